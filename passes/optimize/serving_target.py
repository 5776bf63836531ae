"""The serving checks as a target of the weight map (issue 30 item 2): a load the engine cannot serve within its
TTFT/TPOT/throughput budgets becomes a timing target the precision search can trade accuracy for.

The serving simulation is not linear in the cells' costs, so it cannot be a term of the search itself. What it can
give is a budget, the way a chip's top-level timing is budgeted onto its blocks: the `steps` suggestion
(softsyn.timing.serving.suggest.steps) bisects the largest uniform factor s of every step time at which every
check meets. The map is then searched as if each decode and prefill path group had to reach s times its latency
now: a group's slack in the search becomes min(its own slack, -(1 - s) x its latency). The search's cost order is
unchanged (design rules, the accuracy budget included, come first), so the map goes as far toward the target as the
budget lets it and no further; the serving pass and the final analysis re-simulate the result.

No target when the design has no serving block, when every check meets, when a max_batch alone meets them (the
serving pass takes it: it costs no accuracy), or when no uniform speed-up down to the suggestion's floor meets them
(the load, the KV budget or the host work binds, not the steps). Each case is one line of the compile log.
The groups' own clocks stay what report_timing checks; only the search sees the target.
"""
from __future__ import annotations

import dataclasses

from passes.optimize import search
from softsyn.units import fmt_time


def tighten(design, problem: search.Problem) -> tuple[search.Problem, str]:
    """`problem` with each decode/prefill group's slack tightened to the serving target, and the log line ("" when
    the design has no serving block)."""
    if design.constraints.serving is None:
        return problem, ""
    analysis = design.analyze(tp_plan=False, serving=True)
    served = analysis.serving
    if served is None:
        return problem, ""
    batch = design.serving.max_batch
    if not served.violated:
        return problem, f"serving: every check met at max_batch {batch} before the map (simulated, est): no target"
    missed = ", ".join(c.group for c in served.checks if not c.met) or f"{served.rejected} requests rejected"
    by = {s.knob: s for s in served.suggestions}
    if by.get("max_batch") is not None and by["max_batch"].meets:
        return problem, (f"serving: {missed} violated at max_batch {batch}; {by['max_batch'].change} meets every check "
                         "(the serving pass takes it, at no accuracy cost): no target for the map")
    steps = by.get("steps")
    if steps is None or steps.scale is None:
        why = steps.result if steps is not None else "not simulated"
        return problem, f"serving: {missed} violated at max_batch {batch}; no target for the map ({why})"
    encoders = {name for name, spec in design.constraints.path_groups.items() if spec.kind == "encoder"}
    slack, moved = dict(problem.slack), []
    for t in analysis.groups:
        if t.name not in slack or t.name in encoders or not t.paths:
            continue
        latency = t.critical.arrival - t.critical.input_delay
        target = -(1 - steps.scale) * latency
        if target < slack[t.name]:
            slack[t.name] = target
            moved.append(f"{t.name} {fmt_time(latency, 'ms', 3)} -> {fmt_time(steps.scale * latency, 'ms', 3)}")
    if not moved:
        return problem, f"serving: {missed} violated at max_batch {batch}; the groups' own clocks are tighter than its target"
    return dataclasses.replace(problem, slack=slack), (
        f"serving: {missed} violated at max_batch {batch}; every step x{steps.scale:.3f} meets every check "
        f"(simulated, est), so the map's targets are {', '.join(moved)} (est); the opt.* rows count them, "
        "report_timing keeps the groups' own clocks")
