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
    vocab = netlist.config.get("vocab_size")
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
            high = (int(vocab or table_rows(value) or 1000)
                    if "ids" in value.name and "type" not in value.name else 2)
            feeds[value.name] = rng.integers(0, high, size=shape, dtype=dtype)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    image = netlist.provenance.get("image")
    if image and "input_ids" in feeds:
        _place_image_tokens(feeds["input_ids"], image, dims.get("images", 0), rng)
    return feeds


def _place_image_tokens(ids: np.ndarray, image: dict, images: int, rng) -> None:
    """A composite's prompt: text ids below the special tokens, and each sequence's images' tokens at its start
    (`images` spread evenly over the batch, as a group's images per sequence make them), so the embedding finds
    exactly as many placeholders as image features."""
    token = int(image["image_token_id"])
    ids[...] = rng.integers(0, token, size=ids.shape, dtype=ids.dtype)
    per_image = int(image["tokens"])
    per_seq = -(-images // ids.shape[0]) if images else 0
    for b in range(min(images, ids.shape[0])):
        ids[b, :min(per_seq * per_image, ids.shape[1])] = token


VIEWS = ("Reshape", "Unsqueeze", "Squeeze", "Flatten", "Cast", "Identity")


def table_rows(ids: ir.Value) -> int | None:
    """Rows of the smallest embedding table that `ids` indexes, through view ops (a plain file records no vocab
    size): ids drawn below it are valid for every Gather they feed."""
    rows: list[int] = []
    frontier, seen = [ids], set()
    while frontier:
        v = frontier.pop()
        for use in v.uses():
            node = use.node
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type == "Gather" and use.idx == 1:
                shape = node.inputs[0].shape
                if shape is not None and len(shape) >= 1 and isinstance(shape[0], int):
                    rows.append(int(shape[0]))
            elif node.op_type in VIEWS and use.idx == 0:
                frontier.extend(o for o in node.outputs if o is not None)
    return min(rows) if rows else None
