"""The wrapper's BufferPool: a large output the caller dropped is written again by the next call
(no fresh, page-faulting allocation); one anything can still observe is never touched."""
import threading
import weakref

import numpy as np
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten, lowering
from tdbg.compiler.config import current
from tdbg.compiler.decompositions import decomposition_table
from tdbg.compiler.wrapper import ARENA_MIN_BYTES, POOL_DEPTH, POOL_MIN_BYTES, BufferPool

ROWS, COLS = 512, 1024          # 2 MB of float32: above POOL_MIN_BYTES
assert ROWS * COLS * 4 >= POOL_MIN_BYTES


def compile_fn(fn, *inputs, **cfg):
    lowering.reset_counters()
    gm = make_fx(fn, decomposition_table=decomposition_table(current()))(*inputs)
    return compile_aten(gm, list(inputs), current().replace(**cfg))


def big(seed):
    return torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def add():
    """a + b on two 2 MB inputs."""
    return compile_fn(lambda a, b: a + b, big(0), big(1))


def test_a_dropped_output_is_written_again_with_right_values(add):
    a, b = big(2), big(3)
    out = add(a, b)
    ptr = out.data_ptr()
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)
    del out
    c, d = big(4), big(5)
    again = add(c, d)
    assert again.data_ptr() == ptr
    torch.testing.assert_close(again, c + d, rtol=0, atol=0)
    assert again._version == 0 and not again.requires_grad and again._base is None
    assert (again.shape, again.stride(), again.dtype) == ((ROWS, COLS), (COLS, 1), torch.float32)


def _storage_tensor(storage):
    return torch.empty(0).set_(storage, 0, (ROWS, COLS), (COLS, 1))


# (name, hold(out) -> holder, read(holder) -> the last rows of `out` the holder sees)
HOLDERS = [
    ("the tensor", lambda t: t, lambda h: h),
    ("a slice", lambda t: t[ROWS // 2:], lambda h: h),
    ("a flat view", lambda t: t.view(-1), lambda h: h.view(ROWS, COLS)),
    ("a transposed view", lambda t: t.t(), lambda h: h.t()),
    ("numpy", lambda t: t.numpy(), torch.from_numpy),
    ("np.asarray", np.asarray, torch.from_numpy),
    (".data", lambda t: t.data, lambda h: h),
    ("detach()", lambda t: t.detach(), lambda h: h),
    ("untyped_storage()", lambda t: t.untyped_storage(), _storage_tensor),
    ("a DLPack capsule", torch.utils.dlpack.to_dlpack, torch.utils.dlpack.from_dlpack),
    ("torch.from_dlpack", torch.from_dlpack, lambda h: h),
    ("a list", lambda t: [t], lambda h: h[0]),
]


@pytest.mark.parametrize("name,hold,read", HOLDERS, ids=[h[0] for h in HOLDERS])
def test_an_output_still_reachable_is_not_reused(add, name, hold, read):
    a, b = big(6), big(7)
    out = add(a, b)
    ptr, expected = out.data_ptr(), a + b
    holder = hold(out)
    del out
    for seed in (8, 9):   # two calls: every kept storage of the slot is tried
        c, d = big(seed), big(seed + 10)
        other = add(c, d)
        assert other.data_ptr() != ptr
        torch.testing.assert_close(other, c + d, rtol=0, atol=0)
    seen = read(holder)
    torch.testing.assert_close(seen, expected[ROWS - len(seen):], rtol=0, atol=0)


def test_a_weakref_to_the_storage_blocks_reuse_while_the_pool_keeps_it(add):
    a, b = big(60), big(61)
    out = add(a, b)
    ptr, expected, ref = out.data_ptr(), a + b, weakref.ref(out.untyped_storage())
    del out
    assert add(big(62), big(63)).data_ptr() != ptr
    torch.testing.assert_close(_storage_tensor(ref()), expected, rtol=0, atol=0)


def test_an_output_saved_for_backward_keeps_its_values(add):
    a, b = big(11), big(12)
    out = add(a, b)
    expected = out.clone()
    w = torch.randn(ROWS, COLS, requires_grad=True)
    loss = (out * w).sum()          # mul saves `out` for w's gradient
    del out
    for seed in (13, 14):
        add(big(seed), big(seed + 1))
    loss.backward()
    torch.testing.assert_close(w.grad, expected, rtol=0, atol=0)


def test_forward_activations_saved_by_aot_autograd_survive_a_second_forward():
    """A training step: the compiled forward returns the exp (a saved activation, 2 MB); a second
    forward before the first backward must not write over it."""
    def f(x):
        return torch.exp(x * 3.0 - 1.0).sum(1).mean()
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="tdbg")
    xs = [big(s).div_(4).requires_grad_() for s in (15, 16, 17)]
    losses = [compiled(x) for x in xs[:2]]
    for x, loss in zip(xs, losses):
        loss.backward()
        ref = x.detach().clone().requires_grad_()
        f(ref).backward()
        torch.testing.assert_close(x.grad, ref.grad)
    loss = compiled(xs[2])          # after the backwards the activations are free again
    loss.backward()
    torch._dynamo.reset()


def test_the_threshold_keeps_small_outputs_out_of_the_pool():
    n = POOL_MIN_BYTES // 4
    pooled = compile_fn(lambda a: a * 2.0, torch.randn(n))
    small = compile_fn(lambda a: a * 2.0, torch.randn(n - 1))
    assert "_pool.empty_strided((262144,), (1,), dtype=torch.float32, slot=0)" in pooled.source_code
    assert "_BufferPool" not in small.source_code.split("def make_call")[1]
    assert "empty_strided((262143,), (1,), dtype=torch.float32)" in small.source_code
    assert len(pooled._call.pool) == 0
    x = torch.randn(n)
    torch.testing.assert_close(pooled(x), x * 2.0)
    assert len(pooled._call.pool) == 1
    assert not hasattr(small._call, "pool")


def test_multiple_outputs_and_outputs_aliasing_each_other_and_inputs():
    def f(a, b):
        s = a + b
        return s, s.t(), a * b, a, s
    compiled = compile_fn(f, big(20), big(21))
    assert compiled.source_code.count("_pool.empty_strided(") == 2    # s and a * b
    a, b = big(22), big(23)
    s, st, p, same_a, s2 = compiled(a, b)
    assert same_a is a or same_a.data_ptr() == a.data_ptr()
    assert st.data_ptr() == s.data_ptr() == s2.data_ptr()
    s_ptr, p_ptr, s_expected = s.data_ptr(), p.data_ptr(), a + b
    del s, s2, p                         # the transposed view keeps s's storage alive
    c, d = big(24), big(25)
    out = compiled(c, d)
    assert out[2].data_ptr() == p_ptr    # a * b was dropped: reused
    assert out[0].data_ptr() != s_ptr    # s is still visible through `st`
    torch.testing.assert_close(st.t(), s_expected, rtol=0, atol=0)
    for got, want in zip(out, f(c, d)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_x_equals_f_of_x_alternates_between_two_storages(add):
    x, y = big(30), big(31)
    want = x.clone()
    ptrs = []
    for _ in range(6):
        x = add(x, y)
        want = want + y
        ptrs.append(x.data_ptr())
    torch.testing.assert_close(x, want)
    assert POOL_DEPTH == 2 and len(set(ptrs[1:])) == 2
    assert ptrs[2] == ptrs[4] and ptrs[3] == ptrs[5]


def test_inference_mode_and_grad_mode_outputs_match_a_fresh_allocation(add):
    a, b = big(40), big(41)
    with torch.inference_mode():
        inf = add(a, b)
        assert inf.is_inference()
        ptr = inf.data_ptr()
        del inf
        inf = add(a, b)
        assert inf.is_inference() and inf.data_ptr() == ptr
    del inf
    out = add(a, b)
    assert out.data_ptr() == ptr and not out.is_inference() and out._version == 0
    out.add_(1)                           # an ordinary tensor: in-place ops work and count
    assert out._version == 1
    torch.testing.assert_close(out, a + b + 1)


def test_concurrent_calls_never_share_an_output(add):
    a, b = big(50), big(51)
    want = a + b
    errors = []

    def run():
        for _ in range(20):
            out = add(a, b)
            out.mul_(2)                   # a shared storage would be doubled twice
            if not torch.equal(out, want * 2):
                errors.append("wrong values")

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_large_intermediates_share_arena_slots_and_extern_results_use_out_overloads():
    """relu -> cumsum (aten) -> sigmoid -> cumsum -> sum, all ARENA_MIN_BYTES but the sum: the two
    kernel intermediates share one arena slot, the two aten results another (through cumsum.out)."""
    def f(a):
        return torch.cumsum(torch.sigmoid(torch.cumsum(torch.relu(a), 1)), 1).sum(1)
    a = torch.randn(ARENA_MIN_BYTES // 4 // 1024, 1024)
    compiled = compile_fn(f, a)
    src = compiled.source_code
    assert f"_BufferPool([{ARENA_MIN_BYTES}, {ARENA_MIN_BYTES}])" in src
    assert src.count("aten.cumsum.out(") == 2 and src.count("slot=0)") == 2 and src.count("slot=1)") == 2
    torch.testing.assert_close(compiled(a), f(a))
    storages = {id(s) for entries in compiled._call.pool._slots for s, _ in entries}
    b = torch.randn(a.shape)
    torch.testing.assert_close(compiled(b), f(b))
    assert {id(s) for entries in compiled._call.pool._slots for s, _ in entries} == storages


def test_an_extern_output_is_pooled_through_out_and_accepts_inputs_requiring_grad():
    a, w = torch.randn(ROWS, 64), torch.randn(64, COLS)
    compiled = compile_fn(torch.mm, a, w, pack_weights=False)   # a graph input as B is packed otherwise
    assert "aten.mm.out(arg0_1, arg1_1, out=buf0)" in compiled.source_code
    ptr = compiled(a, w).data_ptr()
    a2, w2 = a.clone().requires_grad_(), w.clone().requires_grad_()
    out = compiled(a2, w2)
    assert out.data_ptr() == ptr and not out.requires_grad
    torch.testing.assert_close(out, a @ w)


def test_pool_clear_forgets_kept_storages():
    pool = BufferPool([64])
    t = pool.empty_strided((4, 4), (4, 1), dtype=torch.float32, slot=0)
    ptr = t.data_ptr()
    del t
    assert pool.empty_strided((4, 4), (4, 1), dtype=torch.float32, slot=0).data_ptr() == ptr
    pool.clear()
    assert len(pool) == 0


def test_reuse_outputs_off_allocates_every_output_fresh():
    a, b = big(0), big(1)
    lowering.reset_counters()
    gm = make_fx(lambda a, b: a + b, decomposition_table=decomposition_table(current()))(a, b)
    fresh = compile_aten(gm, [a, b], current().replace(reuse_outputs=False))
    assert "_BufferPool(" not in fresh.source_code and "_pool." not in fresh.source_code
    first = fresh(a, b)
    torch.testing.assert_close(first, a + b, rtol=0, atol=0)
    assert fresh(a, b).data_ptr() != first.data_ptr()   # `first` is alive: always true
