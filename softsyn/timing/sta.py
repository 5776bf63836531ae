"""Static timing analysis of one path group.

The netlist executes on streams: a cell starts when its inputs have arrived,
its stream is free and the host has issued it, so arrival = max(data
predecessors, stream free, issued) + device time, where the host issues the
cells in execution order, each taking its host time (Library.host_device). On
a CPU provider the host does the work (host = delay, device = 0) and arrival is
the running sum in execution order; on a GPU the host only launches
(launch_overhead per node) and kernels run behind it, so a host-bound graph
costs its launches and a device-bound one its kernels (ORT CUDA, plain fp16
Qwen3 exports: 2608 executed nodes x the measured 4.47 us launch = 11.7 ms, the
measured 11.5-12.3 ms of every 0.6B/1.7B scenario, while the sum of the copies-
measured cell delays said 15.5-20 ms). A cell ORT fuses into another when the session
loads (softsyn.runtime.load_view) keeps its kernel time but costs the host no launch: GPT-2-small's export has
648 nodes, ORT launches 550, and the H200 took 5.1-5.6 us per launched node. A one-graph design runs every cell on one stream
(what ONNX Runtime does for one session.run). A composite (vision, embedding,
decoder blocks: one session each) gives each block its own stream and host, which
starts at the input delay of the ports it reads plus its own per-call overhead,
so the text embedding runs while the vision encoder does; a block's host issues a
cell only once the data it reads from another block has arrived. A group runs
only its blocks (a decode step or a text-only task runs no vision).

Required time = clock period - clock uncertainty - output delay, and the
data's arrival starts at the input delay of the ports the group uses, plus the
runtime's fixed per-call overhead.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import networkx as nx
import onnx_ir as ir

from softsyn.constraints import Constraints
from softsyn.library import Library
from softsyn.netlist import Netlist
from softsyn.timing.capture import Launch
from softsyn.timing.tp import collective_bytes
from softsyn.timing.cost import PRECISION_BY_DTYPE, Work, has_cost_model, node_work, precision_of
from softsyn.timing.scan import scan_timing
from softsyn.results.analysis import GroupTiming, PathPoint, Scenario, TimingPath

NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
RUN_CALL = "session.run"  # the pseudo-cell for the runtime's fixed per-call overhead
STORED_PATHS = 10  # paths per group kept with their full point list (others keep endpoint figures only)
UNMODELLED = "no-model"  # the source of a cell whose op has no library cell and no cost model


@dataclass
class PathGroup:
    """A path group resolved against a netlist: its clock and its scenario."""

    name: str
    clock_period: float | None  # None: unconstrained
    weight: float
    critical_range: float
    scenario: Scenario
    inputs: list[str]  # input ports whose arrival launches the group's paths
    blocks: list[str] | None = None  # a composite's blocks this group runs (None: the whole netlist)


@dataclass
class CellTiming:
    node: ir.Node
    cell: str
    work: Work
    delay: float  # the library's (or annotation's) delay of the node
    source: str
    host: float = 0.0  # s the host spends issuing it (= delay when the host does the work)
    device: float = 0.0  # s it occupies its stream after being issued
    stream: int = 0
    collectives: tuple = ()  # (op, delay s, source, bytes) run right after it (tensor parallelism, softsyn.timing.tp)


@dataclass(frozen=True)
class TimingRequest:
    """How one group is timed, beyond the netlist, library and constraints it is timed on (the default: the
    library's delays, eager launches, one device).

    `annotation`: a softsyn.flow.annotate.GroupAnnotation for the group's scenario: it replaces the library's delay,
    source "annot", for every node it knows (0 s for nodes the runtime folded or fused away; by name, so a node whose
    name another node shares keeps its library delay), and its residual the library's run_overhead on the
    session.run row. `absorbed`: nodes the runtime fuses into another when it loads (softsyn.runtime.load_view); on a
    GPU they keep their kernel time, which the fused kernel still does, but launch nothing. `partition` (a
    softsyn.timing.tp.Partition): each cell timed at one device's part of its work, and the collectives it places
    timed from `collectives` (a softsyn.library.collectives.CollectiveLibrary). `mode`: the group runs as a captured
    CUDA graph (softsyn.timing.capture) or eagerly (None: eagerly, unlabelled)."""

    annotation: object = None
    absorbed: frozenset = frozenset()
    partition: object = None
    collectives: object = None
    mode: Launch | None = None


def timing_graph(netlist: Netlist) -> nx.DiGraph:
    """Cells and ports as a DAG: an edge for every net from its driver to each load.

    Cells are keyed by the node itself (identity: names repeat, or are empty, in files that are valid
    ONNX), ports by ("in", name) and ("out", name)."""
    graph = nx.DiGraph()
    for port in netlist.model.graph.inputs:
        graph.add_node(("in", port.name), kind="input")
    for node in netlist.nodes():
        graph.add_node(node, kind="cell")
        for value in node.inputs:
            if value is None:
                continue
            driver = value.producer()
            if driver is not None:
                graph.add_edge(driver, node, net=value.name)
            elif value.is_graph_input():
                graph.add_edge(("in", value.name), node, net=value.name)
    for port in netlist.model.graph.outputs:
        graph.add_node(("out", port.name), kind="output")
        driver = port.producer()
        graph.add_edge(driver if driver is not None else ("in", port.name), ("out", port.name), net=port.name)
    return graph


def load_time_constants(netlist: Netlist) -> set[ir.Node]:
    """Nodes whose inputs are all weights or other such nodes (Constant, Transpose of a weight...).

    ONNX Runtime folds these into initializers when the session is created, so a run never pays for them.
    """
    folded: set[ir.Node] = set()
    for node in netlist.nodes():
        if node.op_type in NONDETERMINISTIC:
            continue
        inputs = [v for v in node.inputs if v is not None]
        if all(v.is_initializer() or v.producer() in folded for v in inputs):
            folded.add(node)
    return folded


def cell_timings(netlist: Netlist, library: Library, shapes: dict,
                 request: TimingRequest = TimingRequest()) -> list[CellTiming]:
    """Delay of every cell in execution order under one scenario's shapes, as `request` says (annotation,
    absorbed nodes, partition: see TimingRequest). A cell of an op neither the library nor the cost model knows
    gets 0 work (its delay is the launch overhead), source "no-model"."""
    annotation, absorbed, partition = request.annotation, request.absorbed, request.partition
    cells = []
    folded = load_time_constants(netlist)
    shared = {name for name, n in Counter(n.name for n in netlist.nodes()).items() if n > 1}
    for node in netlist.nodes():
        work = node_work(node, shapes)
        if partition is not None:
            work = partition.shard(node, work)
        precision = precision_of(node)
        op = node.op_type
        if partition is not None:
            op, precision = partition.kind(node, precision)
        annotated = annotation.delay(node.name) if annotation is not None and node.name not in shared else None
        host, device = None, 0.0
        if annotated is not None:  # measured per-node times add up to the measured run: serial
            delay, source = annotated, "annot"
        elif node in folded:  # the runtime computes it once, when the session loads
            delay, source = 0.0, "folded"
        elif op == "Scan" and "body" in node.attributes:  # a loop: its body's cells once per iteration
            (delay, host, device), source = scan_timing(node, shapes, library), "est"
        else:
            delay, source, host, device = library.node_timing(op, precision, work.flops, work.bytes,
                                                              work.sizes)
            if source == "est" and not has_cost_model(node):
                source = UNMODELLED
            if node in absorbed and library.is_gpu:
                host = 0.0
        moves = ()
        if partition is not None and node in partition.collectives:
            moves = tuple(_collective(kind, value, shapes, partition.n, request.collectives)
                          for kind, value in partition.collectives[node])
        cells.append(CellTiming(node=node, cell=f"{op}.{precision}", work=work, delay=delay, source=source,
                                host=delay if host is None else host, device=device, collectives=moves))
    return cells


def _collective(op: str, value: ir.Value, shapes: dict, ranks: int, collectives) -> tuple[str, float, str, float]:
    size = collective_bytes(value, shapes)
    precision = PRECISION_BY_DTYPE.get(value.dtype, "fp16") if value.dtype is not None else "fp16"
    delay, source = collectives.delay(op, size, ranks, precision)
    return f"{op}.{precision}", delay, source, size


def unmodelled_warnings(netlist: Netlist, library: Library) -> list[str]:
    """One line per op type whose cells have no library cell and no cost model (their delays are guesses)."""
    folded = load_time_constants(netlist)
    ops = Counter((n.op_type, n.domain) for n in netlist.nodes() if n not in folded and not has_cost_model(n)
                  and library.cell_for(n.op_type, precision_of(n), {}) is None)
    return [f"{count} cell{'s' if count != 1 else ''} of op {op}{f' ({domain})' if domain else ''} "
            f"{'have' if count != 1 else 'has'} no library cell and no cost model: 0 assumed "
            f"(0 FLOPs, 0 bytes: the launch overhead only), source {UNMODELLED}"
            for (op, domain), count in sorted(ops.items())]


def time_group(netlist: Netlist, graph: nx.DiGraph, library: Library, constraints: Constraints,
               group: PathGroup, request: TimingRequest = TimingRequest()) -> GroupTiming:
    """Every output path of `group`, timed as `request` says (see TimingRequest). A collective is issued by the
    host (one launch on a GPU) after its cell and holds the stream for its delay; on a CPU the host waits it out."""
    annotation, mode = request.annotation, request.mode
    shapes = netlist.bind(group.scenario.dims)
    cells = cell_timings(netlist, library, shapes, request)
    if mode is not None and mode.captured and annotation is None:
        in_graph(cells, library)

    port_arrival = {name: constraints.input_delay_for(name, netlist.input_modality(name), group.name)
                    for name in group.inputs}
    launch_port = max(group.inputs, key=lambda n: port_arrival[n]) if group.inputs else ""
    launch = port_arrival.get(launch_port, 0.0)
    starts = _stream_starts(netlist, library, group, cells, port_arrival=port_arrival, launch=launch,
                            annotation=annotation)
    arrival: dict = {("in", p.name): port_arrival.get(p.name, 0.0) for p in netlist.model.graph.inputs}
    critical_pred, moved = _propagate(graph, library, cells, starts, arrival)

    period = group.clock_period
    ends = endpoints(netlist, group)
    paths = [_output_path(constraints, group, port, arrival, (launch_port, launch)) for port in ends]
    paths.sort(key=lambda p: (p.slack, -p.arrival))
    drivers = {port.name: port.producer() for port in ends}
    timed = {c.node: c for c in cells}
    for path in paths[:STORED_PATHS]:
        path.points = _trace(drivers[path.endpoint], critical_pred, timed, arrival, netlist, starts,
                             annotated=annotation is not None, moved=moved)

    return GroupTiming(
        name=group.name, clock_period=math.inf if period is None else period, weight=group.weight,
        critical_range=group.critical_range, scenario=group.scenario, paths=paths, cell_count=len(cells),
        estimated_cells=sum(1 for c in cells if c.source == "est"),
        total_flops=sum(c.work.flops for c in cells), total_bytes=sum(c.work.bytes for c in cells),
        launch="" if mode is None else mode.describe(library))


def _propagate(graph: nx.DiGraph, library: Library, cells: list[CellTiming], starts: dict[int, tuple[float, float]],
               arrival: dict) -> tuple[dict, dict]:
    """Fill `arrival` (keyed by the timing graph's keys: nodes by identity, ports as ("in", name); it holds the
    ports' arrivals) at each cell: max(data predecessors, stream free, issued by the host) + device time. Returns
    (critical_pred: the key that set each cell's start, moved: node -> its arrival before its collectives, then
    after each). The host's issue order follows the stream order: its last cell."""
    stream_of = {c.node: c.stream for c in cells}
    critical_pred: dict = {}
    moved: dict = {}
    stream_free = {s: start + overhead for s, (start, overhead) in starts.items()}
    stream_last: dict = dict.fromkeys(starts)
    host_free, host_last = dict(stream_free), dict.fromkeys(starts)
    for c in cells:
        node, s = c.node, c.stream
        preds = list(graph.predecessors(node))
        for p in preds:  # another block's data: this block's host waits for it before issuing the cell
            if stream_of.get(p, s) != s and arrival.get(p, 0.0) > host_free[s]:
                host_free[s], host_last[s] = arrival[p], p
        host_free[s] += c.host
        start, pred = stream_free[s], stream_last[s]
        if host_free[s] > start:
            start, pred = host_free[s], host_last[s]
        for p in preds:
            if arrival.get(p, 0.0) > start:
                start, pred = arrival[p], p
        arrival[node] = start + c.device
        if c.collectives:
            moved[node] = [arrival[node]]
            for _, delay, _, _ in c.collectives:
                if library.is_gpu:
                    host_free[s] += library.ceilings.launch_overhead
                    arrival[node] = max(arrival[node], host_free[s]) + delay
                else:
                    host_free[s] = max(host_free[s], arrival[node]) + delay
                    arrival[node] = host_free[s]
                moved[node].append(arrival[node])
        critical_pred[node] = pred
        stream_free[s], stream_last[s] = arrival[node], node
        host_last[s] = node
    return critical_pred, moved


def endpoints(netlist: Netlist, group: PathGroup) -> list[ir.Value]:
    """The group's endpoints: the graph's outputs, or for a composite's group the outputs of the blocks it runs
    that none of them reads (a vision-encoder group ends at image_features, which the joined graph keeps inside)."""
    blocks = netlist.blocks()
    if group.blocks is None or not blocks:
        return list(netlist.model.graph.outputs)
    active = [b for b in blocks if b["name"] in group.blocks]
    read = {p for b in active for p in b["inputs"]}
    names = [o for b in active for o in b["outputs"] if o not in read]
    values = {o.name: o for n in netlist.model.graph for o in n.outputs if o.name in names}
    values.update({v.name: v for v in netlist.model.graph.outputs if v.name in names})
    return [values[n] for n in names if n in values]


def _output_path(constraints: Constraints, group: PathGroup, port: ir.Value, arrival: dict,
                 launched: tuple[str, float]) -> TimingPath:
    """The path to output `port` (its points traced later): launched at (port name, its input delay)."""
    launch_port, launch = launched
    period = group.clock_period
    driver = port.producer()
    end = arrival[driver] if driver is not None else arrival.get(("in", port.name), launch)
    output_delay = constraints.output_delay_for(port.name)
    required = math.inf if period is None else period - constraints.clock_uncertainty - output_delay
    return TimingPath(
        group=group.name, scenario=group.scenario, startpoint=launch_port, endpoint=port.name,
        clock_period=math.inf if period is None else period, input_delay=launch,
        clock_uncertainty=constraints.clock_uncertainty, output_delay=output_delay,
        points=[], arrival=end, required=required, slack=required - end)


def in_graph(cells: list[CellTiming], library: Library) -> None:
    """Re-time cells replayed from a captured CUDA graph: the host issues none of them; a kernel occupies the
    device for its graph table's time (measured as graph replays: kernel + per-node graph cost, no host share) where
    the library has one, else its time or the graph's per-node cost, whichever is longer; a view costs nothing."""
    per_node = library.ceilings.launch_overhead_graph or 0.0
    for c in cells:
        c.host = 0.0
        if c.device > 0.0:
            op, precision = c.cell.split(".", 1)
            c.device = (max(c.device, per_node) if c.source == "annot"
                        else library.device_in_graph(op, precision, c.work.sizes, c.device, c.work.bytes))


def _stream_starts(netlist: Netlist, library: Library, group: PathGroup, cells: list[CellTiming], port_arrival: dict,
                   launch: float, annotation) -> dict[int, tuple[float, float]]:
    """Stream -> (start, per-call overhead). One stream at the group's launch for a one-graph design; a composite's
    group keeps the cells of its blocks, each block on its own stream from the latest input delay of the ports it
    reads (a block fed only by other blocks starts at the launch), with its own session's overhead."""
    if not netlist.blocks():
        ios = len(netlist.model.graph.inputs) + len(netlist.model.graph.outputs)
        return {0: (launch, library.run_delay(ios)[0] if annotation is None else annotation.residual)}
    active = [b for b in netlist.blocks() if group.blocks is None or b["name"] in group.blocks]
    index = {b["name"]: i for i, b in enumerate(active)}
    cells[:] = [c for c in cells if netlist.block_of(c.node) in index]
    for c in cells:
        c.stream = index[netlist.block_of(c.node)]
    # A block's host issues first what needs no other block's data (the text embedding while the vision encoder
    # runs): a stable partition, so each stream's order stays topological.
    stream_of = {c.node: c.stream for c in cells}
    waiting: set = set()
    for c in cells:
        for v in c.node.inputs:
            p = v.producer() if v is not None else None
            if p in stream_of and (stream_of[p] != c.stream or p in waiting):
                waiting.add(c.node)
                break
    cells[:] = [c for c in cells if c.node not in waiting] + [c for c in cells if c.node in waiting]
    starts = {}
    for i, b in enumerate(active):
        read = [port_arrival[p] for p in b["inputs"] if p in port_arrival]
        overhead = library.run_delay(len(b["inputs"]) + len(b["outputs"]))[0]
        starts[i] = (max(read) if read else launch, overhead if annotation is None else annotation.residual)
    return starts


def _trace(end: ir.Node | None, critical_pred: dict, timed: dict, arrival: dict, netlist: Netlist,
           starts: dict[int, tuple[float, float]], annotated: bool = False,
           moved: dict | None = None) -> list[PathPoint]:
    """Walk back from the endpoint's driver along the predecessors that set each start time. A cell's
    critical predecessor was timed before it, so the walk visits each cell once at most; the bound
    keeps it finite whatever the graph holds."""
    chain = []
    key = end
    while key is not None and key in timed and len(chain) < len(timed):
        chain.append(timed[key])
        key = critical_pred.get(key)
    chain.reverse()
    launch, run_overhead = starts[chain[0].stream if chain else 0]  # the session the path starts in
    # Back-annotated: the row carries the measured residual (host overhead, gaps, runtime-only nodes).
    points = [PathPoint(name=RUN_CALL, cell="Run.residual" if annotated else "Run.overhead", incr=run_overhead,
                        arrival=launch + run_overhead, source="annot" if annotated else "est", hierarchy="",
                        op_type="Run")]
    previous = launch + run_overhead
    for c in chain:
        if c.source == "folded":
            continue
        hierarchy = netlist.hierarchy(c.node)
        name = f"{hierarchy}/{c.node.name}" if hierarchy else c.node.name
        steps = (moved or {}).get(c.node, [arrival[c.node]])
        # incr: what the cell adds to the path (its delay when serial; its share of the overlapped
        # host/device schedule on a GPU), so a path's increments sum to its arrival
        points.append(PathPoint(
            name=name, cell=c.cell, incr=steps[0] - previous, arrival=steps[0], source=c.source,
            hierarchy=hierarchy, op_type=c.node.op_type, flops=c.work.flops, bytes=c.work.bytes))
        for (cell, _, source, size), before, after in zip(c.collectives, steps, steps[1:]):
            points.append(PathPoint(name=f"{name}:{cell.split('.')[0]}", cell=cell, incr=after - before, arrival=after,
                                    source=source, hierarchy=hierarchy, op_type=cell.split(".")[0], bytes=size))
        previous = steps[-1]
    return points
