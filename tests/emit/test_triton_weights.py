"""softsyn's weight-only kernel for the CUDA torch target (softsyn.emit.triton_weights): the packed int4 and fp8
formats, the Triton kernel run in Triton's interpreter on the CPU (both of its paths: one row a program, and
tensor-core tiles), and the lowering's use of it (the compile's int4 and fp8 cells become QuantLinear layers; a
prompt's form computes what the kernel does)."""
from __future__ import annotations

import importlib
import inspect
import warnings

import numpy as np
import pytest
import torch

from softsyn.emit.triton_weights import (FP8_MAX, GROUPS, QuantLinear, dequantise, group_for, misaligned, quantise,
                                        use_prompt_form)
from helpers import in_triton_interpreter


@pytest.mark.parametrize("group", GROUPS)
def test_the_packed_format_holds_each_weight_at_its_nearest_code_and_fits_no_worse_than_min_to_max(group):
    """Each weight's code is the nearest on its group's stored grid (q * scale + low, q in 0..15), and the fitted grids
    (fit_int4: least squares over candidate grids) err less than the group's min-to-max grid, never more per group."""
    torch.manual_seed(0)
    weight = torch.randn(48, 256)
    q = quantise(weight, group, torch.float32)
    assert q.packed.dtype == torch.uint8 and q.packed.shape == (48, 128)
    assert q.scales.shape == q.lows.shape == (48, 256 // group)
    back = dequantise(q.packed, q.scales, q.lows)
    half = group // 2  # byte i of a group: input i in the low nibble, half + i in the high
    assert ((q.packed[:, :half] & 0xF) == ((weight[:, :half] - q.lows[:, :1]) / q.scales[:, :1]).round()
            .clamp(0, 15)).all()
    step = q.scales.repeat_interleave(group, dim=1)  # [N, K]: each weight's group scale
    top = (q.lows + 15 * q.scales).repeat_interleave(group, dim=1)
    inside = (weight >= q.lows.repeat_interleave(group, dim=1)) & (weight <= top)
    assert ((back - weight).abs()[inside] <= step[inside] / 2 + 1e-6).all()  # clipped extremes take an end code
    x = weight.reshape(48, -1, group)
    low = x.amin(-1, keepdim=True)
    scale = (x.amax(-1, keepdim=True) - low) / 15
    min_max = (((x - low) / scale).round().clamp(0, 15) * scale + low - x).pow(2).sum(-1)
    fitted = (back - weight).reshape(48, -1, group).pow(2).sum(-1)
    assert (fitted <= min_max * (1 + 1e-5)).all() and fitted.sum() < 0.9 * min_max.sum()


@pytest.mark.parametrize("precision", ["fp8", "int8"])
@pytest.mark.parametrize("group", GROUPS)
def test_byte_codes_hold_each_weight_to_their_precision_of_its_group_scale(group, precision):
    """fp8 and int8: one code a weight [N, K], w ~ q * scale with the group's largest weight at the largest code
    (e4m3's 448, int8's 127); fp8 within 3 mantissa bits of each weight, int8 within half a step."""
    torch.manual_seed(0)
    weight = torch.randn(48, 256)
    q = quantise(weight, group, torch.float32, precision)
    code_dtype, top = {"fp8": (torch.float8_e4m3fn, FP8_MAX), "int8": (torch.int8, 127.0)}[precision]
    assert q.packed.dtype == code_dtype and q.packed.shape == (48, 256) and q.precision == precision
    assert q.scales.shape == (48, 256 // group) and q.lows.numel() == 0
    back = dequantise(q.packed, q.scales, q.lows)
    step = q.scales.repeat_interleave(group, dim=1)
    assert torch.allclose(step.amax(0) * top, weight.abs().reshape(48, -1, group).amax(-1).repeat_interleave(
        group, dim=1).amax(0))
    bound = weight.abs() / 16 + step * 2 ** -9 if precision == "fp8" else step / 2 + 1e-6  # 3 mantissa bits / rounding
    assert ((back - weight).abs() <= bound).all() and (back - weight).abs().max() > 0


def test_a_precision_the_kernel_does_not_take_is_refused():
    with pytest.raises(ValueError, match="valid precisions are int4, fp8, int8"):
        quantise(torch.randn(4, 64), 32, torch.float32, "int2")


def test_a_group_is_the_largest_the_kernel_takes_at_or_below_the_block():
    assert [group_for(b, 2048) for b in (0, 16, 32, 48, 64, 128, 256)] == [128, None, 32, 32, 64, 128, 128]
    assert group_for(128, 96) == 32 and group_for(0, 100) is None
    with pytest.raises(ValueError, match="valid groups are"):
        quantise(torch.randn(4, 96), 64, torch.float32)


KERNEL_CHECK = r"""
import json, sys, torch
from softsyn.emit.triton_weights import QuantLinear, dequantise, launch, quantise, tuned_configs
torch.manual_seed(0)
out = {}
for dtype, precision in ((torch.float32, "int4"), (torch.float16, "int4"), (torch.float16, "fp8"), (torch.float16, "int8")):
    for group, rows, width, outputs in ((32, 1, 96, 24), (64, 5, 256, 40), (128, 19, 256, 24)):
        w = torch.randn(outputs, width)
        q = quantise(w, group, dtype, precision)
        x = torch.randn(rows, width).to(dtype)
        want = x.float() @ dequantise(q.packed, q.scales, q.lows).float().t()
        for config in ({"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 128}, {"BLOCK_M": 1, "BLOCK_N": 4, "BLOCK_K": 1024},
                       {"BLOCK_M": 1, "BLOCK_N": 4, "BLOCK_K": 256, "X_TILE": True},
                       {"BLOCK_M": 1, "BLOCK_N": 4, "BLOCK_K": 256, "X_TILE": True, "F16": True},
                       {"BLOCK_M": 16, "BLOCK_N": 32}):
            # the one-row path loops over rows in every program: 5 rows cover it, 19 (two row tiles) the tiled path,
            # and the interpreter takes ~8 s for 19 rows of the one-row path at group 128
            take = rows if config["BLOCK_M"] > 1 else min(rows, 5)
            got = launch(x[:take], q.packed, q.scales, q.lows, config).float()
            key = f"{precision} {dtype} g{group} {take}x{width}x{outputs} {sorted(config.items())}"
            out[key] = float((got - want[:take]).abs().max() / want[:take].abs().max())
for precision in ("int4", "fp8"):  # gated: W = [gate; up], silu(gate) * up in the one-row path's epilogue
    w = torch.randn(2 * 12, 256)
    q = quantise(w, 64, torch.float16, precision)
    x = torch.randn(3, 256).to(torch.float16)
    gate, up = (x.float() @ dequantise(q.packed, q.scales, q.lows).float().t()).chunk(2, dim=-1)
    want = torch.nn.functional.silu(gate) * up
    for config in ({"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 128}, {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 128,
                                                                     "X_TILE": True},
                   {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 128, "X_TILE": True, "F16": True},
                   {"BLOCK_M": 16, "BLOCK_N": 32}):
        got = launch(x, q.packed, q.scales, q.lows, config, gated=True).float()
        out[f"gated {precision} float16 {sorted(config.items())}"] = float((got - want).abs().max() / want.abs().max())
    out[f"gated op {precision} float16"] = float((torch.ops.softsyn.gated_weight_matmul(x[None], q.packed, q.scales, q.lows)[0]
                                          .float() - want).abs().max() / want.abs().max())
    for index in range(len(tuned_configs(precision))):  # each tuned config pinned, as a measured compile leaves it
        got = torch.ops.softsyn.gated_weight_matmul(x[None], q.packed, q.scales, q.lows, index)[0].float()
        out[f"gated op {precision} float16 config {index}"] = float((got - want).abs().max() / want.abs().max())
for precision in ("int4", "fp8", "int8"):
    layer = QuantLinear.from_linear(torch.nn.Linear(128, 24), 64, precision)
    x = torch.randn(2, 3, 128)
    want = torch.nn.functional.linear(x, dequantise(layer.packed, layer.scales, layer.lows), layer.bias)
    out[f"QuantLinear {precision}"] = float((layer(x) - want).abs().max() / want.abs().max())
for precision in ("int4", "fp8"):  # each tuned config pinned in the layer (the compile's measured choice)
    layer = QuantLinear.from_linear(torch.nn.Linear(128, 24).half(), 64, precision)
    x = torch.randn(1, 3, 128).half()
    want = torch.nn.functional.linear(x.float(), dequantise(layer.packed, layer.scales, layer.lows).float(),
                                      layer.bias.float())
    for index in range(len(tuned_configs(precision))):
        layer.config = index
        out[f"QuantLinear {precision} float16 config {index}"] = float((layer(x).float() - want).abs().max()
                                                                       / want.abs().max())
print(json.dumps(out))
"""


def test_the_kernel_computes_the_dequantised_matmul_in_triton_s_interpreter():
    """Triton's interpreter runs the kernel's code on CPU tensors: every path (the one-row path over 1-5 rows, its
    loop steps of 128 bytes a row (several steps, groups that do not fill the last) and of 1024 (past every row's
    end), outputs that do not fill a program's, with the activations broadcast or in the codes' layout (X_TILE,
    and F16 with it: int4 in fp16 where the activations are fp16, X_TILE's form elsewhere);
    16-row tensor-core tiles with rows and outputs that do not fill a
    tile), every group size, the gated epilogue (silu(gate) * up of a [gate; up] weight; the tiles' path applies it
    after) and its op, int4
    with fp32 and fp16 activations, fp8 and int8 with fp16, and the op through QuantLinear with a bias (autotuned,
    and at each tuned config pinned: int4's are ASM's), against the product of the dequantised weight."""
    errors = in_triton_interpreter(KERNEL_CHECK)
    assert len(errors) == 87  # + int4's 3 and fp8's 4 tuned configs pinned, in QuantLinear and the gated op
    for key, err in errors.items():
        assert err < (2e-3 if "float16" in key else 1e-5), (key, err)


NORM_CHECK = r"""
import json, torch
from softsyn.emit.triton_weights import dequantise, launch, quantise, silu_gated, tuned_configs
torch.manual_seed(0)
out = {}
for precision in ("int4", "fp8"):
    for gated in (False, True):
        w = torch.randn(36 if gated else 18, 256)
        q = quantise(w, 64, torch.float16, precision)
        x = (torch.randn(3, 256) * 7).half()  # un-normed rows: the kernel's norm must take their rms out
        residual = None if gated else torch.randn(3, 18).half()
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        want = normed @ dequantise(q.packed, q.scales, q.lows).float().t()
        want = silu_gated(want).float() if gated else want + residual.float()
        for config in ({"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 128},
                       {"BLOCK_M": 1, "BLOCK_N": 4, "BLOCK_K": 256, "X_TILE": True, "F16": True},
                       {"BLOCK_M": 16, "BLOCK_N": 32}):
            got = launch(x, q.packed, q.scales, q.lows, config, gated=gated, norm_eps=1e-6, residual=residual)
            out[f"{precision} gated {gated} {sorted(config.items())}"] = float((got.float() - want).abs().max()
                                                                              / want.abs().max())
        for index in range(len(tuned_configs(precision))):  # int4's: ASM's, its twin in the interpreter
            if gated:
                got = torch.ops.softsyn.gated_weight_matmul(x[None], q.packed, q.scales, q.lows, index, 1e-6)[0]
            else:
                got = torch.ops.softsyn.weight_matmul(x[None], q.packed, q.scales, q.lows, index, 1e-6, residual[None])[0]
            out[f"{precision} gated {gated} op config {index}"] = float((got.float() - want).abs().max()
                                                                       / want.abs().max())
print(json.dumps(out))
"""


def test_the_kernel_norms_its_rows_and_adds_the_residual_in_triton_s_interpreter():
    """NORM (x's rows RMS-normed without a weight: the finished sums scaled by 1 / rms) with RESIDUAL (added before
    the store), and NORM gated (gate/up), at int4 and fp8, on the one-row path (fp32 and F16 forms, each tuned
    config through the ops: int4's ASM), and the tiles' path (in torch around the tiles), against the normed input's
    product with the dequantised weight."""
    errors = in_triton_interpreter(NORM_CHECK)
    assert len(errors) == 2 * (2 * 3 + 3 + 4)
    for key, err in errors.items():
        assert err < 2e-3, (key, err)


@pytest.mark.parametrize("precision", ["int4", "fp8"])
def test_the_torch_fallback_computes_the_norm_and_residual_and_the_prompt_form_with_it(precision):
    """Without the kernel (CPU, no interpreter) the ops and QuantLinear's forms compute the same function: the norm in
    fp32 before the product, the residual after."""
    torch.manual_seed(0)
    layer = QuantLinear.from_linear(torch.nn.Linear(128, 24), 64, precision)
    x, residual = torch.randn(2, 3, 128) * 5, torch.randn(2, 3, 24)
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    want = torch.nn.functional.linear(normed, dequantise(layer.packed, layer.scales, layer.lows), layer.bias) + residual
    torch.testing.assert_close(layer(x, 1e-5, residual), want, rtol=1e-5, atol=1e-5)
    use_prompt_form(layer, True)
    torch.testing.assert_close(layer(x, 1e-5, residual), want, rtol=1e-5, atol=1e-5)
    gated = torch.ops.softsyn.gated_weight_matmul(x, layer.packed, layer.scales, layer.lows, -1, 1e-5)
    gate, up = (want - residual - layer.bias).chunk(2, dim=-1)
    torch.testing.assert_close(gated, torch.nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-5)


FORM_CHECK = r"""
import json, torch
from softsyn.emit.triton_weights import dequantise, launch, quantise, silu_gated
torch.manual_seed(0)
out = {}
for group in GROUPS:
    for gated, size in ((False, 1.0), (False, 3000.0), (True, 1.0)):  # 3000: fp16 products q * x would overflow
        w = torch.randn(2 * OUTPUTS if gated else OUTPUTS, 512) / size  # outputs within fp16's range
        q = quantise(w, group, torch.float16)
        x = (torch.randn(3, 512) * size).half()
        want = x.float() @ dequantise(q.packed, q.scales, q.lows).float().t()
        want = silu_gated(want).float() if gated else want
        for n, k in ((1, 1024), (2, 128), (4, 512)):  # one step past the row's end, four steps, two rows a thread
            for on in (True, False):
                config = {"BLOCK_M": 1, "BLOCK_N": n, "BLOCK_K": k, "X_TILE": True, "F16": True, "FLAG": on}
                got = launch(x, q.packed, q.scales, q.lows, config, gated=gated).float()
                out[f"g{group} gated {gated} x{size} {n}x{k} LABEL {on}"] = float((got - want).abs().max() / want.abs().max())
print(json.dumps(out))
"""


def form_check(flag: str, groups: tuple, outputs: int) -> str:
    """FORM_CHECK for one constexpr `flag` of the kernel's F16 configs (F16 itself: against X_TILE's fp32 form), on
    and off (the errors' keys end in the flag in lower case and its value), over `groups` with `outputs` rows (10:
    outputs that fill no 4-row program, and few: the interpreter's time goes by programs; doubled when gated)."""
    return (FORM_CHECK.replace("GROUPS", repr(groups)).replace("OUTPUTS", str(outputs)).replace("FLAG", flag)
            .replace("LABEL", flag.lower()))


def test_the_fp16_dequantising_form_computes_the_int4_product_within_the_fp32_form_s_tolerance():
    """F16 (int4 codes as fp16 (q - 8) / 16 times fp16 activations, a byte's two products summed in fp16, the rest
    in fp32) at groups 32 and 128, plain and gated, one to four loop steps a row, activations up to ~12000 (where fp16
    products of the codes themselves, 15 x, would overflow): within the fp16 tolerance of the other tests, and within
    twice the fp32 form's error (X_TILE without F16) at the same case."""
    errors = in_triton_interpreter(form_check("F16", (32, 128), 10))
    assert len(errors) == 36
    for key, err in errors.items():
        assert err < 2e-3, (key, err)
        if "f16 True" in key:
            assert err < 2 * errors[key.replace("f16 True", "f16 False")] + 2.5e-4, (key, err)


def test_the_word_form_computes_the_int4_product_within_the_fp16_form_s_tolerance():
    """ASM's interpreter twin (word_twin: the codes as 32-bit words, each word's activations as two 64-bit loads, q s
    + l and the products in fp16, a word's two quads added in fp32) at groups 32, 64 and 128, plain and gated, one to
    four loop steps a row (groups past a row's end and outputs past N read clamped, unmasked), activations up to
    ~12000: within the fp16 tolerance, and no worse than F16 (the form it would replace) by more than 2.5e-4 at the
    same case; this proves the nibbles' pairing with the activations."""
    errors = in_triton_interpreter(form_check("ASM", (32, 64, 128), 10))
    assert len(errors) == 54
    for key, err in errors.items():
        assert err < 2e-3, (key, err)
        if "asm True" in key:
            assert err < errors[key.replace("asm True", "asm False")] + 2.5e-4, (key, err)


def ptx_f16x2(op, *regs):
    """An f16x2 instruction of WORD_DOTS on uint32 arrays: each half computed in fp64 and rounded once to fp16 (an
    fma's one rounding; sub and mul are exact in fp64)."""
    regs = np.broadcast_arrays(*regs)  # a scalar operand (the magic numbers) beside arrays
    halves = [np.stack([(r & 0xFFFF).astype(np.uint16), (r >> 16).astype(np.uint16)]).view(np.float16)
              .astype(np.float64) for r in regs]
    value = {"sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "fma": lambda a, b, c: a * b + c}[op](*halves)
    bits = value.astype(np.float16).view(np.uint16).astype(np.uint32)
    return bits[0] | (bits[1] << 16)


def run_word_dots(asm: str, operands: dict) -> np.ndarray:
    """WORD_DOTS executed on numpy arrays by the PTX ISA's rules for the instructions it uses, from its text:
    `operands` maps $1.. to uint32 (or uint64) arrays; returns $0 as float32."""
    regs = dict(operands)
    for line in asm.strip().removeprefix("{").removesuffix("}").split(";"):  # one line, statements end in ";"
        line = line.strip()
        if not line or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        args = [a.strip() for a in args.replace("{", "").replace("}", "").split(",")]
        val = [regs[a] if a in regs else np.uint64(int(a, 0)) if a[0].isdigit() else None for a in args[1:]]
        if op == "prmt.b32":  # d's byte i is byte sel[i] of b:a
            both = val[0].astype(np.uint64) | (np.uint64(val[1]) << np.uint64(32))
            sel = int(args[3], 0)
            regs[args[0]] = sum(((both >> np.uint64(8 * ((sel >> 4 * i) & 7))) & np.uint64(0xFF)) << np.uint64(8 * i)
                                for i in range(4)).astype(np.uint32)
        elif op == "lop3.b32":  # bit i of the table: the result where a, b, c hold bits i >> 2, i >> 1, i & 1
            a, b, c = (np.asarray(v).astype(np.uint32) for v in val[:3])
            lut, ones = int(args[4], 0), np.uint32(0xFFFFFFFF)
            regs[args[0]] = np.bitwise_or.reduce([(a if i & 4 else a ^ ones) & (b if i & 2 else b ^ ones)
                                                  & (c if i & 1 else c ^ ones) for i in range(8) if lut >> i & 1])
        elif op.endswith(".f16x2"):
            regs[args[0]] = ptx_f16x2(op.split(".")[0], *(np.asarray(v).astype(np.uint32) for v in val))
        elif op == "mov.b64":  # {lo, hi}: the low 32 bits first
            regs[args[0]], regs[args[1]] = ((regs[args[2]] >> np.uint64(s)) & np.uint64(0xFFFFFFFF) for s in (0, 32))
        elif op == "mov.b32":  # {h0, h1}: the low 16 bits first
            regs[args[0]], regs[args[1]] = ((regs[args[2]] >> np.uint64(s)) & np.uint64(0xFFFF) for s in (0, 16))
        elif op == "cvt.f32.f16":
            regs[args[0]] = np.asarray(val[0]).astype(np.uint16).view(np.float16).astype(np.float32)
        elif op == "add.f32":
            regs[args[0]] = val[0] + val[1]
        else:
            raise AssertionError(f"an instruction the emulator does not know: {line}")
    return regs["$0"]


def test_the_inline_ptx_dequantises_each_nibble_with_its_own_activation():
    """WORD_DOTS (ASM's inline PTX, which no CPU runs) executed by the PTX ISA's rules: with one activation set at a
    time it returns exactly that input's fp16 q s + l (so each of a word's 8 nibbles meets its own activation: byte j's
    low nibble input j, its high nibble input half + j), and on random words, scales and activations it is within
    fp16's rounding of the fp64 sum of the 8 products."""
    pytest.importorskip("triton")
    triton_words = pytest.importorskip("softsyn.emit.triton_words")
    rng = np.random.default_rng(0)
    count = 4096
    codes = rng.integers(0, 2**32, count, dtype=np.uint64).astype(np.uint32)
    scale = rng.uniform(1e-4, 0.1, count).astype(np.float16)
    low = (-7.5 * scale.astype(np.float32) * rng.uniform(0.5, 1.5, count)).astype(np.float16)
    scale2, low2 = (v.view(np.uint16).astype(np.uint32) * np.uint32(65537) for v in (scale, low))  # f16x2 pairs
    nibbles = [(codes >> np.uint32(8 * (k % 4) + 4 * (k // 4))) & np.uint32(0xF) for k in range(8)]  # inputs 0-3, 4-7
    weights = [(q.astype(np.float64) * scale + low).astype(np.float16) for q in nibbles]
    words = {"$1": codes, "$4": scale2, "$5": low2, "$6": np.uint32(0x64006400),
             "$7": np.uint32(0x54005400)}

    def packed(x):  # four fp16 activations a lane, as one little-endian uint64
        return x.astype(np.float16).view(np.uint16).astype(np.uint64) @ (np.uint64(1) << np.arange(0, 64, 16,
                                                                                                     dtype=np.uint64))
    for k in range(8):
        x = np.zeros((count, 8))
        x[:, k] = 1.0
        got = run_word_dots(triton_words.WORD_DOTS.value, {**words, "$2": packed(x[:, :4]), "$3": packed(x[:, 4:])})
        assert np.array_equal(got, weights[k].astype(np.float32)), k
    x = rng.normal(0, 100, (count, 8)).astype(np.float16)
    got = run_word_dots(triton_words.WORD_DOTS.value, {**words, "$2": packed(x[:, :4]), "$3": packed(x[:, 4:])})
    terms = np.stack([weights[k].astype(np.float64) * x[:, k] for k in range(8)], 1)
    assert np.all(np.abs(got - terms.sum(1)) <= 2.0**-9 * np.abs(terms).sum(1) + 1e-6)


def test_the_prompt_form_computes_what_the_kernel_form_does():
    """A prefill package dequantises and runs one matmul (use_prompt_form); without CUDA or the interpreter the op
    computes the same product in torch: both forms give one function of the same buffers."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(QuantLinear.from_linear(torch.nn.Linear(128, 32), 128), torch.nn.ReLU())
    x = torch.randn(4, 128)
    kernel = model(x)
    assert use_prompt_form(model, True) == 1 and model[0].prompt_form
    torch.testing.assert_close(model(x), kernel, rtol=1e-5, atol=1e-5)


def test_a_one_row_lm_head_keeps_the_kernel_in_a_prompt_package():
    """use_prompt_form's `one_row` (an lm_head that reads the last position only) keep the kernel form; the others
    take the prompt form; off, every layer runs the kernel."""
    body, head = (QuantLinear.from_linear(torch.nn.Linear(128, 128), 128) for _ in range(2))
    model = torch.nn.Sequential(body, head)
    assert use_prompt_form(model, True, one_row=(head,)) == 2
    assert (body.prompt_form, head.prompt_form) == (True, False)
    use_prompt_form(model, False)
    assert not body.prompt_form and not head.prompt_form


def test_int4_and_fp8_cells_become_softsyn_layers_that_export():
    """On a target whose int4 kernel is softsyn's, each int4 group becomes one QuantLinear at the largest group at or
    below its finest part's block (a packed group replaced where its PackedLinear holds it), an fp8 cell one in fp8;
    the step still exports with the op in its graph (what AOTInductor compiles) and computes within int4's error of
    the float model."""
    from tests.emit.test_torch_lowering import exported_step, packed_tiny

    from softsyn.emit.torch_step import WeightCell, quantise_modules

    model, want = packed_tiny()
    cells = {"model.layers.0.mlp.gate_proj": WeightCell("int4", 128), "model.layers.0.mlp.up_proj": WeightCell("int4", 64),
             "model.layers.1.mlp.down_proj": WeightCell("int4", 128), "model.layers.1.self_attn.o_proj":
             WeightCell("fp8", 0)}
    notes, kernels = quantise_modules(model, cells, "fp32", ("int8", "int4", "fp8"), "softsyn")
    assert kernels == dict.fromkeys(cells, "softsyn")
    layer0, layer1 = model.model.layers
    packed = layer0.mlp.packed_gate_up.linear
    assert isinstance(packed, QuantLinear) and packed.group == 64 and packed.precision == "int4"
    assert isinstance(layer1.mlp.down_proj, QuantLinear)
    assert layer1.self_attn.o_proj.precision == "fp8" and layer1.self_attn.o_proj.group == 128
    assert type(layer1.mlp.packed_gate_up.linear) is torch.nn.Linear  # not in the map
    assert any("1 Linear layer int4 weight-only at group 64 (softsyn's Triton kernel" in n for n in notes)
    assert any("1 Linear layer int4 weight-only at group 128 (softsyn's Triton kernel" in n for n in notes)
    assert any("1 Linear layer fp8 weight-only at group 128 (softsyn's Triton kernel" in n for n in notes)
    program, got = exported_step(model)
    assert sum("softsyn.weight_matmul" in str(node.target) for node in program.graph.nodes) == 3
    rel = float((got - want).abs().max() / want.abs().max())
    assert 0 < rel < 0.2, rel


def test_a_gated_mlp_runs_its_activation_in_the_gate_up_kernel_where_it_computes_silu_gating():
    """After quantise_modules, an MLP whose packed gate/up is softsyn's computes silu(gate) * up in that kernel's
    epilogue (GatedMLP: one softsyn::gated_weight_matmul in the exported step where the GEMV and an elementwise
    kernel were), with the step's logits unchanged in both forms (decode's kernel, a prompt's dequantise + matmul);
    an MLP whose activation is another (GELU here) is checked, found to differ, and keeps its own forward."""
    from tests.emit.test_torch_lowering import exported_step, packed_tiny

    from softsyn.emit.torch_step import GatedMLP, WeightCell, fuse_gated_mlps, quantise_modules

    model, _ = packed_tiny()
    cells = {f"model.layers.{i}.mlp.{part}": WeightCell("int4", 64) for i in (0, 1) for part in ("gate_proj", "up_proj")}
    quantise_modules(model, cells, "fp32", ("int8", "int4", "fp8"), "softsyn")
    layers = model.model.layers
    layers[1].mlp.act_fn = torch.nn.GELU()
    _, before = exported_step(model)
    assert fuse_gated_mlps(model) == (1, 1)
    assert isinstance(layers[0].mlp, GatedMLP) and not isinstance(layers[1].mlp, GatedMLP)
    program, got = exported_step(model)
    assert sum("gated_weight_matmul" in str(node.target) for node in program.graph.nodes) == 1
    assert sum("softsyn.weight_matmul" in str(node.target) for node in program.graph.nodes) == 1  # layer 1's
    torch.testing.assert_close(got, before, rtol=1e-4, atol=1e-4)
    use_prompt_form(model, True)
    torch.testing.assert_close(exported_step(model)[1], before, rtol=1e-4, atol=1e-4)


def test_held_dequantised_weights_compute_the_prompt_form_and_export_without_dequantising():
    """hold_dequantised: a prefill package's int4/fp8 layers hold their dequantised weights (the prompt form's function,
    dequantised once); their packed buffers are dropped, a one-row lm_head keeps its kernel and its buffers, and the
    exported prefill step runs no dequantise (no shift of codes) where the prompt form ran one a layer."""
    from tests.emit.test_torch_lowering import exported_step, packed_tiny

    from softsyn.emit.torch_step import WeightCell, fuse_gated_mlps, quantise_modules
    from softsyn.emit.triton_weights import dequantised_bytes, hold_dequantised

    model, _ = packed_tiny()
    cells = {f"model.layers.{i}.{part}": WeightCell(precision, 64) for i in (0, 1) for part, precision in
             (("mlp.gate_proj", "int4"), ("mlp.up_proj", "int4"), ("mlp.down_proj", "fp8"), ("self_attn.o_proj", "int4"))}
    cells["lm_head"] = WeightCell("int4", 64)
    quantise_modules(model, cells, "fp32", ("int8", "int4", "fp8"), "softsyn")
    fuse_gated_mlps(model)
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    head = model.get_output_embeddings()
    assert len(layers) == 7 and layers[-1] is head
    use_prompt_form(model, True, one_row=(head,))
    program, before = exported_step(model)
    assert sum("rshift" in str(node.target) for node in program.graph.nodes) == 4  # gate/up's and o's high nibbles
    size = dequantised_bytes(model, one_row=(head,))
    assert size == sum(m.out_features * m.in_features * 4 for m in layers[:-1])
    assert hold_dequantised(model, one_row=(head,)) == size and dequantised_bytes(model, one_row=(head,)) == 0
    assert all(m.packed.numel() == 0 and m.dense is not None and m.prompt_form for m in layers[:-1])
    assert head.dense is None and head.packed.numel() > 0
    program, got = exported_step(model)
    torch.testing.assert_close(got, before, rtol=1e-5, atol=1e-5)
    assert not any("rshift" in str(node.target) for node in program.graph.nodes)
    assert sum("weight_matmul" in str(node.target) for node in program.graph.nodes) == 1  # the one-row head's kernel


def test_the_kernels_string_constants_are_one_line_so_inductor_can_embed_them():
    """Inductor writes a wrapped kernel's constexpr globals by repr into a triple-quoted string (AOTInductor's
    autotuning block), where a newline escape becomes a newline and breaks the literal: the 2026-12-06 H100 package
    failed so ("unterminated string literal") while ASM's PTX was written over lines."""
    triton = pytest.importorskip("triton")
    for name in ("triton_weights", "triton_words", "triton_attention", "triton_prologue"):
        module = importlib.import_module(f"softsyn.emit.{name}")
        for key, value in vars(module).items():
            text = value.value if isinstance(value, triton.language.constexpr) else None
            assert not (isinstance(text, str) and "\n" in text), f"{name}.{key} spans lines"


def test_every_tuned_config_names_each_constexpr_launch_leaves_to_it():
    """torch's mutation analysis of a wrapped kernel fails on a call that leaves a constexpr to its default, and then
    takes every tensor argument as written (H100, 2026-12-06: "Incorrect number of arguments passed to kernel");
    launch passes GROUP, BYTE_CODES, GATED, NORM and RESIDUAL, the configs the rest, and int4's tuned configs are ASM's."""
    pytest.importorskip("triton")
    from softsyn.emit import triton_weights

    params = inspect.signature(triton_weights.weight_matmul_kernel.fn).parameters
    constexprs = {name for name, p in params.items() if "constexpr" in str(p.annotation)}
    for config in (*triton_weights.INT4_CONFIGS, *triton_weights.BYTE_CONFIGS, *triton_weights.CONFIGS):
        assert set(config.kwargs) == constexprs - {"GROUP", "BYTE_CODES", "GATED", "NORM", "RESIDUAL"}, config
    assert all(c.kwargs["ASM"] and c.kwargs["F16"] for c in triton_weights.INT4_CONFIGS)


def test_an_activation_without_an_address_is_never_taken_for_misaligned():
    """torch.compile runs a triton_op's body on fake tensors outside is_compiling (torch 2.11 on the H100, 2026-12-07:
    every module chain of the measured attention choice failed with "Cannot access data pointer of Tensor" on an int4
    projection): the alignment check must not ask a fake for its address."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns where it does not raise: "Accessing the data pointer of FakeTensor"
        assert misaligned(torch.empty(4, 64, dtype=torch.float16)) is False
    x = torch.zeros(65, dtype=torch.float16)
    assert misaligned(x[1:]) and not misaligned(x[:64])
