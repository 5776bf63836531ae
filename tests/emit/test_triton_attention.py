"""softsyn's split decode attention (softsyn.emit.triton_attention): the kernel in Triton's interpreter against the
torch function, the splits' combination, and the attention form that calls it at decode only."""
from __future__ import annotations


import torch

from softsyn.emit.torch_attention_forms import ATTENTIONS, matmul_attention, softsyn_attention
from helpers import in_triton_interpreter

ATTENTION_CHECK = r"""
import json, torch
import softsyn.emit.triton_attention as kernels
from softsyn.emit.triton_attention import decode_attention, reference
kernels.SPLITS = 16  # the interpreter runs every program in turn: fewer, and still most of them empty at 5 slots
empty = torch.empty
def poisoned(*args, **kwargs):  # the kernels' buffers start as NaN: a part merged that no program wrote shows
    made = empty(*args, **kwargs)
    return made.fill_(float("nan")) if made.is_floating_point() else made
torch.empty = poisoned
torch.manual_seed(0)
out = {}
for dtype in (torch.float32, torch.float16):
    for batch, kv_heads, heads, seq, dim, cache, slots in ((1, 2, 2, 1, 32, 80, 5), (2, 1, 3, 1, 64, 400, 300),
                                                            (1, 2, 4, 1, 32, 2100, 2049), (2, 2, 3, 7, 32, 300, 130)):
        q = torch.randn(batch, kv_heads, heads * seq, dim).to(dtype)  # row r * seq + s: head r at position s
        k_cache, v_cache = torch.randn(2, batch, kv_heads, cache, dim).to(dtype)
        k, v = k_cache[:, :, :slots], v_cache[:, :, :slots]  # views of a longer cache, as the step reads it
        last = torch.tensor([slots - 1 - 3 * b for b in range(batch)])  # each batch row its own prefix
        position = last[:, None] - seq + 1 + torch.arange(seq)  # [B, seq]: the step's positions, causal within it
        mask = torch.arange(slots)[None, None, :] <= position[:, :, None]  # [B, seq, S]
        if batch > 1:
            mask[1] &= torch.arange(slots) > 40  # a sliding window: slots before it hidden
        got = decode_attention(q, k, v, mask, dim ** -0.5).float()
        want = reference(q.float(), k.float(), v.float(), mask, dim ** -0.5)
        key = f"{dtype} b{batch} h{kv_heads}x{heads} seq{seq} d{dim} s{slots}"
        out[key] = float((got - want).abs().max() / want.abs().max())
        # the combine folded into the split kernel; it must leave its counters zero, the state the next launch
        # starts from (so a second launch would repeat this one: not run, the interpreter's time is the suite's)
        counts = torch.zeros(kv_heads, dtype=torch.int32)
        folded = kernels.launch(q, k, v, mask, dim ** -0.5, counts).float()
        out[f"{key} folded"] = float((folded - want).abs().max() / want.abs().max())
        out[f"{key} counts left"] = int(counts.abs().sum())
print(json.dumps(out))
"""


def test_the_split_kernel_computes_masked_attention_in_triton_s_interpreter():
    """Every case against the torch function: short caches (most of the splits empty), spans that end inside a
    block and a split, query heads a KV head that are not a power of two (3: rows padded to the 16-row tile), two
    batch rows with different masks (a prefix and a sliding window), several positions a step (7 x 3 heads: 21 rows,
    two row tiles, each row its own causal mask), the cache read as a view of a longer buffer; fp32 and fp16; the
    kernels' buffers start as NaN, so a merge that reads a part no split wrote (past the span: not stored) fails. The
    folded form (the combine in the split kernel's last program) the same, its counters left zero for the next
    launch."""
    errors = in_triton_interpreter(ATTENTION_CHECK)
    assert len(errors) == 8 * 3
    assert all(errors.pop(key) == 0 for key in list(errors) if key.endswith("counts left"))
    for key, err in errors.items():
        assert err < (5e-3 if "float16" in key else 1e-5), (key, err)


def test_the_softsyn_form_calls_the_kernel_and_computes_the_matmul_form_s_function():
    """At one query position and at several (a package's step is exported with them dynamic) the form calls
    softsyn::decode_attention (exported into the graph AOTInductor compiles) and computes what the matmul form does,
    query heads stacked per KV head in the matmul form's order."""
    assert ATTENTIONS["softsyn"][1] is softsyn_attention
    torch.manual_seed(3)
    key, value = torch.randn(2, 1, 2, 24, 64)
    for last, seq in ((20, 1), (20, 4)):
        positions = torch.arange(last - seq + 1, last + 1)[None]
        mask = (torch.arange(24)[None, None, :] <= positions[:, :, None])[:, None]  # [1, 1, seq, 24]
        query = torch.randn(1, 4, seq, 64)
        got, _ = softsyn_attention(None, query, key, value, mask, 0.125)
        want, _ = matmul_attention(None, query, key, value, mask, 0.125)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    class Step(torch.nn.Module):
        def forward(self, q, k, v, m):
            return softsyn_attention(None, q, k, v, m, 0.125)[0]

    program = torch.export.export(Step(), (query, key, value, mask), strict=False)
    assert any("softsyn.decode_attention" in str(node.target) for node in program.graph.nodes)


def test_a_step_exported_with_the_softsyn_form_holds_the_op_in_every_layer_and_computes_the_logits():
    """qwen3-tiny's step exported as a package's is (positions dynamic): each layer's attention is
    softsyn::decode_attention in the graph, and the program's logits for a 4-token prompt are the float model's."""
    from tests.emit.test_torch_lowering import exported_step, packed_tiny

    model, want = packed_tiny()
    model.set_attn_implementation(ATTENTIONS["softsyn"][0])
    program, got = exported_step(model)
    calls = sum("softsyn.decode_attention" in str(node.target) for node in program.graph.nodes)
    assert calls == model.config.num_hidden_layers
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
