"""A decoder artifact's IO, read from its graph: what a generation loop feeds and what onnxruntime-genai is told.

`decoder_io(model)` names the token, mask and position inputs, the logits output and the KV ports of every layer
(past_key_values.N.key -> present.N.key, as name templates with %d), the KV heads, head size and dtype, whether
past and present share one buffer, and how many positions the rotary caches hold. A model that is not a decoder
with a KV cache raises NotDecoder, saying why.

A hybrid decoder (Qwen3-Next: linear-attention layers between full-attention ones) also carries fixed-size state
ports per linear-attention layer, named as onnxruntime-genai names them: past.N.conv -> present.N.conv and
past.N.recurrent -> present.N.recurrent (`DecoderIO.states`); N is the model's layer index, so its KV layers'
numbers have gaps (past_key_values.1.key, past_key_values.3.key).

Past and present share a buffer when the graph says so: every past input is read only by a GroupQueryAttention
(as its past key or value) that writes the matching present output, and both are declared with the same shape
(a `max_length` sequence dim). GQA then updates the buffer in place; a graph whose present is `past + seq` long
(the export's `past` -> `total`) grows its cache instead, present becoming the next step's past.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import onnx_ir as ir

from softsyn.errors import SoftsynError
from softsyn.netlist.keys import STATE_PORT

INPUT_IDS, ATTENTION_MASK, POSITION_IDS, LOGITS = "input_ids", "attention_mask", "position_ids", "logits"
ORT_DOMAIN = "com.microsoft"
# Where each op reads its cos cache: ORT's contrib RotaryEmbedding and GroupQueryAttention, ONNX's RotaryEmbedding
COS_CACHE_INPUT = {("RotaryEmbedding", ORT_DOMAIN): 2, ("GroupQueryAttention", ORT_DOMAIN): 7, ("RotaryEmbedding", ""): 1}
GQA_PAST = {"key": 3, "value": 4}  # GroupQueryAttention's past_key / past_value inputs
GQA_PRESENT = {"key": 1, "value": 2}  # and its present_key / present_value outputs


class NotDecoder(SoftsynError):
    """The model is not a decoder with a KV cache that a generation loop (or onnxruntime-genai) can drive."""


@dataclass(frozen=True)
class KvLayer:
    index: int
    past_key: str
    past_value: str
    present_key: str
    present_value: str


@dataclass(frozen=True)
class StatePort:
    """One fixed-size state of a linear-attention layer: fed as `past`, its next value comes out as `present`."""

    layer: int
    kind: str  # "conv" | "recurrent"
    past: str
    present: str
    shape: tuple[int, ...]  # one sequence's (the batch dim left out)
    elem: int  # onnx element type


@dataclass(frozen=True)
class DecoderIO:
    input_ids: str
    attention_mask: str | None
    position_ids: str | None
    logits: str
    layers: tuple[KvLayer, ...]
    templates: tuple[tuple[str, str], ...]  # (genai key, %d template): past_key_names, ..., present_value_names
    kv_heads: int
    head_size: int
    kv_elem: int  # onnx element type of the KV cache
    dtypes: tuple[tuple[str, str], ...]  # numpy dtype name of each token/mask/position input
    vocab_size: int | None
    shares_buffer: bool
    buffer_length: int | None  # the static sequence dim of a shared buffer (None: symbolic or not shared)
    max_positions: int | None  # rows of the smallest rotary cos cache (None: no rotary cache in the graph)
    states: tuple[StatePort, ...] = ()  # a hybrid decoder's conv and recurrent states, in layer order
    last_logits: bool = False  # logits [batch, 1, vocab] at every step: the last position's (passes.kv_layout)

    def dtype(self, name: str) -> str:
        return dict(self.dtypes)[name]

    def template(self, key: str) -> str:
        return dict(self.templates)[key]


def _dims(value: ir.Value) -> tuple:
    return tuple(d if isinstance(d, int) else str(d) for d in value.shape) if value.shape is not None else ()


def _kv_ports(values, side: str) -> dict[tuple[str, int], ir.Value]:
    """(key|value, layer) -> port, for the ports named like a KV cache ("past..." inputs, "present..." outputs)."""
    ports = {}
    for v in values:
        if side not in v.name:
            continue
        # the last of "key" / "value" in the name decides: past_key_values.0.value is a value
        at = {k: v.name.rfind(k) for k in ("key", "value")}
        kind = max(at, key=at.get) if max(at.values()) >= 0 else None
        layer = re.findall(r"\d+", v.name.replace(side, ""))
        if kind is None or len(layer) != 1:
            raise NotDecoder(f"KV port {v.name}: not named like past_key_values.N.key / present.N.value "
                             "(one layer number, key or value)")
        ports[(kind, int(layer[0]))] = v
    return ports


def _template(ports: dict, kind: str, layers: list[int], what: str) -> str:
    """The %d name template every layer's port follows (onnxruntime-genai names KV ports this way)."""
    first = ports[(kind, layers[0])].name
    number = str(layers[0])
    template = (re.sub(rf"(?<![\d%]){number}(?!\d)", "%d", first.replace("%", "%%"), count=1)
                if number in first else "")
    if not template or any(ports[(kind, i)].name != template % i for i in layers):
        raise NotDecoder(f"{what} {kind} ports ({first}, ...) do not follow one name template with the layer number")
    return template


def _shares(past: ir.Value, present: ir.Value, kind: str) -> bool:
    uses = list(past.uses())
    producer = present.producer()
    return (bool(uses) and producer is not None and producer.op_type == "GroupQueryAttention"
            and all(u.node is producer and u.idx == GQA_PAST[kind] for u in uses)
            and producer.outputs[GQA_PRESENT[kind]] is present and _dims(past) == _dims(present))


def max_positions(graph: ir.Graph) -> int | None:
    """Positions the graph's rotary caches hold (the smallest cos cache's rows); None where it has none."""
    rows = []
    for node in graph:
        idx = COS_CACHE_INPUT.get((node.op_type, node.domain or ""))
        if idx is not None and idx < len(node.inputs) and node.inputs[idx] is not None:
            shape = node.inputs[idx].shape
            if shape is not None and len(shape) >= 1 and isinstance(shape[0], int):
                rows.append(int(shape[0]))
    return min(rows) if rows else None


def _state_ports(graph: ir.Graph) -> tuple[StatePort, ...]:
    """The conv and recurrent state ports of a hybrid decoder: each past.N.KIND input with its present.N.KIND output
    and one shape (batch, then fixed dims)."""
    outputs = {v.name: v for v in graph.outputs}
    states = []
    for v in graph.inputs:
        m = STATE_PORT.fullmatch(v.name)
        if m is None or m[1] != "past":
            continue
        present = outputs.get(f"present.{m[2]}.{m[3]}")
        shape = _dims(v)
        if present is None:
            raise NotDecoder(f"state input {v.name}: no output present.{m[2]}.{m[3]} carries its next value")
        if len(shape) < 2 or not all(isinstance(d, int) for d in shape[1:]) or _dims(present)[1:] != shape[1:]:
            raise NotDecoder(f"state input {v.name}: shape {list(shape)} is not [batch, fixed dims...] matching "
                             f"{present.name}'s {list(_dims(present))}")
        states.append(StatePort(int(m[2]), m[3], v.name, present.name, shape[1:], int(v.dtype)))
    return tuple(sorted(states, key=lambda p: (p.layer, p.kind)))


def decoder_io(model: ir.Model, token_input: str = INPUT_IDS, extra: tuple[str, ...] = ()) -> DecoderIO:
    """The decoder IO of `model` (NotDecoder when it has no input_ids, logits or KV ports, or unknown inputs).
    `token_input`: the port tokens come in by (a composite's decoder block takes `inputs_embeds`); `extra`: other
    inputs it may have (a Qwen3-VL decoder's `deepstack_embeds`)."""
    graph = model.graph
    inputs = {v.name: v for v in graph.inputs}
    outputs = {v.name: v for v in graph.outputs}
    if token_input not in inputs or LOGITS not in outputs:
        raise NotDecoder(f"no {token_input} input or {LOGITS} output (inputs: {', '.join(inputs)})")
    states = _state_ports(graph)
    state_names = {n for p in states for n in (p.past, p.present)}
    past = _kv_ports([v for v in graph.inputs if v.name not in (token_input, ATTENTION_MASK, POSITION_IDS, *extra)
                      and v.name not in state_names], "past")
    present = _kv_ports([v for v in graph.outputs if v.name != LOGITS and v.name not in state_names], "present")
    layers = sorted({i for _, i in past})
    if not past or set(past) != {(k, i) for k in ("key", "value") for i in layers} or set(present) != set(past):
        raise NotDecoder(f"no KV cache: its past inputs ({len(past)}) and present outputs ({len(present)}) are not "
                         "one key and one value per layer")
    known = {token_input, ATTENTION_MASK, POSITION_IDS, *extra} | {v.name for v in past.values()} | state_names
    unknown = [n for n in inputs if n not in known]
    if unknown:
        raise NotDecoder(f"input {unknown[0]}: not a token, mask, position, KV or state input")
    templates = tuple((f"{side}_{kind}_names", _template(ports, kind, layers, side))
                      for side, ports in (("past", past), ("present", present)) for kind in ("key", "value"))
    first = past[("key", layers[0])]
    shape = _dims(first)
    if len(shape) != 4 or not isinstance(shape[1], int) or not isinstance(shape[3], int):
        raise NotDecoder(f"{first.name}: shape {list(shape)} is not [batch, kv_heads, seq, head_size]")
    shares = all(_shares(past[(k, i)], present[(k, i)], k) for k in ("key", "value") for i in layers)
    logits = _dims(outputs[LOGITS])
    return DecoderIO(
        input_ids=token_input,
        attention_mask=ATTENTION_MASK if ATTENTION_MASK in inputs else None,
        position_ids=POSITION_IDS if POSITION_IDS in inputs else None,
        logits=LOGITS,
        layers=tuple(KvLayer(i, past[("key", i)].name, past[("value", i)].name, present[("key", i)].name,
                             present[("value", i)].name) for i in layers),
        templates=templates,
        kv_heads=shape[1], head_size=shape[3], kv_elem=int(first.dtype),
        dtypes=tuple((n, ir.DataType(inputs[n].dtype).numpy().name) for n in (token_input, ATTENTION_MASK, POSITION_IDS)
                     if n in inputs),
        vocab_size=logits[-1] if logits and isinstance(logits[-1], int) else None,
        shares_buffer=shares,
        buffer_length=shape[2] if shares and isinstance(shape[2], int) else None,
        max_positions=max_positions(graph),
        states=states,
        last_logits=len(logits) == 3 and logits[1] == 1,
    )


def kv_aliases(netlist) -> dict[str, str]:
    """{present: past} of a decoder whose past and present share one buffer (kv_layout), so the measured run binds
    them as the artifact runs; {} otherwise."""
    try:
        io = decoder_io(netlist.model)
    except NotDecoder:
        return {}
    if not io.shares_buffer:
        return {}
    return {k: v for layer in io.layers for k, v in ((layer.present_key, layer.past_key),
                                                      (layer.present_value, layer.past_value))}
