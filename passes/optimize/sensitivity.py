"""Sensitivity: the output error each cell adds at each candidate precision, measured and cached.

Per cell: for each (cell, precision) the design is run with that one MatMul quantised (ONNX Runtime's quantiser for
int4/int8, the block-scaled e4m3 one for fp8: passes.optimize.mapping.quantise) on every path group's seeded scenario inputs
(softsyn.runtime.inputs), and compared with the design as it stands: the error is verify's relative error,
max|quantised - design| / max|design|, the worst over outputs and groups.
Per role (`measure_per_role`, for designs too large to run cell by cell): the cells grouped by role (`roles`: the
hierarchy without its layer indices, so model.layers.*.mlp.down_proj is one group; a packed QKV or gate-up apart
from the plain projection it is named after), each group quantised at once per precision and run end to end
(~10 groups x 2 precisions instead of ~400 runs); each cell's error is the group's shared by the combination rule
(passes.optimize.search.cell_error), labelled "measured per role".

Where: on the target's device when it is here (the CUDA provider for a CUDA library's design, when onnxruntime has
it and a session opens), else on ORT CPU, through the CPU view verify uses (softsyn.runtime.gqa_view: the q/k norms a
CUDA GroupQueryAttention absorbed, which ORT's CPU kernel refuses, run before it; softsyn.runtime.fp8_view: the fp8
weight cells, which have a CUDA kernel only, as their decode and a MatMul). Weights travel as ORT external
initializers (numpy arrays the session reads), never in the protobuf: no 2 GB limit, no copy per run.

Results are cached on disk under $SOFTSYN_CACHE/sensitivity by a content key (the design's source key, its cells
and nodes, the library, the group dims, the seed, the block size, ORT's version, the provider and per cell or per
role), so a second compile measures nothing. A weightless netlist (a plan) cannot run: its sensitivities are the
labelled prior `PRIOR_ERROR` instead. `Runner.error(map)` runs a whole map the same way: the end-to-end check the
loop makes before it keeps a map.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort

from softsyn import progress
from passes.optimize.experts import BITS as QMOE_BITS, QMOE_BLOCK, qmoe_proto
from passes.optimize.mapping import (BF16, BLOCK, FP8_BLOCK, NBITS, QUANTISED, Candidate, nbits_block, quantise,
                                     weight_of, weight_source)
from passes.optimize.search import ESTIMATE_RULE, cell_error
from softsyn.frontends.cache import default_cache_dir
from softsyn.netlist.keys import is_weightless
from softsyn.runtime.design_runner import SEED, DesignRunner, target_provider

# Per-cell output error of one MatMul quantised alone, as a prior for plans (estimate): the median of the 36 cells
# measured on the pretrained zoo:minilm (2.05e-2 int4, 1.32e-3 int8; bench/sensitivity.py), rounded up. Seeded
# random weights quantise worse (zoo:qwen3-wide: 9.3e-2, 6.0e-3): docs/decisions/2026-12-01-compile-loop.md. Under
# the RSS estimate (search.map_error) 8 % of a 10 % budget admits 9 int4 or ~2000 int8 cells of it (qwen3-1.7b's
# plan: 8 int4 + 104 int8). A design with weights is measured (per cell, or per role when large), never given it.
# fp8 (estimate, not measured on minilm: the CPU design is fp32, which the op does not take): the int8 prior times 5,
# the fp8 / int8 error ratio rounded up (bench/results/fp8-sensitivity-2026-12-01.md: RMS weight error 4.8 on normal
# and 3.3 on Student-t weights, e4m3 block 128 vs int8 block 32, where int4 / int8 reads 16 as the priors' 15; output
# error per cell of seeded qwen3-tiny 2.6-5.6, median 3.8).
# bf16 (estimate: 8 mantissa bits, its weight, input and product each rounded to 2^-9 relative): the int8 prior times
# 0.75, the largest bf16 / int8 ratio of one MatMul's output error over 8 shapes of normal and Student-t weights
# (median 0.52; bench/bf16_prior.py), rounded up.
PRIOR_ERROR = {"int8": 1.4e-3, "int4": 2.1e-2, "fp8": 7.0e-3, "bf16": 1.1e-3}


def _cache_file(design, cands: list[Candidate], provider: str, mode: str = "cell") -> Path:
    prov = design.netlist.provenance
    source = (prov.get("cache") or {}).get("key") or prov.get("file") or prov.get("source")
    if prov.get("file") and Path(prov["file"]).is_file():  # a file read as given: its size and time stand for it
        stat = Path(prov["file"]).stat()
        source = f"{source}:{stat.st_size}:{stat.st_mtime_ns}"
    material = {"source": source, "library": design.library.name,
                "cells": [(c.name, c.k, c.n, c.current) for c in cands],
                "nodes": hashlib.sha256("|".join(f"{n.op_type}:{n.name}" for n in design.netlist.nodes())
                                        .encode()).hexdigest(),
                "dims": {g.name: g.scenario.dims for g in design.groups}, "seed": SEED,
                "blocks": [(c.name, c.blocks) for c in cands if c.blocks],
                **({"fp8_block": FP8_BLOCK} if any("fp8" in c.options for c in cands) else {}),
                **({"qmoe_block": QMOE_BLOCK} if any(c.op == "MoE" for c in cands) else {}),
                "ort": ort.__version__, "provider": provider, "mode": mode, "format": 2}
    key = hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:24]
    return default_cache_dir() / "sensitivity" / f"{key}.json"


def _write_cache(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)


class Runner(DesignRunner):
    """The design runner with `mapping`'s cells quantised (mapping.quantise) for the precisions QUANTISED names; an
    MoE cell's experts (its weight the pair fc1, fc2) as QMoE (passes.optimize.experts)."""
    def __init__(self, design, provider: str | None = None):
        super().__init__(design, provider)
        self.library = design.library  # int4/int8 cells quantised at the block it times fastest (nbits_block)

    def quantise_cell(self, name: str, weight, precision: str):
        if isinstance(weight, tuple):
            return qmoe_proto(self.node(name), *weight, precision) if precision in QMOE_BITS else None
        if precision == BF16:
            return bf16_nodes(self.node(name), weight)
        if precision not in QUANTISED:
            return None
        k, n = weight.shape
        block = nbits_block(self.library, precision, n, k) if precision in NBITS else BLOCK
        return quantise(name, weight, precision, block, self.library)


def bf16_nodes(node: onnx.NodeProto, weight: np.ndarray) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """A MatMul cell as the bf16 cell the map writes (mapping.bf16_cell), in the runner's multi-node form: Cast(x ->
    bf16), MatMul with the weight rounded to bf16, Cast back to fp16 (a bf16 cell replaces an fp16 one only)."""
    base = f"{node.name}.sens.bf16"
    w = onnx.numpy_helper.from_array(np.asarray(weight, np.float32).astype(ml_dtypes.bfloat16), "w")
    return [onnx.helper.make_node("Cast", [node.input[0]], [f"{base}.x"], name=f"{base}.cast_in",
                                  to=onnx.TensorProto.BFLOAT16),
            onnx.helper.make_node("MatMul", [f"{base}.x", "w"], [f"{base}.y"], name=node.name),
            onnx.helper.make_node("Cast", [f"{base}.y"], ["y"], name=f"{base}.cast_out",
                                  to=onnx.TensorProto.FLOAT16)], [w]


def _prior(design, cands: list[Candidate]) -> tuple[dict[str, dict[str, float]], str] | None:
    """The labelled prior for a weightless netlist (a plan), which cannot run; None for a design with weights."""
    first = next(n for n in design.netlist.nodes() if n.name == cands[0].name) if cands else None
    if first is None or not is_weightless(weight_of(first)):
        return None
    errors = {c.name: {c.current: 0.0, **{p: PRIOR_ERROR[p] for p in c.moves}} for c in cands}
    return errors, ("estimate: a weightless netlist cannot run, so each cell's error is the per-precision prior "
                    + ", ".join(f"{p} {e:.1e}" for p, e in PRIOR_ERROR.items())
                    + " (int4/int8: the median per cell measured on the pretrained zoo:minilm, rounded up; fp8: the "
                      "int8 prior times the fp8 / int8 weight error ratio; bf16: the int8 prior times the largest "
                      "bf16 / int8 output error ratio of bench/bf16_prior.py)")


def _measured(design, cands: list[Candidate], options: dict, mode: str, log, said):
    """The cached errors {key: {precision: error}} of `mode`'s cache file, every option {(key, precision): the
    cells quantised to measure it} not cached yet measured end to end and written back; `said(i, total, key,
    precision, error)` gives the line `log` gets after each (None: no line). Returns (cached, where it ran, the
    cache file, the options measured now)."""
    provider = target_provider(design)
    path = _cache_file(design, cands, provider, mode)
    cached = json.loads(path.read_text()) if path.is_file() else {}
    todo = [(key, p) for key, p in options if p not in cached.get(key, {})]
    where = "ORT CUDA" if provider == "cuda" else "ORT CPU"
    if not todo:
        return cached, where, path, todo
    with progress.step(f"optimize: sensitivity, each {mode} quantised and run", total=len(todo),
                       enabled=getattr(design, "progress", False),
                       done=f"optimize: sensitivity of {len(todo)} {mode} options") as bar:
        runner = Runner(design, provider)
        for i, (key, p) in enumerate(todo, 1):
            cached.setdefault(key, {})[p] = runner.error(options[key, p])
            bar.advance()
            line = said(i, len(todo), key, p, cached[key][p])
            if log is not None and line:
                log(line)
    path = _cache_file(design, cands, runner.provider, mode)
    _write_cache(path, cached)
    return cached, runner.where, path, todo


def measure(design, cands: list[Candidate], log=None) -> tuple[dict[str, dict[str, float]], str]:
    """({cell: {precision: error}}, how they were obtained): each cell quantised alone (cached) or, for a plan, the
    prior."""
    prior = _prior(design, cands)
    if prior is not None:
        return prior
    options = {(c.name, p): {c.name: p} for c in cands for p in c.moves}

    def said(i, total, key, p, error):
        return f"optimize: sensitivity {i}/{total} measured" if i % 10 == 0 or i == total else None

    cached, where, path, todo = _measured(design, cands, options, "cell", log, said)
    errors = {c.name: {c.current: 0.0, **{p: cached[c.name][p] for p in c.moves}} for c in cands}
    how = (f"measured: each cell quantised alone on {where}, {len(design.groups)} groups' seeded inputs, "
           f"{len(todo)} new, {sum(len(c.moves) for c in cands) - len(todo)} from the cache ({path.name})")
    return errors, how


def roles(design, cands: list[Candidate]) -> dict[str, list[Candidate]]:
    """{role: its cells}: a cell's role is its hierarchy (else its name) without the numeric (layer, expert)
    components; a packed weight (the projection fusion's `.mergedN`) is its own role, named for what it packs."""
    by_name = {n.name: n for n in design.netlist.nodes()}
    groups: dict[str, list[Candidate]] = {}
    for c in cands:
        role = ".".join(part for part in (c.hierarchy or c.name).split(".") if not part.isdigit())
        source = weight_source(by_name[c.name].inputs[1])
        merged = source[0].name.rsplit(".merged", 1) if source is not None and source[0].name else []
        if len(merged) == 2 and merged[1].isdigit():
            role += f" (packed {merged[1]})"
        groups.setdefault(role, []).append(c)
    return groups


def measure_per_role(design, cands: list[Candidate], log=None) -> tuple[dict[str, dict[str, float]], str]:
    """({cell: {precision: error}}, how): each role's cells (`roles`) quantised at once per precision, run end to
    end (cached), each cell given search.cell_error of its group's error; for a plan, the prior."""
    prior = _prior(design, cands)
    if prior is not None:
        return prior
    groups = roles(design, cands)
    options = {(role, p): {c.name: p for c in cells if p in c.options}
               for role, cells in groups.items() for p in sorted({p for c in cells for p in c.moves})}

    def said(i, total, role, p, error):
        return f"optimize: sensitivity per role {i}/{total}: {role} x{len(groups[role])} {p} {error:.3e}"

    cached, where, path, todo = _measured(design, cands, options, "role", log, said)
    errors = {}
    for role, cells in groups.items():
        for c in cells:
            errors[c.name] = {c.current: 0.0, **{p: cell_error(cached[role][p], sum(p in x.options for x in cells))
                                                  for p in c.moves}}
    runs = sum(len(v) for v in cached.values())
    how = (f"measured per role (not per cell): {len(groups)} role groups of {len(cands)} cells, each quantised at "
           f"once per precision on {where}, {len(design.groups)} groups' seeded inputs, {len(todo)} runs new, "
           f"{runs - len(todo)} from the cache ({path.name}); a cell's error is its group's / sqrt(cells), "
           f"the inverse of the estimate ({ESTIMATE_RULE})")
    return errors, how
