"""Turn an operand into an input: a node whose result other nodes read is replaced by an input
holding its recorded value, and what only fed it disappears. Latest nodes first, so the largest
prefixes go first."""
from tdbg.minifier.reduce.surgery import names, replace_with_input


def inputize(state) -> None:
    with state.strategy("Operand to input"):
        for name in reversed(names(state.current.compute_nodes())):
            node = next((n for n in state.current.compute_nodes() if n.name == name), None)
            if node is not None and node.users and node.all_input_nodes:
                state.test(replace_with_input(state.current, name, state.values(), state.store))
