"""`hosts check` for a Slurm cluster: through its login node, can a campaign run there?

sinfo answers; the partition exists and is up; the gres the jobs ask for is configured on
its nodes; how many nodes are idle (or only partly used) now; the run directory is
writable. For a deployment of node ranks (`deployment_checks`): the job it would submit
can run there (one job over N nodes: the partition has N nodes that take jobs, and every
role is a node rank). Each check is one line with what to fix. The executor asks the same
of a cluster before its campaign (`check_cluster`) and before a deployment's job
(`check_nodes`), and stops on the same errors.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.errors import OrchestratorError, SchedulerError
from orchestrator.execution.checks import Check
from orchestrator.execution.slurm import facts, multinode
from orchestrator.execution.transport import Transport


def check_nodes(host: Host, run: Callable[..., object], needed: int, what: str) -> None:
    """The partition has `needed` nodes that take jobs (a deployment's job asks one per
    node rank); else our error, naming the nodes it has."""
    opts = host.slurm
    assert opts is not None
    r = run(f"sinfo -h -N -p {shlex.quote(opts.partition)} -o '%N|%t'", timeout=60)
    nodes = facts.parse_sinfo_nodes(getattr(r, "stdout", "") or "")
    usable = [n for n, state in nodes.items() if state not in facts.UNUSABLE]
    if len(usable) >= needed:
        return
    has = ", ".join(f"{n} ({state})" for n, state in sorted(nodes.items())) or "none"
    raise SchedulerError(
        f"{host.describe()}: {what} needs {needed} nodes, one per node rank; partition "
        f"'{opts.partition}' has {len(usable)} that take jobs: {has}",
        hint=f"run it where the partition has {needed} nodes (slurm.partition of "
        f"{host.name} in the hosts file), or on SSH hosts (roles.NAME.host)",
    )


def check_cluster(host: Host, run: Callable[..., object]) -> facts.Partition:
    """The partition exists, is up, and offers the gres the jobs ask for; else our error."""
    opts = host.slurm
    assert opts is not None
    r = run("sinfo -h -o '%P|%a|%D|%t|%G'", timeout=60)
    if not getattr(r, "ok", False):
        err = (getattr(r, "stderr", "") or getattr(r, "stdout", "")).strip()
        raise SchedulerError(
            f"{host.describe()}: sinfo does not answer: {err.splitlines()[-1] if err else '?'}",
            hint="check that Slurm's clients work on the login node (and slurm.conf in the "
            "hosts file, if the cluster's is not the default)",
        )
    parts = facts.parse_sinfo(getattr(r, "stdout", ""))
    part = parts.get(opts.partition)
    if part is None:
        raise SchedulerError(
            f"{host.describe()}: no partition '{opts.partition}' on this cluster",
            hint="partitions: "
            + (", ".join(sorted(parts)) or "none")
            + f"; set slurm.partition of {host.name} in the hosts file",
        )
    if opts.gres and not facts.gres_offered(opts.gres, part.gres):
        raise SchedulerError(
            f"{host.describe()}: partition '{opts.partition}' has no node with gres "
            f"{opts.gres} (it offers {', '.join(part.gres) or 'no gres'})",
            hint=f"set slurm.gres of {host.name} to what the nodes have, or configure it in "
            "gres.conf",
        )
    return part


def _runner(host: Host, t: Transport) -> Callable[..., object]:
    opts = host.slurm
    assert opts is not None

    def run(command: str, *, timeout: float = 60):  # noqa: ANN202
        if opts.conf:
            command = f"export SLURM_CONF={shlex.quote(opts.conf)}; {command}"
        return t.run(command, timeout=timeout)

    return run


def deployment_checks(host: Host, t: Transport, exp: Experiment) -> list[Check]:
    """Whether the one job of `exp`'s node ranks can run on this cluster: every role is a
    node rank, and the partition has a node that takes jobs for each."""
    try:
        n = len(multinode.node_roles(exp))
    except OrchestratorError as exc:  # roles of another kind: no job over the nodes
        return [Check("deployment", False, str(exc), exc.hint)]
    if n == 0:
        return []
    try:
        check_nodes(host, _runner(host, t), n, f"deployment {exp.name}")
    except OrchestratorError as exc:
        return [Check("nodes", False, str(exc), exc.hint)]
    return [Check("nodes", True, f"one job of {n} nodes, one per node rank")]


def slurm_checks(host: Host, t: Transport) -> list[Check]:
    opts = host.slurm
    assert opts is not None
    run = _runner(host, t)

    checks: list[Check] = []
    v = run("sinfo --version", timeout=30)
    if not v.ok:
        return [
            Check(
                "slurm",
                False,
                (v.stderr or v.stdout).strip()[-200:] or "sinfo failed",
                "install Slurm's clients on the login node, or set slurm.conf",
            )
        ]
    checks.append(Check("slurm", True, f"{v.stdout.strip()}; sinfo answers"))
    try:
        part = check_cluster(host, run)
    except OrchestratorError as exc:
        name = "gres" if "gres" in str(exc) else "partition"
        return [*checks, Check(name, False, str(exc), exc.hint)]
    checks.append(
        Check(
            "partition",
            part.available,
            f"{part.name}: {'up' if part.available else 'down'}, {part.nodes} node(s)",
            None if part.available else "the partition is not up",
        )
    )
    if opts.gres:
        checks.append(
            Check("gres", True, f"{opts.gres} requested; nodes offer {', '.join(part.gres)}")
        )
    usable = sum(n for s, n in part.states.items() if s in ("idle", "mix"))
    states = ", ".join(f"{n} {s}" for s, n in sorted(part.states.items()))
    checks.append(
        Check(
            "idle nodes",
            usable > 0,
            f"{usable} of {part.nodes} can start jobs now ({states})",
            None if usable else "jobs will wait in the queue until a node frees up",
        )
    )
    d = shlex.quote(host.run_dir or "")
    w = t.run(f"mkdir -p {d} && test -w {d}", timeout=30)
    checks.append(
        Check(
            "run directory",
            w.ok,
            f"{host.run_dir} writable" if w.ok else (w.stderr.strip()[-200:] or "not writable"),
            None if w.ok else "set run_dir to a directory shared by the login node and the nodes",
        )
    )
    return checks
