"""softsyn's attention prologue (softsyn.emit.triton_prologue): the kernel in Triton's interpreter and the op's torch
form, each against transformers' own norm and rotary: q in softsyn::decode_attention's stacked layout, the step's
key and value rows returned (the caller writes them into its cache)."""
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


def errors(dtype, norm: bool, seq: int, dim: int, heads=6, kv_heads=2, batch=2) -> dict:
    """The op's q, key rows and value rows against `expected` (relative to its largest value), q read head by head
    at the row the stacked layout puts it; and whether it left qkv as it was (the op mutates nothing)."""
    from softsyn.emit.triton_prologue import attention_prologue

    g = torch.Generator().manual_seed(seq * dim + norm)
    qkv = torch.randn(batch, seq, (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
    weights = [(1 + 0.3 * torch.randn(dim, generator=g)).to(dtype) if norm else None for _ in range(2)]
    # three positions: one batch row of angles for both (transformers' rotary of a [1, S] position_ids)
    angle = torch.randn(1 if seq > 1 else batch, seq, dim // 2, generator=g).repeat(1, 1, 2) * 3
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    before = qkv.clone()
    got, k_rows, v_rows = attention_prologue(qkv, *weights, cos, sin, kv_heads, 1e-6)
    q, k, v = expected(qkv, *weights, cos, sin, heads, kv_heads, 1e-6)
    rep = heads // kv_heads
    assert got.shape == (batch, kv_heads, rep * seq, dim) and got.dtype == dtype, got.shape
    assert k_rows.shape == v_rows.shape == (batch, kv_heads, seq, dim) and k_rows.dtype == v_rows.dtype == dtype
    q_err = max(float((got[b, h // rep, (h % rep) * seq + s].float() - q[b, h, s]).abs().max())
                for b in range(batch) for h in range(heads) for s in range(seq)) / float(q.abs().max())
    k_err = float((k_rows.float() - k).abs().max() / k.abs().max())
    v_err = float((v_rows.float() - v).abs().max() / v.abs().max())
    return {"q": q_err, "k": k_err, "v": v_err, "untouched": bool(torch.equal(qkv, before))}


def all_errors() -> dict:
    return {f"{dtype} norm{norm} seq{seq} d{dim}": errors(dtype, norm, seq, dim)
            for dtype in (torch.float32, torch.float16) for norm in (True, False) for seq in (1, 3) for dim in (64, 128)}


def check_errors(errors: dict) -> None:
    assert len(errors) == 16
    for key, err in errors.items():
        assert err.pop("untouched"), key  # qkv as it was
        for name, value in err.items():
            assert value < (2e-3 if "float16" in key else 1e-5), (key, name, value)


def test_the_prologue_kernel_computes_norm_rotary_and_the_cache_write_in_triton_s_interpreter():
    """qk-norm on (Qwen3) and off (Llama), 2 batch rows, one position and three, 3 query heads a KV head, head dims
    64 and 128, fp32 and fp16: q rotated in the stacked layout, the step's keys rotated and its values as they were,
    its input untouched."""
    from helpers import in_triton_interpreter

    check_errors(in_triton_interpreter("import json\nfrom tests.emit.test_triton_prologue import all_errors\n"
                                       "print(json.dumps(all_errors()))"))


def test_the_op_s_torch_form_computes_the_same_function(monkeypatch):
    """Outside Triton's interpreter on the CPU (and without Triton: the CPU-only install) the op runs its torch form:
    the same checks."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    check_errors(all_errors())


def step_errors() -> dict:
    """softsyn::attention_step (the prologue kernel writing the cache, decode_attention's kernels after it) against
    its parts' torch forms (each checked against transformers' above, or in test_triton_attention): the output, and
    the whole cache after the step (the step's slots written, every stale slot as it was), relative to the largest
    value; fp32 and fp16, one position and three, with and without the q/k norms (with them the combine folded into
    the split kernel, without it its own kernel), 2 batch rows over 16 slots, the span rounded past the step (its
    last slots masked)."""
    from softsyn.emit.triton_attention import reference as attention_reference
    from softsyn.emit.triton_prologue import attention_step, reference

    heads, kv_heads, dim, batch, slots = 6, 2, 64, 2, 16
    out = {}
    for dtype in (torch.float32, torch.float16):
        for seq in (1, 3):
            for norm in (True, False):
                g = torch.Generator().manual_seed(seq + 10 * norm)
                qkv = torch.randn(batch, seq, (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
                weights = [(1 + 0.3 * torch.randn(dim, generator=g)).to(dtype) if norm else None for _ in range(2)]
                angle = torch.randn(1, seq, dim // 2, generator=g).repeat(1, 1, 2) * 3
                cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
                keys, values = (torch.randn(batch, kv_heads, slots, dim, generator=g).to(dtype) for _ in range(2))
                where = torch.arange(5, 5 + seq)
                span = 5 + seq + 3
                mask = (torch.arange(span)[None, None, :] <= where[None, :, None]).expand(batch, seq, span).contiguous()
                q, k_rows, v_rows = reference(qkv, *weights, cos, sin, kv_heads=kv_heads, eps=1e-6)
                k_want, v_want = keys.clone().index_copy_(2, where, k_rows), values.clone().index_copy_(2, where, v_rows)
                want = attention_reference(q, k_want[:, :, :span], v_want[:, :, :span], mask, dim ** -0.5)
                got = attention_step(qkv, *weights, cos, sin, keys, values, where, mask, 1e-6, dim ** -0.5,
                                     fold=norm)

                def rel(a, b):
                    return float((a.float() - b.float()).abs().max() / b.float().abs().max())
                out[f"{dtype} seq{seq} norm{norm}"] = {"out": rel(got, want), "keys": rel(keys, k_want),
                                                       "values": rel(values, v_want), "shape": list(got.shape)}
    return out


def check_step_errors(errors: dict) -> None:
    assert len(errors) == 8
    for key, err in errors.items():
        seq = 3 if "seq3" in key else 1
        assert err.pop("shape") == [2, seq, 6, 64], key  # [B, S, H, D]: where o_proj reads it
        for name, value in err.items():
            assert value < (3e-3 if "float16" in key else 1e-5), (key, name, value)


def test_the_attention_step_writes_the_cache_and_attends_in_triton_s_interpreter():
    from helpers import in_triton_interpreter

    # 16 splits a KV head, not 64: the interpreter runs every program in turn, and at 16 slots most are empty
    check_step_errors(in_triton_interpreter("import json\nimport softsyn.emit.triton_attention as kernels\n"
                                            "kernels.SPLITS = 16\n"
                                            "from tests.emit.test_triton_prologue import step_errors\n"
                                            "print(json.dumps(step_errors()))"))


def test_the_attention_step_s_torch_form_writes_the_same_cache(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    check_step_errors(step_errors())


def test_the_attention_step_is_exported_as_one_call_mutating_the_cache():
    """torch.export keeps softsyn::attention_step whole, taking the caller's keys and values (the op's declared
    mutation: nothing after it reads them, so Inductor can write them in place), and the exported step writes them
    at the step's slots only."""
    from softsyn.emit.triton_prologue import attention_step

    class Step(torch.nn.Module):
        def forward(self, qkv, w, cos, sin, keys, values, where, mask):
            return attention_step(qkv, w, w, cos, sin, keys, values, where, mask, 1e-6, 0.125)

    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[[True, True, False, False, False, False], [True, True, True, True, True, False]]])
    args = (torch.randn(1, 2, 4 * 32, generator=g), torch.ones(32), torch.ones(1, 2, 32), torch.zeros(1, 2, 32),
            torch.zeros(1, 1, 6, 32), torch.zeros(1, 1, 6, 32), torch.tensor([1, 4]), mask)
    program = torch.export.export(Step(), args, strict=False)
    calls = [n for n in program.graph.nodes if "attention_step" in str(n.target)]
    assert len(calls) == 1 and not any("index_copy" in str(n.target) for n in program.graph.nodes)
    mutated = program.run_decompositions().graph_signature.user_inputs_to_mutate.values()
    assert sorted(mutated) == ["keys", "values"]
    keys, values = torch.zeros(1, 1, 6, 32), torch.zeros(1, 1, 6, 32)
    program.module()(*args[:4], keys, values, *args[6:])
    assert torch.equal(values[0, 0, [1, 4]], args[0][0, :, 3 * 32:])  # cos 1, sin 0: the values as they came
    assert float(values[0, 0, [0, 2, 3, 5]].abs().max()) == 0 and float(keys[0, 0, [0, 2, 3, 5]].abs().max()) == 0


def test_the_op_is_exported_as_one_call_that_mutates_nothing_and_the_step_writes_the_cache_in_place():
    """torch.export keeps the op whole (what AOTInductor compiles into the package), functional (no input it
    mutates: the rows form; softsyn::attention_step is the cache-writing one), and a step that
    writes its rows as the fused attention does (BufferLayer.update's index_copy_) writes the caller's cache in place
    at the step's slots only."""
    from softsyn.emit.torch_step import BufferLayer
    from softsyn.emit.triton_prologue import attention_prologue

    class Step(torch.nn.Module):
        def forward(self, qkv, w, cos, sin, keys, values, where):
            q, k_rows, v_rows = attention_prologue(qkv, w, w, cos, sin, 1, 1e-6)
            return q, BufferLayer(keys, values, where, 6).update(k_rows, v_rows)[0]

    g = torch.Generator().manual_seed(0)
    args = (torch.randn(1, 2, 4 * 32, generator=g), torch.ones(32), torch.ones(1, 2, 32), torch.zeros(1, 2, 32),
            torch.zeros(1, 1, 6, 32), torch.zeros(1, 1, 6, 32), torch.tensor([1, 4]))
    program = torch.export.export(Step(), args, strict=False)
    calls = [n for n in program.graph.nodes if "attention_prologue" in str(n.target)]
    assert len(calls) == 1 and not {"keys", "values"} & {str(a) for a in calls[0].args}
    mutated = program.run_decompositions().graph_signature.user_inputs_to_mutate.values()
    assert sorted(mutated) == ["keys", "values"]  # by the index_copy_ alone: the op's node takes no cache
    keys, values = torch.zeros(1, 1, 6, 32), torch.zeros(1, 1, 6, 32)
    program.module()(*args[:4], keys, values, args[6])
    assert torch.equal(values[0, 0, [1, 4]], args[0][0, :, 3 * 32:])  # cos 1, sin 0: the values as they came
    assert float(values[0, 0, [0, 2, 3, 5]].abs().max()) == 0 and float(keys[0, 0, [0, 2, 3, 5]].abs().max()) == 0
    assert float(keys[0, 0, [1, 4]].abs().max()) > 0
