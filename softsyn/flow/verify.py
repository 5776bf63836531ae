"""`softsyn verify DIR`: the compiled model against its fp32 reference (Formality's role, by simulation).

Both models run on ONNX Runtime with the same seeded inputs (softsyn.runtime.inputs.scenario_inputs) at
every scenario the compile timed. Per output:
- max abs error  max|c - r|
- rel error      max|c - r| / max|r|   (one number per tensor: the worst element against the
                 tensor's scale, so near-zero elements do not blow it up)
- cosine         cos(c, r) over the flattened tensor, in float64
- top-1          for logits (any [B, S, V] output over the model's vocabulary V, or a final MatMul/Gemm to a
                 wide last axis, whatever it is named): fraction of positions where argmax over V agrees
compared with the accuracy budget: constraints `accuracy.max_rel_error` (default by the compiled
precision, DEFAULT_REL_ERROR) and `accuracy.min_top1` (checked when given).

The reference is recorded as the model spec and its content key (the export cache key, or the ONNX
file's sha256), never as a path into the cache: verify reads the spec again (a cache hit, or a fresh
export) and checks the key. A broken artifact (unreadable settings, a missing or truncated data file,
a model ONNX Runtime cannot load, outputs that do not match the reference's) is a SoftsynError
naming what is broken.
"""
from __future__ import annotations

import gc
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from softsyn import outdir
from softsyn.flow.cpu_view import cpu_view_session, view_note
from softsyn.flow.verify_locate import ROUTED, locate as locate_divergence
from softsyn.emit import MODEL_FILE, SESSION_FILE, compiled_precision, ort_errors
from softsyn.errors import SoftsynError
from softsyn.frontends import read_design, roles
from softsyn.frontends.onnx_file import check_external_data, inside, name_nodes
from softsyn.runtime.artifact import check_session, read_json, scenarios_problem
from softsyn.runtime.blocks import BlockRunner
from softsyn.runtime.decoder import NotDecoder, decoder_io, kv_aliases
from softsyn.runtime.inputs import VIEWS, scenario_inputs, table_rows
from softsyn.runtime.session import SessionSettings, open_session, provider_of, provider_opens
from softsyn.netlist import Netlist
from softsyn.progress import step
from softsyn.results.verify import DEFAULT_REL_ERROR, OutputCheck, VerifyResult
from softsyn.runtime.measure import onnx_path
from softsyn.runtime.binding import BoundRunner
from softsyn.runtime.kv_quant import dequantise, quantise
from softsyn.timing.realised import realised_precision

WIDE_LOGITS = 1000  # without a known vocabulary, a final MatMul/Gemm at least this wide is read as logits


def compare(compiled: np.ndarray, reference: np.ndarray, top1: bool,
            max_rel: float = 0.0) -> tuple[float, float, float, float | None]:
    c, r = np.asarray(compiled, np.float64), np.asarray(reference, np.float64)  # no copy when already float64
    diff = np.abs(c - r)
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(r).max()) if r.size else 0.0
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    norms = float(np.linalg.norm(c) * np.linalg.norm(r))
    cosine = float(np.dot(c.ravel(), r.ravel()) / norms) if norms > 0 else float(max_abs == 0)
    agree = None
    if top1 and r.ndim >= 1 and r.size:
        # A position agrees when the compiled argmax is the reference's, or the reference prefers its own by no more
        # than the numerical error seen on this output, capped by the accuracy budget (max_rel x max|ref|): a near-tie
        # rounding decides, as random-weight logits are full of them; a real flip costs more than the budget.
        tie = min(max_abs, max_rel * scale)
        picked = np.take_along_axis(r, c.argmax(-1)[..., None], axis=-1)[..., 0]
        agree = float(np.mean(r.max(-1) - picked <= tie))
    return max_abs, rel, cosine, agree


def position_axes(name: str, value: np.ndarray, logits: bool) -> tuple[int, ...] | None:
    """The axes an output's per-position error reduces over: logits [..., vocab] the last; a KV cache [batch, heads,
    positions, head_dim] (a 4-D output named key/value) heads and head_dim; None for others (a recurrent state has
    no position axis)."""
    if logits:
        return (-1,) if value.ndim >= 2 else None
    return (1, 3) if value.ndim == 4 and ("key" in name or "value" in name) else None


def positions_over(compiled: np.ndarray, reference: np.ndarray, max_rel: float,
                   axes: tuple[int, ...] = (-1,)) -> tuple[int, int] | None:
    """(positions whose max|compiled - reference| over `axes` exceeds max_rel x max|reference| of the whole tensor,
    positions): where an error sits. A few positions far over with the rest within budget is what a routed model's
    near-tied experts leave (a token sent to another expert moves by that expert's share); every position over is a
    numerical fault. None for an empty or all-zero reference."""
    if not reference.size:
        return None
    c, r = np.asarray(compiled, np.float64), np.asarray(reference, np.float64)
    scale = float(np.abs(r).max())
    if scale == 0:
        return None
    per = np.abs(c - r).max(axis=axes).ravel()
    return int((per > max_rel * scale).sum()), int(per.size)


def judge(scenario: str, name: str, got: np.ndarray, want: np.ndarray, *, logits: bool, max_rel: float,
          min_top1: float | None) -> OutputCheck:
    """One output against the reference's as the budget reads it: max rel error, for logits top-1 agreement, and
    for logits and KV the positions over the budget."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)  # once, for both measures
    max_abs, rel, cosine, top1 = compare(got, want, top1=logits, max_rel=max_rel)
    axes = position_axes(name, want, logits)
    over = positions_over(got, want, max_rel, axes) if axes else None
    violations = []
    if not rel <= max_rel:
        where = f" at {over[0]} of {over[1]} positions" if over and 0 < over[0] < over[1] else ""
        violations.append(f"rel error {rel:.3e} > {max_rel:.3e}{where}")
    if top1 is not None and min_top1 is not None and not top1 >= min_top1:
        violations.append(f"top-1 agreement {top1:.4f} < {min_top1:.4f}")
    return OutputCheck(scenario=scenario, output=name, max_abs=max_abs, rel=rel, cosine=cosine, top1=top1,
                       violations=violations, positions_over=over[0] if over else None,
                       positions=over[1] if over else None)


def load_settings(out_dir: Path) -> dict:
    path = out_dir / SESSION_FILE
    settings = read_json(path, "runtime/session.json") if path.is_file() else None
    if isinstance(settings, dict) and settings.get("plan") is True:
        raise SoftsynError(f"{out_dir}: a weightless plan (softsyn compile --plan) has no model to run; compile "
                           "without --plan, on a machine with RAM for its weights, to verify it")
    if not (out_dir / MODEL_FILE).is_file() or settings is None:
        raise SoftsynError(f"{out_dir}: not a compiled design (no {MODEL_FILE} or {SESSION_FILE}); "
                           f"run `softsyn compile MODEL -o {out_dir}` first")
    problem = _settings_problem(settings)
    if problem:
        raise SoftsynError(f"{path}: {problem}; re-run softsyn compile")
    inside(out_dir, MODEL_FILE, MODEL_FILE, out_dir)  # a symlink out of DIR is not the compiled model
    return check_session(settings, path)


def _settings_problem(settings) -> str | None:
    """What is wrong with runtime/session.json for verify, None when nothing."""
    if not isinstance(settings, dict):
        return "not a JSON object"
    problem = scenarios_problem(settings)
    if problem:
        return problem
    providers = settings.get("providers")
    if not isinstance(providers, list) or not providers or not all(isinstance(p, str) for p in providers):
        return "providers: not a list of ONNX Runtime provider names"
    for key in ("reference", "accuracy"):
        if not isinstance(settings.get(key) or {}, dict):
            return f"{key}: not an object"
    budget = settings.get("accuracy") or {}
    for key in ("max_rel_error", "min_top1"):
        value = budget.get(key)
        if value is not None and (type(value) not in (int, float) or not value >= 0):
            return f"accuracy.{key}: not a non-negative number"
    if not isinstance(settings.get("precision", "fp32"), str):
        return "precision: not a string"
    size = (settings.get("reference") or {}).get("image_size")
    if size is not None and not (isinstance(size, list) and len(size) == 2
                                 and all(type(x) is int and x > 0 for x in size)):
        return "reference.image_size: not [width, height] in pixels"
    return None


def content_key(netlist: Netlist) -> str:
    """The identity of a design's source: its export cache key, or the sha256 of the ONNX file it was read from."""
    key = (netlist.provenance.get("cache") or {}).get("key")
    if key:
        return key
    file = netlist.provenance.get("file")
    return f"sha256:{outdir.sha256(Path(file))}" if file else ""


def reference_record(spec: str, netlist: Netlist) -> dict:
    """runtime/session.json's `reference`, relocatable: the spec (a path made absolute), its content key and
    the precision the reference runs in."""
    path = Path(spec).expanduser()
    source = str(path.resolve()) if not spec.startswith("zoo:") and path.exists() else spec
    filled = "filled into the weightless export" in str(netlist.provenance.get("weights", ""))
    record = {"source": source, "key": content_key(netlist), "precision": compiled_precision(netlist),
              "materialize": filled}  # read it again the way compile read it: seeded weights in the weightless export
    size = (netlist.provenance.get("image") or {}).get("size")
    if size:  # a composite's vision block is exported at one image size: the reference is read at the same
        record["image_size"] = list(size)
    return record


def reference_path(settings: dict, cache_dir: str | Path | None) -> Path:
    """The fp32 reference ONNX: the recorded source read again (through the export cache), checked
    against the recorded content key."""
    ref = settings.get("reference") or {}
    source, key = ref.get("source"), ref.get("key")
    if not isinstance(source, str) or not source:
        raise SoftsynError(f"{SESSION_FILE}: no reference recorded; re-run softsyn compile")

    size = ref.get("image_size")
    netlist = read_design(source, cache_dir=cache_dir, progress=False, materialize=bool(ref.get("materialize")),
                          image_size=tuple(size) if size else None)
    found = content_key(netlist)
    if key and found != key:
        raise SoftsynError(f"reference {source}: its content key is now {found[:23]}, the compile recorded {key[:23]} "
                           "(the model file or the exporter's package versions changed); re-run softsyn compile")
    return onnx_path(netlist)


def _load(path: Path, what: str) -> Netlist:
    """A model verify runs, read and its external data checked (SoftsynError naming the file)."""
    try:
        model = ir.load(str(path))
    except Exception as exc:  # protobuf and onnx-ir raise many types for a file that is not a valid model
        raise SoftsynError(f"{path}: the {what} is not a readable ONNX model ({type(exc).__name__}: "
                           f"{' '.join(str(exc).split())}); re-run softsyn compile") from None
    check_external_data(model, path)
    return Netlist.from_model(model)


def _reference_run(session, feeds: dict, ref_path, scenario: str, spec: dict) -> list:
    """The reference's outputs for one scenario. The reference is the user's own model: a scenario it refuses (a
    sequence past its position table, say) is what the constraints asked of it, bad input rather than a defect."""
    try:
        return session.run(None, feeds)
    except ort_errors() as exc:
        first = " ".join(str(exc).split())[:300]
        raise SoftsynError(f"{ref_path}: the reference model cannot run scenario {scenario} (dims {spec['dims']}): "
                           f"{first}; the constraints ask more of the model than it accepts (e.g. past + seq beyond "
                           "its positions): give that group smaller dims") from None


def _session(path: Path, provider: str, what: str):
    """A session on `path` (the target's provider, the CPU where this machine lacks it), or one line naming why not."""
    try:
        return open_session(path, SessionSettings(provider=provider, require_provider=False))
    except ort_errors() as exc:
        first = " ".join(str(exc).split())
    if "same node name" in first:  # ONNX allows repeated node names, ORT does not: run a renamed copy in memory
        model = ir.from_proto(onnx.load(str(path)))
        name_nodes(model.graph)
        try:
            return open_session(ir.to_proto(model).SerializeToString(), SessionSettings(provider=provider,
                                                                                      require_provider=False))
        except (ValueError, *ort_errors()):  # over protobuf's 2 GB, or still not loadable
            pass
    raise SoftsynError(f"{path}: ONNX Runtime cannot load the {what} ({first})")


def verify(out_dir: str | Path, seed: int = 0, cache_dir: str | Path | None = None, cpu: bool = False,
           progress: bool = False, locate: bool = False) -> VerifyResult:
    """The compiled model at out_dir against its reference on every scenario (see the module doc); `locate`: each
    violated scenario of a GPU run is also run node by node against the CPU provider (softsyn.flow.verify_locate)."""
    out_dir = Path(out_dir)
    settings = load_settings(out_dir)
    layout, aliases, routed = _compiled_facts(out_dir / MODEL_FILE)
    ref_path = reference_path(settings, cache_dir)
    reference = _load(ref_path, "reference")
    roles.apply_roles(reference.model, roles.find_roles(reference.model).renames)  # a plain file's dims, as compiled
    vocab = vocab_size(reference)
    ports = {v.name: v for v in reference.model.graph.outputs}
    precision = settings.get("precision", "fp32")
    budget = settings.get("accuracy") or {}
    max_rel = budget.get("max_rel_error")
    source = "accuracy.max_rel_error"
    if max_rel is None:
        max_rel, source = DEFAULT_REL_ERROR.get(precision, DEFAULT_REL_ERROR["fp16"]), f"default for {precision}"
        # an fp16 reference (a real-size export) agrees with any compile only within its own rounding
        held = realised_precision(reference).float_precision
        looser = DEFAULT_REL_ERROR.get(held, DEFAULT_REL_ERROR["fp16"]) if held else 0.0
        if looser > max_rel:
            max_rel, source = looser, f"{source} against an {held} reference"
    min_top1 = budget.get("min_top1")

    ort.set_default_logger_severity(4)  # ORT's log lines (a failed run, a GPU fallback) would precede softsyn's one
    # One session at a time: the reference's outputs for every scenario first, then the compiled model's (a
    # real-size pair of sessions held together peaked at 22.4 GB on a 24 GB machine).
    with step("verify: the fp32 reference on every scenario", enabled=progress, done="verify: reference run"):
        ref_session = _session(ref_path, "cpu", "reference")
        ref_names = [o.name for o in ref_session.get_outputs()]
        scenario_feeds = {scenario: {k: layout.held(k, v) for k, v in scenario_inputs(reference, spec["dims"],
                                                                                     seed=seed).items()}
                          for scenario, spec in settings["scenarios"].items()}
        expected_by_scenario = {scenario: dict(zip(ref_names, _reference_run(ref_session, feeds, ref_path, scenario,
                                                                            settings["scenarios"][scenario])))
                                for scenario, feeds in scenario_feeds.items()}
        del ref_session
        gc.collect()
    with step("verify: the compiled model on every scenario", enabled=progress, done="verify: compiled model run"):
        target = "cpu" if cpu else provider_of((settings.get("providers") or ["CPUExecutionProvider"])[0])
        if settings.get("blocks"):  # a composite: its block files run in order, as onnxruntime-genai runs them
            session = BlockRunner(out_dir, settings["blocks"], SessionSettings(provider=target, require_provider=False))
        else:
            try:
                session = _session(out_dir / MODEL_FILE, target, "compiled model")
            except SoftsynError as exc:  # on the CPU its view may load where the model does not (fp8 weight cells)
                if target != "cpu" and provider_opens(target):
                    raise
                session, refused = None, exc
        provider = session.get_providers()[0] if session is not None else "CPUExecutionProvider"
        if provider == "CPUExecutionProvider" and not settings.get("blocks"):
            try:
                session, viewed = cpu_view_session(out_dir / MODEL_FILE)
            except ort_errors():
                if session is None:
                    raise refused from None
                raise
            if any(viewed.values()):
                provider += f" (CPU view: {view_note(viewed)})"
        input_types = {i.name: i.type for i in session.get_inputs()}
        fed = next(iter(scenario_feeds.values()), {})
        missing = [name for name in input_types if name not in fed]
        if missing:  # model.onnx is not the model compiled from the reference (replaced, or another artifact's)
            raise SoftsynError(f"{out_dir / MODEL_FILE}: inputs {', '.join(missing)} are not the reference's "
                               f"({', '.join(fed) or 'none'}; {ref_path}): it is not the model softsyn compiled "
                               "there; re-run softsyn compile")
        names = [o.name for o in session.get_outputs()]
        checks, fed_by_scenario, gpu_by_scenario = [], {}, {}
        run_on = target if provider.startswith("CUDA") else "cpu"
        for scenario, feeds in scenario_feeds.items():
            compiled_feeds = {k: layout.feed(k, as_declared(v, input_types.get(k))) for k, v in feeds.items()}
            if locate:  # the feeds as given: a CPU run's shared KV buffer is written in place
                fed_by_scenario[scenario] = {k: v.copy() for k, v in compiled_feeds.items()}
            expected = expected_by_scenario.pop(scenario)
            try:
                outputs = run_compiled(session, compiled_feeds, aliases, run_on) if aliases and not settings.get(
                    "blocks") else session.run(None, compiled_feeds)
            except (*ort_errors(), RuntimeError) as exc:  # run_with_iobinding raises a plain RuntimeError
                first = str(exc).splitlines()[0]
                raise SoftsynError(
                    f"{out_dir / MODEL_FILE}: {session.get_providers()[0]} cannot run the compiled model ({first}); "
                    f"verify it on its target (runtime/session.json providers: {', '.join(settings.get('providers') or [])})"
                ) from None
            if locate:  # the GPU's outputs as compiled: --locate tells a load-time fusion's departure by them
                gpu_by_scenario[scenario] = {n: np.array(o, copy=True) for n, o in zip(names, outputs)}
            checks += [_check(scenario, name, got, expected, layout=layout, logits=is_logits(ports.get(name), vocab),
                              max_rel=max_rel, min_top1=min_top1, model=f"{out_dir / MODEL_FILE}", ref_path=ref_path)
                       for name, got in zip(names, outputs)]
    result = VerifyResult(checks=checks, max_rel_error=max_rel, budget_source=source, min_top1=min_top1,
                          provider=provider, reference=settings.get("reference") or {}, precision=precision,
                          routed=routed)
    if locate and run_on != "cpu" and not settings.get("blocks"):
        del session
        gc.collect()
        result.located += _located(out_dir / MODEL_FILE, result, fed=fed_by_scenario, gpu=gpu_by_scenario,
                                   aliases=aliases, progress=progress)
    return result


def _compiled_facts(path: Path) -> tuple["SharedLayout", dict[str, str], int]:
    """What verify needs of the compiled graph before running it: its shared-KV layout, {present: past} aliases (it
    runs as the artifact runs) and how many expert ops route tokens (MoE/QMoE)."""
    compiled = _load(path, "compiled model")
    return (shared_layout(compiled.model), kv_aliases(compiled),
            sum(1 for n in compiled.nodes() if n.op_type in ROUTED))


def _located(model: Path, result: VerifyResult, *, fed: dict, gpu: dict, aliases: dict, progress: bool) -> list:
    """verify --locate on each violated scenario of a GPU run (softsyn.flow.verify_locate): `fed` and `gpu` per
    scenario, the compiled model's feeds as verify gave them and verify's GPU outputs; `aliases` {present: past}."""
    found = []
    run_on = provider_of(result.provider.split()[0])
    for scenario in dict.fromkeys(c.scenario for c in result.checks if c.violations):
        with step(f"verify --locate: {scenario} node by node, {run_on} against the CPU", enabled=progress,
                  done=f"verify --locate: {scenario}"):
            try:
                found.append(locate_divergence(model, scenario, fed[scenario], aliases, run_on, result.max_rel_error,
                                               unprobed=gpu.get(scenario)))
            except (*ort_errors(), RuntimeError, OSError) as exc:  # a probed copy that cannot load, run or be written
                first = " ".join(str(exc).split())[:300]
                raise SoftsynError(f"{model}: verify --locate could not run its probed copy of the model ({first}); "
                                   "run softsyn verify without --locate for the checks") from None
    return found


def _check(scenario: str, name: str, got: np.ndarray, expected: dict, *, layout: "SharedLayout", logits: bool,
           max_rel: float, min_top1: float | None, model: str, ref_path) -> OutputCheck:
    """One compiled output against the reference's (`expected`: the scenario's outputs by name), as the budget
    reads it."""
    if name not in expected:
        raise SoftsynError(f"{model}: output {name} has no counterpart in the reference {ref_path} (outputs: "
                           f"{', '.join(expected)})")
    got, want = layout.aligned(name, got, expected[name])
    if got.shape != want.shape:
        raise SoftsynError(f"{model}: output {name} has shape {list(got.shape)} in scenario {scenario}, the "
                           f"reference's {list(want.shape)}")
    return judge(scenario, name, got, want, logits=logits, max_rel=max_rel, min_top1=min_top1)


FLOAT_FEEDS = {"tensor(float16)": np.float16, "tensor(float)": np.float32}


def as_declared(value: np.ndarray, declared: str | None) -> np.ndarray:
    """A float feed in the float type the compiled model declares: an fp32 map of an fp16 source reads fp32 ports
    where its reference reads fp16 ones, an fp16 map of an fp32 source the reverse."""
    want = FLOAT_FEEDS.get(declared or "")
    return value.astype(want) if want is not None and value.dtype.kind == "f" else value


def run_compiled(session, feeds: dict, aliases: dict[str, str], provider: str) -> list[np.ndarray]:
    """One run of a compiled decoder whose past and present share a buffer, bound as the artifact runs (present onto
    its past, GroupQueryAttention updating it in place): the outputs in the session's order. A separate present is
    another code path in the kernel (on ORT 1.31.1 CUDA an int8 cache read wrong at decode that way, 2026-12-01,
    while shared-buffer generation matched the CPU token for token)."""
    runner = BoundRunner.from_feeds(session, feeds, provider, aliases)
    runner.run()
    return list(runner.arrays().values())


@dataclass(frozen=True)
class SharedLayout:
    """What kv_layout changed in the compiled model's IO against the reference's: KV ports that are one
    `buffer` positions long (past fed in its first positions, present compared over the reference's length) and
    logits of the last position only (compared with the reference's last position)."""
    kv_ports: frozenset[str] = frozenset()
    buffer: int | None = None
    last_logits: str | None = None
    # port -> the fp32 scale of GroupQueryAttention's int8 cache on it: the reference's past is quantised as the
    # kernel stores it, the present dequantised, so the check measures the quantised cache's error
    kv_scales: tuple[tuple[str, np.ndarray], ...] = ()

    def held(self, name: str, value: np.ndarray) -> np.ndarray:
        """A past the reference gets: as an int8 cache holds it (its seeded values are no K/V of the model, and
        saturate on scales calibrated for its K/V: both models read the same cache, the new tokens' error is
        measured), else as given."""
        scale = dict(self.kv_scales).get(name)
        return value if scale is None else dequantise(quantise(value, scale), scale).astype(value.dtype)

    def feed(self, name: str, value: np.ndarray) -> np.ndarray:
        scale = dict(self.kv_scales).get(name)
        if scale is not None:
            value = quantise(value, scale)
        if name not in self.kv_ports or value.shape[2] == self.buffer:
            return value
        if value.shape[2] > self.buffer:
            raise SoftsynError(f"{name}: the scenario caches {value.shape[2]} positions, the compiled KV buffer holds "
                               f"{self.buffer}; re-run softsyn compile with a larger kv_cache.max_length")
        padded = np.zeros(value.shape[:2] + (self.buffer,) + value.shape[3:], value.dtype)
        padded[:, :, :value.shape[2]] = value  # the cached positions first, as GQA's seqlens_k counts them
        return padded

    def aligned(self, name: str, got: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(compiled, reference) over what both hold: a present's first positions, the last position's logits."""
        scale = dict(self.kv_scales).get(name)
        if scale is not None:
            got = dequantise(got, scale)
        if name in self.kv_ports and got.ndim == 4 and got.shape[2] == self.buffer:
            return got[:, :, :expected.shape[2]], expected
        if name == self.last_logits and got.ndim == 3 and got.shape[1] == 1 and expected.ndim == 3:
            return got, expected[:, -1:]
        return got, expected


def shared_layout(model: ir.Model) -> SharedLayout:
    """The compiled model's shared KV buffer and last-position logits (passes.kv_layout), if any."""
    try:
        io = decoder_io(model)
    except NotDecoder:
        return SharedLayout()
    last = io.logits if io.last_logits else None
    if not io.shares_buffer or io.buffer_length is None:
        return SharedLayout(last_logits=last)
    ports = frozenset(n for layer in io.layers for n in (layer.past_key, layer.past_value, layer.present_key,
                                                          layer.present_value))
    return SharedLayout(ports, io.buffer_length, last, kv_cache_scales(model))


def kv_cache_scales(model: ir.Model) -> tuple[tuple[str, np.ndarray], ...]:
    """(KV port, scale) of every GroupQueryAttention int8 cache (passes.kv_layout's k_scale / v_scale)."""
    found = []
    for node in model.graph:
        if node.op_type != "GroupQueryAttention" or len(node.inputs) <= 13:
            continue
        for past, present, scale in ((3, 1, 12), (4, 2, 13)):
            s = node.inputs[scale]
            if s is not None and s.const_value is not None and node.inputs[past].dtype == ir.DataType.INT8:
                found += [(node.inputs[past].name, s.const_value.numpy()), (node.outputs[present].name,
                                                                            s.const_value.numpy())]
    return tuple(found)


def vocab_size(netlist: Netlist) -> int | None:
    """The model's vocabulary: its config's, else the rows of the embedding table its token ids index."""
    ids = next((v for v in netlist.model.graph.inputs if v.name == "input_ids"), None)
    return netlist.config.get("vocab_size") or (table_rows(ids) if ids is not None else None)


def is_logits(value: ir.Value | None, vocab: int | None) -> bool:
    """A logits output: named `logits`, or [B, S, V] over the vocabulary, or (vocabulary unknown) a final
    MatMul/Gemm, through views, to a last axis of at least WIDE_LOGITS."""
    if value is None:
        return False
    if value.name == "logits":
        return True
    width = value.shape[-1] if value.shape is not None and len(value.shape) else None
    if not isinstance(width, int):
        return False
    if vocab:
        return len(value.shape) == 3 and width == vocab
    producer = value.producer()
    while producer is not None and producer.op_type in VIEWS:
        producer = producer.inputs[0].producer()
    return width >= WIDE_LOGITS and producer is not None and producer.op_type in ("MatMul", "Gemm")


