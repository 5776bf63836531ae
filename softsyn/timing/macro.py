"""Static timing of a torch package on its macro cells (softsyn.runtime.torch_macros): one path per group whose
stages are the macro cells in launch order, each with its measured delay, then the kernels no call accounts for, then
the step's time outside kernels (the measured step minus the kernels: the runner's and the wrapper's host work).

The package runs its kernels one after another on one stream, so the path is their sum; the clock, input and output
delays and the ports are the group's critical path's in the compile's analysis (the ORT library's STA of the ONNX
netlist), so both paths face the same required time.
"""
from __future__ import annotations

from softsyn.results.analysis import PathPoint, TimingPath
from softsyn.runtime.torch_macros import NO_MODULE, UNATTRIBUTED, MacroGroup

HOST = "(outside kernels)"  # the host point's name
MEASURED = "measured"  # every point's source: a macro cell's delay is a measurement on the target


def macro_path(critical: TimingPath, group: MacroGroup) -> TimingPath | None:
    """The group's path through its macro cells under `critical`'s clock and ports; None when the group was not
    characterised (group.problem says why)."""
    if group.problem:
        return None
    at = critical.input_delay
    points = []
    for m in (*group.macros, group.unattributed):
        at += m.seconds
        scope = "" if m.instance in (UNATTRIBUTED, NO_MODULE) else m.instance
        points.append(PathPoint(name=m.instance, cell=f"macro: {m.kernels:g} kernels, {len(m.cells)} cells",
                                incr=m.seconds, arrival=at, source=MEASURED, hierarchy=scope, op_type="macro"))
    host = max(0.0, group.step - group.kernel_seconds)  # profiled kernels can sum above the separately timed step
    at += host
    points.append(PathPoint(name=HOST, cell="step - kernels", incr=host, arrival=at, source=MEASURED, hierarchy="",
                            op_type="host"))
    return TimingPath(group=critical.group, scenario=critical.scenario, startpoint=critical.startpoint,
                      endpoint=critical.endpoint, clock_period=critical.clock_period,
                      input_delay=critical.input_delay, clock_uncertainty=critical.clock_uncertainty,
                      output_delay=critical.output_delay, points=points, arrival=at, required=critical.required,
                      slack=critical.required - at)
