"""DIR/reports/report.html: the renderer (well-formed, offline, a section per data present, the same numbers as the
JSON) and the page in a real browser (Debian's chromium driven by Playwright, headless): no console error, no
network request, the key elements, screenshots at desktop and phone widths."""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from paths import ROOT
from softsyn.cli import main, run
from reports.html import HTML_FILE, Page, load_page, render_html


def parse(html: str) -> ET.Element:
    """The page as XML: the renderer writes well-formed markup (a parse error is a malformed page)."""
    assert html.startswith("<!DOCTYPE html>\n")
    return ET.fromstring(html.split("\n", 1)[1])


def sections(root: ET.Element) -> dict[str, ET.Element]:
    return {s.get("id"): s for s in root.iter("section")}


def si_values(root: ET.Element, caption_start: str, key: str) -> list[float]:
    """The data-si values of column `key` in the table whose caption starts with caption_start."""
    for table in root.iter("table"):
        caption = table.find("caption")
        if caption is not None and (caption.text or "").startswith(caption_start):
            return [float(td.get("data-si")) for td in table.iter("td") if td.get("data-key") == key and td.get("data-si")]
    raise AssertionError(f"no table captioned {caption_start!r}")


@pytest.fixture(scope="module")
def compiled(tiny_cpu_artifact, tmp_path_factory):
    """A copy of the compiled qwen3-tiny (the shared artifact stays as it was)."""
    out = tmp_path_factory.mktemp("html") / "compiled"
    shutil.copytree(tiny_cpu_artifact, out)
    return out


@pytest.fixture(scope="module")
def signed(tiny_cpu_artifact, tmp_path_factory):
    """A copy signed off on the CPU with the quickest options (one timed and one profiled run per group: ~3 s)."""
    out = tmp_path_factory.mktemp("html") / "signed"
    shutil.copytree(tiny_cpu_artifact, out)
    result = CliRunner().invoke(main, ["signoff", str(out), "--provider", "cpu", "--runs", "1", "--warmup", "0",
                                       "--profile-runs", "1", "-q"])
    assert result.exit_code in (0, 1), result.output + repr(result.exception)  # 1: a measured group violated
    return out


# ------------------------------------------------------------------------------------------ the renderer

def test_compile_page_is_well_formed_offline_and_has_each_section(compiled):
    html = (compiled / HTML_FILE).read_text()
    assert "http://" not in html and "https://" not in html and "<script" not in html and "<img" not in html
    root = parse(html)
    found = sections(root)
    analysis = json.loads((compiled / "analysis.json").read_text())
    groups = [g["name"] for g in analysis["groups"]]
    assert [s.get("data-group") for s in root.iter("section") if s.get("class") == "group"] == groups
    assert {"precision", "vram", "compile-log", "fusion", "suggestions"} <= set(found) and "signoff" not in found
    for name in groups:  # a waterfall per group, folded layers expandable (<details>) to their cells
        wf = next(d for d in found[f"group-{name}"].iter("div") if "waterfall" in (d.get("class") or ""))
        folds = [d for d in wf.iter("details")]
        assert folds and all(d.find("summary") is not None and d.find("div") is not None for d in folds)
        layers = [d.find("summary").find("span").text for d in folds if d.get("class") == "layer"]
        assert len(layers) == 2 and all(name.startswith(f"model.layers.{i} (") for i, name in enumerate(layers))
        marks = {s.text for s in wf.iter("span") if s.get("class") == "mark" and s.text}
        assert marks & {"(table)", "(est)", "measured"}
    grid = next(t for t in found["precision"].iter("table") if "pmap" in t.get("class"))
    assert [th.get("title") for th in grid.find("thead").iter("th")][1:] == [
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj"]
    assert [th.text for th in grid.find("thead").iter("th")][1:4] == ["q_proj", "k_proj", "v_proj"]
    assert all(td.text == "fp32" for td in grid.find("tbody").iter("td"))  # a cpu-ort compile stays fp32
    assert len(list(found["compile-log"].iter("polyline"))) == 2  # WNS and TNS


def test_page_numbers_are_the_json_reports(compiled):
    """The tables behind the charts carry the JSON's SI values (data-si), row for row."""
    root = parse((compiled / HTML_FILE).read_text())
    analysis = json.loads((compiled / "analysis.json").read_text())
    assert si_values(root, "verdict", "slack") == [g["paths"][0]["slack"] for g in analysis["groups"]]
    assert si_values(root, "verdict", "arrival") == [g["paths"][0]["arrival"] for g in analysis["groups"]]
    area = analysis["area"]
    assert si_values(root, f"{analysis['design']}: VRAM by kind", "bytes")[:len(area["by_kind"]) + 2] == [
        k["bytes"] for k in area["by_kind"]] + [area["total"], area["limit"]]
    fusion = json.loads((compiled / "reports" / "fusion.json").read_text())
    assert si_values(root, "fusion coverage by kind", "fused") == [r["fused"] for r in fusion["kinds"]["rows"]]
    misses = [td.text for td in root.iter("td") if td.get("data-key") == "reason"]
    assert misses == [r["reason"] for r in fusion["misses"]["rows"]] and misses  # every miss with its reason
    log = json.loads((compiled / "compile_log.json").read_text())
    assert si_values(root, "compile log", "wns") == [r["wns"] for r in log["rows"]]
    assert [td.text for td in sections(root)["compile-log"].iter("td") if td.get("data-key") == "phase"] == [
        r["phase"] for r in log["rows"]]


def test_signoff_section_has_the_measured_figures(signed):
    root = parse((signed / HTML_FILE).read_text())
    found = sections(root)
    data = json.loads((signed / "signoff" / "signoff.json").read_text())
    assert si_values(root, "sign-off per path group", "measured") == [g["measured_median"] for g in data["groups"]]
    assert si_values(root, "sign-off per path group", "predicted") == [g["predicted"] for g in data["groups"]]
    figures = [f for f in found["signoff"].iter("figure") if f.get("class") != "signoff-slack"]
    assert len(figures) == 1 + len(data["groups"])  # per group, then per cell of each group
    slack = [f for f in found["signoff"].iter("figure") if f.get("class") == "signoff-slack"]
    assert [f.get("data-group") for f in slack] == [g["name"] for g in data["groups"]]  # each on its own axis
    assert all(list(f.iter("circle")) and list(f.iter("line")) for f in figures)  # points and error bands


def test_engineering_views_hold_the_analysis_and_library_figures(compiled):
    """Time per op type sums the critical path's cells; the roofline's ceilings are the library's; the slack
    histogram counts every timed path; before/after is the compile log's first and last row."""
    from softsyn.library import load_library

    root = parse((compiled / HTML_FILE).read_text())
    found = sections(root)
    assert {"op-time", "roofline", "slack-histogram", "before-after"} <= set(found) and "timeline" not in found
    analysis = json.loads((compiled / "analysis.json").read_text())
    for g in analysis["groups"]:
        points = g["paths"][0]["points"]
        times = si_values(root, f"{g['name']}: time per op type", "time")
        assert sum(times) == pytest.approx(sum(p["incr"] for p in points))
        assert times == sorted(times, reverse=True)
        positive = [v for v in times if v > 0]
        view = next(d for d in found["op-time"].iter("div") if d.get("data-group") == g["name"])
        caption = "".join(next(view.iter("figcaption")).itertext())
        assert ("(log axis)" in caption) == (max(positive) / min(positive) > 100)  # orders of magnitude: log
        assert sum(si_values(root, f"{g['name']}: timed paths per slack bin", "paths")) == len(g["paths"])
    ceilings = load_library(analysis["library"]).ceilings
    assert si_values(root, "ceilings of", "value") == [ceilings.memory_bandwidth] + [
        v for v in ceilings.peak_flops.values() if v]
    assert any("estimates" in (c.text or "") for c in found["roofline"].iter("figcaption"))
    log = json.loads((compiled / "compile_log.json").read_text())
    assert si_values(root, "before (as read)", "wns") == [log["rows"][0]["wns"], log["rows"][-1]["wns"]]
    # the waterfall starts at the first cell: the input delay is drawn apart, on its own row
    wf = next(d for d in found[f"group-{analysis['groups'][0]['name']}"].iter("div") if "waterfall" in (d.get("class") or ""))
    first = next(r for r in wf.iter("div") if r.get("class") == "row")
    assert "input external delay" in "".join(first.itertext()) and "drawn apart" in "".join(first.itertext())


def test_kernel_timeline_is_the_profile_or_says_not_measured(signed):
    page = load_page(signed)
    root = parse(render_html(page))
    assert "timeline" in sections(root)
    measured = {g.name: sum(c.measured for c in g.cells if c.match in ("exact", "fused-anchor")) for g in page.signoff.groups}
    for g in page.signoff.groups:
        starts = si_values(root, f"{g.name}: kernels in the path's order", "start")
        kernels = si_values(root, f"{g.name}: kernels in the path's order", "measured")
        assert starts == sorted(starts) and sum(kernels) <= measured[g.name] + 1e-12  # the profile's own times
    blank = copy.deepcopy(page.signoff)
    for g in blank.groups:
        for c in g.cells:
            c.measured = 0.0
    text = "".join(sections(parse(render_html(Page(page.analysis, signoff=blank))))["timeline"].itertext())
    assert text.count("not measured") == len(blank.groups) and "profiled kernels" not in text


def test_sections_follow_the_data_present(compiled):
    """An analyze output (no compile log, fusion, netlist) renders without those sections; a violated group
    brings its suggestion; an area with a per-device list gets one bar per device."""
    full = load_page(compiled)
    analysis = copy.deepcopy(full.analysis)
    path = analysis.groups[-1].critical
    path.slack, path.required = -2e-3, path.arrival - 2e-3
    analysis.area.devices = [copy.deepcopy(analysis.area), copy.deepcopy(analysis.area)]
    root = parse(render_html(Page(analysis)))
    found = sections(root)
    assert not {"compile-log", "fusion", "signoff"} & set(found)
    log = dict(full.compile_log, moves=[{"step": "precision", "move": "q_proj int8", "wns": -1e-4}])  # a compile loop's
    moved = sections(parse(render_html(Page(analysis, compile_log=log))))["compile-log"]
    assert [c.text for c in moved.iter("caption")][-1] == "accepted moves"
    assert "q_proj int8" in [td.text for td in moved.iter("td")]
    assert "precision" in found  # from the cells on the timed paths
    assert len([d for d in found["vram"].iter("div") if d.get("class") == "vram-device"]) == 2
    verdicts = {d.get("data-group"): "".join(d.itertext()) for d in root.iter("div") if d.get("class") == "verdict"}
    assert "VIOLATED" in verdicts[path.group] and "slack -2.000 ms" in verdicts[path.group]
    advice = " ".join(found["suggestions"].itertext())
    assert f"{path.group} misses by 2.000 ms" in advice


def test_waterfall_marks_measured_cells_and_the_map_requested_precisions(compiled):
    """A back-annotated cell reads `measured`; a precision request the compile did not realise is marked per cell."""
    full = load_page(compiled)
    analysis = copy.deepcopy(full.analysis)
    point = analysis.groups[0].critical.points[-1]
    point.source = "annot"
    session = dict(full.session, precision_request={"requested": "int4", "realised": "fp32"})
    root = parse(render_html(Page(analysis, cells=full.cells, session=session)))
    found = sections(root)
    rows = [r for r in found[f"group-{analysis.groups[0].name}"].iter("div") if r.get("class") == "row"]
    last = next(r for r in rows if "".join(r.itertext()).startswith(point.name.split("/")[0]))
    assert "measured" in "".join(last.itertext())
    cells = [td for td in found["precision"].iter("td") if "prec-fp32" in (td.get("class") or "")]
    assert cells and all("differs" in td.get("class") and td.text.endswith("(req int4)") for td in cells)


def test_report_html_re_renders_and_refuses_a_bad_directory(compiled, tmp_path, capsys):
    page = compiled / HTML_FILE
    page.unlink()
    with pytest.raises(SystemExit) as exc:
        run(["report", "html", str(compiled)])
    out, _ = capsys.readouterr()
    assert exc.value.code == 0 and out.strip() == str(compiled / HTML_FILE) and page.is_file()
    manifest = json.loads((compiled / "softsyn-manifest.json").read_text())
    assert manifest["files"][HTML_FILE]["by"] == "report" and manifest["kind"] == "compile"
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exc:
        run(["report", "html", str(tmp_path / "empty")])
    _, err = capsys.readouterr()
    assert exc.value.code == 2 and "not a softsyn output directory" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------ in a browser

def chromium() -> str:
    """Debian's chromium, installed with apt when absent and we are root (CI); else the test is skipped."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium is not installed and installing it needs root and apt-get (apt-get install chromium)")
    start = time.monotonic()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr[-2000:]}"
    print(f"chromium installed in {time.monotonic() - start:.0f} s")
    return shutil.which("chromium")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])  # root in CI: no sandbox there
        yield b
        b.close()


WIDTHS = {"desktop": 1280, "phone": 390}
DOCS_IMG = ROOT / "docs" / "img"
# every table cell whose content is wider than its box, unless a scroll container (overflow-x auto/scroll) holds it
CLIPPED = """() => Array.from(document.querySelectorAll('td, th')).filter(c => {
  if (c.scrollWidth <= c.clientWidth) return false;
  for (let p = c.parentElement; p; p = p.parentElement) {
    const o = getComputedStyle(p).overflowX;
    if (o === 'auto' || o === 'scroll') return false;
  }
  return true;
}).map(c => c.textContent.trim())"""


@pytest.mark.parametrize("which", ["compiled", "signed"])
def test_page_in_chromium(browser, which, request, tmp_path):
    directory = request.getfixturevalue(which)
    url = (directory / HTML_FILE).as_uri()
    for name, width in WIDTHS.items():
        page = browser.new_page(viewport={"width": width, "height": 900})
        requests, errors = [], []
        page.route("**/*", lambda route: (requests.append(route.request.url),
                                          route.continue_() if route.request.url == url else route.abort()))
        page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url, wait_until="load")
        assert requests == [url] and errors == []  # the page alone: no fonts, scripts, images, CDN
        groups = json.loads((directory / "analysis.json").read_text())["groups"]
        assert page.locator("section.group").count() == len(groups)
        assert page.locator(".waterfall").count() == len(groups)
        assert page.locator("#vram svg.lane").count() >= 2 and page.locator("#fusion table").count() >= 2
        assert page.locator("#signoff figure").count() == (1 + 2 * len(groups) if which == "signed" else 0)
        # folded layers open to one row per layer, and a layer to its cells, without script
        fold = page.locator(".waterfall details.fold:has(details.layer)").first
        layer = fold.locator("details.layer").first
        assert not layer.is_visible()
        fold.locator(":scope > summary").click()
        assert layer.is_visible() and not layer.locator(".row.cell").first.is_visible()
        layer.locator(":scope > summary").click()
        assert layer.locator(".row.cell").first.is_visible()
        # nothing wider than the screen: wide tables scroll inside their own box
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")  # every table shown
        assert page.evaluate(CLIPPED) == [], f"clipped table cells at {width} px"
        assert page.locator("#op-time svg.chart, #roofline svg.chart, #slack-histogram svg.chart").count() >= 3
        page.screenshot(path=str(tmp_path / f"{which}-{name}.png"), full_page=True)
        if which == "signed" and os.environ.get("SOFTSYN_UPDATE_DOCS_IMG") == "1":  # the README's pictures
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=str(DOCS_IMG / f"report-{width}.png"), full_page=False)
        page.close()
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(f"{which}-{n}.png" for n in WIDTHS)


def test_clipping_check_finds_a_clipped_cell(browser, tmp_path):
    """The check above fails where a cell's text is cut off outside a scroll container."""
    page_file = tmp_path / "clipped.html"
    page_file.write_text('<!DOCTYPE html><html><body><table style="table-layout: fixed; width: 60px"><tr>'
                         '<td style="overflow: hidden; white-space: nowrap">VIOLATED VIOLATED</td></tr></table>'
                         '<div style="overflow-x: auto; width: 60px"><table><tr><td style="white-space: nowrap">'
                         'scrolls, not clipped</td></tr></table></div></body></html>')
    page = browser.new_page(viewport={"width": 390, "height": 300})
    page.goto(page_file.as_uri())
    assert page.evaluate(CLIPPED) == ["VIOLATED VIOLATED"]
    page.close()
