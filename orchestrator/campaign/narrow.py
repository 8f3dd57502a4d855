"""4. The findings on the way, each narrowed to its own flag where one flag shows it.

A finding (a failure other than the target) is met on whatever variants the search ran;
its smallest may hold harmless deltas beside the one that causes it. After the search, each
finding whose smallest variant has more than one delta has those deltas started alone, one
at a time, until one shows the finding's signature (the answer then reports that one flag)
or none does (the finding needs several together: its smallest variant stays as it is).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.campaign.records import Finding
from orchestrator.diagnosis.verdicts import Verdict


def narrow_findings(
    runs: Any,
    findings: Callable[[], list[Finding]],
    drive: Callable[..., str | None],
    pool: Any,
) -> str | None:
    """Start the single deltas of every finding's smallest variant until the finding is
    seen on one alone or each was tried; returns why it stopped early (a budget), or None."""

    def want() -> list[tuple[int, ...]]:
        seen = {r.variant for r in runs.rows() if r.verdict is not Verdict.INFRA}
        out: list[tuple[int, ...]] = []
        for f in findings():
            if len(f.variant) <= 1:
                continue
            nxt = next(((x,) for x in f.variant if (x,) not in seen), None)
            if nxt is not None and nxt not in out:
                out.append(nxt)
        return out

    return drive(
        pool,
        want,
        lambda v, row: None,
        target=runs.target,
        purpose=lambda v: "finding",
    )
