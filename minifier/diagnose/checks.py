"""Accuracy checks of a compiled graph's calls: forward outputs and gradients against eager.

One library for `tdbg run --check-accuracy` (runs/instrument.py), bisect's probes (through run)
and the level-4 dumper (artifacts/dump.py):

  snapshot(gm)        an untouched copy of a graph, taken before the backend sees it (backends
                      may edit Dynamo's GraphModule in place; the reference must not run their edit)
  CallPolicy          which calls are checked: the first few of each graph, then every call with
                      an input signature not checked before, at most a bound per graph
  check_call(...)     run the user's call through the compiled callable and judge it: outputs,
                      and the inputs either side changed in place (a BatchNorm's running
                      statistics), vs eager on the snapshot (float64 reference,
                      diagnose.accuracy.compare); when
                      inputs require grad and outputs are differentiable, gradients too (compiled
                      vs eager autograd on cloned leaves, fixed random grad_outputs, float64
                      reference). The user's autograd graph, RNG state and inputs see exactly one
                      compiled call, as without the check.
  AccuracyError       what a failed check raises: graph, call number, forward or backward, the
                      mismatches and the user line each mismatching output comes from.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from tdbg.compiler.errors import TdbgError
from tdbg.minifier.diagnose.kept_state import IN_PLACE, KeptState
from tdbg.minifier.runs.names import source_line

DEFAULT_FIRST_CALLS = 3          # every graph's first calls are checked whatever their inputs
DEFAULT_NEW_SIGNATURES = 100     # later calls with a new input signature, at most this many
GRAD_OUTPUT_SEED = 0             # grad_outputs are random, but the same for compiled and eager

_STACK_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)\n\s*(?P<code>[^\n]*)')


# -- which calls --------------------------------------------------------------------------------
@dataclass(frozen=True)
class CallPolicy:
    """Check a graph's first `first` calls, then calls whose input signature was not checked
    before, `new_signatures` of them at most. `CallPolicy.every(n)` is `--check-calls N`."""
    first: int = DEFAULT_FIRST_CALLS
    new_signatures: int = DEFAULT_NEW_SIGNATURES

    def __post_init__(self):
        if self.first < 0 or self.new_signatures < 0:
            raise ValueError(f"check counts must be >= 0, got first={self.first}, "
                             f"new_signatures={self.new_signatures}")

    @classmethod
    def every(cls, n: Optional[int]) -> "CallPolicy":
        """`--check-calls N`: the first N calls of each graph, and up to N later calls with a new
        input signature; None is the default policy."""
        return cls() if n is None else cls(first=n, new_signatures=n)

    def describe(self) -> str:
        return (f"the first {self.first} call(s) of each graph and up to {self.new_signatures} later "
                "call(s) with a new input signature")


class CallCounter:
    """Per compiled graph: numbers its calls (from 1) and says which ones the policy checks."""

    def __init__(self, policy: Optional[CallPolicy] = None):
        self.policy = policy or CallPolicy()
        self.calls = 0
        self.checked = 0
        self._seen: set = set()
        self._later = 0

    def count(self) -> int:
        """Number a call that is not to be checked (no signature work); its number."""
        self.calls += 1
        return self.calls

    def next_call(self, args) -> tuple:
        """(call number, check it?) for the call about to run with `args`."""
        self.calls += 1
        sig = signature(args)
        new = sig not in self._seen
        check = self.calls <= self.policy.first
        if not check and new and self._later < self.policy.new_signatures:
            check, self._later = True, self._later + 1
        if check:
            self._seen.add(sig)
            self.checked += 1
        return self.calls, check


def signature(args) -> tuple:
    """What makes two calls different for a compiled graph: each tensor's shape, strides, dtype
    and whether it requires grad; other values themselves; and whether grad mode is on."""
    import torch
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            parts.append((tuple(a.shape), tuple(a.stride()) if a.layout == torch.strided else (),
                          str(a.dtype), a.requires_grad))
        elif isinstance(a, (int, float, bool, str, type(None))):
            parts.append((type(a).__name__, a))
        else:
            parts.append((type(a).__name__,))
    return (torch.is_grad_enabled(), tuple(parts))


# -- the untouched copy -------------------------------------------------------------------------
def snapshot(gm):
    """A copy of `gm`'s graph (new nodes, same submodules and constants): what the reference
    runs, whatever the backend later does to `gm`. One implementation, runtime.py's, which
    repro.py and every minifier query also use."""
    from tdbg.repro_templates.runtime import snapshot as untouched_copy
    return untouched_copy(gm)


# true whichever backend ran: the check switches tdbg's compiler and Inductor to eager's stream
# (runner._eager_random_numbers) and cannot switch a user's backend
RANDOM_NOTE = ("This graph draws random numbers (its eager run advanced torch's generator). Eager and the "
               "compiled graph started from the same generator state, and tdbg's compiler and Inductor drew "
               "eager's numbers (fallback_random): with them, this mismatch is not the random numbers. A backend "
               "that draws its own random numbers differs here by design.")


# -- the error ----------------------------------------------------------------------------------
class AccuracyError(TdbgError):
    """A compiled graph's call gave results that differ from eager.

    `part` is "forward" (outputs) or "backward" (gradients of the inputs); `places` maps each
    mismatching output or gradient to {"source": the user's line it comes from ("file:line in
    fn: code") or None, "fx_node": the node that produces it (or, for a gradient, that reads the
    input)}."""
    stage = "accuracy"

    def __init__(self, graph, call: int, part: str, mismatches: list, places: Optional[dict] = None,
                 draws_random: bool = False):
        self.graph, self.call, self.part = graph, call, part
        self.mismatches = list(mismatches)
        self.places = {m.output: (places or {}).get(m.output) or {} for m in self.mismatches}
        in_place = all(m.output.endswith(IN_PLACE) for m in self.mismatches)
        what = ("gradients differ from eager autograd" if part == "backward" else
                "inputs it changes in place differ from eager" if in_place else "outputs differ from eager")
        lines = [f"  {m.output} ({m.dtype}{list(m.shape)}): {m.message}" for m in self.mismatches]
        super().__init__(f"compiled graph {graph} ({part}), call {call}: {what}:\n" + "\n".join(lines)
                         + (f"\n{RANDOM_NOTE}" if draws_random else ""))

    def _first(self, key: str) -> Optional[str]:
        return next((p[key] for p in self.places.values() if p.get(key)), None)

    def evidence(self) -> dict:
        nodes = list(dict.fromkeys(p["fx_node"] for p in self.places.values() if p.get("fx_node")))
        return {"stage": self.stage, "message": str(self), "graph": self.graph, "call": self.call,
                "part": self.part, "mismatches": [m.to_dict() for m in self.mismatches],
                "places": self.places, "source": self._first("source"), "fx_node": ", ".join(nodes) or None}


# -- one checked call ---------------------------------------------------------------------------
@dataclass
class CallCheck:
    """The outcome of `check_call`: the user's result and what differs (empty lists: OK)."""
    actual: Any
    forward: list
    backward: list
    grads_checked: bool
    unchecked: Optional[str] = None   # why (part of) this call could not be checked: eager failed
    forward_checked: bool = True
    draws_random: bool = False        # the eager run advanced torch's generator


def check_call(compiled: Callable, snap, args, *, call: Callable = None) -> CallCheck:
    """Run `compiled` on the user's `args` (the one call whose outputs the user gets) and judge it.

    Forward: outputs vs `snap` run eagerly on clones of the inputs, float64 reference. Backward,
    when grad mode is on, some tensor input requires grad and some output is differentiable:
    gradients of fixed random grad_outputs w.r.t. those inputs, from a second compiled call on
    cloned leaves, vs eager autograd on `snap` (float64 reference). Inputs are cloned before the
    user's call, so graphs that mutate their inputs are judged on what they were given; the RNG
    state is put back before each run and left as the user's call left it. An exception raised
    while checking gradients carries `tdbg_during = "backward"`. When eager itself fails on the
    copy, nothing is compared and `unchecked` says why (never a silent pass)."""
    import torch
    from tdbg.minifier.diagnose.accuracy import compare, fp64_reference
    from tdbg.minifier.diagnose.same_draws import same_draws_reference
    call = call or (lambda fn, a: fn(*a))
    rng = torch.get_rng_state()
    before = _clones(args)
    wants_grads = torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
    eager_args = _clones(before)   # after the run: the inputs as eager's in-place ops left them
    state = KeptState(snap)        # what the graph reads through get_attr: the program's call alone changes it
    try:
        with torch.no_grad(), state.from_saved() as eager_state:
            expected = snap(*eager_args)
    except Exception as e:  # the reference cannot run: the call goes on unchecked, and says so
        torch.set_rng_state(rng)
        return CallCheck(call(compiled, args), [], [], False, f"eager failed on the graph: {type(e).__name__}: {e}",
                         forward_checked=False)
    # A plain float64 run draws other random numbers than eager, so its error would excuse
    # anything: a graph that draws gets the reference whose random nodes draw as eager's did
    # (same_draws), used only when it left the generator where eager did.
    eager_end = torch.get_rng_state()
    draws = not torch.equal(eager_end, rng)
    torch.set_rng_state(rng)
    actual = call(compiled, args)
    after = torch.get_rng_state()
    forward = compare(expected, _detach(actual))
    if forward:
        torch.set_rng_state(rng)
        with state.from_saved():
            reference = same_draws_reference(snap, _clones(before), eager_end) if draws \
                else fp64_reference(snap, _clones(before))
        forward = compare(expected, _detach(actual), reference)
    with state.from_saved():
        forward += changed_in_place(snap, before, eager_args, args, rng if not draws else None)
    forward += state.mismatches(eager_state)
    backward, checked, note = [], False, None
    if wants_grads and not forward and _differentiable(actual):
        needs = [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
        try:
            backward, checked = grad_check(compiled, snap, before, needs, rng, call, draws, state), True
        except EagerFailed as e:
            note = f"eager autograd failed on the graph: {e}"
    torch.set_rng_state(after)
    return CallCheck(actual, forward, backward, checked, note, draws_random=draws)


def changed_in_place(snap, before: list, eager_args: list, args: list, rng) -> list:
    """Mismatches of the tensor inputs that eager or the compiled call changed in place (a
    BatchNorm's running statistics, an `x.add_(1)`), named `NAME (changed in place)`: eager's
    copies after its run against the user's inputs after the compiled call. A float64 run from
    `rng` (None: the graph draws random numbers, no reference) judges a float mismatch."""
    import torch
    from tdbg.minifier.diagnose.accuracy import compare, to_fp64
    from tdbg.repro_templates.runtime import same_bits
    names = input_names(snap, len(args))
    changed = [i for i, (b, e, a) in enumerate(zip(before, eager_args, args)) if isinstance(b, torch.Tensor)
               and isinstance(a, torch.Tensor) and not (same_bits(b, e) and same_bits(b, a))]
    if not changed:
        return []
    labels = [names[i] + IN_PLACE for i in changed]
    expected, actual = [eager_args[i] for i in changed], [args[i].detach() for i in changed]
    found = compare(expected, actual, names=labels)
    if not found or rng is None:
        return found
    torch.set_rng_state(rng)
    inputs64 = to_fp64(_clones(before))
    try:
        with torch.no_grad():
            copy.deepcopy(snap).to(torch.float64)(*inputs64)
    except Exception:   # a graph that cannot run in float64 is judged against eager alone
        return found
    return compare(expected, actual, [inputs64[i] for i in changed], names=labels)


class EagerFailed(Exception):
    """The eager reference could not run, so there is nothing to compare with."""


def grad_check(compiled: Callable, snap, inputs: list, needs_grad: list, rng, call: Callable,
               draws_random: bool = False, state: Optional[KeptState] = None) -> list:
    """Mismatches of the compiled gradients w.r.t. the inputs flagged in `needs_grad`, each named
    after its input (`grad of NAME`), against eager autograd on `snap` (float64 reference; for a
    graph that draws random numbers, same_draws' one, when its draws were eager's). Each run
    starts from `state`'s saved values and leaves the program's as they were."""
    import copy

    import torch
    from tdbg.minifier.diagnose.accuracy import Mismatch, compare, to_fp64
    from tdbg.minifier.diagnose.same_draws import generator_matches, same_draws_fp64
    names = [f"grad of {n}" for n, need in zip(input_names(snap, len(inputs)), needs_grad) if need]
    state = state or KeptState(snap)
    torch.set_rng_state(rng)
    with state.from_saved():
        actual, n_actual = _grads(lambda *a: call(compiled, a), inputs, needs_grad, compiled=True)
    torch.set_rng_state(rng)
    try:
        with state.from_saved():
            expected, n_expected = _grads(snap, inputs, needs_grad)
    except Exception as e:
        raise EagerFailed(f"{type(e).__name__}: {e}") from e
    eager_end = torch.get_rng_state()
    if n_actual != n_expected:
        return [Mismatch("grad", "", (), float("inf"), None, f"the compiled graph returns {n_actual} "
                         f"differentiable outputs, eager {n_expected}: gradients cannot be compared")]
    found = compare(expected, actual, names=names)
    if not found:
        return found
    torch.set_rng_state(rng)
    with state.from_saved():   # the copy takes the saved values
        fp64 = same_draws_fp64(snap) if draws_random else copy.deepcopy(snap).to(torch.float64)
    try:
        reference, _ = _grads(fp64, [to_fp64(a) for a in inputs], needs_grad)
    except Exception:  # a graph that cannot run in float64 is judged against eager alone
        reference = None
    if draws_random and not generator_matches(eager_end):
        reference = None   # its draws were not eager's: its error would excuse anything
    return compare(expected, actual, reference, names=names)


def _grads(fn: Callable, inputs: list, needs_grad: list, compiled: bool = False) -> tuple:
    """(gradients, number of differentiable outputs): gradients of fn's differentiable outputs,
    with seeded random grad_outputs (the same values for every fn), w.r.t. fresh leaves of the
    flagged inputs; an input that gets no gradient gives zeros. With `compiled`, an exception
    from the backward pass carries `tdbg_during = "backward"`."""
    import torch

    from tdbg.compiler.torch_compat import pytree
    leaves = [a.detach().clone().requires_grad_(True) if need else a for a, need in zip(inputs, needs_grad)]
    wrt = [x for x, need in zip(leaves, needs_grad) if need]
    with torch.enable_grad():
        outs = [o for o in pytree.tree_leaves(fn(*leaves)) if _is_diff(o)]
    gen = torch.Generator().manual_seed(GRAD_OUTPUT_SEED)
    gouts = [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.dtype) for o in outs]
    try:
        grads = torch.autograd.grad(outs, wrt, gouts, allow_unused=True) if outs else [None] * len(wrt)
    except BaseException as e:  # noqa: B902 - re-raised, marked as the backward's failure
        if compiled:
            _mark(e, "backward")
        raise
    return [torch.zeros_like(x) if g is None else g.detach() for x, g in zip(wrt, grads)], len(outs)


def input_names(gm, count: int) -> list:
    """Readable names of a graph's inputs: Dynamo's source (`self.0.weight`, `x`) when the
    placeholder records it, else the placeholder's name."""
    names = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        grapharg = node.meta.get("grapharg")
        source = getattr(grapharg, "source", None)
        name = getattr(source, "name", None)
        name = name() if callable(name) else name
        names.append(_readable(name) if name else node.name)
    return (names + [f"input {i}" for i in range(len(names), count)])[:count]


def _readable(source: str) -> str:
    """L['self']._modules['0']._parameters['weight'] -> self.0.weight"""
    text = re.sub(r"^[LG]\['([^']+)'\]", r"\1", source)
    return re.sub(r"\._(?:modules|parameters|buffers)\['([^']+)'\]", r".\1", text)


# -- where a mismatch comes from ----------------------------------------------------------------
def places(gm, is_user_file: Callable[[str], bool]) -> dict:
    """{"out[i]", "grad of NAME" or "NAME (changed in place)": {"source", "fx_node"}} for `gm`:
    an output's producing node and its user line (the op's own line, not the call site); an
    input's gradient or in-place change, the first node reading the input that has a user line
    (else the first reader)."""
    from tdbg.minifier.diagnose.accuracy import flatten
    found = {}
    nodes = list(gm.graph.nodes)
    output = next((n for n in nodes if n.op == "output"), None)
    if output is not None:
        for path, node in flatten(output.args[0]):
            if hasattr(node, "meta"):
                found[path] = {"source": node_source(node, is_user_file), "fx_node": node.name}
    inputs = [n for n in nodes if n.op == "placeholder"]
    for name, node in zip(input_names(gm, len(inputs)), inputs):
        readers = list(node.users)
        with_line = [(r, node_source(r, is_user_file)) for r in readers]
        r, line = next(((r, s) for r, s in with_line if s), (readers[0], None) if readers else (None, None))
        if r is not None:
            found[f"grad of {name}"] = {"source": line, "fx_node": r.name}
            found[f"{name}{IN_PLACE}"] = found[f"grad of {name}"]
    for node in nodes:   # tensors read through get_attr (an optimizer's state), named by target
        readers = [(r, node_source(r, is_user_file)) for r in node.users] if node.op == "get_attr" else []
        if readers:
            r, line = next(((r, s) for r, s in readers if s), readers[0])
            found[f"{node.target}{IN_PLACE}"] = {"source": line, "fx_node": r.name}
    return found


def node_source(node, is_user_file: Callable[[str], bool]) -> Optional[str]:
    """The user's own line an FX node was traced from ('file:line in fn: code'), or None."""
    return trace_source(node.meta.get("stack_trace") or "", is_user_file)


def trace_source(trace: str, is_user_file: Callable[[str], bool]) -> Optional[str]:
    """The innermost user frame of a stack-trace text ('File "f", line N, in fn\\n    code')."""
    frames = [m.groupdict() for m in _STACK_FRAME.finditer(trace)]
    frames = [f for f in frames if is_user_file(f["file"])]
    if not frames:
        return None
    f = frames[-1]
    return source_line(f["file"], f["line"], f["function"], f["code"].strip())


# -- helpers ------------------------------------------------------------------------------------
def _clones(args) -> list:
    """Detached copies of the tensors of `args` with the same sizes AND strides: a compiled graph
    may assert its inputs' strides (Inductor does), and `clone()` makes an expanded (stride 0) or
    sliced input contiguous, which failed a correct program at stage backend."""
    import torch
    return [clone_exact(a) if isinstance(a, torch.Tensor) else a for a in args]


def clone_exact(a):
    """`a` detached and copied, sizes and strides kept (storage offset 0). A dense tensor is
    `clone()`d; any other strided one (broadcast, gapped) copies the span of storage it reads."""
    import torch
    t = a.detach()
    if t.layout != torch.strided or t.numel() == 0 or _dense(t):
        return t.clone()
    span = 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
    flat = torch.as_strided(t, (span,), (1,), t.storage_offset())
    return torch.as_strided(flat.clone(), t.shape, t.stride(), 0)


def _dense(t) -> bool:
    """Non-overlapping and dense (some permutation of a contiguous layout): clone() keeps its strides."""
    from tdbg.compiler.ir import FixedLayout
    return FixedLayout(tuple(t.shape), tuple(t.stride()), t.dtype).is_dense()


def _detach(value):
    import torch

    from tdbg.compiler.torch_compat import pytree
    return pytree.tree_map(lambda v: v.detach() if isinstance(v, torch.Tensor) else v, value)


def _is_diff(value) -> bool:
    import torch
    return isinstance(value, torch.Tensor) and value.requires_grad and (value.is_floating_point() or value.is_complex())


def _differentiable(value) -> bool:
    from tdbg.compiler.torch_compat import pytree
    return any(_is_diff(v) for v in pytree.tree_leaves(value))


def _mark(e: BaseException, during: str) -> None:
    try:
        e.tdbg_during = during
    except (AttributeError, TypeError):
        pass
