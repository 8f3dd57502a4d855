"""Tests of the pure parsers of host command output, on recorded output files."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from orchestrator.config.systemd_quoting import quote_command_line, split_command_line
from orchestrator.execution.facts import (
    FactParseError,
    GpuHolder,
    argv_matches,
    holders_on,
    journal_text,
    parse_busctl_exec,
    parse_environment,
    parse_exec_start,
    parse_gpu_holders,
    parse_help_options,
    parse_journal_cat,
    parse_journal_json,
    parse_show,
    parse_ss_listening,
    port_listeners,
    unit_state,
)
from orchestrator.execution.preflight import check_flags

FACTS = Path(__file__).parent / "data" / "facts"
LOGS = Path(__file__).parent / "data" / "logs"


def read(name: str) -> str:
    return (FACTS / name).read_text(encoding="utf-8")


# --- systemctl show ------------------------------------------------------------------


def test_show_failed_unit_state_and_exec() -> None:
    props = parse_show(read("systemctl_show_failed.txt"))
    state = unit_state(props)
    assert state.active_state == "failed" and state.result == "exit-code"
    assert state.failed and not state.running
    assert state.exit_code == 1 and state.exit_signal is None
    assert state.invocation_id == "6b0f1c4a2e8d4f7c9a3b5d1e0f2a4c6e"
    (cmd,) = parse_exec_start(props["ExecStart"])
    assert cmd.path == "/opt/sglang/bin/python"
    assert cmd.argv[:3] == ("/opt/sglang/bin/python", "-m", "sglang.launch_server")
    assert "--enable-nccl-nvls" in cmd.argv
    assert cmd.code == "exited" and cmd.status == "1" and cmd.pid == 48211
    assert parse_environment(props["Environment"]) == {
        "NCCL_DEBUG": "WARN",
        "SGLANG_EXTRA": "a b",
        "PYTHONUNBUFFERED": "1",
    }


def test_show_running_and_killed_and_oom() -> None:
    running = unit_state(parse_show(read("systemctl_show_running.txt")))
    assert running.running and not running.failed and running.main_pid == 49002
    killed = unit_state(parse_show(read("systemctl_show_killed.txt")))
    assert killed.exit_signal == "SIGKILL" and killed.exit_code is None and killed.failed
    oom = unit_state(parse_show(read("systemctl_show_oom.txt")))
    assert oom.result == "oom-kill" and oom.exit_signal == "SIGKILL"


def test_show_a_process_systemd_could_not_set_up() -> None:
    # systemd's child exits 219/CGROUP before the server's command runs: systemd's status
    cgroup = unit_state(parse_show(read("systemctl_show_cgroup.txt")))
    assert cgroup.setup_failure == "219/CGROUP" and cgroup.exit_signal is None
    assert cgroup.exit_code == 219 and cgroup.failed
    # a server's own exit status, even a high one, is the server's
    assert unit_state(parse_show(read("systemctl_show_failed.txt"))).setup_failure is None
    killed = unit_state(parse_show(read("systemctl_show_killed.txt")))
    assert killed.setup_failure is None  # 9 as a signal is no setup status


def test_show_rejects_garbage() -> None:
    with pytest.raises(FactParseError):
        parse_show("Failed to connect to bus: No such file or directory")
    with pytest.raises(FactParseError):
        parse_exec_start("{ path=/x ; nonsense }")


INTENDED = [
    "/usr/bin/python3",
    "-m",
    "lab.server",
    "--served-model-name",
    "my model",
    "--chat-template",
    '{"a": "$HOME"}',
    ";",
    "--note",
    "back\\slash",
    "--name",
    "Kimi-K2.6-ß",
]


def test_exec_quoted_rendering_round_trips() -> None:
    (cmd,) = parse_exec_start(parse_show(read("systemctl_show_exec_quoted.txt"))["ExecStart"])
    # the record's argv contains " ; " inside a value: the tail-anchored match keeps it whole
    assert list(cmd.argv) == INTENDED
    assert argv_matches(INTENDED, cmd)
    assert not argv_matches([*INTENDED[:-1], "other"], cmd)
    assert quote_command_line(INTENDED) == cmd.argv_text


def test_exec_plain_join_rendering_matches_by_join() -> None:
    # systemd v252's systemctl joins argv with plain spaces; compare the join, not a split
    record = (
        "{ path=/usr/bin/python3 ; argv[]=" + " ".join(INTENDED) + " ; ignore_errors=no ; "
        "start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }"
    )
    (cmd,) = parse_exec_start(record)
    assert argv_matches(INTENDED, cmd)
    assert not argv_matches(INTENDED[:-1], cmd)


def test_exec_ex_flags() -> None:
    (cmd,) = parse_exec_start(parse_show(read("systemctl_show_exec_ex.txt"))["ExecStartEx"])
    assert cmd.flags == ("ignore-failure",) and cmd.argv[-1] == "30000"


@pytest.mark.parametrize(
    "value",
    ["plain", "with space", 'q"uote', "$VAR", "a;b", "back\\slash", "tab\there", "ünï ß", ""],
)
def test_quote_split_round_trip(value: str) -> None:
    argv = ["/bin/x", value, "--y"]
    if value == "":
        return  # systemd prints an empty element as nothing: not recoverable, not used
    assert split_command_line(quote_command_line(argv)) == argv


def test_busctl_exact_argv() -> None:
    ((path, argv),) = parse_busctl_exec(read("busctl_execstart.json"))
    assert path == "/usr/bin/python3"
    assert list(argv) == INTENDED[:10]
    with pytest.raises(FactParseError):
        parse_busctl_exec("Failed to get property")


def test_environment_unprintable_is_refused() -> None:
    with pytest.raises(FactParseError):
        parse_environment("A=1 [unprintable]")


# --- journalctl ----------------------------------------------------------------------


def test_journal_json() -> None:
    entries = parse_journal_json(read("journal.json"))
    assert len(entries) == 3
    assert "Capture cuda graph begin." in entries[0].message
    assert entries[0].invocation_id == "6b0f1c4a2e8d4f7c9a3b5d1e0f2a4c6e"
    assert entries[0].pid == 48211 and entries[0].realtime_us == 1749564131000123
    assert entries[1].message == "[TP0] \ufffdok"  # non-UTF-8 bytes arrive as a byte array
    assert entries[2].message == ""
    assert journal_text(entries).count("\n") == 3
    with pytest.raises(FactParseError):
        parse_journal_json("not json")


def test_journal_cat() -> None:
    assert len(parse_journal_cat(read("journal_cat.txt"))) == 2
    assert parse_journal_cat(read("journal_cat_empty.txt")) == []


# --- ss ------------------------------------------------------------------------------


def test_ss_listeners() -> None:
    sockets = parse_ss_listening(read("ss_ltnpH.txt"))
    (ours,) = port_listeners(sockets, 30000)
    assert ours.address == "0.0.0.0" and ours.pids == (48211, 48212)
    assert ours.processes[0] == ("python3", 48211)
    assert [s.address for s in port_listeners(sockets, 22)] == ["0.0.0.0", "::"]
    (resolver,) = port_listeners(sockets, 53)
    assert resolver.address == "127.0.0.53"
    (vllm,) = port_listeners(sockets, 8000)
    assert vllm.processes == (("vllm serve", 9001),)
    (anon,) = port_listeners(sockets, 8080)
    assert anon.processes == () and anon.address == "*"
    assert port_listeners(sockets, 31000) == []


# --- argparse --help -----------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    """The parser that printed help_sglang_like.txt (same calls, same order)."""

    class Raising(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            raise ValueError(message)

    p = Raising(prog="launch_server.py")
    p.add_argument("--model-path", "--model")
    p.add_argument("--tokenizer-mode", choices=["auto", "slow"])
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int)
    p.add_argument("--ep-size", "--expert-parallel-size", type=int)
    p.add_argument("--enable-nccl-nvls", action="store_true")
    p.add_argument("--cuda-graph-max-bs-decode", type=int)
    p.add_argument("--cuda-graph-max-bs-prefill", type=int)
    p.add_argument("--cuda-graph-bs", type=int, nargs="+")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--lora-paths", nargs="*")
    p.add_argument("--moe-a2a-backend", choices=["none", "deepep", "flashinfer"])
    p.add_argument("--port", type=int)
    return p


def test_help_options_parsed() -> None:
    opts = parse_help_options(read("help_sglang_like.txt"))
    assert set(opts) == {
        o
        for o in _parser()._option_string_actions
        if o.startswith("--")  # noqa: SLF001
    }
    assert "--model-path-old" not in opts  # named in help prose only


def test_help_options_from_recorded_sglang_usage() -> None:
    opts = parse_help_options((LOGS / "sglang_argparse_unrecognized_usage.log").read_text())
    assert {"--model-path", "--kv-cache-dtype", "--device", "--skip-tokenizer-init"} <= set(opts)
    assert "--enable-reasoning" not in opts


def test_check_flags_cuda_graph_max_bs_is_ambiguous() -> None:
    opts = parse_help_options(read("help_sglang_like.txt"))
    (problem,) = check_flags(["--cuda-graph-max-bs"], opts)
    assert problem.kind == "ambiguous" and problem.fatal
    assert problem.message == (
        "ambiguous option: --cuda-graph-max-bs could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
    )


def test_check_flags_kinds() -> None:
    opts = parse_help_options(read("help_sglang_like.txt"))
    assert check_flags(["--tp-size", "ep-size", "--port=30000"], opts) == []
    (abbrev,) = check_flags(["--enable-nccl"], opts)
    assert abbrev.kind == "abbreviation" and not abbrev.fatal
    assert abbrev.candidates == ("--enable-nccl-nvls",)
    (unknown,) = check_flags(["--mem-fraction-statc"], opts)
    assert unknown.kind == "unrecognized"
    assert unknown.message == "unrecognized arguments: --mem-fraction-statc"
    assert unknown.candidates[0] == "--mem-fraction-static"


@pytest.mark.parametrize(
    "flag",
    [
        "--cuda-graph-max-bs",
        "--cuda-graph",
        "--mo",
        "--m",
        "--tp",
        "--enable-nccl",
        "--mem-fraction-statc",
        "--reasoning-parser",
        "--cuda-graph-max-bs=512",
        "--ep-size",
    ],
)
def test_check_flags_agrees_with_argparse(flag: str) -> None:
    """Differential: our decision and wording equal the real argparse's."""
    opts = parse_help_options(read("help_sglang_like.txt"))
    argv = [flag] if "=" in flag or flag == "--enable-nccl" else [flag, "1"]
    try:
        _, extras = _parser().parse_known_args(argv)
        argparse_error = f"unrecognized arguments: {flag}" if extras else None
    except ValueError as exc:
        argparse_error = str(exc)
    fatal = [p for p in check_flags([flag], opts) if p.fatal]
    if argparse_error is None:
        assert fatal == []
    else:
        assert [p.message for p in fatal] == [argparse_error]


# --- nvidia-smi: who holds GPU memory ------------------------------------------------------


def test_gpu_holders_by_index_with_odd_names_and_unknown_memory() -> None:
    got = parse_gpu_holders(read("gpu_holders.txt"))
    assert got == [
        GpuHolder(1, "GPU-7f8e9d0c-1111-2222-3333-444455556666", 31337, "/usr/bin/python3", 80512),
        GpuHolder(
            3,
            "GPU-9a8b7c6d-1111-2222-3333-444455556666",
            4021,
            "ray::RayWorkerWrapper, with, comma",
            1024,
        ),
        GpuHolder(None, "GPU-deadbeef-1111-2222-3333-444455556666", 77, "python", None),
    ]
    assert got[0].describe() == "GPU 1: 80512 MiB held by pid 31337 (/usr/bin/python3)"
    assert got[2].describe().startswith("GPU-deadbeef-1111-2222-3333-444455556666: memory held")
    assert parse_gpu_holders("0, GPU-a\n@@APPS\n") == []
    assert parse_gpu_holders("") == []


def test_gpu_holders_on_the_gpus_a_server_uses() -> None:
    got = parse_gpu_holders(read("gpu_holders.txt"))
    assert holders_on(got, None) == got  # unset: every GPU
    assert [h.pid for h in holders_on(got, "0,1")] == [31337]
    assert [h.pid for h in holders_on(got, " 2 ")] == []
    assert [h.pid for h in holders_on(got, "GPU-9a8b7c6d")] == [4021]  # a uuid's prefix
    assert holders_on(got, "MIG-1234") == got  # not an index or a GPU uuid: all count
    assert holders_on(got, "") == []  # no GPU at all
    mps = GpuHolder(0, "GPU-0a1b2c3d", 900, "/usr/bin/nvidia-cuda-mps-server", 30)
    assert holders_on([mps, *got], "0,1") == [got[0]]  # MPS serves the servers: not another's
