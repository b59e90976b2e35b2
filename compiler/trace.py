"""Debug trace directories, provenance files and TORCH_TRACE artifacts of compiled graphs.

With `config.debug` on, every compiled graph gets a directory

    <config.debug_dir>/run_<YYYY_MM_DD_HH_MM_SS>-pid_<pid>/compiler/<model>__<n>_<kind>_<k>/

(one run directory per process, created on first use) into which the compiler writes its
artifacts with `write` / `write_json`, and `debug.log` gets one `<stage> <seconds>` line per
`stage(...)` block. The directory is announced on the `compiler` channel (compiler/logs.py, whose
`get_logger` and `configure_logging` this module also exports).
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any, Iterator, Optional

from .logs import configure_logging, get_logger

_lock = threading.Lock()
_run_dirs: dict = {}      # (abs debug_dir, pid) -> run directory


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


# ---- PyTorch's structured trace (TORCH_TRACE) and the per-graph provenance files ----------
# torch reads TORCH_TRACE itself and installs trace_log's handler; tdbg reads no variable here.

def structured_trace_enabled() -> bool:
    """True when PyTorch's structured trace (TORCH_TRACE=dir) is collecting records."""
    from .torch_compat import trace_log
    return bool(trace_log.handlers)


@contextlib.contextmanager
def timed_stage(c, name: str) -> Iterator[None]:
    """Time one compile stage into `c.stage_times[name]`; under TORCH_TRACE also as a chromium
    event `tdbg.<name>` (what Dynamo's `dynamo_timed` writes for Inductor's phases)."""
    timer = contextlib.nullcontext()
    if structured_trace_enabled():
        from .torch_compat import dynamo_timed
        timer = dynamo_timed(f"tdbg.{name}", log_pt2_compile_event=True)
    start = time.perf_counter()
    try:
        with timer:
            yield
    finally:
        c.stage_times[name] = time.perf_counter() - start


def record_compilation(c, failed_stage: Optional[str] = None) -> None:
    """After a graph's stages (also when one raised): with `config.debug`, write ir.txt,
    kernels.cpp and provenance.json into its debug directory; under TORCH_TRACE, emit its
    artifacts into the structured trace. Never raises: a debugging aid must not replace the
    compile's own result or error (a failure here is logged on the `compiler` channel)."""
    try:
        if c.trace is not None:
            _write_provenance(c)
        if structured_trace_enabled():
            _emit_structured(c, failed_stage)
    except Exception as e:      # noqa: BLE001 - see docstring
        get_logger("compiler").warning("%s: provenance/structured trace not recorded: %s: %s",
                                       c.name, type(e).__name__, e)


def _write_provenance(c) -> None:
    from . import provenance
    fx_path = os.path.join(c.trace.path, provenance.FX_FILE)
    if not os.path.exists(fx_path):
        return
    with open(fx_path) as f:
        prov = provenance.build(c, f.read())
    c.trace.write(provenance.IR_FILE, prov.ir_text)
    c.trace.write(provenance.CPP_FILE, prov.cpp_text)
    c.trace.write_json(provenance.PROVENANCE_FILE, prov.document())


def _emit_structured(c, failed_stage) -> None:
    """The artifacts Inductor writes, under the names tlparse knows (so its index and its
    provenance view (-i) show tdbg's graph, output code and kernel <-> node mapping), plus
    tdbg's own loop IR, line-level provenance and stage times."""
    from . import provenance
    from .torch_compat import trace_structured
    fx_text = c.gm.print_readable(print_output=False)
    cache = {}

    def prov():
        if "p" not in cache:
            cache["p"] = provenance.build(c, fx_text)
        return cache["p"]

    def artifact(name, encoding, payload_fn):
        trace_structured("artifact", metadata_fn=lambda: {"name": name, "encoding": encoding},
                         payload_fn=payload_fn)

    artifact("inductor_post_grad_graph", "string", lambda: fx_text)
    if c.source_code:
        meta = {"filename": f"tdbg_{c.name}.py"}
        if getattr(c, "path", None):
            meta["file_path"] = os.path.abspath(c.path)
        trace_structured("inductor_output_code", lambda: meta, payload_fn=lambda: c.source_code)
    if c.kernels is not None:
        artifact("inductor_provenance_tracking_node_mappings", "json", lambda: json.dumps(prov().node_mappings()))
        artifact("inductor_provenance_tracking_kernel_stack_traces", "json",
                 lambda: json.dumps(prov().kernel_stack_traces()))
    if c.items is not None:
        artifact("tdbg_loop_ir", "string", lambda: prov().ir_text)
    if c.kernels is not None:
        artifact("tdbg_kernels_cpp", "string", lambda: prov().cpp_text)
        artifact("tdbg_provenance", "json", lambda: json.dumps(prov().document(
            "inductor_post_grad_graph", "tdbg_loop_ir", "tdbg_kernels_cpp")))
    artifact("tdbg_compile_stage_times", "json", lambda: json.dumps(
        {"graph": c.name, "kind": c.kind, "seconds": c.stage_times, "failed_stage": failed_stage}))


def current_compile_id():
    """Dynamo's id of the compile in progress (None outside one)."""
    from .torch_compat import CompileContext
    return CompileContext.current_compile_id()


def compile_scope(compile_id):
    """Under TORCH_TRACE, a context in which structured records carry `compile_id` (and attempt
    0, which tlparse's folder names need): a graph with symbolic shapes compiles per signature at
    call time, outside Dynamo's compile, and its artifacts belong next to the Dynamo graph they
    specialize (tlparse groups files by compile id)."""
    if compile_id is None or not structured_trace_enabled():
        return contextlib.nullcontext()
    from .torch_compat import CompileContext, compile_context
    return compile_context(CompileContext(compile_id))
