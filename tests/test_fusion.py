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


@pytest.fixture(scope="module")
def fused_pairs(cache_dir, tmp_path_factory):
    """Memoised per module: each model is fused and run once, whichever fixture asks for it."""
    pairs = {}

    def get(name):
        if name not in pairs:
            pairs[name] = _fused_pair(name, cache_dir, tmp_path_factory)
        return pairs[name]

    return get


@pytest.fixture(scope="module", params=["qwen3-tiny", "llama-tiny", "qwen3-moe-tiny", "minilm"])
def fused(request, fused_pairs):
    return fused_pairs(request.param)


@pytest.fixture(scope="module")
def fused_moe(fused_pairs):
    return fused_pairs("qwen3-moe-tiny")


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


def test_moe_experts_fuse_into_ort_moe(fused_moe):
    nl, moe = fused_moe["netlist"], fused_moe["cov"]["moe"]
    assert (moe.candidates, moe.fused, moe.misses) == (2, 2, [])
    assert moe.target_op == "com.microsoft.MoE" and "CPU" in moe.note
    after = collections.Counter(n.op_type for n in nl.nodes())
    assert after["MoE"] == 2 and not after["TopK"] and not after["GatherND"] and not after["Softmax"]
    for node in (n for n in nl.nodes() if n.op_type == "MoE"):
        assert node.domain == "com.microsoft" and "mlp" in nl.hierarchy(node)
        a = {k: v.value for k, v in node.attributes.items()}
        assert a["k"] == 2 and a["normalize_routing_weights"] == 1  # norm_topk_prob=True
        assert a["activation_type"] == "swiglu" and a["swiglu_fusion"] == 1
        assert (a["activation_alpha"], a["activation_beta"]) == (1.0, 0.0)
        fc1, fc2 = node.inputs[2].const_value.numpy(), node.inputs[4].const_value.numpy()
        assert fc1.shape == (4, 2 * 64, 128) and fc2.shape == (4, 128, 64)
        assert node.inputs[1].producer().op_type == "Gemm"  # fed the router logits: the op does softmax+top-k
    for scenario, ref, got in zip(fused_moe["scenarios"], fused_moe["ref"], fused_moe["got"]):
        for name, a, b in zip(fused_moe["names"], ref, got):
            rel = np.abs(a - b).max() / (np.abs(a).max() + 1e-12)
            assert rel < 1e-4, (scenario, name, rel)


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


# ------------------------------------------------------------------ MoE blocks built on the fly
def _moe_block(act: str = "silu", router: str = "Softmax", hidden: int = 32, inter: int = 16, experts: int = 4,
               k: int = 2) -> Netlist:
    """A Qwen3-MoE-style block in the batched_mm export form: Gemm router -> Softmax -> TopK -> v/sum(v);
    x repeated k times; per-token GatherND of stacked [E, 2I, H] gate_up and [E, H, I] down weights;
    batched MatMuls, Split gate/up, act(gate)*up; weighted ReduceSum over the k slots."""
    rng = np.random.default_rng(3)
    H, I, E = hidden, inter, experts
    vi = oh.make_tensor_value_info
    init = [
        oh.make_tensor("router_w", T.FLOAT, [E, H], rng.standard_normal((E, H)).ravel() * 0.5),
        oh.make_tensor("experts.gate_up", T.FLOAT, [E, 2 * I, H], rng.standard_normal(E * 2 * I * H) * 0.2),
        oh.make_tensor("experts.down", T.FLOAT, [E, H, I], rng.standard_normal(E * H * I) * 0.2),
        oh.make_tensor("k", T.INT64, [1], [k]), oh.make_tensor("m1", T.INT64, [1], [-1]),
        oh.make_tensor("ax1", T.INT64, [1], [1]), oh.make_tensor("ax2", T.INT64, [1], [2]),
        oh.make_tensor("rep", T.INT64, [3], [1, k, 1]), oh.make_tensor("flat_h", T.INT64, [2], [-1, H]),
        oh.make_tensor("slots", T.INT64, [3], [-1, k, H]), oh.make_tensor("sqrt2", T.FLOAT, [], [2 ** 0.5]),
        oh.make_tensor("one", T.FLOAT, [], [1.0]), oh.make_tensor("half", T.FLOAT, [], [0.5]),
    ]
    n = oh.make_node
    nodes = [
        n("Gemm", ["x", "router_w"], ["logits"], transB=1),
        n("Softmax", ["logits"], ["probs"], axis=-1) if router == "Softmax" else n("Sigmoid", ["logits"], ["probs"]),
        n("TopK", ["probs", "k"], ["top_v", "top_i"], axis=-1),
        n("ReduceSum", ["top_v", "m1"], ["top_sum"], keepdims=1),
        n("Div", ["top_v", "top_sum"], ["w"]),
        n("Unsqueeze", ["x", "ax1"], ["x1"]), n("Expand", ["x1", "rep"], ["xk"]),
        n("Reshape", ["xk", "flat_h"], ["xr"]), n("Unsqueeze", ["xr", "ax2"], ["xr2"]),
        n("Reshape", ["top_i", "m1"], ["ids"]), n("Unsqueeze", ["ids", "ax1"], ["ids1"]),
        n("GatherND", ["experts.gate_up", "ids1"], ["w1"]), n("MatMul", ["w1", "xr2"], ["h3"]),
        n("Squeeze", ["h3", "ax2"], ["h"]), n("Split", ["h"], ["gate", "up"], axis=1, num_outputs=2),
    ]
    if act == "silu":
        nodes += [n("Sigmoid", ["gate"], ["sg"]), n("Mul", ["gate", "sg"], ["a0"])]
    else:  # exact GELU: GeGLU experts
        nodes += [n("Div", ["gate", "sqrt2"], ["gd"]), n("Erf", ["gd"], ["ge"]), n("Add", ["ge", "one"], ["g1"]),
                  n("Mul", ["gate", "g1"], ["g2"]), n("Mul", ["g2", "half"], ["a0"])]
    nodes += [
        n("Mul", ["a0", "up"], ["a"]), n("Unsqueeze", ["a", "ax2"], ["a2"]),
        n("GatherND", ["experts.down", "ids1"], ["w2"]), n("MatMul", ["w2", "a2"], ["o3"]),
        n("Squeeze", ["o3", "ax2"], ["o"]),
        n("Reshape", ["w", "m1"], ["wf"]), n("Unsqueeze", ["wf", "ax1"], ["wf1"]), n("Mul", ["o", "wf1"], ["ow"]),
        n("Reshape", ["ow", "slots"], ["ow3"]), n("ReduceSum", ["ow3", "ax1"], ["y"], keepdims=0),
    ]
    graph = oh.make_graph(nodes, "moe", [vi("x", T.FLOAT, ["tokens", H])], [vi("y", T.FLOAT, ["tokens", H])],
                          initializer=init)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    model = onnx.shape_inference.infer_shapes(model)
    return Netlist(ir.serde.deserialize_model(model), "moe-block", kind="decoder")


def _run_block(nl: Netlist, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    proto = ir.serde.serialize_model(nl.model)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_moe_block_built_on_the_fly_fuses():
    nl = _moe_block()
    x = np.random.default_rng(0).standard_normal((9, 32)).astype(np.float32)
    ref = _run_block(nl, x)
    (cov,) = fuse(nl, "cpu", kinds=["moe"])
    assert (cov.candidates, cov.fused) == (1, 1)
    assert [n.op_type for n in nl.nodes()] == ["Gemm", "MoE"]
    got = _run_block(nl, x)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5


@pytest.mark.parametrize("variant, target, reason", [
    (dict(act="gelu"), "cpu", "gated with GELU (erf)"),
    (dict(router="Sigmoid"), "cpu", "router scores are Sigmoid"),
    (dict(hidden=8, inter=8), "cuda", "hidden and expert width >= 16"),
    (dict(hidden=20, inter=18), "cuda", "multiples of 4"),
])
def test_moe_block_that_does_not_fit_is_a_miss_with_a_reason(variant, target, reason):
    nl = _moe_block(**variant)
    before = [n.op_type for n in nl.nodes()]
    (cov,) = fuse(nl, target, kinds=["moe"])
    assert (cov.candidates, cov.fused) == (1, 0)
    (miss,) = cov.misses
    assert reason in miss.reason and miss.site == "<top> (TopK -> top_v)"
    assert [n.op_type for n in nl.nodes()] == before  # left as it was
    assert reason[:30] in report_fusion([cov])


# ------------------------------------------------------------------ float16 exports (the real-size zoo dtype)
def _fp16_pair(name, cache_dir, tmp_path_factory):
    """A tiny zoo config exported like the real-size entries: float16, through the same HF frontend path
    (HF half-precision RMSNorm upcasts to fp32 and casts back; the router softmax is cast to fp32)."""
    from softsyn.frontends import hf, zoo

    cfg = zoo.make_config(zoo.ZOO[name])
    nl = hf.load_transformers_design(cfg, f"{name}-fp16", f"zoo:{name} (float16)", cache_dir, progress=False,
                                     weights="random", dtype="float16")
    assert nl.model.graph.inputs[1].dtype == ir.DataType.INT64  # attention_mask; the KV inputs are fp16
    assert any(v.dtype == ir.DataType.FLOAT16 for v in nl.model.graph.inputs)
    feeds = [scenario_inputs(nl, d, seed=1) for d in DECODE_SCENARIOS]
    d = tmp_path_factory.mktemp(f"fuse-{name}-fp16")
    ref_names, ref = _run(nl.model, d / "ref.onnx", feeds)
    cov = {c.kind: c for c in fuse(nl, "cpu")}
    names, got = _run(nl.model, d / "fused.onnx", feeds)
    return nl, cov, ref_names, ref, names, got


@pytest.mark.parametrize("name", ["qwen3-tiny", "qwen3-moe-tiny"])
def test_float16_export_fuses_fully_and_matches(name, cache_dir, tmp_path_factory):
    nl, cov, ref_names, ref, names, got = _fp16_pair(name, cache_dir, tmp_path_factory)
    layers = nl.config["num_layers"]
    for c in cov.values():
        assert not c.misses, (c.kind, [m.reason for m in c.misses])
        assert c.fused == c.candidates
    assert cov["attention"].fused == layers
    assert cov["rms_norm"].fused == 1 + 4 * layers        # input/post norms, q/k norms, final norm
    assert cov["skip_rms_norm"].fused == 2 * layers
    assert cov["rotary"].fused == 2 * layers
    assert cov["packed_qkv"].fused == layers
    if name == "qwen3-moe-tiny":
        assert cov["moe"].fused == layers and cov["gate_up"].candidates == 0
    else:
        assert cov["gate_up"].fused == layers
    after = collections.Counter(n.op_type for n in nl.nodes())
    # the fused norms take the fp16 tensors themselves (they compute in fp32 inside): no Cast wrappers,
    # no Pow/ReduceMean left; the remaining Casts are the GQA length computations
    assert not after["Pow"] and not after["ReduceMean"] and not after["Softmax"]
    norms = [n for n in nl.nodes() if n.op_type in ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")]
    assert norms and all(n.inputs[0].dtype == ir.DataType.FLOAT16 and n.outputs[0].dtype == ir.DataType.FLOAT16
                         for n in norms)
    assert {n.inputs[2].dtype for n in nl.nodes() if n.op_type == "RotaryEmbedding"} == {ir.DataType.FLOAT16}
    assert names == ref_names
    for scenario, r, g in zip(DECODE_SCENARIOS, ref, got):
        for out, a, b in zip(names, r, g):
            assert a.dtype == b.dtype == np.float16 and a.shape == b.shape, (scenario, out)
            a, b = a.astype(np.float64), b.astype(np.float64)
            rel = np.abs(a - b).max() / (np.abs(a).max() + 1e-12)
            assert rel < 1e-2, (scenario, out, rel)   # fp16 tolerance (observed ~1e-3)
