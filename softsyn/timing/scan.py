"""A Scan cell's delay: its body's cells, each timed from the library at the body's shapes, times the trip count.

A Scan (the recurrent form of a linear-attention layer's delta rule: one iteration per token, as softsyn exports
Qwen3-Next with its cache) runs its body graph once per element of its scan axis; ONNX Runtime runs the body's
nodes one by one every iteration, so each pays its own launch. Timed as one element-wise cell it would cost
microseconds whatever the prompt length. The body's shapes are its declared ones with the symbolic dims bound
from the Scan's own inputs and outputs under the scenario; a body value whose shape cannot be bound counts 0 bytes.
"""
from __future__ import annotations

import onnx_ir as ir

from softsyn.timing.cost import node_work, precision_of


def _bind(declared, concrete, env: dict[str, int]) -> None:
    """Record what each symbolic dim of `declared` is in `concrete` (the same value's bound shape)."""
    if declared is None or concrete is None or len(declared) != len(concrete):
        return
    for d, c in zip(declared, concrete):
        if isinstance(d, ir.SymbolicDim) and d.value is not None:
            env.setdefault(d.value, int(c))


def _concrete(shape, env: dict[str, int]) -> tuple[int, ...] | None:
    if shape is None:
        return None
    dims = []
    for d in shape:
        if isinstance(d, int):
            dims.append(d)
        elif isinstance(d, ir.SymbolicDim) and d.value in env:
            dims.append(env[d.value])
        else:
            return None
    return tuple(dims)


def trip_count(node: ir.Node, shapes: dict) -> int:
    """Iterations of a Scan: the length of its first scan input's axis 0 (the sequence, bound)."""
    states = len(node.inputs) - int(node.attributes["num_scan_inputs"].value)
    scanned = node.inputs[states] if 0 <= states < len(node.inputs) else None
    shape = shapes.get(scanned.name) if scanned is not None else None
    return int(shape[0]) if shape else 1


def body_shapes(node: ir.Node, body: ir.Graph, shapes: dict) -> dict[str, tuple[int, ...]]:
    """The body's value shapes under the scenario: symbolic dims bound from the Scan's inputs and outputs, and the
    body's own inputs from the values they stand for (its states whole, its scanned inputs less axis 0)."""
    env: dict[str, int] = {}
    for v in (*node.inputs, *node.outputs):
        if v is not None:
            _bind(v.shape, shapes.get(v.name), env)
    states = len(body.inputs) - int(node.attributes["num_scan_inputs"].value)
    out: dict[str, tuple[int, ...]] = {}
    for i, (inner, outer) in enumerate(zip(body.inputs, node.inputs)):
        bound = shapes.get(outer.name) if outer is not None else None
        if bound is not None:
            out[inner.name] = tuple(bound) if i < states else tuple(bound[1:])
    for n in body:
        for v in n.outputs:
            shape = _concrete(v.shape, env)
            if shape is not None:
                out[v.name] = shape
    return out


def scan_timing(node: ir.Node, shapes: dict, library) -> tuple[float, float, float]:
    """(delay, host, device) seconds of a Scan cell: every body cell's library timing, summed, times the trips."""
    body = node.attributes["body"].value
    inner = body_shapes(node, body, shapes)
    delay = host = device = 0.0
    for n in body:
        work = node_work(n, inner)
        d, _, h, dev = library.node_timing(n.op_type, precision_of(n), work.flops, work.bytes, work.sizes)
        delay, host, device = delay + d, host + (d if h is None else h), device + dev
    trips = trip_count(node, shapes)
    return delay * trips, host * trips, device * trips
