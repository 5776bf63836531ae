"""The attention prologue in one kernel (softsyn.emit.torch_prologue): qwen3-tiny's attentions replaced only where
they compute what the fused form does, the step's logits and cache unchanged, the op in the exported graph in place
of the cache writes; attentions that compute something else, or that the kernels cannot take, kept with why; the
target setting off and used with softsyn's decode attention only."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from softsyn.emit.torch_prologue import Fusion, FusedAttention, fuse_prologues, prologues_for
from softsyn.emit.torch_attention_forms import ATTENTIONS
from softsyn.emit.torch_step import StaticStep, cast_parameters, pack_projections
from softsyn.frontends.export import kv_geometry
from softsyn.library.torch_targets import TORCH_TARGETS
from softsyn.frontends import source_torch_model

CALCULATED = "it computes something else (another rotary or norm)"


def packed_model(dtype=torch.float32):
    model = source_torch_model("zoo:qwen3-tiny")
    cast_parameters(model, dtype)
    pack_projections(model)
    return model


def steps(model, form: str):
    """(logits of a 4-token prefill and a decode step, 2 batch rows, over a 16-slot cache of random stale values;
    the cache after them) in attention form `form`."""
    layers, kv, head_dim = kv_geometry(model.config)
    g = torch.Generator().manual_seed(1)
    cache = [torch.randn(2, kv, 16, head_dim, generator=g) for _ in range(2 * layers)]
    model.set_attn_implementation(ATTENTIONS[form][0])
    step = StaticStep(model, 16).eval()
    with torch.no_grad():
        prefill = step(torch.tensor([[3, 14, 15, 92], [5, 6, 7, 8]]), torch.arange(4).expand(2, 4), torch.arange(8),
                       *cache)
        decode = step(torch.tensor([[65], [66]]), torch.tensor([[4], [4]]), torch.arange(8), *cache)
    return torch.cat([prefill, decode], 1), torch.stack(cache)


@pytest.mark.parametrize("writes_cache,folded", [(False, False), (True, False), (True, True)])
def test_fused_attentions_step_to_the_original_s_logits_and_cache_and_export_the_op_per_layer(writes_cache, folded):
    """Every qwen3-tiny attention is fused (same module paths and parameters); the step's logits and the cache it
    writes are the original's in softsyn's decode form, and in another form (the prefill package's SDPA) the fused
    module runs the original's forward; the exported step holds one prologue op a layer and its cache writes as
    index_copy_ (the op mutates nothing), or where the prologue writes the cache, one attention_step a layer that
    mutates the layer's keys and values and no index_copy_ (`folded`: the op asked to fold its combine)."""
    model = packed_model()
    names = [name for name, _ in model.named_parameters()]
    want = steps(model, "softsyn")
    want_sdpa = steps(model, "sdpa")
    assert fuse_prologues(model, writes_cache=writes_cache, folded=folded) == Fusion(2, 0, {})
    assert all(isinstance(layer.self_attn, FusedAttention) for layer in model.model.layers)
    assert [name for name, _ in model.named_parameters()] == names
    got, got_sdpa = steps(model, "softsyn"), steps(model, "sdpa")
    for (logits, cache), (ref_logits, ref_cache) in ((got, want), (got_sdpa, want_sdpa)):
        torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cache, ref_cache, rtol=1e-5, atol=1e-5)

    from softsyn.emit.torch_lowering import export_step

    model.set_attn_implementation(ATTENTIONS["softsyn"][0])
    program = export_step(StaticStep(model, 16).eval(), model.config, 16, "cpu", torch.float32)
    targets = [str(node.target) for node in program.graph.nodes]
    mutated = program.run_decompositions().graph_signature.user_inputs_to_mutate.values()
    assert len(mutated) == 4  # each layer's keys and values, written in place
    if writes_cache:
        assert sum("attention_step" in t for t in targets) == 2 and not any("index_copy" in t for t in targets)
        assert not any("attention_prologue" in t or "decode_attention" in t for t in targets)
        steps_called = [node for node in program.graph.nodes if "attention_step" in str(node.target)]
        named = [node.normalized_arguments(program.graph_module, normalize_to_only_use_kwargs=True).kwargs
                 for node in steps_called]
        assert [arguments["fold"] for arguments in named] == [folded] * 2
        return
    assert sum("attention_prologue" in t for t in targets) == sum("decode_attention" in t for t in targets) == 2
    # the cache written by two index_copy_ a layer (which Inductor writes in place), none inside the op
    assert sum("index_copy" in t for t in targets) == 4


def test_an_attention_that_computes_something_else_is_kept(monkeypatch):
    """Interleaved rotary (pairs of neighbours, not halves: GPT-J's form) is not what the kernel computes: both
    attentions kept, the count saying why, the modules untouched."""
    import transformers.models.qwen3.modeling_qwen3 as qwen3

    def every_two(x):
        return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)

    model = packed_model()
    monkeypatch.setattr(qwen3, "rotate_half", every_two)
    assert fuse_prologues(model) == Fusion(0, 2, {CALCULATED: 2})
    assert not any(isinstance(layer.self_attn, FusedAttention) for layer in model.model.layers)


def test_a_layer_the_kernels_cannot_take_is_kept_with_why():
    """A sliding-window layer (the step masks it per layer type) is kept, the other fused; at h200-torch's fp16 the
    check passes within fp16's rounding."""
    model = packed_model(torch.float16)
    model.model.layers[0].self_attn.sliding_window = 4
    assert fuse_prologues(model) == Fusion(1, 1, {"sliding-window layers (the step's per-type mask)": 1})
    assert [isinstance(layer.self_attn, FusedAttention) for layer in model.model.layers] == [False, True]


@pytest.mark.parametrize("form", ["softsyn", "matmul"])
def test_the_setting_fuses_only_with_softsyn_s_decode_attention_and_measured_only_when_chosen(form):
    """off: nothing; measured: the kernel only where the attention choice chose the prologue, else (where the target
    fuses norms, which need the fused form) the fused form with the prologue's torch form; on: the kernel; any of
    them only with softsyn's decode attention (the kernel writes q in its layout)."""
    target = TORCH_TARGETS["h200-torch"]
    assert target.fused_prologue == "measured" and TORCH_TARGETS["cpu-torch"].fused_prologue == "off"
    assert target.fused_norms == "on"
    model = packed_model()
    assert prologues_for(dataclasses.replace(target, fused_prologue="off"), form, model) == []
    kept = prologues_for(dataclasses.replace(target, fused_norms="off"), form, model, chosen=False)
    assert not any(isinstance(layer.self_attn, FusedAttention) for layer in model.model.layers)
    if form == "softsyn":
        assert kept == ["fused_prologue measured: not faster than each attention's own prologue, so not fused"]
        torch_form = prologues_for(target, form, model, chosen=False)
        assert torch_form[0] == "fused_prologue measured: not faster than each attention's own prologue"
        assert torch_form[1].startswith("2 attentions in the fused form with the prologue's torch form")
        attentions = [layer.self_attn for layer in model.model.layers]
        assert all(isinstance(a, FusedAttention) and not a.kernel_prologue for a in attentions)
        model = packed_model()
        chosen = prologues_for(target, form, packed_model(), chosen=True)
        assert len(chosen) == 1 and chosen[0].endswith("(softsyn::attention_prologue; fused_prologue, measured faster)")
        writing = prologues_for(target, form, packed_model(), chosen=True, writes_cache=True)
        assert len(writing) == 1 and writing[0].startswith("2 attentions: q/k norm, rotary and the cache write")
        assert writing[0].endswith("(softsyn::attention_step; fused_prologue, measured faster)")
        folded = prologues_for(target, form, packed_model(), chosen=True, writes_cache=True, folded=True)
        assert folded[0].endswith("in the same op, its combine folded into the split kernel (softsyn::attention_step; "
                                  "fused_prologue, measured faster)")
    notes = prologues_for(dataclasses.replace(target, fused_prologue="on"), form, model)
    fused = [isinstance(layer.self_attn, FusedAttention) for layer in model.model.layers]
    if form == "softsyn":
        assert len(notes) == 1 and notes[0].startswith("2 attentions: q/k norm, rotary and q's layout") and all(fused)
    else:
        assert notes == ["fused_prologue unused: the decode attention is matmul, not softsyn's"] and not any(fused)
