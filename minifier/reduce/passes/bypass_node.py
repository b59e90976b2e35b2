"""Bypass a node: its users read one of its operands instead, when that operand has the same
shape and dtype as the node's result (e.g. drop a relu or an add in the middle of a chain)."""
import torch.fx as fx

from tdbg.minifier.reduce.surgery import bypass, names, tensor_meta


def bypass_node(state) -> None:
    with state.strategy("Bypass node"):
        for name in reversed(names(state.current.compute_nodes())):
            node = next((n for n in state.current.compute_nodes() if n.name == name), None)
            if node is None or not node.users:
                continue
            values = state.values()
            meta = tensor_meta(values, name)
            operands = [a.name for a in node.all_input_nodes
                        if isinstance(a, fx.Node) and meta and tensor_meta(values, a.name) == meta]
            for operand in operands:
                if state.test(bypass(state.current, name, operand)):
                    break
