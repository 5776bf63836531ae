"""A decode step's weight GEMVs as the step runs them, layer after layer: qwen3-1.7b's q/k/v (packed), o, gate/up
(packed, silu(gate) * up in the epilogue) and down, 28 layers of distinct weights (every layer's read from device
memory, as in a step), captured in one CUDA graph; per layer. Forms: cuBLAS fp16, and softsyn's int4 g128 kernel
(softsyn.emit.triton_weights, autotuned) without and with each GEMV asking the next one's weights into L2
(pull_ahead's two ways), each with and without an RMSNorm kernel before q/k/v and gate/up (the small kernels between
a step's GEMVs, during which asked-for weights can arrive). Part `layerchain` of bench/torch_kernels.py.

A single GEMV chain (torch_kernels' `chain`) repeats one shape; this one measures what a prefetch needs: a different
next weight after each call."""
from __future__ import annotations

import torch

HIDDEN, MLP, QKV, LAYERS = 2048, 6144, 4096, 28  # qwen3-1.7b: q 16 x 128, k and v 8 x 128 each
SHAPES = (("qkv", HIDDEN, QKV), ("o", HIDDEN, HIDDEN), ("gate_up", HIDDEN, 2 * MLP), ("down", MLP, HIDDEN))
AHEAD = ((0, "no prefetch"), (1, "each GEMV prefetches the next one's weights, a line a thread"),
         (2, "each GEMV prefetches the next one's weights, one bulk copy a program"))


def int4_layers(device: str, dtype) -> list[dict]:
    """LAYERS layers of seeded int4 g128 weights at SHAPES: a dict of PackedWeights per layer."""
    from softsyn.emit.triton_weights import quantise

    layers = []
    for _ in range(LAYERS):
        layers.append({name: quantise(torch.randn(out, width, device=device, dtype=dtype) * 0.02, 128, dtype)
                       for name, width, out in SHAPES})
    return layers


def int4_step(layers: list[dict], inputs: dict, how: int, norms: bool):
    """One step's GEMVs over `layers`; `how` 0: no prefetch, else each call names the next call's codes."""
    from softsyn.emit.triton_weights import launch

    order = [(i, name) for i in range(len(layers)) for name, _, _ in SHAPES]
    ahead = [layers[i][name].packed for i, name in order[1:] + order[:1]]
    norm = torch.ones(HIDDEN, device=inputs[HIDDEN].device, dtype=inputs[HIDDEN].dtype)

    def step():
        for (i, name), nxt in zip(order, ahead):
            w = layers[i][name]
            x = inputs[w.packed.shape[1] * 2]
            if norms and name in ("qkv", "gate_up"):
                x = torch.nn.functional.rms_norm(x, (HIDDEN,), norm)
            launch(x, w.packed, w.scales, w.lows, gated=name == "gate_up", ahead=nxt if how else None, how=how or 1)
    return step


def fp16_step(layers: list[dict], inputs: dict, norms: bool):
    norm = torch.ones(HIDDEN, device=inputs[HIDDEN].device, dtype=inputs[HIDDEN].dtype)

    def step():
        for layer in layers:
            for name, width, _ in SHAPES:
                x = inputs[width]
                if norms and name in ("qkv", "gate_up"):
                    x = torch.nn.functional.rms_norm(x, (HIDDEN,), norm)
                torch.nn.functional.linear(x, layer[name])
    return step


def layer_chain_rows(device: str, dtype, timed) -> list[tuple]:
    """Rows (what, form, seconds a layer, fp16 bytes a layer / time) for torch_kernels' table; `timed(fn, device)`
    is its CUDA-graph timer."""
    inputs = {width: torch.randn(1, width, device=device, dtype=dtype) for width in (HIDDEN, MLP)}
    fp16_bytes = sum(width * out * 2 for _, width, out in SHAPES)
    what = f"decode layer chain ({LAYERS} layers of q/k/v, o, gate/up gated, down; per layer)"
    rows = []
    fp16 = [{name: torch.randn(out, width, device=device, dtype=dtype) * 0.02 for name, width, out in SHAPES}
            for _ in range(LAYERS)]
    for norms in (False, True):
        seconds = timed(fp16_step(fp16, inputs, norms), device) / LAYERS
        rows.append((what, f"fp16 cuBLAS{' + RMSNorms' if norms else ''}", seconds, fp16_bytes / seconds))
        print(f"layer chain | fp16 cuBLAS norms={norms} | {seconds * 1e6:.1f} us a layer", flush=True)
    del fp16
    torch.cuda.empty_cache()
    layers = int4_layers(device, dtype)
    for norms in (False, True):
        for how, label in AHEAD:
            form = f"softsyn int4 g128 (autotuned), {label}{' + RMSNorms' if norms else ''}"
            try:
                seconds = timed(int4_step(layers, inputs, how, norms), device) / LAYERS
            except Exception as exc:  # noqa: BLE001 - a form that fails is a line, not a crash
                print(f"layer chain {form}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            rows.append((what, form, seconds, fp16_bytes / seconds))
            print(f"layer chain | {form} | {seconds * 1e6:.1f} us a layer", flush=True)
    return rows
