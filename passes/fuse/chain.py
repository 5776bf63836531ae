"""Fusion patterns as declarative chains, the way onnxscript's rewriter spells a pattern out and has its check
name where it failed: a chain is the hops from one value through the nodes it must feed, one Link per hop, and
following it returns the nodes it matched or the first broken link as the reason, naming the value it broke at."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import onnx_ir as ir

from passes.fuse.graph import consumers


@dataclass(frozen=True)
class Link:
    """One hop: the value is read by exactly one node (and is no graph output: an intermediate of the pattern is used
    nowhere else), of one of `ops`, for which `test(node, value)`, if given, returns None (else why it is not this
    link). The chain goes on from the node's output `output`, which the next link's reason calls `gives`."""

    what: str  # the link as a reason names it: "Add(eps)"
    ops: tuple[str, ...]
    gives: str = ""  # the output's name in reasons ("mean(x**2)+eps"); default: `what`
    test: Callable[[ir.Node, ir.Value], str | None] | None = None
    output: int = 0


def describe(node: ir.Node | None) -> str:
    return "nothing" if node is None else f"{node.op_type} ({node.name})"


def follow(start: ir.Value, label: str, *links: Link) -> list[ir.Node] | str:
    """The nodes `links` match from `start` (which reasons call `label`), one per link, or the first broken link:
    "<label> (<value name>) feeds <node>, not <link>[: why]", or why the value is read outside the pattern."""
    nodes, v = [], start
    for link in links:
        users = consumers(v)
        if len(users) != 1 or v.is_graph_output():
            where = " and is a graph output" if v.is_graph_output() else ""
            return (f"{label} ({v.name}) has {len(users)} consumers{where} (an intermediate of the pattern is used "
                    f"outside it), not only {link.what}")
        node = users[0]
        why = None if node.op_type not in link.ops or link.test is None else link.test(node, v)
        if node.op_type not in link.ops or why:
            return f"{label} ({v.name}) feeds {describe(node)}, not {link.what}" + (f": {why}" if why else "")
        nodes.append(node)
        v, label = node.outputs[link.output], link.gives or link.what
    return nodes
