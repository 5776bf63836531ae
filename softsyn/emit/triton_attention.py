"""softsyn's decode attention for the CUDA torch target: the query positions of a step against the static KV cache's
filled prefix, as two Triton kernels that AOTInductor compiles into the package (a `torch.library.triton_op`, like
softsyn.emit.triton_weights), split over the cache's slots as FlashDecoding does.

Why: at decode the matmul form (torch_attention_forms.matmul_attention) runs q k^T, a masked softmax and p v as
three kernels a layer, each reading its operand whole; in qwen3-1.7b's int4 step at past 4096 they took 522 us of
1.886 ms of kernels (H100, 2026-12-06, bench/results/compare-peers-cuda-h100-2026-12-06-torch-int4-1.7b.md), where
K and V read once at the card's bandwidth take ~0.15 ms for 28 layers.

The kernels:
- split (attend_kernel): program (h, split) takes KV head h's slots [split * part, +part) (part: the span over SPLITS
  in whole blocks of BLOCK_S) and, for every batch row and every tile of RP query rows (the KV head's query heads
  stacked, times the step's positions: 2-8 rows at decode, one tile), walks them with an online softmax (scores and
  sums in fp32, masked slots at -inf) and writes the unnormalised output and its (max, sum) for the live rows. A split
  past the span reads nothing and writes zeros and (max -inf, sum 0) for the live rows (1 KB at decode).
- combine (combine_kernel): program (h, r) merges row r of every row tile's SPLITS parts (each weighted by
  exp(its max - the overall max); parts and weights loaded at once) and writes the row where the attention output
  goes, [B, seq, heads, D]: no transpose after. It took 3.0-3.7 us a layer (H100, 2026-12-06) in the form whose
  parts' load waited on the weights (an empty part's output was not written, so not read); the loads now go
  together, not yet measured.
- folded (attend_kernel's FOLD, softsyn::attention_step's form): the split kernel's last program of each KV head
  to finish (an acquire-release count a head, which the prologue kernel zeroes) merges the head's rows itself, reading
  only the splits inside the span: one launch a layer where two ran, the combine's ~3.5 us and a launch gap saved
  if the merge in one program costs less (not yet measured).
Both grids are static (KV heads x a constant): batch, positions and span are loop bounds, never grid dims, since
torch 2.11's AOTInductor failed to autotune a kernel whose grid named a dynamic size (the weight kernel's "launcher()
missing 1 required positional argument", H100 2026-12-06; this kernel's first form, gridded over batch x KV heads and
row tiles, failed to package the same way).

The first form (SPLITS programs a KV head, the combine in torch ops) lost to the matmul form: 35.5 vs 11.6 us a layer
at past 512, 39.3 vs 29.8 at 4096 (H100, 2026-12-06, bench/results/torch-kernels-h100-2026-12-06-e.md).
"""
from __future__ import annotations

import torch

from softsyn.emit.triton_weights import interpreting

SPLITS = 64  # programs a KV head over the span (qwen3's 8 KV heads: 512 at any batch; idle past the span)
ROWS = 16  # query rows a tile: tl.dot's smallest (decode's 2-8 query heads a KV head padded up to it)
DEFAULT_CONFIG = {"BLOCK_S": 64}  # untuned (the interpreter)

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU-only install: the op computes the same function in torch
    triton = None

if triton is not None:
    @triton.jit
    def attend_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, ml_ptr, out_ptr, count_ptr, batch, rows, seq, slots,
                      stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, stride_mb, stride_mq, scale,
                      SPLITS: tl.constexpr, RP: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr,
                      FOLD: tl.constexpr):
        """Program (h, split): for every batch row b and row tile, rows of q[b, h] (row i: query position i % seq)
        against the split's slots of k/v[b, h], visible where mask[b, i % seq, slot]; writes o[b, h, tile, split]
        (unnormalised, fp32, [RP, D]) and ml[b, h, tile, split] = (running max, running sum) per row. FOLD: the
        combine too, by the last of KV head h's programs to finish (count[h], zero before the launch, counts them
        and is left zero again), so a layer's attention is one launch where it was two."""
        h, split = tl.program_id(0), tl.program_id(1)
        kv_heads = tl.num_programs(0)
        part = tl.cdiv(tl.cdiv(slots, SPLITS), BLOCK_S) * BLOCK_S
        start = split * part
        end = tl.minimum(start + part, slots)
        rd, tiles = tl.arange(0, D), tl.cdiv(rows, RP)
        for b in range(batch):
            k_head = k_ptr + b * stride_kb + h * stride_kh
            v_head = v_ptr + b * stride_vb + h * stride_vh
            for t in range(tiles):
                rr = t * RP + tl.arange(0, RP)
                live = rr < rows
                # in the cache's dtype: torch 2.11's AOTInductor typed q fp32 in qwen3-1.7b's package (tl.dot "Both
                # operands must be same dtype", H100, 2026-12-06)
                q = tl.load(q_ptr + ((b * kv_heads + h) * rows + rr[:, None]) * D + rd[None, :], mask=live[:, None],
                            other=0.0).to(k_ptr.dtype.element_ty)
                mask_rows = mask_ptr + b * stride_mb + (rr % seq) * stride_mq
                m_i = tl.full((RP,), float("-inf"), tl.float32)
                l_i = tl.zeros((RP,), tl.float32)
                acc = tl.zeros((RP, D), tl.float32)
                for s0 in range(start, end, BLOCK_S):
                    rs = s0 + tl.arange(0, BLOCK_S)
                    inside = rs < end
                    visible = tl.load(mask_rows[:, None] + rs[None, :], mask=live[:, None] & inside[None, :],
                                      other=0) != 0
                    k = tl.load(k_head + rs[:, None] * stride_ks + rd[None, :], mask=inside[:, None], other=0.0)
                    # fp32 throughout: Inductor types the float `scale` as fp64, which would make the loop-carried
                    # max fp64 ("Loop-carried variable m_i ... re-assigned to fp64", H100, 2026-12-06)
                    scores = tl.where(visible, (tl.dot(q, tl.trans(k)).to(tl.float32) * scale).to(tl.float32),
                                      float("-inf"))
                    m_new = tl.maximum(m_i, tl.max(scores, 1))
                    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing visible yet: p = 0, never nan
                    p = tl.exp(scores - m_safe[:, None])
                    alpha = tl.exp(m_i - m_safe)
                    v = tl.load(v_head + rs[:, None] * stride_vs + rd[None, :], mask=inside[:, None], other=0.0)
                    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
                    l_i = l_i * alpha + tl.sum(p, 1)
                    m_i = m_new
                at = ((b * kv_heads + h) * tiles + t) * SPLITS + split  # this tile's part of this split
                # live rows only; a split past the span writes its (max -inf, sum 0) alone: the merge reads no part
                # whose max is -inf (it weighs 0), and at a short span most splits are past it (512 slots in parts
                # of 64: 8 of 64)
                tl.store(o_ptr + (at * RP + rr % RP)[:, None] * D + rd[None, :], acc,
                         mask=live[:, None] & (start < end))
                tl.store(ml_ptr + (at * RP + rr % RP) * 2, m_i, mask=live)
                tl.store(ml_ptr + (at * RP + rr % RP) * 2 + 1, l_i, mask=live)
        if FOLD:
            # every thread's stores before the count (the barrier), the count acquire-release at GPU scope, so the
            # program that counts last sees every split's parts; no program waits on another (no spin: a count
            # left wrong by a stray launch loses a combine, never hangs the step)
            tl.debug_barrier()
            if tl.atomic_add(count_ptr + h, 1, sem="acq_rel") == SPLITS - 1:
                splits = tl.cdiv(slots, part)  # those past the span hold nothing: not read
                for b in range(batch):
                    for t in range(tiles):
                        for r in range(tl.minimum(RP, rows - t * RP)):
                            merge_row(o_ptr, ml_ptr, out_ptr, b, h, t, r=r, kv_heads=kv_heads, rows=rows, seq=seq,
                                      splits=splits, SPLITS=SPLITS, RP=RP, D=D, CHUNK=16,  # merge_row says why 16
                                      SKIP=False)
                tl.atomic_xchg(count_ptr + h, 0)

    @triton.jit
    def merge_row(o_ptr, ml_ptr, out_ptr, b, h, t, r, kv_heads, rows, seq, splits, SPLITS: tl.constexpr,
                  RP: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr, SKIP: tl.constexpr):
        """Row r of row tile t of KV head h, batch row b: its first `splits` parts merged into one softmax, written to
        out[b, position, head, :] (row i: query head h * rows / seq + i // seq, position i % seq), the parts read
        CHUNK at a time (the folded combine's 16: a [SPLITS, D] fp32 tile took 64 registers a thread at 4 warps and
        raised the whole split kernel's count from 168 to 190, sm_90, 2026-12-07; the combine kernel's SPLITS: one
        load round). The parts are read past the L1 cache (.cg): a folded combine reads what other SMs wrote in the
        same launch. SKIP: no part whose max is -inf is read (the combine kernel's, which merges every split, most
        of them past a short span; the folded combine reads the first `splits` alone, and the predicate cost its
        kernel 12 registers a thread, 168 -> 180, sm_90)."""
        tiles, rep = tl.cdiv(rows, RP), rows // seq
        rs, rc, rd = tl.arange(0, SPLITS), tl.arange(0, CHUNK), tl.arange(0, D)
        row = t * RP + r
        first = ((b * kv_heads + h) * tiles + t) * SPLITS  # this row's tile's first part
        m = tl.load(ml_ptr + ((first + rs) * RP + r) * 2, mask=rs < splits, other=float("-inf"), cache_modifier=".cg")
        top = tl.max(m, 0)
        top = tl.where(top == float("-inf"), 0.0, top)  # an empty part weighs 0
        total = tl.sum(tl.load(ml_ptr + ((first + rs) * RP + r) * 2 + 1, mask=rs < splits, other=0.0,
                               cache_modifier=".cg") * tl.exp(m - top), 0)
        row_out = tl.zeros((D,), dtype=tl.float32)
        for c0 in range(0, splits, CHUNK):
            at = first + c0 + rc  # [CHUNK] parts
            used = c0 + rc < splits
            maxes = tl.load(ml_ptr + (at * RP + r) * 2, mask=used, other=float("-inf"), cache_modifier=".cg")
            weight = tl.exp(maxes - top)
            # a part whose max is -inf (a split past the span, or every slot of it hidden) weighs 0: not read (the
            # split kernel writes none past the span), so the combine reads the parts a short span fills, not SPLITS
            read = used & (maxes > float("-inf")) if SKIP else used
            parts = tl.load(o_ptr + (at * RP + r)[:, None] * D + rd[None, :], mask=read[:, None], other=0.0,
                            cache_modifier=".cg")
            row_out += tl.sum(parts * weight[:, None], 0)
        head, position = h * rep + row // seq, row % seq
        tl.store(out_ptr + ((b * seq + position) * kv_heads * rep + head) * D + rd,
                 (row_out / total).to(out_ptr.dtype.element_ty))

    @triton.jit
    def combine_kernel(o_ptr, ml_ptr, out_ptr, batch, rows, seq, SPLITS: tl.constexpr, RP: tl.constexpr,
                       D: tl.constexpr):
        """Program (h, r): row r of every row tile of KV head h, each batch row: its SPLITS parts merged (merge_row)."""
        h, r = tl.program_id(0), tl.program_id(1)
        kv_heads = tl.num_programs(0)
        for b in range(batch):
            for t in range(tl.cdiv(rows, RP)):
                if t * RP + r < rows:
                    merge_row(o_ptr, ml_ptr, out_ptr, b, h, t, r=r, kv_heads=kv_heads, rows=rows, seq=seq,
                              splits=SPLITS, SPLITS=SPLITS, RP=RP, D=D, CHUNK=SPLITS, SKIP=True)

    # few configs: AOTInductor compiles each (once a package: every layer has the same shapes); num_stages 2 lets a
    # split's next block load while this one computes
    CONFIGS = [triton.Config({"BLOCK_S": s}, num_warps=w, num_stages=n)
               for s, w, n in ((32, 2, 1), (64, 4, 1), (64, 4, 2), (128, 4, 2))]
    tuned_attend = triton.autotune(configs=CONFIGS, key=["rows", "slots"])(attend_kernel)


def reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
              scale: float) -> torch.Tensor:
    """The function in torch, softmax(q k^T * scale, masked) v in fp32, laid out as the op's result: query
    [B, Hkv, rows, D] (row i: position i % seq), mask [B, seq, S] -> [B, seq, Hkv * rows / seq, D]."""
    batch, kv_heads, rows, dim = query.shape
    seq = mask.shape[1]
    rows_mask = mask.repeat(1, rows // seq, 1)[:, None]  # [B, 1, rows, S]
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~rows_mask, float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), value.float()).to(query.dtype)
    return out.reshape(batch, kv_heads * rows // seq, seq, dim).transpose(1, 2).contiguous()


@torch.library.triton_op("softsyn::decode_attention", mutates_args=())
def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """softmax(query key^T * scale where mask) value: query [B, Hkv, rows, D] (the query heads of each KV head
    stacked, rows = heads a KV head x positions, row i at position i % seq; D a power of two), key/value
    [B, Hkv, S, D] (views of the cache, each slot's D values contiguous), mask [B, seq, S] bool (True: visible,
    contiguous along S); [B, seq, heads, D] in the query's dtype (the layout attention's output projection reads).
    The Triton kernels on CUDA (and in Triton's interpreter), torch elsewhere."""
    if triton is None or (query.device.type != "cuda" and not interpreting()):
        return reference(query, key, value, mask, scale)
    return launch(query, key, value, mask, scale)


def launch(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
           scale: float, counts: torch.Tensor | None = None) -> torch.Tensor:
    """decode_attention's kernels launched (on CUDA or in Triton's interpreter), for a triton_op's body: the op's
    and softsyn::attention_step's (softsyn.emit.triton_prologue), which writes the cache and attends in one op.
    `counts` [Hkv] int32, zero (attention_step's prologue kernel zeroes them): the combine folded into the split
    kernel (attend_kernel's FOLD), one launch, not two."""
    batch, kv_heads, rows, dim = query.shape
    seq, tiles = mask.shape[1], -(-rows // ROWS)
    q = query.contiguous()
    parts = torch.empty((batch * kv_heads * tiles * SPLITS * ROWS, dim), device=q.device, dtype=torch.float32)
    ml = torch.empty((batch * kv_heads * tiles * SPLITS * ROWS, 2), device=q.device, dtype=torch.float32)
    out = torch.empty((batch, seq, kv_heads * (rows // seq), dim), device=q.device, dtype=query.dtype)
    args = dict(q_ptr=q, k_ptr=key, v_ptr=value, mask_ptr=mask, o_ptr=parts, ml_ptr=ml, out_ptr=out,
                count_ptr=counts if counts is not None else ml, batch=batch, rows=rows,
                seq=seq, slots=key.shape[2], stride_kb=key.stride(0), stride_kh=key.stride(1),
                stride_ks=key.stride(2), stride_vb=value.stride(0), stride_vh=value.stride(1),
                stride_vs=value.stride(2), stride_mb=mask.stride(0), stride_mq=mask.stride(1), scale=scale,
                SPLITS=SPLITS, RP=ROWS, D=dim, FOLD=counts is not None)
    if q.device.type == "cuda":
        torch.library.wrap_triton(tuned_attend)[(kv_heads, SPLITS)](**args)
    else:
        torch.library.wrap_triton(attend_kernel)[(kv_heads, SPLITS)](**args, **DEFAULT_CONFIG)
    if counts is None:
        torch.library.wrap_triton(combine_kernel)[(kv_heads, ROWS)](
            o_ptr=parts, ml_ptr=ml, out_ptr=out, batch=batch, rows=rows, seq=seq, SPLITS=SPLITS, RP=ROWS, D=dim)
    return out
