"""A deployment's run as the readers show it: every role's host, unit, verdict and
signature, and which role failed first.

A run of a deployment (several roles, each a unit on a host) is recorded with the failing
role's host and log tail, `detail` saying the first failure in words, and a host record
`{"manager": "deployment", "roles": [...in start order], "first_failure": {"role",
"host", "describe"}}`. Everything here reads that record, pure: `show`, both reports, the
issue text, `--json` and the notification say it the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.verdicts import Signature

#: the host record's `manager` of a run over several roles
MANAGER = "deployment"


@dataclass(frozen=True)
class RoleRun:
    """One role's part of a recorded run."""

    role: str
    kind: str
    rank: int | None
    host: str
    unit: str
    verdict: str
    signature: str
    log_tail: str
    #: the command line as it ran, when the record knows it (a Slurm job fills in each
    #: rank's node rank and the first node's address); () when it is the config's
    argv: tuple[str, ...] = ()

    def where(self) -> str:
        """`node-1 [node rank 1] on b300-02 (sglang.service)`."""
        rank = f" rank {self.rank}" if self.rank is not None and self.kind != "router" else ""
        unit = f" ({self.unit})" if self.unit else ""
        return f"{self.role} [{self.kind}{rank}] on {self.host or '?'}{unit}"

    def to_json(self, *, log: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": self.role,
            "kind": self.kind,
            "rank": self.rank,
            "host": self.host,
            "unit": self.unit,
            "verdict": self.verdict,
            "signature": self.signature,
        }
        if log:
            out["log_tail"] = self.log_tail
        return out


@dataclass(frozen=True)
class DeploymentRun:
    """The roles of one recorded run in start order, and its first failure (if any)."""

    roles: tuple[RoleRun, ...]
    #: the role that failed first, its host, and the sentence that names it with what the
    #: others did then; None when no role failed
    first_role: str | None = None
    first_host: str | None = None
    describe: str | None = None
    #: (role, host) of the roles that hung alike when which one failed first cannot be
    #: told (no role is then named first); () when the order is known
    tied: tuple[tuple[str, str], ...] = ()

    def role(self, name: str) -> RoleRun | None:
        return next((r for r in self.roles if r.role == name), None)

    @property
    def first_failure(self) -> str | None:
        """`node-1 on b300-02`: where the run failed first (or the roles of which it
        cannot be told)."""
        if self.tied:
            names = " or ".join(f"{r} on {h or '?'}" for r, h in self.tied)
            return f"{names} (which one first cannot be told)"
        if self.first_role is None:
            return None
        return f"{self.first_role} on {self.first_host or '?'}"

    def hosts(self) -> str:
        """`node-0 on b300-01, node-1 on b300-02`."""
        return ", ".join(f"{r.role} on {r.host or '?'}" for r in self.roles)

    def to_json(self, *, logs: bool = False) -> dict[str, Any]:
        first: dict[str, Any] | None = None
        if self.first_role is not None:
            first = {"role": self.first_role, "host": self.first_host, "describe": self.describe}
        elif self.tied:
            first = {
                "role": None,
                "host": None,
                "describe": self.describe,
                "tied": [{"role": r, "host": h} for r, h in self.tied],
            }
        return {"roles": [r.to_json(log=logs) for r in self.roles], "first_failure": first}


def _text(value: object) -> str:
    return "" if value is None else str(value)


def _signature(value: object) -> str:
    """A role's signature as printed (`phase: class: message`), whether the record holds
    it printed or as the store's key (`phase|class|message`)."""
    text = _text(value)
    if text.count("|") >= 2:
        try:
            return str(Signature.from_key(text))
        except ValueError:  # not a key: a message with bars in it
            return text
    return text


def _argv(value: object) -> tuple[str, ...]:
    if isinstance(value, list) and all(isinstance(w, str) for w in value):
        return tuple(value)
    return ()


def of_record(record: Mapping[str, Any] | None) -> DeploymentRun | None:
    """The deployment of a run's host record, or None for a run of one unit."""
    if not record or record.get("manager") != MANAGER:
        return None
    roles = []
    for r in record.get("roles") or []:
        if not isinstance(r, Mapping):
            continue
        rank = r.get("rank")
        roles.append(
            RoleRun(
                role=_text(r.get("role")) or "?",
                kind=_text(r.get("kind")) or "node",
                rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
                host=_text(r.get("host")),
                unit=_text(r.get("unit")),
                verdict=_text(r.get("verdict")),
                signature=_signature(r.get("signature")),
                log_tail=_text(r.get("log_tail")),
                argv=_argv(r.get("argv")),
            )
        )
    first = record.get("first_failure")
    tied = first.get("tied") if isinstance(first, Mapping) else None
    if isinstance(tied, list) and tied:
        pairs = tuple(
            (_text(t.get("role")), _text(t.get("host"))) for t in tied if isinstance(t, Mapping)
        )
        said = _text(first.get("describe")) or None  # type: ignore[union-attr]
        return DeploymentRun(tuple(roles), describe=said, tied=pairs)
    if isinstance(first, Mapping) and first.get("role"):
        return DeploymentRun(
            tuple(roles),
            _text(first.get("role")),
            _text(first.get("host")) or None,
            _text(first.get("describe")) or None,
        )
    return DeploymentRun(tuple(roles))


def of_runs(
    runs: Iterable[Any], record_of: Callable[[str], Mapping[str, Any] | None]
) -> dict[str, DeploymentRun]:
    """Run id -> its deployment, for the runs of a campaign that ran over several roles
    (empty for a campaign of one unit)."""
    out: dict[str, DeploymentRun] = {}
    for r in runs:
        if r.cached_from:
            continue  # a reused run's record is its source's
        dep = of_record(record_of(r.id))
        if dep is not None:
            out[r.id] = dep
    # a reused run shows what its source recorded
    for r in runs:
        if r.cached_from and r.cached_from not in out:
            dep = of_record(record_of(r.cached_from))
            if dep is not None:
                out[r.cached_from] = dep
        if r.cached_from in out:
            out[r.id] = out[r.cached_from]
    return out


def roles_table(deps: Mapping[str, DeploymentRun]) -> list[RoleRun]:
    """The roles of a campaign's deployment in start order, from the first run recorded
    (every run of a campaign runs on one set of roles)."""
    first = next(iter(deps.values()), None)
    return list(first.roles) if first else []


def target_failure(
    runs: Iterable[Any], deps: Mapping[str, DeploymentRun], target: Any
) -> tuple[str, DeploymentRun] | None:
    """(run id, its deployment) of the first run that showed the target failure: the role
    and host the answer names."""
    if target is None:
        return None
    for r in sorted(runs, key=lambda r: r.seq):
        dep = deps.get(r.id)
        if dep is not None and dep.first_failure is not None and r.signature == target:
            return r.id, dep
    return None


def role_lines(dep: DeploymentRun) -> list[str]:
    """One line per role, in start order: where it ran, its verdict and signature."""
    out = []
    for r in dep.roles:
        said = r.verdict or "?"
        if r.signature:
            said += f": {r.signature}"
        first = "  <- failed first" if r.role == dep.first_role else ""
        if any(r.role == name for name, _ in dep.tied):
            first = "  <- hung alike; which failed first cannot be told"
        out.append(f"{r.where()}: {said}{first}")
    return out


@dataclass(frozen=True)
class CampaignDeployment:
    """A campaign's runs over several roles: the roles, each run's deployment, and the run
    that fixed the target failure with the role and host where it happened."""

    roles: tuple[RoleRun, ...]
    runs: Mapping[str, DeploymentRun]
    #: (run id, its deployment) of the first run that showed the target failure
    target: tuple[str, DeploymentRun] | None

    def answer_line(self) -> str | None:
        """`the target failure happens first on node1 on b300-02 (run c.2): node1 on
        b300-02: <signature>; node0 then timed out in a collective`."""
        if self.target is None:
            return None
        run_id, dep = self.target
        if dep.tied:
            return f"the target failure: which role failed first cannot be told (run {run_id})" + (
                f": {dep.describe}" if dep.describe else ""
            )
        return f"the target failure happens first on {dep.first_failure} (run {run_id})" + (
            f": {dep.describe}" if dep.describe else ""
        )

    def first_failure_of(self, run_id: str) -> str:
        """`node1 on b300-02` for a run whose roles failed, "" otherwise."""
        dep = self.runs.get(run_id)
        return (dep.first_failure or "") if dep else ""

    def to_json(self) -> dict[str, Any]:
        first = None
        if self.target is not None:
            run_id, dep = self.target
            first = {"run": run_id} | (dep.to_json()["first_failure"] or {})
        return {
            "roles": [
                {k: v for k, v in r.to_json().items() if k not in ("verdict", "signature")}
                for r in self.roles
            ],
            "target_first_failure": first,
            "runs": {
                rid: {
                    "hosts": {r.role: r.host for r in d.roles},
                    "first_failure": d.to_json()["first_failure"],
                }
                for rid, d in self.runs.items()
            },
        }


def of_campaign(
    runs: Iterable[Any], record_of: Callable[[str], Mapping[str, Any] | None], target: Any
) -> CampaignDeployment | None:
    """The deployment a campaign ran on, or None for a campaign of one unit."""
    runs = list(runs)
    deps = of_runs(runs, record_of)
    if not deps:
        return None
    return CampaignDeployment(tuple(roles_table(deps)), deps, target_failure(runs, deps, target))
