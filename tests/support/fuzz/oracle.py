"""The expected answer of a bisection on the lab, from the scenario's rules and the two
experiment files alone.

Written apart from the search: it never imports the planner or the campaign. Its own diff
lists the deltas (flags, environment variables, keys of a JSON-valued flag); its own
variants apply them to good's launch; the lab's scenario model says which rules hold of a
variant, read as the lab server reads its command line. A flaky rule's draw is set aside:
a variant *can* show every rule that holds up to the first one that always fires.

The answer: the target (what bad shows first), the minimal sets of deltas whose variant
can show it (the culprit sets), every other failure with the minimal sets that can show
it (the findings one may meet), and the deltas that must never be named. Only deltas a
rule's condition reads are searched over (at most `MAX_RELEVANT`), so 30 deltas cost no
more than the few the rules name.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config.loading import load_experiment
from orchestrator.lab import cmdline
from orchestrator.lab import scenario as labscenario
from orchestrator.lab.scenario_model import LAB_ONLY_FLAGS, Condition, Scenario

MAX_RELEVANT = 14
PASS = "pass"


class OracleError(Exception):
    """An incident the oracle cannot answer (bad does not fail, too many relevant deltas)."""


@dataclass(frozen=True)
class Failure:
    """One failure as the scenario makes it; equal failures give one signature."""

    kind: str  # crash, hang, invalid (refused at argument parsing), garbled, wrong, drift
    phase: str  # the rule's phase (`serving` for wrong answers)
    error: str = ""

    @property
    def marker(self) -> str:
        """Words of the failure that any signature of it keeps (its error class)."""
        if self.kind in ("crash", "invalid"):
            return self.error.split(":", 1)[0].strip()
        return self.kind

    def __str__(self) -> str:
        return f"{self.phase}: {self.kind}" + (f": {self.error}" if self.error else "")


@dataclass(frozen=True)
class Expected:
    deltas: tuple[str, ...]
    target: Failure
    #: the target fires on a share of the starts only
    flaky_target: bool
    culprits: tuple[frozenset[str], ...]
    #: other failures -> the minimal sets of deltas whose variant can show them
    findings: dict[Failure, tuple[frozenset[str], ...]] = field(default_factory=dict)

    @property
    def never_named(self) -> frozenset[str]:
        named = set().union(*self.culprits) if self.culprits else set()
        return frozenset(self.deltas) - named

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": str(self.target),
            "flaky_target": self.flaky_target,
            "culprits": [sorted(s) for s in self.culprits],
            "findings": {str(k): [sorted(s) for s in v] for k, v in self.findings.items()},
            "never_named": sorted(self.never_named),
        }


@dataclass(frozen=True)
class Launch:
    """A side's launch as the lab server reads it: its flags (parsed) and environment."""

    flags: dict[str, Any]
    env: dict[str, str]
    probe_prompts: int  # requests the probe sends (0: no probe)


class Oracle:
    """The scenario and both launches, read once: what any variant can show."""

    def __init__(self, scenario: Path | str, good: Path, bad: Path) -> None:
        self.scenario = labscenario.load(str(scenario))
        self.good = _launch(good, self.scenario)
        self.bad = _launch(bad, self.scenario)
        self.deltas = diff(self.good, self.bad)

    def outcomes(self, deltas: Any) -> list[Failure | str]:
        """What a start of good + `deltas` (keys) can show (see `outcomes`)."""
        return outcomes(self.scenario, variant(self.good, self.bad, deltas))

    def expected(self) -> Expected:
        target_list = self.outcomes(self.deltas)
        target = target_list[0]
        if not isinstance(target, Failure):
            raise OracleError("bad does not fail: nothing to bisect")
        relevant = [d for d in self.deltas if _read_by_rules(self.scenario, d)]
        if len(relevant) > MAX_RELEVANT:
            raise OracleError(f"{len(relevant)} deltas are read by rules; at most {MAX_RELEVANT}")
        shows: dict[frozenset[str], list[Failure | str]] = {}
        for r in range(len(relevant) + 1):
            for combo in itertools.combinations(relevant, r):
                shows[frozenset(combo)] = self.outcomes(combo)
        failures = {f for seen in shows.values() for f in seen if isinstance(f, Failure)}
        return Expected(
            deltas=tuple(self.deltas),
            target=target,
            flaky_target=len(target_list) > 1,
            culprits=_minimal([s for s, seen in shows.items() if target in seen]),
            findings={
                f: _minimal([s for s, seen in shows.items() if f in seen])
                for f in sorted(failures - {target}, key=str)
            },
        )


def expected(scenario: Path | str, good: Path, bad: Path) -> Expected:
    """The expected answer of bisecting `good` -> `bad` on the lab server of `scenario`."""
    return Oracle(scenario, good, bad).expected()


def outcomes(scen: Scenario, launch: Launch) -> list[Failure | str]:
    """What a start of `launch` can show, in rule order: the rules that hold up to the
    first that always fires, then, if none always fires, what serving shows."""
    flags, env = launch.flags, launch.env
    out: list[Failure | str] = []
    for rule in scen.faults:
        if rule.needs_real_weights and str(flags.get("load-format", "")) == "dummy":
            continue
        if not rule.when.holds(flags, env, scen.defaults):
            continue
        if rule.phase == "serving" and (rule.after_requests or 0) > launch.probe_prompts:
            continue  # a crash under load the launch never puts it under
        # a refusal at argument parsing is no failure of the config's: the run is invalid
        kind = "invalid" if rule.phase == "args" else rule.effect
        out.append(Failure(kind, rule.phase, rule.error if kind != "hang" else ""))
        if rule.probability is None or rule.probability >= 1:
            return out
    for arule in scen.answers:
        if arule.when.holds(flags, env, scen.defaults):
            out.append(Failure(arule.effect, "serving"))
            if arule.probability is None or arule.probability >= 1:
                return out
    out.append(PASS)
    return out


# ---------------------------------------------------------------------------- deltas


def diff(good: Launch, bad: Launch) -> list[str]:
    """The deltas: flags (a JSON object's changed key paths instead), then environment."""
    out = []
    for name in [*bad.flags, *(k for k in good.flags if k not in bad.flags)]:
        a, b = good.flags.get(name), bad.flags.get(name)
        if a == b:
            continue
        ja, jb = _json_object(a), _json_object(b)
        if ja is not None and jb is not None:
            out += [f"{name}.{p}" for p in _json_paths(ja, jb)]
        else:
            out.append(name)
    for name in [*bad.env, *(k for k in good.env if k not in bad.env)]:
        if good.env.get(name) != bad.env.get(name):
            out.append(f"env:{name}")
    return out


def variant(good: Launch, bad: Launch, deltas: Any) -> Launch:
    """Good's launch with `deltas` taken from bad's."""
    flags, env = dict(good.flags), dict(good.env)
    objects: dict[str, dict[str, Any]] = {}
    for key in deltas:
        if key.startswith("env:"):
            _put(env, key[4:], bad.env.get(key[4:]))
        elif "." in key and _json_object(good.flags.get(key.split(".")[0])) is not None:
            name, *path = key.split(".")
            obj = objects.setdefault(name, _json_object(flags[name]) or {})
            present, value = _path_value(_json_object(bad.flags[name]) or {}, path)
            _put_path(obj, path, value, present)
        else:
            _put(flags, key, bad.flags.get(key))
    for name, obj in objects.items():
        flags[name] = json.dumps(obj)
    return Launch(flags, env, good.probe_prompts)


def _launch(path: Path, scen: Scenario) -> Launch:
    exp = load_experiment(path)
    argv = exp.argv()
    start = argv.index("--scenario") + 2 if "--scenario" in argv else 0
    rest = argv[start:]
    # as the server reads it: argparse's parser when the scenario lists its flags
    flags = (
        cmdline.parse_strict(rest, scen.known_flags)
        if scen.known_flags is not None
        else cmdline.parse_permissive(rest)
    )
    for name in LAB_ONLY_FLAGS:
        flags.pop(name, None)
    prompts = 0
    if exp.probe and exp.probe.run:
        m = re.search(r"--num-prompts[ =](\d+)", exp.probe.run)
        prompts = int(m.group(1)) if m else 0
    return Launch(flags, exp.env_map(), prompts)


def _read_by_rules(scen: Scenario, key: str) -> bool:
    """Whether any rule's condition reads the delta `key`."""
    rules = [*scen.faults, *scen.answers]
    if key.startswith("env:"):
        return any(c.key == key[4:] for r in rules for c in r.when.env)
    parts = key.split(".")
    return any(_overlaps(c, parts) for r in rules for c in r.when.flags)


def _overlaps(c: Condition, parts: list[str]) -> bool:
    mine = [c.key, *c.path]
    n = min(len(mine), len(parts))
    return mine[:n] == parts[:n]


def _minimal(sets: list[frozenset[str]]) -> tuple[frozenset[str], ...]:
    out = [s for s in sets if not any(o < s for o in sets)]
    return tuple(sorted(set(out), key=lambda s: (len(s), sorted(s))))


def _json_object(value: object) -> dict[str, Any] | None:
    if not isinstance(value, str):
        return None
    try:
        obj = json.loads(value)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _json_paths(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in [*b, *(k for k in a if k not in b)]:
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _json_paths(va, vb, f"{prefix}{key}.")
        elif key not in a or key not in b or va != vb:
            out.append(f"{prefix}{key}")
    return out


def _path_value(obj: dict[str, Any], path: list[str]) -> tuple[bool, Any]:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return False, None
        cur = cur[key]
    return True, cur


def _put_path(obj: dict[str, Any], path: list[str], value: Any, present: bool) -> None:
    for key in path[:-1]:
        obj = obj.setdefault(key, {})
    if present:
        obj[path[-1]] = value
    else:
        obj.pop(path[-1], None)


def _put(d: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        d.pop(key, None)
    else:
        d[key] = value
