"""The cpu-torch lowering: DIR/model.pt2 and runtime/torch.json written instead of the ONNX Runtime files, the package
measured per path group and labelled beside the library's estimate."""
import json
import re

import pytest

from helpers import cli
from softsyn.runtime.torch_package import read_torch_settings


def test_package_and_settings_written(tiny_torch_artifact):
    out = tiny_torch_artifact
    assert (out / "model.pt2").stat().st_size > 0
    assert not (out / "model.onnx").exists() and not (out / "runtime" / "session.json").exists()
    settings = read_torch_settings(out)
    assert settings["kv_cache"] == {**settings["kv_cache"], "layers": 2, "kv_heads": 2, "head_dim": 32,
                                    "max_length": 512}
    assert settings["vocab_size"] == 1024 and settings["dtype"] == "float32"
    assert settings["reference"]["source"] == "zoo:qwen3-tiny"
    assert set(settings["scenarios"]) == {"prefill", "decode"}
    manifest = json.loads((out / "softsyn-manifest.json").read_text())
    assert "model.pt2" in json.dumps(manifest) and "runtime/torch.json" in json.dumps(manifest)


def test_measured_numbers_are_labelled(tiny_torch_artifact):
    log = (tiny_torch_artifact / "compile.log").read_text()
    measured = re.findall(r"^note: target cpu-torch: (prefill|decode) \(.*\): [\d.]+ ms \(torch package, measured, "
                          r"median of 10\); [\d.]+ ms \(est, cpu-ort library", log, re.M)
    assert sorted(measured) == ["decode", "prefill"]
    assert "per-module torchao precision (int8/int4/fp8) is not built yet" in log
    rpt = (tiny_torch_artifact / "reports" / "torch.rpt").read_text()
    assert rpt.count("torch package, measured") == 3 and rpt.count("(est, cpu-ort library") == 2


def test_a_weightless_plan_is_refused(cache_dir, tmp_path, capsys):
    code, out, err = cli(capsys, "compile", "zoo:qwen3-tiny", "--target", "cpu-torch", "--plan", "-o", tmp_path / "o",
                         "--cache-dir", cache_dir, "-q")
    assert code == 2 and err.count("\n") == 1
    assert "target cpu-torch lowers a model with weights" in err and not (tmp_path / "o").exists()


def _tiny_model():
    from softsyn.emit.torch_lowering import ATTENTIONS  # registers softsyn's attentions with transformers
    from softsyn.frontends import source_torch_model

    model = source_torch_model("zoo:qwen3-tiny")
    return model, ATTENTIONS


@pytest.mark.parametrize("form", ["sdpa", "matmul"])
def test_grouped_attention_equals_transformers_sdpa_with_repeated_kv(form):
    """K and V are never repeated per query head, yet either form gives transformers' masked SDPA (which repeats
    them), for one query (decode) and several (prefill), GQA 2:1."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from softsyn.emit.torch_lowering import ATTENTIONS

    grouped_attention = ATTENTIONS[form][1]

    g = torch.Generator().manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal, module.training = 2, True, False
    for seq in (1, 5):
        q = torch.randn(2, 4, seq, 16, generator=g)
        k, v = torch.randn(2, 2, 12, 16, generator=g), torch.randn(2, 2, 12, 16, generator=g)
        positions = torch.arange(6, 6 + seq)[None].expand(2, seq)
        mask = (torch.arange(12)[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, seq, 12]
        got, _ = grouped_attention(module, q, k, v, mask, scaling=0.25)
        want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
        assert got.shape == want.shape == (2, seq, 4, 16)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["sdpa", "matmul"])
def test_static_step_writes_the_cache_in_place_and_generates_what_transformers_does(form):
    """The step module torch.export lowers, run eagerly: a prefill then decode steps over one static cache (written in
    place, stale slots masked) give the logits of transformers' own forward over the whole sequence."""
    import torch

    from softsyn.emit.torch_lowering import StaticStep
    from softsyn.frontends.export import kv_geometry

    model, attentions = _tiny_model()
    layers, kv, head_dim = kv_geometry(model.config)
    cache = [torch.full((1, kv, 16, head_dim), 7.0) for _ in range(2 * layers)]  # stale values: must stay masked
    ids = torch.tensor([[3, 14, 15, 92]])
    with torch.no_grad():
        want = model(input_ids=torch.cat([ids, torch.tensor([[65, 35]])], 1)).logits
        model.set_attn_implementation(attentions[form][0])
        step = StaticStep(model, 16).eval()
        prefill = step(ids, torch.arange(4)[None], *cache)
        first = step(torch.tensor([[65]]), torch.tensor([[4]]), *cache)
        second = step(torch.tensor([[35]]), torch.tensor([[5]]), *cache)
    torch.testing.assert_close(prefill, want[:, :4], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.cat([first, second], 1), want[:, 4:], rtol=1e-4, atol=1e-4)
    assert all(float(c[:, :, 6:].sub(7).abs().max()) == 0 for c in cache)  # slots past the sequence untouched
    assert all(float(c[:, :, :6].sub(7).abs().min()) > 0 for c in cache)


def test_packed_projections_compute_what_the_separate_ones_did():
    """QKV and gate/up become one matmul per layer (PackedLinear, the Linear modules replaced by parts of it) and the
    model's logits stay those of the separate projections."""
    import torch

    from softsyn.emit.torch_lowering import PackedLinear, PackedPart, pack_projections

    model, _ = _tiny_model()
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        assert pack_projections(model) == 2 * model.config.num_hidden_layers
        got = model(input_ids=ids).logits
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.k_proj, PackedPart) and isinstance(layer.mlp.up_proj, PackedPart)
    assert isinstance(layer.self_attn.q_proj.packed, PackedLinear) and layer.self_attn.q_proj.packed._parts is None
    assert layer.mlp.gate_proj.packed.weight.shape == (2 * model.config.intermediate_size, model.config.hidden_size)
    assert type(layer.mlp.down_proj) is torch.nn.Linear  # its input is not another projection's
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fp16_step_keeps_rotary_fp32_and_far_positions_right():
    """h200-torch's cast (parameters to fp16, buffers as built): at position 4000 the fp16 step's keys stay within
    fp16 rounding of the fp32 step's (an fp16 inv_freq put them 7.5 % off)."""
    import torch

    from softsyn.emit.torch_lowering import StaticStep, cast_parameters
    from softsyn.frontends.export import kv_geometry

    model, attentions = _tiny_model()
    layers, kv, head_dim = kv_geometry(model.config)
    ids, positions = torch.tensor([[5, 6]]), torch.tensor([[4000, 4001]])
    keys = {}
    for dtype in (torch.float32, torch.float16):
        if dtype == torch.float16:
            cast_parameters(model, dtype)
            assert model.model.rotary_emb.inv_freq.dtype == torch.float32
        model.set_attn_implementation(attentions["matmul"][0])
        cache = [torch.zeros(1, kv, 4096, head_dim, dtype=dtype) for _ in range(2 * layers)]
        with torch.no_grad():
            StaticStep(model, 4096).eval()(ids, positions, *cache)
        keys[dtype] = cache[0][:, :, 4000:4002].float()
    rel = float((keys[torch.float16] - keys[torch.float32]).abs().max() / keys[torch.float32].abs().max())
    assert rel < 5e-3, rel
