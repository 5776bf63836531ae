"""The torch targets' step model (softsyn.emit.torch_lowering exports and compiles it): one decoder step over a
static KV cache the caller owns, written in place, attention over its filled prefix (BufferLayer, StaticStep; the
attention forms in softsyn.emit.torch_attention_forms, registered with transformers' AttentionInterface); QKV and
gate/up as one matmul per group (PackedLinear); the target dtype on the parameters only (cast_parameters); the compile
loop's int8 and int4 cells as torchao weight-only layers (quantise_modules; int4 as tinygemm's tile-packed layout or
softsyn's Triton kernel, whichever measures faster per layer shape on the device, CUDA only, at the cell's block); a
gated MLP on softsyn's kernel as one GEMV with its activation in the epilogue (GatedMLP, fuse_gated_mlps).
Sliding-window layers (Gemma-2/3) get their own mask (StaticStep)."""
from __future__ import annotations

import copy
import functools
import inspect
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
from transformers.cache_utils import Cache, StaticLayer

import softsyn.emit.torch_attention_forms  # noqa: F401 - registers the attention forms with transformers
from softsyn.emit.torch_kernel_choice import CHOICE_PRECISIONS, Pick, WeightShape, choose_weight_kernels
from softsyn.emit.triton_weights import (AUTOTUNED, GROUPS, QuantLinear, config_name, group_for, replace_linears,
                                         silu_gated)


class BufferLayer(StaticLayer):
    """One layer's cache as the step's input tensors, written in place at the step's positions (batch rows share
    them): the package mutates the caller's buffers, so a step moves no cache bytes beyond its own keys and values.
    Attention reads the first `span` slots only (the filled prefix, rounded up by the caller)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, where: torch.Tensor, span):
        super().__init__(max_cache_len=keys.shape[2])
        self.keys, self.values, self.where, self.device = keys, values, where, keys.device
        self.span = span
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        self.keys.index_copy_(2, self.where, key_states)
        self.values.index_copy_(2, self.where, value_states)
        return self.keys[:, :, :self.span], self.values[:, :, :self.span]


def rotary_embedding(model: torch.nn.Module) -> torch.nn.Module | None:
    """`model`'s rotary embedding module (transformers names it rotary_emb), None without one."""
    return next((m for n, m in model.named_modules() if n.endswith("rotary_emb")), None)


SUBCLASSES: dict[tuple[type, type], type] = {}  # (form, original class) -> form's subclass of that class


def on_same_state(original: torch.nn.Module, form: type, prefix: str) -> torch.nn.Module:
    """`original` as an instance of `form`'s subclass of its class (named prefix + its class's name, made once): a
    shallow copy with the same children, parameters and attributes, so module paths, weight names and kernel
    provenance are unchanged (the fused prologue's and fused norms' forms)."""
    key = (form, type(original))
    if key not in SUBCLASSES:
        SUBCLASSES[key] = type(f"{prefix}{key[1].__name__}", (form, key[1]), {"__module__": form.__module__})
    out = copy.copy(original)
    out.__class__ = SUBCLASSES[key]
    return out


def substitute_checked(model: torch.nn.Module, attempt: Callable) -> tuple[int, dict[str, int]]:
    """Put a checked substitute in place of each child of `model` that `attempt` takes: attempt(child) answers None
    (not its kind), a module (the substitute, checked to compute what the child does) or a str (why the child is
    kept). (How many were substituted, {reason: children kept for it}): the fused prologue's and fused norms' walk."""
    done, why = 0, {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            answer = attempt(child)
            if isinstance(answer, torch.nn.Module):
                setattr(parent, name, answer)
                done += 1
            elif answer is not None:
                why[answer] = why.get(answer, 0) + 1
    return done, why


class PackedLinear(torch.nn.Module):
    """Linear layers that read the same input as one matmul over their concatenated weights (a GEMV at decode:
    qwen3-1.7b's separate q/k/v GEMVs ran at 0.8 TB/s on the H200, 2026-12-03; one wide GEMV streams faster). The
    first part asked for an input computes every output; the others take theirs from it (same input object)."""

    def __init__(self, linears: list[torch.nn.Linear]):
        super().__init__()
        first, biases = linears[0], [lin.bias for lin in linears]
        # one nn.Linear over the concatenated weights: whatever handles Linear layers (torchao's quantize_) handles it
        self.linear = torch.nn.Linear(first.in_features, sum(lin.out_features for lin in linears),
                                      bias=all(b is not None for b in biases), device=first.weight.device,
                                      dtype=first.weight.dtype)
        with torch.no_grad():
            self.linear.weight.copy_(torch.cat([lin.weight for lin in linears]))
            if self.linear.bias is not None:
                self.linear.bias.copy_(torch.cat(biases))
        self.sizes = [lin.out_features for lin in linears]
        self._input, self._parts, self._taken = None, None, 0

    def part(self, index: int, x: torch.Tensor) -> torch.Tensor:
        if self._input is not x:
            self._input = x
            self._parts = self.linear(x).split(self.sizes, dim=-1)
            self._taken = 0
        out = self._parts[index]
        self._taken += 1
        if self._taken == len(self.sizes):  # every part taken: hold no tensor past the call
            self._input, self._parts = None, None
        return out


class PackedPart(torch.nn.Module):
    """One of a PackedLinear's outputs, where the Linear it replaces was."""

    def __init__(self, packed: PackedLinear, index: int):
        super().__init__()
        self.index = index
        # a plain reference, not a submodule: the PackedLinear is registered once, on the module that holds the
        # parts, so module walks (torchao's quantize_, parameters()) meet its weight once
        self.__dict__["packed"] = packed

    def forward(self, x):
        return self.packed.part(self.index, x)


PACKED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # attention's QKV, the MLP's gate and up


def pack_projections(model: torch.nn.Module) -> int:
    """Replace every group of PACKED Linear layers of one module (same input width) by a PackedLinear; how many."""
    packed = 0
    for module in list(model.modules()):
        for names in PACKED:
            linears = [getattr(module, name, None) for name in names]
            if not all(type(lin) is torch.nn.Linear for lin in linears):
                continue
            if len({lin.in_features for lin in linears}) != 1:
                continue
            group = PackedLinear(linears)
            setattr(module, "packed_" + "_".join(n.removesuffix("_proj") for n in names), group)
            for index, name in enumerate(names):
                setattr(module, name, PackedPart(group, index))
            packed += 1
    return packed


class GatedMLP(torch.nn.Module):
    """A gated MLP, down(silu(gate(x)) * up(x)), whose packed gate/up is softsyn's QuantLinear: one kernel computes
    the activation in the GEMV's epilogue (softsyn::gated_weight_matmul) where a decode step ran the GEMV and an
    elementwise kernel; a prompt (the layer's prompt form) runs the dequantised matmul and the activation in torch."""

    def __init__(self, gate_up: QuantLinear, down: torch.nn.Module):
        super().__init__()
        self.gate_up, self.down_proj = gate_up, down

    def forward(self, x: torch.Tensor, norm_eps: float | None = None,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """`norm_eps`, `residual` (a fused decoder layer's, softsyn.emit.torch_norms): x RMS-normed without a weight
        in the gate/up GEMV (the norm's weight folded into gate/up), the residual added in down's."""
        layer = self.gate_up
        if layer.prompt_form:  # the layer's own prompt form (dequantise + one matmul), then the activation
            h = silu_gated(layer(x) if norm_eps is None else layer(x, norm_eps))
        else:
            h = gated_gemv(layer, x, norm_eps)
        return self.down_proj(h) if residual is None else self.down_proj(h, residual=residual)


def gated_gemv(layer: QuantLinear, x: torch.Tensor, norm_eps: float | None = None) -> torch.Tensor:
    """silu(gate) * up of a packed gate/up QuantLinear in one kernel (softsyn::gated_weight_matmul), at the layer's
    pinned config (the measured choice times gate/up shapes in this form: GatedGemv) or autotuned; `norm_eps`: x
    RMS-normed (no weight) in the kernel first."""
    return torch.ops.softsyn.gated_weight_matmul(x, layer.packed, layer.scales, layer.lows, layer.config, norm_eps)


class GatedGemv(torch.nn.Module):
    """gated_gemv as a layer: what the measured choice times for a packed gate/up."""

    def __init__(self, layer: QuantLinear):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gated_gemv(self.layer, x)


class ActivatedLayer(torch.nn.Module):
    """torchao's layer of a packed gate/up with silu(gate) * up after it, as a package runs it (the GEMV, then one
    kernel Inductor fuses for the activation; compiled here on CUDA, so the choice times that kernel and not eager's
    casts, silu and product): what the measured choice times for torchao's form of a gated shape, like for like with
    GatedGemv, whose epilogue computes the activation."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layer(x)
        return compiled_activation()(y) if y.is_cuda else silu_gated(y)


@functools.cache
def compiled_activation() -> Callable[[torch.Tensor], torch.Tensor]:
    """silu_gated compiled by Inductor, once a process (the first call on a shape compiles it)."""
    return torch.compile(silu_gated, dynamic=False)


def gated_candidate(module: torch.nn.Module) -> QuantLinear | None:
    """The packed gate/up QuantLinear (no bias) of a module holding gate_proj and up_proj as its parts and a
    down_proj, else None."""
    packed = getattr(module, "packed_gate_up", None)
    parts = [getattr(module, name, None) for name in PACKED[1]]
    if not isinstance(packed, PackedLinear) or not isinstance(getattr(module, "down_proj", None), torch.nn.Module):
        return None
    if not all(isinstance(p, PackedPart) and p.packed is packed for p in parts) or len(packed.sizes) != 2:
        return None
    layer = packed.linear
    return layer if isinstance(layer, QuantLinear) and layer.bias is None and packed.sizes[0] == packed.sizes[1] else None


def fuse_gated_mlps(model: torch.nn.Module) -> tuple[int, int]:
    """Put a GatedMLP where each MLP with a packed softsyn gate/up computes down(silu(gate(x)) * up(x)); (how many
    fused, how many such MLPs kept). What an MLP computes is checked, not assumed from its class: both forms run on
    one random input of the layer's width and agree within fp16's rounding of the activation, or the MLP stays as it
    was (another activation or order, e.g. GELU-gated MLPs, computes something else and keeps its own)."""
    fused = kept = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            layer = gated_candidate(child)
            if layer is None:
                continue
            gated = GatedMLP(layer, child.down_proj)
            generator = torch.Generator(device=layer.packed.device).manual_seed(0)
            x = torch.randn(2, layer.in_features, generator=generator, device=layer.packed.device,
                            dtype=layer.scales.dtype)
            with torch.no_grad():
                want, got = child(x).float(), gated(x).float()
            if (got - want).abs().max() <= 1e-2 * want.abs().max() + 1e-6:
                setattr(parent, name, gated)
                fused += 1
            else:
                kept += 1
    return fused, kept


SPAN_HINT = 1024  # the example span torch.export traces: AOTInductor tunes each kernel over a dynamic dim for its
# example size, so a softmax traced over 7 slots looped 8 at a time: 136 us a layer at 4096 on the H200 (2026-12-03)


def example_span(max_length: int) -> int:
    """The span a package over a cache of `max_length` slots is exported at (SPAN_HINT, below the length: a span equal
    to the cache's length would let torch.export specialise the two as one)."""
    return max(4, min(SPAN_HINT, max_length - 1))


class StaticStep(torch.nn.Module):
    """(input_ids, position_ids, slots, k0, v0, k1, v1, ...) -> logits: one step over a static cache the caller owns,
    the step's keys and values written into it in place. `slots` (arange(S), S at least the last position + 1 and at
    most the cache's length) are the slots attention reads: a decode at 512 reads 512-odd slots, not the whole cache.
    A query sees the slots at or before its own position. With `last_logits` the lm_head reads the last position
    only (logits [B, 1, vocab], as the netlist's after kv_layout): a prompt of 512 then runs a one-row lm_head, not a
    512 x vocab GEMM (0.74 of 6.4 ms in qwen3-1.7b's int4 prefill, H100, 2026-12-06)."""

    def __init__(self, model, max_length: int, last_logits: bool = False):
        super().__init__()
        self.m, self.max_length, self.last_logits = model, max_length, last_logits
        # transformers' causal LMs slice the hidden state before their lm_head (logits_to_keep); any other model's
        # logits are sliced after it: the same function, without the saving
        self.keep = last_logits and "logits_to_keep" in inspect.signature(model.forward).parameters
        self.layers = model.config.num_hidden_layers
        types = set(getattr(model.config, "layer_types", None) or ())
        self.window = int(model.config.sliding_window) if "sliding_attention" in types else 0
        # transformers >= 5.2x names the argument `cache` (past_key_values is deprecated), as export_decoder reads it
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def forward(self, input_ids, position_ids, slots, *kv):
        where = position_ids[0]  # every row of a batch at the same positions
        span = slots.shape[0]
        cache = Cache(layers=[BufferLayer(kv[2 * i], kv[2 * i + 1], where, span) for i in range(self.layers)])
        mask = (slots[None, None, :] <= position_ids[:, :, None])[:, None]  # [B, 1, seq, span]
        if self.window:  # per layer type, as transformers' own masks: a sliding layer sees the last `window` slots
            mask = {"full_attention": mask,
                    "sliding_attention": mask & (slots[None, None, :] > position_ids[:, :, None] - self.window)[:, None]}
        out = self.m(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
                     **{self.cache_kw: cache}, **({"logits_to_keep": 1} if self.keep else {}))
        return out.logits[:, -1:] if self.last_logits and not self.keep else out.logits


TINYGEMM_BLOCKS = (32, 64, 128, 256)  # the group sizes aten._weight_int4pack_mm (torchao's int4 on CUDA) takes


def int4_config(block: int):
    """torchao's int4 weight-only layer at `block` (a group size tinygemm takes): the tile-packed layout runs
    aten._weight_int4pack_mm, in torch itself (the default layout needs the mslk package); its weight must be bf16 and
    it casts the activation to bf16 and the result back, so an fp16 step keeps fp16 around it."""
    return Int4WeightOnlyConfig(group_size=block, int4_packing_format="tile_packed_to_4d")


def int8_config(block: int):
    """torchao's int8 weight-only layer (per output channel: it has no block)."""
    return Int8WeightOnlyConfig()


TORCHAO = {"int8": int8_config, "int4": int4_config}  # the weight precisions torch targets can build, torchao's layer
WEIGHT_DTYPE = {"int4": torch.bfloat16}  # the dtype a precision's weight must have when torchao quantises it
BITS_ORDER = ("fp32", "bf16", "fp16", "int8", "fp8", "int4")  # most accurate first: a packed group takes its parts' first


@dataclass(frozen=True)
class WeightCell:
    precision: str  # int4 / int8 / fp8
    block: int  # the quantisation block the loop chose (0: none, per channel)


def weight_map(design) -> dict[str, WeightCell]:
    """{module name (the cell's hierarchy): its precision and block} of the design's quantised weight cells, as the
    loop left them."""
    out = {}
    for node in design.netlist.nodes():
        if node.op_type == "MatMulNBits":
            out[design.netlist.hierarchy(node)] = WeightCell(f"int{node.attributes.get_int('bits', 4)}",
                                                             node.attributes.get_int("block_size", 32))
        elif node.op_type == "MatMulBlockQuantizedFp8Weight":
            out[design.netlist.hierarchy(node)] = WeightCell("fp8", 0)
    return out


def tinygemm_block(block: int) -> int:
    """The group size tinygemm takes nearest `block` from below (finer blocks are at least as accurate)."""
    return max([b for b in TINYGEMM_BLOCKS if b <= block] or [TINYGEMM_BLOCKS[0]])


class Wanted(NamedTuple):
    """One Linear the map quantises (a packed group once), and the kernel that will run it."""
    linear: torch.nn.Linear
    names: list[str]  # the cells it realises
    precision: str
    block: int
    kernel: str  # "softsyn", "torchao", or "measured" until measured_kernels picks one
    config: int = AUTOTUNED  # softsyn's: the tuned config measured fastest, if measured

    def shape(self) -> WeightShape:
        # a packed gate/up is timed gated (fuse_gated_mlps runs it so where the MLP computes silu(gate) * up): the
        # gated form's fastest config is not the plain GEMV's (H100, 2026-12-06: 1 x 1024 vs 2 x 1024, 7 % apart)
        gated = all(any(name.endswith(f".{part}") for name in self.names) for part in PACKED[1])
        return WeightShape(self.precision, self.linear.in_features, self.linear.out_features, self.block, gated)


class Quantised(NamedTuple):
    notes: list[str]  # what was quantised, any cell kept float (and why), measured kernel choices
    kernels: dict[str, str]  # {cell name: the kernel that runs it} for every cell quantised


def quantise_modules(model: torch.nn.Module, cells: dict[str, WeightCell], float_precision: str,
                     built: tuple[str, ...], weight_kernel: str = "torchao") -> Quantised:
    """Weight-only quantisation of the Linear layers `cells` names, in the precisions `built` (a packed group at its
    most accurate part's precision and finest block): torchao's layers, or softsyn's own Triton kernel
    (softsyn.emit.triton_weights) for fp8, and for int4 and int8 as `weight_kernel` says ("torchao", "softsyn", or
    "measured": the faster of the two per precision and layer shape, timed on the device,
    softsyn.emit.torch_kernel_choice)."""
    modules = dict(model.named_modules())
    groups: dict[int, tuple[torch.nn.Linear, list[str], list[WeightCell]]] = {}
    notes = []
    for name, cell in sorted(cells.items()):
        module = modules.get(name)
        linear = module.packed.linear if isinstance(module, PackedPart) else module
        if not isinstance(linear, torch.nn.Linear):
            notes.append(f"cell {name} ({cell.precision}): no torch Linear of that name; kept {float_precision}")
            continue
        entry = groups.setdefault(id(linear), (linear, [], []))
        entry[1].append(name)
        entry[2].append(cell)
    wanted, unbuilt = [], {}
    for linear, names, asked in groups.values():
        precision = min((c.precision for c in asked), key=BITS_ORDER.index)
        block = min(c.block for c in asked if c.precision == precision)
        if precision in built:
            # fp8: softsyn's kernel only, its config measured where the kernels are
            kernel = weight_kernel if precision in CHOICE_PRECISIONS or weight_kernel == "measured" else "softsyn"
            wanted.append(Wanted(linear, names, precision, block, kernel))
        elif precision != float_precision:
            unbuilt[precision] = unbuilt.get(precision, 0) + 1
    notes += [f"{n} Linear layer{'s' if n != 1 else ''} mapped {p} kept {float_precision}: {p} is not built for this "
              f"torch target (built: {', '.join(built)})" for p, n in unbuilt.items()]
    wanted = buildable(measured_kernels(wanted, notes), float_precision, notes)
    kernels = {name: w.kernel for w in wanted for name in w.names}
    return Quantised(notes + build_layers(model, wanted), kernels)


def buildable(wanted: list[Wanted], float_precision: str, notes: list[str]) -> list[Wanted]:
    """`wanted` less the layers softsyn's kernel was to run whose input width no group of GROUPS divides: they stay
    `float_precision` (a line each in `notes`)."""
    kept = []
    for w in wanted:
        if w.kernel == "softsyn" and group_for(w.block, w.linear.in_features) is None:
            notes.append(f"{w.linear.in_features}-wide Linear mapped {w.precision} kept {float_precision}: no group "
                         f"of {GROUPS} divides its input width")
        else:
            kept.append(w)
    return kept


def measured_kernels(wanted: list[Wanted], notes: list[str]) -> list[Wanted]:
    """`wanted` with each "measured" kernel replaced by the faster of softsyn's and torchao's for its layer's
    precision and shape, timed on CUDA (softsyn.emit.torch_kernel_choice; its lines added to `notes`)."""
    shapes = {w.shape(): w.linear for w in wanted if w.kernel == "measured"}
    if not shapes:
        return wanted
    weight = next(iter(shapes.values())).weight
    picks, said = choose_weight_kernels(shapes, quant_layer, weight.dtype, weight.device.type)
    notes += said
    out = []
    for w in wanted:
        if w.kernel == "measured":
            pick = picks[w.shape()]
            w = w._replace(kernel=pick.kernel, config=pick.config)
        out.append(w)
    return out


def quant_layer(pick: Pick, linear: torch.nn.Linear, shape: WeightShape) -> torch.nn.Module:
    """A copy of `linear` as `pick`'s layer at `shape`'s precision and block (what build_layers makes of it), a
    gated shape's with its activation (GatedGemv, ActivatedLayer)."""
    if pick.kernel == "softsyn":
        group = group_for(shape.block, linear.in_features)
        if group is None:
            raise ValueError(f"no group of {GROUPS} divides the input width {linear.in_features}")
        layer = QuantLinear.from_linear(linear, group, shape.precision, pick.config)
        return GatedGemv(layer) if shape.gated else layer
    layer = copy.deepcopy(linear).to(WEIGHT_DTYPE.get(shape.precision, linear.weight.dtype))
    quantize_(layer, TORCHAO[shape.precision](torchao_block(shape.precision, shape.block)))
    # a gated shape's torchao form needs the activation kernel after it, which softsyn's computes in its epilogue:
    # timed without it, the choice leaned toward torchao by that kernel
    return ActivatedLayer(layer) if shape.gated else layer


def torchao_block(precision: str, block: int) -> int:
    """The block torchao's layer takes for a cell at `block`: tinygemm's nearest for int4, none (per channel) else."""
    return tinygemm_block(block) if precision == "int4" else 0


def build_layers(model: torch.nn.Module, wanted: list[Wanted]) -> list[str]:
    """Quantise `wanted`'s layers (each `buildable`) in place, softsyn's kernel or torchao's layer; the notes saying
    what was built."""
    notes, chosen = [], {}  # chosen: (precision, group or block, kernel, config) -> the layers
    for linear, _, precision, block, kernel, config in wanted:
        if kernel == "softsyn":
            chosen.setdefault((precision, group_for(block, linear.in_features), "softsyn", config), []).append(linear)
        else:
            chosen.setdefault((precision, torchao_block(precision, block), "torchao", AUTOTUNED), []).append(linear)
    for (precision, block, kernel, config), linears in sorted(chosen.items()):
        if kernel == "softsyn":
            count = replace_linears(model, linears, block, precision, config)
            notes.append(f"{count} Linear layer{'s' if count != 1 else ''} {precision} weight-only at group {block} "
                         f"(softsyn's Triton kernel, softsyn.emit.triton_weights, {config_name(precision, config)}), "
                         "as the compile's map")
            continue
        ids = {id(lin) for lin in linears}
        if precision in WEIGHT_DTYPE:
            with torch.no_grad():
                for lin in linears:
                    lin.to(WEIGHT_DTYPE[precision])
        config = TORCHAO[precision](block)
        quantize_(model, config, filter_fn=lambda m, fqn, ids=ids: id(m) in ids)
        at = f" at block {block}" if block else ""
        notes.append(f"{len(ids)} Linear layer{'s' if len(ids) != 1 else ''} {precision} weight-only{at} "
                     f"(torchao {type(config).__name__}), as the compile's map")
    return notes


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Parameters to `dtype`, buffers left as built: rotary's fp32 inv_freq cast to fp16 skews the angle at far
    positions (qwen3-tiny's keys at position 4096 were 7.5 % off the reference on the H200, 2026-12-03)."""
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.to(dtype)
