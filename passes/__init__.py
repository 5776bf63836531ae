"""softsyn.passes: netlist transformations, one module per pass (Yosys style).

Each pass module registers itself with `register(name, help)` on a function
`run(design) -> dict[str, int]` that returns counts of what it changed. Effort
levels are scripts: ordered lists of pass names (DESIGN.md, "Compile loop").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

PASSES: dict[str, "Pass"] = {}


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
