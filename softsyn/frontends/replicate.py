"""A deep decoder of identical layers from the export of two: the last exported layer copied to the config's depth.

torch.export traces every layer again, so a weightless export of Qwen3-235B-A22B (94 layers of 128 experts)
costs minutes and GBs for 92 copies of one subgraph. The hierarchy is per layer (`model.layers.N`), so the
netlist of N layers is the two-layer export with `model.layers.1` copied N - 2 times: each copy reads the
previous copy's hidden state, its own past KV inputs and weightless weights named `model.layers.i.*`, writes
`present.i.*`, and shares what every layer reads (rotary cos/sin, the mask, shape arithmetic). Only configs whose
layers are one module qualify (`homogeneous`); a structure the copy cannot map (more than one value carried from
layer to layer) refuses with the reason and the caller exports every layer.
"""
from __future__ import annotations

import re

import onnx_ir as ir

from softsyn.netlist import HIERARCHY_KEY
from softsyn.netlist.keys import META_WEIGHTS

EXPORTED = 2  # layers traced: layer 0 (whatever the first layer shares) and layer 1, the template
LAYER = re.compile(r"^model\.layers\.(\d+)(?:\.|$)")


class NotReplicable(Exception):
    pass


def homogeneous(cfg) -> bool:
    """Every decoder layer is the same module: no dense-MLP layers among sparse ones, one attention kind."""
    if getattr(cfg, "mlp_only_layers", None) or getattr(cfg, "decoder_sparse_step", 1) not in (1, None):
        return False
    types = getattr(cfg, "layer_types", None)
    return not (types and len(set(types)) > 1) and not getattr(cfg, "use_sliding_window", False)


def layer_of(node: ir.Node) -> int | None:
    m = LAYER.match(node.metadata_props.get(HIERARCHY_KEY, ""))
    return int(m.group(1)) if m else None


def _renamer(j: int, i: int):
    pat = re.compile(rf"(?<=\.){j}(?=\.|$)")
    return lambda name: pat.sub(str(i), name, count=1)


def replicate_layers(model: ir.Model, layers: int) -> int:
    """Copy the last exported layer of `model` (in place) until it has `layers`; returns the copies made."""
    g = model.graph
    nodes = list(g)
    present = sorted({x for x in (layer_of(n) for n in nodes) if x is not None})
    if len(present) < 2 or present != list(range(len(present))):
        raise NotReplicable(f"layers {present} are not 0..n-1 with n >= 2")
    j = present[-1]
    if layers <= j + 1:
        return 0
    template = [n for n in nodes if layer_of(n) == j]
    ids = {id(n) for n in template}
    layer_name = re.compile(rf"\.{j}\.")
    past = [v for v in g.inputs if layer_name.search(v.name or "") and any(id(u) in ids or layer_of(u) is None
                                                                           for u, _ in v.uses())]
    # nodes without a scope that live inside this layer: the exporter's Identity of a cache input, a node the
    # optimizer made without metadata (a Split of the experts' gate/up); they read the layer or its past only
    block_ids = set(ids)
    for _ in range(8):  # a few levels of such nodes at most
        grown = False
        for n in nodes:
            if id(n) in block_ids or layer_of(n) is not None or any(o in g.outputs for o in n.outputs):
                continue
            reads = [v for v in n.inputs if v is not None]
            inside = [v for v in reads if v in past or (v.producer() is not None and id(v.producer()) in block_ids)]
            uses = [u for o in n.outputs for u, _ in o.uses()]
            if inside and uses and all(id(u) in block_ids for u in uses):
                block_ids.add(id(n))
                grown = True
        if not grown:
            break
    block = [n for n in nodes if id(n) in block_ids]
    outs = [o for n in block for o in n.outputs]
    graph_outs = [o for o in outs if o in g.outputs]
    carried_out = [o for o in outs if o not in g.outputs and any(id(u) not in block_ids for u, _ in o.uses())]
    if len(carried_out) != 1:
        raise NotReplicable(f"layer {j} passes on {len(carried_out)} values to what follows it (the copy maps one: "
                            f"the hidden state)")
    (h_out,) = carried_out
    # the one value layer j reads from layer j - 1 that has the hidden state's shape; what else it reads from there
    # (rotary cos/sin, the mask, that an optimizer's CSE left in layer j - 1's scope) is layer-independent: shared
    carried_in = {id(v): v for n in block for v in n.inputs
                  if v is not None and v.producer() is not None and layer_of(v.producer()) == j - 1
                  and v.shape == h_out.shape and v.dtype == h_out.dtype}
    if len(carried_in) != 1:
        raise NotReplicable(f"layer {j} reads {len(carried_in)} values shaped like the hidden state from layer "
                            f"{j - 1} (the copy maps exactly one)")
    (h_in,) = carried_in.values()
    outside = [(u, k) for u, k in h_out.uses() if id(u) not in block_ids]
    cursor, cur = block[-1], h_out
    in_at = max(list(g.inputs).index(v) for v in past) + 1 if past else len(g.inputs)
    out_at = max(list(g.outputs).index(v) for v in graph_outs) + 1 if graph_outs else len(g.outputs)
    for i in range(j + 1, layers):
        rename = _renamer(j, i)
        vmap = {id(h_in): cur}
        for v in past:
            new = ir.Value(name=rename(v.name), shape=v.shape, type=v.type)
            g.inputs.insert(in_at, new)
            in_at += 1
            vmap[id(v)] = new
        clones = [_clone(n, vmap, g, rename, i, j) for n in block]
        for o in graph_outs:
            new = vmap[id(o)]
            new.name = rename(o.name)
            g.outputs.insert(out_at, new)
            out_at += 1
        g.insert_after(cursor, clones)
        cursor, cur = clones[-1], vmap[id(h_out)]
    for u, k in outside:
        u.replace_input_with(k, cur)
    return layers - j - 1


def _clone(n: ir.Node, vmap: dict, g: ir.Graph, rename, i: int, j: int) -> ir.Node:
    inputs = []
    for v in n.inputs:
        if v is None or id(v) in vmap:
            inputs.append(None if v is None else vmap[id(v)])
        elif v.is_initializer() and re.search(rf"\.{j}\.", v.name or ""):
            vmap[id(v)] = _weight_like(g, v, rename(v.name))
            inputs.append(vmap[id(v)])
        else:
            inputs.append(v)  # shared: rotary cos/sin, mask, shape arithmetic, embedding
    attrs = [ir.Attr(a.name, a.type, a.value) for a in n.attributes.values()]
    node = ir.Node(n.domain, n.op_type, inputs, attrs, num_outputs=len(n.outputs), name=f"{n.name}__l{i}",
                   overload=n.overload, version=n.version)
    for o, new in zip(n.outputs, node.outputs):
        new.name, new.shape, new.type = f"{o.name}__l{i}", o.shape, o.type
        vmap[id(o)] = new
    node.metadata_props.update(n.metadata_props)
    h = n.metadata_props.get(HIERARCHY_KEY)
    if h is not None:
        node.metadata_props[HIERARCHY_KEY] = rename(h)
    return node


def _weight_like(g: ir.Graph, v: ir.Value, name: str) -> ir.Value:
    """The copy's own weight: same shape and dtype, weightless like the template's (a meta export's); a weight
    with data (a materialised export) is shared, so the copy computes what the template does."""
    t = v.const_value
    if isinstance(t, ir.ExternalTensor) and t.location == META_WEIGHTS:
        t = ir.ExternalTensor(location=t.location, offset=0, length=t.length, dtype=t.dtype, shape=t.shape, name=name)
    new = ir.Value(name=name, shape=v.shape, type=v.type, const_value=t)
    g.register_initializer(new)
    return new
