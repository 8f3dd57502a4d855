"""Scoring the classifier on a labelled folder of real server logs.

A folder holds logs and a `labels.tsv` with exactly the tab-separated columns
`file, class, phase, root_cause_key, source` (phase one of init, load_weights, kv_cache,
cuda_graph, warmup, serving, unknown). The classifier is right when two logs get the same
signature exactly when they share a root cause, so it is scored on pairs of logs:

- precision: of the pairs with one signature, the share that are one root cause
  (a miss here merges two bugs: the bisection chases the wrong failure);
- recall: of the pairs with one root cause, the share with one signature
  (a miss here splits one bug: the target turns into an `other` finding);
- unclassified: logs given no signature at all;
- phase accuracy: logs whose phase is the labelled one (labels `unknown` are not counted).

The corpus is split in two halves by root cause (a stable hash of the key, so every log of
one bug lands in the same half): tune on one, report on the other. Pure: `score` takes
the texts, `load` reads a folder.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from orchestrator.diagnosis.classify.analyze import LogAnalysis, analyze_log
from orchestrator.diagnosis.classify.judge import RunEvidence, judge
from orchestrator.diagnosis.verdicts import Signature
from orchestrator.errors import UsageError

COLUMNS = ("file", "class", "phase", "root_cause_key", "source")
PHASES = ("init", "load_weights", "kv_cache", "cuda_graph", "warmup", "serving", "unknown")

#: the targets of the issue that introduced this benchmark; never loosened
TARGETS = {"precision": 0.98, "recall": 0.95, "unclassified": 0, "phase_accuracy": 0.90}


@dataclass(frozen=True)
class Label:
    file: str
    klass: str
    phase: str
    root_cause: str
    source: str


@dataclass(frozen=True)
class Case:
    label: Label
    text: str


@dataclass(frozen=True)
class Outcome:
    label: Label
    signature: str | None
    phase: str | None


@dataclass
class Score:
    """Figures for one set of logs, plus the pairs that went wrong (for people to read)."""

    logs: int = 0
    root_causes: int = 0
    pairs_same_signature: int = 0
    pairs_same_cause: int = 0
    true_pairs: int = 0
    unclassified: list[str] = field(default_factory=list)
    phase_counted: int = 0
    phase_right: int = 0
    collisions: list[tuple[str, str, str]] = field(default_factory=list)  # a, b, signature
    splits: list[tuple[str, str, str, str]] = field(default_factory=list)  # a, b, sig a, sig b
    wrong_phase: list[tuple[str, str, str]] = field(default_factory=list)  # file, want, got

    @property
    def precision(self) -> float:
        return self.true_pairs / self.pairs_same_signature if self.pairs_same_signature else 1.0

    @property
    def recall(self) -> float:
        return self.true_pairs / self.pairs_same_cause if self.pairs_same_cause else 1.0

    @property
    def phase_accuracy(self) -> float:
        return self.phase_right / self.phase_counted if self.phase_counted else 1.0

    def meets_targets(self) -> bool:
        return (
            self.precision >= TARGETS["precision"]
            and self.recall >= TARGETS["recall"]
            and len(self.unclassified) <= TARGETS["unclassified"]
            and self.phase_accuracy >= TARGETS["phase_accuracy"]
        )


def read_labels(folder: Path) -> list[Label]:
    """The rows of FOLDER/labels.tsv, checked: exact columns, known phases, existing files."""
    path = folder / "labels.tsv"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"{path}: cannot read ({exc.strerror or exc})",
            hint="give a folder holding logs and a labels.tsv",
        ) from exc
    rows = list(csv.reader(text.splitlines(), delimiter="\t"))
    if not rows or tuple(c.strip() for c in rows[0]) != COLUMNS:
        raise UsageError(
            f"{path}: the header must be the tab-separated columns {', '.join(COLUMNS)}"
        )
    labels = []
    for n, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(COLUMNS):
            raise UsageError(
                f"{path}:{n}: expected {len(COLUMNS)} tab-separated columns, found {len(row)}"
            )
        file, klass, phase, key, source = (cell.strip() for cell in row)
        if phase not in PHASES:
            raise UsageError(f"{path}:{n}: phase '{phase}' is not one of {', '.join(PHASES)}")
        if not (folder / file).is_file():
            raise UsageError(f"{path}:{n}: no log file '{file}' in {folder}")
        labels.append(Label(file, klass, phase, key, source))
    return labels


def load(folder: str | Path) -> list[Case]:
    folder = Path(folder)
    return [
        Case(label, (folder / label.file).read_text(encoding="utf-8", errors="replace"))
        for label in read_labels(folder)
    ]


def half_of(root_cause: str) -> str:
    """'tune' or 'heldout': a stable split by root cause (all reruns of a bug together)."""
    digest = hashlib.sha256(root_cause.encode()).digest()
    return "tune" if digest[0] % 2 == 0 else "heldout"


def timed_out(label: Label) -> bool:
    """A log labelled a hang or a timeout is what a run that missed its deadline leaves."""
    return any(word in label.klass.lower() for word in ("hang", "hung", "timeout", "stuck"))


def classify(
    cases: Sequence[Case], analyze: Callable[[str], LogAnalysis] = analyze_log
) -> list[Outcome]:
    """Each log's signature and phase as a run leaving that log would be judged.

    A crash must be named by its log alone. For a log labelled a hang or a timeout the
    orchestrator also knows the deadline passed: the run is judged as such (`judge`): when
    the log names nothing (the server just stopped printing) or only the kill that ended
    the wait (`Killed`), it is the hang at the last phase the log reached, named by what it
    waited on, as it would be in a campaign.
    """
    out = []
    for case in cases:
        analysis = analyze(case.text)
        sig, phase = analysis.signature, analysis.phase
        if timed_out(case.label) and analysis.note is None:
            _verdict, sig = judge(RunEvidence(log_tail=case.text, timed_out=True), None)
            phase = sig.phase if sig is not None else phase
        out.append(Outcome(case.label, sig.key() if sig else None, phase.value if phase else None))
    return out


def score(outcomes: Sequence[Outcome]) -> Score:
    s = Score(logs=len(outcomes), root_causes=len({o.label.root_cause for o in outcomes}))
    for o in outcomes:
        if o.signature is None:
            s.unclassified.append(o.label.file)
        if o.label.phase != "unknown":
            s.phase_counted += 1
            if o.phase == o.label.phase:
                s.phase_right += 1
            else:
                s.wrong_phase.append((o.label.file, o.label.phase, o.phase or "none"))
    # signatures are compared as a campaign compares them (`Signature.__eq__`)
    same = {
        o.signature: Signature.from_key(o.signature).same_key()
        for o in outcomes
        if o.signature is not None
    }
    for a, b in combinations(outcomes, 2):
        same_cause = a.label.root_cause == b.label.root_cause
        same_sig = (
            a.signature is not None
            and b.signature is not None
            and same[a.signature] == same[b.signature]
        )
        s.pairs_same_cause += same_cause
        s.pairs_same_signature += same_sig
        s.true_pairs += same_cause and same_sig
        if same_sig and not same_cause:
            s.collisions.append((a.label.file, b.label.file, a.signature or ""))
        if same_cause and not same_sig:
            s.splits.append(
                (a.label.file, b.label.file, a.signature or "none", b.signature or "none")
            )
    return s


def score_halves(outcomes: Sequence[Outcome]) -> dict[str, Score]:
    """Scores for the held-out half, the tuning half and the whole."""
    return {
        "heldout": score([o for o in outcomes if half_of(o.label.root_cause) == "heldout"]),
        "tune": score([o for o in outcomes if half_of(o.label.root_cause) == "tune"]),
        "whole": score(outcomes),
    }


__all__ = [
    "COLUMNS",
    "PHASES",
    "TARGETS",
    "Case",
    "Label",
    "Outcome",
    "Score",
    "classify",
    "half_of",
    "load",
    "read_labels",
    "score",
    "score_halves",
    "timed_out",
]
