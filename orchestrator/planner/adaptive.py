"""`auto` while the runs look deterministic; the noise-aware search once they do not.

The search starts as `auto` (log-cost, as cheap as ever when nothing is flaky) and watches
every verdict. It switches to the noise-aware search (`noisy`) with all runs so far as
evidence as soon as the runs show that the failure does not reproduce every time:

- one variant both failed and passed (the bad config passing on a start, say);
- a variant passed although a variant with a subset of its deltas failed (a failure needs
  all of its deltas, so a superset of a failing variant must fail too);
- `auto`'s complete answer disagrees with a recorded verdict or needs more than three
  changes at once: the marks a missed failure leaves. When two of its culprit sets share a
  change, that change runs alone (twice): a failure of it shows a flaky single culprit
  that unlucky passes dressed up as several sets.

Whether it switched is a pure function of the recorded runs, so a resumed campaign takes
the same path. When it does not switch, `auto`'s answer is weighed by the posterior of
the noise model with a prior weight on deterministic failures (`DETERMINISTIC`); below the
confidence asked, the posterior search goes on from the runs so far (none for one flag;
about two runs for a pair among 8 or more changes, more among fewer: `estimate_search`)
until the answer reaches it or the budget ends; while no run has looked flaky it runs
variants not run yet where one tells about as much as a repeat (`NoiseModel.repeats`).
When `auto`'s sets share a change and every run fits them, while the
posterior (one cause) prefers a single flaky change, the two models are weighed against
each other and that change runs alone until one of them reaches the confidence. Either
way the answer's confidence is that posterior: one model, whether or not the failure
turns out to be flaky (bench/runs_to_answer.py --noise: `default`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from orchestrator.planner import batch
from orchestrator.planner.batch import NoisyFromStart
from orchestrator.planner.core import Answer, Round, Search, StrategyFn, Variant
from orchestrator.planner.noisy import NoiseModel, Noisy
from orchestrator.planner.strategies import auto, estimate_runs
from orchestrator.verdicts import Verdict

Run = tuple[Variant, Verdict]
Describe = Callable[[Variant], str]

#: prior weight of "this failure reproduces on every start" when no run says otherwise.
#: Runs that never contradict themselves can still come from a flaky failure and a few
#: unlucky passes (they then point at a superset of the culprit set): a weight below even
#: keeps the confidence of such an interacting set honest (bench/runs_to_answer.py
#: --noise, calibration of `default` at p = 0.5: 0.5 named a flaky flag's pair wrongly in
#: 6% of answers at n = 16); a single flag reproduced by good + it is certain either way.
DETERMINISTIC = 0.3
#: the same weight when the chance is weighed that another cause hid behind a set no run
#: of which passed (`NoiseModel.miss_spike`)
MISS_DETERMINISTIC = 0.5
#: prior chance that any one change of bad without a member is a further cause of the same
#: failure: another cause hides among the 7 others of 8 changes with chance 0.1, among the
#: 31 others of 32 with 0.37 (`NoiseModel.other_per_change`: more changes, more places to
#: hide; a flaky flag that picked up a partner is checked harder where there are many)
OTHER_PER_CHANGE = 0.015
#: once the runs contradicted each other (a failure that does not reproduce every time),
#: the posterior search stops when the doubt left is this share of the doubt allowed (0.975
#: for --confidence 0.95): the model (one rate, runs independent, a uniform prior on the
#: rate) is an approximation, and a search that stops at the first crossing lands just
#: above it (bench/runs_to_answer.py --noise: default right 96 -> 97% at p = 0.5, n = 8)
FLAKY_DOUBT = 0.5
#: at most this many runs alone of a set the flaky search is sure of but that never failed
#: alone, before it is named without that evidence
CONFIRM_TRIES = 12
#: the largest interacting set taken at face value from runs that all agree: a larger one
#: is the mark a missed failure leaves (the noise-aware search then checks it)
MAX_SET = 3
#: runs of a change shared by two culprit sets, alone, before the sets are believed
SHARED_CHECKS = 2
#: sets of three changes the default's posterior weighs (every one up to n = 32): a search
#: that leaves them out names a flaky triple's pairs with a confidence it does not have
TRIPLES = 5000
#: starts of the bad config before a campaign concludes that it does not fail: with a
#: reproduction rate of 0.5 all pass once in 65,000 campaigns, with 0.3 once in 300
BAD_ATTEMPTS = 16
#: the confidence at which a set that passed alone and never failed alone runs alone again
#: (rather than searching until sure again first)
ALONE_SURE = 0.5
#: runs (plus 2 per change) that weigh causes sharing a change against one flaky cause
WEIGH_RUNS = 6
#: the prior weight of a deterministic failure for the posterior search from the first
#: run (`Adaptive.posterior`): heavier than `DETERMINISTIC`, which weighs `auto`'s answer
#: after the fact; a failure that reproduces every time is then searched for at about what
#: `auto` costs (bench/runs_to_answer.py --noise, policy `posterior`)
POSTERIOR_DETERMINISTIC = 0.4


def _describe(v: Variant) -> str:
    return "{" + ", ".join(str(i) for i in sorted(v)) + "}"


def flakiness(runs: Sequence[Run], describe: Describe = _describe) -> str:
    """Why the runs cannot come from a failure that reproduces every time ("" if they can)."""
    fails: dict[Variant, int] = {}
    passes: dict[Variant, int] = {}
    for v, x in runs:
        if x is Verdict.FAIL:
            fails[v] = fails.get(v, 0) + 1
        elif x is Verdict.PASS:
            passes[v] = passes.get(v, 0) + 1
    for v in fails:
        if v in passes:
            return (
                f"{describe(v)} failed {fails[v]} of {fails[v] + passes[v]} starts "
                "with the same config"
            )

    def order(u: Variant) -> tuple[int, list[int]]:
        return len(u), sorted(u)

    supersets = [v for v in passes if any(w < v for w in fails)]
    for w in sorted(fails, key=order) if supersets else ():
        for v in sorted(supersets, key=order):
            if w < v:
                return (
                    f"{describe(v)} passed although {describe(w)}, which has only some "
                    "of its changes, failed"
                )
    return ""


def answer_doubt(answer: Answer, runs: Sequence[Run], describe: Describe = _describe) -> str:
    """Why `auto`'s complete answer cannot be right if the failure reproduced every time
    ("" if nothing says so). An incomplete answer (unresolved variants hid the evidence)
    is left as it is: nothing in it points at flakiness."""
    terms = answer.culprit_sets
    if not terms or not answer.complete:
        return ""
    big = next((t for t in terms if len(t) > MAX_SET), None)
    if big is not None:
        # as many changes all needed at once is far less likely than a missed failure
        return f"{describe(big)} would need {len(big)} changes at once"
    for v, x in runs:
        if not x.resolved:
            continue
        if any(t <= v for t in terms) != (x is Verdict.FAIL):
            return f"{describe(v)} {x.value}ed, against the answer"
    return ""


@dataclass(frozen=True)
class Adaptive:
    """A strategy function (`takes_evidence`): auto, switching to noisy on flakiness."""

    model: NoiseModel = NoiseModel()
    describe: Describe = _describe
    #: runs the noise-aware search keeps in progress (the campaign's slots: planner.batch)
    slots: int = 1
    #: True: the posterior search from the first run (under the default's prior)
    posterior: bool = False
    takes_evidence = True

    def __call__(
        self,
        n: int,
        evidence: Sequence[Run] = (),
        closure: Callable[[Variant], Variant] | None = None,
    ) -> Search:
        return adaptive(
            n,
            evidence,
            model=self.model,
            closure=closure,
            describe=self.describe,
            slots=self.slots,
            posterior=self.posterior,
        )


def adaptive(
    n: int,
    evidence: Sequence[Run] = (),
    *,
    model: NoiseModel | None = None,
    closure: Callable[[Variant], Variant] | None = None,
    describe: Describe = _describe,
    slots: int = 1,
    posterior: bool = False,
) -> Search:
    model = model or NoiseModel()
    close = closure or (lambda v: v)
    full = frozenset(range(n))
    runs: list[Run] = [(frozenset(v), x) for v, x in evidence if x is not Verdict.INFRA]
    if not runs:  # the strategy contract: good passes and bad fails
        runs = [(frozenset(), Verdict.PASS), (full, Verdict.FAIL)]
    seen = {v for v, _ in runs}

    def switch(reason: str) -> Search:
        note = (
            f"the failure is flaky: {reason}; switched to the noise-aware search" if reason else ""
        )
        budget = model.max_runs if model.max_runs is not None else 60 + 25 * n
        start = len(runs)
        answer: Answer | None = None
        for _ in range(2 * CONFIRM_TRIES + 4):  # bounded: one run alone, or one phase, per pass
            # once runs contradicted each other, the search goes on until the doubt left is
            # FLAKY_DOUBT of the doubt allowed; an answer at the confidence asked is complete
            flaky = bool(reason or flakiness(runs, describe))
            strict = _default_model(model, flaky=flaky)
            v, best = _alone_again(n, runs, strict, close)
            if v is not None and len(runs) - start < budget:
                got = yield Round((v,), purpose="noise-confirm", again=True, note=note, best=best)
                runs.extend((close(u), x) for u, x in got.items() if x is not Verdict.INFRA)
                continue
            left = replace(strict, max_runs=max(0, budget - (len(runs) - start)))
            search = batch.search(
                n, list(runs), model=left, closure=closure, note=note, slots=slots
            )
            answer = yield from _recording(
                search,
                runs,
                close,
                until=None if flaky else lambda: bool(flakiness(runs, describe)),
            )
            if answer is None:  # the runs just looked flaky: weighed again with that stop
                continue
            # a set the posterior is sure of that never failed alone: it runs alone (the
            # evidence a culprit is named with) until it fails, or until a failure with its
            # measured rate would have shown with the confidence asked (at most
            # CONFIRM_TRIES runs); each run is weighed again (a pure function of the runs)
            alone = [close(c.deltas) for c in answer.culprits if not c.confirmed]
            if not answer.complete or not alone or len(runs) - start >= budget:
                break
            v = alone[0]
            rate = min(max(answer.reproduction_rate or 0.5, 0.05), 0.95)
            tries = min(CONFIRM_TRIES, math.ceil(math.log1p(-model.confidence) / math.log1p(-rate)))
            if sum(1 for u, x in runs if u == v and x is Verdict.PASS) >= tries:
                break
            best = replace(answer, complete=False, reason="the search was stopped")
            got = yield Round((v,), purpose="noise-confirm", again=True, note=note, best=best)
            runs.extend((close(u), x) for u, x in got.items() if x is not Verdict.INFRA)
        if answer is None:  # (bounded loop spent on phases: weigh what the runs say)
            state = Noisy(n, _default_model(model, flaky=True))
            for u, x in runs:
                state.add(u, x)
            answer = state.answer(state.analyze(), complete=False, reason="the search was stopped")
        if (
            not answer.complete
            and answer.culprits
            and (answer.confidence or 0.0) >= model.confidence
        ):
            answer = replace(answer, complete=True, reason="")
        return answer

    reason = flakiness(runs, describe)
    if reason or posterior:
        return (yield from switch(reason))
    gen = auto(n)
    try:
        rnd = next(gen)
        for _ in range(100_000):  # bounded: auto proposes finitely many variants
            got = yield rnd
            for v, x in got.items():
                cv = close(v)
                if cv not in seen and x is not Verdict.INFRA:
                    seen.add(cv)
                    runs.append((cv, x))
            reason = flakiness(runs, describe)
            if reason:
                return (yield from switch(reason))
            rnd = gen.send(got)
        raise RuntimeError("auto did not converge")
    except StopIteration as stop:
        answer: Answer = stop.value
    # Causes that share a change: real (two causes with a common flag) or the chain a
    # flaky culprit leaves when unlucky passes made each pass of the search pick up a
    # partner. The changes common to every set that has a shared change tell them apart
    # (they fail only if they hold the culprit): they run until they have two verdicts.
    # Never needed in the deterministic table (no shape there shares a change).
    for core in _shared(answer.culprit_sets):
        v = close(core)
        for _ in range(SHARED_CHECKS):
            if sum(1 for u, y in runs if u == v and y.resolved) >= SHARED_CHECKS:
                break
            got = yield Round((v,), purpose="check", again=True)
            runs.append((v, got[v]))
    reason = answer_doubt(answer, runs, describe)
    if reason:
        return (yield from switch(reason))
    got = _deterministic_confidence(n, runs, answer, model)
    conf = got["confidence"]
    if conf is not None and conf >= model.confidence:
        return replace(answer, **got)
    # Not yet as sure as asked (a few unlucky passes of a flaky failure could explain the
    # same runs): the posterior search goes on from these runs, under the same prior,
    # until its answer reaches the confidence or its budget ends.
    # While no run has looked flaky, a variant already run is not run again when one not
    # run yet tells about as much (issue 35): the same question asked of another variant
    # is worth as much under the model, and may show the flakiness a repeat would not.
    sure = yield from _recording(
        batch.search(
            n,
            list(runs),
            model=replace(_default_model(model), repeats=False),
            closure=closure,
            slots=slots,
        ),
        runs,
        close,
    )
    if set(sure.culprit_sets) == set(answer.culprit_sets):
        # the same sets: `auto`'s answer, with the evidence it cites, at the new confidence
        return replace(
            answer,
            confidence=sure.confidence,
            complete=sure.complete,
            reason=sure.reason,
            reproduction_rate=sure.reproduction_rate,
            noise_aware=True,
        )
    if flakiness(runs, describe) or answer_doubt(answer, runs, describe):
        return sure  # the new runs showed flakiness: the posterior's answer stands
    # Every run still fits `auto`'s answer exactly, and the one-cause posterior prefers
    # another (one flaky cause where `auto` saw several that share changes). The two
    # models are weighed against each other; runs of the flaky candidate alone (which
    # the several causes say pass) and of `auto`'s sets (which they say fail) go on until
    # one of them reaches the confidence, the runs contradict `auto` (then the failure
    # is flaky: the posterior search takes over) or the budget ends.
    rival = list(sure.culprit_sets)
    for _ in range(WEIGH_RUNS + 2 * n):
        several, lead = _several_causes(n, runs, answer.culprit_sets, rival, model)
        if several >= model.confidence:
            return replace(answer, confidence=several, noise_aware=True, reproduction_rate=1.0)
        conf = (sure.confidence or 0.0) * (1.0 - several)
        if conf >= model.confidence:
            return replace(sure, confidence=conf)
        v = _weigh_next(runs, [*([lead] if lead else []), *rival, *answer.culprit_sets], close)
        best = replace(
            answer,
            complete=False,
            noise_aware=True,
            confidence=several,
            reason="the search was stopped",
        )
        got = yield Round((v,), purpose="noise-check", again=True, best=best)
        runs.extend((close(u), x) for u, x in got.items() if x is not Verdict.INFRA)
        reason = flakiness(runs, describe) or answer_doubt(answer, runs, describe)
        if reason:
            return (yield from switch(reason))
    several, _ = _several_causes(n, runs, answer.culprit_sets, rival, model)
    return replace(
        answer,
        complete=False,
        noise_aware=True,
        confidence=several,
        reason="the runs fit causes that share changes, or one flaky cause",
    )


def _alone_again(
    n: int, runs: Sequence[Run], model: NoiseModel, close: Callable[[Variant], Variant]
) -> tuple[Variant | None, Answer | None]:
    """(The leading set alone once more, the best answer so far) while that set has run
    alone, passed and never failed alone, the runs still make it the answer at ALONE_SURE
    and its measured rate says a failure could still show; (None, None) otherwise. A pure
    function of the runs: a search sure of a set that then passed alone runs it alone
    again instead of searching until sure again before each run alone."""
    state = Noisy(n, model)
    for v, x in runs:
        state.add(v, x)
    a = state.analyze()
    if not a.found or a.confidence < ALONE_SURE:
        return None, None
    v = close(a.found[0].term)
    got = [x for u, x in runs if u == v and x.resolved]
    passes = sum(1 for x in got if x is Verdict.PASS)
    if not passes or any(x is Verdict.FAIL for x in got):
        return None, None
    rate = min(max(a.rate or 0.5, 0.05), 0.95)
    tries = min(CONFIRM_TRIES, math.ceil(math.log1p(-model.confidence) / math.log1p(-rate)))
    if passes >= tries:
        return None, None
    return v, state.answer(a, complete=False, reason="the search was stopped")


def _several_causes(
    n: int,
    runs: Sequence[Run],
    terms: Sequence[frozenset[int]],
    rival: Sequence[frozenset[int]],
    model: NoiseModel,
) -> tuple[float, frozenset[int] | None]:
    """(P(`auto`'s causes `terms` | runs) against every single cause and against the
    posterior's own answer `rival`, the leading single cause if one explains every
    failure).

    A set of causes is weighed as one model: its prior is the product of the sets' priors,
    each cause after the first with the prior weight of another cause (`other`); with one
    reproduction rate for all of them, its likelihood is that of a set carried by every
    failing run and by the passing runs that carry any of its sets (`auto`'s: none). A
    single cause has the prior and likelihood of the posterior (`Noisy`), weighed together.
    """
    m = replace(_default_model(model), max_triples=10**5)
    state = Noisy(n, m)
    for v, x in runs:
        state.add(v, x)
    belief = state.belief((1 << n) - 1)

    def evidence(sets: Sequence[frozenset[int]]) -> float:
        if not sets or any(len(t) > len(m.sizes) or m.sizes[len(t) - 1] <= 0 for t in sets):
            return -math.inf
        masks = [sum(1 << i for i in t) for t in sets]
        passes = 0
        for v, x in state.runs:  # as the posterior reads them (another failure: a pass)
            if not x.resolved:
                continue
            carried = any(t & ~v == 0 for t in masks)
            if x is Verdict.FAIL and not carried:
                return -math.inf  # a target failure none of the sets is in
            passes += carried and x is not Verdict.FAIL
        prior = sum(math.log(m.sizes[len(t) - 1] / math.comb(n, len(t))) for t in sets)
        return prior + (len(sets) - 1) * math.log(m.other) + belief.likelihood(passes)

    several = evidence(terms)
    if several == -math.inf:
        return 0.0, None
    others = [evidence(rival) if len(rival) > 1 else -math.inf]
    if belief.consistent:
        others.append(belief.log_evidence() + math.log1p(-m.other))
    top = max(others)
    if top == -math.inf:
        return 1.0, None
    rest = top + math.log(sum(math.exp(x - top) for x in others))
    lead = belief.best()[0] if belief.consistent else None
    return 1.0 / (1.0 + math.exp(min(rest - several, 700.0))), lead


def _weigh_next(
    runs: Sequence[Run], options: Sequence[frozenset[int]], close: Callable[[Variant], Variant]
) -> Variant:
    """The variant with the fewest runs among `options` (each set alone; the first
    first)."""
    count: dict[Variant, int] = {}
    for v, _ in runs:
        count[v] = count.get(v, 0) + 1
    return min((close(t) for t in options), key=lambda v: count.get(v, 0))


def _recording(
    search: Search,
    runs: list[Run],
    close: Callable[[Variant], Variant],
    until: Callable[[], bool] | None = None,
) -> Search:
    """`search`, with every verdict it receives added to `runs`; None (the search closed)
    as soon as `until()` says so after a round."""
    try:
        rnd = next(search)
        for _ in range(100_000):  # bounded: the search has a run budget
            got = yield rnd
            runs.extend((close(v), x) for v, x in got.items() if x is not Verdict.INFRA)
            if until is not None and until():
                search.close()
                return None
            rnd = search.send(got)
        raise RuntimeError("the search did not converge")
    except StopIteration as stop:
        answer: Answer = stop.value
        return answer


def _shared(terms: list[frozenset[int]]) -> list[frozenset[int]]:
    """For each change that belongs to more than one culprit set: the changes common to
    all the sets it belongs to (the change alone when they share nothing else)."""
    seen: dict[int, int] = {}
    for t in terms:
        for x in t:
            seen[x] = seen.get(x, 0) + 1
    cores: list[frozenset[int]] = []
    for x in sorted(x for x, k in seen.items() if k > 1):
        core = frozenset.intersection(*(t for t in terms if x in t))
        if core not in cores:
            cores.append(core)
    return cores


def _default_model(model: NoiseModel, *, flaky: bool | None = None) -> NoiseModel:
    """The prior of the default search: a failure reproduces on every start with prior
    probability `DETERMINISTIC`, otherwise at a rate uniform on (0, 1); a run that failed
    in another way did not show the target (as `auto` reads it). `flaky` (the runs
    contradicted a deterministic failure): the search stops when the doubt left is
    FLAKY_DOUBT of the doubt allowed; False: at the confidence asked; None: as asked,
    with `auto`'s spike weight."""
    if flaky is not None:
        conf = model.confidence
        if flaky:
            conf = 1.0 - (1.0 - conf) * FLAKY_DOUBT
        spike = model.spike or (DETERMINISTIC if flaky else POSTERIOR_DETERMINISTIC)
        model = replace(model, confidence=conf, spike=spike)
    return replace(
        model,
        spike=model.spike if model.spike > 0 else DETERMINISTIC,
        miss_spike=model.miss_spike or MISS_DETERMINISTIC,
        other_clears=True,
        other_per_change=model.other_per_change or OTHER_PER_CHANGE,
        max_triples=max(model.max_triples, TRIPLES),
    )


def _deterministic_confidence(
    n: int, runs: Sequence[Run], answer: Answer, model: NoiseModel
) -> dict[str, float | None]:
    """The posterior of `auto`'s answer under a prior that favours a deterministic failure."""
    # every set of up to three changes is weighed here (one posterior, not a search step)
    state = Noisy(n, replace(_default_model(model), max_triples=10**5))
    for v, x in runs:
        state.add(v, x)
    a = state.analyze()
    rate, _, _ = state.rate(answer.culprits[0].deltas) if answer.culprits else (None, 0, 0)
    same = {f.term for f in a.found} == set(answer.culprit_sets)
    return {"confidence": a.confidence if same else None, "reproduction_rate": rate}


def make_adaptive(confidence: float = 0.95, describe: Describe = _describe) -> StrategyFn:
    return Adaptive(NoiseModel(confidence=confidence), describe)


#: the largest number of deltas a search that weighs every run is simulated at for an
#: estimate; beyond it, what it costs over `auto` there is added to `auto`'s estimate
#: (those runs confirm the culprit set: they do not grow with the number of deltas)
SIMULATED_UP_TO = 24
#: the simulated work of one such estimate (strategies.estimate_runs)
DEFAULT_ESTIMATE_BUDGET = 1500


@functools.lru_cache(maxsize=64)
def estimate_search(name: str, n: int, confidence: float = 0.95) -> dict[str, float]:
    """Runs after the endpoints of the search a campaign runs for strategy `name` ("auto":
    auto, then runs until the answer reaches `confidence`; "noisy": the noise-aware search
    from the first run) for a single culprit and an interacting pair, each failing on
    every start; `auto_*`: what `auto` alone costs (the base the flaky estimates of
    planner.noise_estimate scale)."""
    model = NoiseModel(confidence=confidence)
    strategy = Adaptive(model) if name == "auto" else NoisyFromStart(model)
    m = min(n, SIMULATED_UP_TO)
    search = estimate_runs(strategy, m, DEFAULT_ESTIMATE_BUDGET)
    base = estimate_runs(auto, n)
    at_m = estimate_runs(auto, m)
    out = {k: base[k] + max(0.0, search[k] - at_m[k]) for k in base}
    return out | {f"auto_{k}": v for k, v in base.items()}
