"""Plain ONNX files of the architectures users bring, built on the fly: tiny random-weight transformers models
exported with `torch.onnx.export(dynamo=True)` and dynamic dims, as a user would (the exporter names the dims
`s0`, `s1`, ...). Not softsyn's own export: no KV cache, no renamed ports, the exporter's defaults."""
from __future__ import annotations

from pathlib import Path

FAMILIES = {  # name -> (transformers config class, kwargs, model class, inputs: "tokens" | "image")
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=512), "GPT2LMHeadModel",
             "tokens"),
    "bert": ("BertConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                vocab_size=512, max_position_embeddings=128), "BertModel", "tokens"),
    "vit": ("ViTConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                              image_size=32, patch_size=8, num_channels=3), "ViTModel", "image"),
    "phi3": ("Phi3Config", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                intermediate_size=128, vocab_size=512, max_position_embeddings=128,
                                pad_token_id=0), "Phi3ForCausalLM", "tokens"),
    "mistral": ("MistralConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, vocab_size=512,
                                      max_position_embeddings=128, head_dim=16), "MistralForCausalLM", "tokens"),
    "qwen2": ("Qwen2Config", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  intermediate_size=128, vocab_size=512, max_position_embeddings=128),
              "Qwen2ForCausalLM", "tokens"),
    "llama": ("LlamaConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  intermediate_size=128, vocab_size=512, max_position_embeddings=128,
                                  head_dim=16), "LlamaForCausalLM", "tokens"),
    # sliding window 8 (the tests run 13- and 24-token sequences past it), Gemma 2's attention soft cap. (Gemma 3's
    # plain export is not here: without a cache its K is rotated per head, [B, N, S, H], which the no-KV K walk
    # does not take; with softsyn's cache it fuses: tests/passes/fuse/test_sliding_window.py)
    "gemma2": ("Gemma2Config", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                    head_dim=16, intermediate_size=128, vocab_size=512, max_position_embeddings=128,
                                    sliding_window=8, query_pre_attn_scalar=16, attn_logit_softcapping=0.05),
               "Gemma2ForCausalLM", "tokens"),
}
DECODERS = ("gpt2", "phi3", "mistral", "qwen2", "llama", "gemma2")
OTHERS = {  # encoders whose attention or activation has a form of its own; not in FAMILIES' fused-everywhere guards
    # disentangled attention: c2p/p2c position scores; share_att_key: every layer projects the relative embeddings
    "deberta": ("DebertaV2Config", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=128, vocab_size=512, max_position_embeddings=128,
                                        relative_attention=True, position_buckets=32, max_relative_positions=64,
                                        pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=True,
                                        position_biased_input=False), "DebertaV2Model", "tokens"),
    # quick_gelu: x * sigmoid(1.702 x)
    "clip": ("CLIPVisionConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=128, image_size=32, patch_size=8, num_channels=3),
             "CLIPVisionModel", "image"),
}


def export_family(name: str, folder: Path, mask: bool = False) -> Path:
    """`folder/NAME.onnx`: the family's tiny model (seed 0), exported once per folder. `mask`: a token model
    exported as model(input_ids, attention_mask) (`NAME-mask.onnx`), each input's dims Dim.DYNAMIC, as a user
    writes it (the exporter then names the mask's dims apart from the ids')."""
    import torch
    import transformers

    path = folder / f"{name}{'-mask' if mask else ''}.onnx"
    if path.exists():
        return path
    cfg_cls, kwargs, model_cls, inputs = FAMILIES[name] if name in FAMILIES else OTHERS[name]
    cfg = getattr(transformers, cfg_cls)(**kwargs)
    cfg.use_cache = False  # one forward, no cache in or out: the plain file a user exports
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    dyn, extra = torch.export.Dim.DYNAMIC, {}
    if inputs == "image":
        args = (torch.randn(1, 3, kwargs["image_size"], kwargs["image_size"]),)
        dynamic = ({0: dyn},)
    else:
        args = (torch.randint(0, kwargs["vocab_size"], (2, 16)),)
        dynamic = ({0: dyn, 1: dyn},)
    if mask:
        extra = {"attention_mask": torch.ones(2, 16, dtype=torch.int64)}
        dynamic = {"input_ids": {0: dyn, 1: dyn}, "attention_mask": {0: dyn, 1: dyn}}
    folder.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(model, args, str(path), kwargs=extra, dynamo=True, dynamic_shapes=dynamic,
                          external_data=False)
    return path
