"""The executor's contract, shared by every backend: what a run gives back, how a run is
abandoned, and `HostExecutor`, the base of the executors a campaign drives.

`Executor` (orchestrator.execution.executor: SSH or local hosts, systemd or detached
processes) and `SlurmExecutor` (orchestrator.execution.slurm.executor: one job per variant)
both derive from `HostExecutor`; `executor_for` (orchestrator.execution.backends) picks the
one a host's service manager asks for. A campaign sees only the contract: `open()` (lock,
back-up), `run(exp, run_id=...)` -> `RunResult`, `close()` (restore, unlock, `left`),
`cancel_event`, and the checks before a start (`check_build`, `check_flags`,
`check_port`, `prepare_packages`) and the reads (`inputs`, `environment`,
`parser_facts`) that work alike on every backend and live here.
"""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from orchestrator.config import builds, containers
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.errors import ConfigError, InfraError, OrchestratorError, TransportError
from orchestrator.events import Listener, RunFinished, StepDone
from orchestrator.execution import environment as envfacts
from orchestrator.execution import preflight
from orchestrator.execution.helpcache import build_of
from orchestrator.execution.inputs import LaunchInputs, launch_inputs, named_files
from orchestrator.execution.transport import Transport

LOG_TAIL_LINES = 400
#: lines read from the host, of which the tail and the tracebacks above it are kept
#: (orchestrator.diagnosis.logtail): a server's shutdown noise can run to hundreds of lines
LOG_FETCH_LINES = 5000


class RunResultLike(Protocol):
    """What a run's record is made of (`Store.add_run`): a `RunResult`, or a recorded run
    presented as one to record it again in another campaign (a cache hit,
    `orchestrator.campaign.core.CachedResult`)."""

    @property
    def experiment(self) -> Experiment: ...
    @property
    def label(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def host_class(self) -> str: ...
    @property
    def verdict(self) -> Verdict: ...
    @property
    def signature(self) -> Signature | None: ...
    @property
    def started_at(self) -> float: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def phase_times(self) -> tuple[tuple[str, float], ...]: ...
    @property
    def last_phase(self) -> Phase | None: ...
    @property
    def log_tail(self) -> str: ...
    @property
    def rendered(self) -> str | None: ...
    @property
    def probe_metric(self) -> float | None: ...
    @property
    def detail(self) -> str: ...
    @property
    def host_record(self) -> dict[str, object] | None: ...
    @property
    def environment(self) -> envfacts.HostEnvironment | None: ...
    @property
    def inputs(self) -> LaunchInputs | None: ...


class RunCancelled(Exception):  # noqa: N818 (a control-flow signal, not an error)
    """The run was abandoned on request; nothing about the config was learnt."""


@dataclass(frozen=True)
class RunResult:
    """Everything recorded about one run."""

    run_id: str
    host: str
    host_class: str
    experiment: Experiment
    label: str
    verdict: Verdict
    signature: Signature | None
    started_at: float  # epoch seconds
    duration_s: float
    phase_times: tuple[tuple[str, float], ...] = ()  # phase -> seconds after start
    last_phase: Phase | None = None
    log_tail: str = ""
    rendered: str | None = None  # the drop-in / launch script written for this run
    probe_metric: float | None = None
    detail: str = ""
    invocation: str | None = None
    polls: int = 0
    ready_s: float | None = None  # seconds from start to ready
    #: what the run did on the host (systemd: drop-in path, ExecStart read back,
    #: InvocationID, journalctl command), see ServiceManager.host_record
    host_record: dict[str, object] | None = None
    #: the host's environment as the server's interpreter saw it just before the run
    environment: envfacts.HostEnvironment | None = None
    #: what reached the server besides its config (the cache key's other half)
    inputs: LaunchInputs | None = None
    #: what the server answered to the answers check (execution.answers.ask_check), and,
    #: once the campaign judged it against good's, the judgement (`judged`)
    answers: dict[str, Any] | None = None


class HostExecutor:
    """Runs variants on one host. Use as a context manager. A backend sets, in its
    `__init__`, the attributes below, and defines `open`, `close`, `run` and `check_port`
    (and `environment` where the server's interpreter cannot be reached from the host)."""

    host: Host
    service: str
    campaign: str
    emit: Listener
    t: Transport
    preflight: preflight.Preflight
    #: set from another thread to abandon the run in progress: the backend stops it and
    #: raises RunCancelled
    cancel_event: threading.Event
    #: what close() read back as left on the host (None: it could not be read)
    left: list[str] | None
    _inputs_memo: dict[str, LaunchInputs]

    def open(self) -> HostExecutor:
        raise NotImplementedError

    def close(self, *, restore: bool = True) -> list[str]:
        raise NotImplementedError

    def run(
        self,
        exp: Experiment,
        *,
        run_id: str,
        label: str = "",
        target: Signature | None = None,
        env_keys: Iterable[str] = (),
        good_metric: float | None = None,
        ask_twice: bool = False,
    ) -> RunResult:
        raise NotImplementedError

    def check_port(self, exp: Experiment) -> None:
        raise NotImplementedError

    def __enter__(self) -> HostExecutor:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- builds
    def launch_of(self, exp: Experiment) -> Experiment:
        """The config with its build applied on this host (`service.build` and the host's
        `builds:`): the command line that runs. Unchanged when it names no build; a build
        the host lacks is a BuildError naming the hosts-file line to add."""
        out = builds.resolve(
            exp, dict(self.host.builds), host=self.host.name, hosts_file=self.host.hosts_file
        )
        if builds.container_split(out.exec) is not None:
            why = containers.container_problem(out.exec)  # a run recorded before it was
            if why:
                raise ConfigError(why, file=exp.source, key="service.exec")
            # a container's server sees only what the runtime hands it: the config's
            # environment reaches the runtime (drop-in, launch script) and goes on by `-e`;
            # the label finds the container to stop and remove after the run
            words = containers.passing_env(out.exec, list(out.env_map()))
            out = replace(out, exec=containers.labelled(words, self.service))
        if exp.packages and exp.packages_from:
            # the packages taken from another build go first on the server's path: in a
            # container, mounted at the same path and first on the container's PYTHONPATH
            site = self._overlay_site(exp)
            cc = builds.container_split(out.exec)
            if cc is not None:
                image_path = self._image_env(cc).get("PYTHONPATH")
                return replace(out, exec=builds.with_path_first(out.exec, site, image_path))
            rest = dict(out.env).get("PYTHONPATH")
            out = out.with_changes(env={"PYTHONPATH": site + (f":{rest}" if rest else "")})
        return out

    def _overlay_site(self, exp: Experiment) -> str:
        root = self.host.run_dir or builds.OVERLAY_ROOT
        return builds.overlay_dir(root, exp.packages, str(exp.packages_from), self.service)

    def _remove_overlays(self, *, keep: str | None = None) -> list[str]:
        """Remove this service's package overlays (full copies out of an image: gigabytes)
        but `keep`; what was removed, in words. With sudo where the host allows it: files
        copied out of an image by a rootful runtime are root's."""
        d = shlex.quote(builds.overlays_of(self.host.run_dir, self.service))
        spare = f" ! -name {shlex.quote(keep.rsplit('/', 1)[-1])}" if keep else ""
        r = self.t.run(
            f"[ -d {d} ] || exit 0; for o in $(find {d} -mindepth 1 -maxdepth 1{spare}); do "
            f'rm -rf -- "$o" && echo "@@GONE $o"; done; '
            + ("true" if keep else f"rmdir {d} 2>/dev/null; true"),
            timeout=300,
            sudo=True,
        )
        return [
            f"removed the package overlay {line.split(' ', 1)[1]}"
            for line in r.stdout.splitlines()
            if line.startswith("@@GONE ")
        ]

    def _overlays_left(self) -> list[str]:
        """This service's package overlays still on the host, in words."""
        d = shlex.quote(builds.overlays_of(self.host.run_dir, self.service))
        r = self.t.run(f"ls -1A {d} 2>/dev/null; true", timeout=30, sudo=True)
        names = r.stdout.split()
        return [f"package overlays in {d}: {', '.join(names)}"] if names else []

    def _image_env(self, cc: builds.ContainerCommand) -> dict[str, str]:
        """The environment an image sets for its processes (`ENV` of its build), read once
        per image and host; empty when it cannot be read (the run's start will tell)."""
        memo = self.__dict__.setdefault("_image_envs", {})
        if cc.image not in memo:
            cmd = shlex.join(
                [*cc.runtime[:-1], "image", "inspect", "--format", "{{json .Config.Env}}", cc.image]
            )
            res = self.t.run(cmd, timeout=60)
            try:
                items = json.loads(res.stdout.strip().splitlines()[-1]) if res.ok else []
            except (ValueError, IndexError):
                items = []
            memo[cc.image] = dict(str(i).split("=", 1) for i in items or [] if "=" in str(i))
        return memo[cc.image]

    def _python_of(self, exp: Experiment) -> str:
        """The shell words running the Python of a config's build as its server would: the
        prefix's `bin/python`, the exec's interpreter, or `python3` inside its image (with
        the command's environment and mounts); arguments follow."""
        launch = self.launch_of(exp)
        cc = builds.container_split(launch.exec)
        if cc is not None:
            return builds.python_in_image(cc)
        target = (
            builds.target_of(exp.build, dict(self.host.builds), exp.exec) if exp.build else None
        )
        py = shlex.quote(builds.python_of(launch.exec, target))
        if exp.packages and exp.packages_from:
            site = shlex.quote(self._overlay_site(exp))
            py = f"PYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}} {py}"
        return py

    def packages_of(self, exp: Experiment) -> dict[str, str]:
        """The distributions of a config's build, read by its own interpreter on the host
        (inside its image, for a container command)."""
        py = self._python_of(exp)
        res = self.t.run(f"{py} -c {shlex.quote(builds.LIST_SNIPPET)}", timeout=120)
        dists = builds.parse_dists(res.stdout)
        if dists is None:
            raise InfraError(
                f"{self.host.name}: cannot list the distributions of build "
                f"'{exp.build}' with {py}: {res.stderr.strip()[-300:]}"
            )
        return dists

    def prepare_packages(self, exp: Experiment) -> str | None:
        """Lay the overlay of a package variant out on the host (links into the build the
        packages come from; copies out of it when it is an image) and put the result to
        `pip check`: why the variant cannot run (a package missing, a requirement the set
        breaks that good's build alone does not), None when it can."""
        if not exp.packages or not exp.packages_from:
            return None
        site = self._overlay_site(exp)
        # one overlay of this service on the host at a time: the one this run needs
        self._remove_overlays(keep=site)
        self.__dict__["_overlays_made"] = True
        source = replace(exp, build=exp.packages_from, packages=(), packages_from=None)
        wanted = json.dumps(dict(exp.packages))
        cc = builds.container_split(self.launch_of(source).exec)
        if cc is not None:
            # the image's files, copied into the overlay through a writable mount of it
            qsite = shlex.quote(site)
            lay = (
                f"mkdir -p {qsite} && "
                + builds.python_in_image(cc, "-v", f"{site}:{site}")
                + f" -c {shlex.quote(builds.OVERLAY_SNIPPET)} {qsite} {shlex.quote(wanted)} copy"
            )
        else:
            lay = (
                f"{self._python_of(source)} -c {shlex.quote(builds.OVERLAY_SNIPPET)} "
                f"{shlex.quote(site)} {shlex.quote(wanted)}"
            )
        res = self.t.run(lay, timeout=300)
        line = next((ln for ln in res.stdout.splitlines() if ln.startswith("@@OVERLAY ")), None)
        if line is None:
            raise InfraError(
                f"{self.host.name}: cannot lay out the packages from build "
                f"'{exp.packages_from}': {res.stderr.strip()[-300:]}"
            )
        missing = json.loads(line[len("@@OVERLAY ") :])
        if missing:
            return (
                f"build '{exp.packages_from}' does not hold {', '.join(missing)}: "
                "the packages cannot be taken from it"
            )
        base = replace(exp, packages=(), packages_from=None)
        before = self.t.run(f"{self._python_of(base)} -m pip check 2>&1", timeout=120)
        after = self.t.run(f"{self._python_of(exp)} -m pip check 2>&1", timeout=120)
        if "No module named pip" in before.stdout + after.stdout:
            return None  # nothing to check with: the server's start will tell
        # a complaint good's build has already is none of the set's, whatever version of
        # the complaining distribution the set brings ("X 0.29 requires Y" = "X 0.28 ...")
        known = {builds.complaint_key(p) for p in builds.pip_problems(before.stdout)}
        new = [p for p in builds.pip_problems(after.stdout) if builds.complaint_key(p) not in known]
        if new:
            return "pip check refuses this set of packages: " + "; ".join(new[:5])
        return None

    def check_build(self, exp: Experiment) -> None:
        """Refuse, before anything starts, a build this host does not have: its prefix's
        command is no executable file there, or its image is not pulled. Read once per
        build and host."""
        if exp.build is None:
            return
        launch = self.launch_of(exp)
        checked = self.__dict__.setdefault("_builds_checked", set())
        if launch.exec in checked:
            return
        cc = builds.container_split(launch.exec)
        if cc is not None:
            cmd = shlex.join(
                [*cc.runtime[:-1], "image", "inspect", "--format", "{{.Id}}", cc.image]
            )
            what = f"the image {cc.image} is not on the host"
        else:
            cmd = f"test -x {shlex.quote(launch.exec[0])}"
            what = f"{launch.exec[0]} is no executable file there"
        res = self.t.run(cmd, timeout=60)
        if res.exit_code != 0:
            said = f"build '{exp.build}' is not installed on host {self.host.name}: {what}"
            if exp.build not in dict(self.host.builds):
                # named by its own path or image (the config, or --builds): no line of
                # the hosts file's `builds:` to correct
                raise builds.BuildError(
                    said,
                    file=exp.source or None,
                    key="service.build",
                    hint="install it there, or correct the path or image the build is "
                    "given by (service.build, or --builds)",
                )
            raise builds.BuildError(
                said,
                file=self.host.hosts_file or None,
                key=f"hosts.{self.host.name}.builds",
                hint=builds.missing_hint(exp.build, self.host.name, self.host.hosts_file, exp.exec)
                + " (pointing at where the build is installed), or install it there",
            )
        checked.add(launch.exec)

    # ---- preflight
    def accepted_flags(self, exp: Experiment) -> tuple[str, ...] | None:
        """The options the server's own `--help` lists, when that help is trusted to refuse
        flags (None: it is not; see orchestrator.execution.preflight)."""
        exp = self.launch_of(exp)
        entry = self.preflight.help_of(exp)
        return entry.facts.options if entry.trusted else None

    def parser_facts(self, exp: Experiment) -> preflight.HelpFacts | None:
        """What the server's parser takes, as its own help lists it (read once per host and
        server build, see orchestrator.execution.helpcache), when that help is trusted to
        tell; None otherwise. Needs no lock: it only reads."""
        exp = self.launch_of(exp)
        try:
            env: envfacts.HostEnvironment | None = self.environment(exp)
        except (TransportError, InfraError):
            env = None
        entry = self.preflight.help_of(exp, build_of(env))
        return entry.facts if entry.trusted else None

    def check_flags(self, exp: Experiment) -> str | None:
        """Why the server refuses this variant's flags, in its own words, when its own parser
        confirmed it without a start; None otherwise (a prediction is confirmed by the run)."""
        return self.preflight.check(self.launch_of(exp)).refusal

    # ---- one run
    def _finish(
        self,
        exp: Experiment,
        run_id: str,
        label: str,
        verdict: Verdict,
        sig: Signature | None,
        detail: str,
        duration: float,
        **fields: Any,
    ) -> RunResult:
        """Announce the end of a run and make its record: every backend ends a run here,
        with what only it knows in `fields`."""
        env = fields.get("environment")
        if "inputs" not in fields:
            fields["inputs"] = self._inputs(
                env.digest() if env is not None else None, *self._files_read_for(exp)
            )
        self.emit(
            RunFinished(
                host=self.host.name,
                run_id=run_id,
                verdict=verdict,
                signature=sig,
                duration_s=duration,
                detail=detail,
            )
        )
        return RunResult(
            run_id=run_id,
            host=self.host.name,
            host_class=self.host.host_class,
            experiment=exp,
            label=label,
            verdict=verdict,
            signature=sig,
            duration_s=duration,
            detail=detail,
            **fields,
        )

    def _inputs(
        self,
        environment: str | None,
        files: str | None = "",
        named: tuple[tuple[str, str], ...] | None = None,
    ) -> LaunchInputs:
        manager = getattr(self, "manager", None)  # a Slurm job has no unit of the user's
        return launch_inputs(
            self.host,
            unit=manager.unit_inputs() if manager else "",
            environment=environment,
            files=files,
            named=named,
        )

    def _files_read_for(
        self, exp: Experiment
    ) -> tuple[str | None, tuple[tuple[str, str], ...] | None]:
        """The digest of the files the launch of `exp` names, as the last capture of its
        environment read them ("": it names none; None: not read), and each file's own."""
        try:
            launch = self.launch_of(exp)
        except OrchestratorError:
            return None, None
        named = self._named(launch)
        if not named:
            return "", ()
        return self.__dict__.get("_files_read", {}).get(named, (None, None))

    @staticmethod
    def _named(exp: Experiment) -> tuple[str, ...]:
        # a word holding a secret (an API key on the command line) is never a file name:
        # the named files' paths are recorded with the run
        hidden = set(exp.secrets().values())
        argv = [w for w in exp.argv() if not any(h in w for h in hidden)]
        return named_files(argv, envfacts.public_env(exp))

    def inputs(self, exp: Experiment) -> LaunchInputs:
        """What would reach the server of `exp` if it started now, besides its config: read
        on the host (its environment as the server's interpreter sees it, the unit's own
        definition). A part that cannot be read now is unknown (then nothing is reused).
        Read once per capture between two runs (variants of one pair mostly share it);
        every run reads it afresh."""
        memo = self._inputs_memo
        exp = self.launch_of(exp)
        key = self._capture_command(exp)
        if key not in memo:
            try:
                env: str | None = self.environment(exp).digest()
            except (TransportError, InfraError):
                env = None
            files, named = self._files_read_for(exp) if env is not None else (None, None)
            memo[key] = self._inputs(env, files, named)
        return memo[key]

    def _capture_command(self, exp: Experiment) -> str:
        manager = getattr(self, "manager", None)  # a Slurm job's node reads its own
        unit_env, unit_wd = manager.interpreter_context() if manager else ([], None)
        return envfacts.command(
            exp.exec,
            env=[*unit_env, *envfacts.public_env(exp)],
            workdir=exp.workdir or unit_wd,
            files=self._named(exp),
        )

    def environment(self, exp: Experiment) -> envfacts.HostEnvironment:
        """GPUs, driver, CUDA, NCCL, kernel and the server's packages, read on the host with
        the server's own interpreter (one command; what is absent is recorded as absent)."""
        exp = self.launch_of(exp)
        cmd = self._capture_command(exp)
        text = self.t.run(cmd, timeout=60).stdout
        # the files the launch names, read by the same command: part of its cache key
        named = self._named(exp)
        self.__dict__.setdefault("_files_read", {})[named] = (
            envfacts.parse_files(text, named),
            envfacts.parse_file_digests(text, named),
        )
        return envfacts.parse(text)

    def _step(self, step: str, detail: str) -> None:
        self.emit(StepDone(host=self.host.name, step=step, detail=detail))
