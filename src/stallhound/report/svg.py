"""The report's static charts as SVG text written here: a horizontal bar chart and a series of points."""

from __future__ import annotations

from html import escape

WIDTH = 900  # viewBox units: the charts scale to the page
LABEL = 330  # room for a kernel name at the left of its bar
BAR = 18  # bar height plus spacing
LABEL_CHARS = 52  # kernel names are long templates: the start says which one
VALUE_ROOM = 160  # right of the longest bar: its value text, e.g. "99.151 ms (19.9%, 80x)"
SERIES_HEIGHT = 180
PAD = 30  # room for the axis labels


def bars(rows: list[tuple[str, float, str]]) -> str:
    """(label, value, value text) per bar, longest bar = largest value."""
    top = max((v for _, v, _ in rows), default=0) or 1
    height = BAR * len(rows) + 4
    parts = [f'<svg class="chart bars" viewBox="0 0 {WIDTH} {height}" role="img">']
    for i, (label, value, text) in enumerate(rows):
        y = i * BAR
        length = (WIDTH - LABEL - VALUE_ROOM) * value / top
        short = label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "…"
        parts.append(f'<text x="0" y="{y + 13}">{escape(short)}</text>'
                     f'<rect class="bar" x="{LABEL}" y="{y + 2}" width="{length:.1f}" height="{BAR - 4}">'
                     f'<title>{escape(label)}: {escape(text)}</title></rect>'
                     f'<text x="{LABEL + length + 4:.1f}" y="{y + 13}">{escape(text)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def series(values: list[float], unit: str) -> str:
    """One point per value in order (an iteration's duration), joined by a line, with the y range labelled."""
    if not values:
        return ""
    top, low = max(values), min(values)
    span = (top - low) or 1
    step = (WIDTH - 2 * PAD) / max(1, len(values) - 1)
    points = [(PAD + i * step, SERIES_HEIGHT - PAD - (v - low) / span * (SERIES_HEIGHT - 2 * PAD))
              for i, v in enumerate(values)]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dots = "".join(f'<circle class="dot" cx="{x:.1f}" cy="{y:.1f}" r="2"><title>{i}: {v:,.3f} {unit}</title></circle>'
                   for i, ((x, y), v) in enumerate(zip(points, values, strict=True)))
    return (f'<svg class="chart series" viewBox="0 0 {WIDTH} {SERIES_HEIGHT}" role="img">'
            f'<polyline class="line" points="{path}"/>{dots}'
            f'<text x="0" y="{PAD - 8}">{top:,.3f} {unit}</text>'
            f'<text x="0" y="{SERIES_HEIGHT - 8}">{low:,.3f} {unit}</text>'
            f'<text x="{WIDTH - PAD}" y="{SERIES_HEIGHT - 8}" text-anchor="end">'
            f"iteration {len(values) - 1}</text></svg>")
