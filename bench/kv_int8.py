"""GroupQueryAttention's int8 KV cache (kv_layout's kv_cache.dtype int8) on the device against ORT CPU and numpy.

    python3 bench/kv_int8.py --provider cuda -o bench/results/kv-int8-h200.json     # on the H200
    python3 bench/kv_int8.py --provider cpu                                         # here: the script's own check

One GQA node in the form kv_layout emits for qwen3-1.7b (16 query heads, 8 KV heads, head_dim 128, do_rotary with
fp16 cos/sin caches, the absorbed q/k norms, one shared past/present buffer of --length positions, int8 past/present,
PER_CHANNEL fp32 k_scale / v_scale [8, 128]). Three questions:
  1. does the device's kernel store what softsyn.runtime.kv_quant.quantise computes (the present caches against ORT
     CPU's, on the CPU view: the q/k norms outside the node), and attend the same values (the outputs)? A prefill of
     --prompt tokens on an empty cache, then one decode token;
  2. does the provider register a float8e4m3fn cache (ORT CUDA only when built with USE_FP8_KV_CACHE)?
  3. decode (one token, --past cached) fp16 vs int8 cache, eager, IO bound on the device: median of --runs, ms.
Prints one JSON object (and writes it to -o).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper

from softsyn.runtime.gqa_view import expand_qk_norms
from softsyn.runtime.kv_quant import INT8_MAX, quantise

HEADS, KV_HEADS, HEAD = 16, 8, 128


def model(cache: int, length: int) -> onnx.ModelProto:
    f16 = T.FLOAT16
    ins = [helper.make_tensor_value_info("q", f16, [1, "s", HEADS * HEAD]),
           helper.make_tensor_value_info("k", f16, [1, "s", KV_HEADS * HEAD]),
           helper.make_tensor_value_info("v", f16, [1, "s", KV_HEADS * HEAD])]
    ins += [helper.make_tensor_value_info(x, cache, [1, KV_HEADS, length, HEAD]) for x in ("pk", "pv")]
    ins += [helper.make_tensor_value_info("sl", T.INT32, [1]), helper.make_tensor_value_info("tl", T.INT32, [])]
    rng = np.random.default_rng(7)
    pos = np.arange(length)[:, None] / (1e6 ** (np.arange(HEAD // 2) / (HEAD // 2)))
    inits = [onnx.numpy_helper.from_array(np.cos(pos).astype(np.float16), "cos"),
             onnx.numpy_helper.from_array(np.sin(pos).astype(np.float16), "sin"),
             onnx.numpy_helper.from_array(rng.uniform(0.5, 1.5, HEAD).astype(np.float16), "qn"),
             onnx.numpy_helper.from_array(rng.uniform(0.5, 1.5, HEAD).astype(np.float16), "kn")]
    names = ["q", "k", "v", "pk", "pv", "sl", "tl", "cos", "sin", "", "", "", "", "", "qn", "kn"]
    attrs = {}
    if cache != f16:
        # K after the norms and rotary stays within sqrt(HEAD) x the norm weight: 1.5 x sqrt(128) = 17; V ~ N(0, 1)
        inits += [onnx.numpy_helper.from_array(np.full((KV_HEADS, HEAD), 17.0 / INT8_MAX, np.float32), "ks"),
                  onnx.numpy_helper.from_array(np.full((KV_HEADS, HEAD), 5.0 / INT8_MAX, np.float32), "vs")]
        names[12:14] = ["ks", "vs"]
        attrs = dict(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=8)
    node = helper.make_node("GroupQueryAttention", names, ["o", "prk", "prv"], domain="com.microsoft",
                            num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=1, **attrs)
    outs = [helper.make_tensor_value_info("o", f16, [1, "s", HEADS * HEAD])]
    outs += [helper.make_tensor_value_info(x, cache, [1, KV_HEADS, length, HEAD]) for x in ("prk", "prv")]
    return helper.make_model(helper.make_graph([node], "gqa", ins, outs, initializer=inits), ir_version=10,
                             opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


class Run:
    """A session with past and present bound to one buffer per key/value (the shared layout), on `device`."""

    def __init__(self, proto: onnx.ModelProto, provider: str, cache_dtype, length: int):
        providers = ["CUDAExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
        self.session = ort.InferenceSession(proto.SerializeToString(), providers=providers)
        self.device = "cuda" if provider == "cuda" else "cpu"
        zeros = np.zeros((1, KV_HEADS, length, HEAD), cache_dtype)
        self.buffers = [ort.OrtValue.ortvalue_from_numpy(zeros.copy(), self.device, 0) for _ in range(2)]

    def __call__(self, q, k, v, total: int, repeat: int = 1) -> tuple[np.ndarray, list[float]]:
        b = self.session.io_binding()
        for name, x in (("q", q), ("k", k), ("v", v)):
            b.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(x, self.device, 0))
        b.bind_cpu_input("sl", np.array([total - 1], np.int32))
        b.bind_cpu_input("tl", np.array(total, np.int32))
        b.bind_output("o", self.device)  # first: copy_outputs_to_cpu()[0]
        for (past, present), buf in zip((("pk", "prk"), ("pv", "prv")), self.buffers):
            b.bind_ortvalue_input(past, buf)
            b.bind_ortvalue_output(present, buf)
        times = []
        for _ in range(repeat):
            b.synchronize_inputs()
            start = time.perf_counter()
            self.session.run_with_iobinding(b)
            b.synchronize_outputs()
            times.append(time.perf_counter() - start)
        return b.copy_outputs_to_cpu()[0], times

    def caches(self) -> list[np.ndarray]:
        return [buf.numpy() for buf in self.buffers]


def inputs(seq: int, seed: int):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, seq, n * HEAD)).astype(np.float16) for n in (HEADS, KV_HEADS, KV_HEADS)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--provider", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--length", type=int, default=8192, help="the shared buffer's positions")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--past", type=int, default=4096, help="cached positions of the timed decode step")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    result = {"ort": ort.__version__, "provider": args.provider, "geometry": [HEADS, KV_HEADS, HEAD, args.length]}

    # 1. the device's int8 cache against ORT CPU's (the CPU view: q/k norms outside the node)
    int8 = model(T.INT8, args.length)
    view = model(T.INT8, args.length)
    expand_qk_norms(view)
    dev = Run(int8 if args.provider == "cuda" else view, args.provider, np.int8, args.length)
    cpu = Run(view, "cpu", np.int8, args.length)
    steps = [(inputs(args.prompt, 1), args.prompt), (inputs(1, 2), args.prompt + 1)]
    check = []
    for (q, k, v), total in steps:
        got, _ = dev(q, k, v, total)
        want, _ = cpu(q, k, v, total)
        caches = [np.abs(a[:, :, :total].astype(int) - b[:, :, :total].astype(int)) for a, b in
                  zip(dev.caches(), cpu.caches())]
        check.append({"total": total, "output_max_abs": float(np.abs(got.astype(np.float32) - want).max()),
                      "output_max": float(np.abs(want).max()),
                      "cache_steps_differing": [int((c > 0).sum()) for c in caches],
                      "cache_max_steps": [int(c.max()) for c in caches]})
    k_sat = int((np.abs(dev.caches()[0][:, :, :args.prompt + 1].astype(int)) >= INT8_MAX).sum())
    result["int8_vs_cpu"] = check
    result["k_saturated"] = k_sat
    result["quantise_reference"] = "softsyn.runtime.kv_quant.quantise: " + str(quantise.__doc__).split(";")[0]

    # 2. a float8e4m3fn cache
    try:
        Run(model(T.FLOAT8E4M3FN, args.length), args.provider, np.uint8, args.length)
        result["fp8_cache"] = "session opens"
    except Exception as exc:  # noqa: BLE001 - ORT raises its own types
        result["fp8_cache"] = "refused: " + " ".join(str(exc).split())[:240]

    # 3. one decode step at --past cached positions: fp16 vs int8 cache
    timing = {}
    for name, cache, dtype in (("fp16", T.FLOAT16, np.float16), ("int8", T.INT8, np.int8)):
        proto = model(cache, args.length)
        if args.provider == "cpu":
            expand_qk_norms(proto)
        run = Run(proto, args.provider, dtype, args.length)
        q, k, v = inputs(1, 3)
        run(q, k, v, args.past + 1, repeat=20)  # warm-up
        _, times = run(q, k, v, args.past + 1, repeat=args.runs)
        timing[name] = {"median_ms": statistics.median(times) * 1e3,
                        "p10_ms": float(np.percentile(times, 10)) * 1e3, "p90_ms": float(np.percentile(times, 90)) * 1e3}
    result["decode_step"] = {"past": args.past, **timing}
    text = json.dumps(result, indent=1)
    print(text)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
