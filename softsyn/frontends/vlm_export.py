"""The torch side of a vision-language composite (softsyn.frontends.vlm): the three modules its blocks are exported
from, Qwen3-VL's vision tower at a fixed grid, the embedding with its merge of image features (and DeepStack's), the
text decoder with a KV cache, and their export with torch.onnx.export(dynamo=True)."""
from __future__ import annotations

import onnx_ir as ir
import torch
import torch.nn.functional as F
from torch.export import Dim
from transformers import Qwen3VLForConditionalGeneration
from transformers.cache_utils import DynamicCache
from transformers.vision_utils import get_vision_interpolation_indices_and_weights, get_vision_position_ids

from softsyn.frontends import export as _export
from softsyn.frontends.hf_common import building


def parameter_count(cfg, source: str) -> int:
    """Parameters of the Qwen3-VL model `cfg` describes, counted on the meta device (nothing allocated)."""
    with building(source), torch.device("meta"):
        return sum(p.numel() for p in Qwen3VLForConditionalGeneration(cfg).parameters())


def build_model(cfg, source: str, *, weights: str, dtype: str):
    """The Qwen3-VL model to export: seeded random weights (seed 0), or on the meta device for a weightless plan."""
    torch.manual_seed(0)
    with building(source), (torch.device("meta") if weights == "meta" else torch.device("cpu")):
        return Qwen3VLForConditionalGeneration(cfg).to(getattr(torch, dtype)).eval()


def grid_constants(visual, grid) -> dict[str, torch.Tensor]:
    """The vision tower's constants at one grid, on the CPU (from the config: a model on the meta device has none),
    by the name of the buffer (and of the exported initializer) that holds each: the position table's resampling
    indices and weights, the rotary cos and sin of every patch."""
    grid_thw = torch.tensor([grid.thw])
    idx, weights = get_vision_interpolation_indices_and_weights(
        grid_thw, num_grid_per_side=visual.num_grid_per_side, mode=visual.interpolation_mode,
        align_corners=visual.interpolation_align_corners, spatial_merge_size=visual.spatial_merge_size)
    positions = get_vision_position_ids(grid_thw, visual.spatial_merge_size)
    rope = visual.rotary_pos_emb
    inv_freq, scale = type(rope).compute_axial_rope_parameters(visual.config)
    angles = positions[..., None].float() * inv_freq
    cos, sin = (rope.recomposition_frequencies(f * scale) for f in (angles.cos(), angles.sin()))
    return {"interp_indices": idx, "interp_weights": weights, "rope_cos": cos.float(), "rope_sin": sin.float()}


def _vision_module(visual, grid):
    """Qwen3-VL's vision tower at one fixed grid, `images` images of it per call."""
    hidden = visual.config.hidden_size
    device = next(visual.parameters()).device
    constants = {k: t.to(device) for k, t in grid_constants(visual, grid).items()}

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    class Vision(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m
            for key, value in constants.items():
                self.register_buffer(key, value, persistent=False)

        def forward(self, pixel_values):
            m, patches = self.m, grid.patches
            x = m.patch_embed(pixel_values).view(-1, patches, hidden)
            x = x + (m.pos_embed(self.interp_indices) * self.interp_weights[:, :, None]).sum(1).to(x.dtype)
            cos, sin = self.rope_cos[None, None], self.rope_sin[None, None]
            deepstack = []
            for layer, blk in enumerate(m.blocks):
                heads = blk.attn.num_heads
                qkv = blk.attn.qkv(blk.norm1(x)).view(-1, patches, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
                q, k, v = qkv[0], qkv[1], qkv[2]
                q = (q.float() * cos + rotate_half(q.float()) * sin).to(v.dtype)
                k = (k.float() * cos + rotate_half(k.float()) * sin).to(v.dtype)
                a = F.scaled_dot_product_attention(q, k, v, scale=blk.attn.scaling)  # one segment per image
                x = x + blk.attn.proj(a.transpose(1, 2).reshape(-1, patches, hidden))
                x = x + blk.mlp(blk.norm2(x))
                if layer in m.deepstack_visual_indexes:  # DeepStack: this layer's features, merged, for the decoder
                    merger = m.deepstack_merger_list[m.deepstack_visual_indexes.index(layer)]
                    deepstack.append(merger(x.reshape(-1, hidden)))
            features = m.merger(x.reshape(-1, hidden))
            return (features, torch.stack(deepstack)) if deepstack else features

    return Vision(visual).eval()


def _embedding_module(embed_tokens, image_token_id: int, deepstack: int):
    """input_ids + image features (+ DeepStack features [layers, tokens, hidden]) -> inputs_embeds (+ the DeepStack
    features scattered to their prompt positions, zeros elsewhere: [layers, batch, seq, hidden])."""
    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = embed_tokens

    class Embedding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = Holder()

        def forward(self, input_ids, image_features, *deepstack_features):
            text = self.m.embed_tokens(input_ids)
            mask = input_ids == image_token_id
            order = torch.cumsum(mask.reshape(-1).to(torch.int64), 0).reshape(mask.shape) - 1
            # a zero row past the features: text-only prompts (0 features) gather it, never out of range
            rows = torch.cat([image_features.to(text.dtype), torch.zeros_like(text[0, :1])], 0)
            index = torch.where(mask, order, torch.full_like(order, image_features.shape[0]))
            embeds = torch.where(mask[..., None], rows[index], text)
            if not deepstack:
                return embeds
            ds = deepstack_features[0].to(text.dtype)
            ds_rows = torch.cat([ds, torch.zeros_like(ds[:, :1])], 1)
            return embeds, ds_rows[:, index]

    return Embedding().eval()


def _decoder_module(language_model, lm_head, layers: int, deepstack: int):
    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = language_model
            self.lm_head = lm_head

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = Holder()

        def forward(self, inputs_embeds, attention_mask, position_ids, *rest):
            deepstack_embeds, past_kv = (rest[0], rest[1:]) if deepstack else (None, rest)
            cache = DynamicCache(config=self.m.model.config)
            for i in range(len(past_kv) // 2):
                cache.update(past_kv[2 * i], past_kv[2 * i + 1], i)
            kw = {}
            if deepstack:  # the features are already at their positions (zeros elsewhere): the decoder adds them
                kw["deepstack_visual_embeds"] = [deepstack_embeds[i] for i in range(deepstack)]
                self.m.model._deepstack_process = lambda hidden, _mask, embeds: hidden + embeds.to(hidden.dtype)
            try:
                out = self.m.model(inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                   position_ids=position_ids, cache=cache, use_cache=True, **kw)
            finally:
                self.m.model.__dict__.pop("_deepstack_process", None)
            flat = [self.m.lm_head(out.last_hidden_state)]
            for i in range(layers):
                flat += [out.cache.layers[i].keys, out.cache.layers[i].values]
            return tuple(flat)

    return Decoder().eval()


def reference_modules(model, grid) -> dict:
    """The three torch modules the blocks are exported from (tests compare them with transformers' own model)."""
    cfg = model.config
    deepstack = len(cfg.vision_config.deepstack_visual_indexes or [])
    return {"vision": _vision_module(model.model.visual, grid),
            "embedding": _embedding_module(model.model.language_model.embed_tokens, cfg.image_token_id, deepstack),
            "decoder": _decoder_module(model.model.language_model, model.lm_head, cfg.text_config.num_hidden_layers,
                                       deepstack)}


def _export_module(module, args, dynamic_shapes, *, in_names, out_names, name, optimize):
    with _export.quiet(), torch.no_grad():
        prog = torch.onnx.export(module, args, dynamic_shapes=dynamic_shapes, dynamo=True, input_names=in_names,
                                 output_names=out_names, opset_version=_export.OPSET, optimize=optimize,
                                 verbose=False)
    return _export.finish(prog.model, name)


def export_blocks(model, name: str, grid) -> dict[str, ir.Model]:
    """The vision, embedding and decoder blocks as onnx-ir models (example sizes > 1 so no dim is specialised)."""
    cfg = model.config
    text = cfg.text_config
    layers, kv, head_dim = _export.kv_geometry(text)
    device = next(model.parameters()).device
    meta = device.type == "meta"
    dtype = next(model.parameters()).dtype
    mods = reference_modules(model, grid)
    g = torch.Generator().manual_seed(0)

    def example(t):  # example inputs live where the weights do (the meta device for a weightless export)
        return t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)

    v = cfg.vision_config
    pixel_dim = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    images, batch, seq, past = Dim("images"), Dim("batch"), Dim("seq"), Dim("past")
    deepstack = len(v.deepstack_visual_indexes or [])
    ds = ["deepstack_features"] if deepstack else []
    pixels = example(torch.randn(2 * grid.patches, pixel_dim, generator=g))
    out = {"vision": _export_module(mods["vision"], (pixels,), {"pixel_values": {0: images * grid.patches}},
                                    in_names=["pixel_values"], out_names=["image_features"] + ds,
                                    name=f"{name}.vision", optimize=not meta)}
    ids = example(torch.randint(0, text.vocab_size, (2, 5), generator=g))
    tokens = Dim("image_tokens")
    feats = (example(torch.randn(3, text.hidden_size, generator=g)),)
    shapes = {"input_ids": {0: batch, 1: seq}, "image_features": {0: tokens}}
    if deepstack:
        feats += (example(torch.randn(deepstack, 3, text.hidden_size, generator=g)),)
        shapes["deepstack_features"] = ({1: tokens},)
    out["embedding"] = _export_module(mods["embedding"], (ids,) + feats, shapes,
                                      in_names=["input_ids", "image_features"] + ds,
                                      out_names=["inputs_embeds"] + (["deepstack_embeds"] if deepstack else []),
                                      name=f"{name}.embedding", optimize=not meta)
    embeds = example(torch.randn(2, 3, text.hidden_size, generator=g))
    mask = example(torch.ones(2, 7, dtype=torch.long))
    pos = example(torch.arange(4, 7).view(1, 1, 3).expand(3, 2, 3).contiguous())
    past_t = tuple(example(torch.randn(2, kv, 4, head_dim, generator=g)) for _ in range(2 * layers))
    extra = (example(torch.randn(deepstack, 2, 3, text.hidden_size, generator=g)),) if deepstack else ()
    in_names = ["inputs_embeds", "attention_mask", "position_ids"] + (["deepstack_embeds"] if deepstack else []) + [
        f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    out_names = ["logits"] + [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    rest = ({1: batch, 2: seq},) * bool(deepstack) + tuple({0: batch, 2: past} for _ in range(2 * layers))
    out["decoder"] = _export_module(
        mods["decoder"], (embeds, mask, pos) + extra + past_t,
        {"inputs_embeds": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: Dim("total")},
         "position_ids": {1: batch, 2: seq}, "rest": rest},
        in_names=in_names, out_names=out_names, name=f"{name}.decoder", optimize=not meta)
    return out
