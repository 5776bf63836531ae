"""Serving checks with slack from a simulated outcome: latency percentiles against their budgets (slack = budget -
achieved, s), throughput against its minimum (slack = achieved - minimum, tokens/s: negative is a violation, as for
a path)."""
from __future__ import annotations

import numpy as np

from softsyn.constraints.serving import Serving
from softsyn.results.serving import Distribution, HistogramBin, ServingCheck
from softsyn.timing.serving.simulate import Outcome
from softsyn.units import fmt_time

PERCENTILES = {"p50": 50, "p99": 99}


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def checks(serving: Serving, outcome: Outcome) -> list[ServingCheck]:
    rows = []
    for metric in ("ttft", "tpot"):
        for p, q in PERCENTILES.items():
            budget = getattr(serving, f"{metric}_{p}")
            if budget is not None:
                achieved = _pct(getattr(outcome, metric), q)
                rows.append(ServingCheck(f"{metric}_{p}", "time", budget, achieved, budget - achieved))
    if serving.throughput_min is not None:
        rows.append(ServingCheck("throughput", "rate", serving.throughput_min, outcome.throughput,
                                 outcome.throughput - serving.throughput_min))
    return rows


def distributions(outcome: Outcome) -> list[Distribution]:
    return [Distribution(name, _pct(v, 50), _pct(v, 90), _pct(v, 99), float(v.mean()) if len(v) else 0.0,
                         float(v.max()) if len(v) else 0.0)
            for name, v in (("ttft", outcome.ttft), ("tpot", outcome.tpot), ("e2e", outcome.e2e),
                            ("queue", outcome.queue))]


def histogram(outcome: Outcome, bins: int = 20) -> list[HistogramBin]:
    """TTFT and TPOT in `bins` equal bins from 0 to their largest value."""
    out = []
    for name in ("ttft", "tpot"):
        values = getattr(outcome, name)
        if len(values):
            counts, edges = np.histogram(values, bins=bins, range=(0.0, max(float(values.max()), 1e-9)))
            out += [HistogramBin(name, float(lo), float(hi), int(n)) for lo, hi, n in zip(edges, edges[1:], counts)]
    return out


def summary(rows: list[ServingCheck], outcome: Outcome) -> str:
    """One line for a suggestion: each check's achieved value, then whether all meet."""
    parts = [f"{c.group} {fmt_time(c.achieved, 'ms', 1)}" if c.kind == "time" else f"{c.achieved:,.0f} tok/s"
             for c in rows]
    bad = [c.group for c in rows if not c.met]
    verdict = "all met" if not bad else "violated: " + ", ".join(bad)
    rejected = f"; {outcome.rejected} rejected" if outcome.rejected else ""
    return f"{', '.join(parts)}: {verdict}{rejected} (simulated, est)"
