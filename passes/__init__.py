"""softsyn.passes: netlist transformations, one module per pass (Yosys style).

Each pass module registers itself with `register(name, help)` on a function
`run(design) -> dict[str, int]` that returns counts of what it changed. Effort
levels are scripts: ordered lists of pass names (DESIGN.md, "Compile loop").
`run_pass` logs a header line and the counts; it re-times nothing (the compile
loop decides when to re-time).
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

from softsyn.errors import SoftsynError

PASSES: dict[str, "Pass"] = {}

# Effort levels: pass scripts read top to bottom; each level extends the one below it.
LOW = ["flatten", "fuse", "precision"]  # map: standard fusions, uniform default precision
EFFORT: dict[str, list[str]] = {"low": LOW}


@dataclass(frozen=True)
class Pass:
    name: str
    help: str
    run: Callable[..., dict[str, int]]


def register(name: str, help: str):
    """Decorator: make `run(design) -> counts` available as the pass `name`."""
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


def run_pass(design, name: str) -> dict[str, int]:
    """Run one pass on the design: header line, the pass, then its counts."""
    p = get(name)
    design._log(f"pass {name}: {p.help}")
    counts = p.run(design)
    shown = ", ".join(f"{kind} {n}" for kind, n in counts.items()) or "no change"
    design._log(f"pass {name}: {shown}")
    return counts
