"""The shared vocabulary of outcomes: verdicts, startup phases, and failure signatures.

Every layer speaks these words: the classifier produces them, the planner consumes
verdicts, the store records them, the CLI shows them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Verdict(str, enum.Enum):  # noqa: UP042 (str() and f-strings must keep enum behaviour)
    """The outcome of one run, relative to the campaign's target failure."""

    PASS = "pass"  # healthy (and the probe, if any, met its bar)
    FAIL = "fail"  # failed with the target signature
    OTHER = "other"  # failed with a different signature: a separate finding
    TIMEOUT = "timeout"  # never became ready before the deadline (a hang)
    INVALID = "invalid"  # rejected before it could run (bad flag, read-back mismatch)
    INFRA = "infra"  # SSH or host trouble: says nothing about the config; retried

    @property
    def resolved(self) -> bool:
        """True when the verdict says something definite about the target failure."""
        return self in (Verdict.PASS, Verdict.FAIL)


class Phase(str, enum.Enum):  # noqa: UP042
    """Startup phases of an inference server, in the order they happen."""

    ARGS = "args"
    INIT = "init"
    LOAD_WEIGHTS = "load_weights"
    KV_CACHE = "kv_cache"
    CUDA_GRAPH = "cuda_graph"
    WARMUP = "warmup"
    SERVING = "serving"
    PROBE = "probe"


#: each phase's place in a server's startup (the order of `Phase`): the one order the
#: classifier and every executor compare phases by
PHASE_ORDER: dict[Phase, int] = {phase: i for i, phase in enumerate(Phase)}


@dataclass(frozen=True, eq=False)
class Signature:
    """What identifies a failure regardless of timestamps, ranks, addresses and sizes.

    Two runs with equal signatures hit the same bug. Equality is `same_key()`: an
    exception's type is shown but not compared when its message names the failure (one
    error reaches a log as torch's older `RuntimeError` and its newer `DistNetworkError`,
    as vLLM's `ValueError` and a client's `BadRequestError` around the server's answer,
    or quoted without its type at all); an error class the rules name (`cuda_oom`,
    `hang`, `nccl_timeout`) and the type of a message too short to name anything alone
    (`KeyError: 'weight'`, an empty message, only a place) are compared.
    """

    phase: Phase
    error_class: str  # e.g. "cublas", "cuda_oom", "illegal_address", "AttributeError", "hang"
    message: str  # the key message, normalized

    def key(self) -> str:
        """A stable one-line text form, used for storage and display."""
        return f"{self.phase.value}|{self.error_class}|{self.message}"

    def same_key(self) -> str:
        """What two signatures must share to name one failure (see the class)."""
        words = self.message.split(" @ ", 1)[0].split()
        if (
            typed(self.error_class)
            and len(words) >= NAMING_WORDS
            and not self.message.startswith("@")
        ):
            return f"{self.phase.value}||{self.message}"
        return self.key()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Signature):
            return NotImplemented
        return self.same_key() == other.same_key()

    def __hash__(self) -> int:
        return hash(self.same_key())

    @classmethod
    def from_key(cls, key: str) -> Signature:
        phase, error_class, message = key.split("|", 2)
        return cls(Phase(phase), error_class, message)

    def __str__(self) -> str:
        return f"{self.phase.value}: {self.error_class}: {self.message}"


#: the error classes of a failure for want of a resource (memory, KV-cache space): the
#: classes a repair move may address (orchestrator.config.repair), named by the rules
RESOURCE_CLASSES = frozenset(
    {"cuda_oom", "not_enough_memory", "kv_cache_memory", "kv_cache_too_small"}
)

#: a message of fewer words than this names no failure by itself
NAMING_WORDS = 4

#: error classes that are no exception's type: a class the rules name is lower case
#: (`cuda_oom`); `untyped` and `error` stand for a message quoted without its type
UNTYPED_CLASSES = frozenset({"untyped", "error"})


def typed(error_class: str) -> bool:
    """True for an exception's type (`ValueError`, `DistNetworkError`) or no type at all,
    False for an error class a rule names."""
    return error_class[:1].isupper() or error_class in UNTYPED_CLASSES


def relative(
    verdict: Verdict,
    signature: Signature | None,
    target: Signature | None,
    *,
    across_builds: bool = False,
) -> Verdict:
    """A recorded verdict re-read against a campaign's target signature. `across_builds`:
    the campaign runs several builds of the server, whose logs mark their startup phases
    with other lines (the same error is read in `kv_cache` on one release and in
    `cuda_graph` on the next): the target is then the error class and message, in any
    phase."""
    if verdict in (Verdict.FAIL, Verdict.OTHER, Verdict.TIMEOUT) and signature and target:
        if signature == target or (
            across_builds
            and signature.error_class != "hang"
            and (signature.error_class, signature.message) == (target.error_class, target.message)
        ):
            return Verdict.FAIL
        return Verdict.TIMEOUT if verdict is Verdict.TIMEOUT else Verdict.OTHER
    return verdict


def same_signature(a: str | None, b: str | None) -> bool:
    """Two stored signature keys (`Signature.key()`) name one failure."""
    return a is not None and b is not None and Signature.from_key(a) == Signature.from_key(b)
