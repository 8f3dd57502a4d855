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
`deployment_record`).

A rank's task leaves `rank-K.exit` (its exit status and time) when its server ends on
its own; the job stops every rank a short grace after the first such end (as a
deployment on SSH hosts does: the others' last lines, then the stop), and the exits seen
before it stops anything are the job's `rank_exit_K` results. A rank with none was still
running when the job stopped it: before the deployment served, it was blocked, and one
that never logged a failure hung silently (the rank the others' watchdogs waited for).
Pure: text in, text out.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Collection
from dataclasses import replace

from orchestrator.config.deployment import Role, deployment, launch
from orchestrator.config.experiment import Experiment
from orchestrator.diagnosis.classify.analyze import analyze_log
from orchestrator.diagnosis.classify.judge import RunEvidence, judge
from orchestrator.diagnosis.first_failure import (
    CONSEQUENCE_KINDS,
    HANG,
    FirstFailure,
    RoleResult,
    first_stamp,
)
from orchestrator.diagnosis.verdicts import Signature, Verdict
from orchestrator.errors import ConfigError
from orchestrator.execution.slurm.facts import server_lines

#: the init port when the config names no `--dist-init-addr` (SGLang's examples use it)
DEFAULT_INIT_PORT = 5000
#: seconds the other ranks get for their last lines once one rank's server ended (the
#: grace of a deployment on SSH hosts)
DEATH_GRACE_S = 5
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


def ran_argv(exp: Experiment, role: Role, n: int, head: str) -> list[str]:
    """A rank's command line as its task ran it: its node rank and the first node's
    address (`head`, what the job resolved) in place of the placeholders."""
    return [
        str(role.rank) if w == _RANK else head + w[len(_HEAD) :] if w.startswith(_HEAD) else w
        for w in rank_argv(exp, role, n)
    ]


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
        lines.append(f"  {role.rank}) {prefix}{shell_words(rank_argv(exp, role, n), word)} ;;")
    lines += [
        '  *) echo "orchestrator: no node rank $SLURM_NODEID in this deployment" >&2; exit 2 ;;',
        "esac",
        # the rank's own end, beside this script (a rank the job stops leaves none: the
        # stop ends this shell with its server)
        "rc=$?",
        'printf \'%s %s\\n\' "$rc" "$(date +%s.%N)" > "${0%/*}/rank-$SLURM_NODEID.exit"',
        'exit "$rc"',
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
        'rm -f "$D"/rank-*.exit',
        f"cat > \"$D/ranks.sh\" <<'{RANKS_EOF}'",
        *script.splitlines(),
        RANKS_EOF,
        'ln -sf rank-0.log "$D/server.log"',
        f"setsid srun --nodes={n} --ntasks={n} --ntasks-per-node=1 --kill-on-bad-exit=0 "
        '--output="$D/rank-%n.log" bash "$D/ranks.sh" > "$D/srun.log" 2>&1 < /dev/null &',
    ]


def watch_functions() -> list[str]:
    """The job script's functions that see a rank's own end: `rank_ended` (some rank's
    server ended), `ranks_seen` (records, once, the exits seen before the job stops any
    rank: call it before every stop)."""
    return [
        'rank_ended() { compgen -G "$D/rank-*.exit" > /dev/null; }',
        "ranks_seen() {",
        '  [ -n "${RANKS_SEEN:-}" ] && return 0; RANKS_SEEN=1',
        '  for f in "$D"/rank-*.exit; do',
        '    [ -f "$f" ] || continue; k=${f##*/rank-}; res "rank_exit_${k%.exit}" "$(cat "$f")"',
        "  done",
        "}",
    ]


def watch_lines() -> list[str]:
    """The health loop's check for a rank that ended: the others get a grace for their
    last lines, then every rank is stopped (a rank blocked on the dead one would otherwise
    hold the job until the health deadline)."""
    return [
        "  if rank_ended; then",
        f"    for i in $(seq {DEATH_GRACE_S * 10}); do alive || break; sleep 0.1; done",
        "    state=dead; ranks_seen; stop_server; died; break",
        "  fi",
    ]


# ---------------------------------------------------------------------------- judged


def rank_mark(k: int) -> str:
    """The line before rank K's log tail in what the collection reads back."""
    return f"@@RANK-{k}@@"


def rank_exit(result: dict[str, str], k: int) -> tuple[int | None, float | None] | None:
    """Rank K's own end (exit status, time) when its server ended before the job stopped
    anything; None when it was still running then."""
    words = result.get(f"rank_exit_{k}", "").split()
    if not words:
        return None
    code = int(words[0]) if words[0].lstrip("-").isdigit() else None
    try:
        when = float(words[1]) if len(words) > 1 else None
    except ValueError:
        when = None
    return code, when


def rank_evidence(k: int, log: str, result: dict[str, str]) -> RunEvidence:
    """What the job saw of rank K, for the classifier: its log, its own exit, and, when it
    was still running as the job ended without serving, that it was blocked."""
    ready = result.get("state") == "ready"
    ended = rank_exit(result, k)
    return RunEvidence(
        log_tail=log,
        became_ready=ready,
        died_after_ready=ready and ended is not None,
        exit_code=ended[0] if ended is not None else None,
        timed_out=not ready and ended is None,
    )


def rank_results(
    ranks: tuple[Role, ...], out: dict[str, str], result: dict[str, str], year: int
) -> list[tuple[RoleResult, str]]:
    """Each node rank's part of a job, judged from its own log (`rank-K.log`) and end,
    with its log tail: the node it ran on (the job's K-th node), its failure and when it
    happened (the log's own stamp, `year` completing torch's, else its exit; the nodes
    share the cluster's clock, no offset is measured). A rank blocked without a word when
    the job ended is a silent hang, as on SSH hosts."""
    nodes = [n for n in result.get("rank_nodes", "").split(",") if n]
    out_roles = []
    for k, role in enumerate(ranks):
        log = server_lines(out.get(f"rank-{k}", ""))
        verdict, sig = judge(rank_evidence(k, log, result), None)
        node = nodes[k] if k < len(nodes) else "?"
        if verdict is Verdict.INFRA:  # killed from outside, say: the run is host trouble
            why = "host trouble during the run"
            out_roles.append((RoleResult(role.name, node, absent=why, infra=True), log))
            continue
        failed = sig is not None and verdict is not Verdict.PASS
        a = analyze_log(log)
        ended = rank_exit(result, k)
        kind = None
        stamp = None
        if failed and sig is not None:
            kind = a.kind if a.signature == sig else HANG if _hang(sig) else None
            stamp = first_stamp(a.excerpt, year) if a.signature == sig and a.excerpt else None
            if stamp is None and ended is not None:
                stamp = ended[1]
        out_roles.append(
            (
                RoleResult(
                    role.name,
                    node,
                    signature=sig if failed else None,
                    kind=kind,
                    failed_at=stamp,
                ),
                log,
            )
        )
    return out_roles


def _hang(sig: Signature) -> bool:
    return sig.error_class == "hang"


def deployment_record(
    ranks: tuple[Role, ...],
    roles: list[tuple[RoleResult, str]],
    first: FirstFailure | None,
    exp: Experiment,
    job: dict[str, object],
    head: str | None = None,
) -> dict[str, object]:
    """A deployment's host record (every role's node, verdict, signature and log tail in
    start order, and the first failure), with the job's own record under `slurm`. With
    `head`, the first node's address the job resolved, each role's `argv` is the command
    line its task ran (what `show` and the issue text give)."""
    by_name = {r.role: (r, log) for r, log in roles}
    out_roles = []
    for role in ranks:
        r, log = by_name.get(role.name, (RoleResult(role.name, "?"), ""))
        verdict = "pass"
        if r.infra:
            verdict = "infra"
        elif r.signature is not None and first is not None:
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
                "argv": ran_argv(exp, role, len(ranks), head) if head else None,
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
