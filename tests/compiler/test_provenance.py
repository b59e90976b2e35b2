"""provenance.json in the compiler's debug folder: every FX node's lines in the FX graph file,
the loop IR (ir.txt) and the kernels' C++ (kernels.cpp), its kernel and its user source line;
written even when the C++ does not compile."""
import inspect
import json
import os
import re

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten, make_backend, provenance
from tdbg.compiler.config import current
from tdbg.compiler.errors import CppCompileError

NODE_KEYS = {"fx_lines", "ir_lines", "cpp_lines", "kernel", "source"}


def model(x1, x2, w):
    a = torch.neg(x1)
    b = torch.maximum(x2, a)
    y = torch.cat([b], dim=0)
    return y.sum(dim=1) + 1, y @ w.t()


LINE = {name: inspect.getsourcelines(model)[1] + i for i, name in enumerate(("", "neg", "maximum", "cat", "sum"))}


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """(graph dir, provenance.json, fx lines, ir lines, cpp lines) of one compiled graph."""
    root = tmp_path_factory.mktemp("prov")
    cfg = current().replace(debug=True, debug_dir=str(root))
    torch._dynamo.reset()
    inputs = (torch.randn(1, 8), torch.randn(64, 8), torch.randn(4, 8))
    out = torch.compile(model, backend=make_backend(cfg))(*inputs)
    torch._dynamo.reset()
    expected = model(*inputs)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(out, expected))
    (run,) = os.listdir(root)
    (name,) = os.listdir(root / run / "compiler")
    d = root / run / "compiler" / name
    doc = json.loads((d / "provenance.json").read_text())
    texts = [(d / doc[k]).read_text().splitlines() for k in ("fx", "ir", "cpp")]
    return (d, doc, *texts)


def lines(text, numbers):
    return [text[n - 1] for n in numbers]


def test_document_shape(graph):
    d, doc, fx, ir, cpp = graph
    assert (doc["fx"], doc["ir"], doc["cpp"]) == ("fx_graph_readable.py", "ir.txt", "kernels.cpp")
    assert list(doc["nodes"]) == ["neg", "maximum", "cat", "sum_1", "add", "t", "mm"]
    for name, entry in doc["nodes"].items():
        assert set(entry) == NODE_KEYS, name
        for key, text in (("fx_lines", fx), ("ir_lines", ir), ("cpp_lines", cpp)):
            assert entry[key] == sorted(set(entry[key])) and all(1 <= n <= len(text) for n in entry[key]), (name, key)


def test_fx_lines_are_the_assignments(graph):
    _, doc, fx, _, _ = graph
    for name, entry in doc["nodes"].items():
        (line,) = lines(fx, entry["fx_lines"])
        assert re.match(rf'\s+{name}: "[^"]+" = torch\.ops\.aten\.', line), (name, line)


def test_source_is_the_user_line(graph):
    _, doc, _, _, _ = graph
    here = os.path.abspath(__file__)
    assert doc["nodes"]["neg"]["source"] == f"{here}:{LINE['neg']}  a = torch.neg(x1)"
    assert doc["nodes"]["maximum"]["source"] == f"{here}:{LINE['maximum']}  b = torch.maximum(x2, a)"
    assert doc["nodes"]["add"]["source"] == doc["nodes"]["mm"]["source"] == \
        f"{here}:{LINE['sum']}  return y.sum(dim=1) + 1, y @ w.t()"


def test_kernel_and_cpp_lines_of_a_pointwise_node(graph):
    d, doc, _, ir, cpp = graph
    kernel_map = json.loads((d / "kernel_map.json").read_text())
    neg = doc["nodes"]["neg"]
    assert "neg" in kernel_map[neg["kernel"]]
    code = [line.strip() for line in lines(cpp, neg["cpp_lines"])]
    assert code[0] == "// FX: neg = torch.ops.aten.neg.default(arg0_1)"
    assert any(re.fullmatch(r"float (tmp\d+) = decltype\((tmp\d+)\)\(-\2\);", c) for c in code), code
    # no line of another node's FX comment is claimed by neg
    assert not any(c.startswith("// FX:") and not c.startswith("// FX: neg =") for c in code)
    body = lines(ir, neg["ir_lines"])
    assert all(line.rstrip().endswith("# neg") for line in body), body
    assert any(re.search(r"= neg\(t\d+\)", line) for line in body)


def test_reduction_owns_its_accumulator(graph):
    _, doc, _, ir, cpp = graph
    total = doc["nodes"]["sum_1"]
    code = [line.strip() for line in lines(cpp, total["cpp_lines"])]
    i = code.index("// accumulate")
    assert re.match(r"acc\d+p? = acc\d+p? \+ ", code[i + 1]), code
    assert re.fullmatch(r"double (acc\d+) = 0;", code[0]), code       # its accumulator's declaration
    acc = code[0].split()[1]
    assert any(re.fullmatch(rf"float tmp\d+ = static_cast<float>\({acc}\);", c) for c in code), code  # final read
    body = lines(ir, total["ir_lines"])
    assert body[0].startswith("ComputedBuffer(") and ": Reduction sum over [8]" in body[0]
    assert any("sum-reduce" in line for line in body)
    assert total["kernel"] == doc["nodes"]["add"]["kernel"]      # the epilogue fuses into the reduction
    # add's store of its own temporary belongs to add
    add_code = [line.strip() for line in lines(cpp, doc["nodes"]["add"]["cpp_lines"])]
    assert add_code[0].startswith("// FX: add = ") and re.fullmatch(r"out_ptr\d+\[x0\] = tmp\d+;", add_code[-1])


def test_extern_call_has_ir_but_no_kernel(graph):
    _, doc, _, ir, _ = graph
    mm = doc["nodes"]["mm"]
    assert mm["kernel"] is None and mm["cpp_lines"] == []
    block = lines(ir, mm["ir_lines"])
    assert block[0].startswith("ExternKernel(") and "aten.mm" in block[0]
    # it reads w through t's view, spelled as the wrapper spells it (not an object repr)
    assert re.fullmatch(r"  reads: \['\w+', 'torch\.as_strided\(arg2_1, \(8, 4\), \(1, 8\), "
                        r"arg2_1\.storage_offset\(\) \+ 0\)'\]", block[2]), block
    t = doc["nodes"]["t"]      # a view: no IR block, no C++ of its own
    assert (t["kernel"], t["ir_lines"], t["cpp_lines"]) == (None, [], [])


def test_written_when_the_cpp_does_not_compile(tmp_path):
    x1, x2 = torch.randn(1, 8), torch.randn(16, 8)
    gm = make_fx(lambda a, b: torch.maximum(b, torch.neg(a)))(x1, x2)
    cfg = current().replace(debug=True, debug_dir=str(tmp_path), inject_bug=("neg", "compile_error"))
    with pytest.raises(CppCompileError):
        compile_aten(gm, [x1, x2], cfg, graph_name="bad__0_inference_0")
    (run,) = os.listdir(tmp_path)
    d = tmp_path / run / "compiler" / "bad__0_inference_0"
    doc = json.loads((d / "provenance.json").read_text())
    cpp = (d / "kernels.cpp").read_text().splitlines()
    neg = [cpp[n - 1] for n in doc["nodes"]["neg"]["cpp_lines"]]
    assert any("tdbg_injected_compile_error_neg" in line for line in neg), neg
    maximum = [cpp[n - 1] for n in doc["nodes"]["maximum"]["cpp_lines"]]
    assert not any("tdbg_injected" in line for line in maximum), maximum
    ir = (d / "ir.txt").read_text().splitlines()
    assert any("inject_bug(compile_error" in ir[n - 1] for n in doc["nodes"]["neg"]["ir_lines"])
    assert doc["nodes"]["neg"]["source"] == ""       # make_fx graphs carry no user stack


def test_user_source_and_fx_line_parsing():
    trace = ('  File "/a/b.py", line 3, in f\n    x = g(y)\n\n'
             '  File "/a/c.py", line 12, in g\n    return torch.neg(y)\n')
    assert provenance.user_source(trace) == "/a/c.py:12  return torch.neg(y)"
    assert provenance.user_source("") == ""
    text = 'class G(torch.nn.Module):\n    def forward(self, x: "f32[2]"):\n' \
           '        # File: /a.py:1 in f, code: y = x.neg()\n        neg: "f32[2]" = torch.ops.aten.neg.default(x)\n' \
           '        getitem = foo[0]\n        return (neg,)\n'
    assert provenance.fx_lines(text) == {"neg": [4], "getitem": [5]}


def test_tlparse_mappings_list_every_kernel_of_a_node():
    nodes = {"a": {"source": "/u.py:1  a()"}, "b": {"source": ""}, "v": {"source": "/u.py:2  v()"}}
    p = provenance.Provenance(nodes=nodes, kernels_of={"a": ["k0", "k1"], "b": ["k1"]})
    assert p.node_mappings() == {"preToPost": {}, "postToPre": {}, "version": 2.0,
                                 "cppCodeToPost": {"k0": ["a"], "k1": ["a", "b"]},
                                 "postToCppCode": {"a": ["k0", "k1"], "b": ["k1"]}}
    assert p.kernel_stack_traces() == {"k0": ["/u.py:1  a()"], "k1": ["/u.py:1  a()"]}
