"""Run a user script as __main__ in a child process, every torch.compile sent to one backend.

Parent side: `run_script(RunRequest) -> dict` (the verdict). The child is
`python -m tdbg.minifier.runs.runner SPEC.json`; it runs the script with its own argv, records graphs
(see instrument.Session), classifies any failure and writes the verdict as JSON. A child killed
by a signal or by the timeout still gets a verdict from the parent (stage `crash` / `timeout`),
located by the child's events file. Nothing is left behind: the spec, events and verdict live in
a temporary directory removed before `run_script` returns.

Verdict (JSON-safe dict): status ("ok" | "failed"), stage (one of errors.STAGES, "backend",
"script", "bad_input", "internal" or None), script_exit_code (the script process's own status:
0, its sys.exit code, 1 when it raised, the negative signal of a killed child, None when it never
ran; never tdbg's exit code, which console.verdict_exit_code derives), compile_calls, graphs,
recompiles, guards, error {type, message, source, source_lines, fx_node, kernel, graph, frame,
during, evidence, traceback}, debug_dir, duration_s, and stdout/stderr tails when captured.
"""
from __future__ import annotations

import ast
import gc
import glob
import re
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

from tdbg.compiler.torch_compat import RUN_WARM
from tdbg.minifier.runs.names import backend_label, canonical_backend, source_line
from tdbg.minifier.runs.own_backend import OWN

MAX_MESSAGE_LINES = 12
# imported once by the warm servers of `zygote_pool`, before any run is forked
# (the torch internals among them: torch_compat.RUN_WARM, each checked by tests/compat)
ZYGOTE_WARM = ("torch", *RUN_WARM, "tdbg.minifier.runs.backends", "tdbg.minifier.runs.instrument",
               "tdbg.minifier.runs.runner", "tdbg.compiler.lowering")
TORCH_LOG_CHANNELS = ("dynamo", "aot", "graph_breaks", "recompiles", "guards", "graph_code", "bytecode")


@dataclass
class RunRequest:
    script: str
    argv: list = field(default_factory=list)
    backend: Optional[str] = OWN   # own: each torch.compile call's own backend; None: run uncompiled
    fullgraph: bool = False
    function: Optional[str] = None
    check_accuracy: bool = False
    check_calls: Optional[int] = None    # checks.CallPolicy.every(check_calls): None = the default policy
    # The child's tdbg Config: `config_json` (a Config.to_json() text) when given, else the
    # child's environment (config.from_env) with `config_changes` applied. The second form
    # keeps the parent free of torch (importing tdbg.compiler imports torch).
    config_json: Optional[str] = None
    config_changes: dict = field(default_factory=dict)
    repro_from_env: bool = False         # no `repro`: read TDBG_REPRO_AFTER/LEVEL in the child
    torch_logs: dict = field(default_factory=dict)   # torch._logging.set_logs(**torch_logs)
    repro: Optional[dict] = None         # {"after", "level", "out_dir"} for dump.wrap_backend
    timeout: Optional[float] = None
    capture: bool = False                # keep the script's stdout/stderr (tails go in the verdict)
    stdout_to_stderr: bool = False       # not captured: the script's stdout goes to our stderr
    env: dict = field(default_factory=dict)   # set in the child before anything else (e.g. a backend's own knobs)
    # --save-io DIR: every compiled graph's inputs and outputs saved there (instrument.IOSaver);
    # the folder must be new or empty (the CLI checks before any work). With `save_io_profile`,
    # compiled call times are saved too.
    save_io: Optional[str] = None
    save_io_profile: bool = False
    # {"path": a JSON file, "tolerance": float or None}: each Dynamo graph's stages (Dynamo graph
    # vs aten graph vs compiled) judged at its first call and written to path
    # (diagnose/stages.StageRecorder; `tdbg compare` reads it)
    stage_check: Optional[dict] = None
    code_view: bool = False              # verdict["code_frames"]: diagnose/code_view.CodeRecorder.collect()
    break_at: Optional[str] = None       # "FILE:LINE": stop in pdb in each graph's code at that line (graph_pdb.py)
    cache_events: Optional[str] = None   # a JSON-lines file: every compile-cache lookup (diagnose/caches.py)
    check_determinism: bool = False      # each graph's first call run twice, compiled and eager (determinism.py)
    # the compiler's debug traces were switched on for a report (--html), not by the user: its
    # `compiler` log channel (which config.debug turns on) stays quiet unless config.logs names it
    quiet_compiler_log: bool = False

    def __post_init__(self):
        # one name for tdbg's compiler in the child, its verdict and what it suggests (`tdbg` -> `inductor`)
        self.backend = canonical_backend(self.backend)


def _compares_with_eager(spec: dict, repro: Optional[dict]) -> bool:
    """Whether this run compares compiled graphs with eager: accuracy checks, level-4 dumps, or
    saved eager/compiled outputs (which replay, diff and compare judge later)."""
    return bool(spec["check_accuracy"] or spec.get("save_io") or (repro or {}).get("level") == 4)


def _eager_random_numbers(cfg, backend: Optional[str]):
    """`cfg` with random ops drawing eager's stream, and torch:inductor told the same: eager and
    the compiled graph run from one generator state, and only the same stream can be compared
    (PyTorch's accuracy minifier sets Inductor's fallback_random for the same reason). The run says
    so for every checked graph that draws random numbers."""
    if backend in ("torch:inductor", OWN):   # own: the script may compile with torch.compile's default, Inductor
        from tdbg.minifier.runs.inductor_hooks import inductor_config
        inductor_config.fallback_random = True
    return cfg.replace(fallback_random=True)


def check_script(path: str) -> Optional[str]:
    """A one-paragraph problem with `path` as a Python script, or None when it can be run."""
    if not os.path.exists(path):
        return f"the script {path!r} does not exist."
    if not os.path.isfile(path):
        return f"{path!r} is not a file; give the Python script to run."
    try:
        with open(path, "rb") as f:
            ast.parse(f.read(), filename=path)
    except SyntaxError as e:
        return f"the script {path!r} does not parse: {e.msg} at line {e.lineno}."
    except ValueError as e:
        return f"the script {path!r} cannot be read as Python source: {e}."
    return None


def parse_torch_logs(names) -> dict:
    """['+dynamo', 'graph_breaks'] -> set_logs kwargs; unknown names raise ValueError."""
    import logging
    kwargs = {}
    for part in names:
        name = part.lstrip("+")
        if name not in TORCH_LOG_CHANNELS:
            raise ValueError(f"unknown log channel {name!r}")
        if name in ("dynamo", "aot"):
            kwargs[name] = logging.DEBUG if part.startswith("+") else logging.INFO
        else:
            kwargs[name] = True
    return kwargs


# -- parent -------------------------------------------------------------------------------------
def run_script(req: RunRequest, pool=None) -> dict:
    """Run `req` in a fresh child process, or in a child forked from a warm server of `pool`
    (a `zygote_pool`; only for captured runs: a forked child cannot share the parent's terminal
    safely). Without a usable server the run falls back to a fresh process."""
    tmp = tempfile.mkdtemp(prefix="tdbg-run-")
    try:
        return _run_in(tmp, req, pool if req.capture else None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_in(tmp: str, req: RunRequest, pool) -> dict:
    paths = {k: os.path.join(tmp, f"{k}") for k in ("spec.json", "events.jsonl", "status.json", "verdict.json",
                                                   "stdout.txt", "stderr.txt")}
    spec = dict(asdict(req), script=os.path.abspath(req.script), script_given=req.script,
                save_io=os.path.abspath(req.save_io) if req.save_io else None, events=paths["events.jsonl"],
                status=paths["status.json"],
                verdict=paths["verdict.json"], stdout=paths["stdout.txt"], stderr=paths["stderr.txt"])
    with open(paths["spec.json"], "w") as f:
        json.dump(spec, f)
    start = time.monotonic()
    returncode, timed_out = _forked(paths, req, pool) if pool is not None else (None, False)
    if returncode is None:
        returncode, timed_out = _spawn(paths, req)
    verdict = _read_json(paths["verdict.json"])
    if verdict is None:
        verdict = _dead_child_verdict(returncode, timed_out, req, paths["events.jsonl"], paths["status.json"])
    verdict["duration_s"] = round(time.monotonic() - start, 2)
    if req.capture:
        verdict["stdout_tail"] = _tail(paths["stdout.txt"])
        verdict["stderr_tail"] = _tail(paths["stderr.txt"])
    return verdict


def zygote_pool(size: int):
    """A `forkserver.Pool` of up to `size` warm servers (torch, Dynamo, tdbg imported) for
    `run_script`; close it (or use it as a context manager) when done."""
    from tdbg.minifier.runs import forkserver
    return forkserver.Pool(ZYGOTE_WARM, size=size)


def _forked(paths: dict, req: RunRequest, pool):
    """(exit code, timed out) of `child_main` forked from a warm server, or (None, False) when no
    server can take it. Negative codes are signals; a timed-out child's group is SIGKILLed."""
    from tdbg.minifier.runs import forkserver
    try:
        with pool.server() as server:
            reply = server.call("tdbg.minifier.runs.runner:child_main", paths["spec.json"], timeout=req.timeout,
                                session=True, stdout=paths["stdout.txt"], stderr=paths["stderr.txt"])
    except forkserver.ServerDied:
        return None, False
    # a run's own MemoryError is the script's failure, in its verdict; out_of_memory replies come only
    # from a SIGKILL past half a memory limit (runs set none), so they read as that signal
    code = {"ok": reply.value, "exit": reply.code, "crash": -(reply.signal or 0),
            "timeout": -int(signal.SIGKILL), "out_of_memory": -int(signal.SIGKILL)}[reply.kind]
    return code, reply.kind == "timeout"


def _spawn(paths: dict, req: RunRequest):
    outs = [open(paths[p], "w") for p in ("stdout.txt", "stderr.txt")] if req.capture else [None, None]
    if req.stdout_to_stderr and not req.capture:
        sys.stderr.flush()
        outs[0] = os.fdopen(os.dup(sys.stderr.fileno()), "w")
    proc = subprocess.Popen([sys.executable, "-m", "tdbg.minifier.runs.runner", paths["spec.json"]],
                            stdout=outs[0], stderr=outs[1], start_new_session=True)
    timed_out = False
    try:
        proc.wait(timeout=req.timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(proc)
    except BaseException:
        _kill(proc)
        raise
    finally:
        for f in outs:
            if f is not None:
                f.close()
    return proc.returncode, timed_out


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def read_jsonl(path: str) -> list:
    """The JSON lines of a file a child wrote; [] when it is missing or cut off mid-line."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


# status state -> (where the process was, is a compiled graph to blame, `during`)
_WHERE = {
    "compiling": ("while compiling graph {graph}", True, "compile"),
    "compiled": ("after compiling graph {graph}, before its first call", False, None),
    "running": ("while running graph {graph} (call {call})", True, "run"),
    "returned": ("after graph {graph}'s call {call} returned: outside every compiled graph, in the "
                 "script's own code or eager PyTorch", False, None),
    "backward": ("while running graph {graph}'s backward (for call {call})", True, "backward"),
    "backward_done": ("after graph {graph}'s backward (for call {call}) finished: outside every "
                      "compiled graph, in the script's own code or eager PyTorch", False, None),
}


def _read_status(path: str) -> dict:
    try:
        with open(path) as f:
            return json.loads(f.read().strip() or "{}")
    except (OSError, ValueError):
        return {}


def _dead_child_verdict(returncode: int, timed_out: bool, req: RunRequest, events_path: str,
                        status_path: str = "") -> dict:
    """The child wrote no verdict: it was killed (timeout), died from a signal, or crashed hard.
    The status file says where it was: a compiled graph (compiling, running a call, its
    backward) is blamed only when it was inside one."""
    events = read_jsonl(events_path)
    status = _read_status(status_path)
    template, blame, during = _WHERE.get(status.get("state"), ("before any graph was compiled", False, None))
    where = template.format(**status)
    graph = status.get("graph") if blame else None
    if timed_out:
        stage, message = "timeout", f"the run exceeded its {req.timeout:g} s timeout ({where})"
    elif returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        stage, message = "crash", f"the process died from signal {name} ({where})"
    else:
        stage, message = "internal", f"the tdbg child process exited with code {returncode} without a verdict"
    starts = {e["graph"]: e for e in events if e.get("event") == "compile_start"}
    start = starts.get(graph) or {}
    source = start.get("source")
    if source:      # the graph's first user line (a crash has no traceback to read it from)
        path, _, rest = source.partition(":")
        source = f"{_rel(path)}:{rest}"
    return {"status": "failed", "stage": stage, "script_exit_code": returncode, "compile_calls": None,
            "graphs": [], "recompiles": [], "guards": [],
            "error": {"type": stage, "message": message, "graph": graph, "frame": start.get("frame"),
                      "during": during, "call": status.get("call") if blame else None,
                      "part": "backward" if during == "backward" else None,
                      "last_compiled": status or None, "source": source, "fx_node": None, "kernel": None,
                      "evidence": {}, "traceback": ""}}


# -- child --------------------------------------------------------------------------------------
def _child(spec: dict) -> dict:
    import builtins
    import types

    from tdbg.compiler import config as tdbg_config
    from tdbg.minifier.runs import instrument, own_backend
    from tdbg.minifier.runs.backends import BackendError, resolve

    os.environ.update(spec.get("env") or {})
    try:
        cfg = (tdbg_config.Config.from_json(spec["config_json"]) if spec["config_json"]
               else tdbg_config.from_env().replace(**spec["config_changes"]))
        repro = spec["repro"] or (_repro_from_env(tdbg_config) if spec["repro_from_env"] else None)
    except ValueError as e:
        return _bad_input(f"bad tdbg configuration: {e}")
    if _compares_with_eager(spec, repro):
        cfg = _eager_random_numbers(cfg, spec["backend"])
    tdbg_config.set_default(cfg)
    if spec.get("quiet_compiler_log"):
        from tdbg.minifier.diagnose.profiling import drop_compiler_log
        drop_compiler_log(cfg)
    script = spec["script"]
    if spec["torch_logs"]:
        from tdbg.compiler.torch_compat import set_logs
        set_logs(**spec["torch_logs"])
    if spec.get("cache_events"):
        from tdbg.minifier.diagnose.caches import CacheRecorder
        CacheRecorder(spec["cache_events"]).install()
    if spec.get("save_io") and repro:
        return _bad_input("--save-io cannot be combined with repro dumping (--repro-after, TDBG_REPRO_AFTER): "
                          "both hook the backend's compiler; run them separately.")
    prepare = _Prepare(spec, cfg, repro)
    backend_fn, kind, own = None, "", None
    if spec["backend"] == OWN:
        own = prepare
    elif spec["backend"]:
        try:
            backend = resolve(spec["backend"], cfg, script=script)
            backend_fn, kind = prepare(backend), backend.kind
        except BackendError as e:   # e.g. --repro-after aot for a backend with no AOT stage
            return _bad_input(str(e))
    session = instrument.Session(backend_fn, backend_kind=kind, backend_name=spec["backend"], own=own,
                                 script=spec.get("script_given") or script, config=cfg, fullgraph=spec["fullgraph"],
                                 function=spec["function"], check_accuracy=spec["check_accuracy"],
                                 check_calls=spec.get("check_calls"), events_path=spec["events"],
                                 status_path=spec.get("status"), check_determinism=spec.get("check_determinism", False))
    _code_tools(session, spec, script)
    with open(script, "rb") as f:
        code = compile(f.read(), script, "exec")
    module = types.ModuleType("__main__")
    module.__file__, module.__builtins__ = script, builtins
    saved = (sys.argv, sys.path[0], sys.modules["__main__"])
    sys.argv, sys.path[0], sys.modules["__main__"] = [script, *spec["argv"]], os.path.dirname(script), module
    exc, exit_code = None, 0
    try:
        with session.install():
            exec(code, module.__dict__)
    except SystemExit as e:
        exit_code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # noqa: B902 - the script's failure is what we report
        exc = e
    finally:
        sys.argv, sys.path[0], sys.modules["__main__"] = saved
    if session.setup_error is not None:
        return _bad_input(str(session.setup_error))
    verdict = _verdict(session, exc, exit_code, script, cfg)
    verdict["compile_backends"] = own_backend.summary(session.compile_records)
    if session.code_recorder is not None:
        verdict["code_frames"] = session.code_recorder.collect()
    if session.graph_edit is not None:
        verdict["break_at"] = session.graph_edit.placed
    verdict["check_calls"] = spec.get("check_calls")   # --check-calls N (None: the default policy)
    verdict["check_determinism"] = bool(spec.get("check_determinism"))
    if prepare.savers:
        for saver in prepare.savers.values():
            saver.finish()
        verdict["save_io"] = _save_io_summary(list(prepare.savers.values()), spec["backend"])
    out_dir = (prepare.repro or {}).get("out_dir")
    if out_dir and os.path.isdir(out_dir) and os.listdir(out_dir):
        verdict["repro_dir"] = os.path.abspath(out_dir)
    verdict["config"] = json.loads(cfg.to_json())
    verdict["default_config"] = json.loads(tdbg_config.Config().to_json())
    return verdict


def _code_tools(session, spec: dict, script: str) -> None:
    """explain --code records each frame's code; --break-at edits each graph to stop in pdb."""
    if spec.get("code_view"):
        from tdbg.minifier.diagnose.code_view import CodeRecorder
        session.code_recorder = CodeRecorder()
    if spec.get("break_at"):
        from tdbg.minifier.diagnose.graph_pdb import GraphBreakpoints
        session.graph_edit = GraphBreakpoints(spec["break_at"], script)


class _Prepare:
    """Backend -> the Dynamo backend a run compiles with: the backend itself, or wrapped by
    --save-io (instrument.IOSaver, one per backend, all writing one folder), by repro dumping
    (dump.wrap_backend) and by compare's stage check (stages.StageRecorder, one for the run). Called once for --backend NAME, once per distinct backend the script's
    own torch.compile calls ask for (own_backend.py)."""

    def __init__(self, spec: dict, cfg, repro: Optional[dict]):
        import itertools
        self.spec, self.cfg, self.savers, self.writer, self.stages = spec, cfg, {}, None, None
        self.repro = dict(repro, out_dir=repro.get("out_dir") or _new_run_dir()) if repro else None
        self.counter = itertools.count()   # saved graphs are numbered across every backend's saver

    def __call__(self, backend):
        from tdbg.minifier.runs import inductor_hooks, instrument
        fn = backend.compiler_fn
        if backend.name in inductor_hooks.BACKENDS:   # a kernel g++ rejects can then name its ops
            inductor_hooks.record_kernel_origins()
        if self.spec.get("save_io"):
            if self.writer is None:
                from tdbg.minifier.artifacts.saved_io import Writer
                self.writer = Writer(self.spec["save_io"], {"backend": self.spec["backend"],
                                                            "script": self.spec.get("script_given") or self.spec["script"]})
            saver = instrument.IOSaver(self.writer, backend, self.cfg, profile=self.spec.get("save_io_profile", False),
                                       counter=self.counter)
            self.writer.manifest["after"] = saver.after
            self.savers[id(saver)] = saver
            fn = saver.backend_fn
        if self.repro:
            from tdbg.minifier.artifacts.dump import wrap_backend
            fn = wrap_backend(backend, config=self.cfg, **self.repro)
        if self.spec.get("stage_check"):
            if self.stages is None:
                from tdbg.minifier.diagnose.stages import StageRecorder
                self.stages = StageRecorder(backend, self.cfg, **self.spec["stage_check"])
            fn = self.stages.wrap(fn, backend)
        return fn


def _new_run_dir() -> str:
    from tdbg.minifier.artifacts.repro import new_run_dir
    return new_run_dir()


def _save_io_summary(savers: list, backend: str) -> dict:
    """What --save-io saved, for the verdict (and what it could not save, and why)."""
    manifest = savers[0].writer.manifest
    dynamo = [s for s in savers if s.after != "aot"]
    note = None if not dynamo else (
        f"backward graphs were not saved: backend {backend_label(dynamo[0].backend.name)} has no AOT stage tdbg can hook, so each "
        "Dynamo graph was saved whole (kind dynamo)")
    return {"dir": savers[0].writer.directory, "after": "dynamo" if dynamo else "aot",
            "graphs": [g["name"] for g in manifest["graphs"]],
            "skipped": manifest["skipped"], "timings": manifest["timings"], "note": note}


def _repro_from_env(tdbg_config) -> Optional[dict]:
    after, level = tdbg_config.repro_from_env()
    return {"after": after, "level": level, "out_dir": None} if after else None


def _bad_input(message: str) -> dict:
    return {"status": "failed", "stage": "bad_input", "script_exit_code": None, "compile_calls": 0,
            "graphs": [], "recompiles": [], "guards": [],
            "error": {"type": "bad_input", "message": message, "evidence": {}, "traceback": ""}}


def _verdict(session, exc, exit_code: int, script: str, cfg) -> dict:
    verdict = {"status": "ok", "stage": None, "script_exit_code": exit_code, "compile_calls": session.compile_calls,
               "graphs": session.graphs, "recompiles": session.recompiles, "guards": session.guards,
               "recompile_limits": session.recompile_limits,
               "error": None, "debug_dir": _debug_dir(cfg), "skipped_frames": session.skipped_frames,
               "check_policy": session.policy.describe() if session.check_accuracy else None}
    if exc is not None:
        verdict["error"] = describe(exc, session, script)
        verdict.update(status="failed", stage=verdict["error"]["stage"], script_exit_code=1)
        if verdict["stage"] == "script":
            sys.stderr.write(verdict["error"]["traceback"])
    elif exit_code != 0:
        verdict.update(status="failed", stage="script",
                       error={"type": "SystemExit", "message": f"the script exited with code {exit_code}",
                              "evidence": {}, "traceback": "", "stage": "script"})
    return verdict


def _debug_dir(cfg) -> Optional[str]:
    if not cfg.debug:
        return None
    found = sorted(glob.glob(os.path.join(cfg.debug_dir, f"run_*-pid_{os.getpid()}")))
    return os.path.abspath(found[-1]) if found else None


def describe(exc: BaseException, session, script: str) -> dict:
    """Classify `exc` and pull out the user's line, FX node, kernel and the first lines of the error.

    The source is the failing op's own line when it is known (the error's evidence, a mismatching
    output's node, the FX node of the graph), else the user's innermost frame."""
    import traceback

    from tdbg.minifier.runs import inductor_hooks, instrument
    chain = instrument.exception_chain(exc)
    tag = next((t for t in map(session.tag_of, chain) if t), None)
    if tag is None and _from_autograd(chain):
        tag = session.backward_tag(exc)
    typed = instrument.typed_error(exc)
    # another compiler's own failure with evidence (Inductor's C++ compile error: kernel, FX nodes)
    evidence = typed.evidence() if typed is not None else (inductor_hooks.cpp_compile_evidence(chain) or {})
    if tag:
        stage = tag["stage"]
    elif typed is not None or evidence.get("stage"):
        stage = typed.stage if typed is not None else evidence["stage"]
    else:
        stage = "dynamo" if _is_dynamo_error(chain) else "script"
    root = typed or _innermost(chain)
    graph = tag["graph"] if tag else None
    info = session.graphs[graph] if graph is not None and graph < len(session.graphs) else {}
    fx = evidence.get("fx_node") or ", ".join(evidence.get("fx_nodes") or []) or None
    during = tag["during"] if tag else None
    site = tag.get("site") if tag else None    # a backward's failure: the forward's call site
    source = (source_of(evidence.get("node_source")) or source_of(evidence.get("source"))
              or (_node_source(session, graph, fx) if during != "backward" else None)
              or (_rel_source(site) if site else None) or _user_line(chain, script))
    return {"stage": stage, "type": type(root).__name__,
            "message": _first_lines(evidence.get("message") or f"{type(root).__name__}: {root}"),
            "source": source, "source_lines": _trace_lines(evidence.pop("node_traces", None)),
            "fx_node": fx, "kernel": evidence.get("kernel") or None, "graph": graph,
            "frame": info.get("frame"), "during": during, "call": tag.get("call") if tag else None,
            "symbolic_sizes": tag.get("sizes") if tag else None,
            "part": evidence.get("part") or ("backward" if during == "backward" else ("forward" if tag else None)),
            "evidence": evidence,
            "traceback": "".join(traceback.format_exception(type(exc), exc, _script_tb(exc)))}


def _trace_lines(traces) -> list:
    """The distinct user lines of a kernel's FX nodes' stack traces, in the nodes' order."""
    found = [source_of(t) for t in traces or []]
    return list(dict.fromkeys(line for line in found if line))


def _from_autograd(chain) -> bool:
    """The exception came out of autograd's backward engine (loss.backward(), autograd.grad)."""
    import traceback
    marker = os.path.join("torch", "autograd") + os.sep
    return any(marker in f.filename for e in chain for f in traceback.extract_tb(e.__traceback__))


def source_of(text) -> Optional[str]:
    """An error's own source: one 'file:line ...' line, or the user frame of a node's stack trace
    ('File "f", line N, in fn' lines); None for anything else (e.g. a kernel's C++)."""
    from tdbg.minifier.diagnose.checks import trace_source
    from tdbg.minifier.runs.instrument import is_user_file
    text = str(text or "").strip()
    if not text:
        return None
    if 'File "' in text:
        line = trace_source(text, is_user_file)
        return _rel_source(line) if line else None
    return _rel_source(text) if "\n" not in text and ":" in text else None


def _node_source(session, graph, fx) -> Optional[str]:
    """The user line of a named FX node of an aten graph, through the Dynamo graph `graph`: the
    earliest named node (in the Dynamo graph's order) whose op appears exactly once there (aten
    nodes are named after their op; Dynamo's after the user's variables, so only a unique op
    identifies the node)."""
    ops = {re.sub(r"_\d+$", "", name) for name in str(fx or "").split(", ") if name}
    known = list((getattr(session, "node_sources", {}).get(graph) or {}).values())
    for op, line in known:
        if op in ops and line and sum(1 for o, _ in known if o == op) == 1:
            return _rel_source(line)
    return None


def _rel_source(line: str) -> str:
    path, sep, rest = line.partition(":")
    return f"{_rel(path)}{sep}{rest}"


def _script_tb(exc: BaseException):
    """The traceback from the script's first frame on (the runner's exec frame left out)."""
    tb = exc.__traceback__
    return tb.tb_next if tb is not None and tb.tb_frame.f_code is _child.__code__ and tb.tb_next else tb


# raised by Dynamo while building a frame's guards, yet no TorchDynamoException: (module, class)
_DYNAMO_GUARD_ERRORS = (("torch.fx.experimental.symbolic_shapes", "ConstraintViolationError"),)


def _is_dynamo_error(chain) -> bool:
    from tdbg.compiler.torch_compat import BackendCompilerFailed, TorchDynamoException
    return any((isinstance(e, TorchDynamoException) and not isinstance(e, BackendCompilerFailed))
               or (type(e).__module__, type(e).__name__) in _DYNAMO_GUARD_ERRORS for e in chain)


def _innermost(chain):
    """The exception that says what went wrong: Dynamo's wrappers name only the backend."""
    from tdbg.compiler.torch_compat import BackendCompilerFailed
    for e in chain:
        if isinstance(e, BackendCompilerFailed) and getattr(e, "inner_exception", None) is not None:
            return e.inner_exception
    return chain[0]


def _first_lines(text: str) -> str:
    """The first MAX_MESSAGE_LINES lines of `text`, each whole (a message is never cut mid-line:
    the cut words may be the hint), and how many more there were."""
    lines = str(text).strip().splitlines()
    more = len(lines) - MAX_MESSAGE_LINES
    return "\n".join(lines[:MAX_MESSAGE_LINES] + ([f"... ({more} more lines)"] if more > 0 else []))


def _user_line(chain, script: str) -> Optional[str]:
    """'file:line  code' of the user's innermost frame: Dynamo's user stack first, else the traceback."""
    import traceback

    from tdbg.minifier.runs import instrument
    for e in chain:
        stack = getattr(e, "real_stack", None)
        frames = instrument.user_frames(stack) if stack else []
        if frames:
            return _fmt(frames[-1])
    for e in chain:
        # a compiled frame shows up at its `def` line: the call site above it is the useful line
        frames = [f for f in instrument.user_frames(traceback.extract_tb(e.__traceback__))
                  if not f["code"].startswith(("def ", "async def "))]
        if frames:
            return _fmt(frames[-1])
    return None


def _fmt(frame: dict) -> str:
    return source_line(_rel(frame['file']), frame['line'], frame['function'], frame['code'])


def _rel(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def child_main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    try:
        verdict = _child(spec)
    except BaseException as e:  # noqa: B902 - a bug in tdbg: still hand the parent a verdict
        import traceback
        verdict = {"status": "failed", "stage": "internal", "script_exit_code": None, "compile_calls": None,
                   "graphs": [], "recompiles": [], "guards": [],
                   "error": {"type": type(e).__name__, "message": _first_lines(str(e)), "evidence": {},
                             "traceback": "".join(traceback.format_exception(e))}}
    tmp = spec["verdict"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(verdict, f, default=str)
    os.replace(tmp, spec["verdict"])
    sys.stdout.flush()
    sys.stderr.flush()
    # Spare the exit's cyclic collections the millions of objects torch and Dynamo keep alive
    # (about a second per run on a 2-core EPYC); Python never promised __del__ at exit to them.
    gc.freeze()
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1]))
