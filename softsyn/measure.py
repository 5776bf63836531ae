"""Measuring a netlist on the real runtime: seeded scenario inputs and warm, repeated runs.

What the measured interval covers: one `InferenceSession.run` call, wall clock
on the host, inputs already built as numpy arrays (outputs are allocated and
returned by the call). No tokenisation or sampling: the constraints' input and
output delays stand for those, so compare measured against the predicted
arrival minus the input delay.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir

from softsyn.errors import SoftsynError
from softsyn.netlist import Netlist


@dataclass
class Measurement:
    median: float  # s
    p90: float
    runs: int
    provider: str

    @property
    def summary(self) -> str:
        return f"median {self.median * 1e3:.3f} ms, p90 {self.p90 * 1e3:.3f} ms over {self.runs} runs ({self.provider})"


def scenario_inputs(netlist: Netlist, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for every graph input at the scenario's dims.

    Token ids are drawn below the vocabulary size, masks are all ones, and
    position ids continue after the cached tokens, so a decoder runs the path
    it runs in service.
    """
    rng = np.random.default_rng(seed)
    shapes = netlist.bind(dims)
    vocab = int(netlist.config.get("vocab_size") or 1000)
    past = dims.get("past", 0)
    feeds = {}
    for value in netlist.model.graph.inputs:
        shape = shapes.get(value.name)
        if shape is None:
            raise SoftsynError(f"input {value.name}: no concrete shape under dims {dims}")
        dtype = ir.DataType(value.dtype).numpy()
        if value.name == "position_ids":
            feeds[value.name] = np.broadcast_to(np.arange(past, past + shape[-1], dtype=dtype), shape).copy()
        elif "mask" in value.name:
            feeds[value.name] = np.ones(shape, dtype=dtype)
        elif np.issubdtype(dtype, np.integer):
            high = vocab if "ids" in value.name and "type" not in value.name else 2
            feeds[value.name] = rng.integers(0, high, size=shape, dtype=dtype)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def onnx_path(netlist: Netlist) -> Path:
    """The ONNX file behind a netlist (its export cache entry or the file it was read from)."""
    cached = netlist.provenance.get("cache", {}).get("path")
    candidates = [Path(cached) / "model.onnx"] if cached else []
    candidates.append(Path(netlist.provenance.get("source", "")))
    for path in candidates:
        if path.suffix == ".onnx" and path.is_file():
            return path
    raise SoftsynError(f"{netlist.name}: no ONNX file on disk to run (provenance: {netlist.provenance.get('source')})")


def measure(model_path: Path, feeds: dict[str, np.ndarray], runs: int = 20, warmup: int = 3,
            provider: str = "cpu") -> Measurement:
    """Median and p90 of `runs` warm session.run calls."""
    import onnxruntime as ort

    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
    session = ort.InferenceSession(str(model_path), providers=providers)
    used = session.get_providers()[0]
    if provider == "cuda" and used != "CUDAExecutionProvider":
        raise SoftsynError(f"{model_path}: the CUDA provider did not load (session runs on {used})")
    for _ in range(warmup):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    times.sort()
    return Measurement(statistics.median(times), times[min(len(times) - 1, int(0.9 * len(times)))], runs, used)
