"""Emit a compiled design into DIR through softsyn.outdir (staged beside DIR, swapped in whole, with its manifest).

The writers, in the order `emit` runs them, one line each:

    model.write_models            DIR/model.onnx (+ model.onnx.data; a composite: one model per block), checked to load
    netlist_json.netlist_json     DIR/netlist.json: every cell, its library cell, precision and delay per group
    session.session_json          DIR/runtime/session.json: ORT session settings, IO, scenario dims, KV buffers, reference
    genai.write_genai             DIR/genai_config.json (+ tokenizer): a decoder's onnxruntime-genai config
    engines.write_engines         DIR/runtime/vllm*.json|sh, trtllm-*: a decoder's vLLM and TensorRT-LLM settings
    report_files.write_report_files  DIR/reports/*, compile.log, compile_log.json, then reports/report.html
    torch_lowering.lower          a torch target instead of the model, session.json, genai and engines: DIR/model.pt2,
                                  DIR/runtime/torch.json, the package measured per path group (reports/torch.rpt),
                                  its macro cells (runtime/torch_macros.json, reports/torch_macros.rpt)
    softsyn.outdir                DIR/softsyn-manifest.json: what softsyn wrote (on leaving outdir.replace)

Passes hand emit what they add through their reports' protocol (passes.PassReport: artifact notes, session.json
entries; reports render fusion and precision reports by type), never by a pass's name.

A failed emit leaves DIR as it was; the artifact is byte-identical for the same inputs wherever the export cache is
(no run facts or absolute paths in it: softsyn.frontends.cache.design_provenance).
"""
from __future__ import annotations

from pathlib import Path

from softsyn import outdir, progress
from softsyn.errors import SoftsynError
from softsyn.emit.engines import write_engines
from softsyn.emit.genai import write_genai
from softsyn.emit.model import MODEL_FILE, check, ort_errors, require_weights, write_models
from softsyn.emit.netlist_json import netlist_json
from softsyn.emit.report_files import write_report_files
from softsyn.emit.session import SESSION_FILE, compiled_precision, session_json, write_json
from softsyn.results.compile_log import CompileLog
from softsyn.timing import Analysis

__all__ = ["emit", "check_target", "MODEL_FILE", "SESSION_FILE", "check", "compiled_precision", "netlist_json", "ort_errors",
           "require_weights", "session_json"]


def check_target(design, source: str, plan: bool) -> None:
    """Refuse, before any pass runs, a compile whose emit could not finish: a torch target's weightless plan, or a
    CUDA torch target where torch sees no CUDA device."""
    if design.torch_target is None:
        return
    if plan:
        raise SoftsynError(f"{source}: target {design.torch_target} lowers a model with weights, and "
                           f"{design.netlist.name} is compiled as a weightless plan here (too large to materialise, "
                           "or --plan)")
    problem = _torch_side().device_problem(design.torch_target)
    if problem:
        raise SoftsynError(f"{source}: {problem}")


def emit(design, analysis: Analysis, out_dir: str | Path, log: CompileLog, reference: dict, plan: bool = False) -> Path:
    """Write the compiled design; `plan`: everything but the model (a weightless netlist's compile)."""
    netlist, source = design.netlist, str(reference.get("source", ""))  # check_target ran before the passes
    if not plan:
        require_weights(netlist)
    with outdir.replace(out_dir, "compile", netlist.name, model=source,
                        inputs=outdir.input_paths(netlist.provenance), progress=design.progress) as staged:
        tmp = staged.path
        if design.torch_target is not None and not plan:
            cells = netlist_json(design, analysis, None)  # before the lowering: the macro cells map to its cells
            for written in _torch_side().lower(design, reference, tmp, log.notes, cells["cells"]):
                staged.seal(written, "compile")
            write_json(tmp / "netlist.json", cells)
            write_report_files(design, analysis, tmp, log)
            return staged.out
        session = session_json(design, reference, plan)
        if not plan:
            with progress.step(f"emit: writing {netlist.name}'s model, onnx.checker, ONNX Runtime load check",
                               enabled=design.progress, done="emit: model written and loaded"):
                for written in write_models(design, tmp, session["providers"]):
                    staged.seal(written, "compile")
        write_json(tmp / "netlist.json", netlist_json(design, analysis, (session["precision_request"] or {}).get("requested")))
        write_json(tmp / SESSION_FILE, session)
        log.notes += [line for report in design.pass_reports.values() for line in report.artifact_notes()]
        log.notes += write_genai(tmp, netlist, session, source)
        write_engines(design, analysis, tmp, source, log.notes)
        write_report_files(design, analysis, tmp, log)
    return staged.out


def _torch_side():
    """softsyn.emit.torch_lowering, imported when a torch target is compiled."""
    # deferred: torch and transformers take seconds to import; only a torch target's lowering needs them
    from softsyn.emit import torch_lowering

    return torch_lowering

