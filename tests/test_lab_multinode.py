"""The simulated server over two nodes, as real processes on 127.0.0.1.

Rank 0 listens on the init address, rank 1 connects over TCP, every startup phase ends in
a barrier between them, a rank left waiting for a dead peer is ended by its watchdog
(`--dist-timeout`) with torch's NCCL timeout lines, and only rank 0 serves HTTP. Every wait
is bounded; every process is stopped in teardown.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestrator.diagnosis.classify.analyze import analyze_log
from orchestrator.diagnosis.verdicts import Phase
from orchestrator.lab import multinode
from tests.hosts.procs import LabProcess, free_port, http_get, port_open, scenario_file

pytestmark = pytest.mark.slow

WATCHDOG = "2"  # seconds: --dist-timeout
WAIT = 30.0  # bound of every wait: startup plus the watchdog, with room for a busy machine
TIMEOUT_LINE = "Watchdog caught collective operation timeout: WorkNCCL("
READY = "The server is fired up and ready to roll!"
CUBLAS = (
    "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling "
    "`cublasGemmStridedBatchedEx(...)`"
)
SCENARIO = f"""
name: two-nodes
startup: {{init: 1.0, load_weights: 1.0, kv_cache: 1.0, cuda_graph: 2.0, warmup: 1.0}}
faults:
  - when: {{node-rank: 1, enable-nccl-nvls: true}}
    phase: cuda_graph
    error: "{CUBLAS}"
  - when: {{node-rank: 0, rank0-oom: true}}
    phase: kv_cache
    error: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
  - when: {{node-rank: 1, rank1-hang: true}}
    phase: load_weights
    effect: hang
"""


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(scenario_file(tmp_path_factory, SCENARIO))


class Pair:
    """Two ranks of one server; every process started is stopped at the end."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.init_port = free_port()
        self.http = {0: free_port(), 1: free_port()}
        self.procs: dict[int, LabProcess] = {}

    def start(self, rank: int, *extra: str) -> LabProcess:
        args = [
            "--scenario",
            self.scenario,
            "--time-scale",
            "0.1",
            "--tp-size",
            "2",
            "--nnodes",
            "2",
            "--node-rank",
            str(rank),
            "--dist-init-addr",
            f"127.0.0.1:{self.init_port}",
            "--dist-timeout",
            WATCHDOG,
            "--port",
            str(self.http[rank]),
            *extra,
        ]
        proc = LabProcess.server(args).start()
        self.procs[rank] = proc
        return proc

    def stop(self) -> None:
        for rank in sorted(self.procs, reverse=True):
            self.procs[rank].stop()


@pytest.fixture
def pair(scenario: str) -> Iterator[Pair]:
    p = Pair(scenario)
    try:
        yield p
    finally:
        p.stop()


def test_two_healthy_ranks_rank0_serves_and_rank1_does_not(pair: Pair) -> None:
    one = pair.start(1)  # before rank 0 listens: it retries the connection
    zero = pair.start(0)
    assert zero.wait_healthy(pair.http[0], WAIT), zero.out + zero.err
    assert zero.wait_for_line(READY, WAIT)
    assert http_get(pair.http[0], "/health") == 200
    # rank 1 went through every phase with rank 0 and serves nothing
    assert one.wait_for_line("Capture cuda graph end.", WAIT), one.out
    assert not port_open(pair.http[1])
    assert "Uvicorn running" not in one.out and READY not in one.out
    # --tp-size 2 over two nodes: one scheduler rank each, TP0 on rank 0 and TP1 on rank 1
    assert " TP1] " in one.out and " TP0] " not in one.out
    assert " TP0] " in zero.out and " TP1] " not in zero.out
    assert one.proc is not None and one.proc.poll() is None
    assert TIMEOUT_LINE not in zero.out + one.out
    assert one.stop() == 0 and zero.stop() == 0


def test_rank1_crashes_in_graph_capture_rank0_times_out_in_its_watchdog(pair: Pair) -> None:
    zero = pair.start(0, "--enable-nccl-nvls")
    one = pair.start(1, "--enable-nccl-nvls")
    assert one.wait_exit(WAIT) == 1
    assert CUBLAS in one.out
    # rank 0 finished its own capture and waits for rank 1 in the barrier until the
    # watchdog ends it; it never printed the end of the capture nor served
    assert zero.wait_exit(WAIT) == multinode.WATCHDOG_EXIT, zero.out
    assert TIMEOUT_LINE in zero.out and f"Timeout(ms)={int(WATCHDOG) * 1000})" in zero.out
    assert "Capture cuda graph begin." in zero.out
    assert "Capture cuda graph end." not in zero.out and READY not in zero.out
    assert not port_open(pair.http[0])
    # the classifier reads the crash as a crash and the watchdog as a timeout, same phase
    crash, timeout = analyze_log(one.out), analyze_log(zero.out)
    assert crash.kind == "crash" and crash.error_class == "cublas"
    assert timeout.kind == "timeout" and timeout.error_class == "nccl_timeout"
    assert crash.phase == timeout.phase == Phase.CUDA_GRAPH


def test_rank0_crashes_rank1_times_out_in_its_watchdog(pair: Pair) -> None:
    zero = pair.start(0, "--rank0-oom")
    one = pair.start(1, "--rank0-oom")
    assert zero.wait_exit(WAIT) == 1
    assert "torch.OutOfMemoryError: CUDA out of memory." in zero.out
    assert one.wait_exit(WAIT) == multinode.WATCHDOG_EXIT, one.out
    assert TIMEOUT_LINE in one.out and "[Rank 1]" in one.out  # the node's first global rank
    assert "Memory pool end." not in one.out  # blocked at the end of its KV-cache phase
    crash, timeout = analyze_log(zero.out), analyze_log(one.out)
    assert crash.kind == "crash" and crash.error_class == "cuda_oom"
    assert timeout.kind == "timeout" and timeout.phase == Phase.KV_CACHE


def test_a_hung_rank_leaves_the_other_to_its_watchdog_and_sigterm_ends_it_cleanly(
    pair: Pair,
) -> None:
    zero = pair.start(0, "--rank1-hang")
    one = pair.start(1, "--rank1-hang")
    assert zero.wait_exit(WAIT) == multinode.WATCHDOG_EXIT, zero.out
    assert TIMEOUT_LINE in zero.out
    assert analyze_log(zero.out).phase == Phase.LOAD_WEIGHTS
    # the hung rank says nothing and lives on until stopped; a stop ends it at once
    assert one.proc is not None and one.proc.poll() is None
    assert one.stop() == 0


def test_a_rank_blocked_in_a_barrier_stops_cleanly_on_sigterm(pair: Pair) -> None:
    zero = pair.start(0, "--dist-timeout", "600")  # the later flag wins: a long watchdog
    assert zero.wait_for_line("Init torch distributed begin.", WAIT)
    assert zero.stop(grace=10.0) == 0  # not SIGKILL: the wait saw the stop
    assert TIMEOUT_LINE not in zero.out


def test_rank1_without_rank0_gives_up_with_the_store_client_timeout(pair: Pair) -> None:
    one = pair.start(1)  # nobody listens on the init address
    assert one.wait_exit(WAIT) == multinode.WATCHDOG_EXIT, one.out
    assert "The client socket has timed out after 2000ms while trying to connect to" in one.out
    analysis = analyze_log(one.out)
    assert analysis.kind == "timeout" and analysis.phase == Phase.INIT


def test_rank1_lost_after_ready_rank0_times_out_while_serving(pair: Pair) -> None:
    zero = pair.start(0)
    one = pair.start(1)
    assert zero.wait_healthy(pair.http[0], WAIT), zero.out
    assert one.proc is not None
    one.proc.kill()  # the node dies without a word
    assert zero.wait_exit(WAIT) == multinode.WATCHDOG_EXIT, zero.out
    assert TIMEOUT_LINE in zero.out
    assert analyze_log(zero.out).kind == "timeout"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--nnodes", "2"], "argument --dist-init-addr: expected HOST:PORT"),
        (["--nnodes", "2", "--node-rank", "2"], "argument --node-rank: expected a whole number"),
        (["--nnodes", "x"], "argument --nnodes: expected a whole number"),
        (
            ["--nnodes", "2", "--dist-init-addr", "127.0.0.1:1", "--dist-timeout", "0"],
            "argument --dist-timeout: expected a positive number",
        ),
    ],
)
def test_a_bad_topology_is_a_usage_error(scenario: str, extra: list[str], message: str) -> None:
    with LabProcess.server(["--scenario", scenario, *extra]) as proc:
        assert proc.wait_exit(WAIT) == 2
        assert message in proc.err
