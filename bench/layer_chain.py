"""A decode step's weight GEMVs as the step runs them, layer after layer: qwen3-1.7b's q/k/v (packed), o, gate/up
(packed, silu(gate) * up in the epilogue) and down, 28 layers of distinct weights (every layer's read from device
memory, as in a step), captured in one CUDA graph; per layer. Forms: cuBLAS fp16 and softsyn's int4 g128 kernel
(softsyn.emit.triton_weights, autotuned), each without and with an RMSNorm kernel before q/k/v and gate/up (the small
kernels between a step's GEMVs); first, what a near-empty kernel costs in the same kind of graph. Part `layerchain`
of bench/torch_kernels.py.

A single GEMV chain (torch_kernels' `chain`) repeats one shape; this one runs the step's shapes in the step's order,
each GEMV after a different one, as a change to what one GEMV leaves for the next (the cache, the tail of its launch)
needs. It measured the kernel asking the next GEMV's weights into L2 (H100, 2026-12-06: slower; decision note
docs/decisions/2026-12-06-triton-int4.md, "v6")."""
from __future__ import annotations

import torch

HIDDEN, MLP, QKV, LAYERS = 2048, 6144, 4096, 28  # qwen3-1.7b: q 16 x 128, k and v 8 x 128 each
SHAPES = (("qkv", HIDDEN, QKV), ("o", HIDDEN, HIDDEN), ("gate_up", HIDDEN, 2 * MLP), ("down", MLP, HIDDEN))


def int4_layers(device: str, dtype) -> list[dict]:
    """LAYERS layers of seeded int4 g128 weights at SHAPES: a dict of PackedWeights per layer."""
    from softsyn.emit.triton_weights import quantise

    layers = []
    for _ in range(LAYERS):
        layers.append({name: quantise(torch.randn(out, width, device=device, dtype=dtype) * 0.02, 128, dtype)
                       for name, width, out in SHAPES})
    return layers


def int4_step(layers: list[dict], inputs: dict, norms: bool):
    """One step's GEMVs over `layers` (softsyn's kernel, autotuned; gate/up with silu(gate) * up in its epilogue)."""
    from softsyn.emit.triton_weights import launch

    norm = torch.ones(HIDDEN, device=inputs[HIDDEN].device, dtype=inputs[HIDDEN].dtype)

    def step():
        for layer in layers:
            for name, width, _ in SHAPES:
                x = inputs[width]
                if norms and name in ("qkv", "gate_up"):
                    x = torch.nn.functional.rms_norm(x, (HIDDEN,), norm)
                w = layer[name]
                launch(x, w.packed, w.scales, w.lows, gated=name == "gate_up")
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


KERNELS_A_LAYER = 14  # kernels a layer of qwen3-1.7b's int4 decode step runs (v5, matmul attention; 2026-12-06)


def floor_row(device: str, dtype, timed) -> tuple:
    """What a kernel costs a step when it does almost nothing: LAYERS x KERNELS_A_LAYER in-place adds on a hidden-wide
    vector in one graph, per kernel: the floor that only fewer kernels remove (the L2 prefetch, which removes none,
    bought nothing: H100, 2026-12-06)."""
    x = torch.zeros(HIDDEN, device=device, dtype=dtype)
    calls = LAYERS * KERNELS_A_LAYER
    seconds = timed(lambda: [x.add_(1) for _ in range(calls)], device) / calls
    print(f"layer chain | a near-empty kernel (in-place add of {HIDDEN}) | {seconds * 1e6:.2f} us a kernel", flush=True)
    return (f"a near-empty kernel in a graph ({calls} in-place adds of {HIDDEN} values; per kernel)", "torch add_",
            seconds, x.numel() * x.element_size() / seconds)


def layer_chain_rows(device: str, dtype, timed) -> list[tuple]:
    """Rows (what, form, seconds a layer, fp16 bytes a layer / time) for torch_kernels' table; `timed(fn, device)`
    is its CUDA-graph timer."""
    inputs = {width: torch.randn(1, width, device=device, dtype=dtype) for width in (HIDDEN, MLP)}
    fp16_bytes = sum(width * out * 2 for _, width, out in SHAPES)
    what = f"decode layer chain ({LAYERS} layers of q/k/v, o, gate/up gated, down; per layer)"
    rows = [floor_row(device, dtype, timed)]
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
        form = f"softsyn int4 g128 (autotuned){' + RMSNorms' if norms else ''}"
        try:
            seconds = timed(int4_step(layers, inputs, norms), device) / LAYERS
        except Exception as exc:  # noqa: BLE001 - a form that fails is a line, not a crash
            print(f"layer chain {form}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        rows.append((what, form, seconds, fp16_bytes / seconds))
        print(f"layer chain | {form} | {seconds * 1e6:.1f} us a layer", flush=True)
    return rows
