"""Issue 25's rough edges, one regression test each (in-process and cheap: no tdbg subprocess)."""
import io

from tdbg.cli import console

LONG = "torch:aot_eager_decomp_partition"


def _chain_table(c) -> str:
    from tdbg.cli.bisect import _render_chain
    rows = [{"backend": b, "status": "ok", "adds": "AOTAutograd with the decompositions and partitioner Inductor "
             "uses, run eagerly (no code generation)", "duration_s": 1.5} for b in ("eager", LONG)]
    _render_chain(c, {"backends": rows, "chain": ["eager", LONG]})
    return c.file.getvalue()


def test_piped_tables_keep_backend_names_whole():
    """A console that is not a terminal (a pipe, a CI log) printed `torch:aot_eager_decomp_partiti` /
    `on` on two lines at 80 columns; it is now PIPE_WIDTH wide, so the name is on one line."""
    text = _chain_table(console._console(file=io.StringIO()))
    (line,) = [ln for ln in text.splitlines() if "aot_eager_decomp" in ln]
    assert LONG in line and "run eagerly (no code generation)" in line
    assert console._console(file=io.StringIO()).width == console.PIPE_WIDTH


def test_a_terminal_keeps_its_own_width():
    c = console._console(file=io.StringIO(), force_terminal=True, color_system=None, width=60)
    assert c.width == 60
    assert max(len(ln) for ln in _chain_table(c).splitlines()) <= 60
