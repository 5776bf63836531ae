"""Seeded scenario inputs: the feeds every run of a netlist at a scenario's dims gets (signoff, verify, fusion)."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from softsyn.errors import SoftsynError
from softsyn.netlist import Netlist


def scenario_inputs(netlist: Netlist, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for every graph input at the scenario's dims.

    Token ids are drawn below the vocabulary size, masks are all ones, and
    position ids continue after the cached tokens, so a decoder runs the path
    it runs in service.
    """
    rng = np.random.default_rng(seed)
    shapes = netlist.bind(dims)
    vocab = int(netlist.config.get("vocab_size") or 1000)
    past = dims.get("past", 0)
    feeds = {}
    for value in netlist.model.graph.inputs:
        shape = shapes.get(value.name)
        if shape is None:
            raise SoftsynError(f"input {value.name}: no concrete shape under dims {dims}")
        dtype = ir.DataType(value.dtype).numpy()
        if value.name == "position_ids":
            feeds[value.name] = np.broadcast_to(np.arange(past, past + shape[-1], dtype=dtype), shape).copy()
        elif "mask" in value.name:
            feeds[value.name] = np.ones(shape, dtype=dtype)
        elif np.issubdtype(dtype, np.integer):
            high = vocab if "ids" in value.name and "type" not in value.name else 2
            feeds[value.name] = rng.integers(0, high, size=shape, dtype=dtype)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds
