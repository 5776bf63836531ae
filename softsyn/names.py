"""Names the passes give the nodes and values they add: `prefix` + _fzN, N counted on from the highest _fz index the
netlist holds (`restart_names`, called before every pass), so a compile's names depend on its input alone."""
from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports the pass registry at startup: no onnx_ir there
    import onnx_ir as ir

_counter = itertools.count()
_FRESH = re.compile(r"_fz(\d+)")


def fresh(prefix: str) -> str:
    """A new node or value name, `prefix` + _fzN, N past every _fz index the model had when `restart_names` read it."""
    return f"{prefix}_fz{next(_counter)}"


def restart_names(model: ir.Model) -> None:
    """Let `fresh` count on from the highest _fzN in `model`'s node and value names (0 in a model no pass touched):
    the names a pass adds then depend on the model alone, not on what this process compiled before (a second compile
    in one process was not byte-identical to the first), and never repeat a name the model holds (an artifact
    compiled again keeps its earlier passes' names)."""
    global _counter
    names = [v.name or "" for v in (*model.graph.inputs, *model.graph.initializers.values())]
    for node in model.graph.all_nodes():
        names += [node.name or "", *(v.name or "" for v in node.outputs)]
    top = max((int(m) for name in names for m in _FRESH.findall(name)), default=-1)
    _counter = itertools.count(top + 1)
