"""Which kernel runs an int4 or int8 cell in a CUDA torch package, measured on the device while the compile lowers the
design (TorchTarget.weight_kernel "measured"): torchao's layer (int4: tinygemm's layout; int8: Int8WeightOnlyConfig)
or softsyn's Triton kernel (softsyn.emit.triton_weights).

Why measured and per shape: neither wins everywhere. On the H100 (2026-12-06, 24 calls a graph) softsyn's first
kernel read the lm_head in 105 us against fp16's 205 and lost on the narrow q/k/v, o and down GEMVs, while its
fourth beat tinygemm 2.0-2.8x at every qwen3-0.6b shape (1.1-2.3x at qwen3-1.7b's, weights read cold); tinygemm ran
at fp16's speed at every decode shape. Which wins depends on the layer's widths, the precision and the card, so the compile times both forms of every distinct
quantised layer shape on the device the package is for, the way a step runs them (a chain of CALLS one-row calls
captured as a CUDA graph: a call replayed alone reads a ~10-14 us floor whatever its kernel), and builds the faster.
The chain rotates over distinct copies of the layer (cold_copies): a step reads each layer's weights once, from
device memory, while a chain of one layer's calls reads its weights from the L2 cache wherever they fit (every
qwen3-1.7b layer but the lm_head on an H100's 50 MB), which flatters the kernel that hides latency worst.
softsyn's kernel is timed at each of its tuned configs (softsyn.emit.triton_weights.tuned_configs) and the fastest
is pinned in the layer (a packed gate/up timed in its gated form, activation in the epilogue, as the lowering runs
it; torchao's form of it with the activation's kernel after it, as its package would run it): Triton's autotuner
times single launches, whose pick was 10-14 % behind the best config at four of five qwen3-1.7b shapes in a chain
(H200, 2026-12-06), and a pinned config is one AOTInductor compile a shape where an autotuned one is one per config.
fp8 (softsyn's kernel alone) has its config measured the same way. The times are compile-log lines;
runtime/torch.json names each layer's kernel.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from softsyn.emit.triton_weights import AUTOTUNED, config_name, tuned_configs
from softsyn.errors import SoftsynDefect
from softsyn.units import fmt_time

CHOICE_PRECISIONS = ("int4", "int8")  # the precisions both kernels build (fp8: softsyn's only)
CALLS = 24  # one-row calls a timed CUDA graph holds
BITS = {"int4": 4, "int8": 8, "fp8": 8}  # weight bits a code takes, per quantised precision
RUNS, WARMUP = 50, 5  # replays timed (the median taken), and replays before them


@dataclass(frozen=True)
class Pick:
    """A form a layer can run: a kernel ("softsyn" or "torchao"), and for softsyn's a tuned config's index (AUTOTUNED:
    none pinned)."""
    kernel: str
    config: int = AUTOTUNED

    def label(self, precision: str) -> str:
        return self.kernel if self.config == AUTOTUNED else f"{self.kernel} at {config_name(precision, self.config)}"


@dataclass(frozen=True)
class WeightShape:
    precision: str  # CHOICE_PRECISIONS
    width: int  # input features
    out: int  # output features
    block: int  # the cell's quantisation block (0: per channel); each kernel takes its nearest group
    gated: bool = False  # a packed gate/up, timed as softsyn's gated GEMV (activation in the epilogue) runs it

    def label(self) -> str:
        return f"{self.precision} {self.width}->{self.out} block {self.block}{' gated' if self.gated else ''}"

    def weight_bytes(self) -> int:
        """The bytes of the layer's codes (its scales left out: a lower bound, as cold_copies wants)."""
        return self.width * self.out * BITS[self.precision] // 8


def cold_copies(weight_bytes: int, cache_bytes: int, calls: int = CALLS) -> int:
    """How many distinct copies of a layer a chain of `calls` rotates over so that every call reads its weights from
    device memory, as a step does: enough that the others' weights between two calls of one copy fill the cache
    twice over (LRU-like eviction), at most one per call."""
    return max(1, min(calls, math.ceil(2 * cache_bytes / max(weight_bytes, 1)) + 1))


def cache_bytes(device: str) -> int:
    """The L2 cache of the current CUDA device, in bytes."""
    return torch.cuda.get_device_properties(torch.device(device)).L2_cache_size


def graph_of(fn: Callable[[], object], warm: int = 3) -> torch.cuda.CUDAGraph:
    """`fn` captured as a CUDA graph, after `warm` calls on a side stream (torch's CUDA-graph docs ask for that before
    a capture; the first calls also run Triton's autotuning and torchao's lazy state)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warm):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception:
        unmark_capture(torch.cuda.current_device())
        raise
    return graph


def unmark_capture(device: int) -> None:
    """Gives `device`'s default CUDA generator a fresh state of the same seed. A capture that fails ends before torch
    tells the generator it is over, and every later random draw on the device then fails ("Offset increment outside
    graph capture encountered unexpectedly"; Inductor's autotuning draws some): a failed candidate's capture ended the
    whole compile that way on the H100 (2026-12-07)."""
    generator = torch.cuda.default_generators[device]
    fresh = torch.Generator(device=f"cuda:{device}")
    fresh.manual_seed(generator.initial_seed())
    generator.graphsafe_set_state(fresh.graphsafe_get_state())


def replay_seconds(graph: torch.cuda.CUDAGraph, runs: int = RUNS, warmup: int = WARMUP) -> float:
    """The median seconds of one replay of `graph` over `runs` (after `warmup`), CUDA events around each."""
    times = []
    for run in range(warmup + runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if run >= warmup:
            times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def chain_seconds(layers: list[torch.nn.Module], width: int, dtype: torch.dtype, device: str) -> float:
    """Seconds a one-row call takes among CALLS captured in one CUDA graph (the median replay / CALLS), call i on
    layers[i % len(layers)]: distinct copies of one layer (cold_copies) keep its weights out of the cache."""
    rows = [torch.randn(1, width, device=device, dtype=dtype) for _ in range(CALLS)]
    with torch.no_grad():
        graph = graph_of(lambda: [layers[i % len(layers)](x) for i, x in enumerate(rows)])
    return replay_seconds(graph) / CALLS


Build = Callable[[Pick, torch.nn.Linear, "WeightShape"], torch.nn.Module]  # (form, a Linear, shape) -> its layer
Timer = Callable[[list[torch.nn.Module], int, torch.dtype, str], float]


def failure(exc: BaseException) -> str:
    """An exception in a log line's parentheses: its type and its first line, cut at 120 characters."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}"


def stop_if_faulted(what: str, exc: BaseException) -> None:
    """After `what` (a candidate being timed) failed with `exc`: where the device faulted (an illegal address and
    other sticky errors leave the process's CUDA context unusable, so every later CUDA call fails), stop the compile
    with a defect naming the candidate; else return, and the candidate loses as any failure does. Without it the
    fault surfaced at the next CUDA call elsewhere, naming that (H100, 2026-12-07: the attention choice's
    chain of an aliased cache, reported from the prologue check after the choice)."""
    if not torch.cuda.is_available():
        return
    try:
        torch.cuda.synchronize()
    except Exception as fault:  # noqa: BLE001 - torch reports a lost context as several types
        raise SoftsynDefect(f"{what}: the device faulted while it ran ({failure(exc)}); a CUDA context does not "
                            "recover from that, so the compile stops here (a defect in softsyn's kernels or in the "
                            "code the compiler made for them; --debug prints the trace)") from fault


def options(shape: WeightShape) -> list[Pick]:
    """The forms a shape is timed in: softsyn's kernel at each tuned config of its precision (autotuned where Triton
    lists none), then torchao's layer for the precisions both build."""
    softsyn = [Pick("softsyn", i) for i in range(len(tuned_configs(shape.precision)))] or [Pick("softsyn")]
    return softsyn + [Pick("torchao")] if shape.precision in CHOICE_PRECISIONS else softsyn


def fallback(order: list[Pick]) -> Pick:
    """A shape's form when none was timed: torchao's layer where it is offered (the default), else softsyn's kernel
    autotuned (fp8, whose build then says what failed)."""
    return Pick("torchao") if Pick("torchao") in order else Pick("softsyn")


def choose_weight_kernels(layers: dict[WeightShape, torch.nn.Linear], build: Build, dtype: torch.dtype, device: str,
                          timer: Timer = chain_seconds, cache: int | None = None,
                          forms: Callable[[WeightShape], list[Pick]] = options
                          ) -> tuple[dict[WeightShape, Pick], list[str]]:
    """{shape: the fastest of its `forms`} for one Linear of each quantised shape (`build` makes a form's layer from a
    copy of its weight, once per cold copy for a cache of `cache` bytes, the device's L2 unless given; the model's
    layer is untouched) on `device`, and the compile-log lines with every time. A form that fails to build or run
    here is a line and loses (a kernel failing at one config is not tried at the others); a shape no form runs keeps
    the fallback (the build then says why), as does every shape off CUDA (nothing to time)."""
    if device != "cuda":
        return {shape: fallback(forms(shape)) for shape in layers}, \
            ["weight kernels not measured (no CUDA device): torchao's (fp8: softsyn's, autotuned)"]
    cache = cache_bytes(device) if cache is None else cache
    chosen, notes = {}, []
    for shape, linear in layers.items():
        times, failed = {}, {}
        copies = cold_copies(shape.weight_bytes(), cache)
        order = forms(shape)
        for pick in order:
            if pick.kernel in failed:
                continue
            try:
                times[pick] = timer([build(pick, linear, shape) for _ in range(copies)], shape.width, dtype, "cuda")
            except Exception as exc:  # noqa: BLE001 - Triton, torchao and CUDA fail with many types; the form loses
                stop_if_faulted(f"weight kernel {pick.label(shape.precision)} for {shape.label()}", exc)
                failed[pick.kernel] = f"{pick.label(shape.precision)} did not run ({failure(exc)})"
        chosen[shape] = min(times, key=lambda p: (times[p], order.index(p))) if times else fallback(order)
        said = [f"{p.label(shape.precision)} {fmt_time(t, 'us', 1)}" for p, t in times.items()] + list(failed.values())
        notes.append(f"kernel for {shape.label()}: {chosen[shape].label(shape.precision)} ({', '.join(said)} a "
                     f"one-row call, {CALLS} calls a CUDA graph over {copies} copies, measured)")
        torch.cuda.empty_cache()  # the timed copies (an lm_head's is 0.3-0.6 GB) go before the next shape's
    return chosen, notes
