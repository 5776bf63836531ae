"""Timing and area: work per cell (cost), static timing per path group (sta), VRAM (area), and the result
objects every report renders (results).

The area computation stays under its module's name, ``softsyn.timing.area.area``: exporting the function
here would shadow the submodule ``softsyn.timing.area``.
"""
from softsyn.timing.cost import Work, node_work, precision_of
from softsyn.results.analysis import (AreaItem, AreaResult, Analysis, GroupTiming, KVBudget, KVOption, PathPoint, Scenario,
                                    TimingPath, TPPlan, TPRow, WeightOption, WorkspacePoint)
from softsyn.timing.sta import (RUN_CALL, CellTiming, PathGroup, TimingRequest, cell_timings, load_time_constants,
                                time_group, timing_graph)

__all__ = [
    "Work",
    "node_work",
    "precision_of",
    "PathGroup",
    "CellTiming",
    "RUN_CALL",
    "timing_graph",
    "time_group",
    "TimingRequest",
    "cell_timings",
    "load_time_constants",
    "Analysis",
    "GroupTiming",
    "Scenario",
    "TimingPath",
    "PathPoint",
    "AreaItem",
    "AreaResult",
    "KVBudget",
    "KVOption",
    "WeightOption",
    "WorkspacePoint",
    "TPPlan",
    "TPRow",
]
