"""A CPU-runnable view of a compiled model, so `softsyn verify` can check a GPU artifact on a machine without one.

The cuda target's GroupQueryAttention absorbs Qwen3's per-head q/k RMSNorms (inputs q_norm_weight and
k_norm_weight): ORT runs that prologue on its CUDA and WebGPU providers only. The view computes the same
function with ops the CPU provider has: the norms as SimplifiedLayerNormalization over each head's features,
before the GQA node (which keeps its rotary), exactly the graph the fusion absorbed. Everything else is the
compiled model as written; weights stay in its data file (the view is saved next to it and removed after load).
"""
from __future__ import annotations

from pathlib import Path

import onnx

from softsyn.runtime.gqa_view import expand_qk_norms


def cpu_view_session(model_path: Path, options: dict | None = None):
    """(CPU session, GQA nodes changed): the model at model_path, or its CPU view where it absorbed what only GPU
    kernels run; the view file lives beside the weights only while the session loads. `options`: SessionOptions
    attributes by name (runtime/session.json's)."""
    from softsyn.runtime.session import open_model

    model_path = Path(model_path)
    proto = onnx.load(str(model_path), load_external_data=False)
    changed = expand_qk_norms(proto)
    if not changed:
        return open_model(model_path, "cpu", options), 0
    view = model_path.with_name(f".cpu-view-{model_path.name}")
    try:
        onnx.save(proto, str(view))
        return open_model(view, "cpu", options), changed
    finally:
        view.unlink(missing_ok=True)
