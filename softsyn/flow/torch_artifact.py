"""`softsyn verify DIR` and `softsyn run DIR` (and, from softsyn.flow.torch_signoff, `signoff DIR`) on a torch target's artifact (DIR/runtime/torch.json, DIR/model.pt2).

verify: the fp32 reference (the source's ONNX export, read again through the export cache and its content key
checked, as for an ONNX Runtime artifact) runs on ORT CPU with the seeded scenario inputs of every path group; the
package runs the same step: the same ids and positions, the seeded past in its cache's first positions. Logits and
the cache's filled positions (present) are compared as softsyn.flow.verify compares them, against the same budget.
run: greedy generation with the package, a seeded prompt as `softsyn run` draws it for ONNX Runtime, timed per step.
"""
from __future__ import annotations

import time
from pathlib import Path

import onnx_ir as ir

from softsyn import outdir, progress
from softsyn.errors import SoftsynError
from softsyn.flow.run import TAKES, RunResult, RunSettings
from softsyn.flow.verify import judge, reference_path
from softsyn.frontends import roles
from softsyn.netlist import Netlist
from softsyn.results.verify import DEFAULT_REL_ERROR, OutputCheck, VerifyResult
from softsyn.runtime.artifact import TORCH_PACKAGE
from softsyn.runtime.generate import prompt_ids
from softsyn.runtime.inputs import scenario_inputs
from softsyn.runtime.session import SessionSettings, device_name, open_session
from softsyn.flow.torch_signoff import signoff  # noqa: F401  (the CLI reaches the torch flows through this module)
from softsyn.library.torch_targets import DTYPE_PRECISION
from softsyn.runtime.torch_package import TorchStep, package_label, packages, read_torch_settings

MAX_BATCH = 1024  # rows a scenario of runtime/torch.json may ask verify to allocate (it is untrusted input)
INTERVAL = ("host wall clock per step: the ids and positions made tensors on the device, one call of the AOTInductor "
            "package (the KV cache written in place; on CUDA a replayed CUDA graph, captured in the warm-up runs), "
            "the last position's argmax (greedy) read back; TTFT = the prefill step, TPOT = one decode step; no "
            "tokenisation, package loading or cache allocation")


def provider_label(settings: dict) -> str:
    graphs = ", CUDA graphs" if settings.get("cuda_graphs") and settings["device"] == "cuda" else ""
    plural = "s" if len(packages(settings)) > 1 else ""
    return (f"torch AOTInductor package{plural} ({package_label(settings)}, {settings['device'].upper()}, "
            f"{settings['dtype']}{graphs})")


def host(tensor):
    """A device tensor as fp32 on the host (the reference's dtype: fp16 logits compared as fp32)."""
    return tensor.float().cpu().numpy()


def _reference(settings: dict, cache_dir) -> tuple[Path, Netlist]:
    ref_path = reference_path(settings, cache_dir)
    try:
        reference = Netlist.from_model(ir.load(str(ref_path)))
    except Exception as exc:  # protobuf and onnx-ir raise many types for a file that is not a valid model
        raise SoftsynError(f"{ref_path}: the reference is not a readable ONNX model ({type(exc).__name__}); "
                           "re-run softsyn compile") from None
    roles.apply_roles(reference.model, roles.find_roles(reference.model).renames)
    return ref_path, reference


def declares_last_logits(settings: dict) -> bool:
    """Whether runtime/torch.json declares logits of the last position only (outputs.logits [batch, 1, vocab]):
    verify then compares them with the reference's last position, as for an ONNX Runtime artifact."""
    outputs = settings.get("outputs")
    shape = outputs.get("logits") if isinstance(outputs, dict) else None
    return isinstance(shape, list) and len(shape) == 4 and shape[1] == 1


def _checks(scenario: str, got: dict, expected: dict, max_rel: float, min_top1) -> list[OutputCheck]:
    checks = []
    for name, value in got.items():
        if value.shape != expected[name].shape:
            raise SoftsynError(f"{TORCH_PACKAGE}: output {name} has shape {list(value.shape)} in scenario {scenario}, "
                               f"the reference's {list(expected[name].shape)}; re-run softsyn compile")
        checks.append(judge(scenario, name, value, expected[name], logits=name == "logits", max_rel=max_rel,
                            min_top1=min_top1))
    return checks


def verify(directory: str | Path, seed: int = 0, cache_dir: str | Path | None = None,
           progress_on: bool = False) -> VerifyResult:
    out = Path(directory)
    settings = read_torch_settings(out)
    step = TorchStep(out, settings)
    layers = settings["kv_cache"]["layers"]
    budget = settings.get("accuracy") or {}
    max_rel, source = budget.get("max_rel_error"), "accuracy.max_rel_error"
    if max_rel is None:
        known = DTYPE_PRECISION[settings["dtype"]] if DTYPE_PRECISION[settings["dtype"]] in DEFAULT_REL_ERROR else "fp32"
        max_rel, source = DEFAULT_REL_ERROR[known], f"default for {known}"
    ref_path, reference = _reference(settings, cache_dir)
    session = open_session(ref_path, SessionSettings(provider="cpu"))
    names = [o.name for o in session.get_outputs()]
    checks = []
    with progress.step(f"verify: the fp32 reference (ORT CPU) and {package_label(settings)} on every scenario",
                       enabled=progress_on,
                       done="verify: compared"):
        for scenario, spec in (settings.get("scenarios") or {}).items():
            dims = spec["dims"]  # read_torch_settings checked it: an object of dim sizes
            if dims.get("past", 0) + dims.get("seq", 1) > step.max_length or not 1 <= dims.get("batch", 1) <= MAX_BATCH:
                raise SoftsynError(f"{out}/runtime/torch.json: scenarios.{scenario}.dims: {dims} do not fit the package "
                                   f"(past + seq <= {step.max_length}, batch 1..{MAX_BATCH}); re-run softsyn compile")
            feeds = scenario_inputs(reference, dims, seed=seed)
            expected = dict(zip(names, session.run(None, feeds)))
            if declares_last_logits(settings):
                expected["logits"] = expected["logits"][:, -1:]
            past = [feeds[f"past_key_values.{i}.{k}"] for i in range(layers) for k in ("key", "value")]
            ids = feeds["input_ids"]
            start = dims.get("past", 0)
            cache = step.empty_cache(ids.shape[0], past)
            got = {"logits": host(step(ids, start, cache))}
            filled = start + ids.shape[1]
            got.update({f"present.{i}.{k}": host(cache[2 * i + j][:, :, :filled])
                        for i in range(layers) for j, k in enumerate(("key", "value"))})
            checks += _checks(scenario, got, expected, max_rel, budget.get("min_top1"))
    return VerifyResult(checks=checks, max_rel_error=max_rel, budget_source=source, min_top1=budget.get("min_top1"),
                        provider=provider_label(settings), reference=settings.get("reference") or {},
                        precision=DTYPE_PRECISION[settings["dtype"]])


def run(directory: str | Path, settings: RunSettings = RunSettings(), show_progress: bool = True) -> RunResult:
    """Generate `settings.runs` times with DIR/model.pt2 and time every step."""
    out = Path(directory)
    manifest = outdir.read_manifest(out)
    if manifest is None or manifest.kind != "compile":
        raise SoftsynError(f"{directory}: not a softsyn compile output (no {outdir.MANIFEST} of a compile); {TAKES}")
    torch_settings = read_torch_settings(out)
    device = torch_settings["device"]
    if settings.provider not in (None, device):
        raise SoftsynError(f"{directory}: a {torch_settings.get('target')} package runs on the {device.upper()}; "
                           f"valid --provider: {device}")
    progress.log(f"loading {out}/{package_label(torch_settings)} (torch AOTInductor)", enabled=show_progress)
    step = TorchStep(out, torch_settings)
    progress.log(step.weights, enabled=show_progress)
    prompt = prompt_ids(step.vocab_size, settings.prompt_len, settings.seed)
    result = RunResult(directory=str(directory), design=manifest.design, settings=settings,
                       execution_provider=provider_label(torch_settings), device=device_name(device), kv="static",
                       max_length=step.max_length, cuda_graph=step.graphs, date=time.strftime("%a %b %d %H:%M:%S %Y"),
                       interval=INTERVAL)
    for r in range(settings.warmup + settings.runs):
        generation = step.generate(prompt, settings.gen)
        (result.generations if r >= settings.warmup else result.warmups).append(generation)
    progress.log(f"generated {settings.gen} tokens after a {settings.prompt_len}-token prompt, {settings.runs} timed "
                 f"run{'s' if settings.runs != 1 else ''} after {settings.warmup} warm-up", enabled=show_progress)
    return result
