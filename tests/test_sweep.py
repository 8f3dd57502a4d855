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
from collections import Counter
from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.sweep import parse_until
from orchestrator.cli import main
from orchestrator.config.sweep import load_sweep
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.errors import ConfigError, UsageError
from orchestrator.lab.sdhosts import SystemdHost
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.reports.sweep_report import html_page, markdown, svg_plot
from orchestrator.store.store import CampaignRow, RunRow, Store
from tests.hosts.wait import wait_until
from tests.support.campaign_lab import (
    LAB,
    SETTLE,
    UNIT_DIR,
    cli,
    lab_servers,
    popen_cli,
    sshd_hosts_file,
    stop_child,
)

PERF_GOOD = LAB / "rtx6000" / "perf_good.yaml"
UNIT = "lab-rtx6000.service"
#: the shipped probe's tool and metric, with more tokens: the relative bar (0.95 x the
#: reference) compares configs of equal throughput, and a short benchmark's fixed overhead
#: on a loaded machine would be a noise of the bar's order
PROBE = "python3 -m orchestrator.lab.bench --port {port} --num-prompts 40 --random-output-len 128"
MATRIX = {"cuda-graph-max-bs": [128, 256, 512], "mem-fraction-static": [0.85, 0.92]}


def write_sweep(
    tmp: Path,
    *,
    port: int | None = None,
    matrix: dict | None = None,
    repeat: int = 1,
    name: str = "rtx6000-cuda-graph",
    slow_512: float | None = None,
) -> Path:
    """A sweep over the shipped rtx6000 perf config, on `port` (None: the config's 30000).
    `slow_512`: the server reads a copy of the rtx6000 scenario in which
    --cuda-graph-max-bs 512 costs that factor instead of 0.9, so that a relative bar of
    0.95 judges it by a margin wider than a loaded machine's noise (servers on this
    machine only: the copy lives in `tmp`)."""
    tmp.mkdir(parents=True, exist_ok=True)
    base: dict = {
        "name": "test-rtx6000-perf",
        "extends": str(PERF_GOOD),
        "probe": {"run": PROBE},
        "health": SETTLE,
    }
    service: dict = {}
    if port is not None:
        service["flags"] = {"port": port}
    if slow_512 is not None:
        scenario = yaml.safe_load((LAB / "rtx6000" / "scenario.yaml").read_text())
        [factor] = scenario["throughput"]["factors"]
        factor["multiply"] = slow_512
        (tmp / "scenario.yaml").write_text(yaml.safe_dump(scenario))
        service["exec"] = f"python3 -m orchestrator.lab.server --scenario {tmp / 'scenario.yaml'}"
    if service:
        base["service"] = service
    (tmp / "base.yaml").write_text(yaml.safe_dump(base, sort_keys=False))
    sweep = {"name": name, "base": "base.yaml", "matrix": matrix or MATRIX, "repeat": repeat}
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def judged_by_the_bar(runs: list[RunRow], ref: RunRow) -> None:
    """Each run's verdict is its metric against 0.95 x the reference's: one rule."""
    assert ref.probe_metric
    for r in runs:
        missed = r.probe_metric is not None and r.probe_metric < 0.95 * ref.probe_metric
        assert r.verdict is (Verdict.FAIL if missed else Verdict.PASS), (
            r.label,
            r.probe_metric,
            str(r.signature),
            r.detail,
            r.log_tail()[-1500:],
        )
        if missed:
            assert str(r.signature) == "probe: probe_threshold: metric missed >= 0.95 * good"


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


@pytest.mark.parametrize(
    "body, key",
    [
        ({"matrix": {"tp-size": [4, 8]}}, "base"),
        ({"base": "base.yaml", "matrix": {"tp-size": []}}, "matrix.tp-size"),
        ({"base": "base.yaml", "matrix": {"tp-size": [8, 8]}}, None),
        ({"base": "base.yaml", "matrix": {}, "repeats": 2}, "repeats"),
        ({}, None),
    ],
)
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
    row = {
        "config": "other-config",
        "repeat": 0,
        "run": None,
        "verdict": None,
        "signature": None,
        "metric": None,
        "duration": None,
    }
    camp = CampaignRow(
        id="c0ffee",
        kind="sweep",
        key="k",
        created=0.0,
        updated=0.0,
        status="incomplete",
        command="orchestrator sweep s.yaml",
        target=None,
        spec={
            "name": "s",
            "sweep": "s.yaml",
            "hosts": ["gpu1", "gpu2"],
            "axes": [],
            "items": [{"label": "other-config", "values": [], "config": {}}],
        },
        answer={"rows": [row], "removed_hosts": [["gpu2", "2 runs in a row failed"]]},
    )
    assert svg_plot(camp) == ""
    md = markdown(camp)
    assert "| other-config | 1 | not run |" in md
    assert "host gpu2 was taken out of the pool: 2 runs in a row failed" in md
    page = html_page(camp)
    assert "<svg" not in page and "not run" in page and "<b>gpu2</b> was taken out" in page


def test_a_relative_bar_is_judged_against_a_reference_in_the_sweep(tmp_path: Path) -> None:
    """The base is the reference: the matrix config equal to it, or a row of its own."""
    sweep = load_sweep(write_sweep(tmp_path))
    ref = sweep.items[sweep.reference]
    assert ref.label == "cuda-graph-max-bs=128 mem-fraction-static=0.85"
    assert [it for it in sweep.items if sweep.needs_reference(it)] == [
        it for it in sweep.items if it is not ref
    ]
    # the base's values are not in the matrix: the base is measured as a row of its own
    sweep = load_sweep(write_sweep(tmp_path, matrix={"cuda-graph-max-bs": [256, 512]}))
    assert [it.label for it in sweep.items] == [
        "reference test-rtx6000-perf",
        "cuda-graph-max-bs=256",
        "cuda-graph-max-bs=512",
    ]
    assert sweep.reference == 0 and sweep.items[0].values == (("cuda-graph-max-bs", 128),)
    assert [it.index for it in sweep.items] == [0, 1, 2]


@pytest.mark.parametrize(
    "body, expect",
    [
        ({"configs": ["base.yaml"]}, "names no config to measure as good"),
        (
            {"base": "base.yaml", "matrix": {"tp-size": [4, 8]}, "reference": "gone.yaml"},
            "config 'gone.yaml' not found",
        ),
    ],
)
def test_a_missing_reference_is_a_load_error(tmp_path: Path, body: dict, expect: str) -> None:
    write_sweep(tmp_path)  # base.yaml: the perf config, `pass_if: ">= 0.95 * good"`
    path = tmp_path / "ref-sweep.yaml"
    path.write_text(yaml.safe_dump(body))
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert expect in str(err.value) and err.value.key == "reference", str(err.value)
    assert err.value.file == str(path)


@pytest.mark.parametrize(
    "body, key, expect",
    [
        ({"base": "gone.yaml", "matrix": {"tp-size": [4, 8]}}, "base", "'gone.yaml' not found"),
        ({"base": ".", "matrix": {"tp-size": [4, 8]}}, "base", "'.' is a directory"),
        ({"configs": ["base.yaml", "/dev/null"]}, "configs[1]", "is not a regular file"),
    ],
)
def test_a_config_the_sweep_names_that_is_no_file_names_the_sweep_and_key(
    tmp_path: Path, body: dict, key: str, expect: str
) -> None:
    write_sweep(tmp_path)
    path = tmp_path / "bad-sweep.yaml"
    path.write_text(yaml.safe_dump(body))
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert expect in str(err.value) and err.value.key == key, str(err.value)
    assert err.value.file == str(path)


def test_an_absent_flag_is_labelled_absent(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path, matrix={"cuda-graph-max-bs": [None, 128]}))
    labels = [it.label for it in sweep.items]
    assert "cuda-graph-max-bs=(absent)" in labels and not any("None" in x for x in labels)
    absent = next(it for it in sweep.items if "absent" in it.label)
    assert "--cuda-graph-max-bs" not in absent.exp.argv()


def _camp(rows: list[dict], items: list[dict], axes: list[str]) -> CampaignRow:
    full = [
        {
            "signature": None,
            "duration": 1.0,
            "run": f"c0ffee.{i + 1}",
            "repeat": 0,
            "reused_from": None,
            **r,
        }
        for i, r in enumerate(rows)
    ]
    return CampaignRow(
        id="c0ffee",
        kind="sweep",
        key="k",
        created=0.0,
        updated=0.0,
        status="done",
        command="orchestrator sweep s.yaml",
        target=None,
        spec={"name": "s", "sweep": "s.yaml", "hosts": ["gpu1"], "axes": axes, "items": items},
        answer={"rows": full, "total_executed": 7, "total_reused": 0},
    )


def test_plot_of_a_list_sweep_marks_failed_configs_with_full_labels() -> None:
    long = "sglang-0.5.23-ep8-flashinfer-mem0.92-cuda-graph-max-bs-512-max-running-256"
    names = ["tp8", "tp8-cgmb512", long]
    items = [{"label": n, "values": [], "config": {}} for n in names]
    camp = _camp(
        [
            {"config": "tp8", "verdict": "pass", "metric": 2400.0},
            {
                "config": "tp8-cgmb512",
                "verdict": "fail",
                "metric": 2160.0,
                "signature": "probe: probe_threshold: metric missed >= 0.95 * good",
            },
            {
                "config": long,
                "verdict": "fail",
                "metric": None,
                "signature": "cuda_graph: AssertionError",
            },
        ],
        items,
        [],
    )
    svg = svg_plot(camp)
    assert svg, "a list sweep with a metric gets a plot"
    assert svg.count("<circle") == 1  # the one that passed
    assert svg.count("class=failed") == 2  # both failures drawn, the one without a metric too
    for n in names:
        assert f">{n}</text>" in svg  # every config named in full
    width = float(re.search(r"width='(\d+)'", svg)[1])  # type: ignore[index]
    for m in re.finditer(r"<text class=legend x='(\d+)'[^>]*>([^<]*)</text>", svg):
        assert float(m[1]) + 6.6 * len(m[2]) <= width, m[2]  # no legend label cut off
    assert "did not pass" in svg


def test_plot_of_a_matrix_with_an_absent_value_and_long_series_names() -> None:
    axes = ["cuda-graph-max-bs", "moe-a2a-backend-and-a-very-long-flag-name"]
    values = [
        (None, "flashinfer-with-a-long-name"),
        (128, "flashinfer-with-a-long-name"),
        (None, None),
        (128, None),
    ]
    items = [
        {"label": f"{i}", "values": [[axes[0], a], [axes[1], b]], "config": {}}
        for i, (a, b) in enumerate(values)
    ]
    rows = [{"config": f"{i}", "verdict": "pass", "metric": 2000.0 + i} for i in range(4)]
    svg = svg_plot(_camp(rows, items, axes))
    assert ">(absent)</text>" in svg and "None" not in svg
    assert svg.count("<polyline") == 2
    label = f"{axes[1]}=flashinfer-with-a-long-name"
    [m] = [
        m
        for m in re.finditer(r"<text class=legend x='(\d+)'[^>]*>([^<]*)</text>", svg)
        if m[2] == label
    ]
    assert f"{axes[1]}=(absent)" in svg
    width = float(re.search(r"width='(\d+)'", svg)[1])  # type: ignore[index]
    assert float(m[1]) + 6.6 * len(label) <= width


def test_plot_orders_numbers_by_value_then_words_then_the_absent_flag() -> None:
    axes = ["x"]
    values = [1.5, 2, None, 1, "auto"]
    items = [{"label": f"c{i}", "values": [["x", v]], "config": {}} for i, v in enumerate(values)]
    rows = [{"config": f"c{i}", "verdict": "pass", "metric": 10.0 + i} for i in range(5)]
    svg = svg_plot(_camp(rows, items, axes))
    ticks = re.findall(r"text-anchor='middle'>([^<]+)</text>", svg)
    assert ticks[:5] == ["1", "1.5", "2", "auto", "(absent)"], ticks


def test_resuming_a_campaign_of_the_other_kind_says_what_resumes_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = Store(tmp_path / "results")
    try:
        bisection = store.create_campaign(kind="bisect", key="b", command="x", spec={})
        sweep = store.create_campaign(kind="sweep", key="s", command="x", spec={})
    finally:
        store.close()
    for cmd, cid, what, resume in (
        ("sweep", bisection, "a bisection", "bisect"),
        ("bisect", sweep, "a sweep", "sweep"),
    ):
        # the CLI's main() in this process: an exception it let through fails the test
        capsys.readouterr()
        code = main([cmd, "--resume", cid, "--results", str(tmp_path / "results")])
        text = "".join(capsys.readouterr())
        assert code == 2, text
        assert "Traceback" not in text and "KeyError" not in text
        [line] = [ln for ln in text.splitlines() if ln.startswith("error:")]
        assert f"campaign {cid} is {what}" in line
        assert f"resume it with: orchestrator {resume} --resume {cid} --results " in line


def test_sweep_help_documents_the_budgets(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:  # argparse's own exit, as the command's
        main(["sweep", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-runs N start at most N runs in this invocation" in text
    assert "--until HH:MM stop starting runs at this time of day" in text
    assert "same command again also resumes it" in text and "--reuse" in text


# ---- over the real sshd ------------------------------------------------------------------


def test_sweep_table_and_report_over_sshd(sshd: SshdEndpoint, tmp_path: Path) -> None:
    port = free_port()
    path = write_sweep(tmp_path, port=port, slow_512=0.7)
    hosts = sshd_hosts_file(sshd, tmp_path)
    results = tmp_path / "results"
    res = cli("sweep", path, "--host", "lab", "--hosts", hosts, "--results", results, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # sweep wording, not a bisection's
    assert re.search(r"sweep campaign \w+: 6 configs, 6 runs", res.stdout), res.stdout[:500]
    assert "deltas" not in res.stdout and "strategy" not in res.stdout
    # the relative bar (">= 0.95 * good") is judged against the base, measured here:
    # --cuda-graph-max-bs 512 (0.7x in this test's scenario) fails it, as in a bisection
    cid, runs = sweep_runs(results)
    assert len(runs) == 6 and all(r.probe_metric and r.probe_metric > 1000 for r in runs)
    [ref] = [r for r in runs if r.label == "cuda-graph-max-bs=128 mem-fraction-static=0.85"]
    assert ref.seq == 1 and ref.verdict is Verdict.PASS  # the reference runs first
    judged_by_the_bar(runs, ref)
    assert all(r.verdict is Verdict.FAIL for r in runs if "max-bs=512" in r.label)
    n_pass = sum(r.verdict is Verdict.PASS for r in runs)
    lines = res.stdout.splitlines()
    for r in runs:
        [line] = [ln for ln in lines if r.id in ln and "│" in ln]
        assert r.label[:20] in line and r.verdict.value in line
        assert f"{r.probe_metric:g}" in line
    assert "relative probe bars judged against the reference cuda-graph-max-bs=128" in res.stdout
    assert "runs: 6 executed, 0 reused from earlier campaigns" in res.stdout
    # the reports: Markdown table; HTML with the plot (one line per memory fraction) and rows
    md = results / "reports" / f"{cid}.md"
    page = results / "reports" / f"{cid}.html"
    assert f"report: {md}" in res.stdout and f"report: {page}" in res.stdout
    md_rows = [ln for ln in md.read_text().splitlines() if ln.startswith("| cuda-graph")]
    assert len(md_rows) == 6
    assert sum("| pass |" in ln for ln in md_rows) == n_pass
    assert sum("| fail |" in ln for ln in md_rows) == 6 - n_pass
    text = page.read_text()
    svg = re.search(r"<svg id=plot.*?</svg>", text, re.S)
    assert svg, "no plot in the HTML report"
    assert svg[0].count("<polyline") == 2  # mem-fraction-static=0.85 and =0.92
    assert svg[0].count("<circle") == n_pass and svg[0].count("class=failed") == 6 - n_pass
    for x in ("128", "256", "512"):
        assert f">{x}</text>" in svg[0]
    assert "mem-fraction-static=0.85" in svg[0] and "mem-fraction-static=0.92" in svg[0]
    table = text[text.index("<table id=results>") :]
    assert table.count("<tr><td>cuda-graph-max-bs=") == 6
    assert lab_servers(port) == []
    # rerun of a failed row: judged by its recorded bar against the sweep's reference metric
    [slow] = [r for r in runs if r.label == "cuda-graph-max-bs=512 mem-fraction-static=0.85"]
    again = cli("rerun", slow.id, "--hosts", hosts, "--results", results, timeout=120)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert (
        f"judged by the recorded bar >= 0.95 * good, good = {ref.probe_metric:g} (run {ref.id})"
    ) in again.stdout, again.stdout
    assert "same verdict and signature" in again.stdout
    assert re.search(r"rerun\s+\S+ on lab: fail", again.stdout)
    # The same sweep again, as a nightly schedule would: measured afresh, not reused. With
    # --max-runs it stops with the resume command, and the same command resumes it.
    budget = [
        "sweep",
        path,
        "--host",
        "lab",
        "--hosts",
        hosts,
        "--results",
        results,
        "--max-runs",
        "2",
    ]
    second = cli(*budget, timeout=300)
    assert second.returncode == 1, second.stdout[-3000:] + second.stderr[-3000:]
    cids = _sweep_ids(results)
    assert len(cids) == 2 and cids[0] == cid
    new = cids[1]
    assert "--max-runs 2 reached" in second.stdout
    assert (
        f"resume with: orchestrator sweep --resume {new} --hosts {hosts} --results "
        f"{results}" in " ".join(second.stdout.split())
    )
    assert "runs: 2 executed, 0 reused from earlier campaigns" in second.stdout
    third = cli(*budget, timeout=300)
    assert third.returncode == 1 and _sweep_ids(results) == cids, third.stdout[-3000:]
    assert "resuming with 2 recorded runs" in third.stdout
    last = cli(*budget, "--json", timeout=300)
    assert last.returncode == 0, last.stdout[-3000:] + last.stderr[-3000:]
    out = json.loads(last.stdout)
    assert out["campaign"] == new and out["status"] == "done" and _sweep_ids(results) == cids
    # totals for the whole campaign, not only this invocation
    assert (out["executed"], out["total_executed"], out["total_reused"]) == (2, 6, 0)
    store = Store(results)
    try:
        new_runs = store.runs(new)
    finally:
        store.close()
    assert len(new_runs) == 6 and all(r.cached_from is None for r in new_runs)
    md = (results / "reports" / f"{new}.md").read_text()
    assert "runs: 6 executed, 0 reused from earlier campaigns" in md
    # and the report compares this run of the sweep with the first one, config by config
    assert out["comparison"]["previous"] == cid
    assert len(out["comparison"]["changes"]) == 6
    assert f"## Against the previous run (campaign {cid}," in md


def _sweep_ids(results: Path) -> list[str]:
    store = Store(results)
    try:
        return [
            c.id for c in sorted(store.campaigns(), key=lambda c: c.created) if c.kind == "sweep"
        ]
    finally:
        store.close()


def test_reused_rows_are_judged_by_the_sweeps_rule_over_sshd(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    """A run recorded elsewhere (a lone `run`, which has no good metric to judge its relative
    bar by, so it passed) is reused only with --reuse, marked as reused, and judged by this
    sweep's reference like the rows measured with it."""
    port = free_port()
    path = write_sweep(tmp_path, port=port, matrix={"cuda-graph-max-bs": [128, 512]}, slow_512=0.7)
    slow = tmp_path / "slow.yaml"
    slow.write_text(
        yaml.safe_dump(
            {
                "name": "slow",
                "extends": "base.yaml",
                "service": {"flags": {"cuda-graph-max-bs": 512}},
            }
        )
    )
    hosts = sshd_hosts_file(sshd, tmp_path)
    results = tmp_path / "results"
    one = cli(
        "run", slow, "--host", "lab", "--hosts", hosts, "--results", results, "--json", timeout=120
    )
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    alone = json.loads(one.stdout)
    assert alone["verdict"] == "pass"  # nothing to compare its metric with
    res = cli(
        "sweep",
        path,
        "--host",
        "lab",
        "--hosts",
        hosts,
        "--results",
        results,
        "--reuse",
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    cid, runs = sweep_runs(results)
    [ref] = [r for r in runs if r.label == "cuda-graph-max-bs=128"]
    [reused] = [r for r in runs if r.label == "cuda-graph-max-bs=512"]
    assert ref.cached_from is None and reused.cached_from == alone["run"]
    assert reused.probe_metric == alone["probe_metric"] < 0.95 * ref.probe_metric
    assert reused.verdict is Verdict.FAIL  # the same rule as every other row
    [line] = [ln for ln in res.stdout.splitlines() if reused.id in ln and "│" in ln]
    assert re.search(r"fail\s+\(reused\)", line) and alone["run"] in line
    assert "runs: 1 executed, 1 reused from earlier campaigns" in res.stdout
    md = (results / "reports" / f"{cid}.md").read_text()
    assert "| fail (reused) |" in md and f"reused from {alone['run']}" in md


def _running_run(results: Path, port: int, n_recorded: int) -> bool:
    """`n_recorded` runs are in the store and the next one's server is up on `port`."""
    try:
        _, runs = sweep_runs(results)
    except Exception:  # noqa: BLE001 - the store or the campaign may not exist yet
        return False
    return len(runs) >= n_recorded and bool(lab_servers(port))


def test_sweep_survives_sigkill_and_resumes_over_sshd(sshd: SshdEndpoint, tmp_path: Path) -> None:
    port = free_port()
    path = write_sweep(tmp_path, port=port, matrix={"cuda-graph-max-bs": [128, 512]}, repeat=2)
    hosts = sshd_hosts_file(sshd, tmp_path)
    results = tmp_path / "results"
    first = ["sweep", path, "--host", "lab", "--hosts", hosts, "--results", results]
    child = popen_cli(*first, log=tmp_path / "first.log")
    try:
        wait_until(
            lambda: _running_run(results, port, 1),
            timeout=120,
            what="a run recorded and the second one's server up",
            describe=lambda: (tmp_path / "first.log").read_text()[-2000:],
        )
    finally:
        stop_child(child)  # SIGKILL: no restore, no status update, the server is left running
    cid, runs = sweep_runs(results)
    assert lab_servers(port), "the killed sweep's server should still be running"
    killed_at = len(runs)
    # 1. resume by id; kill again mid-run
    child = popen_cli(
        "sweep",
        "--resume",
        cid,
        "--hosts",
        hosts,
        "--results",
        results,
        log=tmp_path / "second.log",
    )
    try:
        wait_until(
            lambda: _running_run(results, port, killed_at + 1),
            timeout=120,
            what="one more run recorded and the next one's server up",
            describe=lambda: (tmp_path / "second.log").read_text()[-2000:],
        )
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
    assert [r["run"] for r in out["rows"]] == [
        r.id for r in sorted(runs, key=lambda r: (int(r.purpose.split("/")[1]), r.variant))
    ]
    for k in (0, 1):  # each repeat against its own run of the reference
        [ref] = [r for r in runs if r.variant == (0,) and r.purpose == f"sweep/{k}"]
        judged_by_the_bar([r for r in runs if r.purpose == f"sweep/{k}"], ref)
    assert all(Path(p).is_file() for p in out["reports"])
    assert lab_servers(port) == []  # the last process restored the host


# ---- a pool of two systemd hosts ----------------------------------------------------------


def pool_hosts_file(boxes: list[SystemdHost], tmp: Path) -> Path:
    hosts = {
        f"gpu{i + 1}": box.hosts_entry(env={"PYTHONPATH": "/opt/orchestrator"}, labels=["rtx6000"])
        for i, box in enumerate(boxes)
    }
    path = tmp / "hosts.yaml"
    path.write_text(
        yaml.safe_dump({"hosts": hosts, "pools": {"duo": list(hosts)}}, sort_keys=False)
    )
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
    res = cli(
        "sweep",
        path,
        "--pool",
        "duo",
        "--hosts",
        hosts,
        "--results",
        results,
        "--json",
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads(res.stdout)
    cid, runs = sweep_runs(results)
    assert out["campaign"] == cid and out["status"] == "done" and out["executed"] == 6
    recorded_once(runs, 6)
    assert len(runs) == 6
    [ref] = [r for r in runs if r.variant == (0,)]
    judged_by_the_bar(runs, ref)  # the relative bar, against the base's run
    by_host = {h: [r for r in runs if r.host == h] for h in ("gpu1", "gpu2")}
    assert all(by_host.values()), {h: len(rs) for h, rs in by_host.items()}  # both used
    pairs = overlapping(by_host["gpu1"], by_host["gpu2"])
    assert len(pairs) >= 2, [(r.id, r.host, r.started, r.duration) for r in runs]
    store = Store(results)
    try:
        assert store.campaign(cid).spec["hosts"] == ["gpu1", "gpu2"]
    finally:
        store.close()
    for box in duo:
        check_restored(box)


def test_ids_announced_on_a_pool_are_the_stored_ids(duo: list[SystemdHost], tmp_path: Path) -> None:
    """With EP8, the FlashInfer backend dies at KV-cache allocation in a second while the
    other configs start and are benchmarked: runs finish out of the order they started in,
    and each `run ID on HOST: CONFIG` line printed live names the run stored as ID."""
    (tmp_path / "base.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "ep8",
                "extends": str(PERF_GOOD),
                "service": {"flags": {"ep-size": 8}},
                "probe": {"run": PROBE, "pass_if": ">= 1000"},
            }
        )
    )
    path = tmp_path / "sweep.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "ids",
                "base": "base.yaml",
                "matrix": {
                    "cuda-graph-max-bs": [128, 256],
                    "moe-a2a-backend": [None, "flashinfer"],
                },
            }
        )
    )
    hosts = pool_hosts_file(duo, tmp_path)
    results = tmp_path / "results"
    res = cli("sweep", path, "--pool", "duo", "--hosts", hosts, "--results", results, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    announced = re.findall(r"^\s*run (\S+) on (gpu\d): (.+)$", res.stdout, re.M)
    cid, runs = sweep_runs(results)
    assert len(runs) == 4 and len(announced) == 4, res.stdout[-3000:]
    stored = {r.id: (r.host, r.label) for r in runs}
    assert {rid: (host, label.strip()) for rid, host, label in announced} == stored
    assert [r.verdict for r in sorted(runs, key=lambda r: r.variant)] == [
        Verdict.PASS,
        Verdict.FAIL,
    ] * 2
    # and they did finish out of order (else this test proves nothing)
    by_end = sorted(runs, key=lambda r: r.started + r.duration)
    assert [r.seq for r in by_end] != sorted(r.seq for r in runs), [
        (r.id, r.host, r.started, r.duration) for r in runs
    ]
    for box in duo:
        check_restored(box)
