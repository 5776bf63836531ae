"""A Qwen3-Next-shaped tiny model (hybrid Gated DeltaNet + gated attention + MoE) exported, read and compiled.

    python bench/qwen3_next_tiny.py --work /tmp/qwen3-next          # here (CPU); ~10 min export on 2 loaded cores

transformers' qwen3_next classes with a tiny config (4 layers: linear, full, linear, full; 4 experts top-2 plus the
shared expert), exported as `torch.onnx.export(model, (input_ids,), dynamo=True, optimize=False)` without a KV cache
(the hybrid cache holds conv and recurrent states, not past K/V), checked against torch on ORT CPU, then
`softsyn compile FILE -c constraints/guide-short.yaml --target h200-ort-cuda`; prints the fusion report.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEQ = 16
CONFIG = dict(vocab_size=1024, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=32, intermediate_size=256, moe_intermediate_size=64, shared_expert_intermediate_size=64,
              num_experts=4, num_experts_per_tok=2, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4, max_position_embeddings=4096,
              full_attention_interval=2, use_cache=False)


def export(path: Path) -> float:
    """Export to `path`; returns the max |ORT - torch| of the logits at SEQ tokens."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, Qwen3NextConfig

    from softsyn.runtime.session import open_model

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3NextConfig(**CONFIG), dtype=torch.float32,
                                             experts_implementation="batched_mm").eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, use_cache=False).logits

    ids = torch.randint(0, CONFIG["vocab_size"], (1, SEQ))
    dims = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")},)
    # optimize=False: onnxscript's optimizer ran > 15 min on this graph without finishing (2026-12-01)
    prog = torch.onnx.export(Logits(model).eval(), (ids,), dynamo=True, dynamic_shapes=dims, optimize=False,
                             input_names=["input_ids"], output_names=["logits"])
    prog.save(str(path))
    sess = open_model(path, "cpu")
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits.numpy()
    return float(np.abs(sess.run(None, {"input_ids": ids.numpy()})[0] - ref).max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/softsyn-qwen3-next"))
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    onnx_path = args.work / "qwen3-next-tiny.onnx"
    t0 = time.perf_counter()
    err = export(onnx_path)
    print(f"exported in {time.perf_counter() - t0:.0f} s; max |ORT - torch| logits at seq {SEQ}: {err:.2e}")
    out = args.work / "out"
    proc = subprocess.run([sys.executable, "-m", "softsyn.cli", "compile", str(onnx_path), "-c",
                           str(ROOT / "constraints" / "guide-short.yaml"), "--target", "h200-ort-cuda", "-o", str(out),
                           "-q"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        print(proc.stderr[-2000:], file=sys.stderr)
        return 3
    print((out / "compile.log").read_text())
    print((out / "reports" / "fusion.rpt").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
