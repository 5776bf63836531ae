"""A torch target's lowering (softsyn.library.torch_targets): the source model as one decoder step over a static KV
cache, exported with torch.export and compiled by AOTInductor into DIR/model.pt2, with DIR/runtime/torch.json, then
measured at every path group's dims.

The cache tensors are the step's inputs and it writes its keys and values into them in place (as a static cache
under torch.compile does; softsyn.runtime.torch_package says the signature), then attends over the cache's first S
slots (an input, the filled prefix rounded up: the runner's spans) under a 4-D mask: a slot is visible when it is at
or before the query's position. So one package
with dynamic batch and `seq` serves prefill and decode, its fixed-shape steps can be replayed as CUDA graphs (the
buffers keep their addresses), and it computes the function the ONNX export does (the same model object, built by
softsyn.frontends.source_torch_model: same config, seed, weights). The step model itself (attention, packed
projections, casts, torchao's int8 layers) is softsyn.emit.torch_step. Precision: the target's dtype for activations
and cache (fp32 on cpu-torch, fp16 on h200-torch), the compile loop's int8 (and on CUDA int4) cells as weight-only
layers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from softsyn import progress
from softsyn.constraints.model import shared_buffer_length
from softsyn.emit.session import write_json
from softsyn.emit.torch_attention_choice import (FORMS, MEASURED_FORM, Candidate, attention_timing,
                                                 choose_attention, decode_shapes)
from softsyn.emit.torch_characterise import characterise
from softsyn.emit.torch_kernel_choice import CHOICE_PRECISIONS
from softsyn.emit.torch_norms import covered_cells, fold_norms, norms_for
from softsyn.emit.torch_prologue import prologues_for
from softsyn.emit.torch_attention_forms import ATTENTIONS, END_SPAN_FORMS
from softsyn.emit.torch_step import (StaticStep, cast_parameters, example_span, fuse_gated_mlps, pack_projections,
                                     quantise_modules, weight_map)
from softsyn.emit.triton_weights import dequantised_bytes, hold_dequantised, packed_layers, use_prompt_form
from softsyn.errors import LibraryFailure, SoftsynError
from softsyn.frontends import source_torch_model
from softsyn.frontends.export import kv_geometry, quiet, torch_num_threads
from softsyn.frontends.hf_common import brief
from softsyn.library.torch_targets import torch_target
from softsyn.results.files import write_atomic
from softsyn.runtime.decoder import NotDecoder, decoder_io
from softsyn.runtime.artifact import TORCH_FILE, TORCH_PACKAGE, TORCH_PREFILL_PACKAGE
from softsyn.runtime.torch_package import DECODE, END, FORMAT, PREFILL, ROUNDED, SPAN_STEP, TorchStep
from softsyn.runtime.torch_provenance import (KERNELS_FILE, PREFILL_KERNELS_FILE, PROVENANCE_CONFIG, calls_data,
                                              kernel_calls)
from softsyn.runtime.torch_macros import MACROS_FILE
from softsyn.runtime.torch_profile import record_config, strip_stack_traces
from softsyn.runtime.torch_weights import OWN, SHARED
from softsyn.units import fmt_bytes, fmt_time

MEASURED_RUNS = 10  # steps timed per path group (after 2 untimed): the median is written
MEASURED = "torch package, measured"  # the label every measured number carries
ESTIMATED = "est"  # and every number the ORT library predicts


PREFILL_SEQ_HINT = 512  # the example query length of a prefill package: its kernels are tuned for prompts, not 3 rows
# Where a package's weights go (aoti_compile_and_package's inductor_configs), when a target builds two packages:
# model.pt2's beside its .so in the archive (aoti_load_package still loads it alone), model-prefill.pt2 without any
# (it reads model.pt2's at load: softsyn.runtime.torch_weights). A single package keeps them inside its .so.
WEIGHTS_BESIDE = {"aot_inductor.package_constants_in_so": False,
                  "aot_inductor.package_constants_on_disk_format": "binary_blob"}
WEIGHTLESS = {"aot_inductor.package_constants_in_so": False}


def export_step(step: StaticStep, cfg, max_length: int, device: str, dtype: torch.dtype, prefill: bool = False):
    """torch.export of the step at batch 2 over example_span(max_length) slots, seq 3, or for a `prefill` package
    up to PREFILL_SEQ_HINT (half the span); sizes > 1 and distinct so none is specialised, the three dims dynamic. The
    example sizes are the hints Inductor tunes its kernels for."""
    layers, kv, head_dim = kv_geometry(cfg)
    g = torch.Generator().manual_seed(0)
    span = example_span(max_length)
    seq = max(3, min(PREFILL_SEQ_HINT, span // 2)) if prefill else 3
    ids = torch.randint(0, cfg.vocab_size, (2, seq), generator=g).to(device)
    positions = torch.arange(span - seq, span).expand(2, seq).contiguous().to(device)
    slots = torch.arange(span, device=device)
    cache = tuple(torch.zeros(2, kv, max_length, head_dim, dtype=dtype, device=device) for _ in range(2 * layers))
    auto = torch.export.Dim.AUTO  # a named Dim fails on guards transformers' mask code makes (true for seq >= 0)
    shapes = {"input_ids": {0: auto, 1: auto}, "position_ids": {0: auto, 1: auto}, "slots": {0: auto},
              "kv": tuple({0: auto} for _ in cache)}
    with quiet(), torch.no_grad():
        return torch.export.export(step, (ids, positions, slots, *cache), dynamic_shapes=shapes, strict=False)


def last_logits(design) -> bool:
    """Whether the design's netlist returns the last position's logits only (kv_layout's last_token_logits; off with
    compile --all-logits): the packages then compute the same function."""
    try:
        return decoder_io(design.netlist.model).last_logits
    except NotDecoder:
        return False


def device_problem(name: str) -> str | None:
    """Why torch target `name` cannot be compiled on this machine, None when it can."""
    target = torch_target(name)
    if target.device == "cuda" and not torch.cuda.is_available():
        return (f"target {target.name} compiles a CUDA package and torch sees no CUDA device here "
                "(torch.cuda.is_available() is False); compile on the GPU machine, or use target cpu-torch")
    return None


@dataclass
class Built:
    """One package the lowering compiled: its file, attention form, the query lengths it serves, its kernel map."""
    key: str  # torch.json's packages key (DECODE, PREFILL)
    file: str
    attention: str
    min_seq: int
    kernels: str
    calls: list = field(default_factory=list)
    seconds: float = 0.0  # torch.export + AOTInductor, host wall clock
    constants: str = OWN  # OWN: the package holds its weights; SHARED: none, it reads model.pt2's
    weights_config: dict = field(default_factory=dict)  # inductor_configs on where its weights go
    program: object = None  # the exported step, kept while the prefill package may need recompiling with weights
    said: list = field(default_factory=list)  # notes on its weights' form (a fallback, and why)
    resident: bool = False  # a prefill package holding its int4/fp8 layers' weights dequantised (prefill_residency)
    covers: dict = field(default_factory=dict)  # kernel_calls' covers: the decode package's GEMVs' fused norms

    @property
    def span(self) -> str:
        """torch.json's span for the package: END where its attention form needs the span to end at the last
        position, else ROUNDED."""
        return END if self.attention in END_SPAN_FORMS else ROUNDED


def planned(target, attention: str, resident: bool = False) -> list[Built]:
    """The packages `target` builds: model.pt2 in `attention` (target.attention, or the measured choice); with a
    prefill form, model-prefill.pt2 too, reading model.pt2's weights, or holding its own where `resident`."""
    out = [Built(DECODE, TORCH_PACKAGE, attention, 1, KERNELS_FILE)]
    if target.prefill_attention:
        out[0].weights_config = WEIGHTS_BESIDE
        out.append(Built(PREFILL, TORCH_PREFILL_PACKAGE, target.prefill_attention, 2, PREFILL_KERNELS_FILE,
                         constants=OWN if resident else SHARED, weights_config=WEIGHTS_BESIDE if resident
                         else WEIGHTLESS, resident=resident))
    return out


def one_row_layers(model: torch.nn.Module, keep: bool) -> tuple[torch.nn.Module, ...]:
    """The layers a prompt gives one row a sequence: the lm_head, where the step returns the last position only."""
    return (model.get_output_embeddings(),) if keep else ()


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages under `tensors` (a tied weight once); a tensor subclass, such as torchao's
    quantised weights, has no storage of its own to ask, so it counts by the tensors it holds (__tensor_flatten__)."""
    seen, stack = {}, list(tensors)
    while stack:
        t = stack.pop()
        if hasattr(t, "__tensor_flatten__"):
            names, _ = t.__tensor_flatten__()
            stack += [getattr(t, name) for name in names]
        else:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def prefill_residency(target, model: torch.nn.Module, area, keep: bool) -> tuple[bool, str | None]:
    """Whether the prefill package holds its int4/fp8 layers' weights dequantised (target.prefill_weights "resident"),
    and the compile-log line saying what it costs: the bytes it holds (the dequantised layers, and the rest of the
    model's weights, a copy of model.pt2's) on top of the design's area (`area`, the analysis' AreaResult), admitted
    when they fit area_constraint. None where the question does not arise (no prefill package, no such layer)."""
    one_row = one_row_layers(model, keep)
    dense = dequantised_bytes(model, one_row)
    if not target.prefill_attention or target.prefill_weights != "resident" or not dense:
        return False, None
    packed = sum(t.nbytes for m in packed_layers(model, one_row) for t in (m.packed, m.scales, m.lows))
    held = storage_bytes(model.state_dict().values()) - packed + dense
    what = (f"{TORCH_PREFILL_PACKAGE} {{}} its int4/fp8 layers' weights dequantised ({fmt_bytes(dense)}; "
            f"{fmt_bytes(held)} with a copy of the other weights, on top of the design's {fmt_bytes(area.total)}")
    if area.limit is not None and area.total + held > area.limit:
        return False, (what.format("does not hold") + f": over area_constraint {fmt_bytes(area.limit)}); it "
                       "dequantises them from model.pt2's at every prompt")
    limit = "no area_constraint" if area.limit is None else f"within area_constraint {fmt_bytes(area.limit)}"
    return True, (what.format("holds") + f", {limit}): a prompt's matmuls read them as held, no dequantise kernel")


def build_package(design, holder: list, built: Built, folder: Path, last: bool) -> None:
    """Export the step of the model in `holder` in `built`'s attention form and compile it into folder/built.file;
    on the `last` package the model is dropped once exported (the program holds the weights: a 1.7B model would
    otherwise sit twice in device memory)."""
    target = torch_target(design.torch_target)
    cfg_max, _ = shared_buffer_length(design.constraints)
    model = holder[0]
    model.set_attn_implementation(ATTENTIONS[built.attention][0])
    keep = last_logits(design)
    # softsyn's int4/fp8 layers: dequantise + cuBLAS for a prompt, but an lm_head of one row keeps its kernel
    one_row = one_row_layers(model, keep)
    use_prompt_form(model, built.key == PREFILL, one_row=one_row)
    if built.resident:  # the last package: the model's packed weights are model.pt2's, compiled already
        hold_dequantised(model, one_row=one_row)
    serves = "every step" if built.key == DECODE else f"steps of seq >= {built.min_seq}"
    t0 = time.perf_counter()
    with progress.step(f"emit: torch.export of {design.netlist.name}'s step for {built.file} ({built.attention} "
                       f"attention, {serves}; {target.dtype} on {target.device}, static KV cache of {cfg_max})",
                       enabled=design.progress, done=f"emit: {built.file}'s step exported"):
        step = StaticStep(model, cfg_max, keep).eval()
        program = export_step(step, model.config, cfg_max, target.device, getattr(torch, target.dtype),
                              prefill=built.key == PREFILL)
        del step
    del model
    if last:
        holder.clear()
    if built.constants == SHARED:
        built.program = program
    compile_package(design, program, built, folder)
    built.seconds += time.perf_counter() - t0


def compile_package(design, program, built: Built, folder: Path) -> None:
    """AOTInductor on the exported step into folder/built.file, its weights where built.weights_config puts them;
    model.pt2 with its weights beside the .so falls back to inside it (and model-prefill.pt2 to holding its own)
    where this torch refuses that form, saying so in built.said. On the CPU its kernels run inside profiler records
    (torch_profile.RECORD_CONFIG), so the compile can characterise them as macro cells."""
    configs = {**PROVENANCE_CONFIG, **record_config(torch_target(design.torch_target).device)}
    if configs.keys() - PROVENANCE_CONFIG.keys():
        strip_stack_traces(program)
    with progress.step(f"emit: AOTInductor compiling the step into {built.file} (tens of seconds; minutes on a GPU)",
                       enabled=design.progress, done=f"emit: {built.file} written"):
        try:
            torch._inductor.aoti_compile_and_package(program, package_path=str(folder / built.file),
                                                     inductor_configs={**configs, **built.weights_config})
        except Exception as exc:  # an Inductor without the config, or one that fails on it: the plain form
            if not built.weights_config:
                raise
            built.said.append(f"{built.file}: this torch cannot compile its weights "
                              f"{'out of it' if built.weights_config is WEIGHTLESS else 'beside its program'} "
                              f"({brief(exc)}); "
                              "compiled with them inside")
            built.weights_config, built.constants = {}, OWN
            torch._inductor.aoti_compile_and_package(program, package_path=str(folder / built.file),
                                                     inductor_configs=configs)
    built.calls = kernel_calls(folder / built.file, program, built.covers)


PREFILL_FALLBACK = "sdpa"  # the prefill form a package is built in again where AOTInductor fails on its own


def fallback_form(target, built: Built) -> str | None:
    """The attention form `built` is built in again where AOTInductor fails on its own form: a measured decode choice
    falls back to FORMS[0] (the matmul form), a prefill package to PREFILL_FALLBACK (torch's fused kernels with the
    step's mask); None where it is already that form, or its form was given (the failure stands)."""
    if built.key == PREFILL:
        return PREFILL_FALLBACK if built.attention != PREFILL_FALLBACK else None
    return FORMS[0] if target.attention == MEASURED_FORM and built.attention != FORMS[0] else None


def build_packages(design, packages: list[Built], holder: list, folder: Path, build=build_package) -> None:
    """Build every package `planned` gave, in order (`build`: build_package). A package whose form AOTInductor cannot
    compile is built again in its fallback_form, said in the package's notes and logged at once: the rebuild takes as
    long again, and a run cut short would keep no reason (qwen3-1.7b's int4 package, H100, 2026-12-06). The model is
    dropped once the last package is exported (the program holds the weights), unless that package has a fallback,
    which needs the model to export it again."""
    target = torch_target(design.torch_target)
    for i, built in enumerate(packages):
        # no blob in model.pt2 to read (a resident prefill holds its own already, beside its program)
        if built.key == PREFILL and not built.resident and packages[0].weights_config != WEIGHTS_BESIDE:
            built.constants, built.weights_config = OWN, {}
            built.said.append(f"{built.file} holds its own weights: {packages[0].file} has them inside its .so")
        fallback = fallback_form(target, built)
        last = i == len(packages) - 1
        try:
            build(design, holder, built, folder, last=last and fallback is None)
        except Exception as exc:  # noqa: BLE001 - Inductor and Triton fail with many types; re-raised unless a fallback
            if fallback is None or not holder:
                raise
            built.said.append(f"{built.file}: AOTInductor failed on the {built.attention} attention "
                              f"({brief(exc)}); built in {fallback} attention instead")
            progress.log(f"emit: {built.said[-1]}", enabled=design.progress)
            built.attention = fallback
            build(design, holder, built, folder, last=last)
    holder.clear()


def lower(design, reference: dict, folder: Path, notes: list[str], netlist_cells: list[dict] = ()) -> list[str]:
    """Write DIR/model.pt2 (and with a prefill form DIR/model-prefill.pt2), their kernel maps, DIR/runtime/torch.json
    and the macro cells characterised on this device (softsyn.emit.torch_characterise; `netlist_cells`: the cells of
    DIR/netlist.json, which they are mapped to) into `folder`, and the measured step per group into `notes`; the
    files written (relative)."""
    source = str(reference.get("source", ""))
    target = torch_target(design.torch_target)
    cfg_max, _ = shared_buffer_length(design.constraints)
    torch_num_threads()
    with progress.step(f"emit: building {source} in torch ({target.dtype}, the weights of the design's export)",
                       enabled=design.progress, done="emit: source model built"):
        model = source_torch_model(source, design.cache_dir)
    other = set(getattr(model.config, "layer_types", None) or ()) - {"full_attention", "sliding_attention"}
    if other:  # the step builds a mask per full and sliding layer (torch_step.StaticStep), nothing else
        raise SoftsynError(f"{source}: {design.torch_target} does not lower {', '.join(sorted(other))} layers yet; "
                           "valid: full_attention and sliding_attention layers (qwen3, llama, gemma2/3)")
    cast_parameters(model.to(device=target.device).eval(), getattr(torch, target.dtype))
    packed = pack_projections(model)
    geometry = kv_geometry(model.config)
    vocab = int(model.config.vocab_size)
    analysis = design.analyze()
    cells, shapes = weight_map(design), decode_shapes(analysis.groups, model.config, cfg_max)
    chosen, quantised, lines = decode_modules(target, model, cells, shapes, design.progress)
    attention = chosen.form
    notes += [f"target {design.torch_target}: {line}" for line in lines]
    resident, said = prefill_residency(target, model, analysis.area, last_logits(design))
    packages, holder = planned(target, attention, resident), [model]
    packages[0].covers = covered_cells(model)  # a prefill package runs its layers' own forward: its norms' kernels
    if said:
        packages[-1].said.append(said)
    del model
    try:
        build_packages(design, packages, holder, folder)
    except SoftsynError:
        raise
    except Exception as exc:  # torch.export and Inductor fail with many types; the innermost cause says what
        raise LibraryFailure(f"{source}: lowering {design.netlist.name} for {design.torch_target} failed: "
                             f"{brief(exc)}") from exc
    for built in packages:
        write_json(folder / built.kernels, calls_data(built.calls))
    settings = torch_settings(design, reference, geometry, vocab, packages)
    settings["weights"] = {name: {"precision": c.precision, "block": c.block, "kernel": quantised.kernels[name]}
                           for name, c in sorted(cells.items()) if name in quantised.kernels}
    write_json(folder / TORCH_FILE, settings)
    step = loaded_step(design, folder, settings, packages)
    notes += package_notes(design, packages, packed, folder, step)
    notes += [*(f"target {design.torch_target}: {line}" for line in quantised.notes or ["weights "
                f"{target.float_precision} (the compile's map quantised none)"]),
              f"target {design.torch_target}: the slack above is the {design.library.name} library's estimate "
              f"({ESTIMATED}) of the same function on the ONNX netlist; the package"
              f"{'s are' if len(packages) > 1 else ' is'} measured below"]
    measured = {}
    notes += measured_notes(design, analysis, folder, step, measured)
    notes += characterise(design, analysis, folder, step, calls={b.key: b.calls for b in packages},
                          cells=list(netlist_cells), measured=measured)
    return [*(b.file for b in packages), TORCH_FILE, *(b.kernels for b in packages), MACROS_FILE]


def decode_modules(target, model: torch.nn.Module, cells: dict, shapes: list, shown: bool = False) -> tuple:
    """`model`'s modules (projections packed) as torch target `target` builds them, in this order: the norm weights
    folded into the projections they feed (fused_norms on; before quantisation, since W * g is what it fits), the map's
    `cells` quantised, the gated MLPs fused, the decode attention chosen (the target's form, or where it is
    "measured" the fastest candidate at the decode `shapes`), its prologues fused, then the norms taken into the GEMVs
    (after the prologues: they need FusedAttention). The chosen Candidate, the quantisation (its notes: the compile
    log's lines on the modules) and the attention choice's lines; `shown`: progress shown."""
    folded = fold_norms(model) if target.fused_norms == "on" else None
    timed = target.weight_kernel == "measured" and any(c.precision in CHOICE_PRECISIONS for c in cells.values())
    with progress.step("emit: int4/int8 kernels timed per layer shape on the device (softsyn's and torchao's)",
                       enabled=shown and timed, done="emit: weight kernels chosen"):
        quantised = quantise_modules(model, cells, target.float_precision, target.weights, target.weight_kernel)
    gated, kept = fuse_gated_mlps(model)
    if gated:
        quantised.notes.append(f"{gated} gated MLP{'s' if gated != 1 else ''}: silu(gate) * up in the packed gate/up "
                               "GEMV's epilogue (softsyn's kernel, one kernel where two ran)")
    if kept:
        quantised.notes.append(f"{kept} MLP{'s' if kept != 1 else ''} with a packed gate/up on softsyn's kernel kept "
                               "their own forward: they do not compute silu(gate) * up")
    chosen, lines = Candidate(target.attention), []  # the target's named form, or the measured choice's candidate
    if chosen.form == MEASURED_FORM:
        timing = attention_timing(model, target.fused_prologue == "measured")
        with progress.step(f"emit: decode attention timed on the device ({timing.what}: "
                           f"{', '.join(c.label for c in timing.candidates)})",
                           enabled=shown, done="emit: decode attention chosen"):
            chosen, lines = choose_attention(shapes, getattr(torch, target.dtype), target.device, timing.timer,
                                             timing.candidates, fallback=timing.fallback, packaged=timing.packaged)
    quantised.notes.extend(prologues_for(target, chosen.form, model, chosen=chosen.prologue,
                                         writes_cache=chosen.writes_cache, folded=chosen.folded))
    quantised.notes.extend(norms_for(target, model, folded))
    return chosen, quantised, lines


def torch_settings(design, reference: dict, geometry: tuple, vocab: int, packages: list[Built]) -> dict:
    """runtime/torch.json's content (the weights added by the caller)."""
    target = torch_target(design.torch_target)
    cfg_max, _ = shared_buffer_length(design.constraints)
    layers, kv, head_dim = geometry
    return {
        "format": FORMAT, "target": design.torch_target, "package": TORCH_PACKAGE, "device": target.device,
        "loader": "torch._inductor.aoti_load_package(package)(input_ids, position_ids, slots, *kv) -> logits (shape: "
                  "outputs.logits, the last position's only where its seq is 1); kv "
                  "written in place; slots = arange(S), the cache slots attention reads (last position < S <= "
                  "max_length); `package` runs every step, `packages` says which one softsyn runs at which seq "
                  "(the one of the largest min_seq <= seq) and over which S (span \"end\": S = last position + 1 "
                  "exactly; \"rounded\": any such S)",
        "packages": {b.key: {"file": b.file, "attention": b.attention, "min_seq": b.min_seq, "kernels": b.kernels,
                             "constants": b.constants, "span": b.span}
                     for b in packages},
        "inputs": {"input_ids": ["batch", "seq", "int64"], "position_ids": ["batch", "seq", "int64"],
                   "slots": ["span", "int64"]},
        "outputs": {"logits": ["batch", 1 if last_logits(design) else "seq", "vocab_size", target.dtype]},
        "kv_cache": {"layers": layers, "kv_heads": kv, "head_dim": head_dim, "max_length": cfg_max,
                     "layout": "per layer key then value, [batch, kv_heads, max_length, head_dim]; inputs after "
                               "position_ids, the step's keys and values written into them at its positions"},
        "dtype": target.dtype, "cuda_graphs": target.device == "cuda", "vocab_size": vocab, "kernels": KERNELS_FILE,
        "scenarios": {g.name: {"dims": g.scenario.dims} for g in design.groups},
        "reference": reference,
        "accuracy": {"max_rel_error": design.constraints.accuracy.max_rel_error,
                     "min_top1": design.constraints.accuracy.min_top1},
    }


def loaded_step(design, folder: Path, settings: dict, packages: list[Built]) -> TorchStep:
    """The packages loaded as softsyn's runner loads them. Where model-prefill.pt2 was compiled without weights and this
    torch can give it none of model.pt2's (torch_weights: neither shared nor a copy), it is compiled again holding its
    own and torch.json says so ("constants": "own"): a package never depends on a load that fails here. A copy
    (user-managed constants refused) is kept: two in memory, as before sharing, without a second AOTInductor compile
    (~130 s at 1.7B on the H200)."""
    step = TorchStep(folder, settings)
    prefill = next((b for b in packages if b.key == PREFILL and b.constants == SHARED), None)
    if prefill is not None and PREFILL not in step.packages:
        prefill.said.append(f"{prefill.file}: compiled again with its own weights: this torch cannot hand it "
                            f"{TORCH_PACKAGE}'s ({step.weights})")
        del step
        prefill.constants, prefill.weights_config = OWN, {}
        t0 = time.perf_counter()
        compile_package(design, prefill.program, prefill, folder)
        prefill.seconds += time.perf_counter() - t0
        write_json(folder / prefill.kernels, calls_data(prefill.calls))
        settings["packages"][PREFILL]["constants"] = OWN
        write_json(folder / TORCH_FILE, settings)
        step = TorchStep(folder, settings)
    for built in packages:
        built.program = None
    return step


def package_notes(design, packages: list[Built], packed: int, folder: Path, step: TorchStep) -> list[str]:
    """The compile notes on each package: what it is, its compile time, its kernel map, and where the weights are
    held (on disk: the files' sizes; in memory: as softsyn's runner loaded them)."""
    target = torch_target(design.torch_target)
    cfg_max, _ = shared_buffer_length(design.constraints)
    name = f"target {design.torch_target}"
    two = len(packages) > 1
    lines = [f"{name}: {len(packages)} package{'s' if two else ''} built ("
             f"{', '.join(f'{b.file} {b.seconds:.1f} s' for b in packages)}, torch.export + AOTInductor each)"]
    for b in packages:
        serves = ("every step" if not two else "decode (seq 1)") if b.key == DECODE else f"steps of seq >= {b.min_seq}"
        lines += [f"{name}: {b.file} is the step lowered by torch.export + AOTInductor for {serves}: {b.seconds:.1f} "
                  f"s; static KV cache of {cfg_max} positions, {b.attention} attention over its filled prefix "
                  f"{'exactly' if b.span == END else f'in spans of {SPAN_STEP}'}; {packed} "
                  f"projection groups packed: QKV, gate/up; {target.dtype} activations and cache",
                  f"{name}: {b.kernels}: {len(b.calls)} kernel calls of {b.file}, "
                  f"{sum(1 for c in b.calls if c.modules)} mapped to source modules (Inductor's provenance)"]
    lines += [f"{name}: {said}" for b in packages for said in b.said]
    if two:
        sizes = ", ".join(f"{b.file} {(folder / b.file).stat().st_size / 1e6:.1f} MB" for b in packages)
        copies = 1 if step.shared is not None else len(packages)
        lines.append(f"{name}: {step.weights}; on disk {sizes} ("
                     + ("the weights once, in model.pt2; " if packages[-1].constants == SHARED else
                        "each package with its own weights; ")
                     + f"measured file sizes); in memory {'once' if copies == 1 else f'{copies} times'} "
                     + ("(the area report counts one, as held)" if copies == 1 else
                        "(the area report counts one: memory holds more)"))
    return lines


def measured_notes(design, analysis, folder: Path, step: TorchStep, measured: dict[str, float]) -> list[str]:
    """Per path group: the package's step (median of MEASURED_RUNS, also into `measured`), beside the library's
    estimate."""
    lines = []
    files = " and ".join(e["file"] for e in step.packages.values())
    with progress.step(f"emit: measuring {files} at every path group's dims", enabled=design.progress,
                       done=f"emit: {files} measured"):
        for group in analysis.groups:
            dims = group.scenario.dims
            if dims.get("past", 0) + dims.get("seq", 1) > step.max_length:
                lines.append(f"{group.name}: not measured (past + seq exceed the KV cache of {step.max_length})")
                continue
            seconds = measured[group.name] = step.measure(dims, runs=MEASURED_RUNS)
            est = group.critical.arrival - group.critical.input_delay
            file = step.packages[step.package_for(dims.get("seq", 1))]["file"]
            lines.append(f"{group.name} ({', '.join(f'{k} {v}' for k, v in dims.items())}; {file}): {fmt_time(seconds)} "
                         f"({MEASURED}, median of {MEASURED_RUNS}); {fmt_time(est)} ({ESTIMATED}, {design.library.name} "
                         f"library, critical path without input delay); clock {fmt_time(group.clock_period)}")
    text = "\n".join(lines) + "\n"
    write_atomic(folder / "reports" / "torch.rpt", f"# {design.netlist.name}: {design.torch_target} step per path "
                 f"group, {MEASURED} vs the {design.library.name} library's estimate\n{text}")
    return [f"target {design.torch_target}: {line}" for line in lines]
