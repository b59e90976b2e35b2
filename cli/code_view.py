"""`tdbg explain --code FRAME` and `--break-at FILE:LINE`: the checks before the run, the JSON
part and the text (the library half is minifier/diagnose/code_view.py and graph_pdb.py)."""
from __future__ import annotations

from typing import Optional

# backends where pdb can stop at a user line: graph code that is Python run op by op (eager,
# aot_eager), or a compiled graph's Python wrapper calling the stop op between its kernels (tdbg's
# output_code.py, Inductor's generated module); the stop op is a graph node, so a backend compiling
# the graph its own way (a user's file.py:function) may not run it where it stands
BREAK_BACKENDS = ("eager", "aot_eager", "torch:eager", "torch:aot_eager", "inductor", "tdbg", "torch:tdbg",
                  "torch:inductor")


def break_at_problem(break_at: Optional[str], script: str, backend: str) -> Optional[str]:
    """The one-paragraph problem with --break-at, or None."""
    if break_at is None:
        return None
    if backend not in BREAK_BACKENDS:
        return (f"--break-at needs a backend it knows how to stop in ({', '.join(BREAK_BACKENDS)}), not "
                f"{backend!r}: tdbg puts a stop op in the graph and pdb starts in the graph's own Python (FX code, "
                "or the compiled graph's wrapper between kernels), which another backend may not run as a Python "
                "statement at that place. Add --backend eager (the Dynamo graph), aot_eager (the aten graph) or a "
                "compiler (inductor, torch:inductor: their output code).")
    from tdbg.minifier.diagnose.graph_pdb import check_at
    return check_at(break_at, script)


def document(verdict: dict, spec: Optional[str]) -> Optional[dict]:
    """The JSON `code` part: {asked, frames (the selected ones), available (every compiled frame,
    in words)}; None when --code was not given."""
    if spec is None:
        return None
    from tdbg.minifier.diagnose.code_view import choices, select
    frames = verdict.get("code_frames") or []
    return {"asked": spec, "frames": select(frames, spec), "available": choices(frames)}


def problem(doc: Optional[dict], verdict: dict, break_at: Optional[str]) -> Optional[str]:
    """Why --code or --break-at found nothing, for a run that went fine; else None."""
    if verdict.get("status") != "ok":
        return None
    if doc is not None and not doc["frames"]:
        return (f"--code {doc['asked']} matches no frame Dynamo compiled. Give a function name, FILE:LINE inside "
                f"one, a graph index as explain lists graphs, or `all`. This run compiled: {doc['available']}.")
    if break_at is not None and not verdict.get("break_at"):
        return (f"--break-at {break_at}: no graph has an op traced from that line, so nothing stopped. Give a line "
                "whose tensor operations Dynamo put in a graph (explain lists each graph's lines).")
    return None


def render(c, doc: dict) -> None:
    """Per selected frame: original source | transformed code | guards in words | graph code."""
    from rich.markup import escape
    for f in doc["frames"]:
        resumed = f", resumed after line {f['resume_line']}" if f["resume_line"] else ""
        graphs = ", ".join(str(g["index"]) for g in f["graph_code"])
        # graphs, not the frame's own index: a number given to --code is a graph index
        c.print(f"\n[bold cyan]Code of {escape(f['function'])}[/] (frame {escape(f['frame'])}, "
                f"{escape(f['file'])}:{f['first_line']}{resumed}; graph(s) {graphs or 'none'})")
        src = f["source"]
        c.print(f"  [bold]original source[/] ({escape(f['file'])}:{src['first_line']}):")
        for n, line in enumerate(src["text"].splitlines(), src["first_line"]):
            mark = ">" if f["resume_line"] and n == f["resume_line"] else " "
            c.print(f"  {mark}{n:>5}  {escape(line)}", highlight=False)
        for comp in f["compiles"]:
            _render_compile(c, comp)
        for g in f["graph_code"]:
            c.print(f"  [bold]graph {g['index']} code[/] (the FX GraphModule the backend got):")
            for line in g["code"].splitlines():
                c.print(f"        {escape(line)}", highlight=False)


def _render_compile(c, comp: dict) -> None:
    from rich.markup import escape
    how = f"decompiled by {comp['decompiler']}" if comp["decompiler"] != "dis" else "disassembled"
    c.print(f"  [bold]compile {escape(comp['compile_id'])}: the code Dynamo runs instead[/] ({escape(how)}):")
    if comp["note"]:
        c.print(f"      [yellow]note:[/] {escape(comp['note'])}")
    for line in comp["code"].splitlines():
        c.print(f"        {escape(line)}", highlight=False)
    for g in comp["graphs"]:
        which = f"graph {g['graph']}" if g["graph"] is not None else "a graph"
        c.print(f"      calls {which} as {escape(g['name'])}")
    for r in comp["resumes"]:
        c.print(f"      then continues in {escape(str(r['frame']))} (called as {escape(r['name'])})")
    count = sum(len(g["code"]) for g in comp["guards"])
    c.print(f"  [bold]guards[/] ({count} check(s); this code runs only while all hold, else Dynamo recompiles):")
    for g in comp["guards"]:
        times = f" ({len(g['code'])} checks)" if len(g["code"]) > 1 else ""
        c.print(f"      - {escape(g['words'])}{times}", highlight=False)
