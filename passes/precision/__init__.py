"""precision (effort low): one uniform precision for the whole netlist.

The default is the library's native activation precision: fp16 on GPU targets, fp32 on CPU
(where ORT runs fp16 MatMuls as Cast -> fp32 -> Cast, so fp16 buys nothing). The constraints'
`precision.default` overrides it. fp32 is the export's precision: the pass changes nothing.
fp16 converts weights, activations and the float ports (past KV in, logits and present KV out),
keeping fp32 islands where fp16 loses more than rounding (softsyn.passes.precision.fp16).
"""
from __future__ import annotations

from softsyn.errors import SoftsynError
from softsyn.passes import PassResult, register
from softsyn.passes.precision.fp16 import to_fp16

UNIFORM = ("fp32", "fp16")


def default_precision(design) -> str:
    chosen = design.constraints.precision.default or ("fp16" if design.library.is_gpu else "fp32")
    if chosen not in UNIFORM:
        raise SoftsynError(f"{design.constraints.source}: precision.default: {chosen} is not a uniform precision "
                           f"the low-effort compile maps; valid: {', '.join(UNIFORM)}")
    return chosen


@register("precision", "uniform default precision: fp16 on GPU targets (fp32 islands for norms, rotary), fp32 on CPU")
def run(design) -> PassResult:
    if default_precision(design) == "fp32":
        return PassResult({})
    counts = to_fp16(design.netlist.model, design.constraints.dont_touch).counts()
    design.netlist_changed()
    return PassResult(counts)
