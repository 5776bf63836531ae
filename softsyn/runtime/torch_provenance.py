"""Which source modules a torch package's kernels compute (issue 28's macro cells, first step): Inductor's provenance.

AOTInductor compiled with PROVENANCE_CONFIG stores `kernel_information.json` in the package: per kernel call, in the
wrapper's call order, the graph nodes it was generated from. Those nodes carry the module they came from
(`nn_module_stack`, recorded by torch.export), so every call maps to module paths of the source model
("model.layers.3.mlp.down_proj"), the same paths the ONNX netlist's cell scopes carry. The compile writes the map
(KERNELS_FILE); signoff aligns a profiled step's kernels with it (`attribute`) and reports measured time per module
kind beside the ORT library's estimate of the netlist cells of that kind.

An extern call (a cuBLAS matmul, a fused attention op) launches kernels whose names Inductor never sees; they are
matched by order: each takes the next extern call of the step. A kernel no call accounts for stays unattributed and
is reported as such.

A call Inductor did not generate runs one op, but its provenance is its IR node's `origins`, which for a user-defined
Triton kernel (softsyn::weight_matmul's GEMV, softsyn::decode_attention's) also hold the nodes that computed its
inputs: the RMSNorm's 8 nodes outnumbered the GEMV's one, and qwen3-1.7b int4's signoff (H100, 2026-12-07) gave
the q/k/v and gated GEMVs to the norms and lm_head's to model.norm. So such a call keeps only the nodes of the op it
runs (own_op) where any is among them.
"""
from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from softsyn.errors import SoftsynError
from softsyn.frontends.onnx_file import inside
from softsyn.runtime.artifact import TORCH_FILE, read_json

PROVENANCE_CONFIG = {"trace.provenance_tracking_level": 1}  # aoti_compile_and_package's inductor_configs
KERNELS_FILE = "runtime/torch_kernels.json"  # DIR/model.pt2's map
PREFILL_KERNELS_FILE = "runtime/torch_kernels-prefill.json"  # DIR/model-prefill.pt2's, when the target builds one
FORMAT = "softsyn.torch-kernels/1"
EXTERN_PREFIX = "aoti_torch_"  # Inductor's name for a call into ATen (its kernels are named by the library)
STEP_ROOT = "m"  # StaticStep holds the source model as `m`
UNATTRIBUTED = "(unattributed)"
GENERATED = ("triton_", "cpp_fused")  # Inductor's own kernels' names: one not in the map is no call's
COPIES = ("Memcpy", "Memset")  # the profiler's names for copies and fills: the runner's, not the package's kernels
BUILTIN_OPS = ("aten", "prims")  # the namespaces of the ops Inductor lowers itself; any other op is a call of its own
WRAPPERS = ("triton_kernel_wrapper", "auto_functionalized")  # the graph's forms of a user kernel or a custom op's call


@dataclass(frozen=True)
class KernelCall:
    kernel: str  # Inductor's kernel name (triton_..., cpp_fused_...) or its extern call (aoti_torch_cuda_mm_out)
    modules: tuple[str, ...]  # source module paths it computes, outermost model first stripped ("lm_head")
    nodes: tuple[int, ...] = ()  # per module, how many of the call's graph nodes came from it (() in an older map)

    @property
    def extern(self) -> bool:
        return self.kernel.startswith(EXTERN_PREFIX)

    @property
    def kind(self) -> str:
        """The kind most of its graph nodes came from (a fused kernel's provenance also names what it recomputes
        upstream: the embedding gather and projections of the residual stream in a norm's kernel); in a map without
        node counts its modules' kinds joined by "+". A decoder layer's own ops (the residual adds, LAYER) count only
        when alone, since Inductor fuses them into the norm or projection beside them."""
        counts: dict[str, int] = {}
        for module, n in zip(self.modules, self.nodes or (1,) * len(self.modules)):
            counts[module_kind(module)] = counts.get(module_kind(module), 0) + n
        named = {k: n for k, n in counts.items() if k != LAYER} or counts
        if not named:
            return "(no module)"
        return max(named, key=named.get) if self.nodes else "+".join(sorted(named))


LAYER = "layer"  # the kind of a decoder layer's own ops (model.layers.N itself: residual adds)


def module_kind(path: str) -> str:
    """A module path's kind, the layer index dropped: "model.layers.3.self_attn.o_proj" -> "self_attn",
    "model.layers.3" -> LAYER, a path outside the layers without the model's own prefix ("model.norm" -> "norm",
    "lm_head"); the ONNX netlist's cell scopes read the same way."""
    match = re.search(r"(?:^|\.)layers\.\d+(?:\.([^./]+))?", path)
    if match:
        return match.group(1) or LAYER
    return path.removeprefix("model.") or "(model)"


def kernel_calls(package: Path, program, covers: dict[str, tuple[str, ...]] | None = None) -> list[KernelCall]:
    """The package's kernel calls in wrapper order ("name:N", N the call's index) with the modules of the exported
    `program`'s nodes each was generated from, a call Inductor did not generate with only its own op's nodes where it
    names any (own_op); [] when the package holds no provenance it can read (compiled without PROVENANCE_CONFIG, or by
    a torch whose file differs): the map is a diagnostic, never a reason to fail a compile. `covers`: {module path:
    the modules a call of it also computes, after its own} (a GEMV that runs its layer's norm or residual add in its
    prologue or epilogue: softsyn.emit.torch_norms.covered_cells), one node each."""
    try:
        with zipfile.ZipFile(package) as archive:
            names = [n for n in archive.namelist() if n.endswith("kernel_information.json")]
            info = json.loads(archive.read(names[0])) if names else {}
    except (OSError, ValueError, zipfile.BadZipFile):
        return []
    if not isinstance(info, dict):
        return []
    nodes = {node.name: node for node in program.graph.nodes}
    calls = []
    for key, entry in sorted(info.items(), key=lambda kv: _call_index(kv[0])):
        kernel = key.rsplit(":", 1)[0]
        found = [nodes[n] for n in (entry.get("pre_grad_nodes", []) if isinstance(entry, dict) else []) if n in nodes]
        if not kernel.startswith(GENERATED):  # one op's call: its inputs' producers are no part of it
            found = [n for n in found if own_op(getattr(n, "target", None))] or found
        modules: dict[str, int] = {}
        for node in found:
            stack = getattr(node, "meta", {}).get("nn_module_stack") or {}
            if stack:
                path = list(stack.values())[-1][0]
                path = "" if path == STEP_ROOT else path.removeprefix(f"{STEP_ROOT}.")
                if path:
                    modules[path] = modules.get(path, 0) + 1
        for path in list(modules):
            for extra in (covers or {}).get(path, ()):
                modules.setdefault(extra, 1)
        calls.append(KernelCall(kernel, tuple(modules), tuple(modules.values())))
    return calls


def own_op(target) -> bool:
    """Whether a graph node's target is an op Inductor calls rather than lowers: a custom op (softsyn::weight_matmul,
    any torch.library op outside ATen), a user-defined Triton kernel's wrapper, a custom op functionalised. An
    ATen extern call keeps all its nodes: Inductor names its op's node alone where it knows it (`origin_node`: every
    matmul of qwen3-tiny's map), and no rule tells which of several ATen nodes is the op."""
    namespace = getattr(target, "namespace", None)
    if namespace == "higher_order":
        return getattr(target, "__name__", "").startswith(WRAPPERS)
    return isinstance(namespace, str) and namespace not in BUILTIN_OPS


def _call_index(key: str) -> int:
    suffix = key.rsplit(":", 1)[-1]
    return int(suffix) if suffix.isdigit() else -1


def calls_data(calls: list[KernelCall]) -> dict:
    """KERNELS_FILE's content."""
    return {"format": FORMAT, "calls": [{"kernel": c.kernel, "modules": list(c.modules), "nodes": list(c.nodes)}
                                        for c in calls]}


def read_calls(directory: Path, name: str = KERNELS_FILE) -> list[KernelCall]:
    """DIR's kernel map `name` (torch.json's packages.*.kernels; untrusted, like every file of an artifact, and kept
    inside DIR): [] when absent (a package compiled before the map: its kernels stay runtime-only); a SoftsynError
    naming the file and key when it is not the map."""
    path = inside(directory, name, "kernels", Path(directory) / TORCH_FILE)
    if not path.exists():
        return []
    data = read_json(path, name)
    calls = data.get("calls") if isinstance(data, dict) and data.get("format") == FORMAT else None
    if not isinstance(calls, list):
        raise SoftsynError(f"{path}: not a {FORMAT} map (format, calls); re-run softsyn compile")
    out = []
    for i, call in enumerate(calls):
        if not (isinstance(call, dict) and isinstance(call.get("kernel"), str) and isinstance(call.get("modules"), list)
                and all(isinstance(m, str) for m in call["modules"])):
            raise SoftsynError(f"{path}: calls[{i}]: not {{kernel: a name, modules: [paths]}}; re-run softsyn compile")
        nodes = call.get("nodes", [])  # absent in a map written before the counts
        if not (isinstance(nodes, list) and all(type(n) is int and n >= 1 for n in nodes)
                and len(nodes) in (0, len(call["modules"]))):
            raise SoftsynError(f"{path}: calls[{i}].nodes: not a count >= 1 per module; re-run softsyn compile")
        out.append(KernelCall(call["kernel"], tuple(call["modules"]), tuple(nodes)))
    return out


USER_SUFFIX = re.compile(r"_\d+$")  # Inductor names a user-defined Triton kernel's call NAME_<index>


def user_kernels(calls: list[KernelCall]) -> dict[str, set[str]]:
    """{the name the profiler sees: the map's names of its calls} for user-defined Triton kernels (softsyn's weight
    and attention kernels, through torch.library.triton_op): the map names each distinct launch `NAME_<index>`
    while the compiled kernel keeps the function's NAME, so the profile's NAME matches no call by name and, not
    Inductor's own (triton_...), would be taken for a library kernel of the next extern call."""
    out: dict[str, set[str]] = {}
    for call in calls:
        base = USER_SUFFIX.sub("", call.kernel)
        if base != call.kernel and not call.extern and not call.kernel.startswith(GENERATED):
            out.setdefault(base, set()).add(call.kernel)
    return out


def attribute(kernels: list[str], calls: list[KernelCall], named: bool = False) -> list[KernelCall | None]:
    """Each kernel of a profiled run (launch order; several steps back to back) matched to the call it belongs to:
    a generated kernel to the next call of its name, a user-defined Triton kernel to the next call of its name less
    Inductor's `_N` (user_kernels), a library kernel to the current or next extern call (a matmul may launch two:
    split-K and its reduction); None where no call accounts for it. `named`: every kernel is named by
    its own call, extern ones too (the CPU's profiler records: softsyn.runtime.torch_profile), so all go by name."""
    if not calls:
        return [None] * len(kernels)
    generated = {c.kernel for c in calls if named or not c.extern}
    users = user_kernels(calls)
    out: list[KernelCall | None] = []
    at, extern = 0, None  # the next call expected; the extern call library kernels go to until a generated one runs
    for name in kernels:
        if name in users:  # a user-defined Triton kernel: its calls by name
            wanted = (lambda c, names=users[name]: c.kernel in names)
        elif name.startswith(COPIES) or (name not in generated and (named or name.startswith(GENERATED))):
            out.append(None)
            continue
        elif name in generated:
            wanted = (lambda c: c.kernel == name)
        elif extern is not None:
            out.append(calls[extern])
            continue
        else:
            wanted = (lambda c: c.extern)
        found = next((i % len(calls) for i in range(at, at + len(calls)) if wanted(calls[i % len(calls)])), None)
        if found is None:
            out.append(None)
            continue
        out.append(calls[found])
        at, extern = found + 1, (found if calls[found].extern else None)
    return out
