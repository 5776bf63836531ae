"""The serving simulation (softsyn.timing.serving) on step tables whose times are known: deterministic for a seed,
sane at a low and at an impossible arrival rate, admission within max_batch and the KV budget, the lengths fitted
to p50/p99, the table's interpolation, and suggestions quantified only when a check fails."""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from softsyn.constraints.serving import Lengths, Serving
from softsyn.timing.serving import Knobs, Scheduler, StepTable, requests, serving_analysis, simulate, step_table
from softsyn.timing.serving.workload import cap

PREFILL_PER_TOKEN = 20e-6  # s: a prompt of L tokens takes L x this
DECODE_BASE, DECODE_PER_SEQ, DECODE_PER_PAST = 200e-6, 30e-6, 1e-8


def linear_time(dims: dict) -> float:
    """A design whose steps are linear: prefill in the prompt, decode in the batch and its total past."""
    if dims["seq"] > 1:
        return PREFILL_PER_TOKEN * dims["seq"]
    return DECODE_BASE + DECODE_PER_SEQ * dims["batch"] + DECODE_PER_PAST * dims["batch"] * dims["past"]


SERVING = Serving(arrival_rate=5.0, prompt_len=Lengths(256, 1024), gen_len=Lengths(64, 256), max_batch=8,
                  batch_timeout=0.0, ttft_p50=0.02, ttft_p99=0.1, tpot_p99=0.002, throughput_min=100.0,
                  requests=400, seed=3)
TABLE = step_table(linear_time, max_batch=32, max_prompt=cap(SERVING.prompt_len),
                   max_context=cap(SERVING.prompt_len) + cap(SERVING.gen_len))
NO_KNOBS = Knobs(retime=lambda p: None, precision_why="not in this test", kv_int8_tokens=None, kv_why="no budget")


def run(serving: Serving, kv_tokens=None):
    return simulate(requests(serving), TABLE, Scheduler(serving.max_batch, serving.batch_timeout, kv_tokens))


def test_table_is_exact_on_its_grid_and_linear_between():
    assert TABLE.batches == [1, 2, 4, 8, 16, 32] and TABLE.pasts[:3] == [0, 64, 256]
    for n in (1, 4, 32):
        for past in (0, 256, 1024):
            assert TABLE.decode(n, past) == pytest.approx(linear_time({"batch": n, "seq": 1, "past": past}))
    # linear in each axis: interpolation between points reproduces the linear design (bilinear terms aside)
    assert TABLE.decode(3, 100) == pytest.approx(linear_time({"batch": 3, "seq": 1, "past": 100}), rel=0.05)
    assert TABLE.prefill(300) == pytest.approx(300 * PREFILL_PER_TOKEN)


def test_deterministic_for_a_seed():
    a, b = run(SERVING), run(SERVING)
    for field in ("ttft", "tpot", "e2e", "queue"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    assert a.throughput == b.throughput
    other = run(replace(SERVING, seed=4))
    assert not np.array_equal(a.ttft, other.ttft)


def test_lengths_fit_p50_and_p99():
    reqs = requests(replace(SERVING, requests=20000))
    assert np.percentile(reqs.prompt, 50) == pytest.approx(256, rel=0.05)
    assert np.percentile(reqs.prompt, 99) == pytest.approx(1024, rel=0.1)
    assert reqs.prompt.max() <= 2048 and reqs.gen.min() >= 1
    gaps = np.diff(reqs.arrival)
    assert gaps.mean() == pytest.approx(1 / SERVING.arrival_rate, rel=0.05)


def test_low_rate_meets_and_ttft_is_the_prefill():
    reqs = requests(SERVING)
    out = run(SERVING)
    assert out.completed == SERVING.requests and out.rejected == 0
    prefill = np.array([TABLE.prefill(int(p)) for p in reqs.prompt])
    # at 5 requests/s a request rarely waits: its TTFT is its prefill, plus at most the step it arrived during
    assert np.median(out.ttft) == pytest.approx(np.median(prefill), rel=0.25)
    assert np.all(out.ttft >= prefill - 1e-12)
    assert np.median(out.tpot) < 2 * TABLE.decode(2, 300)
    result = serving_analysis(SERVING, linear_time, None, NO_KNOBS)
    assert not result.violated and result.suggestions == []
    assert [c.group for c in result.checks] == ["ttft_p50", "ttft_p99", "tpot_p99", "throughput"]
    throughput = next(c for c in result.checks if c.group == "throughput")
    assert throughput.slack == pytest.approx(throughput.achieved - 100.0)


def test_rate_far_above_capacity_queues_and_violates():
    slow = run(SERVING)
    hot = replace(SERVING, arrival_rate=2000.0)
    fast = run(hot)
    assert np.percentile(fast.ttft, 99) > 20 * np.percentile(slow.ttft, 99)
    # the queue grows over the run: the later half of the requests waits longer than the first
    half = len(fast.queue) // 2
    assert fast.queue[half:].mean() > 2 * fast.queue[:half].mean()
    result = serving_analysis(hot, linear_time, None, NO_KNOBS)
    assert result.violated
    bad = {c.group for c in result.checks if not c.met}
    assert {"ttft_p50", "ttft_p99"} <= bad
    knobs = [s.knob for s in result.suggestions]
    assert knobs == ["rate", "max_batch", "precision", "kv_dtype", "steps"]
    rate, batch = result.suggestions[:2]
    found = float(re.search(r"-> ([\d.]+)/s", rate.change).group(1))
    assert rate.meets and 0 < found < 2000.0
    # the rate found meets the latency checks; the given one does not
    latency = replace(hot, throughput_min=None, arrival_rate=found)
    assert not serving_analysis(latency, linear_time, None, NO_KNOBS).violated
    assert batch.change.startswith("max_batch 8 -> ") and "(simulated, est)" in batch.result
    assert "not quantified: not in this test" in result.suggestions[2].result
    assert "not simulated: no budget" in result.suggestions[3].result


def test_max_batch_and_kv_budget_bound_admission():
    hot = replace(SERVING, arrival_rate=200.0, max_batch=2)
    wide = replace(hot, max_batch=16)
    assert np.percentile(run(wide).ttft, 99) < np.percentile(run(hot).ttft, 99)
    # a KV budget of two long sequences admits fewer at once: TTFT grows against an unlimited budget
    assert np.percentile(run(wide, kv_tokens=3000).ttft, 99) > np.percentile(run(wide).ttft, 99)
    # a budget smaller than some sequences: those are rejected, the rest complete
    small = run(wide, kv_tokens=400)
    assert small.rejected > 0 and small.completed == wide.requests - small.rejected


def test_batch_timeout_groups_arrivals():
    waited = run(replace(SERVING, batch_timeout=0.05))
    assert np.median(waited.queue) == pytest.approx(0.05, abs=1e-3)  # alone in an idle engine: it waits it out
    assert np.median(run(SERVING).queue) == pytest.approx(0.0, abs=1e-9)


def test_kv_int8_suggestion_is_simulated_with_the_larger_budget():
    hot = replace(SERVING, arrival_rate=100.0, max_batch=16)
    knobs = replace(NO_KNOBS, kv_int8_tokens=12000.0)
    result = serving_analysis(hot, linear_time, 3000.0, knobs)
    assert result.violated
    kv = next(s for s in result.suggestions if s.knob == "kv_dtype")
    assert kv.change == "kv_cache.dtype int8 (KV budget 3,000 -> 12,000 tokens)" and kv.meets is not None


def test_requests_longer_than_the_design_holds_are_rejected_and_the_load_is_violated():
    """A request whose prompt + gen exceeds the positions the design holds per sequence is never served (an engine
    refuses it), and a load with such requests is violated whatever the served requests' latencies, with a note
    that names the key and the length that would hold them."""
    reqs = requests(SERVING)
    limit = int(np.percentile(reqs.prompt + reqs.gen, 90))
    outcome = simulate(reqs, TABLE, Scheduler(SERVING.max_batch, SERVING.batch_timeout, None, limit))
    too_long = int(((reqs.prompt + reqs.gen) > limit).sum())
    assert outcome.too_long == too_long > 0 and outcome.rejected == too_long
    assert outcome.completed == SERVING.requests - too_long
    met = serving_analysis(SERVING, linear_time, None, NO_KNOBS, (int((reqs.prompt + reqs.gen).max()), "k"))
    assert not met.violated and met.rejected == 0
    cut = serving_analysis(SERVING, linear_time, None, NO_KNOBS, (limit, "kv_cache.max_length"))
    assert cut.violated and cut.rejected == too_long
    longest = int((reqs.prompt + reqs.gen).max())
    assert any(n.startswith(f"{too_long} of {SERVING.requests} requests need more positions") and
               f"raise kv_cache.max_length to {longest}" in n for n in cut.notes)


def test_table_from_its_points_is_the_same_table():
    # a compile's analysis.json keeps the table as points; read back, the simulation runs on the very same steps
    back = StepTable.from_points(TABLE.points())
    assert (back.batches, back.pasts, back.prompts) == (TABLE.batches, TABLE.pasts, TABLE.prompts)
    assert back.decode_times == TABLE.decode_times and back.prefill_times == TABLE.prefill_times
    with pytest.raises(ValueError, match="no decode time at batch 1, past 0"):
        StepTable.from_points(TABLE.points()[1:])


def test_steps_suggestion_is_the_largest_step_factor_that_meets_every_check():
    """A TPOT budget the linear design misses: the `steps` suggestion bisects the factor of every step time at which
    every check meets; at that factor the simulation meets, a bisection step above it does not, and the factor is the
    compile loop's target (passes.optimize.serving_target)."""
    from softsyn.timing.serving.suggest import SCALE_FLOOR, SCALE_STEPS, steps

    tight = replace(SERVING, tpot_p99=0.00025)
    sched = Scheduler(tight.max_batch, tight.batch_timeout, None)
    reqs = requests(tight)
    result = serving_analysis(tight, linear_time, None, NO_KNOBS)
    assert result.violated and result.suggestions[-1].knob == "steps"
    found = steps(tight, reqs, TABLE, sched)
    assert found.meets and SCALE_FLOOR <= found.scale < 1 and found.change.startswith(f"every step x{found.scale:.3f}")

    def meets(scale: float) -> bool:
        rows = serving_analysis(tight, lambda d: scale * linear_time(d), None, NO_KNOBS).checks
        return all(c.met for c in rows)

    assert meets(found.scale) and not meets(found.scale + (1 - SCALE_FLOOR) / 2 ** SCALE_STEPS + 1e-3)
    # a budget no speed-up of the steps meets (throughput above what the arrivals offer): said, no factor
    offered = replace(SERVING, throughput_min=1e6)
    never = steps(offered, requests(offered), TABLE, Scheduler(offered.max_batch, offered.batch_timeout, None))
    assert never.meets is False and never.scale is None and "faster steps alone do not meet it" in never.result
