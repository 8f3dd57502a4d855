"""Where the suite's CPU goes: `python -m pytest -p tests.support.cpu_profile --cpu-profile FILE`.

CPU time (user + sys), not wall time: on a shared machine the wall time of a test says more
about the neighbours than about the test. Each test process (every xdist worker) adds up,
per test module, its own CPU and that of the child processes it waited for (resource usage
of RUSAGE_SELF and RUSAGE_CHILDREN before and after each test's setup, call and teardown),
and counts the processes the tests started by kind (the CLI, another Python, ssh, sshd,
systemd-nspawn, ...). Each process appends its counts to FILE as one JSON line; `python -m
tests.support.cpu_profile FILE` prints the table of tests/README.md. A server a test leaves to
another process to reap (a lab server started detached) is not in its module's children.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-profile",
        default=None,
        metavar="FILE",
        help="append each test process's CPU per module (JSON lines) to FILE",
    )


def _cpu() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def kind(argv: Any) -> str:
    """What a started process is, from its command line."""
    args = [str(a) for a in argv] if isinstance(argv, (list, tuple)) else str(argv).split()
    if not args:
        return "?"
    name = os.path.basename(args[0])
    if name.startswith("python") or args[0] == sys.executable:
        if args[1:3] == ["-m", "orchestrator"]:
            return "orchestrator CLI"
        return "python " + (args[2] if len(args) > 2 and args[1] == "-m" else "other")
    return name


class _Profile:
    def __init__(self, path: str, *, controller: bool) -> None:
        self.path = path
        # the xdist controller's children are the workers, which count themselves
        self.controller = controller
        self.self_cpu: dict[str, float] = defaultdict(float)
        self.child_cpu: dict[str, float] = defaultdict(float)
        self.tests: dict[str, int] = defaultdict(int)
        self.spawns: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.module = "(collection and start)"
        self.start_self, self.start_kids = 0.0, 0.0  # the process's own start: counted at the end
        original = subprocess.Popen._execute_child  # type: ignore[attr-defined]
        profile = self

        def counting(popen: Any, args: Any, *rest: Any, **kw: Any) -> Any:
            profile.spawns[profile.module][kind(args)] += 1
            return original(popen, args, *rest, **kw)

        subprocess.Popen._execute_child = counting  # type: ignore[attr-defined]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        module = item.nodeid.split("::")[0]
        self.module = module
        before = _cpu()
        yield
        after = _cpu()
        self.self_cpu[module] += after[0] - before[0]
        self.child_cpu[module] += after[1] - before[1]
        self.tests[module] += 1
        self.module = "(between tests)"

    def pytest_unconfigure(self) -> None:
        me, kids = _cpu()
        total_self = sum(self.self_cpu.values())
        total_kids = sum(self.child_cpu.values())
        self.self_cpu["(collection and start)"] += me - total_self
        self.child_cpu["(collection and start)"] += 0.0 if self.controller else kids - total_kids
        record = {
            "modules": {
                m: {
                    "self": round(self.self_cpu[m], 3),
                    "children": round(self.child_cpu[m], 3),
                    "tests": self.tests.get(m, 0),
                    "spawns": dict(self.spawns.get(m, {})),
                }
                for m in set(self.self_cpu) | set(self.spawns)
            }
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--cpu-profile")
    if path:
        controller = bool(getattr(config.option, "numprocesses", None)) and not hasattr(
            config, "workerinput"
        )
        config.pluginmanager.register(
            _Profile(os.path.abspath(path), controller=controller), "cpu-profile"
        )


def table(path: Path) -> str:
    """The Markdown table of a profile file: modules by CPU, most first, and the spawns."""
    cpu: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    tests: dict[str, int] = defaultdict(int)
    spawns: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for line in path.read_text().splitlines():
        for module, rec in json.loads(line)["modules"].items():
            cpu[module][0] += rec["self"]
            cpu[module][1] += rec["children"]
            tests[module] += rec["tests"]
            for k, n in rec["spawns"].items():
                spawns[module][k] += n
    rows = ["| module | tests | CPU s (own + children) | started processes |", "|---|---|---|---|"]
    total = 0.0
    for module, (own, kids) in sorted(cpu.items(), key=lambda kv: -sum(kv[1])):
        total += own + kids
        started = ", ".join(
            f"{k} {n}" for k, n in sorted(spawns[module].items(), key=lambda kv: -kv[1])
        )
        rows.append(
            f"| {module} | {tests[module]} | {own + kids:.1f} ({own:.1f} + {kids:.1f})"
            f" | {started} |"
        )
    kinds: dict[str, int] = defaultdict(int)
    for per in spawns.values():
        for k, n in per.items():
            kinds[k] += n
    rows.append(
        f"| total | {sum(tests.values())} | {total:.1f} | "
        + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
        + " |"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
