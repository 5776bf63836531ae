"""softsyn's attention prologue for the CUDA torch target: one Triton kernel from the packed QKV GEMV's output to the
decode attention's input, compiled into the package as a `torch.library.triton_op` (like
softsyn.emit.triton_attention): the q and k RMS norms (optional, Qwen3's per-head form), rotary (transformers'
rotate_half convention), the step's keys and values as rows for the cache, and q in the layout
softsyn::decode_attention reads.

Why: a decode step is bound by its number of kernels, not its bytes (~2 us a kernel inside a CUDA graph,
bench/layer_chain.py), and Inductor ran this prologue as four a layer (q norm + rotary, k norm + rotary, two
`index_copy_` cache writes) between the QKV GEMV and the attention. It moves a few KB a layer; one kernel (and the
cache write, an `index_copy_` the caller makes) does.

Two forms of it: `attention_prologue` returns the step's key and value rows, which the caller writes into its cache
by `index_copy_` (two small kernels a layer more); `attention_step` has the kernel write the cache at the step's
slots and runs softsyn::decode_attention's kernels in the same op (the cache written in place in a package:
bench/attention_step_check.py, H100 2026-12-07 16:40), and with `fold` the combine folded into the split kernel (its
counters zeroed by the prologue kernel): two kernels a layer where the rows form launches five. The first
cache-writing form measured ~18 us a layer slow in the attention choice's chains (10:22); that was the chains' doing,
not the op's: their keys and values were views of one tensor, so Inductor copied the whole base before the op that
mutated both (16:40). The measured attention choice (softsyn.emit.torch_attention_choice) times each form.

The kernel (prologue_kernel): program p < H takes query head p, program H + j takes KV head j's key (norm, rotary,
into `k_rows`) and value (as is, into `v_rows`). Each walks the step's rows (batch row x position, ROWS at a time) in
fp32, each row's D values as two halves (rotate_half pairs element i with i + D / 2), and rounds once to the output's
dtype. The grid is static, (H + Hkv,): batch and positions are loop bounds, never grid dims, since torch 2.11's
AOTInductor failed to autotune a kernel whose grid named a dynamic size (softsyn.emit.triton_attention says where).
The torch target uses it only where `fused_prologue` says so: h200-torch times it against the unfused forms in its
measured attention choice (softsyn.emit.torch_attention_choice), and builds it only where it is faster.
"""
from __future__ import annotations

import torch

from softsyn.emit.triton_attention import launch as attend
from softsyn.emit.triton_attention import reference as attention_reference
from softsyn.emit.triton_weights import interpreting

ROWS = 16  # step rows (batch row x position) a program handles at once: decode's 1-8 in one pass, masked; untuned
# (Triton's default 4 warps: a [ROWS, D / 2] fp32 tile is 8 values a thread at D 128)

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU-only install: the op computes the same function in torch
    triton = None

if triton is not None:
    @triton.jit
    def _rms(lo, hi, w_ptr, eps, rh, HALF: tl.constexpr):
        """The rows' two halves RMS-normed over the head (fp32 variance) and times the weight's halves."""
        var = (tl.sum(lo * lo, 1) + tl.sum(hi * hi, 1)) / (2 * HALF)
        inv = tl.math.rsqrt(var + eps)
        w_lo = tl.load(w_ptr + rh).to(tl.float32)
        w_hi = tl.load(w_ptr + HALF + rh).to(tl.float32)
        return lo * inv[:, None] * w_lo[None, :], hi * inv[:, None] * w_hi[None, :]

    @triton.jit
    def prologue_kernel(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, where_ptr, q_ptr, count_ptr, batch,
                        seq, heads, kv_heads, stride_cb, stride_cs, stride_sb, stride_ss, stride_kb, stride_kh,
                        stride_ks, stride_vb, stride_vh, stride_vs, eps, Q_NORM: tl.constexpr, K_NORM: tl.constexpr,
                        HALF: tl.constexpr, ROWS: tl.constexpr, AT_SLOTS: tl.constexpr, COUNTS: tl.constexpr):
        """Program p: query head p (p < heads) or KV head p - heads, over every row t = b * seq + s of the step:
        qkv[b, s] holds the heads' D = 2 * HALF values, queries then keys then values; q written to
        q[b, p, s] ([B, H, S, D] contiguous: [B, Hkv, rep * S, D] with row r * S + s), the key and value to
        k/v[b, j, slot] by their strides (each slot's D values contiguous): slot s (rows of the step), or where AT_SLOTS
        where[s] (the cache's slots). COUNTS: program 0 zeroes count[Hkv], the folded attention's counters
        (softsyn.emit.triton_attention's FOLD), which the next launch reads: a step that zeroes them needs no fill
        kernel of its own."""
        p = tl.program_id(0)
        if COUNTS and p == 0:
            for j in range(kv_heads):
                tl.store(count_ptr + j, 0)
        eps = tl.cast(eps, tl.float32)  # Inductor types a Python float fp64 in a package: the norm stays fp32
        rh = tl.arange(0, HALF)
        width = (heads + 2 * kv_heads) * 2 * HALF
        is_q = p < heads
        kv = p - heads
        column = p * 2 * HALF  # the head's first value in a qkv row: q heads, then k heads (p = heads + kv)
        for t0 in range(0, batch * seq, ROWS):
            rt = t0 + tl.arange(0, ROWS)
            live = rt < batch * seq
            b, s = rt // seq, rt % seq
            at = qkv_ptr + rt[:, None] * width + column + rh[None, :]
            lo = tl.load(at, mask=live[:, None], other=0.0).to(tl.float32)
            hi = tl.load(at + HALF, mask=live[:, None], other=0.0).to(tl.float32)
            if is_q:
                if Q_NORM:
                    lo, hi = _rms(lo, hi, qw_ptr, eps, rh, HALF)
            else:
                if K_NORM:
                    lo, hi = _rms(lo, hi, kw_ptr, eps, rh, HALF)
            c_at = cos_ptr + (b * stride_cb + s * stride_cs)[:, None] + rh[None, :]
            s_at = sin_ptr + (b * stride_sb + s * stride_ss)[:, None] + rh[None, :]
            cos_lo = tl.load(c_at, mask=live[:, None], other=0.0).to(tl.float32)
            cos_hi = tl.load(c_at + HALF, mask=live[:, None], other=0.0).to(tl.float32)
            sin_lo = tl.load(s_at, mask=live[:, None], other=0.0).to(tl.float32)
            sin_hi = tl.load(s_at + HALF, mask=live[:, None], other=0.0).to(tl.float32)
            # x * cos + rotate_half(x) * sin, rotate_half(x) = (-x_hi, x_lo)
            out_lo = lo * cos_lo - hi * sin_lo
            out_hi = hi * cos_hi + lo * sin_hi
            if is_q:
                q_at = q_ptr + ((b * heads + p) * seq + s)[:, None] * 2 * HALF + rh[None, :]
                tl.store(q_at, out_lo.to(q_ptr.dtype.element_ty), mask=live[:, None])
                tl.store(q_at + HALF, out_hi.to(q_ptr.dtype.element_ty), mask=live[:, None])
            else:
                slot = s
                if AT_SLOTS:
                    slot = tl.load(where_ptr + s, mask=live, other=0)
                k_at = k_ptr + (b * stride_kb + kv * stride_kh + slot * stride_ks)[:, None] + rh[None, :]
                tl.store(k_at, out_lo.to(k_ptr.dtype.element_ty), mask=live[:, None])
                tl.store(k_at + HALF, out_hi.to(k_ptr.dtype.element_ty), mask=live[:, None])
                v_in = at + kv_heads * 2 * HALF  # the value head sits kv_heads heads after its key head
                v_at = v_ptr + (b * stride_vb + kv * stride_vh + slot * stride_vs)[:, None] + rh[None, :]
                v_lo = tl.load(v_in, mask=live[:, None], other=0.0).to(tl.float32)
                v_hi = tl.load(v_in + HALF, mask=live[:, None], other=0.0).to(tl.float32)
                tl.store(v_at, v_lo.to(v_ptr.dtype.element_ty), mask=live[:, None])
                tl.store(v_at + HALF, v_hi.to(v_ptr.dtype.element_ty), mask=live[:, None])


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x RMS-normed over its last dim times `weight` in fp32 (x as is where `weight` is None)."""
    if weight is None:
        return x
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin (transformers' convention), x [B, S, heads, D], cos/sin [B, S, D]."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, :, None].float() + turned * sin[:, :, None].float()


def reference(qkv: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, cos: torch.Tensor,
              sin: torch.Tensor, kv_heads: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The function in torch, in fp32 and rounded once to qkv's dtype (the op's contract)."""
    batch, seq, width = qkv.shape
    dim = cos.shape[-1]
    heads = width // dim - 2 * kv_heads
    x = qkv.float().reshape(batch, seq, heads + 2 * kv_heads, dim)
    q, k, v = x.split([heads, kv_heads, kv_heads], dim=2)
    q = rotary(rms_norm(q, q_weight, eps), cos, sin)
    k = rotary(rms_norm(k, k_weight, eps), cos, sin)
    q = q.transpose(1, 2).to(qkv.dtype).reshape(batch, kv_heads, heads // kv_heads * seq, dim)
    return q, k.transpose(1, 2).to(qkv.dtype).contiguous(), v.transpose(1, 2).to(qkv.dtype).contiguous()


@torch.library.triton_op("softsyn::attention_prologue", mutates_args=())
def attention_prologue(qkv: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                       cos: torch.Tensor, sin: torch.Tensor, kv_heads: int,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the packed QKV projection's output qkv [B, S, (H + 2 Hkv) * D] (contiguous, Hkv = kv_heads): q and k
    RMS-normed over each head where their weight [D] is given (eps), both rotated by cos/sin [B, S, D]; returned, in
    qkv's dtype, as (q [B, Hkv, rep * S, D] (row r * S + s: query head j * rep + r at position s),
    softsyn::decode_attention's query; the step's keys and values [B, Hkv, S, D], the rows the caller writes into
    its cache). fp32 inside, rounded once. The Triton kernel on CUDA (and in Triton's interpreter), torch elsewhere;
    D a power of two."""
    if triton is None or (qkv.device.type != "cuda" and not interpreting()):
        return reference(qkv, q_weight, k_weight, cos, sin, kv_heads=kv_heads, eps=eps)
    batch, seq, _ = qkv.shape
    k_rows, v_rows = (torch.empty((batch, kv_heads, seq, cos.shape[-1]), device=qkv.device, dtype=qkv.dtype)
                      for _ in range(2))
    return launch(qkv, (q_weight, k_weight), (cos, sin), (k_rows, v_rows, None), eps), k_rows, v_rows


def launch(qkv: torch.Tensor, weights: tuple, angles: tuple, to: tuple, eps: float,
           counts: torch.Tensor | None = None) -> torch.Tensor:
    """prologue_kernel launched on qkv [B, S, (H + 2 Hkv) D] with the q/k norm `weights` (each None: no norm) and
    rotary `angles` (cos, sin [B, S, D]): the keys and values written into `to` = (keys, values, where), [B, Hkv, L, D]
    each at slots where [S] (None: slot s of [B, Hkv, S, D] rows); q returned as decode_attention's query. `counts`
    [Hkv] int32: zeroed (prologue_kernel's COUNTS)."""
    batch, seq, width = qkv.shape
    (q_weight, k_weight), (cos, sin), (keys, values, where) = weights, angles, to
    dim, kv_heads = cos.shape[-1], keys.shape[1]
    heads = width // dim - 2 * kv_heads
    x = qkv.contiguous()
    # each row's values contiguous (no copy where they are), one batch row's angles read by every row (stride 0)
    cos, sin = (t.contiguous().expand(batch, seq, dim) for t in (cos, sin))
    q = torch.empty((batch, kv_heads, heads // kv_heads * seq, dim), device=x.device, dtype=keys.dtype)
    torch.library.wrap_triton(prologue_kernel)[(heads + kv_heads,)](
        qkv_ptr=x, qw_ptr=q_weight if q_weight is not None else cos, kw_ptr=k_weight if k_weight is not None else cos,
        cos_ptr=cos, sin_ptr=sin, k_ptr=keys, v_ptr=values, where_ptr=where if where is not None else cos, q_ptr=q,
        count_ptr=counts if counts is not None else q, batch=batch, seq=seq, heads=heads, kv_heads=kv_heads,
        stride_cb=cos.stride(0), stride_cs=cos.stride(1),
        stride_sb=sin.stride(0), stride_ss=sin.stride(1), stride_kb=keys.stride(0), stride_kh=keys.stride(1),
        stride_ks=keys.stride(2), stride_vb=values.stride(0), stride_vh=values.stride(1),
        stride_vs=values.stride(2), eps=eps, Q_NORM=q_weight is not None, K_NORM=k_weight is not None,
        HALF=dim // 2, ROWS=ROWS, AT_SLOTS=where is not None, COUNTS=counts is not None)
    return q


@torch.library.triton_op("softsyn::attention_step", mutates_args=("keys", "values"))
def attention_step(qkv: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                   cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, where: torch.Tensor,
                   mask: torch.Tensor, eps: float, scale: float, fold: bool = False) -> torch.Tensor:
    """A decode step's attention after its QKV projection in one op: attention_prologue's q/k norms and rotary, the
    step's keys and values written into the cache keys/values [B, Hkv, L, D] at slots where [S] (each slot's D values
    contiguous) by the prologue kernel itself, then softsyn::decode_attention's kernels over the cache's first
    mask.shape[-1] slots (mask [B, S, span] bool, True: visible); [B, S, H, D] in the cache's dtype. `fold`: the
    combine folded into the split kernel (softsyn.emit.triton_attention's FOLD, its counters zeroed by the prologue
    kernel): two kernels where three run.

    Why one op: nothing after it reads the cache it mutates, as with attention_prologue's first form alone, which
    AOTInductor wrote in place with one launch (bench/prologue_check.py, H100 2026-12-07 04:24). The rows form
    (attention_prologue + index_copy_ + decode_attention) launches two cache writes a layer more; in the module
    chains of the attention choice this op ran 25.8 us a layer at span 768 against the rows form's 29.0 (H100,
    2026-12-07 16:49, one run), and the choice times the two on the compile's own card."""
    span = mask.shape[-1]
    if triton is None or (qkv.device.type != "cuda" and not interpreting()):
        q, k_rows, v_rows = reference(qkv, q_weight, k_weight, cos, sin, kv_heads=keys.shape[1], eps=eps)
        keys.index_copy_(2, where, k_rows)
        values.index_copy_(2, where, v_rows)
        return attention_reference(q, keys[:, :, :span], values[:, :, :span], mask, scale)
    counts = torch.empty((keys.shape[1],), device=qkv.device, dtype=torch.int32) if fold else None
    q = launch(qkv, (q_weight, k_weight), (cos, sin), (keys, values, where), eps, counts)
    return attend(q, keys[:, :, :span], values[:, :, :span], mask, scale, counts)
