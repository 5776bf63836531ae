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
import functools
import importlib.metadata
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from softsyn.characterize.catalogue import plan_name
from softsyn.characterize.cellgraph import ELEM, FLOAT, NP, tensor
from softsyn.characterize.writer import render_library_yaml, write_library
from softsyn.errors import SoftsynError
from softsyn.progress import log
from softsyn.runtime.binding import BoundRunner, device_of, empty, to_device
from softsyn.runtime.session import IR_VERSION, OPSET, PROVIDERS, SessionSettings, describe_device, open_session


@dataclass(frozen=True)
class CeilingPlan:
    """The sizes one plan measures the ceilings at."""

    bandwidth_bytes: int  # the y = x + 1 tensor
    gemm_n: int  # the n of the n^3 MatMul
    chain_n: int  # Adds in the launch-overhead chain
    precisions: tuple[str, ...]  # the GEMM precisions tried


_CPU_PRECISIONS = ("fp32", "fp64", "fp16", "bf16", "int8", "int4")
_CUDA_PRECISIONS = ("fp32", "fp16", "bf16", "int8", "int4")
CEILING_PLANS = {  # by plan name (softsyn.characterize.catalogue.plan_name)
    "cpu": CeilingPlan(256 << 20, 2048, 200, _CPU_PRECISIONS),
    "cpu-quick": CeilingPlan(64 << 20, 768, 100, _CPU_PRECISIONS),
    "cuda": CeilingPlan(1 << 30, 8192, 400, _CUDA_PRECISIONS),
    "cuda-quick": CeilingPlan(256 << 20, 4096, 200, _CUDA_PRECISIONS),
}


# ------------------------------------------------------------------------------------------ graphs

def _onnx():
    return onnx, TensorProto, helper, numpy_helper


def _model(nodes, inputs, outputs, inits, ms_domain: bool = False):
    onnx, _, helper, _ = _onnx()
    opsets = [helper.make_opsetid("", OPSET)]
    if ms_domain:
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    graph = helper.make_graph(nodes, "ceiling", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def add_model(shape, n_nodes: int = 1, precision: str = "fp32"):
    """x -> (+1) -> ... n_nodes times -> y."""
    _, _, helper, _ = _onnx()
    elem = ELEM[precision]
    nodes, prev = [], "x"
    for i in range(n_nodes):
        out = "y" if i == n_nodes - 1 else f"t{i}"
        nodes.append(helper.make_node("Add", [prev, "one"], [out], name=f"add{i}"))
        prev = out
    return _model(nodes, [helper.make_tensor_value_info("x", elem, list(shape))],
                  [helper.make_tensor_value_info("y", elem, list(shape))],
                  [tensor("one", np.array(1.0, np.float32), elem)])


def matmul_model(m: int, k: int, n: int, precision: str, act: str = "fp32", rng=None):
    """y = a @ W, W an initializer; int4/int8 -> MatMulNBits (activation type `act`)."""
    _, _, helper, numpy_helper = _onnx()
    rng = rng or np.random.default_rng(0)
    if precision in ("int4", "int8"):
        bits, block = (4, 32) if precision == "int4" else (8, 32)
        kb = (k + block - 1) // block
        blob = block * bits // 8
        b = numpy_helper.from_array(rng.integers(0, 256, (n, kb, blob), dtype=np.uint8), "B")
        s = tensor("S", (rng.random(n * kb, dtype=np.float32) * 0.01), ELEM[act])
        node = helper.make_node("MatMulNBits", ["a", "B", "S"], ["y"], domain="com.microsoft", name="mm",
                                K=k, N=n, bits=bits, block_size=block)
        elem = ELEM[act]
        return _model([node], [helper.make_tensor_value_info("a", elem, [m, k])],
                      [helper.make_tensor_value_info("y", elem, [m, n])], [b, s], ms_domain=True)
    elem = ELEM[precision]
    w = tensor("W", (rng.random((k, n), dtype=np.float32) - 0.5) * 0.05, elem)
    node = helper.make_node("MatMul", ["a", "W"], ["y"], name="mm")
    return _model([node], [helper.make_tensor_value_info("a", elem, [m, k])],
                  [helper.make_tensor_value_info("y", elem, [m, n])], [w])


# ------------------------------------------------------------------------------------------ sessions

def session_settings(provider: str, **changes) -> SessionSettings:
    """Characterisation's sessions: the defaults a user gets, ORT's log at errors only, and on CUDA no CPU fallback
    (a node the GPU cannot run fails the session instead of timing the CPU)."""
    return replace(SessionSettings(provider=provider, log_severity=3, cpu_fallback=False), **changes)


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
    """Like time_calls for several callables, alternating them sample by sample (shared-machine drift cancels)."""
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
    device = device_of(provider)
    sess = open_session(add_model([n]), session_settings(provider))
    run = BoundRunner.from_values(sess, {"x": to_device(np.ones(n, np.float32), device)},
                                  {"y": empty([n], FLOAT, device)})
    t, lo, hi = time_calls(run, samples=samples, inner=1, warmup=3)
    bw = 2 * n * 4 / t
    return bw, (f"y = x + 1 on {n * 4 >> 20} MiB fp32, IO bound on {device}; read + write / "
                f"median of {samples} runs ({t * 1e3:.2f} ms, p10-p90 {lo * 1e3:.2f}-{hi * 1e3:.2f} ms)")


def _computes_in(precision: str, provider: str) -> str | None:
    """None if the provider computes a MatMul in `precision`, else why not (CPU: inserted Casts)."""
    if provider != "cpu" or precision in ("int4", "int8"):
        return None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "opt.onnx")
        open_session(matmul_model(8, 64, 64, precision), session_settings(provider, optimized_model_filepath=path))
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
        sess = open_session(matmul_model(n, n, n, precision, act=act), session_settings(provider))
    except SoftsynError:
        raise
    except Exception as e:  # NOT_IMPLEMENTED and friends: the provider has no kernel
        msg = str(e).strip().splitlines()[0][:160]
        return None, f"does not run: {msg}"
    a_prec = act if precision in ("int4", "int8") else precision
    device = device_of(provider)
    if a_prec == "bf16":
        a = empty([n, n], ELEM["bf16"], device)  # numpy has no bf16; contents do not change GEMM time
    else:
        a = to_device((np.random.default_rng(1).random((n, n), dtype=np.float32) - 0.5).astype(NP[ELEM[a_prec]]),
                      device)
    run = BoundRunner.from_values(sess, {"a": a}, {"y": empty([n, n], ELEM[a_prec], device)})
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
        sess = open_session(add_model(shape, count), session_settings(provider, cuda_graph=cuda_graph))
        if provider == "cpu":
            feeds = {"x": x_np}
            runners[key] = (lambda s=sess: s.run(None, feeds))
        else:
            device = device_of(provider)
            runners[key] = BoundRunner.from_values(sess, {"x": to_device(x_np, device)},
                                                   {"y": empty(shape, FLOAT, device)})
    return runners


def time_overheads(runners: dict, n_nodes: int, samples: int, inner: int, warmup: int = 5):
    """(per-node launch overhead, 1-node run, n_nodes-chain run), seconds, from overhead_runners' sessions."""
    med = time_interleaved(runners, samples=samples, inner=inner, warmup=warmup)
    per_node = (med["chain"] - med["one"]) / (n_nodes - 1)
    return per_node, med["one"], med["chain"]


def measure_overheads(provider: str, n_nodes: int, samples: int, inner: int, cuda_graph: bool = False):
    return time_overheads(overhead_runners(provider, n_nodes, cuda_graph), n_nodes, samples, inner)


# ------------------------------------------------------------------------------------------ header

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
    if provider not in PROVIDERS:
        raise SoftsynError(f"unknown provider {provider!r}; valid: {', '.join(PROVIDERS)}")
    plan = CEILING_PLANS[plan_name(provider, quick)]
    say = functools.partial(log, enabled=progress, tag="ceilings")
    notes: dict[str, str] = {}
    started = time.perf_counter()

    if provider == "cuda":  # is the CUDA EP really there? (checked on the session, never the available list)
        open_session(add_model([1, 8]), session_settings(provider, cpu_fallback=True))
    nbytes = plan.bandwidth_bytes
    say(f"memory bandwidth ({nbytes >> 20} MiB) ...")
    bw, notes["memory_bandwidth"] = measure_bandwidth(provider, nbytes, samples=8 if quick else 60)
    say(f"  {bw / 1e9:.1f} GB/s")

    peak: dict[str, float | None] = {}
    gemm_n = plan.gemm_n
    for p in plan.precisions:
        say(f"GEMM {p} ({gemm_n}^3) ...")
        rate, notes[f"peak_flops.{p}"] = measure_gemm(provider, p, gemm_n, samples=4 if quick else 30)
        peak[p] = rate
        say(f"  {rate / 1e9:.1f} GFLOP/s" if rate else f"  {notes[f'peak_flops.{p}']}")

    if provider == "cuda":
        notes["peak_flops.fp8"] = ("not attempted: standard ONNX MatMul has no FP8 kernel in ORT; "
                                   "the GemmFloat8 contrib op is not characterised yet")
    n_nodes = plan.chain_n
    samples, inner = (10, 10) if quick else (60, 25)
    say(f"per-node and per-run overhead ({n_nodes}-Add chain vs 1 Add) ...")
    launch, one, chain = measure_overheads(provider, n_nodes, samples, inner)
    path = "session.run with numpy feeds" if provider == "cpu" else "run_with_iobinding, IO on device"
    notes["launch_overhead"] = (f"({n_nodes}-Add chain {chain * 1e6:.1f} us - 1-Add graph {one * 1e6:.1f} us) / "
                                f"{n_nodes - 1}, [1,8] fp32, {path}; medians of {samples} interleaved samples "
                                f"x {inner} runs")
    run_overhead = one - launch if one > launch else one
    notes["run_overhead"] = f"1-Add graph {one * 1e6:.1f} us - one launch_overhead; {path}"
    say(f"  launch {launch * 1e6:.2f} us/node, run {run_overhead * 1e6:.2f} us")

    launch_graph = None
    if provider == "cuda":
        say("per-node overhead inside a CUDA graph ...")
        try:
            launch_graph, g_one, g_chain = measure_overheads(provider, n_nodes, samples, inner, cuda_graph=True)
            notes["launch_overhead_graph"] = (f"same chain with CUDA EP enable_cuda_graph=1: "
                                              f"({g_chain * 1e6:.1f} - {g_one * 1e6:.1f} us) / {n_nodes - 1}")
        except Exception as e:  # noqa: BLE001 - record why, do not guess
            notes["launch_overhead_graph"] = f"not measured: {str(e).splitlines()[0][:160]}"
    else:
        notes["launch_overhead_graph"] = "not applicable (no CUDA graphs on the CPU provider)"

    ep = PROVIDERS[provider]
    lib = {
        "library": name or ("cpu-ort" if provider == "cpu" else "cuda-ort"),
        "format": 1,
        "runtime": f"onnxruntime {ort.__version__}",
        "provider": ep,
        "device": describe_device(provider),
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
    say(f"done in {time.perf_counter() - started:.1f} s")
    return lib


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m softsyn.characterize.ceilings", description=__doc__.split("\n\n")[0])
    ap.add_argument("--provider", choices=sorted(PROVIDERS), default="cpu")
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
    if args.output:
        write_library(lib, args.output)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(render_library_yaml(lib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
