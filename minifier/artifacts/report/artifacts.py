"""Reading a compiler debug folder back for the HTML report: per compiled graph, its FX code,
loop IR and C++ with the provenance linking their lines, and its stage timings.

A debug folder is what `config.debug` writes (compiler/trace.py):
`<debug_dir>/run_<stamp>-pid_<pid>/compiler/<model>__<n>_<kind>_<k>/`. `load_graphs` accepts
the top folder, one run folder, a `compiler` folder or one graph folder.

Provenance comes from the graph folder's `provenance.json` when the compiler wrote one:

    {"fx": FILE, "ir": FILE, "cpp": FILE,
     "nodes": {fx_node: {"fx_lines": [..], "ir_lines": [..], "cpp_lines": [..], "kernel": NAME,
                         "source": "file:line code"}}}

(line numbers 1-based into those files). Older folders have none; then it is derived from the
files every debug folder has: `fx_graph_readable.py` (a node's definition line and the `# File:`
comment above it), `ir_post_fusion.txt` (the `origins:` of each buffer and the body lines calling
the node's op) and `output_code.py` (the `// FX: node = ...` comments codegen puts before a node's
C++). The derived map says `"derived": true` so the page can say it is a reconstruction.
"""
from __future__ import annotations

import json
import os
import re
from typing import Optional

from tdbg.compiler.provenance import FX_COMMENT, FX_FILE, PROVENANCE_FILE

# pane -> files that hold it, first found wins (the derivation reads these too)
PANE_FILES = {"fx": (FX_FILE, "fx_graph_transformed.py"),
              "ir": ("ir_post_fusion.txt", "ir_pre_fusion.txt"),
              "cpp": ("output_code.py",)}
GRAPH_DIR = re.compile(r"^(?P<model>.+)__(?P<index>\d+)_(?P<kind>[a-z]+)_(?P<aot>\d+)(?:\.\d+)?$")

_FX_DEF = re.compile(r"^\s+(?P<node>[A-Za-z_]\w*)\s*(?::\s*\"[^\"]*\")?\s*=\s*(?P<call>.*)$")
_FX_FILE = re.compile(r"^\s*# File: (?P<file>.+?):(?P<line>\d+) in [^,]+, code: (?P<code>.*)$")
_ATEN_OP = re.compile(r"(?:torch\.ops\.)?(?:aten|prims)\.(?P<op>\w+)\.")
_IR_ORIGINS = re.compile(r"^\s*origins: \[(?P<names>.*)\]\s*$")
_IR_BUFFER = re.compile(r"^\s*(?:group \d+:|buf\d+: )")
_IR_CALL = re.compile(r"=\s*(?P<op>\w+)\(")
_CPP_KERNEL = re.compile(r"^\s*'(?P<name>[A-Za-z_]\w*)': r'''")
_CPP_END = re.compile(r"^'''")


def load_graphs(path: str) -> list:
    """Every compiled graph under `path`, in the order the compiler made them: dicts with
    name, model, index, kind (forward/backward/inference), dir, panes {fx|ir|cpp: {file, lines}},
    nodes (the provenance map), derived (bool) and stages [(name, seconds, failure)]."""
    graphs = [_load_graph(d) for d in _graph_dirs(path)]
    return [g for g in graphs if g is not None]


def _graph_dirs(path: str) -> list:
    if not os.path.isdir(path):
        return []
    if _is_graph_dir(path):
        return [path]
    found = []
    for root, dirs, _files in os.walk(path):
        dirs.sort()
        for d in list(dirs):
            full = os.path.join(root, d)
            if _is_graph_dir(full):
                found.append(full)
                dirs.remove(d)
    return sorted(found, key=_made_order)


def _is_graph_dir(path: str) -> bool:
    return GRAPH_DIR.match(os.path.basename(path)) is not None and os.path.isfile(os.path.join(path, "debug.log"))


def _made_order(path: str):
    m = GRAPH_DIR.match(os.path.basename(path))
    return (os.path.dirname(os.path.dirname(path)), int(m["index"]), int(m["aot"]), m["kind"] != "forward", path)


def read_lines(path: Optional[str]) -> list:
    if not path or not os.path.isfile(path):
        return []
    with open(path, errors="replace") as f:
        return f.read().splitlines()


def _load_graph(folder: str) -> Optional[dict]:
    m = GRAPH_DIR.match(os.path.basename(folder))
    provenance = read_json(os.path.join(folder, PROVENANCE_FILE))
    panes = {}
    for pane, names in PANE_FILES.items():
        chosen = (provenance or {}).get(pane)
        candidates = ([chosen] if chosen else []) + [n for n in names if n != chosen]
        name = next((n for n in candidates if os.path.isfile(os.path.join(folder, n))), None)
        panes[pane] = {"file": name, "lines": read_lines(os.path.join(folder, name)) if name else []}
    derived = not (provenance and isinstance(provenance.get("nodes"), dict))
    nodes = derive_provenance(panes) if derived else _clean_nodes(provenance["nodes"])
    return {"name": os.path.basename(folder), "model": m["model"], "index": int(m["index"]), "kind": m["kind"],
            "dir": folder, "panes": panes, "nodes": nodes, "derived": derived,
            "stages": _stages(os.path.join(folder, "debug.log")),
            "kernels": _kernel_names(panes["cpp"]["lines"])}


def read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _clean_nodes(nodes: dict) -> dict:
    """provenance.json's node map with every line list made of ints (a malformed entry is dropped
    rather than breaking the page)."""
    clean = {}
    for name, entry in nodes.items():
        if not isinstance(entry, dict):
            continue
        row = {key: [int(n) for n in entry.get(key) or [] if isinstance(n, int) or str(n).isdigit()]
               for key in ("fx_lines", "ir_lines", "cpp_lines")}
        row["kernel"] = entry.get("kernel")
        row["source"] = entry.get("source")
        clean[str(name)] = row
    return clean


def _stages(path: str) -> list:
    """debug.log's `<stage> <seconds>[ failed:<Error>]` lines."""
    rows = []
    for line in read_lines(path):
        parts = line.split()
        try:
            seconds = float(parts[1])
        except (IndexError, ValueError):
            continue
        failed = parts[2].partition(":")[2] if len(parts) > 2 and parts[2].startswith("failed:") else None
        rows.append((parts[0], seconds, failed))
    return rows


def _kernel_names(cpp_lines: list) -> list:
    return [m["name"] for m in map(_CPP_KERNEL.match, cpp_lines) if m]


def derive_provenance(panes: dict) -> dict:
    """The provenance map rebuilt from the FX, IR and C++ texts (see the module docstring)."""
    nodes: dict = {}
    ops: dict = {}
    pending_source = None
    for n, line in enumerate(panes["fx"]["lines"], 1):
        source = _FX_FILE.match(line)
        if source:
            pending_source = (n, f"{source['file']}:{source['line']} {source['code'].strip()}")
            continue
        d = _FX_DEF.match(line)
        if not d or "(" not in d["call"]:
            continue
        row = nodes.setdefault(d["node"], _empty())
        row["fx_lines"].append(n)
        if pending_source:
            row["fx_lines"].insert(0, pending_source[0])
            row["source"] = pending_source[1]
        op = _ATEN_OP.search(d["call"])
        if op:
            ops[d["node"]] = op["op"]
        pending_source = None
    _derive_ir(panes["ir"]["lines"], nodes, ops)
    _derive_cpp(panes["cpp"]["lines"], nodes)
    return nodes


def _empty() -> dict:
    return {"fx_lines": [], "ir_lines": [], "cpp_lines": [], "kernel": None, "source": None}


def _derive_ir(lines: list, nodes: dict, ops: dict) -> None:
    """A buffer's `origins:` line belongs to each origin; a body line of that buffer belongs to
    the origin whose aten op it calls (t4 = neg(t3) -> node neg)."""
    origins: list = []
    for n, line in enumerate(lines, 1):
        if _IR_BUFFER.match(line):
            origins = []
        o = _IR_ORIGINS.match(line)
        if o:
            origins = [name.strip().strip("'\"") for name in o["names"].split(",") if name.strip()]
            for name in origins:
                nodes.setdefault(name, _empty())["ir_lines"].append(n)
            continue
        call = _IR_CALL.search(line)
        if call:
            for name in origins:
                if ops.get(name) == call["op"] and n not in nodes[name]["ir_lines"]:
                    nodes[name]["ir_lines"].append(n)


def _derive_cpp(lines: list, nodes: dict) -> None:
    """Lines after a `// FX: node = ...` comment belong to that node until the next such comment
    or the end of the loop body; the enclosing KERNELS entry is the node's kernel."""
    kernel, current = None, None
    for n, line in enumerate(lines, 1):
        k = _CPP_KERNEL.match(line)
        if k:
            kernel, current = k["name"], None
            continue
        if _CPP_END.match(line):
            kernel, current = None, None
            continue
        fx = FX_COMMENT.match(line)
        if fx and kernel:
            current = nodes.setdefault(fx["node"], _empty())
            current["kernel"] = current["kernel"] or kernel
        elif current is not None and (not line.strip() or line.strip().startswith("}")):
            current = None
        if current is not None:
            current["cpp_lines"].append(n)
