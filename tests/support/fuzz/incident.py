"""A fuzz incident: the differences between a good and a bad launch of the lab server, the
scenario rules that make some of them fail, and the files that stage it.

An incident is plain data (it round-trips through YAML, which is how a regression case is
kept). Each rule names deltas as applied or not applied; `write()` turns that into the lab
scenario's own conditions (`orchestrator/lab/scenario.py`) and into two experiment files.
What the incident *means* is worked out by the oracle from those files alone, never from
the rules' roles written here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

#: the JSON-valued flag whose keys may be deltas
JSON_FLAG = "compilation-config"
#: flags every launch has (never a delta)
BASE_FLAGS: dict[str, Any] = {
    "model-path": "/models/Fuzz-70B",
    "tp-size": 8,
    "trust-remote-code": True,
}
#: tiny startup phases: a start costs a fraction of a second on the lab server
STARTUP = {"init": 0.02, "load_weights": 0.05, "kv_cache": 0.02, "cuda_graph": 0.03, "warmup": 0.02}
#: the serving crash of a rule with `after_requests` needs more prompts than this
AFTER_REQUESTS = 20
PROBE_PROMPTS = 30


@dataclass(frozen=True)
class Delta:
    """One difference: a flag (`name`), an environment variable (`env:NAME`) or a key of
    the JSON flag (`compilation-config.a.b`); None is absent."""

    key: str
    good: Any
    bad: Any

    @property
    def kind(self) -> str:
        if self.key.startswith("env:"):
            return "env"
        return "json" if self.key.startswith(f"{JSON_FLAG}.") else "flag"

    @property
    def name(self) -> str:
        """The flag, variable or key path the scenario's conditions name."""
        return self.key.removeprefix("env:")


@dataclass(frozen=True)
class Cond:
    """A rule's condition on one delta: it holds when the delta is applied (`applied`)
    or when it is not; `cmp` words a numeric one as a comparison instead of equality."""

    key: str
    applied: bool = True
    cmp: bool = False


@dataclass(frozen=True)
class Fault:
    """A scenario rule. `role` is what the generator meant (target or decoy); the oracle
    never reads it."""

    conds: tuple[Cond, ...]
    phase: str
    error: str
    effect: str = "crash"  # crash, hang, or an answers effect (garbled, wrong)
    probability: float | None = None
    after_requests: int | None = None
    role: str = "target"
    #: a condition on a flag both configs share (always true): realism, no effect
    shared: bool = False

    @property
    def answers(self) -> bool:
        return self.effect in ("garbled", "wrong")


@dataclass(frozen=True)
class Incident:
    seed: int
    features: tuple[str, ...]
    deltas: tuple[Delta, ...]
    faults: tuple[Fault, ...]
    probe: bool = False
    answers: bool = False
    health_timeout: float = 30.0

    def delta(self, key: str) -> Delta:
        return next(d for d in self.deltas if d.key == key)

    @property
    def flaky(self) -> bool:
        return any(f.probability is not None for f in self.faults)

    def without(
        self, *, deltas: frozenset[str] = frozenset(), faults: frozenset[int] = frozenset()
    ) -> Incident:
        """The incident with some deltas and rules left out (the shrinker's moves); a
        rule that names a delta left out goes too."""
        kept = tuple(d for d in self.deltas if d.key not in deltas)
        keys = {d.key for d in kept}
        rules = tuple(
            f
            for i, f in enumerate(self.faults)
            if i not in faults and all(c.key in keys for c in f.conds)
        )
        return replace(self, deltas=kept, faults=rules)

    # -- the files ---------------------------------------------------------------

    def config(self, side: str, port: int, scenario: Path, unit: str) -> dict[str, Any]:
        """The experiment file of one side (`good` or `bad`)."""
        flags: dict[str, Any] = dict(BASE_FLAGS)
        env: dict[str, str] = {}
        obj: dict[str, Any] = {}
        for d in self.deltas:
            value = getattr(d, side)
            if d.kind == "json":
                _set_path(obj, d.name.split(".")[1:], value)
            elif value is None:
                continue
            elif d.kind == "env":
                env[d.name] = str(value)
            else:
                flags[d.name] = value
        if obj:
            flags[JSON_FLAG] = json.dumps(obj)
        flags["port"] = port
        out: dict[str, Any] = {
            "name": f"fuzz-{self.seed}-{side}",
            "service": {
                "unit": unit,
                "exec": f"python3 -m orchestrator.lab.server --scenario {scenario}",
                "flags": flags,
                "env": env,
            },
            "health": {
                "path": "/health",
                "timeout": f"{self.health_timeout:g}s",
                "ready_after": 1,
                "settle": "0.2s",
            },
            "answers": {"rule": "logprobs-close"} if self.answers else {"enabled": False},
        }
        if self.probe:
            out["probe"] = {
                "run": (
                    f"python3 -m orchestrator.lab.bench --port {{port}} --num-prompts"
                    f" {PROBE_PROMPTS} --random-output-len 8"
                ),
                "metric": r"Output token throughput \(tok/s\):\s+([\d.]+)",
                "pass_if": ">= 1",
                "timeout": "60s",
            }
        return out

    def scenario(self) -> dict[str, Any]:
        """The lab scenario: the rules' conditions in the scenario's own words."""
        faults, answers = [], []
        for f in self.faults:
            rule: dict[str, Any] = {"when": self._when(f)}
            if f.answers:
                rule["effect"] = f.effect
            else:
                rule["phase"] = f.phase
                if f.effect == "hang":
                    rule["effect"] = "hang"
                else:
                    rule["error"] = f.error
                if f.after_requests is not None:
                    rule["after_requests"] = f.after_requests
            if f.probability is not None:
                rule["probability"] = f.probability
            (answers if f.answers else faults).append(rule)
        out: dict[str, Any] = {
            "name": f"fuzz-{self.seed}",
            "seed": "random" if self.flaky else 0,
            "startup": dict(STARTUP),
            "faults": faults,
            "throughput": 2000,
        }
        if answers:
            out["answers"] = answers
        return out

    def _when(self, f: Fault) -> dict[str, Any]:
        when: dict[str, Any] = {}
        env: dict[str, Any] = {}
        for c in f.conds:
            d = self.delta(c.key)
            value = d.bad if c.applied else d.good
            if value is None:  # the side that does not have it: absent
                cond: Any = False
            elif value is True:
                cond = True
            elif c.cmp and _number(d.good) and _number(d.bad):
                other = d.good if c.applied else d.bad
                cond = {"gt" if value > other else "lt": other}
            else:
                cond = str(value) if d.kind == "env" else value
            (env if d.kind == "env" else when)[d.name] = cond
        if f.shared:
            when["tp-size"] = BASE_FLAGS["tp-size"]
        if env:
            when["env"] = env
        return when

    def write(self, root: Path, port: int, unit: str) -> tuple[Path, Path, Path]:
        """scenario.yaml, good.yaml and bad.yaml under `root`."""
        root.mkdir(parents=True, exist_ok=True)
        scen = root / "scenario.yaml"
        scen.write_text(yaml.safe_dump(self.scenario(), sort_keys=False))
        out = [scen]
        for side in ("good", "bad"):
            path = root / f"{side}.yaml"
            path.write_text(yaml.safe_dump(self.config(side, port, scen, unit), sort_keys=False))
            out.append(path)
        return out[0], out[1], out[2]

    # -- as data -----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Incident:
        return cls(
            seed=d["seed"],
            features=tuple(d["features"]),
            deltas=tuple(Delta(**x) for x in d["deltas"]),
            faults=tuple(
                Fault(**{**f, "conds": tuple(Cond(**c) for c in f["conds"])}) for f in d["faults"]
            ),
            probe=d.get("probe", False),
            answers=d.get("answers", False),
            health_timeout=d.get("health_timeout", 30.0),
        )


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _set_path(obj: dict[str, Any], path: list[str], value: Any) -> None:
    for key in path[:-1]:
        obj = obj.setdefault(key, {})
    obj[path[-1]] = value
