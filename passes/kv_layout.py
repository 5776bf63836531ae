"""kv_layout (effort low): the KV cache as ORT's GroupQueryAttention runs it fastest, and last-position logits.

A decoder whose attention is GroupQueryAttention (the fuse pass makes it) gets the layout onnxruntime-genai's
builder emits for `past_present_share_buffer`:

- past_key_values.N.key/value and present.N.key/value are declared [batch, kv_heads, max_length, head_dim]: one
  buffer per layer and key/value that the runtime binds as both past input and present output, and GQA writes
  the new positions into it in place (no copy of the cache per step, static shapes for CUDA graphs);
- seqlens_k = ReduceSum(attention_mask, 1) - 1 as int32 and total_sequence_length = attention_mask's width as an
  int32 scalar (a Shape of the mask: a host-side value), the builder's computation; the fuse pass builds them so,
  and a layer whose lengths read the past's shape instead is refused (the buffer's dim is max_length, not the
  cached length);
- max_length is constraints `kv_cache.max_length`, else the workload's (prompt_len, context_len + 1), and it must
  hold every timed scenario's past + seq.

The KV dtype is GQA's activation type T (past, present, query share it): kv_cache.dtype fp16/bf16 is realised by
the precision pass's fp16 map. kv_cache.dtype int8 on a GPU target is GQA's quantised cache: past/present int8,
k_quant_type / v_quant_type PER_CHANNEL, kv_cache_bit_width 8 and fp32 k_scale / v_scale [kv_heads, head_dim] from a
calibration run of the design (softsyn.runtime.kv_quant says why that scheme); ORT's CPU kernel runs the same cache,
so every CPU check measures its error. A weightless plan (no model written, nothing to calibrate on) gets the
int8 cache with placeholder scales, for its timing and area, and the note says so. fp8 is not applied (ORT CPU has
no float8e4m3fn GQA kernel to measure it on, and ORT CUDA registers one only in builds with USE_FP8_KV_CACHE), nor
int8 on a CPU target; the report says so.
Other reads of a past input are rewritten where their value does not depend on the cached length (a Shape of the
batch dim reads input_ids instead; of a static dim, a constant); any other read refuses the pass.

Option `last_token_logits` (default on): the lm_head reads the last position's hidden state only (a Slice before
it), so prefill computes and copies [batch, 1, vocab] logits, as generation reads them; `--all-logits` keeps all.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from softsyn.constraints import shared_buffer_length
from softsyn.errors import SoftsynError
from softsyn.netlist import HIERARCHY_KEY
from softsyn.netlist.keys import is_weightless
from passes import PassReport, PassResult, register
from passes.fuse.graph import add_initializer, make_node, scalar
from passes.padded_logits import gather_last_real
from softsyn.runtime.decoder import ATTENTION_MASK, GQA_PAST, GQA_PRESENT, INPUT_IDS, LOGITS
from softsyn.runtime.design_runner import DesignRunner
from softsyn.runtime.kv_quant import BITS, QUANT_TYPE, channel_scales

GQA_SEQLENS, GQA_TOTAL = 5, 6  # GroupQueryAttention's seqlens_k and total_sequence_length inputs
SEQ_AXIS = 2  # the sequence axis of a [batch, kv_heads, seq, head_dim] KV port
# kv_cache.dtype -> the GQA activation dtypes that realise it (bf16 requests are realised as fp16 by precision)
KV_REALISED = {"fp32": ("fp32",), "fp16": ("fp16",), "bf16": ("bf16", "fp16")}
DTYPE_NAME = {ir.DataType.FLOAT: "fp32", ir.DataType.FLOAT16: "fp16", ir.DataType.BFLOAT16: "bf16",
              ir.DataType.INT8: "int8"}
GQA_COS, GQA_K_SCALE, GQA_V_SCALE = 7, 12, 13  # GroupQueryAttention's cos_cache, k_scale and v_scale inputs
# Ops a lengths computation passes through from the mask to GQA's seqlens_k / total_sequence_length
LENGTH_OPS = {"ReduceSum", "Sub", "Cast", "Shape", "Squeeze", "Gather", "Slice", "Unsqueeze", "Reshape"}
LOGITS_OPS = {"MatMul", "Gemm", "MatMulNBits", "MatMulBlockQuantizedFp8Weight"}
SCALAR_OPS = {"Mul", "Div"}  # by a constant scalar, like Tanh and Cast each position's own (Gemma 2's final soft cap)


@dataclass(frozen=True)
class KvLayoutReport(PassReport):
    applied: bool
    reason: str  # why not applied, or what was done
    max_length: int | None
    length_key: str  # the constraints key (or workload) max_length came from
    layers: int
    kv_dtype: str | None  # the KV ports' dtype as emitted
    kv_note: str  # how kv_cache.dtype was realised, or why not
    last_token_logits: bool  # whether the lm_head now reads the last position only
    logits_note: str

    def lines(self) -> list[str]:
        head = (f"kv_layout: {self.layers} layers share one [batch, kv_heads, {self.max_length}, head_dim] past/present "
                f"buffer ({self.length_key})" if self.applied else f"kv_layout: KV layout unchanged: {self.reason}")
        return [head] + [note for note in (self.kv_note, self.logits_note) if note]

    def artifact_notes(self) -> list[str]:
        return self.lines()

    def session_entries(self) -> dict[str, object]:
        """session.json's kv_cache: the shared buffer's length (softsyn run binds it) and whether GQA updates it in
        place."""
        return {"kv_cache": {**({"max_length": self.max_length} if self.max_length else {}),
                             "shared_buffer": self.applied}}


def _hierarchy_pinned(node: ir.Node, dont_touch) -> bool:
    h = node.metadata_props.get(HIERARCHY_KEY, "")
    return any(fnmatch.fnmatchcase(h, g) or fnmatch.fnmatchcase(node.name or "", g) for g in dont_touch or ())


def kv_attention(graph: ir.Graph) -> list[ir.Node]:
    """The GroupQueryAttention nodes that read a past KV graph input and write a present graph output."""
    inputs, outputs = {id(v) for v in graph.inputs}, {id(v) for v in graph.outputs}
    found = []
    for node in graph:
        if node.op_type != "GroupQueryAttention" or len(node.inputs) <= GQA_TOTAL:
            continue
        past = [node.inputs[i] for i in GQA_PAST.values()]
        present = [node.outputs[i] for i in GQA_PRESENT.values()]
        if all(v is not None and id(v) in inputs for v in past) and all(id(v) in outputs for v in present):
            found.append(node)
    return found


def max_length_for(design) -> tuple[int, str]:
    """(max_length, where it came from): shared_buffer_length; SoftsynError when a timed scenario does not fit in it."""
    cons = design.constraints
    length, key = shared_buffer_length(cons)
    for group in design.groups:
        dims = group.scenario.dims
        need = dims.get("past", 0) + dims.get("seq", 1)
        if need > length:
            raise SoftsynError(f"{cons.source}: kv_cache.max_length {length} ({key}) is below scenario "
                               f"{group.name}'s past + seq = {need}: its shared KV buffer could not hold it; "
                               f"set kv_cache.max_length to at least {need}")
    return length, key


def _leaves(value: ir.Value) -> tuple[set[str], bool]:
    """(graph inputs the value is computed from, whether only LENGTH_OPS compute it)."""
    names, clean, stack, seen = set(), True, [value], set()
    while stack:
        v = stack.pop()
        if v is None or id(v) in seen or v.is_initializer() or v.const_value is not None:
            continue
        seen.add(id(v))
        node = v.producer()
        if node is None:
            names.add(v.name)
            continue
        clean &= node.op_type in LENGTH_OPS or node.op_type == "Constant"
        stack.extend(node.inputs)
    return names, clean


def _length_problem(node: ir.Node) -> str | None:
    """Why the node's seqlens_k / total_sequence_length do not fit a shared buffer (None: they are the mask's)."""
    for idx, what in ((GQA_SEQLENS, "seqlens_k"), (GQA_TOTAL, "total_sequence_length")):
        names, clean = _leaves(node.inputs[idx])
        if names != {ATTENTION_MASK} or not clean:
            return (f"{node.name}: {what} is computed from {', '.join(sorted(names)) or 'constants'}, not from "
                    f"{ATTENTION_MASK} alone (a shared buffer's dim is max_length, not the cached length)")
    return None


def _other_reads(graph: ir.Graph, past: ir.Value, attention: set[int]) -> tuple[list, str | None]:
    """The rewrites the past input's reads other than GQA need ([(Shape node, replacement)]), or why none fits."""
    plan = []
    for use in past.uses():
        node = use.node
        if id(node) in attention:
            continue
        if node.op_type != "Shape":
            return [], f"{past.name} is read by {node.op_type} {node.name}, not only by GroupQueryAttention"
        rank = len(past.shape)
        start = node.attributes.get_int("start", 0)
        end = node.attributes.get_int("end", rank)
        start, end = start + rank if start < 0 else start, min(end + rank if end < 0 else end, rank)
        axes = list(range(start, end))
        if axes == [0]:
            plan.append((node, "batch"))
        elif axes and all(isinstance(past.shape[a], int) and a != SEQ_AXIS for a in axes):
            plan.append((node, [int(past.shape[a]) for a in axes]))
        else:
            return [], f"{node.name} reads {past.name}'s dims {axes} (its cached length is not its shape any more)"
    return plan, None


def _apply_reads(graph: ir.Graph, plan) -> None:
    ids = next(v for v in graph.inputs if v.name == INPUT_IDS)
    for node, what in plan:
        if what == "batch":  # input_ids is [batch, seq]: the same batch dim
            node.replace_input_with(0, ids)
            node.attributes.pop("end", None)
            node.attributes["start"] = ir.AttrInt64("start", 0)
            node.attributes["end"] = ir.AttrInt64("end", 1)
        else:
            const = add_initializer(graph, f"{node.name}_dims", np.asarray(what, dtype=np.int64))
            ir.convenience.replace_all_uses_with(node.outputs[0], const)
            graph.remove(node, safe=True)


def kv_dtype_note(requested: str | None, emitted: str | None, why: str = "") -> str:
    if not requested:
        return ""
    if requested in ("int8", "fp8") and emitted != requested:
        return f"kv_cache.dtype {requested}: not applied ({why}); the KV cache stays {emitted}"
    if requested == emitted and why:
        return f"kv_cache.dtype {requested}: realised as {emitted} ({why})"
    if emitted in KV_REALISED.get(requested, ()):
        return f"kv_cache.dtype {requested}: realised as {emitted}" if requested != emitted else ""
    return (f"kv_cache.dtype {requested}: not applied (GroupQueryAttention keeps its KV cache in its activation "
            f"type, {emitted}; set precision.default to change both)")


def weightless(design) -> bool:
    return any(is_weightless(v) for v in design.netlist.model.graph.initializers.values())


def quantised_cache_problem(design, requested: str | None) -> str:
    """Why kv_cache.dtype `requested` (int8 / fp8) cannot be realised as GQA's quantised cache here ("" if it can)."""
    if requested == "fp8":
        return ("ORT CPU 1.31.1 has no float8e4m3fn GroupQueryAttention kernel to measure its error on, and ORT CUDA "
                "registers one only when built with USE_FP8_KV_CACHE")
    if not design.library.is_gpu:
        return f"the target {design.library.name} is a CPU target; its GroupQueryAttention keeps an fp32 cache"
    return ""


def calibrate(design, nodes: list[ir.Node]) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], int]:
    """({node name: (k_scale, v_scale)}, calibration tokens): the present K/V of the design run on every group's
    seeded inputs (ORT CPU), over the positions each group writes: a decode group's new token attends a seeded
    random cache and may run wider than a prompt's K/V; rounding's error is bounded by half a step, saturation's
    is not."""
    runner = DesignRunner(design, provider="cpu")
    names = [v.name for v in design.netlist.model.graph.outputs]
    groups = list(design.groups)
    tokens = sum(g.scenario.dims.get("seq", 1) * g.scenario.dims.get("batch", 1) for g in groups)
    scales = {}
    for node in nodes:
        half_split = node.attributes.get_int("do_rotary", 0) and not node.attributes.get_int("rotary_interleaved", 0)
        cos = node.inputs[GQA_COS] if len(node.inputs) > GQA_COS else None
        rotary = 2 * int(cos.shape[1]) if half_split and cos is not None and cos.shape is not None else 0
        pair = []
        for kind in ("key", "value"):
            idx = names.index(node.outputs[GQA_PRESENT[kind]].name)
            written = []
            for g in groups:
                past, seq = g.scenario.dims.get("past", 0), g.scenario.dims.get("seq", 1)
                written.append(runner.reference[g.name][idx][:, :, past:past + seq])
            pair.append(channel_scales(written, rotary if kind == "key" else 0))
        scales[node.name] = (pair[0], pair[1])
    return scales, tokens


def placeholder_scales(node: ir.Node) -> tuple[np.ndarray, np.ndarray]:
    """Unit-range scales [kv_heads, head_dim] for a node whose cache is timed, never run (a weightless plan)."""
    kv_heads, head_dim = int(node.inputs[GQA_PAST["key"]].shape[1]), int(node.inputs[GQA_PAST["key"]].shape[3])
    scale = np.full((kv_heads, head_dim), 1.0 / 127, np.float32)
    return scale, scale.copy()


def quantise_cache(graph: ir.Graph, nodes: list[ir.Node], scales: dict) -> None:
    """GQA's int8 cache on every node: the quant attributes, the scale initializers, int8 past/present ports."""
    for node in nodes:
        k_scale, v_scale = scales[node.name]
        if len(node.inputs) <= GQA_V_SCALE:
            node.resize_inputs(GQA_V_SCALE + 1)
        node.replace_input_with(GQA_K_SCALE, add_initializer(graph, f"{node.name}_k_scale", k_scale))
        node.replace_input_with(GQA_V_SCALE, add_initializer(graph, f"{node.name}_v_scale", v_scale))
        for attr in ("k_quant_type", "v_quant_type"):
            node.attributes[attr] = ir.AttrString(attr, QUANT_TYPE)
        node.attributes["kv_cache_bit_width"] = ir.AttrInt64("kv_cache_bit_width", BITS["int8"])
        for kind, i in GQA_PAST.items():
            for port in (node.inputs[i], node.outputs[GQA_PRESENT[kind]]):
                port.type = ir.TensorType(ir.DataType.INT8)


def rewrite_kv(nodes: list[ir.Node], length: int) -> None:
    """Declare every layer's past/present [batch, kv_heads, length, head_dim] (the caller checked they can be)."""
    for node in nodes:
        for kind, i in GQA_PAST.items():
            past, present = node.inputs[i], node.outputs[GQA_PRESENT[kind]]
            shape = list(past.shape)
            shape[SEQ_AXIS] = length
            past.shape = ir.Shape(shape)
            present.shape = ir.Shape(shape)


def slice_last_position(graph: ir.Graph, padded_by: ir.Node | None = None) -> str:
    """Slice the lm_head's input to the last position, or with `padded_by` (a GroupQueryAttention node) gather it at
    each row's last real position (passes.padded_logits: right-padded prompts); returns what was done (or why not)."""
    out = next((v for v in graph.outputs if v.name == LOGITS), None)
    head = out.producer() if out is not None else None
    after: list[ir.Value] = []  # what lies between the lm_head and the logits, each position on its own
    while head is not None and (head.op_type in ("Cast", "Tanh")
                                or (head.op_type in SCALAR_OPS and scalar(head.inputs[1]) is not None)):
        after.append(head.outputs[0])
        head = head.inputs[0].producer()
    if head is None or head.op_type not in LOGITS_OPS:
        return f"last_token_logits: not applied ({LOGITS} is not computed by a MatMul/Gemm lm_head)"
    x = head.inputs[0]
    if x.shape is None or len(x.shape) != 3:
        return f"last_token_logits: not applied (the lm_head's input {x.name} is not [batch, seq, hidden])"
    if x.shape[1] == 1:
        return ""
    scope = head.metadata_props.get(HIERARCHY_KEY, "")
    # the lm_head's parent scope: a dont_touch on the lm_head pins that cell, which stays as it was
    parent = scope.rsplit(".", 1)[0] if "." in scope else ""
    if padded_by is not None:
        head.replace_input_with(0, gather_last_real(graph, head, x, padded_by, parent))
    else:
        starts, ends, axes = (add_initializer(graph, f"last_position_{k}", np.asarray([v], dtype=np.int64))
                              for k, v in (("start", -1), ("end", np.iinfo(np.int64).max), ("axis", 1)))
        cut = make_node(head, "", "Slice", [x, starts, ends, axes], name="last_position_slice", hierarchy=parent)
        cut.outputs[0].shape = ir.Shape([x.shape[0], 1, x.shape[2]])
        cut.outputs[0].type = x.type
        graph.insert_before(head, [cut])
        head.replace_input_with(0, cut.outputs[0])
    for v in [head.outputs[0]] + after:
        if v.shape is not None and len(v.shape) == 3:
            v.shape = ir.Shape([v.shape[0], 1, v.shape[2]])
    if padded_by is not None:
        return ("last_token_logits: the lm_head reads each row's last real position only (logits [batch, 1, vocab] "
                "at prefill; serving.prompt_buckets: right-padded prompts)")
    return "last_token_logits: the lm_head reads the last position only (logits [batch, 1, vocab] at prefill)"


@register("kv_layout", "KV ports as one max_length past/present buffer GroupQueryAttention updates in place; "
                       "last-position logits")
def run(design, last_token_logits: bool = True) -> PassResult:
    last = last_token_logits
    graph = design.netlist.model.graph
    cons = design.constraints
    counts: dict[str, int] = {}
    report = dict(applied=False, max_length=None, length_key="", layers=0, kv_dtype=None, kv_note="",
                  last_token_logits=False, logits_note="")
    nodes = kv_attention(graph)
    reason = ""
    if design.netlist.kind != "decoder":
        reason = f"not a decoder with a KV cache (netlist kind {design.netlist.kind})"
    elif not nodes:
        reason = "no GroupQueryAttention reads a past KV input and writes a present output"
    elif not any(v.name == ATTENTION_MASK for v in graph.inputs):
        reason = f"no {ATTENTION_MASK} input: seqlens_k and total_sequence_length need it with a shared buffer"
    pinned = [n.name for n in nodes if _hierarchy_pinned(n, cons.dont_touch)]
    if not reason and pinned:
        reason = f"dont_touch holds {', '.join(pinned[:3])}{' ...' if len(pinned) > 3 else ''}"
    if not reason:
        reason = next((p for p in map(_length_problem, nodes) if p), "")
    reads = []
    if not reason:
        attention = {id(n) for n in nodes}
        for node in nodes:
            for i in GQA_PAST.values():
                plan, problem = _other_reads(graph, node.inputs[i], attention)
                reads += plan
                reason = reason or problem or ""
    if not reason:
        length, key = max_length_for(design)
        _apply_reads(graph, reads)
        rewrite_kv(nodes, length)
        counts["layers rewritten"] = len(nodes)
        if reads:
            counts["past reads moved"] = len(reads)
        requested, why = cons.kv_cache.dtype, ""
        if requested in ("int8", "fp8"):
            why = quantised_cache_problem(design, requested)
            if not why:
                design.netlist_changed()  # the calibration binds the shared buffers' shapes
                if weightless(design):  # a plan writes no model: its scales only fill the inputs' place
                    scales = {n.name: placeholder_scales(n) for n in nodes}
                    how = "placeholder scales (a weightless plan: no weights to calibrate on; timing and area only)"
                else:
                    scales, tokens = calibrate(design, nodes)
                    how = f"per-channel scales from {tokens} seeded calibration tokens"
                quantise_cache(graph, nodes, scales)
                counts["KV caches quantised"] = 2 * len(nodes)
                measured = any(c.op == "GroupQueryAttention" and c.precision == "int8" for c in design.library.cells)
                why = (f"GroupQueryAttention's quantised cache, {how}; timed by " + ("the library's GroupQueryAttention.int8 cell" if measured else
                                               "a roofline estimate (est): the library has no GroupQueryAttention.int8 "
                                               "cell yet"))
        emitted = DTYPE_NAME.get(nodes[0].inputs[GQA_PAST["key"]].dtype)
        report.update(applied=True, max_length=length, length_key=key, layers=len(nodes), kv_dtype=emitted,
                      kv_note=kv_dtype_note(requested, emitted, why))
    if last and design.netlist.kind == "decoder":
        buckets = cons.serving.prompt_buckets if cons.serving is not None else None
        note = slice_last_position(graph, nodes[0] if buckets and nodes and not reason else None)
        applied = note.startswith("last_token_logits: the lm_head")
        report.update(last_token_logits=applied, logits_note=note)
        if applied:
            counts["logits sliced"] = 1
    elif not last:
        report.update(logits_note="last_token_logits: off (--all-logits): prefill emits every position's logits")
    if counts:
        design.netlist_changed()
    result = KvLayoutReport(reason=reason or "shared past/present buffer", **report)
    for line in result.lines():
        design.log(line)
    return PassResult(counts, result)
