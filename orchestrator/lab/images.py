"""Lab images: container images of the simulated server, one per release, for podman.

The image builds beside the prefix builds (`orchestrator.lab.builds`): a release is an
image `localhost/orchestrator-lab:VERSION` whose Python holds the distribution
`orchestrator-lab-server` at that version (and any `extra` distributions, metadata only,
as the packages a release brings), over one base image made from the systemd test
rootfs (Debian with python3; `podman import` of its tarball, no registry, no network).
`pip` is copied in from this machine's environment, so `pip check` runs inside. The
orchestrator package itself is mounted into the container by the command that runs it
(`-v REPO:/opt/orchestrator:ro -e PYTHONPATH=/opt/orchestrator`), as an image's own
server would be installed in it.

`podman()` runs the runtime with the lab's settings (`CONTAINERS_CONF`): the `runc`
runtime and modest resource limits, which a root without CAP_SYS_RESOURCE on a cgroup v1
host (a container of its own, like a CI machine) can set; a real host needs neither.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from orchestrator.lab.server import LAB_DIST

#: the repository in every lab container, and where the image's Python finds it
REPO_IN_IMAGE = "/opt/orchestrator"
#: the image's own site-packages (Debian's python3 reads /usr/local/lib/pythonX.Y/...)
SITE = "/usr/local/lib/python3.11/dist-packages"
NAME = "localhost/orchestrator-lab"
BASE = "localhost/orchestrator-lab-base"

CONF = """\
# the lab's podman settings (orchestrator.lab.images)
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=2048:2048"]
[engine]
runtime = "runc"
"""


class ImagesUnavailable(RuntimeError):
    """podman (or runc) is missing or cannot run a container on this machine."""


def conf_path() -> Path:
    """The lab's `containers.conf`, written once per content."""
    key = hashlib.sha256(CONF.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"orchestrator-lab-containers-{key}.conf"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(CONF)
        os.replace(tmp, path)
    return path


def env() -> dict[str, str]:
    """What a command running the lab's podman needs in its environment."""
    return {"CONTAINERS_CONF": str(conf_path())}


def podman(*args: str, input: bytes | None = None, timeout: float = 300) -> str:
    """Run podman with the lab's settings; its stdout. Raises ImagesUnavailable."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        raise ImagesUnavailable(
            "podman and runc are not installed (scripts/bootstrap installs them as root)"
        )
    res = subprocess.run(
        ["podman", *args],
        input=input,
        capture_output=True,
        timeout=timeout,
        env={**os.environ, **env()},
    )
    if res.returncode != 0:
        raise ImagesUnavailable(
            f"podman {' '.join(args[:3])} exited {res.returncode}: "
            + res.stderr.decode(errors="replace").strip()[-600:]
        )
    return res.stdout.decode(errors="replace")


def _exists(tag: str) -> bool:
    try:
        podman("image", "exists", tag, timeout=60)
    except ImagesUnavailable:
        return False
    return True


def base_image() -> str:
    """The base image (the systemd test rootfs, imported once per recipe); its tag."""
    from orchestrator.lab import rootfs

    tarball = rootfs.tarball_path()
    tag = f"{BASE}:{rootfs.recipe_hash()}"
    if _exists(tag):
        return tag
    if not tarball.exists():
        raise ImagesUnavailable(f"no rootfs tarball at {tarball} (scripts/build-rootfs makes it)")
    raw = subprocess.run(["zstd", "-dc", str(tarball)], capture_output=True, check=True).stdout
    podman("import", "-", tag, input=raw, timeout=600)
    return tag


def _pip_sources() -> list[Path]:
    """pip and its dist-info from this machine's environment (pure Python)."""
    import pip

    pkg = Path(pip.__file__).parent
    infos = sorted(pkg.parent.glob("pip-*.dist-info"))
    return [pkg, *infos[-1:]]


def image(
    version: str, *, extra: dict[str, tuple[str, list[str]]] | None = None, tag: str | None = None
) -> str:
    """The image of release `version` (built unless an identical one exists); its tag.
    `extra`: more distributions (name -> (version, requirements)), metadata only."""
    base = base_image()
    files: dict[str, str] = {}
    info = f"{LAB_DIST.replace('-', '_')}-{version}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {LAB_DIST}\nVersion: {version}\n"
    files[f"{info}/top_level.txt"] = "orchestrator\n"  # the package it provides
    for dname, (dver, requires) in sorted((extra or {}).items()):
        files[f"{dname.replace('-', '_')}-{dver}.dist-info/METADATA"] = (
            f"Metadata-Version: 2.1\nName: {dname}\nVersion: {dver}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires)
        )
    key = hashlib.sha256(repr((base, sorted(files.items()))).encode()).hexdigest()[:12]
    tag = tag or f"{NAME}:{version}-{key}"
    if _exists(tag):
        return tag
    with tempfile.TemporaryDirectory(prefix="orch-lab-image-") as d:
        ctx = Path(d)
        site = ctx / "site"
        for rel, text in files.items():
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_text(text)
        for src in _pip_sources():
            shutil.copytree(src, site / src.name, ignore=shutil.ignore_patterns("__pycache__"))
        (ctx / "Containerfile").write_text(f"FROM {base}\nCOPY site/ {SITE}/\n")
        podman("build", "-q", "-t", tag, str(ctx), timeout=600)
    return tag


def run_command(
    image_tag: str, *, repo: str, scenario: str, time_scale: str, label: str
) -> list[str]:
    """The `podman run` command line of the lab server in an image: host network (the
    health check reaches its port), the checkout mounted, a label to clean up by."""
    return [
        "podman",
        "run",
        "--rm",
        "--network",
        "host",
        "--label",
        f"orchestrator-lab={label}",
        "-v",
        f"{repo}:{REPO_IN_IMAGE}:ro",
        "-e",
        f"PYTHONPATH={REPO_IN_IMAGE}",
        "-e",
        f"ORCH_LAB_TIME_SCALE={time_scale}",
        "-e",
        "PYTHONDONTWRITEBYTECODE=1",
        image_tag,
        "python3",
        "-m",
        "orchestrator.lab.server",
        "--scenario",
        scenario,
    ]


def remove_labelled(label: str) -> None:
    """Remove every lab container of `label` (a stopped client can leave one running)."""
    try:
        ids = podman("ps", "-aq", "--filter", f"label=orchestrator-lab={label}", timeout=60)
        if ids.split():
            podman("rm", "-f", "-t", "2", *ids.split(), timeout=120)
    except ImagesUnavailable:
        pass


if __name__ == "__main__":  # pragma: no cover - a manual check: build one image
    print(image(sys.argv[1] if len(sys.argv) > 1 else "0.5.22"))
