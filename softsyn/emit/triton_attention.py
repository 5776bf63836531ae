"""softsyn's decode attention for the CUDA torch target: one query position per head against the static KV cache, as
a Triton kernel that AOTInductor compiles into the package (a `torch.library.triton_op`, like
softsyn.emit.triton_weights), split over the cache's slots as FlashDecoding does.

Why: at decode, the matmul form (softsyn.emit.torch_step.matmul_attention) runs q k^T, a masked softmax and p v as
three kernels a layer, each reading its operand whole; at past 4096 they took 0.52 of a 1.58 ms qwen3-0.6b int4 step
on the H100 (2026-12-06, bench/results/torch-int4-qwen3-0.6b-h100-2026-12-06-c.rpt), where K and V once at the
card's bandwidth take ~0.17 ms for 28 layers. cuDNN's fused SDPA splits the work by query rows, two a KV head at
decode, and was slower still (86 us a layer at qwen3-1.7b's shapes on the H200, 2026-12-03).

The kernel: program (b * kv_heads + h, split, t) takes 16 of the rows that share KV head h (its query heads
stacked, times the step's positions: 2-8 rows at decode, one tile), walks its split's slots in blocks of BLOCK_S
with an online softmax (scores and sums in fp32, each row's masked slots at -inf) and writes its unnormalised output
and its (max, sum); the splits are combined in torch (one Inductor kernel). SPLITS programs a KV head whatever the
span, so a short cache leaves some splits empty (max -inf, weight 0) and a long one spreads over every SM. It serves
any number of positions (a package's step is exported with the positions dynamic), but is built for one.
Measured, it loses: per layer at qwen3-1.7b's shapes, matmul / SDPA / this kernel took 11.6 / 24.8 / 35.5 us at past
512 and 29.8 / 98.1 / 39.3 at past 4096, and AOTInductor failed to package it (H100, 2026-12-06,
bench/results/torch-kernels-h100-2026-12-06-e.md). No target uses the form; it walks the whole span it is given with a
per-row mask, where FlashDecoding splits only the filled prefix.
"""
from __future__ import annotations

import torch

from softsyn.emit.triton_weights import interpreting

SPLITS = 32  # programs a KV head over the cache's slots (qwen3's 8 KV heads: 256 programs at batch 1)
BLOCK_S = 64  # slots a loop step
ROWS_MIN = 16  # rows a program: tl.dot's smallest tile (decode's 2-8 query heads a KV head padded up to it)

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU-only install: the op computes the same function in torch
    triton = None

if triton is not None:
    @triton.jit
    def decode_attention_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, ml_ptr, kv_heads, rows, seq, slots, split_slots,
                                stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, stride_mb, stride_mq,
                                scale, RP: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr):
        """Program (bh, split, t): rows [t * RP, +RP) of q[bh] (row i: query position i % seq) against slots
        [split * split_slots, +split_slots) of k/v[b, h], visible where mask[b, i % seq, slot]; writes
        o[bh, split, row] (unnormalised, fp32) and ml[bh, split, row] = (running max, running sum)."""
        bh, split = tl.program_id(0), tl.program_id(1)
        b, h = bh // kv_heads, bh % kv_heads
        rr, rd = tl.program_id(2) * RP + tl.arange(0, RP), tl.arange(0, D)
        live = rr < rows
        q = tl.load(q_ptr + (bh * rows + rr[:, None]) * D + rd[None, :], mask=live[:, None], other=0.0)
        k_head, v_head = k_ptr + b * stride_kb + h * stride_kh, v_ptr + b * stride_vb + h * stride_vh
        mask_rows = mask_ptr + b * stride_mb + (rr % seq) * stride_mq
        m_i = tl.full((RP,), float("-inf"), tl.float32)
        l_i = tl.zeros((RP,), tl.float32)
        acc = tl.zeros((RP, D), tl.float32)
        start = split * split_slots
        end = tl.minimum(start + split_slots, slots)
        for s0 in range(start, end, BLOCK_S):
            rs = s0 + tl.arange(0, BLOCK_S)
            inside = rs < end
            visible = tl.load(mask_rows[:, None] + rs[None, :], mask=live[:, None] & inside[None, :], other=0) != 0
            k = tl.load(k_head + rs[:, None] * stride_ks + rd[None, :], mask=inside[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
            scores = tl.where(visible, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no visible slot yet: exp(-inf) = 0, never nan
            p = tl.exp(scores - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            v = tl.load(v_head + rs[:, None] * stride_vs + rd[None, :], mask=inside[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        part = (bh * tl.num_programs(1) + split) * rows + rr
        tl.store(o_ptr + part[:, None] * D + rd[None, :], acc, mask=live[:, None])
        tl.store(ml_ptr + part * 2, m_i, mask=live)
        tl.store(ml_ptr + part * 2 + 1, l_i, mask=live)


def reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
              scale: float) -> torch.Tensor:
    """The function in torch: softmax(q k^T * scale, masked) v in fp32, per KV head (the kernel's fallback); row i of
    a KV head's rows is query position i % seq."""
    rows_mask = mask.repeat(1, query.shape[2] // mask.shape[1], 1)[:, None]  # [B, 1, rows, S]
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~rows_mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), value.float()).to(query.dtype)


def combine(out: torch.Tensor, ml: torch.Tensor) -> torch.Tensor:
    """The splits' partial outputs [BH, SPLITS, R, D] and (max, sum) [BH, SPLITS, R, 2] as one softmax: each split
    weighted by exp(its max - the overall max); an empty split (max -inf) weighs 0."""
    top = ml[..., 0].amax(1, keepdim=True)
    weight = torch.exp(ml[..., 0] - torch.where(torch.isinf(top), torch.zeros_like(top), top))
    return (out * weight[..., None]).sum(1) / (ml[..., 1] * weight).sum(1)[..., None]


@torch.library.triton_op("softsyn::decode_attention", mutates_args=())
def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """softmax(query key^T * scale where mask) value: query [B, Hkv, rows, D] (the query heads of each KV head
    stacked, rows = heads a KV head x positions, row i at position i % seq; D a power of two), key/value
    [B, Hkv, S, D] (views of the cache, each slot's D values contiguous), mask [B, seq, S] bool (True: visible,
    contiguous along S); [B, Hkv, rows, D] in the query's dtype. The Triton kernel on CUDA (and in Triton's
    interpreter), torch elsewhere."""
    if triton is None or (query.device.type != "cuda" and not interpreting()):
        return reference(query, key, value, mask, scale)
    batch, kv_heads, rows, dim = query.shape
    slots = key.shape[2]
    q = query.contiguous()
    out = torch.empty((batch * kv_heads, SPLITS, rows, dim), device=q.device, dtype=torch.float32)
    ml = torch.empty((batch * kv_heads, SPLITS, rows, 2), device=q.device, dtype=torch.float32)
    per_split = -(-slots // SPLITS)
    split_slots = -(-per_split // BLOCK_S) * BLOCK_S  # a split's slots, in whole blocks
    grid = (batch * kv_heads, SPLITS, -(-rows // ROWS_MIN))
    torch.library.wrap_triton(decode_attention_kernel)[grid](
        q_ptr=q, k_ptr=key, v_ptr=value, mask_ptr=mask, o_ptr=out, ml_ptr=ml, kv_heads=kv_heads, rows=rows,
        seq=mask.shape[1], slots=slots, split_slots=split_slots, stride_kb=key.stride(0), stride_kh=key.stride(1),
        stride_ks=key.stride(2), stride_vb=value.stride(0), stride_vh=value.stride(1), stride_vs=value.stride(2),
        stride_mb=mask.stride(0), stride_mq=mask.stride(1), scale=scale, RP=ROWS_MIN, D=dim, BLOCK_S=BLOCK_S,
        num_warps=4)
    return combine(out, ml).reshape(batch, kv_heads, rows, dim).to(query.dtype)
