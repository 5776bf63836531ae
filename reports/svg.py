"""Inline SVG charts of the HTML report (reports.html): bars, a stacked bar, a line plot, a scatter.

Each function takes numbers the report's rows already hold (SI values) and returns SVG markup (a
markupsafe.Markup); it computes no figure of its own beyond scaling to the drawing. Every chart has a
viewBox and width 100 %, so it scales with the page, a <title> for screen readers, and the page puts
a table with the same numbers beside it. Colours are CSS classes, so the stylesheet keeps them in one place.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup

# op kinds: what colours a cell on the waterfall (a CSS class op-<kind>)
_OP_KINDS = (
    ("matmul", {"MatMul", "Gemm", "MatMulNBits", "MatMulBlockQuantizedFp8Weight", "FusedMatMul", "MatMulInteger", "QLinearMatMul", "Einsum", "Conv",
                "QMoE"}),
    ("attention", {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PagedAttention", "Softmax"}),
    ("norm", {"LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
              "SkipSimplifiedLayerNormalization", "RMSNormalization", "GroupNormalization"}),
    ("run", {"Run"}),
    ("memory", {"Gather", "GatherElements", "GatherND", "Reshape", "Transpose", "Concat", "Slice", "Split", "Expand",
                "Unsqueeze", "Squeeze", "Shape", "Identity", "Cast", "ScatterND"}),
)
OP_KIND_NAMES = tuple(k for k, _ in _OP_KINDS) + ("elementwise",)


def op_kind(op_type: str) -> str:
    """The colour class of an op type: matmul, attention, norm, run, memory, else elementwise."""
    for kind, ops in _OP_KINDS:
        if op_type in ops:
            return kind
    return "elementwise"


@dataclass(frozen=True)
class Segment:
    """One piece of a bar: [start, start + length) on the bar's axis, its CSS class and hover text."""

    start: float
    length: float
    css: str
    label: str


def _title(text: str) -> Markup:
    return Markup("<title>{}</title>").format(text)


def lane(segments: Sequence[Segment], scale: float, label: str, height: int = 10, titled: bool = True) -> Markup:
    """A one-line bar of segments on [0, scale): no text inside, so it can stretch to any width (the
    label and numbers sit in HTML beside it). `titled`: each segment carries its hover text (a page with
    thousands of cells leaves it to the rows that print it)."""
    scale = scale if scale > 0 else 1.0
    rect = Markup('<rect x="{:.2f}" width="{:.2f}" height="{}" class="{}">{}</rect>')
    rects = Markup("").join(
        rect.format(1000 * s.start / scale, max(1000 * s.length / scale, 0.5), height, s.css,
                    _title(s.label) if titled else "")
        for s in segments if s.length > 0)
    if not titled:  # the row beside it says it in text
        return Markup('<svg class="lane" viewBox="0 0 1000 {h}" preserveAspectRatio="none" aria-hidden="true">{r}</svg>'
                      ).format(h=height, r=rects)
    return Markup('<svg class="lane" viewBox="0 0 1000 {h}" preserveAspectRatio="none" role="img" '
                  'aria-label="{a}">{r}</svg>').format(h=height, a=label, r=rects)


def stacked_bar(segments: Sequence[Segment], scale: float, label: str, limit: float | None = None,
                limit_label: str = "") -> Markup:
    """A stacked bar (VRAM by kind) with an optional limit marker, on [0, scale)."""
    scale = scale if scale > 0 else 1.0
    body = lane(segments, scale, label, height=24)
    if limit is None:
        return body
    x = min(1000 * limit / scale, 999)
    marker = Markup('<svg class="lane limit" viewBox="0 0 1000 8" preserveAspectRatio="none" aria-hidden="true">'
                    '<rect x="{:.3f}" y="0" width="2" height="8" class="limit-mark"><title>{}</title></rect></svg>').format(
        x, limit_label)
    return body + marker


def ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


W, H, PAD_L, PAD_B, PAD_T, PAD_R = 480, 260, 64, 36, 12, 12


def line_plot(series: dict[str, Sequence[float]], labels: Sequence[str], title: str, y_label: str,
              fmt=str) -> Markup:
    """Lines of equal length over the steps `labels` (WNS / TNS per compile step); `fmt` prints a y value."""
    values = [v for ys in series.values() for v in ys]
    lo, hi = min(values + [0.0]), max(values + [0.0])
    if hi == lo:  # a flat line (every step met: WNS = TNS = 0) sits mid-plot
        lo, hi = lo - 1.0, hi + 1.0
    n = max(len(labels), 1)
    x = lambda i: PAD_L + (W - PAD_L - PAD_R) * (i / (n - 1) if n > 1 else 0.5)  # noqa: E731
    y = lambda v: PAD_T + (H - PAD_T - PAD_B) * (hi - v) / (hi - lo)  # noqa: E731
    parts = [Markup('<svg class="chart" viewBox="0 0 {} {}" role="img" aria-label="{}">').format(W, H, title),
             _title(title)]
    for t in ticks(lo, hi):
        parts.append(Markup('<line x1="{l}" x2="{r}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                            '<text x="{tx}" y="{ty:.1f}" class="axis" text-anchor="end">{v}</text>').format(
            l=PAD_L, r=W - PAD_R, y=y(t), tx=PAD_L - 4, ty=y(t) + 4, v=fmt(t)))
    for i, name in enumerate(labels):
        parts.append(Markup('<text x="{:.1f}" y="{}" class="axis" text-anchor="middle">{}</text>').format(
            x(i), H - PAD_B + 16, i))
    parts.append(Markup('<text x="12" y="{}" class="axis" transform="rotate(-90 12 {})" text-anchor="middle">{}</text>')
                 .format(H / 2, H / 2, y_label))
    for k, (name, ys) in enumerate(series.items()):
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(ys))
        parts.append(Markup('<polyline points="{}" class="series s{}"/>').format(points, k))
        for i, v in enumerate(ys):
            parts.append(Markup('<circle cx="{:.1f}" cy="{:.1f}" r="3" class="series s{}"><title>{}: {} {}</title>'
                                '</circle>').format(x(i), y(v), k, labels[i], name, fmt(v)))
        parts.append(Markup('<text x="{}" y="{}" class="legend s{}">{}</text>').format(
            PAD_L + 8 + 90 * k, PAD_T + 12, k, name))
    parts.append(Markup("</svg>"))
    return Markup("").join(parts)


def scatter(points: Sequence[tuple[float, float, str]], title: str, fmt=str, bands: Sequence[float] = (0.1, 0.25)
            ) -> Markup:
    """Predicted (x) vs measured (y) on log axes, with the y = x line and +-band error lines; points whose
    values are not positive cannot sit on a log axis and are left to the table."""
    shown = [(px, py, label) for px, py, label in points if px > 0 and py > 0]
    parts = [Markup('<svg class="chart" viewBox="0 0 {} {}" role="img" aria-label="{}">').format(W, H, title),
             _title(title)]
    if not shown:
        parts.append(Markup('<text x="{}" y="{}" class="axis" text-anchor="middle">no positive pairs to plot</text>'
                            '</svg>').format(W / 2, H / 2))
        return Markup("").join(parts)
    lo = math.log10(min(min(p[0], p[1]) for p in shown)) - 0.1
    hi = math.log10(max(max(p[0], p[1]) for p in shown)) + 0.1
    size = min(W - PAD_L - PAD_R, H - PAD_T - PAD_B)
    pos = lambda v: size * (math.log10(v) - lo) / (hi - lo)  # noqa: E731
    x = lambda v: PAD_L + pos(v)  # noqa: E731
    y = lambda v: PAD_T + size - pos(v)  # noqa: E731
    a, b = 10 ** lo, 10 ** hi
    for e in range(math.ceil(lo), math.floor(hi) + 1):
        v = 10.0 ** e
        parts.append(Markup('<line x1="{x:.1f}" x2="{x:.1f}" y1="{t}" y2="{btm}" class="grid"/>'
                            '<text x="{x:.1f}" y="{ty}" class="axis" text-anchor="middle">{v}</text>'
                            '<line x1="{l}" x2="{r}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                            '<text x="{lx}" y="{yy:.1f}" class="axis" text-anchor="end">{v}</text>').format(
            x=x(v), t=PAD_T, btm=PAD_T + size, ty=PAD_T + size + 14, v=fmt(v), l=PAD_L, r=PAD_L + size, y=y(v),
            lx=PAD_L - 4, yy=y(v) + 4))
    # the y = x line and the error bands, clipped to the plot square by a nested svg's viewport
    parts.append(Markup('<svg x="{}" y="{}" width="{:.1f}" height="{:.1f}" overflow="hidden">').format(PAD_L, PAD_T, size, size))
    local = lambda px, py: (pos(px), size - pos(py))  # noqa: E731
    lines = [(1.0, "diag", "measured = predicted")]
    lines += [(1 / (1 + s * band), "band", f"error {'+' if s > 0 else '-'}{band:.0%}") for band in bands for s in (1, -1)]
    for f, css, text in lines:  # measured = predicted / (1 + error)
        (x1, y1), (x2, y2) = local(a, a * f), local(b, b * f)
        parts.append(Markup('<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" class="{}"><title>{}</title></line>')
                     .format(x1, y1, x2, y2, css, text))
    parts.append(Markup("</svg>"))
    for px, py, label in shown:
        parts.append(Markup('<circle cx="{:.1f}" cy="{:.1f}" r="3.5" class="pt"><title>{}: predicted {}, measured {}'
                            '</title></circle>').format(x(px), y(py), label, fmt(px), fmt(py)))
    parts.append(Markup('<text x="{}" y="{}" class="axis" text-anchor="middle">predicted</text>'
                        '<text x="{}" y="{}" class="axis" text-anchor="start">measured</text>').format(
        PAD_L + size / 2, H - 4, PAD_L + size + 6, PAD_T + 10))
    parts.append(Markup("</svg>"))
    return Markup("").join(parts)




def hbars(rows: Sequence[tuple[str, float, str, str]], title: str, log: bool = False) -> Markup:
    """Horizontal bars, one per (label, value, css class, value text), on a linear axis from 0, or a log axis
    (`log`: values that differ by orders of magnitude); a value that is not positive gets no bar on a log axis."""
    label_w, bar_w, row_h = 150, 270, 18
    height = PAD_T + row_h * max(len(rows), 1) + 8
    shown = [v for _, v, _, _ in rows if v > 0]
    parts = [Markup('<svg class="chart hbars" viewBox="0 0 {} {}" role="img" aria-label="{}">').format(
        label_w + bar_w + 100, height, title), _title(title)]
    if shown:
        top = max(shown)
        low = min(shown) / 2 if log else 0.0
        span = (math.log10(top) - math.log10(low)) if log and top > low else 1.0
        length = (lambda v: bar_w * (math.log10(v) - math.log10(low)) / span) if log else (lambda v: bar_w * v / top)
        for i, (label, value, css, text) in enumerate(rows):
            y = PAD_T + i * row_h
            parts.append(Markup('<text x="{}" y="{}" class="axis" text-anchor="end">{}</text>').format(
                label_w - 6, y + 12, label[:24]))
            if value > 0:
                parts.append(Markup('<rect x="{x}" y="{y}" width="{w:.1f}" height="{h}" class="{css}"><title>{label}: '
                                    '{text}</title></rect>').format(x=label_w, y=y + 2, w=max(length(value), 1.0),
                                                                     h=row_h - 5, css=css, label=label, text=text))
            parts.append(Markup('<text x="{:.1f}" y="{}" class="axis">{}</text>').format(
                label_w + (max(length(value), 0.0) if value > 0 else 0) + 4, y + 12, text))
    parts.append(Markup("</svg>"))
    return Markup("").join(parts)


def _log_ticks(lo: float, hi: float) -> list[float]:
    return [10.0 ** e for e in range(math.ceil(lo), math.floor(hi) + 1)]


def roofline_chart(points: Sequence[tuple[float, float, str, str]], bandwidth: float | None,
                   peaks: dict[str, float], title: str) -> Markup:
    """Achieved FLOP/s (y) against arithmetic intensity, FLOP/byte (x), both log: the cells as points
    (x, y, css class, hover text) under the library's ceilings, the memory roof (y = x * bandwidth) and one
    flat roof per precision's peak."""
    shown = [(x, y, c, t) for x, y, c, t in points if x > 0 and y > 0]
    parts = [Markup('<svg class="chart" viewBox="0 0 {} {}" role="img" aria-label="{}">').format(W, H, title),
             _title(title)]
    if not shown:
        parts.append(Markup('<text x="{}" y="{}" class="axis" text-anchor="middle">no cell with FLOPs and bytes to '
                            'plot</text></svg>').format(W / 2, H / 2))
        return Markup("").join(parts)
    xs = [p[0] for p in shown]
    ys = [p[1] for p in shown] + [v for v in peaks.values() if v]
    x_lo, x_hi = math.log10(min(xs)) - 0.3, math.log10(max(xs)) + 0.3
    y_lo, y_hi = math.log10(min(ys)) - 0.3, math.log10(max(ys)) + 0.3
    pw, ph = W - PAD_L - PAD_R - 80, H - PAD_T - PAD_B
    x = lambda v: PAD_L + pw * (math.log10(v) - x_lo) / (x_hi - x_lo)  # noqa: E731
    y = lambda v: PAD_T + ph * (y_hi - math.log10(v)) / (y_hi - y_lo)  # noqa: E731
    for v in _log_ticks(x_lo, x_hi):
        parts.append(Markup('<line x1="{x:.1f}" x2="{x:.1f}" y1="{t}" y2="{b}" class="grid"/><text x="{x:.1f}" '
                            'y="{ty}" class="axis" text-anchor="middle">{v:g}</text>').format(
            x=x(v), t=PAD_T, b=PAD_T + ph, ty=PAD_T + ph + 14, v=v))
    for v in _log_ticks(y_lo, y_hi):
        parts.append(Markup('<line x1="{l}" x2="{r}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/><text x="{lx}" '
                            'y="{ty:.1f}" class="axis" text-anchor="end">{v:.0e}</text>').format(
            l=PAD_L, r=PAD_L + pw, y=y(v), lx=PAD_L - 4, ty=y(v) + 4, v=v))
    parts.append(Markup('<svg x="{}" y="{}" width="{}" height="{}" overflow="hidden"><g transform="translate({},{})">'
                        ).format(PAD_L, PAD_T, pw, ph, -PAD_L, -PAD_T))
    a, b = 10 ** x_lo, 10 ** x_hi
    if bandwidth:
        parts.append(Markup('<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" class="roof"><title>memory '
                            'bandwidth {:.3g} B/s</title></line>').format(x(a), y(a * bandwidth), x(b), y(b * bandwidth),
                                                                        bandwidth))
    for name, peak in peaks.items():
        if peak:
            parts.append(Markup('<line x1="{l}" x2="{r}" y1="{y:.1f}" y2="{y:.1f}" class="roof peak"><title>peak {n} '
                                '{p:.3g} FLOP/s</title></line>').format(l=PAD_L, r=PAD_L + pw, y=y(peak), n=name, p=peak))
    parts.append(Markup("</g></svg>"))
    labels: list[list] = []  # peaks within 12 px of each other share one label, so no two overlap
    for name, peak in sorted(peaks.items(), key=lambda kv: -kv[1]):
        if peak and y_lo <= math.log10(peak) <= y_hi:
            if labels and abs(y(peak) - labels[-1][0]) < 12:
                labels[-1][1].append(name)
            else:
                labels.append([y(peak), [name]])
    for at, names in labels:
        parts.append(Markup('<text x="{}" y="{:.1f}" class="axis">{}</text>').format(PAD_L + pw + 3, at + 4,
                                                                                      "/".join(names)))
    for px, py, css, text in shown:
        parts.append(Markup('<circle cx="{:.1f}" cy="{:.1f}" r="3.5" class="pt {}"><title>{}</title></circle>').format(
            x(px), y(py), css, text))
    parts.append(Markup('<text x="{}" y="{}" class="axis" text-anchor="middle">FLOP/byte</text>'
                        '<text x="{}" y="{}" class="axis" text-anchor="start">FLOP/s</text>').format(
        PAD_L + pw / 2, H - 4, PAD_L + 4, PAD_T + 10))
    parts.append(Markup("</svg>"))
    return Markup("").join(parts)


def histogram(bins: Sequence[tuple[float, float, int]], title: str, fmt=str, x_label: str = "slack (ms)",
              noun: str = "path") -> Markup:
    """Counts per [low, high) bin as columns, with the zero-slack line where it falls inside; `noun` is what is
    counted, `x_label` the axis."""
    parts = [Markup('<svg class="chart" viewBox="0 0 {} {}" role="img" aria-label="{}">').format(W, H, title),
             _title(title)]
    lo, hi = min(b[0] for b in bins), max(b[1] for b in bins)
    if hi <= lo:
        lo, hi = lo - 1e-4, hi + 1e-4
    top = max(max(b[2] for b in bins), 1)
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    x = lambda v: PAD_L + pw * (v - lo) / (hi - lo)  # noqa: E731
    for t in ticks(0, top, 4):
        y = PAD_T + ph * (1 - t / top)
        parts.append(Markup('<line x1="{l}" x2="{r}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/><text x="{lx}" y="{ty:.1f}" '
                            'class="axis" text-anchor="end">{v:g}</text>').format(l=PAD_L, r=PAD_L + pw, y=y, lx=PAD_L - 4,
                                                                             ty=y + 4, v=t))
    for low, high, n in bins:
        h = ph * n / top
        parts.append(Markup('<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" class="{css}"><title>{low} '
                            'to {high}: {n} {s}</title></rect>').format(
            x=x(low) + 1, y=PAD_T + ph - h, w=max(x(high) - x(low) - 2, 1.5), h=h, css="bin neg" if high <= 0 else "bin",
            low=fmt(low), high=fmt(high), n=n, s=f"{noun}s" if n != 1 else noun))
    for v in (lo, hi):
        parts.append(Markup('<text x="{:.1f}" y="{}" class="axis" text-anchor="middle">{}</text>').format(
            x(v), PAD_T + ph + 14, fmt(v)))
    if lo < 0 < hi:
        parts.append(Markup('<line x1="{x:.1f}" x2="{x:.1f}" y1="{t}" y2="{b}" class="diag"><title>slack 0</title></line>'
                            ).format(x=x(0), t=PAD_T, b=PAD_T + ph))
    parts.append(Markup('<text x="{}" y="{}" class="axis" text-anchor="middle">{}</text></svg>').format(
        PAD_L + pw / 2, H - 4, x_label))
    return Markup("").join(parts)


__all__ = ["Segment", "ticks", "lane", "stacked_bar", "line_plot", "scatter", "op_kind", "OP_KIND_NAMES", "hbars",
           "roofline_chart", "histogram"]
