"""Weight error of the fp8 (e4m3, block 128) quantiser against ORT's int8 / int4 one (block 32): the ratio behind
passes.optimize.sensitivity.PRIOR_ERROR["fp8"].

    python bench/fp8_error.py [--k 1024] [--n 1024]

Quantises seeded weights [k, n] (normal, and Student-t with 4 degrees of freedom for heavier tails) with
mapping.quantise_fp8 and mapping.quantise_weight, dequantises them (the ops' formulas) and prints each precision's
RMS error relative to the weights' RMS, and the fp8 / int8 ratio. A matmul's output error follows the weight error
(the rows are sums of weight x activation), so the ratio carries the measured int8 prior over to fp8.
"""
from __future__ import annotations

import argparse

import numpy as np

from passes.optimize.mapping import BLOCK, fp8_blocks, fp8_dequantised, quantise_weight


def nbits_dequantised(weight: np.ndarray, bits: int) -> np.ndarray:
    """ORT's blockwise symmetric quantiser's weight [k, n], dequantised (MatMulNBits' zero point 2^(bits-1))."""
    from onnx import numpy_helper

    _, inits = quantise_weight("w", weight, bits)
    packed, scales = (numpy_helper.to_array(t) for t in inits)
    n, kb, _ = packed.shape
    if bits == 4:
        codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, kb, BLOCK)
    else:
        codes = packed.reshape(n, kb, BLOCK)
    values = (codes.astype(np.float32) - 2 ** (bits - 1)) * scales.reshape(n, kb, 1).astype(np.float32)
    return values.reshape(n, kb * BLOCK)[:, :weight.shape[0]].T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--n", type=int, default=1024)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    draws = {"normal": rng.standard_normal((args.k, args.n)), "student-t(4)": rng.standard_t(4, (args.k, args.n))}
    for label, w in draws.items():
        w = (w * 0.02).astype(np.float32)
        rms = float(np.sqrt(np.mean(w ** 2)))
        q, s = fp8_blocks(w.T)
        errors = {"fp8": fp8_dequantised(q, s).T - w}
        for bits in (8, 4):
            errors[f"int{bits}"] = nbits_dequantised(w, bits) - w
        rel = {p: float(np.sqrt(np.mean(e ** 2))) / rms for p, e in errors.items()}
        print(f"{label:13s} " + "  ".join(f"{p} {r:.2e}" for p, r in rel.items())
              + f"  fp8/int8 {rel['fp8'] / rel['int8']:.2f}  int4/int8 {rel['int4'] / rel['int8']:.2f}")


if __name__ == "__main__":
    main()
