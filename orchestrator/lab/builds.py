"""Lab builds: install prefixes of the simulated server, one per release.

A build is a directory `ROOT/NAME` holding `bin/python3` (a wrapper that puts the build's
own `site/` first on the path and runs the host's interpreter) and, in `site/`, the
distribution `orchestrator-lab-server` at the build's version (a dist-info directory, as
pip leaves it). The lab server reads its release from that distribution
(`orchestrator.lab.server.installed_version`) and a scenario's `versions:` rules fire by
it; the environment capture reads the same distribution from inside the build, so a
build whose directory says one version and whose package is another is seen. A `broken`
build's interpreter fails the way a release with a missing library does.

`files()` is pure (path -> (text, mode)); `install()` writes them on this machine, and a
test writes them on a remote host through its transport.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from orchestrator.lab.server import LAB_DIST

#: what a build without its native library prints when the server starts (a torch wheel
#: of another CUDA, as public reports show it)
BROKEN_ERROR = (
    "ImportError: libcudart.so.13: cannot open shared object file: No such file or directory"
)


def files(
    root: str,
    name: str,
    *,
    version: str | None = None,
    python: str = "python3",
    repo: str | None = None,
    broken: bool = False,
    extra: dict[str, tuple[str, list[str]]] | None = None,
) -> dict[str, tuple[str, int]]:
    """The files of build `name` under `root` (an absolute path on the host): `version`
    defaults to the name; `repo` is put on the path after the build's own site (where the
    orchestrator package is, when the host has it there); `extra`: more distributions
    (name -> (version, requirements)), metadata only, as packages a build holds."""
    prefix = f"{root.rstrip('/')}/{name}"
    site = f"{prefix}/site"
    version = version or name
    dist = f"{site}/{LAB_DIST.replace('-', '_')}-{version}.dist-info"
    path = site + (f":{repo}" if repo else "")
    if broken:
        body = (
            'case " $* " in *" -m orchestrator.lab.server "*)\n'
            "  echo 'Traceback (most recent call last):' >&2\n"
            "  echo '  File \"<frozen runpy>\", line 198, in _run_module_as_main' >&2\n"
            f"  echo {shlex.quote(BROKEN_ERROR)} >&2\n  exit 1;;\nesac\n"
        )
    else:
        body = ""
    wrapper = (
        "#!/bin/sh\n# a lab build of the simulated server (orchestrator.lab.builds)\n"
        # after what the caller put first (a run's package overlay), as a
        # virtualenv's site-packages comes after PYTHONPATH
        f"PYTHONPATH=${{PYTHONPATH:+$PYTHONPATH:}}{shlex.quote(path)}\n"
        f'export PYTHONPATH\n{body}exec {shlex.quote(python)} "$@"\n'
    )
    meta = f"Metadata-Version: 2.1\nName: {LAB_DIST}\nVersion: {version}\n"
    out = {
        f"{prefix}/bin/python3": (wrapper, 0o755),
        f"{prefix}/bin/python": (wrapper, 0o755),
        f"{dist}/METADATA": (meta, 0o644),
        f"{dist}/top_level.txt": ("orchestrator\n", 0o644),
    }
    for dname, (dver, requires) in (extra or {}).items():
        info = f"{site}/{dname.replace('-', '_')}-{dver}.dist-info"
        text = f"Metadata-Version: 2.1\nName: {dname}\nVersion: {dver}\n" + "".join(
            f"Requires-Dist: {r}\n" for r in requires
        )
        out[f"{info}/METADATA"] = (text, 0o644)
    return out


def install(root: Path, name: str, **kwargs: object) -> Path:
    """Write build `name` under `root` on this machine; its prefix."""
    for path, (text, mode) in files(str(root), name, **kwargs).items():  # type: ignore[arg-type]
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        p.chmod(mode)
    return root / name
