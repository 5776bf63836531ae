"""Whether a target realises bf16 MatMul cells, and whether the compile loop starts from them (precision.default
bf16): read by the precision pass (the float design under a bf16 start is fp16) and by passes.optimize.fallback
(uniform bf16: the fallback and the start), and by the compile loop's mapping (the bf16 option). In passes.rules
because all three import it (passes.rules' docstring)."""
from __future__ import annotations

BF16 = "bf16"


def realisable(design) -> str:
    """"" when this target realises uniform bf16 as bf16 cells, else why not (the float design is kept instead)."""
    lib = design.library
    if not lib.is_gpu:
        return f"the CPU target (library {lib.name}) has no bf16 MatMul kernel in ORT"
    if not lib.has_cell("MatMul", BF16):
        return f"library {lib.name} has no MatMul.bf16 cell"
    return ""


def start_why_not(design) -> str | None:
    """Whether the compile loop starts from uniform bf16: None where precision.default is not bf16 (nothing to say);
    "" where it does (bf16 in precision.allowed, the target realises bf16 cells); else why it starts from the float
    design (precision's substitution: fp16 on a GPU, as at effort low before this rule)."""
    precision = design.constraints.precision
    if precision.default != BF16:
        return None
    if BF16 not in (precision.allowed or ()):
        return "bf16 is not in precision.allowed"
    return realisable(design)
