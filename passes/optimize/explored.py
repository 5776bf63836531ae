"""Every map the compile loop evaluated, kept as points of the latency-error plane (softsyn.results.pareto).

The loop evaluates many maps and keeps one; this records each distinct one as it goes, from what the loop already
computed: its tables (the search's Problem: per cell and option the cost per group and the error) predict its
latency per group (the design's latency before the pass, the STA's arrival less the input delay, plus the tables'
change) and estimate its error (search.map_error of its cells' errors); an end-to-end check adds the measured error,
a measured re-timing round the measured latencies. A map seen again (the ILP finding the greedy map) gets the new
label beside the first, not a second point. The uniform designs (every cell at one precision) are predicted from
the same tables and error model (`uniform`), the baseline (every cell as it was) first.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from passes.optimize import search
from softsyn.results.pareto import ParetoPoint

ORDER = ("int4", "int8", "fp8", "fp16", "bf16", "fp32")  # a mix lists its narrowest precision first


def mix(mapping: dict[str, str]) -> str:
    """'39 int4 + 53 int8 + 104 fp16': how many cells of the map run at each precision, narrowest first."""
    counts: dict[str, int] = {}
    for p in mapping.values():
        counts[p] = counts.get(p, 0) + 1
    ranked = sorted(counts, key=lambda p: (ORDER.index(p) if p in ORDER else len(ORDER), p))
    return " + ".join(f"{counts[p]} {p}" for p in ranked)


@dataclass
class Entry:
    key: frozenset  # the cells the map moves off the baseline, with their precision
    labels: list[str]
    origin: str
    mapping: dict[str, str]
    delta: dict[str, float]  # group -> s the tables add to the design's latency before the pass
    estimate: float  # search.map_error on the tables it was first evaluated on
    checked: float | None = None  # the end-to-end check's measured error
    measured: dict[str, float] | None = None  # group -> s, a measured re-timing round's median
    base_measured: dict[str, float] | None = None  # group -> s, the design before the map in the same run


@dataclass
class Explored:
    """The loop's points, in the order first evaluated; `stage` prefixes the labels (an attempt, a re-search)."""
    stage: str = ""
    entries: dict[object, Entry] = field(default_factory=dict)  # a map (frozenset) or a uniform design (origin, label)

    def add(self, problem: search.Problem, mapping: dict[str, str], label: str | None, origin: str = "loop") -> Entry:
        """The map's point (made on first sight, from `problem`'s tables), with `label` (behind `stage`) added; a
        uniform design is a point of its own even where a loop map equals it (the baseline excepted)."""
        base = search.baseline(problem)
        key = frozenset((c, p) for c, p in mapping.items() if p != base.get(c))
        label = f"{self.stage}: {label}" if self.stage and origin == "loop" and label else label
        entry = self.entries.get(key) if origin == "loop" or not key else None
        if entry is None:
            delta = {g: sum(rows[c][mapping[c]] - rows[c][base[c]] for c in problem.cells)
                     for g, rows in problem.cost.items()}
            entry = Entry(key, [], origin, dict(mapping), delta,
                          search.map_error(problem.error[c][mapping[c]] for c in problem.cells))
            self.entries[key if origin == "loop" or not key else (origin, label)] = entry
        if label and label not in entry.labels:
            entry.labels.append(label)
        return entry

    def start(self, problem: search.Problem) -> None:
        """The baseline first: every cell at the precision it had (a uniform design too)."""
        held = set(search.baseline(problem).values())
        name = held.pop() if len(held) == 1 else "as read"  # cells of two float precisions: no one name
        self.add(problem, search.baseline(problem), f"uniform {name} (start)", origin="uniform")

    def checked(self, problem: search.Problem, mapping: dict[str, str], error: float) -> None:
        """The end-to-end check's measured error of a map (kept or rejected)."""
        self.add(problem, mapping, None).checked = error

    def measured(self, problem: search.Problem, maps: list[dict[str, str]], rnd, labels: list[str]) -> None:
        """A measured re-timing round (passes.optimize.retime.Round): the map and its sub-maps per precision (`maps`,
        in the round's order), each with its measured medians; the baseline's medians go to the baseline."""
        figures = [rnd.groups, *rnd.parts.values()]
        for mapping, figs, label in zip(maps, figures, labels):
            self.add(problem, mapping, label).measured = {f.group: f.measured_map for f in figs}
        baseline = self.entries.get(frozenset()) or self.add(problem, search.baseline(problem), "start", "uniform")
        if baseline.measured is None:
            baseline.measured = {f.group: f.measured_base for f in rnd.groups}

    def uniform(self, problem: search.Problem, allowed: set[str], library: str) -> list[str]:
        """The uniform designs: per precision a cell offers, every cell offering it at it (the rest keep theirs: the
        loop dropped the option where the library times it no faster in any group). Returns the notes that say so,
        and which `allowed` precision (the constraints' and the library's, before that pruning) has no point."""
        rank = lambda p: (ORDER.index(p) if p in ORDER else len(ORDER), p)  # noqa: E731
        offered = sorted({p for c in problem.cells for p in problem.options[c][1:]}, key=rank)
        notes = []
        for p in offered:
            mapping = {c: p if p in problem.options[c] else problem.options[c][0] for c in problem.cells}
            self.add(problem, mapping, f"uniform {p}", origin="uniform")
            moved = sum(1 for c in problem.cells if mapping[c] == p)
            if moved < len(problem.cells):
                notes.append(f"uniform {p}: the {moved} of {len(problem.cells)} cells that offer {p}; the others "
                             f"keep their precision ({library} times {p} no faster there in any group)")
        for p in sorted(allowed - set(offered), key=rank):
            notes.append(f"uniform {p}: no point: no cell runs faster at {p} in any group ({library}), so the loop "
                         "never measured its error")
        return notes

    def points(self, base: dict[str, float], kept: dict[str, str], problem: search.Problem) -> list[ParetoPoint]:
        """The points: `base` the design's latency per group before the pass (s), `kept` the map the design takes
        (its point added if the loop never recorded it)."""
        start = search.baseline(problem)
        key = frozenset((c, p) for c, p in kept.items() if p != start.get(c))
        if key not in self.entries:
            self.add(problem, kept, "kept")
        out = []
        for e in self.entries.values():
            same = self.entries.get(e.key, e)  # a uniform design the loop also evaluated: the loop's measurements
            checked = e.checked if e.checked is not None else same.checked
            error, how = (checked, "measured") if checked is not None else (e.estimate, "estimated")
            out.append(ParetoPoint(label=" = ".join(e.labels) or "kept", origin=e.origin, mix=mix(e.mapping),
                                   predicted={g: base[g] + d for g, d in e.delta.items() if g in base},
                                   measured=e.measured or same.measured, error=error, error_how=how,
                                   kept=e.key == key and e is same))
        return out
