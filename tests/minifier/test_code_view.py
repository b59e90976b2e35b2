"""code_view's pure half: guards in words (real code parts of torch 2.13's guard manager), frame
selection, the disassembly fallback; graph_pdb's --break-at parsing."""

import pytest

from tdbg.minifier.diagnose import code_view, graph_pdb

CHECK_TENSOR = ("check_tensor(L['x'], Tensor, DispatchKeySet(CPU, BackendSelect, ADInplaceOrView, AutogradCPU), "
                "torch.float32, device=None, requires_grad=False, size=[4, 8], stride=[8, 1])")


@pytest.mark.parametrize("code,words", [
    (CHECK_TENSOR, "`x` is a Tensor of dtype float32, shape [4, 8], stride [8, 1], requires_grad=False, device cpu"),
    ("check_tensor(L['self']._modules['fc']._parameters['weight'], Parameter, DispatchKeySet(CPU, BackendSelect, "
     "ADInplaceOrView, AutogradCPU), torch.float32, device=None, requires_grad=True, size=[2, 3], stride=[3, 1])",
     "`self.fc.weight` is a Parameter of dtype float32, shape [2, 3], stride [3, 1], requires_grad=True, device cpu"),
    ("hasattr(L['x'], '_dynamo_weak_dynamic_indices') == False",
     "`x` carries no mark_dynamic / mark_static / unbacked marks (marking it later recompiles)"),
    ("L['n'] == 3", "`n` == 3 (the graph is specialized to this Python value)"),
    ("___check_obj_id(G['__builtins_dict___1']['print'], 140111372424816), type=<class 'builtin_function_or_method'>",
     "`print` is the very object it was when compiled"),
    ("___check_type_id(L['cfg'], 94011), type=<class 'dict'>", "`cfg` has the type it had when compiled (dict)"),
    ("len(L['xs']) == 3", "`xs` has length 3"),
    ("2 <= L['x'].size()[0]", "`x` has size at least 2 in dim 0"),
    ("utils_device.CURRENT_DEVICE == None", "no `with torch.device(...)` block is active"),
    ('___check_global_state() against {"deterministic_algorithms":false,"grad_mode":true,"num_threads":2}',
     "torch's global state is as when compiled: grad mode on, deterministic algorithms off, 2 threads, "
     "the same autocast and default dtype"),
    ("___some_new_guard(L['x'])", "holds: ___some_new_guard(x)"),
    ("check_no_aliasing(L['x'], L['xs'][0])", "`x`, `xs[0]` are distinct tensors (none aliases another)"),
    ("not ___dict_contains('forward', L['self']._modules['fc'].__dict__)",
     "`self.fc.forward` is not set on the instance (the class's forward runs)"),
    (CHECK_TENSOR.replace("size=[4, 8], stride=[8, 1]", "size=[None, 8], stride=[8, 1]"),
     "`x` is a Tensor of dtype float32, shape [any, 8], stride [8, 1], requires_grad=False, device cpu"),
    # symbolic-shape guards, as torch 2.13 writes them (the comment names the user line)
    ("4 <= L['x'].size()[0]  # if x.size(0) > 3:  # mp/cv/probe3.py:4 in f (_dynamo/variables/tensor.py:2606 in "
     "evaluate_expr)", "`x` has size at least 4 in dim 0 (from line 4: `if x.size(0) > 3:`)"),
    ("2 <= L['x'].size()[1]  # if x.size(0) > 3:  # mp/cv/probe3.py:4 in f (user code shown is first use of this "
     "value--the guard itself is not due user code but due to 0/1 specialization in the framework; to avoid "
     "specialization try torch._dynamo.decorators.mark_unbacked(tensor, dim))",
     "`x` has size at least 2 in dim 1 (not from your code: sizes 0 and 1 always get graphs of their own; line 4 is "
     "only where the size was first used)"),
    ("L['x'].stride()[0] == L['x'].size()[1]  # (unknown source L['x'].stride()[0], please file a bug)",
     "`x.stride()[0]` == `x.size()[1]` (a relation between sizes and strides the graph assumes)"),
])
def test_guards_in_words(code, words):
    assert code_view.plain_guard(code) == words


def test_guards_with_the_same_words_are_one_row():
    parts = [CHECK_TENSOR] + [f"hasattr(L['x'], '_dynamo_{k}_indices') == False"
                              for k in ("dynamic", "weak_dynamic", "unbacked", "strict_unbacked", "static")]
    rows = code_view.plain_guards(parts)
    assert [len(r["code"]) for r in rows] == [1, 5]
    assert rows[0]["code"] == [CHECK_TENSOR]


def _frame(index, name, first, lines, graphs):
    return {"index": index, "frame": name, "function": code_view.function_of(name), "file": "dir/s.py",
            "first_line": first, "resume_line": code_view._resume_line(name),
            "source": {"first_line": 3, "text": "\n".join(["x"] * lines)},
            "compiles": [{"graphs": [{"name": f"__compiled_fn_{g}", "graph": g} for g in graphs]}],
            "graph_code": [{"index": g, "code": ""} for g in graphs]}


FRAMES = [_frame(0, "f", 3, 5, [0]), _frame(1, "torch_dynamo_resume_in_f_at_5", 5, 5, [1, 2]),
          _frame(2, "g", 20, 2, [3])]
FRAMES[2]["source"] = {"first_line": 20, "text": "def g(x):\n    return x"}


@pytest.mark.parametrize("spec,indices", [
    ("f", [0, 1]), ("torch_dynamo_resume_in_f_at_5", [1]), ("g", [2]), ("all", [0, 1, 2]),
    ("2", [1]), ("3", [2]), ("s.py:4", [0, 1]), ("dir/s.py:21", [2]), ("s.py:22", []), ("other.py:4", []),
    ("h", []),
])
def test_select_frames(spec, indices):
    assert [f["index"] for f in code_view.select(FRAMES, spec)] == indices


def test_choices_name_resume_points():
    assert code_view.choices(FRAMES) == ("f (dir/s.py:3), f (dir/s.py:3, resumed after line 5), g (dir/s.py:20)")
    assert code_view.choices([]) == "none (nothing was compiled)"


def test_undecompilable_code_falls_back_to_a_disassembly(monkeypatch):
    import depyf

    def refuse(code):
        raise NotImplementedError("unsupported opcode CALL_INTRINSIC_1")
    monkeypatch.setattr(depyf, "decompile", refuse)
    text, decompiler, note = code_view.decompile((lambda a: a + 1).__code__)
    assert decompiler == "dis" and "BINARY_OP" in text and "LOAD_FAST" in text
    assert note == ("depyf could not decompile this code (NotImplementedError: unsupported opcode "
                    "CALL_INTRINSIC_1): showing the disassembly")


def test_without_depyf_the_note_says_how_to_install_it(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "depyf", None)     # import depyf -> ImportError
    _, decompiler, note = code_view.decompile((lambda: 0).__code__)
    assert decompiler == "dis"
    assert note == "depyf is not installed (pip install depyf): showing the disassembly"


def test_break_at_parsing(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("x = 1\n")
    assert graph_pdb.parse_at("7", str(script)) == (str(script.resolve()), 7)
    assert graph_pdb.parse_at(f"{script}:3", "other.py") == (str(script.resolve()), 3)
    assert graph_pdb.check_at("x7", str(script)) == \
        "--break-at takes FILE:LINE or LINE (a line of the script), not 'x7'"
    assert graph_pdb.check_at("nofile.py:3", str(script)) == "--break-at nofile.py:3: 'nofile.py' is not a file"


def test_shape_guards_come_with_the_line_that_made_them():
    """A dynamic-shape compile: the symbolic-shape guards (checked last, outside code_parts) are
    listed too, with the user line of the branch that created them."""
    import torch

    from tdbg.compiler.torch_compat import dynamo_cache_entries

    def f(x):
        if x.size(0) > 3:
            return x * 2
        return x
    torch.compiler.reset()
    try:
        torch.compile(f, backend="eager", dynamic=True)(torch.ones(5, 8))
        (entry,) = dynamo_cache_entries(f.__code__)
        words = [g["words"] for g in code_view.plain_guards(code_view.guard_parts(entry.guard_manager))]
    finally:
        torch.compiler.reset()
    line = f.__code__.co_firstlineno + 1
    assert f"`x` has size at least 4 in dim 0 (from line {line}: `if x.size(0) > 3:`)" in words
    assert "`x` is a Tensor of dtype float32, shape [any, any], stride [any, 1], requires_grad=False, device cpu" \
        in words


def test_an_unreadable_compile_is_a_note_not_a_crash():
    class Entry:
        compile_id = "0/0"

        @property
        def code(self):
            raise AttributeError("no code on this torch")
    (entry,) = [code_view._compile_or_note(Entry(), {})]
    assert entry["note"] == "tdbg could not read this compile (AttributeError: no code on this torch)"
    assert entry["compile_id"] == "0/0" and entry["guards"] == [] and entry["code"] == ""
