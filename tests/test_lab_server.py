"""The simulated server as a real process: startup lines, port, faults, flags, signals.

Every test starts `python -m orchestrator.lab.server` on a free 127.0.0.1 port with a
small time scale; every wait is bounded and every process is stopped in teardown.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from orchestrator.lab import scenario as sc
from tests.hosts.procs import REPO, LabProcess, free_port, http_get, port_open, scenario_file

# Every test starts the lab server as a real process: `slow`, so the fast tier
# (scripts/test --fast) stays within seconds.
pytestmark = pytest.mark.slow

SCALE = "0.05"
WAIT = 10.0
SIGQUIT = "Received sigquit from a child process. It usually means the child failed."
READY = "The server is fired up and ready to roll!"

ZOO = """
name: zoo
seed: 7
startup: {init: 2.0, load_weights: 4.0, kv_cache: 1.0, cuda_graph: 3.0, warmup: 2.0}
faults:
  - when: {crash-at: args}
    phase: args
    error: "argument --crash-at: invalid choice: 'args'"
  - when: {crash-at: init}
    phase: init
    error: "AttributeError: 'NoneType' object has no attribute 'dtype'"
  - when: {crash-at: load_weights}
    phase: load_weights
    error: "KeyError: 'model.layers.0.mlp.experts.w13_weight'"
  - when: {crash-at: kv_cache}
    phase: kv_cache
    error: "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
  - when: {crash-at: cuda_graph}
    phase: cuda_graph
    error: "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED"
  - when: {crash-at: warmup}
    phase: warmup
    error: "RuntimeError: NCCL error: internal error"
  - when: {crash-at: killed}
    phase: init
    kill: true
    error: "RuntimeError: killed like kill_process_tree"
  - when: {crash-at: code3}
    phase: init
    exit_code: 3
    error: "ValueError: exit code three"
  - when: {hang-at: cuda_graph}
    phase: cuda_graph
    effect: hang
  - when: {hang-at: warmup}
    phase: warmup
    effect: hang
  - when: {load-crash: true}
    after_requests: 5
    error: "RuntimeError: CUDA error: an illegal memory access was encountered"
  - when: {load-hang: true}
    phase: serving
    after_requests: 3
    effect: hang
  - when: {flaky: true}
    phase: init
    probability: 0.5
    error: "RuntimeError: NCCL error: unhandled system error"
  - when: {env: {LAB_TEST_BREAK: "yes"}}
    phase: init
    error: "RuntimeError: broken by environment"
throughput: 1000
"""


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario_file(tmp_path_factory, ZOO)


def _before(lines: list[str], marker: str) -> list[str]:
    idx = next(i for i, line in enumerate(lines) if marker in line)
    return lines[:idx]


# ---------------------------------------------------------------------------- startup


def test_startup_lines_in_order_port_refused_until_ready(spawn, zoo: Path) -> None:
    port = free_port()
    proc = spawn(
        "--scenario",
        str(zoo),
        "--port",
        str(port),
        "--tp-size",
        "4",
        "--model-path",
        "/models/m",
        "--time-scale",
        "0.1",
    )
    assert proc.wait_for_line("Init torch distributed begin.", WAIT)
    assert not port_open(port), "the port must refuse connections until ready"
    assert proc.wait_for_line("Capture cuda graph begin.", WAIT)
    assert http_get(port, "/health") == 0
    assert proc.wait_healthy(port, WAIT)
    assert http_get(port, "/health_generate") == 200
    order = [
        "server_args=ServerArgs(model_path='/models/m'",
        "Init torch distributed begin.",
        "Init torch distributed ends.",
        "Load weight begin. avail mem=",
        "Loading safetensors checkpoint shards: 100% Completed",
        "Load weight end. type=",
        "KV Cache is allocated. #tokens:",
        "Capture cuda graph begin. This can take up to several minutes. avail mem=",
        "Capture cuda graph end. Time elapsed:",
        "max_total_num_tokens=",
        "INFO:     Uvicorn running on http://127.0.0.1:",
        READY,
    ]
    lines = proc.stdout
    positions = [next(i for i, line in enumerate(lines) if text in line) for text in order]
    assert positions == sorted(positions)
    prefix = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP(\d)\] Load weight begin\. ")
    ranks = sorted(m.group(1) for line in lines if (m := prefix.match(line)))
    assert ranks == ["0", "1", "2", "3"]
    assert any(
        re.match(
            r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] The server is fired up and "
            r"ready to roll!$",
            x,
        )
        for x in lines
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=2) as r:
        info = json.load(r)
    assert info["tp_size"] == 4 and info["flags"]["model-path"] == "/models/m"
    proc.terminate()
    assert proc.wait_exit(WAIT) == 0
    assert "INFO:     Finished server process" in proc.out


def test_time_scale_flag_wins_over_env(spawn, zoo: Path) -> None:
    port = free_port()
    started = time.monotonic()
    # 12 s of startup at scale 1; the env asks for 100x slower, the flag for 0.01x.
    proc = spawn(
        "--scenario",
        str(zoo),
        "--port",
        str(port),
        "--time-scale",
        "0.01",
        env={"ORCH_LAB_TIME_SCALE": "100"},
    )
    assert proc.wait_healthy(port, WAIT)
    assert time.monotonic() - started < 5
    port2 = free_port()
    proc2 = spawn("--scenario", str(zoo), "--port", str(port2), env={"ORCH_LAB_TIME_SCALE": "0.01"})
    assert proc2.wait_healthy(port2, WAIT)


def test_bare_scenario_name_resolves_under_experiments(spawn) -> None:
    port = free_port()
    proc = spawn(
        "--scenario", "b300", "--port", str(port), "--tp-size", "8", "--time-scale", "0.02"
    )
    assert proc.wait_healthy(port, WAIT)
    assert "type=DeepseekV3ForCausalLM" in proc.out


# ---------------------------------------------------------------------------- faults


PHASE_MARKERS = {
    # the last phase-opening line printed before the traceback
    "init": "Init torch distributed begin.",
    "load_weights": "Load weight begin.",
    "kv_cache": "Using KV cache dtype:",
    "cuda_graph": "Capture cuda graph begin.",
    "warmup": "INFO:     Uvicorn running on",
}
MARKER_ORDER = list(PHASE_MARKERS.values())


@pytest.mark.parametrize("phase", list(PHASE_MARKERS))
def test_crash_at_each_phase(spawn, zoo: Path, phase: str) -> None:
    port = free_port()
    proc = spawn(
        "--scenario",
        str(zoo),
        "--port",
        str(port),
        "--crash-at",
        phase,
        "--tp-size",
        "2",
        "--time-scale",
        SCALE,
    )
    assert proc.wait_exit(WAIT) == 1
    lines = proc.stdout
    rule = next(r for r in sc.load(zoo).faults if r.phase == phase)
    assert lines[-1].endswith(f"] {SIGQUIT}")
    assert lines[-2] == ""
    assert lines[-3] == rule.error, "the traceback ends with the rule's error text"
    head = _before(lines, "Scheduler hit an exception: Traceback (most recent call last):")
    assert re.match(r"^\[[\d :-]+ TP0\] Scheduler hit an exception: Traceback", lines[len(head)])
    assert any(line.startswith('  File "') for line in lines[len(head) :])
    seen = [m for m in MARKER_ORDER if any(m in line for line in head)]
    assert seen[-1] == PHASE_MARKERS[phase]
    assert READY not in proc.out
    assert not port_open(port)


def test_crash_kill_and_custom_exit_code(spawn, zoo: Path) -> None:
    killed = spawn(
        "--scenario",
        str(zoo),
        "--crash-at",
        "killed",
        "--port",
        str(free_port()),
        "--time-scale",
        SCALE,
    )
    code3 = spawn(
        "--scenario",
        str(zoo),
        "--crash-at",
        "code3",
        "--port",
        str(free_port()),
        "--time-scale",
        SCALE,
    )
    assert killed.wait_exit(WAIT) == -signal.SIGKILL
    assert SIGQUIT in killed.out
    assert code3.wait_exit(WAIT) == 3
    assert "ValueError: exit code three" in code3.out


def test_env_condition_triggers_fault(spawn, zoo: Path) -> None:
    proc = spawn(
        "--scenario",
        str(zoo),
        "--port",
        str(free_port()),
        "--time-scale",
        SCALE,
        env={"LAB_TEST_BREAK": "yes"},
    )
    assert proc.wait_exit(WAIT) == 1
    assert "RuntimeError: broken by environment" in proc.out


@pytest.mark.parametrize(
    ("phase", "marker"),
    [("cuda_graph", "Capture cuda graph begin."), ("warmup", "INFO:     Uvicorn running on")],
)
def test_hang_stops_logging_never_ready_until_sigterm(
    spawn, zoo: Path, phase: str, marker: str
) -> None:
    port = free_port()
    proc = spawn(
        "--scenario", str(zoo), "--port", str(port), "--hang-at", phase, "--time-scale", SCALE
    )
    assert proc.wait_for_line(marker, WAIT)
    # The marker opens a block (one line per rank, then the capture lines): let the block
    # arrive in full (bounded), then nothing more may come.
    count = -1
    for _ in range(50):
        if len(proc.stdout) == count:
            break
        count = len(proc.stdout)
        time.sleep(0.2)
    time.sleep(1.0)  # the whole startup takes 0.6 s at this scale
    assert proc.proc.poll() is None, "a hung server stays alive"
    assert len(proc.stdout) == count, "a hung server stops logging"
    assert not port_open(port)
    proc.terminate()
    assert proc.wait_exit(WAIT) == 0


def _generate(port: int, tokens: int = 4, timeout: float = 5.0) -> int:
    body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": tokens}}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/generate", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            json.load(resp)
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def test_crash_under_load_after_n_requests(spawn, zoo: Path) -> None:
    port = free_port()
    proc = spawn("--scenario", str(zoo), "--port", str(port), "--load-crash", "--time-scale", SCALE)
    assert proc.wait_healthy(port, WAIT)
    assert [_generate(port) for _ in range(5)] == [200] * 5
    assert proc.wait_exit(WAIT) == 1
    assert _generate(port) == 0
    assert not port_open(port)
    out = proc.stdout
    assert out[-1].endswith(SIGQUIT)
    assert out[-3] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert any("in event_loop_overlap" in line for line in out)
    assert READY in proc.out


def test_hang_under_load_stops_answering(spawn, zoo: Path) -> None:
    port = free_port()
    proc = spawn("--scenario", str(zoo), "--port", str(port), "--load-hang", "--time-scale", SCALE)
    assert proc.wait_healthy(port, WAIT)
    assert [_generate(port) for _ in range(3)] == [200] * 3
    assert _generate(port, timeout=0.5) == 0
    assert http_get(port, "/health", timeout=0.5) == 0
    assert proc.proc.poll() is None
    proc.terminate()
    assert proc.wait_exit(WAIT) == 0


def _flaky_outcome(
    spawn, zoo: Path, seed: int | str | None, env: dict[str, str] | None = None
) -> str:
    args = ["--scenario", str(zoo), "--port", str(free_port()), "--flaky", "--time-scale", "0"]
    if seed is not None:
        args += ["--seed", str(seed)]
    proc = spawn(*args, env=env)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if READY in proc.out:
            proc.stop()
            return "pass"
        if proc.proc.poll() is not None:
            proc.wait_exit(WAIT)
            return "crash" if "NCCL error: unhandled system error" in proc.out else "other"
        time.sleep(0.02)
    raise AssertionError("flaky server neither crashed nor became ready")


def test_flaky_rule_is_deterministic_per_seed(spawn, zoo: Path) -> None:
    scen = sc.load(zoo)
    flags = {"flaky": True}
    crashing = [s for s in range(50) if scen.select_fault(flags, {}, s) is not None]
    passing = [s for s in range(50) if scen.select_fault(flags, {}, s) is None]
    assert crashing and passing, "p=0.5 must split 50 seeds"
    for seed, expected in ((crashing[0], "crash"), (passing[0], "pass")):
        assert _flaky_outcome(spawn, zoo, seed) == expected
        assert _flaky_outcome(spawn, zoo, seed) == expected
    # ORCH_LAB_SEED stands in for --seed; without either, the scenario's seed (7) is used
    env_seed = _flaky_outcome(spawn, zoo, None, env={"ORCH_LAB_SEED": str(crashing[0])})
    assert env_seed == "crash"
    default = "crash" if scen.select_fault(flags, {}, 7) is not None else "pass"
    assert _flaky_outcome(spawn, zoo, None) == default


def test_seed_random_draws_afresh_on_every_start(spawn, zoo: Path, tmp_path: Path) -> None:
    # The same command line, 16 starts: with p = 0.5 all alike has odds 1 in 32,768.
    by_flag = [_flaky_outcome(spawn, zoo, "random") for _ in range(8)]
    by_env = [_flaky_outcome(spawn, zoo, None, env={"ORCH_LAB_SEED": "random"}) for _ in range(8)]
    assert set(by_flag + by_env) == {"crash", "pass"}, by_flag + by_env
    # `seed: random` in the scenario does the same without any override
    scen = tmp_path / "random.yaml"
    scen.write_text(ZOO.replace("\nseed: 7\n", "\nseed: random\n"), encoding="utf-8")
    assert "seed: random" in scen.read_text()
    outcomes = [_flaky_outcome(spawn, scen, None) for _ in range(16)]
    assert set(outcomes) == {"crash", "pass"}, outcomes


def test_seed_random_n_replays_the_same_flaky_history(spawn, zoo: Path, tmp_path: Path) -> None:
    from orchestrator.lab.server import replayed_seed

    scen = sc.load(zoo)
    base = next(
        b
        for b in range(1, 100)
        if len(
            {
                scen.select_fault({"flaky": True}, {}, replayed_seed(b, k)) is None
                for k in range(1, 7)
            }
        )
        == 2
    )  # a history with both outcomes
    expected = [
        "pass"
        if scen.select_fault({"flaky": True}, {}, replayed_seed(base, k)) is None
        else "crash"
        for k in range(1, 7)
    ]
    for attempt in ("a", "b"):  # two fresh counters: the same six starts
        env = {"ORCH_LAB_SEED": f"random:{base}", "ORCH_LAB_DIR": str(tmp_path / attempt)}
        assert [_flaky_outcome(spawn, zoo, None, env=env) for _ in range(6)] == expected


def test_args_rule_exits_2_with_argparse_message(spawn, zoo: Path) -> None:
    proc = spawn("--scenario", str(zoo), "--crash-at", "args", "--port", str(free_port()))
    assert proc.wait_exit(WAIT) == 2
    err = proc.stderr
    assert err[0].startswith("usage: launch_server.py [-h]")
    assert err[-1] == "launch_server.py: error: argument --crash-at: invalid choice: 'args'"
    assert proc.stdout == []


# ---------------------------------------------------------------------------- flags


def test_known_flags_help_in_argparse_layout(spawn) -> None:
    proc = spawn("--scenario", "rtx6000", "--help")
    assert proc.wait_exit(WAIT) == 0
    out = proc.out
    assert out.startswith("usage: launch_server.py [-h] [--model-path MODEL_PATH]")
    assert "\noptions:\n  -h, --help" in out
    assert "  --cuda-graph-max-bs CUDA_GRAPH_MAX_BS" in out
    assert re.search(r"^  --enable-nccl-nvls$", out, re.M)
    assert "--tp-size TP_SIZE, --tensor-parallel-size TP_SIZE" in out
    assert "--scenario" not in out and "--time-scale" not in out


def test_known_flags_unrecognized(spawn) -> None:
    proc = spawn("--scenario", "rtx6000", "--model-path", "/m", "--foo", "1")
    assert proc.wait_exit(WAIT) == 2
    assert proc.stderr[0].startswith("usage: launch_server.py")
    assert proc.stderr[-1] == "launch_server.py: error: unrecognized arguments: --foo 1"


def test_known_flags_ambiguous_prefix(spawn) -> None:
    proc = spawn("--scenario", "b300-v0523", "--cuda-graph-max-bs", "128")
    assert proc.wait_exit(WAIT) == 2
    assert proc.stderr[-1] == (
        "launch_server.py: error: ambiguous option: --cuda-graph-max-bs could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
    )


def test_known_flags_accepts_unique_abbreviation(spawn) -> None:
    port = free_port()
    proc = spawn("--scenario", "rtx6000", "--model", "/m", "--port", str(port), "--time-scale", "0")
    assert proc.wait_healthy(port, WAIT)
    assert "server_args=ServerArgs(model_path='/m'" in proc.out


def test_without_known_flags_any_flag_is_accepted(spawn, zoo: Path) -> None:
    port = free_port()
    proc = spawn(
        "--scenario",
        str(zoo),
        "--port",
        str(port),
        "--whatever-flag",
        "x",
        "--some-switch",
        "--time-scale",
        "0",
    )
    assert proc.wait_healthy(port, WAIT)
    helped = spawn("--scenario", str(zoo), "--help")
    assert helped.wait_exit(WAIT) == 0
    assert "any --flag [VALUE ...] is accepted" in helped.out


# ---------------------------------------------------------------------------- signals


def test_sigterm_while_serving_drains_and_answers_503(spawn, zoo: Path) -> None:
    port = free_port()
    proc = spawn("--scenario", str(zoo), "--port", str(port), "--time-scale", SCALE)
    assert proc.wait_healthy(port, WAIT)
    result: list[int] = []
    # 800 tokens at 1000 tok/s: still running when SIGTERM arrives
    worker = threading.Thread(target=lambda: result.append(_generate(port, 800)))
    worker.start()
    time.sleep(0.2)
    proc.terminate()
    assert proc.wait_for_line("INFO:     Shutting down", WAIT)
    assert http_get(port, "/health") == 503
    worker.join(WAIT)
    assert result == [200]
    assert proc.wait_exit(WAIT) == 0


def test_sigterm_during_startup_exits_0(spawn, zoo: Path) -> None:
    proc = spawn("--scenario", str(zoo), "--port", str(free_port()), "--time-scale", "0.2")
    assert proc.wait_for_line("Load weight begin.", WAIT)  # load_weights lasts 0.8 s
    proc.terminate()
    assert proc.wait_exit(WAIT) == 0


# ---------------------------------------------------------------------------- errors


def test_bad_scenario_is_one_line_exit_2(spawn, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("faults:\n  - when: {ep-size: 8}\n    phase: init\n    eror: boom\n")
    proc = spawn("--scenario", str(bad))
    assert proc.wait_exit(WAIT) == 2
    assert len(proc.stderr) == 1
    line = proc.stderr[0]
    assert str(bad) in line and "faults[0].eror: unknown key (did you mean 'error'?)" in line
    assert "Traceback" not in line
    missing = spawn("--scenario", "no-such-scenario")
    assert missing.wait_exit(WAIT) == 2
    assert len(missing.stderr) == 1 and "no scenario named 'no-such-scenario'" in missing.err


def test_missing_scenario_and_bad_values_exit_2(spawn, zoo: Path) -> None:
    none = spawn("--port", "1234")
    bad_port = spawn("--scenario", str(zoo), "--port", "http")
    bad_scale = spawn("--scenario", str(zoo), "--time-scale", "fast")
    for proc, text in (
        (none, "the following arguments are required: --scenario"),
        (bad_port, "argument --port: invalid int value: 'http'"),
        (bad_scale, "--time-scale: expected a non-negative number"),
    ):
        assert proc.wait_exit(WAIT) == 2
        assert text in proc.stderr[-1]


def test_port_in_use_fails_at_bind(spawn, zoo: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = spawn("--scenario", str(zoo), "--port", str(port), "--time-scale", "0")
        assert proc.wait_exit(WAIT) == 1
    assert f"error while attempting to bind on address ('127.0.0.1', {port})" in proc.out


def test_runs_on_system_python_with_only_pyyaml() -> None:
    python = shutil.which("python3", path="/usr/bin")
    if python is None:
        pytest.skip("no /usr/bin/python3 on this machine")
    if subprocess.run([python, "-c", "import yaml"], capture_output=True).returncode != 0:
        pytest.skip("/usr/bin/python3 has no PyYAML (Debian: apt-get install python3-yaml)")
    port = free_port()
    proc = LabProcess.server(
        ["--scenario", "glm5", "--port", str(port), "--time-scale", "0"], python=python
    ).start()
    try:
        assert proc.wait_healthy(port, WAIT), proc.err
    finally:
        proc.stop()
    # the server's modules import nothing outside the standard library and yaml
    code = (
        "import sys, orchestrator.lab.server, orchestrator.lab.bench; "
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('pydantic', 'rich', 'fabric', 'paramiko', 'tenacity') "
        "or (m.startswith('orchestrator.') and not m.startswith('orchestrator.lab'))]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [python, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        timeout=WAIT,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------------------- shipped pairs


@pytest.mark.parametrize(
    ("experiment", "code", "text"),
    [
        ("b300/good.yaml", None, READY),
        ("k26-dp-ep/bad.yaml", None, READY),  # it answers wrong, but serves
        ("crash-wrong/bad.yaml", 1, "RuntimeError: CUDA error: misaligned address"),
        ("b300/bad.yaml", 1, "CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmStrided"),
        ("b300/ep8_only.yaml", 1, "AttributeError: 'NoneType' object has no attribute 'dtype'"),
        ("rtx6000/bad.yaml", 1, "AssertionError"),
        ("b300-v0523/seed_good.yaml", 2, "error: ambiguous option: --cuda-graph-max-bs could"),
    ],
)
def test_shipped_experiments_launch_as_documented(
    spawn, experiment: str, code: int | None, text: str
) -> None:
    from orchestrator.config.loading import load_experiment

    exp = load_experiment(REPO / "experiments" / "lab" / experiment)
    argv = exp.argv()
    assert argv[:3] == ["python3", "-m", "orchestrator.lab.server"]
    port = free_port()
    words = [w if w != str(exp.port) else str(port) for w in argv[3:]]
    proc = spawn(*words, "--time-scale", "0", env=exp.env_map())
    if code is None:
        assert proc.wait_healthy(port, WAIT), proc.out
    else:
        assert proc.wait_exit(WAIT) == code
    assert text in (proc.out + proc.err)
