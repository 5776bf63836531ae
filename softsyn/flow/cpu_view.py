"""A CPU-runnable view of a compiled model, so `softsyn verify` can check a GPU artifact on a machine without one.

The cuda target's GroupQueryAttention absorbs Qwen3's per-head q/k RMSNorms (inputs q_norm_weight and
k_norm_weight): ORT runs that prologue on its CUDA and WebGPU providers only. The view computes the same
function with ops the CPU provider has: the norms as SimplifiedLayerNormalization over each head's features,
before the GQA node (which keeps its rotary), exactly the graph the fusion absorbed. Its fp8 weight cells
(MatMulBlockQuantizedFp8Weight, a CUDA-only kernel) become the fp8 decode, block scales and MatMul they compute
(softsyn.runtime.fp8_view); its bf16 MatMul cells (no CPU kernel) the fp32 product of their bf16 operands, rounded to
bf16 (softsyn.runtime.bf16_view). Everything else is the compiled model as written; weights stay in its data file (the
view is saved next to it and removed after load).
"""
from __future__ import annotations

from pathlib import Path

import onnx

from softsyn.runtime.bf16_view import expand_bf16_matmuls
from softsyn.runtime.fp8_view import expand_fp8_matmuls
from softsyn.runtime.gqa_view import expand_qk_norms
from softsyn.runtime.session import open_model


def rewrite(proto: onnx.ModelProto) -> dict[str, int]:
    """Apply the view's rewrites to `proto` in place: {"gqa": GroupQueryAttention nodes, "fp8": fp8 MatMuls, "bf16":
    bf16 MatMuls}."""
    return {"gqa": expand_qk_norms(proto), "fp8": expand_fp8_matmuls(proto), "bf16": expand_bf16_matmuls(proto)}


def view_note(changed: dict[str, int]) -> str:
    """What the view changed, for a provider line ("" when nothing)."""
    parts = []
    if changed.get("gqa"):
        parts.append(f"q/k norms run outside {changed['gqa']} GroupQueryAttention nodes")
    if changed.get("fp8"):
        parts.append(f"{changed['fp8']} fp8 weight MatMuls decoded to MatMul")
    if changed.get("bf16"):
        parts.append(f"{changed['bf16']} bf16 MatMuls as fp32 products of their bf16 operands")
    return "; ".join(parts)


def cpu_view_session(model_path: Path, options: dict | None = None):
    """(CPU session, {rewrite: nodes changed}, see `rewrite`): the model at model_path, or its CPU view where it
    absorbed what only GPU kernels run; the view file lives beside the weights only while the session loads.
    `options`: SessionOptions attributes by name (runtime/session.json's)."""
    model_path = Path(model_path)
    proto = onnx.load(str(model_path), load_external_data=False)
    changed = rewrite(proto)
    if not any(changed.values()):
        return open_model(model_path, "cpu", options), changed
    view = model_path.with_name(f".cpu-view-{model_path.name}")
    try:
        onnx.save(proto, str(view))
        return open_model(view, "cpu", options), changed
    finally:
        view.unlink(missing_ok=True)
