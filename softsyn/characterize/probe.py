"""Machine-speed probe: how fast the machine runs now, against the speed its library was measured at.

Shared machines drift: on the 2-core CPU VM this project is built on, a fixed 256^3 numpy matmul took
142-149 us in one minute and 178-189 us in the next, and whole sign-offs came out 15-45 % slower
across every group. A prediction describes the machine the library was characterised on, so a
sign-off must say what state the machine was in while it measured. The probe is a fixed small ONNX
Runtime workload (PROBE_WORKLOAD) timed in a few milliseconds: `softsyn characterize` records its
fastest and median time over the run in the library header (`probe`), and `softsyn signoff` times it
before and after measuring. machine factor = probe now / the library's fastest probe: 1.0 = the speed
the tables describe, 1.3 = everything ran about 30 % slower (the probe tracks the slow spells, with
about +-15 % jitter between a probe and a model measured next to it). That holds on the CPU; on a GPU the
probe reports the host's state only (the H200 read 1.7-1.87x while its models ran within -1..-13 % of the
predictions: their time is kernel launches, bench/launch_drift.py).
"""
from __future__ import annotations

import statistics
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from softsyn.runtime.session import IR_VERSION, SessionSettings, open_session

PROBE_WORKLOAD = ("8 x (MatMul [64, 256] @ W[256, 256] + Add), fp32, one session.run with numpy feeds on the "
                  "provider; median of 50 warm runs")
_SESSIONS: dict = {}


def _probe_session(provider: str):
    """The probe's session and feeds on `provider`, made once per process. Its provider is not checked: the sessions
    that measure (signoff's, characterisation's) check theirs."""
    if provider in _SESSIONS:
        return _SESSIONS[provider]

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(8):
        inits.append(numpy_helper.from_array(rng.random((256, 256), dtype=np.float32) * 0.01, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Add", [f"m{i}", "x"], [f"a{i}"]))
        prev = f"a{i}"
    graph = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [64, 256])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION)
    sess = open_session(model, SessionSettings(provider=provider, log_severity=3, require_provider=False))
    feeds = {"x": rng.random((64, 256), dtype=np.float32)}
    _SESSIONS[provider] = (sess, feeds)
    return sess, feeds


def speed_probe(provider: str = "cpu", runs: int = 50) -> float:
    """Median seconds of one run of the probe workload on `provider` ("cpu" | "cuda")."""
    sess, feeds = _probe_session(provider)
    for _ in range(5):
        sess.run(None, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def summarise(samples: list[float], previous: dict | None = None) -> dict:
    """The library header's `probe` entry from this run's samples (merged with a resumed file's entry)."""
    out = {"workload": PROBE_WORKLOAD}
    fastest = min(samples) if samples else None
    if previous and previous.get("fastest_s"):
        fastest = min(fastest, float(previous["fastest_s"])) if fastest else float(previous["fastest_s"])
    out["fastest_s"] = fastest
    out["median_s"] = statistics.median(samples) if samples else (previous or {}).get("median_s")
    out["samples"] = len(samples) + int((previous or {}).get("samples", 0))
    return out


SETTLE_NEAR = 1.15  # settle(): "at the library's speed" = the probe within this factor of the library's fastest


def settle(provider: str = "cpu", timeout: float = 60.0, tolerance: float = 0.05, window: int = 3,
           reference: float | None = None, near: float = SETTLE_NEAR) -> tuple[list[float], float, bool]:
    """Run the probe until `window` readings in a row agree within `tolerance` and, given the library's fastest
    probe `reference`, their median is within `near` x of it; or until `timeout` seconds pass.

    A VM left idle runs its first minute of work slow, and this 2-core VM has slow phases of minutes in which ORT's
    two-thread workloads run 1.7x slower (the CPU correlation of 2026-11-30, session 3: probe 283-289 us for a
    whole run vs the library's 155 us; the single-threaded numpy probe stayed normal). A benchmark that compares
    against the library measures at the library's speed or says it could not. Returns the readings (s), the
    seconds spent and whether the machine settled (at the reference speed where one is given)."""
    start = time.perf_counter()
    readings: list[float] = []
    while True:
        readings.append(speed_probe(provider))
        last = readings[-window:]
        steady = len(last) == window and max(last) <= (1 + tolerance) * min(last)
        fast = reference is None or statistics.median(last) <= near * reference
        if steady and fast:
            return readings, time.perf_counter() - start, True
        if time.perf_counter() - start >= timeout:
            return readings, time.perf_counter() - start, False
        time.sleep(0.5)
