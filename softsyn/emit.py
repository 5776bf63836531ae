"""Emit a compiled design into DIR through softsyn.outdir (staged beside DIR, swapped in whole, with its manifest).

    DIR/model.onnx (+ model.onnx.data)   the compiled netlist, checked by onnx.checker (path form) and
                                         loaded by ONNX Runtime with the target's providers
    DIR/netlist.json                     every cell: hierarchy, op, library cell, precision, delay per group
    DIR/runtime/session.json             ORT session settings, IO dtypes, scenario dims, KV buffers, reference
    DIR/genai_config.json (+ tokenizer)  a decoder's onnxruntime-genai config (softsyn.runtime.genai)
    DIR/runtime/vllm*.json|sh, trtllm-*  a decoder's vLLM and TensorRT-LLM serving settings (softsyn.runtime.engines)
    DIR/reports/*.rpt, DIR/analysis.json the analysis of the compiled netlist (reports), fusion.json
    DIR/compile.log, compile_log.json    one row per step (text, JSON)
    DIR/reports/report.html              the page of all of it (reports.html), written last
    DIR/softsyn-manifest.json            what softsyn wrote (softsyn.outdir)

A failed emit leaves DIR as it was; the artifact is byte-identical for the same inputs wherever the
export cache is (no run facts or absolute paths in it: softsyn.frontends.cache.design_provenance).
"""
from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from pathlib import Path

import onnx
import onnx_ir as ir

from softsyn import __version__, outdir, progress
from softsyn.errors import SoftsynDefect, SoftsynError
from softsyn.frontends.cache import design_provenance
from softsyn.frontends.vlm import split_blocks
from softsyn.netlist import NETLIST_META_KEY
from softsyn.runtime.engines import engine_files
from softsyn.runtime.genai import write_genai
from softsyn.runtime.session import ARTIFACT_OPTIONS, IR_VERSION, SessionSettings, open_session, provider_of
from passes.precision.mapping import REQUESTED_KEY
from softsyn.timing import Analysis, cell_timings, precision_of
from softsyn.timing.cost import FP8_MATMUL
from softsyn.timing.realised import realised_precision

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
SESSION_FILE = "runtime/session.json"
ORT_DOMAIN = "com.microsoft"


def require_weights(netlist) -> None:
    """A compiled model needs real weights (SoftsynError for a weightless export)."""
    if str(netlist.provenance.get("weights", "")).startswith("meta"):
        raise SoftsynError(f"design {netlist.name}: weights are not materialised ({netlist.provenance['weights']}); "
                           "a compiled model needs real weights: compile an ONNX file or a model folder with weights, "
                           "or ask for the weightless plan (--plan)")


def emit(design, analysis: Analysis, out_dir: str | Path, log, reference: dict, plan: bool = False) -> Path:
    """Write the compiled design; `plan`: everything but the model (a weightless netlist's compile)."""
    import reports
    from reports.compile_log import compile_log_json, report_compile_log
    from reports.html import write_html
    from reports.advice import design_facts
    from reports.suggest import precision_moves, precision_suggestions

    netlist = design.netlist
    if not plan:
        require_weights(netlist)
    with outdir.replace(out_dir, "compile", netlist.name, model=str(reference.get("source", "")),
                        inputs=outdir.input_paths(netlist.provenance), progress=design.progress) as staged:
        tmp = staged.path
        session = session_json(design, reference, plan)
        with progress.step(f"emit: writing {netlist.name}'s model, onnx.checker, ONNX Runtime load check",
                           enabled=design.progress and not plan, done="emit: model written and loaded"):
            if not plan and netlist.blocks():
                for block, model in split_blocks(netlist.model, netlist.blocks()).items():
                    file = next(b["file"] for b in netlist.blocks() if b["name"] == block)
                    _write_model(netlist, tmp, model, file)
                    check_loads(tmp / file, session["providers"], f"{netlist.name} block {block}")
                    for written in (file, f"{file}.data"):
                        staged.seal(written, "compile")
            elif not plan:
                _write_model(netlist, tmp)
                check_loads(tmp / MODEL_FILE, session["providers"], netlist.name)
                for written in (MODEL_FILE, DATA_FILE):
                    staged.seal(written, "compile")
        _write_json(tmp / "netlist.json", netlist_json(design, analysis))
        _write_json(tmp / SESSION_FILE, session)
        kv_layout = design.pass_reports.get("kv_layout")
        if kv_layout is not None:
            log.notes += kv_layout.lines()
        for name, rule in ((design.pass_reports.get("precision") or {}).get("rules") or {}).items():
            log.notes.append(f"precision rule {name}: {rule['held']}")
        log.notes += write_genai(tmp, netlist, session, str(reference.get("source", "")))
        if netlist.kind == "decoder":
            for name, text in engine_files(design, analysis, str(reference.get("source", "")),
                                           compiled_precision(netlist), log.notes).items():
                (tmp / name).write_text(text)
        precision_map = design.pass_reports.get("optimize")
        moves = precision_suggestions(precision_map, analysis.groups) if precision_map is not None else []
        log.notes += [f"suggestion: {m}" for m in moves]
        facts = design_facts(design, analysis, log.effort, precision_moves(precision_map, analysis.groups))
        reports.write_reports(analysis, tmp, facts=facts)
        coverage = design.pass_reports.get("fuse")
        if coverage is not None:
            (tmp / "reports" / "fusion.rpt").write_text(
                reports.report_fusion(coverage, design=netlist.name, target=design.library.name))
            (tmp / "reports" / "fusion.json").write_text(
                reports.fusion_json(coverage, design=netlist.name, target=design.library.name))
        if precision_map is not None:
            (tmp / "reports" / "precision.rpt").write_text(
                reports.report_precision(precision_map, design=netlist.name, target=design.library.name))
        log.add("emit", analysis, len(netlist.nodes()))  # its elapsed: the model written and loaded, the reports
        (tmp / "compile.log").write_text(report_compile_log(log))
        (tmp / "compile_log.json").write_text(compile_log_json(log))
        write_html(tmp)  # last: the page reads the files above
    return staged.out


def _write_model(netlist, folder: Path, model=None, file: str = MODEL_FILE) -> None:
    """The netlist's model (or one block of a composite, `model`) as `file` + `file`.data."""
    model = netlist.model if model is None else model
    model.metadata_props[NETLIST_META_KEY] = json.dumps(
        {**netlist.to_meta(), "provenance": design_provenance(netlist.provenance)}, sort_keys=True, default=str)
    model.ir_version = min(model.ir_version, IR_VERSION)
    path = folder / file
    ir.save(model, str(path), external_data=DATA_FILE if file == MODEL_FILE else f"{file}.data",
            size_threshold_bytes=1024)
    try:
        check(path)
    except onnx.checker.ValidationError as exc:
        first = " ".join(str(exc).split())
        source = netlist.provenance.get("file")  # an ONNX source: the checker may refuse what the user gave
        why = source_fails_checker(Path(source)) if source and str(source).endswith(".onnx") else None
        if why:
            raise SoftsynError(f"{source}: the source model fails onnx.checker: {why}") from None
        raise SoftsynDefect(f"design {netlist.name}: softsyn wrote {file}, which fails onnx.checker (a softsyn "
                            f"defect, not your input): {first}") from None


def source_fails_checker(path: Path) -> str | None:
    """The checker's first complaint about a source ONNX file, or None where it passes (or the file is gone)."""
    if not path.is_file():
        return None
    try:
        check(path)
    except onnx.checker.ValidationError as exc:
        return " ".join(str(exc).split())
    return None


# How ONNX Runtime says a node has no kernel: an op a provider lacks, an unknown ONNX op, an unknown domain op
_NO_KERNEL = [re.compile(r"implementation for (?P<op>[\w.]+)\(\d+\) node with name '(?P<node>[^']*)'"),
              re.compile(r'In Node, \("(?P<node>[^"]*)", (?P<op>[\w.]+), "(?P<domain>[^"]*)"'),
              re.compile(r"(?P<domain>[\w.]*):(?P<op>\w+)\(-?\d+\) is not a registered function/op")]


def check_loads(path: Path, providers: list[str], design: str) -> None:
    """ONNX Runtime creates a session on the emitted model with the target's providers (as
    runtime/session.json says): an artifact the runtime cannot load is refused, naming the node."""
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # a provider this machine lacks logs an error, then ORT falls back to the CPU
    try:
        open_session(path, SessionSettings(provider=provider_of(providers[0]), require_provider=False))
        return
    except ort_errors() as exc:
        text = re.sub(r"Load model from \S+ failed:", "", " ".join(str(exc).split()))
    if _loads_as_cpu_view(path, providers):
        return
    why = text
    found = next((m for m in (p.search(text) for p in _NO_KERNEL) if m), None)
    if found is not None:
        op, domain = found["op"], found.groupdict().get("domain")
        nodes = [n.name for n in onnx.load(str(path), load_external_data=False).graph.node
                 if n.op_type == op and (domain is None or n.domain == domain)]
        node = found.groupdict().get("node") or (nodes[0] if nodes else "?")
        more = f" (and {len(nodes) - 1} more)" if len(nodes) > 1 else ""
        why = f"node {node} (op {domain + ':' if domain else ''}{op}) has no kernel{more}"
    raise SoftsynError(f"design {design}: ONNX Runtime ({', '.join(providers)}) cannot load the compiled model: "
                       f"{why}; nothing was written")


def _loads_as_cpu_view(path: Path, providers: list[str]) -> bool:
    """On a machine without the target's provider, whether the model's CPU view (what verify runs here) loads: a
    CUDA-only kernel (fp8 weight cells) refuses the CPU fallback check_loads gets there, the view does not."""
    from softsyn.flow.cpu_view import cpu_view_session
    from softsyn.runtime.session import provider_opens

    if provider_of(providers[0]) == "cpu" or provider_opens(provider_of(providers[0])):
        return False
    try:
        _, changed = cpu_view_session(path)
    except ort_errors():
        return False
    return any(changed.values())


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


def ort_errors() -> tuple[type[Exception], ...]:
    """ONNX Runtime's own exception types (a kernel a provider lacks, a graph it cannot load, bad feeds):
    about the model or the machine, not bugs in softsyn."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return tuple(v for v in vars(state).values() if isinstance(v, type) and issubclass(v, Exception))


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=False, allow_nan=False) + "\n")


def netlist_json(design, analysis: Analysis) -> dict:
    netlist = design.netlist
    per_group = {g.name: cell_timings(netlist, design.library, netlist.bind(g.scenario.dims)) for g in design.groups}
    cells = []
    uniform = (design.pass_reports.get("precision") or {}).get("requested")  # what the uniform map was asked for
    for i, node in enumerate(netlist.nodes()):
        timed = {name: timings[i] for name, timings in per_group.items()}
        first = next(iter(timed.values()), None)
        cells.append({
            "name": node.name, "hierarchy": netlist.hierarchy(node), "op": node.op_type,
            "domain": node.domain or "ai.onnx", "cell": first.cell if first else f"{node.op_type}.{precision_of(node)}",
            "precision": precision_of(node),
            "requested_precision": node.metadata_props.get(REQUESTED_KEY, uniform),
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


def _precision_map(report) -> dict | None:
    """The compile loop's per-cell map summed: cells by requested and by realised precision (netlist.json has each)."""
    if report is None or not getattr(report, "cells", None):
        return None
    from reports import retime_table

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
