"""`softsyn verify --locate`: where a compiled model's run on its GPU provider departs from the same model on the
CPU provider (Formality's failing-point diagnosis, by simulation).

verify compares outputs only. When the GPU run violates the budget, locate runs the compiled model twice more with
every intermediate value of the main graph as an extra output, on the target provider and on the CPU provider (its
CPU view where the model absorbed GPU-only prologues), with the same feeds, and walks the nodes in graph order: a
node whose output departs by more than the budget while every input it reads agrees is where the divergence starts
(a kernel, or a fused node's kernel, computing another function on that provider). The CPU run is the oracle
because verify checks the CPU run of the same compiled model against the fp32 reference in CI.

The extra outputs keep ONNX Runtime from fusing across them at load, so the nodes located are the compiled graph's
own. When no node departs, verify's own GPU outputs (the graph as compiled, fused at load) are compared with the
probed GPU run's: if they differ, the departure is in what ORT fuses at load; if not, the two providers agree and
the compiled model departs from the reference on the CPU too.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from softsyn.flow.cpu_view import cpu_view_session
from softsyn.runtime.binding import BoundRunner
from softsyn.runtime.session import SessionSettings, open_session

SHOWN = 5  # nodes listed per scenario: the first is where it starts, the rest diverge independently later


@dataclass(frozen=True)
class Departure:
    """One node whose output departs (rel error over the budget) while its inputs agree (within the budget)."""
    node: str
    op: str
    output: str
    rel: float  # max|gpu - cpu| / max|cpu| of its worst output
    inputs_rel: float  # the worst of its inputs' errors (0: graph inputs, weights)
    cause: str = ""  # what the values say beyond the node (a MoE's routing flips), "" when nothing more is known


@dataclass(frozen=True)
class Located:
    scenario: str
    provider: str
    compared: int  # values compared (node outputs present in both runs)
    departures: tuple[Departure, ...]  # in graph order, at most SHOWN
    # the worst rel error between verify's own GPU run (the graph as compiled, ORT free to fuse at load) and the probed
    # GPU run at the model's outputs (None: none to compare): over the budget while no node departs, the departure
    # is in what ORT fuses at load
    unprobed_rel: float | None = None


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """max|got - want| / max|want| in float64 (inf on a shape mismatch; for integer and bool values, the fraction
    of elements that differ: routing indices or masks taken another way)."""
    if got.shape != want.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    if want.dtype.kind not in "fc":
        return float(np.mean(got != want))
    g, w = got.astype(np.float64), want.astype(np.float64)
    same = (g == w) | (np.isnan(g) & np.isnan(w))  # equal infinities (a mask's -inf) and NaNs in the same places agree
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(g - w))
    finite = np.abs(w[np.isfinite(w)])
    scale = float(finite.max()) if finite.size else 0.0
    worst = float(np.max(diff)) if np.all(np.isfinite(diff)) else float("inf")
    return worst / scale if scale > 0 else (0.0 if worst == 0 else float("inf"))


def probed(proto: onnx.ModelProto) -> list[str]:
    """Every node output of the main graph that is not already a graph output, added to the graph's outputs (by
    name: ONNX Runtime infers their types) in place; returns them."""
    taken = {o.name for o in proto.graph.output} | {i.name for i in proto.graph.input}
    names = [o for node in proto.graph.node for o in node.output if o and o not in taken]
    proto.graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(names))
    return list(dict.fromkeys(names))


def _run(session, feeds: dict, aliases: dict[str, str], provider: str) -> dict[str, np.ndarray]:
    names = {i.name for i in session.get_inputs()}
    # copies: on the CPU a bound input is the array's own memory, and GroupQueryAttention writes the new tokens into a
    # shared past (the feeds serve both runs); alive until the outputs are read
    copies = {k: v.copy() for k, v in feeds.items() if k in names}
    runner = BoundRunner.from_feeds(session, copies, provider, aliases)
    runner.run()
    return runner.arrays()  # a sequence or optional value (a Scan's, an If's) has no array: not compared


def both_runs(model_path: Path, feeds: dict, aliases: dict[str, str], provider: str,
              proto: onnx.ModelProto | None = None):
    """({value: array} on `provider`, the same on the CPU provider) of the model at model_path (its graph `proto`
    when the caller has it loaded) with every node output probed; the probed copy lives beside the weights only
    while the sessions load."""
    model_path = Path(model_path)
    proto = proto if proto is not None else onnx.load(str(model_path), load_external_data=False)
    probed(proto)
    copy = model_path.with_name(f".locate-{model_path.name}")
    try:
        onnx.save(proto, str(copy))
        gpu = open_session(copy, SessionSettings(provider=provider))
        on_gpu = _run(gpu, feeds, aliases, provider)
        del gpu
        cpu, _ = cpu_view_session(copy)
        on_cpu = _run(cpu, feeds, aliases, "cpu")
        del cpu
    finally:
        copy.unlink(missing_ok=True)
    return on_gpu, on_cpu


ROUTED = ("MoE", "QMoE")  # com.microsoft's expert ops: router logits are input 1, top-k experts per token


def routing_flips(node: onnx.NodeProto, on_gpu: dict, on_cpu: dict) -> str:
    """For an expert op (ROUTED): how many tokens pick another top-k expert set on the two runs. Top-k is
    discontinuous: router logits that agree within fp16 rounding choose another expert where two are nearly tied, and
    that token's output moves by a whole expert's share; a kernel fault moves every token. "" for other ops."""
    if node.op_type not in ROUTED or len(node.input) < 2 or node.input[1] not in on_gpu or node.input[1] not in on_cpu:
        return ""
    k = next((int(a.i) for a in node.attribute if a.name == "k"), 1)
    gpu, cpu = (np.asarray(v[node.input[1]], dtype=np.float64) for v in (on_gpu, on_cpu))
    gpu, cpu = gpu.reshape(-1, gpu.shape[-1]), cpu.reshape(-1, cpu.shape[-1])
    if gpu.shape != cpu.shape or not 0 < k <= gpu.shape[-1]:
        return ""
    chosen = [np.sort(np.argpartition(-x, k - 1, axis=-1)[:, :k], axis=-1) for x in (gpu, cpu)]
    flips = int(np.any(chosen[0] != chosen[1], axis=-1).sum())
    if not flips:
        return f"routing: all {len(gpu)} tokens pick the same top-{k} experts on both providers"
    return (f"routing: {flips} of {len(gpu)} tokens pick another top-{k} expert set (router logits within "
            f"{rel_error(gpu, cpu):.1e}): near-tied experts, not a kernel fault")


def departures(graph: onnx.GraphProto, errors: dict[str, float], budget: float,
               values: tuple[dict, dict] | None = None) -> list[Departure]:
    """The nodes (graph order) whose worst output's error is over `budget` while every input they read is within
    it (a value not compared, a graph input or a weight, counts as agreeing); `values` (the GPU and CPU runs' arrays)
    let an expert op say whether its tokens were routed differently."""
    found = []
    for node in graph.node:
        outs = [(errors[o], o) for o in node.output if o in errors]
        if not outs:
            continue
        rel, worst = max(outs)
        ins = max((errors.get(i, 0.0) for i in node.input if i), default=0.0)
        if rel > budget and ins <= budget:
            cause = routing_flips(node, *values) if values else ""
            found.append(Departure(node.name, node.op_type, worst, rel, ins, cause))
    return found


def locate(model_path: Path, scenario: str, feeds: dict, aliases: dict[str, str], provider: str, budget: float,
           unprobed: dict[str, np.ndarray] | None = None) -> Located:
    """Where the compiled model's run on `provider` departs from its CPU run on `feeds` (see the module doc);
    `unprobed`: verify's own outputs of the GPU run, to tell a departure under ORT's load-time fusion."""
    proto = onnx.load(str(model_path), load_external_data=False)
    on_gpu, on_cpu = both_runs(model_path, feeds, aliases, provider, proto)
    errors = {name: rel_error(on_gpu[name], on_cpu[name]) for name in on_gpu.keys() & on_cpu.keys()}
    found = departures(proto.graph, errors, budget, (on_gpu, on_cpu))  # the probed outputs change no node
    shared = [name for name in (unprobed or {}) if name in on_gpu]
    fused = max((rel_error(unprobed[name], on_gpu[name]) for name in shared), default=None)
    return Located(scenario, provider, len(errors), tuple(found[:SHOWN]), fused)
