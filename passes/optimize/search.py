"""Searching a precision map on tables: greedy (medium), exact ILP (high), recovery (ultra).

Everything here is pure arithmetic on a `Problem`: per path group, the slack of the design as timed and each
option's cost per cell (passes.optimize.mapping.delay_tables); per cell and option the output error
(measured, passes.optimize.sensitivity) and the weight bytes. A map's slack in a group is the baseline
slack less the sum of its options' extra cost, its error `map_error` of its cells' errors: the root sum of squares
times ERROR_SAFETY (independent rounding perturbations add in variance; measured in bench/error_combination.py).
The accuracy budget is a hard rule (the baseline always meets it): no search step exceeds it, and the ILP holds it
as sum of e_i^2 x_i <= (budget / ERROR_SAFETY)^2, linear in the binaries.

The cost order, most important first (`Cost`): design rules (the estimated error over the accuracy budget,
the area over its limit), then the weighted negative slack (sum over groups of weight x max(0, -slack)), then
the weighted latency (sum of weight x the groups' extra cost: what a met design still gains by going faster),
last the cells' summed error as a tie-break (ERROR_WEIGHT: 1 % error weighs as much as 10 us of weighted latency, so
no map spends accuracy on a gain of nanoseconds; linear, so the ILP's objective is the same cost).
A greedy move is kept only if it lowers the cost in that order.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

US = 1e6  # the ILP works in microseconds: delays in seconds are too small for the solver's tolerances
VIOLATION_WEIGHT = 1e4  # a microsecond of weighted violation outweighs any latency gain (lexicographic order)
SLACK_EPS = 1e-12  # s: a slack this far below zero is the sum's rounding (and under the ILP solver's tolerance), met
RULE_WEIGHT = 1e8  # a design-rule unit (1 % error over budget, 1 MB over area) outweighs any timing term
ERROR_WEIGHT = 1e3  # us of weighted latency one unit of error is worth: 1 % error must buy 10 us
# The RSS times this stays at or above the measured end-to-end error of 57 of 60 random maps of 2..36 cells on
# zoo:qwen3-wide and zoo:minilm (measured/RSS median 0.90, worst 1.36; the sum over-read 1.2-7x); the other three
# read at most 8 % low, inside the check's headroom over the estimate's share (optimize: 0.9 / 0.8 = 1.125):
# bench/results/error-combination-cpu-2026-12-01.md.
ERROR_SAFETY = 1.25
ESTIMATE_RULE = f"root sum of squares of the cells' errors x {ERROR_SAFETY}"  # how the estimate is made, as printed


def map_error(errors: Iterable[float]) -> float:
    """The estimated end-to-end error of a map from its cells' errors, each measured alone (ESTIMATE_RULE)."""
    return ERROR_SAFETY * math.sqrt(sum(e * e for e in errors))


def energy_budget(budget: float) -> float:
    """map_error <= budget as a bound on the cells' summed squared errors (linear in the ILP's binaries)."""
    return (budget / ERROR_SAFETY) ** 2


def cell_error(group_error: float, cells: int) -> float:
    """Each cell's error from a group of `cells` quantised at once (the RSS inverted, without the safety factor, so
    a map of the whole group estimates ERROR_SAFETY x its measured error)."""
    return group_error / math.sqrt(cells) if cells else 0.0


@dataclass(frozen=True)
class Problem:
    cells: tuple[str, ...]
    options: dict[str, tuple[str, ...]]  # cell -> its options, the baseline (what it runs in now) first
    cost: dict[str, dict[str, dict[str, float]]]  # group -> cell -> option -> s
    slack: dict[str, float]  # group -> the baseline's worst slack, s
    weight: dict[str, float]  # group -> its weight
    error: dict[str, dict[str, float]]  # cell -> option -> output error it adds (0 for the baseline)
    area: dict[str, dict[str, float]]  # cell -> option -> weight bytes
    budget: float  # accuracy budget for the estimate (map_error)
    area_slack: float | None = None  # limit - the baseline's total, bytes (None: no limit)


@dataclass(frozen=True, order=True)
class Cost:
    rules: float  # error over budget (relative units x 100) + area over the limit (MB)
    violation: float  # sum of weight x max(0, -slack), s
    latency: float  # sum of weight x extra cost, s
    error: float = 0.0  # the cells' summed error, a tie-break (not the estimate): of equal latency, the lower

    def scalar(self) -> float:
        return (RULE_WEIGHT * self.rules + VIOLATION_WEIGHT * self.violation * US + self.latency * US
                + ERROR_WEIGHT * self.error)


@dataclass
class Outcome:
    mapping: dict[str, str]
    cost: Cost
    slack: dict[str, float]
    error: float  # the estimate, map_error
    area_delta: float
    steps: list[str] = field(default_factory=list)  # one line per accepted move


def baseline(problem: Problem) -> dict[str, str]:
    return {c: problem.options[c][0] for c in problem.cells}


def evaluate(problem: Problem, mapping: dict[str, str]) -> tuple[Cost, dict[str, float], float, float]:
    """(cost, slack per group, estimated error (map_error), area delta) of a map."""
    slack = {g: s - sum(problem.cost[g][c][mapping[c]] - problem.cost[g][c][problem.options[c][0]]
                        for c in problem.cells) for g, s in problem.slack.items()}
    cell_errors = [problem.error[c][mapping[c]] for c in problem.cells]
    error = map_error(cell_errors)
    area = sum(problem.area[c][mapping[c]] - problem.area[c][problem.options[c][0]] for c in problem.cells)
    over_area = 0.0 if problem.area_slack is None else max(0.0, area - problem.area_slack) / 1e6
    rules = max(0.0, error - problem.budget) * 100 + over_area
    violation = sum(problem.weight[g] * max(0.0, -s - SLACK_EPS) for g, s in slack.items())
    latency = sum(problem.weight[g] * (problem.slack[g] - s) for g, s in slack.items())
    return Cost(rules, violation, latency, sum(cell_errors)), slack, error, area


def within_budget(problem: Problem, mapping: dict[str, str]) -> bool:
    """Whether the map's estimate keeps the accuracy budget, in the ILP's own terms (sum of squares)."""
    energy = sum(problem.error[c][mapping[c]] ** 2 for c in problem.cells)
    return energy <= energy_budget(problem.budget) * (1 + 1e-9)


def outcome(problem: Problem, mapping: dict[str, str], steps: list[str]) -> Outcome:
    cost, slack, error, area = evaluate(problem, mapping)
    return Outcome(dict(mapping), cost, slack, error, area, steps)


def greedy(problem: Problem, max_steps: int = 200) -> Outcome:
    """Medium effort: while a group misses, take the move on the worst group (weighted) with the best
    delta-delay / delta-error that keeps the accuracy budget and the design rules, if it lowers the cost; at most
    `max_steps` moves."""
    mapping = baseline(problem)
    steps: list[str] = []
    for _ in range(max_steps):
        cost, slack, error, _ = evaluate(problem, mapping)
        missing = {g: problem.weight[g] * -s for g, s in slack.items() if s < 0}
        if not missing:
            break
        worst = max(missing, key=missing.get)
        best, best_score = None, 0.0
        for c in problem.cells:
            for o in problem.options[c]:
                gain = problem.cost[worst][c][mapping[c]] - problem.cost[worst][c][o]
                if o == mapping[c] or gain <= 0:
                    continue
                trial = dict(mapping, **{c: o})
                trial_cost = evaluate(problem, trial)[0]
                if trial_cost.rules > cost.rules or not trial_cost < cost or not within_budget(problem, trial):
                    continue
                score = gain / max(problem.error[c][o] - problem.error[c][mapping[c]], 1e-12)
                if score > best_score:
                    best, best_score = (c, o), score
        if best is None:
            break
        c, o = best
        steps.append(f"{c}: {mapping[c]} -> {o} ({worst})")
        mapping[c] = o
    return outcome(problem, mapping, steps)


def ilp(problem: Problem, ceiling: dict[str, float] | None = None, time_limit: float = 30.0) -> Outcome:
    """High effort: the exact map under the cost order, as one mixed-integer program (scipy.optimize.milp).

    Binary x[c, o] (one option per cell); per group a violation v_g >= extra_g(x) - slack_g, v_g >= 0; the accuracy
    budget sum e^2 x <= (budget / ERROR_SAFETY)^2 (map_error squared; scaled to 1, options over it alone barred);
    area(x) <= area_slack, or, when the baseline already exceeds the area, an excess r_area >= 0. Minimise
    RULE_WEIGHT x rules + VIOLATION_WEIGHT x sum w_g v_g + sum w_g extra_g(x) (`Cost.scalar`), so no map of
    lower cost exists; the greedy map is one the program could choose."""
    # deferred: scipy's MILP solver is slow to import; only effort high/ultra searches with it
    from scipy.optimize import Bounds, LinearConstraint, milp

    pairs = [(c, o) for c in problem.cells for o in problem.options[c]]
    groups = list(problem.slack)
    nx_, ng = len(pairs), len(groups)
    n = nx_ + ng + 2  # x..., v_g..., r_err (held at 0: the accuracy budget is hard), r_area
    extra = np.array([[(problem.cost[g][c][o] - problem.cost[g][c][problem.options[c][0]]) * US for c, o in pairs]
                      for g in groups]).reshape(ng, nx_)
    err = np.array([problem.error[c][o] for c, o in pairs])  # the tie-break term (Cost.error)
    allowed = energy_budget(problem.budget)
    barred = err ** 2 > allowed * (1 + 1e-9)  # over the budget alone; with a zero budget every quantised option
    energy = np.divide(err ** 2, allowed, out=np.zeros(nx_), where=~barred & (err > 0))  # each <= 1
    area = np.array([(problem.area[c][o] - problem.area[c][problem.options[c][0]]) / 1e6 for c, o in pairs])
    w = np.array([problem.weight[g] for g in groups])
    objective = np.zeros(n)
    objective[:nx_] = w @ extra + ERROR_WEIGHT * err
    objective[nx_:nx_ + ng] = VIOLATION_WEIGHT * w
    objective[-2] = RULE_WEIGHT * 100
    objective[-1] = RULE_WEIGHT if problem.area_slack is not None else 0.0
    rows, lower, upper = [], [], []
    for c in problem.cells:  # one option per cell
        row = np.zeros(n)
        row[[i for i, (cc, _) in enumerate(pairs) if cc == c]] = 1
        rows.append(row); lower.append(1); upper.append(1)
    for j, g in enumerate(groups):  # extra_g(x) - v_g <= slack_g
        row = np.zeros(n)
        row[:nx_] = extra[j]
        row[nx_ + j] = -1
        rows.append(row); lower.append(-np.inf); upper.append(problem.slack[g] * US)
    row = np.zeros(n)
    row[:nx_] = energy
    rows.append(row); lower.append(-np.inf); upper.append(1.0)
    for j, g in enumerate(groups):  # extra_g(x) <= ceiling_g
        if ceiling is not None and g in ceiling:
            row = np.zeros(n)
            row[:nx_] = extra[j]
            rows.append(row); lower.append(-np.inf); upper.append(ceiling[g] * US + 1e-9)
    if problem.area_slack is not None:
        row = np.zeros(n)
        row[:nx_], row[-1] = area, -1
        rows.append(row); lower.append(-np.inf); upper.append(problem.area_slack / 1e6)
    integrality = np.concatenate([np.ones(nx_), np.zeros(ng + 2)])
    # The baseline has no error and fits the area if anything does: the rules are then hard (no excess allowed).
    # Only when the baseline already exceeds the area is the area soft, and then solved first on its own, so no
    # weight trades a design rule for slack (the cost order, exactly); the accuracy budget stays hard (r_err 0).
    soft = problem.area_slack is not None and problem.area_slack < 0
    bounds = Bounds(np.zeros(n), np.concatenate([np.where(barred, 0.0, 1.0), np.full(ng, np.inf),
                                                 [0.0, np.inf] if soft else [0.0, 0.0]]))
    options = {"time_limit": time_limit, "mip_rel_gap": 0.0}
    if soft:
        rules = np.zeros(n)
        rules[-1] = 1.0  # Cost.rules: MB over the area (the error is within the budget)
        first = milp(rules, constraints=LinearConstraint(np.array(rows), lower, upper), integrality=integrality,
                     bounds=bounds, options=options)
        if first.x is None:
            raise RuntimeError(f"milp found no map ({first.message})")
        rows.append(rules); lower.append(-np.inf); upper.append(first.fun + 1e-7)
    res = milp(objective, constraints=LinearConstraint(np.array(rows), lower, upper), integrality=integrality,
               bounds=bounds, options=options)
    if res.x is None:
        raise RuntimeError(f"milp found no map ({res.message})")
    chosen = {c: o for (c, o), v in zip(pairs, res.x[:nx_]) if v > 0.5}
    mapping = {c: chosen.get(c, problem.options[c][0]) for c in problem.cells}
    base = baseline(problem)
    steps = [f"{c}: {base[c]} -> {mapping[c]}" for c in problem.cells if mapping[c] != base[c]]
    return outcome(problem, mapping, steps)


def recover(problem: Problem, start: Outcome, ceiling: dict[str, float], max_steps: int = 200) -> Outcome:
    """Ultra effort's recovery: raise cells back towards their baseline precision, largest error first, where
    every group keeps its slack (>= 0 where it met) and its extra cost stays within `ceiling` (group -> s: the
    medium map's, so higher effort never predicts slower), without raising the design-rule cost."""
    mapping = dict(start.mapping)
    steps = list(start.steps)
    order = sorted(problem.cells, key=lambda c: -problem.error[c][mapping[c]])
    for c in order[:max_steps]:
        now = problem.error[c][mapping[c]]
        for o in sorted((o for o in problem.options[c] if problem.error[c][o] < now), key=lambda o: problem.error[c][o]):
            # the most accurate first
            trial = dict(mapping, **{c: o})
            cost, slack, _, _ = evaluate(problem, trial)
            old_cost, old_slack, _, _ = evaluate(problem, mapping)
            keeps = all(slack[g] >= min(0.0, old_slack[g]) for g in slack)
            within = all(problem.slack[g] - slack[g] <= ceiling[g] + 1e-12 for g in slack)
            if keeps and within and cost.rules <= old_cost.rules and cost.violation <= old_cost.violation:
                steps.append(f"{c}: {mapping[c]} -> {o} (recovery: -{problem.error[c][mapping[c]] - problem.error[c][o]:.2e} error)")
                mapping[c] = o
                break
    return outcome(problem, mapping, steps)
