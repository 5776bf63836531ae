"""ORT CPU's MatMulNBits at accuracy_level 0 and 4 against the fp32 MatMul, at decode's one row.

    python bench/nbits_accuracy_level.py [-o FILE] [--runs 200]

Each projection of Qwen3-0.6B and -1.7B (q/k/v packed, o, gate/up packed, down) as a one-node model: fp32 MatMul,
then MatMulNBits int4 and int8 (ORT's MatMulNBitsQuantizer, block 32, symmetric, the quantiser softsyn's map uses) at
accuracy_level 0 (unset: dequantise, fp32 multiply) and 4 (MLAS quantises the activations to int8 per block). One
session per form with the CPU provider, 2 intra-op threads (the CI machine's cores), 20 warm-up runs, then the median
of --runs single runs. The relative error is against the fp32 product. Why it matters: the cpu-ort library's
MatMulNBits cells and the nodes softsyn writes on the CPU carry accuracy_level 4
(docs/decisions/2026-12-06-cpu-nbits-accuracy-level.md).
"""
from __future__ import annotations

import argparse
import datetime
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import matmul_nbits_quantizer as nbits

SHAPES = (("qwen3-0.6b q/k/v packed", 1024, 4096), ("qwen3-0.6b o", 2048, 1024),
          ("qwen3-0.6b gate/up packed", 1024, 6144), ("qwen3-0.6b down", 3072, 1024),
          ("qwen3-1.7b q/k/v packed", 2048, 4096), ("qwen3-1.7b gate/up packed", 2048, 12288),
          ("qwen3-1.7b down", 6144, 2048))
FORMS = (("fp32", None, None), ("int4 level 0", 4, None), ("int4 level 4", 4, 4), ("int8 level 0", 8, None),
         ("int8 level 4", 8, 4))


def matmul_model(weight: np.ndarray) -> onnx.ModelProto:
    k, n = weight.shape
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10  # ORT 1.31 reads IR 13 at most; onnx writes its newest
    return model


def quantised(weight: np.ndarray, bits: int, level: int | None) -> onnx.ModelProto:
    config = nbits.DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True, bits=bits, accuracy_level=level)
    quantiser = nbits.MatMulNBitsQuantizer(matmul_model(weight), algo_config=config)
    quantiser.process()
    return quantiser.model.model


def timed(model: onnx.ModelProto, x: np.ndarray, runs: int) -> tuple[float, np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for _ in range(20):
        y = session.run(None, {"x": x})[0]
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run(None, {"x": x})
        times.append(time.perf_counter() - t)
    return statistics.median(times), y


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    nbits.logger.setLevel(logging.WARNING)
    rng = np.random.default_rng(0)
    lines = [f"# MatMulNBits accuracy_level on ORT {ort.__version__} CPU, one row, 2 threads "
             f"({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC)", "",
             "| projection | form | us | x fp32 | rel err vs fp32 |", "|---|---|---:|---:|---:|"]
    for label, k, n in SHAPES:
        weight = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
        x = rng.standard_normal((1, k)).astype(np.float32)
        base = None
        for form, bits, level in FORMS:
            model = matmul_model(weight) if bits is None else quantised(weight, bits, level)
            seconds, y = timed(model, x, args.runs if bits != 8 or level else max(5, args.runs // 20))
            if base is None:
                base, want = seconds, y
            err = float(np.abs(y - want).max() / np.abs(want).max())
            lines.append(f"| {label} {k}x{n} | {form} | {seconds * 1e6:.0f} | {seconds / base:.2f} | {err:.1e} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.output:
        args.output.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
