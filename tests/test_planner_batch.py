"""The noise-aware search with k slots (orchestrator.planner.batch): what each slot gets.

The joint information of runs in progress is the single-run information for one run and
less than the sum for repeats (one rate per culprit set); the variants chosen together
bring more than k copies of the best one; each round of the batched search names k runs,
a verdict ends it and the others stay named (once the answer is sure, the runs in
progress are read before it is given); the answer is the posterior of the runs recorded,
whatever order they came in. How much wall time it saves is measured by
bench/parallel_noisy.py.
"""

from __future__ import annotations

import random
from collections import Counter

from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.planner import Planner
from orchestrator.planner.adaptive import Adaptive
from orchestrator.planner.batch import NoisyFromStart, joint_gain, next_batch
from orchestrator.planner.noisy import NoiseModel, Noisy

P, F = Verdict.PASS, Verdict.FAIL
N = 8


def state_after(runs: list[tuple[frozenset[int], Verdict]]) -> Noisy:
    s = Noisy(N, NoiseModel())
    for v, x in runs:
        s.add(v, x)
    return s


START = [(frozenset(), P), (frozenset(range(N)), P), (frozenset(range(N)), F)]


def test_one_run_is_the_single_run_information_and_a_repeat_brings_less() -> None:
    s = state_after(START + [(frozenset({0, 1, 2, 3}), P)])
    a = s.analyze()
    belief = a.found[-1].belief
    for v in (0b1111, 0b11110000, 0b1, 0b10101010):
        one = joint_gain(belief, [v])
        assert abs(one - belief.gain(v)) < 1e-9
        two = joint_gain(belief, [v, v])
        assert one < two < 2 * one  # a second run helps, less than the first: a shared rate


def test_the_slots_get_different_information_not_copies_of_the_best() -> None:
    s = state_after(START)
    a = s.analyze()
    belief = a.found[-1].belief
    batch = next_batch(s, a, 4, [])
    assert frozenset(i for i in range(N) if batch[0] >> i & 1) == a.next  # as one slot would
    assert len(set(batch)) > 1
    assert joint_gain(belief, batch) > joint_gain(belief, [batch[0]] * 4) + 0.05
    # a run in progress is weighed: the next slot goes elsewhere
    assert next_batch(s, a, 1, [batch[0]])[0] != batch[0]


def drive(strategy, term: frozenset[int], p: float, seed: int, k: int):  # noqa: ANN001, ANN201
    """k slots; each step one run in progress ends (in a random order); returns the planner
    and the number of runs named by each noise-aware round."""
    rng = random.Random(seed)
    full = frozenset(range(N))
    planner = Planner(N, strategy, known={frozenset(): P, full: F}, evidence=START)
    named: list[int] = []
    running: list[frozenset[int]] = []
    for _ in range(2000):
        if planner.done:
            break
        want = Counter(planner.pending())
        rnd = planner.current_round
        # the search's own confirmation of a set (run alone until it fails) is one run
        if rnd is not None and rnd.purpose.startswith("noise-") and rnd.purpose != "noise-confirm":
            named.append(sum(want.values()))
        have = Counter(running)
        for v, c in want.items():
            running += [v] * max(0, c - have[v])
        running = [v for v in running if want[v] > 0] or list(want.elements())
        v = running.pop(rng.randrange(len(running)))
        planner.record(v, F if term <= v and rng.random() < p else P)
    return planner, named


def test_every_slot_holds_a_run_until_the_answer() -> None:
    right = 0
    for seed in range(6):
        term = frozenset(random.Random(seed).sample(range(N), 2))
        planner, named = drive(Adaptive(NoiseModel(), slots=4), term, 0.5, seed, 4)
        assert planner.done and named
        # every noise-aware round names 4 runs, but once the answer is sure: the runs still
        # in progress are read (one fewer each round), nothing new starts
        assert named[0] == 4
        # (after a drain, a set's confirmation may send the search on: a new pass)
        assert all(b in (4, a - 1) or a == 1 for a, b in zip(named, named[1:], strict=False)), named
        assert named.count(4) >= len(named) - 3 * named.count(1)
        right += planner.answer.culprit_sets == [term]
    assert right >= 5


def test_a_verdict_decides_the_round_and_the_others_stay_named() -> None:
    planner = Planner(
        N,
        NoisyFromStart(NoiseModel(), slots=3),
        known={frozenset(): P, frozenset(range(N)): F},
        evidence=START,
    )
    first = planner.pending()
    assert len(first) == 3 and planner.current_round.any_verdict
    planner.record(first[1], P)
    after = planner.pending()
    assert len(after) == 3
    assert not Counter([first[0], first[2]]) - Counter(after)  # still named: still running


def test_the_answer_is_the_posterior_of_the_runs_recorded() -> None:
    term = frozenset({3, 6})
    planner, _ = drive(NoisyFromStart(NoiseModel(), slots=4), term, 0.5, 7, 4)
    shuffled = START + list(planner.history)
    random.Random(1).shuffle(shuffled)
    again = state_after([(v, x) for v, x in shuffled if x is not Verdict.INFRA]).analyze()
    assert again.next is None  # the same runs in any order: the search is done
    assert abs(again.confidence - planner.answer.confidence) < 1e-9
    assert {f.term for f in again.found} == set(planner.answer.culprit_sets)
