"""The debug directory's graph files (TDBG_COMPILE_DEBUG): ir_pre_fusion.txt and ir_post_fusion.txt
(every IR buffer with its origins, layout, ranges, reads and loop body, before and after fusion) and
the FX graph as fx_graph_readable.py, a standalone fx_graph_runnable.py and fx_graph_transformed.py
(each call marked lowered or extern)."""
from __future__ import annotations

import torch

from . import ir
from .ir import ExternKernel, Reduction, format_body, index_var
from .lowering import LOWERINGS
from .scheduler import KernelGroup
from .wrapper import pyexpr


def _describe(buffer, index, rindex, reads=None, extra="") -> list:
    data = buffer.data
    lines = [f"{buffer.name}: {type(data).__name__}{extra}",
             f"  origins: {[o.name for o in buffer.origins]}",
             f"  layout: {buffer.layout}",
             f"  ranges: {list(data.ranges)}"]
    if isinstance(data, Reduction):
        lines.append(f"  reduction: {data.reduction_type} over {list(data.reduction_ranges)}")
    if reads is not None:
        lines.append(f"  reads: {sorted(reads)}")
    lines.append(f"  writes: [{buffer.name}]")
    lines.append("  body:")
    lines += ["    " + line for line in format_body(buffer, index, rindex)]
    return lines


def _describe_extern(kernel) -> list:
    return [f"{kernel.name}: ExternKernel {kernel.target}",
            f"  origins: [{kernel.node.name}]",
            f"  reads: {sorted({pyexpr(x) for x in kernel.inputs})}",
            f"  writes: {[b.name for b in kernel.outputs] + [b.name for b in kernel.mutated]}"]


def ir_pre_fusion(graph) -> str:
    """Every IR operation of a lowered graph, in program order."""
    out = []
    for op in graph.operations:
        if isinstance(op, ExternKernel):
            out += _describe_extern(op)
        else:
            index = [index_var("x", i) for i in range(len(op.data.ranges))]
            rindex = [index_var("r", i) for i in range(len(getattr(op.data, "reduction_ranges", ())))]
            out += _describe(op, index, rindex)
        out.append("")
    return "\n".join(out)


def ir_post_fusion(items) -> str:
    """Kernel groups (with their nodes' loop bodies) and extern calls, in execution order."""
    out = []
    for pos, item in enumerate(items):
        if isinstance(item, KernelGroup):
            out.append(f"group {pos}: {len(item.nodes)} node(s) over ranges {list(item.ranges)}")
            for n in item.nodes:
                out += ["  " + line for line in _describe(n.buffer, n.index, n.rindex, n.read_names(),
                                                          " (local)" if n.local else "")]
        else:
            out.append(f"group {pos}: extern")
            out += ["  " + line for line in _describe_extern(item.kernel)]
        out.append("")
    return "\n".join(out)


def write_graph_files(trace, gm, example_inputs) -> None:
    """fx_graph_readable.py, fx_graph_runnable.py (standalone) and fx_graph_transformed.py."""
    trace.write("fx_graph_readable.py", gm.print_readable(print_output=False))
    consts = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    def value(v):   # a symbolic size: the example's (its hint; int() would add a guard)
        return ir.hint(ir.as_size(v)) if isinstance(v, torch.SymInt) else v
    specs = [(tuple(map(value, x.shape)), tuple(map(value, x.stride())), x.dtype) if isinstance(x, torch.Tensor)
             else value(x) for x in example_inputs]
    body = "\n".join("    " + line for line in gm.code.strip("\n").splitlines())
    init = "\n".join(f"        self.register_buffer({c!r}, torch.randn({tuple(getattr(gm, c).shape)}).to({getattr(gm, c).dtype}))"
                     for c in consts) or "        pass"
    trace.write("fx_graph_runnable.py", RUNNABLE.format(init=init, body=body, specs=repr(specs)))
    lines = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            how = "lowered" if n.target in LOWERINGS else "extern (aten)"
            lines.append(f"{n.format_node()}  # {how}")
        else:
            lines.append(n.format_node())
    trace.write("fx_graph_transformed.py", "# the graph as tdbg lowers it: each call marked lowered or extern\n"
                + "\n".join(f"# {line}" for line in lines) + "\n\n" + gm.code)


RUNNABLE = '''# Standalone: runs the graph tdbg compiled on random inputs of the same shapes and dtypes.
import torch
from torch import device, inf, nan  # noqa: F401


class Repro(torch.nn.Module):
    def __init__(self):
        super().__init__()
{init}

{body}


def make_input(spec):
    if not isinstance(spec, tuple):
        return spec
    size, stride, dtype = spec
    out = torch.empty_strided(size, stride, dtype=dtype)
    if dtype.is_floating_point:
        return out.copy_(torch.randn(size, dtype=dtype))
    return out.copy_(torch.randint(0, 2, size).to(dtype))


if __name__ == "__main__":
    args = [make_input(s) for s in {specs}]
    print(Repro()(*args))
'''
