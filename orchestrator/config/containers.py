"""Container commands (`docker run ... IMAGE CMD...`, `podman run`) read as the runtime
reads them.

Where the image is in such a command, which of its words are the runtime's options and
which are the server's own argv, what the image runs first (`--entrypoint`, or the entry
point of an image known to be the server's), and what cannot be run as a server's command
(`-d`; an option neither runtime lists, whose value could be the image). Pure; the
importer, the builds (`config.builds`) and config loading read commands with it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

#: container runtimes whose `run` subcommand starts the server inside an image
RUNTIMES = ("docker", "podman", "nerdctl", "nvidia-docker")
#: `docker run` / `podman run` options that take a value as the next word (a long option
#: may also be written `--opt=value`), as the two runtimes' own `run --help` list them
_VALUE_OPTIONS = frozenset(
    """
-a --attach --add-host --annotation --arch --authfile --blkio-weight --blkio-weight-device
--cap-add --cap-drop --cert-dir --cgroup-conf --cgroup-parent --cgroupns --cgroups
--chrootdirs --cidfile --conmon-pidfile --cpu-count --cpu-percent --cpu-period --cpu-quota
--cpu-rt-period --cpu-rt-runtime -c --cpu-shares --cpus --cpuset-cpus --cpuset-mems --creds
--decryption-key --detach-keys --device --device-cgroup-rule --device-read-bps
--device-read-iops --device-write-bps --device-write-iops --dns --dns-opt --dns-option
--dns-search --domainname --entrypoint -e --env --env-file --env-merge --expose --gidmap
--gpus --group-add --group-entry --health-cmd --health-interval --health-log-destination
--health-max-log-count --health-max-log-size --health-on-failure --health-retries
--health-start-interval --health-start-period --health-startup-cmd
--health-startup-interval --health-startup-retries --health-startup-success
--health-startup-timeout --health-timeout -h --hostname --hosts-file --hostuser
--hooks-dir --image-volume --init-path --io-maxbandwidth --io-maxiops --ip --ip6 --ipc
--isolation --kernel-memory -l --label --label-file --link --link-local-ip --log-driver
--log-level --log-opt --mac-address -m --memory --memory-reservation --memory-swap
--memory-swappiness --mount --name --network --net --network-alias --net-alias
--oom-score-adj --os --passwd-entry --personality --pid --pidfile --pids-limit --platform
--pod --pod-id-file --preserve-fd --preserve-fds -p --publish --pull --rdt-class
--requires --restart --retry --retry-delay --runtime --sdnotify --seccomp-policy --secret
--security-opt --shm-size --shm-size-systemd --stop-signal --stop-timeout --storage-opt
--subgidname --subuidname --sysctl --systemd --timeout --tmpfs --tz --uidmap --ulimit
--umask --unsetenv -u --user --userns --uts --variant -v --volume --volume-driver
--volumes-from -w --workdir
""".split()
)
#: their options that take no value (a switch may also be written `--opt=false`)
_SWITCHES = frozenset(
    """
-d --detach --disable-content-trust --env-host --help --http-proxy --init -i --interactive
--no-healthcheck --no-hostname --no-hosts --oom-kill-disable --passwd --privileged -P
--publish-all -q --quiet --read-only --read-only-tmpfs --replace --rm --rmi --rootfs
--sig-proxy --tls-verify -t --tty --unsetenv-all --use-api-socket
""".split()
)
#: the options of docker and podman before their command that take a value
#: (`docker --context gpu run`, `podman --root /srv/c run`)
_GLOBAL_VALUE = frozenset(
    """
--config -c --context -H --host -l --log-level --tlscacert --tlscert --tlskey --cgroup-manager
--conmon --connection --events-backend --hooks-dir --identity --imagestore --module
--network-cmd-path --network-config-dir --root --runroot --runtime --runtime-flag --ssh
--storage-driver --storage-opt --tmpdir --url --volumepath
""".split()
)
#: sudo's options that take a value (`sudo -u svc`)
_SUDO_VALUE = frozenset({"-u", "-g", "-h", "-p", "-C", "-D", "-r", "-t", "-U", "-T"})
#: a short option's long name (what the command line means whichever is written)
_LONG = {
    "-a": "--attach",
    "-c": "--cpu-shares",
    "-d": "--detach",
    "-e": "--env",
    "-h": "--hostname",
    "-i": "--interactive",
    "-l": "--label",
    "-m": "--memory",
    "-P": "--publish-all",
    "-p": "--publish",
    "-q": "--quiet",
    "-t": "--tty",
    "-u": "--user",
    "-v": "--volume",
    "-w": "--workdir",
    "--net": "--network",
    "--net-alias": "--network-alias",
}
#: the entry point of images whose entry point is the server itself: the words after the
#: image are its arguments (`docker run vllm/vllm-openai --model m -tp 8`)
IMAGE_ENTRYPOINTS: dict[str, tuple[str, ...]] = {"vllm/vllm-openai": ("vllm", "serve")}


@dataclass(frozen=True)
class Option:
    """One option of a container command: its long name, the words it takes, its value."""

    name: str  # `--env` for `-e`, `-eX=1`, `--env X=1` and `--env=X=1`
    start: int  # index in the options
    words: int
    value: str | None  # None: a switch
    known: bool = True


def read_options(opts: Sequence[str]) -> list[Option]:
    """The runtime's options as its parser (Go's pflag) reads them: `--opt v`, `--opt=v`,
    a cluster of short switches (`-it`), a short option with its value attached (`-p8000:
    8000`). An option neither table knows is `known=False` (taken as a switch)."""
    out: list[Option] = []
    k = 0
    while k < len(opts):
        w = opts[k]
        if w == "--" or not w.startswith("-"):  # the end of the options
            break
        if w.startswith("--"):
            name, eq, text = w.partition("=")
            if eq:  # `--opt=v`: one word whatever the option is
                out.append(Option(_LONG.get(name, name), k, 1, text))
                k += 1
            elif name in _VALUE_OPTIONS:
                value = opts[k + 1] if k + 1 < len(opts) else None
                out.append(Option(_LONG.get(name, name), k, 2, value))
                k += 2
            else:
                out.append(Option(_LONG.get(name, name), k, 1, None, name in _SWITCHES))
                k += 1
            continue
        step = 1
        for j, c in enumerate(w[1:], start=1):
            short = f"-{c}"
            if short in _VALUE_OPTIONS:
                rest = w[j + 1 :].removeprefix("=")
                if rest:
                    value: str | None = rest
                else:
                    value = opts[k + 1] if k + 1 < len(opts) else None
                    step = 2
                out.append(Option(_LONG.get(short, short), k, step, value))
                break
            out.append(Option(_LONG.get(short, short), k, 1, None, short in _SWITCHES))
        k += step
    return out


@dataclass(frozen=True)
class ContainerCommand:
    """A `docker run ... IMAGE CMD...` command line cut in three."""

    runtime: tuple[str, ...]  # everything up to and including `run` (`sudo docker run`)
    options: tuple[str, ...]  # the runtime's own options (not the server's)
    image: str
    command: tuple[str, ...]  # what runs inside the image: the server's own argv

    @property
    def image_index(self) -> int:
        return len(self.runtime) + len(self.options)

    @property
    def runtime_name(self) -> str:
        """`docker`, `podman`, ... (`nvidia-docker` is docker's)."""
        word = next(w for w in self.runtime if os.path.basename(w) in RUNTIMES)
        return os.path.basename(word)

    def parsed(self) -> list[Option]:
        return read_options(self.options)

    def unknown(self) -> list[str]:
        """The options neither runtime lists: whether they take a value cannot be told."""
        return [self.options[o.start] for o in self.parsed() if not o.known]

    def value_of(self, name: str) -> str | None:
        """The last value given to option `name` (`--entrypoint`), None if none."""
        found = [o.value for o in self.parsed() if o.name == name and o.value is not None]
        return found[-1] if found else None

    def detached(self) -> bool:
        """`-d` / `--detach` (not `--detach=false`): the command returns at once and the
        container runs on, out of the service manager's sight."""
        return any(
            o.name == "--detach" and (o.value or "true").lower() not in ("false", "0")
            for o in self.parsed()
        )

    def entrypoint(self) -> tuple[str, ...]:
        """The words that run before the command inside the image: `--entrypoint`'s, else
        the entry point of an image known to be the server's, else none."""
        given = self.value_of("--entrypoint")
        if given:
            return (given,)
        return IMAGE_ENTRYPOINTS.get(image_repository(self.image), ())


def image_repository(image: str) -> str:
    """An image's repository without registry, tag or digest: `docker.io/vllm/vllm-openai:
    v0.9.1` -> `vllm/vllm-openai`."""
    name = image.split("@", 1)[0]
    head, _, tail = name.rpartition(":")
    if head and "/" not in tail:
        name = head
    parts = name.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]
    return "/".join(parts)


def container_split(words: Sequence[str]) -> ContainerCommand | None:
    """The parts of a `docker run` / `podman run` command line, or None if it is not one.

    `sudo`, `env X=Y` and a path to the runtime (`/usr/bin/docker`) may come first. The
    runtime's options are read by the tables above (`read_options`); `--` ends them."""
    i = 0
    sudo = False  # in sudo's own options (`sudo -u svc -E docker ...`)
    while i < len(words) and (
        words[i] in ("sudo", "env", "exec", "nice")
        or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[i])
        or (sudo and words[i].startswith("-"))
    ):
        sudo = words[i] == "sudo" or (sudo and words[i].startswith("-"))
        i += 2 if sudo and words[i] in _SUDO_VALUE else 1
    if i + 1 >= len(words) or os.path.basename(words[i]) not in RUNTIMES:
        return None
    j = i + 1
    while j < len(words) and words[j].startswith("-"):  # the runtime's global options
        name = words[j].split("=", 1)[0]
        j += 2 if name in _GLOBAL_VALUE and "=" not in words[j] else 1
    if j >= len(words):
        return None
    if words[j] == "container":  # `docker container run`
        j += 1
    if j >= len(words) or words[j] != "run":
        return None
    runtime_end = j + 1
    k = runtime_end
    while k < len(words):
        w = words[k]
        if w == "--":
            k += 1
            break
        if not w.startswith("-") or w == "-":
            break
        k += max(o.start + o.words for o in read_options(words[k : k + 2]) if o.start == 0)
    if k >= len(words):
        return None
    return ContainerCommand(
        tuple(words[:runtime_end]), tuple(words[runtime_end:k]), words[k], tuple(words[k + 1 :])
    )


def container_problem(words: Sequence[str]) -> str | None:
    """Why a container command cannot be run as a server's command, or None: an option
    whose taking a value cannot be told (the image could be the word after it), or `-d`
    (the command returns at once, the container runs on unwatched)."""
    cc = container_split(words)
    if cc is None:
        return None
    unknown = cc.unknown()
    if unknown:
        return (
            f"{cc.runtime_name} run option {unknown[0]} is not one docker or podman lists, "
            "so whether the next word is its value or the image cannot be told; write it "
            f"{unknown[0].split('=', 1)[0]}=VALUE (a switch: {unknown[0].split('=', 1)[0]}=true)"
        )
    if cc.detached():
        return (
            f"{cc.runtime_name} run -d detaches the container: the command returns at once and "
            "the server runs on where no run can watch or stop it; drop -d (runs keep the "
            "container in the foreground and remove it after each run)"
        )
    return None


def with_options(words: Sequence[str], extra: Sequence[str]) -> tuple[str, ...]:
    """A container command with `extra` runtime options after its own (so they win where
    both set the same thing), before the image; unchanged when it is none."""
    cc = container_split(words)
    if cc is None or not extra:
        return tuple(words)
    opts = list(cc.options)
    end = ["--"] if opts and opts[-1] == "--" else []
    if end:
        opts.pop()
    return (*cc.runtime, *opts, *extra, *end, cc.image, *cc.command)


def passing_env(words: Sequence[str], names: Sequence[str]) -> tuple[str, ...]:
    """A container command that hands the variables `names` to the server inside it:
    `-e NAME` (the value taken from the runtime's own environment, where the drop-in or
    the launch script sets it: never on the command line)."""
    return with_options(words, [w for name in names for w in ("-e", name)])


#: the label on every container a run starts: the service it ran for (to stop and remove
#: it after the run, and to find what a controller that died left running)
LABEL = "orchestrator.service"
#: the runtimes looked for on a host whose leftovers are surveyed
SURVEYED = ("docker", "podman", "nerdctl")
CONTAINER_MARK = "@@CONTAINER"


def service_key(service: str) -> str:
    """The name a service's containers, lock and run directory are kept under."""
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", service)


def labelled(words: Sequence[str], service: str) -> tuple[str, ...]:
    """A container command whose container carries the service's label."""
    return with_options(words, ["--label", f"{LABEL}={service_key(service)}"])


def runtime_prefix(cc: ContainerCommand) -> tuple[str, ...]:
    """The words that run the runtime as the server's command does (`sudo docker`,
    `env CONTAINERS_CONF=... podman`, `docker container`), without `run`."""
    return cc.runtime[:-1]


def remove_command(runtime: Sequence[str], service: str) -> str:
    """Shell that stops (then removes) every container of the service's label, printing
    `@@CONTAINER removed ID` for each one it found and `@@CONTAINER left ID` for each one
    still there after."""
    import shlex

    r = shlex.join(runtime)
    flt = shlex.quote(f"label={LABEL}={service_key(service)}")
    return (
        f"ids=$({r} ps -aq --filter {flt} 2>/dev/null); "
        f'if [ -n "$ids" ]; then {r} stop -t 10 $ids >/dev/null 2>&1; '
        f"{r} rm -f $ids >/dev/null 2>&1; fi; "
        f'for id in $ids; do echo "{CONTAINER_MARK} removed $id"; done; '
        f"for id in $({r} ps -aq --filter {flt} 2>/dev/null); do "
        f'echo "{CONTAINER_MARK} left $id"; done; true'
    )


def survey_command() -> str:
    """Shell printing `@@CONTAINER RUNTIME ID SERVICE` for every labelled container of each
    runtime the host has."""
    fmt = "'{{index .Config.Labels \"" + LABEL + "\"}}'"
    return (
        f"for r in {' '.join(SURVEYED)}; do command -v $r >/dev/null 2>&1 || continue; "
        f"for id in $($r ps -aq --filter label={LABEL} 2>/dev/null); do "
        f'echo "{CONTAINER_MARK} $r $id $($r inspect --format {fmt} $id 2>/dev/null)"; '
        "done; done; true"
    )


def parse_marked(text: str) -> list[list[str]]:
    """The fields after each `@@CONTAINER` line of a command's output."""
    return [line.split()[1:] for line in text.splitlines() if line.startswith(CONTAINER_MARK + " ")]
