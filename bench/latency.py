"""Executor latency on real hosts: how fast a verdict follows what the server did.

Against the lab server through a private OpenSSH sshd on 127.0.0.1 (process manager)
and, when running as root with systemd-nspawn, a real systemd container (drop-in unit):

  (a) process exit -> verdict   crash runs (b300 bad): the server's exit time (the exit
                                file the wrapper writes; systemd's ExecMainExitTimestamp)
                                to the RunFinished event
  (b) first 200 -> verdict      healthy runs (b300 good): a side prober on the host asks
                                /health every 20 ms and notes the first 200
  (c) overhead per run          RunStarted -> RunFinished minus the server's own time
                                (its process start to its exit / first 200): preflight,
                                stop, install, start, polling latency, log, stop again
  (d) commands per min polling  a hung server polled until its deadline: SSH commands
                                from first to last poll, per minute

Times on both sides come from this machine's clocks (the sshd is local; the container
shares the kernel's CLOCK_MONOTONIC and CLOCK_REALTIME), so no clock skew enters.

    .venv/bin/python bench/latency.py [--runs 5] [--hang 30] [--no-systemd]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.config.experiment import Experiment  # noqa: E402
from orchestrator.config.hosts import Host, load_inventory  # noqa: E402
from orchestrator.config.loading import load_experiment  # noqa: E402
from orchestrator.diagnosis.verdicts import Verdict  # noqa: E402
from orchestrator.events import Event, Polled, RunFinished, RunStarted, StepDone  # noqa: E402
from orchestrator.execution.backends import executor_for  # noqa: E402
from orchestrator.lab.sshd import SshdServer, free_port, prepare, session_env  # noqa: E402

LAB = REPO / "experiments" / "lab"
TARGETS = {"a": 2.0, "b": 2.0, "c": 3.0, "d": 120.0}
HAND_POLL_S = 15.0
LABELS = {
    "a": "(a) process exit -> verdict (s)",
    "b": "(b) first 200 -> verdict (s)",
    "c": "(c) our overhead per run (s)",
    "d": "(d) SSH commands / min of polling",
}
# Polls /health every 20 ms; prints CLOCK_MONOTONIC of the first 200 (or nothing).
PROBER = r"""
import sys, time, urllib.request
url, end = sys.argv[1], time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    try:
        if urllib.request.urlopen(url, timeout=0.5).status == 200:
            print(repr(time.monotonic()), flush=True); break
    except Exception:
        pass
    time.sleep(0.02)
"""


@dataclass
class Recorder:
    """Listener: every event with its local monotonic and wall-clock arrival time."""

    events: list[tuple[float, float, Event]] = field(default_factory=list)

    def __call__(self, event: Event) -> None:
        self.events.append((time.monotonic(), time.time(), event))

    def first(self, kind: type) -> tuple[float, float, Event]:
        return next(e for e in self.events if isinstance(e[2], kind))

    def all(self, kind: type) -> list[tuple[float, float, Event]]:
        return [e for e in self.events if isinstance(e[2], kind)]


@dataclass
class Backend:
    """How to run on one kind of host and read the server's own timings there."""

    name: str
    host: Host
    service: str
    #: after a run: (start, end) of the server in this machine's monotonic time;
    #: end = exit for crashed runs; None where unknown
    server_times: Callable[[], tuple[float | None, float | None]]
    #: argv prefix to run the /health prober where the server's 127.0.0.1 is
    prober_prefix: list[str]
    adjust: Callable[[Experiment], Experiment] = lambda e: e
    hang_exec: tuple[str, ...] = ()
    #: called as the executor reports the server started (the pid file exists then)
    on_started: Callable[[], None] = lambda: None


@dataclass
class Sample:
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    c: list[float] = field(default_factory=list)
    d: list[float] = field(default_factory=list)


def hang_scenario() -> str:
    data = yaml.safe_load((LAB / "b300" / "scenario.yaml").read_text())
    data["name"] = "b300-hang"
    data["faults"].insert(
        0, {"when": {"cuda-graph-max-bs": 512}, "phase": "cuda_graph", "effect": "hang"}
    )
    return yaml.safe_dump(data, sort_keys=False)


def wall_to_mono(wall: float) -> float:
    return time.monotonic() - (time.time() - wall)


# ---------------------------------------------------------------------------- one backend


def measure(be: Backend, runs: int, hang_s: float, log: Callable[[str], None]) -> Sample:
    good = be.adjust(load_experiment(LAB / "b300" / "good.yaml"))
    bad = be.adjust(load_experiment(LAB / "b300" / "bad.yaml"))
    hang = replace(good, exec=be.hang_exec).with_changes(flags={"cuda-graph-max-bs": 512})
    hang = replace(hang, health=replace(hang.health, timeout=hang_s))
    s = Sample()
    rec = Recorder()

    def listener(event: Event) -> None:
        rec(event)
        if isinstance(event, StepDone) and event.step == "started":
            be.on_started()

    with executor_for(
        be.host, service=be.service, campaign="bench-latency", listener=listener
    ) as ex:
        ex.run(good, run_id="warm")  # preflight's --help, the first connection: not counted
        for i in range(runs):
            # (a) + (c) on a crash
            rec.events.clear()
            r = ex.run(bad, run_id=f"bad{i}")
            start, exit_t = be.server_times()
            t0 = rec.first(RunStarted)[0]
            t1 = rec.first(RunFinished)[0]
            assert r.verdict is Verdict.FAIL, r.detail
            if exit_t is not None:
                s.a.append(t1 - exit_t)
                if start is not None:
                    s.c.append((t1 - t0) - (exit_t - start))
            # (b) + (c) on a healthy run, with a side prober for the first 200
            rec.events.clear()
            prober = subprocess.Popen(
                [
                    *be.prober_prefix,
                    "python3",
                    "-c",
                    PROBER,
                    f"http://127.0.0.1:{good.port}{good.health.path}",
                    "120",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                r = ex.run(good, run_id=f"good{i}")
                out, _ = prober.communicate(timeout=130)
            finally:
                if prober.poll() is None:
                    prober.kill()
                    prober.wait(timeout=10)
            start, _ = be.server_times()
            t0 = rec.first(RunStarted)[0]
            t1 = rec.first(RunFinished)[0]
            assert r.verdict is Verdict.PASS, r.detail
            if out.strip():
                first200 = float(out.split()[0])
                s.b.append(t1 - first200)
                if start is not None:
                    s.c.append((t1 - t0) - (first200 - start))
            log(f"  {be.name}: run {i + 1}/{runs} done")
        # (d) a hung server polled until its deadline
        rec.events.clear()
        before = ex.t.commands_run
        marks: list[tuple[float, int]] = []
        rec_cb = ex.emit

        def counting(event: Event) -> None:
            rec_cb(event)
            if isinstance(event, Polled):
                marks.append((time.monotonic(), ex.t.commands_run))

        ex.emit = counting
        r = ex.run(hang, run_id="hang", target=None)
        ex.emit = rec_cb
        assert r.verdict is Verdict.FAIL and r.signature and r.signature.error_class == "hang"
        if len(marks) >= 2:
            (ta, ca), (tb, cb) = marks[0], marks[-1]
            s.d.append((cb - ca) / ((tb - ta) / 60.0))
        log(
            f"  {be.name}: hang run: {len(marks)} polls, {ex.t.commands_run - before} "
            f"commands in {r.duration_s:.1f}s"
        )
    return s


# ---------------------------------------------------------------------------- the hosts


@contextmanager
def sshd_backend(work: Path) -> Iterator[Backend]:
    endpoint = prepare(work / "ssh", port=free_port(), env=session_env(REPO))
    run_dir = work / "run"
    scenario = work / "hang.yaml"
    scenario.write_text(hang_scenario())
    (work / "hosts.yaml").write_text(endpoint.hosts_yaml("lab", run_dir=str(run_dir)))
    host = load_inventory(work / "hosts.yaml").host("lab")
    port = free_port()
    svc = run_dir / "lab-latency"
    started: list[float | None] = [None]

    def mtime(name: str) -> float | None:
        try:
            return wall_to_mono((svc / name).stat().st_mtime)
        except OSError:
            return None

    def on_started() -> None:
        # The wrapper writes its pid file just before it runs the launch script.
        started[0] = mtime("pid")

    def server_times() -> tuple[float | None, float | None]:
        return started[0], mtime("exit")

    def adjust(e: Experiment) -> Experiment:
        return e.with_changes(flags={"port": port}, env={"ORCH_LAB_TIME_SCALE": "0.2"})

    with SshdServer(endpoint):
        yield Backend(
            "process/sshd",
            host,
            "lab-latency",
            server_times,
            [],
            adjust,
            ("python3", "-m", "orchestrator.lab.server", "--scenario", str(scenario)),
            on_started,
        )


@contextmanager
def systemd_backend(work: Path) -> Iterator[Backend]:
    from orchestrator.lab.sdhosts import SystemdHostFactory
    from orchestrator.lab.units import lab_unit

    unit = "lab-latency.service"
    factory = SystemdHostFactory()
    try:
        box = factory.boot()
        box.write_file(f"/etc/systemd/system/{unit}", lab_unit(time_scale=0.2))
        box.write_file("/etc/orch-lab/hang.yaml", hang_scenario())
        box.ssh_run("systemctl daemon-reload", check=True)
        (work / "sd.yaml").write_text(box.hosts_yaml("sd", env={"PYTHONPATH": "/opt/orchestrator"}))
        host = load_inventory(work / "sd.yaml").host("sd")

        def server_times() -> tuple[float | None, float | None]:
            out = box.ssh_run(
                f"systemctl show {unit} -p ExecMainStartTimestampMonotonic "
                "-p ExecMainExitTimestampMonotonic "
                "-p ActiveEnterTimestampMonotonic",
                check=True,
            ).stdout
            props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

            def mono(key: str) -> float | None:
                v = int(props.get(key) or 0)
                return v / 1e6 if v else None

            # A failed unit may report no ExecMainStart; Type=simple enters "active" at exec.
            start = mono("ExecMainStartTimestampMonotonic") or mono("ActiveEnterTimestampMonotonic")
            return start, mono("ExecMainExitTimestampMonotonic")

        yield Backend(
            "systemd/nspawn",
            host,
            unit,
            server_times,
            ["ip", "netns", "exec", box.netns.name],
            hang_exec=(
                "python3",
                "-m",
                "orchestrator.lab.server",
                "--scenario",
                "/etc/orch-lab/hang.yaml",
            ),
        )
    finally:
        factory.stop_all()


def systemd_available() -> bool:
    return os.geteuid() == 0 and all(shutil.which(t) for t in ("systemd-nspawn", "ip", "zstd"))


# ---------------------------------------------------------------------------- report


def table(results: dict[str, Sample]) -> str:
    hand = {
        "a": "~7.5 mean / 15 max",
        "b": "~7.5 mean / 15 max",
        "c": "n/a (by hand)",
        "d": "4 (but a person)",
    }
    rows = [("backend", "metric", "n", "median", "max", "target", "ok", "hand loop, 15 s poll")]
    for name, s in results.items():
        for key in "abcd":
            vals = getattr(s, key)
            if not vals:
                rows.append(
                    (name, LABELS[key], "0", "-", "-", f"<= {TARGETS[key]:g}", "?", hand[key])
                )
                continue
            med, mx = statistics.median(vals), max(vals)
            fmt = "{:.0f}" if key == "d" else "{:.2f}"
            rows.append(
                (
                    name,
                    LABELS[key],
                    str(len(vals)),
                    fmt.format(med),
                    fmt.format(mx),
                    f"<= {TARGETS[key]:g}",
                    "yes" if mx <= TARGETS[key] else "NO",
                    hand[key],
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="crash and healthy runs per backend")
    ap.add_argument(
        "--hang", type=float, default=30.0, help="deadline (s) of the hung run that measures (d)"
    )
    ap.add_argument("--no-systemd", action="store_true", help="only the sshd/process backend")
    args = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    results: dict[str, Sample] = {}
    work = Path(tempfile.mkdtemp(prefix="orch-bench-latency-"))
    try:
        log("process manager through a private sshd on 127.0.0.1 ...")
        with sshd_backend(work) as be:
            results[be.name] = measure(be, args.runs, args.hang, log)
        if args.no_systemd:
            pass
        elif systemd_available():
            log("systemd host (nspawn container) ...")
            with systemd_backend(work) as be:
                results[be.name] = measure(be, args.runs, args.hang, log)
        else:
            log("systemd host skipped: needs root and systemd-nspawn")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(results))
    print(
        f"\nhand loop: poll /health every {HAND_POLL_S:g} s -> detection latency uniform on "
        f"[0, {HAND_POLL_S:g}] s: {HAND_POLL_S / 2:g} s mean, {HAND_POLL_S:g} s max, per event"
    )
    missed = [
        k
        for s in results.values()
        for k in "abcd"
        if getattr(s, k) and max(getattr(s, k)) > TARGETS[k]
    ]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
