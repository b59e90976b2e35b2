"""Debug trace directories and the compiler's log channels.

With `config.debug` on, every compiled graph gets a directory

    <config.debug_dir>/run_<YYYY_MM_DD_HH_MM_SS>-pid_<pid>/compiler/<model>__<n>_<kind>_<k>/

(one run directory per process, created on first use) into which the compiler writes its
artifacts with `write` / `write_json`, and `debug.log` gets one `<stage> <seconds>` line per
`stage(...)` block. The directory is announced on the `compiler` channel.

Log channels (`compiler`, `output_code`, `schedule`, `graph`) are `logging.Logger`s named
`tdbg.<channel>`. They are silent until `configure_logging(config)` enables the channels in
`config.logs` (those in `config.verbose_logs` at DEBUG, the others at INFO; `compiler` is always
on at INFO while `config.debug` is set) with one terse handler on stderr.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from typing import Any, Iterator, Optional

from .config import LOG_CHANNELS

# Channels propagate only up to "tdbg", whose NullHandler keeps both the host application's
# root handlers and logging's last-resort stderr handler away from the compiler's records.
_ROOT = logging.getLogger("tdbg")
_ROOT.addHandler(logging.NullHandler())
_ROOT.propagate = False

_lock = threading.Lock()
_run_dirs: dict = {}      # (abs debug_dir, pid) -> run directory


def get_logger(channel: str) -> logging.Logger:
    """The logger of one channel (`compiler`, `output_code`, `schedule`, `graph`)."""
    if channel not in LOG_CHANNELS:
        raise ValueError(f"unknown log channel {channel!r}; channels: {', '.join(LOG_CHANNELS)}")
    return logging.getLogger(f"tdbg.{channel}")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at emit time (so redirection and capture work)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("[tdbg.%(channel)s] %(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass

    def format(self, record: logging.LogRecord) -> str:
        record.channel = record.name.rpartition(".")[2]
        return super().format(record)


_handler = _StderrHandler()


def configure_logging(config) -> None:
    """Set every channel's level and handler from `config`; calling it again just re-applies."""
    enabled = set(config.logs) | ({"compiler"} if config.debug else set())
    for channel in LOG_CHANNELS:
        logger = get_logger(channel)
        if channel in enabled:
            logger.setLevel(logging.DEBUG if channel in config.verbose_logs else logging.INFO)
            if _handler not in logger.handlers:
                logger.addHandler(_handler)
        else:
            logger.setLevel(logging.WARNING)
            if _handler in logger.handlers:
                logger.removeHandler(_handler)


def run_dir(debug_dir: str) -> str:
    """This process's run directory under `debug_dir`, created on first call."""
    key = (os.path.abspath(debug_dir), os.getpid())
    with _lock:
        if key not in _run_dirs:
            stamp = time.strftime("%Y_%m_%d_%H_%M_%S")
            path = os.path.join(key[0], f"run_{stamp}-pid_{key[1]}")
            os.makedirs(path, exist_ok=True)
            _run_dirs[key] = path
        return _run_dirs[key]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(name)) or "model"


class DebugTrace:
    """One compiled graph's debug directory."""

    def __init__(self, path: str):
        self.path = path

    @classmethod
    def start(cls, config, model: str, graph_index: int, kind: str,
              aot_index: int) -> Optional["DebugTrace"]:
        """The trace for one graph, or None when `config.debug` is off."""
        if not config.debug:
            return None
        configure_logging(config)
        base = os.path.join(run_dir(config.debug_dir), "compiler",
                            f"{_safe(model)}__{graph_index}_{_safe(kind)}_{aot_index}")
        path, n = base, 1
        with _lock:
            while os.path.exists(path):
                n += 1
                path = f"{base}.{n}"
            os.makedirs(path)
        get_logger("compiler").info("debug trace for %s %s graph %d: %s", model, kind, graph_index, path)
        return cls(path)

    def write(self, filename: str, text: str) -> str:
        """Write `text` to `filename` inside the trace; return its path."""
        target = os.path.join(self.path, filename)
        with open(target, "w") as f:
            f.write(text)
        return target

    def write_json(self, filename: str, obj: Any) -> str:
        return self.write(filename, json.dumps(obj, indent=2, default=str) + "\n")

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block; append `<name> <seconds>` (and the error type if it raised) to debug.log."""
        start = time.perf_counter()
        failed = ""
        try:
            yield
        except BaseException as e:
            failed = f" failed:{type(e).__name__}"
            raise
        finally:
            with open(os.path.join(self.path, "debug.log"), "a") as f:
                f.write(f"{name} {time.perf_counter() - start:.6f}{failed}\n")
