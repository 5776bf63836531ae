"""The KV budget (softsyn.timing.area): bytes per token from the netlist's past-KV inputs against the model's
config, the largest concurrency and context under area_constraint (each re-analysed: it fits, one more does
not), qwen3-1.7b's shapes at 24 GB, and a too-small area through the CLI: exit 1 with suggestions that fit."""
from __future__ import annotations

import json
import math

import onnx_ir as ir
import pytest
from click.testing import CliRunner

from softsyn.cli import main
from softsyn.constraints import parse_constraints
from softsyn.design import Design
from softsyn.frontends import read_design
from softsyn.frontends.zoo import ZOO
from softsyn.library import load_library
from softsyn.netlist import Netlist
from reports import from_json, report_area, to_json
from reports.area import kv_table, weight_table
from softsyn.timing import Analysis
from softsyn.timing.area import area

CPU = "target: cpu-ort\narea_constraint: {area}\nworkload: {{batch: 1, prompt_len: 128, context_len: {ctx}, concurrency: {n}}}\n"


@pytest.fixture(scope="module")
def tiny(cache_dir):
    return read_design("zoo:qwen3-tiny", cache_dir=cache_dir, progress=False)


def area_of(netlist: Netlist, text: str):
    """report_area's figures for the netlist under a constraints text (no timing: the area only)."""
    design = Design(netlist, parse_constraints(text), load_library("cpu-ort"), progress=False)
    return area(netlist, design.constraints, {g.name: g.scenario.dims for g in design.groups})


def config_bytes_per_token(cfg: dict, itemsize: int) -> int:
    """The independent formula: K and V of every layer, kv heads x head dim elements each."""
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * itemsize


def test_bytes_per_token_is_the_configs_formula(tiny):
    result = area_of(tiny, CPU.format(area="20MB", ctx=256, n=3))
    b = result.kv_budget
    cfg = ZOO["qwen3-tiny"].config
    assert b.bytes_per_token == config_bytes_per_token(cfg, 4)  # fp32 export
    assert b.tensors == 2 * cfg["num_hidden_layers"] and b.dtype == "fp32"
    assert b.layout == f"[batch, {cfg['num_key_value_heads']}, past, {cfg['head_dim']}]"
    kinds = {k.name: k.bytes for k in result.by_kind}
    assert kinds["kv_cache"] == b.kv_bytes == b.bytes_per_token * 3 * 256
    assert b.available == pytest.approx(20e6 - b.weights - b.workspace)
    assert b.weights == kinds["weights fp32"] + kinds["constants"]
    assert b.workspace == kinds["activations (peak)"]
    assert b.max_concurrency == math.floor(b.available / (256 * config_bytes_per_token(cfg, 4)))
    fp8 = next(r for r in b.kv_dtypes if r.dtype == "fp8/int8")
    assert fp8.bytes_per_token == config_bytes_per_token(cfg, 1) and fp8.source == "estimate"


def test_largest_concurrency_and_context_fit_and_one_more_does_not(tiny):
    b = area_of(tiny, CPU.format(area="5MB", ctx=256, n=1)).kv_budget
    assert b.max_concurrency > 1 and b.max_context > 256
    at = lambda ctx, n: area_of(tiny, CPU.format(area="5MB", ctx=ctx, n=n))  # noqa: E731
    assert at(256, b.max_concurrency).slack >= 0 and at(256, b.max_concurrency + 1).slack < 0
    assert at(b.max_context, 1).slack >= 0  # the workspace grows with the context too: re-bound, still fits
    assert at(math.ceil(b.max_context * 1.02), 1).slack < 0  # and the answer is tight


def qwen3_1_7b_kv_netlist() -> tuple[Netlist, dict, int]:
    """qwen3-1.7b's past-KV inputs and weight bytes (fp16, from its config; no data), each layer's present KV
    a Concat of past and new (the plain export's workspace that grows with the context)."""
    cfg = ZOO["qwen3-1.7b"].config
    h, layers, kvh, hd, inter = (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"],
                                 cfg["head_dim"], cfg["intermediate_size"])
    per_layer = (h * cfg["num_attention_heads"] * hd * 2 + 2 * h * kvh * hd + 3 * h * inter + 2 * h + 2 * hd)
    params = cfg["vocab_size"] * h + layers * per_layer + h  # tied lm_head
    fp16 = ir.TensorType(ir.DataType.FLOAT16)
    inputs, outputs, nodes = [], [], []
    weight = ir.Value(name="weights", shape=ir.Shape([params]), type=fp16,
                      const_value=ir.ExternalTensor("weights.not-materialised", offset=0, length=2 * params,
                                                    dtype=ir.DataType.FLOAT16, shape=ir.Shape([params]),
                                                    name="weights"))
    for i in range(layers):
        for kind in ("key", "value"):
            past = ir.Value(name=f"past_key_values.{i}.{kind}", shape=ir.Shape(["batch", kvh, "past", hd]), type=fp16)
            new = ir.Value(name=f"new.{i}.{kind}", shape=ir.Shape(["batch", kvh, "seq", hd]), type=fp16)
            node = ir.node("Concat", [past, new], attributes={"axis": 2}, name=f"concat_{i}_{kind}")
            node.outputs[0].name = f"present.{i}.{kind}"
            node.outputs[0].shape = ir.Shape(["batch", kvh, "past + seq", hd])
            node.outputs[0].type = fp16
            inputs += [past, new]
            outputs.append(node.outputs[0])
            nodes.append(node)
    graph = ir.Graph(inputs, outputs, nodes=nodes, initializers=[weight], opset_imports={"": 18}, name="qwen3-1.7b-kv")
    netlist = Netlist(ir.Model(graph, ir_version=10), "qwen3-1.7b-kv", kind="decoder",
                      config={"max_position_embeddings": cfg["max_position_embeddings"]})
    return netlist, cfg, params


H200 = "area_constraint: 24GB\nworkload: {{batch: 1, prompt_len: 512, context_len: 4096, concurrency: {n}}}\n"


def test_qwen3_1_7b_at_24_gb_states_the_largest_concurrency_at_4096():
    netlist, cfg, params = qwen3_1_7b_kv_netlist()
    per_token = config_bytes_per_token(cfg, 2)
    assert per_token == 114_688
    result = area_of(netlist, H200.format(n=8))
    b = result.kv_budget
    weights = 2 * params
    workspace = per_token * 4097  # decode: the present KV of 4096 + 1 tokens
    assert b.bytes_per_token == per_token and b.weights == weights and b.workspace == workspace
    assert b.available == 24e9 - weights - workspace
    assert b.max_concurrency == math.floor((24e9 - weights - workspace) / (4096 * per_token)) == 42
    # concurrency 8: KV 8 x c tokens, the workspace (c + 1) tokens: exactly linear, so the answer is exact
    assert b.max_context == math.floor((24e9 - weights - per_token) / (9 * per_token))
    text = report_area(_analysis(result))
    assert "KV budget (derived from the netlist's 56 past-KV inputs [batch, 8, past, 128] fp16 and area_constraint)" in text
    assert "Largest concurrency at 4096 tokens:  42 (sequences of batch 1)" in text
    assert f"Largest context at concurrency 8:  {b.max_context:,} tokens" in text
    # at concurrency 1 the KV budget outlasts the model's positions
    assert area_of(netlist, H200.format(n=1)).kv_budget.max_context == cfg["max_position_embeddings"]


def _analysis(result) -> Analysis:
    """An Analysis around an area result (report_area reads only the banner fields besides the area)."""
    return Analysis(design="qwen3-1.7b-kv", library="h200-ort-cuda", library_source="", version="softsyn test",
                    date="Mon Jan  5 12:00:00 2026", provenance={}, constraints_file="h200.yaml", groups=[],
                    area=result, cell_counts={})


def test_tables_render_the_rows_analysis_json_holds():
    netlist, _, _ = qwen3_1_7b_kv_netlist()
    analysis = _analysis(area_of(netlist, H200.format(n=64)))
    text = report_area(analysis)
    b = from_json(to_json(analysis)).area.kv_budget
    assert b == analysis.area.kv_budget
    for table in (kv_table(b), weight_table(b)):
        for line in (table.header(), *table.lines(byte_unit="GB")):
            assert line in text
    assert kv_table(b).rows[0]["fits"] is False and kv_table(b).rows[0]["total"] == analysis.area.total
    # an analysis.json from before the budget still reads and renders
    data = json.loads(to_json(analysis))
    del data["area"]["kv_budget"]
    old = from_json(json.dumps(data))
    assert old.area.kv_budget is None and "KV budget" not in report_area(old)


def test_too_small_area_exits_1_with_suggestions_that_fit(tmp_path, cache_dir):
    def analyze(text: str, name: str):
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        out = tmp_path / name
        result = CliRunner().invoke(main, ["analyze", "zoo:qwen3-tiny", "-c", str(path), "-o", str(out), "-q"])
        return result, out

    result, out = analyze(CPU.format(area="5MB", ctx=2048, n=4), "kv")
    assert result.exit_code == 1, result.output
    b = from_json((out / "analysis.json").read_text()).area.kv_budget
    rpt = (out / "reports" / "area.rpt").read_text()
    for text in (result.output, rpt):  # report_qor on stdout, report_area in the directory
        assert "VRAM exceeds the limit by" in text
        assert f"- workload.context_len {b.max_context} (from 2048): fits at concurrency 4." in text
        assert "- kv_cache.dtype fp16/bf16 (0.512 KB per token, estimate): fits with workload.context_len" in text
    assert "slack (VIOLATED)" in rpt and "Area (VRAM) Violation:                 yes" in result.output
    again, _ = analyze(CPU.format(area="5MB", ctx=b.max_context, n=4), "shorter")
    assert again.exit_code == 0, again.output  # the suggested context fits

    weights, out = analyze(CPU.format(area="1MB", ctx=256, n=1), "weights")
    assert weights.exit_code == 1
    assert "The weights and constants alone (2.229 MB) exceed the limit: no KV cache fits at any context." in weights.output
    assert "- precision int4 weights: 0.314 MB (estimate), total 1.461 MB: still over by 0.461 MB." in weights.output
