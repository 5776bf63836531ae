"""The torch targets' step on sliding-window and soft-capped attention (Gemma-2/3): StaticStep gives each layer type
its own mask (a sliding layer sees the last `sliding_window` slots) and the attention forms soft-cap the scores, so
the step over softsyn's static cache computes what transformers computes with its own cache and masks. Eager, on
the CPU: the exported package runs the same module."""
from __future__ import annotations

import pytest
import torch

from softsyn.emit.torch_attention_forms import ATTENTIONS
from softsyn.emit.torch_step import StaticStep
from softsyn.frontends import source_torch_model

SPAN = 128  # slots the step reads: past the tiny zoo entries' 64-token window


@pytest.mark.parametrize("name", ["gemma2-tiny", "gemma3-tiny"])
@pytest.mark.parametrize("attention", ["matmul", "sdpa", "by_seq"])
def test_the_step_computes_transformers_logits_past_the_window(name, attention, cache_dir):
    model = source_torch_model(f"zoo:{name}", cache_dir).float().eval()
    config = model.config
    assert "sliding_attention" in config.layer_types and config.sliding_window < 100
    for layer in model.model.layers:  # a cap the seeded scores reach, so the test sees whether it is applied
        if getattr(layer.self_attn, "attn_logit_softcapping", None):
            layer.self_attn.attn_logit_softcapping = 0.05
    ids = torch.randint(0, config.vocab_size, (1, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model(input_ids=ids).logits  # transformers' own masks and attention (eager)
        model.set_attn_implementation(ATTENTIONS[attention][0])
        step = StaticStep(model, 256).eval()
        heads, dim = config.num_key_value_heads, config.head_dim
        kv = [torch.zeros(1, heads, 256, dim) for _ in range(2 * config.num_hidden_layers)]
        slots = torch.arange(SPAN)
        prefill = step(ids[:, :96], torch.arange(96)[None], slots, *kv)  # the prompt, then four decode steps
        decodes = [step(ids[:, p:p + 1], torch.tensor([[p]]), slots, *kv) for p in range(96, 100)]
    got = torch.cat([prefill, *decodes], dim=1)
    assert step.window == config.sliding_window
    torch.testing.assert_close(got, reference, rtol=2e-4, atol=2e-4)
