"""softsyn's Triton kernels compiled for the H100/H200 (sm_90) on this CPU, with the argument types Inductor gives a
user-defined kernel inside a package (a Python float as fp64, sizes and strides as i32): a kernel Triton's
interpreter runs can still fail to compile. The attention kernel's first GPU run did (H100, 2026-12-06: the fp64
`scale` made its loop-carried max fp64), which cost a device lease to find. This is Triton 3.8 (the test extra's);
the H200 image's torch 2.11 brings 3.6, so a version's own quirks can still pass here."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
from softsyn.emit import triton_attention, triton_prologue, triton_weights  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
# bench/: kernels compiled for sm_90 with Inductor's argument types (asserting a cubin), the loop body of a PTX
from kernel_ptx import compile_config, compiled, cuobjdump, inner_loop, instructions, registers, sass_loop  # noqa: E402

I32 = "i32"


def test_the_decode_attention_kernels_compile_for_sm90():
    """Every config, with the combine folded in and without; the folded form counts with an acquire-release atomic at
    GPU scope, after a barrier, reads the parts past L1 (other SMs wrote them in the same launch), and holds no more
    registers a thread than the unfolded kernel (its merge reads the parts 16 at a time: a whole [64, 128] fp32 tile
    raised the kernel from 168 to 190 registers, so from three programs an SM to two)."""
    ints = dict.fromkeys(("batch", "rows", "seq", "slots", "stride_kb", "stride_kh", "stride_ks", "stride_vb",
                          "stride_vh", "stride_vs", "stride_mb", "stride_mq"), I32)
    attend = {"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "mask_ptr": "*i1", "o_ptr": "*fp32",
              "ml_ptr": "*fp32", "out_ptr": "*fp16", "count_ptr": "*i32", **ints, "scale": "fp64"}
    for config in triton_attention.CONFIGS:
        counts = []
        for fold in (False, True):
            kernel = compiled(triton_attention.attend_kernel, attend,
                              {"SPLITS": triton_attention.SPLITS, "RP": triton_attention.ROWS, "D": 128,
                               "FOLD": fold, **config.kwargs})
            ptx = kernel.asm["ptx"]
            assert ("atom.global.gpu.acq_rel.add" in ptx) == fold and ("ld.global.cg" in ptx) == fold
            counts.append(registers(kernel.asm["cubin"]))
        assert counts[1] <= counts[0], (config, counts)
    # q typed fp32 beside an fp16 cache, as AOTInductor typed it in qwen3-1.7b's package (H100, 2026-12-06)
    assert compiled(triton_attention.attend_kernel, {**attend, "q_ptr": "*fp32"},
                    {"SPLITS": triton_attention.SPLITS, "RP": triton_attention.ROWS, "D": 128, "FOLD": True,
                     **triton_attention.CONFIGS[0].kwargs})
    combine = {"o_ptr": "*fp32", "ml_ptr": "*fp32", "out_ptr": "*fp16", "batch": I32, "rows": I32, "seq": I32}
    assert compiled(triton_attention.combine_kernel, combine,
                    {"SPLITS": triton_attention.SPLITS, "RP": triton_attention.ROWS, "D": 128})


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("at_slots", [False, True])  # the step's rows (attention_prologue), the cache (attention_step)
def test_the_attention_prologue_kernel_compiles_for_sm90_with_its_norm_in_fp32(norm, at_slots):
    """With and without the q/k norms (Qwen3, Llama), q typed fp32 beside an fp16 cache (as AOTInductor typed the
    attention kernel's q) and `eps` fp64: no fp64 arithmetic past the one convert of eps (the norm stays fp32)."""
    ints = dict.fromkeys(("batch", "seq", "heads", "kv_heads", "stride_cb", "stride_cs", "stride_sb", "stride_ss",
                          "stride_kb", "stride_kh", "stride_ks", "stride_vb", "stride_vh", "stride_vs"), I32)
    signature = {"qkv_ptr": "*fp16", "qw_ptr": "*fp16", "kw_ptr": "*fp16", "cos_ptr": "*fp16", "sin_ptr": "*fp16",
                 "k_ptr": "*fp16", "v_ptr": "*fp16", "where_ptr": "*i64" if at_slots else "*fp16", "q_ptr": "*fp32",
                 "count_ptr": "*i32" if at_slots else "*fp32", **ints, "eps": "fp64"}
    for half in (32, 64):  # head dims 64 and 128
        kernel = compiled(triton_prologue.prologue_kernel, signature,
                          {"Q_NORM": norm, "K_NORM": norm, "HALF": half, "ROWS": triton_prologue.ROWS,
                           "AT_SLOTS": at_slots, "COUNTS": at_slots})
        f64 = [line for line in kernel.asm["ptx"].splitlines() if "f64" in line and ".param" not in line]
        assert ["cvt.rn.f32.f64" in line for line in f64] == ([True] if norm else []), f64  # eps to fp32, once
        assert ("rsqrt" in kernel.asm["ptx"]) == norm


@pytest.mark.parametrize("codes", ["*u8", "*fp8e4nv", "*i8"])  # int4's bytes, fp8 and int8 codes
def test_the_weight_kernel_compiles_for_sm90_at_every_shipped_config_with_16_byte_loads(codes):
    """Every shipped one-row config at every group (and the gated epilogue at the smallest), as Inductor launches it at qwen3's widths (aligned buffers, K and
    N multiples of 16): the codes load 16 bytes a thread (a scalar byte load a weight is what an unproven alignment
    gives, and a GEMV's speed is its loads), and integer codes become floats with no int-to-float convert (a quarter
    of the FMA rate: small_ints), and an X_TILE config's loop holds at most 4 barriers and no more than the same
    config without it (the activations moved into the codes' layout through shared memory:
    softsyn.emit.triton_weights.CONFIGS)."""
    for group in triton_weights.GROUPS:
        for config in triton_weights.CONFIGS:
            for gated in (False, True) if group == triton_weights.GROUPS[0] else (False,):  # + the gated epilogue
                kernel = compile_config(codes, group, config, gated)
                assert "ld.global.v4.b32" in kernel.asm["ptx"], (group, config, gated)
                if codes != "*fp8e4nv":  # integer codes become floats by small_ints' exponent trick, no converts
                    assert not re.search(r"cvt\.rn\.f32\.[su]\d+", kernel.asm["ptx"]), (group, config, gated)
                if config.kwargs["X_TILE"]:  # the activations reach the codes' layout without shared memory
                    twin = compile_config(codes, group, triton.Config({**config.kwargs, "X_TILE": False, "F16": False},
                                                                      num_warps=config.num_warps,
                                                                      num_stages=config.num_stages), gated)
                    bars, twin_bars = (inner_loop(k.asm["ptx"]).count("bar.sync") for k in (kernel, twin))
                    assert bars <= 4 and bars <= twin_bars, (group, config, gated, bars, twin_bars)


@pytest.mark.parametrize("gated", [False, True])
def test_the_fp16_dequantising_configs_hold_fewer_registers_than_x_tile_s_and_no_barrier_in_their_loop(gated):
    """Every shipped F16 config at int4 g128 (qwen3's int4 layers), plain and gated: no bar.sync in the loop, and
    fewer registers a thread than the same config in the form it replaces (X_TILE's fp32 codes and activations), the
    registers being what caps the threads, so the bytes of codes in flight, an SM holds (bench/kernel_ptx.py)."""
    shipped = [config for config in triton_weights.CONFIGS if config.kwargs.get("F16")]
    assert shipped
    for config in shipped:
        kernel = compile_config("*u8", 128, config, gated)
        twin = compile_config("*u8", 128, triton.Config({**config.kwargs, "F16": False}, num_warps=config.num_warps,
                                                        num_stages=config.num_stages), gated)
        assert inner_loop(kernel.asm["ptx"]).count("bar.sync") == 0, (config, gated)
        assert "fma.rn.f16x2" in kernel.asm["ptx"], (config, gated)  # the products are fp16, two a register
        regs, twin_regs = registers(kernel.asm["cubin"]), registers(twin.asm["cubin"])
        assert regs < twin_regs, (config, gated, regs, twin_regs)



@pytest.mark.parametrize("gated", [False, True])
def test_the_inline_ptx_form_compiles_with_no_loop_barrier_and_far_fewer_instructions_a_weight_than_f16(gated):
    """ASM's twin of every F16 config (softsyn.emit.triton_weights.ASM_CONFIGS) at int4 g128, plain and gated: ptxas
    takes its inline PTX (a syntax or register error fails here), its loop holds no bar.sync and loads the codes 16
    bytes a thread, and it issues at most 0.65 of F16's instructions at the same config, in PTX and in SASS (4.3-4.6
    PTX and 3.9-4.0 SASS a weight to F16's 8.6-8.7 and 7.3-7.5, Triton 3.8, 2026-12-06): the lever on an int4 GEMV
    the issue rate bounds. At groups 32 and 64 it compiles too."""
    assert triton_weights.ASM_CONFIGS
    for config in triton_weights.ASM_CONFIGS:
        kernel = compile_config("*u8", 128, config, gated)
        twin = compile_config("*u8", 128, triton.Config({**config.kwargs, "ASM": False}, num_warps=config.num_warps,
                                                        num_stages=config.num_stages), gated)
        body, twin_body = inner_loop(kernel.asm["ptx"]), inner_loop(twin.asm["ptx"])
        assert "bar.sync" not in body and "lop3.b32" in body and "ld.global.v4.b32" in body, (config, gated)
        ptx, twin_ptx = len(instructions(body)), len(instructions(twin_body))  # the same weights a step
        sass, twin_sass = len(sass_loop(kernel.asm["cubin"])), len(sass_loop(twin.asm["cubin"]))
        assert ptx <= 0.65 * twin_ptx and sass <= 0.65 * twin_sass, (config, gated, ptx, twin_ptx, sass, twin_sass)
    for group in (32, 64):
        for config in triton_weights.ASM_CONFIGS:
            assert "lop3.b32" in inner_loop(compile_config("*u8", group, config, gated).asm["ptx"]), (group, config)


@pytest.mark.parametrize("codes", ["*u8", "*fp8e4nv"])  # int4's bytes (ASM's configs), fp8's (the byte configs)
def test_the_weight_kernel_compiles_its_norm_and_residual_for_sm90_without_spills_or_fp64(codes):
    """NORM with RESIDUAL (q/k/v, o and down's forms) and NORM gated (gate/up's) at every tuned config of the
    precision, group 128 and 32: the codes still load 16 bytes a thread, the norm's rsqrt is there and stays fp32
    (`eps` typed fp64 as Inductor types a Python float: one convert), and no register spills to local memory (the
    squares of x the loop keeps lane by lane and the residual's load hold registers beside the dots)."""
    configs = triton_weights.INT4_CONFIGS if codes == "*u8" else triton_weights.BYTE_CONFIGS
    for group in (128, 32):
        for config in configs:
            for gated, residual in ((False, True), (True, False)):
                kernel = compile_config(codes, group, config, gated, norm=True, residual=residual)
                ptx = kernel.asm["ptx"]
                assert "ld.global.v4.b32" in ptx and "rsqrt" in ptx, (group, config, gated)
                f64 = [line for line in ptx.splitlines() if "f64" in line and ".param" not in line]
                assert all("cvt.rn.f32.f64" in line for line in f64) and len(f64) <= 1, f64
                sass = cuobjdump(kernel.asm["cubin"], "-sass")
                assert not re.search(r"\b(STL|LDL)\b", sass), (group, config, gated, "spills")


@pytest.mark.parametrize("codes", ["*u8", "*fp8e4nv"])
def test_the_norm_costs_the_weight_kernel_few_registers_and_no_loop_reduction(codes):
    """NORM (plain and gated) at every tuned config, group 128, against the same config without it: the loop carries
    the row's squares as one partial sum a thread (chunk_squares), so a normed kernel holds at most 1.3x the
    registers a thread of the plain one (a [BLOCK_K x 2] tile of squares held 126 against 64, and 167 gated, which
    cap the programs an SM holds: the normed GEMVs' 0.864 ms against 0.729, H100 2026-12-07) and its loop adds no
    barrier and no shuffle (no cross-thread reduction a step)."""
    configs = triton_weights.INT4_CONFIGS if codes == "*u8" else triton_weights.BYTE_CONFIGS
    for config in configs:
        for gated in (False, True):
            plain = compile_config(codes, 128, config, gated)
            normed = compile_config(codes, 128, config, gated, norm=True)
            regs, plain_regs = registers(normed.asm["cubin"]), registers(plain.asm["cubin"])
            assert regs <= 1.3 * plain_regs, (config, gated, regs, plain_regs)
            loop, plain_loop = inner_loop(normed.asm["ptx"]), inner_loop(plain.asm["ptx"])
            for op in ("bar.sync", "shfl"):
                assert loop.count(op) == plain_loop.count(op), (config, gated, op)
