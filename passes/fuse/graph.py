"""Graph helpers for fusion rules: producers, consumers, constants, node building, cone evaluation."""
from __future__ import annotations


import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir import serde

from softsyn.netlist import HIERARCHY_KEY
from softsyn.netlist.keys import META_WEIGHTS
from softsyn.names import fresh  # noqa: F401  (the passes' name for it)
from softsyn.runtime.session import IR_VERSION, SessionSettings, external_initializer, host_array, open_session

MS = "com.microsoft"
# Cone initializers above this many bytes reach ORT as external initializers, not inside the protobuf.
INLINE_BYTES = 1 << 20


def producer(v: ir.Value | None) -> ir.Node | None:
    return None if v is None else v.producer()


def op(v: ir.Value | None, *types: str) -> ir.Node | None:
    """The producer of v if its op_type is one of types (standard domain or com.microsoft)."""
    n = producer(v)
    if n is not None and n.op_type in types:
        return n
    return None


def consumers(v: ir.Value) -> list[ir.Node]:
    seen, out = set(), []
    for use in v.uses():
        node = use.node if hasattr(use, "node") else use[0]
        if id(node) not in seen:
            seen.add(id(node))
            out.append(node)
    return out


def downstream(start: ir.Value, follow):
    """Every node reachable forward from `start`, once, with the value it read: yields (node, value);
    `follow(node, value)` gives the output the walk continues from (None: it stops at that node)."""
    seen, stack = set(), [start]
    while stack:
        v = stack.pop()
        for n in consumers(v):
            if id(n) in seen:
                continue
            seen.add(id(n))
            yield n, v
            nxt = follow(n, v)
            if nxt is not None:
                stack.append(nxt)


def is_graph_output(graph: ir.Graph, v: ir.Value) -> bool:
    return any(o is v for o in graph.outputs)


def const(v: ir.Value | None) -> np.ndarray | None:
    """The constant value of v (initializer or Constant node), else None."""
    if v is None:
        return None
    t = v.const_value
    if t is None:
        n = producer(v)
        if n is not None and n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            for name, attr in n.attributes.items():
                val = attr.value
                if name == "value":
                    t = val
                elif name in ("value_float", "value_int"):
                    return np.array(val)
                elif name in ("value_floats", "value_ints"):
                    return np.array(list(val))
        if t is None:
            return None
    try:
        return t.numpy()
    except Exception:  # meta / unreadable external data
        return None


def weightless(v: ir.Value | None) -> bool:
    """v is an initializer whose data cannot be read: a meta (weightless) export's weights, which keep exact
    shape and dtype but point at external data that was never written."""
    return v is not None and v.producer() is None and v.const_value is not None and const(v) is None


def const_shape(v: ir.Value | None) -> tuple[int, ...] | None:
    """The shape of a constant (initializer or Constant node) whether or not its data is readable, else None.
    For checks that need a weight's shape, not its values, so weightless netlists pass them too."""
    c = const(v)
    if c is not None:
        return tuple(c.shape)
    if weightless(v) and v.shape is not None and all(isinstance(d, int) for d in v.shape):
        return tuple(v.shape)
    return None


def add_weightless(graph: ir.Graph, name: str, shape, dtype: ir.DataType) -> ir.Value:
    """A new initializer with shape and dtype only, like a meta export's weights (see frontends.export)."""
    base, k = name, 0
    while name in graph.initializers:
        k += 1
        name = f"{base}_{k}"
    shape = ir.Shape([int(d) for d in shape])
    nbytes = int(np.prod(list(shape), dtype=np.int64)) * dtype.itemsize
    v = ir.Value(name=name, shape=shape, type=ir.TensorType(dtype),
                 const_value=ir.ExternalTensor(location=META_WEIGHTS, offset=0, length=nbytes, dtype=dtype,
                                               shape=shape, name=name))
    graph.register_initializer(v)
    return v


def placeholders(values: list[ir.Value], seed: int = 0) -> dict:
    """Seeded stand-ins (uniform in [0.5, 1.5)) for the weightless initializers the cone of `values` reads, as
    `evaluate` feeds: a weightless netlist's constant subgraph (e.g. the rotary inv_freq buffer) can then be run
    to check its structure; what it computes from them is not the model's data."""
    rng = np.random.default_rng(seed)
    out, seen, stack = {}, set(), list(values)
    while stack:
        v = stack.pop()
        if v is None or id(v) in seen:
            continue
        seen.add(id(v))
        if weightless(v):
            shape = tuple(int(d) for d in v.shape)
            out[v] = (0.5 + rng.random(shape)).astype(v.dtype.numpy())
        elif v.producer() is not None:
            stack.extend(v.producer().inputs)
    return out


def scalar(v: ir.Value | None) -> float | None:
    c = const(v)
    if c is None or c.size != 1:
        return None
    return float(c.reshape(()))


def attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def other_input(node: ir.Node, v: ir.Value) -> ir.Value | None:
    ins = list(node.inputs)
    if len(ins) != 2:
        return None
    if ins[0] is v:
        return ins[1]
    if ins[1] is v:
        return ins[0]
    return None


def rank(v: ir.Value | None) -> int | None:
    if v is None or v.shape is None:
        return None
    return len(v.shape)


def dim(v: ir.Value | None, i: int):
    if v is None or v.shape is None or len(v.shape) <= abs(i) - (1 if i < 0 else 0):
        return None
    d = v.shape[i]
    return d if isinstance(d, int) else (d.value if hasattr(d, "value") else None)


def make_node(anchor: ir.Node, domain: str, op_type: str, inputs, attrs: dict | None = None,
              num_outputs: int = 1, name: str | None = None, hierarchy: str | None = None) -> ir.Node:
    """A new node that inherits the anchor's hierarchy; attrs converted by onnx_ir."""
    attributes = ir.convenience.convert_attributes(attrs or {})
    node = ir.Node(domain, op_type, list(inputs), attributes, num_outputs=num_outputs,
                   name=name or fresh(f"{op_type}"))
    h = hierarchy if hierarchy is not None else anchor.metadata_props.get(HIERARCHY_KEY, "")
    node.metadata_props[HIERARCHY_KEY] = h
    for i, o in enumerate(node.outputs):
        o.name = fresh(f"{node.name}_out{i}")
    return node


def add_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    base, k = name, 0
    while name in graph.initializers:
        k += 1
        name = f"{base}_{k}"
    v = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                 const_value=ir.tensor(array, name=name))
    graph.register_initializer(v)
    return v


def replace_value(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Every use of old now reads new; a graph output keeps its name (new takes it over)."""
    outs = [i for i, o in enumerate(graph.outputs) if o is old]
    if outs:
        name = old.name
        old.name = fresh(name + "_old")
        new.name = name
        if old.shape is not None and new.shape is None:
            new.shape = old.shape
        if old.type is not None and new.type is None:
            new.type = old.type
        for i in outs:
            graph.outputs[i] = new
    ir.convenience.replace_all_uses_with(old, new)


def swap_node(graph: ir.Graph, old: ir.Node, new: ir.Node) -> None:
    """`new` in `old`'s place: inserted before it with its metadata, its one output taking the old output's dtype,
    shape, name and every use (graph outputs too); `old` removed."""
    new.metadata_props.update(old.metadata_props)
    out, was = new.outputs[0], old.outputs[0]
    out.dtype, out.shape = was.dtype, was.shape
    graph.insert_before(old, new)
    name = was.name
    was.replace_all_uses_with(out, replace_graph_outputs=True)
    graph.remove(old, safe=True)
    out.name = name


def remove_dead(graph: ir.Graph) -> int:
    """Remove nodes none of whose outputs are used or graph outputs; returns the count removed."""
    removed = 0
    outputs = {id(o) for o in graph.outputs}
    changed = True
    while changed:
        changed = False
        for node in reversed(list(graph)):
            if any(id(o) in outputs or o.uses() for o in node.outputs):
                continue
            graph.remove(node, safe=True)
            removed += 1
            changed = True
    for name in list(graph.initializers):
        v = graph.initializers[name]
        if not v.uses() and id(v) not in outputs and not any(i is v for i in graph.inputs):
            graph.initializers.pop(name)
    return removed


def insert_before(graph: ir.Graph, anchor: ir.Node, nodes: list[ir.Node]) -> None:
    graph.insert_before(anchor, nodes)


def first_in_order(graph: ir.Graph, nodes: list[ir.Node]) -> ir.Node:
    """The node of `nodes` that comes first in the graph: where a node replacing several must go, so that every
    consumer of any value it takes over still comes after it."""
    wanted = {id(n) for n in nodes}
    return next(n for n in graph if id(n) in wanted)


def read_before_made(graph: ir.Graph) -> tuple[ir.Node, ir.Value] | None:
    """The first node reading a value whose producer comes after it in the graph, or None (topological order)."""
    placed: set[int] = set()
    for node in graph:
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is not None and producer.graph is graph and id(producer) not in placed:
                return node, value
        placed.add(id(node))
    return None


def site(netlist, node: ir.Node) -> str:
    h = netlist.hierarchy(node) if netlist is not None else node.metadata_props.get(HIERARCHY_KEY, "")
    label = node.name or f"{node.op_type} -> {node.outputs[0].name if node.outputs else '?'}"
    return f"{h or '<top>'} ({label})"


# --------------------------------------------------------------------------- cone evaluation
def evaluate(graph: ir.Graph, outputs: list[ir.Value], feeds: dict, opsets: dict[str, int],
             provider: str = "cpu") -> list[np.ndarray]:
    """Run the cone of `outputs` on ORT (`provider`: "cpu", or "cuda" to check a kernel on the target). `feeds` maps
    ir.Value (graph inputs or any inner value, which then acts as an input) -> numpy array. Raises ValueError naming
    what the cone needs."""
    fed = {id(v): (v, a) for v, a in feeds.items()}
    nodes: list[ir.Node] = []
    seen: set[int] = set()
    inits: dict[str, ir.Value] = {}
    stack = list(outputs)
    while stack:
        v = stack.pop()
        if v is None or id(v) in fed:
            continue
        if v.const_value is not None and v.producer() is None:
            inits[v.name] = v
            continue
        n = v.producer()
        if n is None:
            raise ValueError(f"the cone needs graph input {v.name}")
        if id(n) in seen:
            continue
        seen.add(id(n))
        nodes.append(n)
        stack.extend(n.inputs)
    nodes = _topological(graph, nodes)
    protos = [serde.serialize_node(n) for n in nodes]
    inputs, feed_np = [], {}
    for v, a in fed.values():
        a = np.asarray(a)
        inputs.append(onnx.helper.make_tensor_value_info(v.name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
        feed_np[v.name] = a
    external: dict[str, tuple[int, np.ndarray]] = {}
    init_protos = [_initializer(v, external) for v in inits.values()]
    outs = [onnx.helper.make_tensor_value_info(v.name, int(v.dtype) if v.dtype is not None else onnx.TensorProto.FLOAT, None)
            for v in outputs]
    g = onnx.helper.make_graph(protos, "cone", inputs, outs, initializer=init_protos)
    model = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid(d, o) for d, o in opsets.items()],
                                   ir_version=IR_VERSION)
    # no CPU fallback on a GPU: a node the provider cannot run fails the probe instead of quietly running on the CPU
    sess = open_session(model, SessionSettings(provider=provider, optimize=False, intra_op_threads=1,
                                               cpu_fallback=provider == "cpu"), external=external)
    return sess.run([v.name for v in outputs], feed_np)


def _initializer(v: ir.Value, external: dict) -> onnx.TensorProto:
    """v's initializer for the cone's protobuf: inline when small; above INLINE_BYTES a reference to external data
    whose array goes into `external` (name -> (elem, array)) for the session to add, since protobuf caps the whole
    model at 2 GiB (a real-size MoE layer's stacked experts alone are 2 GiB: Qwen3-Next-80B's 512 x 1024 x 2048 fp16)."""
    t = v.const_value
    if t.nbytes > INLINE_BYTES and t.dtype.bitwidth >= 8:
        external[v.name] = (int(t.dtype), host_array(t.numpy()))  # bf16/fp8: ORT takes their bits
        return external_initializer(v.name, int(t.dtype), t.shape, t.nbytes, "softsyn-cone")
    if isinstance(t, ir.ExternalTensor):  # the cone is loaded from bytes: inline what it reads
        t = ir.tensor(t.numpy(), name=v.name)
    tp = serde.serialize_tensor(t)
    tp.name = v.name
    return tp


def _topological(graph: ir.Graph, nodes: list[ir.Node]) -> list[ir.Node]:
    """`nodes` in an order where every producer precedes its consumers; graph order breaks ties, and
    nodes not (yet) in the graph (a candidate rewrite being checked) come after the ones they read."""
    order = {id(n): i for i, n in enumerate(graph)}
    nodes = sorted(nodes, key=lambda n: order.get(id(n), len(order)))
    inside = {id(n) for n in nodes}
    placed: set[int] = set()
    out: list[ir.Node] = []
    for root in nodes:
        stack = [(root, False)]
        while stack:
            n, expanded = stack.pop()
            if id(n) in placed:
                continue
            if expanded:
                placed.add(id(n))
                out.append(n)
                continue
            stack.append((n, True))
            for v in reversed(list(n.inputs)):
                p = v.producer() if v is not None else None
                if p is not None and id(p) in inside and id(p) not in placed:
                    stack.append((p, False))
    return out


def cone_inputs(values: list[ir.Value], stop: set[int] | None = None) -> list[ir.Value]:
    """Graph inputs (non-constant values without a producer) the cone of `values` reads."""
    stop = stop or set()
    found, seen, stack = [], set(), list(values)
    while stack:
        v = stack.pop()
        if v is None or id(v) in seen or id(v) in stop:
            continue
        seen.add(id(v))
        n = v.producer()
        if n is None:
            if v.const_value is None:
                found.append(v)
            continue
        stack.extend(n.inputs)
    return found


def int64(graph: ir.Graph, name: str, values) -> ir.Value:
    return add_initializer(graph, name, np.asarray(values, dtype=np.int64))


def input_dependent(graph: ir.Graph) -> set[int]:
    """ids of the values that depend on a graph input (activations), in one pass over the graph's topological
    order; the rest (weights, constants and what only they feed) the runtime can compute at load."""
    dynamic = {id(v) for v in graph.inputs if v.const_value is None}  # an input with an initializer is a weight
    for node in ir.traversal.RecursiveGraphIterator(graph):
        if any(v is not None and id(v) in dynamic for v in node.inputs):
            dynamic.update(id(o) for o in node.outputs)
    return dynamic
