"""softsyn.constraints: loading, defaults, and one-line errors that name file, line and key."""
import math
import textwrap
from pathlib import Path

import pytest

from paths import ROOT
from softsyn.constraints import (
    PRECISIONS,
    Accuracy,
    Constraints,
    ConstraintsError,
    KVCache,
    PathGroupSpec,
    Precision,
    Workload,
    load_constraints,
    parse_constraints,
)
from softsyn.errors import SoftsynError

EXAMPLES = sorted((ROOT / "constraints").glob("*.yaml"))

SHORT = """\
clock_period: 2000ms
input_delay:
  image: 100ms
  text: 10ms
output_delay: 50ms
area_constraint: 80GB
"""


def write(tmp_path, text, name="constraints.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text), encoding="utf-8")
    return p


def test_short_form_verbatim(tmp_path):
    c = load_constraints(write(tmp_path, SHORT))
    assert c.clock_period == 2.0
    assert c.input_delay == {"image": 0.1, "text": 0.01}
    assert c.output_delay == {"*": 0.05}
    assert c.area_constraint == 80e9
    assert c.target is None
    assert c.clock_uncertainty == 0.0
    assert c.workload == Workload(batch=1, prompt_len=512, context_len=512, concurrency=1)
    assert c.path_groups == {}
    assert c.precision.allowed == list(PRECISIONS) and c.precision.default is None
    assert c.accuracy == Accuracy() and c.kv_cache == KVCache() and c.dont_touch == []
    assert c.source.endswith("constraints.yaml")
    assert c.key_lines["clock_period"] == 1 and c.key_lines["input_delay.text"] == 4


def test_example_files_exist():
    names = {p.name for p in EXAMPLES}
    assert {"guide-short.yaml", "chat-h200.yaml", "cpu-tiny.yaml", "embedding-cpu.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_load(path):
    c = load_constraints(path)
    assert isinstance(c, Constraints)
    assert path.read_text().startswith("#"), "each example starts with a comment header"
    for name, g in c.path_groups.items():
        assert g.name == name
        assert c.period_for(name) is not None


def test_guide_short_example_is_the_short_form():
    path = next(p for p in EXAMPLES if p.name == "guide-short.yaml")
    body = "".join(l + "\n" for l in path.read_text().splitlines() if not l.startswith("#"))
    assert body.strip() == SHORT.strip()


def test_chat_h200_example():
    c = load_constraints(next(p for p in EXAMPLES if p.name == "chat-h200.yaml"))
    assert c.target == "h200-ort-cuda"
    assert c.path_groups["prefill"].kind == "prefill"
    assert c.path_groups["decode"].kind == "decode"
    assert c.period_for("decode") == pytest.approx(0.008)
    assert c.path_groups["decode"].dims["past"] == 4096
    assert c.area_constraint == 141e9


def test_full_form(tmp_path):
    c = load_constraints(write(tmp_path, """\
        target: cpu-ort
        clock_period: 1s
        clock_uncertainty: 250µs
        input_delay: 5ms
        output_delay:
          logits: 2ms
          "*": 1ms
        area_constraint: 2 GiB
        workload: {batch: 4, prompt_len: 256, context_len: 2048, concurrency: 2}
        path_groups:
          prefill:
            clock_period: 100ms
            weight: 0.5
            critical_range: 3ms
            kind: prefill
            dims: {batch: 4, seq: 256, past: 0}
            inputs: [input_ids, attention_mask]
          decode:
            kind: Decode
            inputs: input_ids
          misc:
        accuracy: {max_rel_error: 0.01, min_top1: 99%}
        precision: {allowed: [FP16, int8, fp16], default: fp16}
        dont_touch: [lm_head, "model.layers.0.*"]
        kv_cache: {dtype: int8, max_length: 4096}
        """))
    assert c.target == "cpu-ort"
    assert c.clock_uncertainty == pytest.approx(250e-6)
    assert c.input_delay == {"*": 0.005}
    assert c.input_delay_for("input_ids", "text") == 0.005
    assert c.output_delay_for("logits") == 0.002
    assert c.output_delay_for("present.0.key") == 0.001
    assert c.area_constraint == 2 * 2**30
    assert c.workload == Workload(4, 256, 2048, 2)
    p = c.path_groups["prefill"]
    assert p == PathGroupSpec("prefill", 0.1, 0.5, 0.003, "prefill", {"batch": 4, "seq": 256, "past": 0},
                              ["input_ids", "attention_mask"])
    assert c.path_groups["decode"].kind == "decode"
    assert c.path_groups["decode"].inputs == ["input_ids"]
    assert c.path_groups["misc"] == PathGroupSpec("misc")
    assert c.period_for("prefill") == 0.1
    assert c.period_for("decode") == 1.0
    assert c.period_for("nonexistent") == 1.0
    assert c.accuracy == Accuracy(max_rel_error=0.01, min_top1=0.99)
    assert c.precision == Precision(allowed=["fp16", "int8"], default="fp16")
    assert c.dont_touch == ["lm_head", "model.layers.0.*"]
    assert c.kv_cache == KVCache(dtype="int8", max_length=4096)
    d = c.to_dict()
    assert d["path_groups"]["prefill"]["clock_period"] == 0.1 and "key_lines" not in d


def test_delay_lookup_order():
    c = Constraints.default()
    assert c.source == "<defaults>"
    assert c.clock_period is None and c.period_for("decode") is None
    assert c.input_delay_for("input_ids", "text") == 0.0
    assert c.output_delay_for("logits") == 0.0
    c.input_delay = {"input_ids": 0.001, "text": 0.002, "*": 0.003}
    assert c.input_delay_for("input_ids", "text") == 0.001
    assert c.input_delay_for("attention_mask", "text") == 0.002
    assert c.input_delay_for("pixel_values", "image") == 0.003
    assert c.input_delay_for("pixel_values", None) == 0.003


def test_none_path_gives_defaults():
    assert load_constraints(None) == Constraints.default()


def test_target_path_resolved_against_file(tmp_path):
    (tmp_path / "libs").mkdir()
    (tmp_path / "libs" / "mine.yaml").write_text("library: mine\n")
    c = load_constraints(write(tmp_path, "target: libs/mine.yaml\n"))
    assert Path(c.target) == tmp_path / "libs" / "mine.yaml"
    assert load_constraints(write(tmp_path, "target: h200-ort-cuda\n")).target == "h200-ort-cuda"


def test_constraints_error_helper(tmp_path):
    c = load_constraints(write(tmp_path, "path_groups:\n  prefill:\n    inputs: [pixel_values]\n"))
    e = c.error("path_groups.prefill.inputs", "unknown input 'pixel_values'; valid: input_ids")
    assert isinstance(e, ConstraintsError)
    assert str(e).endswith("constraints.yaml:3: path_groups.prefill.inputs: unknown input 'pixel_values'; valid: input_ids")
    assert "constraints.yaml:2: path_groups.prefill.kind:" in str(c.error("path_groups.prefill.kind", "x"))


# (file text, line, words that must appear: the key and what is valid)
MALFORMED = {
    "unknown time unit": ("clock_period: 2000mss\n", 1, ["clock_period", "'mss'", "'2000mss'", "ms"]),
    "bare number time": ("clock_period: 2000\n", 1, ["clock_period", "needs a unit"]),
    "misspelt key": ("input_delay: 5ms\n\nclok_period: 2s\n", 3,
                     ["'clok_period'", "did you mean 'clock_period'?", "valid keys:"]),
    "misspelt nested key": ("workload:\n  batch_size: 4\n", 2, ["workload", "'batch_size'", "'batch'"]),
    "negative period": ("path_groups:\n  decode:\n    clock_period: -8ms\n", 3,
                        ["path_groups.decode.clock_period", "positive"]),
    "zero period": ("clock_period: 0s\n", 1, ["clock_period", "positive"]),
    "negative delay": ("input_delay:\n  text: -1ms\n", 2, ["input_delay.text", "negative"]),
    "yaml syntax": ("clock_period: 2000ms\ninput_delay:\n  image: 100ms\n   text: 10ms\n", 4,
                    ["YAML syntax error", "text"]),
    "yaml unclosed quote": ('output_delay: 1ms\nclock_period: "2s\n', 2, ["YAML syntax error", "clock_period"]),
    "wrong type int": ("workload:\n  batch: four\n", 2, ["workload.batch", "integer"]),
    "wrong type bool": ("workload:\n  concurrency: yes\n", 2, ["workload.concurrency", "integer", "boolean"]),
    "wrong type section": ("workload: 4\n", 1, ["workload", "mapping", "batch"]),
    "wrong type list": ("output_delay: [1ms]\n", 1, ["output_delay", "list"]),
    "wrong type weight": ("path_groups:\n  d:\n    weight: heavy\n", 3, ["path_groups.d.weight", "number"]),
    "unknown size unit": ("area_constraint: 80G\n", 1, ["area_constraint", "'G'", "GiB"]),
    "unknown precision": ("precision:\n  allowed: [fp16, in8]\n", 2, ["precision.allowed", "'in8'", "int8", "int4"]),
    "default not allowed": ("precision:\n  allowed: [fp16]\n  default: int8\n", 3, ["precision.default", "fp16"]),
    "unknown kv dtype": ("kv_cache:\n  dtype: int4\n", 2, ["kv_cache.dtype", "fp8"]),
    "unknown group kind": ("path_groups:\n  d:\n    kind: decod\n", 3, ["path_groups.d.kind", "'decode'"]),
    "unknown group key": ("path_groups:\n  d:\n    period: 8ms\n", 3, ["path_groups.d", "'clock_period'"]),
    "bad percent": ("accuracy:\n  max_rel_error: 5\n", 2, ["accuracy.max_rel_error", "'5%'"]),
    "top1 over 100": ("accuracy:\n  min_top1: 101%\n", 2, ["accuracy.min_top1", "100%"]),
    "unknown fallback": ("accuracy:\n  fallback: fp8\n", 2, ["accuracy.fallback", "'fp8'", "valid: bf16, none"]),
    "fallback bf16 not allowed": ("precision:\n  allowed: [fp16, fp8]\naccuracy:\n  fallback: bf16\n", 4,
                                  ["accuracy.fallback", "not in precision.allowed", "fp16, fp8", "none"]),
    "missing value": ("clock_period:\n", 1, ["clock_period", "no value"]),
    "duplicate key": ("clock_period: 2s\nclock_period: 3s\n", 2, ["duplicate", "'clock_period'", "line 1"]),
    "top level list": ("- clock_period: 2s\n", 1, ["top level", "mapping", "clock_period"]),
    "top level scalar": ("2000ms\n", 1, ["top level", "mapping"]),
    "empty file": ("", 1, ["empty"]),
    "comments only": ("# nothing here\n", 1, ["empty"]),
    "uncertainty eats period": ("clock_period: 8ms\nclock_uncertainty: 8ms\n", 2, ["clock_uncertainty", "clock_period"]),
    "kv shorter than context": ("workload: {context_len: 4096}\nkv_cache:\n  max_length: 2048\n", 3,
                                ["kv_cache.max_length", "context_len"]),
    "negative dim": ("path_groups:\n  d:\n    dims: {past: -1}\n", 3, ["path_groups.d.dims.past", ">= 0"]),
    # issue 12, round 2: what used to be a traceback (exit 3), a RecursionError or silently accepted
    "yaml tag": ("clock_period: !mytag 5ms\n", 1, ["YAML tag '!mytag' is not supported", "strings, numbers"]),
    "python tag": ("output_delay: 1ms\nclock_period: !!python/object:os.system x\n", 2,
                   ["YAML tag '!!python/object:os.system' is not supported"]),
    "bad explicit int": ("workload:\n  batch: !!int four\n", 2, ["'four' is not a valid !!int"]),
    "impossible date": ("clock_period: 2024-13-45\n", 1, ["'2024-13-45' is not a valid !!timestamp"]),
    "too many digits": ("workload: {batch: " + "9" * 5000 + "}\n", 1, ["is not a valid !!int"]),
    "deep flow lists": ("clock_period: " + "[" * 5000 + "]" * 5000 + "\n", 1, ["nested deeper than 64 levels"]),
    "deep block mappings": ("path_groups:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 200)), 65,
                            ["nested deeper than 64 levels"]),
    "merge of a scalar": ("path_groups:\n  b:\n    <<: 5\n", 3, ["merge key '<<'", "mapping", "an integer (5)"]),
    "recursive alias": ("path_groups: &p\n  b: *p\n", 2, ["alias *p", "inside the node it names"]),
    "merge into itself": ("path_groups:\n  b: &b\n    <<: *b\n", 3, ["alias *b", "inside the node it names"]),
    "long syntax error line": ("clock_period: 5ms\nfoo: [" + "x" * 10000 + "\n", 2, ["YAML syntax error", "..."]),
    "overflowing time": ("clock_period: 1e400ms\n", 1, ["clock_period", "'1e400ms' is not a finite number",
                                                         "valid: a time > 0 and at most 1000000s"]),
    "infinite time": ("clock_period: .inf\n", 1, ["clock_period", "valid: a time > 0"]),
    "nan delay": ("input_delay:\n  text: .nan\n", 2, ["input_delay.text", "valid: a time >= 0"]),
    "huge time": ("clock_period: 1e300s\n", 1, ["clock_period", "valid: a time > 0 and at most 1000000s"]),
    "overflowing range": ("path_groups:\n  d:\n    critical_range: 1e400s\n", 3, ["path_groups.d.critical_range",
                                                                                    "valid: a time >= 0"]),
    "overflowing size": ("area_constraint: 1e400GB\n", 1, ["area_constraint", "not a finite number",
                                                           "valid: a size > 0 and at most 1000000TB"]),
    "overflowing percent": ("accuracy:\n  max_rel_error: 1e400%\n", 2, ["accuracy.max_rel_error", "not a finite"]),
    "rel error over 100": ("accuracy:\n  max_rel_error: 150%\n", 2, ["accuracy.max_rel_error", "'150%'",
                                                                      "above 0% and below 100%"]),
    "rel error of 100": ("accuracy:\n  max_rel_error: 1\n", 2, ["accuracy.max_rel_error", "below 100%",
                                                                "all-zero output"]),
    "rel error zero": ("accuracy:\n  max_rel_error: 0%\n", 2, ["accuracy.max_rel_error", "above 0%"]),
    "huge batch": ("workload:\n  batch: 99999999999999999999999\n", 2, ["workload.batch", "at most 2147483647"]),
    "huge dim": ("path_groups:\n  d:\n    dims: {past: 1000000000000000000000000}\n", 3,
                 ["path_groups.d.dims.past", "at most 2147483647"]),
}


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_malformed_one_line_error(tmp_path, case):
    text, line, words = MALFORMED[case]
    p = tmp_path / "bad.yaml"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(ConstraintsError) as ei:
        load_constraints(p)
    msg = str(ei.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"{p}:{line}: "), msg
    for w in words:
        assert w in msg, (w, msg)


def test_error_uses_path_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("constraints.yaml").write_text("clock_period: 2000mss\n")
    with pytest.raises(ConstraintsError) as ei:
        load_constraints("constraints.yaml")
    assert str(ei.value).startswith("constraints.yaml:1: clock_period: unknown time unit 'mss' in '2000mss'; valid")


def test_file_not_found(tmp_path):
    with pytest.raises(ConstraintsError, match="nope.yaml: constraints file not found"):
        load_constraints(tmp_path / "nope.yaml")


def test_directory_and_binary(tmp_path):
    with pytest.raises(ConstraintsError, match="directory"):
        load_constraints(tmp_path)
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"\xff\xfe\x00clock")
    with pytest.raises(ConstraintsError):
        load_constraints(p)


def test_is_softsyn_error():
    assert issubclass(ConstraintsError, SoftsynError)
    with pytest.raises(SoftsynError):
        parse_constraints("clock_period: 1 fortnight\n", source="inline")


def test_parse_constraints_source_and_merge_keys():
    c = parse_constraints(textwrap.dedent("""\
        path_groups:
          a: &common {weight: 2, critical_range: 1ms}
          b:
            <<: *common
            clock_period: 5ms
        """), source="inline.yaml")
    assert c.source == "inline.yaml"
    assert c.path_groups["b"].weight == 2.0 and c.path_groups["b"].critical_range == pytest.approx(1e-3)
    assert math.isclose(c.period_for("b"), 0.005)
    assert c.path_groups["a"].clock_period is None


def test_merge_keys_follow_yaml_and_errors_point_where_the_text_is():
    """A key given next to `<<` overrides the merged one (YAML's rule, not a duplicate); the first merged
    mapping wins over later ones; an error in a merged value names the line the value is written on."""
    c = parse_constraints(textwrap.dedent("""\
        path_groups:
          a: &common {weight: 2, critical_range: 1ms}
          slow: &slow {weight: 5}
          b:
            <<: [*common, *slow]
            weight: 3
        """), source="inline.yaml")
    assert c.path_groups["b"].weight == 3.0 and c.path_groups["b"].critical_range == pytest.approx(1e-3)
    c = parse_constraints("path_groups:\n  a: &a {weight: 2}\n  s: &s {weight: 5}\n  b: {<<: [*a, *s]}\n")
    assert c.path_groups["b"].weight == 2.0
    with pytest.raises(ConstraintsError) as ei:
        parse_constraints("kv_cache: &k {dtype: int8}\npath_groups:\n  b:\n    <<: *k\n", source="m.yaml")
    assert str(ei.value).startswith("m.yaml:1: path_groups.b: unknown key 'dtype'"), ei.value


def test_yaml_reader_indexes_keys_and_names_the_nearest_parent_line():
    """The one YAML reader (constraints and libraries): dotted key paths with list indices -> lines, and an error
    about a key without a line of its own points at its nearest parent's."""
    import yaml

    from softsyn.constraints import YamlReader

    reader = YamlReader("f.yaml")
    reader.index(yaml.compose("a:\n  b: [1, 2]\n  c:\n    - x: 1\n", Loader=yaml.SafeLoader))
    assert reader.key_lines == {"a": 1, "a.b": 2, "a.b.0": 2, "a.b.1": 2, "a.c": 3, "a.c.0": 4, "a.c.0.x": 4}
    assert str(reader.at("a.c.0.y", "missing")) == "f.yaml:4: a.c.0.y: missing"
    assert str(reader.at("z", "missing")) == "f.yaml: z: missing"
    assert type(reader.at("z", "x")) is SoftsynError


def test_a_group_s_own_input_delay_replaces_the_top_level_one(tmp_path):
    c = load_constraints(write(tmp_path, """\
        clock_period: 1s
        input_delay: {text: 10ms}
        path_groups:
          prefill: {kind: prefill}
          decode: {kind: decode, input_delay: 0ms}
        """))
    assert c.input_delay_for("input_ids", "text", "prefill") == pytest.approx(0.010)
    assert c.input_delay_for("input_ids", "text", "decode") == 0.0
    assert c.input_delay_for("input_ids", "text") == pytest.approx(0.010)
    with pytest.raises(ConstraintsError, match=r"constraints.yaml:5: path_groups.decode.input_delay: expected a time"):
        load_constraints(write(tmp_path, """\
            clock_period: 1s
            path_groups:
              prefill: {kind: prefill}
              decode:
                input_delay: [1ms]
            """))


def test_the_chat_example_charges_tokenisation_to_prefill_only(tmp_path):
    from softsyn.design import Design

    design = Design.load("zoo:qwen3-tiny", next(p for p in EXAMPLES if p.name == "chat-h200.yaml"), progress=False)
    timing = {g.name: g for g in design.time()}
    assert timing["prefill"].paths[0].input_delay == pytest.approx(0.010)
    assert timing["decode"].paths[0].input_delay == 0.0
