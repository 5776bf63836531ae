"""A Design's serving analysis: its netlist timed by the STA at the step table's dims, its KV budget from the area
result. Takes the Design as it is (duck-typed, as softsyn.timing.tp_plan does: design sits on the floor above)."""
from __future__ import annotations

from softsyn.netlist.dims import expr_names
from softsyn.results.analysis import AreaResult, Scenario
from softsyn.results.serving import ServingResult
from softsyn.timing.capture import group_launch, shared_kv_buffer
from softsyn.runtime.decoder import NotDecoder, decoder_io
from softsyn.timing.serving import HostWork, Knobs, grid_for, host_work, serving_analysis, step_table
from softsyn.timing.sta import PathGroup, TimingRequest, time_group
from softsyn.timing.tp import WEIGHT_MATMULS, TPError, partition

STEP = "serving-step"  # the path group name the steps are timed under (unconstrained: arrival is all that is read)


def _timer(design, part=None):
    """dims -> the critical arrival of one engine step at those dims (no input delay: a step starts when the
    previous one ends); `part`: a what-if partition (weights at another precision), else the design's own."""
    netlist = design.netlist
    read = {n for expr in netlist.derived_dims.values() for n in expr_names(expr)}  # as Design._resolve binds
    free = netlist.symbolic_dims() | read
    absorbed = design.runtime_view.absorbed if design.runtime_view is not None else frozenset()
    shared = shared_kv_buffer(netlist) if design.library.is_gpu else False
    part = part if part is not None else design.partition

    def time_at(dims: dict) -> float:
        dims = {k: v for k, v in dims.items() if k in free}
        group = PathGroup(name=STEP, clock_period=None, weight=1.0, critical_range=0.0, inputs=[],
                          scenario=Scenario(STEP, dims, f"{STEP} ({dims})"))
        mode = group_launch(netlist, design.library, dims, shared) if design.library.is_gpu else None
        request = TimingRequest(absorbed=absorbed, partition=part, mode=mode,
                                collectives=design.collectives if part is not None and part.n > 1 else None)
        return time_group(netlist, design.graph, design.library, design.constraints, group, request).critical.arrival
    return time_at


def _kv(area: AreaResult) -> tuple[float | None, float | None, str]:
    """(KV budget in tokens, the same at int8, why int8 is not simulated)."""
    kv = area.kv_budget
    if kv is None:
        return None, None, "the design has no KV cache"
    if kv.available is None:
        return None, None, "no area_constraint: the KV budget does not bind"
    tokens = max(kv.available, 0.0) / kv.bytes_per_token
    int8 = next((o for o in kv.kv_dtypes if "int8" in o.dtype.split("/")), None)
    if int8 is None or int8.bytes_per_token >= kv.bytes_per_token:
        return tokens, None, f"the KV cache is {kv.dtype} already"
    return tokens, max(kv.available, 0.0) / int8.bytes_per_token, ""


def design_serving(design, area: AreaResult) -> ServingResult:
    serving = design.serving  # the constraints' block with the compile's max_batch choice (passes.serving)
    if design.netlist.kind != "decoder":
        raise design.constraints.error("serving", f"design {design.netlist.name} is a {design.netlist.kind} model; "
                                       "serving simulates a decoder with a KV cache (prefill, then decode steps)")
    tokens, int8_tokens, kv_why = _kv(area)

    def retime(precision: str):
        shapes = design.netlist.bind(design.groups[0].scenario.dims)
        try:
            what_if = partition(design.netlist, 1, shapes, design.constraints.parallel.devices, precision)
        except TPError:
            return None
        return step_table(_timer(design, what_if), **grid_for(serving))

    why = "tensor parallelism is on (the what-if re-times one device's partition only)" if design.partition else ""
    knobs = Knobs(retime=retime, precision_why=why, kv_int8_tokens=int8_tokens, kv_why=kv_why)
    sequence = (area.kv_budget.length, area.kv_budget.length_key) if area.kv_budget is not None else None
    host, why = _host(design, area)
    return serving_analysis(serving, _timer(design), tokens, knobs, sequence, host=host, host_why=why)


def _host(design, area: AreaResult) -> tuple[HostWork | None, str]:
    """The engine's host work per iteration at the design's sizes from the library's measured serving_host block,
    or (None, why not)."""
    library = design.library
    if library.serving_host is None:
        return None, (f"library {library.name} has no serving_host block (python bench/host_probe.py on the target "
                      "measures it): the simulated steps are the run calls alone")
    try:
        io = decoder_io(design.netlist.model)
    except NotDecoder as exc:
        return None, f"the design's inputs are not a decoder's the host work is modelled for ({exc})"
    graph = design.netlist.model.graph
    logits = next(v for v in graph.outputs if v.name == io.logits)
    mask = next((v for v in graph.inputs if v.name == io.attention_mask), None)
    positions = io.buffer_length or (area.kv_budget.length if area.kv_budget is not None else None)
    if io.vocab_size is None or positions is None or area.kv_budget is None:
        return None, "the design's vocabulary or KV length is symbolic: the host work has no size to scale with"
    seq = logits.shape[-2] if logits.shape is not None and len(logits.shape) >= 2 else None
    nodes = [n for n in design.netlist.nodes() if n.op_type != "Constant"]  # ORT folds Constants at load
    gemms = {(n.op_type, _weight_shape(n)) for n in nodes if n.op_type in WEIGHT_MATMULS}  # cuBLAS: per problem size
    return host_work(library.serving_host, library.ceilings.memory_bandwidth, vocab=io.vocab_size,
                     logits_bytes=int(logits.dtype.itemsize), positions=int(positions),
                     mask_bytes=int(mask.dtype.itemsize) if mask is not None and mask.dtype is not None else 8,
                     layers=len(io.layers), kv_bytes_per_token=area.kv_budget.bytes_per_token,
                     all_logits=seq != 1, library=library.name,
                     gemms=len(gemms), nodes=len(nodes) - sum(n.op_type in WEIGHT_MATMULS for n in nodes)), ""


def _weight_shape(node) -> tuple | None:
    """A GEMM node's weight (second input) shape, which with the rows sets its problem size; None when unknown."""
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    shape = weight.shape if weight is not None else None
    return tuple(shape) if shape is not None else None
