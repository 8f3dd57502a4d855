"""The HTML report of a real b300 bisection, opened in a real headless browser.

Debian's chromium loads the report from a file:// URL (no server), with networking off.
`--dump-dom` gives the document as the browser built it: the answer names both flags of
the interacting set and the step table has one row per recorded run. `--screenshot`
shows it painted: the narrowing matrix's cells appear in the verdict colours.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.reports.report import COLORS, write_reports
from orchestrator.store.store import Store
from tests.hosts.prereq import unavailable
from tests.support.campaign_lab import recorded_b300

CHROMIUM = Path("/usr/bin/chromium")


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless chromium with everything that could reach out or linger turned off."""
    if not CHROMIUM.exists():
        unavailable(
            "Debian's chromium is not installed (/usr/bin/chromium; run scripts/bootstrap as root)"
        )
    profile = tmp / "chromium-profile"
    profile.mkdir(exist_ok=True)
    res = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res


class Dom(HTMLParser):
    """The parts of the dumped DOM the test reads: text under #answer, rows of #steps."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, str | None]] = []
        self.answer_text: list[str] = []
        self.step_rows: list[list[str]] = []
        self.header: list[str] = []
        self.external: list[str] = []
        self.ids: list[str] = []

    def _inside(self, ident: str) -> bool:
        return any(i == ident for _, i in self.stack)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.append(str(a["id"]))
        for key in ("src", "href"):
            if a.get(key):
                self.external.append(f"{tag} {key}={a[key]}")
        if tag in ("br", "meta", "link", "img", "input", "hr"):  # void elements
            return
        self.stack.append((tag, a.get("id")))
        if tag == "tr" and self._inside("steps"):
            self.step_rows.append([])

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._inside("answer"):
            self.answer_text.append(data)
        if self._inside("steps") and self.step_rows and self.stack[-1][0] in ("td", "code"):
            self.step_rows[-1].append(data.strip())
        if self._inside("steps") and self.stack and self.stack[-1][0] == "th":
            self.header.append(data.strip())


def png_pixels(path: Path) -> tuple[int, int, set[tuple[int, int, int]]]:
    """Width, height and the set of colours of an 8-bit RGB(A) PNG (stdlib only)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    colors: set[tuple[int, int, int]] = set()
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 0xFF
        for x in range(0, stride, bpp):
            colors.add((line[x], line[x + 1], line[x + 2]))
        prev = line
    return width, height, colors


def rgb(hex_color: str) -> tuple[int, int, int]:
    h = hex_color.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


@pytest.fixture
def report(
    sshd: SshdEndpoint, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, int]:
    """A fresh HTML report of a recorded b300 bisection, and its number of runs."""
    rec = recorded_b300(sshd, tmp_path_factory.getbasetemp())
    assert rec.exit_code == 0, rec.outcome
    results = rec.copy_results(tmp_path / "results")
    store = Store(results)
    try:
        paths = write_reports(store, rec.campaign)
        n_runs = len(store.runs(rec.campaign))
    finally:
        store.close()
    [html] = [p for p in paths if p.suffix == ".html"]
    # Self-contained: opened from anywhere, beside nothing.
    alone = tmp_path / "alone" / html.name
    alone.parent.mkdir()
    shutil.copy(html, alone)
    return alone, n_runs


def test_report_dom_shows_the_answer_and_one_step_row_per_run(
    report: tuple[Path, int], tmp_path: Path
) -> None:
    html, n_runs = report
    res = chromium(tmp_path, "--dump-dom", html.as_uri())
    dom = Dom()
    dom.feed(res.stdout)
    assert "answer" in dom.ids and "steps" in dom.ids, res.stdout[:2000]
    answer = " ".join(" ".join(dom.answer_text).split())
    assert "--ep-size 8" in answer and "--enable-nccl-nvls" in answer, answer
    assert "interacting set" in answer
    assert "CUBLAS_STATUS_EXECUTION_FAILED" in answer  # the target failure
    assert "AttributeError" in answer  # the separate finding
    assert "--max-running-requests 128 -> 256" in answer  # cleared
    rows = [r for r in dom.step_rows if r]  # the header row has th cells only
    assert len(rows) == n_runs, dom.step_rows
    assert dom.header[:4] == ["run", "variant", "purpose", "verdict"]
    assert [r[1] for r in rows[:2]] == ["good", "bad"]  # the endpoints first
    assert {r[3] for r in rows} >= {"pass", "fail", "other"}
    assert dom.external == []  # no stylesheet, script or image to fetch


def test_report_screenshot_paints_the_narrowing_matrix(
    report: tuple[Path, int], tmp_path: Path
) -> None:
    html, _ = report
    shot = tmp_path / "report.png"
    chromium(
        tmp_path,
        f"--screenshot={shot}",
        "--window-size=1200,1600",
        "--hide-scrollbars",
        html.as_uri(),
    )
    width, height, colors = png_pixels(shot)
    assert (width, height) == (1200, 1600)
    assert len(colors) > 20  # text, borders, fills: not a blank page
    for verdict in ("pass", "fail", "other"):
        assert rgb(COLORS[verdict]) in colors, f"no {verdict} cell painted"
