"""The operator's own unit for a simulated server on a systemd lab host.

The tests' and the benchmarks' systemd hosts install it as the unit a campaign works on:
the lab's environment (the checkout on PYTHONPATH, the lab's time scale), and an
ExecStart of its own that the orchestrator's drop-in replaces for each run (a plain sleep
by default, so "running with its own config" is easy to see). One text, many hosts.
"""

from __future__ import annotations

REPO_IN_CONTAINER = "/opt/orchestrator"  # where the checkout is bound in the lab's rootfs


def lab_unit(
    *,
    exec_start: str = "/bin/sleep infinity",
    time_scale: float | str = 0.1,
    restart: str = "no",
    restart_sec: str | None = None,
) -> str:
    """The unit file text."""
    restart_line = f"Restart={restart}\n" + (f"RestartSec={restart_sec}\n" if restart_sec else "")
    return (
        "[Unit]\n"
        "Description=simulated SGLang server (orchestrator lab)\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"WorkingDirectory={REPO_IN_CONTAINER}\n"
        f"Environment=PYTHONPATH={REPO_IN_CONTAINER} ORCH_LAB_TIME_SCALE={time_scale}\n"
        f"ExecStart={exec_start}\n"
        f"{restart_line}"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )
