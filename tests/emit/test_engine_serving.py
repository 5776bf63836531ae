"""Engine settings from the serving simulation (softsyn.emit.engine_serving): with a `serving:` block, max_num_seqs,
max_num_batched_tokens and the CUDA-graph capture sizes follow the documented rules from the simulation's own
numbers (analysis.json's serving.schedule), each labelled where it was written; the simulation's schedule is what
its steps formed; without a serving block nothing of it is written."""
from __future__ import annotations

import json
import math

import numpy as np
import yaml

from paths import ROOT
from softsyn.constraints import parse_constraints
from softsyn.constraints.serving import Lengths, Serving
from softsyn.emit.engine_serving import buckets, serving_settings
from softsyn.results.serving import ServingSchedule
from softsyn.timing.serving import Scheduler, simulate, step_table
from softsyn.timing.serving.workload import Requests

OPTIONS = json.loads((ROOT / "tests" / "timing" / "data" / "engine_options.json").read_text())
SERVING_TINY = ROOT / "constraints" / "serving-tiny.yaml"


def test_compiled_settings_follow_the_simulation(tiny_serving_artifact):
    served = tiny_serving_artifact  # conftest: compiled with constraints/serving-tiny.yaml, effort low
    serving = parse_constraints(SERVING_TINY.read_text(), str(SERVING_TINY)).serving
    analysis = json.loads((served / "analysis.json").read_text())
    schedule, kv = analysis["serving"]["schedule"], analysis["area"]["kv_budget"]
    vllm = json.loads((served / "runtime" / "vllm.json").read_text())
    trt = yaml.safe_load((served / "runtime" / "trtllm-llm-api.yaml").read_text())
    kv_seqs = kv["max_concurrency"] * kv["batch"]
    seqs = min(serving.max_batch, kv_seqs)
    assert vllm["max_num_seqs"] == trt["max_batch_size"] == seqs
    tokens = max(schedule["max_step_tokens"], seqs, vllm["max_model_len"])
    assert vllm["max_num_batched_tokens"] == trt["max_num_tokens"] == tokens
    sizes = sorted({min(2 ** math.ceil(math.log2(b)), seqs) for b in schedule["decode_batches"]})
    assert vllm["compilation_config"]["cudagraph_capture_sizes"] == trt["cuda_graph_config"]["batch_sizes"] == sizes
    assert trt["cuda_graph_config"]["max_batch_size"] == max(sizes)  # TensorRT-LLM requires max(batch_sizes)
    assert all(any(b <= s for s in sizes) for b in schedule["decode_batches"] if b <= seqs)
    # option names the engines document
    assert set(vllm) <= set(OPTIONS["vllm"]["engine_args"])
    assert set(trt) <= set(OPTIONS["trtllm"]["llm_args"])
    # each derived value is written beside where it came from, in every file that can hold a comment
    for name in ("vllm-serve.sh", "trtllm-llm-api.yaml", "trtllm-serve.sh"):
        text = (served / "runtime" / name).read_text()
        assert f"# max_num_seqs / max_batch_size {seqs}: serving.max_batch {serving.max_batch}" in text
        assert f"# max_num_batched_tokens / max_num_tokens {tokens}: the most tokens one simulated step" in text
        assert f"# cudagraph_capture_sizes / cuda_graph_config.batch_sizes {sizes}: the simulated decode" in text
    log = (served / "compile.log").read_text()
    assert "runtime/: batching from the serving simulation: max_num_seqs" in log
    assert ("is longer than max_model_len" in log) == (schedule["longest"] > vllm["max_model_len"])


def test_no_serving_block_writes_no_derivation(tiny_cpu_artifact):
    vllm = json.loads((tiny_cpu_artifact / "runtime" / "vllm.json").read_text())
    assert "max_num_batched_tokens" not in vllm
    assert "from the serving simulation" not in (tiny_cpu_artifact / "compile.log").read_text()
    head = (tiny_cpu_artifact / "runtime" / "vllm-serve.sh").read_text().splitlines()
    assert [line for line in head if line.startswith("#")] == head[:2]  # the shebang and the one header line


def test_schedule_is_what_the_steps_formed():
    """Three prompts arrive together: one step admits all three (their prompts), then decode steps at batch 3, 2, 1
    as the shorter generations finish."""
    table = step_table(lambda dims: 1e-3 * dims["batch"] * dims["seq"], max_batch=4, max_prompt=64, max_context=128)
    prompt, gen = np.array([10, 20, 30]), np.array([2, 3, 4])
    outcome = simulate(Requests(np.zeros(3), prompt, gen), table, Scheduler(8, 0.0, None))
    assert outcome.max_step_tokens == int(prompt.sum())
    assert outcome.decode_batches == (1, 2, 3)
    # one at a time (max_batch 1): a step holds one prompt, or one decode
    alone = simulate(Requests(np.zeros(3), prompt, gen), table, Scheduler(1, 0.0, None))
    assert alone.max_step_tokens == int(prompt.max()) and alone.decode_batches == (1,)


SERVING = Serving(arrival_rate=20.0, prompt_len=Lengths(128, 512), gen_len=Lengths(64, 256), max_batch=16,
                  ttft_p99=0.05)


def test_kv_budget_bounds_max_num_seqs_with_a_note():
    schedule = ServingSchedule(max_step_tokens=900, decode_batches=[1, 3, 6, 12], longest=700)
    values, lines, notes = serving_settings(SERVING, schedule, 5, 1024, [1, 2, 4, 5])
    assert values["max_seqs"] == 5 and values["capture"] == [1, 4, 5]
    assert values["batched_tokens"] == 1024  # raised to max_model_len: a prompt the engine admits fits one step
    assert "raised to max_model_len 1024" in lines[1]
    assert notes == ["runtime/: max_num_seqs 5, not serving.max_batch 16: the KV budget holds 5 sequences of 1024 "
                     "tokens"]
    free, _, free_notes = serving_settings(SERVING, schedule, None, 512, [1])
    assert free["max_seqs"] == SERVING.max_batch and free["capture"] == [1, 4, 8, 16] and free["batched_tokens"] == 900
    assert any("longer than max_model_len 512" in n for n in free_notes)


def test_no_decode_step_keeps_the_default_capture_sizes():
    values, lines, _ = serving_settings(SERVING, ServingSchedule(300, [], 300), 64, 512, [1, 2, 4, 8, 16])
    assert values["capture"] == [1, 2, 4, 8, 16] and "ran no decode step" in lines[2]


def test_buckets_round_up_to_powers_of_two():
    assert buckets([1, 3, 5, 9, 17], 16) == [1, 4, 8, 16]
    assert buckets([2, 2, 7], 64) == [2, 8]
