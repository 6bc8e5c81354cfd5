"""kcache.nvfuser.FusionCache: hit/miss logic, bounds, counters, threads, the C++ guard path."""

from __future__ import annotations

import random
import threading
import time

import pytest

from kcache import counters
from kcache.nvfuser import FusionCache
from kcache.nvfuser import fusion_cache as fcm
from kcache.nvfuser.descriptors import TensorDescriptor, runtime_key

torch = pytest.importorskip("torch", reason="FusionCache is tested on torch tensors; torch is not installed")


class Recorder:
    """A builder that records the descriptors it was called with; definitions are numbered."""

    def __init__(self, delay: float = 0.0):
        self.calls: list[tuple] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, descs: tuple) -> tuple:
        if self.delay:
            time.sleep(self.delay)
        with self.lock:
            self.calls.append(descs)
            return ("fd", len(self.calls), descs)


@pytest.fixture(params=[True, False], ids=["guards", "python"])
def use_guards(request):
    return request.param


def test_hit_miss_and_descriptors(use_guards):
    rec = Recorder()
    fc = FusionCache(rec, use_guards=use_guards)
    a = torch.randn(3, 4)
    d1 = fc.lookup((a, 2.0))
    assert rec.calls == [runtime_key((a, 2.0))]
    assert d1[2][0] == TensorDescriptor(torch.float32, (-1, -1), (True, True), (1, 0), False)
    for _ in range(5):
        assert fc.lookup((a, 2.0)) is d1
    # other sizes, same layout: no build
    assert fc.lookup((torch.randn(7, 9), 3.5)) is d1
    # other stride order, dtype, broadcast, scalar type: a build each
    d2 = fc.lookup((a.t(), 2.0))
    d3 = fc.lookup((a.double(), 2.0))
    d4 = fc.lookup((torch.randn(1, 4), 2.0))
    d5 = fc.lookup((a, 2))
    assert len({id(d) for d in (d1, d2, d3, d4, d5)}) == 5
    assert len(rec.calls) == 5
    assert fc.lookup((a.t().contiguous().t(), 1.0)) is d2
    assert fc.misses == 5
    assert fc.hits == 6 + 1
    assert fc.cache_info() == {"hits": 7, "misses": 5, "maxsize": 256, "currsize": 5}


def test_execute_and_call():
    executed = []

    def execute(fd, args):
        executed.append((fd, args))
        return ["out", fd[1]]

    fc = FusionCache(Recorder(), execute)
    a = torch.randn(2, 2)
    assert fc(a, 1) == ["out", 1]
    assert fc.lookup((a, 1))[1] == 1
    assert len(executed) == 1 and executed[0][1] == (a, 1)


def test_default_execute_calls_definition_execute():
    class FD:
        def __init__(self, descs):
            self.descs = descs
            self.inputs = []

        def execute(self, inputs):
            self.inputs.append(inputs)
            return [len(inputs)]

    fc = FusionCache(FD)
    a = torch.randn(2, 2)
    assert fc(a, a) == [2]
    fd = fc.lookup((a, a))
    assert fd.inputs == [(a, a)]


def test_zero_dim_cpu_scalar_vs_device(use_guards):
    rec = Recorder()
    fc = FusionCache(rec, use_guards=use_guards)
    cpu = torch.tensor(1.0)
    meta = torch.empty((), device="meta")
    for _ in range(3):
        d_cpu = fc.lookup((cpu,))
        d_meta = fc.lookup((meta,))
    assert d_cpu is not d_meta
    assert d_cpu[2][0].cpu_scalar and not d_meta[2][0].cpu_scalar
    assert fc.lookup((torch.tensor(5.0),)) is d_cpu
    assert len(rec.calls) == 2


def test_guard_path_never_serves_a_wrong_definition():
    rec = Recorder()
    fc = FusionCache(rec)
    a = torch.randn(4, 5)
    d = fc.lookup((a,))
    fc.lookup((a,))  # the same call shape twice: the entry gets its C++ guard
    if fcm._tensor_guards_cls():
        assert fc._mru[0], "expected a C++ guard on the most recent entry"
    assert fc.lookup((a,)) is d
    # each of these differs from the guarded call in one respect only
    assert fc.lookup((torch.empty_strided((4, 5), (1, 4)),)) is not d
    assert fc.lookup((a.half(),)) is not d
    assert fc.lookup((torch.randn(1, 5),)) is not d
    assert fc.lookup((a, a)) is not d
    assert fc.lookup((2.0,)) is not d
    # stricter than the key (requires_grad, sizes): still the right definition
    fc.lookup((a,))
    fc.lookup((a,))
    assert fc.lookup((a.clone().requires_grad_(),)) is d
    assert fc.lookup((torch.randn(9, 3),)) is d
    assert fc.lookup((torch.nn.Parameter(torch.randn(2, 2)),)) is d


def test_guards_and_python_path_agree():
    rng = random.Random(0)
    pool = [
        torch.randn(3, 4),
        torch.randn(4, 3).t(),
        torch.randn(3, 1),
        torch.randn(3, 4).half(),
        torch.tensor(2.0),
        torch.randn(2, 3, 4).permute(1, 2, 0),
        torch.randn(5, 4),
        1,
        2.0,
    ]
    calls = [tuple(rng.choice(pool) for _ in range(rng.randint(0, 3))) for _ in range(60)]
    seq = [rng.choice(calls) for _ in range(3000)]
    seq += [c for c in calls for _ in range(3)]  # runs of repeats arm the guards
    fg, fp = FusionCache(Recorder()), FusionCache(Recorder(), use_guards=False)
    for args in seq:
        dg, dp = fg.lookup(args), fp.lookup(args)
        assert dg[2] == dp[2] == runtime_key(args)
    assert fg.misses == fp.misses == len({runtime_key(c) for c in calls})
    assert fg.hits == fp.hits == len(seq) - fg.misses


def test_static_positions():
    rec = Recorder()
    fc = FusionCache(rec, static=[1])
    a = torch.randn(2, 3)
    d_relu = fc.lookup((a, "relu"))
    assert fc.lookup((torch.randn(5, 5), "relu")) is d_relu
    d_gelu = fc.lookup((a, "gelu"))
    assert d_gelu is not d_relu
    assert len(rec.calls) == 2 and fc.hits == 1


def test_bounded_lru_eviction():
    rec = Recorder()
    fc = FusionCache(rec, maxsize=2)
    A, B, C = torch.randn(3, 4), torch.randn(4, 3).t(), torch.randn(3, 1)
    fc.lookup((A,))
    fc.lookup((B,))
    fc.lookup((A,))  # A is now more recent than B
    fc.lookup((C,))  # evicts B
    assert len(fc) == 2 and len(rec.calls) == 3
    assert [d[1] for _, d in fc.definitions()] == [1, 3]
    fc.lookup((A,))
    fc.lookup((C,))
    assert len(rec.calls) == 3
    fc.lookup((B,))  # rebuilt; evicts A (C was used after A)
    assert len(rec.calls) == 4
    assert len(fc) == 2
    fc.lookup((C,))
    assert len(rec.calls) == 4
    fc.lookup((A,))
    assert len(rec.calls) == 5
    # the memo never points at an evicted definition
    live = {rk for rk, _ in fc.definitions()}
    assert all(e[3] in live for e in fc._memo.values())


def test_eviction_under_many_shapes_keeps_bound():
    rec = Recorder()
    fc = FusionCache(rec, maxsize=3)
    layouts = [
        torch.randn(2, 3, 4).permute(*p) for p in [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1)]
    ]
    for i in range(200):
        t = layouts[i % 5]
        assert fc.lookup((t,))[2] == runtime_key((t,))
        assert len(fc) <= 3
    fc._memo_max = 4  # a tiny memo: cleared and refilled, results unchanged
    for i in range(50):
        t = torch.randn(i + 1, 3)
        assert fc.lookup((t,))[2] == runtime_key((t,))
        assert len(fc._memo) <= 4


def test_builder_error_propagates_and_is_retried():
    n = {"calls": 0}

    def build(descs):
        n["calls"] += 1
        if n["calls"] == 1:
            raise RuntimeError("boom")
        return ("fd", descs)

    fc = FusionCache(build)
    a = torch.randn(2, 2)
    with pytest.raises(RuntimeError, match="boom"):
        fc.lookup((a,))
    assert fc.lookup((a,))[0] == "fd"
    assert fc.lookup((a,))[0] == "fd"
    assert n["calls"] == 2 and fc.misses == 1


def test_counters_reach_kcache_counters():
    before = counters.process_totals().get(fcm.COUNTER_KIND, {})
    fc = FusionCache(Recorder())
    a = torch.randn(2, 2)
    for _ in range(10):
        fc.lookup((a,))
    fc.lookup((a.t(),))
    fc.flush()
    after = counters.process_totals()[fcm.COUNTER_KIND]
    assert after.get("misses", 0) - before.get("misses", 0) == 2
    assert after.get("hits", 0) - before.get("hits", 0) == 9
    fc.flush()  # nothing new: nothing pushed
    assert counters.process_totals()[fcm.COUNTER_KIND] == after
    fcm.flush_all()


def test_concurrent_misses_build_once():
    rec = Recorder(delay=0.05)
    fc = FusionCache(rec)
    a = torch.randn(3, 3)
    barrier = threading.Barrier(8)
    out = []

    def worker():
        barrier.wait()
        out.append(fc.lookup((torch.randn(3, 3),)))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(rec.calls) == 1
    assert all(d is out[0] for d in out)
    assert fc.lookup((a,)) is out[0]
    assert fc.misses == 1 and fc.hits == 8


@pytest.mark.parametrize("maxsize", [256, 3])
def test_threads_hammering(maxsize, use_guards):
    rec = Recorder(delay=0.001)
    fc = FusionCache(rec, maxsize=maxsize, use_guards=use_guards)
    pool = [
        (torch.randn(3, 4),),
        (torch.randn(4, 3).t(),),
        (torch.randn(3, 1), 1.0),
        (torch.randn(2, 3, 4).permute(2, 0, 1), torch.randn(5)),
        (torch.tensor(1.0), torch.randn(2, 2).half()),
        (torch.randn(6, 4),),  # same key as pool[0]
    ]
    keys = [runtime_key(p) for p in pool]
    errors: list[str] = []
    n_threads, n_calls = 8, 1500

    def worker(seed):
        rng = random.Random(seed)
        for _ in range(n_calls):
            i = rng.randrange(len(pool)) if rng.random() < 0.3 else seed % len(pool)
            d = fc.lookup(pool[i])
            if d[2] != keys[i]:
                errors.append(f"call {i} got a definition for {d[2]}")
            if len(fc) > maxsize:
                errors.append(f"size {len(fc)} > {maxsize}")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    assert fc.hits + fc.misses == n_threads * n_calls
    assert fc.misses == len(rec.calls)
    if maxsize >= len(pool):
        assert len(rec.calls) == len(set(keys)) == 5


def test_rejects_bad_maxsize():
    with pytest.raises(ValueError):
        FusionCache(Recorder(), maxsize=0)


def test_counts_pushed_periodically_without_flush(monkeypatch):
    monkeypatch.setattr(fcm, "_PUSH_EVERY", 7)
    fc = FusionCache(Recorder())
    a, b = torch.randn(2, 2), torch.randn(2, 2).t()
    fc.lookup((a,))
    fc.lookup((b,))
    before = counters.process_totals()[fcm.COUNTER_KIND].get("hits", 0)
    for _ in range(20):  # alternating: every call takes the memo path
        fc.lookup((a,))
        fc.lookup((b,))
    pushed = counters.process_totals()[fcm.COUNTER_KIND].get("hits", 0) - before
    assert 30 <= pushed <= 40
    fc.flush()
    assert counters.process_totals()[fcm.COUNTER_KIND].get("hits", 0) - before == 40


def test_guard_suspended_on_miss_and_rearmed_on_repeat():
    if not fcm._tensor_guards_cls():
        pytest.skip("torch's C++ tensor guards are not usable here")
    fc = FusionCache(Recorder())
    a, b = torch.randn(3, 4), torch.randn(4, 3).t()
    da = fc.lookup((a,))
    fc.lookup((a,))
    entry_a = fc._mru
    guard = entry_a[0]
    assert guard
    db = fc.lookup((b,))  # a's guard fails: suspended, kept
    assert entry_a[0] is False and entry_a[5] is guard
    assert fc.lookup((a,)) is da  # memo path; still suspended
    assert entry_a[0] is False
    assert fc.lookup((a,)) is da  # a repeat: re-armed with the same guard, nothing rebuilt
    assert entry_a[0] is guard
    assert fc.lookup((b,)) is db
    # entries with non-tensor arguments never get a guard
    fc.lookup((a, 1.0))
    fc.lookup((a, 1.0))
    assert fc._mru[0] == 0 and fc._mru[0] is not False
    assert fc.lookup((a, 2.0)) is fc.lookup((a, 3.0))


def test_reentrant_build_of_the_same_key_raises_instead_of_hanging():
    fc: FusionCache

    def build(descs):
        return fc.lookup((torch.randn(2, 2),))

    fc = FusionCache(build)
    with pytest.raises(RuntimeError, match="building"):
        fc.lookup((torch.randn(3, 3),))
    assert not fc._pending


def test_static_negative_positions():
    fc = FusionCache(Recorder(), static=[-1])
    a = torch.randn(2, 2)
    assert fc.lookup((a, "x")) is fc.lookup((torch.randn(3, 3), "x"))
    assert fc.lookup((a, "x")) is not fc.lookup((a, "y"))
    assert fc.lookup((a, 1, "x")) is not fc.lookup((a, "x"))
