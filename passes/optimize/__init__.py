"""optimize (effort medium and up): slack-driven precision mapping under the accuracy and area budgets.

The loop: tabulate once, per path group, every candidate cell's cost at each precision its library has a cell
for (passes.optimize.mapping); measure each (cell, precision)'s output error (sensitivity, cached);
search a map on the tables (passes.optimize.search: greedy at `medium`, an exact ILP at `high`, the
ILP then recovery at `ultra`) in the cost order design rules -> weighted negative slack -> latency, the slack
tightened to the serving checks' target when a serving block is violated (passes.optimize.serving_target); check the
map end to end (the design with the whole map quantised, run on the target's device when it is here, else ORT CPU,
against the design before this pass, verify's relative error); apply it. A map the check rejects is searched again
with half the estimate's budget (at most ATTEMPTS times), then the design keeps its precision; the log says why.

Options per effort step: `search` ("greedy", "ilp", "ultra"), `max_steps` (the greedy and recovery cap), `calibrate`
(ultra: when a map still misses a clock and its end-to-end check measured well under its estimate, every cell's
error is scaled by measured / estimated and the map searched once more on those calibrated errors, checked end to
end again; the estimate is a bound built to over-read, 1.2-7x for a plain sum, `calibrated_search`), `retime`
(ultra: a kept map is measured against the design before it on the target's provider, when it runs here, and the
tables back-annotated and searched again if the map is no faster: passes.optimize.retime).
The report (`OptimizeReport`) holds, per candidate cell, the requested and realised precision, its measured
error and its cost per group, and the rows the compile log prints for each search step (estimates).
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field

from passes import PassReport, PassResult, register, report_of
from passes.kv_layout import KvLayoutReport
from passes.optimize import experts, fallback as fallback_rule, kv_moves, serving_target
from passes.optimize.explored import Explored, mix
from passes.optimize import mapping as mp
from passes.optimize import retime as measured
from passes.optimize import search, sensitivity
from softsyn.results.compile_log import TraceRow
from softsyn.results.pareto import ParetoPoint
from softsyn.results.verify import DEFAULT_REL_ERROR
from softsyn.runtime.design_runner import CannotRun
from softsyn.timing.area import area as area_of
from softsyn.timing.cost import precision_of

ATTEMPTS = 3  # end-to-end checks before the design keeps its precision
CALIBRATE_BELOW = 0.8  # ultra: a check reading under this share of its estimate calibrates the errors (once)
ESTIMATE_SHARE = 0.8  # the estimate (search.map_error) may use this share of the accuracy budget ...
CHECK_SHARE = 0.9  # ... the end-to-end check this share: the rest is the design's own error against fp32
MEASURE_LIMIT = 2e9  # weight bytes above which per-cell runs would take hours: measured per role instead (labelled)
# ... unless the cells need this few runs (minutes: a run of the 2-layer Qwen3-30B-A3B takes ~65 s on 2 CPU cores):
# a role's error shared by sqrt(cells) misreads a role of few cells (its experts: layer 1 alone 0.106, layer 0 0.213,
# the role's share 0.168 each, so neither fitted a 25 % budget; docs/decisions/2026-12-03-qmoe.md, Session 7)
CELL_RUNS = 8


@dataclass
class CellMap:
    name: str
    hierarchy: str
    requested: str
    realised: str
    error: float  # the error its precision adds (measured, or the prior)
    cost: dict[str, float]  # group -> s at the realised precision
    baseline_cost: dict[str, float]  # group -> s at the precision it had


# A low-bit map's speed-up on a GPU is a prediction until measured: on the H200 an int8 map measured slower than fp16,
# and an int4/int8 map 4 % faster at decode but 30 % slower at prefill (docs/decisions/2026-12-01-compile-loop.md);
# ultra measures it where the device is present, other efforts say so.
GPU_SPEED_UNMEASURED = ("the map's speed-up is predicted from the GPU library's tables (est), not measured: "
                        "--effort ultra on the GPU machine measures it, or confirm it with softsyn signoff DIR "
                        "--provider cuda before deploying it")


@dataclass
class OptimizeReport(PassReport):
    search: str
    sensitivity: str  # how the errors were obtained (measured / prior)
    budget: float
    cells: list[CellMap] = field(default_factory=list)
    trace: list[TraceRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problem: search.Problem | None = None  # the tables the search ran on (suggestions read them)
    estimate_error: float = 0.0
    checked_error: float | None = None  # the end-to-end check's measured error of the kept map
    retime: measured.Retime | None = None  # the measured re-timing's rounds (ultra, the device present)
    kv: list[kv_moves.KvMove] = field(default_factory=list)  # the KV moves after the map (opt.kv.*)
    explored: Explored = field(default_factory=Explored)  # every map evaluated, as it went (the points' source)
    pareto: list[ParetoPoint] = field(default_factory=list)  # those maps and the uniform designs, as points
    pareto_notes: list[str] = field(default_factory=list)  # what the points stand on (reports.pareto prints them)
    fallback: fallback_rule.Fallback | None = None  # accuracy.fallback taken: the failed map and what replaced it
    start: dict[str, int] | None = None  # the loop's start where it is not the netlist's: {"bf16": cells} (bf16 start)

    def log_notes(self) -> list[str]:
        """The lines the compile log prints under its rows (flow.compile reads them; no pass name needed)."""
        return [f"optimize: {n}" for n in [f"sensitivity {self.sensitivity}", *self.notes]]

    def error_over(self) -> float:
        """The kept map's estimated error over the accuracy budget (the compile log's design-rule cost)."""
        return self.estimate_error - self.budget

    def session_entries(self) -> dict[str, object]:
        """session.json's `precision_map` (the per-cell map summed: cells by requested and by realised precision;
        netlist.json has each cell; ultra's measured rounds, SI) and `kv_moves`."""
        measured = self.retime
        summed = None if not self.cells else {
            "requested": dict(Counter(c.requested for c in self.cells)),
            "realised": dict(Counter(c.realised for c in self.cells)),
            "estimated_error": self.estimate_error, "checked_error": self.checked_error,
            "fallback": None if self.fallback is None else dataclasses.asdict(self.fallback),
            "start": self.start,
            "measured": None if measured is None else {"provider": measured.provider, "kept_round": measured.kept,
                                                       "outcome": measured.why, "rows": measured.rows()}}
        return {"precision_map": summed, "kv_moves": [dataclasses.asdict(m) for m in self.kv]}


@dataclass
class Proposer:
    """The effort's map on some tables, checked end to end (`__call__`). What the checks carry from one attempt to
    the next: the estimate's share of the budget (halved after each rejected map) and the design runner (made at the
    first check, reused after). Every map searched and checked goes to the report's explored points."""
    design: object
    report: "OptimizeReport"
    budget: float
    search_mode: str
    max_steps: int
    checkable: bool = True
    share: float = ESTIMATE_SHARE
    runner: sensitivity.Runner | None = None
    held: dict[str, str] = field(default_factory=dict)  # cell -> the netlist's precision, where the start differs
    rejected: list[tuple[dict[str, str], float, float]] = field(default_factory=list)  # (moved cells, measured, estimate)

    def __call__(self, tables: search.Problem, attempts: int = ATTEMPTS) -> search.Outcome | None:
        """The effort's map on `tables`, checked end to end (`attempts` times at most); None when every map fails."""
        report, budget, explored = self.report, self.budget, self.report.explored
        stage = explored.stage
        try:
            for attempt in range(1, attempts + 1):
                explored.stage = f"{stage} attempt {attempt}".strip() if attempt > 1 else stage
                outcome = search_map(dataclasses.replace(tables, budget=budget * self.share), self.search_mode,
                                     self.max_steps, report)
                moved = {c: p for c, p in outcome.mapping.items() if p != self.held.get(c, tables.options[c][0])}
                if not moved or outcome.mapping == search.baseline(tables):  # the start (a bf16 start: verify's)
                    return outcome
                if not self.checkable:
                    report.notes.append("end-to-end check not run (no weights to run here, or not runnable on ORT "
                                        "here): softsyn verify DIR checks the artifact where it can run")
                    return outcome
                self.runner = self.runner or sensitivity.Runner(self.design)
                error = self.runner.error(moved)
                explored.checked(tables, outcome.mapping, error)
                if error <= budget * CHECK_SHARE:
                    report.checked_error = error
                    report.notes.append(f"end-to-end check (attempt {attempt}, {self.runner.where}): error {error:.3e} "
                                        f"(estimate {outcome.error:.3e}) <= {budget * CHECK_SHARE:.3e} "
                                        f"({CHECK_SHARE:.0%} of the budget {budget:.3e}): kept")
                    return outcome
                self.rejected.append((moved, error, outcome.error))
                report.notes.append(f"end-to-end check (attempt {attempt}): error {error:.3e} > "
                                    f"{budget * CHECK_SHARE:.3e} (estimate {outcome.error:.3e}): rejected; searching "
                                    "again with half the estimate's budget")
                self.share /= 2
            return None
        finally:
            explored.stage = stage


def accuracy_budget(design) -> float:
    given = design.constraints.accuracy.max_rel_error
    if given is not None:
        return given
    return DEFAULT_REL_ERROR["fp16" if design.library.is_gpu else "fp32"]


def _trace(problem: search.Problem, outcome_map: dict[str, str], phase: str) -> TraceRow:
    cost, slack, _, area = search.evaluate(problem, outcome_map)
    worst = min(slack, key=lambda g: slack[g]) if slack else ""
    return TraceRow(phase, min(0.0, slack[worst]) if worst else 0.0,
                    min(0.0, sum(min(0.0, s) for s in slack.values())), cost.rules, area,
                    worst if worst and slack[worst] < 0 else "")


def build_problem(design, cands, errors, budget: float, tables: dict | None = None) -> search.Problem:
    """The search's problem: `tables` (mapping.delay_tables, made here if not given) restricted to the cells'
    options, the design's slack per group as timed now, less what a start other than the netlist's costs (a bf16
    start: each bf16 cell's cost over its fp16 one, so `tables` must hold both), the errors, the weight bytes and the
    area left."""
    full = tables or mp.delay_tables(design, cands)
    tables = {g: {c.name: {p: rows[c.name][p] for p in c.options} for c in cands} for g, rows in full.items()}
    shift = start_cost(full, cands)
    timed = {g.name: g for g in design.time()}
    act = 2 if any(c.current in ("fp16", mp.BF16) for c in cands) else 4
    area_limit = design.constraints.area_constraint
    area_slack = None
    if area_limit is not None:
        area_slack = area_limit - area_of(design.netlist, design.constraints,
                                          {g.name: g.scenario.dims for g in design.groups}).total
    return search.Problem(
        cells=tuple(c.name for c in cands), options={c.name: c.options for c in cands},
        cost=tables, slack={g: t.critical.slack - shift.get(g, 0.0) for g, t in timed.items()},
        weight={g: t.weight for g, t in timed.items()}, error=errors,
        area={c.name: {p: c.weight_bytes(p, act) for p in c.options} for c in cands}, budget=budget,
        area_slack=area_slack)


def start_cost(tables: dict, cands) -> dict[str, float]:
    """Per group, s the cells' start (their first option) costs over the netlist's precision: a bf16 start's bf16
    cells over their fp16 MatMuls (`tables` holding both); 0 where the start is the netlist."""
    return {g: sum(rows[c.name][c.options[0]] - rows[c.name][c.current] for c in cands if c.options[0] != c.current)
            for g, rows in tables.items()}


def prune(design, cands, tables: dict | None = None) -> tuple[list, list[str], dict]:
    """Drop the options no group runs faster in than the cell's start (its first option: its own precision, or bf16
    from a bf16 start; the library says the cell is not worth it there); a cell left with its start only stays in the
    table (and the report) with that one option. Returns the tables too (`tables`, made here if not given)."""
    tables = tables or mp.delay_tables(design, cands)
    kept, notes, dropped = [], [], {}
    for c in cands:
        base = c.options[0]
        faster = [p for p in c.options[1:] if any(tables[g][c.name][p] < tables[g][c.name][base] for g in tables)]
        for p in c.options[1:]:
            if p not in faster:
                dropped[p] = dropped.get(p, 0) + 1
        kept.append(dataclasses.replace(c, options=(base, *faster)))
    for p, n in dropped.items():
        notes.append(f"{p}: {n} cell{'s' if n != 1 else ''} no faster than {cands[0].options[0]} in any group "
                     f"(library {design.library.name}), not candidates")
    return kept, notes, tables


@register("optimize", "slack-driven precision map: per-cell int4/int8 MatMulNBits or fp8 weights, QMoE int4/int8 experts, "
                      "where the library says it is faster, under the accuracy and area budgets")
def run(design, search_mode: str = "greedy", max_steps: int = 200, retime: bool = False,
        calibrate: bool = False) -> PassResult:
    start = time.perf_counter()
    budget = accuracy_budget(design)
    area0 = start_area(design)
    cands, skipped = mp.candidates(design)
    report = OptimizeReport(search_mode, "", budget)
    report.notes += [f"{what}: {why}" for what, why in skipped.items()
                     if what in mp.OFFERED or what.startswith("qmoe ")]
    if mp.BF16 in skipped:
        design.log(f"optimize: bf16: {skipped[mp.BF16]}")
    if any(v == "dont_touch" for v in skipped.values()):
        kept = sum(1 for v in skipped.values() if v == "dont_touch")
        report.notes.append(f"dont_touch: {kept} cell{'s' if kept != 1 else ''} kept as {'they are' if kept != 1 else 'it is'}")
    if not cands:
        report.notes.append("no MatMul with a 2-D weight outside dont_touch: nothing to map")
        return PassResult({"candidates": 0, **kv_step(design, report, budget, 0.0, start_area(design))}, report)
    offered = cands  # every option, pruned or not (the fallback's uniform bf16 takes bf16 where no group gains)
    tables = mp.delay_tables(design, offered)  # fp16 and bf16 both: a bf16 start is priced against its fp16 cell
    cands, started, start_why = fallback_rule.start_from_bf16(design, cands)
    if started:
        report.start = {mp.BF16: len(started)}
    if started or start_why:
        _say(design, report, _start_line(started, start_why, cands, offered))
    allowed = {p for c in cands for p in c.options[1:]}  # before pruning: a uniform design may have no point
    cands, notes, tables = prune(design, cands, tables)
    report.notes += notes
    faster = any(len(c.options) > 1 for c in cands)
    if not faster:  # every cell stays as it is; the tables still say so, and what would close a miss
        report.notes.append("no cell has a faster precision the constraints allow and the library has a cell for")
    errors, report.sensitivity, checkable = sensitivities(design, cands)
    design.log(f"optimize: {len(cands)} candidate cells; sensitivity {report.sensitivity}")

    problem = build_problem(design, cands, errors, budget * ESTIMATE_SHARE, tables)
    problem, line = serving_target.tighten(design, problem)  # a violated serving block: the steps' target
    if line:
        _say(design, report, line)
    report.problem = problem
    report.trace.append(_trace(problem, search.baseline(problem), "opt.start"))
    report.explored.start(problem)
    first = problem  # the tables the uniform designs are predicted on: the loop's own, before any correction
    propose = Proposer(design, report, budget, search_mode, max_steps, checkable=checkable,
                       held={c.name: c.current for c in started})
    if started and not search.within_budget(problem, search.baseline(problem)):
        start_error = search.map_error(problem.error[c][p] for c, p in search.baseline(problem).items())
        report.notes.append(f"start: uniform bf16's estimate {start_error:.3e} is over the estimate's budget "
                            f"{problem.budget:.3e}: no move searched (every move adds error); the start kept, as "
                            "precision.default asks (softsyn verify measures it)")
        chosen = search.outcome(problem, search.baseline(problem), [])
    else:
        chosen = propose(problem)
    if chosen is None and design.constraints.accuracy.fallback == fallback_rule.BF16:
        chosen, problem, cands = fallback_rule.fall_back(
            design, report, propose, offered=offered, tables=tables, errors=errors, budget=budget * ESTIMATE_SHARE,
            limit=budget * CHECK_SHARE, build_problem=build_problem)
        report.problem = problem
    elif chosen is None:
        report.notes.append("every map failed the end-to-end check: the design keeps its precision"
                            + (" (its start: uniform bf16 MatMul cells)" if started else ""))
        chosen = search.outcome(problem, search.baseline(problem), [])
    elif calibrate and report.checked_error is not None:
        chosen, problem = calibrated_search(problem, chosen, report, lambda tables: propose(tables, attempts=1))
        report.problem = problem
    if retime and started:
        report.notes.append("measured re-timing not run from a bf16 start: it measures a map against the netlist "
                            "before it (fp16), not against the start (not built)")
    elif retime and report.fallback is None and any(p != problem.options[c][0] for c, p in chosen.mapping.items()):
        chosen, problem = measured.retime(design, problem, chosen, propose, report)
        report.problem = problem  # the back-annotated tables, if a round corrected them (suggestions read them)
        if report.retime is not None and report.retime.kept is None:
            report.checked_error = None
    report.estimate_error = chosen.error
    report.pareto_notes = report.explored.uniform(first, allowed, design.library.name)
    base = base_latency(design)
    if report.fallback is None:  # the points stand on the start: from a bf16 start, its cells' cost over fp16 added
        base = {g: t + start_cost(tables, cands).get(g, 0.0) for g, t in base.items()}
    report.pareto = report.explored.points(base, chosen.mapping,
                                           first if report.fallback is None else problem)
    report.trace.append(_trace(problem, chosen.mapping, "opt.checked"))

    counts, remapped = _apply(design, report, problem, chosen, cands, budget=budget, share=propose.share,
                              started=started, start=start)
    map_error = report.checked_error if report.checked_error is not None else (chosen.error if remapped else 0.0)
    kv = kv_step(design, report, budget, map_error, area0)
    return PassResult({"candidates": len(cands), **{f"cells_{p}": n for p, n in counts.items()}, **kv}, report)


def _say(design, report: OptimizeReport, line: str) -> None:
    """A note of the pass that the compile log also prints as it goes."""
    report.notes.append(line)
    design.log(f"optimize: {line}")


def _start_line(started, start_why: str | None, cands, offered) -> str:
    """The compile log's line on the loop's start under precision.default bf16 (from bf16 cells, or why not)."""
    if not started:
        return f"start: precision.default bf16 realised as the float design ({offered[0].current}): {start_why}"
    moves = ", ".join(sorted({p for c in cands for p in c.options[1:]})) or "none"
    return (f"start: uniform bf16 (precision.default bf16): {len(started)} MatMul cells start as bf16 cells (Casts at "
            "their boundary, as accuracy.fallback's uniform bf16 builds them), attention, norms and the KV cache stay "
            f"fp16; the loop's moves ({moves}) are priced against the bf16 cell, and a cell it does not move stays bf16")


def _apply(design, report: OptimizeReport, problem: search.Problem, chosen: search.Outcome, cands, *, budget: float,
           share: float, started, start: float) -> tuple[dict, bool]:
    """The chosen map applied to the netlist, each cell's row and the notes on what was realised; (the counts per
    precision, whether any cell left the netlist's precision)."""
    search_mode = report.search
    requested = dict(chosen.mapping)
    counts = mp.apply_mapping(design.netlist, requested, requested, design.library)
    design.netlist_changed()
    realised = {n.name: precision_of(n) for n in design.netlist.nodes() if n.name in requested}
    for c in cands:
        p = requested[c.name]
        report.cells.append(mp_row(problem, c, p, realised.get(c.name, p)))
    quantised = [problem.error[c][p] for c, p in chosen.mapping.items() if p != problem.options[c][0]]
    report.notes += experts.kept_float([(row, {p: problem.error[row.name][p] for p in problem.options[row.name][1:]})
                                        for row, c in zip(report.cells, cands) if c.op == "MoE"],
                                       quantised, budget, share,
                                       report.sensitivity.startswith("measured per role"))
    remapped = any(row.realised != c.current for row, c in zip(report.cells, cands))  # off the netlist (a bf16 start too)
    if design.library.is_gpu and remapped and report.retime is None:
        report.notes.append(GPU_SPEED_UNMEASURED)
        design.log(f"optimize: note: {GPU_SPEED_UNMEASURED}")
    mismatched = [c for c in report.cells if c.requested != c.realised]
    if mismatched:
        report.notes.append(f"{len(mismatched)} cells realised another precision than requested: "
                            + ", ".join(f"{c.name} {c.requested}->{c.realised}" for c in mismatched[:5]))
    design.log(f"optimize: {search_mode}: {len([c for c in report.cells if c.realised != problem.options[c.name][0]])} "
               f"cells re-mapped, estimated error {chosen.error:.3e}, {time.perf_counter() - start:.1f} s"
               + (f"; the map: {mix({c.name: c.realised for c in report.cells})} cells (from a start of "
                  f"{len(started)} bf16)" if started else ""))
    return counts, remapped


def base_latency(design) -> dict[str, float]:
    """Each group's predicted latency as the design is timed now (the critical path's arrival less its input delay,
    as measured re-timing predicts it): what the explored points' table changes are added to."""
    return {t.name: t.critical.arrival - t.critical.input_delay for t in design.time() if t.paths}


def start_area(design) -> float:
    """The design's area (bytes) as the pass finds it: the compile log's rows are deltas from it."""
    return area_of(design.netlist, design.constraints, {g.name: g.scenario.dims for g in design.groups}).total


def kv_step(design, report: OptimizeReport, budget: float, map_error: float, area0: float) -> dict[str, int]:
    """The KV moves (passes.optimize.kv_moves) after the map: the buffer's length when the area is over
    budget, then the KV dtype; their rows into the trace, their verdicts into the notes; counts of kept moves."""
    def row(phase: str, analysis) -> None:
        worst = min(analysis.groups, key=lambda g: g.wns) if analysis.groups else None
        report.trace.append(TraceRow(phase, min(analysis.wns, 0.0), analysis.tns,
                                     kv_moves.loop_cost(analysis).rules, analysis.area.total - area0,
                                     worst.name if worst is not None and worst.wns < 0 else ""))

    layout = report_of(design, KvLayoutReport)
    if layout is None or not layout.applied:
        return {}  # no shared KV buffer: neither move has anything to change (and no re-timing is spent)
    analysis = design.analyze(tp_plan=False)
    move, analysis = kv_moves.length_move(design, analysis, row)
    if move is not None:
        report.kv.append(move)
    move, analysis = kv_moves.dtype_move(design, analysis, row, budget * CHECK_SHARE, map_error)
    if move is not None:
        report.kv.append(move)
    for m in report.kv:
        line = f"{m.phase}: requested {m.requested}, realised {m.realised}: {'kept' if m.kept else 'not kept'} ({m.why})"
        report.notes.append(line)
        design.log(f"optimize: {line}")
    return {m.phase: 1 for m in report.kv if m.kept}


def calibrated_search(problem: search.Problem, chosen: search.Outcome, report: OptimizeReport,
                      propose) -> tuple[search.Outcome, search.Problem]:
    """Ultra's one calibration (module docstring, `calibrate`): a map that still misses a clock and whose end-to-end
    check (report.checked_error) read under CALIBRATE_BELOW of its estimate is searched once more with every cell's
    error scaled by measured / estimated; `propose(tables)` searches and checks it (None: its check failed). The
    calibrated map is taken only if its check passed and it costs less on the calibrated tables; else the first map
    stays, with its own check. Returns the outcome and the tables it stands on."""
    measured = report.checked_error
    if chosen.cost.violation <= 0 or not chosen.error or measured >= CALIBRATE_BELOW * chosen.error:
        return chosen, problem
    ratio = measured / chosen.error
    scaled = dataclasses.replace(problem, error={c: {p: e * ratio for p, e in options.items()}
                                                 for c, options in problem.error.items()})
    report.notes.append(f"calibration: the map still misses a clock and its check measured {measured:.3e} against the "
                        f"estimate {chosen.error:.3e}: every cell's error scaled by x{ratio:.2f}, searched once more")
    first = search.outcome(scaled, chosen.mapping, chosen.steps)
    report.explored.stage = "calibrated"
    second = propose(scaled)
    report.explored.stage = ""
    if second is None or second.mapping == chosen.mapping or not second.cost < first.cost:
        why = ("its map failed the end-to-end check" if second is None else
               "it found the same map" if second.mapping == chosen.mapping else "its map costs no less")
        report.notes.append(f"calibration: the first map kept ({why})")
        report.checked_error = measured
        return chosen, problem
    cells = sum(1 for c, p in second.mapping.items() if p != problem.options[c][0])
    report.notes.append(f"calibration: the calibrated map kept ({cells} cells moved; its check measured "
                        f"{report.checked_error:.3e}); the tables' errors stay calibrated for what follows")
    report.sensitivity += f"; calibrated x{ratio:.2f} by the end-to-end check"
    report.trace.append(_trace(scaled, second.mapping, "opt.calibrated"))
    return second, scaled


def sensitivities(design, cands) -> tuple[dict, str, bool]:
    """(errors per cell and option, how they were obtained, whether the design runs here for the end-to-end check):
    measured per cell, per role for a design over MEASURE_LIMIT of weights whose cells need more than CELL_RUNS runs
    (on the target's device when it is here, else ORT CPU), or the labelled prior for a plan or a design ORT cannot
    run here."""
    if not any(c.moves for c in cands):  # a bf16 start's cells are measured at bf16 even with no move left
        return {c.name: {c.current: 0.0} for c in cands}, "not needed: no cell has another option", False
    weights = sum(c.params for c in cands) * (2 if cands[0].current == "fp16" else 4)
    if _weightless(design, cands):
        errors, how = sensitivity.measure(design, cands)  # the prior, said so
        return errors, how, False
    runs = sum(len(c.moves) for c in cands)
    per_role = weights > MEASURE_LIMIT and runs > CELL_RUNS
    measure = sensitivity.measure_per_role if per_role else sensitivity.measure
    try:
        return (*measure(design, cands, design.log), True)
    except CannotRun as exc:
        return (*_prior(cands, f"ORT cannot run this design here ({exc})"), False)


def _prior(cands, why: str) -> tuple[dict, str]:
    """Each cell's error as the labelled per-precision prior, and the line that says why."""
    errors = {c.name: {c.current: 0.0, **{p: sensitivity.PRIOR_ERROR[p] for p in c.moves}} for c in cands}
    return errors, (f"estimate: {why}; per-precision prior "
                    + ", ".join(f"{p} {e:.1e}" for p, e in sensitivity.PRIOR_ERROR.items()))


def mp_row(problem: search.Problem, cand, requested: str, realised: str) -> CellMap:
    return CellMap(name=cand.name, hierarchy=cand.hierarchy, requested=requested, realised=realised,
                   error=problem.error[cand.name][requested],
                   cost={g: problem.cost[g][cand.name][requested] for g in problem.cost},
                   baseline_cost={g: problem.cost[g][cand.name][problem.options[cand.name][0]] for g in problem.cost})


def _weightless(design, cands) -> bool:
    node = next(n for n in design.netlist.nodes() if n.name == cands[0].name)
    return mp.is_weightless(mp.weight_of(node))


def search_map(problem: search.Problem, mode: str, max_steps: int, report: "OptimizeReport") -> search.Outcome:
    """The effort's map: greedy (medium); the exact map no slower than medium in any group unless a slower one
    closes more of a miss (high); that, then recovery within medium's latency (ultra). Trace rows go to `report`."""
    medium = search.greedy(problem, max_steps)
    report.trace.append(_trace(problem, medium.mapping, "opt.greedy"))
    report.explored.add(problem, medium.mapping, "greedy")
    if mode == "greedy":
        return medium
    ceiling = {g: problem.slack[g] - s for g, s in medium.slack.items()}  # never slower than medium in any group
    exact = search.ilp(problem, ceiling)
    report.explored.add(problem, exact.mapping, "ilp")
    if exact.cost.violation > 0:  # meeting comes before speed: a map slower somewhere that meets wins
        free = search.ilp(problem)
        report.explored.add(problem, free.mapping, "ilp (no ceiling)")
        if free.cost.violation < exact.cost.violation:
            report.notes.append("ilp: the exact map that closes more of the miss is slower than medium in some group: kept")
            exact = free
    if search.evaluate(problem, exact.mapping)[0].scalar() > search.evaluate(problem, medium.mapping)[0].scalar():
        report.notes.append("ilp: the solver's map costs more than the greedy one (time limit hit): the greedy map kept")
        exact = medium
    report.trace.append(_trace(problem, exact.mapping, "opt.ilp"))
    if mode == "ilp":
        return exact
    recovered = search.recover(problem, exact, ceiling, max_steps)
    report.trace.append(_trace(problem, recovered.mapping, "opt.recover"))
    report.explored.add(problem, recovered.mapping, "recover")
    return recovered
