"""A decoder layer's norms in its GEMVs (softsyn.emit.torch_norms): folding each RMS norm's weight into the packed
projection it feeds computes the same step; qwen3-tiny's layers, on softsyn's kernel with the fused prologue and
gated MLP, fuse and step to the unfused logits and cache, prefill included; a norm that is no x * g RMS norm is
neither folded nor fused, with why; the target setting and the compile log's lines."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from softsyn.emit.torch_attention_choice import Candidate
from softsyn.emit.torch_lowering import decode_modules
from softsyn.emit.torch_norms import Fusion, FusedNorms, fold_norms, fuse_norms, norms_for
from softsyn.emit.torch_prologue import fuse_prologues
from softsyn.emit.torch_step import WeightCell, fuse_gated_mlps
from softsyn.emit.triton_weights import replace_linears
from softsyn.library.torch_targets import TORCH_TARGETS
from test_torch_prologue import packed_model, steps

NOT_FOLDED = "post_attention_layernorm is not a weightless RMS norm (not folded: fold_norms)"


class OnePlusNorm(torch.nn.Module):
    """Gemma's RMS norm, x * (1 + w): folding w into the next projection is not its function."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width, generator=torch.Generator().manual_seed(3)) * 0.1)
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight.float())).to(x.dtype)


def quantised(model, kernel: bool = True, writes_cache: bool = False):
    """`model`'s q/k/v, o, gate/up and down on softsyn's kernel (int4, group 32), the MLPs gated, the prologues
    fused (`kernel`: as the kernel, else in the fused form's torch prologue; `writes_cache`: the kernel writing the
    cache, softsyn::attention_step): what h200-torch's decode step holds before fuse_norms."""
    linears = [m for layer in model.model.layers for m in (layer.self_attn.packed_q_k_v.linear, layer.self_attn.o_proj,
                                                           layer.mlp.packed_gate_up.linear, layer.mlp.down_proj)]
    replace_linears(model, linears, 32, "int4")
    assert fuse_gated_mlps(model) == (2, 0)
    assert fuse_prologues(model, kernel=kernel, writes_cache=writes_cache).fused == 2
    return model


def test_folding_the_norms_into_the_projections_steps_to_the_same_logits_and_cache():
    """Both norms of both layers folded (weights of one after), the lm_head, the embedding and the final norm
    untouched; prefill and decode logits and the cache equal the unfolded model's (fp32)."""
    model = packed_model()
    head, final = model.lm_head.weight.detach().clone(), model.model.norm.weight.detach().clone()
    want = steps(model, "sdpa")
    assert fold_norms(model) == Fusion(4, 0, {})
    assert all(bool((getattr(layer, n).weight == 1).all()) for layer in model.model.layers
               for n in ("input_layernorm", "post_attention_layernorm"))
    assert torch.equal(model.lm_head.weight, head) and torch.equal(model.model.norm.weight, final)
    got = steps(model, "sdpa")
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel,writes_cache", [(True, False), (False, False), (True, True)])
def test_fused_layers_step_to_the_unfused_logits_and_cache_and_export_no_norm_of_their_own(kernel, writes_cache):
    """Every qwen3-tiny layer fused (same parameter names), its attention's prologue the kernel or (where the
    attention choice did not take the kernel) its torch form; in softsyn's decode form and in SDPA's (the prefill
    package's, where the original forward runs) the logits and cache are the unfused model's; the exported decode
    step's GEMVs take the norms and residuals: 2 of each a layer, and the prologue op only with the kernel (the
    attention_step op where the kernel writes the cache)."""
    model = packed_model()
    fold_norms(model)
    quantised(model, kernel, writes_cache)
    names = [name for name, _ in model.named_parameters()]
    want, want_sdpa = steps(model, "softsyn"), steps(model, "sdpa")
    assert fuse_norms(model) == Fusion(2, 0, {})
    assert all(isinstance(layer, FusedNorms) for layer in model.model.layers)
    assert [name for name, _ in model.named_parameters()] == names
    for got, ref in ((steps(model, "softsyn"), want), (steps(model, "sdpa"), want_sdpa)):
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

    from softsyn.emit.torch_lowering import export_step
    from softsyn.emit.torch_attention_forms import ATTENTIONS
    from softsyn.emit.torch_step import StaticStep

    model.set_attn_implementation(ATTENTIONS["softsyn"][0])
    program = export_step(StaticStep(model, 16).eval(), model.config, 16, "cpu", torch.float32)
    gemvs = [n for n in program.graph.nodes if "weight_matmul" in str(n.target)]
    normed = [n for n in gemvs if isinstance(n.kwargs.get("norm_eps", n.args[5] if len(n.args) > 5 else None), float)]
    added = [n for n in gemvs if n.kwargs.get("residual", n.args[6] if len(n.args) > 6 else None) is not None]
    assert len(normed) == len(added) == 4, [n.args for n in gemvs]
    op = "attention_step" if writes_cache else "attention_prologue"
    assert sum(op in str(n.target) for n in program.graph.nodes) == (2 if kernel else 0)


def test_a_norm_that_is_not_an_x_times_g_rms_norm_is_neither_folded_nor_fused_with_why():
    """Layer 0's post-attention norm as Gemma's x * (1 + w): folding it is checked to compute something else, so it
    keeps its weight, and that layer keeps its norm kernels; the other layer fuses, and the step is unchanged."""
    model = packed_model()
    model.model.layers[0].post_attention_layernorm = OnePlusNorm(128)
    folded = fold_norms(model)
    assert folded.done == 3 and folded.kept == 1 and "computes something else" in next(iter(folded.why))
    quantised(model)
    want = steps(model, "softsyn")
    assert fuse_norms(model) == Fusion(1, 1, {NOT_FOLDED: 1})
    assert [isinstance(layer, FusedNorms) for layer in model.model.layers] == [False, True]
    for a, b in zip(steps(model, "softsyn"), want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_a_layer_without_the_fused_attention_is_kept_and_the_setting_is_on_for_h200_torch_only():
    """fuse_norms needs FusedAttention (the o_proj residual rides its forward): without fuse_prologues every layer
    is kept, saying so; h200-torch fuses ("on"), cpu-torch does not; off writes no line."""
    target = TORCH_TARGETS["h200-torch"]
    assert target.fused_norms == "on" and TORCH_TARGETS["cpu-torch"].fused_norms == "off"
    model = packed_model()
    folded = fold_norms(model)
    replace_linears(model, [m for m in model.modules() if type(m) is torch.nn.Linear and m is not model.lm_head],
                    32, "int4")
    fuse_gated_mlps(model)
    assert norms_for(dataclasses.replace(target, fused_norms="off"), model, folded) == []
    lines = norms_for(target, model, folded)
    assert lines == ["4 RMS norm weights folded into the q/k/v and gate/up projections they feed before quantisation "
                     "(fused_norms)", "2 decoder layers kept their norm kernels (2: its attention is not in the fused "
                     "form (FusedAttention))"]
    assert not any(isinstance(layer, FusedNorms) for layer in model.model.layers)


def test_the_lowering_folds_quantises_and_fuses_prologues_then_norms_and_steps_as_without_the_norm_fusion():
    """decode_modules, the lowering's module order, with h200-torch's settings on the CPU (softsyn's attention and
    int4 kernel named, not measured): every layer's norms are folded, then fused into its GEMVs after the prologues,
    with the compile log's lines; the step equals the same folded and quantised model without the norm fusion."""
    target = dataclasses.replace(TORCH_TARGETS["h200-torch"], device="cpu", dtype="float32", attention="softsyn",
                                 fused_prologue="on", weight_kernel="softsyn")
    parts = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj")
    cells = {f"model.layers.{i}.{part}": WeightCell("int4", 32) for i in range(2) for part in parts}
    model, reference = packed_model(), packed_model()
    assert fold_norms(reference) == Fusion(4, 0, {})
    decode_modules(dataclasses.replace(target, fused_norms="off"), reference, cells, [])
    chosen, quantised, lines = decode_modules(target, model, cells, [])
    assert chosen == Candidate("softsyn") and lines == []
    assert all(isinstance(layer, FusedNorms) for layer in model.model.layers)
    assert not any(isinstance(layer, FusedNorms) for layer in reference.model.layers)
    assert "4 RMS norm weights folded into the q/k/v and gate/up projections they feed before quantisation " \
           "(fused_norms)" in quantised.notes
    assert any(line.startswith("2 decoder layers: input and post-attention RMS norms") for line in quantised.notes)
    for a, b in zip(steps(model, "softsyn"), steps(reference, "softsyn")):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
