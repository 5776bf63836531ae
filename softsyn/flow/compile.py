"""The compile flow: run an effort level's pass script, re-time after each pass, emit.

Effort levels (passes.EFFORTS) are labelled scripts of passes read top to bottom. Every
step adds a row to the compile log (DC's shape: elapsed, phase, WNS, TNS, area, cells, worst
group), which reports.compile_log renders.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import passes
from softsyn import progress
from softsyn.design import Design
from softsyn.errors import SoftsynError
from passes import Effort
from passes.precision import record_realised
from softsyn.timing import Analysis


@dataclass(frozen=True)
class LogRow:
    elapsed: float  # s since the compile started
    phase: str
    wns: float  # s (0 when every group meets its clock)
    tns: float  # s
    area: float  # bytes
    worst_group: str
    cells: int
    rules: float = 0.0  # design-rule cost: area over its limit (MB) + estimated error over the accuracy budget (%)


@dataclass
class CompileLog:
    design: str
    library: str
    effort: Effort
    rows: list[LogRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the emitted artifacts lack or assume, printed under the rows
    start: float = field(default_factory=time.perf_counter)

    def add(self, phase: str, analysis: Analysis, cells: int, error_over: float = 0.0) -> LogRow:
        """A row from a re-timed design; `error_over`: the estimated error over the accuracy budget (fraction)."""
        worst = min(analysis.groups, key=lambda g: g.wns) if analysis.groups else None
        slack = analysis.area.slack
        rules = (max(0.0, -slack) / 1e6 if slack is not None else 0.0) + max(0.0, error_over) * 100
        row = LogRow(elapsed=time.perf_counter() - self.start, phase=phase, wns=min(analysis.wns, 0.0),
                     tns=analysis.tns, area=analysis.area.total,
                     worst_group=worst.name if worst is not None and worst.wns < 0 else "", cells=cells, rules=rules)
        self.rows.append(row)
        return row

    def add_estimates(self, report, analysis: Analysis, cells: int) -> None:
        """The optimize pass's search steps, from its tables (labelled est), and its measured rounds (ultra, not
        labelled): WNS, TNS, rules, area."""
        base = analysis.area.total
        for t in getattr(report, "trace", ()):
            phase = t.phase if getattr(t, "measured", False) else f"{t.phase} (est)"
            at = getattr(t, "at", None)  # when the step ended; a row made before this log started reads 0
            elapsed = max(0.0, at - self.start) if at is not None else time.perf_counter() - self.start
            self.rows.append(LogRow(elapsed=elapsed, phase=phase, wns=t.wns, tns=t.tns, area=base + t.area_delta,
                                    worst_group=t.worst_group, cells=cells, rules=t.rules))


def check_effort(name: str) -> Effort:
    """The effort level, every pass of its script registered (fails before any work is done)."""
    level = passes.effort(name)
    registered = passes.load_all()
    missing = [p for p in level.script if p not in registered]
    if missing:
        raise SoftsynError(f"effort {level.name}: pass {', '.join(missing)} is not registered in this build "
                           f"(script: {', '.join(level.script)}; registered: {', '.join(sorted(registered))})")
    return level


def compile_design(design: Design, effort: str, out_dir: str | Path, reference: dict,
                   plan: bool = False, options: dict[str, dict] | None = None,
                   started: float | None = None) -> tuple[Analysis, Path]:
    """Run the effort script on the design, then emit everything into out_dir (atomically).

    `reference` says what `softsyn verify` compares against (the fp32 source: spec and ONNX path).
    `plan`: the netlist may be weightless; everything but the model itself is written.
    `options`: pass name -> keyword arguments that override its step's options (compile --all-logits).
    `started`: the perf_counter the command started at, so the log's elapsed is the command's wall time (reading
    the design, an export included, is then inside the first row); default now.
    """
    from softsyn.emit import emit

    level = check_effort(effort)
    log = CompileLog(design.netlist.name, design.library.name, level)
    if started is not None:
        hit = (design.netlist.provenance.get("cache") or {}).get("hit")
        how = "read from the export cache" if hit else "exported now" if hit is False else "read"
        log.notes.append(f"elaborate's elapsed includes starting up and reading the design "
                         f"({log.start - started:.1f} s; {how})")
        log.start = started
    analysis = design.analyze()
    log.add("elaborate", analysis, len(design.netlist.nodes()))
    error_over = 0.0
    for step in level.steps:
        before = analysis
        with progress.step(f"compile: {step.pass_name}", enabled=design.progress,
                           done=f"compile: {step.pass_name} done"):
            result = passes.run_pass(design, step.pass_name,
                                     {**dict(step.options), **(options or {}).get(step.pass_name, {})})
        if getattr(result.report, "trace", None):
            log.add_estimates(result.report, before, len(design.netlist.nodes()))
            error_over = result.report.estimate_error - result.report.budget
            log.notes += [f"optimize: {n}" for n in [f"sensitivity {result.report.sensitivity}", *result.report.notes]]
        held = record_realised(design, step.pass_name)  # labels read from the model after every pass
        if held and held.split(" (read after")[0] not in [n.split(" (read after")[0] for n in log.notes]:
            log.notes.append(held)
        analysis = design.analyze(tp_plan=step is level.steps[-1])  # the plan once, for what emit writes
        log.add(step.pass_name, analysis, len(design.netlist.nodes()), error_over)
    path = emit(design, analysis, out_dir, log, reference, plan=plan)
    return analysis, path
