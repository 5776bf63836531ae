"""verify's result: per scenario and output the compiled model against the fp32 reference (VerifyResult).

flow.verify fills it, reports.verify renders it. DEFAULT_REL_ERROR is the accuracy budget when the constraints give
none, by compiled precision: verify checks against it and the compile loop spends it (passes.optimize).
"""
from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_REL_ERROR = {"fp32": 1e-4, "fp16": 1e-2}


@dataclass
class OutputCheck:
    scenario: str
    output: str
    max_abs: float
    rel: float
    cosine: float
    top1: float | None
    violations: list[str]
    positions_over: int | None = None  # logits, KV: positions whose own error is over the budget (rel to the tensor's max)
    positions: int | None = None  # logits, KV: positions compared (batch x sequence)


@dataclass
class VerifyResult:
    checks: list[OutputCheck]
    max_rel_error: float
    budget_source: str
    min_top1: float | None
    provider: str
    reference: dict
    precision: str
    located: list = field(default_factory=list)  # softsyn.flow.verify_locate.Located per violated scenario (--locate)
    routed: int = 0  # expert ops (MoE/QMoE) in the compiled model: their top-k routing is discontinuous

    @property
    def few_positions_over(self) -> list[OutputCheck]:
        """Violated logits or KV whose error sits at some positions while the others are within budget."""
        return [c for c in self.checks if c.violations and c.positions and 0 < (c.positions_over or 0) < c.positions]

    @property
    def violations(self) -> list[str]:
        return [f"{c.scenario}/{c.output}: {v}" for c in self.checks for v in c.violations]
