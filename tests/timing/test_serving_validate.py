"""bench/serving_validate.py's CPU path on a tiny trace: qwen3-tiny compiled with a serving block, its batched decode
and mixed steps measured beside the compile's step table, and a handful of requests served by the harness beside the
simulation of the same trace. Structure and positive measurements only: timings on a shared CPU are not asserted."""
from __future__ import annotations

import importlib.util
import math
import sys

import pytest

from paths import ROOT

CONSTRAINTS = ROOT / "constraints" / "serving-tiny.yaml"


def _bench():
    spec = importlib.util.spec_from_file_location("serving_validate", ROOT / "bench" / "serving_validate.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses resolve their annotations through the module
    spec.loader.exec_module(bench)
    return bench


@pytest.fixture
def serving_artifact(tiny_serving_artifact):
    """qwen3-tiny compiled with constraints/serving-tiny.yaml (CONSTRAINTS), effort low (conftest)."""
    return tiny_serving_artifact


def test_bench_measures_steps_and_a_trace_beside_the_prediction(serving_artifact, tmp_path):
    bench = _bench()
    md = tmp_path / "serving.md"
    rc = bench.main(["--artifact", str(serving_artifact), "--constraints", str(CONSTRAINTS), "--requests", "6",
                     "--seconds", "8", "--runs", "3", "--warmup", "1", "--batches", "1,4", "-o", str(md)])
    assert rc == 0
    res = bench.main.result
    steps = [(r.kind, r.batch) for r in res["steps"]]
    assert steps == [("decode", 1), ("decode", 4), ("mixed", 1), ("mixed", 4)]
    for row in res["steps"]:
        assert row.predicted > 0 and len(row.run) == len(row.step) == res["rounds"] == 3
        assert min(row.run) > 0 and min(row.step) >= min(row.run)
    decode4 = res["steps"][1]
    assert len(decode4.pasts) == 4 and decode4.mean_past == 160 and len(set(decode4.pasts.tolist())) == 4  # ragged
    metrics = [m for m, *_ in res["trace"]]
    assert metrics == ["ttft p50", "ttft p99", "tpot p50", "tpot p99", "e2e p50", "e2e p99", "queue p50", "queue p99",
                       "throughput", "completed", "rejected"]
    values = {m: (sim, hosted, measured) for m, sim, hosted, measured, _ in res["trace"]}
    assert values["completed"] == (6, 6, 6) and not res["cut"] and res["requests"] == 6
    for m in ("ttft p50", "ttft p99", "e2e p99", "throughput"):
        assert min(values[m]) > 0 and math.isfinite(values[m][2])
    hosted = res["hosted"]  # cpu-ort has a serving_host block: the host work is simulated, a share of the busy time
    assert 0 < hosted.host < hosted.busy
    assert res["in_trace"]["iterations"] >= 6 and res["in_trace"]["busy_measured"] > 0
    repeat, first = res["in_trace"]["prefill_repeat"], res["in_trace"]["prefill_first"]
    assert repeat[0] + first[0] == 6  # every request's prefill, split by whether its length ran before
    text = md.read_text()
    assert "- prefill calls: " in text and "at a length it met first" in text
    assert "| decode of 4 | 4 | 160 |" in text and "| prefill 128 + decode of 3 | 4 |" in text
    assert "| ttft p99 |" in text and "+ host work (measured per iteration)" in text
    assert "Host work per iteration, the compile's model: " in text and "measured on " in text
    probe = res["first_probe"]  # fresh lengths, none the warm-up ran, each run once first and then repeated
    assert len(probe) == bench_first_probe_count() and len({p[0] for p in probe}) == len(probe)
    assert all(p[1] > 0 and p[2] > 0 for p in probe)
    assert "First-shape probe (before the trace): " in text and "| prompt tokens | at a length run before" in text


def test_prefill_calls_split_by_whether_their_length_ran_before():
    """The trace's prefill calls, each recorded with whether the session had run its prompt length: the two groups'
    counts, median seconds and median ratio to the table's prefill at that length, apart."""
    from types import SimpleNamespace

    bench = _bench()
    table = SimpleNamespace(prefill=lambda length: length * 1e-5)  # 1.28 ms at 128, 2.56 ms at 256
    calls = [(128, 1.5e-3, True), (128, 1.3e-3, True), (256, 9.0e-3, False), (128, 1.4e-3, True), (512, 20e-3, False)]
    split = bench.prefill_split(SimpleNamespace(prefills=calls), table)
    count, median, ratio = split["prefill_repeat"]
    assert count == 3 and math.isclose(median, 1.4e-3) and math.isclose(ratio, 1.4e-3 / 1.28e-3)
    count, median, ratio = split["prefill_first"]
    assert count == 2 and math.isclose(median, 14.5e-3) and math.isclose(ratio, (9.0 / 2.56 + 20 / 5.12) / 2)
    assert bench.prefill_split(SimpleNamespace(prefills=calls[:2]), table)["prefill_first"] == (0,)
    assert bench.prefill_line((0,)) == "none" and bench.prefill_line(split["prefill_repeat"]).startswith("3, median")
    bands = {lo: split for lo, _, split in split["prefill_first_bands"]}  # per prompt band: length and novelty apart
    assert bands[256][:2] == (1, 9.0e-3) and math.isclose(bands[256][2], 9.0 / 2.56) and bands[0] == (0,)
    assert bands[512][:2] == (1, 20e-3) and math.isclose(bands[512][2], 20 / 5.12)
    rows = bench.prefill_bands_md(split)
    assert rows[2] == "| 0–127 | - | - |" and rows[3] == "| 128–255 | 3: 1.09x | - |" and rows[-1].startswith("| 1024– |")


def bench_first_probe_count() -> int:
    return _bench().FIRST_PROBE


def test_bench_refuses_constraints_without_a_serving_block(serving_artifact, capsys):
    rc = _bench().main(["--artifact", str(serving_artifact), "--constraints", str(ROOT / "constraints" / "cpu-tiny.yaml")])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("serving_validate: ") and "no serving: block" in err[-1]


class _VirtualClock:
    def __init__(self):
        self.t = 0.0

    def start(self):
        self.t = 0.0

    def now(self):
        return self.t

    def sleep(self, seconds):
        self.t += seconds


class _TableEngine:
    """Steps that take exactly the step table's time on a virtual clock: the harness must then be the simulation."""

    def __init__(self, table, clock):
        self.table, self.clock = table, clock
        self.io = type("IO", (), {"vocab_size": 64})()
        self.rows: dict[int, int] = {}  # row -> the prompt length prefilled into it (follows the moves)

    def prefill(self, slot, ids, width=None):
        self.clock.t += self.table.prefill(max(width or len(ids), len(ids)))  # a padded prompt runs at its width
        self.rows[slot] = len(ids)
        return 1, 0.0

    def decode(self, pasts, tokens):
        assert len(pasts) == len(tokens) and all(r in self.rows for r in range(len(pasts)))  # rows 0..N-1 hold them
        self.clock.t += self.table.decode(len(pasts), float(pasts.mean()))
        return tokens, 0.0

    def move_rows(self, moves):
        assert all(dst < src for src, dst, _ in moves) and not {m[0] for m in moves} & {m[1] for m in moves}
        for src, dst, cached in moves:
            assert cached >= self.rows[src]  # the prompt's positions at least
            self.rows[dst] = self.rows.pop(src)


@pytest.mark.parametrize("rate, kv_tokens, bucket", [(20.0, None, None), (400.0, 1500.0, None), (20.0, None, 64)])
def test_harness_schedules_as_the_simulation_does(rate, kv_tokens, bucket):
    # with steps taking the table's times on a virtual clock, the harness's TTFT/TPOT/e2e/queue are the simulation's:
    # what differs on a real run is then the step times (and the harness's own costs), not the scheduling
    import numpy as np

    from softsyn.constraints.serving import Lengths, Serving
    from softsyn.timing.serving import Scheduler, requests, simulate, step_table

    bench = _bench()
    serving = Serving(arrival_rate=rate, prompt_len=Lengths(64, 256), gen_len=Lengths(32, 128), max_batch=8,
                      batch_timeout=0.005, requests=150, seed=1)
    table = step_table(lambda d: 1e-4 * d["batch"] + 1e-7 * d["batch"] * d["past"] + 2e-6 * d["seq"], 32, 512, 768)
    # 300: the longest requests are rejected; bucket: prompts padded to multiples of 64, as serving.prompt_buckets
    sched = Scheduler(8, 0.005, kv_tokens, 300 if kv_tokens else 1000, bucket=bucket)
    reqs = requests(serving)
    sim = simulate(reqs, table, sched)
    clock = _VirtualClock()
    harness = bench.Harness(_TableEngine(table, clock), reqs, sched, clock)
    harness.run(deadline=1e9)
    got = harness.outcome()
    assert got.completed == sim.completed and got.rejected == sim.rejected > (0 if kv_tokens else -1)
    for name in ("ttft", "tpot", "e2e", "queue"):
        assert np.allclose(getattr(got, name), getattr(sim, name), rtol=1e-9, atol=1e-12), name
    assert got.decode_batches == sim.decode_batches and max(sim.decode_batches) > 1
    assert harness.moves > 0
    if bucket:  # every prefill at a bucket length, and the buckets slow the first tokens against unpadded prompts
        assert {p for p, _, _ in harness.prefills} <= set(range(bucket, 10 * bucket, bucket))
        assert np.median(sim.ttft) > np.median(simulate(reqs, table, Scheduler(8, 0.005, None, 1000)).ttft)


def test_harness_row_moves_keep_the_greedy_tokens(serving_artifact):
    # sequences finishing under others move the top rows' KV into the freed rows (one copy of every layer): each
    # request's greedy tokens in the batch are then those of the same prompt decoded alone (softsyn run's Generator)
    from softsyn.constraints.serving import Lengths, Serving
    from softsyn.runtime.generate import Generator
    from softsyn.timing.serving import Scheduler, requests

    bench = _bench()
    art = bench.open_artifact(serving_artifact, str(CONSTRAINTS), "cpu")
    serving = Serving(arrival_rate=2000.0, prompt_len=Lengths(8, 32), gen_len=Lengths(6, 24), max_batch=4,
                      batch_timeout=0.0, requests=10, seed=3)
    reqs = requests(serving)
    harness = bench.Harness(bench.Engine(art, 4), reqs, Scheduler(4, 0.0, None, 200))
    harness.run(deadline=60.0)
    assert harness.moves >= 3 and harness.outcome().completed == 10
    alone = Generator(art.session, art.io, "cpu")
    for r, ids in enumerate(harness.ids):
        assert harness.tokens[r] == list(alone.generate(ids, int(reqs.gen[r])).tokens), r
