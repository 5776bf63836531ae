"""The coordinator: one Design owns the netlist, constraints, library and timing.

Passes receive the Design and change it only through this API: they edit
`design.netlist`, then call `design.netlist_changed()`, which drops everything
derived from the netlist; their reports land in `design.pass_reports` (filled
by `passes.run_pass`). Reports render the Analysis it produces. Path
groups are resolved here, from the constraints and the kind of netlist: a
decoder LLM gets `prefill` (TTFT) and `decode` (TPOT) by default, an encoder
one `encoder` group.
"""
from __future__ import annotations

import dataclasses

import datetime
import functools
import time
from pathlib import Path

from softsyn import __version__
from softsyn.constraints import Constraints, PathGroupSpec, load_constraints
from softsyn.constraints.reader import read_text
from softsyn.errors import SoftsynError
from softsyn.frontends import read_design
from softsyn.frontends.roles import ROLES
from softsyn.library import Library, UnknownLibraryError, default_library, load_library
from softsyn.library.torch_targets import torch_target, torch_target_problem
from softsyn.library.match import check_library, host_cpu, pick_cpu_library
from softsyn.netlist import Netlist
from softsyn.netlist.dims import expr_names
from softsyn.progress import log as progress_log
from softsyn.runtime.artifact import MAX_JSON
from softsyn.runtime.session import describe_device
from softsyn.timing import Analysis, GroupTiming, PathGroup, Scenario, TimingRequest, time_group, timing_graph
from softsyn.timing.area import area
from softsyn.timing.capture import Launch, group_launch, shared_kv_buffer
from softsyn.timing.sta import unmodelled_warnings
from softsyn.results.annotation import load_annotation
from softsyn.runtime.load_view import load_view
from softsyn.timing.tp_plan import partition_at, plan
from softsyn.timing.serving.design_steps import design_serving
from softsyn.library.collectives import load_collectives

# Scenario dims of the default groups, from the workload (constraints.workload).
DEFAULT_GROUPS = {
    "decoder": {
        "prefill": lambda w: {"batch": w.batch, "seq": w.prompt_len, "past": 0},
        "decode": lambda w: {"batch": w.batch, "seq": 1, "past": w.context_len},
    },
    "causal": {"prefill": lambda w: {"batch": w.batch, "seq": w.prompt_len}},  # a decoder without a KV cache
    "encoder": {"encoder": lambda w: {"batch": w.batch, "seq": w.prompt_len}},
    "generic": {"default": lambda w: {"batch": w.batch, "seq": w.prompt_len}},
    # a vision-language composite: prefill (TTFT) crosses vision -> embedding -> decoder, decode runs no vision
    "vlm": {
        "prefill": lambda w: {"batch": w.batch, "seq": w.prompt_len, "past": 0},
        "decode": lambda w: {"batch": w.batch, "seq": 1, "past": w.context_len},
    },
}


def _library_mismatch(library: Library) -> str:
    """The line saying a named library describes another machine (softsyn.library.match), "" when it is this one."""
    gpu = describe_device("cuda") if library.header.get("provider") == "CUDAExecutionProvider" else None
    return check_library(library.name, library.header, host_cpu(describe_device("cpu")), gpu)


class Design:
    annotation = None  # softsyn.results.annotation.Annotation: back-annotated (measured) delays replace the library's
    torch_target = None  # a torch target's name (softsyn.library.torch_targets): emit lowers the source model in torch
    cache_dir = None  # the export cache the design was read through (a torch target reads its source model there)
    serving_max_batch = None  # the compile's max_batch for the serving block (passes.serving), None: the constraints'

    def __init__(self, netlist: Netlist, constraints: Constraints, library: Library, progress: bool = True,
                 tp: str | int | None = None):
        self.netlist = netlist
        self.constraints = constraints
        self.library = library
        self.progress = progress
        # tensor parallelism: --tp (an int or "auto") over parallel.tensor; None with no parallel section
        self.tp_request = tp if tp is not None else constraints.parallel.tensor
        self.tp_from_cli = tp is not None
        self.pass_reports: dict[str, object] = {}  # pass name -> its PassResult's report (passes.PassReport)
        self.library_mismatch = ""  # the library describes another machine (set by load; every banner says it)

    @classmethod
    def load(cls, spec: str, constraints: str | Path | None = None, target: str | None = None,
             cache_dir: str | Path | None = None, progress: bool = True, annotate: str | Path | None = None,
             materialize: bool = False, tp: str | int | None = None, **workload) -> "Design":
        """Read a model and its constraints; `target` and workload keywords override the constraints file.
        `annotate`: an annotation file from `softsyn signoff` (measured delays, source "annot");
        `materialize`: real-size models get seeded random weights instead of a weightless export; `tp`: the
        tensor-parallel degree (an int, or "auto": the smallest that fits), over the constraints' parallel.tensor."""
        cons = load_constraints(constraints) if constraints else Constraints.default()
        for key, value in workload.items():
            if value is not None:
                setattr(cons.workload, key, value)
        lowered = torch_target(target or cons.target)
        if lowered is not None:  # timed with its device's ORT library, an estimate of the same function
            problem = torch_target_problem(lowered, spec)
            if problem:
                raise SoftsynError(f"--target: {problem}") if target else cons.error("target", problem)
            target = lowered.library
        if not target and cons.target:
            try:
                library = load_library(cons.target)
            except UnknownLibraryError as exc:
                raise cons.error("target", str(exc)) from None
            mismatch = _library_mismatch(library)
        elif target:
            library = load_library(target)
            mismatch = _library_mismatch(library)
        else:  # none named: the shipped CPU library whose device is this machine's, else the closest, said
            match = pick_cpu_library(host_cpu(describe_device("cpu")), default=default_library())
            library, mismatch = load_library(match.library), match.mismatch
            if not mismatch and library.name != default_library():  # the default needs no naming; another does
                progress_log(f"library {library.name}: characterised on this machine's device ({match.device})",
                             enabled=progress)
        extra = {"materialize": True} if materialize else {}
        images = {g.image for g in cons.path_groups.values() if g.image is not None}
        if len(images) > 1:
            raise cons.error("path_groups", f"the groups name images of {len(images)} sizes "
                             f"({', '.join(f'{w}x{h}' for w, h in sorted(images))}); a composite's vision block is "
                             "exported at one grid: give one image size per constraints file")
        if images:
            extra["image_size"] = images.pop()
        if mismatch:  # said once, before the design is read (an export takes minutes)
            progress_log(f"warning: {mismatch}", enabled=progress)
        netlist = read_design(spec, cache_dir=cache_dir, progress=progress, **extra)
        design = cls(netlist, cons, library, progress, tp)
        design.library_mismatch = mismatch  # every report's banner carries it (Analysis.warnings)
        design.torch_target = lowered.name if lowered is not None else None
        design.cache_dir = cache_dir
        if annotate:
            # a regular file of bounded size (a FIFO would hang)
            design.annotation = load_annotation(annotate, read_text(annotate, "annotation file", limit=MAX_JSON))
        return design

    # Cached views of the netlist; netlist_changed() drops every one of them.
    NETLIST_VIEWS = ("graph", "groups", "runtime_view", "launches", "partition", "tp_plan")

    @functools.cached_property
    def graph(self):
        return timing_graph(self.netlist)

    @functools.cached_property
    def groups(self) -> list[PathGroup]:
        return [self._resolve(spec) for spec in self._group_specs()]

    @functools.cached_property
    def runtime_view(self):
        """What an ONNX Runtime GPU target launches after its load-time fusions (softsyn.runtime.load_view);
        None for a CPU target, whose delay tables already hold each node's whole cost, or another runtime."""
        if not self.library.is_gpu or not str(self.library.header.get("runtime", "")).startswith("onnxruntime"):
            return None

        start = time.perf_counter()
        view = load_view(self.netlist)
        self.log(f"{view.describe()}, {time.perf_counter() - start:.1f} s")
        return view

    @functools.cached_property
    def launches(self) -> dict[str, Launch]:
        """GPU targets: per group, whether it runs as a captured CUDA graph (softsyn.timing.capture), which the
        STA times and emit's runtime settings enable; empty for a CPU target."""
        if not self.library.is_gpu:
            return {}
        shared = shared_kv_buffer(self.netlist)
        return {g.name: group_launch(self.netlist, self.library, g.scenario.dims, shared) for g in self.groups}

    @functools.cached_property
    def tp_plan(self):
        """The tensor-parallel plan (softsyn.timing.tp_plan) when one is asked for, else None."""
        if self.tp_request is None:
            return None

        start = time.perf_counter()
        result = plan(self)
        self.log(f"tensor-parallel plan over {', '.join(str(r.n) for r in result.rows)} devices, "
                 f"{time.perf_counter() - start:.1f} s")
        return result

    @functools.cached_property
    def partition(self):
        """One device's part of the netlist at the asked degree, or for `auto` the plan's (softsyn.timing.tp.Partition);
        None without tensor parallelism. A given degree needs no plan: the plan times every degree."""
        if self.tp_request is None:
            return None

        return partition_at(self, self.tp_request if isinstance(self.tp_request, int) else self.tp_plan.n)

    def _group_specs(self) -> list[PathGroupSpec]:
        if self.constraints.path_groups:
            return list(self.constraints.path_groups.values())
        return [PathGroupSpec(name=name) for name in DEFAULT_GROUPS[self.netlist.kind]]

    def _resolve(self, spec: PathGroupSpec) -> PathGroup:
        defaults = DEFAULT_GROUPS[self.netlist.kind]
        composite = bool(self.netlist.blocks())
        kind = spec.kind or (spec.name if spec.name in defaults or not composite else "prefill")
        # a composite's encoder group (the vision block alone) is scenario'd like a prefill: its images per sequence
        base = defaults.get("prefill" if composite and kind == "encoder" else kind)
        dims = base(self.constraints.workload) if base else {"batch": self.constraints.workload.batch}
        if spec.batch is not None:
            dims["batch"] = spec.batch
        blocks, image_note = None, ""
        if (spec.image is not None or spec.images) and not composite:
            key = "image" if spec.image is not None else "images"
            raise self.constraints.error(f"path_groups.{spec.name}.{key}", f"design {self.netlist.name} has no vision "
                                         "block (image groups need a vision-language composite, e.g. zoo:qwen3-vl-tiny)")
        if composite:
            dims, blocks, image_note = self._composite_dims(spec, kind, dims)
        # a derived dim's names stay bound: a shared KV buffer leaves `past` only in the mask's `total` (past + seq)
        read = {n for expr in self.netlist.derived_dims.values() for n in expr_names(expr)}
        dims = {k: v for k, v in dims.items() if k in self.netlist.symbolic_dims() | read}
        renamed = self.netlist.provenance.get("dims") or {}  # the exporter's dim names still bind their roles
        free = self.netlist.symbolic_dims() | read
        for name in spec.dims:
            if renamed.get(name, name) not in free:
                derived = self.netlist.derived_dims.get(name)
                why = f"{name!r} is derived ({derived}); give the dims it is made of" if derived else \
                    f"the design has no dim {name!r}"
                raise self.constraints.error(f"path_groups.{spec.name}.dims.{name}",
                                             f"{why}; its dims: {', '.join(sorted(free)) or 'none (all static)'}")
        dims.update({renamed.get(k, k): v for k, v in spec.dims.items()})
        missing = sorted(self.netlist.symbolic_dims() - set(dims))
        if missing:
            raise self.constraints.error(
                f"path_groups.{spec.name}.dims", f"the netlist's dims {', '.join(missing)} have no role softsyn could "
                f"infer from the ports (roles: {', '.join(ROLES)}) and no value in this scenario; "
                f"give them, e.g. dims: {{{', '.join(f'{d}: 1' for d in missing)}}}")
        ports = [v.name for v in self.netlist.model.graph.inputs]
        run = set().union(*(b["inputs"] for b in self.netlist.blocks() if b["name"] in blocks)) if blocks else None
        inputs = spec.inputs or [p for p in ports if run is None or p in run]
        unknown = [p for p in inputs if p not in ports]
        if unknown:
            raise self.constraints.error(f"path_groups.{spec.name}.inputs", f"no input port {', '.join(unknown)}; "
                                         f"the design's inputs are {', '.join(ports)}")
        shown = ", ".join(f"{k} {v}" for k, v in dims.items()) + image_note
        return PathGroup(
            name=spec.name, clock_period=self.constraints.period_for(spec.name), weight=spec.weight,
            critical_range=spec.critical_range, inputs=inputs, blocks=blocks,
            scenario=Scenario(name=spec.name, dims=dims, description=f"{spec.name} ({shown})"))

    def _composite_dims(self, spec: PathGroupSpec, kind: str, dims: dict) -> tuple[dict, list[str], str]:
        """A composite group's dims, blocks and image note. A prefill group is an image task unless it says
        `images: 0` (the guides' OCR, GUI-agent and visual-math groups all read images): `images` images per
        sequence (default 1) whose tokens join the prompt, every block run; a decode step or a text-only group runs
        the embedding and the decoder; an encoder group runs the vision block alone."""
        image = self.netlist.provenance.get("image") or {}
        names = [b["name"] for b in self.netlist.blocks()]
        where = f"path_groups.{spec.name}"
        if spec.images and kind == "decode":
            raise self.constraints.error(f"{where}.images", f"{spec.images}: a decode step reads no image (its "
                                         "prompt's images were read at prefill); drop images or make it a prefill")
        per_seq = 0 if kind == "decode" else 1 if spec.images is None else spec.images
        if kind == "encoder" and not per_seq:
            raise self.constraints.error(f"{where}.images", "0: an encoder group times the vision block, which "
                                         "needs images (>= 1)")
        if not per_seq:
            return {**dims, "images": 0}, [n for n in names if n != "vision"], ""
        size = tuple(image.get("size") or ())
        if spec.image is not None and tuple(spec.image) != size:
            raise self.constraints.error(f"{where}.image", f"{spec.image[0]}x{spec.image[1]}: the "
                                         f"design's vision block is exported at {size[0]}x{size[1]}")
        tokens = int(image["tokens"])
        t, h, w = image["grid_thw"]
        dims = {**dims, "seq": dims["seq"] + per_seq * tokens, "images": dims["batch"] * per_seq}
        each = f"{per_seq} images per sequence, each" if per_seq > 1 else "image"
        note = f"; {each} {size[0]}x{size[1]} -> grid {t}x{h}x{w} -> {tokens} tokens"
        if kind == "encoder":
            return dims, ["vision"], note + " (vision encoder only)"
        return dims, names, note

    def netlist_changed(self) -> None:
        """Call after changing the netlist: drops what was derived from it, so the next use rebuilds it.

        That is the netlist's node list and bound shapes, the timing graph (cells and nets), and the path
        groups (their dims are the netlist's symbolic dims, their inputs its ports).
        """
        self.netlist.invalidate()
        for view in self.NETLIST_VIEWS:
            self.__dict__.pop(view, None)

    def time(self) -> list[GroupTiming]:
        results = []
        for group in self.groups:
            start = time.perf_counter()
            annotation = self.annotation.for_group(group.name, group.scenario.dims) if self.annotation else None
            absorbed = self.runtime_view.absorbed if self.runtime_view is not None and annotation is None else frozenset()
            request = TimingRequest(annotation=annotation, absorbed=absorbed, partition=self.partition,
                                    collectives=self.collectives if self.partition else None,
                                    mode=self.launches.get(group.name))
            results.append(time_group(self.netlist, self.graph, self.library, self.constraints, group, request))
            self.log(f"timed {group.scenario.description}: {len(self.netlist.nodes())} cells, "
                     f"{time.perf_counter() - start:.1f} s")
        return results

    @functools.cached_property
    def collectives(self):
        return load_collectives()

    @property
    def serving(self):
        """The constraints' serving block with the compile's choices (max_batch) applied; None without one."""
        serving = self.constraints.serving
        if serving is None or self.serving_max_batch is None:
            return serving
        return dataclasses.replace(serving, max_batch=self.serving_max_batch)

    def choose_max_batch(self, max_batch: int) -> None:
        """The engines' batch for the serving simulation and the emitted engine settings (passes.serving)."""
        self.serving_max_batch = max_batch

    def analyze(self, tp_plan: bool = True, serving: bool | None = None) -> Analysis:
        """`tp_plan`: with tensor parallelism, the plan over every degree too (off for a compile's intermediate
        steps, whose log rows need only this degree's timing); `serving`: the constraints' serving block simulated
        (softsyn.timing.serving; default: when `tp_plan` is, so a compile simulates its result, not every step)."""
        groups = self.time()
        share = self.partition.share if self.partition is not None else None
        recast = self.partition.recast if self.partition is not None else None
        counts: dict[str, int] = {}
        for node in self.netlist.nodes():
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
        header = self.library.header
        source = f"{header['runtime']} {header['provider']}, measured {header['date']}"
        source += "; delay tables" if self.library.cells else "; ceilings only: delays are roofline estimates"
        areas = area(self.netlist, self.constraints, {g.name: g.scenario.dims for g in self.groups}, share, recast)
        simulate = (tp_plan if serving is None else serving) and self.constraints.serving is not None
        served = None
        if simulate:
            start = time.perf_counter()
            served = design_serving(self, areas)
            self.log(f"serving: simulated {served.requests} requests, {time.perf_counter() - start:.1f} s")
        return Analysis(
            design=self.netlist.name, library=self.library.name,
            library_source=source,
            version=f"softsyn {__version__}", date=datetime.datetime.now().strftime("%a %b %d %H:%M:%S %Y"),
            provenance=self.netlist.provenance, constraints_file=str(self.constraints.source), groups=groups,
            area=areas, serving=served,
            cell_counts=dict(sorted(counts.items())),
            notes=self._annotation_notes() + ([self.runtime_view.describe()] if self.runtime_view else []),
            warnings=self._library_warnings() + unmodelled_warnings(self.netlist, self.library),
            tp=self.tp_plan if tp_plan else None)

    def _library_warnings(self) -> list[str]:
        """The library describes another machine (softsyn.library.match): the first warning of every banner."""
        return [f"timings describe another machine: {self.library_mismatch}"] if self.library_mismatch else []

    def _annotation_notes(self) -> list[str]:
        if self.annotation is None:
            return []
        a = self.annotation
        notes = []
        for group in self.groups:
            g = a.for_group(group.name, group.scenario.dims)
            if g is None:
                notes.append(f"{group.name}: not back-annotated ({a.path} has no group at dims {group.scenario.dims}); "
                             "library delays")
                continue
            known = sum(1 for n in self.netlist.nodes() if g.delay(n.name) is not None)
            notes.append(f"{group.name}: back-annotated from {a.path} ({a.provider}, {a.device}, {a.date}): "
                         f"{len(g.cells)} cells measured, {len(g.absorbed)} absorbed by runtime fusion/folding (0 s), "
                         f"session.run residual {g.residual * 1e3:.3f} ms; {len(self.netlist.nodes()) - known} "
                         "cells not in the annotation keep library delays")
        return notes

    def log(self, message: str) -> None:
        """A progress line on stderr, unless the design was loaded quiet."""
        progress_log(message, enabled=self.progress)
