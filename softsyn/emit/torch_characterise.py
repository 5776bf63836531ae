"""The torch package's macro cells characterised at compile end (issue 28 item 2): the step profiled at every path
group's dims, its kernels attributed to source module instances through the provenance map and to netlist cells
through their scopes (softsyn.runtime.torch_macros), written to DIR/runtime/torch_macros.json and rendered as
DIR/reports/torch_macros.rpt (report_timing through the macro cells, beside the ORT library's estimate)."""
from __future__ import annotations

import datetime
from pathlib import Path

import torch

from reports.macro_timing import report_macro_timing
from softsyn import progress
from softsyn.results.files import write_atomic
from softsyn.runtime.session import device_name
from softsyn.runtime.torch_macros import (MACROS_FILE, UNATTRIBUTED, MacroCell, MacroGroup, MacroLibrary, aggregate,
                                          cover, scaled, write_library)
from softsyn.runtime.torch_profile import Profile, profile_step
from softsyn.units import fmt_time

PROFILED_STEPS = 5  # steps profiled per group, after one untimed
MACROS_REPORT = "reports/torch_macros.rpt"
METHOD = (f"torch.profiler over {PROFILED_STEPS} steps per group after one untimed (CUDA: CUPTI kernel times; CPU: "
          "AOTInductor's per-kernel profiler records, wall time), summed per macro cell and per step, scaled to the "
          "step where they sum above it; the step's time outside kernels: its median (10 steps, unprofiled) minus "
          "the kernels")
NOT_SEEN = ("torch.profiler saw no kernel of the package at these dims (a CPU package compiled without Inductor's "
            "cpp.enable_kernel_profile records, or a device whose kernels the profiler cannot see)")
NO_MAP = "the package has no kernel map (runtime/torch_kernels*.json): its kernels cannot be mapped to modules"


def characterise(design, analysis, folder: Path, step, *, calls: dict[str, list], cells: list[dict],
                 measured: dict[str, float]) -> list[str]:
    """Profile `step` (the loaded packages) at each group's dims, write MACROS_FILE and MACROS_REPORT into `folder`;
    `calls`: each package's kernel map (torch.json's packages key -> calls), `cells`: DIR/netlist.json's cells,
    `measured`: each group's measured step (groups absent did not fit the cache). The compile log's lines."""
    groups = []
    with progress.step(f"emit: characterising the package's macro cells ({PROFILED_STEPS} profiled steps per group)",
                       enabled=design.progress, done="emit: macro cells characterised"):
        for g in analysis.groups:
            dims = dict(g.scenario.dims)
            key = step.package_for(dims.get("seq", 1))
            file = step.packages[key]["file"]
            if g.name not in measured:
                groups.append(_uncharacterised(g.name, dims, file, f"not measured: past + seq exceed the KV cache of "
                                                                   f"{step.max_length}"))
                continue
            groups.append(macro_group(g.name, dims, file, profile_step(step, dims, PROFILED_STEPS), calls=calls[key],
                                      cells=cells, step=measured[g.name]))
    library = MacroLibrary(target=design.torch_target, device=device_name(step.device), torch=torch.__version__,
                           date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"), method=METHOD,
                           groups=tuple(groups), library=design.library.name)
    write_library(folder / MACROS_FILE, library)
    write_atomic(folder / MACROS_REPORT, report_macro_timing(analysis, library))
    return [f"target {design.torch_target}: {MACROS_FILE}: {line}" for line in summary(library)]


def macro_group(name: str, dims: dict, file: str, profiled: Profile, *, calls: list, cells: list[dict],
                step: float) -> MacroGroup:
    """One group's macro cells from its profile: not characterised (saying why) when the profiler saw no kernel or
    the package has no map."""
    if not profiled.kernels:
        return _uncharacterised(name, dims, file, NOT_SEEN, profiled.steps)
    if not calls:
        return _uncharacterised(name, dims, file, NO_MAP, profiled.steps)
    macros, unattributed = aggregate(list(profiled.kernels), profiled.steps, calls, profiled.named)
    macros, unattributed, factor = scaled(macros, unattributed, step)
    macros, uncovered = cover(macros, cells, name)
    return MacroGroup(name, dims, file, steps=profiled.steps, step=step, macros=macros, unattributed=unattributed,
                      uncovered=uncovered, scale=factor)


def _uncharacterised(name: str, dims: dict, file: str, problem: str, steps: int = PROFILED_STEPS) -> MacroGroup:
    return MacroGroup(name, dims, file, steps=steps, step=0.0, macros=(),
                      unattributed=MacroCell(UNATTRIBUTED, 0.0, 0.0, ()), problem=problem)


def summary(library: MacroLibrary) -> list[str]:
    """One line per group: its macro cells and what maps to nothing, measured."""
    lines = []
    for g in library.groups:
        if g.problem:
            lines.append(f"{g.name}: not characterised: {g.problem}")
            continue
        mapped = sum(1 for m in g.macros if m.cells)
        scale = f"; kernels scaled by {g.scale:.3f} to the step" if g.scale < 1 else ""
        lines.append(f"{g.name}: {len(g.macros)} macro cells ({mapped} covering netlist cells), "
                     f"{sum(m.kernels for m in g.macros):g} kernels {fmt_time(g.kernel_seconds)} per step of "
                     f"{fmt_time(g.step)} ({library.device}, measured{scale}); unattributed "
                     f"{g.unattributed.kernels:g} kernels {fmt_time(g.unattributed.seconds)}; {len(g.uncovered)} "
                     "netlist cells uncovered")
    return lines
