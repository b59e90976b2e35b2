"""How output names backends and Dynamo frames: the one place (torch-free, imports nothing of tdbg).

Backends. On the command line `inductor` (also spelled `tdbg`, the name `torch.compile` knows it
by) is tdbg's own CPU compiler and `torch:inductor` is PyTorch's Inductor. A bare "inductor" in
output would read as PyTorch's, so every human-readable line names a backend through
`backend_label`: tdbg's compiler is "tdbg's compiler (inductor)", every other backend keeps its
command-line name (PyTorch's Inductor is always `torch:inductor`). JSON keeps the canonical
command-line name (`inductor`), never the label.

Frames. Dynamo continues a function after a graph break in a generated "resume function" named
`torch_dynamo_resume_in_<function>_at_<line>` (torch/_dynamo/resume_execution.py), where <line>
is the line of the break. Output shows it as the user's function, `frame_label`:
"train_step, resumed after the break at line 12"; `function_of` gives the function alone, and
`source_line` ('file:line in fn: code', the `source` of errors and culprits) names it too.
JSON keeps Dynamo's code name in `frame` fields, which is what Dynamo's own logs print.
"""
from __future__ import annotations

import re
from typing import Optional

# canonical backend name -> the words output uses for it (names not here are shown as they are)
BACKEND_LABELS = {
    "inductor": "tdbg's compiler (inductor)",
    # the entry point torch.compile(backend="tdbg") uses, reached through Dynamo's registry
    "torch:tdbg": "tdbg's compiler (torch:tdbg)",
}
# other spellings of a backend name -> the canonical one every command and JSON document uses
BACKEND_ALIASES = {"tdbg": "inductor"}

RESUME_PREFIX = "torch_dynamo_resume_in_"
# one level of Dynamo's resume naming; a resume of a resume nests it, so it is peeled in a loop
_RESUME = re.compile(r"torch_dynamo_resume_in_(?P<fn>.+)_at_(?P<line>\d+)$")


def canonical_backend(name: Optional[str]) -> Optional[str]:
    """The canonical command-line name of `name` (`tdbg` -> `inductor`); others unchanged."""
    return BACKEND_ALIASES.get(name, name) if name is not None else None


def backend_label(name: Optional[str]) -> str:
    """A backend name as human-readable output shows it: tdbg's compiler is never a bare
    "inductor" (which would read as PyTorch's Inductor, always `torch:inductor`); None -> "?"."""
    if name is None:
        return "?"
    name = canonical_backend(name)
    return BACKEND_LABELS.get(name, name)


def function_of(frame: Optional[str]) -> str:
    """The user function a Dynamo frame belongs to (resume functions fold into their function)."""
    fn = frame or "<unknown>"
    m = _RESUME.match(fn)
    while m:
        fn = m["fn"]
        m = _RESUME.match(fn)
    return fn


def frame_label(frame: Optional[str]) -> str:
    """A Dynamo frame as output shows it: `f` stays `f`; `torch_dynamo_resume_in_f_at_12` is
    "f, resumed after the break at line 12" (the innermost resume's line: where this frame
    starts; no parentheses, as output often puts the frame in some); None -> "<unknown>"."""
    m = _RESUME.match(frame or "")
    if not m:
        return frame or "<unknown>"
    return f"{function_of(frame)}, resumed after the break at line {m['line']}"


def source_line(file: str, line, function: Optional[str], code: str) -> str:
    """A user line as output and JSON `source` fields give it: 'file:line in fn: code', the
    function by the user's name (a line inside a resume function is in that function)."""
    return f"{file}:{line} in {function_of(function)}: {code}"


def is_frame_of(frame: Optional[str], function: str) -> bool:
    """Whether Dynamo frame `frame` is `function` itself or one of its resume functions."""
    return function_of(frame) == function
