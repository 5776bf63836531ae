"""The compile flow: run an effort level's pass script, re-time after each pass, emit.

Effort levels (passes.EFFORTS) are labelled scripts of passes read top to bottom. Every
step adds a row to the compile log (DC's shape: elapsed, phase, WNS, TNS, area, cells, worst
group), which reports.compile_log renders.
"""
from __future__ import annotations

from pathlib import Path

import passes
from softsyn import progress
from softsyn.design import Design
from softsyn.errors import SoftsynError
from passes import Effort
from passes.precision import record_realised
from softsyn.results.compile_log import CompileLog
from softsyn.timing import Analysis
from softsyn.emit import check_target, emit


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
    level = check_effort(effort)
    check_target(design, str(reference.get("source", "")), plan)
    torch_note = None
    if design.torch_target is not None and level.name != "low":  # the loop's moves would not reach the package
        torch_note = (f"target {design.torch_target}: effort {level.name} ran effort low's script: the compile loop's "
                      "precision moves change the ONNX netlist, not the torch package (one dtype)")
        level = check_effort("low")
    log = CompileLog(design.netlist.name, design.library.name, level)
    if torch_note:
        log.notes.append(torch_note)
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
        report = result.report  # a pass with search steps (the loop): its rows, rule cost and notes (passes.PassReport)
        if report is not None and report.trace:
            log.add_trace(report.trace, before, len(design.netlist.nodes()))
            error_over = report.error_over()
            log.notes += report.log_notes()
        held = record_realised(design, step.pass_name)  # labels read from the model after every pass
        if held and held.split(" (read after")[0] not in [n.split(" (read after")[0] for n in log.notes]:
            log.notes.append(held)
        analysis = design.analyze(tp_plan=step is level.steps[-1])  # the plan once, for what emit writes
        log.add(step.pass_name, analysis, len(design.netlist.nodes()), error_over)
    path = emit(design, analysis, out_dir, log, reference, plan=plan)
    return analysis, path
