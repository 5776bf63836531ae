"""What a suggestion must agree with (Facts), and the advice per op type that follows from it.

A suggestion never proposes a move the compile loop found slower (a fusion the fuse pass kept unfused because the
library times it slower, a precision the optimize pass pruned as no faster), nor one the constraints forbid (a
precision outside precision.allowed), nor one that does not apply to the design (KV-cache advice without a KV
cache, CUDA graphs on a CPU target). Facts come from the design and its pass reports at compile or analyze time
(`design_facts`), else from the Analysis alone (`analysis_facts`: the conservative subset), and are saved beside
the reports (reports/suggestions.json) so the HTML page renders the same advice as the text.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from passes import report_of
from passes.fuse.base import FusionReport
from passes.fuse.cost import KEPT
from passes.optimize import OptimizeReport

# Precision ranks, widest first: a "lower" precision is one to the right of the current one
RANKS = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")
MATMUL_OPS = {"MatMul", "Gemm", "FusedMatMul", "MatMulInteger", "QLinearMatMul", "Einsum"}
LOW_BIT_OPS = {"MatMulNBits", "QMoE", "MatMulBlockQuantizedFp8Weight"}
FUSED_ATTENTION = {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PagedAttention"}
UNFUSED_NORMS = {"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization", "RMSNorm"}
FUSED_NORMS = {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}
FUSED_OTHER = {"BiasGelu", "FastGelu", "Gelu", "QuickGelu", "RotaryEmbedding", "MoE", "BiasSplitGelu", "BiasAdd"}
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Cast", "Transpose", "Reshape", "Concat",
               "Slice", "Split", "Expand", "Unsqueeze", "Squeeze", "Where", "Sigmoid", "Tanh", "Relu", "Erf", "Exp",
               "ReduceMean", "Shape", "Range", "Equal", "Less", "Greater", "And", "Or", "Not", "Cos", "Sin", "Trilu",
               "ScatterND", "Identity", "Max", "Min", "Softplus", "SiLU"}
ROTARY_OPS = {"RotaryEmbedding"}
KV_KINDS = ("kv",)


@dataclass(frozen=True)
class Fusion:
    """One fusion kind's sites the fuse pass did not fuse: `kept` (the library times the fused cell slower) or
    missed for a structural reason; `reason`: the first site's reason, with its figures."""

    kind: str
    sites: int
    kept: bool
    reason: str


@dataclass(frozen=True)
class Facts:
    """What the design is and what the loop found; None / empty where not known (an Analysis read back alone)."""

    kv_cache: bool = False  # the design holds a KV cache (a decoder's past inputs)
    rotary: bool = False  # the graph holds a rotary embedding
    gpu: bool = False  # the target library runs on a GPU (CUDA graphs, launch overhead apply)
    library: str = ""
    device: str = ""  # the library header's device (the machine its tables were measured on)
    allowed: tuple[str, ...] | None = None  # precision.allowed; None: not known
    current: str | None = None  # the matmuls' uniform precision before any map
    effort: str | None = None  # the compile's effort; None: not a compile (analyze)
    searched: bool = False  # the optimize pass ran (its precision moves are in `precision`)
    pruned: tuple[str, ...] = ()  # the optimize pass's notes on precisions no faster than the current one
    precision: tuple[tuple[str, str], ...] = ()  # (group, the loop's quantified precision line) per violated group
    fusions: tuple[Fusion, ...] = field(default=())
    fallback: str = ""  # the loop's accuracy.fallback line, when it fell back ("" when it did not)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Facts:
        data = dict(data)
        data["fusions"] = tuple(Fusion(**f) for f in data.get("fusions", ()))
        for key in ("allowed",):
            data[key] = tuple(data[key]) if data.get(key) is not None else None
        data["pruned"] = tuple(data.get("pruned", ()))
        data["precision"] = tuple(tuple(p) for p in data.get("precision", ()))
        return cls(**data)

    def lower(self) -> tuple[str, ...]:
        """Allowed precisions below the current one (by RANKS)."""
        if self.allowed is None or self.current not in RANKS:
            return ()
        here = RANKS.index(self.current)
        return tuple(p for p in self.allowed if p in RANKS and RANKS.index(p) > here)

    def fusion(self, *kinds: str) -> list[Fusion]:
        return [f for f in self.fusions if f.kind in kinds]


def analysis_facts(analysis) -> Facts:
    """What the Analysis alone says: a KV cache (KV bytes in the area), rotary (a RotaryEmbedding, or Sin and Cos
    cells), a GPU library."""
    area = analysis.area
    kv = area.kv_budget is not None or any(k.name.lower().startswith(KV_KINDS) and k.bytes > 0 for k in area.by_kind)
    counts = analysis.cell_counts
    rotary = bool(ROTARY_OPS & set(counts)) or {"Sin", "Cos"} <= set(counts)
    gpu = "cuda" in f"{analysis.library} {analysis.library_source}".lower()
    return Facts(kv_cache=kv, rotary=rotary, gpu=gpu, library=analysis.library)


def design_facts(design, analysis, effort=None, precision_lines: dict[str, str] | None = None) -> Facts:
    """The facts of a design after analyze or compile: its kind and KV inputs, precision.allowed, and from the pass
    reports what the fuse pass kept as slower or missed and what the optimize pass pruned; `effort`: the compile's
    effort level (None for analyze); `precision_lines`: the loop's quantified precision move per violated group."""
    base = analysis_facts(analysis)
    fuse = report_of(design, FusionReport) or []
    rotary = base.rotary or any(c.kind == "rotary" and c.candidates for c in fuse)
    fusions = []
    for c in fuse:
        kept = [m for m in c.misses if m.reason.startswith(KEPT)]
        missed = [m for m in c.misses if not m.reason.startswith(KEPT)]
        if kept:
            fusions.append(Fusion(c.kind, len(kept), True, kept[0].reason))
        if missed:
            fusions.append(Fusion(c.kind, len(missed), False, missed[0].reason))
    report = report_of(design, OptimizeReport)
    pruned = tuple(n for n in getattr(report, "notes", []) if "no faster than" in n or "not in precision.allowed" in n)
    retimed = getattr(report, "retime", None)
    if retimed is not None and retimed.kept is None and retimed.why:  # ultra measured the map no faster on the device
        pruned += (f"measured re-timing on {retimed.provider}: {retimed.why}",)
    cons = design.constraints
    current = cons.precision.default or ("fp16" if design.library.is_gpu else "fp32")
    return Facts(kv_cache=design.netlist.kind == "decoder" and base.kv_cache, rotary=rotary, gpu=design.library.is_gpu,
                 library=design.library.name, device=str(design.library.header.get("device") or "").split(" (")[0],
                 allowed=tuple(cons.precision.allowed), current=current,
                 effort=getattr(effort, "name", effort), searched=report is not None, pruned=pruned,
                 precision=tuple((precision_lines or {}).items()), fusions=tuple(fusions),
                 fallback=getattr(getattr(report, "fallback", None), "why", ""))


# ------------------------------------------------------------------------------------------ advice per op type

def weight_advice(facts: Facts) -> str:
    """Area: what lower-precision weights the constraints allow (and tensor parallelism on a GPU target)."""
    tp = " or tensor parallelism" if facts.gpu or facts.allowed is None else ""
    if facts.allowed is None:
        return f"consider lower-precision weights from precision.allowed (MatMulNBits){tp}."
    lower = facts.lower()
    if not lower:
        return f"precision.allowed ({', '.join(facts.allowed)}) leaves no weight precision below {facts.current}{tp}."
    return f"consider precision {'/'.join(lower)} weights (precision.allowed; MatMulNBits){tp}."


def _fusion_lines(facts: Facts, *kinds: str) -> list[str]:
    out = []
    for f in facts.fusion(*kinds):
        if f.kept:
            out.append(f"{f.kind} fusion declined at {f.sites} site{'s' if f.sites != 1 else ''}: the library times "
                       f"it slower ({f.reason.removeprefix(KEPT).strip()})")
        else:
            out.append(f"{f.kind} fusion missed at {f.sites} site{'s' if f.sites != 1 else ''}: {f.reason}")
    return out


def _precision_advice(facts: Facts, group: str) -> str:
    line = dict(facts.precision).get(group)
    if line:
        found = [n for n in facts.pruned if "no faster" in n or "measured" in n]
        return line + (f" ({'; '.join(found)})" if line.startswith("no cell") and found else "")
    if facts.allowed is None:
        return "a lower precision from precision.allowed where the library times it faster (compile --effort medium)"
    lower = facts.lower()
    if not lower:
        return f"precision.allowed ({', '.join(facts.allowed)}) leaves no precision below {facts.current}"
    if not facts.searched:
        when = f"effort {facts.effort}" if facts.effort else "analyze"
        return (f"the precision search over {', '.join(lower)} (precision.allowed) did not run at {when}: "
                "compile --effort medium times each cell at each")
    pruned = [n for n in facts.pruned if "no faster than" in n]
    if pruned:
        return "no allowed precision is faster in the library: " + "; ".join(pruned)
    return f"no cell has a faster precision left ({', '.join(lower)} in precision.allowed x {facts.library})"


def op_advice(op: str, facts: Facts, group: str, decode: bool = False) -> list[str]:
    """What to do about one op type on a violated path, consistent with `facts`; every line states a move and its
    figure, or what the loop found and why there is no move. `decode`: the group reads a KV cache (past > 0)."""
    if op in MATMUL_OPS:
        return [_precision_advice(facts, group)] + _fusion_lines(facts, "packed_qkv", "gate_up")
    if op in LOW_BIT_OPS:
        return ["already low-bit (the optimize pass's map)"] + _fusion_lines(facts, "packed_qkv", "gate_up")
    if op in FUSED_ATTENTION:
        lines = [f"already the fused attention kernel ({op})"]
        if facts.kv_cache and decode:
            lines.append("a lower-precision KV cache (kv_cache.dtype int8 from fp16) halves the KV bytes it reads")
        return lines
    if op == "Softmax":
        return _fusion_lines(facts, "attention") or ["fused attention (MultiHeadAttention / GroupQueryAttention)"]
    if op in UNFUSED_NORMS or op in FUSED_NORMS:
        found = _fusion_lines(facts, "skip_layer_norm", "skip_rms_norm", "layer_norm", "rms_norm")
        if found or op in FUSED_NORMS:
            return found or [f"already fused with its residual Add ({op})"]
        return ["fusing the norm with its residual Add (SkipLayerNormalization / SkipSimplifiedLayerNormalization)"]
    if op in FUSED_OTHER:
        return [f"already a fused runtime kernel ({op})"]
    if op == "Run":
        if facts.gpu:
            return ["per-call overhead: CUDA graph capture or IO binding removes host launches"]
        return ["per-call overhead: fewer, larger runs (more tokens or sequences per run)"]
    if op in {"Gather", "GatherElements", "GatherND"}:
        return ["an embedding lookup: memory-bound; fusing it gains little"]
    if op in ELEMENTWISE:
        return (_fusion_lines(facts, "gelu", "silu", "rotary" if facts.rotary else "")
                or ["small elementwise kernels: fusion into a neighbouring kernel saves their launches"])
    return ["no rule in this library for a faster cell"]
