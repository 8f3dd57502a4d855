"""Builds: which installation of the server a config runs (a venv, a prefix, an image).

A config names its build with `service.build`. The name is one of:

- a path on the host (`/opt/sglang-0.5.23`): a virtualenv or install prefix; the run's
  command takes its interpreter (or its first word) from that prefix's `bin/`;
- a container image (`lmsysorg/sglang:v0.5.23`) when the command runs `docker run` or
  `podman run`: the image word of that command line is replaced;
- any other name (`0.5.23`), which the host maps to one of the two in the hosts file
  (`builds: {0.5.23: /opt/sglang-0.5.23}` under the host).

Everything here is pure: `resolve` turns a config and a host's `builds:` into the command
line that runs; the executor calls it before every run, so the drop-in, the launch script
and the Slurm job all carry the build's interpreter or image. Where the exec runs a
container, `container_split` finds the image and the server's own argv in it (the importer
reads unit files with it too).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from orchestrator.config.containers import ContainerCommand, container_split
from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.config.experiment import Experiment

#: the options of a container command that shape what its Python sees (its environment
#: and its mounts): a command run inside the same image to read it takes them too
_SEEN_OPTIONS = frozenset({"--env", "--env-file", "--volume", "--mount"})


def seen_options(cc: ContainerCommand) -> tuple[str, ...]:
    """The environment and mount options of the server's own `run` (`-e X=1`, `-v a:b`,
    `--env=X=1`), in order: what a command run in the image to read it needs as well."""
    out: list[str] = []
    for o in cc.parsed():
        if o.name in _SEEN_OPTIONS:
            out.extend(cc.options[o.start : o.start + o.words])
    return tuple(out)


def python_in_image(cc: ContainerCommand, *extra_options: str) -> str:
    """A shell command prefix running the image's `python3` the way the server's own
    command would see it (its `-e` and `-v` options), without a network; arguments follow."""
    return shlex.join(
        [
            *cc.runtime,
            "--rm",
            "--network",
            "none",
            *seen_options(cc),
            *extra_options,
            "--entrypoint",
            "python3",
            cc.image,
        ]
    )


def env_option(cc: ContainerCommand, name: str) -> tuple[int, int, str] | None:
    """Where the command sets variable `name` (`-e NAME=V`, `--env NAME=V`,
    `--env=NAME=V`): (index in the options, words taken, value) of the last such option."""
    found = None
    for o in cc.parsed():
        if o.name == "--env" and o.value is not None:
            key, sep, value = o.value.partition("=")
            if key == name and sep:
                found = (o.start, o.words, value)
    return found


def with_path_first(words: Sequence[str], site: str, image_path: str | None) -> tuple[str, ...]:
    """A container command whose Python finds `site` first: mounted read-only at the same
    path and first on the container's PYTHONPATH, before the command's own `-e PYTHONPATH`
    (else the image's own, `image_path`)."""
    cc = container_split(words)
    assert cc is not None
    opts = list(cc.options)
    own = env_option(cc, "PYTHONPATH")
    rest = own[2] if own is not None else image_path
    if own is not None:
        del opts[own[0] : own[0] + own[1]]
    value = site + (f":{rest}" if rest else "")
    opts += ["-v", f"{site}:{site}:ro", "-e", f"PYTHONPATH={value}"]
    return (*cc.runtime, *opts, cc.image, *cc.command)


def is_path(name: str) -> bool:
    return name.startswith("/")


#: a version in a build's name, with the separators PEP 440 allows before a pre-, post- or
#: dev-release (`0.5.23-rc1`, `0.5.23.rc1`, `0.5.23-post1`); a bare `a`/`b` only unseparated
#: (`0.5.23b1`), as `-b200` after a version names hardware, not a beta
_VERSION = re.compile(
    r"(?<![\w.])v?(\d+(?:\.\d+)+"
    r"(?:(?:[-_.]?(?:rc|alpha|beta|pre|preview)|a|b)[-_.]?\d+)?"
    r"(?:[-_.]?post[-_.]?\d+)?(?:[-_.]?dev[-_.]?\d+)?)"
)


def version_in(name: str) -> str | None:
    """The version a build's name states (`0.5.23`, `lmsysorg/sglang:v0.5.23-cu129`,
    `/opt/vllm-0.30.0`), or None when it states none."""
    found = _VERSION.findall(name.rsplit(":", 1)[-1] if not is_path(name) else name)
    return found[-1] if found else None


def same_version(a: str, b: str) -> bool:
    """`0.30.0` is `0.30.0+cpu` and `0.30`: what a release's name promises."""

    def norm(v: str) -> list[str]:
        parts = v.split("+", 1)[0].split(".")
        while len(parts) > 1 and parts[-1] == "0":
            parts.pop()
        return parts

    ka, kb = version_key(a), version_key(b)
    if ka is not None and kb is not None:  # `0.5.23-rc1` is `0.5.23rc1`
        return ka == kb
    return norm(a) == norm(b)


#: a version as PEP 440 spells it, with the spellings it normalizes (`1.0-rc.1`, `1.0.post2`)
_PEP440 = re.compile(
    r"v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pre_n>\d*))?"
    r"(?:-(?P<post_implicit>\d+)|[-_.]?(?:post|rev|r)[-_.]?(?P<post_n>\d*))?"
    r"(?:[-_.]?dev[-_.]?(?P<dev_n>\d*))?"
    r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?",
    re.IGNORECASE,
)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
#: sorts below and above every number of a version's part
_LOW, _HIGH = (-1, 0), (1, 0)


def version_key(version: str) -> tuple | None:
    """A key that orders versions as PEP 440 does (`0.5.23.dev1 < 0.5.23rc1 < 0.5.23 <
    0.5.23.post1 < 0.5.24`; `1.0 == 1.0.0`; a local part `+cu129` is ignored); None when
    the text is not a version."""
    m = _PEP440.fullmatch(version.strip())
    if m is None:
        return None
    release = [int(x) for x in m["release"].split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    dev = (0, int(m["dev_n"] or 0)) if m["dev_n"] is not None else _HIGH
    post_text = m["post_implicit"] or m["post_n"]
    has_post = m["post_implicit"] is not None or m["post_n"] is not None
    post = (0, int(post_text or 0)) if has_post else _LOW
    if m["pre"] is not None:
        pre = (0, _PRE_RANK[m["pre"].lower()], int(m["pre_n"] or 0))
    elif m["dev_n"] is not None and not has_post:
        pre = (-1, 0, 0)  # `1.0.dev1` comes before `1.0a1`
    else:
        pre = (1, 0, 0)
    return (int(m["epoch"] or 0), tuple(release), pre, post, dev)


def build_version_key(name: str) -> tuple | None:
    """The PEP 440 key of the version a build's name states (`0.5.23rc1`,
    `lmsysorg/sglang:v0.5.23rc1-cu129`, `/opt/sglang-0.5.23rc1`); None: it states none."""
    direct = version_key(name)
    if direct is not None:
        return direct
    stated = version_in(name)
    return version_key(stated) if stated is not None else None


class BuildError(ConfigError):
    """A build that the host cannot run (unknown name, wrong kind for the command)."""


def target_of(name: str, builds: Mapping[str, str], exec_words: Sequence[str]) -> str | None:
    """What a build name stands for on a host: the `builds:` entry, else the name itself
    when it is a path or (for a container command) an image; None: the host lacks it."""
    if name in builds:
        return builds[name]
    if is_path(name):
        return name
    if container_split(exec_words) is not None and ("/" in name or ":" in name):
        return name
    return None


def close_build(name: str, builds: Mapping[str, str]) -> str | None:
    """The host's build a mistyped name means: one stating the same version as PEP 440
    reads it (`0.5.23-rc1` is `0.5.23rc1`), else one spelt nearly the same."""
    import difflib

    key = build_version_key(name)
    if key is not None:
        same = [b for b in builds if build_version_key(b) == key]
        # another version is another build, however close its spelling
        return same[0] if len(same) == 1 else None
    close = difflib.get_close_matches(name, list(builds), n=1, cutoff=0.8)
    return close[0] if close else None


def missing_hint(name: str, host: str, hosts_file: str, exec_words: Sequence[str]) -> str:
    example = f"lmsysorg/sglang:{name}" if container_split(exec_words) else f"/opt/server-{name}"
    return (
        f"add it under the host in {hosts_file or 'the hosts file'}: "
        f"hosts.{host}.builds: {{{shlex.quote(name)}: {example}}}"
    )


def apply(exec_words: Sequence[str], target: str) -> tuple[str, ...]:
    """The command line with the build's interpreter or image.

    An image replaces the image word of a container command. A prefix gives the first word
    from its `bin/`: `/opt/a/bin/python -m x` -> `/opt/b/bin/python -m x`, `vllm serve` ->
    `/opt/b/bin/vllm serve`. Raises ValueError when the kinds do not fit."""
    words = list(exec_words)
    cc = container_split(words)
    if cc is not None:
        if is_path(target):
            raise ValueError(
                f"the command runs a container ({cc.runtime[-2]} run): its build "
                f"is an image, not the path {target}"
            )
        words[cc.image_index] = target
        return tuple(words)
    if not is_path(target):
        raise ValueError(
            f"{target!r} is neither a path on the host nor usable as an image: "
            "the command runs no 'docker run' / 'podman run'"
        )
    words[0] = f"{target.rstrip('/')}/bin/{os.path.basename(words[0])}"
    return tuple(words)


def resolve(
    exp: Experiment, builds: Mapping[str, str], *, host: str = "", hosts_file: str = ""
) -> Experiment:
    """The config with its build applied (unchanged when it names none)."""
    if exp.build is None:
        return exp
    target = target_of(exp.build, builds, exp.exec)
    if target is None:
        close = close_build(exp.build, builds)
        if close is not None:
            raise BuildError(
                f"build '{exp.build}' is not known on host {host}; did you mean '{close}'?",
                file=exp.source,
                key="service.build",
                hint=f"the host's builds are {', '.join(sorted(builds))} "
                f"(hosts.{host}.builds in {hosts_file or 'the hosts file'})",
            )
        raise BuildError(
            f"build '{exp.build}' is not known on host {host}",
            file=hosts_file or None,
            key=f"hosts.{host}.builds",
            hint=missing_hint(exp.build, host, hosts_file, exp.exec),
        )
    try:
        words = apply(exp.exec, target)
    except ValueError as exc:
        raise BuildError(
            f"build '{exp.build}': {exc}", file=exp.source, key="service.build"
        ) from None
    return replace(exp, exec=words)


def read_back(
    name: str, target: str | None, served: str | None, server: str | None = None
) -> str | None:
    """Why a run of build `name` says nothing about its config: the version the server's
    package reports from inside the environment (`served`) is not the one the build's
    name (or its path or image) states. None when they agree or either is unknown."""
    stated = version_in(name) or (version_in(target) if target else None)
    if stated is None or served is None or same_version(stated, served):
        return None
    where = f" ({target})" if target and target != name else ""
    return (
        f"build '{name}'{where} serves {server or 'the server'} {served}, not {stated}: "
        "the tag or path points at another release; not a verdict about the config"
    )


#: a server that cannot start from its build: a module or a native library missing, a
#: symbol another build of a library lacks
_BROKEN = re.compile(
    r"cannot open shared object file|undefined symbol|No module named"
    r"|DLL load failed|GLIBC_[\d.]+' not found"
)


def broken(error_class: str, message: str) -> bool:
    """A failure that says the build is broken (an import error, a missing library),
    not that the config fails."""
    return error_class in ("ImportError", "ModuleNotFoundError") or bool(_BROKEN.search(message))


#: run by a build's python: its distributions, {name: version}
LIST_SNIPPET = (
    "import importlib.metadata as m, json; print('@@DISTS ' + json.dumps("
    "{d.metadata['Name']: d.version for d in m.distributions() "
    "if d.metadata['Name']}))"
)

#: run by the python of the build the packages come from: links each wanted distribution
#: (its dist-info and the top-level paths its RECORD lists) into the overlay directory, or
#: copies them (`copy`: from inside an image, whose files the host cannot link to)
OVERLAY_SNIPPET = r"""
import importlib.metadata as m, json, os, shutil, sys
dst, wanted = sys.argv[1], json.loads(sys.argv[2])
copy = sys.argv[3:] == ["copy"]  # out of an image: the files, not links into it
os.makedirs(dst, exist_ok=True)
missing = []
for name, version in wanted.items():
    try:
        d = m.distribution(name)
    except m.PackageNotFoundError:
        missing.append(name); continue
    if d.version != version:
        missing.append(f"{name} (is {d.version})"); continue
    info = str(getattr(d, "_path", ""))
    site = os.path.dirname(info)
    tops = {os.path.basename(info)}
    for f in d.files or []:
        parts = f.parts
        if parts and parts[0] not in ("..", "/") and not str(f).startswith("/"):
            tops.add(parts[0])
    for t in tops:
        src, link = os.path.join(site, t), os.path.join(dst, t)
        if os.path.exists(src) and not os.path.lexists(link):
            if copy and os.path.isdir(src):
                shutil.copytree(src, link, symlinks=True)
            elif copy:
                shutil.copy2(src, link)
            else:
                os.symlink(src, link)
print("@@OVERLAY " + json.dumps(missing))
"""


def parse_dists(text: str) -> dict[str, str] | None:
    """The output of LIST_SNIPPET -> {distribution: version}; None if absent."""
    import json

    for line in text.splitlines():
        if line.startswith("@@DISTS "):
            try:
                data = json.loads(line[len("@@DISTS ") :])
            except ValueError:
                return None
            return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else None
    return None


def python_of(launch_exec: Sequence[str], target: str | None) -> str:
    """The interpreter of a build: the prefix's `bin/python`, else the exec's own."""
    if target and is_path(target):
        return f"{target.rstrip('/')}/bin/python"
    return launch_exec[0]


#: where the overlays go on a host without a `run_dir`
OVERLAY_ROOT = "/var/tmp/orchestrator"


def overlays_of(run_dir: str | None, service: str | None = None) -> str:
    """The directory of a service's package overlays on a host (of every service's: None):
    `RUN_DIR/overlays/SERVICE/`, removed when the campaign ends and by `restore`."""
    from orchestrator.config.containers import service_key

    base = f"{(run_dir or OVERLAY_ROOT).rstrip('/')}/overlays"
    return base if service is None else f"{base}/{service_key(service)}"


def overlay_dir(
    root: str, packages: Sequence[tuple[str, str]], source: str, service: str = ""
) -> str:
    """One set of packages' overlay: `ROOT/overlays/SERVICE/KEY`."""
    import hashlib
    import json

    key = hashlib.sha256(json.dumps([sorted(packages), source]).encode()).hexdigest()[:16]
    return f"{overlays_of(root, service or None)}/{key}"


def pip_problems(text: str) -> list[str]:
    """`pip check`'s complaints, one a line ('No broken requirements found.' is none)."""
    return [
        ln.strip()
        for ln in text.splitlines()
        if ln.strip() and not ln.startswith("No broken requirements")
    ]


def complaint_key(line: str) -> str:
    """A `pip check` complaint without the complaining distribution's version."""
    return re.sub(r"^(\S+) \S+ ", r"\1 ", line)


def describe(name: str | None) -> str:
    return name if name is not None else "(as installed)"
