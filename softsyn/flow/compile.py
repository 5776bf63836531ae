"""The compile flow: run an effort level's pass script, re-time after each pass, emit.

Effort levels (softsyn.passes.EFFORT) are scripts of pass names read top to bottom
(DESIGN.md, "Compile loop"). Every step adds a row to the compile log (DC's shape:
elapsed, phase, WNS, TNS, area, worst group).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from softsyn import passes
from softsyn.passes import EFFORT
from softsyn.design import Design
from softsyn.errors import SoftsynError
from softsyn.timing import Analysis
from softsyn.units import fmt_bytes

@dataclass
class LogRow:
    elapsed: float  # s since the compile started
    phase: str
    wns: float  # s (0 when every group meets its clock)
    tns: float
    area: float  # bytes
    worst_group: str
    cells: int


@dataclass
class CompileLog:
    design: str
    library: str
    effort: str
    rows: list[LogRow] = field(default_factory=list)
    start: float = field(default_factory=time.perf_counter)

    def add(self, phase: str, analysis: Analysis, cells: int) -> LogRow:
        worst = min(analysis.groups, key=lambda g: g.wns) if analysis.groups else None
        row = LogRow(time.perf_counter() - self.start, phase, min(analysis.wns, 0.0), analysis.tns,
                     analysis.area.total, worst.name if worst is not None and worst.wns < 0 else "", cells)
        self.rows.append(row)
        return row

    def render(self) -> str:
        lines = [f"softsyn compile: design {self.design}, library {self.library}, effort {self.effort}",
                 f"script: {' -> '.join(EFFORT[self.effort])}", "",
                 f"  {'ELAPSED':>8}  {'':<12}  {'WORST NEG':>10}  {'TOTAL NEG':>10}  {'':>12}  {'':>6}",
                 f"  {'TIME':>8}  {'PHASE':<12}  {'SLACK (ms)':>10}  {'SLACK (ms)':>10}  {'AREA':>12}  "
                 f"{'CELLS':>6}  WORST GROUP",
                 f"  {'-' * 8}  {'-' * 12}  {'-' * 10}  {'-' * 10}  {'-' * 12}  {'-' * 6}  {'-' * 11}"]
        for r in self.rows:
            lines.append(f"  {_clock(r.elapsed):>8}  {r.phase:<12}  {r.wns * 1e3:>10.3f}  {r.tns * 1e3:>10.3f}  "
                         f"{fmt_bytes(r.area):>12}  {r.cells:>6}  {r.worst_group}")
        return "\n".join(lines) + "\n"


def _clock(seconds: float) -> str:
    s = int(math.floor(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def check_script(effort: str) -> list[str]:
    """The pass names of an effort level, every one registered (fails before any work is done)."""
    if effort not in EFFORT:
        raise SoftsynError(f"no effort level {effort!r}; valid: {', '.join(EFFORT)}")
    script = EFFORT[effort]
    registered = passes.load_all()
    missing = [name for name in script if name not in registered]
    if missing:
        raise SoftsynError(f"effort {effort}: pass {', '.join(missing)} is not registered in this build "
                           f"(script: {', '.join(script)}; registered: {', '.join(sorted(registered))})")
    return script


def compile_design(design: Design, effort: str, out_dir: str | Path, reference: dict) -> tuple[Analysis, Path]:
    """Run the effort script on the design, then emit everything into out_dir (atomically).

    `reference` says what `softsyn verify` compares against (the fp32 source: spec and ONNX path).
    """
    from softsyn.emit import emit

    script = check_script(effort)
    log = CompileLog(design.netlist.name, design.library.name, effort)
    analysis = design.analyze()
    log.add("elaborate", analysis, len(design.netlist.nodes()))
    for name in script:
        passes.run_pass(design, name)
        analysis = design.analyze()
        log.add(name, analysis, len(design.netlist.nodes()))
    path = emit(design, analysis, out_dir, log, reference)
    return analysis, path
