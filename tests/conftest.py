"""Shared pytest setup: the real test hosts (see `tests/hosts`)."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest

# `tests.hosts` is imported as a package of the repo, however pytest was started
# (`pytest`, `python -m pytest`, from any directory).
_REPO = str(Path(__file__).resolve().parents[1])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

# A Ctrl-C reaches the commands the tests start as it would from a terminal: a suite started
# as a background job of a shell without job control (`./.ci/run &` in a script) inherits
# SIGINT ignored, and an ignored SIGINT stays ignored in every process it starts (Python then
# installs no KeyboardInterrupt handler), so a test's Ctrl-C of a command would not arrive.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The help pages the preflight keeps per host and server build: the tests' own, never the
# user's (each test process starts with an empty one).
os.environ["ORCH_HELP_CACHE"] = tempfile.mkdtemp(prefix="orch-help-cache-")
atexit.register(shutil.rmtree, os.environ["ORCH_HELP_CACHE"], True)

from tests.hosts.fault_fixtures import net, sd, sd_box  # noqa: E402
from tests.hosts.fixtures import (  # noqa: E402
    duo,
    netns_hosts,
    spawn,
    sshd,
    sshd_server,
    systemd_host,
    systemd_hosts,
)
from tests.hosts.slurm import slurm_cluster, slurm_cluster2  # noqa: E402
from tests.hosts.vllm import vllm_real  # noqa: E402
from tests.support.repeat import (  # noqa: E402  the flake finder: scripts/test --repeat N
    _repeat_index,
    pytest_addoption,
    pytest_configure,
    pytest_generate_tests,
)

__all__ = [
    "_repeat_index",
    "duo",
    "net",
    "netns_hosts",
    "pytest_addoption",
    "pytest_configure",
    "pytest_generate_tests",
    "sd",
    "sd_box",
    "slurm_cluster",
    "slurm_cluster2",
    "spawn",
    "sshd",
    "sshd_server",
    "systemd_host",
    "systemd_hosts",
    "vllm_real",
]

_MARKERS = {
    "sshd": "sshd",
    "sshd_server": "sshd",
    "netns_hosts": "sshd",
    "systemd_host": "systemd",
    "systemd_hosts": "systemd",
    "sd_box": "systemd",
    "duo": "systemd",
    "slurm_cluster": "slurm",
    "slurm_cluster2": "slurm",
    "vllm_real": "real",
}


#: the order tests are handed to the workers in: the real hosts' tests first (they run for
#: seconds to minutes, mostly waiting), the fast tier last (it fills the workers' gaps)
_ORDER = {"real": 0, "systemd": 0, "slurm": 0, "sshd": 1, "slow": 2}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests by the hosts they use, so `-m "not systemd"` deselects them (a test that
    needs no host but starts real processes for seconds carries `slow` itself, in its
    module, so renaming it cannot move it into the fast tier). For `scripts/test`
    (pytest-xdist, `--dist loadgroup`): the tests of a module that shares a module-scoped
    fixture (a booted container, recorded runs) go to one worker together, every other test
    goes wherever a worker is free, and the long ones go first."""
    for item in items:
        for fixture, marker in _MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d[-1].scope == "module" for d in defs if d):
            _group(item, item.nodeid.split("::")[0])
        elif (mark := item.get_closest_marker("xdist_group")) is not None:
            _group(item, str(mark.args[0]))  # a module that shares a cache of its own

    def rank(item: pytest.Item) -> int:
        return min(
            (_ORDER[m.name] for m in item.iter_markers() if m.name in _ORDER), default=len(_ORDER)
        )

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
def _help_cache_of_the_module(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The preflight's help cache (orchestrator.execution.helpcache) is kept per test
    module, never in the user's home: a test that asks whether the flag pre-check ran, or
    a lab scenario with its own flags, never sees another module's cached help; the tests
    of one module (the real vLLM tier's bisections) still pay a slow `--help=all` once."""
    module = request.node.nodeid.split("::")[0].replace("/", "_")
    monkeypatch.setenv("ORCH_HELP_CACHE", str(tmp_path_factory.getbasetemp() / "help" / module))
