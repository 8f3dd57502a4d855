"""What the command line prints and leaves behind, checked by running it (issue 35).

Every command a command prints (to follow a detached campaign, to stop and resume it) is
parsed by the real parser and run; a closed host (nothing to connect to: its known_hosts
file is missing, so the transport refuses before any network) stands for host trouble, so
no test host is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import build_parser, detached, main
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import Store
from tests.support.campaign_lab import REPO, check_b300_answer, cli, cli_json
from tests.test_campaign_resume import SshdLab

B300 = REPO / "experiments" / "lab" / "b300"


def closed_hosts(tmp: Path) -> Path:
    """A hosts file whose hosts are refused at once, before any connection (host trouble,
    exit 3): `gone` has no known_hosts file, `noid` no identity file."""
    path = tmp / "hosts.yaml"
    (tmp / "known_hosts").write_text("")
    entry = {
        "address": "127.0.0.1",
        "port": 9,
        "user": "nobody",
        "service_manager": "process",
        "run_dir": str(tmp / "run"),
        "connect_timeout": 3,
    }
    path.write_text(
        yaml.safe_dump(
            {
                "hosts": {
                    "gone": entry | {"known_hosts": str(tmp / "no-known-hosts")},
                    "noid": entry
                    | {
                        "known_hosts": str(tmp / "known_hosts"),
                        "identity_file": str(tmp / "no-id"),
                    },
                }
            }
        )
    )
    return path


def parsed(command: str) -> argparse.Namespace:
    """A printed `orchestrator ...` command, read by the real parser (exit 2 if it cannot)."""
    words = shlex.split(command)
    assert words[0] == "orchestrator", command
    return build_parser(words[1:]).parse_args(words[1:])


# ---- row 6: the commands --detach prints run as printed


@pytest.mark.parametrize("kind", ["bisect", "sweep", "run"])
def test_the_commands_a_detached_campaign_prints_parse(kind: str, tmp_path: Path) -> None:
    argv = {
        "bisect": ["bisect", "--good", "g.yaml", "--bad", "b.yaml", "--host", "h"],
        "sweep": ["sweep", "s.yaml"],
        "run": ["run", "g.yaml", "--host", "h"],
    }[kind]
    argv += ["--hosts", "my hosts.yaml", "--results", str(tmp_path / "r"), "--detach"]
    args = build_parser(argv).parse_args(argv)
    follow, resume = detached.commands(args, "abc123")
    f = parsed(follow)
    assert (f.command, f.follow, f.results) == ("runs", "abc123", str(tmp_path / "r"))
    if kind == "run":  # one run: nothing resumes it
        assert resume is None
        return
    assert resume is not None
    r = parsed(resume)
    assert (r.command, r.resume, r.hosts, r.results) == (
        kind,
        "abc123",
        os.path.abspath("my hosts.yaml"),  # absolute: it resumes from any directory
        str(tmp_path / "r"),
    )


@pytest.mark.slow
def test_a_detached_campaign_prints_commands_that_run(tmp_path: Path) -> None:
    """End to end: `bisect --detach` on a host in trouble; the follow command it prints
    follows that campaign to its end and exits with its code; the resume command resumes
    that campaign (and meets the same trouble)."""
    hosts, results = closed_hosts(tmp_path), tmp_path / "results"
    res = cli(
        "bisect",
        "--good",
        B300 / "good.yaml",
        "--bad",
        B300 / "bad.yaml",
        "--host",
        "gone",
        "--hosts",
        hosts,
        "--results",
        results,
        "--detach",
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    [follow] = [
        ln.removeprefix("follow it with: ")
        for ln in res.stdout.splitlines()
        if ln.startswith("follow it with: ")
    ]
    [stop] = [ln for ln in res.stdout.splitlines() if ln.startswith("stop it with: ")]
    assert "the same command" not in stop
    resume = stop.split("then resume it with: ", 1)[1].rstrip(")")
    cid = parsed(follow).follow
    followed = cli(*shlex.split(follow)[1:], timeout=120)
    assert followed.returncode == 3, followed.stdout + followed.stderr
    assert f"campaign {cid} ended: error (exit 3)" in followed.stdout
    resumed = cli(*shlex.split(resume)[1:], timeout=120)
    assert resumed.returncode == 3, resumed.stdout + resumed.stderr
    assert f"campaign {cid}:" in resumed.stdout  # the same campaign, resumed
    assert f"--resume {cid}" in resumed.stderr


# ---- row 8: host trouble has one status, the documented one, everywhere


@pytest.mark.parametrize("host", ["gone", "noid"])
def test_host_trouble_is_recorded_notified_and_documented_as_error(
    host: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.test_notify_issue import Receiver

    hosts, results = closed_hosts(tmp_path), tmp_path / "results"
    with Receiver() as receiver:
        code = main(
            [
                "bisect",
                "--good",
                str(B300 / "good.yaml"),
                "--bad",
                str(B300 / "bad.yaml"),
                "--host",
                host,
                "--hosts",
                str(hosts),
                "--results",
                str(results),
                "--notify",
                receiver.url,
            ]
        )
    assert code == 3
    out = capsys.readouterr()
    assert "taken out of the pool" not in out.out + out.err  # a pool of one host
    assert main(["runs", "--campaigns", "--json", "--results", str(results)]) == 0
    [camp] = json.loads(capsys.readouterr().out)
    [message] = receiver.bodies
    assert camp["status"] == message["status"] == "error"
    assert "stopped on an error" in message["text"]
    # the status the docs give this case
    docs = (REPO / "docs" / "verdicts.md").read_text()
    [row] = [ln for ln in docs.splitlines() if ln.startswith("| `error` |")]
    assert "unreachable" in row and "identity file" in row
    # and the same command goes on with that campaign once the host is fixed
    assert (
        main(
            [
                "bisect",
                "--good",
                str(B300 / "good.yaml"),
                "--bad",
                str(B300 / "bad.yaml"),
                "--host",
                host,
                "--hosts",
                str(hosts),
                "--results",
                str(results),
            ]
        )
        == 3
    )
    assert f"campaign {camp['id']}:" in capsys.readouterr().out
    store = Store(results, readonly=True)
    assert len(store.campaigns()) == 1
    store.close()


# ---- row 7: a closed output is an interrupt, like SIGHUP


def test_an_output_closed_under_a_worker_thread_interrupts_the_main_thread() -> None:
    """A pool's worker prints (its run's progress) into a pipe whose reader is gone: the
    main thread gets the interrupt, counted once as the closed output; the console goes
    quiet and writes nothing more, without an error."""
    import threading
    import time

    from orchestrator.cli.output import SafeConsole
    from orchestrator.cli.signals import Interrupts

    r, w = os.pipe()
    os.close(r)  # the reader is gone
    con = SafeConsole(file=os.fdopen(w, "w"), soft_wrap=True)
    with Interrupts() as interrupts:
        with pytest.raises(KeyboardInterrupt):
            worker = threading.Thread(target=lambda: con.print("x" * 100))
            worker.start()
            worker.join()
            time.sleep(5)  # the interrupt arrives long before this ends
        con.print("more")  # quiet now: nothing is written, nothing fails
    assert interrupts.received == ["closed output"] and con.closed


def test_a_closed_output_stops_the_campaign_as_interrupted(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    """`orchestrator bisect ... | head -1`: a real pipe whose reader goes once it has the
    first line. The campaign stops as on SIGHUP: the host restored and read back, the record
    `interrupted`, exit 130, and what it would have said (the resume command) on stderr;
    that command, run as printed, resumes the campaign to its answer."""
    lab = SshdLab(sshd, tmp_path)
    err = tmp_path / "stderr"
    with err.open("wb") as fh:
        child = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *map(str, lab.command())],
            stdout=subprocess.PIPE,
            stderr=fh,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            env={**os.environ, "COLUMNS": "200"},
        )
    try:
        assert child.stdout is not None
        first = child.stdout.readline().decode()
        child.stdout.close()  # `head -1` has its line and exits
        code = child.wait(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    said = err.read_text()
    assert first.startswith("campaign "), first + said
    cid = first.split()[1].rstrip(":")
    assert code == 130, said
    assert f"interrupted: campaign {cid} stopped." in said, said
    assert "the host was restored (read back: as found): lab" in said, said
    [resume] = [
        ln.removeprefix("resume with: ")
        for ln in said.splitlines()
        if ln.startswith("resume with: ")
    ]
    store = Store(lab.results, readonly=True)
    assert store.campaign(cid).status == "interrupted"
    store.close()
    assert lab.restored()
    words = shlex.split(resume)
    assert words[:4] == ["orchestrator", "bisect", "--resume", cid], resume
    code, answer = cli_json(*words[1:], timeout=400)
    assert code == 0 and answer["campaign"] == cid, answer
    check_b300_answer(answer, lab.results, resumed=True)
    assert lab.restored()


# ---- row 11: rerun without --hosts reruns on the recorded host


def test_rerun_without_hosts_uses_the_hosts_file_the_run_was_recorded_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run recorded with `--hosts lab.yaml`; `rerun ID` from a directory whose hosts.yaml
    names another machine `box` reruns on the recorded one, and says where it came from."""
    from orchestrator.cli import common
    from tests.support.scripted import Faults, Oracle, ScriptedExecutor, write_pair

    good, _ = write_pair(tmp_path / "exp", 1)
    used: list[tuple[str, int]] = []

    def scripted(args: argparse.Namespace):  # noqa: ANN202 - the executor factory
        def make(h, service, campaign, listener):  # noqa: ANN001, ANN202
            used.append((h.address, h.port))
            return ScriptedExecutor(h, Oracle([]), Faults(), listener)

        return make

    monkeypatch.setattr(common, "executor_factory", scripted)
    box = {
        "address": "192.0.2.1",
        "port": 2201,
        "known_hosts": "/dev/null",
        "service_manager": "process",
    }
    lab = tmp_path / "lab.yaml"
    lab.write_text(yaml.safe_dump({"hosts": {"box": box}}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "hosts.yaml").write_text(yaml.safe_dump({"hosts": {"box": box | {"port": 22}}}))
    results = tmp_path / "results"
    assert (
        main(
            [
                "run",
                str(good),
                "--host",
                "box",
                "--hosts",
                str(lab),
                "--results",
                str(results),
                "--json",
            ]
        )
        == 0
    )
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("ORCH_HOSTS", raising=False)
    store = Store(results, readonly=True)
    [run] = store.runs()
    store.close()
    assert main(["rerun", run.id, "--results", str(results), "--json"]) == 0
    assert used == [("192.0.2.1", 2201), ("192.0.2.1", 2201)]  # not hosts.yaml's port 22
    # --hosts still chooses
    assert (
        main(["rerun", run.id, "--results", str(results), "--hosts", "hosts.yaml", "--json"]) == 0
    )
    assert used[-1] == ("192.0.2.1", 22)


# ---- row 11: runs --follow --json prints one JSON document


def test_follow_with_json_prints_one_json_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results"
    store = Store(results)
    cid = store.create_campaign(kind="bisect", key="k", command="bisect", spec={})
    store.update_campaign(cid, status="error", controller={"exit_code": 3})
    store.close()
    assert main(["runs", "--follow", cid, "--results", str(results), "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert (doc["campaign"], doc["status"], doc["exit_code"], doc["runs"]) == (cid, "error", 3, [])


# ---- row 11: a mapping as a flag value says what a flag value may be


@pytest.mark.parametrize(
    ("value", "key", "got"),
    [
        ({"level": 3}, "service.flags.compilation-config", "got a mapping"),
        ([1, [2]], "service.flags.compilation-config", "got a list holding a list"),
        ([1, {"a": 2}], "service.flags.compilation-config", "got a list holding a mapping"),
    ],
)
def test_a_flag_value_of_the_wrong_shape_says_what_a_flag_value_may_be(
    value: object, key: str, got: str, tmp_path: Path
) -> None:
    from orchestrator.config.loading import load_experiment
    from orchestrator.errors import ConfigError

    path = tmp_path / "e.yaml"
    config = {
        "name": "e",
        "service": {"exec": "vllm serve /m", "flags": {"port": 8000, "compilation-config": value}},
    }
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as caught:
        load_experiment(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: {key}: a flag value is a scalar"), text
    assert "a list of them" in text and "one string of JSON" in text and got in text
    assert "boolean" not in text and "more problem" not in (caught.value.hint or "")
    if isinstance(value, dict):  # the hint's form loads, as the JSON option it meant
        form = caught.value.hint.split(": ", 2)[2]
        assert form == """'{"level": 3}'"""
        path.write_text(
            yaml.safe_dump(config).replace(
                "compilation-config:\n      level: 3", f"compilation-config: {form}"
            )
        )
        assert load_experiment(path).flag_map()["compilation-config"] == '{"level": 3}'


# ---- row 11: results/ is made only by a command that records something


def test_no_results_directory_for_commands_that_record_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default store is `results/` in the working directory (docs/usage.md, Results); only a
    command that records a campaign makes it, and says where it is."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ORCH_RESULTS", raising=False)
    hosts = closed_hosts(tmp_path)
    good, bad = str(B300 / "good.yaml"), str(B300 / "bad.yaml")
    nothing = [
        ["runs"],
        ["runs", "--campaigns"],
        ["show", "abc.1"],
        ["report", "abc"],
        ["report", "abc", "--issue"],
        ["rerun", "abc.1", "--hosts", str(hosts)],
        ["runs", "--follow", "abc"],
        ["bisect", "--resume", "abc", "--hosts", str(hosts)],
        ["sweep", "--resume", "abc", "--hosts", str(hosts)],
        ["bisect", "--good", "missing.yaml", "--bad", bad, "--host", "gone", "--hosts", str(hosts)],
        ["bisect", "--good", good, "--bad", bad, "--host", "nosuch", "--hosts", str(hosts)],
        ["sweep", "missing.yaml", "--hosts", str(hosts)],
        ["run", "missing.yaml", "--host", "gone", "--hosts", str(hosts)],
        ["plan", "--good", good, "--bad", bad],
    ]
    for argv in nothing:
        main(argv)
        assert not (tmp_path / "results").exists(), argv
    capsys.readouterr()
    # a campaign recorded (its host in trouble): the directory is made, and said
    assert (
        main(["bisect", "--good", good, "--bad", bad, "--host", "gone", "--hosts", str(hosts)]) == 3
    )
    assert (tmp_path / "results" / "orchestrator.db").is_file()
    assert f"a new results directory: {tmp_path / 'results'}" in capsys.readouterr().err
    assert (
        main(["bisect", "--good", good, "--bad", bad, "--host", "gone", "--hosts", str(hosts)]) == 3
    )
    assert "a new results directory" not in capsys.readouterr().err  # said once
