"""softsyn's weight kernel compiled for sm_90 on this CPU, its innermost loop read: per shipped config, PTX
instructions a weight, barriers and warp shuffles in the loop body. No GPU: a kernel's static cost before a lease.

Why: a GEMV at qwen3-1.7b's widths read ~0.9 TB/s of the H200's 4.8 (2026-12-06); the loop's instruction count per
weight bounds it from the issue side (at 8.5 a weight, a layer's 50.3M int4 weights are ~13 us of issue over the
H200's 132 SMs, of the 29.8 us measured), and barriers or shuffles inside it serialise its warps.

    python bench/kernel_ptx.py [--precision int4|fp8|int8] [--group 128]

Needs Triton (the test extra); compiles with the installed version (the H200 image's 3.6 may differ from CI's 3.8).
"""
from __future__ import annotations

import argparse
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from softsyn.emit import triton_weights

SM90 = GPUTarget("cuda", 90, 32)
CODES = {"int4": "*u8", "fp8": "*fp8e4nv", "int8": "*i8"}
ALIGNED = ("x_ptr", "w_ptr", "s_ptr", "l_ptr", "y_ptr", "N", "K", "stride_xm", "stride_ym")  # as Inductor marks them


def compile_config(codes: str, group: int, config, gated: bool = False):
    """The weight kernel at `config` (a triton.Config of CONFIGS) with the argument types Inductor gives it."""
    signature = {"x_ptr": "*fp16", "w_ptr": codes, "s_ptr": "*fp16", "l_ptr": "*fp16", "y_ptr": "*fp16",
                 **dict.fromkeys(("M", "N", "K", "stride_xm", "stride_ym"), "i32")}
    constexprs = {"GROUP": group, "BYTE_CODES": codes != "*u8", "GATED": gated, **config.kwargs}
    names = list(signature)
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in ALIGNED}
    source = ASTSource(fn=triton_weights.weight_matmul_kernel, attrs=attrs, constexprs=constexprs,
                       signature={**signature, **dict.fromkeys(constexprs, "constexpr")})
    return triton.compile(source, target=SM90, options={"num_warps": config.num_warps,
                                                         "num_stages": config.num_stages})


def inner_loop(ptx: str) -> str:
    """The innermost loop body: from the block LLVM labels `.lr.ph` to the branch back to it."""
    label = re.search(r"^(\$L__BB\d+_\d+):\s*// %\.lr\.ph$", ptx, re.M)
    if not label:
        raise ValueError("no loop body in the PTX")
    back = re.search(rf"bra\s+{re.escape(label.group(1))};", ptx[label.end():])
    return ptx[label.end():label.end() + back.start()]


def instructions(body: str) -> list[str]:
    return [line.strip() for line in body.splitlines() if line.strip()
            and not line.strip().startswith(("//", "$", ".", "{", "}")) and not line.strip().endswith(":")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=sorted(CODES), default="int4")
    parser.add_argument("--group", type=int, choices=triton_weights.GROUPS, default=128)
    args = parser.parse_args()
    per_byte = 2 if args.precision == "int4" else 1
    print(f"# weight kernel, {args.precision} g{args.group}, sm_90 PTX (Triton {triton.__version__}), innermost loop")
    print("| BLOCK_N | BLOCK_K | warps | X_TILE | weights a thread a step | PTX a weight | bar.sync | shfl |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|")
    for config in triton_weights.CONFIGS:
        body = inner_loop(compile_config(CODES[args.precision], args.group, config).asm["ptx"])
        kw = config.kwargs
        weights = kw["BLOCK_N"] * kw["BLOCK_K"] * per_byte // (config.num_warps * 32)
        print(f"| {kw['BLOCK_N']} | {kw['BLOCK_K']} | {config.num_warps} | {kw.get('X_TILE', False)} | {weights} | "
              f"{len(instructions(body)) / weights:.1f} | {body.count('bar.sync')} | {body.count('shfl')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
