"""Which Softmax is an attention site: a Softmax over a Q.K^T, found by structure alone, so that every such
site is an attention candidate (fused, kept with both delays, or missed with its reason; never absent).

Q.K^T is a MatMul both of whose operands depend on the model's inputs (a router's or a classifier's Softmax
multiplies by a weight); between it and the Softmax lie what exporters put on the scores: scaling, additive
masks and biases, soft-caps, masked fills, casts and views. DeBERTa's disentangled attention adds position
scores gathered per query and key (c2p, p2c: GatherElements of Q or K times the projected relative position
embeddings); no ORT op computes those, so such a site is counted and missed with that reason.
"""
from __future__ import annotations

import onnx_ir as ir

from passes.fuse.graph import input_dependent

SCORE_PATH = {"Add", "Sub", "Mul", "Div", "Where", "Cast", "Tanh", "Reshape", "Transpose", "Squeeze",
              "Unsqueeze", "Expand", "Identity", "Clip", "GatherElements"}
DEPTH = 10  # ops between Q.K^T and the Softmax: scale, mask, softcap (Div, Tanh, Mul), masked fill, views


def _path_nodes(v: ir.Value, dynamic: set[int]):
    """The nodes on the score path back from `v` (through SCORE_PATH ops, activation inputs only), breadth first,
    at most DEPTH deep, MatMuls included but not walked through."""
    frontier, seen = [(v, 0)], set()
    while frontier:
        x, d = frontier.pop(0)
        n = x.producer()
        if n is None or id(n) in seen or d > DEPTH:
            continue
        seen.add(id(n))
        yield n
        if n.op_type in SCORE_PATH:
            frontier.extend((i, d + 1) for i in n.inputs if i is not None and id(i) in dynamic)


def qk_matmul(sm: ir.Node, dynamic: set[int]) -> ir.Node | None:
    """The MatMul of two activations whose product the Softmax `sm` normalises (its Q.K^T), else None."""
    for n in _path_nodes(sm.inputs[0], dynamic):
        if n.op_type == "MatMul" and all(i is not None and id(i) in dynamic for i in n.inputs):
            return n
    return None


def attention_softmaxes(graph: ir.Graph, dynamic: set[int] | None = None) -> list[ir.Node]:
    """Every Softmax over a Q.K^T, in graph order (`dynamic`: input_dependent(graph), if already at hand)."""
    dynamic = input_dependent(graph) if dynamic is None else dynamic
    return [n for n in graph if n.op_type == "Softmax" and qk_matmul(n, dynamic) is not None]


def position_terms(sm: ir.Node, dynamic: set[int]) -> str | None:
    """Why the site of `sm` has no fused cell when its scores add position scores gathered from a product
    (DeBERTa's c2p/p2c: GatherElements of a MatMul), else None. `dynamic`: input_dependent(graph)."""
    for n in _path_nodes(sm.inputs[0], dynamic):
        if n.op_type == "GatherElements" and n.inputs[0] is not None and n.inputs[0].producer() is not None \
                and n.inputs[0].producer().op_type == "MatMul":
            return (f"disentangled attention (c2p/p2c position terms, gathered per query and key at {n.name}) has "
                    "no fused cell: no ORT op computes them")
    return None
