"""A torch target's lowering (softsyn.library.torch_targets): the source model as one decoder step over a static KV
cache, exported with torch.export and compiled by AOTInductor into DIR/model.pt2, with DIR/runtime/torch.json, then
measured at every path group's dims.

The step is functional: the cache tensors are inputs and the updated ones outputs (softsyn.runtime.torch_package
says the signature). Attention reads the whole cache (max_length slots) and the step's own keys, under a 4-D mask:
a slot is visible when it lies before the step's first position, a new key when it is not after the query. So one
package with a dynamic `seq` serves prefill and decode and computes the function the ONNX export does (the same
model object, built by softsyn.frontends.source_torch_model: same config, seed, weights). Precision: fp32, the
compile's uniform choice on a CPU; torchao's per-module precisions are not built yet.
"""
from __future__ import annotations

import inspect
import time
from pathlib import Path

import torch
from transformers.cache_utils import DynamicCache

from softsyn import progress
from softsyn.constraints.model import shared_buffer_length
from softsyn.emit.session import write_json
from softsyn.errors import SoftsynError
from softsyn.frontends import source_torch_model
from softsyn.frontends.export import kv_geometry, quiet, torch_num_threads
from softsyn.frontends.hf_common import brief
from softsyn.results.files import write_atomic
from softsyn.runtime.artifact import TORCH_FILE, TORCH_PACKAGE
from softsyn.runtime.torch_package import FORMAT, TorchStep
from softsyn.units import fmt_time

MEASURED_RUNS = 10  # steps timed per path group (after 2 untimed): the median is written
MEASURED = "torch package, measured"  # the label every measured number carries
ESTIMATED = "est"  # and every number the ORT library predicts


class StaticStep(torch.nn.Module):
    """(input_ids, position_ids, k0, v0, k1, v1, ...) -> (logits, k0', v0', ...): one step over a static cache."""

    def __init__(self, model, max_length: int):
        super().__init__()
        self.m, self.max_length = model, max_length
        self.layers = model.config.num_hidden_layers
        # transformers >= 5.2x names the argument `cache` (past_key_values is deprecated), as export_decoder reads it
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def forward(self, input_ids, position_ids, *kv):
        batch, seq = input_ids.shape
        cache = DynamicCache(config=self.m.config)
        for i in range(self.layers):
            cache.update(kv[2 * i], kv[2 * i + 1], i)
        slots = torch.arange(self.max_length, device=input_ids.device)
        cached = (slots[None, :] < position_ids[:, :1])[:, None, :].expand(-1, seq, -1)  # [B, seq, max_length]
        q = torch.arange(seq, device=input_ids.device)
        causal = (q[None, :] <= q[:, None])[None].expand(batch, -1, -1)  # [B, seq, seq]
        mask = torch.cat([cached, causal], dim=-1)[:, None]  # [B, 1, seq, max_length + seq], True: attend
        out = self.m(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
                     **{self.cache_kw: cache})
        where = position_ids[0]
        flat = [out.logits]
        for i in range(self.layers):
            layer = out.past_key_values.layers[i]
            flat += [kv[2 * i].index_copy(2, where, layer.keys[:, :, self.max_length:]),
                     kv[2 * i + 1].index_copy(2, where, layer.values[:, :, self.max_length:])]
        return tuple(flat)


def _export(step: StaticStep, cfg, max_length: int):
    """torch.export of the step at batch 2, seq 3 (sizes > 1 so neither is specialised), both dims dynamic."""
    layers, kv, head_dim = kv_geometry(cfg)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (2, 3), generator=g)
    positions = torch.arange(4, 7).expand(2, 3).contiguous()
    cache = tuple(torch.randn(2, kv, max_length, head_dim, generator=g) for _ in range(2 * layers))
    auto = torch.export.Dim.AUTO  # a named Dim fails on guards transformers' cache concat makes (true for seq >= 0)
    shapes = {"input_ids": {0: auto, 1: auto}, "position_ids": {0: auto, 1: auto}, "kv": tuple({0: auto} for _ in cache)}
    with quiet(), torch.no_grad():
        return torch.export.export(step, (ids, positions, *cache), dynamic_shapes=shapes, strict=False)


def lower(design, reference: dict, folder: Path, notes: list[str]) -> list[str]:
    """Write DIR/model.pt2 and DIR/runtime/torch.json into `folder` and the measured step per group into `notes`;
    the files written (relative)."""
    source = str(reference.get("source", ""))
    cfg_max, _ = shared_buffer_length(design.constraints)
    torch_num_threads()
    model = source_torch_model(source)
    if next(model.parameters()).dtype != torch.float32:
        model = model.float()  # the torch targets are fp32 until torchao's precisions are built
    if "sliding_attention" in (getattr(model.config, "layer_types", None) or []):  # the 4-D mask has no window
        raise SoftsynError(f"{source}: {design.torch_target} does not lower sliding-window attention yet (the step's "
                           "mask covers the whole cache); valid: a decoder of full-attention layers (qwen3, llama)")
    layers, kv, head_dim = kv_geometry(model.config)
    t0 = time.perf_counter()
    try:
        with progress.step(f"emit: torch.export of {design.netlist.name}'s step (static KV cache of {cfg_max})",
                           enabled=design.progress, done="emit: step exported"):
            program = _export(StaticStep(model, cfg_max).eval(), model.config, cfg_max)
        with progress.step("emit: AOTInductor compiling the step into model.pt2 (tens of seconds)",
                           enabled=design.progress, done="emit: model.pt2 written"):
            torch._inductor.aoti_compile_and_package(program, package_path=str(folder / TORCH_PACKAGE))
    except SoftsynError:
        raise
    except Exception as exc:  # torch.export and Inductor fail with many types; the innermost cause says what
        raise SoftsynError(f"{source}: lowering {design.netlist.name} for {design.torch_target} failed: "
                           f"{brief(exc)}") from exc
    lowered_s = time.perf_counter() - t0
    settings = {
        "format": FORMAT, "target": design.torch_target, "package": TORCH_PACKAGE, "device": "cpu",
        "loader": "torch._inductor.aoti_load_package(package)(input_ids, position_ids, *kv) -> (logits, *kv)",
        "inputs": {"input_ids": ["batch", "seq", "int64"], "position_ids": ["batch", "seq", "int64"]},
        "outputs": {"logits": ["batch", "seq", "vocab_size", "float32"]},
        "kv_cache": {"layers": layers, "kv_heads": kv, "head_dim": head_dim, "max_length": cfg_max,
                     "layout": "per layer key then value, [batch, kv_heads, max_length, head_dim]; inputs after "
                               "position_ids, updated copies after logits"},
        "dtype": "float32", "vocab_size": int(model.config.vocab_size),
        "scenarios": {g.name: {"dims": g.scenario.dims} for g in design.groups},
        "reference": reference,
        "accuracy": {"max_rel_error": design.constraints.accuracy.max_rel_error,
                     "min_top1": design.constraints.accuracy.min_top1},
    }
    write_json(folder / TORCH_FILE, settings)
    notes += [f"target {design.torch_target}: {TORCH_PACKAGE} is the step lowered by torch.export + AOTInductor "
              f"({lowered_s:.1f} s; static KV cache of {cfg_max} positions); fp32 everywhere: per-module torchao "
              "precision (int8/int4/fp8) is not built yet",
              f"target {design.torch_target}: the slack above is the {design.library.name} library's estimate ({ESTIMATED}) "
              "of the same function on the ONNX netlist; the package is measured below"]
    notes += measured_notes(design, folder, settings)
    return [TORCH_PACKAGE, TORCH_FILE]


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
