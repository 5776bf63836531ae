"""Emit a compiled design: everything is built in a temp folder next to DIR, then renamed into place.

    DIR/model.onnx (+ model.onnx.data)   the compiled netlist, checked by onnx.checker (path form)
    DIR/netlist.json                     every cell: hierarchy, op, library cell, precision, delay per group
    DIR/runtime/session.json             ORT session settings, IO dtypes, scenario dims, KV buffers, reference
    DIR/reports/*.rpt, DIR/analysis.json the analysis of the compiled netlist (softsyn.reports)
    DIR/compile.log                      one row per step

A failed emit removes its temp folder, so DIR is either the previous complete output or the
new one, never half of each.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import onnx
import onnx_ir as ir

from softsyn import __version__
from softsyn.errors import SoftsynError
from softsyn.reports.common import umask
from softsyn.runtime.session import IR_VERSION
from softsyn.timing import Analysis, cell_timings, precision_of

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
SESSION_FILE = "runtime/session.json"
ORT_DOMAIN = "com.microsoft"


def emit(design, analysis: Analysis, out_dir: str | Path, log, reference: dict, plan: bool = False) -> Path:
    """Write the compiled design; `plan`: everything but the model (a weightless netlist's compile)."""
    netlist = design.netlist
    if not plan and str(netlist.provenance.get("weights", "")).startswith("meta"):
        raise SoftsynError(f"design {netlist.name}: weights are not materialised ({netlist.provenance['weights']}); "
                           "a compiled model needs real weights: compile an ONNX file or a model folder with weights, "
                           "or ask for the weightless plan (--plan)")
    out = Path(out_dir).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tmp.chmod(0o777 & ~umask())  # mkdtemp makes it 0700; DIR should read like any folder the user makes
        if not plan:
            _write_model(netlist, tmp)
        _write_json(tmp / "netlist.json", netlist_json(design, analysis))
        _write_json(tmp / SESSION_FILE, session_json(design, reference, plan))
        from softsyn import reports
        from softsyn.reports.compile_log import report_compile_log

        reports.write_reports(analysis, tmp)
        coverage = design.pass_reports.get("fuse")
        if coverage is not None:
            (tmp / "reports" / "fusion.rpt").write_text(
                reports.report_fusion(coverage, design=netlist.name, target=design.library.name))
        (tmp / "compile.log").write_text(report_compile_log(log))
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_model(netlist, folder: Path) -> None:
    netlist.store_meta()
    model = netlist.model
    model.ir_version = min(model.ir_version, IR_VERSION)
    path = folder / MODEL_FILE
    ir.save(model, str(path), external_data=DATA_FILE, size_threshold_bytes=1024)
    try:
        check(path)
    except onnx.checker.ValidationError as exc:
        raise SoftsynError(f"design {netlist.name}: the compiled model fails onnx.checker: {exc}") from None


def check(path: Path) -> None:
    """onnx.checker on the saved model (path form: external data resolved next to it).

    ORT registers a few of its own kernels in the default domain (SimplifiedLayerNormalization), where
    the checker knows only ONNX's ops; those nodes are checked as runtime ops (custom domain) in a
    throwaway view, and everything else as written.
    """
    try:
        onnx.checker.check_model(str(path))
        return
    except onnx.checker.ValidationError as exc:
        first = exc
    proto = onnx.load(str(path), load_external_data=False)
    runtime_ops = [n for n in proto.graph.node if n.domain in ("", "ai.onnx") and not onnx.defs.has(n.op_type)]
    if not runtime_ops:
        raise first
    for node in runtime_ops:
        node.domain = ORT_DOMAIN
    if not any(o.domain == ORT_DOMAIN for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid(ORT_DOMAIN, 1))
    view = path.with_name(f".checker-view-{path.name}")
    try:
        onnx.save(proto, str(view))
        onnx.checker.check_model(str(view))
    finally:
        view.unlink(missing_ok=True)


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")


def _swap_into_place(tmp: Path, out: Path) -> None:
    """rename(2) of a folder cannot replace a non-empty one: move the old output aside first."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def netlist_json(design, analysis: Analysis) -> dict:
    netlist = design.netlist
    per_group = {g.name: cell_timings(netlist, design.library, netlist.bind(g.scenario.dims)) for g in design.groups}
    cells = []
    for i, node in enumerate(netlist.nodes()):
        timed = {name: timings[i] for name, timings in per_group.items()}
        first = next(iter(timed.values()), None)
        cells.append({
            "name": node.name, "hierarchy": netlist.hierarchy(node), "op": node.op_type,
            "domain": node.domain or "ai.onnx", "cell": first.cell if first else f"{node.op_type}.{precision_of(node)}",
            "precision": precision_of(node),
            "delay": {name: t.delay for name, t in timed.items()},
            "source": {name: t.source for name, t in timed.items()},
        })
    return {
        "format": 1, "softsyn": __version__, "design": netlist.name, "library": design.library.name,
        "constraints_file": str(design.constraints.source),
        "units": {"delay": "s"},
        "groups": {g.name: g.scenario.dims for g in design.groups},
        "cell_count": len(cells), "cells": cells,
    }


def _ports(values, shapes_by_group: dict) -> dict:
    return {v.name: {"dtype": ir.DataType(v.dtype).name.lower(),
                     "shape": [d if isinstance(d, int) else str(d) for d in v.shape] if v.shape is not None else None,
                     "scenarios": {g: list(shapes[v.name]) for g, shapes in shapes_by_group.items() if v.name in shapes}}
            for v in values}


def compiled_precision(netlist) -> str:
    """The precision most weight-bearing cells (MatMul, Gemm) run in: what the verify budget defaults on."""
    found = Counter(precision_of(n) for n in netlist.nodes() if n.op_type in ("MatMul", "Gemm", "MatMulNBits"))
    return found.most_common(1)[0][0] if found else "fp32"


def session_json(design, reference: dict, plan: bool = False) -> dict:
    """ORT settings to run DIR/model.onnx as compiled, plus what `softsyn verify` needs (a plan: no model)."""
    netlist, library, cons = design.netlist, design.library, design.constraints
    shapes = {g.name: netlist.bind(g.scenario.dims) for g in design.groups}
    graph = netlist.model.graph
    providers = ([library.provider, "CPUExecutionProvider"] if library.is_gpu else ["CPUExecutionProvider"])
    kv_ports = [v.name for v in list(graph.inputs) + list(graph.outputs) if "past" in v.name or "present" in v.name]
    return {
        "format": 1,
        "model": None if plan else MODEL_FILE,
        "plan": plan,
        "providers": providers,
        "session_options": {"graph_optimization_level": "ORT_ENABLE_ALL", "intra_op_num_threads": 0},
        "inputs": _ports(graph.inputs, shapes),
        "outputs": _ports(graph.outputs, shapes),
        "scenarios": {g.name: {"dims": g.scenario.dims, "clock_period": g.clock_period} for g in design.groups},
        "kv_cache": {"ports": kv_ports, "dtype": next((ir.DataType(v.dtype).name.lower() for v in graph.inputs
                                                       if v.name in kv_ports), None),
                     "max_length": cons.kv_cache.max_length} if kv_ports else None,
        "precision": compiled_precision(netlist),
        "precision_request": design.pass_reports.get("precision"),  # requested vs realised uniform precision
        "reference": reference,
        "accuracy": {"max_rel_error": cons.accuracy.max_rel_error, "min_top1": cons.accuracy.min_top1},
        "target": library.name,
    }
