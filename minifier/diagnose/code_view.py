"""What Dynamo made of the user's code, per frame: the original source, the code Dynamo runs in
its place (decompiled to Python), that code's guards in plain words and the graphs it calls.

Two halves. In the run's child, `CodeRecorder` is told of every graph the backend gets
(`note_graph`, from instrument.Session) and, after the script ends, reads each frame's cache
entries (`collect`): one entry per compile of the frame, each holding the transformed code and its
guard manager, whose `code_parts` are the guards as Python expressions. The transformed code is
decompiled with depyf (the library made for Dynamo's bytecode); where depyf is missing or cannot
decompile it, the entry holds a disassembly instead and says why (never an exception). A compiled
graph is found in the transformed code by the global it is called through (`__compiled_fn_...`),
whose value unwraps to the run's call wrapper carrying `tdbg_graph` (its graph index); a resume
function (`__resume_at_...`) by its code's name (`torch_dynamo_resume_in_f_at_12`).

In the parent, everything is data: `plain_guard` turns one guard into words (GUARD_WORDS table),
`select` picks frames by the user's function name (its resume frames included), `FILE:LINE`
(the function holding that line) or a graph index as explain lists graphs, or `all`.
"""
from __future__ import annotations

import dis
import inspect
import linecache
import os
import re
from typing import Optional

from tdbg.minifier.diagnose.explain import function_of, source_names

_RESUME = re.compile(r"torch_dynamo_resume_in_(?P<fn>.+)_at_(?P<line>\d+)$")

# (pattern on one guard with sources already in user spelling, words). First match wins; the
# named groups fill the words. Patterns follow torch/_dynamo/guards.py's code parts.
GUARD_WORDS = (
    (r"^check_tensor\((?P<name>[^,]+), (?P<cls>\w+), DispatchKeySet\((?P<keys>[^)]*)\), (?P<dtype>[\w.]+), "
     r"device=(?P<device>[^,]+), requires_grad=(?P<rg>\w+), size=(?P<size>\[[^\]]*\]), stride=(?P<stride>\[[^\]]*\])",
     "`{name}` is a {cls} of dtype {dtype_short}, shape {size_words}, stride {stride_words}, requires_grad={rg}, "
     "device {device_words}"),
    (r"^hasattr\((?P<name>[^,]+), '_dynamo_(?:weak_|strict_)?(?:dynamic|unbacked|static)_indices'\) == False",
     "`{name}` carries no mark_dynamic / mark_static / unbacked marks (marking it later recompiles)"),
    (r"^(?P<name>\S+)\.size\(\)\[(?P<dim>\d+)\] == (?P<value>-?\d+)$",
     "`{name}` has size {value} in dim {dim}"),
    (r"^(?P<lo>-?\d+) <= (?P<name>\S+)\.size\(\)\[(?P<dim>\d+)\]$",
     "`{name}` has size at least {lo} in dim {dim}"),
    (r"^(?P<name>\S+)\.size\(\)\[(?P<dim>\d+)\] <= (?P<hi>-?\d+)$",
     "`{name}` has size at most {hi} in dim {dim}"),
    (r"^(?P<lo>-?\d+) <= (?P<name>\S+)\.size\(\)\[(?P<dim>\d+)\] <= (?P<hi>-?\d+)$",
     "`{name}` has size {lo}..{hi} in dim {dim}"),
    (r"^(?P<a>\S+\.(?:size|stride)\(\)\[\d+\]) == (?P<b>\S+\.(?:size|stride)\(\)\[\d+\])$",
     "`{a}` == `{b}` (a relation between sizes and strides the graph assumes)"),
    (r"^not ___dict_contains\('(?P<attr>\w+)', (?P<name>.+)\.__dict__\)$",
     "`{name}.{attr}` is not set on the instance (the class's {attr} runs)"),
    (r"^___check_obj_id\((?P<name>.+), \d+\)(?:, type=<class '(?P<type>[^']+)'>)?$",
     "`{name}` is the very object it was when compiled"),
    (r"^___check_type_id\((?P<name>.+), \d+\)(?:, type=<class '(?P<type>[^']+)'>)?$",
     "`{name}` has the type it had when compiled ({type})"),
    (r"^___check_global_state\(\)", "torch's global state is as when compiled: grad mode {grad_mode}, "
     "deterministic algorithms {deterministic_algorithms}, {num_threads} threads, the same autocast and default dtype"),
    (r"^___check_torch_function_mode_stack\(\)", "the same torch function modes are active as when compiled"),
    (r"^utils_device\.CURRENT_DEVICE == None", "no `with torch.device(...)` block is active"),
    (r"top_saved_tensors_hooks ids == None", "no saved-tensors hooks are active "
     "(torch.autograd.graph.saved_tensors_hooks)"),
    (r"^check_no_aliasing\((?P<names>.+)\)$", "{names_quoted} are distinct tensors (none aliases another)"),
    (r"^len\((?P<name>.+)\) == (?P<value>\d+)$", "`{name}` has length {value}"),
    (r"^isinstance\((?P<name>.+), (?P<type>\w+)\)$", "`{name}` is a {type}"),
    (r"^(?P<name>[\w.\[\]'\"]+) is None$", "`{name}` is None"),
    (r"^(?P<name>[\w.\[\]'\"]+) is not None$", "`{name}` is not None"),
    (r"^(?P<name>[\w.\[\]'\"]+) == (?P<value>.+)$",
     "`{name}` == {value} (the graph is specialized to this Python value)"),
)


# a verbose guard's comment: `# user code  # file:line in function (...)` (symbolic-shape guards)
_ORIGIN = re.compile(r"#\s*(?P<code>[^#]+?)\s*#\s*\S*?:(?P<line>\d+) in (?P<fn>\S+)")


def plain_guard(code: str) -> str:
    """One guard (a code part of Dynamo's guard manager) in words; unknown guards as the check
    itself. A guard whose comment names the user line that created it (shape guards) says so."""
    text = _user_spelling(code.split("#")[0].strip())
    origin = _ORIGIN.search(code)
    where = f" (from line {origin['line']}: `{origin['code']}`)" if origin else ""
    if origin and "not due user code" in code:   # torch says the line is only the value's first use
        where = (f" (not from your code: sizes 0 and 1 always get graphs of their own; line {origin['line']} "
                 "is only where the size was first used)")
    for pattern, words in GUARD_WORDS:
        m = re.search(pattern, text)
        if m:
            fields = {k: (v if v is not None else "?") for k, v in m.groupdict().items()}
            return words.format(**fields, **_extra_fields(fields, text)) + where
    return f"holds: {text}{where}"


def plain_guards(parts: list) -> list:
    """[{words, code: [guards]}]: guards in order, those with the same words as one row."""
    rows: dict = {}
    for part in parts:
        rows.setdefault(plain_guard(part), []).append(part.split("#")[0].strip())
    return [{"words": words, "code": codes} for words, codes in rows.items()]


def guard_parts(guard_manager) -> list:
    """Every guard of a cache entry as Python text: the manager's code parts, then the guards it
    checks last (symbolic-shape guards, with their comments naming the user line)."""
    parts = list(getattr(guard_manager, "code_parts", None) or [])
    root = getattr(guard_manager, "root", None)
    for guard in (root.get_epilogue_lambda_guards() if hasattr(root, "get_epilogue_lambda_guards") else []):
        parts.extend(guard.verbose_code_parts())
    return parts


def _user_spelling(text: str) -> str:
    text = re.sub(r"G\['__builtins_dict___\d+'\]\['([^']+)'\]", r"\1", text)
    return source_names(text)


def _extra_fields(fields: dict, text: str) -> dict:
    extra = {"names_quoted": ", ".join(f"`{n}`" for n in fields["names"].split(", "))} if "names" in fields else {}
    if "dtype" in fields:
        extra["dtype_short"] = fields["dtype"].replace("torch.", "")
        device = fields.get("device", "None")
        extra["device_words"] = "cpu" if device == "None" and "CPU" in fields.get("keys", "") else device
        # None: a dynamic dim, checked by the symbolic-shape guards instead
        extra["size_words"] = fields["size"].replace("None", "any")
        extra["stride_words"] = fields["stride"].replace("None", "any")
    for key in ("grad_mode", "deterministic_algorithms", "num_threads"):
        m = re.search(rf'"{key}":\s*([^,}}]+)', text)
        extra[key] = {"true": "on", "false": "off"}.get(m.group(1), m.group(1)) if m else "?"
    return extra


# -- in the run's child: recording --------------------------------------------------------------
class CodeRecorder:
    """Records, per original code object Dynamo compiled, its globals and the graphs it produced
    (their FX code, taken before any backend edits the graph); `collect()` reads the rest from
    Dynamo's cache after the script ran."""

    def __init__(self):
        self.frames: dict = {}   # id(original code) -> {"code", "globals", "graphs": [index], "graph_code": {}}

    def note_graph(self, index: int, gm) -> None:
        from tdbg.compiler.torch_compat import InstructionTranslator
        try:
            tx = InstructionTranslator.current_tx()
        except Exception:   # a backend called by hand, outside a Dynamo translation: no frame to show
            return
        rec = self.frames.setdefault(id(tx.f_code), {"code": tx.f_code, "globals": tx.f_globals, "graphs": [],
                                                     "graph_code": {}})
        rec["graphs"].append(index)
        # print_readable: the forward's code with each op's user line as a `# File: ...` comment
        rec["graph_code"][index] = gm.print_readable(print_output=False).strip("\n")

    def collect(self) -> list:
        """One dict per frame in first-compiled order (see module docstring); JSON-ready."""
        from tdbg.compiler.torch_compat import dynamo_cache_entries
        records = list(self.frames.values())
        out = []
        for i, rec in enumerate(records):
            code = rec["code"]
            entries = list(reversed(dynamo_cache_entries(code)))   # Dynamo keeps the newest first
            out.append({"index": i, "frame": code.co_name, "function": function_of(code.co_name),
                        "file": _rel(code.co_filename), "first_line": code.co_firstlineno,
                        "resume_line": _resume_line(code.co_name),
                        "source": _source(code, records),
                        "compiles": [_compile_or_note(e, rec["globals"]) for e in entries],
                        "graph_code": [{"index": k, "code": v} for k, v in rec["graph_code"].items()]})
        return out


def _compile_or_note(entry, globals_: dict) -> dict:
    """`_compile`, or an entry whose note says what could not be read (a torch whose cache entries
    or guard managers differ must not cost the run its verdict)."""
    try:
        return _compile(entry, globals_)
    except Exception as e:
        return {"compile_id": str(getattr(entry, "compile_id", "?")), "code": "", "decompiler": "dis",
                "note": f"tdbg could not read this compile ({type(e).__name__}: {e})", "graphs": [], "resumes": [],
                "guards": []}


def _compile(entry, globals_: dict) -> dict:
    code = entry.code
    text, decompiler, note = decompile(code)
    parts = guard_parts(entry.guard_manager)
    graphs, resumes = [], []
    for name in code.co_names:
        value = globals_.get(name)
        if name.startswith("__compiled_fn"):
            graphs.append({"name": name, "graph": getattr(inspect.unwrap(value), "tdbg_graph", None)
                           if value is not None else None})
        elif name.startswith("__resume_at") and value is not None:
            resumes.append({"name": name, "frame": getattr(getattr(value, "__code__", None), "co_name", None)})
    return {"compile_id": str(entry.compile_id), "code": text, "decompiler": decompiler, "note": note,
            "graphs": graphs, "resumes": resumes, "guards": plain_guards(parts)}


def decompile(code) -> tuple:
    """(text, decompiler, note): depyf's Python, else a disassembly with the reason in `note`."""
    try:
        import depyf
    except ImportError:
        return _disassembly(code), "dis", "depyf is not installed (pip install depyf): showing the disassembly"
    try:
        return depyf.decompile(code).rstrip("\n"), f"depyf {depyf.__version__}", None
    except Exception as e:   # depyf lacks some opcode of this Python: the bytecode still helps
        return _disassembly(code), "dis", f"depyf could not decompile this code ({type(e).__name__}: " \
                                          f"{str(e).splitlines()[0] if str(e) else ''}): showing the disassembly"


def _disassembly(code) -> str:
    return dis.Bytecode(code).dis().rstrip("\n")


def _resume_line(name: str) -> Optional[int]:
    m = _RESUME.match(name)
    return int(m["line"]) if m else None


def _source(code, records: list) -> dict:
    """{"first_line", "text"} of the user's function; a resume frame shows its parent's source."""
    target = code
    if _RESUME.match(code.co_name):
        parent = function_of(code.co_name)
        target = next((r["code"] for r in records if r["code"].co_name == parent
                       and r["code"].co_filename == code.co_filename), code)
    try:
        lines, first = inspect.getsourcelines(target)
    except (OSError, TypeError):
        first = target.co_firstlineno
        lines = [linecache.getline(target.co_filename, first)]
    return {"first_line": max(first, 1), "text": "".join(lines).rstrip("\n")}


def _rel(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


# -- in the parent: choosing frames -------------------------------------------------------------
def select(frames: list, spec: str, graphs: Optional[list] = None) -> list:
    """Frames matching `spec`: `all`; a graph index (as explain lists graphs: the frame that made
    it); FILE:LINE (frames of the function whose source holds that line: FILE matched by its end);
    else a function name (its resume frames too) or a frame's exact name. Empty when none match."""
    spec = spec.strip()
    if spec == "all":
        return list(frames)
    if spec.isdigit():
        return [f for f in frames if any(int(spec) in _graph_indices(c) for c in f["compiles"])
                or any(g["index"] == int(spec) for g in f["graph_code"])]
    m = re.match(r"^(?P<file>.+):(?P<line>\d+)$", spec)
    if m:
        return [f for f in frames if _same_file(f["file"], m["file"]) and _holds(f, int(m["line"]))]
    return [f for f in frames if f["function"] == spec or f["frame"] == spec]


def choices(frames: list) -> str:
    """The frames a run compiled, as `--code` accepts them (for an error that matched none)."""
    return ", ".join(f"{f['function']} ({f['file']}:{f['source']['first_line']}"
                     + (f", resumed after line {f['resume_line']}" if f["resume_line"] else "") + ")"
                     for f in frames) or "none (nothing was compiled)"


def _graph_indices(compile_: dict) -> set:
    return {g["graph"] for g in compile_["graphs"] if g["graph"] is not None}


def _same_file(path: str, given: str) -> bool:
    a, b = os.path.normpath(path), os.path.normpath(given)
    return a == b or a.endswith(os.sep + b) or os.path.abspath(a) == os.path.abspath(b)


def _holds(frame: dict, line: int) -> bool:
    src = frame["source"]
    return src["first_line"] <= line < src["first_line"] + len(src["text"].splitlines())
