"""A nightly sweep that regressed says so everywhere: the terminal, the notification, the
exit code (5); a reference that moved is called out.

Two nights of one sweep on the sshd lab host: the reference (the base) at 2400 tok/s and
`--cuda-graph-max-bs 512` at 0.6 of it (it fails the bar `>= 0.8 * good`); the second
night the scenario file the server reads makes the reference half as fast and leaves the
512 config's own throughput as it was, so it now passes. The second night ends with exit
5; its last line and the notification (a real receiver on 127.0.0.1) name the regression;
the moved reference and the config that flipped fail -> pass with it are called out.
The night-to-night rules and the message are checked in the fast tier too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.cli.notifying import url_for
from orchestrator.config.loading import load_experiment
from orchestrator.errors import EXIT_REGRESSION, UsageError
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.reports.notify import Message
from orchestrator.reports.sweep_report import compare
from orchestrator.store.store import CampaignRow
from tests.support.campaign_lab import LAB, SETTLE, cli, sshd_hosts_file
from tests.test_notify_issue import Receiver

PROBE = "python3 -m orchestrator.lab.bench --port {port} --num-prompts 40 --random-output-len 128"
REF = "reference lab-rtx6000-perf"
FAST = "cuda-graph-max-bs=512"


def _night(tmp: Path, base: float, factor: float) -> None:
    scen = yaml.safe_load((LAB / "rtx6000" / "scenario.yaml").read_text())
    scen["throughput"] = {
        "base": base,
        "factors": [{"when": {"cuda-graph-max-bs": 512}, "multiply": factor}],
    }
    (tmp / "scenario.yaml").write_text(yaml.safe_dump(scen))


def _sweep(tmp: Path, port: int) -> Path:
    base = {
        "name": "lab-rtx6000-perf",
        "extends": str(LAB / "rtx6000" / "perf_good.yaml"),
        "service": {
            "flags": {"port": port},
            "exec": f"python3 -m orchestrator.lab.server --scenario {tmp / 'scenario.yaml'}",
        },
        "probe": {"run": PROBE, "pass_if": ">= 0.8 * good"},
        "health": SETTLE,
    }
    (tmp / "base.yaml").write_text(yaml.safe_dump(base, sort_keys=False))
    path = tmp / "nightly.yaml"
    path.write_text(
        yaml.safe_dump(
            {"name": "nightly", "base": "base.yaml", "matrix": {"cuda-graph-max-bs": [512]}}
        )
    )
    return path


def test_a_regression_is_in_the_summary_the_message_and_the_exit_code(
    sshd: SshdEndpoint,
    tmp_path: Path,
) -> None:
    sweep = _sweep(tmp_path, free_port())
    hosts = sshd_hosts_file(sshd, tmp_path)
    results = tmp_path / "results"
    with Receiver() as receiver:
        _night(tmp_path, 2400, 0.6)
        first = cli(
            "sweep",
            sweep,
            "--host",
            "lab",
            "--hosts",
            hosts,
            "--results",
            results,
            "--notify",
            receiver.url,
            timeout=300,
        )
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
        _night(tmp_path, 1200, 1.2)  # the reference halves; 512 stays at 1440 tok/s
        second = cli(
            "sweep",
            sweep,
            "--host",
            "lab",
            "--hosts",
            hosts,
            "--results",
            results,
            "--notify",
            receiver.url,
            timeout=300,
        )
        bodies = list(receiver.bodies)
    out = second.stdout
    assert second.returncode == EXIT_REGRESSION == 5, out[-3000:] + second.stderr[-2000:]
    last = [ln for ln in out.splitlines() if ln.strip()][-1]
    assert last.startswith("REGRESSION against campaign") and REF in last
    assert last.endswith("(exit 5)")
    assert f"the reference {REF} itself moved" in out
    assert f"{FAST} fail -> pass" in " ".join(out.split())
    night1, night2 = bodies
    assert night1["regressions"] == [] and "REGRESSION" not in night1["text"]
    assert night2["status"] == "done" and "finished with a REGRESSION" in night2["text"]
    assert any(r.startswith(f"{REF}: metric") for r in night2["regressions"])
    assert any("itself moved" in r and f"{FAST} fail -> pass" in r for r in night2["regressions"])
    md = next((results / "reports").glob("*.md"), None)
    assert md is not None


# ---- the rules, in the fast tier


def _camp(
    cid: str,
    created: float,
    metrics: dict[str, float],
    verdicts: dict[str, str],
    ref: str | None = "ref",
) -> CampaignRow:
    # a real config with the bar `>= 0.95 * good`, as the store records it
    config = load_experiment(LAB / "rtx6000" / "perf_good.yaml").to_dict()
    items = [
        {"index": i, "label": name, "values": [], "config": config}
        for i, name in enumerate(metrics)
    ]
    rows = [
        {
            "config": name,
            "repeat": 0,
            "verdict": verdicts[name],
            "metric": m,
            "signature": None,
            "duration": 1.0,
            "run": f"{cid}.{i + 1}",
            "reused_from": None,
        }
        for i, (name, m) in enumerate(metrics.items())
    ]
    return CampaignRow(
        id=cid,
        kind="sweep",
        key="k",
        created=created,
        updated=created,
        status="done",
        command="orchestrator sweep s.yaml",
        target=None,
        spec={"name": "s", "sweep": "s.yaml", "hosts": ["gpu1"], "axes": [], "items": items},
        answer={"rows": rows, "reference": ref, "status": "done", "campaign": cid},
    )


def test_a_moved_reference_is_called_out_with_the_verdicts_it_moved() -> None:
    before = _camp(
        "n1", 1.0, {"ref": 1000, "a": 900, "b": 1000}, {"ref": "pass", "a": "fail", "b": "pass"}
    )
    after = _camp(
        "n2", 2.0, {"ref": 840, "a": 905, "b": 700}, {"ref": "pass", "a": "pass", "b": "fail"}
    )
    comp = compare(before, after)
    assert [c.config for c in comp.regressions] == ["ref", "b"]
    assert "ref itself moved -16.0% (1000 -> 840)" in comp.reference_moved
    assert "a fail -> pass" in comp.reference_moved  # its own metric held still
    assert "b pass -> fail" not in comp.reference_moved  # b moved by itself: a regression
    assert comp.regression_lines()[-1] == comp.reference_moved
    still = compare(
        before,
        _camp(
            "n3", 3.0, {"ref": 990, "a": 900, "b": 1000}, {"ref": "pass", "a": "fail", "b": "pass"}
        ),
    )
    assert still.reference_moved == "" and still.regressions == []
    up = compare(
        before,
        _camp(
            "n4", 4.0, {"ref": 1200, "a": 900, "b": 1190}, {"ref": "pass", "a": "fail", "b": "pass"}
        ),
    )
    assert "moved +20.0%" in up.reference_moved and up.regressions == []


def test_the_message_leads_with_the_regressions() -> None:
    msg = Message("n2", "sweep", "done", regressions=("ref: metric 1000 -> 840 (-16.0%)",))
    body = msg.payload()
    assert body["text"].startswith(
        "orchestrator sweep n2 finished with a REGRESSION: ref: metric 1000 -> 840"
    )
    assert body["regressions"] == ["ref: metric 1000 -> 840 (-16.0%)"]
    assert Message("n1", "sweep", "done").payload()["regressions"] == []


# ---- schedules take the URL from a file or the environment


def test_the_url_comes_from_the_environment_or_a_private_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import argparse

    args = argparse.Namespace(notify=None)
    monkeypatch.delenv("ORCH_NOTIFY_URL", raising=False)
    monkeypatch.delenv("ORCH_NOTIFY_FILE", raising=False)
    assert url_for(args, None) is None
    monkeypatch.setenv("ORCH_NOTIFY_URL", "https://hooks.example/T/B/x")
    assert url_for(args, None) == "https://hooks.example/T/B/x"
    assert url_for(args, "https://from.file/x") == "https://from.file/x"  # a file says more
    monkeypatch.delenv("ORCH_NOTIFY_URL")
    f = tmp_path / "hook"
    f.write_text("\nhttps://hooks.example/T/B/secretpath\n")
    f.chmod(0o600)
    monkeypatch.setenv("ORCH_NOTIFY_FILE", str(f))
    assert url_for(args, None) == "https://hooks.example/T/B/secretpath"
    f.chmod(0o644)
    with pytest.raises(UsageError, match="readable by other users"):
        url_for(args, None)
    f.chmod(0o600)
    f.write_text("http://[::1\n")
    with pytest.raises(UsageError, match="ORCH_NOTIFY_FILE"):
        url_for(args, None)
