"""Experiment configs: one server launch (exec, flags, env, unit, port, health, probe).

The frozen `Experiment` and its parts, built from a merged, validated config: the checks
no schema can make (a complete command, a port, what the kernel can launch) are made
there, naming the file and key. Files are read and their `extends:` chains merged in
`config.loading`; the models they are validated with are `config.schema`'s.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.config.containers import container_split
from orchestrator.config.deployment import Deployment, Role, build_roles, deployment, launch
from orchestrator.config.flagtext import (  # noqa: F401 (FlagValue, _keyed: used by others)
    FlagValue,
    _jsonable,
    _keyed,
    _scalar_text,
    option_word,
    render_value,
)
from orchestrator.config.probe import DEFAULT_REPEATS, DEFAULT_WARMUP, Probe
from orchestrator.config.repair import Declared
from orchestrator.config.schema import (
    ExperimentModel,
    HealthModel,
    ServiceModel,
    uncarriable,
)
from orchestrator.config.secrets import resolve_reference
from orchestrator.config.shortopts import canonical
from orchestrator.config.yamlio import validation_error
from orchestrator.errors import ConfigError

DEFAULT_HEALTH_TIMEOUT = 15 * 60.0
#: the flag SGLang and vLLM both take to load random weights instead of the checkpoint
LOAD_FORMAT = "load-format"
DEFAULT_SETTLE = 1.0  # seconds a server must stay up after its first ready answers


# ---------------------------------------------------------------------------- frozen objects


@dataclass(frozen=True)
class Health:
    path: str = "/health"
    port: int = 30000
    timeout: float = DEFAULT_HEALTH_TIMEOUT
    ready_after: int = 2
    interval: float | None = None  # None: capped exponential backoff chosen by the executor
    #: seconds a server that just became ready must stay alive before it counts as ready
    #: (one more poll after them): a server that answers /health and then dies is no pass
    settle: float = DEFAULT_SETTLE


@dataclass(frozen=True)
class AnswersCheck:
    """`answers:`: what a ready server is asked and how its answers are judged against the
    good config's in the same campaign (orchestrator.diagnosis.answers)."""

    enabled: bool = True
    #: the prompt set's file; None: the shipped default set
    prompts: str | None = None
    rule: str = "logprobs-close"
    top_k: int = 5
    max_tokens: int = 24
    modes: tuple[str, ...] = ("sequential", "batch")
    #: `chat` or `completions`: the endpoint every prompt goes to (a chat prompt set sent
    #: to completions is its messages' text; a completion prompt sent to chat, one user turn)
    endpoint: str | None = None
    pass_if: str = ">= good - 0.08"
    #: ready means /health passes AND one real completion returns
    ready_completion: bool = True
    timeout: float = 120.0  # per request
    #: the prompt set's digest: a run judged on other prompts is another run
    digest: str = ""

    def judged(self) -> bool:
        return self.enabled

    def key(self) -> list[object]:
        return [
            self.enabled,
            self.digest,
            self.rule,
            self.top_k,
            self.max_tokens,
            list(self.modes),
            self.endpoint,
            self.pass_if if self.rule == "score" else None,
            self.ready_completion,
        ]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "enabled": self.enabled,
            "rule": self.rule,
            "top_k": self.top_k,
            "max_tokens": self.max_tokens,
            "modes": list(self.modes),
            "ready_completion": self.ready_completion,
            "timeout": self.timeout,
        }
        if self.rule == "score":
            out["pass_if"] = self.pass_if
        if self.prompts is not None:
            out["prompts"] = self.prompts
        if self.endpoint is not None:
            out["endpoint"] = self.endpoint
        if self.digest:
            out["digest"] = self.digest
        return out

    def load(self) -> tuple[Any, ...]:
        """The prompt set (orchestrator.diagnosis.answers.Prompt), each sent to `endpoint`."""
        from orchestrator.config.prompts import load_prompts

        path = Path(self.prompts) if self.prompts else None
        try:
            prompts = load_prompts(path)
        except ConfigError as exc:
            # a recorded config's prompt set (a rerun's): the key is named, and why it
            # must come back rather than be replaced
            hint = exc.hint or (
                "restore the prompt set as its runs were asked it, or start a new campaign"
                if self.digest
                else None
            )
            raise ConfigError(f"the prompt set {exc}", key="answers.prompts", hint=hint) from exc
        loaded = tuple(_to_endpoint(p, self.endpoint) for p in prompts)
        now = prompts_digest(loaded)
        if self.digest and now != self.digest:
            # a recorded config (a rerun, a resumed campaign): its reference answered the
            # questions of then; answers to other questions are no answers to judge by them
            from orchestrator.config.prompts import DEFAULT_PROMPTS

            raise ConfigError(
                f"the prompt set changed since the runs it judges were recorded (digest "
                f"{self.digest}, now {now}): answers to other prompts cannot be judged "
                "against the recorded ones",
                file=str(path or DEFAULT_PROMPTS),
                key="answers.prompts",
                hint="restore the prompt set as it was, or start a new campaign",
            )
        return loaded


def prompts_digest(prompts: tuple[Any, ...]) -> str:
    """The digest of a loaded prompt set (part of a config's fingerprint)."""
    blob = json.dumps([repr(p) for p in prompts])
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _to_endpoint(prompt: Any, endpoint: str | None) -> Any:
    if endpoint == "chat" and prompt.messages is None:
        return replace(prompt, prompt=None, messages=(("user", prompt.prompt),))
    if endpoint == "completions" and prompt.messages is not None:
        text = "\n".join(content for _, content in prompt.messages)
        return replace(prompt, prompt=text, messages=None)
    return prompt


def flag_key(raw: str) -> str:
    """A config's flag key as the launch names it: `--tp-size` and `tp-size` are the long
    option `tp-size`; a key written with one dash (`-tp`, `-O3`) is a short option and
    keeps its dash (it is given as `-tp`, never as `--tp`)."""
    if raw.startswith("-") and not raw.startswith("--") and len(raw) > 1:
        return raw
    return raw.lstrip("-")


@dataclass(frozen=True)
class Experiment:
    """One resolved server launch. Hashable and comparable; the planner's unit of work."""

    name: str
    exec: tuple[str, ...]
    flags: tuple[tuple[str, FlagValue], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    unit: str | None = None
    workdir: str | None = None
    health: Health = field(default_factory=Health)
    probe: Probe | None = None
    #: the answers check (`answers:`); None: the server is judged by its health alone
    answers: AnswersCheck | None = None
    requires: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: environment variables the launch removes (sorted): `env: {X: null}`, or a variable
    #: another config of the campaign sets; a unit's own `Environment=X=...` does not reach
    #: the server then (`UnsetEnvironment=`, `unset X`)
    unset: tuple[str, ...] = ()
    source: str | None = field(default=None, compare=False)
    #: (env var or flag, the `${VAR}` its value came from): secret
    secret_refs: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    #: campaign hints, not part of the launch: `rehearse:` and `expect.run_time` (seconds)
    rehearse: str | None = field(default=None, compare=False)
    run_time: float | None = field(default=None, compare=False)
    #: the repair moves this file declares (`repair:`), a campaign hint like `rehearse:`
    repair: Declared | None = field(default=None, compare=False)
    #: the build that runs (`service.build`; None: the command as it is); see config.builds
    build: str | None = None
    #: (distribution, version) taken from build `packages_from` over `build` (an overlay
    #: on the server's path; `bisect --packages`)
    packages: tuple[tuple[str, str], ...] = ()
    packages_from: str | None = None
    #: the roles of a deployment over several units (config.deployment); () is one unit
    roles: tuple[Role, ...] = ()
    #: a variant whose roles split a flag they must agree on: `refuse` (invalid) or `start`
    mismatched_roles: str = "refuse"

    @property
    def weights(self) -> str:
        """Which weights the server loads: `dummy` (`--load-format dummy`: random weights of
        the same shapes) or `real`."""
        return "dummy" if str(self.flag_map().get(LOAD_FORMAT, "")) == "dummy" else "real"

    def with_dummy_weights(self) -> Experiment:
        """The same launch on random weights (SGLang and vLLM: `--load-format dummy`)."""
        return self.with_changes(flags={LOAD_FORMAT: "dummy"})

    def secrets(self) -> dict[str, str]:
        """VAR -> value of everything secret in this launch (see orchestrator.config.secrets)."""
        from orchestrator.config.secrets import secrets_of

        return secrets_of(self.env_map(), self.flags, marked=dict(self.secret_refs))

    # ---- views
    def deployment(self) -> Deployment:
        """Its roles in start order (one role, `server`, without `roles:`)."""
        return deployment(self)

    def role_launch(self, role: str) -> Experiment:
        """The single-unit launch of one role (of a single unit: itself)."""
        return launch(self, role)

    @property
    def port(self) -> int:
        return self.health.port

    def flag_map(self) -> dict[str, FlagValue]:
        return dict(self.flags)

    def env_map(self) -> dict[str, str]:
        return dict(self.env)

    def argv(self) -> list[str]:
        """The full command line: exec words, then `--flag [value...]` in config order."""
        out = list(self.exec)
        for name, value in self.flags:
            out.append(option_word(name))
            out.extend(render_value(value))
        return out

    def unsetting(self, keys: Iterable[str]) -> Experiment:
        """The same launch with every variable of `keys` it does not set removed too (the
        variables another config of the campaign sets: a variant without one must not get
        the unit's or the host's value of it). The one place a launch's removals are
        decided: every command runs and records the launch this returns."""
        env = self.env_map()
        unset = tuple(sorted(set(self.unset) | {k for k in keys if k not in env}))
        return self if unset == self.unset else replace(self, unset=unset)

    def command_line(self) -> str:
        return shlex.join(self.argv())

    def fingerprint(self) -> str:
        """Identifies everything that decides a run's verdict: what the server is launched
        with (order of flags does not matter) and how it is judged (health check, probe,
        bar). Cached verdicts are keyed by it, so a run judged under other settings (another
        health path, a shorter deadline, another bar) is never reused."""
        h = self.health
        launch = {
            "exec": list(self.exec),
            # a JSON object or array value by its canonical text: key order and spacing
            # decide nothing (the argv keeps the text as written)
            "flags": sorted([k, _keyed(v)] for k, v in self.flags),
            "env": sorted([k, v] for k, v in self.env),
            # joins only when set: the keys of launches that removed nothing hold
            **({"unset": list(self.unset)} if self.unset else {}),
            "unit": self.unit,
            "workdir": self.workdir,
            # settle joins only when set: the keys of runs recorded before it existed hold
            "health": [h.path, h.port, h.timeout, h.ready_after, h.interval]
            + ([h.settle] if h.settle != DEFAULT_SETTLE else []),
            "probe": (
                [self.probe.run, self.probe.metric, self.probe.pass_if, self.probe.timeout]
                # repeats and warm-up join only when not the default: older runs' keys hold
                + (
                    [self.probe.repeats, self.probe.warmup]
                    if (self.probe.repeats, self.probe.warmup) != (DEFAULT_REPEATS, DEFAULT_WARMUP)
                    else []
                )
                if self.probe
                else None
            ),
        }
        if self.build is not None:  # joins only when set: older runs' keys hold
            launch["build"] = self.build
        if self.answers is not None:  # joins only when set: older runs' keys hold
            launch["answers"] = self.answers.key()
        if self.env and container_split(self.exec) is not None:
            # the environment goes into the container (`-e`): runs from before it did
            # launched another server and hold no verdict for this one
            launch["env_into_container"] = True
        if self.packages:
            launch["packages"] = [sorted(self.packages), self.packages_from]
        if self.roles:  # joins only when set: a single unit's key holds
            launch["roles"] = [r.key() for r in self.roles]
            launch["mismatched_roles"] = self.mismatched_roles
        blob = json.dumps(launch, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # ---- derivation
    def with_changes(
        self,
        flags: Mapping[str, FlagValue | None] | None = None,
        env: Mapping[str, str | None] | None = None,
        name: str | None = None,
    ) -> Experiment:
        """A copy with flags/env set (None removes). New flags go after existing ones."""
        # a dict keeps the config's order and puts new keys last; a removed key is marked
        # and dropped at the end (deleting from a list per key would be quadratic)
        merged: dict[str, FlagValue | None] = dict(self.flags)
        for key, value in (flags or {}).items():
            merged[key] = None if value is False else value
        new_flags = [(k, v) for k, v in merged.items() if v is not None]
        new_env = dict(self.env)
        unset = set(self.unset)
        for key, value in (env or {}).items():
            if value is None:
                new_env.pop(key, None)
                unset.add(key)  # removed: the unit's own value must not come back
            else:
                new_env[key] = value
                unset.discard(key)
        port = self.health.port
        for key, value in new_flags:
            if key == "port" and isinstance(value, int) and not isinstance(value, bool):
                port = value
        return replace(
            self,
            name=name or self.name,
            flags=tuple(new_flags),
            env=tuple(new_env.items()),
            unset=tuple(sorted(unset)),
            health=replace(self.health, port=port),
        )

    # ---- serialisation (store, rerun, render)
    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "service": {}}
        svc = data["service"]
        if self.unit:
            svc["unit"] = self.unit
        svc["exec"] = shlex.join(self.exec)
        if self.workdir:
            svc["workdir"] = self.workdir
        if self.build is not None:
            svc["build"] = self.build
        if self.packages:
            svc["packages"] = dict(self.packages)
            svc["packages_from"] = self.packages_from
        svc["flags"] = {k: _jsonable(v) for k, v in self.flags}
        if self.env or self.unset:
            svc["env"] = dict(self.env) | dict.fromkeys(self.unset)  # null: removed
        h = self.health
        data["health"] = {"path": h.path, "port": h.port, "timeout": h.timeout}
        data["health"]["ready_after"] = h.ready_after
        if h.interval is not None:
            data["health"]["interval"] = h.interval
        if self.probe:
            p = {"run": self.probe.run, "timeout": self.probe.timeout}
            if self.probe.metric:
                p["metric"] = self.probe.metric
            if self.probe.pass_if:
                p["pass_if"] = self.probe.pass_if
            if self.probe.repeats != DEFAULT_REPEATS:
                p["repeats"] = self.probe.repeats
            if self.probe.warmup != DEFAULT_WARMUP:
                p["warmup"] = self.probe.warmup
            data["probe"] = p
        if self.answers is not None:
            data["answers"] = self.answers.to_dict()
        if self.requires:
            data["requires"] = {k: list(v) for k, v in self.requires}
        if self.repair is not None:
            data["repair"] = self.repair.to_dict()
        if self.roles:
            data["roles"] = {r.name: r.to_dict() for r in self.roles}
        if self.mismatched_roles != "refuse":
            data["mismatched_roles"] = self.mismatched_roles
        return data

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, source: str = "<recorded>", resolve_secrets: bool = False
    ) -> Experiment:
        """A recorded config. Its secrets were stored as `[REDACTED:NAME]` markers; with
        `resolve_secrets` they are taken from this environment again (to run it)."""
        data = dict(data)
        # the prompt set's digest as recorded: the file may have changed or be elsewhere
        digest = None
        if isinstance(data.get("answers"), Mapping) and "digest" in data["answers"]:
            data["answers"] = dict(data["answers"])
            digest = str(data["answers"].pop("digest"))
        if digest is not None:
            exp = cls.from_dict(data, source=source, resolve_secrets=resolve_secrets)
            assert exp.answers is not None
            return replace(exp, answers=replace(exp.answers, digest=digest))
        if resolve_secrets:
            from orchestrator.config.secrets import MARKER, unredact

            svc = dict(data.get("service") or {})
            refs: list[tuple[str, str]] = []
            for part in ("env", "flags"):
                values = dict(svc.get(part) or {})
                for k, v in values.items():
                    m = MARKER.fullmatch(v) if isinstance(v, str) else None
                    if m:
                        refs.append((k, m[1]))
                    if isinstance(v, str) and MARKER.search(v):
                        values[k] = unredact(v)
                svc[part] = values
            data["service"] = svc
            exp = _build(data, source)
            return replace(exp, secret_refs=tuple(dict.fromkeys(exp.secret_refs + tuple(refs))))
        return _build(data, source)


def _check_workdir(workdir: str, source: str) -> None:
    """WorkingDirectory= takes its value verbatim (no quoting, no escapes), so the
    directory must be an absolute path it can hold: one line, no control characters."""
    why = uncarriable(workdir)
    if why is None and not workdir.startswith("/"):
        why = "must be an absolute path on the host"
    if why is None and re.search(r"[\x00-\x1f\x7f]", workdir):
        why = "cannot contain control characters (newline, tab, ...)"
    if why is None and workdir != workdir.rstrip():
        why = "cannot end with whitespace (systemd would drop it)"
    if why:
        raise ConfigError(f"{workdir!r} {why}", file=source, key="service.workdir")


#: Linux's MAX_ARG_STRLEN: no single argv word or environment entry may be longer, in bytes
#: with its terminating NUL (execve fails with "Argument list too long")
MAX_ARG_BYTES = 131072
#: all of argv and the environment together: well under the common ARG_MAX of 2 MiB and
#: systemd's longest unit file line (1 MiB), whatever the host
MAX_LAUNCH_BYTES = 1024 * 1024


def _check_sizes(
    flags: list[tuple[str, FlagValue]],
    env: list[tuple[str, str]],
    exec_words: tuple[str, ...],
    source: str,
) -> None:
    """Refuse at load what no host can start: a word or an entry past the kernel's limit."""
    # (key, one argv word or environment entry, what it is) for every string execve gets
    strings = [("service.exec", w, "argument") for w in exec_words]
    for name, value in flags:
        words = [option_word(name), *render_value(value)]
        strings += [(f"service.flags.{name}", w, "argument") for w in words]
    strings += [(f"service.env.{k}", f"{k}={v}", "environment entry") for k, v in env]
    total = 0
    for key, text, what in strings:
        size = len(text.encode("utf-8", "surrogatepass")) + 1
        total += size
        if size > MAX_ARG_BYTES:
            raise ConfigError(
                f"the {'value' if what == 'argument' else 'entry'} is {size - 1} bytes; one "
                f"{what} can hold at most {MAX_ARG_BYTES - 1} (the kernel's MAX_ARG_STRLEN)",
                file=source,
                key=key,
                hint="pass large settings in a file the server reads",
            )
    if total > MAX_LAUNCH_BYTES:
        raise ConfigError(
            f"the command line and environment together are {total} bytes; at most "
            f"{MAX_LAUNCH_BYTES} can be launched on any host",
            file=source,
            key="service",
        )


def _build(data: dict[str, Any], source: str) -> Experiment:
    """Check completeness of a merged config and freeze it."""
    try:
        model = ExperimentModel.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, ExperimentModel, file=source) from None
    svc = model.service or ServiceModel()
    if not svc.exec:
        raise ConfigError(
            "required key is missing: the command that starts the server",
            file=source,
            key="service.exec",
            hint="e.g. exec: /opt/sglang/bin/python -m sglang.launch_server",
        )
    why = uncarriable(svc.exec)
    if why:
        raise ConfigError(f"the command {why}", file=source, key="service.exec")
    try:
        exec_words = tuple(shlex.split(svc.exec))
    except ValueError as exc:
        raise ConfigError(
            f"cannot split the command: {exc}", file=source, key="service.exec"
        ) from None
    if not exec_words:
        raise ConfigError("the command is empty", file=source, key="service.exec")
    if svc.workdir is not None:
        _check_workdir(svc.workdir, source)
    if svc.packages and not svc.packages_from:
        raise ConfigError(
            "packages taken from another build need that build",
            file=source,
            key="service.packages_from",
        )

    secret_refs: list[tuple[str, str]] = []

    def flag_value(
        raw_name: str, value: Any, key: str, words: tuple[str, ...]
    ) -> tuple[str, FlagValue | None]:
        # a known server's short alias is its long option (`-tp` is vLLM's
        # tensor-parallel-size): one option to the planner however it is written
        name = canonical(words, flag_key(raw_name))
        if value is None or value is False:
            return name, None  # absent
        if isinstance(value, list):
            if not value:
                return name, None
            value = tuple(value)
        if isinstance(value, str):
            value, ref = resolve_reference(value, file=source, key=key)
            if ref:
                secret_refs.append((name, ref))
        for word in value if isinstance(value, tuple) else (value,):
            why = uncarriable(word) if isinstance(word, str) else None
            if why:
                raise ConfigError(f"the value {why}", file=source, key=key)
        return name, value

    flags: list[tuple[str, FlagValue]] = []
    seen: set[str] = set()  # a set, not a scan of `flags`: loading stays linear in the flags
    for raw_name, raw_value in (svc.flags or {}).items():
        name, value = flag_value(raw_name, raw_value, f"service.flags.{raw_name}", exec_words)
        if value is None:
            continue
        if name in seen:
            raise ConfigError(
                f"flag '{name}' is given twice", file=source, key=f"service.flags.{raw_name}"
            )
        seen.add(name)
        flags.append((name, value))

    env: list[tuple[str, str]] = []
    unset: list[str] = []
    for key, value in (svc.env or {}).items():
        if value is None or value is False:
            # `X: null` (or `false`, as for a flag): the launch removes X (the unit's own
            # X too); the text "false" is written quoted
            unset.append(key)
            continue
        text = _scalar_text(value) if not isinstance(value, str) else value
        text, ref = resolve_reference(text, file=source, key=f"service.env.{key}")
        if ref:
            secret_refs.append((key, ref))
        why = uncarriable(text)
        if why:
            raise ConfigError(f"the value {why}", file=source, key=f"service.env.{key}")
        env.append((key, text))

    _check_sizes(flags, env, exec_words, source)
    roles = build_roles(model.roles, source=source, exec_words=exec_words, flag_value=flag_value)
    h = model.health or HealthModel()
    flag_port = dict(flags).get("port")
    if roles:  # health is polled on the router, else rank 0: the port is that role's
        from orchestrator.config.deployment import role_flags

        dep = Deployment(roles)
        polled = dep.role(dep.health_role)
        flag_port = role_flags(_Shared(tuple(flags)), polled).get("port")
        if flag_port is None and h.port is None:
            raise ConfigError(
                f"no port: health is polled on the role '{polled.name}', which names none",
                file=source,
                key=f"roles.{polled.name}.flags.port",
                hint="set the port that role's server listens on (its --port)",
            )
    if flag_port is not None and (
        isinstance(flag_port, bool) or not isinstance(flag_port, int) or not 0 < flag_port < 65536
    ):
        raise ConfigError(
            f"expected a port number, got {flag_port!r}", file=source, key="service.flags.port"
        )
    if flag_port is not None and h.port is not None and h.port != flag_port:
        raise ConfigError(
            f"health.port {h.port} differs from the server's --port {flag_port}",
            file=source,
            key="health.port",
            hint="drop health.port: the health port is taken from --port",
        )
    port = flag_port if flag_port is not None else h.port
    if port is None:
        raise ConfigError(
            "no port: the health check needs the port the server listens on",
            file=source,
            key="service.flags.port",
            hint="set service.flags.port (the server's --port), or health.port if the server "
            "takes its port another way; it is never guessed",
        )
    health = Health(
        path=h.path or "/health",
        port=int(port),
        timeout=h.timeout or DEFAULT_HEALTH_TIMEOUT,
        ready_after=h.ready_after or 2,
        interval=h.interval,
        settle=DEFAULT_SETTLE if h.settle is None else h.settle,
    )
    probe = None
    if model.probe is not None:
        p = model.probe
        if not p.run:
            raise ConfigError("required key is missing", file=source, key="probe.run")
        probe = Probe(
            run=p.run,
            metric=p.metric,
            pass_if=p.pass_if,
            timeout=p.timeout or 600.0,
            repeats=DEFAULT_REPEATS if p.repeats is None else p.repeats,
            warmup=DEFAULT_WARMUP if p.warmup is None else p.warmup,
        )
        if p.pass_if and not p.metric:
            raise ConfigError(
                "pass_if needs a metric to compare",
                file=source,
                key="probe.pass_if",
                hint="add probe.metric: a regex with one group capturing the number",
            )
    answers = _answers(model, source)
    requires = tuple(
        (flag_key(k), tuple(flag_key(x) for x in v)) for k, v in (model.requires or {}).items()
    )
    name = model.name or Path(source).stem
    return Experiment(
        name=name,
        exec=exec_words,
        flags=tuple(flags),
        env=tuple(env),
        unit=svc.unit,
        workdir=svc.workdir,
        health=health,
        probe=probe,
        answers=answers,
        requires=requires,
        unset=tuple(sorted(unset)),
        source=source,
        secret_refs=tuple(secret_refs),
        rehearse=model.rehearse,
        run_time=model.expect.run_time if model.expect else None,
        repair=Declared.of(model.repair, source),
        build=svc.build,
        packages=tuple((svc.packages or {}).items()),
        packages_from=svc.packages_from,
        roles=roles,
        mismatched_roles=model.mismatched_roles or "refuse",
    )


def _answers(model: ExperimentModel, source: str) -> AnswersCheck | None:
    """The `answers:` section, its prompt file read now (a path relative to the file that
    names it): a missing or malformed prompt set is refused at load, not after a start."""
    a = model.answers
    if a is None:
        return None
    enabled = True if a.enabled is None else a.enabled
    prompts = a.prompts
    if prompts is not None:
        path = Path(prompts).expanduser()
        if not path.is_absolute() and not source.startswith(("<", "run ")):
            path = Path(source).parent / path
        prompts = str(path)
    if a.pass_if is not None and (a.rule or "logprobs-close") != "score":
        raise ConfigError(
            f"pass_if is the bar of the score rule, but the rule is {a.rule or 'logprobs-close'!r}",
            file=source,
            key="answers.pass_if",
            hint="set answers.rule: score, or drop answers.pass_if",
        )
    check = AnswersCheck(
        enabled=enabled,
        prompts=prompts,
        rule=a.rule or "logprobs-close",
        top_k=a.top_k or 5,
        max_tokens=a.max_tokens or 24,
        modes=tuple(a.modes or ("sequential", "batch")),
        endpoint=a.endpoint,
        pass_if=a.pass_if or ">= good - 0.08",
        ready_completion=enabled if a.ready_completion is None else a.ready_completion,
        timeout=a.timeout or 120.0,
    )
    if (not check.enabled and not check.ready_completion) or source.startswith(
        ("<recorded>", "run ")
    ):
        return check  # a recorded config: its digest is the recorded one (from_dict)
    try:
        loaded = check.load()
    except ConfigError as exc:
        raise ConfigError(exc.reason, file=source, key="answers.prompts", hint=exc.hint) from exc
    if check.rule == "score" and not any(p.scored for p in loaded):
        raise ConfigError(
            "the score rule needs prompts with an expected answer (expect or regex)",
            file=source,
            key="answers.rule",
            hint="add expect/regex to the prompts, or use rule: logprobs-close",
        )
    return replace(check, digest=prompts_digest(loaded))


@dataclass(frozen=True)
class _Shared:
    """The shared flags of a config being built (what `role_flags` reads of it)."""

    flags: tuple[tuple[str, FlagValue], ...]
    env: tuple[tuple[str, str], ...] = ()
