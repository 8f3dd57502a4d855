"""Pure parsers of what Slurm's clients print (squeue, scontrol, sacct, sinfo, sbatch), and
what a job's final state means for a run.

A job ends in one of Slurm's states. Only COMPLETED and FAILED say something about the
config (the job script then left its result file); TIMEOUT is the job's time limit (a
`timeout`); a node failure, a preemption, a requeue, a job cancelled by someone else or
a job that never started are host trouble (`infra`): retried, never cached.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: states in which the job has not finished
ACTIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
    }
)
#: final states that are the cluster's trouble, not the config's
INFRA = frozenset(
    {"NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "REVOKED", "SPECIAL_EXIT", "DEADLINE", "CANCELLED"}
)
#: the job script ran to its end (or was stopped): its result file tells what happened
RAN = frozenset({"COMPLETED", "FAILED", "OUT_OF_MEMORY"})

#: pending reasons that mean the job can never start as asked: our error, not a wait
NEVER = frozenset(
    {
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "BadConstraints",
        "InvalidAccount",
        "InvalidQOS",
        "PartitionConfig",
    }
)

SCTL_MARK = "@@SCTL"
RESULT_MARK = "@@RESULT"
LOG_MARK = "@@LOG"
PROBE_MARK = "@@PROBE"
ENV_MARK = "@@ENV"


@dataclass(frozen=True)
class JobState:
    """What the scheduler says about one job."""

    state: str  # PENDING, RUNNING, COMPLETED, ... ("" when the scheduler no longer knows it)
    reason: str = ""
    node: str = ""
    exit_code: int | None = None
    exit_signal: int | None = None
    restarts: int = 0

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD")

    @property
    def running(self) -> bool:
        return self.state in ("RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT")


def parse_scontrol(text: str) -> JobState | None:
    """`scontrol show job -o ID` (or its JobState/Reason/... words) -> the state; None
    when the job is unknown (purged, or never existed)."""
    if "Invalid job id" in text:
        return None
    m = re.search(r"\bJobState=(\S+)", text)
    if not m:
        return None
    reason = re.search(r"\bReason=(\S+)", text)
    node = re.search(r"\bNodeList=(\S+)", text)
    code = re.search(r"\bExitCode=(\d+):(\d+)", text)
    restarts = re.search(r"\bRestarts=(\d+)", text)
    return JobState(
        state=m[1].upper(),
        reason=(reason[1].replace("_", " ") if reason and reason[1] != "None" else ""),
        node=node[1] if node and node[1] != "(null)" else "",
        exit_code=int(code[1]) if code else None,
        exit_signal=int(code[2]) if code and int(code[2]) else None,
        restarts=int(restarts[1]) if restarts else 0,
    )


def parse_sacct(text: str) -> JobState | None:
    """`sacct -n -P -X -j ID -o State,ExitCode,NodeList,Reason` -> the state (accounting)."""
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < 2 or not cells[0].strip():
            continue
        state = cells[0].split()[0].upper()  # "CANCELLED by 0"
        code = re.match(r"(\d+):(\d+)", cells[1])
        return JobState(
            state=state,
            node=cells[2] if len(cells) > 2 and cells[2] != "None assigned" else "",
            reason=cells[3] if len(cells) > 3 and cells[3] != "None" else "",
            exit_code=int(code[1]) if code else None,
            exit_signal=int(code[2]) if code and int(code[2]) else None,
        )
    return None


def parse_squeue_jobs(text: str) -> list[tuple[str, str, str]]:
    """`squeue -h -o '%i|%T|%k'` -> [(job id, state, comment)]."""
    out = []
    for line in text.splitlines():
        cells = line.split("|", 2)
        if len(cells) == 3 and cells[0].strip().isdigit():
            out.append((cells[0].strip(), cells[1].strip().upper(), cells[2].strip()))
    return out


def parse_job_id(stdout: str) -> str | None:
    """`sbatch --parsable` prints `ID` or `ID;cluster`."""
    for line in stdout.splitlines():
        word = line.strip().split(";")[0]
        if word.isdigit():
            return word
    return None


def sbatch_refusal(stderr: str) -> str:
    """sbatch's own words for why it refused a job, without its `sbatch: error: ` prefixes."""
    lines = [re.sub(r"^sbatch:\s*(error:\s*)?", "", x).strip() for x in stderr.splitlines()]
    lines = [x for x in lines if x]
    # "Batch job submission failed: ..." is the verdict; the line before it often says why
    return "; ".join(dict.fromkeys(lines[-2:])) if lines else "no reason given"


@dataclass(frozen=True)
class Partition:
    name: str
    available: bool
    nodes: int
    states: dict[str, int]  # node state -> count
    gres: tuple[str, ...]  # e.g. ("gpu:8",)


def parse_sinfo(text: str) -> dict[str, Partition]:
    """`sinfo -h -o '%P|%a|%D|%t|%G'` -> partition name -> what it has (rows per state)."""
    out: dict[str, Partition] = {}
    for line in text.splitlines():
        cells = line.strip().split("|")
        if len(cells) < 5 or not cells[0]:
            continue
        name = cells[0].rstrip("*")
        try:
            count = int(cells[2])
        except ValueError:
            continue
        state = cells[3].rstrip("*~#!%$@^-")
        gres = tuple(g for g in re.split(r",(?![^()]*\))", cells[4]) if g and g != "(null)")
        old = out.get(name)
        states = dict(old.states) if old else {}
        states[state] = states.get(state, 0) + count
        out[name] = Partition(
            name,
            cells[1] == "up",
            (old.nodes if old else 0) + count,
            states,
            tuple(dict.fromkeys((old.gres if old else ()) + gres)),
        )
    return out


def gres_offered(requested: str, offered: tuple[str, ...]) -> bool:
    """Whether a partition's nodes have the gres a job asks for (`gpu:8`, `gpu:h100:4`)."""
    parts = requested.split(":")
    name = parts[0]
    count = int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    kind = parts[1] if len(parts) == 3 else None
    for g in offered:
        gp = re.sub(r"\(.*\)", "", g).split(":")
        if gp[0] != name:
            continue
        have = int(gp[-1]) if len(gp) > 1 and gp[-1].isdigit() else 1
        if kind is not None and (len(gp) < 3 or gp[1] != kind):
            continue
        if have >= count:
            return True
    return False


def split(text: str, *marks: str) -> dict[str, str]:
    """The sections of one command's output, each after its `@@MARK` line."""
    out: dict[str, str] = {}
    pattern = "|".join(re.escape(m) for m in marks)
    pieces = re.split(rf"^({pattern})[ \t]*\n?", text, flags=re.M)
    out[""] = pieces[0]
    for i in range(1, len(pieces) - 1, 2):
        out[pieces[i]] = pieces[i + 1]
    return out


#: node states in which a node takes no job (sinfo's short names, flags stripped)
UNUSABLE = frozenset({"down", "drain", "drng", "fail", "failg", "maint", "futr", "inval", "unk"})


def parse_sinfo_nodes(text: str) -> dict[str, str]:
    """`sinfo -h -N -p P -o '%N|%t'` -> node name -> state (one row per node; a node in
    several partitions once)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, state = line.strip().partition("|")
        if sep and name:
            out.setdefault(name, state.strip().rstrip("*~#!%$@^-"))
    return out


#: what slurmstepd writes into a task's output when its step or job is ended (by the job
#: script stopping the ranks, the time limit, scancel): the scheduler's words, never the
#: server's (how the job ended is judged from its state)
STEP_ENDED = re.compile(r"^slurmstepd(?:-\S+)?: error: \*\*\* (?:STEP|JOB) \S+ ON \S+ CANCELLED AT")


def server_lines(log: str) -> str:
    """A task's output without the lines slurmstepd wrote into it."""
    return "".join(
        line for line in log.splitlines(keepends=True) if not STEP_ENDED.match(line.strip())
    )
