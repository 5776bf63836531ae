"""DIR/netlist.json: every cell of the compiled netlist: hierarchy, op, library cell, precision (realised and
requested), delay per path group and where that delay came from."""
from __future__ import annotations

from softsyn import __version__
from softsyn.netlist.keys import REQUESTED_KEY
from softsyn.timing import Analysis, cell_timings, precision_of


def netlist_json(design, analysis: Analysis, uniform: str | None = None) -> dict:
    """`uniform`: the precision the uniform map was asked for (a cell's requested precision where it has none)."""
    netlist = design.netlist
    per_group = {g.name: cell_timings(netlist, design.library, netlist.bind(g.scenario.dims)) for g in design.groups}
    cells = []
    for i, node in enumerate(netlist.nodes()):
        timed = {name: timings[i] for name, timings in per_group.items()}
        first = next(iter(timed.values()), None)
        cells.append({
            "name": node.name, "hierarchy": netlist.hierarchy(node), "op": node.op_type,
            "domain": node.domain or "ai.onnx", "cell": first.cell if first else f"{node.op_type}.{precision_of(node)}",
            "precision": precision_of(node),
            "requested_precision": node.metadata_props.get(REQUESTED_KEY, uniform),
            "delay": {name: t.delay for name, t in timed.items()},
            "source": {name: t.source for name, t in timed.items()},
        })
    return {
        "format": 1, "softsyn": __version__, "design": netlist.name, "library": design.library.name,
        "constraints_file": str(design.constraints.source),
        "units": {"delay": "s"},
        "groups": {g.name: g.scenario.dims for g in design.groups},
        "cell_count": len(cells), "cells": cells,
    }
