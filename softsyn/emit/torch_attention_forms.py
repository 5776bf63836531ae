"""The attention forms of the torch targets' step (softsyn.emit.torch_step), registered with transformers'
AttentionInterface under the names ATTENTIONS gives: a KV head's query heads stacked so K and V are never repeated —
torch's SDPA (grouped_attention), two matmuls and an fp32 softmax, whole or split into chunks of slots (matmul, split,
by_seq), a prompt's flash causal form over exactly its filled prefix (prompt_attention), or at decode softsyn's split
kernels (softsyn_attention, softsyn.emit.triton_attention). Soft-capped scores are capped in every form (a
sliding-window layer's mask comes from the step). attention_implementation runs one module in a form for a check or a
timing and restores its own after."""
from __future__ import annotations

import contextlib

import torch
from transformers import AttentionInterface

import softsyn.emit.triton_attention  # noqa: F401 - registers softsyn::decode_attention

def _stacked(query, key, attention_mask):
    """The query heads of one KV head stacked as rows ([B, Hkv, rep*seq, D]) and the mask repeated to match."""
    batch, heads, seq, dim = query.shape
    kv_heads = key.shape[1]
    rep = heads // kv_heads
    mask = attention_mask[:, :, None].expand(-1, -1, rep, -1, -1).reshape(batch, 1, rep * seq, key.shape[2])
    return query.reshape(batch, kv_heads, rep * seq, dim), mask


def grouped_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """SDPA over the whole static cache, query heads stacked per KV head: K and V are read once per KV head, never
    repeated (transformers' sdpa path repeats them when a mask is given, which would copy the cache every step).
    `attention_mask`: bool [B, 1, seq, max_length], True where visible. Soft-capped scores (Gemma-2's
    attn_logit_softcapping) are no SDPA: those layers take the matmul form."""
    if kwargs.get("softcap"):
        return matmul_attention(module, query, key, value, attention_mask, scaling, softcap=kwargs["softcap"])
    batch, heads, seq, dim = query.shape
    q, mask = _stacked(query, key, attention_mask)
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, seq, dim).transpose(1, 2).contiguous(), None


def matmul_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The same function as two matmuls and a softmax in fp32 (transformers' eager form, query heads stacked):
    Inductor fuses the mask, scale and softmax, and at decode the matmuls are GEMVs over the cache that cuBLAS spreads
    over all its positions, where SDPA's fused kernels split the work by query rows (two at decode: 86 us a layer for
    cuDNN's at qwen3-1.7b's shapes on the H200, 2026-12-03)."""
    return _two_matmuls(query, key, value, attention_mask, scaling, lambda s: torch.softmax(s, dim=-1),
                        softcap=kwargs.get("softcap"))


def _two_matmuls(query, key, value, attention_mask, scaling, softmax, *, softcap=None):
    """q k^T in fp32, masked, `softmax` over the slots, times v: query heads stacked per KV head (_stacked);
    `softcap`: scores = softcap * tanh(scores / softcap) before the mask (Gemma-2, as transformers' eager form)."""
    batch, heads, seq, dim = query.shape
    q, mask = _stacked(query, key, attention_mask)
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * (scaling if scaling is not None else dim ** -0.5)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    probs = softmax(scores.masked_fill(~mask, float("-inf"))).to(value.dtype)
    out = torch.matmul(probs, value)
    return out.reshape(batch, heads, seq, dim).transpose(1, 2).contiguous(), None


SPLIT_CHUNK = 64  # slots per softmax chunk: divides every span (multiples of SPAN_STEP, and the cache's 64-aligned end)


def split_softmax(scores: torch.Tensor) -> torch.Tensor:
    """softmax over the last axis with its max and sum taken per chunk of SPLIT_CHUNK slots, then over the chunks.
    The package is exported with the span dynamic, and Inductor compiles a softmax over a dynamic axis as one program
    per row looping over it: 16 rows at decode, 136 us a layer over 4096 slots on the H200 (2026-12-03). Chunked,
    every (row, chunk) is its own reduction, so the work spreads over the GPU whatever the span."""
    span = scores.shape[-1]
    # one chunk more than the span needs (all -inf): never a single chunk, which torch.export would specialise on
    chunks = -(-span // SPLIT_CHUNK) + 1
    padded = torch.nn.functional.pad(scores, (0, chunks * SPLIT_CHUNK - span), value=float("-inf"))
    parts = padded.reshape(*padded.shape[:-1], chunks, SPLIT_CHUNK)
    top = parts.amax(-1, keepdim=True).amax(-2, keepdim=True)
    weights = torch.exp(parts - top)
    total = weights.sum(-1, keepdim=True).sum(-2, keepdim=True)
    return (weights / total).reshape(padded.shape)[..., :span]


def split_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """matmul_attention with the softmax split into chunks of slots (split_softmax): the same function."""
    return _two_matmuls(query, key, value, attention_mask, scaling, split_softmax, softcap=kwargs.get("softcap"))


def by_seq_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """matmul_attention for one query position (decode), grouped_attention (SDPA) for several (prefill): on the H200
    (2026-12-03) the matmul form is fastest at decode and SDPA at prefill 512 (34 vs 80 us a layer, each alone). One
    exported program serves both: torch.cond on the query length, which AOTInductor decides on the host from the
    step's shape."""
    softcap = kwargs.get("softcap")

    def decode(q, k, v, m):
        return matmul_attention(module, q, k, v, m, scaling, softcap=softcap)[0]

    def prefill(q, k, v, m):
        return grouped_attention(module, q, k, v, m, scaling, softcap=softcap)[0]

    return torch.cond(query.shape[2] == 1, decode, prefill, (query, key, value, attention_mask)), None


FLASH_DTYPES, FLASH_MAX_HEAD_DIM = (torch.float16, torch.bfloat16), 256  # what torch's flash attention kernel takes


def prompt_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A prompt's attention where the step's span ends at its last position (a package in this form is run so:
    torch.json's `span` "end", END_SPAN_FORMS): query i (position past + i) sees slots 0..past + i, a causal mask
    aligned to the bottom right, which flash attention applies itself (its causal form, as torch's CausalBias
    lower_right calls it), the query heads grouped in the kernel: no mask built and no query copied into stacked rows,
    the sdpa form's preparing kernel (0.39 of qwen3-1.7b's 4.23 ms int4 prefill 512, H100, 2026-12-07). Off CUDA (or
    where flash takes neither the dtype nor the head width) the same function through SDPA and a mask built from the
    shapes; sliding-window layers and soft-capped scores take
    grouped_attention with the step's mask (the same function, as the span ends at the last position)."""
    if kwargs.get("softcap") or getattr(module, "sliding_window", None):
        return grouped_attention(module, query, key, value, attention_mask, scaling, softcap=kwargs.get("softcap"))
    seq, span = query.shape[2], key.shape[2]
    if query.device.type == "cuda" and query.dtype in FLASH_DTYPES and query.shape[-1] <= FLASH_MAX_HEAD_DIM:
        out = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, 0.0, is_causal=True,
                                                                 scale=scaling)[0]
    else:
        rows, slots = torch.arange(seq, device=query.device), torch.arange(span, device=query.device)
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=slots[None, :] <= rows[:, None] + (span - seq), scale=scaling,
            enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def softsyn_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """softsyn's split decode kernels (softsyn.emit.triton_attention), the query heads of a KV head stacked as its
    rows (_stacked's order: row r * seq + s), the output written as [B, seq, heads, D]; matmul_attention for
    soft-capped scores or a head width the kernel's tiles do not take (not a power of two). The kernels serve any
    number of positions, so a package exported with them dynamic holds them; a prompt runs them too, though they are
    built for decode (a prefill package takes SDPA)."""
    batch, heads, seq, dim = query.shape
    if kwargs.get("softcap") or dim & (dim - 1):
        return matmul_attention(module, query, key, value, attention_mask, scaling, softcap=kwargs.get("softcap"))
    q = query.reshape(batch, key.shape[1], heads // key.shape[1] * seq, dim)
    return torch.ops.softsyn.decode_attention(q, key, value, attention_mask[:, 0],
                                              scaling if scaling is not None else dim ** -0.5), None


# registered names without "sdpa" in them: transformers checks a model's own SDPA support for any such name and
# refuses one that has none (Gemma-2: soft-capped scores), though these forms do their own (grouped_attention)
ATTENTIONS = {"sdpa": ("softsyn_grouped", grouped_attention), "matmul": ("softsyn_matmul", matmul_attention),
              "split": ("softsyn_split", split_attention), "by_seq": ("softsyn_by_seq", by_seq_attention),
              "softsyn": ("softsyn_decode", softsyn_attention), "prompt": ("softsyn_prompt", prompt_attention)}
END_SPAN_FORMS = ("prompt",)  # forms whose step must attend over exactly its filled prefix (torch.json span "end")
for _name, _function in ATTENTIONS.values():
    AttentionInterface.register(_name, _function)


@contextlib.contextmanager
def attention_implementation(module: torch.nn.Module, name: str):
    """`module` runs attention implementation `name` (an ATTENTIONS entry's registered name) inside the block, its
    config's own restored after: a check or a timing of one module leaves the model as the lowering set it."""
    before = module.config._attn_implementation
    module.config._attn_implementation = name
    try:
        yield
    finally:
        module.config._attn_implementation = before
