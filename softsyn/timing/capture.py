"""Which path groups run as one captured CUDA graph, and why the others launch node by node.

ONNX Runtime's CUDA provider replays a captured graph (`enable_cuda_graph=1`) only when every run has the same
shapes and addresses and every node runs on the CUDA provider. softsyn's decoder artifacts meet that at decode:
the KV cache is one `max_length` buffer per layer that GroupQueryAttention updates in place (kv_layout), the
attention mask a `max_length` buffer filled step by step (softsyn run, onnxruntime-genai), the token and its
position one element each. Prefill stays eager: its prompt length varies per request (softsyn run gives it
gpu_graph_id -1). Inside a graph a node costs the host nothing and the device its graph table's time where the
library has one (`softsyn characterize --graph`: the cell timed as graph replays), else its kernel or the library's
`launch_overhead_graph` (what one more node adds inside a graph), whichever is longer.
"""
from __future__ import annotations

from dataclasses import dataclass

from softsyn.library import Library
from softsyn.netlist import Netlist
from softsyn.timing.cost import precision_of
from softsyn.runtime.decoder import NotDecoder, decoder_io

GRAPH = "CUDA graph"
# ORT's InferenceSession refuses graph capture on a model holding any of these (inference_session.cc,
# HasControlflowNodes): a hybrid decoder's delta rule is a Scan (softsyn.frontends.hybrid_export)
CONTROL_FLOW = ("If", "Loop", "Scan")


@dataclass(frozen=True)
class Launch:
    """How one path group's nodes are launched: `captured` in a CUDA graph, else eagerly because of `reason`."""

    captured: bool
    reason: str = ""

    def describe(self, library: Library) -> str:
        if self.captured:
            per_node = library.ceilings.launch_overhead_graph or 0.0
            return f"{GRAPH} (enable_cuda_graph=1; {per_node * 1e6:.2f} us per node inside the graph)"
        return f"eager ({self.reason})"


def shared_kv_buffer(netlist: Netlist) -> bool:
    """Every past KV input is a GroupQueryAttention past that the node updates in place (same shape as its
    present): the graph runs with fixed KV shapes and addresses at every decode step."""
    try:
        return decoder_io(netlist.model).shares_buffer
    except NotDecoder:
        return False


def group_launch(netlist: Netlist, library: Library, dims: dict[str, int], shared: bool) -> Launch:
    """The launch of a group at scenario `dims` (`shared`: shared_kv_buffer(netlist))."""
    if not library.is_gpu:
        return Launch(False, f"{library.provider or 'the provider'} has no CUDA graphs")
    if library.ceilings.launch_overhead_graph is None:
        return Launch(False, f"library {library.name} has no measured launch_overhead_graph")
    if not shared:
        return Launch(False, "the KV cache is not one shared max_length buffer: shapes change every step")
    if dims.get("seq") != 1 or not dims.get("past"):
        return Launch(False, "not a decode step: prompt lengths vary per request, run with gpu_graph_id -1")
    flow = next((n for n in netlist.nodes() if n.op_type in CONTROL_FLOW and n.domain in ("", "ai.onnx")), None)
    if flow is not None:
        return Launch(False, f"node {flow.name}: {flow.op_type} is control flow, and ORT refuses to capture a model "
                             "with control-flow nodes (session creation fails with enable_cuda_graph=1)")
    for node in netlist.nodes():
        why = library.does_not_run(node.op_type, precision_of(node))
        if why:
            return Launch(False, f"node {node.name}: {node.op_type}.{precision_of(node)} {why} on "
                                 f"{library.provider}, so ORT places it on the CPU")
    return Launch(True)
