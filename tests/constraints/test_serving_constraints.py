"""The constraints' serving: block (softsyn.constraints.serving): values in SI, frozen, and one-line errors naming
file, line and key (exit 2 from the command line, before any model is read)."""
from __future__ import annotations

import dataclasses

import jsonschema
import pytest
import yaml

from helpers import cli
from paths import ROOT
from softsyn.constraints import ConstraintsError, Lengths, load_constraints, parse_constraints
from softsyn.constraints.schema import constraints_schema

GOOD = """\
serving:
  arrival_rate: 1200/min
  max_batch: 8
  batch_timeout: 50ms
  prompt_len: {p50: 512, p99: 2048}
  gen_len: 128
  ttft: {p50: 300ms, p99: 800ms}
  tpot: {p99: 50ms}
  throughput: {min: 200 tok/s}
  requests: 300
  seed: 7
"""


def test_serving_block_in_si_and_frozen():
    s = parse_constraints(GOOD, "c.yaml").serving
    assert (s.arrival_rate, s.max_batch, s.batch_timeout) == (20.0, 8, 0.05)
    assert s.prompt_len == Lengths(512, 2048) and s.gen_len == Lengths(128, 128)
    assert (s.ttft_p50, s.ttft_p99, s.tpot_p50, s.tpot_p99) == (0.3, 0.8, None, 0.05)
    assert (s.throughput_min, s.requests, s.seed) == (200.0, 300, 7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.max_batch = 16
    assert s.warm_prompts is False and parse_constraints(GOOD + "  warm_prompts: true\n", "c.yaml").serving.warm_prompts


def test_shipped_serving_file_loads_and_matches_the_schema():
    path = ROOT / "constraints" / "serving-tiny.yaml"
    assert load_constraints(path).serving.max_batch == 16
    jsonschema.validate(yaml.safe_load(path.read_text()), constraints_schema())
    assert parse_constraints("clock_period: 2ms\n").serving is None


@pytest.mark.parametrize("text, expected", [
    ("serving:\n  max_batch: 4\n", "c.yaml:2: serving: arrival_rate is required"),
    (GOOD.replace("1200/min", "20"), "c.yaml:2: serving.arrival_rate: cannot read rate 20"),
    (GOOD.replace("1200/min", "20/h"), "c.yaml:2: serving.arrival_rate: unknown rate unit '/h'"),
    (GOOD.replace("1200/min", "0/s"), "c.yaml:2: serving.arrival_rate: '0/s': valid: a rate above 0"),
    (GOOD.replace("arrival_rate", "arival_rate"), "c.yaml:2: serving: unknown key 'arival_rate'; did you mean "
                                                  "'arrival_rate'?"),
    (GOOD.replace("p99: 2048", "p99: 256"), "c.yaml:5: serving.prompt_len.p99: 256 is below p50 (512)"),
    (GOOD.replace("{p50: 512, p99: 2048}", "{p50: 512}"), "c.yaml:5: serving.prompt_len: needs p50 and p99"),
    (GOOD.replace("max_batch: 8", "max_batch: 0"), "c.yaml:3: serving.max_batch: must be an integer >= 1, got 0"),
    (GOOD.replace("tpot: {p99: 50ms}", "tpot: {p95: 50ms}"), "c.yaml:8: serving.tpot: unknown key 'p95'"),
    (GOOD.replace("300ms", "300"), "c.yaml:7: serving.ttft.p50: time 300 needs a unit"),
    (GOOD.replace("requests: 300", "requests: 5"), "c.yaml:10: serving.requests: must be an integer >= 10"),
    (GOOD + "  warm_prompts: maybe\n", "c.yaml:12: serving.warm_prompts: 'maybe': valid: true or false"),
    ("serving:\n  arrival_rate: 2/s\n  prompt_len: 8\n  gen_len: 8\n",
     "c.yaml:2: serving: no budget to check; give at least one of ttft"),
])
def test_bad_serving_one_line_naming_file_line_key(text, expected):
    with pytest.raises(ConstraintsError) as exc:
        parse_constraints(text, "c.yaml")
    assert str(exc.value).startswith(expected), str(exc.value)
    assert "\n" not in str(exc.value)


def test_bad_serving_exits_2_before_reading_the_model(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("1200/min", "fast"))
    code, out, err = cli(capsys, "analyze", "zoo:qwen3-tiny", "-c", bad, "-q")
    assert code == 2
    assert f"{bad}:2: serving.arrival_rate: cannot read rate 'fast'" in err
