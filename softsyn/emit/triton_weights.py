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
- int4: round to nearest between the group's min and max, w ~ q * scale + low, q in 0..15. `packed` is uint8
  [K / 2, N], N contiguous, so a program's loads along outputs coalesce: in group g, row g * group / 2 + i holds
  input g * group + i in its low nibble and input g * group + group / 2 + i in its high nibble, so a group's two
  halves are two dense [group / 2, N] tiles, each multiplied by its half of the activations (no interleave).
- fp8: w ~ q * scale, q float8_e4m3fn, scale the group's amax / 448 (ORT's MatMulBlockQuantizedFp8Weight's rule, per
  block of 128 along K, where the ONNX netlist's fp8 cells come from). `packed` is [K, N]; `lows` is empty.
- int8: w ~ q * scale, q int8 in -127..127, scale the group's amax / 127 (symmetric, as softsyn maps ORT's int8
  MatMulNBits cells). `packed` is int8 [K, N]; `lows` is empty. fp8 and int8 are "byte codes": one code a weight,
  no low, the same kernel path.

The kernel computes y[M, N] = x[M, K] @ dequant(W)^T with fp32 products. Autotuned (decode): every program reads a
chunk of one group's weight rows for a tile of outputs once, multiplies each row of x by it and adds the partials
into y atomically (split-K at the finest grain, each group's scale applied once to a chunk's dot product); a launch
with a BLOCK_M > 1 config runs tensor-core tiles that loop over the groups instead. On CUDA it is autotuned
(AOTInductor tunes it once at the example shapes of each package); elsewhere it runs at `DEFAULT_CONFIG` or a given
config (CPU tests run it in Triton's interpreter, TRITON_INTERPRET=1), and without Triton the op computes the same
product in torch.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch

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
    packed: torch.Tensor  # int4: uint8 [K / 2, N]; fp8: float8_e4m3fn [K, N]; int8: int8 [K, N]
    scales: torch.Tensor  # [K / group, N], the activations' dtype
    lows: torch.Tensor  # int4: [K / group, N]; byte codes (fp8, int8): empty
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
        return PackedWeights(codes.reshape(out, width).t().contiguous(), scale[..., 0].t().contiguous().to(dtype),
                             torch.empty(0, dtype=dtype, device=weight.device), group)
    low = w.amin(-1, keepdim=True).to(dtype).float()
    scale = ((w.amax(-1, keepdim=True) - low) / LEVELS).clamp(min=1e-8).to(dtype).float()
    codes = ((w - low) / scale).round().clamp(0, LEVELS).to(torch.uint8)
    half = group // 2
    packed = codes[..., :half] | (codes[..., half:] << 4)  # [N, K / group, group / 2]
    return PackedWeights(packed.reshape(out, width // 2).t().contiguous(), scale[..., 0].t().contiguous().to(dtype),
                         low[..., 0].t().contiguous().to(dtype), group)


def dequantise(packed: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor) -> torch.Tensor:
    """The [N, K] weight the kernel multiplies by (in the scales' dtype), from the packed format: a transposed view of
    [K, N] computed in the packed format's own order (N contiguous), so the prompt form's dequantise kernel reads
    and writes along N, coalesced both ways (the [N, K] order read the codes across rows)."""
    rows, out = packed.shape
    groups = scales.shape[0]
    if byte_codes(packed):
        w = packed.to(scales.dtype).reshape(groups, rows // groups, out) * scales[:, None, :]
        return w.reshape(rows, out).t()
    half = rows // groups
    tiles = packed.reshape(groups, half, out)  # a group's row i: input i (low nibble) and half + i (high)
    codes = torch.cat([tiles & 0xF, tiles >> 4], dim=1).to(scales.dtype)  # [groups, group, N]
    return (codes * scales[:, None, :] + lows[:, None, :]).reshape(groups * 2 * half, out).t()


if triton is not None:
    @triton.jit
    def weight_matmul_kernel(x_ptr, w_ptr, s_ptr, l_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                             GROUP: tl.constexpr, BYTE_CODES: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, ROWS: tl.constexpr = 16):
        """y[M, N] (zeros on entry) += x[M, K] @ W^T, W dequantised from the packed format (module docstring;
        BYTE_CODES: fp8 or int8, else int4). BLOCK_M 1 (decode): program (0, j, c) multiplies every row by `ROWS`
        weight rows of one group (chunk c) for outputs j and adds its partials into y atomically, so even a narrow
        layer spreads over every SM (GEMV "split-K" at the finest grain, as gemlite's RevSplit-K GEMV does).
        BLOCK_M > 1 (`launch` with a config; not autotuned): program (i, j, 0) loops over every group with
        tensor-core tiles and stores its tile."""
        HALF: tl.constexpr = GROUP // 2
        GROUP_ROWS: tl.constexpr = GROUP if BYTE_CODES else HALF  # weight rows a group takes
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        if BLOCK_M == 1:
            # the chunk's codes read once for every row (the grid names no row: a package's dynamic row count stays
            # a kernel argument, never a launch dimension); the group's scale (and low) applied once to each row's
            # dot product: x . (q * s + l) = s * (x . q) + l * sum(x), one convert and one fma a weight
            CHUNK: tl.constexpr = ROWS if ROWS < GROUP_ROWS else GROUP_ROWS
            first = tl.program_id(2) * CHUNK
            group = first // GROUP_ROWS
            rr = first + tl.arange(0, CHUNK)
            # no `other`: an output past N only sums its own column, which the atomic's mask drops
            codes = tl.load(w_ptr + rr[:, None] * N + rn[None, :], mask=rn[None, :] < N)
            scale = tl.load(s_ptr + group * N + rn, mask=rn < N, other=0.0).to(tl.float32)
            if BYTE_CODES:
                q = codes.to(tl.float32)
            else:
                q_lo, q_hi = (codes & 0xF).to(tl.float32), (codes >> 4).to(tl.float32)
                low = tl.load(l_ptr + group * N + rn, mask=rn < N, other=0.0).to(tl.float32)
                lo_in = group * GROUP + rr % HALF  # a group's row i holds inputs i (low nibble) and HALF + i
            for row in range(0, M):
                if BYTE_CODES:
                    a = tl.load(x_ptr + row * stride_xm + rr).to(tl.float32)
                    part = tl.sum(a[:, None] * q, 0) * scale
                else:
                    a_lo = tl.load(x_ptr + row * stride_xm + lo_in).to(tl.float32)
                    a_hi = tl.load(x_ptr + row * stride_xm + lo_in + HALF).to(tl.float32)
                    part = tl.sum(a_lo[:, None] * q_lo + a_hi[:, None] * q_hi, 0) * scale + \
                        (tl.sum(a_lo, 0) + tl.sum(a_hi, 0)) * low
                tl.atomic_add(y_ptr + row * stride_ym + rn, part.to(y_ptr.dtype.element_ty), mask=rn < N,
                              sem="relaxed")
        else:
            rk = tl.arange(0, HALF)
            rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
            row_ok, col_ok = rm[:, None] < M, rn[None, :] < N
            x_rows = x_ptr + rm[:, None] * stride_xm + rk[None, :]
            w_tile = w_ptr + rk[:, None] * N + rn[None, :]
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, K, GROUP):
                g = k0 // GROUP
                a_lo = tl.load(x_rows + k0, mask=row_ok, other=0.0)
                a_hi = tl.load(x_rows + k0 + HALF, mask=row_ok, other=0.0)
                scale = tl.load(s_ptr + g * N + rn, mask=rn < N, other=0.0)[None, :]
                if BYTE_CODES:
                    w_lo = tl.load(w_tile + g * GROUP_ROWS * N, mask=col_ok, other=0.0).to(a_lo.dtype) * scale
                    w_hi = tl.load(w_tile + (g * GROUP_ROWS + HALF) * N, mask=col_ok, other=0.0).to(a_lo.dtype) * scale
                else:
                    codes = tl.load(w_tile + g * GROUP_ROWS * N, mask=col_ok, other=0)
                    low = tl.load(l_ptr + g * N + rn, mask=rn < N, other=0.0)[None, :]
                    w_lo = (codes & 0xF).to(a_lo.dtype) * scale + low
                    w_hi = (codes >> 4).to(a_lo.dtype) * scale + low
                acc += tl.dot(a_lo, w_lo.to(a_lo.dtype))
                acc += tl.dot(a_hi, w_hi.to(a_lo.dtype))
            tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                     mask=row_ok & col_ok)

    # decode (a few rows) wants many small programs over one chunk of a group each; a prompt takes the prompt form
    # (use_prompt_form) in a prefill package, so only one-row configs are tuned, and their grid is static (no row
    # count in it: torch 2.11's AOTInductor failed to autotune a grid over the dynamic rows, "launcher() missing 1
    # required positional argument: '_launcher_s1'", H100, 2026-12-06). Few configs, small ones: on the H100 (24 calls
    # a graph, 2026-12-06) one warp over 64-128 outputs was fastest at every qwen3-1.7b decode shape, 256-512 outputs
    # 1.5-4x slower; AOTInductor compiles every config of every layer shape. restore_value: Triton's autotuner (eager
    # calls) puts y back to zeros after timing each config.
    CONFIGS = [triton.Config({"BLOCK_M": 1, "BLOCK_N": n, "ROWS": r}, num_warps=w, num_stages=1)
               for n, r, w in ((32, 32, 1), (64, 16, 1), (64, 32, 1), (64, 64, 1), (128, 16, 1), (128, 32, 2))]
    tuned_kernel = triton.autotune(configs=CONFIGS, key=["M", "N", "K"], restore_value=["y_ptr"])(weight_matmul_kernel)

DEFAULT_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 64}  # where the kernel runs untuned (the interpreter)


def launch(flat: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor,
           config: dict | None = None) -> torch.Tensor:
    """The kernel on `flat` [M, K] (contiguous): autotuned on CUDA unless `config` ({"BLOCK_M", "BLOCK_N"[, "ROWS"]})
    is given, at `config` or DEFAULT_CONFIG elsewhere (Triton's interpreter)."""
    rows, width, out = flat.shape[0], flat.shape[1], packed.shape[1]
    group = width // scales.shape[0]
    one_code = byte_codes(packed)
    group_rows = group if one_code else group // 2
    y = torch.zeros((rows, out), device=flat.device, dtype=flat.dtype)  # the one-row programs add into it

    def grid(meta):
        if meta["BLOCK_M"] == 1:  # every row in each program (no symbolic size in the launch)
            return 1, triton.cdiv(out, meta["BLOCK_N"]), packed.shape[0] // min(meta.get("ROWS", 16), group_rows)
        return triton.cdiv(rows, meta["BLOCK_M"]), triton.cdiv(out, meta["BLOCK_N"]), 1

    args = (flat, packed, scales, lows, y, rows, out, width, flat.stride(0), out)
    if flat.device.type == "cuda" and config is None:
        torch.library.wrap_triton(tuned_kernel)[grid](*args, GROUP=group, BYTE_CODES=one_code)
    else:
        config = config or DEFAULT_CONFIG
        torch.library.wrap_triton(weight_matmul_kernel)[grid(config)](*args, GROUP=group, BYTE_CODES=one_code, **config)
    return y


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@torch.library.triton_op("softsyn::weight_matmul", mutates_args=())
def weight_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ W^T for W in the packed format: the Triton kernel on CUDA (and in Triton's interpreter), torch's
    matmul over the dequantised weight elsewhere."""
    width, out = x.shape[-1], packed.shape[1]
    flat = x.reshape(-1, width)
    if triton is None or (x.device.type != "cuda" and not interpreting()):
        return (flat @ dequantise(packed, scales, lows).t()).reshape(*x.shape[:-1], out)
    y = launch(flat.contiguous(), packed, scales, lows)
    return y.reshape(*x.shape[:-1], out)


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
        rows = weights.packed.shape[0]
        self.in_features, self.out_features = rows if byte_codes(weights.packed) else rows * 2, weights.packed.shape[1]
        self.prompt_form = False  # True: dequantise, then one fp16 matmul (use_prompt_form)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, group: int, precision: str = "int4") -> QuantLinear:
        return cls(quantise(linear.weight, group, linear.weight.dtype, precision), linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.prompt_form:
            return torch.nn.functional.linear(x, dequantise(self.packed, self.scales, self.lows), self.bias)
        y = torch.ops.softsyn.weight_matmul(x, self.packed, self.scales, self.lows)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group={self.group}, "
                f"{self.precision} (softsyn)")


def use_prompt_form(model: torch.nn.Module, on: bool) -> int:
    """Set every QuantLinear of `model` to the prompt form (on) or the kernel (off); how many. At 512 rows the kernel's
    tensor-core tiles took 2.1-2.5x cuBLAS fp16's time (H100, 2026-12-06, bench/torch_kernels.py), so a prompt
    dequantises each weight (one Inductor kernel) and runs cuBLAS; at decode the kernel reads a quarter of the bytes.
    Both forms read the same buffers, so a decode and a prefill package share one set of weights."""
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    for layer in layers:
        layer.prompt_form = on
    return len(layers)


def replace_linears(model: torch.nn.Module, linears: list[torch.nn.Linear], group: int, precision: str = "int4") -> int:
    """Put a QuantLinear at `precision` and `group` where each of `linears` is held (by any parent); how many."""
    ids, done = {id(lin) for lin in linears}, {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in ids:
                if id(child) not in done:
                    done[id(child)] = QuantLinear.from_linear(child, group, precision)
                setattr(parent, name, done[id(child)])
    return len(done)
