"""The environment of a run: what decides whether a server crashes, besides its flags.

Per host: GPU model and count, driver, the CUDA version the driver supports, NCCL, the
kernel, and the server's own package and key libraries (torch and its CUDA runtime,
flashinfer, deep_ep, sgl-kernel, vllm, ...) as the server's OWN interpreter sees them.
Facts style (the pyinfra habit): `command()` builds one shell command, the executor runs
it on the host, `parse()` turns its output into a `HostEnvironment` (pure, tested on
recorded output under `tests/data/facts/`). What is absent (no GPU, no nvidia-smi, a
library not installed) is recorded as absent (None), never an error.

Package versions come from the interpreter's installed distributions
(`importlib.metadata`): nothing heavy is imported, so a capture costs one SSH round trip
and well under a second, and runs before every run: a driver upgraded overnight shows up
at the first run after it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

NVSMI_MARK = "@@NVSMI"
BANNER_MARK = "@@NVBANNER"
KERNEL_MARK = "@@KERNEL"
CPU_MARK = "@@CPU"
PY_MARK = "@@PYJSON"
EXEC_MARK = "@@EXEC"
IMAGE_MARK = "@@IMAGE"

#: distributions recorded whenever installed (name as shown -> distribution names to try)
KEY_PACKAGES: dict[str, tuple[str, ...]] = {
    "sglang": ("sglang",),
    "vllm": ("vllm",),
    "torch": ("torch",),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "sgl-kernel": ("sgl-kernel",),
    "deep_ep": ("deep_ep", "deep-ep"),
    "triton": ("triton",),
    "transformers": ("transformers",),
}
#: NCCL as pip ships it (torch's wheels depend on one of these)
NCCL_DISTS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")

#: the Python run on the host: versions of installed distributions and torch's CUDA
#: runtime (read from torch/version.py: importing torch takes seconds)
_SNIPPET = r"""
import json, os, re, sys
from importlib import metadata as m
from importlib import util
keys, nccl, server = json.loads(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
def ver(names):
    for n in names:
        try:
            return m.version(n)
        except Exception:
            pass
    return None
out = {"python": sys.version.split()[0], "packages": {k: ver(v) for k, v in keys.items()},
       "nccl": ver(nccl), "server": None, "server_version": None, "torch_cuda": None}
if server:
    top = server.split(".")[0]
    out["server"] = top
    try:
        dists = m.packages_distributions().get(top) or [top]
    except Exception:
        dists = [top]
    # several distributions may provide the package (a release over a checkout of the
    # project): a real one before a development checkout's egg-info
    found = []
    for n in dists + [top]:
        try:
            found.append(m.distribution(n))
        except Exception:
            pass
    found.sort(key=lambda d: str(getattr(d, "_path", "")).endswith(".egg-info"))
    v = found[0].version if found else None
    if v is None and util.find_spec(top) is not None and top not in ("sglang", "vllm"):
        try:
            v = getattr(__import__(top), "__version__", None)
        except Exception:
            v = None
    out["server_version"] = v
try:
    spec = util.find_spec("torch")
    if spec is not None and spec.origin:
        text = open(os.path.join(os.path.dirname(spec.origin), "version.py")).read()
        found = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)", text, re.M)
        out["torch_cuda"] = found.group(1) if found else None
except Exception:
    pass
print("@@PYJSON " + json.dumps(out))
"""


@dataclass(frozen=True)
class HostEnvironment:
    """One host's environment as one run saw it. None = absent (or not installed)."""

    gpu_model: str | None = None
    gpu_count: int = 0
    gpu_memory: str | None = None
    driver: str | None = None
    cuda: str | None = None  # the highest CUDA version the driver supports
    torch_cuda: str | None = None  # the CUDA runtime torch was built with
    nccl: str | None = None
    kernel: str | None = None
    cpu: str | None = None  # the CPU model (/proc/cpuinfo) and its count of CPUs
    python: str | None = None
    interpreter: str | None = None  # how the server's interpreter was found
    server: str | None = None  # the server's package (sglang, vllm, ...)
    server_version: str | None = None
    packages: dict[str, str | None] = field(default_factory=dict)
    #: the exec's first word as the host resolves it (`command -v`, with the server's PATH)
    #: and the sha256 of that file: a wrapper script or binary changed in place shows
    exec_path: str | None = None
    exec_sha256: str | None = None
    #: a container command's image as named, and its id (`docker image inspect`): the
    #: packages above are then read inside that image
    image: str | None = None
    image_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostEnvironment:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        known["packages"] = dict(known.get("packages") or {})
        return cls(**known)

    def build(self) -> str | None:
        """The server build this capture saw, as the help cache keys what the server's
        parser takes (None: no server version, so builds are not told apart). Made of
        fields that `digest()` covers too: a changed build is always a changed
        environment, so the verdict cache and the help cache cannot disagree on it."""
        if not self.server_version:
            return None
        packages = sorted((k, v) for k, v in (self.packages or {}).items() if v)
        # the executable's own file too: a wrapper script edited in place takes other flags
        return json.dumps(
            [
                self.interpreter,
                self.server,
                self.server_version,
                self.python,
                packages,
                self.exec_sha256,
            ]
        )

    def digest(self) -> str:
        """Equal environments have equal digests (what the cache and change checks use)."""
        data = self.to_dict()
        for late in ("exec_path", "exec_sha256", "image", "image_id"):  # older digests hold
            if data[late] is None:
                del data[late]
        blob = json.dumps(data, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def rows(self) -> list[tuple[str, str]]:
        """(what, value) lines for people; absent things say so."""
        gpu = "absent"
        if self.gpu_count:
            gpu = f"{self.gpu_count} x {self.gpu_model or '?'}"
            gpu += f" ({self.gpu_memory})" if self.gpu_memory else ""
        out = [
            ("GPU", gpu),
            ("driver", self.driver or "absent"),
            ("CUDA (driver)", self.cuda or "absent"),
            ("CUDA (torch)", self.torch_cuda or "absent"),
            ("NCCL", self.nccl or "absent"),
            ("kernel", self.kernel or "absent"),
            ("CPU", self.cpu or "absent"),
            ("python", self.python or "absent"),
        ]
        if self.server:
            out.append((f"server package ({self.server})", self.server_version or "absent"))
        if self.exec_path:
            sha = f" (sha256 {self.exec_sha256[:12]})" if self.exec_sha256 else ""
            out.append(("exec", self.exec_path + sha))
        if self.image:
            out.append(
                (
                    "image",
                    self.image + (f" ({self.image_id})" if self.image_id else " (not on the host)"),
                )
            )
        out += [(name, v) for name, v in self.packages.items() if v]
        missing = [name for name, v in self.packages.items() if not v]
        if missing:
            out.append(("not installed", ", ".join(missing)))
        return out

    def summary(self) -> str:
        """One line: GPU, driver, CUDA, the server package."""
        if self.gpu_count:
            parts = [
                f"{self.gpu_count}x {self.gpu_model}",
                f"driver {self.driver or 'absent'}",
                f"CUDA {self.cuda or 'absent'}",
            ]
        else:
            # a CPU-only host: what runs the server is the CPU and torch's build
            parts = ["no GPU"] + ([f"CPU {self.cpu}"] if self.cpu else [])
            torch = self.packages.get("torch")
            parts += [f"torch {torch}"] if torch else []
        if self.server:
            parts.append(f"{self.server} {self.server_version or 'absent'}")
        return ", ".join(parts)


def changes(old: HostEnvironment, new: HostEnvironment) -> list[str]:
    """What differs, for people: `driver 580.65.06 -> 580.82.07`."""
    a, b = dict(old.rows()), dict(new.rows())
    keys = dict.fromkeys([*a, *b])
    return [
        f"{k} {a.get(k, 'absent')} -> {b.get(k, 'absent')}"
        for k in keys
        if a.get(k, "absent") != b.get(k, "absent")
    ]


# ---------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------


def public_env(exp: Any) -> list[tuple[str, str]]:
    """The config's environment without its secrets: they decide no package version, and
    a command line is visible to every local user (ps)."""
    from orchestrator.config.secrets import TOKEN_VALUE, is_secret_name

    refs = dict(exp.secret_refs)
    return [
        (k, v)
        for k, v in exp.env
        if k not in refs and not is_secret_name(k) and not TOKEN_VALUE.search(v)
    ]


def server_hint(exec_argv: Sequence[str]) -> str:
    """The server's package as its command line names it: the `-m` module, else the
    script's name (`vllm serve` -> vllm)."""
    argv = list(exec_argv)
    for i, word in enumerate(argv[:-1]):
        if word == "-m":
            return argv[i + 1]
    if argv and not _is_python(argv[0]):
        name = argv[0].rsplit("/", 1)[-1]
        return re.sub(r"[^A-Za-z0-9_.-]", "", name)
    return ""


def _is_python(word: str) -> bool:
    return bool(re.fullmatch(r"python[0-9.]*", word.rsplit("/", 1)[-1]))


#: the section of the files a launch names (`files=`): one line per path, its digest first
FILES_MARK = "@@FILES"
#: files past this size are known by size and time, not read whole (a weights file)
FILE_READ_LIMIT = 64 * 1024 * 1024


def files_section(files: Sequence[str]) -> str:
    """The shell that prints FILES_MARK, then `DIGEST PATH` per path: the first 16 hex of
    its sha256 (`big:SIZE:MTIME` past FILE_READ_LIMIT; `-` when it is no readable file)."""
    if not files:
        return ""
    paths = " ".join(shlex.quote(f) for f in files)
    return (
        f'echo {FILES_MARK}; for f in {paths}; do if [ -f "$f" ] && [ -r "$f" ]; then '
        's=$(stat -c %s -- "$f" 2>/dev/null); '
        f'if [ "${{s:-0}}" -le {FILE_READ_LIMIT} ]; then '
        'echo "$(sha256sum < "$f" | cut -c1-16) $f"; '
        'else echo "big:$s:$(stat -c %Y -- "$f") $f"; fi; '
        'else echo "- $f"; fi; done; '
    )


def parse_files(text: str, files: Sequence[str]) -> str | None:
    """The digest of the files section for `files` ("" when no file is named; None when
    the section is missing or does not cover every path: unknown)."""
    if not files:
        return ""
    kept = parse_file_digests(text, files)
    if kept is None:
        return None
    # a relative word that is no file there (a repository id `org/model`) is none named
    kept = tuple((f, d) for f, d in kept if f.startswith("/") or d != "-")
    if not kept:
        return ""
    blob = json.dumps([list(pair) for pair in kept])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def parse_file_digests(text: str, files: Sequence[str]) -> tuple[tuple[str, str], ...] | None:
    """Each named word's (path, digest) from the files section, in the order named (`-`
    when it is no readable file there); () when none; None when the section is missing or
    does not cover every path. A relative word that is no file is kept (`-`): a file both
    launches name that is deleted in the working directory is then seen as changed."""
    if not files:
        return ()
    body = _section(text, FILES_MARK)
    if body is None:
        return None
    seen = {}
    for line in body.splitlines():
        value, _, path = line.partition(" ")
        if path:
            seen[path] = value
    if any(f not in seen for f in files):
        return None
    return tuple((f, seen[f]) for f in files)


def command(
    exec_argv: Sequence[str],
    *,
    env: Iterable[tuple[str, str]] = (),
    workdir: str | None = None,
    files: Sequence[str] = (),
) -> str:
    """One shell command printing every fact, in sections `parse` reads (and, for the
    paths `files` a launch names, the section `parse_files` reads).

    The interpreter is the server's own: the exec when it is a Python, else the one in
    the exec script's `#!` line (a console script such as `vllm` or `sglang`), else
    python3. `env` is the config's (non-secret) environment: PYTHONPATH, a venv's PATH.
    """
    from orchestrator.config.builds import container_split, python_in_image

    argv = list(exec_argv)
    cc = container_split(argv)
    image = ""
    run_py = "$py"
    if cc is not None:
        # the server runs inside the image: its packages are read there, and the image's id
        # says which image a tag named
        rt = shlex.join(cc.runtime[:-1])
        img = shlex.quote(cc.image)
        image = (
            f"echo {IMAGE_MARK}; echo {img}; {rt} image inspect --format '{{{{.Id}}}}' "
            f"{img} 2>/dev/null; "
        )
        # python3 in the image as the server's command sees it: its -e and -v options
        # (a package overlay mounted first on its path, the user's own mounts)
        in_image = python_in_image(cc)
        find_py = f"py={shlex.quote(in_image)}; how=image"
        run_py = in_image  # its own words, quoted: `$py` would split them anew
    elif argv and _is_python(argv[0]):
        find_py = f"py={shlex.quote(argv[0])}; how=exec"
    elif argv:
        exe = shlex.quote(argv[0])
        # a shell wrapper (a release's `bin/vllm` over a shared base): the Python beside it
        find_py = (
            f"py=$(sed -n '1s/^#![[:space:]]*//p' \"$(command -v {exe})\" 2>/dev/null "
            "| head -c 300); how=shebang; "
            'case "$py" in *python*) ;; *) d=$(dirname "$(command -v '
            f'{exe})" 2>/dev/null); if [ -x "$d/python" ]; then py="$d/python"; '
            "how=beside; else py=; fi;; esac; "
            '[ -n "$py" ] || { py=python3; how=default; }'
        )
    else:
        find_py = "py=python3; how=default"
    keys = shlex.quote(json.dumps(KEY_PACKAGES))
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in env)
    cd = f"cd {shlex.quote(workdir)} 2>/dev/null; " if workdir else ""
    first = shlex.quote(argv[0]) if argv else "''"
    resolve = (
        f'echo {EXEC_MARK}; e=$(command -v {first} 2>/dev/null) && echo "$e" && '
        'sha256sum "$e" 2>/dev/null | cut -c1-64; '
    )
    # The config's environment first: every fact is read as the server would see it.
    return (
        f"{cd}{exports}"
        f"echo {NVSMI_MARK}; if command -v nvidia-smi >/dev/null 2>&1; then "
        "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader "
        f"2>&1; echo {BANNER_MARK}; nvidia-smi 2>/dev/null | head -n 6; fi; "
        f"echo {KERNEL_MARK}; uname -r; "
        f"echo {CPU_MARK}; sed -n 's/^model name[[:space:]]*: *//p' /proc/cpuinfo 2>/dev/null "
        "| sort | uniq -c; "
        f'{image}{resolve}{files_section(files)}{find_py}; echo "@@PYHOW $how $py"; '
        f"{run_py} -c {shlex.quote(_SNIPPET)} {keys} {','.join(NCCL_DISTS)} "
        f"{shlex.quote(server_hint(cc.command if cc else argv))} 2>/dev/null; true"
    )


# ---------------------------------------------------------------------------------------
# the parser
# ---------------------------------------------------------------------------------------


def _section(text: str, mark: str) -> str | None:
    """The lines after `mark` up to the next `@@` mark; None if the mark is missing."""
    lines = text.splitlines()
    if mark not in lines:
        return None
    start = lines.index(mark) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("@@")), len(lines))
    return "\n".join(lines[start:end])


def parse_gpus(text: str | None) -> tuple[str | None, int, str | None, str | None]:
    """`nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader`
    -> (model, count, memory, driver). An error text (no devices, driver not loaded)
    counts as no GPU."""
    models: list[str] = []
    drivers: list[str] = []
    mems: list[str] = []
    for line in (text or "").splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 2 or not re.match(r"\d+\.\d+", cells[1]):
            continue  # "NVIDIA-SMI has failed ...", "No devices were found"
        models.append(cells[0])
        drivers.append(cells[1])
        if len(cells) > 2:
            mems.append(cells[2])
    if not models:
        return None, 0, None, None
    model = Counter(models).most_common(1)[0][0]
    if len(set(models)) > 1:
        model = ", ".join(f"{n} x {m}" for m, n in Counter(models).items())
    return model, len(models), (mems[0] if mems else None), drivers[0]


def parse_cpus(text: str | None) -> str | None:
    """`uniq -c` of /proc/cpuinfo's model names -> `AMD EPYC (2 CPUs)`; None if unread."""
    found = []
    for line in (text or "").splitlines():
        m = re.match(r"\s*(\d+)\s+(\S.*)$", line)
        if m:
            found.append(f"{m[2].strip()} ({m[1]} CPU{'s' if m[1] != '1' else ''})")
    return ", ".join(found) or None


def parse_banner_cuda(text: str | None) -> str | None:
    """`CUDA Version: 12.8` from nvidia-smi's banner."""
    m = re.search(r"CUDA Version:\s*([0-9][0-9.]*)", text or "")
    return m[1] if m else None


def parse(text: str) -> HostEnvironment:
    """The output of `command()` -> the environment. Missing sections are absent facts."""
    model, count, mem, driver = parse_gpus(_section(text, NVSMI_MARK))
    kernel = (_section(text, KERNEL_MARK) or "").strip().splitlines()
    cpu = parse_cpus(_section(text, CPU_MARK))
    how = re.search(r"^@@PYHOW (\S+) (.*)$", text, re.M)
    data: dict[str, Any] = {}
    m = re.search(rf"^{PY_MARK} (.*)$", text, re.M)
    if m:
        try:
            loaded = json.loads(m[1])
            data = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            data = {}
    packages = data.get("packages") if isinstance(data.get("packages"), dict) else {}
    exe = [ln.strip() for ln in (_section(text, EXEC_MARK) or "").splitlines() if ln.strip()]
    sha = exe[1] if len(exe) > 1 and re.fullmatch(r"[0-9a-f]{64}", exe[1]) else None
    img = [ln.strip() for ln in (_section(text, IMAGE_MARK) or "").splitlines() if ln.strip()]
    image_id = (
        img[1] if len(img) > 1 and re.fullmatch(r"(sha256:)?[0-9a-f]{12,64}", img[1]) else None
    )
    pk = {name: _str(packages.get(name)) for name in KEY_PACKAGES}
    return HostEnvironment(
        gpu_model=model,
        gpu_count=count,
        gpu_memory=mem,
        driver=driver,
        cuda=parse_banner_cuda(_section(text, BANNER_MARK)),
        torch_cuda=_str(data.get("torch_cuda")),
        nccl=_str(data.get("nccl")),
        kernel=kernel[0].strip() if kernel and kernel[0].strip() else None,
        cpu=cpu,
        python=_str(data.get("python")),
        interpreter=(f"{how[2].strip()} ({how[1]})" if how else None) if data else None,
        server=_str(data.get("server")),
        server_version=_str(data.get("server_version")),
        packages=pk,
        exec_path=exe[0] if exe else None,
        exec_sha256=sha,
        image=img[0] if img else None,
        image_id=image_id,
    )


def _str(v: object) -> str | None:
    return str(v) if isinstance(v, str | int | float) and str(v) else None
