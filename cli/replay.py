"""`tdbg replay DIR/GRAPH`: rerun one graph saved by `tdbg run --save-io` alone and judge it."""
from __future__ import annotations

import click

from tdbg.cli import common
from tdbg.cli.console import doing, exit_code, exit_codes_help, fail, out, report_to_stderr, verdict_exit_code, write_json

JSON_SCHEMA, JSON_VERSION = "tdbg.replay", 1


@click.command(epilog=exit_codes_help())
@click.argument("path", type=click.Path())
@click.option("--backend", default=None, metavar="NAME", callback=common.canonical_backend,
              help="Compile with NAME instead of the backend the run used (eager: run the graph uncompiled).")
@common.json_option
def replay(path, backend, json_path):
    """Rerun the graph saved in DIR/GRAPH on its saved inputs and compare with the saved eager outputs.

    The graph is compiled as the run compiled it (an aten graph through the backend's own
    per-graph compiler), or with --backend. DIR alone replays every saved graph, in order, and
    exits with the code of the first that fails. A missing or changed saved file is an error
    (exit 3), never a verdict.
    """
    if json_path == "-":
        report_to_stderr()
    common.check_output_file(json_path, "--json")
    if backend not in (None, "eager"):
        common.check_backend(backend)
    from tdbg.minifier.artifacts.saved_io import SavedIOError, load_graph, load_saved, split_path
    from tdbg.minifier.diagnose.replay import replay as replay_graph
    directory, name = split_path(path)
    results = []
    try:
        graphs = [load_graph(path)] if name else load_saved(directory).graphs
        if not graphs:
            fail(f"{path} holds no saved graph (the run compiled nothing, or saved nothing).", "bad_input")
        for graph in graphs:
            with doing(f"replaying {graph.name}"):
                results.append(replay_graph(graph, backend))
    except SavedIOError as e:
        fail(str(e), "bad_input")
    # a graph saved with symbolic sizes compiles with them again: say so beside its verdict
    docs = [dict(r.to_dict(), symbolic_sizes=(g.symbolic_text or None) if backend != "eager" else None)
            for r, g in zip(results, graphs)]
    codes = [verdict_exit_code({"status": d["status"], "stage": d["stage"]}) for d in docs]
    code = next((c for c in codes if c), exit_code("ok"))
    render(docs, codes)
    write_json(json_path, {"path": path, "backend": backend, "exit_code": code, "graphs": docs},
               JSON_SCHEMA, JSON_VERSION)
    raise SystemExit(code)


def render(docs: list, codes: list) -> None:
    from rich.markup import escape

    from tdbg.cli.run import _row
    c = out()
    for doc, code in zip(docs, codes):
        if doc["status"] == "ok":
            err = doc["max_abs_error"]
            worst = (f", max abs error {err:.3g}" + (" (bit-identical)" if err == 0 else "")) if err is not None else ""
            c.print(f"[bold green]OK[/] {escape(doc['graph'])} ({doc['kind']}): backend {escape(common.backend_label(doc['backend']))}, "
                    f"{doc['outputs']} output(s){_and_in_place(doc)}{worst}, "
                    f"{doc['seconds']:.1f} s")
            _row(c, "config", _config_text(doc.get("config")))
            _row(c, "symbolic sizes", doc.get("symbolic_sizes"))
            continue
        error = doc.get("error") or {}
        words = common.STAGE_WORDS.get(doc["stage"], str(doc["stage"]))
        c.print(f"[bold red]FAILED[/] {escape(doc['graph'])} ({doc['kind']}): {escape(words)} "
                f"(stage {doc['stage']}, exit code {code})")
        for key, value in (("backend", common.backend_label(doc["backend"])), ("config", _config_text(doc.get("config"))),
                           ("symbolic sizes", doc.get("symbolic_sizes")),
                           ("source", error.get("source")),
                           ("fx node", error.get("fx_node")), ("kernel", error.get("kernel")),
                           ("error", error.get("message"))):
            _row(c, key, value)
    if len(docs) > 1:
        failed = sum(1 for d in docs if d["status"] != "ok")
        c.print(f"{len(docs)} graph(s) replayed: {len(docs) - failed} OK, {failed} failed")


def _config_text(config) -> str:
    """The recorded tdbg config differences the replay compiled with (e.g. an injected bug)."""
    return ", ".join(f"{k}={v}" for k, v in sorted((config or {}).items()))


def _and_in_place(doc: dict) -> str:
    n = doc.get("in_place") or 0
    return (f" and {n} input(s) changed in place match the saved eager values" if n
            else " match the saved eager outputs")
