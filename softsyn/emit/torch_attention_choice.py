"""Which attention form a CUDA torch package's decode step runs, measured on the device while the compile lowers the
design (TorchTarget.attention "measured"): the matmul form (torch_attention_forms.matmul_attention: q k^T, an fp32
softmax, p v, each an Inductor or cuBLAS kernel) or softsyn's split kernels (softsyn.emit.triton_attention).

Why measured: the first split kernel lost to the matmul form at every decode shape (H100, 2026-12-06), the matmul
form's three kernels a layer took 522 us of qwen3-1.7b's 1.886 ms int4 step at past 4096, and which is faster depends
on the span, the heads and the card. So the compile times each form the way a step runs it, at each decode path
group's span: a chain of one call per layer over distinct caches (each layer's K and V read from device memory, not
the L2 cache; at most CALLS layers), compiled by torch.compile with dynamic shapes (as the package is exported) and
captured as one CUDA graph, and builds the form whose chains sum least over the decode groups. The times are
compile-log lines; runtime/torch.json's packages name each package's form.

With the model at hand the chains time a decoder layer's whole attention module (the packed QKV projection, the q/k
norms, rotary, the cache write, attention, the output projection) in each form, not the attention function alone:
so the fused prologue (softsyn.emit.torch_prologue: the norms, rotary and cache write in one kernel, with softsyn's
form) is one more candidate, timed against the others the same way, where the target measures it
(TorchTarget.fused_prologue "measured"). It packaged in session 17 but was never timed in a step, and what it saves
(four kernels a layer) is worth only what a step of them costs on the card.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from transformers.cache_utils import Cache

from softsyn.emit.torch_kernel_choice import (CALLS, cache_bytes, cold_copies, failure, graph_of, replay_seconds,
                                              stop_if_faulted)
from softsyn.emit.torch_prologue import fused_form, packed_qkv, unfusable
from softsyn.emit.torch_attention_forms import ATTENTIONS, attention_implementation
from softsyn.emit.torch_step import BufferLayer, example_span, rotary_embedding
from softsyn.frontends.export import kv_geometry
from softsyn.runtime.torch_package import attended_span
from softsyn.units import fmt_time

MEASURED_FORM = "measured"  # TorchTarget.attention: choose among FORMS on the device
FORMS = ("matmul", "softsyn")  # the decode forms a measured choice compares (the first wins a tie, and off CUDA)


@dataclass(frozen=True)
class AttentionShape:
    """One decode step's attention in one layer: a batch of one query position per head against `span` cache slots."""
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    span: int
    length: int = 0  # the cache's slots: the step reads the span as a view of it (0: the span)

    def label(self) -> str:
        return (f"batch {self.batch}, {self.heads}/{self.kv_heads} heads of {self.head_dim}, span {self.span}")

    def kv_bytes(self, itemsize: int) -> int:
        return 2 * self.batch * self.kv_heads * self.span * self.head_dim * itemsize


def decode_shapes(groups, config, max_length: int) -> list[AttentionShape]:
    """The distinct attention shapes of the path groups that decode (seq 1) within the cache: `groups`, the
    analysis' (each with scenario.dims); `config`, the model's."""
    heads = config.num_attention_heads
    _, kv_heads, head_dim = kv_geometry(config)
    shapes = []
    for group in groups:
        dims = group.scenario.dims
        end = dims.get("past", 0) + 1
        if dims.get("seq", 1) == 1 and end <= max_length:
            shape = AttentionShape(dims.get("batch", 1), heads, kv_heads, head_dim, attended_span(end, max_length),
                                   max_length)
            shapes += [shape] if shape not in shapes else []
    return shapes


@dataclass(frozen=True)
class Candidate:
    """A decode attention the choice times: a form of ATTENTIONS, with the fused prologue (softsyn's form only),
    which returns the step's rows for index_copy_ or (`writes_cache`) writes the cache and attends in one op, that
    op's combine (`folded`) in its split kernel."""
    form: str
    prologue: bool = False
    writes_cache: bool = False
    folded: bool = False

    @property
    def label(self) -> str:
        if not self.prologue:
            return self.form
        return (f"{self.form} + fused prologue{' writing the cache' if self.writes_cache else ''}"
                f"{', combine folded' if self.folded else ''}")


PLAIN = tuple(Candidate(form) for form in FORMS)  # the candidates without the prologue, FORMS' order
PROLOGUE = Candidate("softsyn", prologue=True)
PROLOGUE_WRITING = Candidate("softsyn", prologue=True, writes_cache=True)  # softsyn::attention_step
PROLOGUE_FOLDED = Candidate("softsyn", prologue=True, writes_cache=True, folded=True)  # its combine in attend
PROLOGUES = (PROLOGUE, PROLOGUE_WRITING, PROLOGUE_FOLDED)
Timer = Callable[[Candidate, AttentionShape, torch.dtype, str], float]


def core_seconds(candidate: Candidate, shape: AttentionShape, dtype: torch.dtype, device: str) -> float:
    """Seconds one layer's attention function in `candidate`'s form takes among CALLS in one CUDA graph (chain_graph):
    the timer where no attention module is at hand."""
    return replay_seconds(chain_graph(candidate.form, shape, dtype, device)) / CALLS


def chain_graph(form: str, shape: AttentionShape, dtype: torch.dtype, device: str,
                calls: int = CALLS) -> torch.cuda.CUDAGraph:
    """`calls` layers' attention function in `form` captured as one CUDA graph, call i over cache copy i % copies
    (cold_caches), compiled with dynamic shapes; bench/torch_kernels.py's attnchain times the same graph."""
    function = ATTENTIONS[form][1]
    step = torch.compile(lambda q, k, v, m: function(None, q, k, v, m, shape.head_dim ** -0.5)[0], dynamic=True)
    caches = [tuple(t[:, :, :shape.span] for t in c) for c in cold_caches(shape, dtype, device, calls)]  # span views
    queries = [torch.randn(shape.batch, shape.heads, 1, shape.head_dim, device=device, dtype=dtype)
               for _ in range(calls)]
    # [B, 1, 1, S] as the step builds it (the last slot unfilled, as in a span rounded up)
    mask = (torch.arange(shape.span, device=device) < shape.span - 1).expand(shape.batch, 1, 1, shape.span)
    with torch.no_grad():
        return graph_of(lambda: [step(q, *caches[i % len(caches)], mask) for i, q in enumerate(queries)])


def cold_caches(shape: AttentionShape, dtype: torch.dtype, device: str, calls: int) -> list[tuple[torch.Tensor, ...]]:
    """Cold copies (each layer's K and V read from device memory) of a whole cache: (keys, values), each
    [B, Hkv, length, D] and its own allocation, as the runtime gives a package each layer's two (runtime.torch_package:
    empty_cache). A chain reads a view of each one's first `span` slots, as the step reads its span: the matmul form's
    cuBLAS kernels then run strided batches (contiguous caches of the span alone timed that form at 13.1 us a layer
    at 768 slots, where the bench's chains over views took 10.9, and the compile chose the other form; H100,
    2026-12-06). Why not one [2, ...] tensor: keys and values that are views of one storage are aliased inputs, and a
    step that mutates both made Inductor copy the whole base (8.5 M values at qwen3-1.7b's 4160 slots) before the op
    that wrote them, and the chains of softsyn::attention_step fail with an illegal address there (H100,
    2026-12-07 16:40): the chains of 2026-12-07 10:22 timed the cache-writing prologue ~18 us a layer slow for it."""
    copies = cold_copies(shape.kv_bytes(torch.finfo(dtype).bits // 8), cache_bytes(device), calls)
    return [tuple(torch.randn(shape.batch, shape.kv_heads, max(shape.length, shape.span), shape.head_dim,
                              device=device, dtype=dtype) for _ in range(2)) for _ in range(copies)]


def module_step(module: torch.nn.Module, rotary: torch.nn.Module, candidate: Candidate, shape: AttentionShape,
                caches: list[tuple[torch.Tensor, ...]], calls: int = CALLS) -> tuple[Callable, list[tuple]]:
    """One decode step of the attention `module` (the prologue fused where `candidate` says), a function of (x, keys,
    values, where, mask, cos, sin), and the arguments of each of `calls` calls: call i writes its key and value into
    caches[i % len(caches)] (whole caches: (keys, values), each [B, Hkv, length, D]) at slot `where` (span - 2) and
    attends over their first `span` slots, the mask's last dim, so one package serves every span (packaged_step).
    Every call runs the one module, so its projections read their weights from the L2 cache where they fit: the same
    for every candidate, which differ in what runs between the projections."""
    chosen = (fused_form(module, writes_cache=candidate.writes_cache, folded=candidate.folded) if candidate.prologue
              else module)
    like = caches[0][0]
    where = torch.tensor([shape.span - 2], device=like.device)
    mask = (torch.arange(shape.span, device=like.device) <= where[0]).expand(shape.batch, 1, 1, shape.span).contiguous()
    rows = [torch.randn(shape.batch, 1, module.config.hidden_size, device=like.device, dtype=like.dtype)
            for _ in range(calls)]
    cos, sin = rotary(rows[0], where.expand(shape.batch, 1))

    def one(x, keys, values, where, mask, cos, sin):
        layer = BufferLayer(keys, values, where, mask.shape[-1])
        return chosen(hidden_states=x, position_embeddings=(cos, sin), attention_mask=mask,
                      position_ids=where.expand(x.shape[0], 1), cache=Cache(layers=[layer] * (module.layer_idx + 1)),
                      use_cache=True)[0]

    return one, [(x, *caches[i % len(caches)], where, mask, cos, sin) for i, x in enumerate(rows)]


def module_timer(module: torch.nn.Module, rotary: torch.nn.Module, packaged: bool = False) -> Timer:
    """A Timer of `module`'s chains (module_step's calls) in each candidate, captured as one CUDA graph: the step
    compiled by torch.compile with dynamic shapes, or where `packaged` built as the package is, by torch.export and
    AOTInductor (packaged_step), each call the loaded package's: one package a candidate, its span dynamic and traced
    at the package's example span, so it serves every decode group and its kernels are tuned as model.pt2's are (one
    static package per candidate and span took 78 s of a compile for two spans, H100, 2026-12-07). The packaged form
    is for a candidate torch.compile fails on: torch 2.11's Inductor failed every chain holding softsyn's Triton ops
    (`KeyError: 'op14'`; an AssertionError in decompose_triton_kernel_wrapper_functional, a check torch 2.13 dropped)
    while AOTInductor packaged the same ops (H100, 2026-12-07)."""
    packages: dict[tuple, Callable] = {}  # (candidate, batch, length): its loaded package
    folder = tempfile.TemporaryDirectory() if packaged else None  # the packages' files, kept while the timer lives

    def step_of(candidate: Candidate, shape: AttentionShape, one: Callable, caches: list[torch.Tensor]) -> Callable:
        if not packaged:
            return torch.compile(one, dynamic=True)
        key = (candidate, shape.batch, shape.length)
        if key not in packages:
            traced = replace(shape, span=example_span(max(shape.length, shape.span)))
            example = module_step(module, rotary, candidate, traced, caches, calls=1)[1][0]
            packages[key] = packaged_step(module, one, example, Path(folder.name) / f"chain-{len(packages)}.pt2")
        return packages[key]

    def seconds(candidate: Candidate, shape: AttentionShape, dtype: torch.dtype, device: str) -> float:
        caches = cold_caches(shape, dtype, device, CALLS)
        with attention_implementation(module, ATTENTIONS[candidate.form][0]), torch.no_grad():
            one, calls = module_step(module, rotary, candidate, shape, caches)
            step = step_of(candidate, shape, one, caches)
            return replay_seconds(graph_of(lambda: [step(*args) for args in calls])) / CALLS
    return seconds


class _Step(torch.nn.Module):
    """A module_step as a module (torch.export takes modules): the attention module's state, the step its forward."""

    def __init__(self, module: torch.nn.Module, one: Callable):
        super().__init__()
        self.module, self.one = module, one

    def forward(self, x, keys, values, where, mask, cos, sin):
        return self.one(x=x, keys=keys, values=values, where=where, mask=mask, cos=cos, sin=sin)


def packaged_step(module: torch.nn.Module, one: Callable, example: tuple, path: Path) -> Callable:
    """`one` (a module_step of `module`) exported at `example`, the span (the mask's last dim) dynamic and every other
    size static, compiled by AOTInductor into `path` and loaded: called as `one` is, at any span up to the cache's
    length, it writes the cache it is given in place as `one` does. Loaded single-threaded, as the runtime's
    CUDA-graph runner loads model.pt2: a multi-threaded package queries an event of its previous run before each
    call, which a stream capture of several calls forbids ("operation not permitted when stream is capturing", H100,
    2026-12-07)."""
    span = (None, None, None, None, {3: torch.export.Dim.AUTO}, None, None)
    program = torch.export.export(_Step(module, one), example, dynamic_shapes=span, strict=False)
    return torch._inductor.aoti_load_package(torch._inductor.aoti_compile_and_package(program, package_path=str(path)),
                                             run_single_threaded=True)


class Timing(NamedTuple):
    """How a model's decode attention choice is timed (attention_timing)."""
    timer: Timer
    candidates: tuple[Candidate, ...]
    what: str  # what a chain call runs, for the log
    fallback: Timer | None  # times PLAIN's forms where no candidate ran (None: nothing else to try)
    packaged: Timer | None = None  # times every candidate as AOTInductor packages where `timer` fails on one


def attention_timing(model: torch.nn.Module, prologue: bool) -> Timing:
    """How `model`'s decode attention choice is timed: its first packed-QKV attention module's chains, the fused
    prologue a candidate where `prologue` asks and the kernels take that module, the attention function's chains
    where none of those runs; the function's chains alone where no such module is found."""
    module = next((m for m in model.modules() if packed_qkv(m) is not None), None)
    rotary = rotary_embedding(model)
    if module is None or rotary is None:
        return Timing(core_seconds, PLAIN, "the attention function", None)
    offered = prologue and unfusable(module, packed_qkv(module)) is None
    return Timing(module_timer(module, rotary), PLAIN + (PROLOGUES if offered else ()), "a layer's attention module",
                  core_seconds, module_timer(module, rotary, packaged=True))


def choose_attention(shapes: list[AttentionShape], dtype: torch.dtype, device: str, timer: Timer = core_seconds,
                     candidates: tuple[Candidate, ...] = PLAIN, fallback: Timer | None = None,
                     packaged: Timer | None = None) -> tuple[Candidate, list[str]]:
    """The candidate whose decode chains sum least over `shapes` on `device`, and the compile-log lines with every
    time. Where `timer` fails on a candidate, every candidate is timed by `packaged` (if given; timed_chains); one
    that fails is a line and loses; where none runs, the forms of PLAIN timed by `fallback` (if given); off CUDA,
    or with no decode group, or where still none runs, the first, saying why."""
    first = candidates[0]
    if device != "cuda" or not shapes:
        why = "no CUDA device" if device != "cuda" else "no decode path group"
        return first, [f"decode attention not measured ({why}): {first.label}"]
    totals, lines = timed_chains(shapes, dtype, device, timer, candidates, packaged)
    if not totals and fallback is not None:
        candidates = PLAIN
        totals, more = timed_chains(shapes, dtype, device, fallback, candidates)
        lines += ["decode attention: no candidate ran; each form's attention function timed instead", *more]
    chosen = min(totals, key=lambda c: (totals[c], candidates.index(c))) if totals else first
    fastest = "the fastest of " + ", ".join(c.label for c in totals) if totals else "none ran"
    return chosen, [f"decode attention: {chosen.label} ({fastest})", *lines]


def timed_chains(shapes, dtype, device, timer: Timer, candidates,
                 packaged: Timer | None = None) -> tuple[dict[Candidate, float], list[str]]:
    """({candidate: its chains' seconds summed over `shapes`} for those that ran, a log line for each): each
    candidate's chains by `timer`; where that fails on any and `packaged` is given, every candidate's by `packaged`
    instead, like for like: a package is compiled whole with static shapes, torch.compile's chain with dynamic ones,
    and the first H100 run that mixed the two chose a form 1.4 % slower over the decode groups (2026-12-07). So with
    `packaged`, the candidates holding softsyn's Triton ops are timed first and the pass stops at the first failure:
    the chains timed before it would be timed again as packages (torch 2.11's pass, matmul's chains compiled first,
    took ~100 s of a 220 s choice, H100 2026-12-07)."""
    # one failure packages them all: the candidates torch.compile may fail on go first
    first = sorted(candidates, key=lambda c: not holds_triton_ops(c)) if packaged is not None else candidates
    totals, lines, failed = time_each(timer, first, shapes, dtype, device, say_failures=packaged is None,
                                      stop_on_failure=packaged is not None)
    if not failed or packaged is None:
        return totals, lines
    labels = ", ".join(f"{c.label} ({failure(exc)})" for c, exc in failed.items())
    lines.append(f"decode attention: torch.compile failed on {labels}: every candidate timed as AOTInductor packages")
    totals, more, _ = time_each(packaged, candidates, shapes, dtype, device, as_packages=True)
    return totals, lines + more


def holds_triton_ops(candidate: Candidate) -> bool:
    """Whether `candidate`'s chain holds softsyn's Triton ops (its split kernels or the fused prologue), which torch
    2.11's torch.compile failed on (module_timer)."""
    return candidate.form == "softsyn" or candidate.prologue


def time_each(timer: Timer, candidates, shapes, dtype, device, say_failures: bool = True,
              as_packages: bool = False,
              stop_on_failure: bool = False) -> tuple[dict[Candidate, float], list[str], dict[Candidate, Exception]]:
    """timed_chains' one pass: ({candidate: seconds summed over `shapes`} for those that ran, their log lines (and
    the failures' where `say_failures`), {candidate: why it failed}); `as_packages`: the lines say so, and how long
    each candidate's packages took to build and time; `stop_on_failure`: none timed after the first that fails."""
    totals, lines, failed = {}, [], {}
    for candidate in candidates:
        started = time.perf_counter()
        try:
            times = chain_times(timer, candidate, shapes, dtype, device)
        except Exception as exc:  # noqa: BLE001 - Triton, Inductor and CUDA fail with many types; the form loses
            stop_if_faulted(f"decode attention candidate {candidate.label}", exc)
            failed[candidate] = exc
            if say_failures:
                how = ", as AOTInductor packages" if as_packages else ""
                lines.append(f"decode attention {candidate.label}{how}: did not run ({failure(exc)})")
            if stop_on_failure:
                break
            continue
        totals[candidate] = sum(times)
        how = f"; as AOTInductor packages, built in {time.perf_counter() - started:.0f} s" if as_packages else ""
        lines.append(chain_line(candidate, times, shapes, how))
    return totals, lines, failed


def chain_line(candidate: Candidate, times: list[float], shapes, how: str) -> str:
    """The compile-log line of `candidate`'s chain times at `shapes`, `how` they were built appended."""
    return (f"decode attention {candidate.label}: "
            + ", ".join(f"{fmt_time(t, 'us', 1)} a layer at {shape.label()}" for t, shape in zip(times, shapes))
            + f" ({CALLS} calls a CUDA graph, measured{how})")


def chain_times(timer: Timer, candidate: Candidate, shapes, dtype, device) -> list[float]:
    """`timer`'s seconds for `candidate` at each of `shapes`, dynamo's compiled chains dropped after (each candidate's
    go before the next one's)."""
    try:
        return [timer(candidate, shape, dtype, device) for shape in shapes]
    finally:
        torch._dynamo.reset()
