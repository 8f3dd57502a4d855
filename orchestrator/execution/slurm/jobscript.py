"""The job script of one variant on a Slurm cluster, and the `sbatch` command that submits it.

Pure: text in, text out. The script runs on the compute node the scheduler picked: it
starts the server in its own session, polls the config's health URL on that node's own
loopback until `ready_after` answers in a row (the health deadline counts from the
server's start, never from submission: time spent pending is the queue's, not the
server's), runs the probe there, checks the server survived it, stops it, and leaves
in the run's directory (on a filesystem the login node shares) the server's log, the
probe's output, the node's environment and a small `result` file of `key=value` lines
(state, exit status, timings). The controller never needs a port of the compute node.

Every value is quoted (shlex). Secrets are never in the script: secret environment
variables and secret flag values go to a 0600 `secret.env` beside it (written through
stdin), which the script sources; a secret flag's word in the command line is a
reference to its variable.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass

from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import SlurmOptions
from orchestrator.errors import ConfigError
from orchestrator.execution import environment as envfacts
from orchestrator.execution.services.base import health_url
from orchestrator.execution.slurm import multinode

#: name and comment of every job: `squeue --name` finds the campaign's jobs again after
#: a controller died (the comment says which run and which controller)
JOB_PREFIX = "orch-"
#: seconds between health polls on the node (the config's `health.interval` wins)
POLL_S = 0.5
#: seconds the server gets to stop on SIGTERM before SIGKILL
STOP_GRACE_S = 20
#: the small file of `key=value` lines (state, exit, timings) the job leaves at its end
RESULT = "result"


@dataclass(frozen=True)
class JobFiles:
    """Where one run's files live (a directory the login node and the nodes share)."""

    dir: str

    def path(self, leaf: str) -> str:
        return f"{self.dir}/{leaf}"

    @property
    def script(self) -> str:
        return self.path("job.sh")

    @property
    def secrets(self) -> str:
        return self.path("secret.env")

    @property
    def log(self) -> str:
        return self.path("server.log")

    @property
    def result(self) -> str:
        return self.path(RESULT)

    @property
    def probe(self) -> str:
        return self.path("probe.out")

    @property
    def environment(self) -> str:
        return self.path("environment")

    @property
    def slurm_out(self) -> str:
        return self.path("slurm.out")


def job_name(campaign: str) -> str:
    return f"{JOB_PREFIX}{campaign}"[:64] if campaign else f"{JOB_PREFIX}run"


def job_comment(campaign: str, run_id: str, controller: str) -> str:
    return f"orchestrator campaign={campaign} run={run_id} controller={controller}"


def parse_comment(text: str) -> dict[str, str]:
    """`orchestrator campaign=C run=R controller=X` -> {campaign, run, controller}."""
    if not text.startswith("orchestrator "):
        return {}
    return dict(w.split("=", 1) for w in text.split()[1:] if "=" in w)


def time_limit(exp: Experiment, opts: SlurmOptions) -> str:
    """The job's `--time`: the configured one, else the health deadline + probe + stop +
    a margin, in whole minutes (Slurm's unit)."""
    if opts.time:
        return opts.time
    seconds = exp.health.timeout + (exp.probe.timeout if exp.probe else 0) + 300
    return str(max(math.ceil(seconds / 60), 1))


def sbatch_argv(
    exp: Experiment,
    opts: SlurmOptions,
    files: JobFiles,
    *,
    campaign: str,
    run_id: str,
    controller: str,
) -> list[str]:
    """The `sbatch` words (the script comes on stdin: it is read at submission)."""
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name(campaign)}",
        f"--comment={job_comment(campaign, run_id, controller)}",
        f"--partition={opts.partition}",
        f"--time={time_limit(exp, opts)}",
        f"--output={files.slurm_out}",
        f"--chdir={files.dir}",
        f"--nodes={multinode.node_count(exp)}",
        f"--ntasks={multinode.node_count(exp)}",
        "--ntasks-per-node=1",
        "--no-requeue",
    ]
    if opts.gres:
        argv.append(f"--gres={opts.gres}")
    if opts.account:
        argv.append(f"--account={opts.account}")
    if opts.constraint:
        argv.append(f"--constraint={opts.constraint}")
    if opts.exclusive:
        argv.append("--exclusive")
    argv += list(opts.options)
    return argv


def secret_env(exp: Experiment) -> dict[str, str]:
    """Variable -> value of what must not be in the script: secret environment variables
    and secret flag values (as ORCH_SECRET_<NAME>)."""
    secrets = exp.secrets()
    out: dict[str, str] = {}
    env = exp.env_map()
    for name, value in secrets.items():
        keys = [k for k, v in env.items() if v == value]
        for k in keys:
            out[k] = value
        if any(isinstance(v, str) and v == value for _, v in exp.flags):
            out[_flag_var(name)] = value
    return out


def _flag_var(name: str) -> str:
    return "ORCH_SECRET_" + re.sub(r"\W", "_", name).upper()


#: the first line of a secrets file: which controller wrote it (`restore` keeps the files
#: of live controllers and of queued jobs, and removes the others)
SECRETS_HEADER = "# orchestrator controller="


def secret_file_text(exp: Experiment, *, controller: str = "") -> str:
    """The 0600 `secret.env` of a run ("" when it has no secret)."""
    lines = "".join(f"{k}={shlex.quote(v)}\n" for k, v in secret_env(exp).items())
    return f"{SECRETS_HEADER}{controller}\n{lines}" if lines else ""


def render(
    exp: Experiment,
    files: JobFiles,
    *,
    run_id: str,
    campaign: str,
    env_keys: frozenset[str] = frozenset(),
    private_network: bool = False,
) -> str:
    """The job script (bash) of one run; of a deployment of node ranks, one job over its
    nodes (see `multinode`: rank 0's launch is polled, probed and read)."""
    secrets = exp.secrets()
    secret_vars = secret_env(exp)
    q = shlex.quote
    by_value = {v: k for k, v in secrets.items()}

    def word(w: str) -> str:
        # a secret flag value is a reference to its variable in secret.env
        if w in by_value and _flag_var(by_value[w]) in secret_vars:
            return f'"${_flag_var(by_value[w])}"'
        return q(w)

    ranks = multinode.node_roles(exp)
    if ranks and private_network:
        raise ConfigError(
            "a deployment's job needs the nodes' own network (srun reaches the other "
            "nodes, the ranks meet at the first node's address): private_network is for "
            "jobs of one server each",
            file=exp.source,
            key="roles",
            hint="run it on a Slurm host without slurm.private_network in the hosts file",
        )
    # a deployment's ranks that ended on their own, noted before the job stops any
    seen = "ranks_seen; " if ranks else ""
    head = multinode.head_launch(exp)
    launch_lines = (
        multinode.launch_lines(exp, word, secret_vars)
        if ranks
        else [
            f'setsid {" ".join(word(w) for w in exp.argv())} > "$D/server.log" 2>&1 < /dev/null &'
        ]
    )
    exp = head  # what the script polls, probes and reads the node's environment with
    env = exp.env_map()
    url = health_url(exp)
    interval = exp.health.interval if exp.health.interval is not None else POLL_S
    probe_cmd = exp.probe.command(exp.port) if exp.probe else None
    envcmd = envfacts.command(exp.exec, env=envfacts.public_env(exp), workdir=exp.workdir)
    lines: list[str] = [
        "#!/bin/bash",
        f"# written by orchestrator for run {run_id} of campaign {campaign or '-'};",
        "# the server's argv and environment are the variant's; secrets are in secret.env",
        "set -u",
        "umask 077",
    ]
    if private_network:
        # Jobs that share a node would all bind the config's port: each gets its own
        # network namespace (its own loopback), the server, health checks and probe in it.
        lines += [
            'if [ "${ORCH_PRIVATE_NET:-}" != 1 ]; then',
            "  export ORCH_PRIVATE_NET=1",
            '  if [ "$(id -u)" = 0 ]; then exec unshare --net bash "$0" "$@"; fi',
            '  exec unshare --net --map-root-user bash "$0" "$@"',
            "fi",
            "ip link set lo up",
        ]
    lines += [
        f"D={q(files.dir)}",
        'rm -f "$D/result"',
        'R="$D/result.tmp"',
        ': > "$R"',
        'res() { printf \'%s=%s\\n\' "$1" "$2" >> "$R"; }',
        "now() { date +%s.%N; }",
        'res job "${SLURM_JOB_ID:-}"',
        'res node "$(hostname)"',
        'res job_start "$(now)"',
        # the node's own environment, read with the server's interpreter before it starts
        f'( {envcmd} ) > "$D/environment" 2>/dev/null < /dev/null',
        # the secrets: read once, then gone from the shared filesystem
        'if [ -f "$D/secret.env" ]; then set -a; . "$D/secret.env"; set +a;'
        ' rm -f "$D/secret.env"; fi',
    ]
    for k in exp.unsetting(env_keys).unset:
        lines.append(f"unset {k}")
    for k, v in env.items():
        if k not in secret_vars:
            lines.append(f"export {k}={q(v)}")
    if exp.workdir:
        lines.append(
            f'cd {q(exp.workdir)} || {{ res state cd_failed; mv "$R" "$D/result"; exit 0; }}'
        )
    lines += [
        *launch_lines,
        "PID=$!",
        'res server_start "$(now)"',
        'res pid "$PID"',
        "stop_server() {",
        '  kill -s TERM -- "-$PID" 2>/dev/null || return 0',
        f'  for i in $(seq {STOP_GRACE_S * 10}); do kill -s 0 "$PID" 2>/dev/null || return 0;'
        " sleep 0.1; done",
        '  kill -s KILL -- "-$PID" 2>/dev/null; return 0',
        "}",
        *(multinode.watch_functions() if ranks else []),
        # scancel and the time limit reach us here: stop the server, leave what is known
        f'on_term() {{ res signalled "$(now)"; {seen}stop_server; mv "$R" "$D/result"; '
        "exit 143; }",
        "trap on_term TERM INT",
        "alive() { kill -s 0 \"$PID\" 2>/dev/null && ! grep -q '^State:.*Z' "
        '"/proc/$PID/status" 2>/dev/null; }',
        'died() { wait "$PID"; res exit "$?"; res dead_at "$(now)"; }',
        f"URL={q(url)}",
        "health() { curl -s -o /dev/null -w '%{http_code}' --max-time 3 \"$URL\" "
        "2>/dev/null || true; }",
        f"T0=$(now); LIMIT={exp.health.timeout!r}; NEED={int(exp.health.ready_after)}; streak=0",
        "state=timeout",
        "while :; do",
        "  if ! alive; then state=dead; died; break; fi",
        *(multinode.watch_lines() if ranks else []),
        "  code=$(health)",
        '  if [ "$code" = 200 ]; then streak=$((streak + 1)); else streak=0; fi',
        '  if [ "$streak" -ge "$NEED" ]; then state=ready; break; fi',
        '  if awk -v a="$(now)" -v b="$T0" -v l="$LIMIT" \'BEGIN {exit !(a - b >= l)}\'; then'
        " break; fi",
        f"  sleep {interval!r} & wait $!",
        "done",
        'res state "$state"',
    ]
    lines += [
        'if [ "$state" = ready ]; then',
        '  res ready_at "$(now)"',
        f"  sleep {exp.health.settle!r} & wait $!",
        "  if ! alive; then res after_ready dead; died; fi",
        "fi",
    ]
    if probe_cmd is not None:
        assert exp.probe is not None
        lines += [
            'if [ "$state" = ready ] && alive; then',
            '  res probe_start "$(now)"',
            f'  timeout -k 10 {exp.probe.timeout!r} bash -c {q(probe_cmd)} > "$D/probe.out" '
            "2>&1 < /dev/null & wait $!",
            '  res probe_exit "$?"',
            # a crash under load takes a moment to show: look twice, one gap apart (half
            # a second, or the settle when shorter), before calling it alive
            "  for i in 1 2; do",
            f"    if [ $i = 2 ]; then sleep {min(0.5, exp.health.settle)!r} & wait $!; fi",
            "    if ! alive; then res after_probe dead; died; break; fi",
            "  done",
            "fi",
        ]
    lines += [
        f"{seen}if alive; then stop_server; fi",
        'res end "$(now)"',
        'mv "$R" "$D/result"',
        "exit 0",
    ]
    return "\n".join(lines) + "\n"


def parse_result(text: str) -> dict[str, str]:
    """The result file's `key=value` lines (the first value of a key wins, except exit)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and (key not in out or key in ("exit", "dead_at")):
            out[key.strip()] = value.strip()
    return out
