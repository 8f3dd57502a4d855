"""A deployment: one experiment spread over several units, each a role on a host.

An experiment names `roles:` (name -> kind, rank, host, unit, exec, flags, env). The
`service:` section is what every server role shares (`node`, `prefill`, `decode`); a role's
own `flags:`/`env:` are laid over it (`null` removes a shared flag on that role). A
`router` takes only what it names itself: its own command and flags. An experiment
without `roles:` is a deployment of one role, `server`, run exactly as before.

Order: the router starts first (it waits for its workers, as sglang_router does), then
each server's ranks in order (rank 0 first: the others connect to its init address), then
prefill before decode; stops go in reverse. Health is polled on the router, else rank 0.

Some flags hold one value over the roles (`AGREE`, each entry with the servers' own docs,
tests or reports as its source). A variant that splits one the servers require to agree is
refused before it starts (`refusal`), unless the experiment says `mismatched_roles: start`;
one they support split in some setups only (prefill and decode of different TP sizes) is
said before the campaign (`split_warnings`), never refused.
Everything here is pure: it reads frozen configs and returns frozen values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.config.flagtext import FlagValue, _keyed, option_word, render_value
from orchestrator.errors import ConfigError

#: a frozen launch (`config.experiment.Experiment`, which holds its roles: read here by
#: its attributes, never imported, so the two modules do not import each other)
Experiment = Any

#: the name of the one role of an experiment without `roles:`
SINGLE = "server"
#: the kinds whose servers take the shared `service:` flags and environment
SERVING = ("node", "prefill", "decode")
#: start order of the kinds (ranks ascending within a kind)
_KIND_ORDER = {"router": 0, "node": 1, "prefill": 2, "decode": 3}
_ROLE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class Role:
    """One role: its own part of the launch (a flag or variable of None is removed on it)."""

    name: str
    kind: str
    rank: int | None = None
    host: str | None = None
    unit: str | None = None
    exec: tuple[str, ...] | None = None
    flags: tuple[tuple[str, Any], ...] = ()
    env: tuple[tuple[str, str | None], ...] = ()

    @property
    def serving(self) -> bool:
        """Whether it takes the shared flags and environment (every kind but the router)."""
        return self.kind in SERVING

    def to_dict(self) -> dict[str, Any]:
        import shlex

        out: dict[str, Any] = {"kind": self.kind}
        if self.rank is not None:
            out["rank"] = self.rank
        for key in ("host", "unit"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.exec is not None:
            out["exec"] = shlex.join(self.exec)
        if self.flags:
            out["flags"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.flags}
        if self.env:
            out["env"] = dict(self.env)
        return out

    def key(self) -> list[Any]:
        """What of the role decides a verdict (the experiment's fingerprint)."""
        return [
            self.name,
            self.kind,
            self.rank,
            self.host,
            self.unit,
            list(self.exec) if self.exec else None,
            sorted([k, None if v is None else _keyed(v)] for k, v in self.flags),
            sorted([k, v] for k, v in self.env),
        ]


@dataclass(frozen=True)
class Deployment:
    """The roles of one experiment, in start order, and the one health is polled on."""

    roles: tuple[Role, ...]

    @property
    def start_order(self) -> tuple[str, ...]:
        ranked = sorted(
            self.roles, key=lambda r: (_KIND_ORDER[r.kind], r.rank if r.rank is not None else 0)
        )
        return tuple(r.name for r in ranked)

    @property
    def stop_order(self) -> tuple[str, ...]:
        return tuple(reversed(self.start_order))

    @property
    def health_role(self) -> str:
        """The router if there is one, else rank 0 (or the first role in start order)."""
        for r in self.roles:
            if r.kind == "router":
                return r.name
        return self.start_order[0]

    def role(self, name: str) -> Role:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)

    @property
    def single(self) -> bool:
        return len(self.roles) == 1


def deployment(exp: Experiment) -> Deployment:
    """The deployment of an experiment: its roles, or one role `server` (the experiment)."""
    if exp.roles:
        return Deployment(exp.roles)
    return Deployment((Role(SINGLE, "node", rank=0, unit=exp.unit),))


def role_flags(exp: Experiment, role: Role) -> dict[str, FlagValue]:
    """A role's effective flags: the shared ones (for a server role) with its own over them."""
    out: dict[str, Any] = dict(exp.flags) if role.serving else {}
    for k, v in role.flags:
        out[k] = v
    return {k: v for k, v in out.items() if v is not None}


def role_env(exp: Experiment, role: Role) -> dict[str, str]:
    out: dict[str, str | None] = dict(exp.env) if role.serving else {}
    for k, v in role.env:
        out[k] = v
    return {k: v for k, v in out.items() if v is not None}


def launch(exp: Experiment, name: str) -> Experiment:
    """The single-unit launch one role runs (its command, flags, environment, unit and
    port): what an executor installs on that role's host. Of a single-role experiment,
    the experiment itself."""
    if not exp.roles:
        return exp
    role = deployment(exp).role(name)
    flags = role_flags(exp, role)
    port = flags.get("port")
    health = exp.health
    if isinstance(port, int) and not isinstance(port, bool):
        health = replace(health, port=port)
    return replace(
        exp,
        name=f"{exp.name}/{role.name}",
        exec=role.exec or exp.exec,
        flags=tuple(flags.items()),
        env=tuple(role_env(exp, role).items()),
        unit=role.unit or exp.unit,
        health=health,
        roles=(),
    )


def listens(exp: Experiment, name: str) -> bool:
    """Whether role `name` binds its HTTP port: the role health is polled on, a router, and
    the first (or only) node of each server, unless `headless` (vLLM's switch for a rank
    without an API server); the other ranks of a multi-node server serve no HTTP (SGLang's
    `--node-rank` >= 1, vLLM's headless ranks only join rank 0), so the port they inherit
    from the shared flags is none of theirs on their host."""
    if not exp.roles:
        return True
    dep = deployment(exp)
    if name == dep.health_role:
        return True
    role = dep.role(name)
    if role_flags(exp, role).get("headless"):
        return False
    return role.kind == "router" or role.rank in (None, 0)


def with_role_changes(
    exp: Experiment,
    name: str,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str | None] | None = None,
) -> Experiment:
    """A copy where role `name` sets these flags/variables (None: removed on that role)."""
    roles = []
    for r in exp.roles:
        if r.name == name:
            f = dict(r.flags)
            for k, v in (flags or {}).items():
                f[k] = None if v is False else v
            e = dict(r.env) | dict(env or {})
            r = replace(r, flags=tuple(f.items()), env=tuple(e.items()))
        roles.append(r)
    return replace(exp, roles=tuple(roles))


def without_overrides(exp: Experiment, flags: set[str], env: set[str]) -> Experiment:
    """A copy where the server roles no longer set these flags/variables of their own (a
    shared change then reaches each of them alike)."""
    roles = []
    for r in exp.roles:
        if r.serving:
            r = replace(
                r,
                flags=tuple((k, v) for k, v in r.flags if k not in flags),
                env=tuple((k, v) for k, v in r.env if k not in env),
            )
        roles.append(r)
    return replace(exp, roles=tuple(roles))


# ---------------------------------------------------------------------------- loading


def build_roles(
    models: Mapping[str, Any] | None,
    *,
    source: str,
    exec_words: tuple[str, ...],
    flag_value: Any,
) -> tuple[Role, ...]:
    """Freeze `roles:`, checking what no schema can: names, kinds, ranks, one router.
    `flag_value(raw_name, value, key, exec_words)` turns a flag as written into its
    (name, value) as the launch has it (None: absent) or raises ConfigError."""
    if models is None:
        return ()
    import shlex

    if not models:
        raise ConfigError(
            "roles is empty", file=source, key="roles", hint="name each role, or drop roles:"
        )
    roles: list[Role] = []
    for name, m in models.items():
        key = f"roles.{name}"
        if not _ROLE_NAME.match(name):
            raise ConfigError(
                f"role name {name!r} is not a plain name (letters, digits, '-', '_', '.')",
                file=source,
                key=key,
            )
        kind = m.kind or (name if name in ("prefill", "decode", "router") else None)
        if kind is None:
            raise ConfigError(
                "a role needs its kind",
                file=source,
                key=f"{key}.kind",
                hint="one of node (with a rank), prefill, decode, router",
            )
        if kind == "node" and m.rank is None:
            raise ConfigError(
                "a node role needs its rank (its --node-rank)", file=source, key=f"{key}.rank"
            )
        if kind == "router" and m.rank is not None:
            raise ConfigError("a router has no rank", file=source, key=f"{key}.rank")
        exe = None
        if m.exec is not None:
            try:
                exe = tuple(shlex.split(m.exec))
            except ValueError as exc:
                raise ConfigError(
                    f"cannot split the command: {exc}", file=source, key=f"{key}.exec"
                ) from None
            if not exe:
                raise ConfigError("the command is empty", file=source, key=f"{key}.exec")
        flags: list[tuple[str, Any]] = []
        for raw, value in (m.flags or {}).items():
            flag, v = flag_value(raw, value, f"{key}.flags.{raw}", exe or exec_words)
            flags.append((flag, v))  # None: removed on this role
        env: list[tuple[str, str | None]] = []
        for var, value in (m.env or {}).items():
            if value is None or value is False:
                env.append((var, None))
            elif isinstance(value, str):
                env.append((var, value))
            else:
                env.append((var, str(value).lower() if isinstance(value, bool) else str(value)))
        roles.append(Role(name, kind, m.rank, m.host, m.unit, exe, tuple(flags), tuple(env)))
    _check_shape(roles, source)
    return tuple(roles)


def _check_shape(roles: list[Role], source: str) -> None:
    if not any(r.serving for r in roles):
        raise ConfigError(
            "a deployment needs a server role (node, prefill or decode), not only a router",
            file=source,
            key="roles",
        )
    routers = [r.name for r in roles if r.kind == "router"]
    if len(routers) > 1:
        raise ConfigError(
            f"one router per deployment, got {', '.join(routers)}", file=source, key="roles"
        )
    for kind in SERVING:
        same = [r for r in roles if r.kind == kind]
        if len(same) < 2 and all(r.rank in (None, 0) for r in same):
            continue
        ranks = sorted(r.rank if r.rank is not None else -1 for r in same)
        if ranks != list(range(len(same))):
            raise ConfigError(
                f"the {kind} roles are the nodes of one server and need the ranks "
                f"0..{len(same) - 1} once each, got "
                + ", ".join(f"{r.name}: {r.rank}" for r in same),
                file=source,
                key="roles",
            )
        for r in same:
            given = dict(r.flags).get("node-rank")
            if given is not None and given != r.rank:
                raise ConfigError(
                    f"--node-rank {given} differs from the role's rank {r.rank}",
                    file=source,
                    key=f"roles.{r.name}.flags.node-rank",
                )


# ---------------------------------------------------------------------------- agreement


@dataclass(frozen=True)
class Rule:
    """Flags (by any of their names) that hold one value over a set of roles, with the
    servers' own word for it (`source`). `required`: a split is refused; else the servers
    support a split in some setups only, and it is a warning, never a refusal."""

    names: tuple[str, ...]
    #: `serving`: every server role; `server`: the ranks of one server (one kind)
    over: str
    why: str
    source: str
    required: bool = True
    #: the value both servers take when the flag is absent (None: none that holds for
    #: every setup, as SGLang's page size, which some attention backends raise): a role
    #: that writes it agrees with a role that leaves the flag out
    default: str | None = None


_SGLANG_MULTINODE = (
    "SGLang's multi-node deployment docs, docs.sglang.io references/multi_node_deployment: "
    "every node is started with the same --tp, --dist-init-addr and --nnodes"
)
_VLLM_DP = (
    "vLLM's data parallel deployment docs, docs.vllm.ai serving/data_parallel_deployment: "
    "every node is started with the same --data-parallel-size, --data-parallel-address "
    "and --data-parallel-rpc-port"
)

#: the flags the roles of a deployment hold one value of, each checked against the
#: servers' own docs, tests and reports (cited in `source`); only `required` ones refuse
AGREE: tuple[Rule, ...] = (
    # SGLang checks it itself since sglang#14474 (an error on prefill, a hung request on
    # decode); before that the transfer never completed
    Rule(
        ("page-size",),
        "serving",
        "KV pages move between the roles: a page size that differs hangs every request",
        "sglang#14474: 'Both servers must use the same --page-size value'",
    ),
    # vLLM's NixlConnector transfers between block sizes that differ in some setups only
    Rule(
        ("block-size",),
        "serving",
        "KV blocks move between the roles: vLLM transfers between block sizes that differ "
        "only with some connectors and models",
        "vLLM's NixlConnector compatibility matrix, docs.vllm.ai "
        "features/nixl_connector_compatibility: heterogeneous block size partly supported",
        required=False,
    ),
    Rule(
        ("kv-cache-dtype",),
        "serving",
        "KV cache moves between the roles: a dtype that differs corrupts answers silently",
        "sglang#19398: no dtype conversion in the KV transfer, corrupted answers and then "
        "'Requested address not found'; vllm#42179: mixed KV cache dtypes between prefill "
        "and decode are not supported yet",
        default="auto",  # SGLang's and vLLM's server arguments
    ),
    Rule(
        ("model-path", "model"),
        "serving",
        "every role must serve the same model: one model's KV cache means nothing to another",
        "SGLang's PD disaggregation docs, docs.sglang.io advanced_features/pd_disaggregation, "
        "and vLLM's disaggregated prefill docs, docs.vllm.ai features/disagg_prefill: every "
        "role starts on one model",
    ),
    # prefill and decode of different TP sizes are a supported layout: the transfer maps
    # prefill's ranks onto decode's; some models and backends still fail with it
    Rule(
        ("tp-size", "tensor-parallel-size"),
        "serving",
        "the KV layout follows the TP size: the servers map one onto the other, but not for "
        "every model and transfer backend, as sglang#15674 reports of non-MLA models under load",
        "sglang#5922 and SGLang's test_disaggregation_different_tp.py: prefill and decode of "
        "different TP sizes are supported; vLLM's NixlConnector compatibility matrix: "
        "heterogeneous TP supported, partly for MLA",
        required=False,
        default="1",
    ),
    Rule(
        ("tp-size", "tensor-parallel-size"),
        "server",
        "the ranks of one server split one model over one TP size; a rank that counts "
        "another never joins the others",
        _SGLANG_MULTINODE,
        default="1",
    ),
    Rule(
        ("dist-init-addr",),
        "server",
        "the ranks of one server meet at one init address; a rank sent elsewhere hangs",
        _SGLANG_MULTINODE,
    ),
    Rule(
        ("nnodes",),
        "server",
        "the ranks of one server must agree on how many they are; the others wait forever",
        _SGLANG_MULTINODE,
        default="1",
    ),
    # vLLM's data parallel over several nodes: every rank dials the head's address and RPC
    # port and expects the same number of ranks; a rank that differs never joins, and the
    # others wait for it in the handshake without a line
    Rule(
        ("data-parallel-address",),
        "server",
        "the data-parallel ranks of one server meet at one address; a rank sent elsewhere hangs",
        _VLLM_DP,
    ),
    Rule(
        ("data-parallel-rpc-port",),
        "server",
        "the data-parallel ranks of one server meet at one RPC port; a rank sent elsewhere hangs",
        _VLLM_DP,
    ),
    Rule(
        ("data-parallel-size",),
        "server",
        "the data-parallel ranks of one server must agree on how many they are; the others "
        "wait forever",
        _VLLM_DP,
        default="1",
    ),
)


@dataclass(frozen=True)
class Disagreement:
    """Roles that would start with different values of a flag that must agree."""

    flag: str
    #: (role, value as the launch has it; None: absent) in role order
    values: tuple[tuple[str, Any], ...]
    why: str
    #: the servers' own word for it (their docs, tests, reports)
    source: str = ""
    #: refused before a start; else only a warning (a split the servers sometimes support)
    required: bool = True

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(r for r, _ in self.values)

    def describe(self) -> str:
        parts = [
            f"{r}: {option_word(self.flag)} "
            + (" ".join(render_value(v)) or "(switch)" if v is not None else "(absent)")
            for r, v in self.values
        ]
        source = f"; {self.source}" if self.source else ""
        return f"{'; '.join(parts)} ({self.why}{source})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "flag": self.flag,
            "values": {r: list(v) if isinstance(v, tuple) else v for r, v in self.values},
            "why": self.why,
            "source": self.source,
            "required": self.required,
        }


@dataclass(frozen=True)
class Refusal:
    """Why a variant is `invalid` before it starts: the flags it would split."""

    disagreements: tuple[Disagreement, ...]

    @property
    def reason(self) -> str:
        return "roles disagree: " + " | ".join(d.describe() for d in self.disagreements)

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "disagreements": [d.to_dict() for d in self.disagreements]}


def disagreements(exp: Experiment) -> tuple[Disagreement, ...]:
    """Every flag of `AGREE` the roles of this launch would split (none for one role):
    those the servers require to agree and those they only sometimes do."""
    dep = deployment(exp)
    if dep.single:
        return ()
    found: list[Disagreement] = []
    serving = [r for r in dep.roles if r.serving]
    flags = {r.name: role_flags(exp, r) for r in serving}
    for rule in AGREE:
        groups = [serving] if rule.over == "serving" else _servers(serving)
        for group in groups:
            if len(group) < 2:
                continue
            values = tuple((r.name, _first(flags[r.name], rule.names)) for r in group)
            # an absent flag is the server's default: written out, it is the same launch
            if len({_hashable(rule.default if v is None else v) for _, (_, v) in values}) > 1:
                name = next((n for _, (n, v) in values if v is not None), rule.names[0])
                pairs = tuple((r, v) for r, (_, v) in values)
                found.append(Disagreement(name, pairs, rule.why, rule.source, rule.required))
    for group in _servers(serving):
        if len(group) < 2:
            continue
        for r in group:
            n = flags[r.name].get("nnodes")
            if n is not None and n != len(group):
                found.append(
                    Disagreement(
                        "nnodes",
                        ((r.name, n),),
                        f"the deployment has {len(group)} {r.kind} roles for this server",
                        _SGLANG_MULTINODE,
                    )
                )
                break
    return tuple(found)


def starts_anyway(*exps: Experiment) -> bool:
    """Whether a campaign over these configs starts variants whose roles disagree: any of
    them says `mismatched_roles: start` (a variant is built from good and takes bad's
    deltas, so the pair decides, as for `rehearse:`)."""
    return any(e.mismatched_roles == "start" for e in exps)


def refusal(exp: Experiment, *, start: bool | None = None) -> Refusal | None:
    """Why this launch must not start (roles that would split a flag they must agree on),
    or None: it agrees, or it starts anyway (`start`; by default the launch's own
    `mismatched_roles: start`)."""
    if exp.mismatched_roles == "start" if start is None else start:
        return None
    found = tuple(d for d in disagreements(exp) if d.required)
    return Refusal(found) if found else None


def split_warnings(*exps: Experiment) -> list[str]:
    """What the roles of these configs split that the servers support only in some setups
    (never refused): one line per split, naming the configs that have it, said before a
    campaign starts."""
    files: dict[tuple[str, str], list[str]] = {}
    for exp in exps:
        for d in disagreements(exp):
            if not d.required:
                where = files.setdefault((d.flag, d.describe()), [])
                if (exp.source or exp.name) not in where:
                    where.append(exp.source or exp.name)
    return [
        f"{', '.join(where)}: the roles differ on {option_word(flag)}, a layout the servers "
        f"support in some setups only: {text}"
        for (flag, text), where in files.items()
    ]


def _servers(serving: list[Role]) -> list[list[Role]]:
    """The ranks of each server over several nodes: the roles of one kind."""
    by_kind: dict[str, list[Role]] = {}
    for r in serving:
        by_kind.setdefault(r.kind, []).append(r)
    return list(by_kind.values())


def _first(flags: Mapping[str, Any], names: tuple[str, ...]) -> tuple[str, Any]:
    for n in names:
        if n in flags:
            return n, flags[n]
    return names[0], None


def _hashable(v: Any) -> Any:
    """A value as the server reads it: `16` and `"16"` are one page size."""
    return None if v is None else tuple(render_value(v))
