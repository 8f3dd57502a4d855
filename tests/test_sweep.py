"""Sweeps end to end on the real test hosts, plus the pure parts (sweep files, reports).

Through OpenSSH's sshd on 127.0.0.1 (process manager): the rtx6000 CUDA-graph sweep gives
its table and its Markdown/HTML report (with the probe-metric plot), a second identical
sweep is served from the cache, and a sweep whose `orchestrator sweep` process is
SIGKILLed twice mid-run (resumed once with `--resume ID`, once with the same command)
records every (config, repeat) exactly once. On a pool of two booted systemd containers
(each with its own network namespace, so both servers use port 30000) the same sweep runs
on both hosts at once: the recorded run intervals overlap and each run is recorded once.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import ConfigError, UsageError
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.store import CampaignRow, RunRow, Store
from orchestrator.sweep import load_sweep, parse_until
from orchestrator.sweep_report import html_page, markdown, svg_plot
from orchestrator.verdicts import Verdict
from tests.campaign_lab import (
    LAB,
    LAB_UNIT,
    UNIT_DIR,
    cli,
    lab_servers,
    popen_cli,
    sshd_hosts_file,
    stop_child,
)
from tests.hosts.systemd import SystemdHost, SystemdHostFactory
from tests.hosts.wait import wait_until

PERF_GOOD = LAB / "rtx6000" / "perf_good.yaml"
UNIT = "lab-rtx6000.service"
#: a shorter probe than the shipped one (same tool, same metric): the tests pay for it per run
PROBE = ("python3 -m orchestrator.lab.bench --port {port} --num-prompts 24 "
         "--random-output-len 32")  # fmt: skip
MATRIX = {"cuda-graph-max-bs": [128, 256, 512], "mem-fraction-static": [0.85, 0.92]}


def write_sweep(tmp: Path, *, port: int | None = None, matrix: dict | None = None,
                repeat: int = 1, name: str = "rtx6000-cuda-graph") -> Path:  # fmt: skip
    """A sweep over the shipped rtx6000 perf config, on `port` (None: the config's 30000)."""
    tmp.mkdir(parents=True, exist_ok=True)
    base: dict = {"name": "test-rtx6000-perf", "extends": str(PERF_GOOD),
                  "probe": {"run": PROBE}}  # fmt: skip
    if port is not None:
        base["service"] = {"flags": {"port": port}}
    (tmp / "base.yaml").write_text(yaml.safe_dump(base, sort_keys=False))
    sweep = {"name": name, "base": "base.yaml", "matrix": matrix or MATRIX, "repeat": repeat}
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def sweep_runs(results: Path) -> tuple[str, list[RunRow]]:
    """The one sweep campaign in `results` and its runs (a fresh connection)."""
    store = Store(results)
    try:
        [camp] = [c for c in store.campaigns() if c.kind == "sweep"]
        return camp.id, store.runs(camp.id)
    finally:
        store.close()


def recorded_once(runs: list[RunRow], expected: int) -> Counter:
    """Each (config, repeat) has exactly one verdict (infra attempts aside)."""
    keys = Counter((r.variant, r.purpose) for r in runs if r.verdict is not Verdict.INFRA)
    assert len(keys) == expected, keys
    assert set(keys.values()) == {1}, f"repeated runs: {keys}"
    return keys


def metrics_by_bs(rows: list[dict]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for r in rows:
        bs = int(re.search(r"cuda-graph-max-bs=(\d+)", r["config"])[1])  # type: ignore[index]
        out.setdefault(bs, []).append(r["metric"])
    return out


# ---- pure parts ---------------------------------------------------------------------------


def test_matrix_expands_over_the_base(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path, repeat=2))
    assert sweep.repeat == 2 and sweep.axes == ["cuda-graph-max-bs", "mem-fraction-static"]
    labels = [it.label for it in sweep.items]
    assert labels[0] == "cuda-graph-max-bs=128 mem-fraction-static=0.85"
    assert len(labels) == 6 and len(set(labels)) == 6
    big = next(it for it in sweep.items if it.label.startswith("cuda-graph-max-bs=512"))
    assert "--cuda-graph-max-bs" in big.exp.argv() and "512" in big.exp.argv()
    assert len({it.exp.fingerprint() for it in sweep.items}) == 6


@pytest.mark.parametrize("body, key", [
    ({"matrix": {"tp-size": [4, 8]}}, "base"),
    ({"base": "base.yaml", "matrix": {"tp-size": []}}, "matrix.tp-size"),
    ({"base": "base.yaml", "matrix": {"tp-size": [8, 8]}}, None),
    ({"base": "base.yaml", "matrix": {}, "repeats": 2}, "repeats"),
    ({}, None),
])  # fmt: skip
def test_sweep_file_errors(tmp_path: Path, body: dict, key: str | None) -> None:
    write_sweep(tmp_path)
    path = tmp_path / "bad-sweep.yaml"
    path.write_text(yaml.safe_dump(body))
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    text = str(err.value) + " " + str(getattr(err.value, "key", ""))
    assert str(path) in str(err.value) or getattr(err.value, "file", None) == str(path)
    if key:
        assert key in text


def test_until_is_the_next_such_time_of_day() -> None:
    now = dt.datetime(2026, 3, 2, 23, 30)
    assert parse_until("07:00", now) == 7.5 * 3600
    assert parse_until("23:45", now) == 15 * 60
    assert parse_until("23:30", now) == 24 * 3600  # now is not "until now": tomorrow
    for bad in ("7", "24:00", "07:60", "7am"):
        with pytest.raises(UsageError):
            parse_until(bad, now)


def test_report_of_a_list_sweep_with_a_removed_host() -> None:
    """No swept axis: no plot; runs without a verdict say so; a removed host is named."""
    row = {"config": "other-config", "repeat": 0, "run": None, "verdict": None,
           "signature": None, "metric": None, "duration": None}  # fmt: skip
    camp = CampaignRow(
        id="c0ffee", kind="sweep", key="k", created=0.0, updated=0.0, status="incomplete",
        command="orchestrator sweep s.yaml", target=None,
        spec={"name": "s", "sweep": "s.yaml", "hosts": ["gpu1", "gpu2"], "axes": [],
              "items": [{"label": "other-config", "values": [], "config": {}}]},
        answer={"rows": [row], "removed_hosts": [["gpu2", "2 runs in a row failed"]]},
    )  # fmt: skip
    assert svg_plot(camp) == ""
    md = markdown(camp)
    assert "| other-config | 1 | not run |" in md
    assert "host gpu2 was taken out of the pool: 2 runs in a row failed" in md
    page = html_page(camp)
    assert "<svg" not in page and "not run" in page and "<b>gpu2</b> was taken out" in page


# ---- over the real sshd ------------------------------------------------------------------


def test_sweep_table_and_report_over_sshd(sshd: SshdEndpoint, tmp_path: Path) -> None:
    port = free_port()
    path = write_sweep(tmp_path, port=port)
    hosts = sshd_hosts_file(sshd, tmp_path)
    results = tmp_path / "results"
    res = cli("sweep", path, "--host", "lab", "--hosts", hosts, "--results", results,
              timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # the table: every config with its verdict, metric and run
    cid, runs = sweep_runs(results)
    assert len(runs) == 6 and all(r.verdict is Verdict.PASS for r in runs)
    assert all(r.probe_metric and r.probe_metric > 1000 for r in runs)
    lines = res.stdout.splitlines()
    for r in runs:
        [line] = [ln for ln in lines if r.id in ln and "│" in ln]
        assert r.label in line and "pass" in line and f"{r.probe_metric:g}" in line
    assert "runs: 6 executed, 0 reused from the cache" in res.stdout
    # the reports: Markdown table; HTML with the plot (one line per memory fraction) and rows
    md = results / "reports" / f"{cid}.md"
    page = results / "reports" / f"{cid}.html"
    assert f"report: {md}" in res.stdout and f"report: {page}" in res.stdout
    md_rows = [ln for ln in md.read_text().splitlines() if ln.startswith("| cuda-graph")]
    assert len(md_rows) == 6 and all("| pass |" in ln for ln in md_rows)
    text = page.read_text()
    svg = re.search(r"<svg id=plot.*?</svg>", text, re.S)
    assert svg, "no plot in the HTML report"
    assert svg[0].count("<polyline") == 2  # mem-fraction-static=0.85 and =0.92
    assert svg[0].count("<circle") == 6
    for x in ("128", "256", "512"):
        assert f">{x}</text>" in svg[0]
    assert "mem-fraction-static=0.85" in svg[0] and "mem-fraction-static=0.92" in svg[0]
    table = text[text.index("<table id=results>") :]
    assert table.count("<tr><td>cuda-graph-max-bs=") == 6
    # the lab's cost of --cuda-graph-max-bs 512: about 10% of the throughput
    store = Store(results)
    try:
        rows = store.campaign(cid).answer["rows"]
    finally:
        store.close()
    by_bs = metrics_by_bs(rows)
    assert max(by_bs[512]) < 0.95 * min(by_bs[128])
    assert lab_servers(port) == []
    # The same sweep again: every config is reused from the cache, nothing runs.
    again = cli("sweep", path, "--host", "lab", "--hosts", hosts, "--results", results, "--json",
                timeout=120)  # fmt: skip
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    out = json.loads(again.stdout)
    assert out["campaign"] != cid and out["executed"] == 0 and out["reused"] == 6
    assert {r["verdict"] for r in out["rows"]} == {"pass"}


def _running_run(results: Path, port: int, n_recorded: int) -> bool:
    """`n_recorded` runs are in the store and the next one's server is up on `port`."""
    try:
        _, runs = sweep_runs(results)
    except Exception:  # noqa: BLE001 - the store or the campaign may not exist yet
        return False
    return len(runs) >= n_recorded and bool(lab_servers(port))


def test_sweep_survives_sigkill_and_resumes_over_sshd(sshd: SshdEndpoint,
                                                       tmp_path: Path) -> None:  # fmt: skip
    port = free_port()
    path = write_sweep(tmp_path, port=port, matrix={"cuda-graph-max-bs": [128, 512]}, repeat=2)
    hosts = sshd_hosts_file(sshd, tmp_path)
    results = tmp_path / "results"
    first = ["sweep", path, "--host", "lab", "--hosts", hosts, "--results", results]
    child = popen_cli(*first, log=tmp_path / "first.log")
    try:
        wait_until(lambda: _running_run(results, port, 1), timeout=120,
                   what="a run recorded and the second one's server up",
                   describe=lambda: (tmp_path / "first.log").read_text()[-2000:])  # fmt: skip
    finally:
        stop_child(child)  # SIGKILL: no restore, no status update, the server is left running
    cid, runs = sweep_runs(results)
    assert lab_servers(port), "the killed sweep's server should still be running"
    killed_at = len(runs)
    # 1. resume by id; kill again mid-run
    child = popen_cli("sweep", "--resume", cid, "--hosts", hosts, "--results", results,
                      log=tmp_path / "second.log")  # fmt: skip
    try:
        wait_until(lambda: _running_run(results, port, killed_at + 1), timeout=120,
                   what="one more run recorded and the next one's server up",
                   describe=lambda: (tmp_path / "second.log").read_text()[-2000:])  # fmt: skip
    finally:
        stop_child(child)
    _, runs = sweep_runs(results)
    before_last = len(runs)
    # 2. the same command as the first time finds the interrupted campaign and finishes it
    res = cli(*first, "--json", timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["campaign"] == cid and out["status"] == "done"
    cid2, runs = sweep_runs(results)
    assert cid2 == cid
    # no repeated and no lost run: 2 configs x 2 repeats, each recorded exactly once
    keys = recorded_once(runs, 4)
    assert {p for _, p in keys} == {"sweep/0", "sweep/1"}
    assert len(runs) == 4 and all(r.cached_from is None for r in runs)
    assert [r.seq for r in runs] == list(range(1, 5))
    assert out["executed"] == 4 - before_last
    assert [r["run"] for r in out["rows"]] == [r.id for r in sorted(
        runs, key=lambda r: (int(r.purpose.split("/")[1]), r.variant))]  # fmt: skip
    assert all(r["verdict"] == "pass" for r in out["rows"])
    assert all(Path(p).is_file() for p in out["reports"])
    assert lab_servers(port) == []  # the last process restored the host


# ---- a pool of two systemd hosts ----------------------------------------------------------


@pytest.fixture(scope="module")
def duo(systemd_hosts: SystemdHostFactory) -> Iterator[list[SystemdHost]]:
    """Two booted containers with the lab's unit installed (each in its own netns)."""
    boxes = [systemd_hosts.boot(), systemd_hosts.boot()]
    try:
        for box in boxes:
            box.install_unit(UNIT, LAB_UNIT)
        yield boxes
    finally:
        for box in boxes:
            systemd_hosts.stop(box)


def pool_hosts_file(boxes: list[SystemdHost], tmp: Path) -> Path:
    hosts = {f"gpu{i + 1}": box.hosts_entry(env={"PYTHONPATH": "/opt/orchestrator"},
                                           labels=["rtx6000"])
             for i, box in enumerate(boxes)}  # fmt: skip
    path = tmp / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": hosts, "pools": {"duo": list(hosts)}},
                                   sort_keys=False))  # fmt: skip
    return path


def check_restored(box: SystemdHost) -> None:
    """No drop-in left, the unit stopped with its own ExecStart."""
    assert box.ssh_run(f"test -e {UNIT_DIR}/{UNIT}.d/99-orchestrator.conf").returncode != 0
    show = box.ssh_run(f"systemctl show {UNIT} -p ActiveState -p ExecStart", check=True).stdout
    assert "ActiveState=inactive" in show and "/bin/sleep" in show, show


def overlapping(a: list[RunRow], b: list[RunRow]) -> list[tuple[str, str]]:
    """Pairs of runs (one per list) whose [start, end] intervals intersect."""
    return [
        (x.id, y.id)
        for x in a
        for y in b
        if x.started < y.started + y.duration and y.started < x.started + x.duration
    ]


def test_sweep_on_a_pool_of_two_systemd_hosts(duo: list[SystemdHost], tmp_path: Path) -> None:
    path = write_sweep(tmp_path)  # both servers on port 30000, each in its own namespace
    hosts = pool_hosts_file(duo, tmp_path)
    results = tmp_path / "results"
    t0 = time.monotonic()
    res = cli("sweep", path, "--pool", "duo", "--hosts", hosts, "--results", results, "--json",
              timeout=300)  # fmt: skip
    wall = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads(res.stdout)
    cid, runs = sweep_runs(results)
    assert out["campaign"] == cid and out["status"] == "done" and out["executed"] == 6
    recorded_once(runs, 6)
    assert len(runs) == 6 and all(r.verdict is Verdict.PASS for r in runs)
    by_host = {h: [r for r in runs if r.host == h] for h in ("gpu1", "gpu2")}
    assert all(by_host.values()), {h: len(rs) for h, rs in by_host.items()}  # both used
    pairs = overlapping(by_host["gpu1"], by_host["gpu2"])
    assert len(pairs) >= 2, [(r.id, r.host, r.started, r.duration) for r in runs]
    busy = sum(r.duration for r in runs)
    assert wall < 0.75 * busy + 3, (wall, busy)
    store = Store(results)
    try:
        assert store.campaign(cid).spec["hosts"] == ["gpu1", "gpu2"]
    finally:
        store.close()
    for box in duo:
        check_restored(box)
