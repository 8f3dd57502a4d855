"""A launch that never reached the server is `invalid`, whatever launcher said so.

The launch script's shell (dash, bash), `env` and a job's launcher exit 126 or 127 with
their own words when the server's command cannot run at all: such a start is no verdict
about the config. A server that ran and exited 127 itself keeps its failure.
"""

from __future__ import annotations

import pytest

from orchestrator.diagnosis.classify.judge import (
    LAUNCH_CLASS,
    RunEvidence,
    judge,
    launch_detail,
    launch_failure,
)
from orchestrator.diagnosis.verdicts import Signature, Verdict

TARGET = Signature.from_key("init|untyped|launch.sh: <n>: exec:: not found")


@pytest.mark.parametrize(
    ("log", "code", "said"),
    [
        (
            "/srv/run/launch.sh: 4: exec: /usr/bin/pyhton3: not found\n",
            127,
            "exec: /usr/bin/pyhton3: not found",
        ),
        (
            "launch.sh: line 4: /opt/sglang-0.5.99/bin/python3: No such file or directory\n",
            127,
            "/opt/sglang-0.5.99/bin/python3: No such file or directory",
        ),
        (
            "/srv/run/launch.sh: 4: exec: /opt/srv/bin/python3: Permission denied\n",
            126,
            "exec: /opt/srv/bin/python3: Permission denied",
        ),
        (
            "/usr/bin/env: 'pyhton3': No such file or directory\n",
            127,
            "/usr/bin/env: 'pyhton3': No such file or directory",
        ),
    ],
)
def test_a_command_the_launcher_cannot_run_is_invalid(log: str, code: int, said: str) -> None:
    ev = RunEvidence(log_tail=log, exit_code=code)
    # judged as bad's endpoint (no target yet) and against a target that has its words
    for target in (None, TARGET):
        verdict, sig = judge(ev, target)
        assert verdict is Verdict.INVALID, (log, verdict, sig)
        assert sig == Signature.from_key(f"init|{LAUNCH_CLASS}|{said}")
    assert "never reached the server" in launch_detail(sig, code, "0.5.99")
    assert "build '0.5.99'" in launch_detail(sig, code, "0.5.99")


def test_a_server_that_ran_keeps_its_own_exit() -> None:
    started = (
        "[2026-01-01 10:00:00] server_args=ServerArgs(model_path='/m')\n"
        "[2026-01-01 10:00:01 TP0] Load weight begin. avail mem=78.12 GB\n"
        "sh: 1: nvidia-smi: not found\n"
    )
    ev = RunEvidence(log_tail=started, exit_code=127)
    assert launch_failure(ev) is None
    assert judge(ev, None)[0] is Verdict.FAIL
    # the same words with the server's own exit status (1): a failure of the config
    assert launch_failure(RunEvidence(log_tail="sh: 1: foo: not found\n", exit_code=1)) is None
