"""The latency-error front: every precision map the compile loop evaluated, the uniform designs, and peers, as points.

The optimize pass records a `ParetoPoint` per distinct map it evaluated (passes.optimize.explored), reports.pareto
renders them (DIR/reports/pareto.rpt, pareto.json, a chart in report.html) and `softsyn report pareto DIR --peers
FILE` adds other compilers' models (`peer_points`: bench/compare_peers.py's peers.json, validated as untrusted input).

The front (`front`) is over two axes: the latency of one path group (`ParetoSet.axis`: the decode group where there
is one) and the error. A point's latency there is its measured one where it has one, else the tables' prediction
(`ParetoPoint.latency`). A point dominates another when it is no worse on both axes and better on one; the front is
the points no other point dominates, compared exactly (no tolerance). Ties: two points equal on both axes dominate
neither the other, so both are on the front; a point without a latency in the axis group or without an error is on
no front (it is listed, never plotted).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from softsyn.errors import SoftsynError

SCHEMA = "softsyn.pareto/1"
PEERS_SCHEMA = "softsyn.peers/1"
ORIGINS = ("loop", "uniform", "peer")
ERROR_HOW = ("estimated", "measured")


@dataclass
class ParetoPoint:
    label: str  # what made the map: "ilp", "retime 2: greedy", "uniform int4", a peer's name
    origin: str  # "loop" | "uniform" | "peer"
    mix: str  # the map's precisions, e.g. "39 int4 + 53 int8 + 104 fp16" (a peer: what it says)
    predicted: dict[str, float]  # group -> s, from the library's tables (est); empty for a peer
    measured: dict[str, float] | None  # group -> s, measured on the target's device; None when not measured
    error: float | None  # relative output error (fraction); None: not known
    error_how: str  # "estimated" (the cells' sensitivities combined) | "measured" (an end-to-end check)
    kept: bool = False  # the map the design keeps

    def latency(self, group: str) -> float | None:
        """The point's latency in `group`: measured where it was measured, else the tables' prediction."""
        if self.measured and group in self.measured:
            return self.measured[group]
        return self.predicted.get(group)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ParetoPoint":
        return cls(**data)


def dominates(a: ParetoPoint, b: ParetoPoint, group: str) -> bool:
    """Whether `a` is no slower in `group` and no less accurate than `b`, and strictly better in one of the two."""
    la, lb = a.latency(group), b.latency(group)
    if la is None or lb is None or a.error is None or b.error is None:
        return False
    return la <= lb and a.error <= b.error and (la < lb or a.error < b.error)


def on_axes(point: ParetoPoint, group: str) -> bool:
    """Whether the point has both coordinates (finite) on the (group latency, error) plane."""
    lat = point.latency(group)
    return lat is not None and point.error is not None and math.isfinite(lat) and math.isfinite(point.error)


def front(points: list[ParetoPoint], group: str) -> list[bool]:
    """Per point, whether it is on the front over (latency in `group`, error): not dominated by any point (module
    docstring for the tie rules). Exact, O(n^2): a loop evaluates tens of maps, not thousands."""
    return [on_axes(p, group) and not any(dominates(q, p, group) for q in points if q is not p) for p in points]


def axis_group(groups: list[str], weights: dict[str, float] | None = None) -> str:
    """The group the front is drawn on: `decode` where there is one (per token is what a deployment feels; prefill
    is paid once), else the heaviest group by weight (the first of equal weights)."""
    if "decode" in groups:
        return "decode"
    weights = weights or {}
    return max(groups, key=lambda g: weights.get(g, 1.0)) if groups else ""


@dataclass
class ParetoSet:
    """What pareto.rpt and pareto.json hold: the points, the group the front is drawn on, and what they stand on."""
    design: str
    target: str
    axis: str  # the group whose latency is the front's x axis
    groups: list[str]  # every group a point may have a latency for, in the design's order
    budget: float | None  # the accuracy budget (fraction)
    sensitivity: str  # how the loop's errors were obtained (measured / prior), as the precision report says
    points: list[ParetoPoint] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def on_front(self) -> list[bool]:
        return front(self.points, self.axis)

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "design": self.design, "target": self.target, "axis": self.axis,
                "groups": list(self.groups), "budget": self.budget, "sensitivity": self.sensitivity,
                "points": [p.to_dict() for p in self.points], "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: dict) -> "ParetoSet":
        if data.get("schema") != SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r}, expected {SCHEMA!r}")
        return cls(design=data["design"], target=data["target"], axis=data["axis"], groups=list(data["groups"]),
                   budget=data["budget"], sensitivity=data["sensitivity"],
                   points=[ParetoPoint.from_dict(p) for p in data["points"]], notes=list(data["notes"]))


# ------------------------------------------------------------------------------------------ peers.json (untrusted)

def _number(value, where: str, source: str, positive: bool) -> float:
    """A finite number (> 0 when `positive`, else >= 0) or a one-line SoftsynError naming the file and key."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
            (value <= 0 if positive else value < 0):
        want = "a positive number of seconds" if positive else "a number >= 0 (a fraction) or null"
        raise SoftsynError(f"{source}: {where}: {value!r} is not {want}")
    return float(value)


def _text(value, where: str, source: str, limit: int = 120) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise SoftsynError(f"{source}: {where}: {value!r} is not a name (a non-empty string of at most {limit} "
                           "characters)")
    return value


def _peer(entry, i: int, source: str) -> ParetoPoint:
    where = f"peers[{i}]"
    if not isinstance(entry, dict):
        raise SoftsynError(f"{source}: {where}: not an object (label, latency, error)")
    label = _text(entry.get("label"), f"{where}.label", source)
    latency = entry.get("latency")
    if not isinstance(latency, dict) or not latency:
        raise SoftsynError(f"{source}: {where}.latency: not an object of path group -> seconds (e.g. "
                           "{\"decode\": 0.0012})")
    measured = {_text(g, f"{where}.latency key", source, 64): _number(v, f"{where}.latency[{g!r}]", source, True)
                for g, v in latency.items()}
    error = entry.get("error")
    error = None if error is None else _number(error, f"{where}.error", source, False)
    mix = entry.get("mix", "")
    mix = "" if mix == "" else _text(mix, f"{where}.mix", source)
    return ParetoPoint(label=label, origin="peer", mix=mix, predicted={}, measured=measured, error=error,
                       error_how="measured")


def peer_points(data, source: str) -> tuple[list[ParetoPoint], list[str]]:
    """The peers of a peers.json (bench/compare_peers.py writes it) as points (origin "peer"), and the notes that
    say what they stand on: its `peers` list of {label, latency: {group: s}, error: fraction | null, mix?}, and its
    optional `what` (one line: the tool, the machine, the reference the errors are against). Untrusted: anything
    else is a one-line SoftsynError naming `source` and the key."""
    if not isinstance(data, dict):
        raise SoftsynError(f"{source}: not a JSON object with a \"peers\" list")
    if data.get("schema", PEERS_SCHEMA) != PEERS_SCHEMA:
        raise SoftsynError(f"{source}: schema: {data.get('schema')!r} is not {PEERS_SCHEMA!r}")
    peers = data.get("peers")
    if not isinstance(peers, list) or not peers:
        raise SoftsynError(f"{source}: peers: not a non-empty list of {{label, latency, error}} objects")
    if len(peers) > 100:
        raise SoftsynError(f"{source}: peers: {len(peers)} entries; at most 100")
    what = data.get("what")
    notes = [] if what is None else [f"peers: {_text(what, 'what', source, 400)}"]
    return [_peer(entry, i, source) for i, entry in enumerate(peers)], notes
