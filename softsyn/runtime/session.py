"""The one ONNX Runtime session factory: every InferenceSession softsyn opens is made here, from SessionSettings.

`open_session(model, settings)` builds the SessionOptions and the provider list from a frozen SessionSettings and
checks what the session got: onnxruntime-gpu lists CUDA even on machines without a GPU and silently falls back to
the CPU, so the provider is read from `session.get_providers()` after creation, never from
`get_available_providers()`. `open_model(path, ...)` is the form for a model file the user gave (signoff, verify,
benches): a file the runtime cannot load is a SoftsynError naming it.

The device in words (`device_name`, `describe_device`) and the provider-name mapping (`PROVIDERS`) live here too,
as do the IR version and opset of the models softsyn builds for ORT.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from softsyn.errors import SoftsynError

IR_VERSION = 10  # onnx 1.23 writes IR 14 by default; ORT 1.31 reads at most 13, and the exporter writes 10
OPSET = 17

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
# The SessionOptions a compiled artifact runs with (emit writes them to runtime/session.json; signoff reads them back)
ARTIFACT_OPTIONS = {"graph_optimization_level": "ORT_ENABLE_ALL", "intra_op_num_threads": 0}
MAX_THREADS = 256  # twice the cores of the largest host softsyn targets; ORT crashes (SIGSEGV) where threads run out
OPTIMIZATION_LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_LAYOUT",
                       "ORT_ENABLE_ALL")
EXECUTION_MODES = ("ORT_SEQUENTIAL", "ORT_PARALLEL")


def _threads(value) -> str | None:
    ok = type(value) is int and 0 <= value <= MAX_THREADS
    return None if ok else f"an integer 0..{MAX_THREADS} (0: ORT's default)"


def _flag(value) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def _one_of(names: tuple[str, ...]):
    return lambda value: None if value in names else f"one of {', '.join(names)}"


# The SessionOptions runtime/session.json may set, each with the check of its value (what valid values are, or None).
# Anything else (optimized_model_filepath, profile_file_prefix: files written wherever the JSON says) is refused;
# docs/report-formats.md lists them.
SESSION_OPTIONS = {
    "graph_optimization_level": _one_of(OPTIMIZATION_LEVELS),
    "intra_op_num_threads": _threads,
    "inter_op_num_threads": _threads,
    "execution_mode": _one_of(EXECUTION_MODES),
    "enable_mem_pattern": _flag,
    "enable_mem_reuse": _flag,
    "enable_cpu_mem_arena": _flag,
    "use_deterministic_compute": _flag,
    "log_severity_level": lambda v: None if type(v) is int and 0 <= v <= 4 else "an integer 0..4 (0 verbose, 4 fatal)",
}


def session_options_problem(options) -> str | None:
    """What is wrong with session options read from a file (runtime/session.json's `session_options`), None when
    nothing: every key must be in SESSION_OPTIONS with a value its check accepts."""
    if not isinstance(options, dict):
        return "session_options: not a JSON object"
    for key, value in options.items():
        check = SESSION_OPTIONS.get(key)
        if check is None:
            return f"session_options.{key}: not an option softsyn passes to ONNX Runtime; valid: {', '.join(SESSION_OPTIONS)}"
        valid = check(value)
        if valid:
            return f"session_options.{key}: {json_text(value)} is not valid; valid: {valid}"
    return None


def json_text(value) -> str:
    """A value as the JSON file wrote it, one line, at most 60 characters."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


# The CUDA provider's attention kernels (its `sdpa_kernel` bitmask): flash (1), memory-efficient (2) and the unfused
# math path (16); not cuDNN's SDPA (8). ORT 1.31.1's GroupQueryAttention prefill picks cuDNN's on the H200 and builds
# a cuDNN graph per new sequence length: 0.9-1.7 s the first time a prompt length is seen, 12-13 ms with this mask,
# repeated lengths 4.1-6.9 ms either way (qwen3-1.7b, 2026-12-03, bench/results/serving-validate-cuda-2026-12-03.md).
# Every CUDA session softsyn opens uses it, and runtime/session.json writes it, so a user's session runs what
# softsyn measured.
CUDA_ATTENTION_KERNELS = 1 | 2 | 16


@dataclass(frozen=True)
class SessionSettings:
    provider: str = "cpu"  # "cpu" | "cuda" (PROVIDERS)
    optimize: bool = True  # False: no graph rewrites (ORT_DISABLE_ALL), e.g. chains ORT would fold away
    optimized_model_filepath: str | None = None  # where ORT writes the graph it optimised
    profile_prefix: str | None = None  # enables ORT's profiler; its JSON trace is named from this prefix
    cuda_graph: bool = False  # the CUDA EP's enable_cuda_graph
    cpu_fallback: bool = True  # False (CUDA): a node the GPU cannot run fails the session (disable_cpu_ep_fallback)
    require_provider: bool = True  # a session that did not get `provider` is an error (False: the fallback is accepted)
    log_severity: int | None = None  # the session's log_severity_level (3: errors only); None: ORT's default
    intra_op_threads: int | None = None  # intra_op_num_threads; None: ORT's default (one per physical core)
    options: tuple[tuple[str, object], ...] = ()  # more SessionOptions attributes by name (runtime/session.json's)


def provider_of(execution_provider: str) -> str:
    """The short provider name ("cpu" | "cuda") of an execution provider's name."""
    for name, ep in PROVIDERS.items():
        if ep == execution_provider:
            return name
    raise SoftsynError(f"execution provider {execution_provider}: softsyn runs {', '.join(PROVIDERS.values())}")


_PROBED: dict[str, str | None] = {}  # provider -> why no session opens on it (None: one does), once per process


def provider_problem(provider: str) -> str | None:
    """None when a session on `provider` ("cpu" / "cuda") opens here, else why not, in words: onnxruntime-gpu lists
    CUDAExecutionProvider on a machine without a GPU too, and falls back to the CPU there (said as an error log,
    silenced), so a one-node session is opened to know."""
    if provider == "cpu":
        return None
    if provider in _PROBED:
        return _PROBED[provider]
    why = None
    if PROVIDERS.get(provider) not in ort.get_available_providers():
        why = f"provider {provider} not available here"
    else:
        x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
        probe = onnx.helper.make_model(
            onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "probe", [x],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]),
            ir_version=10, opset_imports=[onnx.helper.make_opsetid("", 18)])
        ort.set_default_logger_severity(4)  # a CUDA provider without its libraries logs an error, then CPU would run it
        try:
            open_session(probe, SessionSettings(provider=provider, log_severity=4))
        except Exception as exc:  # noqa: BLE001 - no device, or no CUDA libraries
            why = f"provider {provider} not available here (no session opens on it: {' '.join(str(exc).split())[:240]})"
        finally:
            ort.set_default_logger_severity(2)
    _PROBED[provider] = why
    return why


def provider_opens(provider: str) -> bool:
    """Whether a session on `provider` opens here (provider_problem)."""
    return provider_problem(provider) is None


def external_initializer(name: str, elem: int, dims, nbytes: int = 0, location: str = "softsyn-host") -> onnx.TensorProto:
    """An initializer's header with its data named external: open_session's `external` hands the session the array
    itself (a model past protobuf's 2 GiB, or one array shared by many initializers), so the location is a label."""
    t = onnx.TensorProto(name=name, data_type=elem, dims=[int(d) for d in dims])
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(nbytes))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def host_array(array: np.ndarray) -> np.ndarray:
    """An array as ORT's external initializers take it: contiguous, and bf16/fp8 (ml_dtypes, no numpy kind ORT
    reads) as unsigned integers of its size (the element type travels beside it)."""
    array = np.ascontiguousarray(array)
    return array if array.dtype.kind in "biuf" else array.view(f"u{array.dtype.itemsize}")


def open_session(model, settings: SessionSettings = SessionSettings(), external: dict | None = None):
    """An InferenceSession on `model` (a path, serialised bytes or an onnx.ModelProto) as `settings` say.

    `external`: name -> (elem, host array) for initializers the model references as external data
    (softsyn.characterize.cellgraph.make_model), copied in by ORT when the session loads. A model ORT cannot load
    raises ORT's own exception (characterisation records that as a missing kernel); a session on another provider
    than asked for is a SoftsynError unless `settings.require_provider` is off."""
    if settings.provider not in PROVIDERS:
        raise SoftsynError(f"unknown provider {settings.provider!r}; valid: {', '.join(PROVIDERS)}")
    so = ort.SessionOptions()
    if settings.log_severity is not None:
        so.log_severity_level = settings.log_severity
    if not settings.optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if settings.intra_op_threads is not None:
        so.intra_op_num_threads = settings.intra_op_threads
    problem = session_options_problem(dict(settings.options))
    if problem:
        raise SoftsynError(f"{model}: {problem}" if isinstance(model, (str, Path)) else problem)
    for key, value in settings.options:
        if key == "graph_optimization_level":
            value = getattr(ort.GraphOptimizationLevel, value)
        elif key == "execution_mode":
            value = getattr(ort.ExecutionMode, value)
        setattr(so, key, value)
    if settings.optimized_model_filepath:
        so.optimized_model_filepath = settings.optimized_model_filepath
    if settings.profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = settings.profile_prefix
    if external:
        so.add_external_initializers(list(external), [ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a, elem)
                                                      for elem, a in external.values()])
    providers: list = ["CPUExecutionProvider"]
    if settings.provider == "cuda":
        cuda = {"device_id": "0", "sdpa_kernel": str(CUDA_ATTENTION_KERNELS)}
        if settings.cuda_graph:
            cuda["enable_cuda_graph"] = "1"
        # ORT adds the CPU provider itself unless the fallback is disabled, which then holds only if it is not listed
        providers = [("CUDAExecutionProvider", cuda)] + (["CPUExecutionProvider"] if settings.cpu_fallback else [])
        if not settings.cpu_fallback:
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    source = str(model) if isinstance(model, (str, Path)) else model
    if hasattr(source, "SerializeToString"):
        source = source.SerializeToString()
    sess = ort.InferenceSession(source, so, providers=providers)
    got = sess.get_providers()
    if settings.require_provider and got[0] != PROVIDERS[settings.provider]:
        where = f"{model}: " if isinstance(model, (str, Path)) else ""
        raise SoftsynError(f"{where}asked for {PROVIDERS[settings.provider]} but the session runs on {got}: is there "
                           "a GPU, and are the CUDA libraries on LD_LIBRARY_PATH?")
    return sess


def open_model(model_path: str | Path, provider: str = "cpu", options: dict | None = None,
               profile_prefix: str | None = None, cuda_graph: bool = False):
    """A session on a model file the user gave, on `provider` with `options` (SessionOptions attributes by name, as
    runtime/session.json records them); a file the runtime cannot load is a SoftsynError naming it."""
    settings = SessionSettings(provider=provider, options=tuple((options or {}).items()), profile_prefix=profile_prefix,
                               cuda_graph=cuda_graph)
    try:
        return open_session(model_path, settings)
    except SoftsynError:
        raise
    except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
        raise SoftsynError(f"{model_path}: onnxruntime cannot load it: {type(exc).__name__}: {exc}") from None


# ------------------------------------------------------------------------------------------ the device

def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_isa() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    keep = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "avx_vnni", "amx_bf16",
            "amx_int8")
    return [f for f in keep if f in flags]


def _nvidia_smi(fields: str) -> str:
    """nvidia-smi's first line for the query `fields` ("" where it does not run)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return next((line.strip() for line in out.splitlines() if line.strip()), "")


def device_name(provider: str) -> str:
    """The device in words, for reports: CPU model and core count, or the GPU's name."""
    if provider == "cuda":
        return _nvidia_smi("name") or "CUDA GPU"
    return f"{cpu_model()}, {os.cpu_count()} cores"


def describe_device(provider: str) -> str:
    """The device in words, for a library header: the GPU's name, memory and driver, or the CPU model, the cores
    this process may use and the ISA extensions the kernels can use."""
    if provider == "cuda":
        line = _nvidia_smi("name,memory.total,driver_version")
        return f"{line} (nvidia-smi name, memory, driver)" if line else "unknown CUDA device (nvidia-smi unavailable)"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    isa = _cpu_isa()
    return f"{cpu_model()}, {cores} cores" + (f" ({', '.join(isa)})" if isa else "")
