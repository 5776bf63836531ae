"""Sensitivity: the output error each cell adds at each candidate precision, measured on ORT CPU and cached.

For each (cell, precision) the design is run with that one MatMul quantised (ONNX Runtime's quantiser,
softsyn.passes.precision.mapping.quantise_weight) on every path group's seeded scenario inputs
(softsyn.runtime.inputs), and compared with the design as it stands: the error is verify's relative error,
max|quantised - design| / max|design|, the worst over outputs and groups. Results are cached on disk under
$SOFTSYN_CACHE/sensitivity by a content key (the design's source key, its cells and weights' names, the
library, the group dims, the seed, the block size and ORT's version), so a second compile measures nothing.

A weightless netlist (a plan) cannot run: its sensitivities are the labelled prior `PRIOR_ERROR` instead.
`check(...)` runs a whole map the same way: the end-to-end check the loop makes before it keeps a map.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from softsyn.passes.precision.mapping import BLOCK, NBITS, Candidate, is_weightless, quantise_weight, weight_source

# Per-cell output error of one MatMul quantised alone, as a prior for plans (estimate): the median of the 36 cells
# measured on the pretrained zoo:minilm (2.05e-2 int4, 1.32e-3 int8; bench/sensitivity.py), rounded up. Seeded
# random weights quantise worse (zoo:qwen3-wide: 9.3e-2, 6.0e-3): docs/decisions/2026-12-01-compile-loop.md.
PRIOR_ERROR = {"int8": 1.4e-3, "int4": 2.1e-2}
SEED = 0


class CannotRun(Exception):
    """ORT CPU cannot run the design (e.g. GroupQueryAttention with absorbed q/k norms, CUDA only): the message says why."""


def _cache_file(design, cands: list[Candidate]) -> Path:
    import onnxruntime as ort

    from softsyn.frontends.cache import default_cache_dir

    prov = design.netlist.provenance
    source = (prov.get("cache") or {}).get("key") or prov.get("file") or prov.get("source")
    if prov.get("file") and Path(prov["file"]).is_file():  # a file read as given: its size and time stand for it
        stat = Path(prov["file"]).stat()
        source = f"{source}:{stat.st_size}:{stat.st_mtime_ns}"
    material = {"source": source, "library": design.library.name,
                "cells": [(c.name, c.k, c.n, c.current) for c in cands],
                "nodes": hashlib.sha256("|".join(f"{n.op_type}:{n.name}" for n in design.netlist.nodes())
                                        .encode()).hexdigest(),
                "dims": {g.name: g.scenario.dims for g in design.groups}, "seed": SEED, "block": BLOCK,
                "ort": ort.__version__, "format": 1}
    key = hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:24]
    return default_cache_dir() / "sensitivity" / f"{key}.json"


def inline_proto(model: ir.Model) -> onnx.ModelProto:
    """The model as one in-memory proto with every weight inline (external data read in), to run from bytes."""
    proto = ir.to_proto(model)
    values = model.graph.initializers
    for t in proto.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            t.CopyFrom(onnx.numpy_helper.from_array(np.asarray(values[t.name].const_value.numpy()), t.name))
    return proto


class Runner:
    """Runs the design, or the design with some MatMuls quantised, on every group's seeded inputs."""

    def __init__(self, design):
        from softsyn.runtime.inputs import scenario_inputs

        self.proto = inline_proto(design.netlist.model)
        self.index = {n.name: i for i, n in enumerate(self.proto.graph.node)}
        self.weights = {t.name: t for t in self.proto.graph.initializer}
        self.transposed = {n.output[0]: n.input[0] for n in self.proto.graph.node  # Transpose(W) weights
                           if n.op_type == "Transpose" and n.input and n.input[0] in self.weights}
        self.feeds = {g.name: scenario_inputs(design.netlist, g.scenario.dims, seed=SEED) for g in design.groups}
        self.reference = self.run({})

    def run(self, mapping: dict[str, str]) -> dict[str, list[np.ndarray]]:
        """Outputs per group with `mapping`'s cells quantised (the proto is restored afterwards)."""
        from softsyn.runtime.session import SessionSettings, open_session

        graph = self.proto.graph
        saved, added = {}, 0
        for name, precision in mapping.items():
            if precision not in NBITS:
                continue
            i = self.index[name]
            node = graph.node[i]
            source = self.transposed.get(node.input[1])
            weight = onnx.numpy_helper.to_array(self.weights[source or node.input[1]])
            weight = weight.T if source else weight
            qnode, inits = quantise_weight(name, weight, NBITS[precision])
            renamed = {t.name: f"{node.input[1]}.sens.{t.name}" for t in inits}
            for t in inits:
                t.name = renamed[t.name]
            qnode.input[:] = [node.input[0]] + [renamed[x] for x in qnode.input[1:]]
            qnode.output[:] = list(node.output)
            saved[i] = onnx.NodeProto()
            saved[i].CopyFrom(node)
            node.CopyFrom(qnode)
            graph.initializer.extend(inits)
            added += len(inits)
        if saved and not any(o.domain == "com.microsoft" for o in self.proto.opset_import):
            self.proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
        try:
            session = open_session(self.proto, SessionSettings(provider="cpu", require_provider=False))
            return {g: session.run(None, feeds) for g, feeds in self.feeds.items()}
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            raise CannotRun(" ".join(str(exc).split())[:300]) from None
        finally:
            for i, node in saved.items():
                graph.node[i].CopyFrom(node)
            for _ in range(added):
                graph.initializer.pop()

    def error(self, mapping: dict[str, str]) -> float:
        """verify's relative error (max|quantised - design| / max|design|, softsyn.flow.verify.compare) of the
        quantised design against the design, the worst over outputs and groups."""
        got = self.run(mapping)
        worst = 0.0
        for g, outputs in got.items():
            for have, want in zip(outputs, self.reference[g]):
                scale = float(np.abs(want.astype(np.float64)).max()) if want.size else 0.0
                diff = float(np.abs(have.astype(np.float64) - want).max()) if want.size else 0.0
                worst = max(worst, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))
        return worst


def measure(design, cands: list[Candidate], log=None) -> tuple[dict[str, dict[str, float]], str]:
    """({cell: {precision: error}}, how they were obtained): measured (cached) or, for a plan, the prior."""
    errors = {c.name: {c.current: 0.0} for c in cands}
    first = next(n for n in design.netlist.nodes() if n.name == cands[0].name) if cands else None
    if first is not None and is_weightless(weight_source(first.inputs[1])[0]):
        for c in cands:
            errors[c.name].update({p: PRIOR_ERROR[p] for p in c.options[1:]})
        return errors, ("estimate: a weightless netlist cannot run, so each cell's error is the per-precision prior "
                        + ", ".join(f"{p} {e:.1e}" for p, e in PRIOR_ERROR.items())
                        + " (the median per cell measured on the pretrained zoo:minilm, rounded up)")
    path = _cache_file(design, cands)
    cached = json.loads(path.read_text()) if path.is_file() else {}
    todo = [(c, p) for c in cands for p in c.options[1:] if p not in cached.get(c.name, {})]
    if todo:
        runner = Runner(design)
        for i, (c, p) in enumerate(todo, 1):
            cached.setdefault(c.name, {})[p] = runner.error({c.name: p})
            if log is not None and (i % 10 == 0 or i == len(todo)):
                log(f"optimize: sensitivity {i}/{len(todo)} measured")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cached, indent=1, sort_keys=True))
        tmp.replace(path)
    for c in cands:
        errors[c.name].update({p: cached[c.name][p] for p in c.options[1:]})
    how = (f"measured: each cell quantised alone on ORT CPU, {len(design.groups)} groups' seeded inputs, "
           f"{len(todo)} new, {sum(len(c.options) - 1 for c in cands) - len(todo)} from the cache ({path.name})")
    return errors, how

