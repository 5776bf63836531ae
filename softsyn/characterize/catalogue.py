"""The cell catalogue: every CellKind characterisation measures, in library order, and its size grids.

A `CellKind` names a library cell (op, precision, implementation variant), the size axes its delay
table is indexed by (exactly the keys `softsyn.timing.cost.node_work(...).sizes` gives that op), one grid
per axis and per plan (cpu, cpu-quick, cuda, cuda-quick), and a `build(sizes, copies, ctx)`
(softsyn.characterize.recipes) that returns a graph holding `copies` independent instances of the op (each with
its own weights), all fed from the same graph inputs and each writing its own graph output. Characterisation
times that graph at `copies` = N and 1 and takes the difference / (N - 1) as the per-node delay, so the
fixed cost of a session run never enters a cell (the `Run` cell measures it separately).

Conventions that the size axes rely on (they are what cost.py computes for real nodes):
- `elements`: output elements for element-wise / data-movement ops, input elements for reductions
  and normalisations. Row-wise ops (Softmax, Reduce*, *LayerNorm*, TopK) are measured on rows of
  `min(elements, ROW)` columns (ROW = 256 on CPU, 1024 on CUDA): the row length is folded into the
  element count (documented approximation; real rows are the hidden size or the KV length).
- MatMul with a weight initializer: m (rows = product of the output's leading dims), n, k.
- MatMul of two activations (attention scores, attn x V): batch (product of the leading dims), m, n, k.
- MatMulNBits: m, n, k, block (block_size); precision int4 / int8 by the `bits` attribute.
- MatMulBlockQuantizedFp8Weight: m, n, k, block (block_size); precision fp8 (e4m3 weight [n, k], fp32 block scales).
- MoE / QMoE: tokens, experts, k, hidden, inter (the summed width of one expert's matrices); weights per copy.
- GroupQueryAttention / MultiHeadAttention: q_tokens, kv_len, heads, measured at batch 1 and a
  fixed head_dim (and kv_heads = heads / GQA_GROUP); batch and head_dim enter through the cell's
  `scale` rule (see softsyn.library.model).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

from softsyn.characterize.cellgraph import BOOL, FP8, INT8, Ctx, Graph
from softsyn.characterize.recipes import (
    GQA_GROUP, NBITS_CPU_ATTRIBUTES, batched_matmul, bias_gelu, binary, cast, concat, dequantize, expand, gather, gather_nd, gemm, gqa,
    matmul, matmul_fp8, matmul_nbits, mha, moe, norm, qmoe, range_op, reduce, reshape_like, rotary, shape_op, slice_op, softmax,
    split, topk, transpose, unary, where)

NBITS_NOTES = ("weight-only {}-bit, per-block scales, no zero point, activations fp32 (CPU; accuracy_level 4: MLAS "
               "quantises them to int8 per block) / fp16 (CUDA)")


@dataclass
class CellKind:
    op: str
    precision: str
    axes: list[str]
    grids: dict  # plan ("cpu", "cpu-quick", "cuda", "cuda-quick") -> [grid per axis]
    build: Callable[[dict, int, Ctx], Graph]
    variant: str = ""  # implementation suffix: "batched", ...
    providers: tuple = ("cpu", "cuda")
    scale: dict | None = None  # size -> reference value (folded into the table by a scaling rule)
    bytes_per_weight: float | None = None
    notes: str = ""
    discrete: tuple = ()  # axes with only legal values (no hold-out midpoints along them), e.g. block
    align: dict | None = None  # axis -> the multiple the kernel needs there: hold-out midpoints are rounded to it
    attributes: dict | None = None  # provider -> node attributes the cell is built and emitted with (the library's
    # `attributes`: a node the compile writes carries them, so it runs the kernel the table timed)

    def holdouts(self, grids: list[list[float]], limit: int) -> list[tuple]:
        """The hold-out points of this kind's table over `grids` (holdout_points): none along its discrete axes,
        its aligned axes' midpoints on the widths its kernel takes."""
        from_axis = {self.axes.index(a): m for a, m in (self.align or {}).items()}
        return holdout_points(grids, limit, tuple(self.axes.index(a) for a in self.discrete), from_axis)

    @property
    def key(self) -> str:
        return f"{self.op}.{self.precision}" + (f".{self.variant}" if self.variant else "")

    def implementation(self, provider: str) -> str:
        return f"ort-{provider}" + (f"-{self.variant}" if self.variant else "")


def plan_name(provider: str, quick: bool) -> str:
    """The plan a run measures: its provider, "-quick" for the small grids."""
    return provider + ("-quick" if quick else "")


# ------------------------------------------------------------------------------------------ grids

def _e(points: list) -> list[list]:
    """An elements-only grid: one axis of `points`."""
    return [list(points)]


E_CPU = _e([1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 20])
E_CPU_Q = _e([1, 64, 4096, 262144])
E_GPU = _e([1, 1024, 16384, 262144, 1 << 22, 1 << 25])
E_GPU_Q = _e([1, 16384, 1 << 22])
# moves/views: the big end matters less on the tiny zoo, smaller grid on CPU
E_SMALL_CPU = _e([1, 4, 16, 64, 256, 1024, 4096, 16384, 65536])
E_SMALL_CPU_Q = _e([1, 256, 65536])
# GatherND also gathers MoE expert weights per token: outputs of tens of MiB, far beyond the caches
E_GATHER_CPU = _e([1, 16, 256, 4096, 65536, 1 << 20, 1 << 22, 1 << 24])
EL = {"cpu": E_CPU, "cpu-quick": E_CPU_Q, "cuda": E_GPU, "cuda-quick": E_GPU_Q}
ES = {"cpu": E_SMALL_CPU, "cpu-quick": E_SMALL_CPU_Q, "cuda": E_GPU, "cuda-quick": E_GPU_Q}

# Gemm on the CPU (no zoo model uses it; imported ONNX files do): a coarse grid, but not corners only (a 2 x 2 x 2 grid
# read 33-81 % off at its hold-out midpoints, where the weights move between cache and memory)
GEMM_CPU = [[1, 16, 128], [32, 256, 2048], [32, 256, 2048]]
MM = {  # m, n, k: tokens x hidden sizes (CPU zoo: hidden 128-384, intermediate 256-1536, vocab 1024-30522)
    # CPU: points on the zoo's own sizes (tokens 1/4/16/128/512, widths 128/256/384/1024/1536): ORT's CPU GEMM
    # is not a power law between far-apart points ([16, 384] @ [384, 384]: 25 us measured, 17 us interpolated
    # from the m {8, 64} x n, k {256, 2048} grid)
    "cpu": [[1, 4, 16, 128, 512], [32, 128, 256, 384, 1024, 1536, 16384], [32, 128, 256, 384, 1536]],
    "cpu-quick": [[1, 128], [64, 1024], [64, 1024]],
    # real models: hidden 1024-4096, intermediate up to 12288, vocab 151936, tokens 1..512(+)
    "cuda": [[1, 16, 128, 512, 2048], [256, 1024, 4096, 12288, 151936], [256, 1024, 4096, 12288]],
    "cuda-quick": [[1, 512], [1024, 12288], [1024, 4096]],
}
BMM = {  # batch (heads x batch), m (q tokens), n, k (head_dim or kv length)
    "cpu": [[1, 4, 16], [1, 16, 128, 512], [1, 32, 128, 512], [32, 128, 512]],  # n = 1: MoE batched_mm experts
    "cpu-quick": [[1, 16], [1, 128], [32, 512], [32, 512]],
    "cuda": [[1, 8, 32], [1, 128, 512, 2048], [64, 512, 4096], [64, 512, 4096]],
    "cuda-quick": [[1, 32], [1, 512], [64, 4096], [64, 4096]],
}
BMM_EXPERT = {  # batch (tokens x top-k), m, n = 1, k (expert width / hidden): MoE batched_mm experts
    # transformers' batched_mm exports W_gathered [batch, m, k] @ x [batch, k, 1]: A is the per-token expert weight
    # GatherND just wrote (batch x m x k, 64 MiB fp32 at the grid's top, beyond the caches), ORT's CPU MatMul loops
    # one GEMV per batch item over it, so the general BMM grid (batch <= 16, A in cache) cannot speak for it.
    "cpu": [[16, 128, 1024], [32, 64, 128], [1], [32, 64, 128]],
    "cpu-quick": [[16, 1024], [32, 128], [1], [32, 128]],
}
NB = {  # m, n, k, block
    "cpu": [[1, 16, 128], [256, 2048, 16384], [256, 2048], [32, 64, 128]],
    "cpu-quick": [[1, 128], [256, 2048], [256, 1024], [32, 128]],
    # n stops at 12288 on CUDA: a vocab-size int4 weight (151936 x 12288) is a 0.9 GB initializer per point, and
    # building, serialising and loading those dominated the H200 run; above the grid the edge slope continues
    "cuda": [[1, 16, 128, 512], [1024, 4096, 12288], [1024, 4096, 12288], [32, 64, 128]],
    "cuda-quick": [[1, 512], [1024, 12288], [1024, 4096], [32, 128]],
}
MOE = {  # tokens, experts, k, hidden, inter (summed expert width: 3 x moe_intermediate for SwiGLU)
    # CUDA: Qwen3-30B-A3B (hidden 2048, I 768) and 235B-A22B (4096, 1536) widths, 128 experts top-8; tokens from a
    # decode step (k experts read) to a prefill that touches all 128. CPU: the tiny zoo's widths.
    "cpu": [[1, 16, 128], [4, 16], [2], [128, 512], [192, 768]],
    "cpu-quick": [[1, 16, 128], [4], [2], [128], [192]],
    "cuda": [[1, 8, 64, 512, 2048], [128], [8], [2048, 4096], [2304, 4608]],
    "cuda-quick": [[1, 64, 512], [128], [8], [2048], [2304]],
}
# ORT's CUDA MoE GEMMs need aligned widths: an expert width of 1086 (the midpoint of 2304 and 4608, / 3) stopped the
# H100 with "CUDA failure 716: misaligned address" (2026-12-07); QMoE's block-128 scales need K a multiple of 128.
# So hold-outs lie on hidden widths of 128k and expert widths I = inter / 3 of 128k, as real models' do.
MOE_ALIGN = {"hidden": 128, "inter": 3 * 128}
ATT = {  # q_tokens, kv_len, heads
    "cpu": [[1, 16, 128, 512], [16, 128, 512, 2048], [4, 16]],
    "cpu-quick": [[1, 128], [128, 1024], [4, 16]],
    "cuda": [[1, 16, 128, 512, 2048], [128, 512, 2048, 4096, 8192], [8, 16, 32]],
    "cuda-quick": [[1, 512], [512, 4096], [16, 32]],
}


def _mm(prec):
    return lambda s, c, ctx: matmul(s, c, ctx, prec)


def _gemm(prec):
    return lambda s, c, ctx: gemm(s, c, ctx, prec)


def _bmm(prec, chain: bool = True):
    return lambda s, c, ctx: batched_matmul(s, c, ctx, prec, chain)


def cell_kinds() -> list[CellKind]:
    """Every cell kind, in library order (more specific cells of an op before less specific ones)."""
    ks: list[CellKind] = []
    A = ["elements"]
    # dense matmuls at every float precision (recorded only where the provider computes in it)
    for p in ("fp32", "fp16", "bf16"):
        if p == "fp32":  # listed before the general batched cell; Library.cell_for picks the cell covering the sizes
            ks.append(CellKind("MatMul", p, ["batch", "m", "n", "k"], BMM_EXPERT, _bmm(p, chain=False),
                               variant="batched-expert", providers=("cpu",),
                               notes="MoE per-token experts: gathered weights [batch, m, k] @ x [batch, k, 1], batch = "
                                     "tokens x top-k; independent copies (A streamed from memory, as in the model)"))
        ks.append(CellKind("MatMul", p, ["batch", "m", "n", "k"], BMM, _bmm(p), variant="batched",
                           notes="two activations [batch, m, k] @ [batch, k, n] (attention scores, attn x V)"))
        ks.append(CellKind("MatMul", p, ["m", "n", "k"], MM, _mm(p), bytes_per_weight={"fp32": 4}.get(p, 2),
                           notes="[m, k] @ W[k, n], W an initializer"))
        ks.append(CellKind("Gemm", p, ["m", "n", "k"], {**MM, "cpu": GEMM_CPU} if p == "fp32" else MM,
                           _gemm(p), notes="a @ W^T + c (transB=1)"))
    for bits, p in ((4, "int4"), (8, "int8")):
        ks.append(CellKind("MatMulNBits", p, ["m", "n", "k", "block"], NB, matmul_nbits(bits), bytes_per_weight=bits / 8,
                           discrete=("block",), attributes={"cpu": NBITS_CPU_ATTRIBUTES}, notes=NBITS_NOTES.format(bits)))
    # the CUDA provider's only fp8 weight matmul (ORT's CPU provider has no kernel for it); the MatMulNBits grid
    ks.append(CellKind("MatMulBlockQuantizedFp8Weight", "fp8", ["m", "n", "k", "block"], NB, matmul_fp8,
                       providers=("cuda",), bytes_per_weight=1, discrete=("block",),
                       notes="weight-only block-scaled fp8 (e4m3fn B [n, k], fp32 scale per block along k), "
                             "activations fp16, no a_scale, no bias"))
    ks.append(CellKind("DequantizeLinear", "fp8", A, EL, dequantize(FP8, "fp8"), bytes_per_weight=1,
                       notes="fp8 e4m3fn weight -> activation type (the Q/DQ form of an fp8 weight)"))
    ks.append(CellKind("DequantizeLinear", "int8", A, EL, dequantize(INT8, "int8"), bytes_per_weight=1))
    # attention
    for p in ("fp32", "fp16", "bf16"):
        ks.append(CellKind("GroupQueryAttention", p, ["q_tokens", "kv_len", "heads"], ATT, gqa(p),
                           scale={"batch": 1, "head_dim": None}, discrete=("heads",),  # heads % kv_heads == 0
                           notes=f"batch 1, kv_heads = heads / {GQA_GROUP}, shared past/present buffer of kv_len positions"))
        ks.append(CellKind("MultiHeadAttention", p, ["q_tokens", "kv_len", "heads"], ATT, mha(p),
                           scale={"batch": 1, "head_dim": None}, notes="batch 1, BSNH query/key/value, no mask"))
    # kv_layout's int8 KV cache (kv_cache.dtype int8 on GPU targets): the cache's dtype is the cell's precision
    ks.append(CellKind("GroupQueryAttention", "int8", ["q_tokens", "kv_len", "heads"], ATT, gqa("fp16", "int8"),
                       providers=("cuda",), scale={"batch": 1, "head_dim": None}, discrete=("heads",),
                       notes=f"fp16 activations, int8 past/present (PER_CHANNEL fp32 scales), batch 1, kv_heads = "
                             f"heads / {GQA_GROUP}, shared buffer of kv_len positions"))
    # mixture of experts (the fuse pass's com.microsoft.MoE; QMoE for int4/int8 experts)
    moe_axes = ["tokens", "experts", "k", "hidden", "inter"]
    for p in ("fp32", "fp16", "bf16"):
        ks.append(CellKind("MoE", p, moe_axes, MOE, moe(p), discrete=("experts", "k"), align=MOE_ALIGN,
                           providers=("cpu", "cuda") if p != "bf16" else ("cuda",),
                           bytes_per_weight={"fp32": 4}.get(p, 2),
                           notes="SwiGLU experts (swiglu_fusion=1), uniform random routing, normalised top-k"))
    for bits, p in ((4, "int4"), (8, "int8")):
        ks.append(CellKind("QMoE", p, moe_axes, MOE, qmoe(bits), discrete=("experts", "k"), align=MOE_ALIGN,
                           bytes_per_weight=bits / 8,
                           notes=f"{bits}-bit block-128 experts, scales in the activation type, no zero points, "
                                 "raw layout (weights_prepacked=0)"))
    # normalisations and fused element-wise
    for op, kw in (("SimplifiedLayerNormalization", {}), ("LayerNormalization", {"bias": True}),
                   ("SkipSimplifiedLayerNormalization", {"skip": True, "domain": "com.microsoft"}),
                   ("SkipLayerNormalization", {"skip": True, "bias": True, "domain": "com.microsoft"})):
        ks.append(CellKind(op, "fp32", A, EL, norm(op, **kw), notes="rows of min(elements, ROW) columns"))
        ks.append(CellKind(op, "fp16", A, EL, norm(op, **kw), providers=("cuda",)))
        if op.endswith("SimplifiedLayerNormalization"):  # Qwen3's RMSNorms in bf16: a bf16 region's norms (CUDA)
            ks.append(CellKind(op, "bf16", A, EL, norm(op, **kw), providers=("cuda",)))
    ks.append(CellKind("RotaryEmbedding", "fp32", A, EL, rotary, notes="com.microsoft, fixed head_dim"))
    ks.append(CellKind("RotaryEmbedding", "fp16", A, EL, rotary, providers=("cuda",)))
    for op in ("BiasGelu", "FastGelu", "QuickGelu"):
        ks.append(CellKind(op, "fp32", A, EL, bias_gelu(op)))
        ks.append(CellKind(op, "fp16", A, EL, bias_gelu(op), providers=("cuda",)))
    # plain ONNX ops of a dynamo export (CPU zoo) - fp32; the CUDA plan also records them in fp16
    fam = []
    for op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"):
        fam.append((op, EL, binary(op)))
    for op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"):
        fam.append((op, ES, binary(op, out_elem=BOOL)))
    fam.append(("And", ES, binary("And", in_elem=BOOL)))
    fam.append(("Or", ES, binary("Or", in_elem=BOOL)))
    fam.append(("Where", ES, where))
    for op in ("Neg", "Sqrt", "Reciprocal", "Sigmoid", "Cos", "Sin", "Erf", "Exp", "Tanh", "Relu", "Abs", "Log"):
        fam.append((op, EL, unary(op)))
    fam.append(("IsNaN", ES, unary("IsNaN", out_elem=BOOL)))
    fam.append(("Not", ES, unary("Not", in_elem=BOOL)))
    fam.append(("Cast", ES, cast))
    fam.append(("Softmax", EL, softmax))
    for op in ("ReduceMean", "ReduceSum", "ReduceMax"):
        fam.append((op, EL, reduce(op)))
    fam.append(("TopK", ES, topk))
    fam.append(("Transpose", EL, transpose))
    for op in ("Reshape", "Unsqueeze", "Squeeze", "Identity"):
        fam.append((op, ES, reshape_like(op)))
    fam.append(("Shape", {k: [[1, 2, 4]] for k in EL}, shape_op))
    fam.append(("Concat", ES, concat))
    fam.append(("Slice", ES, slice_op))
    fam.append(("Split", ES, split))
    fam.append(("Expand", ES, expand))
    fam.append(("Gather", EL, gather))
    fam.append(("GatherND", {**ES, "cpu": E_GATHER_CPU}, gather_nd))
    fam.append(("Range", {k: ([[1, 16, 256, 4096]] if k.startswith("cpu") else [[1, 4096]]) for k in EL}, range_op))
    int_ops = {"Cast", "Range", "Shape", "And", "Or", "Not"}
    for op, grid, build in fam:
        ks.append(CellKind(op, "fp32", A, grid, build))
        if op not in int_ops:
            ks.append(CellKind(op, "fp16", A, grid, build, providers=("cuda",)))
    return ks


def run_cell_grid(plan: str) -> list[list[int]]:
    return [[2, 4, 8, 16, 32]] if not plan.endswith("quick") else [[2, 8, 32]]


def geometric_mid(a: float, b: float) -> int:
    return int(round(math.sqrt(a * b)))


def holdout_points(grids: list[list[float]], limit: int, discrete: tuple = (),
                   align: dict | None = None) -> list[tuple]:
    """Geometric midpoints: along each axis (other axes on grid points) and cell centres, deduplicated.

    `discrete`: indices of axes with only legal values (block size): no midpoints along them. `align`: axis index ->
    the multiple a midpoint there is rounded to (the widths a kernel takes)."""
    def mid(a: int, x: float, y: float) -> int:
        m, step = geometric_mid(x, y), (align or {}).get(a)
        return max(step, step * round(m / step)) if step else m

    mids = [[] if a in discrete else [mid(a, x, y) for x, y in zip(g, g[1:])] for a, g in enumerate(grids)]
    pts: list[tuple] = []
    for a, m in enumerate(mids):
        for v in m:
            if v in grids[a]:
                continue
            others = list(grids)
            others[a] = [v]
            pts.extend(itertools.product(*others))
    if any(mids):
        pts.extend(itertools.product(*[m if m else grids[a] for a, m in enumerate(mids)]))
    out = list(dict.fromkeys(pts))  # deduplicated, first occurrence order
    if len(out) > limit:  # spread the kept ones over the list (deterministic)
        step = len(out) / limit
        out = [out[int(i * step)] for i in range(limit)]
    return out
