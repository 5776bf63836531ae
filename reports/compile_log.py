"""report_compile_log: DC's compile log, one row per step (elaborate, then each pass of the effort's script),
then the notes emit left about the artifacts (a missing tokenizer, an assumed EOS token).

The columns are data (`COMPILE_LOG_COLUMNS`): the same rows render as the fixed-width text of
DIR/compile.log and as JSON (SI units). A title with a newline is a two-line header.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict

from reports.common import TIME_UNITS, Column
from softsyn.results.compile_log import CompileLog, LogRow
from softsyn.units import fmt_bytes

SCHEMA = "softsyn.compile_log/1"
UNITS = {"elapsed": "s", "wns": "s", "tns": "s", "area": "B", "rules": "MB over the area limit + % error over budget"}
TIME_UNIT = "ms"

COMPILE_LOG_COLUMNS: list[Column] = [
    Column("elapsed", "ELAPSED\nTIME", 8, "right", "number", fmt="{:.1f} s"),  # fmt: JSON/HTML readers (text: H:MM:SS)
    Column("phase", "PHASE", 18, "left"),
    Column("wns", "WORST NEG\nSLACK", 10, "right", "time"),
    Column("tns", "TOTAL NEG\nSLACK", 10, "right", "time"),
    Column("rules", "DESIGN RULE\nCOST", 11, "right"),
    Column("area", "AREA", 12, "right", "bytes"),
    Column("cells", "CELLS", 6, "right", "count"),
    Column("worst_group", "WORST GROUP", 11, "left"),
]


def _clock(seconds: float) -> str:
    s = int(math.floor(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _texts(row: LogRow) -> list[str]:
    """A row's values as printed: elapsed as H:MM:SS, slacks in TIME_UNIT, area with its unit."""
    scale = 1 / TIME_UNITS[TIME_UNIT]
    printed = {"elapsed": _clock(row.elapsed), "phase": row.phase, "wns": f"{row.wns * scale:.3f}",
               "tns": f"{row.tns * scale:.3f}", "rules": f"{row.rules:.2f}", "area": fmt_bytes(row.area), "cells": str(row.cells),
               "worst_group": row.worst_group}
    return [printed[c.key] for c in COMPILE_LOG_COLUMNS]


def _line(texts: list[str], header: bool = False) -> str:
    """Each column two spaces in, padded to its width, except the last, which is not padded (its width is
    the rule's) and which a header line without a title there leaves out; a value wider than its column
    pushes the rest of the line right."""
    *body, last = texts
    line = "".join(f"  {t:>{c.width}}" if c.align == "right" else f"  {t:<{c.width}}"
                   for c, t in zip(COMPILE_LOG_COLUMNS, body))
    return line if header and not last else f"{line}  {last}"


def _header() -> list[str]:
    """The two title lines (a one-line title sits on the lower) and the rule."""
    titles = [c.header(TIME_UNIT).split("\n") for c in COMPILE_LOG_COLUMNS]
    top = [t[0] if len(t) == 2 else "" for t in titles]
    bottom = [t[-1] for t in titles]
    return [_line(top, header=True), _line(bottom, header=True), _line(["-" * c.width for c in COMPILE_LOG_COLUMNS])]


def report_compile_log(log: CompileLog) -> str:
    """The text of DIR/compile.log: design, library, effort and its script, then one row per step."""
    lines = [f"softsyn compile: design {log.design}, library {log.library}, effort {log.effort.name}",
             f"script: {log.effort.script_text()}", "", *_header()]
    lines += [_line(_texts(row)) for row in log.rows]
    if log.notes:
        lines += ["", *(f"note: {note}" for note in log.notes)]
    return "\n".join(lines) + "\n"


def compile_log_json(log: CompileLog) -> str:
    """The same rows as JSON, SI units (elapsed, slacks in s; area in bytes), with the column layout."""
    data = {"schema": SCHEMA, "units": UNITS, "design": log.design, "library": log.library,
            "effort": log.effort.name, "script": list(log.effort.script),
            "columns": [c.to_dict() for c in COMPILE_LOG_COLUMNS], "rows": [asdict(row) for row in log.rows],
            "notes": list(log.notes)}
    return json.dumps(data, indent=1, allow_nan=False) + "\n"
