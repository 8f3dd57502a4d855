"""Shared pytest setup: the real test hosts (see `tests/hosts`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# `tests.hosts` is imported as a package of the repo, however pytest was started
# (`pytest`, `python -m pytest`, from any directory).
_REPO = str(Path(__file__).resolve().parents[1])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tests.hosts.fault_fixtures import net, sd, sd_box  # noqa: E402
from tests.hosts.fixtures import sshd, sshd_server, systemd_host, systemd_hosts  # noqa: E402

__all__ = ["net", "sd", "sd_box", "sshd", "sshd_server", "systemd_host", "systemd_hosts"]

_MARKERS = {"sshd": "sshd", "sshd_server": "sshd", "systemd_host": "systemd",
            "systemd_hosts": "systemd", "sd_box": "systemd"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests by the hosts they use, so `-m "not systemd"` deselects them."""
    for item in items:
        for fixture, marker in _MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
