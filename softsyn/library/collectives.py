"""Collective cells: all-reduce, all-gather and reduce-scatter over message size and group size.

A collective library (`softsyn/library/comm/*.yaml`, format 1, `kind: collectives`) describes one
communication runtime on one interconnect. Each op has an alpha-beta model, from nccl-tests' bus-bandwidth
definitions (busbw = algbw x bus_factor(n); AllReduce 2(n-1)/n, AllGather and ReduceScatter (n-1)/n):

    t(S, n) = alpha + S / (busbw / bus_factor(n))      source "est"

and, once measured (`softsyn characterize --cells 'AllReduce*'` on a multi-GPU host), delay tables over
axes [ranks, bytes] that replace it, source "table" (lookup rules of softsyn.library.interp).
S is the whole buffer: the tensor reduced (AllReduce), gathered (AllGather: n x one rank's part) or
scattered (ReduceScatter).
"""
from __future__ import annotations

import fnmatch
import importlib.resources
import os
from dataclasses import dataclass
from pathlib import Path

from softsyn.constraints.reader import read_text
from softsyn.errors import SoftsynError
from softsyn.library.load import parse_cell, read_yaml
from softsyn.library.model import Cell

COLLECTIVE_OPS = ("AllReduce", "AllGather", "ReduceScatter")
BUS_FACTORS = {"2(n-1)/n": lambda n: 2 * (n - 1) / n, "(n-1)/n": lambda n: (n - 1) / n}
DEFAULT_COLLECTIVES = "h200-nccl"


@dataclass(frozen=True)
class AlphaBeta:
    alpha: float  # s, the latency of a message of no bytes
    busbw: float  # B/s, nccl-tests' bus bandwidth
    bus_factor: str  # key of BUS_FACTORS
    source: str  # where the figures come from

    def delay(self, size: float, ranks: int) -> float:
        factor = BUS_FACTORS[self.bus_factor](ranks)
        return self.alpha + size * factor / self.busbw


@dataclass
class CollectiveLibrary:
    name: str
    header: dict
    models: dict[str, AlphaBeta]
    cells: list[Cell]
    path: Path

    def delay(self, op: str, size: float, ranks: int, precision: str = "fp16") -> tuple[float, str]:
        """(seconds, source) of one collective of `size` bytes over `ranks` devices; 0 on one device."""
        if ranks <= 1:
            return 0.0, "table"
        for cell in self.cells:
            if cell.op == op and cell.precision == precision:
                value, extrap = cell.lookup({"ranks": ranks, "bytes": size})
                return value, "table-extrap" if extrap else "table"
        if op not in self.models:
            raise SoftsynError(f"{self.path}: no model or table for collective {op}; has {', '.join(self.models)}")
        return self.models[op].delay(size, ranks), "est"

    def describe(self) -> str:
        measured = "measured tables" if self.cells else "alpha-beta estimate (est)"
        return f"{self.name} ({self.header.get('runtime')}, {self.header.get('device')}; {measured})"


def parse_collectives(text: str, path: Path) -> CollectiveLibrary:
    """A collective library from YAML text; errors name the file, line and key."""
    reader, data = read_yaml(text, path)
    if not isinstance(data, dict) or data.get("kind") != "collectives":
        raise SoftsynError(f"{path}: not a collective library (needs kind: collectives)")
    for key in ("library", "runtime", "device", "date", "collectives"):
        if data.get(key) in (None, ""):
            raise reader.at(key, "missing")
    models = {}
    for op, raw in (data["collectives"] or {}).items():
        where = f"collectives.{op}"
        if op not in COLLECTIVE_OPS:
            raise reader.at(where, f"unknown collective; valid: {', '.join(COLLECTIVE_OPS)}")
        if not isinstance(raw, dict) or raw.get("bus_factor") not in BUS_FACTORS:
            raise reader.at(where, f"needs alpha, busbw, bus_factor ({' or '.join(BUS_FACTORS)}) and source")
        for key in ("alpha", "busbw"):
            if not isinstance(raw.get(key), (int, float)) or raw[key] < 0 or (key == "busbw" and raw[key] == 0):
                raise reader.at(f"{where}.{key}", f"must be a positive number, got {raw.get(key)!r}")
        models[op] = AlphaBeta(float(raw["alpha"]), float(raw["busbw"]), raw["bus_factor"], str(raw.get("source", "")))
    cells = [parse_cell(reader, i, raw) for i, raw in enumerate(data.get("cells") or [])]
    header = {k: str(v) for k, v in data.items() if k not in ("collectives", "cells")}
    return CollectiveLibrary(str(data["library"]), header, models, cells, path)


def load_collectives(name_or_path: str | os.PathLike = DEFAULT_COLLECTIVES) -> CollectiveLibrary:
    """A shipped collective library by name (`h200-nccl`) or any collective library YAML by path."""
    spec = os.fspath(name_or_path)
    if spec.endswith((".yaml", ".yml")) or "/" in spec:
        if not os.path.isfile(spec):
            raise SoftsynError(f"collective library {spec} not found")
        return parse_collectives(read_text(Path(spec), "collective library"), Path(spec))
    res = importlib.resources.files("softsyn.library.comm") / f"{spec}.yaml"
    if not res.is_file():
        shipped = sorted(e.name[:-5] for e in importlib.resources.files("softsyn.library.comm").iterdir()
                         if e.name.endswith(".yaml"))
        raise SoftsynError(f"unknown collective library {spec!r}; shipped: {', '.join(shipped)}")
    return parse_collectives(res.read_text(), Path(str(res)))

PRECISION = "fp16"  # the precision collective cells are characterised and named in


def collective_cells(pattern: str | None) -> list[str]:
    """The collective ops a --cells pattern names (on OP or OP.PRECISION), in library order."""
    if not pattern:
        return []
    globs = [p.strip() for p in pattern.split(",") if p.strip()]
    return [op for op in COLLECTIVE_OPS if any(fnmatch.fnmatchcase(op, g) or fnmatch.fnmatchcase(f"{op}.{PRECISION}", g)
                                               for g in globs)]
