"""A torch package's kernels seen by torch.profiler over a few steps (issue 28's macro cells are characterised from it).

On CUDA the profiler sees every kernel through CUPTI (also those a CUDA graph replays), named by Inductor (triton_...)
or by the library an extern call launches (cuBLAS's nvjet_...): softsyn.runtime.torch_provenance.attribute matches the
library kernels to extern calls by order. On the CPU AOTInductor's kernels are compiled C++ the profiler does not see
into, unless the package was compiled with RECORD_CONFIG (Inductor's cpp.enable_kernel_profile): then every generated
kernel runs inside a RecordFunction of its name ("graph_0_cpp_fused_..._0") and every extern call inside one named
by its shim function ("aoti_torch_cpu_addmm_out"), so each record names its own call (`named`: attributed by name,
never by order). Tested on torch 2.13's CPU build (2026-12-06); a package compiled without it shows no records.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from softsyn.runtime.torch_provenance import EXTERN_PREFIX, GENERATED

RECORD_CONFIG = {"cpp.enable_kernel_profile": True}  # inductor_configs for a CPU package: its kernels as records
GRAPH_PREFIX = re.compile(r"^graph_\d+_")  # Inductor prefixes a record's kernel name with its graph's id


@dataclass(frozen=True)
class Profile:
    """Kernels of `steps` steps in launch order, (name, seconds) each; `named`: each kernel is a record named by its
    own call (the CPU's records), not a library kernel to place by order (CUDA)."""
    kernels: tuple[tuple[str, float], ...]
    steps: int
    named: bool


def record_config(device: str) -> dict:
    """The inductor_configs that make a package's kernels visible to torch.profiler on `device` ({} on CUDA, which
    CUPTI sees without them)."""
    return dict(RECORD_CONFIG) if device == "cpu" else {}


def strip_stack_traces(program) -> None:
    """Drop the Python stack traces from an exported program's nodes (their module stacks stay, which the provenance
    map reads). With RECORD_CONFIG every kernel call is wrapped in a KernelContextGuard that parses its kernel's
    stack traces on each call: qwen3-tiny's decode step took 0.78 ms with them against 0.25 without records
    (interleaved medians, 2 shared cores, 2026-12-06)."""
    for node in program.graph.nodes:
        node.meta.pop("stack_trace", None)


def profile_step(step, dims: dict, steps: int) -> Profile:
    """`steps` steps of `step` (a softsyn.runtime.torch_package.TorchStep) at `dims` under torch.profiler, after one
    untimed step (a CUDA graph captured, caches warm)."""
    step.time_steps(dims, 1)
    cuda = step.device == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        step.time_steps(dims, steps)
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    if cuda:
        return Profile(tuple((e.name, e.device_time * 1e-6) for e in events
                             if e.device_type == torch.autograd.DeviceType.CUDA), steps, named=False)
    return Profile(tuple(cpu_records((e.name, e.cpu_time_total * 1e-6) for e in events)), steps, named=True)


def cpu_records(events) -> list[tuple[str, float]]:
    """The package's own records among a CPU profile's (name, seconds) events, their graph prefix dropped: generated
    kernels and extern calls; the ATen ops an extern call runs inside its record are in its time, not listed."""
    out = []
    for name, seconds in events:
        name = GRAPH_PREFIX.sub("", name)
        if name.startswith(GENERATED) or name.startswith(EXTERN_PREFIX):
            out.append((name, seconds))
    return out
