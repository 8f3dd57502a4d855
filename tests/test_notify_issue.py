"""Notifications and the upstream bug report, against real receivers.

- `send` POSTs to a real HTTP server on 127.0.0.1 started here: delivered once, retried
  on 5xx, not retried on 4xx, a dead URL is a one-line problem (never an exception).
- A lab bisection on the sshd host with `--notify` delivers exactly one message with the
  campaign, status, culprits and report path, and no secret; `report --issue` of that
  campaign is parsed with markdown-it-py (the CommonMark parser rich already depends
  on): a heading, a bash block with the minimal command, the tables, a traceback block,
  under 200 lines, no local path of the controller, secrets as placeholders.
- A campaign that stops on infrastructure notifies too, and keeps its exit code.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

from orchestrator.cli import main
from orchestrator.config.secrets import Redactor
from orchestrator.config.webhook import check_url
from orchestrator.errors import UsageError
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.reports.notify import Message, send
from orchestrator.store.store import Store
from tests.support.campaign_lab import check_b300_answer, cli, lab_pair, sshd_hosts_file

SECRET = "hf_NotARealTokenButShapedLikeOne1234"


class Receiver:
    """A webhook on 127.0.0.1: records every POST; answers the codes it is told to."""

    def __init__(self, codes: list[int] | None = None) -> None:
        self.bodies: list[dict] = []
        self.raw: list[bytes] = []
        self.codes = list(codes or [])
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                outer.raw.append(body)
                outer.bodies.append(json.loads(body))
                code = outer.codes.pop(0) if outer.codes else 200
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T0/B0/s3cr3tpath"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


# ---- send


def test_send_delivers_one_json_message(receiver: Receiver) -> None:
    msg = Message(
        "abc123",
        "bisect",
        "found",
        culprits=("--ep-size 8 + --enable-nccl-nvls",),
        report="/x/reports/abc123.html",
        detail=f"token {SECRET}",
    )
    assert send(receiver.url, msg.payload(Redactor({"HF_TOKEN": SECRET}))) is None
    [body] = receiver.bodies
    assert body["campaign"] == "abc123" and body["status"] == "found"
    assert body["culprits"] == ["--ep-size 8 + --enable-nccl-nvls"]
    assert body["report"] == "/x/reports/abc123.html"
    assert "found the culprit: --ep-size 8 + --enable-nccl-nvls" in body["text"]
    assert SECRET not in receiver.raw[0].decode() and "[REDACTED:HF_TOKEN]" in body["detail"]


def test_send_retries_server_errors_but_not_client_errors() -> None:
    with Receiver([500, 503]) as r:
        assert send(r.url, {"text": "x"}, sleep=lambda s: None) is None
        assert len(r.bodies) == 3  # two 5xx, then delivered
    with Receiver([404]) as r:
        problem = send(r.url, {"text": "x"}, sleep=lambda s: None)
        assert problem is not None and "HTTP 404" in problem and len(r.bodies) == 1
        assert "s3cr3tpath" not in problem  # a webhook's path is its password
    with Receiver([500, 500, 500]) as r:
        problem = send(r.url, {"text": "x"}, sleep=lambda s: None)
        assert problem is not None and "after 3 attempts" in problem and len(r.bodies) == 3


def test_send_to_nothing_is_a_problem_not_an_error() -> None:
    port = free_port()
    problem = send(f"http://127.0.0.1:{port}/hook", {"text": "x"}, timeout=2, sleep=lambda s: None)
    assert problem is not None and problem.startswith(f"http://127.0.0.1:{port}: ")


def test_only_http_urls() -> None:
    for bad in ("file:///etc/passwd", "ftp://x/y", "hooks.slack.com/x", "http://"):
        with pytest.raises(UsageError):
            check_url(bad)
    assert check_url("https://hooks.slack.com/services/T/B/x")


# ---- a lab bisection with --notify, and its report --issue


def _pair_with_secret(tmp: Path) -> tuple[Path, Path]:
    pair = lab_pair(tmp, "b300")
    for path in (pair.good, pair.bad):
        data = yaml.safe_load(path.read_text())
        data["service"]["env"] = {"HF_TOKEN": "${ORCH_TEST_TOKEN}"}
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return pair.good, pair.bad


def _headings(tokens: list, level: str) -> list[str]:
    return [
        tokens[i + 1].content
        for i, t in enumerate(tokens)
        if t.type == "heading_open" and t.tag == level
    ]


def test_lab_bisection_notifies_once_and_its_issue_report_parses(
    sshd: SshdEndpoint,
    tmp_path: Path,
    receiver: Receiver,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good, bad = _pair_with_secret(tmp_path)
    hosts = sshd_hosts_file(sshd, tmp_path)
    results = tmp_path / "results"
    res = cli(
        "bisect",
        "--good",
        good,
        "--bad",
        bad,
        "--host",
        "lab",
        "--hosts",
        hosts,
        "--results",
        results,
        "--notify",
        receiver.url,
        "--json",
        env={"ORCH_TEST_TOKEN": SECRET},
    )
    outcome = json.loads(res.stdout)
    check_b300_answer(outcome, results)
    assert res.returncode == 0
    # exactly one message, with the fields, and no secret
    assert len(receiver.bodies) == 1, receiver.bodies
    [msg] = receiver.bodies
    assert msg["campaign"] == outcome["campaign"] and msg["status"] == "found"
    assert msg["culprits"] == ["--ep-size 8 + --enable-nccl-nvls"]
    assert msg["report"].endswith(f"{outcome['campaign']}.html") and Path(msg["report"]).exists()
    assert SECRET not in receiver.raw[0].decode()
    assert "notified http://127.0.0.1" in res.stderr
    # the environment in --json: the lab's nvidia-smi stand-in, the lab's own package
    [env] = outcome["environment"]
    assert env["host"] == "lab" and env["gpu_count"] == 8 and env["driver"] == "580.95.05"
    assert env["server"] == "orchestrator" and env["server_version"]
    store = Store(results)
    try:
        camp = store.campaign(outcome["campaign"])
        assert "s3cr3tpath" not in camp.command  # the webhook URL is not recorded
    finally:
        store.close()
    md_report = (results / "reports" / f"{outcome['campaign']}.md").read_text()
    assert "## Environment" in md_report and "8 x NVIDIA B300 SXM6 AC" in md_report

    # report --issue, read by a Markdown parser
    monkeypatch.delenv("ORCH_TEST_TOKEN", raising=False)
    capsys.readouterr()
    assert main(["report", outcome["campaign"], "--issue", "--results", str(results)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert len(lines) < 200
    md = MarkdownIt("commonmark").enable("table")
    tokens = md.parse(text)
    [title] = _headings(tokens, "h1")
    assert title.startswith("[Bug] ") and "cublas" in title and "cuda_graph" in title
    assert _headings(tokens, "h2") == [
        "Reproduction",
        "What does not reproduce",
        "Error",
        "Environment",
        "Runs",
    ]
    summary = next(
        t.content for t in tokens if t.type == "inline" and t.content.startswith("**Summary:**")
    )
    assert "CUBLAS_STATUS_EXECUTION_FAILED" in summary and "without any one of them" in summary
    fences = {t.info: t.content for t in tokens if t.type == "fence"}
    command = fences["bash"]
    assert "--ep-size 8" in command and "--enable-nccl-nvls" in command
    assert "--max-running-requests 128" in command and "256" not in command  # good + set
    assert "HF_TOKEN='<ORCH_TEST_TOKEN>'" in command  # the secret as a placeholder
    assert "Traceback (most recent call last):" in fences["text"]
    assert "CUBLAS_STATUS_EXECUTION_FAILED" in fences["text"]
    # the tables are tables: the what-does-not-reproduce rows, the environment rows
    cells = [t.content for t in tokens if t.type == "inline"]
    # bad without --ep-size 8 passes; bad without NVLS still has EP8: another failure
    row = cells.index("the failing launch without `--ep-size 8`")
    assert cells[row + 1] == "starts and serves (passes)"
    row = cells.index("the failing launch without `--enable-nccl-nvls`")
    assert cells[row + 1].startswith("fails differently: `init: AttributeError")
    row = cells.index("the working launch (none of these flags)")
    assert cells[row + 1] == "starts and serves (passes)"
    assert sum(1 for t in tokens if t.type == "table_open") == 2
    assert cells[cells.index("GPU") + 1] == "8 x NVIDIA B300 SXM6 AC (275040 MiB)"
    assert cells[cells.index("driver") + 1] == "580.95.05"
    html = md.render(text)
    assert "```" not in html and "|---" not in html  # nothing left unparsed
    # nothing of the controller, nothing secret
    for local in (str(tmp_path), str(results), os.getcwd(), str(Path.home())):
        assert local not in text
    assert SECRET not in text
    assert "failed in 1 of 1 starts" in text


def test_a_campaign_stopped_on_infrastructure_notifies_and_keeps_its_exit_code(
    tmp_path: Path,
    receiver: Receiver,
    sshd: SshdEndpoint,
) -> None:
    pair = lab_pair(tmp_path, "b300")
    hosts = tmp_path / "hosts.yaml"
    entry = yaml.safe_load(sshd.hosts_yaml("gone", run_dir=str(tmp_path / "run")))
    entry["hosts"]["gone"]["port"] = free_port()  # nothing listens there
    entry["hosts"]["gone"]["connect_timeout"] = 3
    entry["notify"] = receiver.url  # from the hosts file (what a schedule uses)
    hosts.write_text(yaml.safe_dump(entry))
    res = cli(
        "bisect",
        "--good",
        pair.good,
        "--bad",
        pair.bad,
        "--host",
        "gone",
        "--hosts",
        hosts,
        "--results",
        tmp_path / "results",
    )
    assert res.returncode == 3, res.stderr
    [msg] = receiver.bodies
    assert msg["status"] == "error" and "stopped on an error" in msg["text"]
    assert msg["campaign"] and msg["campaign"] != "?"


def test_a_dead_webhook_never_fails_the_campaign(tmp_path: Path, sshd: SshdEndpoint) -> None:
    pair = lab_pair(tmp_path, "b300")
    hosts = sshd_hosts_file(sshd, tmp_path)
    res = cli(
        "bisect",
        "--good",
        pair.good,
        "--bad",
        pair.bad,
        "--host",
        "lab",
        "--hosts",
        hosts,
        "--results",
        tmp_path / "results",
        "--max-runs",
        "1",
        "--notify",
        f"http://127.0.0.1:{free_port()}/hook",
    )
    assert res.returncode == 1  # the campaign's own: stopped by --max-runs, no answer
    assert "the notification was not delivered: http://127.0.0.1:" in res.stderr


def test_a_sweep_notifies_from_its_file_and_its_reports_show_the_environment(
    tmp_path: Path,
    receiver: Receiver,
    sshd: SshdEndpoint,
) -> None:
    from tests.test_sweep import write_sweep

    path = write_sweep(tmp_path, port=free_port(), matrix={"cuda-graph-max-bs": [128, 256]})
    data = yaml.safe_load(path.read_text()) | {"notify": receiver.url}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    results = tmp_path / "results"
    res = cli(
        "sweep",
        path,
        "--host",
        "lab",
        "--hosts",
        sshd_hosts_file(sshd, tmp_path),
        "--results",
        results,
        "--json",
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    [msg] = receiver.bodies
    assert (msg["kind"], msg["status"], msg["campaign"]) == ("sweep", "done", out["campaign"])
    assert msg["report"].endswith(".html") and msg["culprits"] == []
    [env] = out["environment"]
    assert env["gpu_count"] == 8 and env["driver"] == "580.95.05"
    md = (results / "reports" / f"{out['campaign']}.md").read_text()
    html = (results / "reports" / f"{out['campaign']}.html").read_text()
    assert "## Environment" in md and "| driver | 580.95.05 |" in md
    assert "<h2>Environment</h2>" in html and "580.95.05" in html


def test_an_interrupted_bisection_notifies(
    tmp_path: Path, receiver: Receiver, sshd: SshdEndpoint
) -> None:
    import signal
    import time

    from tests.support.campaign_lab import popen_cli, stop_child

    pair = lab_pair(tmp_path, "b300")
    log = tmp_path / "cli.log"
    child = popen_cli(
        "bisect",
        "--good",
        pair.good,
        "--bad",
        pair.bad,
        "--host",
        "lab",
        "--hosts",
        sshd_hosts_file(sshd, tmp_path),
        "--results",
        tmp_path / "results",
        "--notify",
        receiver.url,
        log=log,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "  1. " not in log.read_text():
            assert child.poll() is None, log.read_text()
            time.sleep(0.2)
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=120) == 130, log.read_text()
    finally:
        stop_child(child)
    [msg] = receiver.bodies
    assert (
        msg["status"] == "interrupted"
        and "resume with: orchestrator bisect --resume" in msg["detail"]
    )


# ---- the issue report's pieces, pure


def test_trim_traceback_keeps_the_first_and_last_frames() -> None:
    from orchestrator.reports.issue_report import trim_traceback

    frames = []
    for i in range(30):
        frames += [
            f'  File "/opt/sglang/srt/mod{i}.py", line {i}, in f{i}',
            f"    call{i}()",
            "           ^^^^^^^^",
        ]
    lines = [
        "[2026-01-01 00:00:00 TP3] Traceback (most recent call last):",
        *frames,
        "[2026-01-01 00:00:00 TP3] RuntimeError: CUDA error: boom",
    ]
    out = trim_traceback(lines)
    assert out[0] == "Traceback (most recent call last):"  # the rank prefix is gone
    assert out[1].endswith("in f0") and out[3] == "  ... (23 frames omitted)"
    assert out[-1] == "RuntimeError: CUDA error: boom" and out[-3].endswith("in f29")
    assert not any("^^^" in x for x in out) and len(out) == 1 + 2 + 1 + 12 + 1


def test_command_block_puts_placeholders_for_secrets() -> None:
    from orchestrator.reports.issue_report import command_block

    text = command_block(
        [
            "python3",
            "-m",
            "sglang.launch_server",
            "--api-key",
            "[REDACTED:API_KEY]",
            "--enable-nccl-nvls",
            "--tp-size",
            "8",
        ],
        {"HF_TOKEN": "[REDACTED:HF_TOKEN]", "NCCL_DEBUG": "WARN"},
    )
    assert text.splitlines() == [
        "HF_TOKEN='<HF_TOKEN>' \\",
        "NCCL_DEBUG=WARN \\",
        "python3 -m sglang.launch_server \\",
        "  --api-key '<API_KEY>' \\",
        "  --enable-nccl-nvls \\",
        "  --tp-size 8",
    ]


def test_issue_report_of_a_campaign_without_an_answer_still_parses(tmp_path: Path) -> None:
    from orchestrator.config.loading import load_experiment
    from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
    from orchestrator.reports.issue_report import issue_markdown
    from tests.support.campaign_lab import LAB
    from tests.support.run_results import run_result

    store = Store(tmp_path / "results")
    good = load_experiment(LAB / "b300" / "good.yaml")
    bad = load_experiment(LAB / "b300" / "bad.yaml")
    sig = Signature(Phase.CUDA_GRAPH, "cublas", "CUBLAS_STATUS_EXECUTION_FAILED")
    cid = store.create_campaign(
        kind="bisect",
        key="k",
        command="c",
        spec={"deltas": [{}, {}, {}], "good_source": str(tmp_path / "g.yaml")},
    )
    store.add_run(cid, variant=(), purpose="endpoint", result=run_result(good, Verdict.PASS))
    store.add_run(
        cid,
        variant=(0, 1, 2),
        purpose="endpoint",
        result=run_result(
            bad,
            Verdict.FAIL,
            sig,
            log_tail='Traceback (most recent call last):\n  File "x.py", '
            "line 1, in f\nRuntimeError: CUDA error: "
            "CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx",
        ),
    )
    store.update_campaign(
        cid,
        status="incomplete",
        target=sig,
        answer={"status": "incomplete", "culprits": [], "flaky": []},
    )
    camp = store.campaign(cid)
    text = issue_markdown(
        camp,
        store.runs(cid),
        log_of=lambda r: r.log_tail(),
        env_of=lambda r: None,
        local_paths=[str(tmp_path)],
    )
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    assert _headings(tokens, "h2") == [
        "Reproduction",
        "What does not reproduce",
        "Error",
        "Environment",
        "Runs",
    ]
    assert "were not narrowed down" in text and "--enable-nccl-nvls" in text  # the bad config
    fences = {t.info: t.content for t in tokens if t.type == "fence"}
    assert "CUBLAS_STATUS_EXECUTION_FAILED" in fences["text"]
    assert str(tmp_path) not in text and "Not recorded." in text


def test_issue_report_of_a_flaky_failure_carries_its_rate(tmp_path: Path) -> None:
    """A failure that shows on 62% of starts: the issue text says so, with the counts of
    every launch carrying the set (not the one start of the launch it quotes), and states
    each "without X" row with the chance that it passed by luck."""
    from orchestrator.config.loading import load_experiment
    from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
    from orchestrator.reports.issue_report import issue_markdown
    from tests.support.campaign_lab import LAB
    from tests.support.run_results import run_result

    store = Store(tmp_path / "results")
    good = load_experiment(LAB / "b300" / "good.yaml")
    bad = load_experiment(LAB / "b300" / "bad.yaml")
    sig = Signature(Phase.CUDA_GRAPH, "cublas", "CUBLAS_STATUS_EXECUTION_FAILED")
    log = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in f\n'
        "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx"
    )
    cid = store.create_campaign(kind="bisect", key="k", command="c", spec={"deltas": [{}, {}, {}]})
    store.add_run(cid, variant=(), purpose="endpoint", result=run_result(good, Verdict.PASS))
    store.add_run(
        cid, variant=(0, 1, 2), purpose="endpoint", result=run_result(bad, Verdict.FAIL, sig)
    )
    repro = store.add_run(
        cid,
        variant=(1,),
        purpose="confirm",
        result=run_result(bad, Verdict.FAIL, sig, log_tail=log),
    )
    cleared = [
        store.add_run(cid, variant=(0, 2), purpose="confirm", result=run_result(bad, Verdict.PASS))
        for _ in range(2)
    ]
    answer = {
        "status": "found",
        "culprits": [
            {
                "deltas": ["+ --enable-nccl-nvls"],
                "flags": ["--enable-nccl-nvls"],
                "indices": [1],
                "reproduced_by": repro,
                "cleared_by": {"--enable-nccl-nvls": cleared[-1]},
                "confirmed": True,
                "reproduced_counts": "fail 1 of 1",
                "cleared_counts": {"--enable-nccl-nvls": "fail 0 of 2"},
            }
        ],
        "flaky": [],
        "noise": {
            "confidence": 0.97,
            "reproduction_rate": 0.62,
            "reproduction_counts": "fail 5 of 8",
        },
    }
    store.update_campaign(cid, status="found", target=sig, answer=answer)
    text = issue_markdown(
        store.campaign(cid), store.runs(cid), log_of=lambda r: r.log_tail(), env_of=lambda r: None
    )
    assert "failed in 5 of 8 starts, rate 0.62" in text, text
    assert "without it the failure does not reproduce" not in text  # not stated as certain
    row = next(ln for ln in text.splitlines() if "without `--enable-nccl-nvls`" in ln)
    # two passing starts of a launch that still fails at 0.62: (1 - 0.62)^2 = 0.14
    assert "passed in 2 of 2 starts" in row and "probability 0.14" in row, row
    assert "starts and serves (passes) |" not in row
