"""Deltas: the differences between a good and a bad config, and variants built from them.

A variant is the good config plus a subset of the deltas (identified by their indices).
Order of deltas is the order of the bad config's flags, then environment, so plans and
reports are stable from run to run.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.config import jsonvalue
from orchestrator.config.containers import container_split
from orchestrator.config.experiment import Experiment, FlagValue, option_word, render_value
from orchestrator.errors import PlanError

DeltaKind = Literal["flag", "env", "exec", "json", "member", "build", "package"]


@dataclass(frozen=True)
class Delta:
    """One difference: `old` is the good config's value, `new` the bad one's (None = absent).

    A `json` delta is one key path inside a flag whose value is a JSON object (`key` is the
    flag, `path` the keys, `old`/`new` the leaf as JSON text); with `member`, the list at
    `path` is a set and `old`/`new` one member removed/added. A `member` delta is one
    value of a multi-value flag documented as a set (`--cuda-graph-bs`). `whole` holds the
    flag's whole value in good and in bad, which a variant's value is rebuilt from. A
    `build` delta is the installation that runs (`service.build`): `old` good's build,
    `new` the one a variant takes; with an ordered list of builds (`--builds`), `order`
    holds it and the search bisects it (planner.ordered). A `package` delta is one
    distribution at good's build's version (`old`) and bad's (`new`; None: bad's build lacks
    it), `path` holding bad's build, which a variant takes it from (`bisect --packages`)."""

    kind: DeltaKind
    key: str
    old: FlagValue | str | None
    new: FlagValue | str | None
    path: tuple[str, ...] = ()
    whole: tuple[FlagValue | None, FlagValue | None] = field(default=(None, None), compare=False)
    member: bool = False
    #: a `build` delta searched on an ordered axis: the builds from good's to bad's
    order: tuple[str, ...] = field(default=(), compare=False)
    #: the role of a deployment whose own flag or variable this is; None: every server
    #: role alike (and the one role of a single unit)
    role: str | None = None

    @property
    def name(self) -> str:
        """The option, or the option and key path of a json delta: `hf-overrides.head_dim`."""
        return f"{self.key}.{jsonvalue.path_text(self.path)}" if self.kind == "json" else self.key

    @property
    def what(self) -> str:
        """What kind of thing changed, as an answer words it: `flag`, `env`, `exec`, `json`
        (one key of a JSON-valued option), `member` (one member of a set), `build` or
        `package`."""
        return "member" if self.member or self.kind == "member" else self.kind

    @property
    def change(self) -> str:
        if self.old is None:
            return "added"
        if self.new is None:
            return "removed"
        return "changed"

    def describe(self) -> str:
        """Human form: `+ --ep-size 8`, `- --disable-radix-cache`, `~ --x 128 -> 256`; a
        role's own: `decode: ~ --page-size 16 -> 64`."""
        return _redacted(self, self._in_role(self._describe()))

    def _in_role(self, text: str) -> str:
        return f"{self.role}: {text}" if self.role is not None else text

    def _describe(self) -> str:
        if self.kind == "package":
            if self.old is None:
                return f"+ package {self.key} {self.new}"
            if self.new is None:
                return f"- package {self.key} (was {self.old})"
            return f"~ package {self.key} {self.old} -> {self.new}"
        if self.kind == "build":
            if self.old is None:
                return f"+ build {self.new}"
            if self.new is None:
                return f"- build {self.old}"
            return f"~ build {self.old} -> {self.new}"
        if self.kind == "exec":
            return f"~ exec {self.old} -> {self.new}"
        if self.member or self.kind == "member":
            if self.old is None:
                return f"+ {option_word(self.name)} member {self._leaf(self.new)}"
            return f"- {option_word(self.name)} member {self._leaf(self.old)}"
        if self.kind == "json":
            if self.old is None:
                return f"+ {_json_words(self.name, self.new)}"
            if self.new is None:
                return f"- {option_word(self.name)} (was {_json_leaf(self.old)})"
            return f"~ {option_word(self.name)} {_json_leaf(self.old)} -> {_json_leaf(self.new)}"
        if self.kind == "env":
            if self.old is None:
                return f"+ env {self.key}={self.new}"
            if self.new is None:
                return f"- env {self.key} (was {self.old})"
            return f"~ env {self.key}={self.old} -> {self.new}"
        if self.old is None:
            return f"+ {_flag_words(self.key, self.new)}"
        if self.new is None:
            return f"- {_flag_words(self.key, self.old)}"
        return f"~ {option_word(self.key)} {_value_text(self.old)} -> {_value_text(self.new)}"

    def short(self) -> str:
        """Compact label for tables: `--ep-size 8`, `NCCL_ALGO=Tree`, `-x` for removals."""
        return _redacted(self, self._in_role(self._short()))

    def _short(self) -> str:
        if self.kind == "env":
            return f"{self.key}={self.new}" if self.new is not None else f"unset {self.key}"
        if self.kind == "exec":
            return "exec"
        if self.kind == "build":
            return f"build {self.new}" if self.new is not None else "build as installed"
        if self.kind == "package":
            return f"{self.key}=={self.new}" if self.new is not None else f"no {self.key}"
        if self.member or self.kind == "member":
            if self.old is None:
                return shlex.join([f"{option_word(self.name)}", "with", self._leaf(self.new)])
            return shlex.join([f"{option_word(self.name)}", "without", self._leaf(self.old)])
        if self.new is None:
            return f"no {option_word(self.name)}"
        if self.kind == "json":
            return _json_words(self.name, self.new)
        return _flag_words(self.key, self.new)

    def _leaf(self, v: object) -> str:
        return _json_leaf(v) if self.kind == "json" else " ".join(render_value(v))  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, object]:
        def j(v: object) -> object:
            return list(v) if isinstance(v, tuple) else v

        out = {"kind": self.kind, "key": self.key, "old": j(self.old), "new": j(self.new)}
        if self.kind == "json":
            out |= {"path": list(self.path), "name": self.name}
        if self.member or self.kind == "member":
            out["member"] = True
        if self.role is not None:
            out["role"] = self.role
        return out

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Delta:
        """A recorded delta (for its labels: `whole` is not recorded)."""

        def t(v: object) -> object:
            return tuple(v) if isinstance(v, list) else v

        return cls(
            d["kind"],
            d["key"],
            t(d.get("old")),
            t(d.get("new")),  # type: ignore[arg-type]
            path=tuple(d.get("path") or ()),  # type: ignore[arg-type]
            member=bool(d.get("member")) and d["kind"] == "json",
            role=d.get("role"),  # type: ignore[arg-type]
        )


def _redacted(d: Delta, text: str) -> str:
    """Labels end up in logs, the store and reports: never with a secret value in them."""
    from orchestrator.config.secrets import Redactor, secrets_of

    values = {}
    for v in (d.old, d.new):
        if isinstance(v, str):
            values |= secrets_of({d.key: v}) if d.kind == "env" else secrets_of({}, [(d.key, v)])
    return Redactor(values).text(text) or text


def _value_text(v: FlagValue | str | None) -> str:
    if v is True:
        return "(switch)"
    return " ".join(render_value(v)) if v is not None else "(absent)"


def _json_leaf(text: object) -> str:
    return jsonvalue.leaf_label(str(text))


def _json_words(name: str, text: object) -> str:
    return shlex.join([option_word(name), _json_leaf(text)])


def _flag_words(key: str, value: FlagValue | str | None) -> str:
    words = [option_word(key), *(render_value(value) if value is not None else [])]
    return shlex.join(words)


def _exec_key(exp: Experiment, *, masked: bool) -> tuple[str, ...]:
    """The command as it decides what runs: a container command whose config names a
    build runs the build's image, whatever image word the command holds."""
    cc = container_split(exp.exec) if masked else None
    if cc is None:
        return exp.exec
    words = list(exp.exec)
    words[cc.image_index] = ""
    return tuple(words)


def diff(good: Experiment, bad: Experiment, *, split: bool = True) -> list[Delta]:
    """All differences between two resolved configs, in a stable order.

    A flag whose value is a JSON object in good, in bad or in both (absent on the other
    side counts as `{}`) gives one `json` delta per key path that differs, unless `split`
    is off or the value is a secret; the option keeps one delta otherwise. Two values that
    are the same JSON whatever their key order and spacing are no difference."""
    deltas: list[Delta] = []
    if good.build != bad.build:
        deltas.append(Delta("build", "build", good.build, bad.build))
    # both name a build: every variant runs one of them, so a difference of the image
    # word alone is no `exec` delta beside the `build` one
    masked = good.build is not None and bad.build is not None
    if _exec_key(good, masked=masked) != _exec_key(bad, masked=masked):
        deltas.append(Delta("exec", "exec", shlex.join(good.exec), shlex.join(bad.exec)))
    secret = set(good.secrets().values()) | set(bad.secrets().values()) if split else set()
    if good.roles or bad.roles:
        return deltas + _role_deltas(good, bad, split, secret)
    gf, bf = good.flag_map(), bad.flag_map()
    for key, new in bad.flags:
        old = gf.get(key)
        if old == new and type(old) is type(new):
            continue
        if jsonvalue.same_json(old, new):
            continue  # key order and spacing only
        deltas.extend(_flag_deltas(key, old, new, split and not {old, new} & secret))
    for key, old in good.flags:
        if key not in bf:
            deltas.extend(_flag_deltas(key, old, None, split and old not in secret))
    ge, be = good.env_map(), bad.env_map()
    for key, new in bad.env:
        if ge.get(key) != new:
            deltas.append(Delta("env", key, ge.get(key), new))
    for key, old in good.env:
        if key not in be:
            deltas.append(Delta("env", key, old, None))
    return deltas


def check_same_roles(good: Experiment, bad: Experiment) -> None:
    """Refuse a pair whose deployments differ in shape (role names, kinds, ranks, hosts,
    units, a role's own command): a variant takes one of the two and no delta moves it.
    The error names the first difference: the role and its key, and each side's value."""
    from orchestrator.config.deployment import deployment

    fields = ("kind", "rank", "host", "unit", "exec")

    def shape(exp: Experiment) -> dict[str, tuple[object, ...]]:
        return {r.name: tuple(getattr(r, f) for f in fields) for r in deployment(exp).roles}

    gs, bs = shape(good), shape(bad)
    if gs == bs:
        return
    where = (
        f"the good config '{good.name}' ({good.source}) and the bad config "
        f"'{bad.name}' ({bad.source})"
    )
    if set(gs) != set(bs):
        only_good = ", ".join(n for n in gs if n not in bs) or "none"
        only_bad = ", ".join(n for n in bs if n not in gs) or "none"
        what = f"{where} have other roles: only good has {only_good}, only bad has {only_bad}"
    else:
        name, field, old, new = next(
            (n, f, g, b) for n in gs for f, g, b in zip(fields, gs[n], bs[n], strict=True) if g != b
        )

        def word(v: object) -> str:
            if v is None:
                return "the campaign's host" if field == "host" else "not set"
            return " ".join(map(str, v)) if isinstance(v, tuple) else str(v)

        what = f"{where} differ in roles.{name}.{field}: good has {word(old)}, bad has {word(new)}"
    raise PlanError(
        f"{what}: every variant runs on one set of roles, so only their flags and "
        "environment can be bisected",
        hint="give both configs the same roles: (names, kind, rank, host, unit, exec) and "
        "move what differs into the roles' flags: or env:",
    )


def _role_deltas(good: Experiment, bad: Experiment, split: bool, secret: set[str]) -> list[Delta]:
    """The flag and env deltas of two deployments of the same roles: a change on every
    server role alike is one delta; any other change is a delta of each role it is on."""
    from dataclasses import replace

    from orchestrator.config.deployment import deployment, role_env, role_flags

    check_same_roles(good, bad)
    gd, bd = deployment(good), deployment(bad)
    shared = [r.name for r in bd.roles if r.serving]
    out: list[Delta] = []
    for what, read in (("flag", role_flags), ("env", role_env)):
        gv = {r.name: read(good, gd.role(r.name)) for r in bd.roles}
        bv = {r.name: read(bad, r) for r in bd.roles}
        keys: dict[str, None] = {}  # bad's shared keys, bad's roles', then good's removed
        for exp in (bad, good):
            for k, _ in exp.flags if what == "flag" else exp.env:
                keys[k] = None
            for r in exp.roles:
                for k, _ in r.flags if what == "flag" else r.env:
                    keys[k] = None
        for key in keys:
            changed = {
                n: (gv[n].get(key), bv[n].get(key))
                for n in gv
                if not _same(gv[n].get(key), bv[n].get(key))
            }
            if not changed:
                continue
            alike = {changed.get(n) for n in shared}
            if set(shared) <= set(changed) and len({repr(c) for c in alike}) == 1:
                old, new = changed[shared[0]]
                out.extend(_one(what, key, old, new, split, secret))
                changed = {n: c for n, c in changed.items() if n not in shared}
            for n, (old, new) in changed.items():
                out.extend(replace(d, role=n) for d in _one(what, key, old, new, split, secret))
    return out


def _same(old: object, new: object) -> bool:
    return (old == new and type(old) is type(new)) or jsonvalue.same_json(old, new)


def _one(
    what: str, key: str, old: object, new: object, split: bool, secret: set[str]
) -> list[Delta]:
    if what == "env":
        return [Delta("env", key, old, new)]  # type: ignore[arg-type]
    return _flag_deltas(key, old, new, split and not {old, new} & secret)  # type: ignore[arg-type]


def _flag_deltas(
    key: str, old: FlagValue | None, new: FlagValue | None, split: bool
) -> list[Delta]:
    if split:
        g, b = jsonvalue.parse_object(old), jsonvalue.parse_object(new)
        if (g is not None or old is None) and (b is not None or new is None):
            leaves = jsonvalue.leaf_changes(g or {}, b or {}, jsonvalue.set_paths(key))
            if leaves:  # (an empty object added or removed is the option's own change)
                return [
                    Delta("json", key, o, n, path=p, whole=(old, new), member=m)
                    for p, o, n, m in leaves
                ]
        if key in jsonvalue.SET_FLAGS and old is not None and new is not None:
            # a set of values given on both sides (absent is the server's default set)
            changes = jsonvalue.member_changes(_members(old), _members(new))
            if changes:
                return [
                    Delta("member", key, o, n, whole=(old, new))
                    for o, n in ((_scalar(o), _scalar(n)) for o, n in changes)
                ]
    return [Delta("flag", key, old, new)]


def _members(v: FlagValue) -> list[object]:
    return list(v) if isinstance(v, tuple) else [v]


def _scalar(text: str | None) -> FlagValue | None:
    import json

    return None if text is None else json.loads(text)


def _set_value(old: FlagValue | None, new: FlagValue | None, ds: list[Delta]) -> FlagValue | None:
    """A multi-value flag documented as a set, with the chosen members added or removed."""
    import json

    members = jsonvalue.rebuild_set(
        _members(old) if old is not None else [],
        _members(new) if new is not None else [],
        [
            (
                None if d.old is None else json.dumps(d.old),
                None if d.new is None else json.dumps(d.new),
            )
            for d in ds
        ],
    )
    for side in (new, old):
        if side is not None and _members(side) == members:
            return side
    return tuple(members) if members else None  # type: ignore[arg-type]


def apply_deltas(
    good: Experiment, deltas: Iterable[Delta], *, name: str | None = None
) -> Experiment:
    """The good config with the given deltas applied (each set to its bad value); the
    `json` deltas of one flag rebuild its value from good's (jsonvalue.rebuild). A delta of
    a role changes that role only; a shared one every server role alike."""
    deltas = list(deltas)
    own: dict[str, list[Delta]] = {}
    for d in deltas:
        if d.role is not None:
            own.setdefault(d.role, []).append(d)
    out = _apply_shared(good, [d for d in deltas if d.role is None], name=name)
    if out.roles:
        from orchestrator.config.deployment import with_role_changes, without_overrides

        shared = [d for d in deltas if d.role is None]
        out = without_overrides(
            out,
            {d.key for d in shared if d.kind in ("flag", "json", "member")},
            {d.key for d in shared if d.kind == "env"},
        )
        for role, ds in own.items():
            flags, env = _changes(ds)
            out = with_role_changes(out, role, flags, env)
    return out


def _changes(
    deltas: list[Delta],
) -> tuple[dict[str, FlagValue | None], dict[str, str | None]]:
    """The flag and env values a role's own deltas set (None: removed on the role)."""
    flags: dict[str, FlagValue | None] = {}
    env: dict[str, str | None] = {}
    inside: dict[str, list[Delta]] = {}
    members: dict[str, list[Delta]] = {}
    for d in deltas:
        if d.kind == "flag":
            flags[d.key] = d.new  # type: ignore[assignment]
        elif d.kind == "json":
            inside.setdefault(d.key, []).append(d)
        elif d.kind == "member":
            members.setdefault(d.key, []).append(d)
        elif d.kind == "env":
            env[d.key] = d.new  # type: ignore[assignment]
    for key, ds in inside.items():
        old, new = ds[0].whole
        flags[key] = jsonvalue.rebuild(
            old,
            new,
            [(d.path, d.old, d.new, d.member) for d in ds],  # type: ignore[misc]
        )
    for key, ds in members.items():
        flags[key] = _set_value(*ds[0].whole, ds)
    return flags, env


def _apply_shared(good: Experiment, deltas: list[Delta], *, name: str | None) -> Experiment:
    flags: dict[str, FlagValue | None] = {}
    env: dict[str, str | None] = {}
    exe = None
    build: tuple[str | None] | None = None
    packages: dict[str, str] = {}
    source: str | None = None
    inside: dict[str, list[Delta]] = {}
    members: dict[str, list[Delta]] = {}
    for d in deltas:
        if d.kind == "flag":
            flags[d.key] = d.new  # type: ignore[assignment]
        elif d.kind == "json":
            inside.setdefault(d.key, []).append(d)
        elif d.kind == "member":
            members.setdefault(d.key, []).append(d)
        elif d.kind == "env":
            env[d.key] = d.new  # type: ignore[assignment]
        elif d.kind == "build":
            build = (d.new,)  # type: ignore[assignment]
        elif d.kind == "package":
            if d.new is not None:
                packages[d.key] = str(d.new)
                source = d.path[0] if d.path else None
        else:
            exe = d.new
    for key, ds in inside.items():
        old, new = ds[0].whole
        flags[key] = jsonvalue.rebuild(
            old,
            new,
            [
                (d.path, d.old, d.new, d.member)  # type: ignore[arg-type]
                for d in ds
            ],
        )
    for key, ds in members.items():
        flags[key] = _set_value(*ds[0].whole, ds)
    out = good.with_changes(flags=flags, env=env, name=name)
    if build is not None:
        from dataclasses import replace

        out = replace(out, build=build[0])
    if packages:
        from dataclasses import replace

        out = replace(out, packages=tuple(sorted(packages.items())), packages_from=source)
    if exe is not None:
        from dataclasses import replace

        out = replace(out, exec=tuple(shlex.split(str(exe))))
    return out


def coupling_closure(deltas: list[Delta], good: Experiment, bad: Experiment):  # noqa: ANN201
    """A function closing a variant under the configs' `requires:` rules.

    `requires: {ep-size: [tp-size]}` means a variant where `--ep-size` is present must also
    have `--tp-size`; if the good config lacks it, the delta adding it is pulled in.
    A variant where a required flag would be removed pulls the removal back out.
    """
    rules: dict[str, set[str]] = {}
    for exp in (good, bad):
        for key, needs in exp.requires:
            rules.setdefault(key, set()).update(needs)
    if not rules:
        return None
    index = {d.key: i for i, d in enumerate(deltas) if d.kind == "flag"}
    good_flags = good.flag_map()

    def close(variant: frozenset[int]) -> frozenset[int]:
        current = set(variant)
        for _ in range(len(deltas) + 1):  # bounded fixpoint
            changed = False
            present = {k for k in good_flags}
            for i in current:
                d = deltas[i]
                if d.kind == "flag":
                    if d.new is None:
                        present.discard(d.key)
                    else:
                        present.add(d.key)
                elif d.kind == "json" and d.new is not None:
                    present.add(d.key)
            for key, needs in rules.items():
                if key not in present:
                    continue
                for need in needs:
                    if need in present:
                        continue
                    j = index.get(need)
                    if j is None:
                        continue
                    if deltas[j].new is not None and j not in current:
                        current.add(j)
                        changed = True
                    elif deltas[j].new is None and j in current:
                        current.discard(j)
                        changed = True
            if not changed:
                break
        return frozenset(current)

    return close


def _unit_words(exp: Experiment) -> str:
    return exp.unit if exp.unit else f"no service.unit (a service named after '{exp.name}')"


def check_same_unit(good: Experiment, bad: Experiment) -> None:
    """Refuse a pair whose configs name different units: every variant runs as a drop-in
    on one unit, so bad's unit would be ignored without a word. A unit is not a delta:
    what differs between two unit files (User=, limits, EnvironmentFile=, ...) is not
    known to the planner, and no variant could take half of it."""
    if good.unit == bad.unit:
        return
    raise PlanError(
        f"the good config '{good.name}' runs on {_unit_words(good)} and the bad config "
        f"'{bad.name}' on {_unit_words(bad)}: every variant runs as a drop-in on one unit, "
        "so a different unit cannot be bisected (the bad config would run on the good "
        "one's unit)",
        hint="give both configs the same service.unit, and move what differs between the "
        "two units (their Environment= or ExecStart= flags) into env: or flags:, where it "
        "becomes deltas; or compare the two units with `orchestrator run` on each config",
    )


def check_differ(deltas: list[Delta], good: Experiment, bad: Experiment) -> None:
    check_same_unit(good, bad)
    if not deltas:
        raise PlanError(
            f"'{good.name}' and '{bad.name}' launch the same server: there is nothing to bisect",
            hint="check the two files; differences in health or probe settings are not deltas",
        )
