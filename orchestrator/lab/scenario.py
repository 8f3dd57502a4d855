"""Lab scenarios: how the simulated server starts, how fast it serves, and how it fails.

A scenario is a YAML file; its format, every key and the matching rules are in
docs/formats.md ("Lab scenario"). It is validated here by hand, not with pydantic, because
this module runs inside minimal hosts that only have python3 and PyYAML. Every problem is
reported as one `ScenarioError` line naming the file, the key path and what was expected.

In brief: a rule's `when` maps flag names (no dashes; dotted key paths reach inside JSON
valued flags; `env` holds environment conditions) to conditions (a scalar is equal, `true`
present, `false` absent, a list a multi-value flag, or `lt, le, gt, ge, ne, in`). A
condition written as a number compares numerically, one written as text compares text.
Fault rules are tried in order and the first whose conditions all hold (and whose
`probability`, if any, comes up for this seed and command line) wins; with `seed: random`
every start draws afresh. `throughput` and `latency` are a figure or `{base, factors,
noise}`: every matching factor applies (a factor naming several flags acts only when all
are there) and the noise (`within`, `between`, `warmup`, `outlier`) is drawn by
`MetricModel.start` from the random stream it is given. Answers rules make a serving server
answer wrong (`orchestrator.lab.answering`): garbled, wrong or drifting, on a fraction of
the prompts, under concurrency or for long prompts only, or flaky by start.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from orchestrator.lab import flags as flagcat
from orchestrator.lab.scenario_model import (
    ANSWER_EFFECTS,
    DEFAULT_STARTUP,
    EFFECTS,
    OPERATORS,
    ROUTES,
    RULE_PHASES,
    STARTUP_PHASES,
    AnswerRule,
    Condition,
    Factor,
    Frame,
    MetricModel,
    MetricNoise,
    ModelInfo,
    Rule,
    Scenario,
    ScenarioError,
    When,
    coerce,
    is_number,
)

# ---------------------------------------------------------------------------- loading


def repo_root() -> Path:
    """The repository holding this package (the parent of the `orchestrator` directory)."""
    return Path(__file__).resolve().parent.parent.parent


def scenarios_dir() -> Path:
    return repo_root() / "experiments" / "lab"


def available_scenarios() -> list[str]:
    base = scenarios_dir()
    if not base.is_dir():
        return []
    return sorted(p.parent.name for p in base.glob("*/scenario.yaml"))


def resolve(spec: str) -> Path:
    """`--scenario` value -> file: a path as given, or a bare name under experiments/lab/."""
    as_path = Path(spec)
    looks_like_path = "/" in spec or spec.endswith((".yaml", ".yml")) or spec.startswith(".")
    if looks_like_path or as_path.is_file():
        if not as_path.is_file():
            raise ScenarioError(f"{spec}: scenario file not found")
        return as_path
    candidate = scenarios_dir() / spec / "scenario.yaml"
    if not candidate.is_file():
        names = available_scenarios()
        close = difflib.get_close_matches(spec, names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(names) if names else "none"
        raise ScenarioError(
            f"no scenario named {spec!r} (looked for {candidate}){hint} known: {known}"
        )
    return candidate


def load(spec: str | Path) -> Scenario:
    """Read and validate a scenario; raises ScenarioError with a one-line message."""
    path = resolve(str(spec))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot read scenario file: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(f"{path}: not valid YAML{where}: {problem}") from None
    return _Validator(path).scenario(data)


class _Validator:
    """Turns parsed YAML into a Scenario, naming file and key path in every error."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.versions: tuple[str, ...] = ()

    def fail(self, where: str, msg: str) -> ScenarioError:
        return ScenarioError(f"{self.path}: {where}: {msg}" if where else f"{self.path}: {msg}")

    def keys(self, where: str, data: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
        for key in data:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                expected = ", ".join(allowed)
                raise self.fail(
                    _join(where, str(key)), f"unknown key{hint}; expected one of: {expected}"
                )

    def mapping(self, where: str, v: object) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self.fail(where, f"expected a mapping, got {_kind(v)}")
        return v

    def number(
        self,
        where: str,
        v: object,
        *,
        minimum: float | None = None,
        positive: bool = False,
        maximum: float | None = None,
    ) -> float:
        if not is_number(v):
            raise self.fail(where, f"expected a number, got {_kind(v)}")
        if positive and v <= 0:
            raise self.fail(where, f"expected a positive number, got {v}")
        if minimum is not None and v < minimum:
            raise self.fail(where, f"expected a number >= {minimum}, got {v}")
        if maximum is not None and v > maximum:
            raise self.fail(where, f"expected a number <= {maximum}, got {v}")
        return float(v)

    def integer(self, where: str, v: object, lo: int, hi: int) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise self.fail(where, f"expected a whole number from {lo} to {hi}, got {v!r}")
        return v

    def string(self, where: str, v: object, *, nonempty: bool = True) -> str:
        if not isinstance(v, str) or (nonempty and not v.strip()):
            raise self.fail(where, f"expected a non-empty string, got {_kind(v)}")
        return v

    # -- top level

    def scenario(self, data: object) -> Scenario:
        if data is None:
            raise self.fail("", "the file is empty; expected a scenario mapping")
        data = self.mapping("(top level)", data)
        self.keys(
            "",
            data,
            (
                "name",
                "description",
                "seed",
                "startup",
                "faults",
                "throughput",
                "latency",
                "known_flags",
                "defaults",
                "model",
                "versions",
                "answers",
                "prompt_sets",
                "routes",
            ),
        )
        self.versions = self.version_list(data.get("versions"))
        name = self.string("name", data["name"]) if "name" in data else self.path.parent.name
        seed: int | None = 0
        if data.get("seed") == "random":
            seed = None
        elif "seed" in data:
            if not isinstance(data["seed"], int) or isinstance(data["seed"], bool):
                raise self.fail(
                    "seed", f"expected a whole number or 'random', got {_kind(data['seed'])}"
                )
            seed = self.integer("seed", data["seed"], 0, 2**63)
        startup = self.startup(data.get("startup", {}))
        faults_raw = data.get("faults", [])
        if faults_raw is None:
            faults_raw = []
        if not isinstance(faults_raw, list):
            raise self.fail("faults", f"expected a list of rules, got {_kind(faults_raw)}")
        faults = tuple(self.rule(i, r) for i, r in enumerate(faults_raw))
        answers_raw = data.get("answers") or []
        if not isinstance(answers_raw, list):
            raise self.fail("answers", f"expected a list of rules, got {_kind(answers_raw)}")
        answers = tuple(self.answer_rule(i, r) for i, r in enumerate(answers_raw))
        prompt_sets = self.prompt_sets(data.get("prompt_sets"))
        routes = self.routes(data.get("routes", list(ROUTES)))
        base, factors, noise = self.metric("throughput", data.get("throughput", 1000.0))
        latency = None
        if "latency" in data:
            lbase, lfactors, lnoise = self.metric("latency", data["latency"])
            latency = MetricModel(lbase, lfactors, False, lnoise)
        defaults = self.defaults(data.get("defaults", {}))
        known = self.known_flags(data["known_flags"]) if data.get("known_flags") else None
        model = self.model(data.get("model", {}))
        desc = data.get("description", "")
        if not isinstance(desc, str):
            raise self.fail("description", f"expected a string, got {_kind(desc)}")
        return Scenario(
            name=name,
            path=self.path,
            description=desc,
            seed=seed,
            startup=startup,
            faults=faults,
            throughput=base,
            factors=factors,
            throughput_noise=noise,
            latency=latency,
            known_flags=known,
            defaults=defaults,
            model=model,
            versions=self.versions,
            answers=answers,
            prompt_sets=prompt_sets,
            routes=routes,
        )

    def routes(self, v: object) -> tuple[str, ...]:
        if not isinstance(v, list) or any(r not in ROUTES for r in v) or len(set(v)) < len(v):
            got = repr(v) if isinstance(v, list) else _kind(v)
            raise self.fail("routes", f"expected a list of distinct {', '.join(ROUTES)}, got {got}")
        return tuple(v)

    def prompt_sets(self, v: object) -> tuple[Path, ...]:
        if v is None:
            return ()
        if not isinstance(v, list):
            raise self.fail("prompt_sets", f"expected a list of JSONL file paths, got {_kind(v)}")
        out = []
        for i, item in enumerate(v):
            where = f"prompt_sets[{i}]"
            path = Path(self.string(where, item))
            path = path if path.is_absolute() else self.path.parent / path
            if not path.is_file():
                raise self.fail(where, f"no such file: {path}; expected a prompt set (JSONL)")
            out.append(path)
        return tuple(out)

    def answer_rule(self, i: int, v: object) -> AnswerRule:
        where = f"answers[{i}]"
        data = self.mapping(where, v)
        self.keys(
            where,
            data,
            (
                "when",
                "effect",
                "fraction",
                "concurrency",
                "min_prompt_tokens",
                "min_prompt_chars",
                "probability",
                "from_token",
                "description",
            ),
        )
        if "when" not in data:
            raise self.fail(
                f"{where}.when", "missing; expected a mapping of conditions ({} = always)"
            )
        effect = data.get("effect")
        if effect not in ANSWER_EFFECTS:
            raise self.fail(
                f"{where}.effect", f"expected one of {', '.join(ANSWER_EFFECTS)}, got {effect!r}"
            )
        fraction = 1.0
        if data.get("fraction") is not None:
            fraction = self.number(f"{where}.fraction", data["fraction"])
            if not 0 < fraction <= 1:
                raise self.fail(f"{where}.fraction", f"expected a number in (0, 1], got {fraction}")
        prob = None
        if data.get("probability") is not None:
            prob = self.number(f"{where}.probability", data["probability"])
            if not 0 < prob <= 1:
                raise self.fail(f"{where}.probability", f"expected a number in (0, 1], got {prob}")
        counts: dict[str, int | None] = {}
        for key, lo in (("concurrency", 2), ("min_prompt_tokens", 1), ("min_prompt_chars", 1)):
            raw = data.get(key)
            counts[key] = None if raw is None else self.integer(f"{where}.{key}", raw, lo, 10**9)
        from_token = 16
        if data.get("from_token") is not None:
            if effect != "drift":
                raise self.fail(
                    f"{where}.from_token", f"only a 'drift' rule has one (effect is {effect!r})"
                )
            from_token = self.integer(f"{where}.from_token", data["from_token"], 0, 10**6)
        desc = data.get("description", "")
        if not isinstance(desc, str):
            raise self.fail(f"{where}.description", f"expected a string, got {_kind(desc)}")
        return AnswerRule(
            index=i,
            when=self.when(f"{where}.when", data["when"]),
            effect=effect,
            fraction=fraction,
            concurrency=counts["concurrency"],
            min_prompt_tokens=counts["min_prompt_tokens"],
            min_prompt_chars=counts["min_prompt_chars"],
            probability=prob,
            from_token=from_token,
        )

    def version_list(self, v: object) -> tuple[str, ...]:
        if v is None:
            return ()
        if not isinstance(v, list) or not v:
            raise self.fail(
                "versions", f"expected a list of version names, oldest first, got {_kind(v)}"
            )
        names = [
            str(x) if isinstance(x, int | float | str) and not isinstance(x, bool) else ""
            for x in v
        ]
        for i, name in enumerate(names):
            if not name:
                raise self.fail(f"versions[{i}]", f"expected a version name, got {_kind(v[i])}")
            if names.index(name) != i:
                raise self.fail(f"versions[{i}]", f"version {name!r} is listed twice")
        return tuple(names)

    def version_condition(self, where: str, v: object) -> Condition:
        """`version: 0.5.23` (equal), `{ge: 0.5.23}`, `{in: [...]}`: by the order of
        `versions:`, as positions."""
        if not self.versions:
            raise self.fail(where, "a version condition needs the scenario's 'versions:' list")
        c = self.condition(
            where,
            "version",
            v
            if not isinstance(v, dict)
            else {k: (0 if k in ("lt", "le", "gt", "ge") else x) for k, x in v.items()},
        )
        raw = v[c.op] if isinstance(v, dict) else v

        def index(x: object, at: str) -> int:
            name = str(x)
            if name not in self.versions:
                close = difflib.get_close_matches(name, self.versions, n=1)
                mean = f"; did you mean {close[0]!r}?" if close else ""
                raise self.fail(at, f"version {name!r} is not in 'versions:'{mean}")
            return self.versions.index(name)

        if c.op in ("present", "absent"):
            return c
        if c.op == "in":
            return Condition("version", "in", [index(x, f"{where}.in") for x in raw])
        return Condition("version", c.op, index(raw, where))

    def startup(self, v: object) -> dict[str, float]:
        data = self.mapping("startup", v if v is not None else {})
        self.keys("startup", data, STARTUP_PHASES)
        out = dict(DEFAULT_STARTUP)
        for phase, secs in data.items():
            out[phase] = self.number(f"startup.{phase}", secs, minimum=0)
        return out

    def defaults(self, v: object) -> dict[str, Any]:
        data = self.mapping("defaults", v if v is not None else {})
        out: dict[str, Any] = {}
        for key, val in data.items():
            flag, *path = str(key).lstrip("-").split(".")
            if path:  # a key path: a JSON value, as the server's JSON reads it
                if not isinstance(val, int | float | str | bool):
                    raise self.fail(
                        f"defaults.{key}", f"expected a number, string or boolean, got {_kind(val)}"
                    )
                out[".".join((flagcat.canonical(flag), *path))] = val
                continue
            if not isinstance(val, int | float | str) or isinstance(val, bool):
                raise self.fail(f"defaults.{key}", f"expected a number or string, got {_kind(val)}")
            # a default stands for the flag on the command line: its text is read as the
            # command line's is, so `"0.85"` and `0.85` are the same default
            out[flagcat.canonical(flag)] = coerce(val) if isinstance(val, str) else val
        return out

    def model(self, v: object) -> ModelInfo:
        data = self.mapping("model", v if v is not None else {})
        self.keys(
            "model",
            data,
            (
                "arch",
                "dtype",
                "shards",
                "gpu_mem_gb",
                "weights_gb",
                "context_len",
                "load_gb_per_s",
                "dummy_load_s",
            ),
        )
        kw: dict[str, Any] = {}
        for key in ("arch", "dtype"):
            if key in data:
                kw[key] = self.string(f"model.{key}", data[key])
        for key in ("shards", "context_len"):
            if key in data:
                kw[key] = self.integer(f"model.{key}", data[key], 1, 10**9)
        for key in ("gpu_mem_gb", "weights_gb", "load_gb_per_s"):
            if key in data:
                kw[key] = self.number(f"model.{key}", data[key], positive=True)
        if "dummy_load_s" in data:
            kw["dummy_load_s"] = self.number("model.dummy_load_s", data["dummy_load_s"], minimum=0)
        return ModelInfo(**kw)

    def metric(self, key: str, v: object) -> tuple[float, tuple[Factor, ...], MetricNoise]:
        """`throughput:` or `latency:`: a number, or `{base, factors, noise}`."""
        unit = "tokens per second, e.g. 4000" if key == "throughput" else "seconds, e.g. 0.05"
        if is_number(v):
            return self.number(key, v, positive=True), (), MetricNoise()
        data = self.mapping(key, v)
        self.keys(key, data, ("base", "factors", "noise"))
        if "base" not in data:
            raise self.fail(f"{key}.base", f"missing; expected {unit}")
        base = self.number(f"{key}.base", data["base"], positive=True)
        raw = data.get("factors") or []
        if not isinstance(raw, list):
            raise self.fail(f"{key}.factors", f"expected a list, got {_kind(raw)}")
        factors = []
        for i, f in enumerate(raw):
            where = f"{key}.factors[{i}]"
            fd = self.mapping(where, f)
            self.keys(where, fd, ("when", "multiply"))
            if "when" not in fd or "multiply" not in fd:
                raise self.fail(where, "expected both 'when' and 'multiply'")
            factors.append(
                Factor(
                    self.when(f"{where}.when", fd["when"]),
                    self.number(f"{where}.multiply", fd["multiply"], positive=True),
                )
            )
        noise = self.noise(f"{key}.noise", data["noise"]) if "noise" in data else MetricNoise()
        return base, tuple(factors), noise

    def noise(self, where: str, v: object) -> MetricNoise:
        data = self.mapping(where, v)
        self.keys(where, data, ("within", "between", "warmup", "outlier"))
        kw: dict[str, Any] = {}
        for key in ("within", "between"):
            if key in data:
                kw[key] = self.number(f"{where}.{key}", data[key], minimum=0, maximum=1)
        if "warmup" in data:
            w = self.mapping(f"{where}.warmup", data["warmup"])
            self.keys(f"{where}.warmup", w, ("runs", "worse"))
            kw["warmup_runs"] = self.integer(f"{where}.warmup.runs", w.get("runs", 1), 0, 100)
            kw["warmup_worse"] = self.number(
                f"{where}.warmup.worse", w.get("worse", 0.0), minimum=0, maximum=10
            )
        if "outlier" in data:
            o = self.mapping(f"{where}.outlier", data["outlier"])
            self.keys(f"{where}.outlier", o, ("probability", "worse"))
            kw["outlier_probability"] = self.number(
                f"{where}.outlier.probability", o.get("probability", 0.0), minimum=0, maximum=1
            )
            kw["outlier_worse"] = self.number(
                f"{where}.outlier.worse", o.get("worse", 0.3), minimum=0, maximum=10
            )
        return MetricNoise(**kw)

    # -- rules

    def rule(self, i: int, v: object) -> Rule:
        where = f"faults[{i}]"
        data = self.mapping(where, v)
        self.keys(
            where,
            data,
            (
                "when",
                "phase",
                "effect",
                "error",
                "after_requests",
                "probability",
                "exit_code",
                "kill",
                "frames",
                "description",
                "needs_real_weights",
            ),
        )
        if "when" not in data:
            raise self.fail(
                f"{where}.when", "missing; expected a mapping of conditions ({} = always)"
            )
        when = self.when(f"{where}.when", data["when"])
        after = None
        if data.get("after_requests") is not None:
            after = self.integer(f"{where}.after_requests", data["after_requests"], 0, 10**9)
        phase = data.get("phase", "serving" if after is not None else None)
        if phase not in RULE_PHASES:
            raise self.fail(
                f"{where}.phase", f"expected one of {', '.join(RULE_PHASES)}, got {phase!r}"
            )
        if after is not None and phase != "serving":
            raise self.fail(
                f"{where}.after_requests",
                f"only a 'serving' phase rule can wait for requests (phase is {phase!r})",
            )
        effect = data.get("effect", "crash")
        if effect not in EFFECTS:
            raise self.fail(
                f"{where}.effect", f"expected one of {', '.join(EFFECTS)}, got {effect!r}"
            )
        if effect == "hang" and phase == "args":
            raise self.fail(f"{where}.effect", "an 'args' rule cannot hang; it exits with code 2")
        error = ""
        if effect == "crash":
            if "error" not in data:
                raise self.fail(
                    f"{where}.error",
                    "missing; a crash needs the error text it ends with, e.g. 'RuntimeError: ...'",
                )
            error = self.string(f"{where}.error", data["error"]).strip("\n")
        elif "error" in data:
            error = self.string(f"{where}.error", data["error"]).strip("\n")
        prob = None
        if data.get("probability") is not None:
            prob = self.number(f"{where}.probability", data["probability"])
            if not 0 < prob <= 1:
                raise self.fail(f"{where}.probability", f"expected a number in (0, 1], got {prob}")
        default_code = 2 if phase == "args" else 1
        code = self.integer(f"{where}.exit_code", data.get("exit_code", default_code), 0, 255)
        kill = data.get("kill", False)
        if not isinstance(kill, bool):
            raise self.fail(f"{where}.kill", f"expected true or false, got {_kind(kill)}")
        raw_frames = data.get("frames") or []
        if not isinstance(raw_frames, list):
            raise self.fail(
                f"{where}.frames", f"expected a list of frames, got {_kind(raw_frames)}"
            )
        frames = tuple(self.frame(f"{where}.frames[{j}]", f) for j, f in enumerate(raw_frames))
        real = data.get("needs_real_weights", False)
        if not isinstance(real, bool):
            raise self.fail(
                f"{where}.needs_real_weights", f"expected true or false, got {_kind(real)}"
            )
        return Rule(
            index=i,
            when=when,
            phase=phase,
            effect=effect,
            error=error,
            needs_real_weights=real,
            after_requests=after if phase == "serving" else None,
            probability=prob,
            exit_code=code,
            kill=kill,
            frames=frames,
        )

    def frame(self, where: str, v: object) -> Frame:
        data = self.mapping(where, v)
        self.keys(where, data, ("file", "line", "func", "code"))
        for key in ("file", "line", "func", "code"):
            if key not in data:
                raise self.fail(f"{where}.{key}", "missing; a frame needs file, line, func, code")
        return Frame(
            self.string(f"{where}.file", data["file"]),
            self.integer(f"{where}.line", data["line"], 1, 10**7),
            self.string(f"{where}.func", data["func"]),
            self.string(f"{where}.code", data["code"]),
        )

    def when(self, where: str, v: object) -> When:
        data = self.mapping(where, v if v is not None else {})
        flag_conds = []
        env_conds: list[Condition] = []
        version_conds: list[Condition] = []
        for key, cond in data.items():
            if key == "version":
                version_conds.append(self.version_condition(f"{where}.version", cond))
                continue
            if key == "env":
                env = self.mapping(f"{where}.env", cond)
                env_conds.extend(
                    self.condition(f"{where}.env.{k}", str(k), c) for k, c in env.items()
                )
                continue
            if not isinstance(key, str) or not key.strip("-"):
                raise self.fail(f"{where}.{key}", "expected a flag name like 'ep-size'")
            flag, *path = key.lstrip("-").split(".")
            if not flag or not all(path):
                raise self.fail(
                    f"{where}.{key}",
                    "expected a flag name or a key path like "
                    "'compilation-config.pass_config.enable_fusion'",
                )
            name = flagcat.canonical(flag)
            if path:
                flag_conds.append(self.key_condition(f"{where}.{key}", name, tuple(path), cond))
            else:
                flag_conds.append(self.condition(f"{where}.{key}", name, cond))
        return When(tuple(flag_conds), tuple(env_conds), tuple(version_conds))

    def key_condition(self, where: str, key: str, path: tuple[str, ...], v: object) -> Condition:
        """A condition on a key path: booleans are JSON values, not present/absent."""
        if isinstance(v, bool):
            return Condition(key, "eq", v, path)
        if isinstance(v, dict) and set(v) == {"present"}:
            if not isinstance(v["present"], bool):
                raise self.fail(
                    f"{where}.present", f"expected true or false, got {_kind(v['present'])}"
                )
            return Condition(key, "present" if v["present"] else "absent", None, path)
        c = self.condition(where, key, v)
        return Condition(c.key, c.op, c.value, path)

    def condition(self, where: str, key: str, v: object) -> Condition:
        if v is True:
            return Condition(key, "present")
        if v is False:
            return Condition(key, "absent")
        if v is None:
            raise self.fail(
                where,
                "expected a value, true (present), false (absent) or a "
                "mapping of lt/le/gt/ge/ne/in; got null",
            )
        if isinstance(v, int | float | str):
            return Condition(key, "eq", v)
        if isinstance(v, list):
            for i, item in enumerate(v):
                if not isinstance(item, int | float | str) or isinstance(item, bool):
                    raise self.fail(
                        f"{where}[{i}]", f"expected a number or string, got {_kind(item)}"
                    )
            return Condition(key, "eq", list(v))
        data = self.mapping(where, v)
        if len(data) != 1:
            # One operator per condition keeps the meaning obvious; ranges use two rules.
            raise self.fail(
                where, f"expected exactly one of {', '.join(OPERATORS)}, got {len(data)} keys"
            )
        self.keys(where, data, OPERATORS)
        op, operand = next(iter(data.items()))
        if op in ("lt", "le", "gt", "ge"):
            self.number(f"{where}.{op}", operand)
        elif op == "in":
            if not isinstance(operand, list) or not operand:
                raise self.fail(f"{where}.in", f"expected a non-empty list, got {_kind(operand)}")
        elif not isinstance(operand, int | float | str) or isinstance(operand, bool):
            raise self.fail(f"{where}.ne", f"expected a number or string, got {_kind(operand)}")
        return Condition(key, op, operand)

    # -- known flags

    def known_flags(self, v: object) -> tuple[flagcat.FlagSpec, ...]:
        where = "known_flags"
        if isinstance(v, str):
            return tuple(self.preset(where, v))
        if isinstance(v, list):
            return tuple(self.flag_list(where, v, []))
        data = self.mapping(where, v)
        self.keys(where, data, ("preset", "add", "remove"))
        specs = self.preset(f"{where}.preset", data.get("preset")) if "preset" in data else []
        remove = data.get("remove") or []
        if not isinstance(remove, list):
            raise self.fail(
                f"{where}.remove", f"expected a list of flag names, got {_kind(remove)}"
            )
        drop = {str(r).lstrip("-") for r in remove}
        unknown = drop - {s.name for s in specs}
        if unknown:
            raise self.fail(f"{where}.remove", f"not in the preset: {', '.join(sorted(unknown))}")
        specs = [s for s in specs if s.name not in drop]
        add = data.get("add") or []
        if not isinstance(add, list):
            raise self.fail(f"{where}.add", f"expected a list, got {_kind(add)}")
        return tuple(self.flag_list(f"{where}.add", add, specs))

    def preset(self, where: str, name: object) -> list[flagcat.FlagSpec]:
        try:
            return flagcat.preset(str(name))
        except KeyError:
            raise self.fail(
                where,
                f"unknown preset {name!r}; expected one of {', '.join(flagcat.preset_names())}",
            ) from None

    def flag_list(
        self, where: str, items: list[Any], start: list[flagcat.FlagSpec]
    ) -> list[flagcat.FlagSpec]:
        specs = list(start)
        seen = {s.name for s in specs}
        for i, item in enumerate(items):
            w = f"{where}[{i}]"
            if isinstance(item, str):
                name = item.lstrip("-")
                spec = flagcat.CATALOGUE.get(name) or flagcat.FlagSpec(name)
            elif isinstance(item, dict) and len(item) == 1:
                name, kind = next(iter(item.items()))
                name = str(name).lstrip("-")
                if kind not in flagcat.KINDS:
                    raise self.fail(
                        f"{w}.{name}", f"expected one of {', '.join(flagcat.KINDS)}, got {kind!r}"
                    )
                base = flagcat.CATALOGUE.get(name)
                spec = flagcat.FlagSpec(
                    name, kind, base.aliases if base else (), base.help if base else None
                )
            else:
                raise self.fail(
                    w,
                    "expected a flag name, or a one-key mapping "
                    f"name: value|switch|list; got {_kind(item)}",
                )
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
                raise self.fail(w, f"{name!r} is not a valid option name")
            if name in seen:
                raise self.fail(w, f"flag {name!r} is listed twice")
            seen.add(name)
            specs.append(spec)
        return specs


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _kind(v: object) -> str:
    if isinstance(v, bool):
        return f"a boolean ({str(v).lower()})"
    if v is None:
        return "nothing (null)"
    if isinstance(v, int | float):
        return f"a number ({v})"
    if isinstance(v, str):
        return f"a string ({v!r})"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "a mapping"
    return type(v).__name__
