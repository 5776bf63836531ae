"""The serving simulation's fast path (softsyn.timing.serving.simulate: decode-only stretches advanced at once in
numpy) gives bit-identical outcomes to stepping every iteration, on random traces, tables and schedulers; and
StepTable.decodes equals decode exactly."""
from __future__ import annotations

import importlib
from dataclasses import fields

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from softsyn.timing.serving import HostWork, Scheduler, StepTable, simulate
from softsyn.timing.serving.workload import Requests

sim = importlib.import_module("softsyn.timing.serving.simulate")  # the module: the package exports its function
NEVER = 10 ** 9  # COAST_MIN that no stretch reaches: the step-by-step reference


class CountingTable(StepTable):
    """A StepTable that counts the fast path's calls, so a test knows the fast path ran."""

    calls = 0

    def decodes(self, batch, pasts):
        CountingTable.calls += 1
        return super().decodes(batch, pasts)


def random_table(rng: np.random.Generator, one_past: bool = False) -> CountingTable:
    """Positive times on the grid in no particular order: extrapolation past a falling last segment may clip at 0."""
    batches, pasts = [1, 2, 4, 8, 16], ([0] if one_past else [0, 64, 256, 1024])
    decode = rng.uniform(1e-5, 1e-3, (len(batches), len(pasts))).tolist()
    return CountingTable(batches, pasts, decode, [16, 32, 64, 128], rng.uniform(1e-5, 2e-3, 4).tolist())


TICK = 2.0 ** -10  # s: a dyadic step time; sums of a few thousand of them are exact


def tied_case(seed: int, n: int) -> tuple[Requests, CountingTable, Scheduler]:
    """Every step a whole number of ticks and every arrival on a tick: arrivals fall exactly on step starts (an
    arrival at a step's start is admitted there), which random times never do."""
    rng = np.random.default_rng(seed)
    table = CountingTable([1, 2, 4, 8, 16], [0], [[TICK]] * 5, [16, 32, 64, 128], [2 * TICK] * 4)
    reqs = Requests(np.cumsum(rng.integers(0, 40, n)) * TICK, rng.integers(1, 300, n), rng.integers(1, 200, n))
    return reqs, table, Scheduler(int(rng.integers(1, 6)), float(rng.choice([0.0, 4 * TICK])), None)


def random_case(seed: int, n: int) -> tuple[Requests, CountingTable, Scheduler]:
    rng = np.random.default_rng(seed)
    if rng.random() < 0.2:
        return tied_case(seed, n)
    rate = float(rng.choice([5.0, 100.0, 1000.0, 20000.0]))
    reqs = Requests(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(1, 300, n),
                    np.clip(np.rint(np.exp(rng.normal(3.5, 1.0, n))), 1, 600).astype(np.int64))
    host = None
    if rng.random() < 0.5:
        host = HostWork(*rng.uniform(1e-7, 5e-5, 4).tolist(), float(rng.uniform(1e-6, 1e-5)),
                        float(rng.uniform(1e-10, 1e-8)), "test")
    kv = None if rng.random() < 0.4 else float(rng.integers(200, 4000))
    max_len = None if rng.random() < 0.6 else int(rng.integers(100, 900))
    sched = Scheduler(int(rng.integers(1, 12)), float(rng.choice([0.0, 1e-3, 0.02])), kv, max_len, host)
    return reqs, random_table(rng, one_past=rng.random() < 0.1), sched


def outcome(reqs, table, sched, coast_min: int):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sim, "COAST_MIN", coast_min)
        return simulate(reqs, table, sched)


def assert_identical(a, b):
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name  # bit for bit: no tolerance
        else:
            assert x == y, f.name


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1, 120), coast_min=st.sampled_from([1, 2, sim.COAST_MIN]))
def test_the_fast_path_equals_stepping_one_at_a_time(seed, n, coast_min):
    reqs, table, sched = random_case(seed, n)
    assert_identical(outcome(reqs, table, sched, coast_min), outcome(reqs, table, sched, NEVER))


@pytest.mark.parametrize("seed", range(6))
def test_the_fast_path_runs_and_equals_the_reference_on_a_long_trace(seed):
    reqs, table, sched = random_case(seed, 400)
    CountingTable.calls = 0
    fast = outcome(reqs, table, sched, sim.COAST_MIN)
    assert CountingTable.calls > 0  # stretches were advanced at once, not stepped
    assert_identical(fast, outcome(reqs, table, sched, NEVER))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), batch=st.integers(1, 40), one_past=st.booleans())
def test_decodes_equals_decode_bit_for_bit(seed, batch, one_past):
    rng = np.random.default_rng(seed)
    table = random_table(rng, one_past)
    pasts = np.concatenate([rng.integers(0, 3000, 50) / rng.integers(1, 17), np.array(table.pasts, dtype=float)])
    assert table.decodes(batch, pasts).tolist() == [table.decode(batch, float(p)) for p in pasts]
