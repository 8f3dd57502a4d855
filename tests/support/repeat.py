"""The flake finder's pytest side (`scripts/test --repeat N`): every chosen test runs N times
in one session, and the summary lists each test that failed at least once.

`--repeat-each N` parametrizes every test with a repeat index (`test_x[rep3]`, or
`test_x[rep3-case]` for a parametrized one), so pytest-xdist hands the copies to whichever
worker is free: a test then also runs beside its own copies, as it does beside the same
suite of another checkout on a shared machine. The controller (or the single process
without xdist) counts each test's outcomes by its id without the repeat index; the
terminal summary names every one that failed, with how often, and the run's exit status is
pytest's own (1 when any copy failed).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

_REPEAT = "_repeat_index"
#: the repeat index among a node id's parameter ids (`[rep3]`, `[rep3-case]`, `[case-rep3]`)
_INDEX = re.compile(r"^rep\d+$")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--repeat-each",
        type=int,
        default=0,
        metavar="N",
        help="run every chosen test N times and list those that failed at least once",
    )


@pytest.fixture
def _repeat_index(request: pytest.FixtureRequest) -> int:
    """The copy's index: only there to give the N copies of a test their own ids."""
    return int(request.param)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    count = metafunc.config.getoption("--repeat-each")
    if count and count > 1:
        metafunc.fixturenames.append(_REPEAT)
        metafunc.parametrize(
            _REPEAT, range(count), indirect=True, ids=[f"rep{i}" for i in range(count)]
        )


def base_id(nodeid: str) -> str:
    """`nodeid` without its repeat index (and without an xdist group's `@name`)."""
    nodeid = nodeid.split("@", 1)[0]
    if not nodeid.endswith("]") or "[" not in nodeid:
        return nodeid
    name, params = nodeid[:-1].split("[", 1)
    kept = [p for p in params.split("-") if not _INDEX.match(p)]
    return f"{name}[{'-'.join(kept)}]" if kept else name


class _Tally:
    """Outcomes per test, counted in the process that reports them (the xdist controller)."""

    def __init__(self) -> None:
        self.ran: set[str] = set()
        self.failed: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.ran.add(report.nodeid)
        if report.failed:  # in setup, call or teardown: the copy failed once
            self.failed.add(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        runs = Counter(base_id(n) for n in self.ran)
        failed = Counter(base_id(n) for n in self.failed)
        tr.section("repeat: tests that failed at least once")
        if not failed:
            tr.write_line(
                f"none: {len(runs)} tests, each run {tr.config.getoption('--repeat-each')} times"
            )
            return
        for name, count in sorted(failed.items()):
            tr.write_line(f"FLAKY {count}/{runs[name]} {name}")


def pytest_configure(config: pytest.Config) -> None:
    # only where the reports arrive: the controller, or a run without xdist
    if config.getoption("--repeat-each") > 1 and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Tally(), "repeat-tally")
