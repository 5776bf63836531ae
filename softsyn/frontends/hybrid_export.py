"""The torch side of a hybrid decoder (Qwen3-Next: Gated DeltaNet linear-attention layers between gated full-attention
layers): its export with the whole hybrid cache as ports.

transformers' cache (`DynamicCache` over a qwen3_next config) holds K/V for the full-attention layers and, per
linear-attention layer, a conv state (the last inputs of the short causal convolution) and a recurrent state
[batch, value_heads, key_dim, value_dim] (the delta rule's memory). The export wrapper takes all three as inputs
and returns their next values, named as onnxruntime-genai names a hybrid decoder's caches (its model builder, 0.18):
past_key_values.N.key/value -> present.N.key/value for a full-attention layer N, past.N.conv -> present.N.conv and
past.N.recurrent -> present.N.recurrent for a linear-attention layer N (N: the model's layer index). The conv state
holds kernel - 1 inputs [batch, conv_dim, kernel - 1], as genai's does: transformers keeps `kernel`, whose oldest
column no output reads.

During the export each linear-attention layer's forward is transformers' own computation in its cached form, with
one change of schedule: the delta rule runs token by token (transformers' `torch_recurrent_gated_delta_rule`, its
decode path) for every prompt length, as one torch `scan` over the sequence (ONNX Scan), not the chunked form
transformers uses for a prompt, which torch.export unrolls at the example length (bench/results/
qwen3-next-tiny-2026-12-01.md). So one graph serves a prompt of any length and each decode step.
"""
from __future__ import annotations

import types

import onnx_ir as ir
import torch
import torch.nn.functional as F
from torch._higher_order_ops.scan import scan
from transformers.activations import ACT2FN
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3_next import modeling_qwen3_next as qn

from softsyn.frontends import export as _export

LINEAR, FULL = "linear_attention", "full_attention"


def layer_types(cfg) -> list[str]:
    return list(cfg.layer_types)


def state_shapes(cfg) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """(conv state [conv_dim, kernel - 1], recurrent state [value_heads, key_dim, value_dim]) of one sequence."""
    key_dim = cfg.linear_key_head_dim * cfg.linear_num_key_heads
    value_dim = cfg.linear_value_head_dim * cfg.linear_num_value_heads
    return ((2 * key_dim + value_dim, cfg.linear_conv_kernel_dim - 1),
            (cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim))


def _delta_step(state, x):
    """One token of transformers' torch_recurrent_gated_delta_rule: decay, delta update, read."""
    q, k, v, decay, beta = x
    state = state * decay.exp()[..., None, None]
    kv_mem = (state * k.unsqueeze(-1)).sum(dim=-2)
    delta = (v - kv_mem) * beta.unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return state, (state * q.unsqueeze(-1)).sum(dim=-2)


def recurrent_delta_rule(query, key, value, g, beta, state):
    """transformers' torch_recurrent_gated_delta_rule (use_qk_l2norm_in_kernel=True) over any number of tokens, as
    one scan: (output [batch, seq, v_heads, v_dim], final state)."""
    dtype = query.dtype
    rep = value.shape[-2] // key.shape[-2]
    if rep > 1:
        query, key = query.repeat_interleave(rep, dim=2), key.repeat_interleave(rep, dim=2)
    query, key, value, beta, g = (x.to(torch.float32) for x in (query, key, value, beta, g))
    query, key = qn.l2norm(query, dim=-1, eps=1e-6), qn.l2norm(key, dim=-1, eps=1e-6)
    query = query / (query.shape[-1] ** 0.5)
    # the scan runs over dim 0: the sequence axis first
    xs = tuple(x.transpose(0, 1).contiguous() for x in (query, key, value, g, beta))
    final, out = scan(_delta_step, state.to(torch.float32), xs)
    return out.transpose(0, 1).to(dtype), final


def _linear_attention_forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
    """Qwen3NextGatedDeltaNet.forward with its conv and recurrent states read from and written to `cache`'s
    layer (softsyn's export cache: always holding a previous state, zeros before the first token). The padding
    mask is not applied: transformers takes the mask's last `seq` columns as the new tokens', which under a shared
    KV buffer (a max_length mask, zeros after the sequence) are the unfilled ones; unpadded sequences are exact."""
    seq_len = hidden_states.shape[1]
    layer = cache.layers[self.layer_idx]
    qkvz, ba = self.in_proj_qkvz(hidden_states), self.in_proj_ba(hidden_states)
    query, key, value, z, b, a = self.fix_query_key_value_ordering(qkvz, ba)
    mixed = torch.cat([x.reshape(x.shape[0], x.shape[1], -1) for x in (query, key, value)], dim=-1).transpose(1, 2)
    # causal_conv1d_update over any number of tokens: the cached inputs, then the new ones
    full = torch.cat([layer.conv_states[0], mixed.to(layer.conv_states[0].dtype)], dim=-1)
    layer.conv_states[0] = full[:, :, full.shape[-1] - (self.conv_kernel_size - 1):]
    mixed = F.conv1d(full, self.conv1d.weight, self.conv1d.bias, padding=0, groups=self.conv_dim)[:, :, -seq_len:]
    mixed = ACT2FN[self.activation](mixed).to(hidden_states.dtype).transpose(1, 2)
    query, key, value = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    query = query.reshape(query.shape[0], seq_len, -1, self.head_k_dim)
    key = key.reshape(key.shape[0], seq_len, -1, self.head_k_dim)
    value = value.reshape(value.shape[0], seq_len, -1, self.head_v_dim)
    g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
    core, layer.recurrent_states[0] = recurrent_delta_rule(query, key, value, g, b.sigmoid(),
                                                           layer.recurrent_states[0])
    z_shape = z.shape
    core = self.norm(core.reshape(-1, core.shape[-1]), z.reshape(-1, z.shape[-1])).reshape(z_shape)
    return self.out_proj(core.reshape(core.shape[0], core.shape[1], -1))


def port_names(cfg) -> tuple[list[str], list[str]]:
    """(cache input names, cache output names) in the wrapper's order: per layer, K and V or conv and recurrent."""
    ins, outs = [], []
    for i, kind in enumerate(layer_types(cfg)):
        if kind == FULL:
            ins += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
            outs += [f"present.{i}.key", f"present.{i}.value"]
        else:
            ins += [f"past.{i}.conv", f"past.{i}.recurrent"]
            outs += [f"present.{i}.conv", f"present.{i}.recurrent"]
    return ins, outs


class HybridDecoder(torch.nn.Module):
    """input_ids, attention_mask, position_ids and the hybrid cache (port_names' order) -> logits, next cache."""

    def __init__(self, m):
        super().__init__()
        self.m = m
        self.kinds = layer_types(m.config)
        for layer in m.model.layers:
            if getattr(layer, "linear_attn", None) is not None:
                layer.linear_attn.forward = types.MethodType(_linear_attention_forward, layer.linear_attn)

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = DynamicCache(config=self.m.config)
        for i, kind in enumerate(self.kinds):
            first, second = past[2 * i], past[2 * i + 1]
            if kind == FULL:
                cache.update(first, second, i)
            else:
                layer = cache.layers[i]
                layer.conv_states[0], layer.recurrent_states[0] = first, second
                layer.has_previous_state[0] = True
        out = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                     use_cache=True)
        flat = [out.logits]
        for i, kind in enumerate(self.kinds):
            layer = cache.layers[i]
            flat += [layer.keys, layer.values] if kind == FULL else [layer.conv_states[0], layer.recurrent_states[0]]
        return tuple(flat)


def example_cache(cfg, batch: int, past: int, dtype, generator) -> tuple:
    """Seeded example inputs for the cache ports (random K/V of `past` positions, random states)."""
    (conv_dim, kernel), rec = state_shapes(cfg)
    kv_heads, head_dim = cfg.num_key_value_heads, cfg.head_dim
    out = []
    for kind in layer_types(cfg):
        if kind == FULL:
            out += [torch.randn(batch, kv_heads, past, head_dim, generator=generator).to(dtype) for _ in range(2)]
        else:
            out += [torch.randn(batch, conv_dim, kernel, generator=generator).to(dtype),
                    torch.randn(batch, *rec, generator=generator).to(torch.float32)]
    return tuple(out)


def export_hybrid_decoder(model, name: str, batch: int = 2, seq: int = 3, past: int = 4,
                          optimize: bool | None = None) -> ir.Model:
    """Export a Qwen3-Next causal LM with its hybrid cache as ports; dims batch, seq, past (total = past + seq).
    The exporter's optimizer runs unless the weights are on the meta device (it folds constants from their data), as
    for the other decoders: 15 s on 2 cores (2026-12-03: the Scan keeps the graph small; on the chunked form's
    unrolled graph it ran over 15 min, 2026-12-01), so shape arithmetic folds as in their exports."""
    cfg = model.config
    param = next(model.parameters())
    dtype, device = param.dtype, param.device
    optimize = device.type != "meta" if optimize is None else optimize
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(device)
    mask = torch.ones(batch, past + seq, dtype=torch.long, device=device)
    pos = torch.arange(past, past + seq, dtype=torch.long, device=device).unsqueeze(0).expand(batch, seq).contiguous()
    cache = tuple(t.to(device) for t in example_cache(cfg, batch, past, dtype, g))
    dim = torch.export.Dim
    b, s, p, t = dim("batch"), dim("seq"), dim("past"), dim("total")
    cache_dims = []
    for kind in layer_types(cfg):
        cache_dims += [{0: b, 2: p}] * 2 if kind == FULL else [{0: b}] * 2
    dynamic_shapes = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: t}, "position_ids": {0: b, 1: s},
                      "past": tuple(cache_dims)}
    in_names, out_names = port_names(cfg)
    with _export.quiet(), torch.no_grad():
        prog = torch.onnx.export(HybridDecoder(model).eval(), (ids, mask, pos) + cache, dynamic_shapes=dynamic_shapes,
                                 dynamo=True, input_names=["input_ids", "attention_mask", "position_ids"] + in_names,
                                 output_names=["logits"] + out_names, opset_version=_export.OPSET, optimize=optimize,
                                 verbose=False)
    return _export.finish(prog.model, name)
