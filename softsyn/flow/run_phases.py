"""Where `softsyn run`'s TTFT and TPOT go: each step's measured phases, the warm-up's cold prefill, and the step
times `softsyn signoff` measured for the same artifact (DIR/signoff/signoff.json), side by side.

A step is timed as three contiguous phases (softsyn.runtime.generate.PHASES: inputs, run, readback), so they sum
to it. The run phase is the interval signoff measures per path group (one run_with_iobinding, inputs already on
the device); inputs and readback are the host work a generation adds. Rows are SI dicts; reports.run prints them.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from softsyn.errors import SoftsynError
from softsyn.frontends.onnx_file import inside
from softsyn.runtime.artifact import read_json
from softsyn.runtime.generate import PHASES

SIGNOFF_FILE = Path("signoff") / "signoff.json"


def median_sample(samples: list[tuple[str, tuple[float, ...]]]) -> dict | None:
    """Of (label, phases) samples, the one whose total ranks at the (lower) median, as a row: its label, total
    and each phase (they sum to the total); None without samples."""
    timed = [(sum(phases), label, phases) for label, phases in samples if phases]
    if not timed:
        return None
    total, label, phases = sorted(timed, key=lambda t: t[0])[(len(timed) - 1) // 2]
    return {"sample": label, "total": total, **dict(zip(PHASES, phases))}


def phase_medians(samples: list[tuple[str, tuple[float, ...]]]) -> dict | None:
    """Each phase's median over the samples (they need not sum to the step's median); None without samples."""
    columns = list(zip(*(phases for _, phases in samples if phases)))
    if not columns:
        return None
    return {"sample": f"median of {len(columns[0])}", "total": None,
            **{name: statistics.median(values) for name, values in zip(PHASES, columns)}}


def step_samples(generations: list) -> dict[str, list[tuple[str, tuple[float, ...]]]]:
    """(label, phases) per prefill ("ttft") and per decode step ("tpot") of the timed generations."""
    ttft = [(f"run {r + 1}", g.ttft_phases) for r, g in enumerate(generations)]
    tpot = [(f"run {r + 1} step {i + 1}", p) for r, g in enumerate(generations) for i, p in enumerate(g.tpot_phases)]
    return {"ttft": ttft, "tpot": tpot}


def breakdown(generations: list) -> dict:
    """{"ttft"|"tpot": {"median_sample": row, "phase_medians": row}} (None where the steps carry no phases: a torch
    package's loop)."""
    out = {}
    for key, samples in step_samples(generations).items():
        sample = median_sample(samples)
        out[key] = {"median_sample": sample, "phase_medians": phase_medians(samples)} if sample else None
    return out


def warmup_rows(warmups: list) -> list[dict]:
    """Per untimed warm-up generation: its prefill's time and phases, and whether it was the prompt length's first
    run on the session (cold)."""
    return [{"warmup": r + 1, "ttft": g.ttft, "cold": g.cold, **dict(zip(PHASES, g.ttft_phases))}
            for r, g in enumerate(warmups)]


def signed_off(directory: str | Path, provider: str, prompt_len: int, gen: int) -> dict:
    """The prefill and decode step times DIR/signoff/signoff.json holds, with whether each is the step this run
    timed: a prefill of `prompt_len` at batch 1 and no past, a decode whose past lies in the run's (prompt_len to
    prompt_len + gen - 2), on the same execution provider. {"file": ..., "problem": why not} when there is none. The
    file is untrusted (read inside DIR, size-limited; an entry of the wrong shape is skipped): a bad one never fails
    the run."""
    none = {"file": str(SIGNOFF_FILE)}
    if not (Path(directory) / SIGNOFF_FILE).is_file():
        return {**none, "problem": "no softsyn signoff of DIR yet"}
    try:
        data = read_json(inside(directory, SIGNOFF_FILE.as_posix(), "signoff", directory), "signoff result")
    except SoftsynError as exc:
        return {**none, "problem": f"not readable ({exc})"}
    if not isinstance(data, dict) or not isinstance(data.get("groups"), list):
        return {**none, "problem": "not a signoff result (no groups)"}
    if data.get("provider") != provider:
        return {**none, "problem": f"signed off on {data.get('provider')}, not {provider}"}
    rows = [row for g in data["groups"] if (row := _signed_step(g, prompt_len, gen)) is not None]
    return {**none, "date": data.get("date"), "groups": rows,
            "problem": None if rows else "no batch-1 prefill or decode group in it"}


def _signed_step(group, prompt_len: int, gen: int) -> dict | None:
    """One signoff group as a row of signed_off, None unless it is a measured batch-1 prefill or decode."""
    if not isinstance(group, dict) or not isinstance(group.get("dims"), dict):
        return None
    dims, median = group["dims"], group.get("measured_median")
    seq, past, batch = dims.get("seq"), dims.get("past", 0), dims.get("batch", 1)
    measured = isinstance(median, (int, float)) and median > 0  # a ratio's divisor in the report
    if not all(type(v) is int for v in (seq, past, batch)) or batch != 1 or not measured:
        return None
    kind = "prefill" if seq > 1 and past == 0 else "decode" if seq == 1 else None
    if kind is None:
        return None
    same = seq == prompt_len if kind == "prefill" else gen > 1 and prompt_len <= past <= prompt_len + gen - 2
    return {"group": str(group.get("name")), "kind": kind, "description": str(group.get("description", "")),
            "dims": dims, "median": float(median), "same_step": same}
