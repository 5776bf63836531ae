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


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
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
    for t in _ticks(lo, hi):
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


__all__ = ["Segment", "lane", "stacked_bar", "line_plot", "scatter", "op_kind", "OP_KIND_NAMES"]
