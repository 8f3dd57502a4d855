"""Fixtures shared by the fault-injection tests: one systemd lab container per test module
(`sd_box`), put back to its installed state after each test (`sd`), and network faults in
its namespace that are always cleared (`net`). Test modules import them by name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestrator.lab.sdhosts import SystemdHostFactory
from tests.hosts.faults import NetFault, SdLab


@pytest.fixture(scope="module")
def sd_box(
    systemd_hosts: SystemdHostFactory,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[SdLab]:
    box = systemd_hosts.boot()
    try:
        name = request.module.__name__.rsplit(".", 1)[-1].replace("test_", "")
        # a module sets LAB_UNIT_RESTART to install the lab unit with another Restart=
        restart = getattr(request.module, "LAB_UNIT_RESTART", "no")
        yield SdLab.setup(box, tmp_path_factory.mktemp(name), restart=restart)
    finally:
        systemd_hosts.stop(box)


@pytest.fixture
def sd(sd_box: SdLab) -> Iterator[SdLab]:
    yield sd_box
    sd_box.reset()


@pytest.fixture
def net(sd_box: SdLab) -> Iterator[NetFault]:
    fault = NetFault(sd_box.netns)
    try:
        yield fault
    finally:
        fault.clear()
    assert not fault.active()
