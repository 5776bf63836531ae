"""Fusion: equivalence on ORT CPU before/after, structure (every decoder attention -> GQA), coverage
report, and misses that carry a reason instead of silence."""
from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as T
from onnx import helper as oh

from softsyn.frontends import read_design
from passes.fuse import Coverage, Miss, fuse, fusion_kinds
from softsyn.runtime.inputs import scenario_inputs
from softsyn.timing.cost import node_work
from softsyn.netlist import HIERARCHY_KEY, Netlist
from reports import report_fusion

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
        # SwiGLU's gate: x * sigmoid(x) is one QuickGelu(alpha 1) per dense MLP; an MoE's experts are in its MoE op
        assert after["QuickGelu"] == cov["silu"].fused == (0 if after["MoE"] else layers) and not after["Sigmoid"]
        assert all(n.attributes["alpha"].value == 1.0 for n in nl.nodes() if n.op_type == "QuickGelu")
    else:
        assert after["MultiHeadAttention"] == cov["attention"].fused == 6
        # 13: the embeddings' too, whose position embeddings [1, S, H] broadcast over the batch (the op's skip)
        assert after["SkipLayerNormalization"] == 13 and after["BiasGelu"] == 6
        assert cov["skip_layer_norm"].fused == cov["skip_layer_norm"].candidates == 13
        emb = next(n for n in nl.nodes() if n.op_type == "SkipLayerNormalization" and "embeddings" in nl.hierarchy(n))
        assert emb.inputs[1].shape[0] == 1 and emb.inputs[0].shape[0] != 1
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
        assert a["swiglu_limit"] == float("inf")  # ORT 1.31.1's CUDA default (7.0) would clip gate/up
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
def _odd_attention(softcap: bool = False, bias_inside: bool = False) -> Netlist:
    """KV-cached attention with no causal mask (bidirectional over the cache) — or soft-capped scores, with an
    additive bias inside the cap (tanh(scores + bias)) where `bias_inside`."""
    B, S, P, N, H = "batch", "seq", "past", 2, 8
    vi = oh.make_tensor_value_info
    nodes = [
        oh.make_node("Concat", ["past_key", "k"], ["present.key"], axis=2),
        oh.make_node("Concat", ["past_value", "v"], ["present.value"], axis=2),
        oh.make_node("Transpose", ["present.key"], ["kt"], perm=[0, 1, 3, 2]),
        oh.make_node("MatMul", ["q", "kt"], ["scores"]),
    ]
    last = "scores"
    if bias_inside:
        nodes += [oh.make_node("Add", ["scores", "bias"], ["biased"])]
        last = "biased"
    if softcap:
        nodes += [oh.make_node("Tanh", [last], ["capped"])]
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
         vi("past_key", T.FLOAT, [B, N, P, H]), vi("past_value", T.FLOAT, [B, N, P, H])]
        + ([vi("bias", T.FLOAT, [B, 1, S, "total"])] if bias_inside else []),
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

    # a soft cap is GroupQueryAttention's softcap (passes.fuse.window): the site misses for its mask alone
    nl = _odd_attention(softcap=True)
    (cov,) = fuse(nl, "cpu", kinds=["attention"])
    assert cov.fused == 0 and "causal" in cov.misses[0].reason and "Tanh" not in cov.misses[0].reason
    # a bias inside the cap is squashed to -softcap, not masked: no fused op computes that
    nl = _odd_attention(softcap=True, bias_inside=True)
    (cov,) = fuse(nl, "cpu", kinds=["attention"])
    assert cov.fused == 0 and "inside the soft cap" in cov.misses[0].reason
    assert "Misses (1)" in report_fusion([cov]) and "before the Tanh" in report_fusion([cov])


def _residual_read_before_its_norm() -> Netlist:
    """x + r -> s; Reshape(s) (a second reader of the residual sum, before the norm, as Qwen3-VL's DeepStack
    merger reads the vision stream) -> side; LayerNormalization(s) -> y."""
    vi = oh.make_tensor_value_info
    rng = np.random.default_rng(0)
    nodes = [oh.make_node("Add", ["x", "r"], ["s"], name="add"),
             oh.make_node("Reshape", ["s", "flat"], ["side"], name="side_reader"),
             oh.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], name="norm", axis=-1, epsilon=1e-5)]
    graph = oh.make_graph(
        nodes, "residual", [vi("x", T.FLOAT, ["batch", "seq", 8]), vi("r", T.FLOAT, ["batch", "seq", 8])],
        [vi("y", T.FLOAT, ["batch", "seq", 8]), vi("side", T.FLOAT, None)],
        initializer=[oh.make_tensor("flat", T.INT64, [2], [-1, 8]),
                     onnx.numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "gamma"),
                     onnx.numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "beta")])
    model = onnx.shape_inference.infer_shapes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)],
                                                            ir_version=10))
    return Netlist(ir.serde.deserialize_model(model), "residual", kind="generic")


def test_skip_norm_goes_before_every_reader_of_the_residual_sum(tmp_path):
    nl = _residual_read_before_its_norm()
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((2, 3, 8)).astype(np.float32),
              "r": rng.standard_normal((2, 3, 8)).astype(np.float32)}]
    ref_names, ref = _run(nl.model, tmp_path / "ref.onnx", feeds)
    (cov,) = fuse(nl, "cuda", kinds=["skip_layer_norm"])
    assert cov.fused == cov.candidates == 1, cov.misses
    assert [n.op_type for n in nl.model.graph] == ["SkipLayerNormalization", "Reshape"]
    onnx.checker.check_model(ir.serde.serialize_model(nl.model))  # topologically sorted
    names, got = _run(nl.model, tmp_path / "fused.onnx", feeds)
    assert names == ref_names
    for a, b in zip(got[0], ref[0]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_rewrite_out_of_topological_order_is_a_defect_naming_the_rule(monkeypatch):
    """The skip norm placed at its norm (as before the fix) reads as what it is: softsyn's defect, named by rule."""
    from passes.fuse import norms
    from softsyn.errors import SoftsynDefect

    monkeypatch.setattr(norms, "first_in_order", lambda graph, nodes: nodes[0])  # the norm, after the Reshape
    with pytest.raises(SoftsynDefect, match=r"fuse: rule skip_layer_norm left node side_reader \(Reshape\) reading "
                                            r"\S+ before the node that makes it"):
        fuse(_residual_read_before_its_norm(), "cuda", kinds=["skip_layer_norm"])


def test_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="unknown kind"):
        fuse(_odd_attention(), kinds=["bogus"])
    assert {"rms_norm", "skip_rms_norm", "rotary", "attention", "packed_qkv", "gate_up", "gelu", "moe"} <= set(fusion_kinds())
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


def test_moe_probe_hands_the_expert_weights_to_ort_outside_the_protobuf(monkeypatch):
    """Qwen3-Next-80B's routing (512 experts, top-10) fuses, proven on probe tokens, with the stacked expert weights
    passed to ORT as external initializers, not inside the probe's protobuf: protobuf caps a model at 2 GiB and the
    80B's fc1 alone is 2 GiB, so its compile (H200, 2026-12-03) missed both MoE sites ("EncodeError: Failed to
    serialize proto"). The 4 MiB of experts here stand for the 2 GiB: the protobuf must not grow with them."""
    from passes.fuse import graph

    protos, real = [], graph.open_session

    def spy(model, settings, external=None):
        protos.append((model.ByteSize(), sum(a.nbytes for _, a in (external or {}).values())))
        return real(model, settings, external=external)

    monkeypatch.setattr(graph, "open_session", spy)
    nl = _moe_block(hidden=32, inter=32, experts=512, k=10)
    experts = sum(v.const_value.nbytes for name, v in nl.model.graph.initializers.items() if name.startswith("experts"))
    x = np.random.default_rng(0).standard_normal((9, 32)).astype(np.float32)
    ref = _run_block(nl, x)
    (cov,) = fuse(nl, "cpu", kinds=["moe"])
    assert (cov.candidates, cov.fused, cov.misses) == (1, 1, [])
    assert [n.op_type for n in nl.nodes()] == ["Gemm", "MoE"]
    (moe,) = [n for n in nl.nodes() if n.op_type == "MoE"]
    assert moe.domain == "com.microsoft" and moe.attributes["k"].value == 10
    assert tuple(moe.inputs[2].shape) == (512, 64, 32) and tuple(moe.inputs[4].shape) == (512, 32, 32)
    got = _run_block(nl, x)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5
    assert len(protos) == 2 and experts == 6 * 2**20  # the probe ran the expert graph and the MoE node
    assert all(size < 2**17 and outside >= 4 * 2**20 for size, outside in protos), protos


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


# ---------------------------------------------------------------- cuda: rotary and q/k norm absorbed into GQA
def _distinct_qk_norm_weights(model):
    """Random exports share one all-ones initializer between q_norm and k_norm: give each its own random
    weight, so a q/k swap or a dropped weight shows in the numbers."""
    from passes.fuse.graph import add_initializer

    rng = np.random.default_rng(5)
    for node in list(model.graph):
        h = node.metadata_props.get(HIERARCHY_KEY, "") or node.name
        for i, v in enumerate(node.inputs):
            if v is not None and v.const_value is not None and len(v.shape or ()) == 1 and node.op_type == "Mul" \
                    and ("q_norm" in v.name or "k_norm" in v.name):
                w = (1 + 0.5 * rng.standard_normal(v.shape[0])).astype(v.dtype.numpy())
                tag = "q" if "q_norm" in h else "k"
                node.replace_input_with(i, add_initializer(model.graph, f"{tag}_norm_test.weight", w))


def _cuda_fused(name, cache_dir, distinct_norms=False):
    nl = read_design(f"zoo:{name}", cache_dir=cache_dir, progress=False)
    ref = read_design(f"zoo:{name}", cache_dir=cache_dir, progress=False).model  # the unfused model (cache hit)
    if distinct_norms:
        _distinct_qk_norm_weights(nl.model)
        _distinct_qk_norm_weights(ref)
        nl.invalidate()
    cov = {c.kind: c for c in fuse(nl, "cuda")}
    return nl, ref, cov


def _rms(x, w, eps):
    x32 = x.astype(np.float32)
    return (x32 / np.sqrt((x32 * x32).mean(-1, keepdims=True) + eps) * w.astype(np.float32)).astype(x.dtype)


def _rope(x, cos, sin, pos):
    """x [B, S, N, H], non-interleaved (rotate_half) rotary at positions pos [B, S] from [P, H/2] caches."""
    h2 = x.shape[-1] // 2
    c, s = cos[pos][:, :, None, :], sin[pos][:, :, None, :]
    x1, x2 = x[..., :h2], x[..., h2:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def _gqa_reference(node, vals):
    """numpy GroupQueryAttention (ORT contract): per-head RMSNorm of q/k (q_norm_weight, k_norm_weight), then
    rotary at positions past + i with past = seqlens_k + 1 - S (right padding / all-ones masks), causal
    attention over past + new with K/V heads shared by groups. Returns (output, present_key, present_value)."""
    a = {k: v.value for k, v in node.attributes.items()}
    q, k, v, pk, pv, seqlens = (vals[i] for i in range(6))
    n, nkv = a["num_heads"], a["kv_num_heads"]
    b, s, _ = q.shape
    h = pk.shape[-1]
    if k is None:  # packed QKV as the query
        q, k, v = np.split(q, [n * h, (n + nkv) * h], axis=-1)
    q, k, v = q.reshape(b, s, n, h), k.reshape(b, s, nkv, h), v.reshape(b, s, nkv, h)
    if len(vals) > 15 and vals[14] is not None:
        eps = a.get("qk_norm_epsilon", 1e-6)
        q, k = _rms(q, vals[14], eps), _rms(k, vals[15], eps)
    past = seqlens.astype(np.int64) + 1 - s
    if a.get("do_rotary", 0):
        pos = past[:, None] + np.arange(s)[None, :]
        q, k = _rope(q, vals[7], vals[8], pos), _rope(k, vals[7], vals[8], pos)
    pres_k = np.concatenate([pk, k.transpose(0, 2, 1, 3)], axis=2)
    pres_v = np.concatenate([pv, v.transpose(0, 2, 1, 3)], axis=2)
    kk = np.repeat(pres_k, n // nkv, axis=1).astype(np.float64)
    vv = np.repeat(pres_v, n // nkv, axis=1).astype(np.float64)
    scores = np.einsum("bnsh,bnth->bnst", q.transpose(0, 2, 1, 3).astype(np.float64), kk) * a["scale"]
    t = kk.shape[2]
    allowed = np.arange(t)[None, None, None, :] <= (past[:, None, None, None] + np.arange(s)[None, None, :, None])
    scores = np.where(allowed, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("bnst,bnth->bnsh", p, vv).transpose(0, 2, 1, 3).reshape(b, s, n * h)
    return out.astype(q.dtype), pres_k, pres_v


def _run_with_gqa_reference(nl, feeds):
    """All graph outputs of a cuda-fused model: every GroupQueryAttention by the numpy reference, everything
    else on ORT CPU (graph.evaluate), layer after layer."""
    from passes.fuse.graph import evaluate

    g, opsets = nl.model.graph, dict(nl.model.opset_imports)
    known = {v: feeds[v.name] for v in g.inputs}
    for node in (n for n in g if n.op_type == "GroupQueryAttention"):
        ins = list(node.inputs)
        need = [v for v in ins if v is not None and v.const_value is None and v not in known]
        got = evaluate(g, need, known, opsets) if need else []
        val = dict(zip(need, got))
        vals = [None if v is None else (v.const_value.numpy() if v.const_value is not None else known.get(v, val.get(v)))
                for v in ins]
        for o, r in zip(node.outputs, _gqa_reference(node, vals)):
            known[o] = r
    rest = [o for o in g.outputs if o not in known]
    got = dict(zip(rest, evaluate(g, rest, known, opsets))) if rest else {}
    return [np.asarray(known[o] if o in known else got[o]) for o in g.outputs]


def _ref_outputs(model, feeds, path):
    names, (out,) = _run(model, path, [feeds])
    return names, out


def test_cuda_gqa_absorbs_rotary_and_qk_norm_structure(cache_dir):
    nl, ref, cov = _cuda_fused("qwen3-tiny", cache_dir)
    layers, h = nl.config["num_layers"], 32
    after = collections.Counter(n.op_type for n in nl.nodes())
    assert after["GroupQueryAttention"] == layers and not after["RotaryEmbedding"] and not after["Reshape"]
    assert after["SimplifiedLayerNormalization"] == 1  # the final norm; no q/k norms left
    assert not [n for n in nl.nodes() if n.op_type == "SimplifiedLayerNormalization" and "_norm" in nl.hierarchy(n)
                and ("q_norm" in nl.hierarchy(n) or "k_norm" in nl.hierarchy(n))]
    assert [v.name for v in nl.model.graph.inputs] == [v.name for v in ref.graph.inputs]  # position_ids stays
    for node in (n for n in nl.nodes() if n.op_type == "GroupQueryAttention"):
        ins = list(node.inputs)
        assert len(ins) == 16 and all(v is None for v in ins[9:14])
        # the packed QKV MatMul feeds the node as its query; no Split, no key/value inputs (ORT's packed form)
        assert ins[0].producer().op_type == "MatMul" and ins[1] is None and ins[2] is None
        assert ins[0].shape[-1] == (4 + 2 * 2) * h
        sizes = node_work(node, nl.bind({"batch": 1, "seq": 1, "past": 16})).sizes  # timed at its own head size
        assert (sizes["heads"], sizes["kv_heads"], sizes["head_dim"]) == (4, 2, h)
        cos, sin = ins[7].const_value.numpy(), ins[8].const_value.numpy()
        assert cos.shape == sin.shape == (nl.config.get("max_position_embeddings") or 4096, h // 2) or cos.shape[1] == h // 2
        assert ins[14].const_value.numpy().shape == ins[15].const_value.numpy().shape == (h,)
        assert "q_norm" in ins[14].name or "k_norm" in ins[14].name
        a = {k: v.value for k, v in node.attributes.items()}
        assert set(a) == {"num_heads", "kv_num_heads", "scale", "local_window_size", "softcap", "do_rotary",
                          "rotary_interleaved", "qk_norm_epsilon"}
        assert (a["num_heads"], a["kv_num_heads"], a["local_window_size"], a["softcap"], a["do_rotary"],
                a["rotary_interleaved"]) == (4, 2, -1, 0.0, 1, 0)
        assert abs(a["qk_norm_epsilon"] - 1e-6) < 1e-9 and abs(a["scale"] - h ** -0.5) < 1e-6
    att = cov["attention"]
    assert att.fused == layers and not att.misses
    assert f"rotary absorbed into GroupQueryAttention (do_rotary=1) {layers}/{layers}" in att.note
    assert f"q/k RMSNorm absorbed (q_norm_weight/k_norm_weight) {layers}/{layers}" in att.note
    assert "not absorbed" not in att.note


def test_cuda_gqa_with_qk_norm_matches_unfused_by_reference(cache_dir, tmp_path):
    """ORT CPU refuses q/k-norm GQA, so the fused GQA nodes are computed by a numpy reference from their
    inputs (the rest of the model on ORT CPU) and compared with the unfused model on ORT CPU."""
    nl, ref, _ = _cuda_fused("qwen3-tiny", cache_dir, distinct_norms=True)
    gqa = next(n for n in nl.nodes() if n.op_type == "GroupQueryAttention")
    assert gqa.inputs[14].name.startswith("q_norm_test") and gqa.inputs[15].name.startswith("k_norm_test")
    for scenario in DECODE_SCENARIOS:
        feeds = scenario_inputs(nl, scenario, seed=1)
        names, want = _ref_outputs(ref, feeds, tmp_path / "ref.onnx")
        got = _run_with_gqa_reference(nl, feeds)
        assert [o.name for o in nl.model.graph.outputs] == names
        for name, a, b in zip(names, want, got):
            assert a.shape == b.shape, (scenario, name)
            rel = np.abs(a - b).max() / (np.abs(a).max() + 1e-12)
            assert rel < 1e-4, (scenario, name, rel)


def test_cuda_gqa_rotary_only_runs_on_cpu_and_matches(cache_dir, tmp_path):
    """llama-tiny (no q/k norm): do_rotary=1 GQA runs on ORT 1.31 CPU (head size a multiple of 16), so the
    rotary absorption is checked end to end on the real kernel."""
    nl, ref, cov = _cuda_fused("llama-tiny", cache_dir)
    gqas = [n for n in nl.nodes() if n.op_type == "GroupQueryAttention"]
    assert len(gqas) == nl.config["num_layers"] and not [n for n in nl.nodes() if n.op_type == "RotaryEmbedding"]
    assert all(n.attributes["do_rotary"].value == 1 and len(n.inputs) == 9 for n in gqas)
    assert "q/k RMSNorm absorbed (q_norm_weight/k_norm_weight) 0/" in cov["attention"].note
    feeds = [scenario_inputs(nl, d, seed=1) for d in DECODE_SCENARIOS]
    names, got = _run(nl.model, tmp_path / "cuda.onnx", feeds)
    for scenario, f, g in zip(DECODE_SCENARIOS, feeds, got):
        ref_names, want = _ref_outputs(ref, f, tmp_path / "ref.onnx")
        assert names == ref_names
        for name, a, b in zip(names, want, g):
            rel = np.abs(a - b).max() / (np.abs(a).max() + 1e-12)
            assert rel < 1e-4, (scenario, name, rel)
        # and the reference agrees with the real kernel
        for name, a, b in zip(names, g, _run_with_gqa_reference(nl, f)):
            rel = np.abs(a - b).max() / (np.abs(a).max() + 1e-12)
            assert rel < 1e-4, (scenario, name, rel)


def test_cuda_rotary_on_computed_positions_is_not_absorbed(cache_dir):
    """Rotary reading a computed position tensor (here position_ids + 3): GQA would rotate at past + i, so it
    keeps today's unabsorbed form (still fused) and the note says why."""
    from passes.fuse.graph import int64, make_node

    nl = read_design("zoo:qwen3-tiny", cache_dir=cache_dir, progress=False)
    fuse(nl, "cuda", kinds=["rms_norm", "rotary"])
    g = nl.model.graph
    pos = next(v for v in g.inputs if v.name == "position_ids")
    rots = [n for n in g if n.op_type == "RotaryEmbedding"]
    add = make_node(rots[0], "", "Add", [pos, int64(g, "three", 3)])
    add.outputs[0].shape, add.outputs[0].type = pos.shape, pos.type
    g.insert_before(rots[0], add)
    for n in rots:
        n.replace_input_with(1, add.outputs[0])
    nl.invalidate()
    cov = {c.kind: c for c in fuse(nl, "cuda")}
    att = cov["attention"]
    assert att.fused == att.candidates == 2 and not att.misses  # still fused
    after = collections.Counter(n.op_type for n in nl.nodes())
    assert after["RotaryEmbedding"] == 4 and after["GroupQueryAttention"] == 2
    assert all("do_rotary" not in n.attributes and len(n.inputs) == 7 for n in nl.nodes() if n.op_type == "GroupQueryAttention")
    assert "rotary absorbed into GroupQueryAttention (do_rotary=1) 0/2" in att.note
    assert "not the model's position_ids input" in att.note and "GQA (positions from seqlens_k) cannot absorb it" in att.note


def test_cpu_gqa_keeps_rotary_and_norms_outside(fused_pairs):
    nl = fused_pairs("qwen3-tiny")["netlist"]
    layers = nl.config["num_layers"]
    after = collections.Counter(n.op_type for n in nl.nodes())
    assert after["RotaryEmbedding"] == 2 * layers and after["SimplifiedLayerNormalization"] == 1 + 2 * layers
    for n in (n for n in nl.nodes() if n.op_type == "GroupQueryAttention"):
        assert len(n.inputs) == 7 and set(n.attributes) == {"num_heads", "kv_num_heads", "scale"}
    assert fused_pairs("qwen3-tiny")["cov"]["attention"].note == ""


def test_half_precision_attention_scale_is_restored_to_its_exact_value():
    from passes.fuse.attention import exact_scale

    rounded = float(np.float16(128 ** -0.5))  # what an fp16 export stores: 0.08838 -> 0.08844
    assert exact_scale(rounded, 128) == 128 ** -0.5
    assert exact_scale(0.125, 128) == 0.125  # a deliberate, different scale is kept
    assert exact_scale(rounded, None) == rounded


# ---------------------------------------------------------------- real width (qwen3-1.7b layer shapes), weightless
# qwen3-1.7b's layers at their real width (hidden 2048, 16/8 heads, head 128, MLP 6144), 2 of its 28, vocab cut to
# 1024: built like zoo:qwen3-1.7b with materialize=True (weightless fp16 export, seeded weights filled in, then the
# exporter's optimizer), whose graph differs from a direct torch export's (a no-op view after probs @ V survives).
TWO_LAYERS = dict(num_hidden_layers=2, vocab_size=1024)


def _zoo_2layers(cache_dir, weights: str, name: str = "qwen3-1.7b", dtype: str = "float16"):
    """A zoo config cut to 2 layers (vocab 1024) through the HF frontend: weights "meta" (weightless export) or
    "filled" (what materialize=True does: seeded weights filled into it, then the exporter's optimizer)."""
    from softsyn.frontends import hf, zoo

    cfg = zoo.make_config(zoo.ZOO[name])
    for k, v in TWO_LAYERS.items():
        setattr(cfg, k, v)
    return hf.load_transformers_design(cfg, f"{name}-2layers", f"zoo:{name} (2 layers)", cache_dir, progress=False,
                                       weights=weights, dtype=dtype)


def _flatten(nl):
    from passes import get

    class _D:  # what the flatten pass uses of a Design
        netlist = nl

        def netlist_changed(self):
            nl.invalidate()

    get("flatten").run(_D())
    return nl


@pytest.fixture(scope="module")
def real_width(cache_dir):
    """Memoised per module: (unfused materialised netlist, its cuda-fused copy, cuda coverage)."""
    ref = _zoo_2layers(cache_dir, "filled")
    nl = _zoo_2layers(cache_dir, "filled")  # cache hit: a second, independent netlist
    cov = {c.kind: c for c in fuse(nl, "cuda")}
    return ref, nl, cov


def test_real_width_fp16_cuda_fuses_everything(real_width):
    ref, nl, cov = real_width
    layers = nl.config["num_layers"]
    assert nl.config["hidden_size"] == 2048 and nl.config["head_dim"] == 128
    for c in cov.values():
        assert c.fused == c.candidates and not c.misses, (c.kind, [m.reason for m in c.misses])
    assert cov["attention"].fused == layers and cov["rotary"].fused == 2 * layers
    assert cov["packed_qkv"].fused == cov["gate_up"].fused == layers
    assert f"rotary absorbed into GroupQueryAttention (do_rotary=1) {layers}/{layers}" in cov["attention"].note
    assert f"q/k RMSNorm absorbed (q_norm_weight/k_norm_weight) {layers}/{layers}" in cov["attention"].note
    after = collections.Counter(n.op_type for n in nl.nodes())
    assert after["GroupQueryAttention"] == layers and not after["Softmax"] and not after["Reshape"]
    for node in (n for n in nl.nodes() if n.op_type == "GroupQueryAttention"):
        a = {k: v.value for k, v in node.attributes.items()}
        assert (a["num_heads"], a["kv_num_heads"], a["do_rotary"]) == (16, 8, 1)
        assert abs(a["scale"] - 128 ** -0.5) < 1e-7
        assert node.inputs[7].const_value.numpy().shape == (40960, 64)


def test_real_width_fp16_cuda_matches_unfused(real_width, tmp_path):
    """The cuda graph (GQA with rotary and q/k norms absorbed, CUDA-only) by the numpy GQA reference, the rest on
    ORT CPU, against the unfused model on ORT CPU: fp16 noise only."""
    ref, nl, _ = real_width
    assert len([n for n in nl.nodes() if n.op_type == "GroupQueryAttention"]) == nl.config["num_layers"]
    for scenario in DECODE_SCENARIOS:
        feeds = scenario_inputs(nl, scenario, seed=1)
        names, want = _ref_outputs(ref.model, feeds, tmp_path / "ref.onnx")
        got = _run_with_gqa_reference(nl, feeds)
        assert [o.name for o in nl.model.graph.outputs] == names
        for name, a, b in zip(names, want, got):
            assert a.dtype == np.float16 and a.shape == b.shape, (scenario, name)
            a, b = a.astype(np.float64), b.astype(np.float64)
            rel = np.abs(a - b).max() / (np.abs(a).max() + 1e-12)
            assert rel < 1e-2, (scenario, name, rel)   # fp16 rounding (observed <= 1.4e-3)


def test_real_width_fp16_cpu_runs_and_matches_unfused(cache_dir, real_width, tmp_path):
    """The same model fused for cpu (rotary and norms outside GQA) runs on the ORT CPU kernels themselves."""
    ref, _, _ = real_width
    nl = _zoo_2layers(cache_dir, "filled")
    cov = {c.kind: c for c in fuse(nl, "cpu")}
    assert cov["attention"].fused == cov["attention"].candidates == 2 and not cov["attention"].misses
    feeds = [scenario_inputs(nl, d, seed=1) for d in DECODE_SCENARIOS]
    names, got = _run(nl.model, tmp_path / "fused.onnx", feeds)
    ref_names, want = _run(ref.model, tmp_path / "ref.onnx", feeds)
    assert names == ref_names
    for scenario, w, g in zip(DECODE_SCENARIOS, want, got):
        for name, a, b in zip(names, w, g):
            a, b = a.astype(np.float64), b.astype(np.float64)
            rel = np.abs(a - b).max() / (np.abs(a).max() + 1e-12)
            assert rel < 1e-2, (scenario, name, rel)


def weightless(v) -> bool:
    """An initializer of a weightless export: shape and dtype, data never written (frontends.export.META_WEIGHTS)."""
    from softsyn.frontends.export import META_WEIGHTS

    return v is not None and isinstance(v.const_value, ir.ExternalTensor) and v.const_value.location == META_WEIGHTS


def _load_time_transposes(nl) -> int:
    """Transposes of a weight (a weightless export cannot fold them; ORT does when the session loads)."""
    return sum(1 for n in nl.nodes() if n.op_type == "Transpose" and n.inputs[0].producer() is None
               and n.inputs[0].const_value is not None)


@pytest.mark.parametrize("name,dtype", [("qwen3-tiny", "float32"), ("qwen3-1.7b", "float16")])
def test_weightless_netlist_fuses_like_the_materialised_one(cache_dir, name, dtype):
    """zoo:qwen3-1.7b without materialize is a weightless export (meta weights: shapes and dtypes, no data). After
    flatten (as compile runs it) it fuses like the materialised export of the same model: same coverage, same cells
    (but the weight Transposes it cannot fold), the new weights (rotary caches, merged projections) weightless."""
    meta = _flatten(_zoo_2layers(cache_dir, "meta", name, dtype))
    full = _flatten(_zoo_2layers(cache_dir, "filled", name, dtype))
    assert all(weightless(v) for v in meta.model.graph.initializers.values() if v.name.endswith(".weight"))
    cov_meta = {c.kind: c for c in fuse(meta, "cuda")}
    cov_full = {c.kind: c for c in fuse(full, "cuda")}
    layers = meta.config["num_layers"]
    for kind, c in cov_meta.items():
        assert not c.misses, (kind, [m.reason for m in c.misses])
        assert (c.fused, c.candidates) == (cov_full[kind].fused, cov_full[kind].candidates), kind
    assert cov_meta["rotary"].fused == 2 * layers and cov_meta["attention"].fused == layers
    assert cov_meta["packed_qkv"].fused == cov_meta["gate_up"].fused == layers
    assert cov_meta["attention"].note == cov_full["attention"].note
    ops_meta = collections.Counter(n.op_type for n in meta.nodes())
    ops_full = collections.Counter(n.op_type for n in full.nodes())
    ops_meta["Transpose"] -= _load_time_transposes(meta)
    ops_full["Transpose"] -= _load_time_transposes(full)
    assert ops_meta == ops_full
    gqa_meta = [n for n in meta.nodes() if n.op_type == "GroupQueryAttention"]
    gqa_full = [n for n in full.nodes() if n.op_type == "GroupQueryAttention"]
    for a, b in zip(gqa_meta, gqa_full):
        assert {k: v.value for k, v in a.attributes.items()} == {k: v.value for k, v in b.attributes.items()}
        assert [None if v is None else (v.dtype, tuple(v.shape) if v.shape is not None else None) for v in a.inputs] \
            == [None if v is None else (v.dtype, tuple(v.shape) if v.shape is not None else None) for v in b.inputs]
        assert weightless(a.inputs[7]) and weightless(a.inputs[8])    # cos/sin caches
        assert weightless(a.inputs[14]) and weightless(a.inputs[15])  # the model's q/k norm weights
        packed = a.inputs[0].producer()
        assert packed.op_type == "MatMul" and weightless(packed.inputs[1]) and a.inputs[1] is None


# ---------------------------------------------------------------- plain exports: positions are not token ids
def _plain_export(arch: str, path):
    """A tiny random transformers model exported as it is: torch.onnx.export(model, (input_ids,), dynamo=True),
    batch and sequence dynamic, no KV cache and no position_ids input (the model computes arange(seq) itself)."""
    import torch
    import transformers

    cfg_cls, model_cls = {"mistral": ("MistralConfig", "MistralForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                          "phi3": ("Phi3Config", "Phi3ForCausalLM")}[arch]
    cfg = getattr(transformers, cfg_cls)(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=128, vocab_size=512,
                                         max_position_embeddings=256, use_cache=False, pad_token_id=0,
                                         bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 7))
    dims = {"input_ids": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}}
    with torch.no_grad():
        torch.onnx.export(model, (ids,), dynamo=True, dynamic_shapes=dims, verbose=False).save(str(path))
    return path


@pytest.fixture(scope="module")
def plain_exports(tmp_path_factory):
    made = {}

    def get(arch):
        if arch not in made:
            made[arch] = _plain_export(arch, tmp_path_factory.mktemp(f"plain-{arch}") / f"{arch}.onnx")
        return made[arch]

    return get


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "phi3"])
def test_plain_export_rotary_reads_positions_not_token_ids(arch, plain_exports, tmp_path):
    import onnxruntime as ort

    path = plain_exports(arch)
    nl = read_design(str(path), progress=False)
    assert [v.name for v in nl.model.graph.inputs] == ["input_ids"]
    cov = {c.kind: c for c in fuse(nl, "cpu")}
    assert cov["rotary"].fused == cov["rotary"].candidates == 4, [m.reason for m in cov["rotary"].misses]
    ids = next(v for v in nl.model.graph.inputs if v.name == "input_ids")
    rots = [n for n in nl.nodes() if n.op_type == "RotaryEmbedding"]
    assert len(rots) == 4 and all(n.inputs[1] is not ids for n in rots)
    ir.save(nl.model, str(tmp_path / "fused.onnx"))
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    fused = ort.InferenceSession(str(tmp_path / "fused.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for b, s in ((2, 7), (1, 13)):
        feeds = {"input_ids": rng.integers(0, 512, (b, s)).astype(np.int64)}
        want, have = ref.run(None, feeds)[0], fused.run(None, feeds)[0]
        per_pos = np.abs(want - have).max(axis=(0, 2)) / np.abs(want).max()
        assert per_pos.max() < 1e-5, (arch, b, s, per_pos)   # at every position, not only position 0


# ---------------------------------------------------------------- GELU in the forms exporters write
def _gelu_block(form: str, bias: bool = True) -> Netlist:
    """y = GELU(x @ W (+ b)) for one of the forms: erf, tanh-pow (GPT-2's gelu_new), tanh-mul (x*x*x, the factors
    grouped otherwise), onnx-none / onnx-tanh (opset 20 Gelu)."""
    rng = np.random.default_rng(2)
    H = 16
    n, vi = oh.make_node, oh.make_tensor_value_info
    init = [oh.make_tensor("w", T.FLOAT, [H, H], rng.standard_normal(H * H) * 0.5),
            oh.make_tensor("b", T.FLOAT, [H], rng.standard_normal(H)),
            oh.make_tensor("half", T.FLOAT, [], [0.5]), oh.make_tensor("one", T.FLOAT, [], [1.0]),
            oh.make_tensor("three", T.FLOAT, [], [3.0]), oh.make_tensor("cubic", T.FLOAT, [], [0.044715]),
            oh.make_tensor("s2pi", T.FLOAT, [], [(2 / np.pi) ** 0.5]), oh.make_tensor("sqrt2", T.FLOAT, [], [2 ** 0.5])]
    nodes = [n("MatMul", ["x", "w"], ["h"])] + ([n("Add", ["h", "b"], ["g"])] if bias else [n("Identity", ["h"], ["g"])])
    if form == "erf":
        nodes += [n("Div", ["g", "sqrt2"], ["d"]), n("Erf", ["d"], ["e"]), n("Add", ["e", "one"], ["t"]),
                  n("Mul", ["g", "half"], ["gh"]), n("Mul", ["gh", "t"], ["y"])]
    elif form.startswith("tanh"):
        cube = ([n("Pow", ["g", "three"], ["c"])] if form == "tanh-pow"
                else [n("Mul", ["g", "g"], ["g2"]), n("Mul", ["g2", "g"], ["c"])])
        nodes += cube + [n("Mul", ["cubic", "c"], ["c3"]), n("Add", ["g", "c3"], ["inner"]),
                         n("Mul", ["s2pi", "inner"], ["arg"]), n("Tanh", ["arg"], ["th"]), n("Add", ["one", "th"], ["t"])]
        nodes += ([n("Mul", ["half", "g"], ["gh"]), n("Mul", ["gh", "t"], ["y"])] if form == "tanh-pow"
                  else [n("Mul", ["t", "g"], ["tg"]), n("Mul", ["tg", "half"], ["y"])])
    else:
        nodes += [n("Gelu", ["g"], ["y"], approximate=form.split("-")[1])]
    graph = oh.make_graph(nodes, "gelu", [vi("x", T.FLOAT, ["seq", H])], [vi("y", T.FLOAT, ["seq", H])],
                          initializer=init)
    model = onnx.shape_inference.infer_shapes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)], ir_version=10))
    nl = Netlist(ir.serde.deserialize_model(model), "gelu-block", kind="generic")
    _flatten(nl)  # the Identity standing in for "no bias" goes, as compile's flatten takes it out
    return nl


@pytest.mark.parametrize("form, bias, fused_op", [
    ("erf", True, "BiasGelu"), ("erf", False, "Gelu"), ("tanh-pow", True, "FastGelu"), ("tanh-mul", False, "FastGelu"),
    ("onnx-none", True, "BiasGelu"), ("onnx-tanh", True, "FastGelu"), ("onnx-none", False, "Gelu"),
])
def test_every_gelu_form_fuses_and_matches(form, bias, fused_op):
    nl = _gelu_block(form, bias)
    x = np.random.default_rng(0).standard_normal((9, 16)).astype(np.float32)
    ref = _run_block(nl, x)
    (cov,) = fuse(nl, "cpu", kinds=["gelu"])
    assert (cov.candidates, cov.fused) == (1, 1), cov.misses
    ops = [n.op_type for n in nl.nodes()]
    assert ops == ["MatMul", fused_op] and len(list(nl.nodes())[1].inputs) == (2 if bias else 1)
    got = _run_block(nl, x)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5


def test_a_tanh_that_is_not_a_gelu_is_no_candidate():
    """A pooler's Tanh (BERT, ViT) is not of sqrt(2/pi) * (...): not counted as a GELU site."""
    vi = oh.make_tensor_value_info
    graph = oh.make_graph([oh.make_node("Tanh", ["x"], ["y"])], "t", [vi("x", T.FLOAT, [4])], [vi("y", T.FLOAT, [4])])
    nl = Netlist(ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])), "tanh")
    (cov,) = fuse(nl, "cpu", kinds=["gelu"])
    assert cov.candidates == 0


# ---------------------------------------------------------------- the library decides: fused only where faster
def _residual_layer_norm(hidden: int = 64) -> Netlist:
    """LayerNormalization(x + r) over [batch, seq, hidden]: a SkipLayerNormalization site."""
    vi = oh.make_tensor_value_info
    shape = ["batch", "seq", hidden]
    init = [oh.make_tensor("gamma", T.FLOAT, [hidden], np.ones(hidden)), oh.make_tensor("beta", T.FLOAT, [hidden], np.zeros(hidden))]
    graph = oh.make_graph([oh.make_node("Add", ["x", "r"], ["s"]),
                           oh.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5)],
                          "sln", [vi("x", T.FLOAT, shape), vi("r", T.FLOAT, shape)], [vi("y", T.FLOAT, shape)],
                          initializer=init)
    model = onnx.shape_inference.infer_shapes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10))
    return Netlist(ir.serde.deserialize_model(model), "residual-ln", kind="generic")


@pytest.mark.parametrize("library, fused", [("cpu-ort", False), ("h200-ort-cuda", True)])
def test_a_fusion_the_library_times_slower_is_kept_with_its_figures(library, fused):
    """cpu-ort tables SkipLayerNormalization slower than the LayerNormalization + Add it replaces: the site is kept
    and the reason gives both delays; on the H200 (launch-bound) the fused cell wins and is applied."""
    from softsyn.constraints.model import Constraints
    from softsyn.design import Design
    from softsyn.library import load_library
    from passes.fuse import KEPT, cost_check

    nl = _residual_layer_norm()
    design = Design(nl, Constraints.default(), load_library(library), progress=False)
    (cov,) = fuse(nl, "cuda" if library.startswith("h200") else "cpu", kinds=["skip_layer_norm"], cost=cost_check(design))
    assert cov.candidates == 1 and cov.fused == int(fused)
    ops = [n.op_type for n in nl.nodes()]
    if fused:
        assert ops == ["SkipLayerNormalization"] and not cov.misses
    else:
        assert ops == ["Add", "LayerNormalization"]
        (miss,) = cov.misses
        assert miss.reason.startswith(f"{KEPT} SkipLayerNormalization tabled ") and " unfused (2 nodes, " in miss.reason
        fused_s, unfused_s = (float(t.split()[0]) for t in miss.reason.split("tabled ")[1].split(" unfused")[0].split(" > "))
        assert fused_s > unfused_s > 0
        assert miss.reason[:30] in report_fusion([cov])


def test_an_estimated_delay_is_no_evidence_against_a_fusion():
    """BiasGelu (tabled) against Add + an ONNX Gelu the library has no table for (a roofline estimate): fused."""
    from softsyn.constraints.model import Constraints
    from softsyn.design import Design
    from softsyn.library import load_library
    from passes.fuse import cost_check

    nl = _gelu_block("onnx-none")
    library = load_library("cpu-ort")
    assert library.cell_for("Gelu", "fp32", {"elements": 1}) is None and library.cell_for("BiasGelu", "fp32", {"elements": 1})
    design = Design(nl, Constraints.default(), library, progress=False)
    (cov,) = fuse(nl, "cpu", kinds=["gelu"], cost=cost_check(design))
    assert cov.fused == 1 and not cov.misses


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_rotary_cache_covers_every_position_the_kv_buffer_holds(target, cache_dir):
    """A KV buffer longer than max_position_embeddings (qwen3-tiny: 4096) still runs: GQA refuses a total length
    past its cos cache's rows, so the cache covers the buffer (compile logs that those positions are untrained)."""
    nl = read_design("zoo:qwen3-tiny", cache_dir=cache_dir, progress=False)
    trained = nl.config["max_position_embeddings"]
    fuse(nl, target, positions=trained + 904)
    caches = {v.name: v.const_value.numpy().shape for n in nl.nodes() for v in n.inputs
              if v is not None and "cos_cache" in v.name and v.const_value is not None}
    assert caches and all(rows == trained + 904 for rows, _ in caches.values()), caches


# ------------------------------------------------------------------ pattern chains: the first broken link names its value
def _rms_block(middle: str = "Sqrt", eps_input: bool = False, sqrt_out: bool = False) -> Netlist:
    """y = x / middle(mean(x**2) + eps) * gamma on [2, 3, 8] fp32 (middle Sqrt: an RMSNorm)."""
    n = oh.make_node
    nodes = [n("Pow", ["x", "two"], ["sq"], name="n_pow"),
             n("ReduceMean", ["sq", "axes"], ["mean"], name="n_mean", keepdims=1),
             n("Add", ["mean", "eps"], ["var"], name="n_add"),
             n(middle, ["var"], ["root"], name="n_root"),
             n("Div", ["x", "root"], ["normed"], name="n_div"),
             n("Mul", ["normed", "gamma"], ["y"], name="n_gamma")]
    vi = oh.make_tensor_value_info
    inits = [oh.make_tensor("two", T.FLOAT, [], [2.0]), oh.make_tensor("axes", T.INT64, [1], [-1]),
             oh.make_tensor("gamma", T.FLOAT, [8], np.linspace(0.5, 1.5, 8).tolist())]
    inputs = [vi("x", T.FLOAT, [2, 3, 8])]
    if eps_input:
        inputs.append(vi("eps", T.FLOAT, []))
    else:
        inits.append(oh.make_tensor("eps", T.FLOAT, [], [1e-6]))
    outputs = [vi("y", T.FLOAT, [2, 3, 8])] + ([vi("root", T.FLOAT, [2, 3, 1])] if sqrt_out else [])
    graph = oh.make_graph(nodes, "rms", inputs, outputs, initializer=inits)
    model = onnx.shape_inference.infer_shapes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)],
                                                            ir_version=10))
    return Netlist(ir.serde.deserialize_model(model), "rms-block", kind="generic")


@pytest.mark.parametrize("variant, reason", [
    (dict(middle="Log"), "mean(x**2)+eps (var) feeds Log (n_root), not Sqrt (no rsqrt form recognised)"),
    (dict(eps_input=True), "mean(x**2) (mean) feeds Add (n_add), not Add(eps): epsilon is not a constant scalar"),
    (dict(sqrt_out=True), "sqrt(mean(x**2)+eps) (root) has 1 consumers and is a graph output (an intermediate of "
                          "the pattern is used outside it), not only Reciprocal/Div"),
])
def test_a_norm_that_breaks_its_chain_names_the_link_and_the_value(variant, reason):
    (cov,) = fuse(_rms_block(**variant), "cpu", kinds=["rms_norm"])
    assert cov.candidates == 1 and cov.fused == 0 and cov.misses[0].reason == reason


def test_a_norm_that_follows_its_chain_fuses():
    nl = _rms_block()
    (cov,) = fuse(nl, "cpu", kinds=["rms_norm"])
    assert cov.fused == 1 and [n.op_type for n in nl.nodes()] == ["SimplifiedLayerNormalization"]
