"""Logits error of qwen3-1.7b (seeded weights, fp16-rounded, computed in fp32 on the CPU) with every projection and
the lm_head int4, quantised by the old min-to-max rule and by softsyn's least-squares fit (triton_weights.fit_int4),
at the groups of the h200-torch int4 compile's map (q/k/v, o, down g32; gate/up, lm_head g128): rel err (max|x -
ref| / max|ref|) and cosine of the last position's logits for three 513-token random prompts. --fold: each decoder
layer's input and post-attention RMSNorm weights folded into the q/k/v and gate/up weights before they are quantised
(softsyn.emit.torch_norms.fold_norms' rule, what h200-torch's fused norms quantise), the reference left unfolded.

    python bench/int4_fit_error.py     # ~16 min on 2 cores, ~14 GB of memory; one line per rule
    python bench/int4_fit_error.py --model qwen3-0.6b --rules fit --fold   # fit with and without folding, ~6 min
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from softsyn.emit import triton_weights  # noqa: E402 - after the repository root is on the path
from softsyn.frontends import source_torch_model  # noqa: E402

PROMPTS, LENGTH = 3, 513


def group(name: str) -> int:
    """The group the compile's map gave the layer (its MatMulNBits cell's block, as the lowering takes it)."""
    return 128 if ("gate_proj" in name or "up_proj" in name or name == "lm_head") else 32


def min_to_max(w: torch.Tensor, g: int) -> torch.Tensor:
    """The old rule: each group's min and max the grid's ends, scale and low stored in fp16."""
    x = w.float().reshape(w.shape[0], -1, g)
    low = x.amin(-1, keepdim=True).half().float()
    scale = ((x.amax(-1, keepdim=True) - low) / 15).clamp(min=1e-8).half().float()
    return (((x - low) / scale).round().clamp(0, 15) * scale + low).reshape(w.shape)


def fitted(w: torch.Tensor, g: int) -> torch.Tensor:
    q = triton_weights.quantise(w.float(), g, torch.float16)
    return triton_weights.dequantise(q.packed, q.scales.float(), q.lows.float())


RULES = {"min-max": min_to_max, "fit": fitted, "none": lambda w, g: w}  # none: fp16 weights (folding's own rounding)
FOLDED = (("input_layernorm", ("q_proj", "k_proj", "v_proj")), ("post_attention_layernorm", ("gate_proj", "up_proj")))


def folded(model: torch.nn.Module, original: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`original` (fp16 weights by Linear name) with each layer's norm weights folded into the Linears it feeds
    (W * g[None, :], rounded to fp16 as the target stores it); the norms set to 1 in `model`."""
    out = dict(original)
    for name, layer in model.named_modules():
        for norm_name, linears in FOLDED:
            norm = getattr(layer, norm_name, None)
            if norm is None or not hasattr(layer, "self_attn"):
                continue
            g = norm.weight.detach().float().clone()
            for n in out:
                if n.startswith(f"{name}.") and n.rsplit(".", 1)[-1] in linears:
                    out[n] = (original[n].float() * g[None, :]).half()
            norm.weight.data.fill_(1.0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-1.7b", help="a zoo decoder (qwen3-1.7b)")
    parser.add_argument("--rules", default="min-max,fit", help=f"of {', '.join(RULES)}")
    parser.add_argument("--fold", action="store_true", help="each rule again with the norms folded in first")
    parser.add_argument("--prompts", type=int, default=PROMPTS, help=f"random prompts ({PROMPTS})")
    parser.add_argument("--seed", type=int, default=0, help="the prompts' seed (0)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    t0 = time.time()
    model = source_torch_model(f"zoo:{args.model}").eval()
    # the lm_head its own weight: quantising it must leave the embedding (dont_touch in the constraints) as it was
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone(), requires_grad=False)
    model.to(torch.float16).to(torch.float32)  # the fp16 weights the target quantises, computed in fp32
    print("built", round(time.time() - t0), flush=True)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    original = {n: m.weight.detach().clone().half() for n, m in linears.items()}
    generator = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(0, model.config.vocab_size, (1, LENGTH), generator=generator)
               for _ in range(args.prompts)]

    def logits() -> list[torch.Tensor]:
        with torch.no_grad():
            return [model(input_ids=p).logits[0, -1].float() for p in prompts]

    reference = logits()
    print("ref", round(time.time() - t0), flush=True)
    runs = [(name, False) for name in args.rules.split(",")] + [(name, True) for name in args.rules.split(",")
                                                                  if args.fold]
    folds = {}  # the folded weights, once (folding sets the norms to 1)
    for name, fold in runs:
        if fold and not folds:
            folds.update(folded(model, original))
        weights = folds if fold else original
        for n, m in linears.items():
            m.weight.data.copy_(RULES[name](weights[n], group(n)))
        got = logits()
        errors = [((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, reference)]
        cosines = [torch.nn.functional.cosine_similarity(a, b, dim=0).item() for a, b in zip(got, reference)]
        print(name + " folded" * fold, "rel err", [round(e, 4) for e in errors], "cos", [round(c, 4) for c in cosines],
              round(time.time() - t0), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
