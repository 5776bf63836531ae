"""Shared pieces of the text reports: banner, units, tables, jinja2 environment.

Tables are data: a `Column` says what a row value is and how it prints, a `Table` holds the
rows (SI values) and renders them as fixed-width text here and as JSON/HTML through
`Table.to_dict`. Every table's columns are defined in reports.columns. Two text
layouts exist: the DC layout (`table_row`: a column's width includes its padding, an
overflowing value borrows the next column's padding) and the format-spec layout
(`fixed_line`: `gap` blanks, then the value padded to its width; an overflowing value pushes
the rest of the row right, as f"{x:<10}" does). Conversion to the printed unit happens only
in this module (through `softsyn.units`).
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import jinja2

from softsyn.results.files import write_atomic  # noqa: F401 -- reports' writers take it from here
from softsyn.units import fmt_count, fmt_time

BANNER_RULE = "*" * 40
INDENT = "  "
TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True)
class Column:
    """One column of a table: `key` selects the row value, `kind` says what it is, `fmt` how it prints."""

    key: str
    title: str
    width: int
    align: str = "left"  # "left" | "right"
    kind: str = "text"  # "text" | "time" (s) | "bytes" | "count" | "percent" (a fraction) | "number"
    fmt: str = ""  # str.format template of a number, e.g. "{:.3e}"; "" prints str(value); "time" uses ftime
    missing: str = ""  # text of an absent value (None)
    gap: int = 0  # format-spec layout only: blanks before the column
    clip: bool = False  # format-spec layout only: a longer text keeps its tail after "..."
    unit: str = ""  # "bytes" only: the printed unit ("KB"); "" takes the table's byte unit

    def header(self, time_unit: str = "ms") -> str:
        return f"{self.title} ({time_unit})" if self.kind == "time" else self.title

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Column":
        return cls(**data)


@dataclass(frozen=True)
class Table:
    """Rows (dicts keyed by Column.key: SI values, None where there is none) and the columns that
    print them; the text report and the JSON (`to_dict`) read the same rows."""

    columns: tuple[Column, ...]
    rows: tuple[dict, ...]

    def header(self) -> str:
        return fixed_line(self.columns, {c.key: c.title for c in self.columns})

    def dashes(self) -> str:
        """Each column's width in dashes, under its title."""
        return fixed_line(self.columns, {c.key: "-" * c.width for c in self.columns})

    def lines(self, unit: str = "ms", digits: int = 3, byte_unit: str = "GB") -> list[str]:
        return [fixed_line(self.columns, row, unit, digits, byte_unit) for row in self.rows]

    def to_dict(self) -> dict:
        return {"columns": [c.to_dict() for c in self.columns], "rows": [dict(r) for r in self.rows]}

    @classmethod
    def from_dict(cls, data: dict) -> "Table":
        """The table `to_dict` wrote (a saved report's rows re-rendered, in HTML, without the objects)."""
        return cls(tuple(Column.from_dict(c) for c in data["columns"]), tuple(dict(r) for r in data["rows"]))


# ------------------------------------------------------------------------------------------ units

def is_unconstrained(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isinf(value))


def ftime(seconds: float | None, unit: str = "ms", digits: int = 3, suffix: bool = False) -> str:
    """Seconds -> fixed-unit text (``0.0012`` -> ``"1.200"``; ``suffix`` adds the unit)."""
    if seconds is None:
        return ""
    if isinstance(seconds, float) and math.isinf(seconds):
        return "inf"
    text = fmt_time(seconds, unit=unit, digits=digits, suffix=suffix)
    if text.startswith("-") and float(text.split()[0]) == 0:  # no "-0.000"
        text = text[1:]
    return text


def byte_unit_for(*values: float | None) -> str:
    """The one unit a report prints bytes in: GB for anything model-sized, smaller for toys."""
    biggest = max((abs(v) for v in values if v is not None and not math.isinf(v)), default=0.0)
    if biggest >= 1e8 or biggest == 0:
        return "GB"
    if biggest >= 1e5:
        return "MB"
    return "KB"


_BYTE_SCALE = {"GB": 1e9, "MB": 1e6, "KB": 1e3, "B": 1.0}


def fbytes(b: float | None, unit: str = "GB", digits: int = 3) -> str:
    """Bytes in a fixed decimal unit: ``3.44e9`` -> ``"3.440 GB"``."""
    if b is None:
        return ""
    if digits is None:
        digits = 3
    return f"{b / _BYTE_SCALE[unit]:.{digits}f} {unit}"


def fcount(n: float) -> str:
    """Counts with an SI prefix: ``8.192e9`` -> ``"8.19 G"``."""
    return fmt_count(n)


def fpercent(fraction: float, digits: int = 1) -> str:
    return f"{fraction * 100:.{digits}f}%"


# ------------------------------------------------------------------------------------------ tables

def format_cell(col: Column, value, unit: str = "ms", digits: int = 3, byte_unit: str = "GB") -> str:
    """A row value as text: text as it is, a time in `unit` with `digits` decimals, bytes in the
    column's unit (else `byte_unit`), a flag as yes/no, a number by `col.fmt`."""
    if value is None:
        return col.missing
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "yes" if value else "no"
    if col.kind == "time":
        return ftime(value, unit, digits)
    if col.kind == "bytes" and not col.fmt:
        return fbytes(value, col.unit or byte_unit, digits)
    return col.fmt.format(value) if col.fmt else str(value)


def fixed_line(columns: Sequence[Column], values: dict, unit: str = "ms", digits: int = 3,
               byte_unit: str = "GB") -> str:
    """One row in the format-spec layout. A left-aligned last column is not padded (its padding
    would be trailing blanks)."""
    out = ""
    for i, col in enumerate(columns):
        text = format_cell(col, values.get(col.key), unit, digits, byte_unit)
        if col.clip and len(text) > col.width:
            text = "..." + text[len(text) - col.width + 3:]
        out += " " * col.gap
        if col.align == "right":
            out += text.rjust(col.width)
        else:
            out += text if i == len(columns) - 1 else text.ljust(col.width)
    return out


def table_header(columns: Sequence[Column], time_unit: str = "ms") -> str:
    return _join(columns, [c.header(time_unit) for c in columns])


def table_rule(columns: Sequence[Column]) -> str:
    return "-" * sum(c.width for c in columns)


def table_row(columns: Sequence[Column], values: dict) -> list[str]:
    """One row as text lines: a left-aligned value too long for its column goes on its own
    line and the rest of the row follows on the next line (DC prints long pin names so)."""
    texts = [format_cell(c, values.get(c.key)) for c in columns]
    lines: list[str] = []
    first = columns[0]
    if first.align == "left" and len(texts[0]) >= first.width and any(texts[1:]):
        lines.append(texts[0].rstrip())
        texts[0] = ""
    lines.append(_join(columns, texts))
    return lines


def _join(columns: Sequence[Column], texts: list[str]) -> str:
    """Place each text in its column; a column that overflows borrows from the next one's
    padding, so right-aligned numbers stay in place whenever they can."""
    out = ""
    end = 0
    for col, text in zip(columns, texts):
        end += col.width
        if col.align == "right":
            room = end - len(out)
            out += text.rjust(room) if len(text) < room else (" " + text if out and text else text)
        else:
            if out and not out.endswith(" ") and text:
                out += " "
            out += text
            if len(out) < end:
                out = out.ljust(end)
    return out.rstrip()


# ------------------------------------------------------------------------------------------ hierarchy

_INDEXED = re.compile(r"^(?P<prefix>.+?)\.(?P<index>\d+)(?P<rest>(?:\..*)?)$")


def indexed_scope(hierarchy: str) -> tuple[str, int, str] | None:
    """``"model.layers.3.mlp"`` -> ``("model.layers", 3, ".mlp")``: the outermost
    ``<prefix>.<int>`` component of a scope, or None when there is none."""
    if not hierarchy:
        return None
    m = _INDEXED.match(hierarchy)
    if m is None:
        return None
    return m.group("prefix"), int(m.group("index")), m.group("rest")


# ------------------------------------------------------------------------------------------ banner

def banner_lines(report: str, analysis, options: list[str], scenarios: list[str] | None = None) -> list[str]:
    lines = [BANNER_RULE, f"Report : {report}"]
    lines += [f"        {o}" for o in options]
    lines += [
        f"Design : {analysis.design}",
        f"Version: {analysis.version}",
        f"Date   : {analysis.date}",
        f"Library: {analysis.library}" + (f" ({analysis.library_source})" if analysis.library_source else ""),
    ]
    lines += [f"Scenario: {s}" for s in (scenarios or [])]
    lines.append(BANNER_RULE)
    lines += [f"Warning: {w}" for w in analysis.warnings]
    return lines


# ------------------------------------------------------------------------------------------ templates

_TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
_ENV: jinja2.Environment | None = None


def env() -> jinja2.Environment:
    """Templates load from this module's directory: works from source, editable and installed."""
    global _ENV
    if _ENV is None:
        _ENV = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(_TEMPLATE_DIR)),
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
            undefined=jinja2.StrictUndefined,
            autoescape=lambda name: bool(name) and name.endswith("_html.j2"),  # the HTML page escapes, text does not
        )
        _ENV.globals.update(table_row=table_row, table_header=table_header, table_rule=table_rule,
                            INDENT=INDENT)
    return _ENV


def render(template: str, **context) -> str:
    text = env().get_template(template).render(**context)
    # no trailing blanks, exactly one final newline
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"
