"""Concrete suggestions printed at the end of a report when something violates.

Derived from the result objects only: the op types that carry the critical path's
delay, how many of its cells are roofline estimates, and what fills VRAM.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from passes.optimize import ESTIMATE_SHARE
from passes.optimize.search import map_error
from reports.advice import Facts, op_advice, weight_advice
from softsyn.errors import SoftsynError
from reports.common import byte_unit_for, fbytes, fpercent, ftime, is_unconstrained

def op_shares(path) -> list[tuple[str, float, int, float]]:
    """(op type, share of the path's cell delay, cells, delay) sorted by share, largest first."""
    delay: dict[str, float] = defaultdict(float)
    cells: dict[str, int] = defaultdict(int)
    for p in path.points:
        delay[p.op_type or p.cell.split(".")[0]] += p.incr
        cells[p.op_type or p.cell.split(".")[0]] += 1
    total = sum(delay.values())
    if total <= 0:
        return []
    return sorted(((op, d / total, cells[op], d) for op, d in delay.items()), key=lambda t: (-t[1], t[0]))


def timing_suggestions(groups, time_unit: str = "ms", digits: int = 3, top: int = 3,
                       facts: Facts | None = None) -> list[list[str]]:
    """One item (a list of lines, first is the headline) per violating group's critical path; the advice agrees
    with `facts` (reports.advice: what the design is, what the constraints allow, what the loop found slower)."""
    facts = facts or Facts()
    ms = lambda v: ftime(v, time_unit, digits, suffix=True)  # noqa: E731
    items: list[list[str]] = []
    for g in groups:
        if not g.paths:
            continue
        path = g.critical
        if is_unconstrained(path.slack) or path.slack >= 0:
            continue
        miss = -path.slack
        lines = [f"{g.name} misses by {ms(miss)} (arrival {ms(path.arrival)}, required {ms(path.required)})."]
        cell_delay = sum(p.incr for p in path.points)
        budget = path.required - path.input_delay
        if budget <= 0:
            lines.append(f"The I/O delays and uncertainty alone use the whole {ms(path.clock_period)} "
                         f"period: no cell optimisation can meet it; relax input/output delay or the period.")
        elif cell_delay > 0:
            lines.append(f"The path's cells take {ms(cell_delay)}: cut {fpercent(miss / cell_delay)} of that "
                         f"(to {ms(cell_delay - miss)}).")
        shares = op_shares(path)[:top]
        if shares:
            lines.append("Top cells by share of the path's delay: "
                         + ", ".join(f"{op} {fpercent(s)} ({n} cell{'s' if n != 1 else ''})" for op, s, n, _ in shares)
                         + ".")
            said: set[str] = set()  # a fusion both MatMul and MatMulNBits rows touch is said once
            decode = g.scenario.dims.get("past", 0) > 0
            for op, s, _, d in shares:
                advice = [a for a in op_advice(op, facts, g.name, decode) if a not in said] or ["as above"]
                said.update(advice)
                lines.append(f"- {op} ({fpercent(s)}, {ms(d)}): " + "; ".join(advice) + ".")
        est = sum(1 for p in path.points if p.source == "est")
        if est:
            lines.append(f"- {est} of {len(path.points)} cells on the path are roofline estimates (est): "
                         f"characterise the library for measured delays before optimising.")
        where = f" ({facts.device})" if facts.device else " (the machine its library describes)"
        lines.append(f"- or raise the clock to {ms(path.clock_period + miss)}: the design as compiled meets it"
                     + (f" on {facts.library}{where}; another machine needs its own library" if facts.library else "")
                     + ".")
        items.append(lines)
    return items


SUGGESTIONS_FILE = "suggestions.json"  # under DIR/reports


def suggestions_json(analysis, facts: Facts, extra: list[list[str]] = ()) -> str:
    """The advice every report prints (timing + area), with the facts it agrees with: what the HTML page renders."""
    items = (list(extra) + timing_suggestions(analysis.groups, "ms", 3, facts=facts)
             + area_suggestions(analysis.area, facts))
    return json.dumps({"schema": "softsyn.suggestions/1", "facts": facts.to_dict(), "items": items}, indent=1) + "\n"


def saved_facts(directory) -> Facts | None:
    """The facts a compile or analyze saved beside its reports (DIR/reports/suggestions.json); None without them."""
    path = Path(directory) / "reports" / SUGGESTIONS_FILE
    if not path.is_file():
        return None
    try:
        return Facts.from_dict(json.loads(path.read_text())["facts"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SoftsynError(f"{path}: not readable softsyn suggestions ({exc}); re-run the command that wrote "
                           "the directory") from None


def area_suggestions(area, facts: Facts | None = None) -> list[list[str]]:
    """Why VRAM does not fit and what would, from the area result's figures: with a KV budget, the
    shorter context, lower-precision KV, fewer sequences or lower-precision weights that fit."""
    if area.limit is None or area.slack is None or area.slack >= 0:
        return []
    unit = byte_unit_for(area.total, area.limit)
    total = area.total or 1.0
    kinds = sorted(area.by_kind, key=lambda k: -k.bytes)[:3]
    lines = [f"VRAM exceeds the limit by {fbytes(-area.slack, unit)} "
             f"(total {fbytes(area.total, unit)}, limit {fbytes(area.limit, unit)}).",
             "Largest: " + ", ".join(f"{k.name} {fpercent(k.bytes / total)}" for k in kinds) + "."]
    budget = area.kv_budget
    if budget is None or budget.limit is None:
        return [lines + generic_area_advice(kinds, facts or Facts())]
    return [lines + kv_budget_advice(budget, unit)]


def generic_area_advice(kinds, facts: Facts) -> list[str]:
    """Advice by kind, for a design without a KV budget (no KV cache); weights as `facts` allow."""
    lines = []
    for k in kinds:
        name = k.name.lower()
        if name.startswith("weights"):
            lines.append(f"- {k.name}: {weight_advice(facts)}")
        elif name.startswith("kv"):
            lines.append(f"- {k.name}: consider an fp8/int8 KV cache, a shorter context_len or lower concurrency.")
        elif name.startswith("activation"):
            lines.append(f"- {k.name}: consider a smaller prefill chunk (prompt_len) or batch.")
    return lines


def area_weight_advice(budget, unit: str) -> list[str]:
    lines = []
    for w in budget.weight_precisions[1:]:
        verdict = (f"fits, up to concurrency {w.max_concurrency:,} at {budget.length} tokens" if w.fits else
                   f"still over by {fbytes(w.total - budget.limit, unit)}")
        lines.append(f"- precision {w.precision} weights: {fbytes(w.weight_bytes, unit)} (estimate), total "
                     f"{fbytes(w.total, unit)}: {verdict}.")
    lines.append("- or tensor parallelism: the weights split over several devices.")
    return lines


def kv_budget_advice(budget, unit: str) -> list[str]:
    """The lines that say which budget the design breaks and, from the KV budget's rows, what fits."""
    b = budget
    if b.weights > b.limit:
        return [f"The weights and constants alone ({fbytes(b.weights, unit)}) exceed the limit: no KV cache fits "
                "at any context."] + area_weight_advice(b, unit)
    if b.max_context == 0:
        return [f"The weights and constants ({fbytes(b.weights, unit)}) and the workspace "
                f"({fbytes(b.workspace, unit)}, {b.workspace_scenario} scenario) leave "
                f"{fbytes(b.available, unit)} for the KV cache: not one token of one sequence fits.",
                "- a smaller prefill chunk (workload.prompt_len) or batch shrinks the workspace."] + area_weight_advice(b, unit)
    need = (f"The KV cache at the workload needs {fbytes(b.kv_bytes, unit)} ({b.length} tokens x batch {b.batch} x "
            f"concurrency {b.concurrency} x {fbytes(b.bytes_per_token, 'KB')} per token, from the netlist's KV inputs)")
    if b.available >= 0:
        lines = [need + f"; {fbytes(b.available, unit)} is left for it after the weights and the workspace."]
    else:
        lines = [need + f"; the weights and the workspace at {b.length} tokens ({fbytes(b.workspace, unit)}, "
                 f"{b.workspace_scenario}) already exceed the limit by {fbytes(-b.available, unit)}, and the "
                 "workspace shrinks with the context."]
    also = " (and workload.context_len at most that)" if b.length_key == "kv_cache.max_length" else ""
    lines.append(f"- {b.length_key} {b.max_context} (from {b.length}){also}: fits at concurrency {b.concurrency}.")
    for r in b.kv_dtypes[1:]:
        if r.fits:
            verdict = (f"fits at the workload (total {fbytes(r.total, unit)}), up to concurrency "
                       f"{r.max_concurrency:,} at {b.length} tokens")
        elif r.max_context:
            verdict = f"fits with {b.length_key} {r.max_context}" + (
                f" or concurrency {r.max_concurrency:,}" if r.max_concurrency else "")
        else:
            verdict = "not enough on its own"
        lines.append(f"- kv_cache.dtype {r.dtype} ({fbytes(r.bytes_per_token, 'KB')} per token, estimate): {verdict}.")
    if b.max_concurrency:
        lines.append(f"- workload.concurrency {b.max_concurrency} (from {b.concurrency}): fits at {b.length} tokens.")
    elif b.batch > 1:
        lines.append(f"- fewer sequences: not one sequence of batch {b.batch} fits at {b.length} tokens; "
                     "lower workload.batch.")
    return lines


def precision_moves(report, groups, time_unit: str = "ms") -> dict[str, str]:
    """Per violated group, from the compile loop's own tables (passes.optimize.OptimizeReport): the cells
    still above their fastest precision (the tables hold only precisions the constraints allow and the library
    times faster), fastest saving first, that would close the miss, what they save and the error they add (both
    estimates); a move past the accuracy budget is said to be one."""
    problem = getattr(report, "problem", None)
    if problem is None:
        return {}
    current = {c.name: c.realised for c in report.cells}
    hierarchy = {c.name: c.hierarchy or c.name for c in report.cells}
    out = {}
    for g in groups:
        slack = g.critical.slack
        if is_unconstrained(g.clock_period) or slack >= 0 or g.name not in problem.cost:
            continue
        miss = -slack
        moves = []
        for cell in problem.cells:
            table = problem.cost[g.name][cell]
            fastest = min(problem.options[cell], key=lambda o: table[o])
            saving = table[current.get(cell, problem.options[cell][0])] - table[fastest]
            if saving > 0:
                moves.append((saving, cell, fastest))
        moves.sort(reverse=True)
        taken, saved = [], 0.0
        for move in moves:
            if saved >= miss:
                break
            taken.append(move)
            saved += move[0]
        if not taken:
            out[g.name] = "no cell has a faster precision left (precision.allowed x the library)"
            continue
        kinds: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for _, cell, precision in taken:
            kinds[precision][hierarchy[cell].rsplit(".", 1)[-1]] += 1
        what = "; ".join(f"{p} for {sum(k.values())} more cell{'s' if sum(k.values()) != 1 else ''} ("
                         + ", ".join(f"{n} {kind}" for kind, n in k.items()) + ")" for p, k in kinds.items())
        now = {c: problem.error[c][current.get(c, problem.options[c][0])] for c in problem.cells}
        after = map_error({**now, **{cell: problem.error[cell][p] for _, cell, p in taken}}.values())
        added = after - map_error(now.values())  # the estimate combines, it does not add (search.map_error)
        needed = after / ESTIMATE_SHARE  # the loop's estimate may use only this share of the budget
        line = f"{what} would save ~{ftime(saved, time_unit)} {time_unit} (est) at +{fpercent(added)} error (est)"
        if needed > report.budget:
            line += (f", past the {ESTIMATE_SHARE:.0%} of accuracy.max_rel_error {fpercent(report.budget)} a map's "
                     f"estimate may use (the map's now {fpercent(report.estimate_error)}): a move only with the "
                     f"budget raised to {fpercent(needed)}")
        else:
            line += f" (the map's now {fpercent(report.estimate_error)}, budget {fpercent(report.budget)})"
        if saved < miss:
            line += f", still {ftime(miss - saved, time_unit)} {time_unit} short"
        out[g.name] = line
    return out


def precision_suggestions(report, groups, time_unit: str = "ms") -> list[str]:
    """precision_moves as one line per violated group, with the clock the design as it is would meet."""
    moves = precision_moves(report, groups, time_unit)
    return [f"{g.name} misses by {ftime(-g.critical.slack, time_unit)} {time_unit}: {moves[g.name]}; or raise the "
            f"clock to {ftime(g.clock_period - g.critical.slack, time_unit)} {time_unit}"
            for g in groups if g.name in moves]
