"""DIR/runtime/session.json: the ORT settings to run the compiled model (providers, options, IO dtypes and shapes per
scenario, KV buffers) and what `softsyn verify` needs (the reference, the accuracy budget, the compiled precision)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx_ir as ir

from softsyn.emit.model import MODEL_FILE
from softsyn.netlist.keys import FP8_MATMUL
from softsyn.runtime.session import ARTIFACT_OPTIONS, CUDA_ATTENTION_KERNELS
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


MERGED = ("kv_cache",)  # session.json's own sections a pass refines; null where the model has none (no KV ports)


def with_pass_entries(session: dict, reports) -> dict:
    """`session` with each pass report's entries (passes.PassReport.session_entries), in pass order: a MERGED
    section's entry is merged into it where the session has it; any other entry sets its key."""
    for report in reports:
        for key, value in report.session_entries().items():
            if key not in MERGED:
                session[key] = value
            elif session.get(key) is not None:
                session[key] = {**session[key], **value}
    return session


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
    captured = any(launch.captured for launch in design.launches.values())
    return with_pass_entries({
        "format": 1,
        "model": None if plan else MODEL_FILE,
        "plan": plan,
        "providers": providers,
        # enable_cuda_graph "1" where a group's graph can be captured (softsyn.timing.capture: decode with a shared
        # KV buffer, every node on CUDA); the attention kernels every softsyn session uses (no per-length cuDNN
        # graphs); softsyn run and genai_config.json take their provider options from here
        "provider_options": {library.provider: {"enable_cuda_graph": "1" if captured else "0",
                                                "sdpa_kernel": str(CUDA_ATTENTION_KERNELS)}}
        if library.is_gpu else {},
        "cuda_graph": {name: launch.describe(library) for name, launch in design.launches.items()},
        "session_options": dict(ARTIFACT_OPTIONS),
        "inputs": _ports(graph.inputs, shapes),
        "outputs": _ports(graph.outputs, shapes),
        "scenarios": {g.name: {"dims": g.scenario.dims, "clock_period": g.clock_period} for g in design.groups},
        "kv_cache": {"ports": kv_ports, "dtype": next((ir.DataType(v.dtype).name.lower() for v in graph.inputs
                                                       if v.name in kv_ports), None),
                     "max_length": cons.kv_cache.max_length, "shared_buffer": False} if kv_ports else None,
        "precision": compiled_precision(netlist),
        "precision_request": None,  # the uniform map's requested vs realised (read from the model): precision's entry
        "realised_precision": realised_precision(netlist).to_dict(),  # per weight precision and KV port, as held
        "precision_map": None,  # the loop's map summed and its measured rounds: optimize's entry
        "kv_moves": [],  # the loop's KV moves: optimize's entry
        "reference": reference,
        "accuracy": {"max_rel_error": cons.accuracy.max_rel_error, "min_top1": cons.accuracy.min_top1},
        "target": library.name,
        **({"blocks": netlist.blocks()} if netlist.blocks() else {}),  # a composite: one model per block, run in order
        **({"prompts": _prompts(cons.serving)} if cons.serving is not None else {}),
    }, design.pass_reports.values())


def _prompts(serving) -> dict:
    """How an engine serving this artifact feeds prompts (the serving block's choices, which the compile modelled)."""
    pad = serving.prompt_buckets
    return {"pad_to_multiple_of": pad, "padding": "right (attention_mask 0 on the padding); the logits are each row's "
            "last real token's" if pad else "none: every prompt at its own length (the logits are the last position's)",
            "warm_at_load": "every prefill length up to the serving block's cap, once" if serving.warm_prompts else
            "none"}
