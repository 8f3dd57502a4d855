"""Planning a campaign from two config files: deltas, closure, first round, run estimates.

Shared by `orchestrator plan` and the campaign runner; pure apart from reading the two
YAML files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.campaign import answers_check
from orchestrator.config.builds import build_version_key
from orchestrator.config.experiment import Experiment
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.errors import UsageError
from orchestrator.planner import (
    Delta,
    Planner,
    apply_deltas,
    coupling_closure,
    diff,
    estimate_runs,
    make_strategy,
)
from orchestrator.planner.core import StrategyFn
from orchestrator.planner.deltas import check_differ
from orchestrator.planner.ordered import Ordered


@dataclass(frozen=True)
class Plan:
    good: Experiment
    bad: Experiment
    deltas: tuple[Delta, ...]
    strategy: str
    #: a JSON-valued flag's changed key paths are deltas of their own (off: `--no-split`)
    split: bool = True
    #: the builds from good's to bad's in order (`--builds`); then the last len(order) - 1
    #: deltas are the hidden steps of the ordered search (planner.ordered), not searched
    #: as deltas of their own
    order: tuple[str, ...] = ()
    #: what the user should know about how the plan was made (builds reordered)
    notes: tuple[str, ...] = ()

    @property
    def n(self) -> int:
        """The deltas the search sees (the ordered search's hidden steps excluded)."""
        return len(self.deltas) - self.hidden

    @property
    def hidden(self) -> int:
        return len(self.order) - 1 if self.order else 0

    def closure(self):  # noqa: ANN201
        return coupling_closure(list(self.deltas), self.good, self.bad)

    def wrap(self, strategy: StrategyFn) -> StrategyFn:
        """The strategy, with the build bisected on its order when `--builds` gave one."""
        if not self.order:
            return strategy
        axis = next(i for i, d in enumerate(self.deltas[: self.n]) if d.kind == "build")
        return Ordered(
            strategy, axis=axis, steps=range(self.n, len(self.deltas)), builds=self.order
        )

    def carries(self, culprit: frozenset[int], variant: Iterable[int]) -> bool:
        """Whether a variant holds a culprit set: its other deltas, and (on an ordered
        axis) a build at or after the set's first bad build."""
        v = frozenset(variant)
        steps = {i for i in culprit if self.order and self.deltas[i].kind == "build"}
        if not (culprit - steps) <= v:
            return False
        if not steps:
            return True
        need = self.order.index(str(self.deltas[min(steps)].new))
        have = self.variant(v).build
        return have in self.order and self.order.index(have) >= need

    def builds_of(self, indices: frozenset[int]) -> str | None:
        """The build a variant runs (None: the command as installed)."""
        return self.variant(indices).build

    def planner(self) -> Planner:
        return Planner(
            self.n,
            self.wrap(make_strategy(self.strategy)),
            known={frozenset(): Verdict.PASS, frozenset(range(self.n)): Verdict.FAIL},
            closure=self.closure(),
        )

    @property
    def env_keys(self) -> frozenset[str]:
        """Every environment variable either config sets or removes: a variant that does
        not set one removes it (the unit's or the host's value never stands in for it)."""
        return frozenset(
            (*self.good.env_map(), *self.good.unset, *self.bad.env_map(), *self.bad.unset)
        )

    def variant(self, indices: frozenset[int]) -> Experiment:
        """The launch of a variant, as it runs and is recorded (its removals included)."""
        if indices == frozenset(range(self.n)):
            exp = self.bad
        elif not indices:
            exp = self.good
        else:
            chosen = [self.deltas[i] for i in sorted(indices)]
            exp = apply_deltas(self.good, chosen, name=f"{self.good.name}+{len(chosen)}")
        return exp.unsetting(self.env_keys)

    def describe(self, indices: frozenset[int]) -> str:
        """`good + --ep-size 8, --enable-nccl-nvls` or `bad - --ep-size 8`, whichever is shorter."""
        if not indices:
            return "good"
        if indices == frozenset(range(self.n)):
            return "bad"
        missing = frozenset(range(self.n)) - indices
        if len(missing) < len(indices) and max(indices) < self.n:
            return "bad - " + ", ".join(self.deltas[i].short() for i in sorted(missing))
        return "good + " + ", ".join(self.deltas[i].short() for i in sorted(indices))

    def estimates(self) -> dict[str, float]:
        """Runs after the endpoints, for a single culprit and an interacting pair that fail
        on every start (`*_mean`, `*_worst`), and what `auto` alone costs (`auto_*`: the
        base of the flaky estimates, planner.noise_estimate)."""
        if self.order:  # the inner search plus a bisection of the builds
            import math

            extra = math.ceil(math.log2(max(len(self.order) - 1, 1))) + 1
            base = Plan(
                self.good, self.bad, self.deltas[: self.n], self.strategy, self.split
            ).estimates()
            return {
                k: v + (extra if k.endswith(("_mean", "_worst")) else 0) for k, v in base.items()
            }
        if self.strategy in ("auto", "noisy"):  # searches that weigh every run: simulated
            from orchestrator.planner.adaptive import estimate_search

            return dict(estimate_search(self.strategy, self.n))  # cached: a copy
        strategy = make_strategy(self.strategy)
        est = dict(estimate_runs(strategy, self.n))
        return est | {
            f"auto_{k}": v for k, v in estimate_runs(make_strategy("auto"), self.n).items()
        }


def make_plan(
    good_path: str | Path, bad_path: str | Path, strategy: str = "auto", *, split: bool = True
) -> Plan:
    make_strategy(strategy)  # validate the name early
    good = load_experiment(good_path)
    bad = load_experiment(bad_path)
    deltas = diff(good, bad, split=split)
    check_differ(deltas, good, bad)
    answers_check.check_same(good, bad)  # one rule judges every run, said before a start
    return Plan(good=good, bad=bad, deltas=tuple(deltas), strategy=strategy, split=split)


def with_packages(plan: Plan, good: dict[str, str], bad: dict[str, str]) -> Plan:
    """The plan with its build delta opened into the distributions that differ between
    good's build and bad's (`bisect --packages`): each added or changed one is a delta,
    taken from bad's build over good's. A distribution only good's build has stays (a
    variant cannot take it away)."""
    if plan.order:
        raise UsageError(
            "--packages and --builds cannot be given together",
            hint="search the builds first, then the packages of the two builds that differ",
        )
    index = next((i for i, d in enumerate(plan.deltas) if d.kind == "build"), None)
    if index is None:
        raise UsageError(
            "--packages opens the build delta into packages, but the two configs run the same build"
        )
    src = str(plan.bad.build)
    changed = [
        Delta("package", name, good.get(name), ver, path=(src,))
        for name, ver in sorted(bad.items(), key=lambda kv: kv[0].lower())
        if good.get(name) != ver
    ]
    if not changed:
        raise UsageError(
            f"builds {plan.good.build} and {plan.bad.build} hold the same "
            "distributions: no package differs"
        )
    deltas = [*plan.deltas[:index], *changed, *plan.deltas[index + 1 :]]
    # good's build throughout: a variant is good's build with some of bad's packages
    bad = replace(
        apply_deltas(plan.good, deltas, name=plan.bad.name),
        health=plan.bad.health,
        probe=plan.bad.probe,
    )
    return replace(plan, deltas=tuple(deltas), bad=bad)


def read_builds(text: str) -> tuple[str, ...]:
    """`--builds a,b,c`, or `--builds FILE` (one build a line; `#` starts a comment)."""
    path = Path(text)
    if "," not in text and path.is_file():
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--builds {text}: cannot read the file: {exc}") from None
        names = [ln.split("#", 1)[0].strip() for ln in lines]
    else:
        names = [w.strip() for w in text.split(",")]
    names = [n for n in names if n]
    if not names:
        raise UsageError(
            f"--builds {text!r}: no build named",
            hint="e.g. --builds 0.5.22,0.5.23rc1,0.5.23, or a file with one a line",
        )
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"--builds: {', '.join(dup)} given twice")
    return tuple(names)


def with_order(plan: Plan, builds: Sequence[str], *, as_searched: bool = False) -> Plan:
    """The plan with its build delta searched on an order: good's build, the builds given
    between, bad's build (good's and bad's are added at the ends when not listed).
    `as_searched`: the order a campaign recorded, taken as it is (its runs name builds by
    their step in it; rules that would order the list otherwise apply to new campaigns)."""
    if not builds:
        return plan
    g, b = plan.good.build, plan.bad.build
    if g is None or b is None or g == b:
        unset = plan.good.source or "good" if g is None else plan.bad.source or "bad"
        raise UsageError(
            "--builds orders the builds between good's and bad's, but "
            + (
                "the two configs run the same build"
                if g == b
                else f"'service.build' is not set in {unset}"
            ),
            hint="set service.build in both configs (a path, an image or a name "
            "the host's builds: maps)",
        )
    names = list(builds)
    if g not in names:
        names.insert(0, g)
    if b not in names:
        names.append(b)
    names, notes = (names, []) if as_searched else _by_version(names, g, b)
    i, j = names.index(g), names.index(b)
    if i > j:
        raise UsageError(
            f"--builds: good's build {g} comes after bad's build {b} in the order",
            hint="list the builds from the one that works to the one that fails",
        )
    order = tuple(names[i : j + 1])
    deltas = [replace(d, order=order) if d.kind == "build" else d for d in plan.deltas]
    steps = [
        Delta("build", "build", order[m - 1], order[m], order=order) for m in range(1, len(order))
    ]
    outside = [n for n in names if n not in order]
    if outside:
        notes.append(
            f"--builds: {', '.join(outside)} not between good's build {g} and bad's {b}: "
            "not searched"
        )
    return replace(plan, deltas=tuple(deltas + steps), order=order, notes=tuple(notes))


def _by_version(names: list[str], good: str, bad: str) -> tuple[list[str], list[str]]:
    """The builds in the order their versions give (PEP 440), from good's toward bad's,
    and a note when that is not the order given (`ls | sort` puts 0.5.23 before
    0.5.23rc1). Unchanged when a name states no version or good's and bad's are the same
    version: the order given is then the only one there is."""
    keys = [build_version_key(n) for n in names]
    if any(k is None for k in keys):
        _check_versions_run_one_way(names, keys)
        return names, []
    kg, kb = build_version_key(good), build_version_key(bad)
    if kg == kb:
        return names, []
    key_of = dict(zip(names, keys, strict=True))
    ordered = sorted(names, key=lambda n: key_of[n], reverse=kg > kb)  # stable: ties kept
    if ordered == names:
        return names, []
    return ordered, [
        f"--builds: reordered by version (PEP 440) from good's build to bad's: "
        f"{', '.join(ordered)} (given: {', '.join(names)})"
    ]


def _check_versions_run_one_way(names: list[str], keys: list[tuple | None]) -> None:
    """Where some names state no version (`nightly`), the order given is the only one, but
    the versions the others state must still run one way: `0.5.23rc1` given before
    `0.5.21` is a misordered list, whichever way the search goes."""
    stated = [(n, k) for n, k in zip(names, keys, strict=True) if k is not None]
    steps = [(a, b) for a, b in zip(stated, stated[1:], strict=False) if a[1] != b[1]]
    if not steps:
        return
    up = steps[0][0][1] < steps[0][1][1]  # type: ignore[operator]
    for (na, ka), (nb, kb) in steps:
        if (ka < kb) != up:  # type: ignore[operator]
            plain = ", ".join(n for n, k in zip(names, keys, strict=True) if k is None)
            raise UsageError(
                f"--builds: {na} comes before {nb} but states a "
                f"{'later' if up else 'earlier'} version than the order's "
                f"{'rising' if up else 'falling'} versions allow ({', '.join(names)}); "
                f"{plain} state no version, so the order given is the one searched",
                hint="list the builds in the order their versions give, from good's build "
                "to bad's, with the unversioned ones where they belong",
            )
