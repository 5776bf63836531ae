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


def layer_weights(device: str, dtype, int4: bool) -> list[dict]:
    """LAYERS layers of seeded weights at SHAPES, a dict per layer: fp16 tensors, or int4 g128 PackedWeights."""
    from softsyn.emit.triton_weights import quantise

    def weight(width: int, out: int):
        w = torch.randn(out, width, device=device, dtype=dtype) * 0.02
        return quantise(w, 128, dtype) if int4 else w

    return [{name: weight(width, out) for name, width, out in SHAPES} for _ in range(LAYERS)]


def cublas(x: torch.Tensor, weight: torch.Tensor, name: str) -> None:
    torch.nn.functional.linear(x, weight)


def softsyn_int4(x: torch.Tensor, weight, name: str) -> None:
    """softsyn's kernel, autotuned; gate/up with silu(gate) * up in its epilogue."""
    from softsyn.emit.triton_weights import launch

    launch(x, weight.packed, weight.scales, weight.lows, gated=name == "gate_up")


def chain_step(layers: list[dict], inputs: dict, norms: bool, gemv):
    """One step's GEMVs over `layers`, `gemv(x, weight, name)` each, an RMSNorm before q/k/v and gate/up if `norms`."""
    norm = torch.ones(HIDDEN, device=inputs[HIDDEN].device, dtype=inputs[HIDDEN].dtype)

    def step():
        for layer in layers:
            for name, width, _ in SHAPES:
                x = inputs[width]
                if norms and name in ("qkv", "gate_up"):
                    x = torch.nn.functional.rms_norm(x, (HIDDEN,), norm)
                gemv(x, layer[name], name)
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
    for label, int4, gemv in (("fp16 cuBLAS", False, cublas), ("softsyn int4 g128 (autotuned)", True, softsyn_int4)):
        layers = layer_weights(device, dtype, int4)
        for norms in (False, True):
            form = f"{label}{' + RMSNorms' if norms else ''}"
            try:
                seconds = timed(chain_step(layers, inputs, norms, gemv), device) / LAYERS
            except Exception as exc:  # noqa: BLE001 - a form that fails is a line, not a crash
                print(f"layer chain {form}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            rows.append((what, form, seconds, fp16_bytes / seconds))
            print(f"layer chain | {form} | {seconds * 1e6:.1f} us a layer", flush=True)
        del layers
        torch.cuda.empty_cache()
    return rows
