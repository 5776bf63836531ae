"""The uniform precision a compile asks for (precision.default) and the float design it realises: fp16 on GPU
targets, fp32 on CPU, bf16 as fp16 (said), a quantised default (int4/int8/fp8) as the float design under a uniform
weight map (the precision pass builds it)."""
from __future__ import annotations

from softsyn.errors import SoftsynError
from passes.rules.bf16 import start_why_not

UNIFORM = ("fp32", "fp16")
WEIGHTS_ONLY = ("int4", "int8", "fp8")  # quantised defaults: a uniform weight map over the float design
# A requested precision the uniform map does not realise, and the one it realises instead when the constraints allow
# it: bf16 and fp16 carry the same bytes, and ORT's CPU provider has no bf16 MatMul to verify a bf16 artifact on.
# Per-cell bf16 comes with the compile loop's precision moves; the substitution is logged and reported, never silent.
SUBSTITUTE = {"bf16": "fp16"}


def bf16_start(design) -> bool:
    """Whether the compile loop starts this design's MatMul cells in bf16 (passes.rules.bf16.start_why_not):
    then the float design under them is fp16 whether or not precision.allowed names fp16."""
    return start_why_not(design) == ""


def default_precision(design) -> tuple[str, str]:
    """(requested, realised) uniform precision."""
    cons = design.constraints
    native = "fp16" if design.library.is_gpu else "fp32"
    chosen = cons.precision.default or native
    if chosen in UNIFORM:
        return chosen, chosen
    if chosen in WEIGHTS_ONLY:  # the float design under the weight map
        return chosen, native
    instead = SUBSTITUTE.get(chosen)
    if instead is not None and (instead in cons.precision.allowed or bf16_start(design)):
        return chosen, instead
    raise SoftsynError(f"{cons.source}: precision.default: {chosen} is not a uniform precision the low-effort "
                       f"compile maps; valid: {', '.join(UNIFORM + WEIGHTS_ONLY)}"
                       + (f" (or {chosen} with {instead} in precision.allowed)" if instead else ""))
