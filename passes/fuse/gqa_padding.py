"""GroupQueryAttention without a KV cache under a padding mask: the model's own additive mask as attention_bias.

A plain decoder export (one forward of input_ids and attention_mask, no past) builds its mask in the graph:
causal AND key padding, added to the scores. GQA's seqlens_k can only say how many keys of each row are valid
from the left (right padding); a left-padded batch — what batched generation feeds — would attend to its pad
keys. So on ORT CPU the node gets seqlens_k = T - 1 for every row and the site's additive mask as attention_bias.
Where a query row has no open key (a left pad position) the two spellings of "blocked" differ, and GQA follows
each (measured on ORT 1.31 CPU): a -inf mask (torch's SDPA spelling, whose NaN guard zeroes such a row) keeps
GQA causal, which gives the row zeros (causal=0 would give NaN), and is checked to block every non-causal entry
on padded probe rows, so causal AND the mask is the mask; a finite mask (dtype min: transformers 5's masks in the
GPT-2, Phi-3, Mistral and Qwen2 exports) makes GQA causal=0, the mask alone, which averages such a row over every
key exactly as the export's Softmax does (causal would average the causal keys only). ORT CUDA's GQA refuses attention_bias ("not supported
in GroupQueryAttention cuda kernel"): there the node keeps the right-padding reading, and the rule's note says so.
"""
from __future__ import annotations

import numpy as np

BLOCKED = -1e4  # an additive mask entry at or below this blocks its key (torch: -inf; HF eager: dtype min)


def uses_bias(ctx, site) -> bool:
    """Whether GQA takes the site's additive mask as attention_bias: no cache, a mask input, the CPU target."""
    return site.past_k is None and site.mask_input is not None and site.bias is not None and ctx.target == "cpu"


def check_bias(ctx, site) -> str | int:
    """GQA's `causal` attribute for the site's additive mask [B, 1|N, S, T] (1: -inf entries, which must block
    every non-causal key also on padded rows — left: key 0 of row 0, right: the last key of the last row; 0:
    finite entries, the mask alone), or why GQA cannot take the mask."""
    b = site.bias
    probe = ctx.probe()
    if isinstance(probe, str):
        return probe
    arrays = dict(probe.arrays)
    pm = np.array(arrays[site.mask_input.name])
    if pm.ndim != 2:
        return f"mask input {site.mask_input.name} is not 2-D [B, T] (shape {pm.shape})"
    pm[0, 0] = 0
    pm[-1, -1] = 0
    arrays[site.mask_input.name] = pm
    try:
        (m,) = ctx.run_probe([b], arrays=arrays)
        (unpadded,) = ctx.run_probe([b])
    except Exception as exc:
        return f"could not evaluate the attention mask {b.name} on padded rows: {exc}"
    m = np.asarray(m, dtype=np.float64)
    if m.ndim != 4 or m.shape[1] not in (1, site.num_heads):
        return (f"attention mask {b.name} is {m.shape} on the probe, not [B, 1|{site.num_heads}, S, T] as GQA's "
                "attention_bias is")
    if not (np.isneginf(m).any() or np.isneginf(unpadded).any()):
        return 0
    s, t = m.shape[-2:]
    causal = np.arange(t)[None, :] <= (t - s + np.arange(s))[:, None]
    if not (m[..., ~causal] <= BLOCKED).all():
        return (f"attention mask {b.name} opens a non-causal key on padded rows (probe mask {pm.tolist()}): GQA, "
                "causal under a -inf mask, would block it")
    return 1


def bias_input(inputs: list, site) -> list:
    """GQA's inputs 0-6 extended to input 10, attention_bias = the site's additive mask."""
    return list(inputs) + [None, None, None, site.bias]


def note(ctx, sites: int) -> str:
    if not sites:
        return ""
    if ctx.target == "cpu":
        return (f"{sites} GroupQueryAttention without a KV cache take the model's padding mask as attention_bias "
                "(left and right padding as the export computes them)")
    return (f"{sites} GroupQueryAttention without a KV cache read the padding mask as right padding (seqlens_k): "
            "ORT CUDA's GroupQueryAttention takes no attention_bias, so a left-padded batch is not what they compute")

