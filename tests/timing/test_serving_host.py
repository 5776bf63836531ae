"""The engine's host work per iteration (issue 30): the probe that measures it on the target, the library block that
holds it, and the simulation that adds it to the step table's times."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from softsyn.errors import SoftsynError
from softsyn.library.load import HOST_FIGURES, HOST_OPTIONAL, parse_library
from paths import ROOT

LIBRARY = ROOT / "softsyn" / "library" / "libs" / "cpu-ort.yaml"


def test_probe_figures_round_trip_through_a_library_block(tmp_path):
    from softsyn.characterize.host import host_yaml, measure_host, with_host_block

    figures = measure_host("cpu", repeats=5)
    assert all(figures[k] > 0 and math.isfinite(figures[k]) for k in HOST_FIGURES)
    assert all(figures[k] >= 0 and math.isfinite(figures[k]) for k in HOST_OPTIONAL)
    text = with_host_block(LIBRARY.read_text(), host_yaml(figures))
    assert text.count("serving_host:") == 1  # the shipped block replaced, not a second one
    host = parse_library(text, tmp_path / "lib.yaml").serving_host
    for k in HOST_FIGURES + HOST_OPTIONAL:
        assert math.isclose(getattr(host, k), figures[k], rel_tol=5e-3, abs_tol=1e-12), k
    assert host.device == figures["device"] and host.date == figures["date"]


@pytest.mark.parametrize("value", [6e-05, 2e10, 1.0, 5.26e-06])
def test_a_figure_with_no_dot_in_its_short_form_still_reads_as_a_number(tmp_path, value):
    """PyYAML reads "6e-05" as a string: a probe whose figure rounded to that (a clean-clone CI run, 2026-12-07)
    wrote a library softsyn then refused. Every figure is written with a dot and a signed exponent."""
    from softsyn.characterize.host import host_yaml, with_host_block

    figures = {k: value for k in HOST_FIGURES + HOST_OPTIONAL} | {"device": "cpu", "date": "2026-12-07",
                                                                  "command": "softsyn characterize"}
    host = parse_library(with_host_block(LIBRARY.read_text(), host_yaml(figures)), tmp_path / "lib.yaml").serving_host
    assert all(getattr(host, k) == pytest.approx(value, rel=5e-3) for k in HOST_FIGURES + HOST_OPTIONAL)


def test_a_bad_host_figure_is_one_line_naming_its_key(tmp_path):
    text = LIBRARY.read_text().replace("\n  bind: ", "\n  bind: -", 1)
    with pytest.raises(SoftsynError) as err:
        parse_library(text, tmp_path / "lib.yaml")
    assert "serving_host.bind" in str(err.value) and "positive number" in str(err.value)


def test_host_work_adds_to_each_iteration_of_a_lone_request():
    # one request alone: its TTFT gains one iteration's host work and its prompt's, each decode step the iteration's
    # and one sequence's, and nothing else moves
    from softsyn.timing.serving import HostWork, Scheduler, simulate, step_table
    from softsyn.timing.serving.workload import Requests

    table = step_table(lambda d: 1e-4 * d["batch"] + 1e-7 * d["past"] + 2e-6 * d["seq"], 4, 256, 512)
    reqs = Requests(np.array([0.0]), np.array([100]), np.array([9]))
    host = HostWork(iteration=3e-5, per_sequence=2e-6, prefill=5e-5, per_token=1e-8, move=1e-5,
                    per_moved_token=1e-9, source="test")
    bare = simulate(reqs, table, Scheduler(4, 0.0, None))
    got = simulate(reqs, table, Scheduler(4, 0.0, None, host=host))
    first = host.iteration + host.prefill + 100 * host.per_token
    assert math.isclose(got.ttft[0] - bare.ttft[0], first, rel_tol=1e-9)
    decode = 8 * (host.iteration + host.per_sequence)
    assert math.isclose(got.e2e[0] - bare.e2e[0], first + decode, rel_tol=1e-9)
    assert math.isclose(got.host, first + decode, rel_tol=1e-9) and bare.host == 0
    assert host.step(0, []) == 0 and host.moves([]) == 0
    assert math.isclose(host.moves([(5, 1, 40), (6, 2, 70)]), 1e-5 + 2 * 70 * 1e-9)  # one copy of the longest


def test_a_negative_first_shape_figure_is_refused_and_an_absent_one_is_none(tmp_path):
    text = LIBRARY.read_text()
    block = "\n".join(line for line in text.splitlines() if "first_shape" not in line) + "\n"
    assert parse_library(block, tmp_path / "lib.yaml").serving_host.first_shape_gemm is None
    bad = block.replace("\n  bind: ", "\n  first_shape_gemm: -1e-6\n  bind: ", 1)
    with pytest.raises(SoftsynError) as err:
        parse_library(bad, tmp_path / "lib.yaml")
    assert "serving_host.first_shape_gemm" in str(err.value) and ">= 0" in str(err.value)


def test_a_prompt_length_met_first_costs_its_first_shape_once():
    # three requests far apart, prompts 100, 100, 60: the first 100 and the 60 pay the first-shape cost, the second
    # 100 does not; a length the engine ran before the trace (Scheduler.warm) never does
    from dataclasses import replace

    from softsyn.timing.serving import HostWork, Scheduler, simulate, step_table
    from softsyn.timing.serving.workload import Requests

    table = step_table(lambda d: 1e-4 * d["batch"] + 1e-7 * d["past"] + 2e-6 * d["seq"], 4, 256, 512)
    reqs = Requests(np.array([0.0, 1.0, 2.0]), np.array([100, 100, 60]), np.array([1, 1, 1]))
    host = HostWork(iteration=3e-5, per_sequence=2e-6, prefill=5e-5, per_token=1e-8, move=1e-5,
                    per_moved_token=1e-9, source="test", first_shape=7e-4)
    plain = simulate(reqs, table, Scheduler(4, 0.0, None, host=replace(host, first_shape=0.0)))
    got = simulate(reqs, table, Scheduler(4, 0.0, None, host=host))
    assert np.allclose(got.ttft - plain.ttft, [7e-4, 0.0, 7e-4])
    warm = simulate(reqs, table, Scheduler(4, 0.0, None, host=host, warm=frozenset({60})))
    assert np.allclose(warm.ttft - plain.ttft, [7e-4, 0.0, 0.0])
    assert math.isclose(host.step(2, [100, 60], fresh=1) - host.step(2, [100, 60]), 7e-4)


def test_host_work_counts_a_designs_gemm_shapes_and_other_nodes():
    from dataclasses import replace

    from softsyn.library.load import load_library
    from softsyn.timing.serving import host_work

    block = replace(load_library("cpu-ort").serving_host, first_shape_gemm=2e-6, first_shape_node=1e-7)
    work = host_work(block, 1e10, vocab=64, logits_bytes=4, positions=128, mask_bytes=8, layers=2,
                     kv_bytes_per_token=256, all_logits=False, library="t", gemms=5, nodes=30)
    assert math.isclose(work.first_shape, 5 * 2e-6 + 30 * 1e-7)
    assert "once per prompt length met first" in work.describe()


def test_warming_every_prompt_length_is_suggested_and_simulated():
    # a first-shape cost large enough to break the TTFT p99 budget: the warm_prompts suggestion re-runs the load with
    # every length warm and meets it; a block that already warms gets none, and its simulation charges nothing
    from softsyn.constraints.serving import Lengths, Serving
    from softsyn.timing.serving import HostWork, Knobs, Scheduler, requests, simulate, step_table
    from softsyn.timing.serving.suggest import suggestions

    table = step_table(lambda d: 1e-4 * d["batch"] + 1e-7 * d["past"] + 2e-6 * d["seq"], 16, 512, 1024)
    serving = Serving(arrival_rate=5.0, prompt_len=Lengths(64, 256), gen_len=Lengths(4, 8), max_batch=8,
                      batch_timeout=0.0, ttft_p99=0.02, requests=200)
    host = HostWork(iteration=3e-5, per_sequence=2e-6, prefill=5e-5, per_token=1e-8, move=1e-5,
                    per_moved_token=1e-9, source="test", first_shape=0.05)
    reqs, sched = requests(serving), Scheduler(8, 0.0, None, host=host)
    knobs = Knobs(retime=lambda p: None, precision_why="a test", kv_int8_tokens=None, kv_why="a test")
    cold = simulate(reqs, table, sched)
    assert np.percentile(cold.ttft, 99) > 0.02  # the first-met lengths' 50 ms
    warm = next(s for s in suggestions(serving, reqs, table, sched, knobs) if s.knob == "warm_prompts")
    longest = int(reqs.prompt.max())
    assert warm.meets is True and f"{longest} prefill lengths up to {longest} run at load" in warm.change
    warmed = simulate(reqs, table, replace(sched, warm=frozenset(range(1, int(reqs.prompt.max()) + 1))))
    assert np.percentile(warmed.ttft, 99) < 0.02
    done = replace(serving, warm_prompts=True)
    assert all(s.knob != "warm_prompts" for s in suggestions(done, reqs, table, sched, knobs))
    # padding to 64-token buckets: at most 256 / 64 + 1 lengths meet their first run, each slower by its padding
    buckets = next(s for s in suggestions(serving, reqs, table, sched, knobs) if s.knob == "prompt_buckets")
    assert buckets.value == 64 and "prompt_buckets: 64" in buckets.change and buckets.meets is not None
    padded = simulate(reqs, table, replace(sched, bucket=64))
    assert np.percentile(padded.ttft, 99) < np.percentile(cold.ttft, 99)


def test_the_probe_leaves_a_library_of_another_device_unwritten(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("host_probe", ROOT / "bench" / "host_probe.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    other = tmp_path / "lib.yaml"
    text = LIBRARY.read_text().replace("\ndevice: ", "\ndevice: Some Other CPU, 64 cores; was ", 1)
    other.write_text(text)
    assert bench.main(["--library", str(other), "--repeats", "3"]) == 2
    assert other.read_text() == text and "describes Some Other CPU" in capsys.readouterr().err
    assert bench.main(["--library", str(other), "--repeats", "3", "--other-device"]) == 0
    assert other.read_text() != text
