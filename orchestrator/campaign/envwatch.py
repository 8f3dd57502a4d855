"""Environment changes during a campaign: runs after a change are not mixed with those before.

Every run records the host's environment (driver, CUDA, packages, ...). When a run sees
an environment other than the one this campaign's earlier runs saw on the same host (a
driver upgraded overnight, a package reinstalled), its verdict is about another system:
the run is recorded as `infra` (never cached, never an answer) with what changed, and the
campaign stops saying so. The files a launch names are compared path by path: a file
read otherwise than an earlier run read it at the same path is a change, a file only
some variant names is part of that variant (`_files_changed`). Running the same command
again starts a new campaign in the new environment; the cache only serves verdicts
recorded in the environment the host has now (it is part of the cache key:
`orchestrator.execution.inputs`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.errors import InfraError
from orchestrator.execution.contract import RunResultLike
from orchestrator.execution.environment import changes
from orchestrator.execution.inputs import PARTS, LaunchInputs
from orchestrator.store.store import Store

#: a run's result: an executed run's, or a reused run's (returned as the type it came in)
R = TypeVar("R", bound=RunResultLike)


class EnvironmentChanged(InfraError):
    """A host's environment changed during a campaign; the campaign stopped there."""

    #: the campaign's status: not resumable by the same command (a new one starts)
    campaign_status = "changed"

    def __init__(self, message: str, *, host: str, what: list[str]) -> None:
        super().__init__(
            message,
            hint="the runs before the change are in the report; run the "
            "same command again for a new campaign in the new environment "
            "(verdicts from the old one are not reused)",
        )
        self.host = host
        self.what = what


def change_of(store: Store, cid: str, result: RunResultLike) -> list[str] | None:
    """What differs between this run's environment, and what else reached its server (the
    hosts file's env:, the unit's own definition, ...), and what the campaign's earlier runs
    on its host saw; None when nothing changed (or nothing is known)."""
    what: list[str] = []
    env = result.environment
    exp = result.experiment
    build = getattr(exp, "build", None)
    if build is not None:
        # each build is its own environment (its packages, its interpreter), and so is each
        # set of packages taken from another: a run is compared with the earlier runs of
        # its own build and packages on its host
        mine = (build, dict(getattr(exp, "packages", ()) or ()))
        first = next(
            (
                r
                for r in store.runs(cid)
                if r.host == result.host and r.env_digest and _build_of(r.config) == mine
            ),
            None,
        )
        then = store.environment(first.env_digest) if first is not None else None
        if env is not None and then is not None and first.env_digest != env.digest():
            what = changes(then, env) or ["environment digest differs"]
    else:
        # Only the first run on the host is read, not all the campaign's runs: this is asked
        # at every run recorded, and reading them all made a campaign's cost grow with the
        # square of its runs.
        seen = store.first_environment(cid, result.host) if env is not None else None
        if env is not None and seen is not None and seen[0] != env.digest():
            what = changes(seen[1], env) or ["environment digest differs"]
    inputs: LaunchInputs | None = result.inputs
    if inputs is not None:
        first = store.first_inputs(cid, result.host)
        if first is not None:
            # the environment's own change is told above, in detail; the files one by one
            # below; an unknown part is none
            for key, words in PARTS.items():
                now, then = getattr(inputs, key), getattr(first, key)
                if key not in SEPARATE and None not in (now, then) and now != then:
                    what.append(f"{words} changed")
        what += _files_changed(store, cid, result.host, inputs)
    return what or None


#: parts of the launch inputs `change_of` does not compare whole: the environment (told
#: in detail), the files (each variant names its own: compared path by path)
SEPARATE = ("environment", "files")


def _files_changed(store: Store, cid: str, host: str, inputs: LaunchInputs) -> list[str]:
    """The files this run read that an earlier run on the host read otherwise. A file is
    part of the launch that names it: a variant naming a file good does not (a chat
    template, a draft model, a JSON config) is that variant, not a host change; a file at
    one path that reads otherwise between two runs is (an edit, a copy, a deletion)."""
    named = dict(inputs.named or ())
    if not named:
        return []
    seen = store.first_file_digests(cid, host, list(named))
    # a relative word that named no file before names one now: something the server
    # writes in its directory, or a word that is no path (`auto`); a deletion is a change
    edited = [
        path
        for path, d in named.items()
        if path in seen and seen[path] != d and (path.startswith("/") or seen[path] != "-")
    ]
    if not edited:
        return []
    return [f"{PARTS['files']} changed: {', '.join(edited)}"]


def _build_of(config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    svc = config.get("service") or {}
    return svc.get("build"), dict(svc.get("packages") or {})


def as_infra(result: R, host: str, what: list[str]) -> R:
    """The run, recorded as `infra`: its verdict is about another environment."""
    return replace(
        result,
        verdict=Verdict.INFRA,
        signature=None,
        detail=f"environment of {host} changed during the campaign: "
        + "; ".join(what)
        + f" (was: {result.verdict.value})",
    )


def check(store: Store, cid: str, result: R) -> tuple[R, EnvironmentChanged | None]:
    """(the result to record, the error to raise after recording it, if any). A run that
    never reached the server (`invalid`: its flags refused, or its command not runnable on
    the host, as a typo'd or absent interpreter is) is a verdict about no environment: the
    environment read for it (an exec the host lacks reads as `absent`) is no change; only
    a file it names that reads otherwise than before is."""
    if result.verdict is Verdict.INVALID:
        # ... but a file the launch names that was edited or deleted since an earlier run
        # is why a launch the server took before is refused now: that is the host's change
        files = _files_changed(store, cid, result.host, result.inputs) if result.inputs else []
        what = files or None
    else:
        what = change_of(store, cid, result)
    if what is None:
        return result, None
    err = EnvironmentChanged(
        f"the environment of {result.host} changed during campaign {cid}: "
        + "; ".join(what)
        + "; runs after the change are not mixed with those before",
        host=result.host,
        what=what,
    )
    return as_infra(result, result.host, what), err


def check_hosts(store: Store, cid: str, hosts: list[Any]) -> None:
    """Before a resumed campaign uses its own runs: what the hosts file hands each host's
    servers (its `env:`, the service manager, the host class) must be what those runs had;
    otherwise the campaign stops as `changed` (its verdicts are about another launch)."""
    from orchestrator.execution.inputs import launch_inputs

    runs = store.runs(cid)
    for host in hosts:
        first = next((r.inputs for r in runs if r.host == host.name and r.inputs), None)
        if first is None:
            continue
        now = launch_inputs(host, unit=first.unit, environment=first.environment, files=first.files)
        what = [f"{d} changed" for d in now.differences(first)]
        if what:
            raise EnvironmentChanged(
                f"what {host.name} hands its servers changed since campaign {cid} ran there: "
                + "; ".join(what)
                + "; its runs are not mixed with new ones",
                host=host.name,
                what=what,
            )
