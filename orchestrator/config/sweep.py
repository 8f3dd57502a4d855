"""A sweep file: a list of experiment configs and/or a matrix of flag values over a base
config, read and checked into a frozen `Sweep` (the campaign that runs it is
`orchestrator.campaign.sweep`).

    name: nightly-rtx6000
    base: experiments/lab/rtx6000/perf_good.yaml   # relative to the sweep file
    matrix:                                         # cartesian product over the base
      cuda-graph-max-bs: [128, 256, 512]
      mem-fraction-static: [0.85, 0.92]
    env_matrix: {NCCL_ALGO: [Ring, Tree]}           # optional
    configs: [other.yaml]                           # optional extra configs
    reference: tp8.yaml                             # optional: what "good" is (default: base)
    repeat: 1
    host: lab                                       # default host or pool

A probe bar relative to the good config (`pass_if: ">= 0.95 * good"`) is judged against
the reference config's metric: the reference is added to the items when it is not one of
the swept configs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.config.experiment import Experiment, flag_key
from orchestrator.config.loading import load_experiment
from orchestrator.config.shortopts import canonical
from orchestrator.config.yamlio import load_model, not_a_file
from orchestrator.errors import ConfigError

Value = bool | int | float | str | None


class SweepModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    base: str | None = None
    matrix: dict[str, list[Value]] = Field(default_factory=dict)
    env_matrix: dict[str, list[str | None]] = Field(default_factory=dict)
    configs: list[str] = Field(default_factory=list)
    repeat: int = Field(default=1, ge=1, le=100)
    host: str | None = None
    reference: str | None = None  # the config whose probe metric is "good" (default: base)
    notify: str | None = None  # URL to POST a message to when the sweep ends


def fmt_value(value: Value) -> str:
    """A swept value as a label shows it: a flag set to null/false is not on the command
    line at all, so it reads `(absent)`, never `None`."""
    return "(absent)" if value is None or value is False else str(value)


@dataclass(frozen=True)
class SweepItem:
    index: int
    label: str  # the config's delta against the base, e.g. "cuda-graph-max-bs=512"
    exp: Experiment
    values: tuple[tuple[str, Value], ...] = ()  # the swept values, for plots


def answers_judged(exp: Experiment) -> bool:
    """The config's answers are judged against the reference's (`answers:`)."""
    return exp.answers is not None and exp.answers.enabled


def relative_bar(exp: Experiment) -> bool:
    """The config's probe bar is relative to the good config's metric."""
    cond = exp.probe.condition if exp.probe else None
    return cond is not None and cond.relative_to_good


@dataclass(frozen=True)
class Sweep:
    """A loaded sweep file: its configs (matrix combinations, then `configs:`) and settings."""

    name: str
    source: str  # the sweep file
    items: tuple[SweepItem, ...]
    repeat: int
    host: str | None  # the default host or pool
    base: Experiment | None
    reference: int | None = None  # the item whose metric a relative bar compares with
    notify: str | None = None

    @property
    def axes(self) -> list[str]:
        names: list[str] = []
        for it in self.items:
            for k, _ in it.values:
                if k not in names:
                    names.append(k)
        return names

    def needs_reference(self, it: SweepItem) -> bool:
        return (
            self.reference is not None
            and it.index != self.reference
            and (relative_bar(it.exp) or answers_judged(it.exp))
        )


def _config_at(path: Path, ref: str, key: str) -> Experiment:
    """The experiment a sweep names under `key`, relative to the sweep file; a name that is
    no file is refused naming the sweep and the key (errors inside that file name it)."""
    target = path.parent / ref
    why = not_a_file(target)
    if why is not None:
        raise ConfigError(
            f"config {ref!r} {why} ({target})",
            file=str(path),
            key=key,
            hint="name an experiment YAML, relative to the sweep file",
        )
    return load_experiment(target)


def _reference(
    m: SweepModel, path: Path, base: Experiment | None, items: list[SweepItem]
) -> Experiment | None:
    """The config a relative bar is judged against: `reference:`, else the base."""
    ref: Experiment | None = None
    if m.reference:
        ref = _config_at(path, m.reference, "reference")
    relative = [it for it in items if relative_bar(it.exp) or answers_judged(it.exp)]
    if relative and ref is None:
        ref = base
        if ref is None:
            bar = relative[0].exp.probe.pass_if if relative[0].exp.probe else ""
            what = (
                f"a probe bar relative to a good config ({bar!r})"
                if relative_bar(relative[0].exp)
                else "answers judged against a good config's (answers:)"
            )
            raise ConfigError(
                f"'{relative[0].label}' has {what} "
                "but the sweep names no config to measure as good",
                file=str(path),
                key="reference",
                hint="add `reference: GOOD.yaml` (or a `base:`) to the sweep",
            )
    bars = [it for it in relative if relative_bar(it.exp)]
    if ref is not None and bars and (ref.probe is None or not ref.probe.metric):
        raise ConfigError(
            f"the reference config {ref.source or ref.name} has no probe metric "
            "to judge the relative bars with",
            file=str(path),
            key="reference",
        )
    return ref


def load_sweep(path: str | Path) -> Sweep:
    path = Path(path)
    m = load_model(path, SweepModel, what="sweep")
    items: list[SweepItem] = []
    base = _config_at(path, m.base, "base") if m.base else None
    if (m.matrix or m.env_matrix) and base is None:
        raise ConfigError("a matrix needs a base config to vary", file=str(path), key="base")
    # a matrix key names a flag as a config's key does (`-tp` is vLLM's long option)
    axes = [
        (canonical(base.exec if base else (), flag_key(k)), "flag", vs)
        for k, vs in m.matrix.items()
    ]
    axes += [(k, "env", vs) for k, vs in m.env_matrix.items()]
    if base is not None:
        for key, _, vs in axes:
            if not vs:
                raise ConfigError("needs at least one value", file=str(path), key=f"matrix.{key}")
        combos = itertools.product(*[vs for _, _, vs in axes]) if axes else [()]
        for combo in combos:
            flags = {k: v for (k, kind, _), v in zip(axes, combo, strict=True) if kind == "flag"}
            env = {k: v for (k, kind, _), v in zip(axes, combo, strict=True) if kind == "env"}
            values = tuple((k, v) for (k, _, _), v in zip(axes, combo, strict=True))
            label = " ".join(f"{k}={fmt_value(v)}" for k, v in values) or "base"
            exp = base.with_changes(flags=flags, env=env, name=f"{base.name}[{label}]")
            items.append(SweepItem(len(items), label, exp, values))
    for i, ref in enumerate(m.configs):
        exp = _config_at(path, ref, f"configs[{i}]")
        items.append(SweepItem(len(items), exp.name or f"config {i}", exp))
    if not items:
        raise ConfigError("nothing to sweep: give configs, or a base with a matrix", file=str(path))
    ref_exp = _reference(m, path, base, items)
    named = [(it.label, it.exp) for it in items]
    named += [(f"reference {ref_exp.name}", ref_exp)] if ref_exp is not None else []
    others = [
        f"'{label}': {exp.unit or 'no service.unit'}"
        for label, exp in named
        if exp.unit != named[0][1].unit
    ]
    if others:
        # the sweep runs every item as a drop-in on the first item's unit
        raise ConfigError(
            f"the sweep's configs name different units ('{named[0][0]}': "
            f"{named[0][1].unit or 'no service.unit'}; {', '.join(others)}): every run is a "
            "drop-in on one unit, so the others would be ignored",
            file=str(path),
            hint="give every config the same service.unit; what differs between the units "
            "goes into env: or flags:",
        )
    # A variable some config sets is removed from the others' launches (not left to the
    # unit's or the host's value), and each item is recorded as that launch.
    keys = {k for _, exp in named for k in (*exp.env_map(), *exp.unset)}
    items = [replace(it, exp=it.exp.unsetting(keys)) for it in items]
    ref_exp = ref_exp.unsetting(keys) if ref_exp is not None else None
    seen: dict[str, str] = {}
    for it in items:
        fp = it.exp.fingerprint()
        if fp in seen:
            raise ConfigError(
                f"'{it.label}' launches the same server as '{seen[fp]}'", file=str(path)
            )
        seen[fp] = it.label
    ref_index: int | None = None
    if ref_exp is not None:
        fp = ref_exp.fingerprint()
        match = next((it for it in items if it.exp.fingerprint() == fp), None)
        if match is not None:
            ref_index = match.index
        else:
            # measured like any row (first in each repeat), at its place on the plot
            flags, env = ref_exp.flag_map(), ref_exp.env_map()
            values = tuple((k, (flags if kind == "flag" else env).get(k)) for k, kind, _ in axes)
            ref_item = SweepItem(0, f"reference {ref_exp.name}", ref_exp, values)
            items = [ref_item, *(replace(it, index=it.index + 1) for it in items)]
            ref_index = 0
    return Sweep(
        m.name or path.stem,
        str(path),
        tuple(items),
        m.repeat,
        m.host,
        base,
        ref_index,
        notify=m.notify,
    )


__all__ = ["Sweep", "SweepItem", "SweepModel", "Value", "fmt_value", "load_sweep", "relative_bar"]
