"""The plan of a model too big to load: `softsyn compile zoo:qwen3-235b-a22b --plan` on the meta device, timed.

    python bench/plan_235b.py --cold -o bench/results/plan-235b-DATE.md     # here (CPU), a fresh export cache

Runs the compile as a child process (the CLI as a user runs it) and prints its wall time and peak RSS (the child's
ru_maxrss) against the goal (<= 5 min, <= 4 GB), the expert fusion (MoE cells: top-k active of 128, not dense),
each path group's timing and the VRAM per kind; then, from the plan's weights at each precision the KV budget
lists and its KV cache, how many H200s the weights + KV need and the area per device (estimate: weights and KV
split evenly, every device holding the whole single-device workspace).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_WALL, GOAL_RSS = 300.0, 4e9
H200 = 141e9  # bytes of HBM3e per H200 (the constraint's area_constraint when it says 141GB)


def devices_needed(weights: float, kv: float, workspace: float, capacity: float = H200) -> tuple[int | None, float]:
    """(devices, bytes per device) to hold weights + KV split evenly, each device also holding the workspace;
    None when the workspace alone does not fit one device."""
    room = capacity - workspace
    if room <= 0:
        return None, workspace
    n = max(1, math.ceil((weights + kv) / room))
    return n, (weights + kv) / n + workspace


def run_plan(model: str, constraints: Path, out: Path, cache: Path) -> tuple[float, float, float, int, str]:
    """(wall s, CPU s, peak RSS bytes of the child, exit code, its stderr tail). CPU time is what the wall time
    would be on an idle core; on a shared machine the wall time also holds the waits for one."""
    cmd = [sys.executable, "-m", "softsyn.cli", "compile", model, "-c", str(constraints), "--plan", "-o", str(out),
           "--cache-dir", str(cache)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss = usage.ru_maxrss * 1024  # KiB on Linux
    return wall, usage.ru_utime + usage.ru_stime, rss, proc.returncode, "\n".join(proc.stderr.strip().splitlines()[-5:])


def summarise(out: Path) -> dict:
    analysis = json.loads((out / "analysis.json").read_text())
    cells = json.loads((out / "netlist.json").read_text())["cells"]
    ops = {}
    for c in cells:
        ops[c["op"]] = ops.get(c["op"], 0) + 1
    area = analysis["area"]
    budget = area.get("kv_budget") or {}
    kv = next((k["kv_bytes"] for k in budget.get("kv_dtypes", []) if k["source"] == "netlist"), 0.0)
    groups = []
    for g in analysis["groups"]:
        worst = min(g["paths"], key=lambda p: p["slack"]) if g["paths"] else None
        groups.append({"group": g["name"], "scenario": g["scenario"]["description"],
                       "arrival": worst["arrival"] if worst else None, "required": worst["required"] if worst else None,
                       "slack": worst["slack"] if worst else None, "cells": g["cell_count"],
                       "estimated_cells": g["estimated_cells"]})
    precisions = []
    for w in budget.get("weight_precisions", []):
        n, per = devices_needed(w["weight_bytes"], kv, budget.get("workspace", 0.0), budget.get("limit") or H200)
        precisions.append({"precision": w["precision"], "source": w["source"], "weights": w["weight_bytes"],
                           "kv": kv, "devices": n, "per_device": per})
    return {"design": analysis["design"], "parameters": area.get("parameters"), "ops": ops,
            "layers_provenance": (analysis.get("provenance") or {}).get("layers"),
            "by_kind": area["by_kind"], "workspace": budget.get("workspace"),
            "workspace_scenario": budget.get("workspace_scenario"), "groups": groups, "precisions": precisions}


def render(s: dict, wall: float, cpu: float, rss: float, rc: int, cmd: str, load: str = "") -> str:
    gb = lambda b: f"{b / 1e9:.3f} GB"  # noqa: E731
    ms = lambda t: "-" if t is None else f"{t * 1e3:.3f} ms"  # noqa: E731
    met = wall <= GOAL_WALL and rss <= GOAL_RSS
    lines = [f"# Plan of {s['design']} ({datetime.date.today()})", "", f"    {cmd}", "",
             f"- wall time: {wall:.1f} s (goal <= {GOAL_WALL:.0f} s); CPU time {cpu:.1f} s"
             + (f"; load average before the run {load}" if load else ""),
             f"- peak RSS: {rss / 1e9:.2f} GB (goal <= {GOAL_RSS / 1e9:.0f} GB): goal {'MET' if met else 'NOT met'}",
             f"- compile exit code: {rc} (1 = a group or the area violates the constraints; the plan is written)",
             f"- parameters: {s['parameters'] / 1e9:.2f} G; layers: {s['layers_provenance']}",
             f"- MoE cells: {s['ops'].get('MoE', 0)}, QMoE: {s['ops'].get('QMoE', 0)}, GatherND left: "
             f"{s['ops'].get('GatherND', 0)}, GroupQueryAttention: {s['ops'].get('GroupQueryAttention', 0)}", "",
             "| group | scenario | arrival | required | slack | cells (est) |", "|---|---|---|---|---|---|"]
    for g in s["groups"]:
        lines.append(f"| {g['group']} | {g['scenario']} | {ms(g['arrival'])} | {ms(g['required'])} | "
                     f"{ms(g['slack'])} | {g['cells']} ({g['estimated_cells']}) |")
    lines += ["", "| VRAM kind | bytes |", "|---|---|"] + [f"| {k['name']} | {gb(k['bytes'])} |" for k in s["by_kind"]]
    lines += ["", f"H200s for weights + KV (estimate: split evenly, each device also holds the "
                  f"{gb(s['workspace'] or 0)} workspace of {s['workspace_scenario']}):", "",
              "| precision | weights | KV | H200s | per device |", "|---|---|---|---|---|"]
    for p in s["precisions"]:
        label = "" if p["source"] == "netlist" else " (est)"
        n = "workspace does not fit" if p["devices"] is None else str(p["devices"])
        lines.append(f"| {p['precision']}{label} | {gb(p['weights'])} | {gb(p['kv'])} | {n} | {gb(p['per_device'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zoo:qwen3-235b-a22b")
    ap.add_argument("-c", "--constraints", type=Path, default=ROOT / "constraints" / "chat-h200.yaml")
    ap.add_argument("--cold", action="store_true", help="a fresh, empty export cache (the export is timed too)")
    ap.add_argument("--cache-dir", type=Path, help="export cache (default: $SOFTSYN_CACHE's default)")
    ap.add_argument("-o", "--output", type=Path, help="also write the result (markdown) here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="plan235b-") as tmp:
        cache = Path(tmp) / "cache" if args.cold else (args.cache_dir or Path.home() / ".cache" / "softsyn")
        out = Path(tmp) / "plan"
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        wall, cpu, rss, rc, err = run_plan(args.model, args.constraints, out, cache)
        if rc not in (0, 1):
            print(f"plan_235b: compile failed (exit {rc}): {err}", file=sys.stderr)
            return 3
        cmd = (f"softsyn compile {args.model} -c {args.constraints.relative_to(ROOT) if args.constraints.is_relative_to(ROOT) else args.constraints} "
               f"--plan -o DIR" + (" (fresh export cache)" if args.cold else ""))
        text = render(summarise(out), wall, cpu, rss, rc, cmd, load)
    print(text)
    if args.output:
        args.output.write_text(text)
    return 0 if wall <= GOAL_WALL and rss <= GOAL_RSS else 1


if __name__ == "__main__":
    sys.exit(main())
