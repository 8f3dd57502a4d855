"""An ordered axis searched jointly with the flags: the builds from good's to bad's.

Given builds b0 (good's) .. bk (bad's) in order, the campaign's deltas hold one `build`
delta b0 -> bk plus one hidden step delta per build (b(m-1) -> bm, setting the build to
bm). The search, with every verdict taken as a failure needs all of its deltas:

1. bisect the builds with bad's flags (as git bisect does on commits), good's build among
   them: the first build hi that fails with them, and the last one lo that does not;
2. when good's build fails with them too, the build does not matter: the flags are
   searched on good's build (the answer is a flag set);
3. else build hi without any flag: failing, the answer is the build alone (first bad hi,
   last good lo);
4. else the flags are searched on build hi (the inner strategy, over the flags only): each
   culprit set found is named together with build hi, an interaction; lo with bad's flags
   did not fail, which clears the build for every set of them.

Cost: log2(k + 1) runs for the builds (rounded up), one check, and the flag search's own
runs. A build that cannot be judged (`invalid`, exhausted `infra`) is skipped like `git
bisect skip`; the answer then says which builds stayed open. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from orchestrator.planner.core import Answer, Culprit, Round, Search, StrategyFn, Variant
from orchestrator.planner.strategies import CLEARING
from orchestrator.verdicts import Verdict

PURPOSE = "build"


class Ordered:
    """Wraps a strategy for the flags: the builds bisected first, then the flags.

    `axis` is the index of the build delta (b0 -> bk); `steps[m - 1]` the index of the
    hidden delta that sets the build to bm (m = 1..k); the search sees deltas 0..n-1."""

    def __init__(
        self, inner: StrategyFn, *, axis: int, steps: Sequence[int], builds: Sequence[str] = ()
    ) -> None:
        self.inner = inner
        self.axis = axis
        self.steps = tuple(steps)
        self.builds = tuple(builds)

    def __call__(self, n: int) -> Search:
        return self._search(n)

    def _at(self, m: int, flags: Iterable[int]) -> Variant:
        """Build bm with the given flag deltas."""
        k = len(self.steps)
        build = () if m == 0 else (self.axis,) if m == k else (self.steps[m - 1],)
        return frozenset((*flags, *build))

    def _search(self, n: int) -> Search:
        k = len(self.steps)
        flags = tuple(i for i in range(n) if i != self.axis)
        seen: dict[Variant, Verdict] = {
            frozenset(): Verdict.PASS,
            frozenset(range(n)): Verdict.FAIL,
        }
        # 1. the builds, with bad's flags; good's build is one of the candidates (all
        #    failing = the build does not matter), so k + 1 outcomes cost log2(k + 1) runs
        lo, hi = -1, k
        skipped: set[int] = set()
        while True:
            inside = [m for m in range(lo + 1, hi) if m not in skipped]
            if not inside:
                break
            m = inside[len(inside) // 2]
            x = yield from self._test(self._at(m, flags), seen)
            if x is Verdict.FAIL:
                hi = m
            elif x in CLEARING:
                lo = m
            else:
                skipped.add(m)
        if hi == 0:  # 2. good's build fails with bad's flags: a flag set, on good's build
            answer = yield from self._flags(flags, 0, seen)
            return answer
        reason = ""
        if lo != hi - 1:
            open_ = ", ".join(self._name(m) for m in range(max(lo, 0) + 1, hi + 1))
            reason = (
                f"builds between {self._name(max(lo, 0))} and {self._name(hi)} could not "
                f"be run with bad's flags: the first bad build is one of {open_}"
                + (f" (or none: {self._name(0)} too)" if lo < 0 else "")
            )
        lo = max(lo, 0)
        step = self.steps[hi - 1]
        # 3. the build alone
        alone = self._at(hi, ())
        x = yield from self._test(alone, seen)
        cleared_build = (step, self._at(lo, flags))
        if x is Verdict.FAIL:
            c = Culprit(frozenset({step}), alone, (cleared_build,), confirmed=not reason)
            return Answer((c,), complete=not reason, reason=reason)
        # 4. the flags on build hi
        inner = yield from self._flags(flags, hi, seen)
        culprits = tuple(
            Culprit(
                c.deltas | {step},
                c.reproduced_by | {self._step_of(hi)},
                tuple(sorted((*c.cleared_by, cleared_build))),
                confirmed=c.confirmed and not reason,
            )
            for c in inner.culprits
        )
        reasons = "; ".join(filter(None, [inner.reason, reason]))
        return replace(
            inner, culprits=culprits, complete=inner.complete and not reason, reason=reasons
        )

    def _step_of(self, m: int) -> int:
        return self.axis if m == len(self.steps) else self.steps[m - 1]

    def _flags(self, flags: tuple[int, ...], m: int, seen: dict[Variant, Verdict]) -> Search:
        """The inner strategy over the flags alone, every variant on build bm; its answer
        in the campaign's delta numbers (the build is added by the caller)."""

        def out(v: Iterable[int]) -> Variant:
            return self._at(m, (flags[j] for j in v))

        gen = self.inner(len(flags))
        got: dict[Variant, Verdict] | None = None
        while True:
            try:
                rnd = gen.send(got) if got is not None else next(gen)
            except StopIteration as stop:
                answer: Answer = stop.value
                break
            outer = {v: out(v) for v in rnd.variants}
            back = yield replace(rnd, variants=tuple(outer[v] for v in rnd.variants), best=None)
            got = {v: back[o] for v, o in outer.items() if o in back}
            seen.update(back)
        build = {self._step_of(m)} if m else set()
        culprits = tuple(
            Culprit(
                frozenset(flags[j] for j in c.deltas),
                out(c.reproduced_by) - build,
                tuple((flags[j], out(v)) for j, v in c.cleared_by),
                c.confirmed,
            )
            for c in answer.culprits
        )
        return replace(answer, culprits=culprits)

    def _test(self, v: Variant, seen: dict[Variant, Verdict]) -> Search:
        if v not in seen:
            got = yield Round((v,), purpose=PURPOSE)
            seen[v] = got[v]
        return seen[v]  # type: ignore[return-value]

    def _name(self, m: int) -> str:
        return self.builds[m] if m < len(self.builds) else f"build {m}"
