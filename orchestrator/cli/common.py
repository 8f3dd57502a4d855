"""Options and helpers shared by the commands that touch hosts or results."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from orchestrator.cli.output import err_console
from orchestrator.config.hosts import Host, Inventory, load_inventory
from orchestrator.errors import (
    CampaignRef,
    ConfigError,
    InfraError,
    Interrupted,
    OrchestratorError,
    UsageError,
)
from orchestrator.events import Listener
from orchestrator.store.store import CampaignRow, Store

if TYPE_CHECKING:  # the executor's imports are heavy: only the commands that run load them
    from orchestrator.campaign.core import ExecutorFactory, HostTrouble
    from orchestrator.execution.contract import HostExecutor

T = TypeVar("T")

#: the environment variable that tells a detached command (`--detach`) where its output goes
LOG_ENV = "ORCH_DETACHED_LOG"


def add_hosts_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--hosts",
        default=os.environ.get("ORCH_HOSTS"),
        help="hosts file (default: hosts.yaml, else hosts.example.yaml; or ORCH_HOSTS)",
    )


def add_results_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--results",
        default=os.environ.get("ORCH_RESULTS", "results"),
        help="results directory (default: results/; or ORCH_RESULTS)",
    )


def inventory(args: argparse.Namespace) -> Inventory:
    """The hosts file the command line names (--hosts, ORCH_HOSTS), else hosts.yaml, else
    hosts.example.yaml: that fallback is said once. The file read is kept on `args`
    (`hosts_file`), so that every host error can name it (see `with_hosts_file`)."""
    path = args.hosts
    if path is None:
        if Path("hosts.yaml").exists():
            path = "hosts.yaml"
        elif Path("hosts.example.yaml").exists():
            path = "hosts.example.yaml"
            if getattr(args, "hosts_file", None) is None:
                note(
                    "note: no hosts.yaml here and no --hosts: using the example hosts file, "
                    f"{Path(path).resolve()} (pass --hosts FILE or set ORCH_HOSTS)"
                )
        else:
            raise UsageError(
                "no hosts file: hosts.yaml not found here",
                hint="copy hosts.example.yaml to hosts.yaml and edit it, or pass --hosts FILE",
            )
    args.hosts_file = str(Path(path).resolve())
    inv = load_inventory(path)
    # noted on the campaigns this command runs: `rerun` finds the same hosts by it
    s = getattr(args, "store_", None)
    if s is not None:
        s.controller_note["hosts_file"] = args.hosts_file
    return inv


def recorded_hosts(args: argparse.Namespace, camp: CampaignRow) -> None:
    """Without --hosts (or ORCH_HOSTS), use the hosts file the campaign was run with, when
    it is still there: a host's name in another file may be another machine. Said once."""
    if getattr(args, "hosts", None):
        return
    path = (camp.controller or {}).get("hosts_file")
    if not isinstance(path, str):  # recorded before the file was noted: its command line
        try:
            words = shlex.split(camp.command)
        except ValueError:
            words = []
        given = [w.split("=", 1)[1] for w in words if w.startswith("--hosts=")] + [
            words[i + 1] for i, w in enumerate(words[:-1]) if w == "--hosts"
        ]
        path = given[-1] if given and Path(given[-1]).is_absolute() else None
    if isinstance(path, str) and Path(path).is_file():
        args.hosts = path
        note(
            f"note: hosts from {path}, the hosts file campaign {camp.id} ran with "
            "(pass --hosts FILE for another)"
        )


def with_hosts_file(args: argparse.Namespace, exc: OrchestratorError) -> str:
    """An error's message; for host trouble (exit 3: connection, host key, lock, unit,
    scheduler) with the hosts file the host came from, unless it names it already."""
    message = str(exc)
    hosts_file = getattr(args, "hosts_file", None)
    if hosts_file and isinstance(exc, InfraError) and hosts_file not in message:
        message += f" (host from {hosts_file})"
    return message


def hosts_for(args: argparse.Namespace, name: str) -> list[Host]:
    inv = inventory(args)
    hosts = inv.resolve(name)
    if getattr(args, "accept_new_host_key", False):
        pass  # handled by the executor factory
    return hosts


def store(args: argparse.Namespace, *, readonly: bool = False, create: bool = True) -> Store:
    """The results store; `readonly` for commands that only read (nothing is created, and a
    read-only results directory works); `create=False` for those that write only to what
    is recorded there (nothing is created either). A detached command notes its log on the
    campaigns it runs (for `runs --follow`); the store is kept on `args` so that the
    command's exit code can be recorded on them (`record_exit`). A results directory made
    now is said once, with where it is."""
    s = Store(args.results, readonly=readonly, create=create)
    if s.created:
        note(
            f"note: a new results directory: {s.root.resolve()} (--results DIR or "
            "ORCH_RESULTS chooses another)"
        )
    if not readonly:
        if os.environ.get(LOG_ENV):
            s.controller_note["log"] = os.environ[LOG_ENV]
        if getattr(args, "hosts_file", None):  # read before the store was opened
            s.controller_note["hosts_file"] = args.hosts_file
        args.store_ = s
    return s


def record_exit(args: argparse.Namespace, code: int) -> None:
    """Note the command's exit code on the campaigns it ran (`runs --follow` exits with it)."""
    s = getattr(args, "store_", None)
    if s is None:
        return
    for cid in s.controlled:
        try:
            ctl = s.campaign(cid).controller or {}
            s.update_campaign(cid, controller=ctl | {"exit_code": code})
        except OrchestratorError:
            pass  # the store went away: nothing to note it in


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of 1 or more, got {value}")
    return value


def command_line() -> str:
    return shlex.join(["orchestrator", *sys.argv[1:]])


def deployment_setup(args: argparse.Namespace, hosts: list[Host], *exps: object) -> None:
    """Check a deployment's configs against the hosts file before anything runs: every
    role's `host:` must be a host of it (a clear error naming the role's key otherwise),
    good's and bad's roles must sit on the same hosts and units, and a pool of several
    hosts takes only roles that name no host (each host then runs a whole deployment).
    Notes every host of the deployment on `args` (`deployment_hosts`): the restore lines
    of an interrupt name each."""
    from orchestrator.execution.deployment import deployment_hosts, same_layout, sites

    roled = [e for e in exps if getattr(e, "roles", ())]
    if not roled:
        return
    same_layout({getattr(e, "source", "") or getattr(e, "name", "?"): e for e in exps})  # type: ignore[misc]
    inv = inventory(args)
    for exp in roled:
        for host in hosts:
            sites(exp, host, inv)  # type: ignore[arg-type]
    if len(hosts) > 1:
        fixed = [r.name for r in roled[0].roles if r.host is not None]  # type: ignore[attr-defined]
        if fixed:
            raise ConfigError(
                f"{'roles' if len(fixed) > 1 else 'role'} {', '.join(fixed)} "
                f"{'name their hosts' if len(fixed) > 1 else 'names its host'}: the "
                f"deployment cannot run on each host of the pool '{args.host}' at once",
                file=getattr(roled[0], "source", None),
                key=f"roles.{fixed[0]}.host",
                hint="give one host with --host (the roles without a host: run there), or "
                "drop the roles' host: to run a whole deployment on each host of the pool",
            )
    args.deployment_exps = exps
    args.deployment_hosts = []
    for host in hosts:
        for name in deployment_hosts(roled, host, inv):  # type: ignore[arg-type]
            if name not in args.deployment_hosts:
                args.deployment_hosts.append(name)


def note(message: str) -> None:
    err_console().print(message, highlight=False)


def resume_options(args: argparse.Namespace) -> str:
    """The options a resume command must repeat to find the same hosts and results."""
    out = ""
    # absolute: the command is pasted later, often from another directory
    if getattr(args, "hosts", None):
        out += " --hosts " + shlex.quote(os.path.abspath(args.hosts))
    return out + results_option(args, absolute=True)


def results_option(args: argparse.Namespace, *, absolute: bool = False) -> str:
    """`--results DIR` when the command line chose another results directory (the only
    option a command that reads the results, `runs`, `show`, needs repeated); `absolute`:
    always, as an absolute path (a command to run from anywhere)."""
    chosen = getattr(args, "results", "results")
    if absolute and chosen is not None:
        return " --results " + shlex.quote(os.path.abspath(str(chosen)))
    if chosen not in (None, "results"):
        return " --results " + shlex.quote(str(chosen))
    return ""


def resume_command(args: argparse.Namespace, campaign: CampaignRef) -> str:
    """The command that resumes `campaign`, with the options that find its hosts and results."""
    return f"orchestrator {campaign.kind} --resume {campaign.campaign_id}{resume_options(args)}"


def executor_factory(args: argparse.Namespace) -> ExecutorFactory:
    """Executors as the command line asks (`--accept-new-host-key`); for the configs
    `deployment_setup` noted (`roles:`, good's first), a deployment's executor: one
    member executor per role, on the role's host of the hosts file, variants whose roles
    disagree started only when either config says `mismatched_roles: start`."""
    from orchestrator.execution.backends import executor_for

    def member(host: Host, **kwargs: object) -> HostExecutor:
        return executor_for(
            host, accept_new_host_key=getattr(args, "accept_new_host_key", False), **kwargs
        )

    exps = getattr(args, "deployment_exps", ())
    roled = [e for e in exps if getattr(e, "roles", ())]
    if roled:
        from orchestrator.config.deployment import starts_anyway
        from orchestrator.execution.deployment import deployment_factory

        return deployment_factory(
            member,
            roled[0],  # type: ignore[arg-type]
            inventory(args),
            start_mismatched=starts_anyway(*exps),
        )

    def make(host: Host, service: str, campaign: str, listener: Listener) -> HostExecutor:
        return member(host, service=service, campaign=campaign, listener=listener)

    return make


def live_view(args: argparse.Namespace) -> Callable[..., None]:
    """Progress on the terminal; nothing with --json (stdout is one JSON document)."""
    from orchestrator.cli.live import LiveView
    from orchestrator.cli.output import console

    return LiveView(console(), verbose=args.verbose) if not args.json else (lambda e: None)


def restore_command(args: argparse.Namespace, host: str) -> str:
    """The command that finishes the restore of `host`."""
    hosts = getattr(args, "hosts", None)
    return f"orchestrator restore --host {host}" + (
        f" --hosts {shlex.quote(os.path.abspath(hosts))}" if hosts else ""
    )


def restore_lines(
    args: argparse.Namespace,
    left: dict[str, list[str] | None] | None,
) -> tuple[bool, list[str]]:
    """(whether every host was read back as found, the lines that say so): a host is called
    restored only when the host itself, read back after the restore, showed nothing of ours
    (no drop-in, the unit in the state it was found in, no server, no lock). Otherwise: what
    is left and the command that finishes it."""
    if left is None:  # the interrupt cut the campaign's own handling short
        host = getattr(args, "host", None)
        every = getattr(args, "deployment_hosts", None) or ([host] if host else [])
        return False, [
            "the hosts were not read back after the restore; finish it with: "
            + (
                "; ".join(restore_command(args, h) for h in every)
                if every
                else "orchestrator restore --host HOST (for each host of the campaign)"
            )
        ]
    if not left:
        return True, ["no host had been changed"]
    bad = {h: what for h, what in left.items() if what is None or what}
    if not bad:
        which = "the hosts were" if len(left) > 1 else "the host was"
        return True, [f"{which} restored (read back: as found): {', '.join(left)}"]
    lines = []
    for h, what in left.items():
        if h not in bad:
            lines.append(f"{h}: restored (read back: as found)")
        elif what is None:
            lines.append(
                f"{h}: NOT restored: the restore was abandoned or the host could not "
                f"be read back; finish it with: {restore_command(args, h)}"
            )
        else:
            lines.append(
                f"{h}: NOT restored: {'; '.join(what)}; finish it with: {restore_command(args, h)}"
            )
    return False, lines


def run_campaign(
    run: Callable[[], T], view: Callable[..., None], noun: str, args: argparse.Namespace
) -> T | None:
    """Run a campaign with SIGTERM and SIGHUP treated like Ctrl-C (see cli.signals). On
    either, the core restores the hosts, reads them back and raises `Interrupted`: print
    what the hosts showed and the resume command, and return None (exit 130). An error
    that stopped a resumable campaign gets the resume command as its hint."""
    try:
        return _interruptible(
            run, view, args, noun=noun, campaign=True, as_json=getattr(args, "json", False)
        )
    except OrchestratorError as exc:
        from orchestrator.campaign.core import HostTrouble  # loaded by the campaign already

        if isinstance(exc, HostTrouble):
            exc.hint = f"check {exc.host} with: {host_check_command(args, exc)}"
        if exc.resumable is not None:
            exc.hint = (
                (exc.hint + "; ") if exc.hint else ""
            ) + f"then resume with: {resume_command(args, exc.resumable)}"
        raise


def host_check_command(args: argparse.Namespace, exc: HostTrouble) -> str:
    """The command that checks the host a campaign lost: a deployment's every host with its
    config (`--experiment`), else the host; with the hosts file the campaign ran with."""
    roled = [e for e in getattr(args, "deployment_exps", ()) if getattr(e, "roles", ())]
    source = getattr(roled[0], "source", None) if roled else None
    what = (
        f"--experiment {shlex.quote(os.path.abspath(source))}"
        if exc.deployment and source and Path(source).is_file()
        else shlex.quote(exc.host or "")
    )
    hosts = getattr(args, "hosts", None)
    return f"orchestrator hosts check {what}" + (
        f" --hosts {shlex.quote(os.path.abspath(hosts))}" if hosts else ""
    )


def run_single(
    run: Callable[[], T],
    view: Callable[..., None],
    *,
    as_json: bool = False,
    args: argparse.Namespace | None = None,
) -> T | None:
    """One recorded run (`run`, `rerun`) with SIGTERM and SIGHUP treated like Ctrl-C: the
    executor restores the host on the way out and reads it back; print what it showed and
    return None (exit 130)."""
    return _interruptible(
        run, view, args or argparse.Namespace(), noun="the run", campaign=False, as_json=as_json
    )


def _interruptible(
    run: Callable[[], T],
    view: Callable[..., None],
    args: argparse.Namespace,
    *,
    noun: str,
    campaign: bool,
    as_json: bool,
) -> T | None:
    """`run` under `Interrupts` (SIGTERM and SIGHUP raise like Ctrl-C); on an interrupt,
    say what the hosts read back showed (never "restored" unless they were), and for a
    campaign the command that resumes it; None then (exit 130). The live view is closed
    either way."""
    from orchestrator.cli.live import LiveView
    from orchestrator.cli.signals import Interrupts

    try:
        with Interrupts():
            return run()
    except (Interrupted, KeyboardInterrupt) as exc:
        if isinstance(view, LiveView):
            view.close()
        _say_interrupted(exc, args, noun=noun, campaign=campaign, as_json=as_json)
        return None
    finally:
        if isinstance(view, LiveView):
            view.close()


def _say_interrupted(
    exc: BaseException, args: argparse.Namespace, *, noun: str, campaign: bool, as_json: bool
) -> None:
    import json

    from rich.markup import escape

    from orchestrator.cli.output import console, stdout_closed

    # the output closed (a pipe's reader gone: that was the interrupt): say it on stderr
    out = err_console() if stdout_closed() else console()
    left = exc.left if isinstance(exc, Interrupted) else None
    restored, lines = restore_lines(args, left)
    # a campaign the core could speak for has an id and a resume command; one cut short
    # before that (a KeyboardInterrupt) has neither
    ref = exc if campaign and isinstance(exc, Interrupted) else None
    subject = f"{noun} {ref.campaign_id}" if ref is not None else noun
    resume = resume_command(args, ref.campaign) if ref is not None else None
    if as_json:
        doc: dict[str, object] = {
            "status": "interrupted",
            "restored": restored,
            "error": f"{subject} {'' if campaign else 'was '}interrupted; " + "; ".join(lines),
            "left": left,
        }
        if ref is not None:
            doc = {"campaign": ref.campaign_id, **doc, "resume": resume}
        out.print_json(json.dumps(doc))
        return
    stopped = f"{subject} stopped." if campaign else f"{noun} was stopped."
    out.print(f"\n[yellow]interrupted[/]: {stopped}", highlight=False)
    for line in lines:
        out.print(escape(line), highlight=False)
    if resume is not None:
        out.print(f"resume with: [bold]{escape(resume)}[/]", highlight=False)
