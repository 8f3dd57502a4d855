"""The CLI's answer to an incident against the oracle's: right, unsure, unconcluded or
wrong, with every problem in words.

Wrong is: a culprit set that is not one of the oracle's (a flag named that must not be, or
a cause missed) or a target that is not bad's failure, at `found`; a recorded run whose
verdict the scenario cannot give to its variant; a finding whose variant cannot show it;
a failure met on the way and left out of the findings; a traceback; an error exit; a host
left changed. `unsure` and an answer not concluded are counted, not wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.verdicts import Verdict, same_signature
from tests.support.fuzz.oracle import PASS, Expected, Failure, Oracle

#: words too common to tell one crash from another in a signature
_COMMON = {"runtimeerror", "error", "cuda", "when", "calling", "object", "attribute"}


@dataclass
class Judgement:
    kind: str  # right, unsure, unconcluded, wrong
    problems: list[str] = field(default_factory=list)


def delta_key(label: str) -> str:
    """A delta as the CLI words it (`~ --a 1 -> 2`, `+ env K=V`) -> the oracle's key."""
    body = label[2:]
    if body.startswith("env "):
        return "env:" + re.split(r"[= ]", body[4:], maxsplit=1)[0]
    return body.split(" ", 1)[0].lstrip("-")


def matches(failure: Failure, signature: str) -> bool:
    """Whether a recorded signature can be this failure: same phase (a hang: any phase
    up to the one that hung), and for a crash a word of its error."""
    phase, _, rest = signature.partition(": ")
    rest = rest.lower()
    if failure.kind == "hang":
        return "timeout" in signature.lower() or "hang" in rest
    if failure.kind in ("garbled", "wrong", "drift"):
        return "wrong_output" in rest or "answers" in rest
    if phase != failure.phase:
        return False
    words = [w.lower() for w in re.findall(r"[A-Za-z_]{5,}", failure.error)]
    return any(w in rest for w in words if w not in _COMMON) or failure.marker.lower() in rest


def judge(
    oracle: Oracle,
    exp: Expected,
    answer: dict[str, Any] | None,
    *,
    exit_code: int | None,
    output: str,
    runs: list[Any],
    left: list[str],
) -> Judgement:
    hard: list[str] = []
    soft: list[str] = []
    if "Traceback (most recent call last)" in output:
        hard.append("traceback in the CLI's output")
    hard += [f"host left changed: {x}" for x in left]
    if exit_code is None:
        hard.append("the CLI did not end within its time")
    if answer is None:
        hard.append(f"no JSON answer (exit {exit_code}): {output[-300:]!r}")
        return Judgement("wrong", hard)
    status = str(answer.get("status"))
    if status == "error":
        hard.append(f"error: {answer.get('error')}")
        return Judgement("wrong", hard)
    labels = list(answer.get("deltas") or [])
    keys = [delta_key(x) for x in labels]
    if not labels and status != "found":  # stopped before it listed them (interrupted)
        why = [f"status {status}: {answer.get('message', '')}"]
        return Judgement("wrong", hard + why) if hard else Judgement("unconcluded", why)
    if sorted(keys) != sorted(exp.deltas):
        hard.append(f"deltas {sorted(keys)} != the oracle's {sorted(exp.deltas)}")
        return Judgement("wrong", hard)

    named = {
        frozenset(keys[i] for i in c.get("indices") or []) for c in answer.get("culprits") or []
    }
    target = str(answer.get("target") or "")
    culprit_problems = []
    if target and not matches(exp.target, target):
        culprit_problems.append(f"target {target!r}, expected {exp.target}")
    if named and named != set(exp.culprits):
        culprit_problems.append(
            f"culprits {_sets(named)}, expected {_sets(exp.culprits)}" + _never(named, exp)
        )
    confidence = answer.get("confidence")
    if status == "found":
        hard += [f"{p} (confidence {_conf(confidence)})" for p in culprit_problems]
    else:
        soft += [f"best answer: {p}" for p in culprit_problems]

    hard += _findings(oracle, exp, answer, keys)
    hard += _runs(oracle, exp, runs, keys, answer)
    if hard:
        return Judgement("wrong", hard + soft)
    if status == "found":
        return Judgement("right", soft)
    if status == "unsure":
        return Judgement("unsure", soft)
    return Judgement("unconcluded", [f"status {status}: {answer.get('message', '')}", *soft])


def _findings(oracle: Oracle, exp: Expected, answer: dict[str, Any], keys: list[str]) -> list[str]:
    out = []
    for f in answer.get("findings") or []:
        sig = str(f.get("signature"))
        variant = {keys[i] for i in f.get("deltas") or []}
        can = [x for x in oracle.outcomes(variant) if isinstance(x, Failure) and x != exp.target]
        if not any(matches(x, sig) for x in can):
            shows = can or "no other failure"
            out.append(f"finding {sig!r} on {sorted(variant)}: that variant can show {shows}")
    return out


def _runs(
    oracle: Oracle, exp: Expected, runs: list[Any], keys: list[str], answer: dict[str, Any]
) -> list[str]:
    """Each recorded run's verdict against what its variant can show."""
    out = []
    reported = [str(f.get("signature")) for f in answer.get("findings") or []]
    for r in runs:
        if r.repair or r.weights != "real" or r.cached_from:
            continue
        variant = {keys[i] for i in r.variant}
        can = oracle.outcomes(variant)
        sig = str(r.signature) if r.signature else ""
        where = f"run {r.id} ({r.verdict.value} {sig!r}) of {sorted(variant) or 'good'}"
        if r.verdict is Verdict.PASS and PASS not in can:
            out.append(f"{where}: passed, but it must show {can[0]}")
        elif r.verdict is Verdict.FAIL and exp.target not in can:
            out.append(f"{where}: called the target, but it can show {can}")
        elif r.verdict in (Verdict.OTHER, Verdict.TIMEOUT):
            others = [x for x in can if isinstance(x, Failure)]
            if not any(matches(x, sig) for x in others):
                out.append(f"{where}: no rule of the scenario gives it; it can show {can}")
            elif sig not in reported and not any(same_signature(sig, s) for s in reported):
                out.append(f"{where}: met on the way, missing from the findings")
        elif r.verdict is Verdict.INVALID:
            out.append(f"{where}: invalid, but the server refuses none of its flags")
    return out


def _sets(sets: Any) -> str:
    return " ".join("{" + ", ".join(sorted(s)) + "}" for s in sorted(sets, key=sorted))


def _never(named: set[frozenset[str]], exp: Expected) -> str:
    bad = sorted(set().union(*named) & exp.never_named)
    return f"; named what must never be: {', '.join(bad)}" if bad else ""


def _conf(c: object) -> str:
    return f"{c:.3f}" if isinstance(c, float) else str(c)


def left_on_host(port: int, unit_dir: Path) -> list[str]:
    """What a bisection left on the process lab host: a server on its port, the unit's
    pid file or launch script."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "orchestrator.lab.server" in cmd and f"--port {port}" in cmd:
            out.append(f"lab server pid {proc.name} still running on port {port}")
    out += [f"{unit_dir / n} still there" for n in ("pid", "launch.sh") if (unit_dir / n).exists()]
    return out
