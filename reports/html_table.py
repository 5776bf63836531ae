"""HTML tables of the report page (reports.html): a `Table` as the text prints it, each number's SI
value in data-si; a table saved with its columns (Table.to_dict) or as plain rows read back."""
from __future__ import annotations

import math

from markupsafe import Markup

from reports.common import Column, Table, format_cell, fpercent, ftime

UNIT = "ms"


def _si(value) -> str:
    return repr(float(value)) if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def cell_html(col: Column, value, byte_unit: str = "GB", tag: str = "td") -> Markup:
    """One value as the text report prints it (percent fractions as percent), its SI value in data-si."""
    if col.kind == "percent" and not col.fmt and isinstance(value, float):
        text = fpercent(value)
    elif col.kind == "time" and isinstance(value, float) and math.isinf(value):
        text = col.missing or "inf"
    else:
        text = format_cell(col, value, UNIT, 3, byte_unit)
    numeric = col.align == "right"
    si = _si(value)
    return Markup('<{t} class="{c}" data-key="{k}" data-title="{h}"{a}>{x}</{t}>').format(
        t=tag, c="num" if numeric else "txt", k=col.key, h=col.header(UNIT).replace("\n", " "), x=text,
        a=Markup(' data-si="{}"').format(si) if si and not (isinstance(value, float) and math.isinf(value)) else "")


def table_html(table: Table, caption: str, css: str = "", byte_unit: str = "GB") -> Markup:
    """A Table as an HTML table: its columns' titles (times in ms), its rows through cell_html."""
    columns = [c for c in table.columns if c.title or c.key != "pad"]
    head = Markup("").join(Markup('<th scope="col" class="{}">{}</th>').format(
        "num" if c.align == "right" else "txt", c.header(UNIT).replace("\n", " ")) for c in columns)
    body = Markup("").join(
        Markup("<tr>{}</tr>").format(Markup("").join(cell_html(c, row.get(c.key), byte_unit) for c in columns))
        for row in table.rows)
    return Markup('<div class="scroll"><table class="{}"><caption>{}</caption><thead><tr>{}</tr></thead>'
                  "<tbody>{}</tbody></table></div>").format(css, caption, head, body)


def t(seconds: float | None) -> str:
    return ftime(seconds, UNIT, 3, suffix=True)


def saved_table(data) -> Table | None:
    """A table saved as Table.to_dict() wrote it, or plain rows (a list of objects: one text column per key,
    in first-seen order); None for nothing."""
    if isinstance(data, dict) and "columns" in data:
        return Table.from_dict(data)
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        keys = list(dict.fromkeys(k for r in data for k in r))
        return Table(tuple(Column(k, k, 0) for k in keys), tuple(data))
    return None
