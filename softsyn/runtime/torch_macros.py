"""A torch package's macro cells (issue 28 item 2): the kernels Inductor generated, characterised on the target as
cells of the design, stored with the artifact in MACROS_FILE.

A macro cell is one source module instance ("model.layers.3.mlp", "lm_head": a decoder layer's direct child, or a
module outside the layers), with the kernels the provenance map (softsyn.runtime.torch_provenance) attributes to it
and their measured time per step, at one path group's dims. A kernel fusing several instances goes to the one most of
its graph nodes came from (call_instance), the others listed as its `modules`. Each macro names the netlist cells it covers: the ONNX netlist's cells whose scope
is one of its instances (each cell covered once, by the first macro in launch order naming its instance), with the
ORT library's estimate of those cells beside the measurement. What maps to nothing stays visible: the kernels no call
accounts for (UNATTRIBUTED), macro cells of no netlist cell (`cells` empty), netlist cells no macro covers
(`uncovered`), a group that could not be characterised (`problem`).

Not softsyn.library's Cell: that is one op x precision's delay table over sizes, interpolated for any instance; a
macro cell is one compiled instance's measured time at each scenario the design was compiled for, nothing to look up
between them.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from softsyn.errors import SoftsynError
from softsyn.runtime.torch_provenance import UNATTRIBUTED, KernelCall, attribute

MACROS_FILE = "runtime/torch_macros.json"
FORMAT = "softsyn.torch-macros/1"
LABEL = "measured"  # every time in the file is a measurement on `device` (est: the ORT library's, named so)
NO_MODULE = "(no module)"  # a kernel call whose graph nodes carry no module (the step's own index arithmetic)
_LAYER = re.compile(r"(?:^|\.)layers\.\d+(?:\.[^./]+)?")


def macro_instance(path: str) -> str:
    """The macro cell a module path (or a netlist cell's scope) belongs to: a decoder layer's direct child
    ("model.layers.3.mlp.down_proj" -> "model.layers.3.mlp"), the layer itself for its own ops ("model.layers.3"),
    else the model's child ("model.norm", "lm_head")."""
    path = path.split("/")[0]
    match = _LAYER.search(path)
    if match:
        return path[:match.end()]
    parts = path.split(".")
    return ".".join(parts[:2] if parts[0] == "model" and len(parts) > 1 else parts[:1])


def _is_layer(instance: str) -> bool:
    return re.search(r"(?:^|\.)layers\.\d+$", instance) is not None


def call_instance(call: KernelCall) -> tuple[str, tuple[str, ...]]:
    """A kernel call's macro cell and every instance it computes. The cell is the instance most of the call's graph
    nodes came from: a fused kernel's provenance also names what it recomputes upstream (the residual stream's
    embedding gather and projections in a norm's kernel; layer 0's rope kernel names layer 1's attention for the
    mask they share); a layer's own residual adds count only when alone. A map without node counts: the instances
    joined by "+"."""
    counts: dict[str, int] = {}
    for module, n in zip(call.modules, call.nodes or (1,) * len(call.modules)):
        counts[macro_instance(module)] = counts.get(macro_instance(module), 0) + n
    named = {p: n for p, n in counts.items() if not _is_layer(p)} or counts
    if not named:
        return NO_MODULE, ()
    return (max(named, key=named.get) if call.nodes else "+".join(named)), tuple(counts)


@dataclass(frozen=True)
class MacroCell:
    instance: str  # module instance(s), "+"-joined for a fused kernel; UNATTRIBUTED for the kernels no call claims
    seconds: float  # measured kernel time per step, s
    kernels: float  # kernels per step
    kernel_names: tuple[str, ...]  # distinct names, launch order
    modules: tuple[str, ...] = ()  # every instance its kernels compute
    cells: tuple[str, ...] = ()  # netlist cells it covers
    est: float | None = None  # the ORT library's delay of those cells at the group's dims, s (None: no cell)


@dataclass(frozen=True)
class MacroGroup:
    name: str  # path group
    dims: dict
    package: str  # the file that ran the step
    steps: int  # profiled steps
    step: float  # the step's measured median, host wall clock, s (0 when not characterised)
    macros: tuple[MacroCell, ...]  # launch order
    unattributed: MacroCell
    uncovered: tuple[str, ...] = ()  # netlist cells no macro covers
    problem: str = ""  # why the group is not characterised ("" when it is)
    scale: float = 1.0  # < 1: the profiled kernels summed above the timed step and were scaled to it

    @property
    def kernel_seconds(self) -> float:
        return sum(m.seconds for m in self.macros) + self.unattributed.seconds


@dataclass(frozen=True)
class MacroLibrary:
    target: str
    device: str  # the device measured on, in words
    torch: str  # torch's version
    date: str  # ISO, when measured
    method: str  # how the times were measured
    groups: tuple[MacroGroup, ...]
    library: str = ""  # the ORT library whose estimate `est` is

    def group(self, name: str) -> MacroGroup | None:
        return next((g for g in self.groups if g.name == name), None)


def aggregate(kernels: list[tuple[str, float]], steps: int, calls: list[KernelCall],
              named: bool) -> tuple[tuple[MacroCell, ...], MacroCell]:
    """Profiled kernels ((name, seconds), launch order, `steps` steps) summed per macro cell and per step, in the
    order each cell first ran; the kernels no call accounts for as the UNATTRIBUTED cell. `named`: each kernel is
    named by its own call (CPU records)."""
    rows: dict[str, dict] = {}
    for (name, seconds), call in zip(kernels, attribute([n for n, _ in kernels], calls, named=named)):
        instance, parts = call_instance(call) if call else (UNATTRIBUTED, ())
        row = rows.setdefault(instance, {"seconds": 0.0, "kernels": 0, "names": {}, "modules": {}})
        row["seconds"] += seconds
        row["kernels"] += 1
        row["names"][name] = None
        row["modules"].update(dict.fromkeys(parts))
    cells = {i: MacroCell(i, r["seconds"] / steps, r["kernels"] / steps, tuple(r["names"]), tuple(r["modules"]))
             for i, r in rows.items()}
    return (tuple(c for i, c in cells.items() if i != UNATTRIBUTED),
            cells.get(UNATTRIBUTED, MacroCell(UNATTRIBUTED, 0.0, 0.0, ())))


def scaled(macros: tuple[MacroCell, ...], unattributed: MacroCell,
           step: float) -> tuple[tuple[MacroCell, ...], MacroCell, float]:
    """The kernels scaled to the timed step where they sum above it (and the factor): on the CPU a record's time
    includes the profiler's cost of the ATen ops an extern call runs inside it, which a tiny step's kernels are
    mostly made of (qwen3-tiny's decode: 0.451 ms of records in a 0.440 ms step, 2026-12-06), as signoff scales an
    ORT profile (softsyn.results.signoff.GroupResult.kernel_scale)."""
    total = sum(m.seconds for m in macros) + unattributed.seconds
    if total <= step or total <= 0:
        return macros, unattributed, 1.0
    factor = step / total
    return (tuple(replace(m, seconds=m.seconds * factor) for m in macros),
            replace(unattributed, seconds=unattributed.seconds * factor), factor)


def cover(macros: tuple[MacroCell, ...], netlist_cells: list[dict],
          group: str) -> tuple[tuple[MacroCell, ...], tuple[str, ...]]:
    """Each netlist cell ({name, hierarchy, delay: {group: s}}, as DIR/netlist.json lists them) given to the first
    macro naming its instance, else the first whose kernels compute it; each macro with its cells and their
    estimated delay at `group`; the cells no macro covers."""
    owner: dict[str, int] = {}
    for i, m in reversed(list(enumerate(macros))):  # the first in launch order wins
        for instance in m.modules:
            owner[instance] = i
    for i, m in reversed(list(enumerate(macros))):
        for instance in m.instance.split("+"):
            owner[instance] = i
    taken: list[list[dict]] = [[] for _ in macros]
    uncovered = []
    for cell in netlist_cells:
        at = owner.get(macro_instance(cell.get("hierarchy") or ""))
        if at is None:
            uncovered.append(cell["name"])
        else:
            taken[at].append(cell)
    return (tuple(replace(m, cells=tuple(c["name"] for c in cs),
                          est=sum((c.get("delay") or {}).get(group, 0.0) for c in cs) if cs else None)
                  for m, cs in zip(macros, taken)), tuple(uncovered))


def library_data(library: MacroLibrary) -> dict:
    """MACROS_FILE's content."""
    data = asdict(library)
    groups = data.pop("groups")
    return {"format": FORMAT, "label": LABEL, "units": {"time": "s"}, **data,
            "groups": {g["name"]: {k: v for k, v in g.items() if k != "name"} for g in groups}}


def write_library(path: Path, library: MacroLibrary) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(library_data(library), indent=1) + "\n")


def read_library(directory: str | Path) -> MacroLibrary | None:
    """DIR's macro library; None when the artifact has none (an ORT target, a package compiled before macro cells).
    Untrusted like every file of an artifact: a SoftsynError naming the file and key when it is not one."""
    path = Path(directory) / MACROS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SoftsynError(f"{path}: not readable JSON ({' '.join(str(exc).split())[:200]}); re-run softsyn "
                           "compile") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SoftsynError(f"{path}: format: not {FORMAT}; re-run softsyn compile")
    head = {k: _text(data, k, path, k) for k in ("target", "device", "torch", "date", "method")}
    groups = data.get("groups")
    if not isinstance(groups, dict):
        raise SoftsynError(f"{path}: groups: not an object of path groups; re-run softsyn compile")
    return MacroLibrary(**head, library=str(data.get("library", "")),
                        groups=tuple(_group(name, g, path) for name, g in groups.items()))


def _group(name: str, g, path: Path) -> MacroGroup:
    key = f"groups.{name}"
    if not isinstance(g, dict) or not isinstance(g.get("dims"), dict) or not isinstance(g.get("macros"), list):
        raise SoftsynError(f"{path}: {key}: not a macro group (dims, macros, unattributed); re-run softsyn compile")
    steps = g.get("steps")
    if not (type(steps) is int and steps >= 1):
        raise SoftsynError(f"{path}: {key}.steps: not an integer >= 1; re-run softsyn compile")
    uncovered = g.get("uncovered", [])
    if not (isinstance(uncovered, list) and all(isinstance(c, str) for c in uncovered)):
        raise SoftsynError(f"{path}: {key}.uncovered: not a list of cell names; re-run softsyn compile")
    return MacroGroup(name, dict(g["dims"]), _text(g, "package", path, key), steps=steps,
                      step=_seconds(g, "step", path, key),
                      macros=tuple(_cell(m, path, f"{key}.macros[{i}]") for i, m in enumerate(g["macros"])),
                      unattributed=_cell(g.get("unattributed"), path, f"{key}.unattributed"), uncovered=tuple(uncovered),
                      problem=str(g.get("problem", "")),
                      scale=_seconds(g, "scale", path, key) if "scale" in g else 1.0)


def _cell(m, path: Path, key: str) -> MacroCell:
    if not isinstance(m, dict):
        raise SoftsynError(f"{path}: {key}: not a macro cell (instance, seconds, kernels, kernel_names); re-run "
                           "softsyn compile")
    lists = {}
    for name in ("kernel_names", "modules", "cells"):
        value = m.get(name, [])
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise SoftsynError(f"{path}: {key}.{name}: not a list of names; re-run softsyn compile")
        lists[name] = tuple(value)
    est = None if m.get("est") is None else _seconds(m, "est", path, key)
    return MacroCell(_text(m, "instance", path, key), _seconds(m, "seconds", path, key),
                     _seconds(m, "kernels", path, key), est=est, **lists)


def _text(data: dict, name: str, path: Path, key: str) -> str:
    if not isinstance(data.get(name), str):
        raise SoftsynError(f"{path}: {key if key.endswith(name) else f'{key}.{name}'}: not a string; re-run softsyn "
                           "compile")
    return data[name]


def _seconds(data: dict, name: str, path: Path, key: str) -> float:
    value = data.get(name)
    if not (type(value) in (int, float) and math.isfinite(value) and value >= 0):
        raise SoftsynError(f"{path}: {key}.{name}: not a number >= 0; re-run softsyn compile")
    return float(value)
