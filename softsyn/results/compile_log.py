"""The compile log's data: one row per step (LogRow), the loop's search steps (TraceRow), and the log (CompileLog).

flow.compile fills it, the optimize pass hands its trace rows to it, reports.compile_log renders it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class TraceRow:
    phase: str
    wns: float  # s, estimated from the tables (<= 0)
    tns: float  # s, the groups' negative slacks summed
    rules: float  # design-rule cost
    area_delta: float  # bytes
    worst_group: str
    measured: bool = False  # wns/tns measured on the target (measured re-timing), not estimated from the tables
    at: float = field(default_factory=time.perf_counter)  # when the step ended (perf_counter): the log's elapsed


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
    effort: object  # passes.Effort: its name, script and script_text() head the log
    rows: list[LogRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the emitted artifacts lack or assume, printed under the rows
    start: float = field(default_factory=time.perf_counter)

    def add(self, phase: str, analysis, cells: int, error_over: float = 0.0) -> LogRow:
        """A row from a re-timed design (an Analysis); `error_over`: the estimated error over the accuracy budget
        (fraction)."""
        worst = min(analysis.groups, key=lambda g: g.wns) if analysis.groups else None
        slack = analysis.area.slack
        rules = (max(0.0, -slack) / 1e6 if slack is not None else 0.0) + max(0.0, error_over) * 100
        row = LogRow(elapsed=time.perf_counter() - self.start, phase=phase, wns=min(analysis.wns, 0.0),
                     tns=analysis.tns, area=analysis.area.total,
                     worst_group=worst.name if worst is not None and worst.wns < 0 else "", cells=cells, rules=rules)
        self.rows.append(row)
        return row

    def add_trace(self, trace: list[TraceRow], analysis, cells: int) -> None:
        """A pass's search steps, from its tables (labelled est), and its measured rounds (ultra, not labelled): WNS,
        TNS, rules, area."""
        base = analysis.area.total
        for t in trace:
            phase = t.phase if t.measured else f"{t.phase} (est)"
            self.rows.append(LogRow(elapsed=max(0.0, t.at - self.start), phase=phase, wns=t.wns, tns=t.tns,
                                    area=base + t.area_delta, worst_group=t.worst_group, cells=cells, rules=t.rules))
