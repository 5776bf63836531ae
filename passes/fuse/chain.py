"""Fusion patterns as declarative chains, the way onnxscript's rewriter spells a pattern out and has its check
name where it failed: a chain is the hops from one value through the nodes it must feed (`follow`), or back through
the nodes that made it (`trace`), one Link per hop, and walking it returns the nodes it matched or the first broken
link as the reason, naming the value it broke at."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import onnx_ir as ir

from passes.fuse.graph import consumers


@dataclass(frozen=True)
class Link:
    """One hop: forward, the value is read by exactly one node (and is no graph output: an intermediate of the
    pattern is used nowhere else) besides readers of the ops `beside`; back, the value is made by a node. That node
    is of one of `ops`, and `test(node, value)`, if given, returns None (else why it is not this link). The chain goes
    on from the node's output `output` (forward) or input `input` (back), which the next link's reason calls `gives`.
    `times` = (least, most) nodes in a row the link matches, greedily: (0, 1) an optional link, most None unbounded."""

    what: str  # the link as a reason names it: "Add(eps)"
    ops: tuple[str, ...]
    gives: str = ""  # the output's name in reasons ("mean(x**2)+eps"); default: `what`
    test: Callable[[ir.Node, ir.Value], str | None] | None = None
    output: int = 0
    input: int = 0
    times: tuple[int, int | None] = (1, 1)
    beside: tuple[str, ...] = ()  # other readers a forward hop allows: the IsNaN of a NaN guard Where(IsNaN(p), 0, p)


def describe(node: ir.Node | None) -> str:
    return "nothing" if node is None else f"{node.op_type} ({node.name})"


def _why(node: ir.Node, v: ir.Value, link: Link) -> str | None:
    """Why `node` is not `link` at `v` ("" when its op is not one of the link's), else None."""
    if node.op_type not in link.ops:
        return ""
    return (link.test(node, v) or None) if link.test is not None else None


def _forward(v: ir.Value, label: str, link: Link) -> tuple[ir.Node, ir.Value] | str:
    users = consumers(v)
    main = [u for u in users if u.op_type not in link.beside]
    if len(main) != 1 or v.is_graph_output():
        where = " and is a graph output" if v.is_graph_output() else ""
        return (f"{label} ({v.name}) has {len(users)} consumers{where} (an intermediate of the pattern is used "
                f"outside it), not only {link.what}")
    why = _why(main[0], v, link)
    if why is not None:
        return f"{label} ({v.name}) feeds {describe(main[0])}, not {link.what}" + (f": {why}" if why else "")
    return main[0], main[0].outputs[link.output]


def _back(v: ir.Value, label: str, link: Link) -> tuple[ir.Node, ir.Value] | str:
    node = v.producer()
    why = "" if node is None else _why(node, v, link)
    if why is not None:
        return f"{label} ({v.name}) comes from {describe(node)}, not {link.what}" + (f": {why}" if why else "")
    return node, node.inputs[link.input]


def _walk(v: ir.Value, label: str, links: tuple[Link, ...], hop) -> list[ir.Node] | str:
    nodes = []
    for link in links:
        least, most = link.times
        for count in itertools.count() if most is None else range(most):
            step = hop(v, label, link)
            if isinstance(step, str):
                if count < least:
                    return step
                break
            nodes.append(step[0])
            v, label = step[1], link.gives or link.what
    return nodes


def follow(start: ir.Value, label: str, *links: Link) -> list[ir.Node] | str:
    """The nodes `links` match forward from `start` (which reasons call `label`), in order, or the first broken link:
    "<label> (<value name>) feeds <node>, not <link>[: why]", or why the value is read outside the pattern."""
    return _walk(start, label, links, _forward)


def trace(start: ir.Value, label: str, *links: Link) -> list[ir.Node] | str:
    """The nodes `links` match back from `start`, the first the one that made it, or the first broken link:
    "<label> (<value name>) comes from <node>, not <link>[: why]"."""
    return _walk(start, label, links, _back)


def reached(start: ir.Value, nodes: list[ir.Node], forward: bool = True) -> ir.Value:
    """The value a walk that matched `nodes` from `start` ended at (port 0 of its last node; `start` if none)."""
    if not nodes:
        return start
    return nodes[-1].outputs[0] if forward else nodes[-1].inputs[0]
