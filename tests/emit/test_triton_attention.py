"""softsyn's split decode attention (softsyn.emit.triton_attention): the kernel in Triton's interpreter against the
torch function, the splits' combination, and the attention form that calls it at decode only."""
from __future__ import annotations


import torch

from softsyn.emit.triton_attention import combine
from softsyn.emit.torch_step import ATTENTIONS, matmul_attention, softsyn_attention
from helpers import in_triton_interpreter

ATTENTION_CHECK = r"""
import json, torch
from softsyn.emit.triton_attention import decode_attention, reference
torch.manual_seed(0)
out = {}
for dtype in (torch.float32, torch.float16):
    for batch, kv_heads, rows, dim, cache, slots in ((1, 2, 2, 32, 80, 5), (2, 1, 3, 64, 400, 300),
                                                      (1, 2, 4, 32, 2100, 2049)):
        q = torch.randn(batch, kv_heads, rows, dim).to(dtype)
        k_cache, v_cache = torch.randn(2, batch, kv_heads, cache, dim).to(dtype)
        k, v = k_cache[:, :, :slots], v_cache[:, :, :slots]  # views of a longer cache, as the step reads it
        positions = torch.arange(slots)
        mask = torch.stack([positions <= slots - 1 - 3 * b for b in range(batch)])  # each row its own prefix
        if batch > 1:
            mask[1] &= positions > 40  # a sliding window: slots before it hidden
        got = decode_attention(q, k, v, mask, dim ** -0.5).float()
        want = reference(q.float(), k.float(), v.float(), mask, dim ** -0.5)
        out[f"{dtype} b{batch} h{kv_heads} r{rows} d{dim} s{slots}"] = float((got - want).abs().max() / want.abs().max())
print(json.dumps(out))
"""


def test_the_split_kernel_computes_masked_attention_in_triton_s_interpreter():
    """Every case against the torch function: short caches (most of the 32 splits empty), spans that end inside a
    block and a split, query heads a KV head that are not a power of two (3: rows padded to the 16-row tile), two
    batch rows with different masks (a prefix and a sliding window), the cache read as a view of a longer buffer; fp32
    and fp16 operands."""
    errors = in_triton_interpreter(ATTENTION_CHECK)
    assert len(errors) == 6
    for key, err in errors.items():
        assert err < (5e-3 if "float16" in key else 1e-5), (key, err)


def test_splits_combine_into_one_softmax_and_an_empty_split_weighs_nothing():
    """Two halves of the slots, each normalised by its own max, combine to the softmax over all; a third split with
    no visible slot (max -inf, sum 0) changes nothing."""
    torch.manual_seed(2)
    scores, values = torch.randn(1, 10), torch.randn(10, 4)
    halves = []
    for part in (slice(0, 6), slice(6, 10)):
        top = scores[:, part].max(-1).values
        weights = torch.exp(scores[:, part] - top[:, None])
        halves.append((weights @ values[part], torch.stack([top, weights.sum(-1)], -1)))
    halves.append((torch.zeros(1, 4), torch.tensor([[float("-inf"), 0.0]])))
    out = torch.stack([h[0] for h in halves])[None]  # [BH 1, splits 3, R 1, D 4]
    ml = torch.stack([h[1] for h in halves])[None]  # [BH 1, splits 3, R 1, (max, sum)]
    torch.testing.assert_close(combine(out, ml)[0], torch.softmax(scores, -1) @ values)


def test_the_softsyn_form_is_the_kernel_at_decode_and_the_matmul_form_otherwise():
    """At one query position the form calls softsyn::decode_attention (exported into the graph AOTInductor compiles)
    and computes what the matmul form does; a prompt (4 positions) takes the matmul form."""
    assert ATTENTIONS["softsyn"][1] is softsyn_attention
    torch.manual_seed(3)
    key, value = torch.randn(2, 1, 2, 24, 64)
    mask = (torch.arange(24)[None, None, :] <= torch.tensor([[20]])[:, :, None])[:, None]  # [1, 1, 1, 24]
    query = torch.randn(1, 4, 1, 64)
    got, _ = softsyn_attention(None, query, key, value, mask, 0.125)
    want, _ = matmul_attention(None, query, key, value, mask, 0.125)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    class Step(torch.nn.Module):
        def forward(self, q, k, v, m):
            return softsyn_attention(None, q, k, v, m, 0.125)[0]

    program = torch.export.export(Step(), (query, key, value, mask), strict=False)
    assert any("softsyn.decode_attention" in str(node.target) for node in program.graph.nodes)
    prompt = torch.randn(1, 4, 4, 64)
    prompt_mask = (torch.arange(24)[None, None, :] <= torch.arange(17, 21)[None, :, None])[:, None]
    got, _ = softsyn_attention(None, prompt, key, value, prompt_mask, 0.125)
    want, _ = matmul_attention(None, prompt, key, value, prompt_mask, 0.125)
    torch.testing.assert_close(got, want)
