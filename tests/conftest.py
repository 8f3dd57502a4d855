"""Shared pytest setup: the real test hosts (see `tests/hosts`)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# `tests.hosts` is imported as a package of the repo, however pytest was started
# (`pytest`, `python -m pytest`, from any directory).
_REPO = str(Path(__file__).resolve().parents[1])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

# The help pages the preflight keeps per host and server build: the tests' own, never the
# user's (each test process starts with an empty one).
os.environ["ORCH_HELP_CACHE"] = tempfile.mkdtemp(prefix="orch-help-cache-")
atexit.register(shutil.rmtree, os.environ["ORCH_HELP_CACHE"], True)

from tests.hosts.fault_fixtures import net, sd, sd_box  # noqa: E402
from tests.hosts.fixtures import (  # noqa: E402
    duo,
    spawn,
    sshd,
    sshd_server,
    systemd_host,
    systemd_hosts,
)
from tests.hosts.slurm import slurm_cluster  # noqa: E402
from tests.hosts.vllm import vllm_real  # noqa: E402
from tests.repeat import (  # noqa: E402  the flake finder: scripts/test --repeat N
    _repeat_index,
    pytest_addoption,
    pytest_configure,
    pytest_generate_tests,
)

__all__ = ["_repeat_index", "duo", "net", "pytest_addoption", "pytest_configure",
           "pytest_generate_tests", "sd", "sd_box", "slurm_cluster", "spawn", "sshd",
           "sshd_server", "systemd_host", "systemd_hosts", "vllm_real"]

_MARKERS = {"sshd": "sshd", "sshd_server": "sshd", "systemd_host": "systemd",
            "systemd_hosts": "systemd", "sd_box": "systemd", "duo": "systemd",
            "slurm_cluster": "slurm", "vllm_real": "real"}


#: Tests that need no test host but start real processes (lab servers, the lab's own sshd,
#: crontab, timed-out commands) or run thousands of generated cases: `slow`, so the fast
#: tier (`scripts/test --fast`: not sshd, systemd, slurm or slow) stays within seconds.
#: Node id prefixes, relative to the repository.
_SLOW = (
    "tests/test_lab_server.py",
    "tests/test_lab_bench.py",
    "tests/test_transport_local.py",
    "tests/test_lab_cli.py::test_up_down_twice_in_a_row",
    "tests/test_lab_cli.py::test_down_leaves_other_processes_alone",
    "tests/test_lab_cli.py::test_up_refuses_a_port_taken_by_someone_else",
    "tests/test_lab_cli.py::test_default_layout_matches_the_hosts_example",
    "tests/test_lab_cli.py::test_two_labs_with_other_state_dirs_do_not_see_or_stop_each_other",
    "tests/test_hostile_input.py::test_any_",
    "tests/test_hostile_input.py::test_extends_chains_load_or_name_the_bad_file",
    "tests/test_hostile_input.py::test_cli_plan_exits_2",
    "tests/test_secrets.py::test_no_secret_under_results_or_in_output",
    "tests/test_schedule.py::test_without_systemd_the_job_goes_into_the_crontab",
    "tests/test_schedule.py::test_add_refuses_what_would_not_run",
    "tests/test_schedule.py::test_add_then_remove_leaves_the_crontab_as_it_was",
    "tests/test_schedule.py::test_without_crontab_nothing_is_scheduled",
    "tests/test_schedule.py::test_bad_calendar_is_a_usage_error_with_the_reason",
    "tests/test_schedule_notify.py",
    "tests/test_lab_scenario.py::test_flaky_pair_answer",
    "tests/test_transport_ssh.py::test_silent_host_times_out_at_connect_timeout",
    "tests/test_detach_follow.py::test_a_detached_command_that_fails_at_once_says_why",
    "tests/test_cli_commands.py::test_a_detached_campaign_prints_commands_that_run",
)


#: the order tests are handed to the workers in: the real hosts' tests first (they run for
#: seconds to minutes, mostly waiting), the fast tier last (it fills the workers' gaps)
_ORDER = {"real": 0, "systemd": 0, "slurm": 0, "sshd": 1, "slow": 2}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests by the hosts they use, so `-m "not systemd"` deselects them, and the slow
    ones without a host (see _SLOW). For `scripts/test` (pytest-xdist, `--dist loadgroup`):
    the tests of a module that shares a module-scoped fixture (a booted container, recorded
    runs) go to one worker together, every other test goes wherever a worker is free, and
    the long ones go first."""
    for item in items:
        for fixture, marker in _MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
        if item.nodeid.startswith(_SLOW):
            item.add_marker("slow")
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d[-1].scope == "module" for d in defs if d):
            _group(item, item.nodeid.split("::")[0])
        elif (mark := item.get_closest_marker("xdist_group")) is not None:
            _group(item, str(mark.args[0]))  # a module that shares a cache of its own

    def rank(item: pytest.Item) -> int:
        return min((_ORDER[m.name] for m in item.iter_markers() if m.name in _ORDER),
                   default=len(_ORDER))

    items.sort(key=rank)  # stable: file order within a tier


def _group(item: pytest.Item, name: str) -> None:
    """Put `item` in the xdist group `name`. pytest-xdist's `loadgroup` scheduler reads the
    group from the node id (`ID@GROUP`), which its worker writes into `item._nodeid`; pytest
    9 keeps the id in `item._id` and no longer reads `_nodeid`, so every group would be
    spread over the workers (each booting the module's container). Written here the way
    this pytest keeps it; with an older pytest, xdist's own hook does it."""
    item.add_marker(pytest.mark.xdist_group(name))
    if not getattr(item.config.option, "loadgroup", False) or "@" in item.nodeid:
        return
    try:
        from _pytest.nodes import coerce_node_id  # pytest >= 9
    except ImportError:
        return
    item._id = coerce_node_id(f"{item.nodeid}@{name}")  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _help_cache_of_the_module(request: pytest.FixtureRequest,
                              tmp_path_factory: pytest.TempPathFactory,
                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The preflight's help cache (orchestrator.execution.helpcache) is kept per test
    module, never in the user's home: a test that asks whether the flag pre-check ran, or
    a lab scenario with its own flags, never sees another module's cached help; the tests
    of one module (the real vLLM tier's bisections) still pay a slow `--help=all` once."""
    module = request.node.nodeid.split("::")[0].replace("/", "_")
    monkeypatch.setenv("ORCH_HELP_CACHE", str(tmp_path_factory.getbasetemp() / "help" / module))
