"""explain's shapes in-process, on verdicts shaped as a run records them (minifier/diagnose/shapes.py,
pure data): the guard behind a size recompile and the line that made it, at its full path even when
torch cut the path's front; a specialization behind a static-size recompile; a backend's guard named
as the backend's; storms; mark_dynamic violations; and the shortened-path recovery itself."""
import os

from tdbg.minifier.diagnose import shapes
from tdbg.minifier.diagnose.explain import build_report

FILE = "/nowhere/proj/f.py"           # outside the current folder: printed in full


def _dims(*states):
    return [{"dim": d, "size": size, "state": state, "symbol": "s0" if state != "static" else None}
            for d, (size, state) in enumerate(states)]


def _guard(expr, line, code, framework="_dynamo/variables/tensor.py:evaluate_expr", file=FILE):
    return {"expr": expr, "sources": ["x.size()[0]"], "file": file, "line": line, "code": code,
            "function": "f", "framework": framework}


def _verdict(compiles, failures):
    """compiles: [(compile_id, dims of x, guards, specializations)]; failures: [(reason, graphs_before)]."""
    graphs = [{"index": i, "frame": "f", "ops": ["Tensor.view"],
               "lines": [{"file": FILE, "line": 8, "code": "return y.view(4, 6)", "ops": ["Tensor.view"]}]}
              for i in range(len(compiles))]
    guards = [{"frame": "f", "total": 1, "by_kind": {"SHAPE_ENV": 1}, "tensors": ["L['x']"],
               "shapes": {"compile_id": cid, "inputs": [{"name": "x", "dims": dims}], "guards": gs,
                          "specializations": specs}} for cid, dims, gs, specs in compiles]
    recompiles = [{"frame": "f", "file": FILE, "line": 1, "reason": reason, "graphs_before": before}
                  for reason, before in failures]
    return {"status": "ok", "graphs": graphs, "guards": guards, "recompiles": recompiles}


def test_a_branch_guard_is_put_at_its_line_in_full_never_at_torch_s_cut_path():
    branch = _guard("x.size()[0] > 32", 9, "if x.size(0) > 32:")
    verdict = _verdict([("0/0", _dims((8, "static")), [], []), ("0/1", _dims((64, "dynamic")), [branch], [])],
                       [("0/0: tensor 'x' size mismatch at index 0. expected 8, actual 64", 1),
                        ("0/1: 33 <= L['x'].size()[0]  # if x.size(0) > 32:  # owhere/proj/f.py:9 in f "
                         "(_dynamo/variables/tensor.py:2606 in evaluate_expr)", 2)])
    (fn,) = build_report(verdict)["functions"]
    static, branch_failed = fn["recompiles"]
    assert static["size"]["created_at"] is None and static["size"]["cause"].startswith(
        "x.size()[0] was compiled static, no line of yours made it so")
    assert branch_failed["line"] == f"{FILE}:9  if x.size(0) > 32:"
    assert (branch_failed["size"]["failed_guard"], branch_failed["size"]["created_at"]) == (
        "33 <= x.size()[0]", f"{FILE}:9")
    assert "Inductor" not in branch_failed["suggestion"] and "Inductor" not in branch_failed["size"]["cause"]
    assert fn["shapes"]["dims"] == {"static": 1, "dynamic": 1}


def test_a_range_guard_printed_at_the_line_that_read_the_size_is_put_at_the_branch():
    """Dynamo prints a range guard with the line where the size was first read (its lower bound's
    place); the only recorded guard on that size was made by the branch, and that line is named."""
    branch = _guard("x.size()[0] <= 32", 11, "if x.size(0) > 32:")
    verdict = _verdict([("0/0", _dims((64, "static")), [], []), ("0/1", _dims((8, "dynamic")), [branch], [])],
                       [("0/1: 2 <= L['x'].size()[0] <= 32  # n = x.size(0)  # owhere/proj/f.py:10 in f "
                         "(_dynamo/variables/builder.py:3544 in wrap_tensor)", 2)])
    (r,) = build_report(verdict)["functions"][0]["recompiles"]
    assert r["line"] == f"{FILE}:11  if x.size(0) > 32:"
    assert (r["size"]["created_at"], r["size"]["kind"]) == (f"{FILE}:11", "condition")
    assert r["changed"] == "argument `x` left the size range 2..32 in dim 0 that the compiled graph assumed"
    assert "Inductor" not in r["suggestion"]


def test_without_a_record_the_cut_path_is_dropped_not_printed():
    verdict = _verdict([], [("0/1: 33 <= L['x'].size()[0]  # if x.size(0) > 32:  # owhere/proj/f.py:9 in f", 2)])
    (r,) = build_report(verdict)["functions"][0]["recompiles"]
    assert r["line"] is None
    assert r["size"]["created_at"] is None and r["size"]["cause"].startswith("unknown: no recorded guard")


def test_a_static_size_recompile_made_by_a_specialization_points_at_its_line():
    spec = {"source": "x.size()[0]", "value": "8", **_guard("", 8, "return y.view(4, 6)",
                                                            "_prims_common/__init__.py:infer_size")}
    del spec["expr"], spec["sources"]
    verdict = _verdict([("0/0", _dims((8, "specialized")), [], [spec])],
                       [("0/0: tensor 'x' size mismatch at index 0. expected 8, actual 5", 1)])
    (fn,) = build_report(verdict)["functions"]
    (r,) = fn["recompiles"]
    assert (r["size"]["created_at"], r["line"]) == (f"{FILE}:8", f"{FILE}:8  return y.view(4, 6)")
    assert r["size"]["cause"] == ("x.size()[0] was specialized to 8 by the shape rule of Tensor.view "
                                  "(_prims_common/__init__.py:infer_size: it needs this relation between sizes to "
                                  "compute its output shape)")
    assert r["suggestion"].startswith("a literal size in the op made the dim a constant")
    assert fn["shapes"]["frames"][0]["inputs"][0]["dims"][0]["specialized_at"] == f"{FILE}:8"


def test_guards_are_named_by_who_asked_for_them():
    ops = {}
    assert shapes.cause_of(_guard("x.size()[0] <= 4096", None, None,
                                  "_functorch/_aot_autograd/aot_autograd_result.py:_check_guards", None),
                           ops)["kind"] == "backend"
    assert shapes.cause_of(_guard("e", 3, "c", "_inductor/codegen/simd.py:codegen"), ops)["kind"] == "backend"
    assert shapes.cause_of(_guard("e", 3, "c", "somewhere/else.py:f"), ops)["kind"] == "unknown"
    assert shapes.cause_of(_guard("e", 3, "c", None), ops)["cause"].startswith("unknown")


def test_a_dim_that_never_stabilizes_is_a_storm_and_two_sizes_are_not():
    failures = [(f"0/{k}: tensor 'x' size mismatch at index 0. expected {k + 1}, actual {k + 2}", k + 1)
                for k in range(3)]
    compiles = [(f"0/{k}", _dims((k + 1, "static")), [], []) for k in range(3)]
    (fn,) = build_report(_verdict(compiles, failures))["functions"]
    assert [(s["source"], s["recompiles"], s["sizes"]) for s in fn["shapes"]["storms"]] == [
        ("x.size()[0]", 3, [1, 2, 3, 4])]
    (fn,) = build_report(_verdict(compiles[:2], failures[:2]))["functions"]
    assert fn["shapes"]["storms"] == []


def test_mark_dynamic_violation_is_read_from_dynamo_s_error():
    message = ("ConstraintViolationError: Constraints violated (L['x'].size()[0])!\n  - You marked L['x'].size()[0] "
               "as dynamic but your code specialized it to be a constant (3). If you're using mark_dynamic, ...\n\n"
               f"User stack:\n  File \"{FILE}\", line 7, in f\n    if x.shape[0] == 3:\n       ^^^^\n")
    v = shapes.constraint_violation({"message": message})
    assert (v["source"], v["value"], v["at"], v["code"]) == ("x.size()[0]", "3", f"{FILE}:7", "if x.shape[0] == 3:")
    assert shapes.constraint_violation({"message": "RuntimeError: boom"}) is None


def test_torch_s_shortened_path_is_recovered_from_the_traced_files(tmp_path):
    f = tmp_path / "work" / "m.py"
    f.parent.mkdir()
    f.write_text("def g(x):\n    if x.size(0) > 2:\n        pass\n")
    short = str(f)[2:]                  # torch cut "/t" off the front
    assert shapes._full_path(short, 2, "if x.size(0) > 2:", [str(f)]) == str(f)
    assert shapes._full_path(short, 2, "another line", [str(f)]) is None       # the line must hold the code
    assert shapes._full_path(short, 2, "if x.size(0) > 2:", []) is None
    inside = os.path.join(os.getcwd(), "a.py")
    assert shapes.rel(inside) == "a.py" and shapes.rel(str(f)) == str(f)


def test_the_html_page_has_a_shapes_section():
    from tdbg.minifier.artifacts import report
    branch = _guard("x.size()[0] > 32", 9, "if x.size(0) > 32:")
    verdict = _verdict([("0/0", _dims((8, "static")), [], []), ("0/1", _dims((64, "dynamic")), [branch], [])],
                       [("0/1: 33 <= L['x'].size()[0]  # if x.size(0) > 32:  # owhere/proj/f.py:9 in f", 2)])
    doc = {"schema": "tdbg.explain", "version": 2, "script": "f.py", "status": "ok", "exit_code": 0,
           **build_report(verdict)}
    html = report.build(doc, command="explain", debug_dirs=())
    section = html.split('<section id="shapes">')[1].split("</section>")[0]
    assert "<td>0/1</td><td>x: dim 0 = 64 dynamic</td>" in section
    assert f"guard x.size()[0] &gt; 32</span> at {FILE}:9" in section
    assert f"of compile 0/1 failed; made at {FILE}:9 if x.size(0) &gt; 32:" in section


def test_a_shape_env_that_cannot_be_read_is_reported_not_raised():
    class Broken:
        var_to_sources = property(lambda self: 1 / 0)
    d = shapes.describe({"env": Broken(), "compile_id": "0/0", "inputs": [], "files": []})
    assert d == {"compile_id": "0/0", "inputs": [], "guards": [], "specializations": [],
                 "error": "ZeroDivisionError: division by zero"}
    assert shapes.frame_record("f", d, {})["error"] == "ZeroDivisionError: division by zero"
