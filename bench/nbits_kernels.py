"""Batch-1 weight GEMV kernels on ONNX Runtime CUDA, side by side, inside CUDA graphs: per decode shape of a model,
fp16 MatMul, MatMulNBits int4/int8 at block 32/64/128 with ORT's fpA_intB path (TensorRT-LLM's weight-only GEMV,
session config `ep.cuda.fpa_intb_gemm`) off and on, and MatMulBlockQuantizedFp8Weight fp8 (block 128).

Each point: a graph of R independent copies of the op reading one input row (weights per copy, so nothing is
cached across copies) against the same graph with one copy, both captured as CUDA graphs and replayed; the per-op
time is (T(R) - T(1)) / (R - 1), the median of interleaved rounds. The fpA_intB on/off pair is also checked to give
the same output on the same weights (it is a layout change, not a different quantisation).

    python3 bench/nbits_kernels.py --model qwen3-1.7b -o bench/results/nbits-kernels-cuda-DATE.md
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

# (name, K, N) per decode GEMV of the model, as softsyn's compiled graph has them (packed QKV and gate/up)
SHAPES = {
    "qwen3-1.7b": [("qkv", 2048, 4096), ("o_proj", 2048, 2048), ("gate_up", 2048, 12288), ("down", 6144, 2048),
                   ("lm_head", 2048, 151936)],
    "qwen3-0.6b": [("qkv", 1024, 4096), ("o_proj", 2048, 1024), ("gate_up", 1024, 6144), ("down", 3072, 1024),
                   ("lm_head", 1024, 151936)],
}
FP16 = TensorProto.FLOAT16


def model_of(op: str, k: int, n: int, copies: int, bits: int = 4, block: int = 32, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits, outs = [], [], []
    for i in range(copies):
        y = f"y{i}"
        outs.append(helper.make_tensor_value_info(y, FP16, [1, n]))
        if op == "fp16":
            w = (rng.standard_normal((k, n), dtype=np.float32) * 0.02).astype(np.float16)
            inits.append(numpy_helper.from_array(w, f"W{i}"))
            nodes.append(helper.make_node("MatMul", ["a", f"W{i}"], [y]))
        elif op == "nbits":
            kb = (k + block - 1) // block
            inits.append(numpy_helper.from_array(rng.integers(0, 255, (n, kb, block * bits // 8), dtype=np.uint8),
                                                 f"B{i}"))
            inits.append(numpy_helper.from_array((rng.random(n * kb, dtype=np.float32) * 0.01).astype(np.float16),
                                                 f"S{i}"))
            nodes.append(helper.make_node("MatMulNBits", ["a", f"B{i}", f"S{i}"], [y], domain="com.microsoft",
                                          K=k, N=n, bits=bits, block_size=block))
        else:  # fp8 weight-only
            kb = (k + block - 1) // block
            raw = rng.integers(0, 0x7E, (n, k), dtype=np.uint8)  # finite e4m3 bit patterns
            b = helper.make_tensor(f"B{i}", TensorProto.FLOAT8E4M3FN, (n, k), raw.tobytes(), raw=True)
            inits.append(b)
            inits.append(numpy_helper.from_array(rng.random((n, kb), dtype=np.float32) * 0.01, f"S{i}"))
            nodes.append(helper.make_node("MatMulBlockQuantizedFp8Weight", ["a", f"B{i}", f"S{i}"], [y],
                                          domain="com.microsoft", block_size=block))
    graph = helper.make_graph(nodes, f"{op}-{k}x{n}x{copies}", [helper.make_tensor_value_info("a", FP16, [1, k])],
                              outs, inits)
    return helper.make_model(graph, ir_version=10,
                             opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


class Replay:
    """One captured session: the input row and outputs bound on the device, replayed by run()."""

    def __init__(self, model: onnx.ModelProto, fpa: bool):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.add_session_config_entry("ep.cuda.fpa_intb_gemm", "1" if fpa else "0")
        self.sess = ort.InferenceSession(model.SerializeToString(), so, providers=[
            ("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
        k = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
        rng = np.random.default_rng(1)
        self.a = ort.OrtValue.ortvalue_from_numpy(rng.standard_normal((1, k)).astype(np.float16), "cuda", 0)
        self.outs = {o.name: ort.OrtValue.ortvalue_from_shape_and_type(
            [1, o.type.tensor_type.shape.dim[1].dim_value], np.float16, "cuda", 0) for o in model.graph.output}
        self.binding = self.sess.io_binding()
        self.binding.bind_ortvalue_input("a", self.a)
        for name, v in self.outs.items():
            self.binding.bind_ortvalue_output(name, v)
        for _ in range(3):  # the first run captures
            self.run()

    def run(self) -> None:
        self.sess.run_with_iobinding(self.binding)

    def timed(self, calls: int) -> float:
        self.binding.synchronize_inputs()
        t = time.perf_counter()
        for _ in range(calls):
            self.run()
        self.binding.synchronize_outputs()
        return (time.perf_counter() - t) / calls

    def first(self) -> np.ndarray:
        return self.outs["y0"].numpy()


def per_op(op: str, k: int, n: int, copies: int, fpa: bool, rounds: int, calls: int, **kw) -> tuple[float, np.ndarray]:
    one, many = Replay(model_of(op, k, n, 1, **kw), fpa), Replay(model_of(op, k, n, copies, **kw), fpa)
    diffs = [(many.timed(calls) - one.timed(calls)) / (copies - 1) for _ in range(rounds)]
    return statistics.median(diffs), one.first()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-1.7b", choices=sorted(SHAPES))
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("-o", "--out", default=None)
    args = ap.parse_args()
    variants = [("fp16", "fp16", {}, False), ("fp8 b128", "fp8", {"block": 128}, False)]
    for bits in (4, 8):
        for block in (32, 64, 128):
            for fpa in (False, True):
                variants.append((f"int{bits} b{block}{' fpA_intB' if fpa else ''}", "nbits",
                                 {"bits": bits, "block": block}, fpa))
    lines = [f"# Batch-1 GEMV kernels, ORT {ort.__version__} CUDA, CUDA graphs ({args.model})", "",
             f"per op: (T({args.copies} copies) - T(1)) / {args.copies - 1}, median of {args.rounds} interleaved "
             f"rounds of {args.calls} replays; weights per copy; GB/s = weight bytes / time", "",
             "| variant | " + " | ".join(f"{name} {k}x{n} (us, GB/s)" for name, k, n in SHAPES[args.model]) + " |",
             "|---|" + "---|" * len(SHAPES[args.model])]
    results = {}
    for label, op, kw, fpa in variants:
        cells = []
        for name, k, n in SHAPES[args.model]:
            copies = 3 if name == "lm_head" else args.copies
            try:
                t, y = per_op(op, k, n, copies, fpa, args.rounds, args.calls, **kw)
            except Exception as e:  # an op/attribute combination ORT refuses: say so in the table
                cells.append(f"refused: {str(e).strip().splitlines()[-1][-90:]}")
                continue
            results[(label, name)] = y
            bits = {"fp16": 16, "fp8": 8}.get(op, kw.get("bits"))
            gbs = k * n * bits / 8 / t / 1e9
            cells.append(f"{t * 1e6:.1f} ({gbs:.0f})")
            if fpa:  # the same weights without fpA_intB: the path must give the same row
                base = results.get((label.replace(" fpA_intB", ""), name))
                if base is not None:
                    err = float(np.abs(base.astype(np.float32) - y).max() / (np.abs(base).max() + 1e-9))
                    cells[-1] += f" d={err:.1e}"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
