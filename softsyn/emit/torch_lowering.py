"""A torch target's lowering (softsyn.library.torch_targets): the source model as one decoder step over a static KV
cache, exported with torch.export and compiled by AOTInductor into DIR/model.pt2, with DIR/runtime/torch.json, then
measured at every path group's dims.

The cache tensors are the step's inputs and it writes its keys and values into them in place (as a static cache
under torch.compile does; softsyn.runtime.torch_package says the signature), then attends over the whole cache
(max_length slots) under a 4-D mask: a slot is visible when it is at or before the query's position. So one package
with dynamic batch and `seq` serves prefill and decode, its fixed-shape steps can be replayed as CUDA graphs (the
buffers keep their addresses), and it computes the function the ONNX export does (the same model object, built by
softsyn.frontends.source_torch_model: same config, seed, weights). Attention is the target's (ATTENTIONS: SDPA, or
matmuls and a softmax), the query heads of a KV head stacked, so K and V are never repeated per query head. Precision: the target's dtype
everywhere (fp32 on cpu-torch, fp16 on h200-torch); torchao's per-module precisions are not built yet.
"""
from __future__ import annotations

import inspect
import time
from pathlib import Path

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, StaticLayer

from softsyn import progress
from softsyn.constraints.model import shared_buffer_length
from softsyn.emit.session import write_json
from softsyn.errors import SoftsynError
from softsyn.frontends import source_torch_model
from softsyn.frontends.export import kv_geometry, quiet, torch_num_threads
from softsyn.frontends.hf_common import brief
from softsyn.library.torch_targets import torch_target
from softsyn.results.files import write_atomic
from softsyn.runtime.artifact import TORCH_FILE, TORCH_PACKAGE
from softsyn.runtime.torch_package import FORMAT, TorchStep
from softsyn.units import fmt_time

MEASURED_RUNS = 10  # steps timed per path group (after 2 untimed): the median is written
MEASURED = "torch package, measured"  # the label every measured number carries
ESTIMATED = "est"  # and every number the ORT library predicts


class BufferLayer(StaticLayer):
    """One layer's cache as the step's input tensors, written in place at the step's positions (batch rows share
    them): the package mutates the caller's buffers, so a step moves no cache bytes beyond its own keys and values."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, where: torch.Tensor):
        super().__init__(max_cache_len=keys.shape[2])
        self.keys, self.values, self.where, self.device = keys, values, where, keys.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        self.keys.index_copy_(2, self.where, key_states)
        self.values.index_copy_(2, self.where, value_states)
        return self.keys, self.values


def _stacked(query, key, attention_mask):
    """The query heads of one KV head stacked as rows ([B, Hkv, rep*seq, D]) and the mask repeated to match."""
    batch, heads, seq, dim = query.shape
    kv_heads = key.shape[1]
    rep = heads // kv_heads
    mask = attention_mask[:, :, None].expand(-1, -1, rep, -1, -1).reshape(batch, 1, rep * seq, key.shape[2])
    return query.reshape(batch, kv_heads, rep * seq, dim), mask


def grouped_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """SDPA over the whole static cache, query heads stacked per KV head: K and V are read once per KV head, never
    repeated (transformers' sdpa path repeats them when a mask is given, which would copy the cache every step).
    `attention_mask`: bool [B, 1, seq, max_length], True where visible."""
    batch, heads, seq, dim = query.shape
    q, mask = _stacked(query, key, attention_mask)
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, seq, dim).transpose(1, 2).contiguous(), None


def matmul_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The same function as two matmuls and a softmax in fp32 (transformers' eager form, query heads stacked):
    Inductor fuses the mask, scale and softmax, and at decode the matmuls are GEMVs over the cache that cuBLAS spreads
    over all its positions, where SDPA's fused kernels split the work by query rows (two at decode: 86 us a layer for
    cuDNN's at qwen3-1.7b's shapes on the H200, 2026-12-03)."""
    batch, heads, seq, dim = query.shape
    q, mask = _stacked(query, key, attention_mask)
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * (scaling if scaling is not None else dim ** -0.5)
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).to(value.dtype)
    out = torch.matmul(probs, value)
    return out.reshape(batch, heads, seq, dim).transpose(1, 2).contiguous(), None


ATTENTIONS = {"sdpa": ("softsyn_sdpa", grouped_attention), "matmul": ("softsyn_matmul", matmul_attention)}
for _name, _function in ATTENTIONS.values():
    AttentionInterface.register(_name, _function)


class PackedLinear(torch.nn.Module):
    """Linear layers that read the same input as one matmul over their concatenated weights (a GEMV at decode:
    qwen3-1.7b's separate q/k/v GEMVs ran at 0.8 TB/s on the H200, 2026-12-03; one wide GEMV streams faster). The
    first part asked for an input computes every output; the others take theirs from it (same input object)."""

    def __init__(self, linears: list[torch.nn.Linear]):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.cat([lin.weight.data for lin in linears]), requires_grad=False)
        biases = [lin.bias for lin in linears]
        self.bias = (torch.nn.Parameter(torch.cat([b.data for b in biases]), requires_grad=False)
                     if all(b is not None for b in biases) else None)
        self.sizes = [lin.out_features for lin in linears]
        self._input, self._parts, self._taken = None, None, 0

    def part(self, index: int, x: torch.Tensor) -> torch.Tensor:
        if self._input is not x:
            self._input = x
            self._parts = torch.nn.functional.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)
            self._taken = 0
        out = self._parts[index]
        self._taken += 1
        if self._taken == len(self.sizes):  # every part taken: hold no tensor past the call
            self._input, self._parts = None, None
        return out


class PackedPart(torch.nn.Module):
    """One of a PackedLinear's outputs, where the Linear it replaces was."""

    def __init__(self, packed: PackedLinear, index: int):
        super().__init__()
        self.packed, self.index = packed, index

    def forward(self, x):
        return self.packed.part(self.index, x)


PACKED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # attention's QKV, the MLP's gate and up


def pack_projections(model: torch.nn.Module) -> int:
    """Replace every group of PACKED Linear layers of one module (same input width) by a PackedLinear; how many."""
    packed = 0
    for module in list(model.modules()):
        for names in PACKED:
            linears = [getattr(module, name, None) for name in names]
            if not all(type(lin) is torch.nn.Linear for lin in linears):
                continue
            if len({lin.in_features for lin in linears}) != 1:
                continue
            group = PackedLinear(linears)
            for index, name in enumerate(names):
                setattr(module, name, PackedPart(group, index))
            packed += 1
    return packed


class StaticStep(torch.nn.Module):
    """(input_ids, position_ids, k0, v0, k1, v1, ...) -> logits: one step over a static cache the caller owns, the
    step's keys and values written into it in place. A query sees the cache slots at or before its own position."""

    def __init__(self, model, max_length: int):
        super().__init__()
        self.m, self.max_length = model, max_length
        self.layers = model.config.num_hidden_layers
        # transformers >= 5.2x names the argument `cache` (past_key_values is deprecated), as export_decoder reads it
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def forward(self, input_ids, position_ids, *kv):
        where = position_ids[0]  # every row of a batch at the same positions
        cache = Cache(layers=[BufferLayer(kv[2 * i], kv[2 * i + 1], where) for i in range(self.layers)])
        slots = torch.arange(self.max_length, device=input_ids.device)
        mask = (slots[None, None, :] <= position_ids[:, :, None])[:, None]  # [B, 1, seq, max_length]
        out = self.m(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
                     **{self.cache_kw: cache})
        return out.logits


def _export(step: StaticStep, cfg, max_length: int, device: str, dtype: torch.dtype):
    """torch.export of the step at batch 2, seq 3 (sizes > 1 so neither is specialised), both dims dynamic."""
    layers, kv, head_dim = kv_geometry(cfg)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (2, 3), generator=g).to(device)
    positions = torch.arange(4, 7).expand(2, 3).contiguous().to(device)
    cache = tuple(torch.zeros(2, kv, max_length, head_dim, dtype=dtype, device=device) for _ in range(2 * layers))
    auto = torch.export.Dim.AUTO  # a named Dim fails on guards transformers' mask code makes (true for seq >= 0)
    shapes = {"input_ids": {0: auto, 1: auto}, "position_ids": {0: auto, 1: auto}, "kv": tuple({0: auto} for _ in cache)}
    with quiet(), torch.no_grad():
        return torch.export.export(step, (ids, positions, *cache), dynamic_shapes=shapes, strict=False)


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Parameters to `dtype`, buffers left as built: rotary's fp32 inv_freq cast to fp16 skews the angle at far
    positions (qwen3-tiny's keys at position 4096 were 7.5 % off the reference on the H200, 2026-12-03)."""
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.to(dtype)


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
    layers, kv, head_dim = kv_geometry(model.config)
    vocab = int(model.config.vocab_size)
    t0 = time.perf_counter()
    try:
        with progress.step(f"emit: torch.export of {design.netlist.name}'s step ({target.dtype} on {target.device}, "
                           f"static KV cache of {cfg_max})", enabled=design.progress, done="emit: step exported"):
            program = _export(StaticStep(model, cfg_max).eval(), model.config, cfg_max, target.device, dtype)
        del model  # the program holds the weights; a 1.7B model would otherwise sit twice in device memory
        with progress.step("emit: AOTInductor compiling the step into model.pt2 (tens of seconds; minutes on a GPU)",
                           enabled=design.progress, done="emit: model.pt2 written"):
            torch._inductor.aoti_compile_and_package(program, package_path=str(folder / TORCH_PACKAGE))
    except SoftsynError:
        raise
    except Exception as exc:  # torch.export and Inductor fail with many types; the innermost cause says what
        raise SoftsynError(f"{source}: lowering {design.netlist.name} for {design.torch_target} failed: "
                           f"{brief(exc)}") from exc
    lowered_s = time.perf_counter() - t0
    settings = {
        "format": FORMAT, "target": design.torch_target, "package": TORCH_PACKAGE, "device": target.device,
        "loader": "torch._inductor.aoti_load_package(package)(input_ids, position_ids, *kv) -> logits; kv written in "
                  "place",
        "inputs": {"input_ids": ["batch", "seq", "int64"], "position_ids": ["batch", "seq", "int64"]},
        "outputs": {"logits": ["batch", "seq", "vocab_size", target.dtype]},
        "kv_cache": {"layers": layers, "kv_heads": kv, "head_dim": head_dim, "max_length": cfg_max,
                     "layout": "per layer key then value, [batch, kv_heads, max_length, head_dim]; inputs after "
                               "position_ids, the step's keys and values written into them at its positions"},
        "dtype": target.dtype, "cuda_graphs": target.device == "cuda", "vocab_size": vocab,
        "scenarios": {g.name: {"dims": g.scenario.dims} for g in design.groups},
        "reference": reference,
        "accuracy": {"max_rel_error": design.constraints.accuracy.max_rel_error,
                     "min_top1": design.constraints.accuracy.min_top1},
    }
    write_json(folder / TORCH_FILE, settings)
    notes += [f"target {design.torch_target}: {TORCH_PACKAGE} is the step lowered by torch.export + AOTInductor "
              f"({lowered_s:.1f} s; static KV cache of {cfg_max} positions, {target.attention} attention over all of "
              f"it; {packed} projection groups packed: QKV, gate/up); {target.dtype} "
              "everywhere: per-module torchao precision (int8/int4/fp8) is not built yet",
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
