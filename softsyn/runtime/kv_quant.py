"""GroupQueryAttention's int8 KV cache: the quantise / dequantise ORT's kernels apply, and the scales softsyn gives it.

ORT 1.31.1 (contrib_ops/cuda/bert/group_query_attention_qdq.cuh, and the CPU kernel, which runs the same int8 cache)
stores K and V symmetric: q = clamp(rint(x * (1 / scale)), -128, 127), x' = q * scale, with `k_quant_type` /
`v_quant_type` PER_TENSOR (scale [1]) or PER_CHANNEL (scale [kv_heads, head_dim], fp32), K quantised after the rotary
and the q/k norms the node applies. softsyn uses PER_CHANNEL: K has outlier channels (KIVI, arXiv 2402.02750), and
one per-tensor step sized for them would round every other channel coarsely.

The scales come from a calibration run of the design itself (there is no calibration set): its seeded scenario
inputs, on ORT CPU, the present K/V the fp16 cache would hold at the positions each scenario writes. A rotary pair
(c, c + rot/2) turns with the position but keeps its norm, so both channels get the pair's largest norm: positions
past the calibrated ones cannot rotate a value out of range. HEADROOM covers prompts whose activations run larger
than the seeded ones (a value above it saturates at +-127 steps).
"""
from __future__ import annotations

import numpy as np

INT8_MIN, INT8_MAX = -128, 127
# Calibrated range x 1.25: a quarter more than the largest seeded value before saturation, for 0.32 bit of step
HEADROOM = 1.25
MIN_RANGE = 1e-4  # a channel the calibration never saw non-zero still gets a finite step
QUANT_TYPE = "PER_CHANNEL"
BITS = {"int8": 8}  # kv_cache.dtype -> kv_cache_bit_width of the caches ORT CPU and CUDA both run


def quantise(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """ORT's int8 KV quantiser on a [batch, kv_heads, seq, head_dim] tensor; scale [kv_heads, head_dim] or [1]."""
    inv = np.float32(1.0) / _per_channel(scale)
    q = np.rint(x.astype(np.float32) * inv)
    return np.clip(q, INT8_MIN, INT8_MAX).astype(np.int8)


def dequantise(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return q.astype(np.float32) * _per_channel(scale)


def _per_channel(scale: np.ndarray) -> np.ndarray:
    scale = np.asarray(scale, np.float32)
    return scale.reshape(1, scale.shape[0], 1, scale.shape[1]) if scale.ndim == 2 else scale.reshape(())


def channel_scales(values: list[np.ndarray], rotary_dim: int = 0) -> np.ndarray:
    """PER_CHANNEL scales [kv_heads, head_dim] from calibration tensors [batch, kv_heads, seq, head_dim] (the
    positions written); `rotary_dim` > 0: channels c and c + rotary_dim / 2 (a half-split rotary pair) share the
    pair's largest norm."""
    flat = np.concatenate([np.abs(v.astype(np.float32)).transpose(1, 0, 2, 3).reshape(v.shape[1], -1, v.shape[3])
                           for v in values], axis=1)  # [kv_heads, tokens, head_dim]
    peak = flat.max(axis=1) if flat.shape[1] else np.zeros((flat.shape[0], flat.shape[2]), np.float32)
    half = rotary_dim // 2
    if half:
        norm = np.sqrt(flat[:, :, :half] ** 2 + flat[:, :, half:2 * half] ** 2).max(axis=1)
        peak[:, :half] = peak[:, half:2 * half] = norm
    return (np.maximum(peak * HEADROOM, MIN_RANGE) / INT8_MAX).astype(np.float32)
