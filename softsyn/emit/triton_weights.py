"""softsyn's weight-only matmul kernels for the CUDA torch target, int4, int8 and fp8: one Triton kernel that
AOTInductor compiles into the package (a `torch.library.triton_op`, so the package runs it with torch alone, no
softsyn and no Triton at load).

Why kernels of our own: torchao's int4 layer (tinygemm's tile-packed layout) decoded no faster than fp16 at
qwen3-1.7b's widths on the H200 (gate/up 19.6 vs 19.2 us, 2026-12-03), torchao has no fast fp8 weight-only layer, and
gemlite registers a Python custom op, so a package holding its layers needs gemlite imported where it loads. At
batch 1 a step streams its weights, so a kernel that reads 4 or 8 bits per weight and dequantises in registers is
the move the torch target's cells need (issue 28). Where it stands: docs/decisions/2026-12-06-triton-int4.md (the
fourth version's int4 and fp8 beat cuBLAS fp16 at every qwen3-1.7b decode GEMV on an H100; h200-torch builds fp8
with it, and int4 with it or tinygemm, whichever the compile measures faster per shape).

Formats (`PackedWeights`), per group of `group` inputs, the group's scale (and int4's low) in the activations' dtype:
- int4: w ~ q * scale + low, q in 0..15, the group's scale and low the least-squares fit of its weights to codes
  over a few candidate grids, the min-to-max grid among them (`fit_int4`: llama.cpp's k-quant search). `packed` is uint8
  [N, K / 2], K contiguous (a Linear's own order), so a program reads whole weight rows in 16-byte loads: in group
  g, byte g * group / 2 + i of a row holds input g * group + i in its low nibble and input g * group + group / 2 + i
  in its high nibble, so a group's two halves are the two nibbles of one dense run of group / 2 bytes, each
  multiplied by its half of the activations (no interleave). `scales` and `lows` are [N, K / group].
- fp8: w ~ q * scale, q float8_e4m3fn, scale the group's amax / 448 (ORT's MatMulBlockQuantizedFp8Weight's rule, per
  block of 128 along K, where the ONNX netlist's fp8 cells come from). `packed` is [N, K]; `lows` is empty.
- int8: w ~ q * scale, q int8 in -127..127, scale the group's amax / 127 (symmetric, as softsyn maps ORT's int8
  MatMulNBits cells). `packed` is int8 [N, K]; `lows` is empty. fp8 and int8 are "byte codes": one code a weight,
  no low, the same kernel path.

The kernel computes y[M, N] = x[M, K] @ dequant(W)^T with fp32 products. Autotuned (decode): every program reads
the whole weight rows of a few outputs (BLOCK_N), BLOCK_K bytes a loop step, and stores their finished sums: no
zeroed output to add into, no atomics (the fourth version split K at its finest grain and added partials
atomically: a zero-fill kernel before every GEMV and one round trip a program); a launch with a BLOCK_M > 1 config
runs tensor-core tiles that loop over the groups instead. On CUDA it is autotuned
(AOTInductor tunes it once at the example shapes of each package); elsewhere it runs at `DEFAULT_CONFIG` or a given
config (CPU tests run it in Triton's interpreter, TRITON_INTERPRET=1), and without Triton the op computes the same
product in torch.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
from torch._subclasses.fake_tensor import is_fake

from softsyn.emit.triton_words import word_dots  # ASM's inline PTX (None without Triton)

GROUPS = (32, 64, 128)  # group sizes the kernel takes (a group's half is a tl.dot K of at least 16)
LEVELS = 15  # 4-bit codes 0..15
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
INT8_MAX = 127.0  # symmetric int8 codes: -127..127
BYTE_FORMATS = {"fp8": (FP8, FP8_MAX), "int8": (torch.int8, INT8_MAX)}  # one code a weight, w ~ q * scale
PRECISIONS = ("int4", *BYTE_FORMATS)  # what the kernel takes

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU-only install has no Triton: the op falls back to torch (below)
    triton = None


class PackedWeights(NamedTuple):
    packed: torch.Tensor  # int4: uint8 [N, K / 2]; fp8: float8_e4m3fn [N, K]; int8: int8 [N, K]
    scales: torch.Tensor  # [N, K / group], the activations' dtype
    lows: torch.Tensor  # int4: [N, K / group]; byte codes (fp8, int8): empty
    group: int

    @property
    def precision(self) -> str:
        return precision_of(self.packed)


def precision_of(packed: torch.Tensor) -> str:
    return next((name for name, (dtype, _) in BYTE_FORMATS.items() if packed.dtype == dtype), "int4")


def byte_codes(packed: torch.Tensor) -> bool:
    """Whether `packed` holds one code a weight (fp8, int8: w ~ q * scale), not int4's nibble pairs with a low."""
    return packed.dtype != torch.uint8


def group_for(block: int, width: int) -> int | None:
    """The kernel's group size for a cell quantised at `block` (0: per channel): the largest of GROUPS at or below
    it that divides the input width `width`; None when none does (the layer stays float)."""
    fits = [g for g in GROUPS if width % g == 0 and (block == 0 or g <= block)]
    return max(fits) if fits else None


def quantise(weight: torch.Tensor, group: int, dtype: torch.dtype, precision: str = "int4") -> PackedWeights:
    """`weight` [N, K] (a Linear's) as PackedWeights at `precision` (PRECISIONS; module docstring), the codes
    computed against the scale (and low) as stored in `dtype`, so dequantise gives what the kernel computes."""
    out, width = weight.shape
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision}: valid precisions are {', '.join(PRECISIONS)}")
    if group not in GROUPS or width % group:
        raise ValueError(f"{precision} group {group} for an input width of {width}: valid groups are {GROUPS} "
                         "dividing it")
    w = weight.detach().float().reshape(out, width // group, group)
    if precision in BYTE_FORMATS:
        code_dtype, top = BYTE_FORMATS[precision]
        scale = (w.abs().amax(-1, keepdim=True) / top).clamp(min=1e-12).to(dtype).float()
        codes = (w / scale).clamp(-top, top)  # [N, K / group, group]
        codes = (codes.round() if precision == "int8" else codes).to(code_dtype)
        return PackedWeights(codes.reshape(out, width).contiguous(), scale[..., 0].contiguous().to(dtype),
                             torch.empty(0, dtype=dtype, device=weight.device), group)
    scale, low = fit_int4(w)
    low = low.to(dtype).float()
    scale = scale.clamp(min=1e-8).to(dtype).float()
    codes = ((w - low) / scale).round().clamp(0, LEVELS).to(torch.uint8)  # nearest to the stored scale and low
    half = group // 2
    packed = codes[..., :half] | (codes[..., half:] << 4)  # [N, K / group, group / 2]
    return PackedWeights(packed.reshape(out, width // 2).contiguous(), scale[..., 0].contiguous().to(dtype),
                         low[..., 0].contiguous().to(dtype), group)


FIT_STEPS = torch.linspace(-1.0, 1.0, 21).tolist()  # candidate grids: LEVELS + step codes span the group's range
FIT_ELEMENTS = 1 << 25  # weights fitted at once (rows of a layer at a time: an lm_head's fp32 temporaries stay ~128 MB)


def fit_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each group's (scale, low) [N, groups, 1] for w [N, groups, group] (fp32): for each candidate grid (the group's
    range cut into LEVELS + step steps from its min, FIT_STEPS), codes rounded on it, then the least-squares scale and
    low for those codes; the fit of least squared error, the plain min-to-max grid (the old rule) among the candidates,
    so no group fits worse. Why: min-to-max spends levels on the group's extremes; on qwen3-1.7b's seeded weights that
    grid's int4 logits missed the 90 % budget at one scenario (rel err 0.93 on the H100, 2026-12-07)."""
    scales, lows = [], []
    rows = max(1, FIT_ELEMENTS // max(1, w[0].numel()))
    for part in w.split(rows):
        lo, hi = part.amin(-1, keepdim=True), part.amax(-1, keepdim=True)
        span = (hi - lo).clamp(min=1e-12)
        best_s, best_l = span / LEVELS, lo
        best_err = ((((part - lo) / best_s).round().clamp(0, LEVELS) * best_s + lo - part) ** 2).sum(-1, keepdim=True)
        n = part.shape[-1]
        for step in FIT_STEPS:
            q = ((part - lo) * ((LEVELS + step) / span)).round().clamp(0, LEVELS)
            sq, sw = q.sum(-1, keepdim=True), part.sum(-1, keepdim=True)
            det = n * (q * q).sum(-1, keepdim=True) - sq * sq
            s = (n * (q * part).sum(-1, keepdim=True) - sq * sw) / det.clamp(min=1e-12)
            low = (sw - s * sq) / n
            err = ((q * s + low - part) ** 2).sum(-1, keepdim=True)
            better = (err < best_err) & (det > 0) & (s > 0)
            best_s, best_l, best_err = (torch.where(better, s, best_s), torch.where(better, low, best_l),
                                        torch.where(better, err, best_err))
        scales.append(best_s)
        lows.append(best_l)
    return torch.cat(scales), torch.cat(lows)


def dequantise(packed: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor) -> torch.Tensor:
    """The [N, K] weight the kernel multiplies by (in the scales' dtype), from the packed format, computed in its own
    order (K contiguous): the prompt form's dequantise kernel reads and writes along rows, coalesced both ways."""
    out, row_bytes = packed.shape
    groups = scales.shape[1]
    if byte_codes(packed):
        w = packed.to(scales.dtype).reshape(out, groups, row_bytes // groups) * scales[:, :, None]
        return w.reshape(out, row_bytes)
    tiles = packed.reshape(out, groups, row_bytes // groups)  # a group's byte i: input i (low nibble), half + i (high)
    codes = torch.cat([tiles & 0xF, tiles >> 4], dim=2).to(scales.dtype)  # [N, groups, group]
    return (codes * scales[:, :, None] + lows[:, :, None]).reshape(out, row_bytes * 2)


if triton is not None:
    @triton.jit
    def small_ints(codes):
        """Integer codes in 0..255 as fp32 by the exponent trick: 2^23 + c holds c in its mantissa, so OR-ing c into
        2^23's bits and subtracting 2^23 is exact: two full-rate ops where an int-to-float convert runs at a quarter
        of the rate (16 a clock an SM on Hopper), which bounded the int4 GEMVs (gate/up 11.3 us cold on the H100, 1.2
        TB/s of codes, as slow as fp8 reading twice the bytes, 2026-12-06)."""
        return (codes.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0

    @triton.jit
    def sixteenths(nibbles):
        """4-bit codes q as fp16 (q - 8) / 16, exactly and with no convert: 0x5400 is fp16 64.0, whose mantissa steps
        by 1/16, so OR-ing q in and subtracting 64.5 gives it (packed two a register: or, sub.f16x2). Sixteenths, not
        q (Marlin's 0x6400, 1024 + q): an fp16 product q * x overflows past |x| 4366, (q - 8) / 16 * x never does;
        centred, so the fp16 products do not carry the group's offset (which the low then cancels: a rounding error
        of the offset's size, 2.5x the fp32 form's on gated outputs in the interpreter, 2026-12-06)."""
        return (nibbles.to(tl.int16) | 0x5400).to(tl.float16, bitcast=True) - 64.5

    @triton.jit
    def step_dots(x_row, w_rows, s_rows, s_ptr, l_ptr, g, n_ok, GROUP: tl.constexpr, GB: tl.constexpr,
                  BYTE_CODES: tl.constexpr, groups, X_TILE: tl.constexpr, F16: tl.constexpr, WORDS: tl.constexpr,
                  TWIN: tl.constexpr):
        """A loop step's [BLOCK_N, len(g), WORDS] dot products, to be summed: word_dots where WORDS > 1 (ASM on
        int4 codes and fp16 activations), else group_dots' (WORDS 1)."""
        if WORDS > 1:
            dots = word_dots(x_row, w_rows, s_rows, s_ptr, l_ptr, g, n_ok=n_ok, GROUP=GROUP, groups=groups, TWIN=TWIN)
        else:
            dots = group_dots(x_row, w_rows, s_rows, s_ptr, l_ptr, g, n_ok=n_ok, GROUP=GROUP, GB=GB,
                              BYTE_CODES=BYTE_CODES, groups=groups, X_TILE=X_TILE, F16=F16)[:, :, None]
        return dots

    @triton.jit
    def group_dots(x_row, w_rows, s_rows, s_ptr, l_ptr, g, n_ok, GROUP: tl.constexpr, GB: tl.constexpr,
                   BYTE_CODES: tl.constexpr, groups, X_TILE: tl.constexpr = False, F16: tl.constexpr = False):
        """[BLOCK_N, len(g)]: each weight row's dot product with x over groups g, each group's scale (and int4's
        low) applied once: x . (q s + l) = s (x . q) + l sum(x), one convert (small_ints for integer codes) and one
        fma a weight. F16 (int4 with fp16 activations, X_TILE's layout; else X_TILE's form): the codes as fp16
        sixteenths times the fp16 activations, a byte's two products summed in fp16 (f16x2 ops), each pair added
        in fp32, so a group's sum and the sums across groups stay fp32."""
        HALF: tl.constexpr = GROUP // 2
        ri = tl.arange(0, GB)
        g_ok = g < groups
        tile_ok = n_ok[:, None, None] & g_ok[None, :, None]
        at = w_rows[:, None, None] + (g[:, None] * GB + ri[None, :])[None, :, :]
        gate = n_ok[:, None] & g_ok[None, :]
        scale = tl.load(s_ptr + s_rows[:, None] + g[None, :], mask=gate, other=0.0).to(tl.float32)
        first = g[:, None] * GROUP + ri[None, :]  # [groups, GB]: the input of each byte (int4: its low nibble)
        if BYTE_CODES:  # fp8 takes a float `other`, int4's uint8 an int one
            codes = tl.load(at, mask=tile_ok, other=0.0)
            if codes.dtype == tl.int8:  # -127..127: shifted into small_ints' range and back
                codes = small_ints(codes.to(tl.int32) + 128) - 128.0
            else:
                codes = codes.to(tl.float32)
            if X_TILE:
                a = tl.load(tl.broadcast_to((x_row + first)[None, :, :], codes.shape), mask=tile_ok, other=0.0)
                dots = tl.sum(codes * a.to(tl.float32), 2) * scale
            else:
                a = tl.load(x_row + first, mask=g_ok[:, None], other=0.0).to(tl.float32)
                dots = tl.sum(codes * a[None, :, :], 2) * scale
        else:
            codes = tl.load(at, mask=tile_ok, other=0)
            low = tl.load(l_ptr + s_rows[:, None] + g[None, :], mask=gate, other=0.0).to(tl.float32)
            if X_TILE:  # each output row's own copy of the activations, loaded in the codes' layout
                x_at = tl.broadcast_to((x_row + first)[None, :, :], codes.shape)
                a_lo = tl.load(x_at, mask=tile_ok, other=0.0)
                a_hi = tl.load(x_at + HALF, mask=tile_ok, other=0.0)
                if F16 and a_lo.dtype == tl.float16:  # half the live registers of fp32 codes and activations
                    pair = (sixteenths(codes & 0xF) * a_lo + sixteenths(codes >> 4) * a_hi).to(tl.float32)
                    both = tl.sum((a_lo + a_hi).to(tl.float32), 2)
                    dots = tl.sum(pair, 2) * (scale * 16.0) + (low + scale * 8.0) * both  # q s + l, centred
                else:
                    a_lo, a_hi = a_lo.to(tl.float32), a_hi.to(tl.float32)
                    dots = tl.sum(small_ints(codes & 0xF) * a_lo + small_ints(codes >> 4) * a_hi, 2)
                    dots = dots * scale + low * tl.sum(a_lo + a_hi, 2)
            else:  # [groups, GB] once, broadcast over the rows
                a_lo = tl.load(x_row + first, mask=g_ok[:, None], other=0.0).to(tl.float32)
                a_hi = tl.load(x_row + first + HALF, mask=g_ok[:, None], other=0.0).to(tl.float32)
                dots = tl.sum(small_ints(codes & 0xF) * a_lo[None, :, :] + small_ints(codes >> 4) * a_hi[None, :, :],
                              2)
                dots = dots * scale + low * tl.sum(a_lo + a_hi, 1)[None, :]
        return dots

    @triton.jit
    def chunk_squares(x_row, k0, K, WIDTH: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr):
        """The squares of x_row[k0:k0 + WIDTH] in fp32 (past K: 0), the inputs a loop step's dots read, summed into
        LANES partial sums (LANES x VEC dividing WIDTH), for the loop to add up and sum once after it (a sum each step
        put a cross-warp reduction in the loop, and spilled at fp8 group 32 with 4 warps): a NORM kernel gathers its
        row's mean square with no pass over the row before the loop. Why LANES sums, one a thread where LANES is the
        program's thread count: the loaded chunk lies VEC inputs a thread (8: 16-byte loads), thread after thread, so
        [rounds, LANES, VEC] sums within each thread, and the loop carries one register a thread where a [WIDTH] tile
        of squares took WIDTH / threads (64 at 1024 bytes of int4 a step and one warp: 126 registers a thread
        normed and 167 normed and gated against 64 plain, Triton 3.8 for sm_90, 2026-12-07, which caps the programs
        an SM holds, so the bytes in flight; the normed GEMVs took 0.864 ms where the plain ones took 0.729, H100,
        2026-12-07 14:43 vs 10:36). The order of the sums is the compiler's; their total is the row's."""
        rk = k0 + tl.arange(0, WIDTH)
        a = tl.load(x_row + rk, mask=rk < K, other=0.0).to(tl.float32)
        return tl.sum(tl.sum(tl.reshape(a * a, (WIDTH // (LANES * VEC), LANES, VEC)), 2), 0)

    @triton.jit
    def weight_matmul_kernel(x_ptr, w_ptr, s_ptr, l_ptr, y_ptr, M, N, K, stride_xm, stride_ym, r_ptr, eps,
                             GROUP: tl.constexpr, BYTE_CODES: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr = 256, GATED: tl.constexpr = False,
                             X_TILE: tl.constexpr = False, F16: tl.constexpr = False, ASM: tl.constexpr = False,
                             TWIN: tl.constexpr = False, NORM: tl.constexpr = False, RESIDUAL: tl.constexpr = False,
                             LANES: tl.constexpr = 32):
        """y[M, N] = x[M, K] @ W^T, W dequantised from the packed format (module docstring; BYTE_CODES: fp8 or int8,
        else int4). A program owns BLOCK_N outputs (decode: tile j is program j on the launch's x axis; tiles: program
        (i, j), rows i, outputs j) and reads their weight rows whole, K contiguous, so it stores finished sums: no
        zeroed output, no atomics, the same sum every run.
        BLOCK_M 1 (decode): BLOCK_K bytes of each row a loop step, as [BLOCK_N, groups, group bytes] tiles
        (group_dots); the rows of x are a loop (the grid names no row: a package's dynamic row count stays a kernel
        argument, never a launch dimension), each reading the program's weights again (from L2 past the first row).
        GATED (one-row path): W holds 2N rows, gate then up, and y = silu(x @ gate^T) * (x @ up^T), a gated MLP's
        activation in the GEMV's epilogue (one kernel where a step ran two). X_TILE (one-row path): each output row
        loads its own copy of the activations in the codes' layout (group_dots); F16 with it: int4 dequantised and
        multiplied in fp16, summed in fp32 (group_dots); ASM with F16 (int4, fp16 activations; int4's tuned configs,
        ASM_CONFIGS): word_dots' inline PTX, TWIN its tl-op twin where Triton's interpreter runs it (`launch` sets it).
        NORM (one-row path): x's rows RMS-normed without a weight (a norm folded into W: torch_norms), each finished
        output scaled by 1 / rms(x_row) (its squares gathered by the loop: chunk_squares); RESIDUAL (one-row path):
        residual r_ptr [M, N] (y's strides) added before the store: the norm before a projection and the residual
        add after one in the GEMV, not kernels of their own (a decode step is bound by its kernel count). LANES (one-row
        path): the program's threads (32 x warps), over which NORM's loop keeps the squares of x (chunk_squares).
        BLOCK_M > 1 (`launch` with a config; not autotuned): tensor-core tiles, one group a step."""
        HALF: tl.constexpr = GROUP // 2
        GB: tl.constexpr = GROUP if BYTE_CODES else HALF  # bytes of one weight row a group takes
        groups = K // GROUP
        # decode's output tiles on the launch's x axis (2^31 - 1 programs; y allows 65535, fewer than the lm_head's
        # 151936 outputs in tiles of 2: "invalid argument", H100, 2026-12-06); the tiles' path: rows on x, outputs on y
        rn = tl.program_id(0 if BLOCK_M == 1 else 1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < N
        # ASM's form (int4 codes, fp16 activations): a group's 32-bit words of codes, each summed after the loop
        WORDS: tl.constexpr = GROUP // 8 if ASM and not BYTE_CODES and x_ptr.dtype.element_ty == tl.float16 else 1
        if WORDS > 1:  # word_dots loads unmasked: outputs past N read the last row (and store nothing)
            rn = tl.minimum(rn, N - 1)
        w_rows = w_ptr + rn.to(tl.int64) * (groups * GB)  # [BLOCK_N] row starts (lm_head-sized matrices: int64)
        s_rows = rn * groups
        if BLOCK_M == 1:
            GPC: tl.constexpr = BLOCK_K // GB  # groups a loop step
            # NORM's partial sums of squares: one a thread (LANES, the config's threads) over 8 of its inputs a round,
            # fewer inputs a thread where a step has fewer than 8 a thread, fewer sums where it has fewer than one
            SQUARES: tl.constexpr = LANES if LANES <= GPC * GROUP else GPC * GROUP
            SQ_VEC: tl.constexpr = 8 if SQUARES * 8 <= GPC * GROUP else GPC * GROUP // SQUARES
            rg = tl.arange(0, GPC)
            up_rows, up_s = w_rows + N * (groups * GB), s_rows + N * groups  # GATED: the up rows
            for row in range(0, M):
                x_row = x_ptr + row * stride_xm
                acc = tl.zeros((BLOCK_N, GPC, WORDS), dtype=tl.float32)  # reduced across groups once, after the loop
                up = tl.zeros((BLOCK_N, GPC, WORDS), dtype=tl.float32)
                squares = tl.zeros((SQUARES,), dtype=tl.float32)  # NORM: the row's squares, step by step
                for g0 in range(0, groups, GPC):
                    acc += step_dots(x_row, w_rows, s_rows, s_ptr, l_ptr, g0 + rg, n_ok=n_ok, GROUP=GROUP, GB=GB,
                                     BYTE_CODES=BYTE_CODES, groups=groups, X_TILE=X_TILE, F16=F16, WORDS=WORDS,
                                     TWIN=TWIN)
                    if GATED:
                        up += step_dots(x_row, up_rows, up_s, s_ptr, l_ptr, g0 + rg, n_ok=n_ok, GROUP=GROUP, GB=GB,
                                        BYTE_CODES=BYTE_CODES, groups=groups, X_TILE=X_TILE, F16=F16, WORDS=WORDS,
                                        TWIN=TWIN)
                    if NORM:
                        squares += chunk_squares(x_row, g0 * GROUP, K, WIDTH=GPC * GROUP, LANES=SQUARES, VEC=SQ_VEC)
                scale = 1.0
                if NORM:  # rsqrt(mean(x^2) + eps), as an RMS norm takes it; Inductor types a Python float fp64
                    scale = tl.math.rsqrt(tl.sum(squares, 0) / K + tl.cast(eps, tl.float32))
                out = tl.sum(tl.sum(acc, 2), 1) * scale
                if GATED:
                    out = out / (1.0 + tl.exp(-out)) * (tl.sum(tl.sum(up, 2), 1) * scale)
                if RESIDUAL:
                    out += tl.load(r_ptr + row * stride_ym + rn, mask=n_ok, other=0.0).to(tl.float32)
                tl.store(y_ptr + row * stride_ym + rn, out.to(y_ptr.dtype.element_ty), mask=n_ok)
        else:
            rk = tl.arange(0, HALF)
            rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
            row_ok = rm[:, None] < M
            x_rows = x_ptr + rm[:, None] * stride_xm + rk[None, :]
            w_tile = w_rows[:, None] + rk[None, :]  # [BLOCK_N, HALF]: a group's first half (int4: both, as nibbles)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for g in range(0, groups):
                a_lo = tl.load(x_rows + g * GROUP, mask=row_ok, other=0.0)
                a_hi = tl.load(x_rows + g * GROUP + HALF, mask=row_ok, other=0.0)
                scale = tl.load(s_ptr + s_rows + g, mask=n_ok, other=0.0)[:, None]
                if BYTE_CODES:
                    w_lo = tl.load(w_tile + g * GB, mask=n_ok[:, None], other=0.0).to(a_lo.dtype) * scale
                    w_hi = tl.load(w_tile + g * GB + HALF, mask=n_ok[:, None], other=0.0).to(a_lo.dtype) * scale
                else:
                    codes = tl.load(w_tile + g * GB, mask=n_ok[:, None], other=0)
                    low = tl.load(l_ptr + s_rows + g, mask=n_ok, other=0.0)[:, None]
                    w_lo = (codes & 0xF).to(a_lo.dtype) * scale + low
                    w_hi = (codes >> 4).to(a_lo.dtype) * scale + low
                acc += tl.dot(a_lo, tl.trans(w_lo.to(a_lo.dtype)))
                acc += tl.dot(a_hi, tl.trans(w_hi.to(a_lo.dtype)))
            tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                     mask=row_ok & n_ok[None, :])

    # a prompt takes the prompt form (use_prompt_form) in a prefill package, so only one-row configs are tuned, and
    # their grid is static (no row count in it: torch 2.11's AOTInductor failed to autotune a grid over the dynamic
    # rows, "launcher() missing 1 required positional argument: '_launcher_s1'", H100, 2026-12-06). A program's tile
    # is BLOCK_N rows x BLOCK_K bytes, 16-32 bytes a thread (one or two 16-byte loads in flight, no spills for sm_90
    # at any group: tests/emit/test_triton_compile.py): the loop does not pipeline (its loads feed no dot), so bytes
    # in flight come from the tile, and a row of qwen3-1.7b's int4 layers (1-3 KB) takes 1-3 steps. Each config kept
    # was the fastest at some qwen3-1.7b shape in a sweep (the sweeps, and the forms F16 and ASM that replaced the
    # fp32 one for int4: docs/decisions/2026-12-06-triton-int4.md); few, because AOTInductor compiles every config
    # of every autotuned layer shape.
    def one_row(n: int, k: int, warps: int, f16: bool, asm: bool = False):
        # every constexpr launch does not pass is named (TWIN too): torch's mutation analysis of a wrapped kernel
        # fails on a call that leaves one to its default ("Incorrect number of arguments passed to kernel", H100,
        # 2026-12-06) and then takes every tensor argument as written, weights included
        return triton.Config({"BLOCK_M": 1, "BLOCK_N": n, "BLOCK_K": k, "X_TILE": f16, "F16": f16, "ASM": asm,
                              "TWIN": False, "LANES": 32 * warps}, num_warps=warps, num_stages=1)

    # Per precision, few configs that are near the best at every qwen3-1.7b shape (cold chains, 2026-12-06). int4:
    # ASM's form at the three F16 configs. On the H200 F16 (1, 1024, 1) and (2, 1024, 2) were the best at every
    # shape but the lm_head, where (2, 512, 1) led by 4 %; on the H100 ASM matched F16's error and beat it at every
    # shape (us, best ASM vs best F16: q/k/v 4.9 vs 5.9, o 4.1 vs 4.6, gate/up 9.2 vs 12.2, down 6.6 vs 8.4,
    # lm_head 66.3 vs 109.2 at (2, 512, 1); torch-kernels-chain-h100-2026-12-06-asm.md), each of the three the best
    # at some shape. Byte codes: the four fastest at some fp8 shape (H200). CONFIGS, the union of the fp32 and F16
    # forms, is what the compile tests and benches walk; ASM_CONFIGS are ASM's twins of the F16 ones. A fourth, one
    # 4096-byte step of 4 warps (down's 3 KB rows in one load round), lost at every shape (down 6.5 vs 6.1 us, H100,
    # 2026-12-07, bench/results/torch-kernels-chain-h100-2026-12-07-b.md): not kept.
    F16_TILES = ((1, 1024, 1), (2, 1024, 2), (2, 512, 1))  # (BLOCK_N, BLOCK_K, warps) of the F16 and ASM configs
    F16_WIDE, F16_NARROW, F16_HALF = (one_row(*tile, True) for tile in F16_TILES)
    ASM_CONFIGS = [one_row(*tile, True, asm=True) for tile in F16_TILES]
    INT4_CONFIGS = ASM_CONFIGS  # with bf16 activations ASM's configs run the F16 form's fp32 path (WORDS = 1)
    BYTE_CONFIGS = [one_row(2, 1024, 4, False), one_row(16, 256, 4, False), F16_WIDE, F16_HALF]
    CONFIGS = [*BYTE_CONFIGS[:2], F16_WIDE, F16_NARROW, F16_HALF]
    TUNED_KEY = ["M", "N", "K", "GATED", "NORM", "RESIDUAL"]
    tuned_int4 = triton.autotune(configs=INT4_CONFIGS, key=TUNED_KEY)(weight_matmul_kernel)
    tuned_bytes = triton.autotune(configs=BYTE_CONFIGS, key=TUNED_KEY)(weight_matmul_kernel)

DEFAULT_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 64}  # where the kernel runs untuned (the interpreter)
AUTOTUNED = -1  # a layer's `config` when Triton's autotuner picks among tuned_configs at the first call


def tuned_configs(precision: str) -> list:
    """The one-row configs the kernel tunes over at `precision` (int4: ASM's; fp8 and int8: the byte codes'); none
    without Triton. A layer pins one by its index (QuantLinear.config), as the compile's measured choice does."""
    if triton is None:
        return []
    return INT4_CONFIGS if precision == "int4" else BYTE_CONFIGS


def config_name(precision: str, index: int) -> str:
    """A pinned config as the compile log names it, e.g. "2 x 1024 bytes, 2 warps, ASM"; "autotuned" for AUTOTUNED."""
    if index == AUTOTUNED:
        return "autotuned"
    c = tuned_configs(precision)[index]
    form = "ASM" if c.kwargs["ASM"] else "F16" if c.kwargs["F16"] else "fp32"
    return f"{c.kwargs['BLOCK_N']} x {c.kwargs['BLOCK_K']} bytes, {c.num_warps} warp{'s' * (c.num_warps > 1)}, {form}"


def pinned(precision: str, index: int) -> dict | None:
    """launch's config for a pinned index (its constexprs and launch options); None for AUTOTUNED."""
    if index == AUTOTUNED or triton is None:
        return None
    c = tuned_configs(precision)[index]
    return {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}


def launch(flat: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor,
           config: dict | None = None, gated: bool = False, norm_eps: float | None = None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel on `flat` [M, K] (contiguous): autotuned on CUDA unless `config` ({"BLOCK_M", "BLOCK_N"[, "BLOCK_K"]})
    is given, at `config` or DEFAULT_CONFIG elsewhere (Triton's interpreter). `gated`: packed holds gate then up rows,
    and the result is silu(gate) * up (in the kernel's epilogue on the one-row path, in torch after the tiles).
    `norm_eps`: flat's rows RMS-normed (no weight) first; `residual` [M, N]: added to the result (both in the one-row
    path, in torch around the tiles)."""
    rows, width = flat.shape
    group = width // scales.shape[1]
    one_code = byte_codes(packed)
    config = None if flat.device.type == "cuda" and config is None else config or DEFAULT_CONFIG
    if config is not None and config["BLOCK_M"] > 1 and (gated or norm_eps is not None or residual is not None):
        # the tiles' path has no prologue or epilogue
        y = launch(flat if norm_eps is None else rms_normed(flat, norm_eps), packed, scales, lows, config)
        y = silu_gated(y) if gated else y
        return y if residual is None else added(y, residual)
    out = packed.shape[0] // 2 if gated else packed.shape[0]
    y = torch.empty((rows, out), device=flat.device, dtype=flat.dtype)  # every program stores finished sums

    def grid(meta):
        if meta["BLOCK_M"] == 1:  # every row in each program (no symbolic size in the launch)
            return triton.cdiv(out, meta["BLOCK_N"]), 1, 1
        return triton.cdiv(rows, meta["BLOCK_M"]), triton.cdiv(out, meta["BLOCK_N"]), 1

    asm = config.get("ASM", False) if config is not None else not one_code  # int4's tuned configs are ASM's
    if asm and misaligned(flat):
        flat = flat.clone()  # ASM loads x 8 bytes at a time, and a view may start off 8 bytes
    # without a residual the kernel is handed x in its place, never read (RESIDUAL off)
    res = flat if residual is None else residual.reshape(rows, out).contiguous()
    args = (flat, packed, scales, lows, y, rows, out, width, flat.stride(0), out, res,
            0.0 if norm_eps is None else float(norm_eps))
    flags = {"GROUP": group, "BYTE_CODES": one_code, "GATED": gated, "NORM": norm_eps is not None,
             "RESIDUAL": residual is not None}
    if config is None:
        tuned = tuned_bytes if one_code else tuned_int4
        torch.library.wrap_triton(tuned)[grid](*args, **flags)
    else:
        twin = {"TWIN": interpreting()} if asm else {}  # the interpreter runs no inline PTX
        torch.library.wrap_triton(weight_matmul_kernel)[grid(config)](*args, **flags, **{**config, **twin})
    return y


def rms_normed(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x's rows times rsqrt(mean(x^2) + eps), in fp32, back in x's dtype: an RMS norm without its weight."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def added(y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """y + residual, added in fp32 as the kernel's epilogue adds it."""
    return (y.float() + residual.reshape(y.shape).float()).to(y.dtype)


def misaligned(flat: torch.Tensor) -> bool:
    """Whether `flat` starts off an 8-byte boundary; never while tracing (export's fakes have no address, and the
    compiled program's buffers are aligned: Inductor specialises Triton kernels on 16-byte ones)."""
    # torch.compile runs a triton_op's body on fake tensors outside is_compiling, where data_ptr raises (torch 2.11)
    return not torch.compiler.is_compiling() and not is_fake(flat) and flat.data_ptr() % 8 != 0


def silu_gated(y: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for y = [gate, up] along its last dim, in fp32 as the kernel's epilogue computes it."""
    gate, up = y.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate.float()).mul(up.float()).to(y.dtype)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def product(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor,
            gated: bool, config: int = AUTOTUNED, norm_eps: float | None = None,
            residual: torch.Tensor | None = None) -> torch.Tensor:
    """Both ops' body: the Triton kernel on CUDA (and in Triton's interpreter), at the tuned config of index `config`
    or autotuned, torch's matmul over the dequantised weight elsewhere; `gated`: silu_gated of the product, in the
    kernel's epilogue where the kernel runs; `norm_eps`: x's rows RMS-normed without a weight first (the kernel scales
    each finished sum by 1 / rms, as here); `residual` (the result's shape): added last, in fp32."""
    width, out = x.shape[-1], packed.shape[0] // (2 if gated else 1)
    flat = x.reshape(-1, width)
    if triton is None or (x.device.type != "cuda" and not interpreting()):
        if norm_eps is None:
            y = flat @ dequantise(packed, scales, lows).t()
        else:  # the kernel's order: the product of x as given, in fp32, scaled by 1 / rms after
            y = flat.float() @ dequantise(packed, scales, lows).float().t()
            y = (y * torch.rsqrt(flat.float().pow(2).mean(-1, keepdim=True) + norm_eps)).to(x.dtype)
        y = silu_gated(y) if gated else y
        y = y if residual is None else added(y, residual)
    else:
        y = launch(flat.contiguous(), packed, scales, lows, pinned(precision_of(packed), config), gated=gated,
                   norm_eps=norm_eps, residual=residual)
    return y.reshape(*x.shape[:-1], out)


@torch.library.triton_op("softsyn::weight_matmul", mutates_args=())
def weight_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor,
                  config: int = AUTOTUNED, norm_eps: float | None = None,
                  residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ W^T for W in the packed format; `config`: a tuned config's index (tuned_configs), or autotuned;
    `norm_eps`: x RMS-normed (no weight: one folded into W) first; `residual` [..., N]: added to the result."""
    return product(x, packed, scales, lows, gated=False, config=config, norm_eps=norm_eps, residual=residual)


@torch.library.triton_op("softsyn::gated_weight_matmul", mutates_args=())
def gated_weight_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                        lows: torch.Tensor, config: int = AUTOTUNED, norm_eps: float | None = None) -> torch.Tensor:
    """silu(x @ G^T) * (x @ U^T) for W = [G; U] in the packed format (a gated MLP's packed gate and up); `norm_eps`:
    x RMS-normed (no weight) first."""
    return product(x, packed, scales, lows, gated=True, config=config, norm_eps=norm_eps)


class QuantLinear(torch.nn.Module):
    """A bias-optional Linear whose weight is PackedWeights (int4, int8 or fp8), run by softsyn::weight_matmul; where a
    torch.nn.Linear was."""

    def __init__(self, weights: PackedWeights, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("packed", weights.packed)
        self.register_buffer("scales", weights.scales)
        self.register_buffer("lows", weights.lows)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.group, self.precision = weights.group, weights.precision
        out, row_bytes = weights.packed.shape
        self.in_features, self.out_features = row_bytes if byte_codes(weights.packed) else row_bytes * 2, out
        self.prompt_form = False  # True: dequantise, then one fp16 matmul (use_prompt_form)
        self.register_buffer("dense", None)  # the prompt form's weight, held dequantised (hold_dequantised)
        self.config = AUTOTUNED  # or the index of the tuned config the compile measured fastest (pinned)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, group: int, precision: str = "int4",
                    config: int = AUTOTUNED) -> QuantLinear:
        layer = cls(quantise(linear.weight, group, linear.weight.dtype, precision), linear.bias)
        layer.config = config
        return layer

    def forward(self, x: torch.Tensor, norm_eps: float | None = None,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """x @ W^T (+ bias); `norm_eps`: x RMS-normed without a weight first (the layer's norm folded into W);
        `residual`: added to the result (in the kernel's prologue and epilogue, in torch in the prompt form)."""
        if self.prompt_form:
            weight = self.dense if self.dense is not None else dequantise(self.packed, self.scales, self.lows)
            y = torch.nn.functional.linear(x if norm_eps is None else rms_normed(x, norm_eps), weight, self.bias)
            return y if residual is None else y + residual
        if self.bias is None:
            return torch.ops.softsyn.weight_matmul(x, self.packed, self.scales, self.lows, self.config,
                                                   norm_eps=norm_eps, residual=residual)
        y = torch.ops.softsyn.weight_matmul(x, self.packed, self.scales, self.lows, self.config, norm_eps)
        return y + self.bias if residual is None else y + self.bias + residual

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group={self.group}, "
                f"{self.precision} (softsyn, {config_name(self.precision, self.config)})")


def use_prompt_form(model: torch.nn.Module, on: bool, one_row: tuple[torch.nn.Module, ...] = ()) -> int:
    """Set every QuantLinear of `model` to the prompt form (on) or the kernel (off); how many. At 512 rows the kernel's
    tensor-core tiles took 2.1-2.5x cuBLAS fp16's time (H100, 2026-12-06, bench/torch_kernels.py), so a prompt
    dequantises each weight (one Inductor kernel) and runs cuBLAS; at decode the kernel reads a quarter of the bytes.
    Both forms read the same buffers, so a decode and a prefill package share one set of weights. The modules in
    `one_row` (an lm_head that reads the last position only) keep the kernel: a prompt gives them one row a sequence,
    and dequantising a 151936 x 2048 weight for it would write 0.6 GB."""
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    skipped = {id(m) for m in one_row}
    for layer in layers:
        layer.prompt_form = on and id(layer) not in skipped
    return len(layers)


def hold_dequantised(model: torch.nn.Module, one_row: tuple[torch.nn.Module, ...] = ()) -> int:
    """Put every QuantLinear of `model` (but those in `one_row`, which keep the kernel) in the prompt form with its
    dequantised weight as a buffer, its packed one dropped: the prompt form then runs one fp16 matmul over weights
    held in memory, the same function as dequantising at every prompt, which took 1.447 of qwen3-1.7b's 6.072 ms int4
    prefill 512 (112 dequantise kernels, H100, 2026-12-07). For a prefill package that holds its own weights, built
    last (the decode package, already compiled, keeps the packed ones); the bytes of the weights now held."""
    held = 0
    for layer in packed_layers(model, one_row):
        dense = dequantise(layer.packed, layer.scales, layer.lows)
        layer.register_buffer("dense", dense)
        layer.register_buffer("packed", layer.packed.new_empty(0))
        layer.register_buffer("scales", layer.scales.new_empty(0))
        layer.register_buffer("lows", layer.lows.new_empty(0))
        layer.prompt_form = True
        held += dense.nbytes
    return held


def packed_layers(model: torch.nn.Module, one_row: tuple[torch.nn.Module, ...] = ()) -> list[QuantLinear]:
    """`model`'s QuantLinears that hold_dequantised would change: still packed, not among `one_row`."""
    skipped = {id(m) for m in one_row}
    return [m for m in model.modules() if isinstance(m, QuantLinear) and id(m) not in skipped and m.dense is None]


def dequantised_bytes(model: torch.nn.Module, one_row: tuple[torch.nn.Module, ...] = ()) -> int:
    """The bytes hold_dequantised would give `model`'s QuantLinears (those not in `one_row`), at their scales' dtype."""
    return sum(m.out_features * m.in_features * m.scales.element_size() for m in packed_layers(model, one_row))


def replace_linears(model: torch.nn.Module, linears: list[torch.nn.Linear], group: int, precision: str = "int4",
                    config: int = AUTOTUNED) -> int:
    """Put a QuantLinear at `precision` and `group` (at tuned config `config`) where each of `linears` is held (by any
    parent); how many."""
    ids, done = {id(lin) for lin in linears}, {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in ids:
                if id(child) not in done:
                    done[id(child)] = QuantLinear.from_linear(child, group, precision, config)
                setattr(parent, name, done[id(child)])
    return len(done)
