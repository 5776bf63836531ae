"""The precision a netlist holds, read from its tensors' dtypes: what session.json, netlist.json and the area
report label, never what a pass was asked for.

Per weight: the initializer as the cell reading it stores it. A MatMulNBits weight is packed uint8 whatever its
width: it is int4 or int8 by the cell's `bits`, and holds K x N parameters (the logical shape, not the packed
bytes); its scales and zero points are part of that weight's storage, with no parameters of their own. QMoE's
packed expert weights likewise (`expert_weight_bits`), and an fp8 weight cell's fp32 scales. Per KV buffer: the
dtype of each past/present port. Per cell: `precision_of`. The model's float precision is the float dtype that
holds most float weight parameters (fp32 islands of an fp16 map hold few).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import onnx_ir as ir

from softsyn.netlist.keys import FP8_MATMUL
from softsyn.timing.cost import PRECISION_BY_DTYPE, numel, precision_of

FLOAT_PRECISIONS = ("fp32", "fp16", "bf16", "fp64")
# input index -> part, for the cells whose weights are stored packed or scaled
_QMOE_PARTS = {2: "weight", 3: "scales", 5: "weight", 6: "scales", 8: "weight", 9: "scales", 11: "zero_points",
               12: "zero_points", 13: "zero_points"}
_PARTS = {"MatMulNBits": {1: "weight", 2: "scales", 3: "zero_points", 4: "g_idx"},
          FP8_MATMUL: {1: "weight", 2: "scales", 3: "scales"}, "QMoE": _QMOE_PARTS}


@dataclass(frozen=True)
class WeightStorage:
    precision: str | None  # None: not a parameter (an integer shape or index constant)
    parameters: int  # the logical parameters the tensor holds; 0 for a quantised weight's scales and zero points


def weight_storage(value: ir.Value) -> WeightStorage:
    """How the cell reading initializer `value` stores it (a quantised cell's part first, else its dtype)."""
    stored = numel(tuple(value.shape.numpy())) if value.shape is not None else 0
    for node, index in value.uses():
        part = _PARTS.get(node.op_type, {}).get(index) if node.domain == "com.microsoft" else None
        if part is None:
            continue
        precision = precision_of(node)
        if part != "weight":
            return WeightStorage(precision, 0)
        if node.op_type == "MatMulNBits":
            return WeightStorage(precision, node.attributes.get_int("K", 0) * node.attributes.get_int("N", 0) or stored)
        if node.op_type == "QMoE":
            return WeightStorage(precision, stored * 8 // (4 if precision == "int4" else 8))
        return WeightStorage(precision, stored)
    return WeightStorage(PRECISION_BY_DTYPE.get(value.dtype) if value.dtype is not None else None, stored)


@dataclass(frozen=True)
class RealisedPrecision:
    weights: dict[str, int]  # precision -> logical parameters
    cells: dict[str, int]  # precision -> weight-bearing cells (those reading a weight initializer)
    kv: dict[str, str]  # KV port -> precision

    @property
    def float_precision(self) -> str | None:
        """The float precision holding most float weight parameters (None: no float weights)."""
        floats = {p: n for p, n in self.weights.items() if p in FLOAT_PRECISIONS and n}
        return max(floats, key=floats.get) if floats else None

    @property
    def kv_precision(self) -> str | None:
        found = Counter(self.kv.values())
        return found.most_common(1)[0][0] if found else None

    def to_dict(self) -> dict:
        return {"float": self.float_precision, "weights": dict(self.weights), "cells": dict(self.cells),
                "kv": self.kv_precision, "kv_ports": dict(self.kv)}


def realised_precision(netlist) -> RealisedPrecision:
    """What the netlist holds now: its weights by stored precision, its weight-bearing cells, its KV ports."""
    graph = netlist.model.graph
    weights: Counter = Counter()
    bearing: set[int] = set()
    cells: Counter = Counter()
    for value in graph.initializers.values():
        storage = weight_storage(value)
        if storage.precision is None:  # an integer shape or index constant
            continue
        weights[storage.precision] += storage.parameters
        for node, _ in value.uses():
            if id(node) not in bearing:
                bearing.add(id(node))
                cells[precision_of(node)] += 1
    kv = {v.name: PRECISION_BY_DTYPE.get(v.dtype, str(v.dtype)) for v in [*graph.inputs, *graph.outputs]
          if v.dtype is not None and ("past" in v.name or "present" in v.name)}
    return RealisedPrecision(dict(weights), dict(cells), kv)
