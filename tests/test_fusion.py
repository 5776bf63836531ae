"""Fusion: equivalence on ORT CPU before/after, structure (every decoder attention -> GQA), coverage
report, and misses that carry a reason instead of silence."""
from __future__ import annotations

import collections
import copy

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as T
from onnx import helper as oh

from softsyn.frontends import read_design
from softsyn.fusion import Coverage, Miss, fuse, fusion_kinds
from softsyn.measure import scenario_inputs
from softsyn.netlist import Netlist
from softsyn.reports import report_fusion

DECODE_SCENARIOS = [{"batch": 2, "seq": 5, "past": 0}, {"batch": 2, "seq": 1, "past": 7}]


def _run(model: ir.Model, path, feeds_list):
    import onnxruntime as ort

    ir.save(model, str(path), external_data=path.name + ".data")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return names, [sess.run(None, f) for f in feeds_list]


def _fused_pair(name, cache_dir, tmp_path_factory):
    nl = read_design(f"zoo:{name}", cache_dir=cache_dir, progress=False)
    scenarios = DECODE_SCENARIOS if nl.kind == "decoder" else [{"batch": 2, "seq": 7}]
    feeds = [scenario_inputs(nl, d, seed=1) for d in scenarios]
    d = tmp_path_factory.mktemp(f"fuse-{name}")
    ref_names, ref = _run(nl.model, d / "ref.onnx", feeds)
    before = collections.Counter(n.op_type for n in nl.nodes())
    cov = fuse(nl, "cpu")
    names, got = _run(nl.model, d / "fused.onnx", feeds)
    return dict(netlist=nl, cov={c.kind: c for c in cov}, coverage=cov, before=before, ref=ref, got=got,
                names=names, ref_names=ref_names, scenarios=scenarios)


@pytest.fixture(scope="module", params=["qwen3-tiny", "llama-tiny", "qwen3-moe-tiny", "minilm"])
def fused(request, cache_dir, tmp_path_factory):
    return _fused_pair(request.param, cache_dir, tmp_path_factory)


def test_outputs_match_unfused(fused):
    assert fused["names"] == fused["ref_names"]  # the KV interface (present.* names) is unchanged
    for scenario, ref, got in zip(fused["scenarios"], fused["ref"], fused["got"]):
        for name, a, b in zip(fused["names"], ref, got):
            assert a.shape == b.shape, (scenario, name)
            rel = np.abs(a - b).max() / (np.abs(a).max() + 1e-12)
            assert rel < 1e-4, (scenario, name, rel)


def test_structure(fused):
    nl, cov = fused["netlist"], fused["cov"]
    after = collections.Counter(n.op_type for n in nl.nodes())
    assert sum(after.values()) < 0.5 * sum(fused["before"].values())
    assert set(cov) == set(fusion_kinds())
    if nl.kind == "decoder":
        layers = nl.config["num_layers"]
        att = cov["attention"]
        assert att.candidates == layers and att.fused == layers and not att.misses
        assert after["GroupQueryAttention"] == layers
        assert not [n for n in nl.nodes() if n.op_type == "Softmax" and "attn" in nl.hierarchy(n)]
        assert cov["rms_norm"].fused == cov["rms_norm"].candidates > 0
        assert cov["skip_rms_norm"].fused == 2 * layers
        assert cov["rotary"].fused == 2 * layers
        assert after["SimplifiedLayerNormalization"] + after["SkipSimplifiedLayerNormalization"] == cov["rms_norm"].fused
    else:
        assert after["MultiHeadAttention"] == cov["attention"].fused == 6
        assert after["SkipLayerNormalization"] == 12 and after["BiasGelu"] == 6
        (miss,) = cov["skip_layer_norm"].misses  # embeddings: position embeddings broadcast over batch
        assert "embeddings.LayerNorm" in miss.site and "broadcast" in miss.reason
    for c in fused["coverage"]:  # every candidate is fused or explained
        assert c.fused + len(c.misses) == c.candidates
        assert all(m.reason and m.site for m in c.misses)


def test_moe_miss_is_explained(cache_dir, fused):
    if fused["netlist"].name != "qwen3-moe-tiny":
        pytest.skip("MoE model only")
    moe = fused["cov"]["moe"]
    assert moe.candidates == 2 and moe.fused == 0
    assert all("TopK" in m.reason and "MoE" in m.reason for m in moe.misses)
    assert "CPU" in moe.note


def test_report_text(fused):
    text = report_fusion(fused["coverage"], design=fused["netlist"].name, target="cpu")
    assert "Report : fusion" in text and f"Design : {fused['netlist'].name}" in text
    assert "Candidates" in text and "Coverage" in text
    line = next(l for l in text.splitlines() if l.startswith("attention"))
    assert "100%" in line
    if fused["netlist"].kind == "decoder":
        assert "GroupQueryAttention" in line
    for c in fused["coverage"]:
        for m in c.misses:
            assert m.site in text and m.reason[:40] in text
    if not any(c.misses for c in fused["coverage"]):
        assert "Misses: none" in text


# ------------------------------------------------------------------ unusual attention built on the fly
def _odd_attention(softcap: bool = False) -> Netlist:
    """KV-cached attention with no causal mask (bidirectional over the cache) — or soft-capped scores."""
    B, S, P, N, H = "batch", "seq", "past", 2, 8
    vi = oh.make_tensor_value_info
    nodes = [
        oh.make_node("Concat", ["past_key", "k"], ["present.key"], axis=2),
        oh.make_node("Concat", ["past_value", "v"], ["present.value"], axis=2),
        oh.make_node("Transpose", ["present.key"], ["kt"], perm=[0, 1, 3, 2]),
        oh.make_node("MatMul", ["q", "kt"], ["scores"]),
    ]
    last = "scores"
    if softcap:
        nodes += [oh.make_node("Tanh", ["scores"], ["capped"])]
        last = "capped"
    nodes += [
        oh.make_node("Softmax", [last], ["probs"], axis=-1),
        oh.make_node("MatMul", ["probs", "present.value"], ["ctx"]),
        oh.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        oh.make_node("Reshape", ["ctx_t", "shape"], ["out"]),
    ]
    graph = oh.make_graph(
        nodes, "odd",
        [vi("q", T.FLOAT, [B, N, S, H]), vi("k", T.FLOAT, [B, N, S, H]), vi("v", T.FLOAT, [B, N, S, H]),
         vi("past_key", T.FLOAT, [B, N, P, H]), vi("past_value", T.FLOAT, [B, N, P, H])],
        [vi("out", T.FLOAT, [B, S, N * H]), vi("present.key", T.FLOAT, None), vi("present.value", T.FLOAT, None)],
        initializer=[oh.make_tensor("shape", T.INT64, [3], [0, 0, N * H])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    model = onnx.shape_inference.infer_shapes(model)
    return Netlist(ir.serde.deserialize_model(model), "odd-attention", kind="decoder")


def test_unusual_attention_is_a_miss_with_a_reason():
    nl = _odd_attention()
    (cov,) = fuse(nl, "cpu", kinds=["attention"])
    assert cov.candidates == 1 and cov.fused == 0
    (miss,) = cov.misses
    assert "causal" in miss.reason and "Softmax" in miss.site
    assert "Softmax" in [n.op_type for n in nl.nodes()]  # left as it was

    nl = _odd_attention(softcap=True)
    (cov,) = fuse(nl, "cpu", kinds=["attention"])
    assert cov.fused == 0 and "Tanh" in cov.misses[0].reason
    assert "Misses (1)" in report_fusion([cov]) and "Tanh" in report_fusion([cov])


def test_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="unknown kind"):
        fuse(_odd_attention(), kinds=["bogus"])
    assert {"rms_norm", "skip_rms_norm", "rotary", "attention", "packed_qkv", "gate_up", "bias_gelu", "moe"} <= set(fusion_kinds())
    assert Coverage("x").percent == 100.0 and Miss("a", "b").reason == "b"
