"""The first-failure rule of a deployment: the crash on one role, never the watchdog it
caused on another, whatever order the logs come in and however the hosts' clocks differ.

The logs are the lab server's own two-node output (tests/data/multinode/), classified by
the classifier; the hosts' clocks and the measurement of their offsets are drawn by
hypothesis around them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.diagnosis.classify.analyze import analyze_log
from orchestrator.diagnosis.classify.judge import HANG_MESSAGE
from orchestrator.diagnosis.first_failure import (
    DEFAULT_TOLERANCE_S,
    NEVER_JOINED,
    RoleResult,
    failure_time,
    first_failure,
    first_stamp,
)
from orchestrator.diagnosis.verdicts import Phase, Signature

DATA = Path(__file__).parent / "data" / "multinode"
YEAR = 2026  # the year the lab logs were recorded in (torch's stamps print none)
PAIRS = {
    # pair -> the rank that failed, its host, and the error class of its crash
    "rank1_cublas": (1, "cublas"),
    "rank0_oom": (0, "cuda_oom"),
}
HOSTS = {0: "b300-01", 1: "b300-02"}


def role_of(pair: str, rank: int) -> RoleResult:
    """One rank's recorded log, classified, its failure stamped from its own lines."""
    analysis = analyze_log((DATA / f"{pair}.rank{rank}.log").read_text(encoding="utf-8"))
    return RoleResult(
        role=f"node-rank {rank}",
        host=HOSTS[rank],
        signature=analysis.signature,
        kind=analysis.kind,
        failed_at=first_stamp(analysis.excerpt, YEAR),
    )


RECORDED = {pair: (role_of(pair, 0), role_of(pair, 1)) for pair in PAIRS}


def test_the_recorded_logs_are_a_crash_and_a_watchdog_timeout() -> None:
    for pair, (failing, error_class) in PAIRS.items():
        crash, timeout = RECORDED[pair][failing], RECORDED[pair][1 - failing]
        assert crash.signature is not None and crash.signature.error_class == error_class
        assert crash.kind == "crash" and crash.is_cause
        assert timeout.signature is not None and timeout.signature.error_class == "nccl_timeout"
        assert timeout.kind == "timeout" and not timeout.is_cause
        assert crash.failed_at is not None and timeout.failed_at is not None


@settings(max_examples=300, deadline=None)
@given(
    pair=st.sampled_from(sorted(PAIRS)),
    true_offsets=st.tuples(*[st.floats(-86_400, 86_400, allow_nan=False)] * 2),
    # how far off the offset measured over SSH is, per host (within the tolerance's budget)
    errors=st.tuples(*[st.floats(-1.0, 1.0, allow_nan=False)] * 2),
    # the crashing process flushed its last lines late
    flush=st.floats(0.0, 2.0, allow_nan=False),
    reverse=st.booleans(),
)
def test_the_failing_rank_wins_whatever_the_clocks_and_the_order(
    pair: str,
    true_offsets: tuple[float, float],
    errors: tuple[float, float],
    flush: float,
    reverse: bool,
) -> None:
    failing, error_class = PAIRS[pair]
    roles = []
    for rank in (0, 1):
        r = RECORDED[pair][rank]
        assert r.failed_at is not None
        late = flush if rank == failing else 0.0
        roles.append(
            replace(
                r,
                failed_at=r.failed_at + true_offsets[rank] + late,  # the host's own clock
                clock_offset=true_offsets[rank] + errors[rank],  # as measured
            )
        )
    if reverse:
        roles.reverse()
    answer = first_failure(roles)
    assert answer is not None
    assert answer.role == f"node-rank {failing}" and answer.host == HOSTS[failing]
    assert answer.signature == RECORDED[pair][failing].signature
    assert answer.signature.error_class == error_class and not answer.consequence
    assert answer.describe().endswith(f"node-rank {1 - failing} then timed out in a collective")


KINDS = st.sampled_from(["timeout", "hang"])


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(2, 8),
    data=st.data(),
)
def test_a_crash_beats_every_consequence_logged_up_to_the_tolerance_before_it(
    n: int, data: st.DataObject
) -> None:
    crash_at = data.draw(st.integers(0, n - 1), label="crashing role")
    crash_t = data.draw(st.floats(0, 1000, allow_nan=False), label="crash time")
    roles = []
    for i in range(n):
        offset = data.draw(st.floats(-3600, 3600, allow_nan=False), label=f"offset {i}")
        if i == crash_at:
            sig, kind, t = (
                Signature(Phase.CUDA_GRAPH, "cublas", "CUBLAS_STATUS_X"),
                "crash",
                crash_t,
            )
        else:
            kind = data.draw(KINDS, label=f"kind {i}")
            sig = Signature(Phase.CUDA_GRAPH, "nccl_timeout" if kind == "timeout" else "hang", kind)
            # up to the tolerance before the crash, or any time after it
            t = crash_t + data.draw(
                st.floats(-DEFAULT_TOLERANCE_S, 1000, allow_nan=False), label=f"gap {i}"
            )
        roles.append(
            RoleResult(
                f"role {i}", f"host-{i}", sig, kind, failed_at=t + offset, clock_offset=offset
            )
        )
    order = data.draw(st.permutations(roles), label="order")
    answer = first_failure(order)
    assert answer is not None and answer.role == f"role {crash_at}"
    assert answer.signature.error_class == "cublas"
    assert len(answer.others) == n - 1


def test_a_timeout_long_before_any_crash_is_the_first_failure() -> None:
    # Rank 1 was silent (slow, stuck) for a whole watchdog; rank 0 timed out; rank 1's
    # crash a minute later came in the teardown: the timeout was the first failure.
    crash = replace(RECORDED["rank1_cublas"][1], failed_at=1000.0 + 60)
    timeout = replace(RECORDED["rank1_cublas"][0], failed_at=1000.0)
    answer = first_failure([crash, timeout])
    assert answer is not None and answer.role == "node-rank 0" and answer.consequence
    assert answer.describe().endswith("node-rank 1 then failed too (" + str(crash.signature) + ")")
    # within the tolerance the crash is still the cause
    near = replace(crash, failed_at=1000.0 + DEFAULT_TOLERANCE_S)
    assert first_failure([near, timeout]).role == "node-rank 1"  # type: ignore[union-attr]
    assert first_failure([near, timeout], tolerance=1.0).role == "node-rank 0"  # type: ignore[union-attr]


def test_a_role_that_never_joined_is_named_as_such() -> None:
    timeout = RECORDED["rank1_cublas"][0]
    absent = RoleResult("node-rank 1", "b300-02", absent="unit failed to start")
    answer = first_failure([timeout, absent])
    assert answer is not None and answer.role == "node-rank 1" and not answer.infra
    assert answer.signature.error_class == NEVER_JOINED
    assert answer.describe() == (
        "node-rank 1 on b300-02 never joined (unit failed to start); "
        "node-rank 0 then timed out in a collective"
    )
    unreachable = RoleResult("decode", "b300-03", absent="host unreachable", infra=True)
    answer = first_failure([timeout, unreachable])
    assert answer is not None and answer.infra and answer.role == "decode"


def test_only_consequences_name_the_earliest_and_no_failure_names_none() -> None:
    a = RoleResult("prefill", "h1", Signature(Phase.WARMUP, "hang", "x"), "hang", failed_at=50)
    b = RoleResult("decode", "h2", Signature(Phase.WARMUP, "nccl_timeout", "y"), "timeout", 40)
    answer = first_failure([a, b])
    assert answer is not None and answer.role == "decode" and answer.consequence
    assert first_failure([RoleResult("router", "h3")]) is None
    assert first_failure([]) is None


def test_a_silent_straggler_is_the_one_the_watchdogs_waited_for() -> None:
    # rank 1 hung without a word (its hang seen only at the run's deadline, no kind from
    # the log); rank 0 timed out in a collective long before that deadline
    timeout = RECORDED["rank1_cublas"][0]
    assert timeout.failed_at is not None
    silent = RoleResult(
        "node-rank 1",
        "b300-02",
        Signature(Phase.LOAD_WEIGHTS, "hang", f"{HANG_MESSAGE} after 'Load weight begin.'"),
        failed_at=timeout.failed_at + 900,
    )
    assert not silent.is_cause
    for order in ([timeout, silent], [silent, timeout]):
        answer = first_failure(order)
        assert answer is not None and answer.role == "node-rank 1" and answer.consequence
        assert answer.describe().endswith("node-rank 0 then timed out in a collective")
    # a crash still beats it, unless the crash came long after the first watchdog
    crash = replace(RECORDED["rank1_cublas"][1], role="node-rank 2", host="b300-03")
    assert first_failure([silent, timeout, crash]).role == "node-rank 2"  # type: ignore[union-attr]
    late = replace(crash, failed_at=timeout.failed_at + 60)
    assert first_failure([late, timeout, silent]).role == "node-rank 1"  # type: ignore[union-attr]


def test_a_role_left_waiting_by_the_crash_is_told_as_hung_not_as_a_failure_of_its_own() -> None:
    # vLLM's data parallel: rank 1's engine dies at config validation while rank 0 waits
    # for it in the handshake without a line; the executor stops rank 0 and judges it a
    # silent hang (no kind from its log)
    crash = RoleResult(
        "node1",
        "dp-node1",
        Signature(Phase.INIT, "ValueError", "User-specified max_model_len is greater"),
        "crash",
        failed_at=100.0,
    )
    waiting = RoleResult(
        "node0",
        "dp-node0",
        Signature(Phase.INIT, "hang", f"{HANG_MESSAGE} after 'Resolved architecture'"),
        failed_at=None,
    )
    for order in ([crash, waiting], [waiting, crash]):
        answer = first_failure(order)
        assert answer is not None and answer.role == "node1" and not answer.consequence
        assert answer.describe() == (
            "node1 on dp-node1: init: ValueError: User-specified max_model_len is greater; "
            "node0 then hung without a word after 'Resolved architecture'"
        )


def test_a_peer_loss_reported_as_an_error_is_a_consequence() -> None:
    lost = RoleResult(
        "node-rank 0",
        "h1",
        Signature(Phase.INIT, "nccl", "ncclRemoteError: remote process exiting prematurely"),
        "crash",
        failed_at=10.0,
    )
    crash = RoleResult("node-rank 1", "h2", Signature(Phase.INIT, "cublas", "X"), "crash", 12.0)
    answer = first_failure([lost, crash])
    assert answer is not None and answer.role == "node-rank 1"
    assert answer.describe().endswith("node-rank 0 then lost its peer")


def test_a_negative_tolerance_is_refused() -> None:
    with pytest.raises(ValueError, match="tolerance"):
        first_failure([], tolerance=-1)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("[2026-12-04 21:36:10 TP0] Scheduler hit an exception:", "2026-12-04T21:36:10"),
        ("[rank0]:[E1204 21:36:12.781147000 ProcessGroupNCCL.cpp:616] [Rank 0]", "21:36:12.781147"),
        ("[2025-02-21 22:59:28] Received sigquit", "2025-02-21T22:59:28"),
        ('  File "x.py", line 3, in f', None),
    ],
)
def test_failure_time_reads_sglang_and_torch_stamps(line: str, expected: str | None) -> None:
    from datetime import datetime

    got = failure_time(line, YEAR)
    if expected is None:
        assert got is None
        return
    text = expected if "T" in expected else f"{YEAR}-12-04T{expected}"
    want = datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()
    assert got == pytest.approx(want)


def _silent(rank: int, phase: Phase, last: str, **kw: object) -> RoleResult:
    return RoleResult(
        f"node{rank}",
        HOSTS[rank],
        Signature(phase, "hang", f"{HANG_MESSAGE} after '{last}'"),
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("reverse", [False, True])
def test_two_ranks_silent_at_one_step_are_not_given_an_invented_order(reverse: bool) -> None:
    """Rank 1 hangs without a word and rank 0 waits for it past the deadline (a long
    dist-timeout): both logs end on the same line, so which one the other waited for
    cannot be told, and the answer says so instead of naming rank 0 first."""
    both = [
        _silent(0, Phase.CUDA_GRAPH, "Capture cuda graph begin."),
        _silent(1, Phase.CUDA_GRAPH, "Capture cuda graph begin."),
    ]
    got = first_failure(both[::-1] if reverse else both)
    assert got is not None
    assert {r.role for r in got.tied} == {"node0", "node1"} and got.others == ()
    said = got.describe()
    assert "cannot be told" in said and "then hung" not in said, said
    assert "node0 on b300-01 and node1 on b300-02" in said or (
        "node1 on b300-02 and node0 on b300-01" in said
    ), said
    assert "after 'Capture cuda graph begin.'" in said, said


def test_the_rank_whose_log_stops_earliest_is_the_one_waited_for() -> None:
    """Silent alike, but rank 1 never finished loading while rank 0 got to graph capture:
    rank 0 could not have got there without it, so rank 1 is the one it waited for."""
    ahead = _silent(0, Phase.CUDA_GRAPH, "Capture cuda graph begin.")
    behind = _silent(1, Phase.LOAD_WEIGHTS, "Load weight begin.")
    for order in ([ahead, behind], [behind, ahead]):
        got = first_failure(order)
        assert got is not None and got.role == "node1" and got.tied == ()
        assert got.describe().endswith(
            "node0 then hung without a word after 'Capture cuda graph begin.'"
        )


def test_a_role_up_and_answering_is_never_said_to_hang() -> None:
    """Decode answered its own health check and the router its 503 (a worker down) while
    prefill hung: neither is the one waited for, and each is said to have stayed up, not
    to have hung."""
    prefill = RoleResult("prefill", "h", Signature(Phase.INIT, "hang", f"{HANG_MESSAGE}"))
    hung = Signature(Phase.INIT, "hang", HANG_MESSAGE)
    router = RoleResult("router", "h", hung, health_code=503)
    decode = RoleResult("decode", "h", hung, health_code=200)
    for order in ([router, prefill, decode], [decode, router, prefill]):
        got = first_failure(order)
        assert got is not None and got.role == "prefill" and got.tied == ()
        said = got.describe()
        assert "hung without a word" not in said, said
        assert "decode stayed up and healthy meanwhile" in said, said
        assert "router stayed up meanwhile (its health check answered 503)" in said, said
