"""DIR/runtime/session.json: the ORT settings to run the compiled model (providers, options, IO dtypes and shapes per
scenario, KV buffers) and what `softsyn verify` needs (the reference, the accuracy budget, the compiled precision)."""
from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import onnx_ir as ir

from reports import retime_table
from softsyn.emit.model import MODEL_FILE
from softsyn.netlist.keys import FP8_MATMUL
from softsyn.runtime.session import ARTIFACT_OPTIONS
from softsyn.timing import precision_of
from softsyn.timing.realised import realised_precision

SESSION_FILE = "runtime/session.json"


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=False, allow_nan=False) + "\n")


def _ports(values, shapes_by_group: dict) -> dict:
    return {v.name: {"dtype": ir.DataType(v.dtype).name.lower(),
                     "shape": [d if isinstance(d, int) else str(d) for d in v.shape] if v.shape is not None else None,
                     "scenarios": {g: list(shapes[v.name]) for g, shapes in shapes_by_group.items() if v.name in shapes}}
            for v in values}


def _precision_map(report) -> dict | None:
    """The compile loop's per-cell map summed: cells by requested and by realised precision (netlist.json has each)."""
    if report is None or not getattr(report, "cells", None):
        return None
    measured = getattr(report, "retime", None)  # ultra's measured re-timing: the rows precision.rpt prints, SI
    return {"requested": dict(Counter(c.requested for c in report.cells)),
            "realised": dict(Counter(c.realised for c in report.cells)),
            "estimated_error": report.estimate_error, "checked_error": report.checked_error,
            "measured": None if measured is None else {"provider": measured.provider, "kept_round": measured.kept,
                                                       "outcome": measured.why, **retime_table(report).to_dict()}}


def compiled_precision(netlist) -> str:
    """The precision most weight-bearing cells (MatMul, Gemm) run in: what the verify budget defaults on."""
    found = Counter(precision_of(n) for n in netlist.nodes() if n.op_type in ("MatMul", "Gemm", "MatMulNBits", FP8_MATMUL))
    return found.most_common(1)[0][0] if found else "fp32"


def session_json(design, reference: dict, plan: bool = False) -> dict:
    """ORT settings to run DIR/model.onnx as compiled, plus what `softsyn verify` needs (a plan: no model)."""
    netlist, library, cons = design.netlist, design.library, design.constraints
    shapes = {g.name: netlist.bind(g.scenario.dims) for g in design.groups}
    graph = netlist.model.graph
    providers = ([library.provider, "CPUExecutionProvider"] if library.is_gpu else ["CPUExecutionProvider"])
    kv_ports = [v.name for v in list(graph.inputs) + list(graph.outputs) if "past" in v.name or "present" in v.name]
    kv_layout = design.pass_reports.get("kv_layout")  # its max_length is the shared buffer's (softsyn run binds it)
    captured = any(launch.captured for launch in design.launches.values())
    return {
        "format": 1,
        "model": None if plan else MODEL_FILE,
        "plan": plan,
        "providers": providers,
        # enable_cuda_graph "1" where a group's graph can be captured (softsyn.timing.capture: decode with a shared
        # KV buffer, every node on CUDA); softsyn run and genai_config.json take their provider options from here
        "provider_options": {library.provider: {"enable_cuda_graph": "1" if captured else "0"}}
        if library.is_gpu else {},
        "cuda_graph": {name: launch.describe(library) for name, launch in design.launches.items()},
        "session_options": dict(ARTIFACT_OPTIONS),
        "inputs": _ports(graph.inputs, shapes),
        "outputs": _ports(graph.outputs, shapes),
        "scenarios": {g.name: {"dims": g.scenario.dims, "clock_period": g.clock_period} for g in design.groups},
        "kv_cache": {"ports": kv_ports, "dtype": next((ir.DataType(v.dtype).name.lower() for v in graph.inputs
                                                       if v.name in kv_ports), None),
                     "max_length": getattr(kv_layout, "max_length", None) or cons.kv_cache.max_length,
                     "shared_buffer": bool(getattr(kv_layout, "applied", False))} if kv_ports else None,
        "precision": compiled_precision(netlist),
        "precision_request": design.pass_reports.get("precision"),  # requested vs realised (read from the model)
        "realised_precision": realised_precision(netlist).to_dict(),  # per weight precision and KV port, as held
        "precision_map": _precision_map(design.pass_reports.get("optimize")),
        "kv_moves": [dataclasses.asdict(m) for m in getattr(design.pass_reports.get("optimize"), "kv", ())],
        "reference": reference,
        "accuracy": {"max_rel_error": cons.accuracy.max_rel_error, "min_top1": cons.accuracy.min_top1},
        "target": library.name,
        **({"blocks": netlist.blocks()} if netlist.blocks() else {}),  # a composite: one model per block, run in order
    }
