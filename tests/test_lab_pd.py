"""The lab's prefill/decode split as real processes: the router (`orchestrator.lab.pd`) in
front of a prefill and a decode lab server on 127.0.0.1, each launched as its role of the
lab pair `experiments/lab/pd-page-size` says. Every wait is bounded; every process is
stopped in teardown."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.config import load_experiment
from orchestrator.config.experiment import Experiment
from tests.hosts.procs import LabProcess, free_port, http_get

pytestmark = pytest.mark.slow

PD = Path(__file__).resolve().parents[1] / "experiments" / "lab" / "pd-page-size"
START = 30.0  # seconds a lab server at time scale 0.05 may take to answer /health
HANG = 3.0  # seconds a request may take before the test calls it hung


def start(spawn: Callable[..., LabProcess], exp: Experiment) -> tuple[int, list[LabProcess]]:
    """Every role of `exp` as its launch says, on free ports; the router's port."""
    ports = {p: free_port() for p in (30000, 30001, 30002)}
    procs = []
    dep = exp.deployment()
    for name in dep.start_order:
        argv = exp.role_launch(name).argv()
        assert argv[:2] == ["python3", "-m"] and argv[2].startswith("orchestrator.lab.")
        words = argv[3:]
        for old, new in ports.items():
            words = [w.replace(str(old), str(new)) for w in words]
        if argv[2] == "orchestrator.lab.server":
            words += ["--time-scale", "0.05"]
        procs.append(spawn(*words, module=argv[2].rsplit(".", 1)[1]))
    router = ports[30000]
    assert procs[0].wait_healthy(router, START), procs[0].out
    return router, procs


def complete(port: int, timeout: float) -> dict:
    body = json.dumps({"model": "m", "prompt": "the capital of France is", "max_tokens": 4})
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def test_matched_page_sizes_serve_through_the_router(spawn) -> None:
    router, procs = start(spawn, load_experiment(PD / "good.yaml"))
    answer = complete(router, timeout=20.0)
    assert answer["choices"][0]["text"].split()  # decode's words
    assert any("POST /v1/completions" in line for line in procs[2].stdout)  # decode served it
    assert http_get(router, "/health") == 200


def test_a_decode_page_size_of_its_own_hangs_every_request_while_health_is_200(spawn) -> None:
    router, procs = start(spawn, load_experiment(PD / "bad-start.yaml"))
    for _ in range(2):  # every request, not the first only
        with pytest.raises((TimeoutError, socket.timeout, urllib.error.URLError)):
            complete(router, timeout=HANG)
        assert http_get(router, "/health") == 200
    assert procs[0].wait_for_line("prefill page_size 16, decode page_size 64", 5.0)
    # a stop ends the router at once, hung requests and all
    procs[0].terminate()
    assert procs[0].wait_exit(10.0) == 0


def test_a_kv_cache_dtype_of_its_own_answers_wrong(spawn, tmp_path: Path) -> None:
    good_router, _ = start(spawn, load_experiment(PD / "good.yaml"))
    right = complete(good_router, timeout=20.0)["choices"][0]["text"]
    (tmp_path / "good.yaml").write_text((PD / "good.yaml").read_text())
    (tmp_path / "dtype.yaml").write_text(
        "name: dtype\nextends: good.yaml\nmismatched_roles: start\n"
        "roles: {decode: {flags: {kv-cache-dtype: fp8_e4m3}}}\n"
    )
    router, _ = start(spawn, load_experiment(tmp_path / "dtype.yaml"))
    wrong = complete(router, timeout=20.0)["choices"][0]["text"]
    assert wrong != right and len(wrong.split()) == len(right.split())


def test_health_is_503_until_both_workers_answer(spawn) -> None:
    port, dead = free_port(), free_port()
    url = f"http://127.0.0.1:{dead}"
    args = ["--port", str(port), "--prefill", url, "--decode", url, "--worker-timeout", "1"]
    router = spawn(*args, module="pd")
    assert router.wait_for_line("[PD] router on", 10.0), router.err
    assert http_get(port, "/health", timeout=5.0) == 503
