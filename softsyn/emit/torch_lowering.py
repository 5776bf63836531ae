"""A torch target's lowering (softsyn.library.torch_targets): the source model as one decoder step over a static KV
cache, exported with torch.export and compiled by AOTInductor into DIR/model.pt2, with DIR/runtime/torch.json, then
measured at every path group's dims.

The cache tensors are the step's inputs and it writes its keys and values into them in place (as a static cache
under torch.compile does; softsyn.runtime.torch_package says the signature), then attends over the cache's first S
slots (an input, the filled prefix rounded up: the runner's spans) under a 4-D mask: a slot is visible when it is at
or before the query's position. So one package
with dynamic batch and `seq` serves prefill and decode, its fixed-shape steps can be replayed as CUDA graphs (the
buffers keep their addresses), and it computes the function the ONNX export does (the same model object, built by
softsyn.frontends.source_torch_model: same config, seed, weights). The step model itself (attention, packed
projections, casts, torchao's int8 layers) is softsyn.emit.torch_step. Precision: the target's dtype for activations
and cache (fp32 on cpu-torch, fp16 on h200-torch), the compile loop's int8 (and on CUDA int4) cells as weight-only
layers.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from softsyn import progress
from softsyn.constraints.model import shared_buffer_length
from softsyn.emit.session import write_json
from softsyn.emit.torch_step import (ATTENTIONS, StaticStep, cast_parameters, pack_projections, quantise_modules,
                                     weight_map)
from softsyn.errors import SoftsynError
from softsyn.frontends import source_torch_model
from softsyn.frontends.export import kv_geometry, quiet, torch_num_threads
from softsyn.frontends.hf_common import brief
from softsyn.library.torch_targets import torch_target
from softsyn.results.files import write_atomic
from softsyn.runtime.artifact import TORCH_FILE, TORCH_PACKAGE
from softsyn.runtime.torch_package import FORMAT, SPAN_STEP, TorchStep
from softsyn.runtime.torch_provenance import KERNELS_FILE, PROVENANCE_CONFIG, calls_data, kernel_calls
from softsyn.units import fmt_time

MEASURED_RUNS = 10  # steps timed per path group (after 2 untimed): the median is written
MEASURED = "torch package, measured"  # the label every measured number carries
ESTIMATED = "est"  # and every number the ORT library predicts


SPAN_HINT = 1024  # the example span torch.export traces: AOTInductor tunes each kernel over a dynamic dim for its
# example size, so a softmax traced over 7 slots looped 8 at a time: 136 us a layer at 4096 on the H200 (2026-12-03)


def export_step(step: StaticStep, cfg, max_length: int, device: str, dtype: torch.dtype):
    """torch.export of the step at batch 2, seq 3 over SPAN_HINT slots (below max_length; sizes > 1 and distinct so
    none is specialised), the three dims dynamic. The example sizes are the hints Inductor tunes its kernels for."""
    layers, kv, head_dim = kv_geometry(cfg)
    g = torch.Generator().manual_seed(0)
    span = max(4, min(SPAN_HINT, max_length - 1))
    ids = torch.randint(0, cfg.vocab_size, (2, 3), generator=g).to(device)
    positions = torch.arange(span - 3, span).expand(2, 3).contiguous().to(device)
    slots = torch.arange(span, device=device)
    cache = tuple(torch.zeros(2, kv, max_length, head_dim, dtype=dtype, device=device) for _ in range(2 * layers))
    auto = torch.export.Dim.AUTO  # a named Dim fails on guards transformers' mask code makes (true for seq >= 0)
    shapes = {"input_ids": {0: auto, 1: auto}, "position_ids": {0: auto, 1: auto}, "slots": {0: auto},
              "kv": tuple({0: auto} for _ in cache)}
    with quiet(), torch.no_grad():
        return torch.export.export(step, (ids, positions, slots, *cache), dynamic_shapes=shapes, strict=False)


def device_problem(name: str) -> str | None:
    """Why torch target `name` cannot be compiled on this machine, None when it can."""
    target = torch_target(name)
    if target.device == "cuda" and not torch.cuda.is_available():
        return (f"target {target.name} compiles a CUDA package and torch sees no CUDA device here "
                "(torch.cuda.is_available() is False); compile on the GPU machine, or use target cpu-torch")
    return None


def lower(design, reference: dict, folder: Path, notes: list[str]) -> list[str]:
    """Write DIR/model.pt2 and DIR/runtime/torch.json into `folder` and the measured step per group into `notes`;
    the files written (relative)."""
    source = str(reference.get("source", ""))
    target = torch_target(design.torch_target)
    cfg_max, _ = shared_buffer_length(design.constraints)
    torch_num_threads()
    with progress.step(f"emit: building {source} in torch ({target.dtype}, the weights of the design's export)",
                       enabled=design.progress, done="emit: source model built"):
        model = source_torch_model(source, design.cache_dir)
    if "sliding_attention" in (getattr(model.config, "layer_types", None) or []):  # the 4-D mask has no window
        raise SoftsynError(f"{source}: {design.torch_target} does not lower sliding-window attention yet (the step's "
                           "mask covers the whole cache); valid: a decoder of full-attention layers (qwen3, llama)")
    dtype = getattr(torch, target.dtype)
    cast_parameters(model.to(device=target.device).eval(), dtype)
    model.set_attn_implementation(ATTENTIONS[target.attention][0])
    packed = pack_projections(model)
    cells = weight_map(design)
    weight_notes = quantise_modules(model, cells, target.float_precision, target.weights)
    layers, kv, head_dim = kv_geometry(model.config)
    vocab = int(model.config.vocab_size)
    t0 = time.perf_counter()
    try:
        with progress.step(f"emit: torch.export of {design.netlist.name}'s step ({target.dtype} on {target.device}, "
                           f"static KV cache of {cfg_max})", enabled=design.progress, done="emit: step exported"):
            program = export_step(StaticStep(model, cfg_max).eval(), model.config, cfg_max, target.device, dtype)
        del model  # the program holds the weights; a 1.7B model would otherwise sit twice in device memory
        with progress.step("emit: AOTInductor compiling the step into model.pt2 (tens of seconds; minutes on a GPU)",
                           enabled=design.progress, done="emit: model.pt2 written"):
            torch._inductor.aoti_compile_and_package(program, package_path=str(folder / TORCH_PACKAGE),
                                                     inductor_configs=PROVENANCE_CONFIG)
        calls = kernel_calls(folder / TORCH_PACKAGE, program)
    except SoftsynError:
        raise
    except Exception as exc:  # torch.export and Inductor fail with many types; the innermost cause says what
        raise SoftsynError(f"{source}: lowering {design.netlist.name} for {design.torch_target} failed: "
                           f"{brief(exc)}") from exc
    lowered_s = time.perf_counter() - t0
    write_json(folder / KERNELS_FILE, calls_data(calls))
    settings = {
        "format": FORMAT, "target": design.torch_target, "package": TORCH_PACKAGE, "device": target.device,
        "loader": "torch._inductor.aoti_load_package(package)(input_ids, position_ids, slots, *kv) -> logits; kv "
                  "written in place; slots = arange(S), the cache slots attention reads (last position < S <= "
                  "max_length)",
        "inputs": {"input_ids": ["batch", "seq", "int64"], "position_ids": ["batch", "seq", "int64"],
                   "slots": ["span", "int64"]},
        "outputs": {"logits": ["batch", "seq", "vocab_size", target.dtype]},
        "kv_cache": {"layers": layers, "kv_heads": kv, "head_dim": head_dim, "max_length": cfg_max,
                     "layout": "per layer key then value, [batch, kv_heads, max_length, head_dim]; inputs after "
                               "position_ids, the step's keys and values written into them at its positions"},
        "dtype": target.dtype, "cuda_graphs": target.device == "cuda", "vocab_size": vocab, "kernels": KERNELS_FILE,
        "weights": {name: {"precision": c.precision, "block": c.block} for name, c in sorted(cells.items())
                    if c.precision in target.weights},
        "scenarios": {g.name: {"dims": g.scenario.dims} for g in design.groups},
        "reference": reference,
        "accuracy": {"max_rel_error": design.constraints.accuracy.max_rel_error,
                     "min_top1": design.constraints.accuracy.min_top1},
    }
    write_json(folder / TORCH_FILE, settings)
    notes += [f"target {design.torch_target}: {TORCH_PACKAGE} is the step lowered by torch.export + AOTInductor "
              f"({lowered_s:.1f} s; static KV cache of {cfg_max} positions, {target.attention} attention over its "
              f"filled prefix in spans of {SPAN_STEP}; {packed} projection groups packed: QKV, gate/up); {target.dtype} "
              "activations and cache",
              f"target {design.torch_target}: {KERNELS_FILE}: {len(calls)} kernel calls, "
              f"{sum(1 for c in calls if c.modules)} mapped to source modules (Inductor's provenance)",
              *(f"target {design.torch_target}: {line}" for line in weight_notes or ["weights "
                f"{target.float_precision} (the compile's map quantised none)"]),
              f"target {design.torch_target}: the slack above is the {design.library.name} library's estimate ({ESTIMATED}) "
              "of the same function on the ONNX netlist; the package is measured below"]
    notes += measured_notes(design, folder, settings)
    return [TORCH_PACKAGE, TORCH_FILE, KERNELS_FILE]


def measured_notes(design, folder: Path, settings: dict) -> list[str]:
    """Per path group: the package's step (median of MEASURED_RUNS), beside the library's estimate."""
    step = TorchStep(folder, settings)
    analysis = design.analyze()
    lines = []
    with progress.step("emit: measuring model.pt2 at every path group's dims", enabled=design.progress,
                       done="emit: model.pt2 measured"):
        for group in analysis.groups:
            dims = group.scenario.dims
            if dims.get("past", 0) + dims.get("seq", 1) > step.max_length:
                lines.append(f"{group.name}: not measured (past + seq exceed the KV cache of {step.max_length})")
                continue
            seconds = step.measure(dims, runs=MEASURED_RUNS)
            est = group.critical.arrival - group.critical.input_delay
            lines.append(f"{group.name} ({', '.join(f'{k} {v}' for k, v in dims.items())}): {fmt_time(seconds)} "
                         f"({MEASURED}, median of {MEASURED_RUNS}); {fmt_time(est)} ({ESTIMATED}, {design.library.name} "
                         f"library, critical path without input delay); clock {fmt_time(group.clock_period)}")
    text = "\n".join(lines) + "\n"
    write_atomic(folder / "reports" / "torch.rpt", f"# {design.netlist.name}: {design.torch_target} step per path "
                 f"group, {MEASURED} vs the {design.library.name} library's estimate\n{text}")
    return [f"target {design.torch_target}: {line}" for line in lines]
