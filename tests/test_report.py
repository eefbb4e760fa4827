"""stallhound report: one self-contained HTML file per profile (or before/after pair), opened in headless Chromium;
and the MCP App view drawing a real show_timeline result inside a minimal host page."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from browser import WINDOW, dom, screenshot
from conftest import FIXTURES, SYNTH_PAIRS, text_of
from mcp.client import Client
from timeline_ref import raw_lanes

from stallhound.cli.main import main
from stallhound.report import page
from stallhound.report.gather import REPORT_SPANS
from stallhound.server.app import build_server

REAL = "nsysai_h100_2gpu_1s"  # two devices, busy: no gap of 1 ms
IDLE = "clue_t4_report4"  # one device, idle 81% of the window in long gaps
MAX_REPORT_BYTES = 3_000_000  # "a few MB at most" holds for the 1 GB export; these small profiles stay far under
MIN_SCREENSHOT_BYTES = 50_000  # a blank 1400x2400 page compresses to ~10 kB; lanes, bars and text add far more
SVG_NAMESPACE = "http://www.w3.org/2000/svg"  # a name, not an address: the only URL a report may contain
LANE = re.compile(r'<g class="lane" data-device="(\d+)" data-lane="(\w+)"')


def _embedded(html: str) -> list[dict]:
    return [json.loads(m) for m in re.findall(r'<script type="application/json" id="timeline-\d">(.*?)</script>', html)]


def _report(tmp_path: Path, cache_root: Path, *args: str) -> tuple[Path, str]:
    out = tmp_path / "report.html"
    assert main(["report", *args, "-o", str(out), "--cache-dir", str(cache_root)]) == 0
    return out, out.read_text()


def _drawn(out: Path) -> str:
    """The DOM after the report's scripts ran, checked for errors (console and the page's own catcher)."""
    after, console = dom(out)
    assert console == []
    assert '<pre id="errors"></pre>' in after
    return after


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory, demo, cache_root):
    profile, truth = demo
    return (*_report(tmp_path_factory.mktemp("report"), cache_root, str(profile.path)), profile, truth)


def test_report_demo_draws_every_lane_gap_and_step(demo_report):
    out, html, profile, truth = demo_report
    (data,) = _embedded(html)
    after = _drawn(out)
    s = data["scope"]
    raw = raw_lanes(profile.path, s["start_ns"], s["end_ns"])
    assert sorted((int(d), lane) for d, lane in LANE.findall(after)) == sorted(k for k, v in raw.items() if v)
    gaps = min(REPORT_SPANS, sum(d["gap_count"] for d in data["devices"]))
    assert after.count('class="gap"') == len(data["gaps"]) == gaps > 0
    assert after.count('class="step"') == len(truth["iterations"]) * len(truth["devices"])
    assert len(html.encode()) < MAX_REPORT_BYTES


def test_report_demo_lists_triage_findings_with_fix_and_book_id(demo_report):
    from stallhound.tools import triage
    out, html, profile, _ = demo_report
    found = triage.run(profile.con, triage.Params(profile="demo.sqlite"))
    assert html.count('class="finding ') == len(found.findings) == 10
    for f in found.findings:
        assert f"book id <code>{f.root_cause}</code>" in html


def test_report_demo_screenshot_is_the_whole_window_and_not_blank(demo_report, tmp_path):
    out = demo_report[0]
    png = tmp_path / "demo.png"
    assert screenshot(out, png) == WINDOW
    assert png.stat().st_size > MIN_SCREENSHOT_BYTES


def test_report_demo_is_self_contained(demo_report):
    html = demo_report[1]
    assert set(re.findall(r"https?://[^\s\"'<>)]+", html)) == {SVG_NAMESPACE}
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=", html)


@pytest.mark.parametrize(("stem", "devices", "some_gaps"), [(REAL, [0, 1], False), (IDLE, [0], True)])
def test_report_real_fixture_matches_the_export_and_writes_nothing_beside_it(tmp_path, cache_root, stem, devices,
                                                                              some_gaps):
    path = FIXTURES / f"{stem}.sqlite"
    before = sorted(p.name for p in FIXTURES.iterdir())
    out, html = _report(tmp_path, cache_root, str(path))
    assert sorted(p.name for p in FIXTURES.iterdir()) == before
    (data,) = _embedded(html)
    after = _drawn(out)
    raw = raw_lanes(path, data["scope"]["start_ns"], data["scope"]["end_ns"])
    assert sorted((int(d), lane) for d, lane in LANE.findall(after)) == sorted(k for k, v in raw.items() if v)
    assert after.count('class="gap"') == len(data["gaps"]) and (len(data["gaps"]) > 0) is some_gaps
    assert [d["device"] for d in data["devices"]] == devices


HOSTILE_NAME = "<!--<script>gemm</script><!--"  # HTML's escaped state: unescaped, the data block runs on past its end


def test_report_kernel_named_like_html_keeps_its_timeline(tmp_path, cache_root):
    """A kernel named `<!--<script>...` (any name an export holds) is embedded so that the page parses: the data block
    reads back with the name as it was, and the timeline draws its lanes without an error."""
    path = tmp_path / "hostile.sqlite"
    shutil.copyfile(FIXTURES / "nsysai_mock.sqlite", path)
    with sqlite3.connect(path) as con:
        con.execute("UPDATE StringIds SET value = ? WHERE id IN (SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL "
                    "UNION SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL)", [HOSTILE_NAME])
    con.close()
    out, html = _report(tmp_path, cache_root, str(path))
    (data,) = _embedded(html)
    assert HOSTILE_NAME in json.dumps(data) and "<!--" not in html.split('id="timeline-0">')[1].split("</script>")[0]
    after = _drawn(out)
    raw = raw_lanes(path, data["scope"]["start_ns"], data["scope"]["end_ns"])
    assert sorted((int(d), lane) for d, lane in LANE.findall(after)) == sorted(k for k, v in raw.items() if v) != []


def test_report_diff_of_a_synth_pair_shows_both_sides_and_the_verdict(synth_pair, tmp_path, cache_root):
    assert "removed_sync" in SYNTH_PAIRS
    (before, _), (after, _) = synth_pair("removed_sync")
    out, html = _report(tmp_path, cache_root, "--diff", str(before.path), str(after.path))
    sides = _embedded(html)
    drawn = _drawn(out)
    assert len(sides) == 2 and drawn.count('class="timeline-root"') == 2
    assert len(LANE.findall(drawn)) == sum(len(side["lanes"]) for side in sides)
    assert re.search(r'<div class="verdict"><b>improved</b> \(-\d', html)  # the planted sync removed: faster


def test_report_needs_one_profile_or_one_pair(tmp_path, capsys):
    assert main(["report", "-o", str(tmp_path / "x.html")]) == 2
    assert capsys.readouterr().err.strip() == (
        "stallhound: error: give one profile, or --diff BEFORE AFTER, not both; e.g. stallhound report run.sqlite "
        "-o report.html")
    assert main(["report", str(FIXTURES / f"{REAL}.sqlite"), "-o", str(tmp_path)]) == 2
    assert "is a folder; name the HTML file to write" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()


# --- the MCP App view in a host ----------------------------------------------------------------------------------
HOST = """<!DOCTYPE html><html><body><pre id="seen"></pre><iframe id="view" style="width:1200px;height:1600px">
</iframe><script>
const frame = document.getElementById("view"), result = %s;
window.addEventListener("message", e => {
  const m = e.data, reply = msg => frame.contentWindow.postMessage({jsonrpc: "2.0", ...msg}, "*");
  if (m.method === "ui/initialize") {
    reply({id: m.id, result: {protocolVersion: "2026-01-26", hostCapabilities: {},
                              hostInfo: {name: "test", version: "1"}, hostContext: {}}});
  } else if (m.method === "ui/notifications/initialized") {
    reply({method: "ui/notifications/tool-result", params: result});
  } else if (m.method === "ui/notifications/size-changed") {
    const doc = frame.contentDocument;
    document.getElementById("seen").textContent = JSON.stringify({
      lanes: doc.querySelectorAll("g.lane").length, gaps: doc.querySelectorAll("rect.gap").length,
      errors: doc.getElementById("errors").textContent});
  }
});
frame.srcdoc = %s;
</script></body></html>"""


@pytest.mark.anyio
async def test_report_view_draws_a_show_timeline_result_in_an_mcp_host(tmp_path, cache_root):
    async with Client(build_server([FIXTURES], cache_dir=cache_root)) as client:
        view = (await client.read_resource("ui://stallhound/timeline.html")).contents[0].text
        result = await client.call_tool("show_timeline", {"profile": str(FIXTURES / f"{IDLE}.sqlite"), "limit": 7})
    assert view == page.timeline_view()
    sent = {"content": [{"type": "text", "text": text_of(result)}], "structuredContent": result.structured_content}
    host = tmp_path / "host.html"
    host.write_text(HOST % (json.dumps(sent).replace("</", "<\\/"), json.dumps(view).replace("</", "<\\/")))
    after, console = dom(host, "--virtual-time-budget=10000")
    assert console == []
    seen = json.loads(re.search(r'<pre id="seen">(.*?)</pre>', after).group(1).replace("&quot;", '"'))
    data = result.structured_content
    assert seen == {"lanes": len(data["lanes"]), "gaps": len(data["gaps"]), "errors": ""}
    raw = raw_lanes(FIXTURES / f"{IDLE}.sqlite", data["scope"]["start_ns"], data["scope"]["end_ns"])
    assert seen["lanes"] == sum(1 for v in raw.values() if v) and seen["gaps"] == 7


def test_report_zoom_in_redraws_the_middle_half_from_the_embedded_data(demo_report, tmp_path):
    out, html, _, _ = demo_report
    (data,) = _embedded(html)
    clicked = tmp_path / "zoomed.html"  # the report as written, plus one click on its first "zoom in" button
    clicked.write_text(html.replace("</body>", '<script>document.querySelector(".zoombar button").click();'
                                               "</script></body>"))
    after = _drawn(clicked)
    s = data["scope"]
    lo, hi = s["start_ns"] + s["duration_ns"] / 4, s["start_ns"] + 3 * s["duration_ns"] / 4
    assert re.search(r"window ([\d.]+) ms to ([\d.]+) ms", after).groups() == (
        f"{s['duration_ns'] / 4e6:.3f}", f"{3 * s['duration_ns'] / 4e6:.3f}")
    visible = [g for g in data["gaps"] if g["end_ns"] > lo and g["start_ns"] < hi]
    assert after.count('class="gap"') == len(visible) < len(data["gaps"])
    assert len(LANE.findall(after)) == len(data["lanes"])


def test_report_of_an_export_without_events_is_one_sentence_and_writes_nothing(tmp_path, capsys, cache_root):
    out = tmp_path / "empty.html"
    argv = ["report", str(FIXTURES / "dynamicvit_empty_export.sqlite"), "-o", str(out), "--cache-dir", str(cache_root)]
    assert main(argv) == 2
    assert capsys.readouterr().err == ("stallhound: error: this profile has no timed events at all, so there is no "
                                       "window to analyse; re-capture with `nsys profile --trace=cuda,nvtx`\n")
    assert not out.exists()
