"""ONNX Runtime's quantisation tooling, imported where a weight is first quantised (a compile that quantises nothing
never loads it): MatMulNBits' blockwise quantiser for MatMul cells, the QMoE packer (which takes torch tensors) for
experts."""
from __future__ import annotations

from types import SimpleNamespace


def ort_quantisers() -> SimpleNamespace:
    """nbits (onnxruntime.quantization.matmul_nbits_quantizer), qmoe (...cuda_quantizer.CudaQuantizer), torch."""
    # deferred: torch and ORT's quantisers load only when a weight is quantised
    import torch, onnxruntime.quantization.cuda_quantizer as cq, onnxruntime.quantization.matmul_nbits_quantizer as nb
    return SimpleNamespace(nbits=nb, qmoe=cq.CudaQuantizer, torch=torch)
