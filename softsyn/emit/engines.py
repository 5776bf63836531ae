"""Serving settings for the engines that run tensor parallelism in production, from the compiled choices.

softsyn does not run these engines; it writes what they would be started with for the design it compiled:
the tensor-parallel degree, the context the KV cache was sized for, the KV dtype, the weights' precision,
the concurrency the per-device KV budget holds and the decode batch sizes to capture as CUDA graphs; with a
`serving:` block the batching settings come from its simulation instead (softsyn.emit.engine_serving), each with a
comment line saying where it came from.

    DIR/runtime/vllm.json           vLLM EngineArgs keyword arguments (`LLM(**json)` / AsyncEngineArgs)
    DIR/runtime/vllm-serve.sh       the same as `vllm serve` flags
    DIR/runtime/trtllm-llm-api.yaml TensorRT-LLM LLM API arguments (TorchLlmArgs): `LLM(**yaml)`, or
                                    `trtllm-serve MODEL --extra_llm_api_options trtllm-llm-api.yaml`
    DIR/runtime/trtllm-serve.sh     that trtllm-serve line

Option names are those of vLLM's EngineArgs / CompilationConfig and TensorRT-LLM's LlmArgs / KvCacheConfig /
CudaGraphConfig (a test checks each key against a list read from their sources, tests/timing/data/engine_options.json).
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml

from softsyn.emit.engine_serving import serving_settings
from softsyn.emit.session import compiled_precision
from softsyn.timing import Analysis
from softsyn.timing.area import kv_length

# The published checkpoints whose shapes the real-size zoo entries copy (the engines load weights by name).
PUBLISHED = {"qwen3-0.6b": "Qwen/Qwen3-0.6B", "qwen3-1.7b": "Qwen/Qwen3-1.7B", "qwen3-8b": "Qwen/Qwen3-8B",
             "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B"}
TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
MAX_SEQS = 1024  # the most concurrent sequences written (vLLM's default max_num_seqs is 256)
FILES = ("runtime/vllm.json", "runtime/vllm-serve.sh", "runtime/trtllm-llm-api.yaml", "runtime/trtllm-serve.sh")


def model_name(source: str) -> str:
    """What the engines load: the published checkpoint of a zoo shape, else the model as given."""
    name = source.removeprefix("zoo:")
    if name in PUBLISHED:
        return PUBLISHED[name]
    return source[: -len("/config.json")] if source.endswith("/config.json") else source  # the folder it names


def capture_sizes(max_seqs: int) -> list[int]:
    """Decode batch sizes to capture: powers of two up to the largest concurrency, and it."""
    sizes = [1 << i for i in range(max_seqs.bit_length()) if (1 << i) <= max_seqs]
    return sizes + ([max_seqs] if sizes[-1] != max_seqs else [])


def settings(design, analysis: Analysis, source: str, precision: str) -> dict:
    """The derived figures both engines' settings are written from; `precision`: the compiled weights'. "derived":
    a line per value the serving simulation set (empty without a serving block)."""
    cons, netlist = design.constraints, design.netlist
    budget = analysis.area.kv_budget
    length = budget.length if budget else kv_length(cons)[0]
    w = cons.workload
    seqs = w.batch * w.concurrency
    if budget is not None and budget.max_concurrency:
        seqs = max(seqs, budget.max_concurrency * budget.batch)
    seqs = max(1, min(seqs, MAX_SEQS))
    kv_seqs = max(1, min(budget.max_concurrency * budget.batch, MAX_SEQS)) \
        if budget is not None and budget.max_concurrency is not None else None
    n = analysis.tp.n if analysis.tp else 1
    limit = cons.area_constraint
    memory = _device_memory(design.library.header.get("device", ""))
    experts = int((netlist.config or {}).get("num_experts") or 0)
    # vLLM's gpu_memory_utilization is the instance's share of the device (weights, activations and KV);
    # TensorRT-LLM's free_gpu_memory_fraction the KV cache's share of what is free once weights and buffers are in
    kv_free = None
    if budget is not None and budget.available is not None and memory:
        free = memory - budget.weights - budget.workspace
        kv_free = float(f"{min(max(budget.available / free, 0.0), 0.95):.3g}") if free > 0 else None
    s = {"model": model_name(source), "tp": n, "precision": precision, "max_len": length, "max_seqs": seqs,
         "kv_dtype": cons.kv_cache.dtype, "memory_fraction": float(f"{min(limit / memory, 0.95):.3g}")
         if limit and memory else None, "kv_free_fraction": kv_free, "experts": experts,
         "max_tokens": max(w.batch * w.prompt_len, seqs), "capture": capture_sizes(seqs), "batched_tokens": None,
         "derived": [], "serving_notes": []}
    served = analysis.serving.schedule if analysis.serving is not None else None
    if design.serving is not None and served is not None:  # the serving simulation's batching replaces the defaults
        values, s["derived"], s["serving_notes"] = serving_settings(design.serving, served, kv_seqs, length,
                                                                    s["capture"])
        s.update(values, max_tokens=values["batched_tokens"])
    return s


def _device_memory(device: str) -> float | None:
    """Bytes of device memory from a library header's device line ("NVIDIA H200, 143771 MiB, ...")."""
    found = re.search(r"(\d+)\s*MiB", device)
    return int(found.group(1)) * 2**20 if found else None


def vllm_args(s: dict) -> dict:
    args = {"model": s["model"], "dtype": TORCH_DTYPES.get(s["precision"], "auto"), "tensor_parallel_size": s["tp"],
            "max_model_len": s["max_len"], "kv_cache_dtype": "fp8" if s["kv_dtype"] == "fp8" else "auto",
            "max_num_seqs": s["max_seqs"]}
    if s["batched_tokens"]:
        args["max_num_batched_tokens"] = s["batched_tokens"]
    args["compilation_config"] = {"cudagraph_capture_sizes": s["capture"]}
    if s["precision"] in ("int8", "fp8"):
        args["quantization"] = "fp8"  # vLLM's online fp8 weights: the nearest it has to 8-bit weight-only
    if s["memory_fraction"]:
        args["gpu_memory_utilization"] = s["memory_fraction"]
    if s["experts"] and s["tp"] > 1:
        args["enable_expert_parallel"] = True
    return args


def trtllm_args(s: dict) -> dict:
    args = {"tensor_parallel_size": s["tp"], "dtype": TORCH_DTYPES.get(s["precision"], "auto"),
            "max_batch_size": s["max_seqs"], "max_seq_len": s["max_len"], "max_num_tokens": s["max_tokens"],
            "kv_cache_config": {"dtype": "fp8" if s["kv_dtype"] == "fp8" else "auto"},
            "cuda_graph_config": {"batch_sizes": s["capture"], "max_batch_size": s["capture"][-1],
                                  "enable_padding": True}}
    if s["kv_free_fraction"]:
        args["kv_cache_config"]["free_gpu_memory_fraction"] = s["kv_free_fraction"]
    if s["experts"] and s["tp"] > 1:
        args["moe_expert_parallel_size"] = s["tp"]
    return args


def vllm_serve(args: dict) -> str:
    """`vllm serve MODEL --flag value ...` from EngineArgs (each field is its --kebab-case flag)."""
    words = ["vllm", "serve", args["model"]]
    for key, value in args.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            words.append(flag)
        else:
            words += [flag, json.dumps(value, separators=(",", ":")) if isinstance(value, dict) else str(value)]
    return " ".join(shlex.quote(w) for w in words)


def engine_files(design, analysis: Analysis, source: str, precision: str, notes: list[str]) -> dict[str, str]:
    """DIR-relative path -> text of each engine settings file (module docstring); a line for the compile log.
    `precision`: the compiled weights' (softsyn.emit.session.compiled_precision)."""
    s = settings(design, analysis, source, precision)
    v, t = vllm_args(s), trtllm_args(s)
    head = (f"# softsyn {design.netlist.name}: serving settings derived from the compile (TP={s['tp']}, "
            f"{s['precision']} weights, {s['max_len']} tokens of context, {s['max_seqs']} sequences); "
            "softsyn does not run this engine.\n") + "".join(f"# {line}\n" for line in s["derived"])
    unpublished = source.startswith("zoo:") and s["model"] == source  # a tiny zoo model: no checkpoint to load
    notes.append(f"runtime/: vLLM and TensorRT-LLM settings for TP={s['tp']} ({', '.join(FILES)}); settings for those "
                 "engines, not run here" + (f"; {source} is no published checkpoint: point `model` at one with its "
                                            "shapes" if unpublished else ""))
    if s["derived"]:
        notes.append("runtime/: batching from the serving simulation: " + "; ".join(s["derived"]))
    notes += s["serving_notes"]
    if s["precision"] == "int4":
        notes.append("runtime/: int4 weights need an int4 checkpoint (AWQ/GPTQ) for vLLM and TensorRT-LLM; "
                     "the settings name none")
    return {
        FILES[0]: json.dumps(v, indent=1) + "\n",
        FILES[1]: "#!/bin/sh\n" + head + vllm_serve(v) + "\n",
        FILES[2]: head + yaml.safe_dump(t, sort_keys=False),
        FILES[3]: "#!/bin/sh\n" + head + " ".join(shlex.quote(w) for w in [
            "trtllm-serve", s["model"], "--backend", "pytorch", "--tp_size", str(s["tp"]),
            "--extra_llm_api_options", "$(dirname \"$0\")/trtllm-llm-api.yaml"]).replace(
            "'$(dirname \"$0\")/trtllm-llm-api.yaml'", "\"$(dirname \"$0\")/trtllm-llm-api.yaml\"") + "\n",
    }


def write_engines(design, analysis: Analysis, folder: Path, source: str, notes: list[str]) -> None:
    """A decoder's engine settings files (engine_files) into `folder`; their line goes to `notes`."""
    if design.netlist.kind != "decoder":
        return
    for name, text in engine_files(design, analysis, source, compiled_precision(design.netlist), notes).items():
        (folder / name).write_text(text)
