"""passes: netlist transformations, one module per pass (Yosys style), and the effort levels.

A pass is a function `run(design) -> PassResult`, registered with `register(name, help)`. It changes
the design only through the Design's API (its netlist, then `design.netlist_changed()`), returns the
counts of what it changed and, optionally, a report object. `run_pass` logs a header line and the
counts through `design.log` and files the report under the pass's name in `design.pass_reports`; it
re-times nothing (the compile loop decides when to re-time).

A pass's report is a `PassReport`: the compile loop and emit read it through that protocol (its search trace and
notes, the session.json entries it adds, the artifact notes), never by the pass's name; `report_of(design, cls)`
finds a report by its type (reports render fusion and precision reports by type).

Effort levels are labelled scripts: an `Effort` is an ordered tuple of `Step`s, each a pass name and
what that step does at this level, read top to bottom. Each level extends the one below it
(`Effort("medium", ..., LOW.steps + (...))`), so the CLI's help, `softsyn passes` and the compile
log all render the same data.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

from softsyn.errors import SoftsynDefect, SoftsynError
from softsyn.names import restart_names

PASSES: dict[str, "Pass"] = {}


class PassReport:
    """What a pass's report hands the compile loop and emit; a pass's report class derives from it and overrides
    what it has. The defaults say nothing."""

    trace: tuple = ()  # the loop's search steps (results.compile_log.TraceRow), for the compile log's rows

    def log_notes(self) -> list[str]:
        """Lines the compile log prints under its rows, taken when the pass has run (with a trace)."""
        return []

    def error_over(self) -> float:
        """The estimated error over the accuracy budget (fraction) of what the pass kept: the log's rule cost."""
        return 0.0

    def artifact_notes(self) -> list[str]:
        """Lines emit adds to the compile log about the artifact (what a layout assumes, which cells a rule held)."""
        return []

    def session_entries(self) -> dict[str, object]:
        """Keys this report sets in runtime/session.json (plain JSON data); a dict value is merged into the key's dict
        where session.json has one (kv_cache)."""
        return {}


@dataclass(frozen=True)
class PassResult:
    counts: dict[str, int]  # what the pass changed, by kind ("folded": 12); empty when it changed nothing
    report: PassReport | None = None  # what the loop, emit and reports read after the pass


@dataclass(frozen=True)
class Pass:
    name: str
    help: str
    run: Callable[..., PassResult]


@dataclass(frozen=True)
class Step:
    pass_name: str
    what: str  # what this step does at its effort level, in a line
    options: tuple[tuple[str, object], ...] = ()  # keyword arguments of the pass's run at this step


@dataclass(frozen=True)
class Effort:
    name: str
    help: str  # what the level is for, in a line
    steps: tuple[Step, ...]

    @property
    def script(self) -> tuple[str, ...]:
        return tuple(step.pass_name for step in self.steps)

    def script_text(self) -> str:
        return " -> ".join(self.script)

    def step_lines(self) -> list[str]:
        """One line per step, numbered in script order: pass name, what it does at this level."""
        width = max(len(step.pass_name) for step in self.steps)
        return [f"{i}. {step.pass_name:<{width}}  {step.what}" for i, step in enumerate(self.steps, 1)]


LOW = Effort("low", "map: standard fusions, uniform default precision", (
    Step("flatten", "inline, constant-fold, sweep dead, no-op and duplicate nodes"),
    Step("fuse", "standard fusions: norms, rotary, attention, projections, GELU, MoE"),
    Step("precision", "one uniform precision: fp16 on GPU targets, fp32 on CPU"),
    Step("kv_layout", "decoders: one max_length KV buffer GQA updates in place; last-position logits at prefill",
         (("last_token_logits", True),)),
))
SERVING = Step("serving", "with a serving block: the engines' max_batch the simulated load meets every check with")
MEDIUM = Effort("medium", "low, then a greedy per-cell precision map on the critical path", LOW.steps + (
    Step("optimize", "greedy: on the worst group, the cell move with the best delta-delay / delta-error, until met",
         (("search_mode", "greedy"), ("max_steps", 200))),
    SERVING,
))
HIGH = Effort("high", "low, then the exact per-cell precision map (an ILP over all cells x precisions)", LOW.steps + (
    Step("optimize", "exact: scipy.optimize.milp over every cell x precision, accuracy and area as constraints, "
         "groups weighted", (("search_mode", "ilp"), ("max_steps", 200))),
    SERVING,
))
ULTRA = Effort("ultra", "high, then recovery: precision raised back where slack allows, to win back accuracy; the map "
               "measured on the target device when it is present", LOW.steps + (
    Step("optimize", "exact map, then recovery: cells raised back, largest error first, where every group keeps "
         "its slack and stays within medium's latency; a map still missing a clock whose end-to-end check read well "
         "under its estimate searched once more on errors calibrated by that check; then measured re-timing where "
         "the target's provider runs: the map kept only if measured better in the cost order (negative slack, then "
         "latency), else the tables back-annotated and searched again (3 rounds at most)",
         (("search_mode", "ultra"), ("max_steps", 200), ("calibrate", True), ("retime", True))),
    SERVING,
))
EFFORTS: dict[str, Effort] = {level.name: level for level in (LOW, MEDIUM, HIGH, ULTRA)}


def effort(name: str) -> Effort:
    if name not in EFFORTS:
        raise SoftsynError(f"no effort level {name!r}; valid: {', '.join(EFFORTS)}")
    return EFFORTS[name]


def register(name: str, help: str):
    """Decorator: make `run(design) -> PassResult` available as the pass `name`."""
    def wrap(run):
        if name in PASSES:
            raise ValueError(f"pass {name!r} registered twice")
        PASSES[name] = Pass(name, help, run)
        return run
    return wrap


def load_all() -> dict[str, Pass]:
    """Import every pass module in this folder (each registers itself); return the registry."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return PASSES


def get(name: str) -> Pass:
    load_all()
    if name not in PASSES:
        raise SoftsynError(f"no pass {name!r}; registered passes: {', '.join(sorted(PASSES)) or 'none'}")
    return PASSES[name]


def run_pass(design, name: str, options: dict | None = None) -> PassResult:
    """Run one pass on the design: header line, the pass (with its step's `options`), its counts; its report
    goes to design.pass_reports."""
    p = get(name)
    design.log(f"pass {name}: {p.help}")
    restart_names(design.netlist.model)  # the names a pass adds depend on the netlist alone (byte-identical compiles)
    result = p.run(design, **(options or {}))
    shown = ", ".join(f"{kind} {n}" for kind, n in result.counts.items()) or "no change"
    design.log(f"pass {name}: {shown}")
    if result.report is not None:
        if not isinstance(result.report, PassReport):
            raise SoftsynDefect(f"pass {name!r} returned a {type(result.report).__name__} report, not a PassReport")
        design.pass_reports[name] = result.report
    return result


def report_of(design, cls: type):
    """The design's pass report of type `cls` (the last filed), or None."""
    return next((r for r in reversed(design.pass_reports.values()) if isinstance(r, cls)), None)


def refile(design, report: PassReport) -> None:
    """Put `report` where the design's report of its type was filed (the loop's KV moves change kv_layout's)."""
    key = next(k for k, r in reversed(design.pass_reports.items()) if isinstance(r, type(report)))
    design.pass_reports[key] = report
