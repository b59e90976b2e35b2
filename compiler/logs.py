"""The compiler's log channels: the bottom of compiler/ (it imports no other module of it).

Channels (`compiler`, `output_code`, `schedule`, `graph`) are `logging.Logger`s named
`tdbg.<channel>`. They are silent until `configure_logging(config)` enables the channels in
`config.logs` (those in `config.verbose_logs` at DEBUG, the others at INFO; `compiler` is always
on at INFO while `config.debug` is set) with one terse handler on stderr.
"""
from __future__ import annotations

import logging
import sys

LOG_CHANNELS = ("compiler", "output_code", "schedule", "graph")

# Channels propagate only up to "tdbg", whose NullHandler keeps both the host application's
# root handlers and logging's last-resort stderr handler away from the compiler's records.
_ROOT = logging.getLogger("tdbg")
_ROOT.addHandler(logging.NullHandler())
_ROOT.propagate = False


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
