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

    @property
    def violations(self) -> list[str]:
        return [f"{c.scenario}/{c.output}: {v}" for c in self.checks for v in c.violations]
