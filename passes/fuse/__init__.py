"""The `fuse` pass: norms, rotary, attention (GQA/MHA), projections, GELU, MoE -> runtime kernels."""
from __future__ import annotations

import sys

from softsyn.passes import register


@register("fuse", "fuse norms, rotary, attention (GQA/MHA), projections, GELU, MoE into runtime kernels")
def run(design) -> dict[str, int]:
    from softsyn.passes.fuse.rules import fuse

    target = "cuda" if design.library.is_gpu else "cpu"
    before = len(design.netlist.nodes())
    coverages = fuse(design.netlist, target)
    design.coverage = coverages
    for attr in ("graph", "groups"):  # cached timing structures of the old netlist
        design.__dict__.pop(attr, None)
    after = len(design.netlist.nodes())
    if getattr(design, "progress", False):
        missed = sum(c.candidates - c.fused for c in coverages)
        print(f"[softsyn] fuse ({target}): {before} -> {after} cells; "
              + ", ".join(f"{c.kind} {c.fused}/{c.candidates}" for c in coverages if c.candidates)
              + (f"; {missed} missed (see the fusion report)" if missed else ""), file=sys.stderr, flush=True)
    return {c.kind: c.fused for c in coverages}
