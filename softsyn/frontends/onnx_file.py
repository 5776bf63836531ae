"""Read an ONNX file as a netlist. External data stays lazy: nothing is read to time a model.

The graph is checked when it is read: every node input is produced by a node, an initializer or a
graph input (no dangling values), every element type has a size, there is no cycle, and a graph
stored out of order is sorted, so the netlist's execution order is topological. Nodes are told
apart by identity, never by name; each gets a name reports can print and ONNX Runtime accepts
(unique): an unnamed node is named after its op and index (`Relu_3`), a repeated name gets its
index (`dup_7`).
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import networkx as nx
import onnx_ir as ir

from softsyn.errors import SoftsynError
from softsyn.frontends import roles
from softsyn.netlist import NETLIST_META_KEY, Netlist, annotate_hierarchy

UNSIZED = (ir.DataType.UNDEFINED, ir.DataType.STRING)  # element types with no byte size (cost, area need one)


def _guess_kind(model: ir.Model) -> str:
    names = [v.name for v in model.graph.inputs]
    tokens = any("input_ids" in n or "inputs_embeds" in n for n in names)
    if any(roles.is_past_port(n) for n in names) and tokens:
        return "decoder"
    if tokens and roles.is_causal(model):
        return "causal"  # a decoder exported without a KV cache: one prefill group
    if any(n in ("input_ids", "pixel_values", "input_features") for n in names):
        return "encoder"
    return "generic"


@contextlib.contextmanager
def _serde_quiet():
    """onnx-ir logs a warning per undefined input while it loads; check_structure reports the first as an error."""
    logger = logging.getLogger("onnx_ir")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def load_onnx(path: Path) -> Netlist:
    try:
        with _serde_quiet():
            model = ir.load(str(path))
    except Exception as e:  # protobuf and onnx-ir raise many types for a file that is not a valid model
        why = " ".join(f"{type(e).__name__}: {e}".split())
        cause = e.__cause__
        if cause is not None:
            why += " (" + " ".join(f"{type(cause).__name__}: {cause}".split()) + ")"
        raise SoftsynError(f"{path}: cannot load ONNX model: {why}") from None
    check_structure(model.graph, path)
    found = roles.find_roles(model)
    roles.apply_roles(model, found.renames)
    if NETLIST_META_KEY not in model.metadata_props:
        annotate_hierarchy(model, prefix="")  # a plain export's scopes start at the model itself (no softsyn wrapper)
    nl = Netlist.from_model(model)
    name_nodes(model.graph)
    stored = bool(nl.provenance)
    for role, expr in found.derived.items():
        nl.derived_dims.setdefault(role, expr)
    if not stored:
        nl.name = path.stem
        nl.kind = _guess_kind(model)
        nl.provenance = {"exporter": "onnx file", "weights": "from file"}
        producer = " ".join(x for x in (model.producer_name, model.producer_version) if x)
        if producer:
            nl.provenance["producer"] = producer
    if found.renames:
        nl.provenance["dims"] = dict(found.renames)  # exporter's name -> role
    nl.provenance["source"] = str(path)
    nl.provenance.setdefault("exporter", "onnx file")
    nl.provenance["file"] = str(path.resolve())
    return nl


def _where(node: ir.Node, index: int) -> str:
    return f"node {node.name or '(unnamed)'} (#{index}, {node.op_type})"


def check_structure(graph: ir.Graph, path: Path) -> None:
    """SoftsynError naming the node and value for a dangling input or output, an unsized element type or
    a cycle (or for a graph without outputs); sorts an acyclic graph stored out of topological order."""
    if not graph.outputs:
        raise SoftsynError(f"{path}: the graph has no outputs, so there is no path to time (an empty or cut file?)")
    nodes = list(graph)
    index = {id(n): i for i, n in enumerate(nodes)}
    for i, node in enumerate(nodes):
        for value in node.inputs:
            if value is not None and value.producer() is None and not value.is_graph_input() \
                    and not value.is_initializer() and value.const_value is None:
                raise SoftsynError(f"{path}: {_where(node, i)}: input {value.name!r} is produced by no node, "
                                   "initializer or graph input")
    for value in graph.outputs:
        if value.producer() is None and not value.is_graph_input() and not value.is_initializer():
            raise SoftsynError(f"{path}: graph output {value.name!r} is produced by no node, initializer or graph input")
    values = [*graph.inputs, *graph.outputs, *graph.initializers.values(), *(v for n in nodes for v in n.outputs)]
    for value in values:
        if value.dtype is not None and value.dtype in UNSIZED:
            raise SoftsynError(f"{path}: value {value.name!r} has element type {value.dtype.name}, which has no size "
                               "to time or place in memory")
    if all(index.get(id(v.producer()), -1) < i for i, n in enumerate(nodes) for v in n.inputs if v is not None):
        return
    cycle = _cycle(nodes)
    if cycle:
        steps = " -> ".join(f"{n.name or '(unnamed)'} ({n.op_type})" for n, _ in cycle)
        node, value = cycle[0]
        raise SoftsynError(f"{path}: {_where(node, index[id(node)])}: input {value.name!r} depends on the node's own "
                           f"output (cycle {steps} -> {node.name or '(unnamed)'})")
    graph.sort()


def _cycle(nodes: list[ir.Node]) -> list[tuple[ir.Node, ir.Value]]:
    """One cycle in data-flow order as [(consumer, the input it reads from the previous node)], starting at
    a node that reads a later node's output; [] if there is none."""
    index = {id(n): i for i, n in enumerate(nodes)}
    flow = nx.DiGraph()
    for i, node in enumerate(nodes):
        for value in node.inputs:
            driver = value.producer() if value is not None else None
            if driver is not None and id(driver) in index:
                flow.add_edge(index[id(driver)], i, value=value)
    try:
        edges = nx.find_cycle(flow)
    except nx.NetworkXNoCycle:
        return []
    back = next(i for i, (u, v) in enumerate(edges) if u >= v)  # a node reading what it or a later node makes
    edges = edges[back:] + edges[:back]
    return [(nodes[v], flow.edges[u, v]["value"]) for u, v in edges]


def name_nodes(graph: ir.Graph) -> int:
    """Unique, printable names: an unnamed node becomes OP_INDEX, a repeated name NAME_INDEX. Returns how many were renamed."""
    nodes = list(graph)
    taken = {n.name for n in nodes if n.name}
    seen: set[str] = set()
    renamed = 0
    for i, node in enumerate(nodes):
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        base = f"{node.name or node.op_type}_{i}"
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        node.name = name
        taken.add(name)
        seen.add(name)
        renamed += 1
    return renamed


def check_external_data(model: ir.Model, where: str | Path) -> None:
    """Every external initializer's file exists and holds its bytes (SoftsynError naming file and tensor)."""
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if not isinstance(tensor, ir.ExternalTensor):
            continue
        file = Path(tensor.path)
        need = (tensor.offset or 0) + (tensor.length if tensor.length is not None else tensor.nbytes)
        if not file.is_file():
            raise SoftsynError(f"{where}: weight {value.name}: its external data file {file} is missing")
        size = file.stat().st_size
        if size < need:
            raise SoftsynError(f"{where}: weight {value.name}: its external data file {file} is truncated "
                               f"({size} bytes, the tensor ends at byte {need})")
