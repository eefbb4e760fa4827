"""The report and the MCP App view as HTML documents: everything inline (styles, scripts, data), nothing fetched."""

from __future__ import annotations

import json
import re
from html import escape
from importlib.resources import files

from stallhound import __version__
from stallhound.analysis.common import ms
from stallhound.report import svg
from stallhound.report.gather import REPORT_SPANS, Side
from stallhound.tools import diff_profiles

ERRORS = """<pre id="errors"></pre><script>window.addEventListener("error", e =>
  document.getElementById("errors").textContent += e.message + "\\n");</script>"""
DRAW = """<script>for (const el of document.querySelectorAll(".timeline-root"))
  NsTimeline.draw(el, JSON.parse(document.getElementById(el.dataset.source).textContent));</script>"""


def _asset(name: str) -> str:
    return files("stallhound.report").joinpath(name).read_text()


def _document(title: str, body: str, scripts: tuple[str, ...], last: str = "") -> str:
    """The page: the error catcher first, the body, the scripts named (report/*.js) after it, then `last`."""
    inline = "".join(f"<script>{_asset(s)}</script>" for s in scripts)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<style>{_asset('report.css')}</style></head><body>{ERRORS}{body}{inline}{last}</body></html>")


def _data(element_id: str, value: object) -> str:
    # every "<" as JSON's \u003c: neither "</script" nor "<!--" then "<script" (HTML's escaped state, which runs the
    # element past its end) can occur in the data, whatever a kernel or range is named
    text = json.dumps(value, separators=(",", ":")).replace("<", "\\u003c")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def _prose(text: str) -> str:
    """Book text: HTML-escaped, `code` spans kept as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


def _findings(side: Side) -> str:
    t = side.triage
    if not t.findings:
        return "<p>No findings: triage found nothing costly in this window.</p>"
    items = [f'<div class="finding {f.severity}"><b>[{f.severity}] {escape(f.title)}</b><br>'
             + (f"where: {_prose(f.where.text)}<br>" if f.where else "")
             + f"cause: {escape(f.book_title)} (book id <code>{escape(f.root_cause)}</code>, "
             f"<code>{escape(f.book_uri)}</code>)<br>fix ({escape(f.fix_for)}): {_prose(f.fix)}<br>"
             f"verify: {_prose(f.verify)}</div>" for f in t.findings]
    more = t.total_findings - len(t.findings)
    note = f'<p class="note">call sites: {escape(t.where_note)}</p>' if t.where_note else ""
    return "".join(items) + note + (f'<p class="note">... {more} smaller findings: run stallhound triage</p>'
                                    if more else "")


def _kernels(side: Side) -> str:
    rows = side.kernels.rows
    if not rows:
        return "<p>No kernels in this profile.</p>"
    return svg.bars([(r.display_name, r.total_ns, f"{ms(r.total_ns)} ({r.kernel_time_pct:.1f}%, {r.count:,}x)")
                     for r in rows])


def _iterations(side: Side) -> str:
    it = side.iterations
    if not it.rows:
        return f"<p>No iterations found{': ' + escape(it.note) if it.note else ''}.</p>"
    shown = f"the first {len(it.rows)} of {it.total_rows}" if it.total_rows > len(it.rows) else f"{len(it.rows)}"
    return (f'<p class="meta">{shown} iterations by {escape(it.method or "")}; steady median '
            f"{ms(it.steady_median_ns)}</p>" + svg.series([r.duration_ns / 1e6 for r in it.rows], "ms"))


def _side(side: Side, key: str) -> str:
    s = side.timeline.scope
    t = side.triage
    return (f"<h2>{escape(side.label)}</h2>"
            f'<p class="meta">{escape(side.path)}<br>{escape(t.program.kind)} program; window {ms(s.duration_ns)} '
            f"({s.window_basis}), devices {', '.join(map(str, s.devices)) or 'none'}; "
            f"{escape(t.classification.bound)}</p>"
            f'<h3>Timeline</h3><p class="note">Wheel or drag to zoom; zoom re-buckets the embedded '
            f"{side.timeline.buckets:,} columns per lane; the {REPORT_SPANS} longest gaps and kernels "
            f"are drawn exactly.</p>"
            f'<div class="timeline-root" data-source="{key}"></div>{_data(key, side.timeline.model_dump(mode="json"))}'
            f"<h3>Findings</h3>{_findings(side)}"
            f"<h3>Top kernels</h3>{_kernels(side)}<h3>Iterations</h3>{_iterations(side)}")


def report(side: Side) -> str:
    body = f"<h1>stallhound report: {escape(side.label)}</h1>{_side(side, 'timeline-0')}"
    return _document(f"stallhound report: {side.label}", body, ("timeline.js",), DRAW)


def diff_report(before: Side, after: Side, diff: diff_profiles.Result) -> str:
    d = diff.decision
    change = "" if d.change_pct is None else f" ({d.change_pct:+.1f}%, threshold {d.threshold_pct:.1f}%)"
    warnings = "".join(f"<li>{escape(w)}</li>" for w in d.warnings)
    verdict = (f'<div class="verdict"><b>{escape(d.verdict)}</b>{change}: {escape(d.reason)}'
               f"{f'<ul>{warnings}</ul>' if warnings else ''}</div>")
    body = (f"<h1>stallhound diff: {escape(before.label)} vs {escape(after.label)}</h1>{verdict}"
            f'<div class="sides"><div>{_side(before, "timeline-0")}</div><div>{_side(after, "timeline-1")}</div></div>')
    return _document(f"stallhound diff: {before.label} vs {after.label}", body, ("timeline.js",), DRAW)


def timeline_view() -> str:
    """The ui:// view: draws the show_timeline result the host sends it."""
    body = f'<div id="timeline"></div><p class="note">stallhound {__version__}</p>'
    return _document("stallhound timeline", body, ("timeline.js", "view.js"))
