"""Which attention form a CUDA torch package's decode step runs, measured on the device while the compile lowers the
design (TorchTarget.attention "measured"): the matmul form (softsyn.emit.torch_step.matmul_attention: q k^T, an fp32
softmax, p v, each an Inductor or cuBLAS kernel) or softsyn's split kernels (softsyn.emit.triton_attention).

Why measured: the first split kernel lost to the matmul form at every decode shape (H100, 2026-12-06), the matmul
form's three kernels a layer took 522 us of qwen3-1.7b's 1.886 ms int4 step at past 4096, and which is faster depends
on the span, the heads and the card. So the compile times each form the way a step runs it, at each decode path
group's span: a chain of one call per layer over distinct caches (each layer's K and V read from device memory, not
the L2 cache; at most CALLS layers), compiled by torch.compile with dynamic shapes (as the package is exported) and
captured as one CUDA graph, and builds the form whose chains sum least over the decode groups. The times are
compile-log lines; runtime/torch.json's packages name each package's form.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from softsyn.emit.torch_kernel_choice import CALLS, cache_bytes, cold_copies, graph_of, replay_seconds
from softsyn.emit.torch_step import ATTENTIONS
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


def chain_seconds(form: str, shape: AttentionShape, dtype: torch.dtype, device: str) -> float:
    """Seconds one layer's attention in `form` takes among CALLS in one CUDA graph (chain_graph)."""
    return replay_seconds(chain_graph(form, shape, dtype, device)) / CALLS


def chain_graph(form: str, shape: AttentionShape, dtype: torch.dtype, device: str,
                calls: int = CALLS) -> torch.cuda.CUDAGraph:
    """`calls` layers' attention in `form` captured as one CUDA graph, call i over cache copy i % copies
    (cold_copies: each layer's K and V read from device memory), compiled with dynamic shapes; the compile's choice
    and bench/torch_kernels.py's attnchain time the same graph."""
    function = ATTENTIONS[form][1]
    step = torch.compile(lambda q, k, v, m: function(None, q, k, v, m, shape.head_dim ** -0.5)[0], dynamic=True)
    copies = cold_copies(shape.kv_bytes(torch.finfo(dtype).bits // 8), cache_bytes(device), calls)
    # views of a cache of `length` slots, as the step reads its span (the matmul form's cuBLAS kernels then run
    # strided batches): contiguous caches of the span alone timed that form at 13.1 us a layer at 768 slots, where
    # the bench's chains over views took 10.9, and the compile chose the other form (H100, 2026-12-06)
    caches = [torch.randn(2, shape.batch, shape.kv_heads, max(shape.length, shape.span), shape.head_dim,
                          device=device, dtype=dtype)[:, :, :, :shape.span] for _ in range(copies)]
    queries = [torch.randn(shape.batch, shape.heads, 1, shape.head_dim, device=device, dtype=dtype)
               for _ in range(calls)]
    # [B, 1, 1, S] as the step builds it (the last slot unfilled, as in a span rounded up)
    mask = (torch.arange(shape.span, device=device) < shape.span - 1).expand(shape.batch, 1, 1, shape.span)
    with torch.no_grad():
        return graph_of(lambda: [step(q, *caches[i % copies], mask) for i, q in enumerate(queries)])


Timer = Callable[[str, AttentionShape, torch.dtype, str], float]


def choose_attention(shapes: list[AttentionShape], dtype: torch.dtype, device: str,
                     timer: Timer = chain_seconds) -> tuple[str, list[str]]:
    """The form of FORMS whose decode chains sum least over `shapes` on `device`, and the compile-log lines with
    every time. A form that fails to compile or run here is a line and loses; off CUDA, or with no decode group, or
    where no form runs, the first form, saying why."""
    if device != "cuda" or not shapes:
        why = "no CUDA device" if device != "cuda" else "no decode path group"
        return FORMS[0], [f"decode attention not measured ({why}): {FORMS[0]}"]
    totals, lines = {}, []
    for form in FORMS:
        try:
            times = [timer(form, shape, dtype, device) for shape in shapes]
        except Exception as exc:  # noqa: BLE001 - Triton, Inductor and CUDA fail with many types; the form loses
            first = (str(exc).splitlines() or [""])[0][:120]
            lines.append(f"decode attention {form}: did not run ({type(exc).__name__}: {first})")
            continue
        finally:
            torch._dynamo.reset()  # each form's compiled chains go before the next form's
        totals[form] = sum(times)
        lines.append(f"decode attention {form}: " + ", ".join(
            f"{fmt_time(t, 'us', 1)} a layer at {shape.label()}" for t, shape in zip(times, shapes))
            + f" ({CALLS} calls a CUDA graph, measured)")
    chosen = min(totals, key=lambda f: (totals[f], FORMS.index(f))) if totals else FORMS[0]
    return chosen, [f"decode attention: {chosen} ({'the fastest of ' + ', '.join(totals) if totals else 'no form ran'})",
                    *lines]
