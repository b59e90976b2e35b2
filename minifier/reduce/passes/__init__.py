"""The minifier's strategies, one table. Each row: (name, function(state), description).

Order matters only for speed: cheap, big cuts first; bypass, operand-to-input and shape
shrinking polish the result. The engine repeats the table until nothing changes.
"""
from tdbg.minifier.reduce.passes.bypass_node import bypass_node
from tdbg.minifier.reduce.passes.consolidate_inputs import consolidate_inputs
from tdbg.minifier.reduce.passes.dead_code import eliminate_dead_code
from tdbg.minifier.reduce.passes.delta_debugging import delta_debugging
from tdbg.minifier.reduce.passes.inputize import inputize
from tdbg.minifier.reduce.passes.remove_outputs import remove_outputs
from tdbg.minifier.reduce.passes.shrink_shapes import shrink_shapes
from tdbg.minifier.reduce.passes.truncate_suffix import truncate_suffix
from tdbg.minifier.reduce.passes.unused_inputs import remove_unused_inputs

PASSES = (
    ("eliminate_dead_code", eliminate_dead_code, "drop nodes whose results nothing uses"),
    ("remove_unused_inputs", remove_unused_inputs, "drop inputs no node reads"),
    ("truncate_suffix", truncate_suffix, "keep only a prefix of the nodes"),
    ("delta_debugging", delta_debugging, "ddmin over nodes: keep a chunk, or drop one (complements)"),
    ("remove_outputs", remove_outputs, "drop outputs and what only computed them"),
    ("bypass_node", bypass_node, "forward an operand of the same shape and dtype past a node"),
    ("inputize", inputize, "turn an operand into an input holding its recorded value"),
    ("consolidate_inputs", consolidate_inputs, "read inputs with identical contents through one input"),
    ("shrink_shapes", shrink_shapes, "cut input tensors down while the failure persists"),
)

BY_NAME = {name: fn for name, fn, _ in PASSES}
