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

    @classmethod
    def ordered(cls) -> list[Phase]:
        return list(cls)


@dataclass(frozen=True)
class Signature:
    """What identifies a failure regardless of timestamps, ranks, addresses and sizes.

    Two runs with equal signatures hit the same bug.
    """

    phase: Phase
    error_class: str  # e.g. "cublas", "cuda_oom", "illegal_address", "AttributeError", "hang"
    message: str  # the key message, normalized

    def key(self) -> str:
        """A stable one-line text form, used for storage and comparison."""
        return f"{self.phase.value}|{self.error_class}|{self.message}"

    @classmethod
    def from_key(cls, key: str) -> Signature:
        phase, error_class, message = key.split("|", 2)
        return cls(Phase(phase), error_class, message)

    def __str__(self) -> str:
        return f"{self.phase.value}: {self.error_class}: {self.message}"
