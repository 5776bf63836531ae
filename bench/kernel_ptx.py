"""softsyn's weight kernel compiled for sm_90 on this CPU, its innermost loop read: per shipped config, PTX
instructions a weight, barriers and warp shuffles in the loop body, registers a thread, the threads an SM can hold at
that count and the bytes of codes those threads have in flight; SASS a weight beside PTX (what issues). No GPU: a
kernel's static cost before a lease.

Why: a GEMV at qwen3-1.7b's widths read ~0.9 TB/s of the H200's 4.8 (2026-12-06). A one-row GEMV's speed is the bytes
its resident threads keep in flight, which its registers cap (65536 a Hopper SM; 2048 threads at most), and its
instruction count a weight bounds it from the issue side; barriers or shuffles inside the loop serialise its warps.

    python bench/kernel_ptx.py [--precision int4|fp8|int8] [--group 128]

Needs Triton (the test extra); compiles with the installed version (the H200 image's 3.6 may differ from CI's 3.8).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from softsyn.emit import triton_weights

SM90 = GPUTarget("cuda", 90, 32)
SM_REGISTERS, SM_THREADS, SM_PROGRAMS = 65536, 2048, 32  # a Hopper SM's register file, thread and block limits
REGISTER_UNIT = 256  # a warp's registers are allocated in units of 256 (8 a thread)
CODES = {"int4": "*u8", "fp8": "*fp8e4nv", "int8": "*i8"}
ALIGNED = ("x_ptr", "w_ptr", "s_ptr", "l_ptr", "y_ptr", "N", "K", "stride_xm", "stride_ym", "r_ptr")  # as Inductor marks them


def compiled(fn, signature: dict, constexprs: dict, aligned: tuple = (), options: dict | None = None):
    """`fn` compiled for sm_90 with `signature`'s argument types; `aligned`: the arguments Inductor marks divisible by
    16 (pointers of aligned buffers, sizes and strides that are multiples of 16), which decides whether loads
    vectorise."""
    names = list(signature)
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    kernel = triton.compile(ASTSource(fn=fn, signature={**signature, **dict.fromkeys(constexprs, "constexpr")},
                                      constexprs=constexprs, attrs=attrs), target=SM90, options=options)
    assert kernel.asm["cubin"], f"{fn.__name__}: no cubin"
    return kernel


def compile_config(codes: str, group: int, config, gated: bool = False, norm: bool = False, residual: bool = False):
    """The weight kernel at `config` (a triton.Config of CONFIGS) with the argument types Inductor gives it (`eps`, a
    Python float, as fp64); `norm`, `residual`: its NORM and RESIDUAL constexprs."""
    signature = {"x_ptr": "*fp16", "w_ptr": codes, "s_ptr": "*fp16", "l_ptr": "*fp16", "y_ptr": "*fp16",
                 **dict.fromkeys(("M", "N", "K", "stride_xm", "stride_ym"), "i32"), "r_ptr": "*fp16", "eps": "fp64"}
    # every constexpr named (ASTSource takes no defaults); TWIN (the interpreter's twin of ASM) never compiles
    constexprs = {"GROUP": group, "BYTE_CODES": codes != "*u8", "GATED": gated, "X_TILE": False, "F16": False,
                  "ASM": False, **config.kwargs, "TWIN": False, "NORM": norm, "RESIDUAL": residual}
    return compiled(triton_weights.weight_matmul_kernel, signature, constexprs, ALIGNED,
                    {"num_warps": config.num_warps, "num_stages": config.num_stages})


def inner_loop(ptx: str) -> str:
    """The innermost loop body: from the block LLVM labels `.lr.ph` to the branch back to it."""
    label = re.search(r"^(\$L__BB\d+_\d+):\s*// %\.lr\.ph$", ptx, re.M)
    if not label:
        raise ValueError("no loop body in the PTX")
    back = re.search(rf"bra\s+{re.escape(label.group(1))};", ptx[label.end():])
    return ptx[label.end():label.end() + back.start()]


def cuobjdump(cubin: bytes, flag: str) -> str:
    """cuobjdump's `flag` output for a cubin (the tool ships in Triton's NVIDIA backend)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout


def registers(cubin: bytes) -> int:
    """Registers a thread of the compiled kernel."""
    return int(re.search(r"REG:(\d+)", cuobjdump(cubin, "--dump-resource-usage")).group(1))


def sass_loop(cubin: bytes) -> list[str]:
    """The innermost loop's SASS instructions (what the schedulers issue; PTX counts dead moves ptxas drops): the
    shortest span from a backward branch's target to the branch."""
    sass = [(int(m.group(1), 16), m.group(2)) for m in
            re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", cuobjdump(cubin, "-sass"))]
    spans = [[text for at, text in sass if int(m.group(1), 16) <= at <= where] for where, branch in sass
             if (m := re.search(r"BRA\s+0x([0-9a-f]+)", branch)) and int(m.group(1), 16) < where]
    return min(spans, key=len)


def resident_threads(regs: int, warps: int) -> int:
    """Threads an SM holds of a kernel at `regs` registers a thread and `warps` a program, whole programs only: the
    register file (a warp's share rounded up to REGISTER_UNIT), 2048 threads, 32 programs; shared memory not counted
    (the one-row configs use at most a few KB)."""
    warp_regs = -(-regs * 32 // REGISTER_UNIT) * REGISTER_UNIT
    programs = min(SM_REGISTERS // warp_regs // warps, SM_THREADS // (warps * 32), SM_PROGRAMS)
    return programs * warps * 32


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
    print("| BLOCK_N | BLOCK_K | warps | X_TILE | F16 | ASM | weights a thread a step | PTX a weight | SASS a weight "
          "| bar.sync | shfl | registers | threads an SM by registers (est) | bytes in flight an SM (est) |")
    print("|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    # the shipped configs, then ASM's twins of the F16 ones (int4's tuned configs: softsyn.emit.triton_weights.ASM_CONFIGS)
    for config in triton_weights.CONFIGS + triton_weights.ASM_CONFIGS:
        kernel = compile_config(CODES[args.precision], args.group, config)
        body = inner_loop(kernel.asm["ptx"])
        kw, threads = config.kwargs, config.num_warps * 32
        weights = kw["BLOCK_N"] * kw["BLOCK_K"] * per_byte // threads
        regs = registers(kernel.asm["cubin"])
        resident = resident_threads(regs, config.num_warps)
        # a step's code loads are all issued before their first use (no loop-carried loads), so a thread's step is
        # what it has in flight: an estimate, which ignores rows shorter than BLOCK_K (masked loads issue nothing)
        in_flight = resident * weights // per_byte
        print(f"| {kw['BLOCK_N']} | {kw['BLOCK_K']} | {config.num_warps} | {kw.get('X_TILE', False)} | "
              f"{kw.get('F16', False)} | {kw.get('ASM', False)} | {weights} | "
              f"{len(instructions(body)) / weights:.1f} | "
              f"{len(sass_loop(kernel.asm['cubin'])) / weights:.1f} | {body.count('bar.sync')} | {body.count('shfl')} "
              f"| {regs} | {resident} | {in_flight / 1024:.1f} KB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
