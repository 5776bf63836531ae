"""`softsyn verify --locate`: where a compiled model's run on its GPU provider departs from the same model on the
CPU provider (Formality's failing-point diagnosis, by simulation).

verify compares outputs only. When the GPU run violates the budget, locate runs the compiled model twice more with
every intermediate value of the main graph as an extra output, on the target provider and on the CPU provider (its
CPU view where the model absorbed GPU-only prologues), with the same feeds, and walks the nodes in graph order: a
node whose output departs by more than the budget while every input it reads agrees is where the divergence starts
(a kernel, or a fused node's kernel, computing another function on that provider). The CPU run is the oracle
because verify checks the CPU run of the same compiled model against the fp32 reference in CI.

The extra outputs keep ONNX Runtime from fusing across them at load, so the nodes located are the compiled graph's
own; a divergence that appears only when ORT fuses at load shows as "no node departs on its own".
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


@dataclass(frozen=True)
class Located:
    scenario: str
    provider: str
    compared: int  # values compared (node outputs present in both runs)
    departures: tuple[Departure, ...]  # in graph order, at most SHOWN
    first_over: str | None  # the first value over the budget in graph order, whatever its inputs did


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
    with np.errstate(invalid="ignore"):  # equal infinities (an attention mask's -inf) agree
        diff = np.where(g == w, 0.0, np.abs(g - w))
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
    # copies: on the CPU a bound past is the array itself, and GroupQueryAttention writes the new tokens into it
    runner = BoundRunner.from_feeds(session, {k: v.copy() for k, v in feeds.items() if k in names}, provider, aliases)
    runner.run()
    # a sequence or optional value (a Scan's or an If's) is not compared: no array to hold
    return {o.name: v.numpy() for o, v in zip(session.get_outputs(), runner.binding.get_outputs()) if v.is_tensor()}


def both_runs(model_path: Path, feeds: dict, aliases: dict[str, str], provider: str):
    """({value: array} on `provider`, the same on the CPU provider) of the model at model_path with every node
    output probed; the probed copy lives beside the weights only while the sessions load."""
    model_path = Path(model_path)
    proto = onnx.load(str(model_path), load_external_data=False)
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


def departures(graph: onnx.GraphProto, errors: dict[str, float], budget: float) -> tuple[list[Departure], str | None]:
    """The nodes (graph order) whose worst output's error is over `budget` while every input they read is within
    it (a value not compared, a graph input or a weight, counts as agreeing), and the first value over it."""
    found, first_over = [], None
    for node in graph.node:
        outs = [(errors[o], o) for o in node.output if o in errors]
        if not outs:
            continue
        rel, worst = max(outs)
        if rel > budget and first_over is None:
            first_over = worst
        ins = max((errors.get(i, 0.0) for i in node.input if i), default=0.0)
        if rel > budget and ins <= budget:
            found.append(Departure(node.name, node.op_type, worst, rel, ins))
    return found, first_over


def locate(model_path: Path, scenario: str, feeds: dict, aliases: dict[str, str], provider: str,
           budget: float) -> Located:
    """Where the compiled model's run on `provider` departs from its CPU run on `feeds` (see the module doc)."""
    on_gpu, on_cpu = both_runs(model_path, feeds, aliases, provider)
    errors = {name: rel_error(on_gpu[name], on_cpu[name]) for name in on_gpu.keys() & on_cpu.keys()}
    graph = onnx.load(str(model_path), load_external_data=False).graph
    found, first_over = departures(graph, errors, budget)
    return Located(scenario, provider, len(errors), tuple(found[:SHOWN]), first_over)
