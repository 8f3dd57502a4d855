"""Which role of a deployment failed first: the rule that names a multi-node run's failure.

A deployment (the node ranks of one server; prefill, decode and a router) fails as a whole
when one role fails: the others then hang in a collective until a watchdog ends them, or
time out waiting for a peer. The log an engineer reads first often names such a
consequence ("Watchdog caught collective operation timeout") instead of the cause. This
module picks the cause from every role's classified result, pure (no I/O, no clock):

1. each role's time of failure (its first failure line, or its exit) is put on one clock:
   the host's time minus the host's clock offset (host clock - controller clock, measured
   over SSH when the deployment started);
2. a cause is a crash (the classifier's kind `crash`, except a peer's loss reported as an
   error: `ncclRemoteError`, a connection closed or reset by the peer) or a role that never
   joined (its unit failed to start, its host was unreachable); a consequence is a hang or a
   timeout (an NCCL watchdog, a store client that gave up) or a peer's loss;
3. the earliest cause wins, unless a consequence came first by more than `tolerance`
   seconds: a watchdog fires a whole timeout after the collective it waited on began, so a
   crash logged a little after it (clock error, a log flushed late) is still its cause,
   while a timeout long before any crash was the first failure (the crash came in the
   teardown);
4. with no cause, a role that hung silently until the run ended (the executor's
   `no readiness before the deadline` hang, or `no readiness when another role failed`
   when another role's watchdog ended the run first) is the failure: it was in no
   collective when the others' watchdogs fired, so it is the one they waited for; else the
   earliest consequence is. Several roles silent alike are told apart only by how far each
   got: the one whose log stops at the earliest startup phase is the one the others
   waited for; when their logs stop at the same phase, which one failed first cannot be
   told, and the answer says so (`FirstFailure.tied`) instead of inventing an order. A
   role whose own port still answered its health check (200, or a router's 503 while a
   worker is down) was up and answering, never the one waited for.

The deployment's signature is the winning role's own signature, unchanged (a bug on one
node of two signs as it does on a single node); the role and its host are named beside it,
with what the other roles did then ("node-rank 1 on b300-02: cuda_graph: cublas: ...;
node-rank 0 then timed out in a collective").

`failure_time(line, year)` reads a log line's own timestamp (SGLang's `[2025-01-01
12:00:00 TP0]`, torch's `[rank0]:[E1204 21:33:06.067238000 ...]`, an ISO time), for
callers whose logs carry no per-line times from the host.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from orchestrator.diagnosis.classify.judge import HANG_MESSAGE
from orchestrator.diagnosis.verdicts import PHASE_ORDER, Phase, Signature

#: seconds a crash may be logged after a consequence on another role and still be its
#: cause: clock offsets measured over SSH are good to milliseconds, SGLang's log stamps to
#: a second, and a dying process may flush its last lines a little late
DEFAULT_TOLERANCE_S = 5.0

#: slack of the tolerance's comparison (stamps are good to a microsecond at best)
EPSILON_S = 1e-6

CRASH, HANG, TIMEOUT = "crash", "hang", "timeout"
#: the classifier's kinds that are consequences of another role's failure
CONSEQUENCE_KINDS = frozenset({HANG, TIMEOUT})
#: error classes of hangs and timeouts, for a result that carries no kind (a run the
#: executor judged a hang at its deadline has the signature but no log analysis)
CONSEQUENCE_CLASSES = frozenset({"hang", "nccl_timeout", "timeout"})
#: error messages that report a peer's loss, not a failure of this role
PEER_LOSS = re.compile(
    r"ncclRemoteError|remote process exiting prematurely|Connection (?:closed|reset) by peer"
    r"|Broken pipe|peer (?:closed|disconnected)",
    re.IGNORECASE,
)
#: error class of the signature of a role that never joined
NEVER_JOINED = "never_joined"
#: a silent hang's message when the run ended before its deadline because another role
#: failed (its watchdog, a crash): the deadline never came
CUT_SHORT_MESSAGE = "no readiness when another role failed"
_SILENT_MESSAGES = (HANG_MESSAGE, CUT_SHORT_MESSAGE)
#: the last milestone a silent hang names (`... after 'Load weight end'`)
_LAST_LINE = re.compile(r"after '(.*)'$")


@dataclass(frozen=True)
class RoleResult:
    """One role's part of a run, as the executor saw it and the classifier judged it.

    `signature`/`kind`: the classifier's for this role's log (None: it did not fail).
    `failed_at`: when it failed on its host's clock (epoch seconds: its first failure
    line, or its exit), None when unknown. `clock_offset`: host clock minus controller
    clock, seconds. `absent`: why the role never joined (its unit failed to start, its host
    was unreachable), None when it ran; `infra`: the absence is host trouble, not the
    config's doing (the run's verdict is then `infra`)."""

    role: str
    host: str
    signature: Signature | None = None
    kind: str | None = None
    failed_at: float | None = None
    clock_offset: float = 0.0
    absent: str | None = None
    infra: bool = False
    #: the HTTP status its own port answered its health check with when last polled (0:
    #: no answer): a role that answers is up, whatever the deployment as a whole did
    health_code: int = 0

    @property
    def failed(self) -> bool:
        return self.signature is not None or self.absent is not None

    @property
    def corrected(self) -> float | None:
        """The failure's time on the controller's clock."""
        return None if self.failed_at is None else self.failed_at - self.clock_offset

    @property
    def silent_hang(self) -> bool:
        """It hung without a word until the run's deadline (no watchdog, no timeout)."""
        sig = self.signature
        return (
            sig is not None
            and sig.error_class == "hang"
            and sig.message.startswith(_SILENT_MESSAGES)
        )

    @property
    def waited_for(self) -> bool:
        """A silent hang that may be the one the others waited for (not a role that was up
        and answering on its port all along)."""
        return self.silent_hang and not self.health_code

    @property
    def is_cause(self) -> bool:
        """A failure of this role's own (a crash, never joining), not a consequence."""
        if self.absent is not None:
            return True
        if self.signature is None or (self.kind or CRASH) in CONSEQUENCE_KINDS:
            return False
        if self.kind is None and self.signature.error_class in CONSEQUENCE_CLASSES:
            return False
        return not PEER_LOSS.search(self.signature.message)


@dataclass(frozen=True)
class FirstFailure:
    """The deployment's failure: the role that failed first, and what the others did."""

    role: str
    host: str
    signature: Signature
    #: the winning role's failure is a consequence too (no role crashed or stayed away)
    consequence: bool
    #: the run says nothing about the config: the first failure is host trouble
    infra: bool
    others: tuple[RoleResult, ...]
    #: the roles (the winner among them) that hung without a word alike, their logs
    #: stopping at the same phase: which one the others waited for cannot be told;
    #: () when the order is known
    tied: tuple[RoleResult, ...] = ()

    def describe(self) -> str:
        """'node-rank 1 on b300-02: <signature>; node-rank 0 then timed out in a
        collective' (the others in time order)."""
        if self.tied:
            names = " and ".join(f"{r.role} on {r.host}" for r in self.tied)
            head = (
                f"{names} each hung without a word{_after(self.tied[0])} "
                f"({self.signature.phase.value}): their logs stop at the same step, so which "
                "one the others waited for cannot be told"
            )
        elif self.signature.error_class == NEVER_JOINED:
            head = f"{self.role} on {self.host} never joined ({self.signature.message})"
        else:
            head = f"{self.role} on {self.host}: {self.signature}"
        tails = [f"{r.role} {_then(r)}" for r in self.others]
        return "; ".join([head, *tails])


def _after(r: RoleResult) -> str:
    """` after 'Load weight end'`: what a silent role said last (it waited on that)."""
    m = _LAST_LINE.search(r.signature.message) if r.signature is not None else None
    return f" after '{m[1]}'" if m else ""


def _then(r: RoleResult) -> str:
    if r.absent is not None:
        return f"never joined ({r.absent})"
    assert r.signature is not None
    if r.signature.error_class == "nccl_timeout":
        return "then timed out in a collective"
    if r.silent_hang and r.health_code == 200:
        # alive and answering its own health check: it did its part and waited
        return "stayed up and healthy meanwhile (its health check answered)"
    if r.silent_hang and r.health_code:
        # up and answering, not ready itself (a router whose worker is down says 503)
        return f"stayed up meanwhile (its health check answered {r.health_code})"
    if r.silent_hang:
        # judged by the executor, not from a log line (no kind): it waited without a word,
        # and what it last said is what it waited on
        return "then hung without a word" + _after(r)
    if r.kind == HANG:
        return "then hung"
    if r.kind == TIMEOUT:
        return "then timed out waiting for a peer"
    if PEER_LOSS.search(r.signature.message):
        return "then lost its peer"
    return f"then failed too ({r.signature})"


def _order(r: RoleResult, index: int) -> tuple[float, int]:
    """Time order; a failure without a time goes first when it never joined (nothing of
    it ever ran), else last; ties keep the caller's order."""
    t = r.corrected
    if t is None or math.isnan(t):
        t = -math.inf if r.absent is not None else math.inf
    return (t, index)


def first_failure(
    roles: Sequence[RoleResult], *, tolerance: float = DEFAULT_TOLERANCE_S
) -> FirstFailure | None:
    """The deployment's first failure across its roles, or None when no role failed.

    The answer does not depend on the order of `roles` except to break exact ties."""
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0 seconds, got {tolerance}")
    failed = sorted(((r, i) for i, r in enumerate(roles) if r.failed), key=lambda p: _order(*p))
    if not failed:
        return None
    causes = [p for p in failed if p[0].is_cause]
    # a role silent until the deadline was in no collective when the others' watchdogs
    # fired: it is the one they waited for, however late its hang was noticed
    effects = sorted((p for p in failed if not p[0].is_cause), key=lambda p: not p[0].waited_for)
    winner = causes[0] if causes else effects[0]
    tied: tuple[RoleResult, ...] = ()
    silent = [p for p in effects if p[0].waited_for]
    if not causes and len(silent) > 1:
        # several silent alike: the one whose log stops earliest held the others up; at
        # the same phase, their logs cannot tell which one the others waited for
        earliest = min(_phase_rank(p[0]) for p in silent)
        behind = [p for p in silent if _phase_rank(p[0]) == earliest]
        winner = behind[0]
        if len(behind) > 1:
            tied = tuple(r for r, _ in behind)
    if causes and effects:
        cause_t = _order(*causes[0])[0]
        effect_t = min(_order(*p)[0] for p in effects)
        # inclusive, with a microsecond's slack for the float sums of the correction
        if cause_t - effect_t > tolerance + EPSILON_S:
            winner = effects[0]  # a consequence long before any crash was the failure
    role = winner[0]
    others = tuple(r for r, _ in failed if r is not role and r not in tied)
    return FirstFailure(
        role=role.role,
        host=role.host,
        signature=_signature(role),
        consequence=not role.is_cause,
        infra=role.infra,
        others=others,
        tied=tied,
    )


def _phase_rank(r: RoleResult) -> int:
    """How far a silent role got: the startup phase its log stops at."""
    assert r.signature is not None
    return PHASE_ORDER[r.signature.phase]


def _signature(r: RoleResult) -> Signature:
    if r.signature is not None:
        return r.signature
    return Signature(Phase.INIT, NEVER_JOINED, r.absent or "never joined")


# ---------------------------------------------------------------------------- log times

_SGLANG = re.compile(r"\[(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[.,](\d+))?")
_TORCH = re.compile(r"\[[EWIF](\d{2})(\d{2}) (\d{2}:\d{2}:\d{2})(?:\.(\d+))?")


def failure_time(line: str, year: int) -> float | None:
    """Epoch seconds (UTC reading of the host's local time) of a log line's own stamp, or
    None when it has none. `year` completes torch's stamps, which print none."""
    m = _SGLANG.search(line)
    if m:
        date, clock, frac = m.groups()
        text = f"{date} {clock}"
    else:
        m = _TORCH.search(line)
        if m is None:
            return None
        month, day, clock, frac = m.groups()
        text = f"{year:04d}-{month}-{day} {clock}"
    try:
        base = datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return None
    fraction = float(f"0.{frac}") if frac else 0.0
    return base.timestamp() + fraction


def first_stamp(lines: Sequence[str], year: int) -> float | None:
    """The first stamp among `lines` (a failure's excerpt: the lines after an unstamped
    traceback line carry none)."""
    for line in lines:
        t = failure_time(line, year)
        if t is not None:
            return t
    return None
