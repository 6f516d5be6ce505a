"""The bisect's HTML report as a browser draws it: headless Chromium lays the page out, a script measures what it drew
(the weight table, the per-token chart on its log axis with the tolerance line inside it, a sparkline per probe),
and a screenshot is taken. What is checked is what a person would see, not the file's text.

Needs chromium (scripts/setup.sh installs Debian's) and the mla-bisect binary (MLA_BINARY)."""
import json
import os
import re
import shutil
import subprocess

import pytest

BINARY = os.environ.get("MLA_BINARY", "")

# Appended to a copy of the report: the boxes the browser laid out, written into the page as JSON.
MEASURE = """<script>
(function () {
  function box(el) { if (!el) return null; var r = el.getBoundingClientRect();
                     return {x: r.x, y: r.y, w: r.width, h: r.height}; }
  var out = {};
  var wt = document.querySelector('table.weights');
  out.weights = wt ? {box: box(wt), rows: wt.querySelectorAll('tr').length - 1,
                      names: Array.from(wt.querySelectorAll('tr')).slice(1).map(function (r) {
                        return r.cells.length > 1 ? r.cells[1].textContent.trim() : ''; })} : null;
  var chart = document.querySelector('svg.token-chart');
  if (chart) {
    var tol = chart.querySelector('line.tolerance');
    out.chart = {box: box(chart), scale: chart.getAttribute('data-y-scale'), tolerance: box(tol),
                 bars: chart.querySelectorAll('rect').length,
                 decades: chart.querySelectorAll('line.decade').length};
  }
  out.sparks = Array.from(document.querySelectorAll('svg.spark')).map(box);
  var pre = document.createElement('pre');
  pre.id = 'mla-measured';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("could not find chromium (scripts/setup.sh installs it: apt-get install chromium)")


def browser(*args, timeout=120):
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--hide-scrollbars", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if not BINARY or not os.path.exists(BINARY):
        pytest.skip("MLA_BINARY does not name the mla-bisect binary")
    d = tmp_path_factory.mktemp("html")
    html = d / "bisect.html"
    # A weight bug: the weight table lists the weights, the first divergent probe has a per-token profile.
    r = subprocess.run([BINARY, "bisect", "--model", "tiny", "--tokens", "16", "--weight-format", "nvfp4",
                        "--inject", "nvfp4-nibble-swap", "--workdir", str(d / "wd"), "--html", str(html), "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert html.exists()
    return d, html


def test_the_browser_draws_the_weight_table_the_log_chart_and_the_sparklines(report):
    d, html = report
    page = html.read_text()
    measured = d / "measured.html"
    measured.write_text(page.replace("</body>", MEASURE + "</body>") if "</body>" in page else page + MEASURE)
    r = browser("--virtual-time-budget=2000", "--dump-dom", measured.as_uri())
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r"<pre id=\"mla-measured\">(.*?)</pre>", r.stdout, re.S)
    assert m, "the measuring script did not run: " + r.stdout[-500:]
    got = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                     .replace("&gt;", ">"))

    # The weight table: drawn, one row per weight of tiny's layer, the planted bug's weights among them.
    w = got["weights"]
    assert w, "no weight table in the page"
    # Laid out, not collapsed: each row at least a line of the page's 10 px text high, the table wider than its names.
    assert w["box"]["w"] > 200 and w["box"]["h"] > 10 * w["rows"], w["box"]
    assert w["rows"] >= 5, w
    for name in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
        assert name in w["names"], (name, w["names"])

    # The per-token chart: on a log axis with its decade lines, a bar per token, the tolerance line drawn inside it.
    c = got.get("chart")
    assert c, "no per-token chart in the page"
    assert c["scale"] == "log"
    assert c["bars"] >= 16 and c["decades"] >= 2, c
    box, tol = c["box"], c["tolerance"]
    assert box["w"] > 300 and box["h"] > 100, box  # the SVG asks for at least 450 x 180 (bisect_html.cpp)
    assert tol is not None, "no tolerance line"
    assert box["y"] < tol["y"] < box["y"] + box["h"], (box, tol)  # inside the chart, not on an edge
    assert tol["w"] > 0.8 * (box["w"] - 60), (box, tol)             # across the plot (its left 50 px are the axis)

    # A sparkline per probe, each drawn with a size.
    assert len(got["sparks"]) >= 10, got["sparks"]
    assert all(s["w"] > 20 and s["h"] > 5 for s in got["sparks"]), got["sparks"]


def test_a_screenshot_of_the_report_is_not_blank(report):
    d, html = report
    png = d / "bisect.png"
    r = browser("--window-size=1280,2400", "--screenshot=" + str(png), html.as_uri())
    assert r.returncode == 0 and png.exists(), r.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    # A blank page of this size compresses to a few kB; the report's tables, charts and colours do not.
    assert len(data) > 30_000, len(data)
