"""A weightless dense decoder traced two layers deep and its template layer copied to the config's depth
(softsyn.frontends.replicate, as real-size exports are read): the same function as every layer traced; a model whose
built layers differ (one without RoPE) is traced whole, and its provenance says why."""
from __future__ import annotations

import collections
import sys
from pathlib import Path

import numpy as np
import pytest

from softsyn.frontends import hf, replicate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
# bench/replicate_families: the widths, and ORT's outputs with the seeded weights filled in (the same for every type)
from replicate_families import LAYERS, SMALL, outputs as _outputs  # noqa: E402


def _config(model_type: str, **extra):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **SMALL, **extra)


def _weightless(cfg, folder):
    return hf.load_transformers_design(cfg, f"{cfg.model_type}-{LAYERS}", "test", folder, progress=False,
                                       weights="meta", dtype="float32")


def test_a_dense_decoder_copied_from_two_traced_layers_computes_what_tracing_every_layer_does(tmp_path, monkeypatch):
    cfg = _config("qwen3")
    copied = _weightless(cfg, tmp_path / "copied")
    assert copied.provenance["layers"].startswith(f"2 traced by torch.export, model.layers.1 copied 2 times to {LAYERS}")
    monkeypatch.setattr(replicate, "homogeneous", lambda cfg: False)  # the plan without copies: every layer traced
    traced = _weightless(cfg, tmp_path / "traced")
    assert "layers" not in traced.provenance
    ops = [collections.Counter(n.op_type for n in nl.nodes()) for nl in (copied, traced)]
    assert ops[0] == ops[1]
    shapes = [{k: tuple(v.shape) for k, v in nl.model.graph.initializers.items() if k.startswith("model.")}
              for nl in (copied, traced)]
    assert shapes[0] == shapes[1] and f"model.layers.{LAYERS - 1}.mlp.down_proj.weight" in shapes[0]
    assert copied.config["parameters"] == traced.config["parameters"]
    got, want = _outputs(copied, cfg, tmp_path / "copied.onnx"), _outputs(traced, cfg, tmp_path / "traced.onnx")
    assert got.keys() == want.keys() and f"present.{LAYERS - 1}.value" in got
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_decoder_whose_built_layers_differ_is_traced_whole_and_says_why(tmp_path):
    """SmolLM3 leaves RoPE out of every fourth layer (no_rope_layers): its config names one layer type, its layers
    are not one module, so copying layer 1 would give layer 3 a RoPE it does not have."""
    pytest.importorskip("transformers.models.smollm3")
    cfg = _config("smollm3")
    assert replicate.homogeneous(cfg)  # what the config alone says
    nl = _weightless(cfg, tmp_path)
    assert nl.provenance["layers"] == (f"all {LAYERS} traced by torch.export, none copied: model.layers.3.self_attn "
                                       "differs from model.layers.1.self_attn (use_rope 0, not 1)")
    layers = collections.Counter(replicate.layer_of(n) for n in nl.nodes())
    assert all(layers[i] > 0 for i in range(LAYERS)) and layers[3] < layers[2]  # layer 3 traced: no rotary in it


def test_an_moe_decoder_whose_first_layers_are_dense_is_not_copied_from_a_dense_layer():
    """DeepSeek-V3 keeps dense MLPs in its first `first_k_dense_replace` layers and experts after: its config names
    one layer type, so only the built layers tell that copying layer 1 (dense) would give layer 3 the wrong MLP."""
    pytest.importorskip("transformers.models.deepseek_v3")
    from softsyn.frontends.hf_torch import layer_difference

    cfg = _config("deepseek_v3", first_k_dense_replace=3, n_routed_experts=4, num_experts_per_tok=2)
    plan = hf._plan_export(cfg, "ds", "test", folder=None, weights="meta", dtype=None, materialize=False)
    assert replicate.homogeneous(cfg) and plan.replicate
    assert layer_difference(plan) == ("model.layers.3.mlp differs from model.layers.1.mlp "
                                      "(DeepseekV3MoE, not DeepseekV3MLP)")
    plan = hf._plan_export(_config("qwen3"), "q", "test", folder=None, weights="meta", dtype=None, materialize=False)
    assert layer_difference(plan) is None
