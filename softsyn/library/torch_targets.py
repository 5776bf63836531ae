"""The PyTorch targets (issue 28): an artifact of AOTInductor kernels (DIR/model.pt2) instead of an ONNX model.

A torch target has no library of its own yet: the design is timed with the ORT library of the same device
(`library`), an estimate of the same function, and the package is measured at compile end. `cpu-torch` is built;
`h200-torch` is named and refused (its CUDA package, CUDA graphs and torchao precisions are not built yet).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path



@dataclass(frozen=True)
class TorchTarget:
    name: str
    device: str  # torch's device name the package is compiled for
    library: str  # the ORT library the design's STA uses (an estimate: the package is measured)
    built: bool


TORCH_TARGETS = {
    "cpu-torch": TorchTarget("cpu-torch", "cpu", "cpu-ort", built=True),
    "h200-torch": TorchTarget("h200-torch", "cuda", "h200-ort-cuda", built=False),
}


def torch_target(name: str | None) -> TorchTarget | None:
    """The torch target `name` names, None for any other target (a library name or file)."""
    return TORCH_TARGETS.get(name) if isinstance(name, str) else None


def torch_target_problem(target: TorchTarget, spec: str) -> str | None:
    """Why `target` cannot lower `spec` here, None when it can: a target not built yet, or a plain ONNX file (the
    torch targets build the source model in torch, which an ONNX file does not hold)."""
    if not target.built:
        built = ", ".join(t.name for t in TORCH_TARGETS.values() if t.built)
        return (f"target {target.name} is not built yet (its {target.device} package, CUDA graphs and torchao "
                f"precisions: issue 28); valid torch targets: {built}")
    if Path(str(spec)).suffix.lower() == ".onnx" and not str(spec).startswith("zoo:"):
        return (f"target {target.name} lowers the source model in torch, which a plain ONNX file ({spec}) does not "
                "hold; give a zoo name (zoo:qwen3-tiny), a Hugging Face model folder or its config.json, or an ORT "
                "target (cpu-ort)")
    return None
