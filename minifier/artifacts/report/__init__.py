"""The HTML report: one static, self-contained page (inline CSS and JS, no network) built from a
tdbg command's --json document and the compiler debug folders it names.

    build(document, ...) -> the page's HTML text
    write(out_dir, html) -> the path of out_dir/index.html
    folder_document(path) -> (document, debug folders) for `tdbg report DIR`

artifacts.py reads debug folders (FX, IR, C++, provenance, stage times); sections.py holds the
SECTIONS table; page.py the HTML pieces and assets/ the CSS and JS. Library code: never prints.
"""
from __future__ import annotations

import json
import os
import time
from typing import Optional

from tdbg.minifier.runs.names import backend_label

from . import artifacts, page, sections

INDEX = "index.html"


def build(document: dict, *, command: str, command_line: str = "", headline: str = "",
          transcript: Optional[dict] = None, debug_dirs: tuple = (), verdict: Optional[dict] = None) -> str:
    """The page for `document` (any tdbg.* schema, error documents included). `headline` is the
    verdict line as the CLI printed it; `debug_dirs` are compiler debug folders whose graphs get
    code panes; `verdict` is a run verdict with graphs and errors when the document has none of
    its own (e.g. the run bisect's report made to collect artifacts)."""
    seen: dict = {}    # one graph folder can lie under several of the folders given
    for folder in filter(None, debug_dirs):
        for g in artifacts.load_graphs(folder):
            seen.setdefault(os.path.realpath(g["dir"]), g)
    graphs = list(seen.values())
    ctx = {"command": command, "command_line": command_line, "document": document, "headline": headline,
           "transcript": transcript or {}, "graphs": graphs,
           "verdict": verdict if verdict is not None else document.get("verdict") if isinstance(
               document.get("verdict"), dict) and "graphs" in document["verdict"] else None}
    ctx["focus"] = focus(sections.verdict_fields(document), graphs)
    built = []
    for ident, title, builder in sections.SECTIONS:
        content = builder(ctx)
        if content:
            built.append((ident, title, content))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return page.assemble(f"tdbg {command} report ({stamp})", command_line, built)


def focus(verdict: dict, graphs: list) -> dict:
    """The culprit to mark in the panes: {graph (name), fx_node, kernel, source}, or {} when the
    verdict names no FX node found in any compiled graph."""
    node = verdict.get("fx_node")
    if not node:
        return {}
    named = [g for g in graphs if g["name"] == verdict.get("graph")]
    holding = [g for g in named + graphs if node in g["nodes"]]
    if not holding:
        return {}
    g = holding[0]
    return {"graph": g["name"], "fx_node": node, "kernel": verdict.get("kernel") or g["nodes"][node].get("kernel"),
            "source": g["nodes"][node].get("source")}


def write(out_dir: str, html: str) -> str:
    """Write the page as out_dir/index.html (the folder is made if missing); its path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, INDEX)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(html)
    os.replace(tmp, path)
    return path


def folder_document(path: str) -> tuple:
    """(document, debug folders) for an existing folder: a tdbg --json document found in it (the
    newest *.json whose schema is tdbg.*) with the debug folder it names, a minify output folder
    (minify.jsonl), a `run --save-io` folder (manifest.json: a `tdbg.saved_io` document), or a
    bare compiler debug folder (a `tdbg.folder` document listing its graphs and failed stages).
    Raises ValueError when the folder holds none of these or a damaged one."""
    if not os.path.isdir(path):
        raise ValueError(f"{path} is not a folder")
    found = _saved_document(path)
    if found is not None:
        named = [(found.get("verdict") or {}).get("debug_dir"), found.get("debug_dir")]
        return found, tuple(d for d in named if d and os.path.isdir(d)) + (path,)
    if os.path.isfile(os.path.join(path, "minify.jsonl")):
        return _minify_folder(path), ()
    if os.path.isfile(os.path.join(path, "manifest.json")):
        return _saved_io_folder(path), ()
    graphs = artifacts.load_graphs(path)
    if not graphs:
        raise ValueError(f"{path} holds no tdbg --json document, no minify.jsonl, no --save-io manifest.json and "
                         "no compiler debug folder (<model>__<n>_<kind>_<k>/ with a debug.log)")
    failed = [(g["name"], name, err) for g in graphs for name, _s, err in g["stages"] if err]
    summary = (f"{len(graphs)} compiled graph(s); " +
               ("; ".join(f"{n}: stage {s} failed ({e})" for n, s, e in failed) if failed
                else "every compile stage finished"))
    return {"schema": "tdbg.folder", "version": 1, "path": path, "status": "failed" if failed else "ok",
            "exit_code": None, "summary": summary}, (path,)


def _saved_document(path: str) -> Optional[dict]:
    candidates = []
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if name.endswith(".json") and os.path.isfile(full):
            try:
                with open(full) as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and str(doc.get("schema", "")).startswith("tdbg."):
                candidates.append((os.path.getmtime(full), name, doc))
    return max(candidates, key=lambda c: (c[0], c[1]))[2] if candidates else None


def _saved_io_folder(path: str) -> dict:
    """A `tdbg.saved_io` document for a `run --save-io` folder: its manifest and, per saved
    graph, the meta.json fields the page shows (`dynamic`: the inputs' recorded symbols) and
    graph.py's text."""
    from tdbg.minifier.artifacts import saved_io
    try:
        manifest = saved_io.read_manifest(path)
    except Exception as e:   # SavedIOError: a damaged folder is described, not reported on
        raise ValueError(str(e)) from None
    graphs = []
    for row in manifest["graphs"]:
        folder = os.path.join(path, str(row.get("name")))
        meta = artifacts.read_json(os.path.join(folder, saved_io.META)) or {}
        code = "\n".join(artifacts.read_lines(os.path.join(folder, saved_io.GRAPH_SOURCE)))
        graphs.append({**row, "inputs": meta.get("inputs") or [], "compiled_error": meta.get("compiled_error"),
                       "timing": meta.get("timing"), "code": code,
                       "dynamic": (meta.get("replay") or {}).get("dynamic") or {}})
    summary = (f"{len(graphs)} saved graph(s) of {manifest.get('script')} "
               f"(backend {backend_label(manifest.get('backend'))}, "
               f"torch {manifest.get('torch')}, after {manifest.get('after')})")
    return {"schema": "tdbg.saved_io", "version": 1, "path": path, "status": "ok", "exit_code": None,
            "summary": summary, "saved_graphs": graphs}


def _minify_folder(path: str) -> dict:
    """A minify document rebuilt from minify.jsonl (its first and last queries) and repro.py."""
    with open(os.path.join(path, "minify.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    kept = [r for r in records if r.get("same_failure")]
    if not records:
        raise ValueError(f"{path}/minify.jsonl is empty")
    first, last = records[0], (kept or records)[-1]
    return {"schema": "tdbg.minify", "version": 1, "out_dir": path, "status": "minified" if kept else "no_failure",
            "original": {"nodes": first["nodes"], "inputs": first["inputs"]},
            "minimized": {"nodes": last["nodes"], "inputs": last["inputs"]},
            "final": {"stage": last.get("outcome"), "message": last.get("summary")},
            "stats": {"queries": sum(1 for r in records if r.get("purpose") == "candidate")}}
