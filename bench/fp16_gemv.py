"""A prototype fp16 decode GEMV on the tensor cores, for bench/torch_kernels.py's chains (not used by softsyn yet).

Why: cuBLAS reads qwen3-1.7b's decode GEMVs at 1.3-2.8 TB/s of the H100's 3.35 (cold chains, 2026-12-06), about 49 us
a layer where the bytes need ~30, and a kernel of our own could also take a gated MLP's activation as an epilogue
(softsyn.emit.triton_weights does for int4/int8/fp8). The row of x is padded to 16 (a tensor-core tile's least M), so
the products and their fp32 sums need no converts; the loads feed the dot, so Triton pipelines them (num_stages).
A program owns BLOCK_N outputs and reads their whole rows. Checked in Triton's interpreter against torch
(`python bench/fp16_gemv.py`, TRITON_INTERPRET=1 on the CPU) and compiled for sm_90 there; its speed is the next
lease's question (docs/decisions/2026-12-06-triton-int4.md, "If small_ints is not enough").
"""
from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

ROWS = 16  # x's rows padded to a tensor-core tile: decode's batch x positions must be at most this


@triton.jit
def fp16_gemv_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_ym, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[M, N] = x[M, K] @ w[N, K]^T for M <= 16: program j owns outputs j * BLOCK_N.., K in BLOCK_K steps."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm, rk = tl.arange(0, 16), tl.arange(0, BLOCK_K)
    rows = w_ptr + rn.to(tl.int64)[:, None] * K
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * stride_xm + ks[None, :], mask=(rm[:, None] < M) & (ks[None, :] < K),
                    other=0.0)
        w = tl.load(rows + ks[None, :], mask=(rn[:, None] < N) & (ks[None, :] < K), other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


CONFIGS = [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
           for n, k, w, s in ((16, 128, 4, 4), (16, 256, 4, 3), (32, 128, 4, 4), (32, 256, 4, 3), (64, 128, 4, 3),
                              (16, 512, 4, 2))]
tuned = triton.autotune(configs=CONFIGS, key=["M", "N", "K"])(fp16_gemv_kernel)


def gemv(x: torch.Tensor, weight: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T with at most ROWS rows: autotuned on CUDA, at `config` (or the first) elsewhere."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    rows, width, out = flat.shape[0], flat.shape[1], weight.shape[0]
    if rows > ROWS:
        raise ValueError(f"{rows} rows: the prototype takes at most {ROWS}")
    y = torch.empty((rows, out), device=x.device, dtype=x.dtype)
    args = (flat, weight, y, rows, out, width, flat.stride(0), out)
    if x.device.type == "cuda" and config is None:
        tuned[lambda meta: (triton.cdiv(out, meta["BLOCK_N"]),)](*args)
    else:
        config = config or CONFIGS[0].kwargs
        fp16_gemv_kernel[(triton.cdiv(out, config["BLOCK_N"]),)](*args, **config)
    return y.reshape(*x.shape[:-1], out)


def main() -> int:
    """Interpreter check (CPU, TRITON_INTERPRET=1): the kernel against torch at shapes that do not fill a tile."""
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        print("run with TRITON_INTERPRET=1 on a machine without CUDA", file=sys.stderr)
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    worst = 0.0
    for rows, width, out in ((1, 96, 40), (3, 320, 72), (16, 256, 33)):
        x = torch.randn(rows, width, device=device).half()
        w = (torch.randn(out, width, device=device) / width ** 0.5).half()
        want = x.float() @ w.float().t()
        for config in ({"BLOCK_N": 16, "BLOCK_K": 128}, {"BLOCK_N": 32, "BLOCK_K": 64}):
            got = gemv(x, w, config).float()
            worst = max(worst, float((got - want).abs().max() / want.abs().max()))
    print(f"fp16_gemv: worst relative error {worst:.1e} against torch")
    return 0 if worst < 2e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
