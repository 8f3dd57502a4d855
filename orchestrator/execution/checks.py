"""One line of `hosts check`: what was checked, whether it passed, what was seen, the fix.

Its own module so that the checks of every kind of host (`hostops` for SSH and local
hosts, `slurm.check` for a cluster's login node) share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None  # None: not applicable / informational
    detail: str
    hint: str | None = None
