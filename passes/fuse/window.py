"""Sliding-window and soft-capped attention: what GroupQueryAttention's `local_window_size` and `softcap` take.

Gemma 2/3 and Mistral-style models restrict some layers to the last W keys (transformers' sliding mask:
key k is open to query q when q - W < k <= q), and Gemma 2 squashes the scores as c * tanh(scores / c) before
the mask. GroupQueryAttention does both: `softcap` c applied to scale * Q K^T, then causal masking that keeps
the last `local_window_size` keys of each query, its own included (ORT 1.31.1's CPU kernel, measured against
that mask: docs/decisions/2026-12-02-sliding-window.md), so W is written as is (the onnxruntime-genai builder
writes config.sliding_window there too).

A window is a property of the mask, and no small probe shows it (the probe's 7 keys fit any real window): the
mask's cone is evaluated once more at the longest past the design holds, and read by meaning, row by row (the
open keys of every query must be one run ending at the query's own position, all of one length W, or all of
its past). A mask that is causal there is full attention for every length the design runs.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from passes.fuse.base import port_arrays
from passes.fuse.graph import cone_inputs

LONG_PROBE_SEQ = 3  # new tokens of the long probe (its past is the rest of the longest sequence)
NO_PAST_KEYS = 1024  # a site without a KV cache is probed at this many tokens at most (its mask is [S, S])


def softcap_step(n: ir.Node, outer: float, softcap: float) -> tuple[ir.Value, float] | str:
    """At a Tanh on the walk back from the Softmax: (its input, the softcap) where the scores are
    `outer` * tanh(inner), or why GroupQueryAttention cannot take it. `outer` is the scalar the walk gathered
    between the Softmax and the Tanh, `softcap` a cap the walk met before (one is all the op applies)."""
    if softcap:
        return f"scores are soft-capped twice ({n.name} is a second Tanh)"
    if outer <= 0:
        return f"scores are soft-capped by a non-positive factor {outer:g} after {n.name} (Tanh)"
    return n.inputs[0], float(outer)


def inner_bias_reason(n: ir.Node) -> str:
    """A mask added inside tanh(...) is squashed to -softcap, not -inf: GroupQueryAttention masks after the cap."""
    return f"an additive mask/bias is applied inside the soft cap (Add {n.name} before the Tanh): not fused"


def _long_dims(ctx, s: int, cached: bool) -> dict[str, int]:
    """Dims of the long probe: the design's longest sequence as past + 3 new tokens (no cache: that many tokens,
    capped), batch 1, other symbolic dims 3."""
    nl = ctx.netlist
    longest = max(int(nl.config.get("max_position_embeddings") or 4096), ctx.positions or 0)
    if cached:
        dims = {"batch": 1, "seq": s, "past": longest - s}
    else:
        dims = {"batch": 1, "seq": min(longest, NO_PAST_KEYS)}
    dims = {k: v for k, v in dims.items() if k in nl.symbolic_dims()}
    dims.update({d: 3 for d in nl.symbolic_dims() - set(dims)})
    return dims


def _long_arrays(ctx, bias: ir.Value, dims: dict[str, int]) -> dict[str, np.ndarray] | str:
    """Inputs for the graph inputs the mask's cone reads, at `dims`: masks all ones, positions after the past,
    everything else zeros (only their shapes reach a mask: a past cache is read through Shape)."""
    shapes = ctx.netlist.bind(dims)
    past = dims.get("past", 0)
    arrays = port_arrays(ctx.netlist, dims)  # a composite's decoder mask stops at its block's inputs
    ports = {id(v) for n in ctx.graph for v in n.outputs if v.name in arrays}
    for v in cone_inputs([bias], ports):
        shape = shapes.get(v.name)
        if shape is None or v.dtype is None:
            return f"no concrete shape for {v.name} at {dims}"
        dtype = ir.DataType(v.dtype).numpy()
        if "mask" in v.name:
            arrays[v.name] = np.ones(shape, dtype=dtype)
        elif v.name == "position_ids":
            arrays[v.name] = np.broadcast_to(np.arange(past, past + shape[-1], dtype=dtype), shape).copy()
        else:
            arrays[v.name] = np.zeros(shape, dtype=dtype)
    return arrays


def read_window(m: np.ndarray, past: int) -> int | str:
    """The window W of a causal mask over `past` + s keys (-1: full causal), read from which keys are open to each
    query; or which entry breaks every sliding-causal reading."""
    m = np.asarray(m, dtype=np.float64)
    s, t = m.shape[-2], m.shape[-1]
    open_ = np.abs(m) < 1e-6
    q = past + np.arange(s)[:, None]
    k = np.arange(t)[None, :]
    width = int(open_.reshape(-1, s, t)[0, -1].sum())  # the last query sees the most keys: min(W, all of them)
    window = -1 if width == past + s else width
    allowed = (k <= q) & ((k > q - window) if window > 0 else True)
    want = np.broadcast_to(allowed, m.shape)
    blocked = m <= -1e4
    good = (open_ & want) | (blocked & ~want)
    if good.all():
        return window
    bad = np.argwhere(~good)[0]
    i, j = int(bad[-2]), int(bad[-1])
    reading = f"a window of {window} keys" if window > 0 else "causal"
    return (f"attention mask at past {past} is neither causal nor a sliding window: entry [q {i}, k {j}] is "
            f"{m[tuple(bad)]:.3g}, {reading} expects {'0' if want[tuple(bad)] else '-inf'}")


def local_window(ctx, bias: ir.Value, s: int, cached: bool) -> int | str:
    """GroupQueryAttention's local_window_size for the causal mask `bias` (its window W; -1 for full attention at
    every length the design holds), or a reason. One long probe per mask value (the layers of a kind share theirs)."""
    key = ("local-window", id(bias))
    if key not in ctx.cache:
        ctx.cache[key] = _probe_window(ctx, bias, s, cached)
    return ctx.cache[key]


def _probe_window(ctx, bias: ir.Value, s: int, cached: bool) -> int | str:
    """The window read from the mask's cone evaluated at the long probe's dims, or why it could not be."""
    dims = _long_dims(ctx, LONG_PROBE_SEQ if cached else s, cached)
    arrays = _long_arrays(ctx, bias, dims)
    if isinstance(arrays, str):
        return f"could not probe the attention mask at a long past: {arrays}"
    try:
        (m,) = ctx.run_probe([bias], arrays=arrays)
    except Exception as exc:
        return f"could not probe the attention mask at past {dims.get('past', 0)}: {exc}"
    if m.ndim != 4:
        return f"attention mask at the long probe has shape {m.shape}, not [B, 1|N, S, T]"
    return read_window(m, dims.get("past", 0) if cached else 0)


def window_attrs(site) -> dict:
    """The GroupQueryAttention attributes of a site's window and soft cap (none where it has neither)."""
    attrs = {}
    if site.window >= 0:
        attrs["local_window_size"] = int(site.window)
    if site.softcap > 0:
        attrs["softcap"] = float(site.softcap)
    return attrs
