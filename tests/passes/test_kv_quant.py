"""kv_cache.dtype int8 (kv_layout): GroupQueryAttention's quantised cache on a GPU target. The structure it emits
(attributes, int8 ports, per-channel scale inputs, a checker-valid model, the STA's int8 cell and 1 B elements), ORT
CPU's int8 cache against a numpy quantise-dequantise reference (so every CPU check measures the quantised cache's
error), the calibration's rotary-pair rule, and verify of the artifact on the CPU."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as T
from onnx import helper

from softsyn.design import Design
from softsyn.flow.compile import compile_design
from softsyn.flow.verify import reference_record, verify
from softsyn.runtime.kv_quant import INT8_MAX, channel_scales, dequantise, quantise
from softsyn.runtime.session import open_session, SessionSettings
from softsyn.timing.cost import node_work, precision_of

CUDA_INT8 = """target: h200-ort-cuda
area_constraint: 1GiB
workload: {batch: 1, prompt_len: 64, context_len: 256}
path_groups:
  prefill: {kind: prefill, clock_period: 150ms, dims: {batch: 1, seq: 64, past: 0}}
  decode: {kind: decode, clock_period: 8ms, dims: {batch: 1, seq: 1, past: 256}}
accuracy: {max_rel_error: 2%}
precision: {allowed: [fp16], default: fp16}
kv_cache: {dtype: int8, max_length: 512}
"""


@pytest.fixture(scope="module")
def int8_artifact(cache_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("kv-int8") / "c.yaml"
    path.write_text(CUDA_INT8)
    design = Design.load("zoo:qwen3-tiny", path, cache_dir=cache_dir, progress=False, materialize=True)
    out = path.parent / "out"
    compile_design(design, "low", out, reference_record("zoo:qwen3-tiny", design.netlist))
    return out


def test_int8_cache_structure(int8_artifact):
    from softsyn.emit import check

    check(int8_artifact / "model.onnx")  # onnx.checker (ORT's default-domain ops checked as runtime ops)
    model = ir.serde.deserialize_model(onnx.load(str(int8_artifact / "model.onnx")))
    nodes = [n for n in model.graph if n.op_type == "GroupQueryAttention"]
    assert len(nodes) == 2
    for node in nodes:
        assert node.attributes["k_quant_type"].value == node.attributes["v_quant_type"].value == "PER_CHANNEL"
        assert node.attributes["kv_cache_bit_width"].value == 8
        for port in (node.inputs[3], node.inputs[4], node.outputs[1], node.outputs[2]):
            assert port.dtype == ir.DataType.INT8 and port.shape[2] == 512
        for scale in (node.inputs[12], node.inputs[13]):
            assert scale.dtype == ir.DataType.FLOAT and list(scale.shape) == [2, 32]  # [kv_heads, head_dim]
            assert (scale.const_value.numpy() > 0).all()
        assert node.inputs[14] is not None  # the cuda target's absorbed q/k norms stay after the scales
        assert precision_of(node) == "int8"
        # the STA counts 1 B per cached element: the same node with an fp16 cache moves 4 x numel(past) more
        shapes = {p.name: [1, 2, 512, 32] for p in (node.inputs[3], node.inputs[4], node.outputs[1], node.outputs[2])}
        int8 = node_work(node, shapes).bytes
        for port in (node.inputs[3], node.inputs[4], node.outputs[1], node.outputs[2]):
            port.type = ir.TensorType(ir.DataType.FLOAT16)
        assert node_work(node, shapes).bytes - int8 == 4 * 2 * 512 * 32
    log = (int8_artifact / "compile.log").read_text()
    assert "kv_cache.dtype int8: realised as int8 (GroupQueryAttention's quantised cache, per-channel scales" in log
    assert "timed by the library's GroupQueryAttention.int8 cell" in log  # measured on the H200 (2026-12-01)


def test_int8_artifact_verifies_on_the_cpu(int8_artifact):
    result = verify(int8_artifact, cpu=True)
    assert all(not c.violations for c in result.checks if c.output == "logits")
    decode = next(c for c in result.checks if c.scenario == "decode" and c.output == "logits")
    assert 0 < decode.rel < 2e-2  # the quantised cache's error is measured, not hidden


def _gqa(cache: int, scales: bool, b=1, s=5, n=4, kv=2, h=16, length=8):
    ins = [helper.make_tensor_value_info(x, T.FLOAT16, [b, s, (n if x == "q" else kv) * h]) for x in "qkv"]
    ins += [helper.make_tensor_value_info(x, cache, [b, kv, length, h]) for x in ("pk", "pv")]
    ins += [helper.make_tensor_value_info("sl", T.INT32, [b]), helper.make_tensor_value_info("tl", T.INT32, [])]
    names, attrs, inits = ["q", "k", "v", "pk", "pv", "sl", "tl"], {}, []
    if scales:
        ins += [helper.make_tensor_value_info(x, T.FLOAT, [kv, h]) for x in ("ks", "vs")]
        names += [""] * 5 + ["ks", "vs"]
        attrs = dict(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=8)
    node = helper.make_node("GroupQueryAttention", names, ["o", "prk", "prv"], domain="com.microsoft", num_heads=n,
                            kv_num_heads=kv, **attrs)
    outs = [helper.make_tensor_value_info("o", T.FLOAT16, [b, s, n * h])]
    outs += [helper.make_tensor_value_info(x, cache, [b, kv, length, h]) for x in ("prk", "prv")]
    return helper.make_model(helper.make_graph([node], "gqa", ins, outs, initializer=inits), ir_version=10,
                             opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


def test_ort_cpu_int8_cache_is_the_numpy_quantise_dequantise():
    """ORT CPU's int8 cache (what the CPU view and every CPU check run) stores numpy's quantise and attends its
    dequantise: an fp16 GQA fed the dequantised K/V gives the same output; a 3-token past, 2 new tokens."""
    rng = np.random.default_rng(0)
    b, s, kvh, h, length, past = 1, 2, 2, 16, 8, 3
    ks = (rng.uniform(0.5, 3.0, (kvh, h)) / INT8_MAX).astype(np.float32)  # per-channel ranges that differ
    vs = (rng.uniform(0.5, 3.0, (kvh, h)) / INT8_MAX).astype(np.float32)
    q = rng.standard_normal((b, s, 4 * h)).astype(np.float16)
    k, v = (rng.standard_normal((b, s, kvh * h)).astype(np.float16) for _ in range(2))
    pk, pv = (rng.standard_normal((b, kvh, length, h)).astype(np.float32) for _ in range(2))
    pk[:, :, past:] = pv[:, :, past:] = 0
    lens = dict(sl=np.array([past + s - 1], np.int32), tl=np.array(past + s, np.int32))
    int8 = open_session(_gqa(T.INT8, True, s=s), SessionSettings(provider="cpu"))
    out, prk, prv = int8.run(None, dict(q=q, k=k, v=v, pk=quantise(pk, ks), pv=quantise(pv, vs), ks=ks, vs=vs, **lens))

    def heads(x):  # [b, s, kv*h] -> [b, kv, s, h]
        return x.reshape(b, s, kvh, h).transpose(0, 2, 1, 3)

    for got, new, cached, scale in ((prk, k, pk, ks), (prv, v, pv, vs)):
        assert (got[:, :, :past] == quantise(cached, scale)[:, :, :past]).all()
        assert (got[:, :, past:past + s] == quantise(heads(new), scale)).all()
    fp16 = open_session(_gqa(T.FLOAT16, False, s=s), SessionSettings(provider="cpu"))
    held = {x: dequantise(quantise(c, sc), sc).astype(np.float16) for x, c, sc in (("pk", pk, ks), ("pv", pv, vs))}
    flat = {x: dequantise(quantise(heads(n), sc), sc).transpose(0, 2, 1, 3).reshape(b, s, -1).astype(np.float16)
            for x, n, sc in (("k", k, ks), ("v", v, vs))}
    want = fp16.run(None, dict(q=q, **flat, **held, **lens))[0]
    plain = fp16.run(None, dict(q=q, k=k, v=v, pk=pk.astype(np.float16), pv=pv.astype(np.float16), **lens))[0]
    err = np.abs(out.astype(np.float32) - want).max()
    assert err < 2e-3 < np.abs(out.astype(np.float32) - plain).max()  # fp16 rounding apart, and not the fp16 cache


def test_rotary_pairs_share_their_largest_norm():
    """A K vector rotated to any angle stays inside the calibrated range: pair (c, c + rot/2) gets the pair's norm."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 1, 6, 8)).astype(np.float32)
    scale = channel_scales([x], rotary_dim=8)
    norm = np.sqrt(x[..., :4] ** 2 + x[..., 4:] ** 2).max(axis=2)[0, 0]
    assert np.allclose(scale[0, :4] * INT8_MAX / 1.25, norm) and np.allclose(scale[0, :4], scale[0, 4:])
    theta = 1.3  # a position the calibration never saw
    turned = np.concatenate([x[..., :4] * np.cos(theta) - x[..., 4:] * np.sin(theta),
                             x[..., 4:] * np.cos(theta) + x[..., :4] * np.sin(theta)], axis=-1)
    assert (np.abs(quantise(turned, scale)) < INT8_MAX).all()
    plain = channel_scales([x])
    assert np.allclose(plain[0] * INT8_MAX / 1.25, np.abs(x).max(axis=2)[0, 0])


def test_genai_generates_with_the_int8_cache(int8_artifact, tmp_path):
    """onnxruntime-genai (its KV cache typed from the model's past inputs) loads the artifact's genai_config.json and
    generates with the int8 cache, on the CPU through the CPU view, the tokens softsyn's own loop generates (the
    same seeded prompt: softsyn run's, prompt_ids seed 0)."""
    import json
    import shutil

    from genai_tokens import genai_tokens
    from softsyn.flow.run import RunSettings, run
    from softsyn.runtime.generate import prompt_ids
    from softsyn.runtime.gqa_view import expand_qk_norms

    proto = onnx.load(str(int8_artifact / "model.onnx"), load_external_data=False)
    expand_qk_norms(proto)
    onnx.save(proto, str(tmp_path / "model.onnx"))
    shutil.copy(int8_artifact / "model.onnx.data", tmp_path)
    config = json.loads((int8_artifact / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["provider_options"] = []  # the CPU
    (tmp_path / "genai_config.json").write_text(json.dumps(config))
    ours = run(int8_artifact, RunSettings(prompt_len=16, gen=6, provider="cpu", runs=1, warmup=0), show_progress=False)
    assert genai_tokens(tmp_path, prompt_ids(1024, 16, 0), 6) == list(ours.generations[0].tokens)


def test_a_weightless_plan_gets_the_int8_cache_with_placeholder_scales(cache_dir, tmp_path, monkeypatch):
    """A plan (no weights, no model written) is timed and sized with the int8 cache; its note says the scales are
    placeholders, and the STA labels the uncharacterised GroupQueryAttention.int8 cell an estimate. (qwen3-tiny
    stands for the plan, its weights declared absent: a real weightless export takes a config-only model.)"""
    import passes
    from passes import LOW, run_pass

    passes.load_all()  # fuse before kv_layout: the two import each other
    from passes import kv_layout

    monkeypatch.setattr(kv_layout, "weightless", lambda design: True)
    path = tmp_path / "c.yaml"
    path.write_text(CUDA_INT8)
    design = Design.load("zoo:qwen3-tiny", path, cache_dir=cache_dir, progress=False, materialize=True)
    for step in LOW.steps:
        run_pass(design, step.pass_name, dict(step.options))
    report = design.pass_reports["kv_layout"]
    assert report.kv_dtype == "int8" and "placeholder scales (a weightless plan" in report.kv_note
    decode = next(g for g in design.time() if g.name == "decode")
    gqa = [p for p in decode.critical.points if p.op_type == "GroupQueryAttention"]
    assert gqa and all(p.cell.startswith("GroupQueryAttention.int8") and p.source != "est" for p in gqa)
    node = next(n for n in design.netlist.model.graph if n.op_type == "GroupQueryAttention")
    assert np.allclose(node.inputs[12].const_value.numpy(), 1 / INT8_MAX)


def test_where_the_int8_cache_cannot_be_realised_the_note_says_why():
    from types import SimpleNamespace

    import passes

    passes.load_all()  # fuse before kv_layout: the two import each other
    from passes.kv_layout import kv_dtype_note, quantised_cache_problem

    cpu = SimpleNamespace(library=SimpleNamespace(is_gpu=False, name="cpu-ort"))
    why = quantised_cache_problem(cpu, "int8")
    assert kv_dtype_note("int8", "fp32", why) == ("kv_cache.dtype int8: not applied (the target cpu-ort is a CPU "
                                                  "target; its GroupQueryAttention keeps an fp32 cache); the KV "
                                                  "cache stays fp32")
    assert "USE_FP8_KV_CACHE" in kv_dtype_note("fp8", "fp16", quantised_cache_problem(cpu, "fp8"))


def test_the_int8_cell_recipe_updates_its_int8_buffer_in_place():
    """The GroupQueryAttention.int8 cell's graph (what `softsyn characterize --cells GroupQueryAttention.int8` times)
    binds present to past like the fp16 cell, and its kernel stores the new key quantised in the one int8 buffer."""
    from softsyn.characterize.catalogue import cell_kinds
    from softsyn.characterize.cellgraph import Ctx
    from softsyn.characterize.runner import Runner

    kind = next(k for k in cell_kinds() if k.key == "GroupQueryAttention.int8")
    assert kind.providers == ("cuda",) and kind.axes == ["q_tokens", "kv_len", "heads"]
    g = kind.build({"q_tokens": 1, "kv_len": 64, "heads": 4}, 2, Ctx("cpu", 256, 32, "fp16", "int8"))
    runner = Runner(g, "cpu", {})
    runner()
    bound = dict(zip([*g.inputs, *(n for n, _ in g.outputs)], runner.keep))
    assert bound["pk0"] is bound["past_key"] and bound["past_key"].numpy().dtype == np.int8
    key = g.inputs["key"][1].reshape(1, 2, 1, 32)  # [batch, kv_heads, 1, head_dim]
    scale = onnx.numpy_helper.to_array(next(t for t in g.inits if t.name == "k_scale"))
    assert (bound["past_key"].numpy()[:, :, -1:, :] == quantise(key, scale)).all()
