"""The wrapper: renders `output_code.py` and provides the helpers that module calls at runtime.

`output_code.py` holds the kernels' C++ source as strings, `load(config)` (builds and loads
the kernels through tdbg.compiler.build), `make_call(kernels, constants)` returning
`call(args)` (allocates buffers with torch.empty_strided, calls kernels through ctypes with
data_ptr()s, runs extern aten calls in between, returns the outputs) and a `__main__` that runs
the graph on random inputs of the compiled shapes and prints its time. `call` starts with a
prologue (`_packed.take`, `_pool.take`) so that a warm call runs no Python function per op
(WrapperCodegen._prologue says why). The debug directory's graph files are debug_files.py's.

Outputs of at least POOL_MIN_BYTES and intermediates of at least ARENA_MIN_BYTES come from the
graph's `BufferPool` instead: the storage an earlier call allocated is written again once nothing
but the pool can reach it, which saves the page faults of fresh memory (see BufferPool).

Kernel status codes: a non-zero return is 1 + the index into STATUS[kernel] naming the FX node
and the reason; `kernel_failed` turns it into KernelRuntimeError.
"""
from __future__ import annotations

import ctypes
import math
import time
from sys import getrefcount
from weakref import getweakrefcount

import sympy
import torch

from . import build, prepack, torch_compat
from .aten_calls import op_table, python_binding, with_defaults  # noqa: F401 (op_table: output_code.py imports it here)
from .config import current
from .errors import KernelRuntimeError
from . import ir
from .ir import Buffer, InputBuffer, IRNode, ReinterpretView, SymbolicUnsupported, hint
from .scheduler import ExternNode, KernelGroup

# ---- runtime helpers (imported by output_code.py) ----------------------------------------


def load_kernels(sources: dict, nargs: dict, config=None, size_args=None) -> dict:
    """{kernel name: ctypes function} built from `sources` under `config`: `nargs[name]` data
    pointers, then `size_args[name]` int64 size symbols (graphs with symbolic shapes)."""
    config = config or current()
    libs = build.build_kernels({n: f'#include "{build.PRELUDE_NAME}"\n' + s for n, s in sources.items()}, config)
    kernels = {}
    for name, path in libs.items():
        fn = build.load_kernel(path, name)
        fn.argtypes = [ctypes.c_void_p] * nargs[name] + [ctypes.c_int64] * (size_args or {}).get(name, 0)
        fn.restype = ctypes.c_int
        kernels[name] = fn
    return kernels


def restride(t: torch.Tensor, stride: tuple) -> torch.Tensor:
    """`t` when its strides already are `stride` (ignoring size-1 dims) or it is no tensor (an
    effect token), else a copy that has them. A stride of 0 over a dim of size > 1 (the graph
    traced an expand there, so `t` is constant along it) cannot be written by a copy: its first
    slice is copied and expanded back."""
    if not isinstance(t, torch.Tensor) or all(s == e or n == 1 for s, e, n in zip(t.stride(), stride, t.shape)):
        return t
    source = t
    for dim, (s, n) in enumerate(zip(stride, t.shape)):
        if s == 0 and n > 1:
            source = source.narrow(dim, 0, 1)
    out = torch.empty_strided(source.shape, stride, dtype=t.dtype, device=t.device)
    out.copy_(source)
    return out if source is t else out.as_strided(t.shape, stride)


POOL_MIN_BYTES = 1 << 20    # smaller outputs: the allocator's heap reuse already avoids page faults
# Not only glibc's mmaps from 32 MB on fault: heap memory it trims back to the OS between calls
# faults again too. ConvNeXt-tiny's training step (2 threads) took 28-46k faults per step with
# 32 MB here, 28k (all of them aten's own conv-backward buffers) with 1 MB: 361 -> 337 ms.
ARENA_MIN_BYTES = 1 << 20
POOL_DEPTH = 2              # storages kept per slot: `x = f(x)` loops alternate between two
_storage_use_count = torch_compat.storage_use_count
below_autograd = torch_compat.AutoDispatchBelowADInplaceOrView


class BufferPool:
    """Recycled storages for one compiled graph: a slot per large output, and arena slots that
    intermediates of at least ARENA_MIN_BYTES with disjoint lifetimes share (`nbytes[slot]` is
    the largest a slot serves).

    `empty_strided(size, stride, dtype=, slot=)` returns a tensor like torch.empty_strided's. It
    writes over a storage the slot allocated before when that storage is unobservable: nothing
    references its StorageImpl but the pool (no tensor, view, `.data`/detach alias, autograd
    saved tensor, DLPack capsule or numpy array, which all hold the StorageImpl or the tensor),
    no Python reference to the pool's storage object exists besides the pool's
    (`t.untyped_storage()` hands out that same object), no weak reference to it exists, and its
    data pointer is the one it was allocated with (not moved to shared memory, not resized).
    Otherwise it allocates a fresh storage and keeps it, dropping the oldest of POOL_DEPTH. The
    returned tensor is always a new, non-view tensor object at version 0.

    With `exact=False` (a graph with symbolic sizes: `nbytes` are the example's, not a bound) a
    kept storage is reused only when it holds the requested size; a larger request allocates."""

    def __init__(self, nbytes: list, exact: bool = True):
        self._nbytes, self._exact = nbytes, exact
        self._slots = [[] for _ in nbytes]   # per slot: (storage, data_ptr), oldest first
        self._empty = {}                     # dtype -> bound `new` of an empty tensor

    def empty_strided(self, size, stride, dtype, slot):
        need = 0 if self._exact else _extent(size, stride) * dtype.itemsize
        kept = self.take(((size, stride, dtype, slot, need),))[0]
        if kept is not None:
            return kept
        out = torch.empty_strided(size, stride, dtype=dtype)
        storage = out.untyped_storage()
        if storage.nbytes() < self._nbytes[slot]:   # an arena slot sized for a larger buffer
            storage = torch.UntypedStorage(self._nbytes[slot])
            out = self._on(storage, size, stride, dtype)
        entries = self._slots[slot]
        if len(entries) >= POOL_DEPTH:
            del entries[0]
        entries.append((storage, storage.data_ptr()))
        return out

    def take(self, sites) -> list:
        """This call's tensor for each pooled allocation `(size, stride, dtype, slot, nbytes)` in
        order (wrapper.py's prologue): on its slot's kept storage where that storage is
        unobservable now (as in empty_strided; the allocations of one arena slot share it, their
        lifetimes being disjoint), else None, and that allocation calls empty_strided. Runs no
        Python function per allocation: the prologue's reason."""
        need, chosen, out = {}, {}, []
        if not self._exact:   # a slot serves the largest of its allocations in this call
            for _size, _stride, _dtype, slot, nbytes in sites:
                need[slot] = max(need.get(slot, 0), nbytes)
        with below_autograd():   # set_ below ADInplaceOrView: version 0, like a fresh tensor
            for size, stride, dtype, slot, _nbytes in sites:
                storage = chosen.get(slot, False)
                if storage is False:
                    storage = chosen[slot] = None
                    least = need.get(slot, 0)
                    for kept, ptr in self._slots[slot]:
                        # 3 references while unobservable: the entry tuple, the loop variable, the argument
                        if (getrefcount(kept) == 3 and _storage_use_count(kept._cdata) == 1
                                and not getweakrefcount(kept) and kept.data_ptr() == ptr and kept.nbytes() >= least):
                            storage = chosen[slot] = kept
                            break
                if storage is None:
                    out.append(None)
                    continue
                new = self._empty.get(dtype)
                if new is None:
                    new = self._empty[dtype] = torch.empty(0, dtype=dtype).new
                out.append(new().set_(storage, 0, size, stride))
        return out

    def _on(self, storage, size, stride, dtype):
        new = self._empty.get(dtype)
        if new is None:
            new = self._empty[dtype] = torch.empty(0, dtype=dtype).new
        with below_autograd():   # set_ below ADInplaceOrView: version 0, like a fresh tensor
            return new().set_(storage, 0, size, stride)

    def clear(self) -> None:
        """Forget every kept storage (memory returns to the allocator once unreferenced)."""
        for entries in self._slots:
            entries.clear()

    def __len__(self):
        return sum(len(entries) for entries in self._slots)


def _extent(size, stride) -> int:
    """Elements a tensor of `size` and `stride` spans from its first (0 for an empty one)."""
    if 0 in size:
        return 0
    return 1 + sum((sz - 1) * st for sz, st in zip(size, stride))


def as_strided(t: torch.Tensor, size, stride, offset) -> torch.Tensor:
    return torch.as_strided(t, size, stride, t.storage_offset() + offset)


def kernel_recorder():
    """The context manager that names a kernel in torch.profiler (kernel profiling): torch's C++
    fast record function; `torch.profiler.record_function` costs 50-110 us per kernel, which the
    profiler would book as the compiled graph's own time."""
    return torch_compat.RecordFunctionFast


def kernel_failed(status: int, kernel: str, table: dict, sources: dict):
    fx_node, message = table[kernel][status - 1] if 0 < status <= len(table[kernel]) else ("?", f"status {status}")
    raise KernelRuntimeError(f"{message} (FX node {fx_node})", kernel=kernel, fx_nodes=(fx_node,),
                             source=sources.get(kernel, ""))


def random_input(size, stride, dtype) -> torch.Tensor:
    out = torch.empty_strided(size, stride, dtype=dtype)
    if dtype.is_floating_point:
        return out.copy_(torch.randn(size, dtype=dtype))
    if dtype == torch.bool:
        return out.copy_(torch.randint(0, 2, size).bool())
    return out.copy_(torch.randint(0, 2, size, dtype=dtype))


def main(graph: str, call, inputs: list, constants: dict, repeat: int = 100) -> None:
    args = [random_input(*spec) if isinstance(spec, tuple) else spec for spec in inputs]
    for _ in range(5):   # warm-up: library loading, OpenMP thread pool start
        call(list(args))
    start = time.perf_counter()
    for _ in range(repeat):
        call(list(args))
    per_call = (time.perf_counter() - start) / repeat
    print(f"{graph}: {per_call * 1e3:.3f} ms per call ({repeat} calls)")


# ---- rendering -----------------------------------------------------------------------------

def pysize(e) -> str:
    """Python source of a size: an int, or a sympy expression over the size symbols ks<i> (which
    output_code.py's call() reads from its inputs)."""
    if isinstance(e, int):
        return str(e)
    try:
        return ir.render_int(e, "//")
    except NotImplementedError:
        raise SymbolicUnsupported(f"size expression {e} in the wrapper") from None


def pysizes(seq) -> str:
    """A tuple of sizes as Python source (the repr of a tuple when all are ints)."""
    items = [pysize(s) for s in seq]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def pyexpr(x) -> str:
    """Python source for an extern call argument or a graph output."""
    if isinstance(x, ReinterpretView):
        lay = x.layout
        base = x.buffer.name   # torch.as_strided's offset is absolute: the view's is relative to its base's
        return f"torch.as_strided({base}, {pysizes(lay.size)}, {pysizes(lay.stride)}, " \
               f"{base}.storage_offset() + {pysize(lay.offset)})"
    if isinstance(x, sympy.Expr):
        return pysize(x)
    if isinstance(x, Buffer):
        return x.name
    if isinstance(x, (list, tuple)):
        inner = ", ".join(pyexpr(v) for v in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner}{',' if len(x) == 1 else ''})"
    if isinstance(x, torch_compat.OpOverload):   # a value, not a call: never the binding table
        return f"torch.ops.{x}"
    if isinstance(x, torch_compat.HigherOrderOperator):
        return _target_expr(x)
    if isinstance(x, torch.dtype):
        return str(x)
    if isinstance(x, torch.device):
        return f"torch.device({str(x)!r})"
    if isinstance(x, (torch.memory_format, torch.layout)):
        return str(x)
    if isinstance(x, float) and (math.isinf(x) or math.isnan(x)):
        return f"float({str(x)!r})"
    return repr(x)


class WrapperCodegen:
    """Renders output_code.py for one compiled graph."""

    def __init__(self, name, graph_inputs, graph_outputs, items, plan, kernels, config, graph_number, buffers,
                 placeholders, kind="inference"):
        self.name, self.graph_inputs, self.graph_outputs = name, graph_inputs, graph_outputs
        # extern GEMMs/convolutions on a packed weight (prepack.py): kernel name -> (slot, method, args)
        rewrites = [(item.kernel.name, prepack.rewrite(item.kernel, kind, config))
                    for item in items if isinstance(item, ExternNode)]
        slots: dict = {}   # prepack.slot_key -> slot: calls packing one weight the same way share it
        self.packed = {name: (slots.setdefault(prepack.slot_key(*how), len(slots)), *how)
                       for name, how in rewrites if how}
        self.placeholders = placeholders
        self.buffers = buffers
        self.items, self.plan, self.kernels, self.config = items, plan, kernels, config
        self.graph_number = graph_number
        self.lines = []
        self.sizes = ir.current_shapes()   # ShapeSymbols of a symbolic compilation, else None
        self._read, self._checked = set(), set()   # size symbols read so far, size checks emitted
        if self.sizes is not None:
            missing = sorted(str(s) for s in self.sizes.hints if s not in self.sizes.sources)
            if missing:
                raise SymbolicUnsupported(f"size symbol(s) {missing} are no input's size, stride or scalar")

    def line(self, text, depth=2):
        self.lines.append("    " * depth + text)

    def render(self) -> str:
        self.aten_calls = {}   # "op.overload" -> torch binding name or None, filled by _extern_call
        self.allocated = set()   # buffers allocated by this graph (storage offset 0), filled by _alloc
        body = self._body()
        if self.sizes and len(self._checked) != len(self.sizes.asserts):
            raise SymbolicUnsupported("a runtime size check on sizes this graph never reads")
        head = [f"# tdbg output code for graph {self.name}",
                "# Run `python output_code.py` to time this graph on random inputs.",
                "import torch", "from torch import empty_strided",
                "from tdbg.compiler.wrapper import (BufferPool as _BufferPool,",
                "                                   below_autograd as _below_autograd, kernel_failed as _kernel_failed,",
                "                                   kernel_recorder as _kernel_recorder, load_kernels, main as _main,",
                "                                   op_table as _op_table, restride as _restride)",
                *(["from tdbg.compiler.prepack import PackedWeights as _PackedWeights"] if self.packed else []),
                "# the aten overloads this graph calls: torch.<op> where that builtin runs exactly the",
                "# overload (the faster call), else the overload itself (see tdbg.compiler.aten_calls.op_table)",
                "ATEN_CALLS = {" + ", ".join(f"{k!r}: {v!r}" for k, v in self.aten_calls.items()) + "}",
                "aten = _op_table('aten', ATEN_CALLS)", "prims = torch.ops.prims", "",
                f"GRAPH = {self.name!r}", "KERNELS = {"]
        for k in self.kernels:
            head.append(f"    {k.name!r}: r'''\n{k.source}''',")
        head += ["}", "NARGS = {" + ", ".join(f"{k.name!r}: {len(k.args)}" for k in self.kernels) + "}",
                 "SIZE_ARGS = {" + ", ".join(f"{k.name!r}: {len(k.size_args)}" for k in self.kernels
                                             if k.size_args) + "}",
                 "STATUS = {" + ", ".join(f"{k.name!r}: {k.status_nodes!r}" for k in self.kernels) + "}",
                 "INPUTS = [" + ", ".join(self._input_spec(p) for p in self.placeholders) + "]",
                 "", "", "def load(config=None):", "    return load_kernels(KERNELS, NARGS, config, SIZE_ARGS)", "", "",
                 "def make_call(kernels, constants=None):"]
        tail = ["", "", 'if __name__ == "__main__":',
                "    _consts = {" + ", ".join(f"{b.name!r}: torch.randn({tuple(b.size)}).to({b.dtype})"
                                             for b in self.graph_inputs if hasattr(b, "constant")) + "}",
                "    _main(GRAPH, make_call(load(), _consts), INPUTS, _consts)", ""]
        return "\n".join(head + body + tail)

    def _body(self) -> list:
        """The lines of make_call (indented), filling self.aten_calls."""
        for k in self.kernels:
            self.line(f"_k_{k.name} = kernels[{k.name!r}]", 1)
        for b in self.graph_inputs:
            if hasattr(b, "constant"):
                self.line(f"{b.name} = constants[{b.name!r}]", 1)
        if self.config.enable_kernel_profile:
            self.line("_record = _kernel_recorder()", 1)
        self._plan_pool()
        if self.packed:
            self.line("_packed = _PackedWeights()", 1)
        self.line("", 0)
        self.line("def call(args):", 1)
        params = self.placeholders
        if params:
            self.line(f"{', '.join(params)}{',' if len(params) == 1 else ''} = args")
        self.line("args.clear()")
        for sym, (name, kind, dim) in sorted(self.sizes.sources.items(), key=lambda kv: str(kv[0])) \
                if self.sizes else ():   # the size symbols of this call (ir.ShapeSymbols)
            if kind != "output":   # data-dependent sizes are read after the call that makes them
                self.line(f"{sym} = " + {"size": f"{name}.size({dim})", "stride": f"{name}.stride({dim})",
                                         "scalar": f"int({name})"}[kind])
                self._read.add(sym)
        self._size_checks()
        for b in self.graph_inputs:
            if not hasattr(b, "constant"):
                self._restride(b)
        self._prologue()
        by_name = {k.group_index: k for k in self.kernels}
        for pos, item in enumerate(self.items):
            for name, reuse in self.plan.allocs[pos]:
                self._alloc(name, reuse)
            if isinstance(item, KernelGroup):
                self._kernel_call(by_name[pos])
            else:
                self._extern_call(item)
            dels = [n for n in self.plan.frees[pos] if n not in self.plan.reused]
            if dels:
                self.line(f"del {', '.join(dels)}")
        outs = ", ".join(self._expr(o) for o in self.graph_outputs)
        self.line(f"return ({outs}{',' if len(self.graph_outputs) == 1 else ''})")
        if self.pool_slots:
            self.line("call.pool = _pool", 1)
        self.line("return call", 1)
        return self.lines

    def _expr(self, x) -> str:
        """pyexpr, with views spelled as torch.as_strided calls (no helper frame): the view's
        offset is relative to its buffer's own, so it is left implicit when 0 (as_strided keeps
        the base's offset) and written out only over buffers this graph allocated (offset 0)."""
        if isinstance(x, ReinterpretView):
            lay, base = x.layout, x.buffer.name
            if ir.same(lay.offset, 0):
                return f"torch.as_strided({base}, {pysizes(lay.size)}, {pysizes(lay.stride)})"
            if base in self.allocated:
                return f"torch.as_strided({base}, {pysizes(lay.size)}, {pysizes(lay.stride)}, {pysize(lay.offset)})"
            return pyexpr(x)
        if isinstance(x, (list, tuple)) and not isinstance(x, IRNode):
            inner = ", ".join(self._expr(v) for v in x)
            return f"[{inner}]" if isinstance(x, list) else f"({inner}{',' if len(x) == 1 else ''})"
        return pyexpr(x)

    def _input_spec(self, name):
        buf = self.buffers.get(name)
        if buf is None:
            value = self.scalars[name]
            return repr(ir.hint(ir.as_size(value)) if isinstance(value, torch.SymInt) else value)
        size, stride = (tuple(map(ir.hint, seq)) for seq in (buf.size, buf.layout.stride))   # examples' sizes
        return f"({size}, {stride}, {buf.dtype})"

    def _plan_pool(self):
        """BufferPool slots for large outputs and intermediates; aten results that get one are
        written through the op's out= overload (`out_variants`)."""
        self.out_variants, allocs = {}, []
        for here, item in zip(self.plan.allocs, self.items):
            out = out_variant(item.kernel) if isinstance(item, ExternNode) and item.kernel.name not in self.packed \
                else None
            if out is not None:
                self.out_variants[item.kernel.name] = out
                here = here + [(item.kernel.name, None)]
            allocs.append(here)
        # symbolic sizes: slots planned on the example's bytes, each reuse checked against the call's
        self.pool_slots, pool_bytes = pool_slots(allocs, self.plan, self.graph_outputs, self.buffers) \
            if self.config.reuse_outputs else ({}, [])
        if self.pool_slots:
            self.line(f"_pool = _BufferPool({pool_bytes}{', exact=False' if self.sizes else ''})", 1)

    def _prologue(self):
        """One call each to `_packed.take` and `_pool.take` for every packed weight and pooled
        allocation whose sizes are known at the start, so that the graph's steady state calls no
        Python function per op (their lines then use what these returned). Why: CPython 3.11 and
        3.12 keep frames on a stack of 16 KiB chunks and free a chunk as soon as the frame at its
        base returns, so a caller whose frame ends near a chunk's end maps and unmaps a chunk for
        every Python function it calls (CPython issue 142183; its fix, one kept chunk, went to 3.13 and 3.14). Whether
        that happens depends on how deep the caller of the compiled model is: MobileNetV2 (52
        convolutions, 53 pooled buffers) ran 208 mmap/munmap pairs a call from one call site, and
        none one frame deeper."""
        self.pool_sites = {}   # pooled buffer name -> its index in `_pool.take`'s list
        sites = []
        for pos, item in enumerate(self.items):
            names = [n for n, reuse in self.plan.allocs[pos] if reuse is None] + \
                    ([item.kernel.name] if isinstance(item, ExternNode) and item.kernel.name in self.out_variants else [])
            for name in names:
                lay = self.buffers[name].layout
                exprs = (*lay.size, *lay.stride, lay.storage_numel())
                if name in self.pool_slots and self._known(exprs):
                    self.pool_sites[name] = len(sites)
                    nbytes = pysize(lay.storage_numel() * lay.dtype.itemsize)
                    sites.append(f"({pysizes(lay.size)}, {pysizes(lay.stride)}, {lay.dtype}, "
                                 f"{self.pool_slots[name]}, {nbytes})")
        self.packed_sites, specs = {}, []   # packed call -> its index in `_packed.take`'s list
        for name, (slot, method, args) in self.packed.items():
            bias, extra, how = prepack.take_spec(method, args)
            if bias is None or isinstance(getattr(bias, "buffer", bias), InputBuffer):   # known at the start
                self.packed_sites[name] = len(specs)
                specs.append(f"({len(specs)}, {slot}, {method!r}, {self._expr(args[1])}, {self._expr(bias)}, "
                             f"{self._source(extra)}, {self._source(how)})")
        if specs:
            self.line(f"_pk = _packed.take(({', '.join(specs)},))")
        if sites:
            self.line(f"_pl = _pool.take(({', '.join(sites)},))")

    def _known(self, exprs) -> bool:
        """Whether `exprs` use only sizes read at the start (no data-dependent one)."""
        return all(isinstance(e, int) or sympy.sympify(e).free_symbols <= self._read for e in exprs)

    def _source(self, value) -> str:
        """Python source of a constant made of tuples, ints, sizes, bools and strings."""
        if isinstance(value, tuple):
            return "(" + ", ".join(map(self._source, value)) + ("," if len(value) == 1 else "") + ")"
        if isinstance(value, (bool, str)) or value is None:
            return repr(value)
        return pysize(value)

    def _restride(self, b):
        stride = pysizes(b.layout.stride)
        if 0 in b.layout.size:   # an effect token may be no tensor at run time
            self.line(f"{b.name} = _restride({b.name}, {stride})")
        else:   # the exact-stride test keeps the usual case to one comparison
            self.line(f"if {b.name}.stride() != {stride}: {b.name} = _restride({b.name}, {stride})")

    def _alloc(self, name, reuse):
        buf = self.buffers[name]
        lay = buf.layout
        if reuse is None or reuse in self.allocated:   # a fresh tensor: storage offset 0
            self.allocated.add(name)
        if reuse is not None:
            self.line(f"{name} = {reuse}; del {reuse}  # reuse")
        elif name in self.pool_slots:
            fresh = f"_pool.empty_strided({pysizes(lay.size)}, {pysizes(lay.stride)}, dtype={lay.dtype}, " \
                    f"slot={self.pool_slots[name]})"
            i = self.pool_sites.get(name)
            self.line(f"{name} = {fresh}" if i is None else f"{name} = {fresh} if _pl[{i}] is None else _pl[{i}]")
        else:
            self.line(f"{name} = empty_strided({pysizes(lay.size)}, {pysizes(lay.stride)}, dtype={lay.dtype})")

    def _kernel_call(self, k):
        args = ", ".join([f"{b}.data_ptr()" for b in k.args] + list(k.size_args))
        call = f"_status = _k_{k.name}({args})"
        fail = f"if _status: _kernel_failed(_status, {k.name!r}, STATUS, KERNELS)"
        if self.config.enable_kernel_profile:
            self.line(f"with _record('graph_{self.graph_number}_{k.name}'):")
            self.line(call, 3)
        else:
            self.line(call)
        self.line(fail)

    def _extern_call(self, item: ExternNode):
        kernel = item.kernel
        if kernel.name in self.packed:
            return self._packed_call(kernel)
        call_args, call_kwargs = kernel.args, kernel.kwargs
        target, depth, pooled = kernel.target, 2, kernel.name in self.pool_slots
        if pooled:   # a pooled result: the op writes it through its out= overload
            self._alloc(kernel.name, None)
            target, depth = self.out_variants[kernel.name], 3
            # below autograd: out= refuses inputs that require grad, which a graph's callers may pass
            self.line("with _below_autograd():")
        expr = _target_expr(target)
        if expr.startswith("aten."):
            binding = python_binding(target, call_args, call_kwargs, out=pooled)
            if binding is not None:   # the binding gets no omitted argument (its defaults may differ)
                call_args, call_kwargs = with_defaults(target, call_args, call_kwargs)
            key = expr[len("aten."):]
            self.aten_calls[key] = binding if self.aten_calls.get(key, binding) == binding else None
        args = [self._expr(a) for a in call_args] + [f"{k}={self._expr(v)}" for k, v in call_kwargs.items()]
        if pooled:
            args.append(f"out={kernel.name}")
        self.line(f"{kernel.name} = {expr}({', '.join(args)})  # FX: {kernel.node.name}", depth)
        self._extern_outputs(kernel)

    def _packed_call(self, kernel):
        slot, method, args = self.packed[kernel.name]
        general = f"_packed.{method}({slot}, {', '.join(self._expr(a) for a in args)})"
        j = self.packed_sites.get(kernel.name)
        fast = f"_pk[{j}][0]({self._expr(args[0])}, *_pk[{j}][1]) if _pk[{j}] is not None else " if j is not None else ""
        self.line(f"{kernel.name} = {fast}{general}  # FX: {kernel.node.name} (packed weight)")
        self._extern_outputs(kernel)

    def _size_checks(self):
        """Each runtime check of sizes (ShapeSymbols.asserts) once every size in it is read."""
        for i, (cond, message) in enumerate(self.sizes.asserts if self.sizes else ()):
            if i not in self._checked and cond.free_symbols <= self._read:
                self._checked.add(i)
                self.line(f"if not ({pysize(cond.lhs)} {cond.rel_op} {pysize(cond.rhs)}): "
                          f"raise RuntimeError({message!r})")

    def _extern_outputs(self, kernel):
        """Name each output of an extern call and give it the strides the graph expects."""
        for out in kernel.outputs:
            if out.expr != out.name:
                self.line(f"{out.name} = {out.expr}")
            for sym, (name, kind, dim) in (self.sizes.sources.items() if self.sizes else ()):
                if kind == "output" and name == out.name:
                    self.line(f"{sym} = {name}.size({dim})  # data-dependent")
                    self._read.add(sym)
                    self._size_checks()
            self._restride(out)


def out_variant(kernel):
    """The `.out` overload that computes `kernel`'s single, freshly allocated result into a given
    tensor (same arguments plus `out`), else None. Only an out= with a CPU kernel of its own
    counts: torch generates the others (convolution.out, embedding_dense_backward.out,
    native_layer_norm.out, ...) as the functional op into a fresh tensor plus a copy into `out`,
    a whole extra pass over the result (a ResNet's saved conv outputs, BERT's 94 MB embedding
    gradient) that costs more than the page faults the pool saves."""
    target = kernel.target
    if not isinstance(target, torch_compat.OpOverload) or len(kernel.outputs) != 1 or kernel.mutated:
        return None
    schema = target._schema
    if (schema.is_mutable or len(schema.returns) != 1 or schema.returns[0].alias_info is not None
            or kernel.outputs[0].expr != kernel.name):
        return None
    if "out" not in target.overloadpacket.overloads():
        return None
    out = target.overloadpacket.out
    if not torch_compat.has_kernel_for_dispatch_key(out.name(), "CPU"):
        return None
    outs = [a.name for a in out._schema.arguments if a.is_out]
    same = [a.name for a in out._schema.arguments if not a.is_out] == [a.name for a in schema.arguments]
    return out if outs == ["out"] and same else None


def pool_slots(allocs, plan, graph_outputs, buffers) -> tuple:
    """({allocated buffer name: BufferPool slot}, [bytes per slot]) for `allocs` (per item: (name,
    reused name or None) as in plan.allocs): a slot of its own for each fresh allocation of at
    least POOL_MIN_BYTES whose storage a graph output returns (directly, as a view, or through
    memory-plan reuse); arena slots for other allocations of at least ARENA_MIN_BYTES, shared by
    buffers whose storages are not live at the same time."""
    root = {}
    for here in allocs:
        for name, reuse in here:
            root[name] = root.get(reuse, reuse) if reuse is not None else name

    def nbytes(name):   # the example's bytes: symbolic sizes plan on their hints (BufferPool exact=False)
        lay = buffers[name].layout
        return hint(lay.storage_numel()) * lay.dtype.itemsize

    slots, sizes = {}, []
    for out in graph_outputs:
        where = out.storage() if isinstance(out, IRNode) else None
        name = root.get(where[0].name) if where else None
        if name is not None and name not in slots and nbytes(name) >= POOL_MIN_BYTES:
            slots[name] = len(sizes)
            sizes.append(nbytes(name))
    free, holder = [], {}   # free arena slots; arena slot -> allocation using it
    for here, frees in zip(allocs, plan.frees):
        for name, reuse in here:
            need = nbytes(name)
            if reuse is not None or name in slots or need < ARENA_MIN_BYTES:
                continue
            fits = [k for k in free if sizes[k] >= need]
            slot = min(fits, key=sizes.__getitem__) if fits else len(sizes)
            if fits:
                free.remove(slot)
            else:
                sizes.append(need)
            slots[name], holder[slot] = slot, name
        for name in frees:
            if name not in plan.reused:
                free += [k for k, user in holder.items() if user == root.get(name) and k not in free]
    return slots, sizes


def _target_expr(target) -> str:
    if isinstance(target, torch_compat.HigherOrderOperator):
        return f"torch.ops.higher_order.{target.name()}"
    text = str(target)
    if text.startswith(("aten.", "prims.")):
        return text
    return f"torch.ops.{text}"
