"""softsyn's attention prologue (softsyn.emit.triton_prologue): the kernel in Triton's interpreter and the op's torch
form, each against transformers' own norm and rotary, the cache written at the step's slots only, q in
softsyn::decode_attention's stacked layout."""
from __future__ import annotations

import torch


def expected(qkv, q_weight, k_weight, cos, sin, heads, kv_heads, eps):
    """(q, k, v) [B, heads, S, D] in fp32 from transformers' Qwen3 functions (the RMS norm's formula in fp32,
    apply_rotary_pos_emb), never from the module under test."""
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    batch, seq, _ = qkv.shape
    x = qkv.float().reshape(batch, seq, heads + 2 * kv_heads, -1).transpose(1, 2)
    q, k, v = x.split([heads, kv_heads, kv_heads], dim=1)

    def norm(t, w):
        return t if w is None else t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w.float()

    q, k = apply_rotary_pos_emb(norm(q, q_weight), norm(k, k_weight), cos.float(), sin.float())
    return q, k, v


def errors(dtype, norm: bool, seq: int, dim: int, heads=6, kv_heads=2, batch=2, slots=11) -> dict:
    """The op's q, keys and values written against `expected` (relative to its largest value), q read head by head
    at the row the stacked layout puts it; and whether every other slot kept its value."""
    from softsyn.emit.triton_prologue import attention_prologue

    g = torch.Generator().manual_seed(seq * dim + norm)
    qkv = torch.randn(batch, seq, (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
    weights = [(1 + 0.3 * torch.randn(dim, generator=g)).to(dtype) if norm else None for _ in range(2)]
    # three positions: one batch row of angles for both (transformers' rotary of a [1, S] position_ids)
    angle = torch.randn(1 if seq > 1 else batch, seq, dim // 2, generator=g).repeat(1, 1, 2) * 3
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    keys, values = (torch.randn(batch, kv_heads, slots, dim, generator=g).to(dtype) for _ in range(2))
    where = torch.tensor([7, 2, 9][:seq])  # unordered, apart: each position its own slot
    before_k, before_v = keys.clone(), values.clone()
    got = attention_prologue(qkv, *weights, cos, sin, keys, values, where, 1e-6)
    q, k, v = expected(qkv, *weights, cos, sin, heads, kv_heads, 1e-6)
    rep = heads // kv_heads
    assert got.shape == (batch, kv_heads, rep * seq, dim) and got.dtype == dtype, got.shape
    q_err = max(float((got[b, h // rep, (h % rep) * seq + s].float() - q[b, h, s]).abs().max())
                for b in range(batch) for h in range(heads) for s in range(seq)) / float(q.abs().max())
    others = [i for i in range(slots) if i not in where.tolist()]
    untouched = bool(torch.equal(keys[:, :, others], before_k[:, :, others])
                     and torch.equal(values[:, :, others], before_v[:, :, others]))
    k_err = float((keys[:, :, where].float() - k).abs().max() / k.abs().max())
    v_err = float((values[:, :, where].float() - v).abs().max() / v.abs().max())
    return {"q": q_err, "k": k_err, "v": v_err, "untouched": untouched}


def all_errors() -> dict:
    return {f"{dtype} norm{norm} seq{seq} d{dim}": errors(dtype, norm, seq, dim)
            for dtype in (torch.float32, torch.float16) for norm in (True, False) for seq in (1, 3) for dim in (64, 128)}


def check_errors(errors: dict) -> None:
    assert len(errors) == 16
    for key, err in errors.items():
        assert err.pop("untouched"), key  # every slot but the step's, keys and values, as it was
        for name, value in err.items():
            assert value < (2e-3 if "float16" in key else 1e-5), (key, name, value)


def test_the_prologue_kernel_computes_norm_rotary_and_the_cache_write_in_triton_s_interpreter():
    """qk-norm on (Qwen3) and off (Llama), 2 batch rows, one position and three (written at unordered slots), 3
    query heads a KV head, head dims 64 and 128, fp32 and fp16: q rotated in the stacked layout, the step's keys
    rotated and its values as they were written at its slots, every other slot untouched."""
    from helpers import in_triton_interpreter

    check_errors(in_triton_interpreter("import json\nfrom tests.emit.test_triton_prologue import all_errors\n"
                                       "print(json.dumps(all_errors()))"))


def test_the_op_s_torch_form_computes_the_same_function(monkeypatch):
    """Outside Triton's interpreter on the CPU (and without Triton: the CPU-only install) the op runs its torch form:
    the same checks."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    check_errors(all_errors())


def test_the_op_is_exported_as_one_call_that_mutates_the_cache():
    """torch.export keeps the op whole (what AOTInductor compiles into the package; no index_copy), functionalised
    with the cache as the inputs it mutates, and the exported program writes the caller's cache in place at the
    step's slots only."""
    from softsyn.emit.triton_prologue import attention_prologue

    class Step(torch.nn.Module):
        def forward(self, qkv, w, cos, sin, keys, values, where):
            return attention_prologue(qkv, w, w, cos, sin, keys, values, where, 1e-6)

    g = torch.Generator().manual_seed(0)
    args = (torch.randn(1, 2, 4 * 32, generator=g), torch.ones(32), torch.ones(1, 2, 32), torch.zeros(1, 2, 32),
            torch.zeros(1, 1, 6, 32), torch.zeros(1, 1, 6, 32), torch.tensor([1, 4]))
    program = torch.export.export(Step(), args, strict=False)
    calls = [n for n in program.graph.nodes if "attention_prologue" in str(n.target)]
    assert len(calls) == 1 and not any("index_copy" in str(n.target) for n in program.graph.nodes)
    functional = program.run_decompositions()
    assert sorted(functional.graph_signature.user_inputs_to_mutate.values()) == ["keys", "values"]
    keys, values = torch.zeros(1, 1, 6, 32), torch.zeros(1, 1, 6, 32)
    program.module()(*args[:4], keys, values, args[6])
    assert torch.equal(values[0, 0, [1, 4]], args[0][0, :, 3 * 32:])  # cos 1, sin 0: the values as they came
    assert float(values[0, 0, [0, 2, 3, 5]].abs().max()) == 0 and float(keys[0, 0, [0, 2, 3, 5]].abs().max()) == 0
    assert float(keys[0, 0, [1, 4]].abs().max()) > 0
