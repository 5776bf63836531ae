"""Measured re-timing (effort ultra): the map signed off in the loop, its measurement back-annotated into the tables.

The tables the search runs on can be wrong where the search gains most: on the H200 they timed a 57-cell int8 map
faster than fp16, and signoff measured it slower (3.828 against 3.098 ms; docs/decisions/2026-12-01-compile-loop.md).
So at ultra, when the target's provider runs here (`device_absent`), a map the accuracy check kept is measured:

1. `Bench`: the design as it stands (a) and with the map applied (b), each written to a temporary ONNX file,
   timed on the target's provider as signoff times a compiled artifact (softsyn.runtime.measure: warm
   run_with_iobinding calls, the artifact's SessionOptions, a group the design's launches say is captured replayed as
   a CUDA graph, the shared KV buffer bound as kv_aliases binds it, scenario_inputs' seeded feeds) in ONE run of
   interleaved rounds, a and b alternating which goes first, so another process's load lands on both alike.
2. `judge`: per group the measured medians and the paired ratio (median over rounds of b's round median over a's),
   its p10-p90; the measured slack is the group's budget (required - input delay) less the measured median, as
   signoff's GroupResult reads it. Each group is first told apart or not: faster or slower beyond its rounds' noise
   (a sign test over its paired rounds at SIGN_P, with 10 rounds the map won 9, and a mean change of MIN_GAIN of its
   median), or 0. The map is then judged in the loop's cost order, one key at a time, each key summing the groups
   told apart (from the medians; a group not told apart adds nothing, so a noisy prefill neither hides nor fakes
   decode's change): first the weighted negative slack (sum of weight x max(0, -slack)), then the weighted latency.
   A key decides when that sum moves it by MIN_GAIN of the baseline's value (a cost at 0 that rises is raised); one
   it does not move passes the decision to the next. So a map that closes part of a miss is kept though a group
   with slack to spare (prefill under a loose clock) runs slower, as Design Compiler trades a met path's slack for
   a violated one's; and a baseline whose decode straddles the clock round to round does not hide a map that
   meets it in every round.
   A tie on both keys goes to the baseline, as the search's last key (the error) says: a map that buys no measured
   time only costs accuracy.
3. `corrected`: a rejected map's measured change per group back-annotates the tables, per precision: the measured
   delta is attributed to the moved cells in proportion to their predicted deltas, i.e. each group's deltas at a
   precision are scaled by the measured relative change over the predicted one ((ratio - 1) / (predicted map /
   predicted base - 1): relative, so a machine that runs every cell slower than the library, as a loaded one does,
   does not inflate it; 0 where the group's paired p10-p90 holds 1: no change told from noise), and the factor is
   applied to every cell's option at that precision (one measurement cannot tell the cells apart; the unmoved cells
   of the same precision share the bias). A map of several low-bit precisions is measured with one sub-map per
   precision beside it, in the same interleaved run, so int4's and int8's errors in the tables are told apart
   (on the H200 int8 measured no faster than fp16 inside a graph while int4 ran in 57 % of its time).
   The caller re-searches on the corrected tables (and checks accuracy again), and the new map is measured; at most
   ROUNDS measured rounds, then the design keeps its precision, and the notes say why.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from softsyn import progress
import onnx_ir as ir

from passes.optimize import mapping as mp, search
from softsyn.results.compile_log import TraceRow
from softsyn.errors import SoftsynError
from softsyn.runtime.session import ARTIFACT_OPTIONS, IR_VERSION, provider_of, provider_problem
from softsyn.netlist import Netlist
from softsyn.timing.capture import group_launch, shared_kv_buffer
from softsyn.runtime.decoder import kv_aliases
from softsyn.runtime.measure import bound_runners, measure_runners
from softsyn.runtime.inputs import scenario_inputs

ROUNDS = 3  # measured rounds (the map, then re-searches on corrected tables) before the design keeps its precision
RUNS, TIMING_ROUNDS, WARMUP = 40, 10, 3  # timed calls per model and group, interleaved rounds, warm-up block
MIN_GAIN = 0.01  # a measured gain below 1 % is not worth the error a map adds
SIGN_P = 0.02  # the sign test's level: with 10 differing rounds the map must win 9 (p 0.011)
DELTA_FLOOR = 1e-9  # s: a group the map changes less than this (predicted) gets no correction factor


@dataclass
class GroupFigures:
    group: str
    weight: float
    budget: float  # required - input delay, s (what one run may take)
    predicted_base: float  # s, the STA's arrival - input delay of the design before the map
    predicted_map: float  # s, predicted_base + the tables' change for the map
    measured_base: float  # s, median
    measured_map: float  # s, median
    ratio: float  # paired: median over rounds of the map's round median / the baseline's
    ratio_p10: float
    ratio_p90: float

    @property
    def slack_base(self) -> float:
        return self.budget - self.measured_base

    @property
    def slack_map(self) -> float:
        return self.budget - self.measured_map

    @property
    def predicted_delta(self) -> float:
        return self.predicted_map - self.predicted_base

    @property
    def factor(self) -> float:
        """Measured relative change over the predicted one (0: none told from noise, or none predicted)."""
        if self.ratio_p10 <= 1.0 <= self.ratio_p90 or abs(self.predicted_delta) < DELTA_FLOOR:
            return 0.0
        return (self.ratio - 1.0) / (self.predicted_delta / self.predicted_base)


@dataclass
class Round:
    index: int
    moved: dict[str, str]  # cell -> low-bit precision of the map measured
    groups: list[GroupFigures]
    ratio: float  # weighted latency, paired: median over rounds of sum(w x map) / sum(w x base)
    ratio_p10: float
    ratio_p90: float
    kept: bool
    verdict: str  # one sentence: why kept or rejected
    load: tuple[float, float]  # 1-min load average before and after measuring
    rounds: int = 0  # interleaved rounds the paired figures are over
    parts: dict[str, list[GroupFigures]] = field(default_factory=dict)  # precision -> its sub-map's figures (a mixed map)

    def figures(self, precision: str) -> list[GroupFigures]:
        """Per group, the measurement that tells `precision`'s change: its own sub-map's, else the map's (one precision)."""
        return self.parts.get(precision, self.groups)

    def negative_slack(self, which: str) -> float:
        """Weighted negative slack, s (>= 0): sum of weight x max(0, -measured slack)."""
        return sum(g.weight * max(0.0, -(g.slack_base if which == "base" else g.slack_map)) for g in self.groups)

    def latency(self, which: str) -> float:
        return sum(g.weight * (g.measured_base if which == "base" else g.measured_map) for g in self.groups)

    def note(self, provider: str) -> str:
        per = "; ".join(f"{g.group} {g.measured_base * 1e3:.3f} -> {g.measured_map * 1e3:.3f} ms (predicted "
                        f"{g.predicted_base * 1e3:.3f} -> {g.predicted_map * 1e3:.3f}), paired x{g.ratio:.3f} "
                        f"[{g.ratio_p10:.3f}-{g.ratio_p90:.3f}]" for g in self.groups)
        counts: dict[str, int] = {}
        for p in self.moved.values():
            counts[p] = counts.get(p, 0) + 1
        cells = ", ".join(f"{n} {p}" for p, n in sorted(counts.items()))
        return (f"measured re-timing round {self.index} on {provider} (baseline vs map of {cells}): {per}; weighted "
                f"latency paired x{self.ratio:.3f} [{self.ratio_p10:.3f}-{self.ratio_p90:.3f}] (median [p10-p90] over "
                f"{self.rounds} rounds); load average {self.load[0]:.2f} -> {self.load[1]:.2f} on {os.cpu_count()} cores: "
                f"{self.verdict}")


@dataclass
class Retime:
    provider: str
    rounds: list[Round] = field(default_factory=list)
    kept: int | None = None  # the round whose map the design keeps; None: the design keeps its precision
    why: str = ""  # how the loop ended, in a sentence

    def rows(self) -> list[dict]:
        """One row per measured round and group, SI: the table precision.rpt prints and session.json holds."""
        return [{"round": rnd.index, "group": g.group, "predicted_base": g.predicted_base,
                 "measured_base": g.measured_base, "predicted_map": g.predicted_map, "measured_map": g.measured_map,
                 "ratio": g.ratio, "spread": f"{g.ratio_p10:.3f}-{g.ratio_p90:.3f}", "slack_map": g.slack_map,
                 "verdict": "kept" if rnd.kept else "rejected"} for rnd in self.rounds for g in rnd.groups]


Measure = Callable[..., dict]  # (design, [mapped netlist, ...], provider) -> {group: (base, map, ...) Measurements}


# ------------------------------------------------------------------------------------------ the device

def target_provider(library) -> str | None:
    """The library's provider as softsyn names it ("cpu" | "cuda"), None for one softsyn does not run."""
    try:
        return provider_of(library.provider)
    except SoftsynError:
        return None


def device_absent(library) -> str | None:
    """None when the library's provider runs here (listed by onnxruntime and, for CUDA, a session opens on it), else
    why not, in words."""
    provider = target_provider(library)
    if provider is None:
        return f"provider {library.provider or '(none)'} is not one softsyn runs"
    return provider_problem(provider)


def not_runnable(design, moved: dict[str, str]) -> str | None:
    """Why the design cannot be measured here even on its device: a weightless plan, a composite; else None."""
    if design.netlist.blocks():
        return "a composite (one model per block) is not measured by the loop"
    by_name = {n.name: n for n in design.netlist.nodes()}
    for name in moved:
        source = mp.weight_source(by_name[name].inputs[1])
        if source is not None and mp.is_weightless(source[0]):
            return "a weightless plan cannot run"
    return None


# ------------------------------------------------------------------------------------------ measuring

def mapped_netlist(netlist, mapping: dict[str, str], library=None):
    """A copy of the netlist with `mapping` applied at `library`'s blocks (the tensors are shared, the graph is the
    copy's own)."""
    copy = Netlist(netlist.model.clone(deep_copy=True), netlist.name, netlist.kind, netlist.provenance,
                   netlist.config, netlist.derived_dims)
    mp.apply_mapping(copy, mapping, library=library)
    return copy


def _write(model, path: Path) -> Path:
    """The model as an ONNX file with its weights beside it (a real-size model is over protobuf's 2 GB)."""

    path.parent.mkdir(parents=True, exist_ok=True)
    model.ir_version = min(model.ir_version, IR_VERSION)
    ir.save(model, str(path), external_data=f"{path.name}.data", size_threshold_bytes=1024)
    return path


def alternate(groups: int, width: int = 2) -> Callable[[int], list[int]]:
    """Round r's order of runners [a0, b0, ..., a1, b1, ...] (`width` designs per group): each group's designs
    rotated by one per round, so each goes first as often as the others."""
    return lambda r: [width * i + (j + r) % width for i in range(groups) for j in range(width)]


def graph_flags(design, mapped, provider: str) -> dict[str, list[bool]]:
    """{"base" | "map": per design group, whether it is timed as a CUDA graph replay}: where the design's launches
    say the group is captured (softsyn.timing.capture, as emit enables it in session.json), on CUDA only."""
    shared = shared_kv_buffer(mapped)
    return {"base": [provider == "cuda" and getattr(design.launches.get(g.name), "captured", False)
                     for g in design.groups],
            "map": [provider == "cuda" and group_launch(mapped, design.library, g.scenario.dims, shared).captured
                    for g in design.groups]}


class Bench:
    """Measures maps against the design before them: the baseline is written and its runners opened once, at the
    first call, and kept for every round (a real-size model loads in tens of seconds); each map is written, opened,
    timed interleaved with them, and dropped. Files live under `folder` (the caller removes it)."""
    def __init__(self, folder: Path, runs: int = RUNS, rounds: int = TIMING_ROUNDS, warmup: int = WARMUP):
        self.folder, self.runs, self.rounds, self.warmup = folder, runs, rounds, warmup
        self.base: list | None = None
        self.feeds: list = []
        self.maps = 0

    def _open(self, netlist, name: str, graphs: list[bool], provider: str) -> list:
        path = _write(netlist.model.clone(), self.folder / name / "model.onnx")
        return bound_runners(path, self.feeds, provider, ARTIFACT_OPTIONS, graphs, kv_aliases(netlist))

    def __call__(self, design, maps: list, provider: str) -> dict:
        """{group: (Measurement before the map, one per netlist in `maps`)}, all timed in one interleaved run."""
        groups = list(design.groups)
        flags = [graph_flags(design, mapped, provider) for mapped in maps]
        if self.base is None:
            self.feeds = [scenario_inputs(design.netlist, g.scenario.dims) for g in groups]
            self.base = self._open(design.netlist, "base", flags[0]["base"], provider)
        opened = []
        for mapped, graphs in zip(maps, flags):
            self.maps += 1
            opened.append((self.maps, self._open(mapped, f"map{self.maps}", graphs["map"], provider)))
        width = 1 + len(maps)
        interleaved = [r for row in zip(self.base, *(runners for _, runners in opened)) for r in row]
        measured = measure_runners(interleaved, self.runs, self.warmup, self.rounds, alternate(len(groups), width))
        folders = [self.folder / f"map{i}" for i, _ in opened]
        del opened, interleaved  # the maps' sessions go before their files do
        for folder in folders:
            for leftover in folder.iterdir():
                leftover.unlink()
        return {g.name: tuple(measured[width * i + j] for j in range(width)) for i, g in enumerate(groups)}

    def close(self) -> None:
        self.base = None  # the baseline's sessions, before the caller removes their files


# ------------------------------------------------------------------------------------------ judging

def _spread(values: list[float]) -> tuple[float, float, float]:
    """(median, p10, p90) of a few values."""
    if len(values) < 2:
        v = values[0] if values else 1.0
        return v, v, v
    cuts = statistics.quantiles(values, n=10, method="inclusive")
    return statistics.median(values), cuts[0], cuts[-1]


def _figures(name: str, timing, problem: search.Problem, mapping: dict[str, str], a, b) -> GroupFigures:
    """One group's figures for the map `mapping` (measurement b) against the design before it (a)."""
    base = search.baseline(problem)
    critical = timing.critical
    budget = min(p.required - p.input_delay for p in timing.paths)
    predicted = critical.arrival - critical.input_delay
    delta = sum(problem.cost[name][c][mapping[c]] - problem.cost[name][c][base[c]] for c in problem.cells) \
        if name in problem.cost else 0.0
    ratio, lo, hi = _spread([mb / ma for ma, mb in zip(a.round_medians, b.round_medians) if ma > 0])
    return GroupFigures(group=name, weight=timing.weight, budget=budget, predicted_base=predicted,
                        predicted_map=predicted + delta, measured_base=a.median, measured_map=b.median, ratio=ratio,
                        ratio_p10=lo, ratio_p90=hi)


def sub_maps(problem: search.Problem, mapping: dict[str, str]) -> dict[str, dict[str, str]]:
    """{precision: the map with only that precision's cells moved}, for a map of two or more low-bit precisions
    (a single-precision map is its own measurement); in precision order."""
    base = search.baseline(problem)
    moved = sorted({p for c, p in mapping.items() if p != base[c]})
    if len(moved) < 2:
        return {}
    return {p: {c: (q if q == p else base[c]) for c, q in mapping.items()} for p in moved}


def _decide(deltas: list[float], reference: float) -> int:
    """+1 when the map runs a group faster, -1 slower, 0 when the rounds cannot tell. `deltas`: per round, the
    baseline's round median less the map's. A sign test over the rounds that differ at SIGN_P, and the mean change
    over all rounds at least MIN_GAIN x `reference` (the baseline's median)."""
    # deferred: scipy.stats is slow to import; only measured re-timing (ultra, device present) tests with it
    from scipy.stats import binomtest

    wins, losses = sum(d > 0 for d in deltas), sum(d < 0 for d in deltas)
    if not wins + losses:
        return 0
    mean, floor = sum(deltas) / len(deltas), MIN_GAIN * reference
    if binomtest(wins, wins + losses, alternative="greater").pvalue <= SIGN_P and mean >= floor:
        return 1
    if binomtest(losses, wins + losses, alternative="greater").pvalue <= SIGN_P and -mean >= floor:
        return -1
    return 0


def _key(gain: float, reference: float) -> int:
    """+1 / -1 / 0: a cost the map lowers / raises by MIN_GAIN x `reference` (the baseline's value) or more, or not;
    `gain` is the baseline's cost less the map's over the groups told apart (a cost at 0 that rises is raised)."""
    floor = MIN_GAIN * reference
    if gain > 0 and gain >= floor:
        return 1
    if gain < 0 and -gain >= floor:
        return -1
    return 0


def judge(index: int, design_timing: dict, problem: search.Problem, mapping: dict[str, str], measured: dict,
          load: tuple[float, float]) -> Round:
    """The round's figures and verdict (module docstring, 2). `design_timing`: {group: GroupTiming} of the design
    before the map; `problem`: the tables the map was searched on (its predicted change); `measured`: {group:
    (baseline, map, then one per sub_maps entry)}."""
    base = search.baseline(problem)
    parts = sub_maps(problem, mapping)
    groups, lat_a, lat_b, told = [], [], [], {}
    split: dict[str, list[GroupFigures]] = {p: [] for p in parts}
    for name, (a, b, *rest) in measured.items():
        timing = design_timing[name]
        fig = _figures(name, timing, problem, mapping, a, b)
        groups.append(fig)
        # faster (+1) or slower (-1) than the baseline beyond its rounds' noise, or not told apart (0)
        told[name] = _decide([ma - mb for ma, mb in zip(a.round_medians, b.round_medians)], a.median)
        for (p, part), m in zip(parts.items(), rest):
            split[p].append(_figures(name, timing, problem, part, a, m))
        for r, (ma, mb) in enumerate(zip(a.round_medians, b.round_medians)):
            if r == len(lat_a):
                lat_a.append(0.0), lat_b.append(0.0)
            lat_a[r] += timing.weight * ma
            lat_b[r] += timing.weight * mb
    ratio, lo, hi = _spread([b / a for a, b in zip(lat_a, lat_b) if a > 0])
    rnd = Round(index=index, moved={c: p for c, p in mapping.items() if p != base[c]}, groups=groups, ratio=ratio,
                ratio_p10=lo, ratio_p90=hi, kept=False, verdict="", load=load, rounds=len(lat_a), parts=split)
    slack = (f"weighted negative slack {-rnd.negative_slack('base') * 1e3:.3f} -> {-rnd.negative_slack('map') * 1e3:.3f}"
             " ms")
    latency = f"weighted latency x{ratio:.3f} [{lo:.3f}-{hi:.3f}]"
    # a key sums its groups' changes (medians), counting only the groups told apart, so one noisy group (prefill's
    # rounds on a shared CPU) neither hides nor fakes another's change
    apart = [g for g in groups if told[g.group]]
    by_slack = _key(sum(g.weight * (max(0.0, -g.slack_base) - max(0.0, -g.slack_map)) for g in apart),
                    rnd.negative_slack("base"))
    by_latency = _key(sum(g.weight * (g.measured_base - g.measured_map) for g in apart), rnd.latency("base"))
    if by_slack < 0:
        rnd.verdict = f"rejected: the map's measured {slack} is worse (a group measured slower)"
    elif by_slack > 0:
        rnd.kept = True
        closes = "closes the miss" if rnd.negative_slack("map") <= 0 else "closes part of the miss"
        rnd.verdict = f"kept: the map {closes} ({slack}, its group measured faster; {latency})"
    elif by_latency < 0:
        rnd.verdict = f"rejected: the map is measured slower ({latency}, weighted over the groups told apart)"
    elif by_latency > 0:
        rnd.kept = True
        rnd.verdict = f"kept: the map is measured faster ({latency}; {slack})"
    else:
        rnd.verdict = (f"rejected: the map is no faster beyond the rounds' spread ({latency}), so it would only add "
                       "error")
    return rnd


def corrected(problem: search.Problem, rnd: Round) -> tuple[search.Problem, list[str]]:
    """The tables back-annotated from a measured round (module docstring, 3), and one line per group and precision
    saying how."""
    cost = {g: {c: dict(options) for c, options in rows.items()} for g, rows in problem.cost.items()}
    lines = []
    for precision in sorted(set(rnd.moved.values())):
        for fig in rnd.figures(precision):
            if fig.group not in cost or abs(fig.predicted_delta) < DELTA_FLOOR:
                continue
            factor = fig.factor
            for c, options in cost[fig.group].items():
                if precision in options:
                    base = options[problem.options[c][0]]
                    options[precision] = base + factor * (options[precision] - base)
            lines.append(f"{fig.group} {precision} x{factor:+.2f}")
    split = " (each precision measured as its own sub-map)" if rnd.parts else ""
    note = (f"tables back-annotated from round {rnd.index}: each group's change at each precision scaled by its "
            f"measured / predicted relative change{split} ({', '.join(lines) or 'no group changed'}; 0: no change "
            "told from the rounds' spread)")
    return dataclasses.replace(problem, cost=cost), [note]


# ------------------------------------------------------------------------------------------ the loop

def retime(design, problem: search.Problem, chosen: search.Outcome, propose: Callable, report,
           measure: Measure | None = None, max_rounds: int = ROUNDS) -> tuple[search.Outcome, search.Problem]:
    """Measure the map, keep it or back-annotate and re-search (`propose(problem) -> Outcome | None`: the search
    and the end-to-end check on corrected tables; None when no map passes). Returns the outcome the design takes
    and the tables it was searched on. Rows and notes go to `report` (an OptimizeReport: trace, notes, retime).
    `measure(design, [mapped netlist, ...], provider)`: the measuring function (default: a Bench kept across the
    rounds): the map, then its sub-maps per precision (sub_maps)."""
    base = search.baseline(problem)
    moved = {c: p for c, p in chosen.mapping.items() if p != base[c]}
    provider = target_provider(design.library)
    why = device_absent(design.library) or not_runnable(design, moved)
    if why:
        report.notes.append(f"measured re-timing skipped: {why}")
        return chosen, problem
    with tempfile.TemporaryDirectory(prefix="softsyn-retime-") as tmp:
        bench = measure or Bench(Path(tmp))
        try:
            return _rounds(design, problem, chosen, propose, report, bench, max_rounds=max_rounds, provider=provider)
        finally:
            getattr(bench, "close", lambda: None)()


def _rounds(design, problem, chosen, propose, report, measure, max_rounds: int, provider: str):
    """retime's loop, measuring with `measure`."""
    base = search.baseline(problem)
    result = Retime(provider)
    report.retime = result
    timing = {t.name: t for t in design.time() if t.paths}
    tried: list[dict[str, str]] = []
    current, tables = chosen, problem
    for index in range(1, max_rounds + 1):
        tried.append(dict(current.mapping))
        design.log(f"optimize: measured re-timing round {index} on {provider}: the design before the map and with it")
        load0 = os.getloadavg()[0]
        maps = [current.mapping, *sub_maps(tables, current.mapping).values()]
        try:
            with progress.step(f"optimize: measured re-timing round {index}/{max_rounds} on {provider}",
                               enabled=getattr(design, "progress", False)):
                pairs = {g: m for g, m in measure(design, [mapped_netlist(design.netlist, m, design.library) for m in maps],
                                                  provider).items() if g in timing}
        except Exception as exc:  # noqa: BLE001 - a session that cannot open or run: ORT's own types, or ours
            report.notes.append(f"measured re-timing round {index} could not run on {provider}: "
                                f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
            if not result.rounds:  # nothing measured: the map stays the tables' choice, labelled as such
                report.retime = None
                return chosen, problem
            result.why = f"round {index} could not be measured"
            break
        rnd = judge(index, timing, tables, current.mapping, pairs, (load0, os.getloadavg()[0]))
        result.rounds.append(rnd)
        report.explored.measured(tables, maps, rnd, [f"measured {index}",
                                                     *(f"measured {index}: its {p} cells only" for p in rnd.parts)])
        if index == 1:
            report.trace.append(_row(TraceRow, "opt.measured.base", rnd, "base", problem, base))
        report.trace.append(_row(TraceRow, f"opt.measured.{index}", rnd, "map", problem, current.mapping))
        report.notes.append(rnd.note(provider))
        design.log(f"optimize: {rnd.note(provider)}")
        if rnd.kept:
            result.kept, result.why = index, f"the map of round {index} is kept: {rnd.verdict[len('kept: '):]}"
            report.notes.append(f"measured re-timing: {result.why}")
            return current, tables
        if index == max_rounds:
            result.why = f"no measured map beat the baseline in {max_rounds} rounds (the cap)"
            break
        tables, lines = corrected(tables, rnd)
        report.notes += lines
        report.explored.stage = f"re-search {index}"  # the points the corrected tables give are labelled so
        nxt = propose(tables)
        report.explored.stage = ""
        if nxt is None or all(p == base[c] for c, p in nxt.mapping.items()):
            result.why = "the re-search on the corrected tables finds no map faster than the baseline"
            break
        if nxt.mapping in tried:
            result.why = "the re-search on the corrected tables chooses a map already measured"
            break
        current = nxt
    result.why += ": the design keeps its precision"
    report.notes.append(f"measured re-timing: {result.why}")
    return search.outcome(tables, base, []), tables


def _row(row_type, phase: str, rnd: Round, which: str, problem: search.Problem, mapping: dict[str, str]):
    """A compile-log row of measured slacks (not an estimate); rules and area from the map, as the tables say."""
    cost, _, _, area = search.evaluate(problem, mapping)
    slack = {g.group: g.slack_base if which == "base" else g.slack_map for g in rnd.groups}
    worst = min(slack, key=slack.get) if slack else ""
    return row_type(phase, min(0.0, slack[worst]) if worst else 0.0, sum(min(0.0, s) for s in slack.values()),
                    cost.rules, area, worst if worst and slack[worst] < 0 else "", measured=True)
