"""One Slurm job for a deployment of node ranks: `--nodes N`, one task per node.

A deployment whose roles are the node ranks 0..N-1 of one server (SGLang's `--nnodes N
--node-rank R --dist-init-addr HOST:PORT`) runs as one job over N nodes. The batch script
runs on the allocation's first node, as rank 0 does; it starts one `srun` step of N tasks,
one per node, and each task runs the launch of its rank (`ranks.sh`, chosen by
`$SLURM_NODEID`) with `--node-rank "$SLURM_NODEID"`, `--nnodes N` and `--dist-init-addr`
on the first node's address (its `NodeAddr`, the config's port, else `DEFAULT_INIT_PORT`).
Each rank's output is `rank-K.log` in the run's directory; `server.log` is rank 0's, whose
health the script polls on the node's loopback. After the job, each rank's log is judged
on its own and the run's failure is the first across the ranks (`rank_results`,
`deployment_record`). Pure: text in, text out.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Collection
from dataclasses import replace

from orchestrator.config.deployment import Role, deployment, launch
from orchestrator.config.experiment import Experiment
from orchestrator.diagnosis.classify.analyze import analyze_log
from orchestrator.diagnosis.first_failure import (
    CONSEQUENCE_KINDS,
    FirstFailure,
    RoleResult,
    first_stamp,
)
from orchestrator.errors import ConfigError
from orchestrator.execution.slurm.facts import server_lines

#: the init port when the config names no `--dist-init-addr` (SGLang's examples use it)
DEFAULT_INIT_PORT = 5000
#: placeholders for the words the job fills in on the node
_RANK = "\0ORCH_RANK\0"
_HEAD = "\0ORCH_HEAD\0"


def node_roles(exp: Experiment) -> tuple[Role, ...]:
    """The node ranks of a deployment in rank order; () for a single unit. A deployment
    with a role of another kind (prefill, decode, a router) is refused: one job runs the
    ranks of one server."""
    if not exp.roles:
        return ()
    dep = deployment(exp)
    others = [r.name for r in dep.roles if r.kind != "node"]
    if others:
        raise ConfigError(
            "a Slurm host runs a deployment of node ranks only (one job over its nodes); "
            f"roles {', '.join(others)} are of another kind",
            file=exp.source,
            key="roles",
            hint="run prefill/decode/router roles on SSH hosts (roles.NAME.host)",
        )
    return tuple(sorted(dep.roles, key=lambda r: r.rank or 0))


def node_count(exp: Experiment) -> int:
    """How many nodes the job of this config asks for (1 for a single unit)."""
    return max(len(node_roles(exp)), 1)


def head_launch(exp: Experiment) -> Experiment:
    """Rank 0's launch: what the batch script polls, probes and reads the node's
    environment with (the config itself for a single unit)."""
    roles = node_roles(exp)
    return launch(exp, roles[0].name) if roles else exp


def _init_port(value: object) -> int:
    text = str(value or "")
    port = text.rsplit(":", 1)[-1] if ":" in text else ""
    return int(port) if port.isdigit() else DEFAULT_INIT_PORT


def rank_argv(exp: Experiment, role: Role, n: int) -> list[str]:
    """A rank's command line, with placeholders for its node rank and the first node's
    address (`shell_words` turns them into `"$SLURM_NODEID"` and `"$ORCH_HEAD"`)."""
    one = launch(exp, role.name)
    flags = dict(one.flags)
    port = _init_port(flags.get("dist-init-addr"))
    flags["nnodes"] = n
    flags["node-rank"] = _RANK
    flags["dist-init-addr"] = f"{_HEAD}:{port}"
    return replace(one, flags=tuple(flags.items())).argv()


def shell_words(argv: list[str], word: Callable[[str], str] = shlex.quote) -> str:
    """The words quoted for bash, the placeholders as the job's variables."""
    out = []
    for w in argv:
        if w == _RANK:
            out.append('"$SLURM_NODEID"')
        elif w.startswith(_HEAD):
            out.append('"$ORCH_HEAD"' + shlex.quote(w[len(_HEAD) :]))
        else:
            out.append(word(w))
    return " ".join(out)


def ranks_script(
    exp: Experiment,
    word: Callable[[str], str] = shlex.quote,
    secret_keys: Collection[str] = (),
) -> str:
    """`ranks.sh`: each task starts the launch of its rank (its own environment, then its
    command) by `$SLURM_NODEID`. `word` quotes a word (a secret's word becomes a reference
    to its variable); the variables of `secret_keys` come from the job's `secret.env`,
    never from the script."""
    roles = node_roles(exp)
    n = len(roles)
    lines = ["#!/bin/bash", 'case "$SLURM_NODEID" in']
    for role in roles:
        one = launch(exp, role.name)
        env = " ".join(
            f"{k}={shlex.quote(v)}" for k, v in one.env_map().items() if k not in secret_keys
        )
        prefix = f"export {env}; " if env else ""
        lines.append(f"  {role.rank}) {prefix}exec {shell_words(rank_argv(exp, role, n), word)} ;;")
    lines += [
        '  *) echo "orchestrator: no node rank $SLURM_NODEID in this deployment" >&2; exit 2 ;;',
        "esac",
    ]
    return "\n".join(lines) + "\n"


#: the end of the ranks script in the job script's here-document
RANKS_EOF = "ORCH_RANKS_EOF"


def launch_lines(
    exp: Experiment,
    word: Callable[[str], str] = shlex.quote,
    secret_keys: Collection[str] = (),
) -> list[str]:
    """The job script's lines that start the ranks (in place of a single server's line):
    the first node's address, `ranks.sh`, and one `srun` step of one task per node, in a
    session of its own, whose pid the script watches as it watches a single server."""
    n = node_count(exp)
    script = ranks_script(exp, word, secret_keys)
    return [
        'FIRST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        # the first node's address (its NodeAddr), which the other ranks connect to
        "ORCH_HEAD=$(scontrol show node \"$FIRST\" -o 2>/dev/null | tr ' ' '\\n' | "
        "sed -n 's/^NodeAddr=//p')",
        "ORCH_HEAD=${ORCH_HEAD:-$FIRST}",
        "export ORCH_HEAD",
        'res rank_nodes "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)"',
        'res head "$ORCH_HEAD"',
        f"cat > \"$D/ranks.sh\" <<'{RANKS_EOF}'",
        *script.splitlines(),
        RANKS_EOF,
        'ln -sf rank-0.log "$D/server.log"',
        f"setsid srun --nodes={n} --ntasks={n} --ntasks-per-node=1 --kill-on-bad-exit=0 "
        '--output="$D/rank-%n.log" bash "$D/ranks.sh" > "$D/srun.log" 2>&1 < /dev/null &',
    ]


# ---------------------------------------------------------------------------- judged


def rank_mark(k: int) -> str:
    """The line before rank K's log tail in what the collection reads back."""
    return f"@@RANK-{k}@@"


def rank_results(
    ranks: tuple[Role, ...], out: dict[str, str], result: dict[str, str], year: int
) -> list[tuple[RoleResult, str]]:
    """Each node rank's part of a job, judged from its own log (`rank-K.log`), with its
    log tail: the node it ran on (the job's K-th node), its failure and when it happened
    (the log's own stamp, `year` completing torch's; the nodes share the cluster's clock, no
    offset is measured)."""
    nodes = [n for n in result.get("rank_nodes", "").split(",") if n]
    out_roles = []
    for k, role in enumerate(ranks):
        log = server_lines(out.get(f"rank-{k}", ""))
        a = analyze_log(log) if log.strip() else None
        failed = a is not None and a.signature is not None
        out_roles.append(
            (
                RoleResult(
                    role.name,
                    nodes[k] if k < len(nodes) else "?",
                    signature=a.signature if failed else None,
                    kind=a.kind if failed else None,
                    failed_at=first_stamp(a.excerpt, year) if failed else None,
                ),
                log,
            )
        )
    return out_roles


def deployment_record(
    ranks: tuple[Role, ...],
    roles: list[tuple[RoleResult, str]],
    first: FirstFailure | None,
    exp: Experiment,
    job: dict[str, object],
) -> dict[str, object]:
    """A deployment's host record (every role's node, verdict, signature and log tail in
    start order, and the first failure), with the job's own record under `slurm`."""
    by_name = {r.role: (r, log) for r, log in roles}
    out_roles = []
    for role in ranks:
        r, log = by_name.get(role.name, (RoleResult(role.name, "?"), ""))
        verdict = "pass"
        if r.signature is not None and first is not None:
            # the others: waited for it (a hang, a watchdog's timeout), or failed too
            consequence = r.kind in CONSEQUENCE_KINDS
            verdict = "fail" if first.role == role.name else "timeout" if consequence else "other"
        out_roles.append(
            {
                "role": role.name,
                "kind": role.kind,
                "rank": role.rank,
                "host": r.host,
                "unit": None,
                "verdict": verdict,
                "signature": str(r.signature) if r.signature else None,
                "failed_at": r.failed_at,
                "clock_offset": 0.0,
                "log_tail": log,
                "rendered": None,
                "invocation": f"slurm job {job.get('job')} task {role.rank}",
                "command": shell_words(rank_argv(exp, role, len(ranks))),
            }
        )
    return {
        "manager": "deployment",
        "roles": out_roles,
        "first_failure": None
        if first is None
        else {"role": first.role, "host": first.host, "describe": first.describe()},
        "slurm": job,
    }
