"""Measure a library's ceilings under ONNX Runtime itself (not numpy, not torch).

    python -m softsyn.characterize.ceilings --provider cpu -o softsyn/library/libs/cpu-ort.yaml
    python -m softsyn.characterize.ceilings --provider cuda -o h200-ort-cuda.yaml      # on the GPU machine

Every figure is the median over many warm samples (each sample times a short loop of runs) of a
small ONNX graph built here and run with the session options a user gets by default
(`ort.SessionOptions()`: graph optimisations ORT_ENABLE_ALL, intra_op_num_threads=0 = ORT's default
of one thread per physical core). What is measured:

- memory_bandwidth: y = x + 1 on a large fp32 tensor (256 MiB on CPU, 1 GiB on CUDA); bytes read +
  written / time. Inputs and a preallocated output are bound with IO binding on the provider's
  device (host for CPU, `OrtValue.ortvalue_from_numpy(..., "cuda", 0)` for CUDA), so no allocation
  or transfer is timed. (+1, not +0: ORT's NoopElimination would remove an Add of zero.)
- peak_flops[precision]: MatMul [n x n] @ [n x n] with the weight as an initializer (prepacked, as
  in a real model), 2 n^3 / time; int4 / int8 are weight-only MatMulNBits (block 32, no zero point,
  accuracy_level unset, as onnxruntime.quantization writes by default) with activations in fp32
  (CPU) or fp16 (CUDA): an *effective* rate. A precision is recorded only if the provider computes
  in it: session creation must succeed, on CUDA with CPU fallback disabled
  (`session.disable_cpu_ep_fallback`), and on CPU the optimised graph must not wrap the MatMul in
  Casts (ORT CPU's InsertCastTransformer runs fp16 MatMul in fp32). Others are null, with the
  reason in `notes`.
- launch_overhead: a chain of N tiny Adds on a [1, 8] tensor minus a 1-Add graph, / (N - 1).
  Measured with the run path a user takes: `session.run` with numpy on CPU; `run_with_iobinding`
  with device-resident IO on CUDA.
- launch_overhead_graph (CUDA only): the same, with the CUDA EP's `enable_cuda_graph=1`.
- run_overhead: the 1-Add graph's time minus one launch_overhead: the fixed cost of a run, so a
  graph of n nodes costs about run_overhead + n * launch_overhead (+ the work).

The GPU session is detected from `session.get_providers()` after creation, never from
`get_available_providers()` (onnxruntime-gpu lists CUDA on machines without a GPU and silently
falls back to the CPU).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from softsyn.errors import SoftsynError

IR_VERSION = 10  # onnx 1.23 writes 14 by default; ORT 1.31 reads at most 13
OPSET = 17

_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}

# (full, quick) sizes and sample counts per provider.
_PLAN = {
    "cpu": {
        "bw_bytes": (256 << 20, 64 << 20), "gemm_n": (2048, 768), "chain_n": (200, 100),
        "precisions": ("fp32", "fp64", "fp16", "bf16", "int8", "int4"),
    },
    "cuda": {
        "bw_bytes": (1 << 30, 256 << 20), "gemm_n": (8192, 4096), "chain_n": (400, 200),
        "precisions": ("fp32", "fp16", "bf16", "int8", "int4"),
    },
}


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[ceilings] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ graphs

def _onnx():
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    return onnx, TensorProto, helper, numpy_helper


def _model(nodes, inputs, outputs, inits, ms_domain: bool = False):
    onnx, _, helper, _ = _onnx()
    opsets = [helper.make_opsetid("", OPSET)]
    if ms_domain:
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    graph = helper.make_graph(nodes, "ceiling", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


_ELEM = {"fp32": 1, "fp16": 10, "bf16": 16, "fp64": 11}  # onnx.TensorProto element types
_NP = {"fp32": np.float32, "fp16": np.float16, "fp64": np.float64}


def _tensor(name: str, array: np.ndarray, precision: str):
    """An initializer in `precision` (bf16 from the top 16 bits of fp32, numpy has no bf16)."""
    _, TensorProto, helper, numpy_helper = _onnx()
    if precision == "bf16":
        bits = (array.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return helper.make_tensor(name, TensorProto.BFLOAT16, array.shape, bits.tobytes(), raw=True)
    return numpy_helper.from_array(array.astype(_NP[precision]), name)


def add_model(shape, n_nodes: int = 1, precision: str = "fp32"):
    """x -> (+1) -> ... n_nodes times -> y."""
    _, _, helper, _ = _onnx()
    elem = _ELEM[precision]
    nodes, prev = [], "x"
    for i in range(n_nodes):
        out = "y" if i == n_nodes - 1 else f"t{i}"
        nodes.append(helper.make_node("Add", [prev, "one"], [out], name=f"add{i}"))
        prev = out
    return _model(nodes, [helper.make_tensor_value_info("x", elem, list(shape))],
                  [helper.make_tensor_value_info("y", elem, list(shape))],
                  [_tensor("one", np.array(1.0, np.float32), precision)])


def matmul_model(m: int, k: int, n: int, precision: str, act: str = "fp32", rng=None):
    """y = a @ W, W an initializer; int4/int8 -> MatMulNBits (activation type `act`)."""
    _, _, helper, numpy_helper = _onnx()
    rng = rng or np.random.default_rng(0)
    if precision in ("int4", "int8"):
        bits, block = (4, 32) if precision == "int4" else (8, 32)
        kb = (k + block - 1) // block
        blob = block * bits // 8
        b = numpy_helper.from_array(rng.integers(0, 256, (n, kb, blob), dtype=np.uint8), "B")
        s = _tensor("S", (rng.random(n * kb, dtype=np.float32) * 0.01), act)
        node = helper.make_node("MatMulNBits", ["a", "B", "S"], ["y"], domain="com.microsoft", name="mm",
                                K=k, N=n, bits=bits, block_size=block)
        elem = _ELEM[act]
        return _model([node], [helper.make_tensor_value_info("a", elem, [m, k])],
                      [helper.make_tensor_value_info("y", elem, [m, n])], [b, s], ms_domain=True)
    elem = _ELEM[precision]
    w = _tensor("W", (rng.random((k, n), dtype=np.float32) - 0.5) * 0.05, precision)
    node = helper.make_node("MatMul", ["a", "W"], ["y"], name="mm")
    return _model([node], [helper.make_tensor_value_info("a", elem, [m, k])],
                  [helper.make_tensor_value_info("y", elem, [m, n])], [w])


# ------------------------------------------------------------------------------------------ sessions

def _session(model, provider: str, cuda_graph: bool = False, optimized_path: str | None = None,
             cpu_fallback: bool = False, external: dict | None = None):
    """A session with the defaults a user gets; `external`: name -> (elem, host array) for the model's initializers
    that reference external data (softsyn.characterize.recipes.make_model), copied in by ORT when the session loads."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if external:
        so.add_external_initializers(list(external), [ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a, elem)
                                                      for elem, a in external.values()])
    if optimized_path:
        so.optimized_model_filepath = optimized_path
    if provider == "cuda":
        if not cpu_fallback:
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        opts = {"device_id": "0"}
        if cuda_graph:
            opts["enable_cuda_graph"] = "1"
        providers = [("CUDAExecutionProvider", opts)]
    else:
        providers = ["CPUExecutionProvider"]
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=providers)
    got = sess.get_providers()
    if got[0] != _PROVIDERS[provider]:
        raise SoftsynError(f"asked for {_PROVIDERS[provider]} but the session runs on {got}: "
                           "no usable device/runtime here (see reference/stack-notes.md)")
    return sess


def _device(provider: str) -> str:
    return "cuda" if provider == "cuda" else "cpu"


def _ortvalue(array: np.ndarray, provider: str):
    import onnxruntime as ort
    return ort.OrtValue.ortvalue_from_numpy(array, _device(provider), 0)


def _empty(shape, precision: str, provider: str):
    import onnxruntime as ort
    return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), _ELEM[precision], _device(provider), 0)


def _bound_runner(sess, inputs: dict, outputs: dict):
    """A zero-argument callable running `sess` on bound OrtValues (no allocation, no transfer)."""
    import onnxruntime as ort
    io = sess.io_binding()
    for name, v in inputs.items():
        io.bind_ortvalue_input(name, v)
    for name, v in outputs.items():
        io.bind_ortvalue_output(name, v)
    ro = ort.RunOptions()

    def run():
        sess.run_with_iobinding(io, ro)  # the CUDA EP synchronises its stream at the end of a run
    return run


def time_calls(fn, samples: int, inner: int, warmup: int = 3) -> tuple[float, float, float]:
    """(median, p10, p90) seconds per call over `samples` samples of `inner` calls each."""
    for _ in range(warmup):
        fn()
    per = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        per.append((time.perf_counter() - t0) / inner)
    per.sort()
    q = lambda f: per[min(len(per) - 1, int(f * len(per)))]  # noqa: E731
    return statistics.median(per), q(0.1), q(0.9)


def time_interleaved(fns: dict, samples: int, inner: int, warmup: int = 3) -> dict:
    """Like _time for several callables, alternating them sample by sample (shared-machine drift cancels)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    per = {k: [] for k in fns}
    for _ in range(samples):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            per[k].append((time.perf_counter() - t0) / inner)
    return {k: statistics.median(v) for k, v in per.items()}


# ------------------------------------------------------------------------------------------ measures

def measure_bandwidth(provider: str, nbytes: int, samples: int) -> tuple[float, str]:
    n = nbytes // 4
    sess = _session(add_model([n]), provider)
    x = _ortvalue(np.ones(n, np.float32), provider)
    y = _empty([n], "fp32", provider)
    run = _bound_runner(sess, {"x": x}, {"y": y})
    t, lo, hi = time_calls(run, samples=samples, inner=1, warmup=3)
    bw = 2 * n * 4 / t
    return bw, (f"y = x + 1 on {n * 4 >> 20} MiB fp32, IO bound on {_device(provider)}; read + write / "
                f"median of {samples} runs ({t * 1e3:.2f} ms, p10-p90 {lo * 1e3:.2f}-{hi * 1e3:.2f} ms)")


def _computes_in(precision: str, provider: str) -> str | None:
    """None if the provider computes a MatMul in `precision`, else why not (CPU: inserted Casts)."""
    if provider != "cpu" or precision in ("int4", "int8"):
        return None
    import onnx
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "opt.onnx")
        _session(matmul_model(8, 64, 64, precision), provider, optimized_path=path)
        ops = [n.op_type for n in onnx.load(path).graph.node]
    if "Cast" in ops:
        return f"runs only through inserted Casts to fp32 ({' -> '.join(ops)}): no {precision} kernel"
    return None


def measure_gemm(provider: str, precision: str, n: int, samples: int) -> tuple[float | None, str]:
    act = "fp16" if provider == "cuda" else "fp32"
    try:
        why_not = _computes_in(precision, provider)
        if why_not:
            return None, why_not
        sess = _session(matmul_model(n, n, n, precision, act=act), provider)
    except SoftsynError:
        raise
    except Exception as e:  # NOT_IMPLEMENTED and friends: the provider has no kernel
        msg = str(e).strip().splitlines()[0][:160]
        return None, f"does not run: {msg}"
    a_prec = act if precision in ("int4", "int8") else precision
    if a_prec == "bf16":
        a = _empty([n, n], "bf16", provider)  # numpy has no bf16; contents do not change GEMM time
    else:
        a = _ortvalue((np.random.default_rng(1).random((n, n), dtype=np.float32) - 0.5).astype(_NP[a_prec]), provider)
    y = _empty([n, n], a_prec, provider)
    run = _bound_runner(sess, {"a": a}, {"y": y})
    run()
    t1 = time_calls(run, samples=1, inner=1, warmup=0)[0]
    samples = max(3, min(samples, int(4.0 / max(t1, 1e-6))))  # about 4 s per precision at most
    t, lo, hi = time_calls(run, samples=samples, inner=1, warmup=2)
    flops = 2.0 * n ** 3
    kind = ("MatMulNBits block 32, activations " + act + ", effective rate") if precision in ("int4", "int8") \
        else "MatMul, weight initializer"
    return flops / t, (f"{n}^3 {kind}; 2n^3 / median of {samples} runs ({t * 1e3:.2f} ms, "
                       f"p10-p90 {lo * 1e3:.2f}-{hi * 1e3:.2f} ms)")


def overhead_runners(provider: str, n_nodes: int, cuda_graph: bool = False):
    """Runners of a 1-Add graph ("one") and an n_nodes-Add chain ("chain") on a [1, 8] tensor."""
    shape = [1, 8]
    x_np = np.ones(shape, np.float32)
    runners = {}
    for key, count in (("one", 1), ("chain", n_nodes)):
        sess = _session(add_model(shape, count), provider, cuda_graph=cuda_graph)
        if provider == "cpu":
            feeds = {"x": x_np}
            runners[key] = (lambda s=sess: s.run(None, feeds))
        else:
            runners[key] = _bound_runner(sess, {"x": _ortvalue(x_np, provider)}, {"y": _empty(shape, "fp32", provider)})
    return runners


def time_overheads(runners: dict, n_nodes: int, samples: int, inner: int, warmup: int = 5):
    """(per-node launch overhead, 1-node run, n_nodes-chain run), seconds, from overhead_runners' sessions."""
    med = time_interleaved(runners, samples=samples, inner=inner, warmup=warmup)
    per_node = (med["chain"] - med["one"]) / (n_nodes - 1)
    return per_node, med["one"], med["chain"]


def measure_overheads(provider: str, n_nodes: int, samples: int, inner: int, cuda_graph: bool = False):
    return time_overheads(overhead_runners(provider, n_nodes, cuda_graph), n_nodes, samples, inner)


# ------------------------------------------------------------------------------------------ header

def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_isa() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    keep = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "avx_vnni", "amx_bf16",
            "amx_int8")
    return [f for f in keep if f in flags]


def _describe_device(provider: str) -> str:
    if provider == "cuda":
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout
            line = out.strip().splitlines()[0]
            return f"{line} (nvidia-smi name, memory, driver)"
        except (OSError, IndexError, subprocess.SubprocessError):
            return "unknown CUDA device (nvidia-smi unavailable)"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    isa = _cpu_isa()
    return f"{_cpu_model()}, {cores} cores" + (f" ({', '.join(isa)})" if isa else "")


def _ort_package() -> str:
    for dist in ("onnxruntime-gpu", "onnxruntime"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def measure_ceilings(provider: str = "cpu", quick: bool = False, progress: bool = True,
                     name: str | None = None, command: str | None = None) -> dict:
    """Measure ceilings on this machine; returns a library mapping (header, ceilings, cells: [])."""
    import onnxruntime as ort
    if provider not in _PLAN:
        raise SoftsynError(f"unknown provider {provider!r}; valid: {', '.join(_PLAN)}")
    plan = _PLAN[provider]
    sel = 1 if quick else 0
    notes: dict[str, str] = {}
    started = time.perf_counter()

    if provider == "cuda":  # is the CUDA EP really there? (checked on the session, never the available list)
        _session(add_model([1, 8]), provider, cpu_fallback=True)
    nbytes = plan["bw_bytes"][sel]
    _log(progress, f"memory bandwidth ({nbytes >> 20} MiB) ...")
    bw, notes["memory_bandwidth"] = measure_bandwidth(provider, nbytes, samples=8 if quick else 60)
    _log(progress, f"  {bw / 1e9:.1f} GB/s")

    peak: dict[str, float | None] = {}
    gemm_n = plan["gemm_n"][sel]
    for p in plan["precisions"]:
        _log(progress, f"GEMM {p} ({gemm_n}^3) ...")
        rate, notes[f"peak_flops.{p}"] = measure_gemm(provider, p, gemm_n, samples=4 if quick else 30)
        peak[p] = rate
        _log(progress, f"  {rate / 1e9:.1f} GFLOP/s" if rate else f"  {notes[f'peak_flops.{p}']}")

    if provider == "cuda":
        notes["peak_flops.fp8"] = ("not attempted: standard ONNX MatMul has no FP8 kernel in ORT; "
                                   "the GemmFloat8 contrib op is not characterised yet")
    n_nodes = plan["chain_n"][sel]
    samples, inner = (10, 10) if quick else (60, 25)
    _log(progress, f"per-node and per-run overhead ({n_nodes}-Add chain vs 1 Add) ...")
    launch, one, chain = measure_overheads(provider, n_nodes, samples, inner)
    path = "session.run with numpy feeds" if provider == "cpu" else "run_with_iobinding, IO on device"
    notes["launch_overhead"] = (f"({n_nodes}-Add chain {chain * 1e6:.1f} us - 1-Add graph {one * 1e6:.1f} us) / "
                                f"{n_nodes - 1}, [1,8] fp32, {path}; medians of {samples} interleaved samples "
                                f"x {inner} runs")
    run_overhead = one - launch if one > launch else one
    notes["run_overhead"] = f"1-Add graph {one * 1e6:.1f} us - one launch_overhead; {path}"
    _log(progress, f"  launch {launch * 1e6:.2f} us/node, run {run_overhead * 1e6:.2f} us")

    launch_graph = None
    if provider == "cuda":
        _log(progress, "per-node overhead inside a CUDA graph ...")
        try:
            launch_graph, g_one, g_chain = measure_overheads(provider, n_nodes, samples, inner, cuda_graph=True)
            notes["launch_overhead_graph"] = (f"same chain with CUDA EP enable_cuda_graph=1: "
                                              f"({g_chain * 1e6:.1f} - {g_one * 1e6:.1f} us) / {n_nodes - 1}")
        except Exception as e:  # noqa: BLE001 - record why, do not guess
            notes["launch_overhead_graph"] = f"not measured: {str(e).splitlines()[0][:160]}"
    else:
        notes["launch_overhead_graph"] = "not applicable (no CUDA graphs on the CPU provider)"

    ep = _PROVIDERS[provider]
    lib = {
        "library": name or ("cpu-ort" if provider == "cpu" else "cuda-ort"),
        "format": 1,
        "runtime": f"onnxruntime {ort.__version__}",
        "provider": ep,
        "device": _describe_device(provider),
        "date": _dt.date.today().isoformat(),
        "command": command or f"softsyn.characterize.ceilings.measure_ceilings(provider={provider!r}, quick={quick})",
        "environment": (f"{_ort_package()}, numpy {np.__version__}, python {platform.python_version()}, "
                        f"{platform.system()} {platform.release()}"),
        "session_options": ("ort.SessionOptions() defaults: graph_optimization_level ORT_ENABLE_ALL, "
                            "intra_op_num_threads 0 (ORT default: one per physical core)"
                            + ("; CUDA: session.disable_cpu_ep_fallback=1" if provider == "cuda" else "")),
        "quick": bool(quick),
        "ceilings": {
            "memory_bandwidth": bw,
            "peak_flops": peak,
            "launch_overhead": launch,
            "launch_overhead_graph": launch_graph,
            "run_overhead": run_overhead,
        },
        "notes": notes,
        "cells": [],
    }
    _log(progress, f"done in {time.perf_counter() - started:.1f} s")
    return lib


# ------------------------------------------------------------------------------------------ YAML

def _num(v) -> str:
    """3 significant digits, always with a dot and a signed exponent (PyYAML reads "1e10" as a string)."""
    if v is None:
        return "null"
    mant, exp = f"{v:.2e}".split("e")
    mant = mant.rstrip("0")
    mant = mant + "0" if mant.endswith(".") else mant
    return f"{mant}e{int(exp):+03d}"


def render_library_yaml(lib: dict) -> str:
    """The library as YAML, each ceiling commented with how it was measured."""
    import yaml

    def scalar(v) -> str:
        return yaml.safe_dump(v, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()

    notes = lib.get("notes", {})
    c = lib["ceilings"]
    out = [f"# softsyn target library: {lib['library']}. Generated by softsyn.characterize.ceilings; see its docstring for the methods.",
           "# SI units: B/s, FLOP/s, s. null: not measured / the provider does not compute in it (see notes)."]
    for k in ("library", "format", "runtime", "provider", "device", "date", "command", "environment",
              "session_options", "quick"):
        if k in lib:
            out.append(f"{k}: {scalar(lib[k])}")
    out.append("ceilings:")
    out.append(f"  memory_bandwidth: {_num(c['memory_bandwidth'])}   # B/s: {notes.get('memory_bandwidth', '')}")
    out.append("  peak_flops:   # FLOP/s")
    for p, v in c["peak_flops"].items():
        out.append(f"    {p}: {_num(v)}   # {notes.get(f'peak_flops.{p}', '')}")
    for k in ("launch_overhead", "launch_overhead_graph", "run_overhead"):
        out.append(f"  {k}: {_num(c[k])}   # s: {notes.get(k, '')}")
    out.append("notes:")
    for k, v in notes.items():
        out.append(f"  {k}: {scalar(v)}")
    out.append("cells: []   # delay tables: filled by characterisation")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m softsyn.characterize.ceilings", description=__doc__.split("\n\n")[0])
    ap.add_argument("--provider", choices=sorted(_PLAN), default="cpu")
    ap.add_argument("-o", "--output", help="library YAML to write (default: print)")
    ap.add_argument("--name", help="library name (default: cpu-ort / cuda-ort)")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer samples (seconds, noisier)")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    command = "python -m softsyn.characterize.ceilings " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        lib = measure_ceilings(args.provider, quick=args.quick, progress=not args.quiet, name=args.name,
                               command=command.strip())
    except SoftsynError as e:
        print(f"softsyn: error: {e}", file=sys.stderr)
        return 2
    text = render_library_yaml(lib)
    if args.output:
        from softsyn.library import parse_library
        parse_library(text, Path(args.output))  # what we write must load
        tmp = Path(args.output).with_suffix(".yaml.tmp")
        tmp.write_text(text)
        tmp.replace(args.output)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
