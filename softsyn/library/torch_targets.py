"""The PyTorch targets (issue 28): an artifact of AOTInductor kernels (DIR/model.pt2) instead of an ONNX model.

A torch target has no library of its own yet: the design is timed with the ORT library of the same device
(`library`), an estimate of the same function, and the package is measured at compile end. `cpu-torch` runs fp32 on
the CPU; `h200-torch` runs fp16 on CUDA, its fixed-shape steps replayed as CUDA graphs (softsyn.runtime.torch_package).
torchao's per-module precisions (int4/int8/fp8) are not built yet.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TorchTarget:
    name: str
    device: str  # torch's device name the package is compiled for
    library: str  # the ORT library the design's STA uses (an estimate: the package is measured)
    dtype: str  # torch's dtype name of the weights, activations and KV cache
    attention: str  # softsyn.emit.torch_lowering.ATTENTIONS: "sdpa" (torch's fused kernels) or "matmul"


TORCH_TARGETS = {
    "cpu-torch": TorchTarget("cpu-torch", "cpu", "cpu-ort", "float32", "sdpa"),
    # matmul: SDPA's cuDNN kernel took 2.4 of a 5.1 ms decode step on the H200 (qwen3-1.7b, 2026-12-03); the matmul
    # form is the alternative until bench/torch_attention.py's measurement says which is faster per shape
    "h200-torch": TorchTarget("h200-torch", "cuda", "h200-ort-cuda", "float16", "matmul"),
}


def torch_target(name: str | None) -> TorchTarget | None:
    """The torch target `name` names, None for any other target (a library name or file)."""
    return TORCH_TARGETS.get(name) if isinstance(name, str) else None


def torch_target_problem(target: TorchTarget, spec: str) -> str | None:
    """Why `target` cannot lower `spec`, None when it can: a plain ONNX file (the torch targets build the source model
    in torch, which an ONNX file does not hold). A CUDA target on a machine without CUDA is refused when the package is
    compiled (softsyn.emit.torch_lowering): analyze and --plan need no device."""
    if Path(str(spec)).suffix.lower() == ".onnx" and not str(spec).startswith("zoo:"):
        return (f"target {target.name} lowers the source model in torch, which a plain ONNX file ({spec}) does not "
                "hold; give a zoo name (zoo:qwen3-tiny), a Hugging Face model folder or its config.json, or an ORT "
                "target (cpu-ort)")
    return None
