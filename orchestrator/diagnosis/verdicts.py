"""The shared words of outcomes (verdicts, startup phases, failure signatures), as the
classifier and the layers above it name them; they live on the ground floor, in
`orchestrator/verdicts.py`, so that the planner and the config need no classifier."""

from __future__ import annotations

from orchestrator.verdicts import (
    NAMING_WORDS,
    PHASE_ORDER,
    RESOURCE_CLASSES,
    UNTYPED_CLASSES,
    Phase,
    Signature,
    Verdict,
    relative,
    same_signature,
    typed,
)

__all__ = [
    "NAMING_WORDS",
    "PHASE_ORDER",
    "RESOURCE_CLASSES",
    "UNTYPED_CLASSES",
    "Phase",
    "Signature",
    "Verdict",
    "relative",
    "same_signature",
    "typed",
]
