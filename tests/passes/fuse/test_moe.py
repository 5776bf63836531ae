"""Qwen3-MoE at scale: replicated layers, weightless expert fusion, the router precision rule, active-expert timing,
the MoE/QMoE characterisation recipes and the H200 bench's CPU-runnable parts."""
from __future__ import annotations

import collections
import copy
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

import passes.fuse.moe as moe_rule
from passes.fuse.graph import evaluate as on_ort
from paths import ROOT
from softsyn.frontends import read_design, replicate, zoo
from softsyn.frontends.export import META_WEIGHTS
from softsyn.netlist import HIERARCHY_KEY, Netlist
from passes.fuse import fuse

LAYERS = 3  # one more than zoo:qwen3-moe-tiny's 2: layer 2 is a copy of layer 1


def _moe3(cache_dir) -> Netlist:
    """zoo:qwen3-moe-tiny (its random export, shared with the frontend and fusion tests; a cache hit is an
    independent netlist) with layer 1 copied once."""
    nl = read_design("zoo:qwen3-moe-tiny", cache_dir=cache_dir, progress=False)
    assert replicate.replicate_layers(nl.model, LAYERS) == 1
    nl.invalidate()
    return nl


def _layer_ops(nl, i):
    return collections.Counter(n.op_type for n in nl.nodes()
                               if n.metadata_props.get(HIERARCHY_KEY, "").startswith(f"model.layers.{i}."))


@pytest.fixture(scope="module")
def moe3(cache_dir):
    return _moe3(cache_dir)


def test_replicated_layer_is_a_copy_with_its_own_ports(moe3):
    assert _layer_ops(moe3, 2) == _layer_ops(moe3, 1) and sum(_layer_ops(moe3, 2).values()) > 50
    g = moe3.model.graph
    assert [v.name for v in g.inputs][-2:] == ["past_key_values.2.key", "past_key_values.2.value"]
    assert [v.name for v in g.outputs][-2:] == ["present.2.key", "present.2.value"]
    own = sorted(k[len("model.layers.2."):] for k in g.initializers if k.startswith("model.layers.2."))
    assert own and own == sorted(k[len("model.layers.1."):] for k in g.initializers if k.startswith("model.layers.1."))


def test_replicated_netlist_computes_the_torch_model_with_that_layer_repeated(moe3, tmp_path):
    """The copy reads the previous layer's hidden state and its own cache: ORT on the 3-layer netlist gives the
    logits and present KV of the torch model whose third layer is a copy of its second."""
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForCausalLM

    cfg = zoo.make_config(zoo.ZOO["qwen3-moe-tiny"])
    torch.manual_seed(0)  # the zoo's random weights
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, experts_implementation="batched_mm").eval()
    extra = copy.deepcopy(model.model.layers[1])
    extra.self_attn.layer_idx = 2
    model.model.layers.append(extra)
    model.config.num_hidden_layers = LAYERS
    path = tmp_path / "m.onnx"
    ir.save(moe3.model, str(path), external_data="m.onnx.data")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 6))
    feeds = {"input_ids": ids, "attention_mask": np.ones((2, 6), np.int64),
             "position_ids": np.tile(np.arange(6), (2, 1))}
    for i in range(LAYERS):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{i}.{kv}"] = np.zeros((2, cfg.num_key_value_heads, 0, cfg.head_dim), np.float32)
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids), use_cache=True)
    np.testing.assert_allclose(got["logits"], ref.logits.numpy(), atol=1e-4, rtol=1e-3)
    np.testing.assert_allclose(got["present.2.key"], ref.past_key_values.layers[2].keys.numpy(), atol=1e-4, rtol=1e-3)


def _weightless(nl: Netlist) -> Netlist:
    """The netlist as a meta export leaves it: every weight an external tensor that was never written."""
    for v in nl.model.graph.initializers.values():
        t = v.const_value
        if v.name.startswith(("model.layers.", "lm_head", "model.embed")) and getattr(t, "location", "") != META_WEIGHTS:
            v.const_value = ir.ExternalTensor(location=META_WEIGHTS, offset=0, length=t.nbytes, dtype=t.dtype,
                                              shape=t.shape, name=v.name)
    return nl


@pytest.mark.parametrize("probe_bytes", [64 * 2**20, 0])
def test_weightless_experts_fuse_into_moe_with_weightless_weights(cache_dir, moe3, monkeypatch, probe_bytes):
    """Meta expert weights fuse: probed with seeded stand-ins while small, by data flow alone above
    PROBE_WEIGHT_BYTES (a real-size layer's GBs are never allocated); the fused fc1/fc2 stay weightless."""
    from passes.fuse import moe as moe_rule
    from passes.rules.router import router_cells

    monkeypatch.setattr(moe_rule, "PROBE_WEIGHT_BYTES", probe_bytes)
    nl = _weightless(_moe3(cache_dir))
    (cov,) = fuse(nl, "cuda", kinds=["moe"])
    assert (cov.candidates, cov.fused, cov.misses) == (LAYERS, LAYERS, [])
    assert ("3 weightless site(s) above 0 MiB" in cov.note) == (probe_bytes == 0)
    nodes = [n for n in nl.nodes() if n.op_type == "MoE"]
    cfg = moe3.config
    for n in nodes:
        fc1, fc2 = n.inputs[2], n.inputs[4]
        assert isinstance(fc1.const_value, ir.ExternalTensor) and fc1.const_value.location == META_WEIGHTS
        assert tuple(fc1.shape) == (cfg["num_experts"], 2 * cfg["moe_intermediate_size"], cfg["hidden_size"])
        assert tuple(fc2.shape) == (cfg["num_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"])
    # the precision rule names each fused layer's router MatMul
    cells = router_cells(nl.model.graph)
    assert len(cells["matmul"]) == LAYERS and not cells["scores"]
    assert all(c.op_type in ("MatMul", "Gemm") and any(u.op_type == "MoE" for o in c.outputs for u, _ in o.uses())
               or c.op_type in ("MatMul", "Gemm") for c in cells["matmul"])


def test_router_softmax_and_topk_stay_fp32_when_the_rest_goes_fp16(cache_dir):
    """Unfused routing (a target without MoE) keeps its Softmax/TopK out of fp16 (rule moe_router)."""
    from passes.precision.fp16 import to_fp16

    nl = _moe3(cache_dir)
    result = to_fp16(nl.model)
    assert result.islands["moe_router"] == 2 * LAYERS
    topks = [n for n in nl.nodes() if n.op_type == "TopK"]
    assert len(topks) == LAYERS
    for topk in topks:
        score = topk.inputs[0].producer()
        assert score.op_type == "Softmax" and score.inputs[0].dtype == topk.inputs[0].dtype == ir.DataType.FLOAT


def test_active_experts_and_moe_bytes_charge_the_experts_touched():
    from softsyn.timing.cost import active_experts, node_work

    assert active_experts(128, 8, 1) == pytest.approx(8)
    assert active_experts(128, 8, 16) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 16))
    assert 127 < active_experts(128, 8, 512) <= 128
    f16 = ir.DataType.FLOAT16
    E, H, I = 128, 2048, 768

    def node(tokens):
        x = ir.Value(name="x", shape=ir.Shape([tokens, H]), type=ir.TensorType(f16))
        r = ir.Value(name="r", shape=ir.Shape([tokens, E]), type=ir.TensorType(f16))
        w1 = ir.Value(name="w1", shape=ir.Shape([E, 2 * I, H]), type=ir.TensorType(f16))
        w2 = ir.Value(name="w2", shape=ir.Shape([E, H, I]), type=ir.TensorType(f16))
        n = ir.node("MoE", [x, r, w1, None, w2], attributes={"k": 8}, domain="com.microsoft")
        n.outputs[0].shape, n.outputs[0].dtype = ir.Shape([tokens, H]), f16
        return n

    expert = 3 * I * H * 2
    decode, prefill = node_work(node(1), {}), node_work(node(512), {})
    assert decode.sizes == {"tokens": 1, "experts": E, "k": 8, "hidden": H, "inter": 3 * I}
    act = lambda t: t * (2 * H + E) * 2  # noqa: E731 -- tokens in and out, router logits (fp16)
    assert decode.bytes - act(1) == pytest.approx(8 * expert)            # k experts' weights
    assert 127 * expert < prefill.bytes - act(512) <= 128 * expert      # nearly every expert
    assert decode.flops == pytest.approx(2 * 8 * 3 * I * H)


@pytest.mark.parametrize("key", ["MoE.fp32", "QMoE.int4"])
def test_moe_recipes_run_on_ort_cpu(key):
    """The characterisation graphs load and run where ORT registers the op (CPU: MoE float, QMoE)."""
    import onnxruntime as ort

    from softsyn.characterize.catalogue import cell_kinds
    from softsyn.characterize.cellgraph import Ctx, make_model
    from softsyn.timing.cost import node_work

    kind = next(k for k in cell_kinds() if k.key == key)
    assert kind.axes == ["tokens", "experts", "k", "hidden", "inter"]
    sizes = {a: g[0] for a, g in zip(kind.axes, kind.grids["cpu-quick"])}
    g = kind.build(sizes, 2, Ctx("cpu", 256, 32, "fp32", precision=kind.precision))
    model = make_model(g)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {name: arr for name, (_, arr) in g.inputs.items()}
    outs = sess.run(None, feeds)
    assert len(outs) == 2 and outs[0].shape == (sizes["tokens"], sizes["hidden"]) and np.isfinite(outs[0]).all()
    # the cell's sizes are what cost.node_work computes for the node it measures
    irm = ir.serde.deserialize_model(model)
    (n0,) = [n for n in irm.graph if n.name.endswith("0")]
    assert node_work(n0, {}).sizes == sizes


def test_moe_cuda_bench_compiles_the_tiny_model_for_cuda_with_moe(cache_dir, tmp_path):
    """bench/moe_cuda.py's CPU-runnable part: its configs and commands, and its first step (compile
    qwen3-moe-tiny for h200-ort-cuda, on the CPU) gives an artifact whose experts are MoE cells."""
    import importlib.util
    import json

    from click.testing import CliRunner

    from softsyn.cli import main

    spec = importlib.util.spec_from_file_location("moe_cuda", ROOT / "bench" / "moe_cuda.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    (tiny, tiny_spec, tiny_load), (big, big_spec, _) = bench.models(tmp_path)
    cfg = json.loads(Path(big_spec).read_text())
    experts = cfg.get("num_experts", cfg.get("num_local_experts"))  # transformers 5 writes num_local_experts
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], experts, cfg["moe_intermediate_size"]) \
        == (bench.LAYERS, 2048, 128, 768)
    cons = tmp_path / "c.yaml"
    cons.write_text(bench.CONSTRAINTS.format(**tiny_load))
    steps = bench.commands(tiny_spec, cons, tmp_path / "out")
    compile_cmd = steps["fused"][0][3:] + ["--cache-dir", str(cache_dir)]
    assert steps["fused"][1][3:6] == ["signoff", str(tmp_path / "out" / "fused"), "--provider"]
    result = CliRunner().invoke(main, compile_cmd)
    assert result.exit_code in (0, 1), result.output + repr(result.exception)
    cells = bench.moe_cells(tmp_path / "out" / "fused")
    assert cells == {"MoE": 2, "QMoE": 0, "GatherND": 0, "TopK": 0}
    log = (tmp_path / "out" / "fused" / "compile.log").read_text()
    assert "precision rule moe_router: 2 router MatMul(s) at fp16" in log


def test_plan_bench_counts_the_devices_weights_and_kv_need():
    import importlib.util

    spec = importlib.util.spec_from_file_location("plan_235b", ROOT / "bench" / "plan_235b.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    n, per = bench.devices_needed(470.2e9, 12.6e9, 2.8e9, 141e9)
    assert n == 4 and per == pytest.approx((470.2e9 + 12.6e9) / 4 + 2.8e9) and per <= 141e9
    assert bench.devices_needed(1e9, 0, 2e9, 1e9) == (None, 2e9)  # the workspace alone does not fit


def test_gated_deltanet_layers_are_named_misses_not_silence():
    """A depthwise causal conv + CumSum scope (a Gated DeltaNet layer's chunked form) is a linear_attention
    candidate: a miss naming the layer and its cells (only the recurrent form, a Scan, is matched), and the graph is
    left as it was."""
    from onnx import TensorProto as T
    from onnx import helper as oh

    C, K = 8, 4
    nodes = [oh.make_node("Conv", ["x", "w"], ["c"], group=C, pads=[K - 1, 0], name="conv"),
             oh.make_node("CumSum", ["c", "axis"], ["y"], name="cumsum")]
    for n in nodes:
        n.metadata_props.add(key=HIERARCHY_KEY, value="model.layers.0.linear_attn")
    w = oh.make_tensor("w", T.FLOAT, [C, 1, K], np.ones(C * K, np.float32).tolist())
    axis = oh.make_tensor("axis", T.INT64, [], [2])
    graph = oh.make_graph(nodes, "gdn", [oh.make_tensor_value_info("x", T.FLOAT, [1, C, 16])],
                          [oh.make_tensor_value_info("y", T.FLOAT, None)], [w, axis])
    nl = Netlist(ir.serde.deserialize_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])),
                 "gdn", kind="causal")
    (cov,) = fuse(nl, "cuda", kinds=["linear_attention"])
    assert (cov.candidates, cov.fused) == (1, 0)
    (miss,) = cov.misses
    assert "model.layers.0.linear_attn" in miss.site and "the chunked delta rule" in miss.reason
    assert "its 2 exported cells stay" in miss.reason
    assert [n.op_type for n in nl.nodes()] == ["Conv", "CumSum"]


def test_a_cuda_moe_kernel_that_departs_is_a_named_miss_where_a_gpu_can_probe_it(cache_dir, monkeypatch):
    # a kernel fault (no routing ambiguity can explain it: the probe's logits have none): where a GPU is present, the
    # candidate also runs on it, and a departure keeps the experts unfused with the reason (the GPU is simulated:
    # the probe's "cuda" evaluation returns the CPU result off by 40 %)
    ran = []

    def evaluate(graph, outputs, feeds, opsets, provider="cpu"):
        got = on_ort(graph, outputs, feeds, opsets)
        ran.append(provider)
        return [g * 1.4 for g in got] if provider == "cuda" else got

    monkeypatch.setattr(moe_rule, "provider_opens", lambda provider: True)
    monkeypatch.setattr(moe_rule, "evaluate", evaluate)
    nl = read_design("zoo:qwen3-moe-tiny", cache_dir=cache_dir, progress=False)
    cov = {c.kind: c for c in fuse(nl, "cuda")}["moe"]
    assert "cuda" in ran and cov.fused == 0 and cov.candidates == 2
    assert all("CUDA MoE kernel differs" in m.reason and "kept unfused on cuda" in m.reason for m in cov.misses)
    assert "no fused site probed on a CUDA kernel (none probed)" in cov.note


def test_the_cuda_probe_feeds_router_logits_with_no_near_tie(cache_dir, monkeypatch):
    # top-k is discontinuous: logits within fp16 rounding pick experts by each kernel's tie-break (the 30B-A3B sites were
    # kept unfused on the H200 on 2026-12-03 by a few such tokens), so the reference and the candidate, on either
    # provider, read logits whose top-k boundary is 1/32 wide on every token
    experts = zoo.make_config(zoo.ZOO["qwen3-moe-tiny"]).num_experts
    fed = []

    def evaluate(graph, outputs, feeds, opsets, provider="cpu"):
        fed.extend((provider, a) for v, a in feeds.items() if v.producer() is not None and a.shape[-1] == experts)
        return on_ort(graph, outputs, feeds, opsets)

    monkeypatch.setattr(moe_rule, "provider_opens", lambda provider: True)
    monkeypatch.setattr(moe_rule, "evaluate", evaluate)
    nl = read_design("zoo:qwen3-moe-tiny", cache_dir=cache_dir, progress=False)
    assert {c.kind: c for c in fuse(nl, "cuda")}["moe"].fused == 2
    assert {p for p, _ in fed} == {"cpu", "cuda"}
    assert {len(a) for p, a in fed if p == "cuda"} == {moe_rule.CUDA_PROBE_TOKENS}
    for _, logits in fed:
        gaps = np.diff(np.sort(logits.astype(np.float64), axis=-1), axis=-1)
        assert gaps.min() == gaps.max() == 1 / 32


def test_separated_logits_rank_every_expert_apart_in_fp16_and_fp32():
    rng = np.random.default_rng(1)
    for dtype in (np.float16, np.float32):
        logits = moe_rule.separated_logits((3, 5, 512), dtype, rng)
        assert logits.shape == (3, 5, 512) and logits.dtype == dtype
        ranked = np.sort(logits.reshape(-1, 512).astype(np.float64), axis=-1)
        assert np.all(np.diff(ranked, axis=-1) == 1 / 32) and ranked.max() < 8 and ranked.min() == -8
        assert len({tuple(np.argsort(row)) for row in logits.reshape(-1, 512)}) == 15  # each token its own order


def test_a_site_the_cuda_moe_kernel_cannot_run_is_a_named_miss(cache_dir, monkeypatch):
    # the GPU's session refusing the candidate (an alignment, a missing kernel) keeps the experts unfused, with why
    def evaluate(graph, outputs, feeds, opsets, provider="cpu"):
        if provider == "cuda":
            raise RuntimeError("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : no kernel for this shape")
        return on_ort(graph, outputs, feeds, opsets)

    monkeypatch.setattr(moe_rule, "provider_opens", lambda provider: True)
    monkeypatch.setattr(moe_rule, "evaluate", evaluate)
    nl = read_design("zoo:qwen3-moe-tiny", cache_dir=cache_dir, progress=False)
    cov = {c.kind: c for c in fuse(nl, "cuda")}["moe"]
    assert cov.fused == 0 and cov.candidates == 2
    assert all("CUDA MoE kernel cannot run this site" in m.reason and "NOT_IMPLEMENTED" in m.reason for m in cov.misses)


def test_sites_the_cuda_kernel_agrees_on_fuse_and_the_note_counts_them(cache_dir, monkeypatch):
    # the simulated GPU agrees (within fp16/TF32 rounding): the sites fuse and the note says how many ran on it
    providers = []

    def evaluate(graph, outputs, feeds, opsets, provider="cpu"):
        providers.append(provider)
        return on_ort(graph, outputs, feeds, opsets)

    monkeypatch.setattr(moe_rule, "provider_opens", lambda provider: True)
    monkeypatch.setattr(moe_rule, "evaluate", evaluate)
    nl = read_design("zoo:qwen3-moe-tiny", cache_dir=cache_dir, progress=False)
    cov = {c.kind: c for c in fuse(nl, "cuda")}["moe"]
    assert cov.fused == cov.candidates == 2 and providers.count("cuda") == 2
    assert f"2 fused site(s) probed on this machine's CUDA kernel too ({moe_rule.CUDA_PROBE_TOKENS} tokens)" in cov.note
