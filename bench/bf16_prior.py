"""The bf16 cell's error prior (passes.optimize.sensitivity.PRIOR_ERROR["bf16"]): bf16 against int8 on one MatMul.

    python bench/bf16_prior.py

For 4 shapes (K x N of Qwen3 projections) and two weight laws (normal, Student-t with 4 degrees of freedom: heavier
tails, as trained weights have), 16 rows of normal activations: the output error, verify's max|y' - y| / max|y|,
of int8 (ONNX Runtime's default blockwise symmetric scheme, block 32 along K, emulated in numpy) and of bf16 (the
weight, the input and the product each rounded to bf16, the product summed in fp32 as cuBLAS sums a bf16 GEMM).
Prints each ratio bf16 / int8 and their median and largest: the prior is the int8 prior times the largest, rounded
up (2026-12-03: median 0.52, largest 0.75 -> 1.4e-3 x 0.75 = 1.05e-3 -> 1.1e-3). Seconds on a CPU, numpy and
ml_dtypes only.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

SHAPES = ((1024, 1024), (1024, 3072), (2048, 6144), (4096, 4096))


def bf16(a: np.ndarray) -> np.ndarray:
    return a.astype(ml_dtypes.bfloat16).astype(np.float32)


def int8_blockwise(w: np.ndarray, block: int = 32) -> np.ndarray:
    """W [K, N] through symmetric int8 with one scale per `block` values along K (amax / 127), dequantised."""
    k, n = w.shape
    blocks = w.T.reshape(n, k // block, block)
    scale = np.abs(blocks).max(axis=2, keepdims=True) / 127
    return (np.round(blocks / scale) * scale).reshape(n, k).T


def main() -> None:
    rng = np.random.default_rng(0)
    ratios = []
    for k, n in SHAPES:
        for law in ("normal", "student-t"):
            x = rng.standard_normal((16, k)).astype(np.float32)
            w = (rng.standard_normal((k, n)) if law == "normal" else rng.standard_t(4, (k, n))).astype(np.float32)
            w *= 0.02
            y = x @ w
            top = np.abs(y).max()
            e8 = np.abs(x @ int8_blockwise(w) - y).max() / top
            eb = np.abs(bf16(bf16(x) @ bf16(w)) - y).max() / top
            ratios.append(eb / e8)
            print(f"{k:5d} x {n:5d} {law:9s}  int8 {e8:.2e}  bf16 {eb:.2e}  bf16/int8 {eb / e8:.2f}")
    print(f"bf16/int8: median {np.median(ratios):.2f}, largest {max(ratios):.2f}")


if __name__ == "__main__":
    main()
