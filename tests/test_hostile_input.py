"""Hostile input: whatever a config says either reaches the server exactly or is refused.

Property tests (hypothesis, derandomized: the same cases on every run):

1. Flag and environment values full of quotes, backslashes, newlines, `$()`, `${X}`,
   `%` specifiers, `;`, `&&`, backticks, non-BMP and right-to-left text, values of a
   few KB, leading dashes, empty strings and NUL either round-trip exactly to the
   server's argv and environment on the real systemd host (drop-in written by the real
   `SystemdManager.install` over the real SSH transport, the server's own
   `/proc/self/cmdline` and `/proc/self/environ` read back) and through the process
   manager over the real sshd, or are refused by `load_experiment` with a `ConfigError`
   naming the key. Refused, because no host can carry them: NUL (it ends a C string),
   lone surrogates (not Unicode text) and Unicode noncharacters (systemd refuses the
   whole unit line as "not UTF-8 clean"). Everything else round-trips, newlines and
   other control characters in environment values included (systemd takes C escapes
   in Environment=).
2. Unit names and paths that would escape their directory are refused at load; any
   unit name the config accepts puts the drop-in inside `unit_dir/UNIT.d/`.
3. Random and malformed YAML (experiment files with and without `extends`, hosts and
   sweep files, invalid UTF-8, binary garbage) loads or raises our error naming the
   file; the CLI exits 2 with an `error:` line and no traceback.
4. Secrets stay private on the host: the drop-in is 0600 and root's, and a secret
   environment value is in a 0600 EnvironmentFile=, never in what systemd serves to an
   unprivileged user over D-Bus (`systemctl show -p Environment`).
"""

from __future__ import annotations

import base64
import itertools
import os
import posixpath
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from orchestrator.cli import main
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host, load_inventory
from orchestrator.config.loading import load_experiment
from orchestrator.config.sweep import load_sweep
from orchestrator.errors import ConfigError, UsageError
from orchestrator.execution.services.process import ProcessManager
from orchestrator.execution.services.systemd import ENV_FILE_NAME, SystemdManager
from orchestrator.execution.transport.local import LocalTransport
from orchestrator.execution.transport.ssh import SSHTransport
from orchestrator.lab.sdhosts import SystemdHost, SystemdHostFactory
from orchestrator.lab.sshd import SshdEndpoint
from tests.hosts.wait import wait_until

UNIT = "hostile-argv.service"
DUMP = "/run/hostile"  # the server copies its cmdline and environ here
#: The "server": copies its own argv and environment, byte for byte, where we read them.
DUMPER = (
    "import shutil, sys; d = sys.argv[1]; "
    "shutil.copy('/proc/self/environ', d + '.environ'); "
    "shutil.copy('/proc/self/cmdline', d + '.argv')"
)
#: set in the controller's environment; `${HOSTILE_SECRET}` values resolve to it
SECRET_VALUE = "tok\"en' $(id) `id` ${HOME} %n %% \\ \\n\n\t😀 ‮ ;&& end"
UNSET_REF = "${HOSTILE_NOT_SET}"
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
#: the same cases on every run: no example database, no random seed, no deadline
BASE = settings(derandomize=True, database=None, deadline=None, suppress_health_check=_SLOW_OK)


def cases(n: int, *, health: tuple[HealthCheck, ...] = (), shrink: bool = True) -> settings:
    """BASE with `n` examples (the module's tests run about 2,000 in all). Tests on a
    host do not shrink a failure: each step costs seconds, the first example is shown."""
    phases = list(Phase) if shrink else [Phase.explicit, Phase.reuse, Phase.generate]
    return settings(BASE, max_examples=n, suppress_health_check=[*_SLOW_OK, *health], phases=phases)


# ------------------------------------------------------------------------------ values

PIECES = [
    '"',
    "'",
    "\\",
    "\\\\",
    "\n",
    "\r\n",
    "\r",
    "\t",
    "$(id)",
    "${X}",
    "$X",
    "$$",
    "$",
    "$HOME",
    "%n",
    "%%",
    "%",
    "%i",
    "%{x}",
    ";",
    "&&",
    "||",
    "|",
    "`id`",
    "#",
    " ",
    "  ",
    "-",
    "--",
    "--x",
    "-rf",
    "=",
    "*",
    "?",
    "~",
    "!",
    "<",
    ">",
    "ü",
    "✓",
    "😀",
    "\U0001f9ea",
    "\u202e",
    "\u05e9\u05dc\u05d5\u05dd",
    "\u0627\u0644\u0639\u0631\u0628",
    "\u200b",
    "\ufeff",
    "\x00",
    "\x01",
    "\x1b[31m",
    "\x7f",
    "\x85",
    "\u2028",
    "\ufffe",
    "\ufdd0",
    "\U0010ffff",
    "\\x41",
    "\\n",
    "\\x00",
    "'\"'",
    '\\"',
    "null",
    "~",
    "0x1F",
    "[REDACTED:X]",
    "\xa0",
    "\U000e0041",
]

#: a value made of the pieces and arbitrary text, or a long one, or a special case
hostile_text = st.one_of(
    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=12).map("".join),
    st.text(max_size=40),
    st.tuples(st.text(min_size=1, max_size=7), st.integers(150, 600)).map(
        lambda t: (t[0] * t[1])[:4000]
    ),
    st.sampled_from(["", "-", "--", "-5", "--port", "${HOSTILE_SECRET}", UNSET_REF]),
)

#: a flag's YAML value: text, a list of words, or a number
flag_value = st.one_of(
    hostile_text,
    hostile_text,
    st.lists(hostile_text, min_size=1, max_size=3),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
)
env_value = st.one_of(hostile_text, hostile_text, st.integers(-(10**9), 10**9))


def refused(text: str) -> bool:
    """Our rule for what no host can carry (the module docstring says why)."""
    return any(
        ch == "\x00"
        or 0xD800 <= ord(ch) <= 0xDFFF
        or 0xFDD0 <= ord(ch) <= 0xFDEF
        or (ord(ch) & 0xFFFE) == 0xFFFE
        for ch in text
    )


def expected_text(value: str) -> str | None:
    """What the server must get for a YAML string value, or None when it must be refused."""
    if value == UNSET_REF:
        return None
    if value == "${HOSTILE_SECRET}":
        return SECRET_VALUE
    return None if refused(value) else value


def expected_words(value: Any) -> list[str] | None:
    """The argv words after `--flag` for a generated flag value, or None when refused."""
    if isinstance(value, list):  # a `${VAR}` reference is a whole value, never a list item
        return (
            None
            if any(refused(v) for v in value if isinstance(v, str))
            else [_word(v) for v in value]
        )
    if isinstance(value, bool):
        return []
    if isinstance(value, str):
        text = expected_text(value)
        return None if text is None else [text]
    return [_word(value)]


def _word(value: str | int | float) -> str:
    return repr(value) if isinstance(value, float) else str(value)


@pytest.fixture(scope="module", autouse=True)
def secret_in_environment() -> Iterator[None]:
    """`${HOSTILE_SECRET}` resolves (from the controller's environment); one stays unset."""
    old = os.environ.get("HOSTILE_SECRET")
    os.environ["HOSTILE_SECRET"] = SECRET_VALUE
    os.environ.pop("HOSTILE_NOT_SET", None)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("HOSTILE_SECRET", None)
        else:
            os.environ["HOSTILE_SECRET"] = old


class Files:
    """Fresh numbered directories under one module temp dir (hypothesis examples cannot
    use the function-scoped `tmp_path`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._n = itertools.count()

    def fresh(self) -> Path:
        d = self.root / f"case{next(self._n)}"
        d.mkdir()
        return d


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    return Files(tmp_path_factory.mktemp("hostile"))


def write_yaml(path: Path, data: Any, *, exact: bool = True) -> Path:
    """`data` as YAML; `exact`: check PyYAML reads back what it wrote (it does not for
    some lone line-break characters, which only the malformed-file tests may meet)."""
    # Double quotes for every string: PyYAML's plain style loses a lone U+0085 or U+2028.
    text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False, width=10**6, default_style='"')
    loaded = yaml.safe_load(text)
    assert not exact or loaded == data or repr(loaded) == repr(data)
    path.write_text(text, encoding="utf-8")
    return path


def experiment_doc(
    flags: dict[str, Any], env: dict[str, Any], *, exec_: str, unit: str | None = None
) -> dict[str, Any]:
    service: dict[str, Any] = {"exec": exec_, "flags": flags, "env": env}
    if unit is not None:
        service["unit"] = unit
    return {"name": "hostile", "service": service, "health": {"port": 30000}}


@dataclass
class Batch:
    """The generated values that load, as one experiment, and what the server must get."""

    exp: Experiment
    words: dict[str, list[str]]  # flag -> argv words after it
    env: dict[str, str]


def sort_out(
    files: Files,
    flags: list[Any],
    envs: list[Any],
    *,
    exec_: str,
    unit: str | None = None,
    private_every: int = 3,
) -> Batch:
    """Load every value on its own: refused ones must be refused with our error naming
    their key; the rest are loaded together as the batch's experiment."""
    d = files.fresh()
    ok_flags: dict[str, Any] = {}
    words: dict[str, list[str]] = {}
    for i, value in enumerate(flags):
        name = f"v{i}"
        want = expected_words(value)
        path = write_yaml(d / f"{name}.yaml", experiment_doc({name: value}, {}, exec_=exec_))
        if want is None:
            with pytest.raises(ConfigError) as err:
                load_experiment(path)
            assert err.value.key == f"service.flags.{name}", str(err.value)
            assert str(path) in str(err.value)
        else:
            assert load_experiment(path).argv()[-1 - len(want) :] == [f"--{name}", *want]
            ok_flags[name], words[name] = value, want
    ok_env: dict[str, Any] = {}
    env: dict[str, str] = {}
    for i, value in enumerate(envs):
        # every third is named like a secret: it goes to the EnvironmentFile=
        key = f"HOSTILE_TOKEN_{i}" if i % private_every == 0 else f"HOSTILE_E{i}"
        want = expected_text(value) if isinstance(value, str) else str(value)
        path = write_yaml(d / f"{key}.yaml", experiment_doc({}, {key: value}, exec_=exec_))
        if want is None:
            with pytest.raises(ConfigError) as err:
                load_experiment(path)
            assert err.value.key == f"service.env.{key}", str(err.value)
            assert str(path) in str(err.value)
        else:
            assert load_experiment(path).env_map() == {key: want}
            ok_env[key], env[key] = value, want
    doc = experiment_doc(ok_flags, ok_env, exec_=exec_, unit=unit)
    exp = load_experiment(write_yaml(d / "batch.yaml", doc))
    return Batch(exp, words, env)


def check_argv(got: list[str], batch: Batch, prefix: list[str]) -> None:
    assert got == batch.exp.argv()  # the whole command line, word for word
    assert got[: len(prefix)] == prefix
    rest = got[len(prefix) :]
    for name, words in batch.words.items():
        i = rest.index(f"--{name}")
        assert rest[i + 1 : i + 1 + len(words)] == words, name


def check_env(got: dict[str, str], batch: Batch) -> None:
    ours = {k: v for k, v in got.items() if k.startswith("HOSTILE_")}
    assert ours == batch.env


def nul_split(raw: bytes) -> list[str]:
    return [w.decode("utf-8", "surrogateescape") for w in raw.split(b"\0")[:-1]]


def environ_of(raw: bytes) -> dict[str, str]:
    return dict(w.partition("=")[::2] for w in nul_split(raw))


# ------------------------------------------------------------------ 1. the systemd host

SD_UNIT = """\
[Unit]
Description=argv/environment dumper for the hostile-input tests

[Service]
Type=oneshot
ExecStart=/bin/true
"""
SD_EXEC = shlex.join(["/usr/bin/python3", "-c", DUMPER, DUMP])


@dataclass
class SdBox:
    box: SystemdHost
    host: Host
    transport: SSHTransport
    manager: SystemdManager

    def sh(self, command: str, *, check: bool = True) -> str:
        return self.box.ssh_run(command, check=check, timeout=120).stdout

    def read_bytes(self, path: str) -> bytes:
        return base64.b64decode(self.sh(f"base64 -w0 {shlex.quote(path)}"))


@pytest.fixture(scope="module")
def sd(
    systemd_hosts: SystemdHostFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SdBox]:
    """One booted host for the module, the dumper unit installed, one SSH connection."""
    box = systemd_hosts.boot()
    try:
        box.install_unit(UNIT, SD_UNIT)
        hosts_file = tmp_path_factory.mktemp("sd-hosts") / "hosts.yaml"
        hosts_file.write_text(box.hosts_yaml("sd"))
        host = load_inventory(hosts_file).host("sd")
        transport = SSHTransport(host)
        try:
            manager = SystemdManager(host, transport, name=UNIT, campaign="hostile")
            manager.prepare()
            yield SdBox(box, host, transport, manager)
            manager.restore()
        finally:
            transport.close()
    finally:
        systemd_hosts.stop(box)


def run_on_systemd(sd: SdBox, batch: Batch, run_id: str) -> tuple[list[str], dict[str, str]]:
    """Install through the real manager (read-back must agree), run, read the dumps."""
    problem = sd.manager.install(batch.exp, env_keys=frozenset(), run_id=run_id)
    assert problem is None, problem
    r = sd.box.ssh_run(
        f"rm -f {DUMP}.argv {DUMP}.environ; systemctl start {UNIT}", check=False, timeout=120
    )
    why = f"systemctl show {UNIT} -p Result -p ExecMainStatus; journalctl -u {UNIT} -n 15 -o cat"
    assert r.returncode == 0, (r.stderr, sd.sh(why, check=False))
    return nul_split(sd.read_bytes(f"{DUMP}.argv")), environ_of(sd.read_bytes(f"{DUMP}.environ"))


@cases(15, shrink=False)
@given(
    flags=st.lists(flag_value, min_size=25, max_size=40),
    envs=st.lists(env_value, min_size=8, max_size=16),
)
def test_values_round_trip_to_the_systemd_server_or_are_refused(
    sd: SdBox, files: Files, flags: list[Any], envs: list[Any]
) -> None:
    batch = sort_out(files, flags, envs, exec_=SD_EXEC, unit=UNIT)
    argv, environ = run_on_systemd(sd, batch, run_id=f"b{next(_runs)}")
    check_argv(argv, batch, ["/usr/bin/python3", "-c", DUMPER, DUMP])
    check_env(environ, batch)


_runs = itertools.count()


def test_secret_environment_is_private_on_the_systemd_host(sd: SdBox, files: Files) -> None:
    """Drop-in 0600 root:root; secret values in a 0600 EnvironmentFile=, absent from
    `systemctl show` and D-Bus as an unprivileged user, present in the server's env."""
    plain = "visible value"
    batch = sort_out(files, [], ["${HOSTILE_SECRET}"], exec_=SD_EXEC, unit=UNIT)
    token = "hf_" + "A1b2C3d4" * 4  # looks like a token: private whatever its name
    exp = batch.exp.with_changes(env={"HOSTILE_PLAIN": plain, "HOSTILE_LOOKS": token})
    batch = Batch(exp, {}, {**batch.env, "HOSTILE_PLAIN": plain, "HOSTILE_LOOKS": token})
    _, environ = run_on_systemd(sd, batch, run_id="private")
    check_env(environ, batch)  # the server got all three

    dropin, env_file = sd.manager.dropin, sd.manager.env_file
    assert env_file == posixpath.join(posixpath.dirname(dropin), ENV_FILE_NAME)
    for path in (dropin, env_file):
        assert sd.sh(f"stat -c '%a %U %G' {shlex.quote(path)}").split() == ["600", "root", "root"]
    text = sd.sh(f"cat {shlex.quote(dropin)}")
    assert SECRET_VALUE not in text and token not in text and "HOSTILE_TOKEN_0" in text
    assert 'Environment="HOSTILE_PLAIN=visible value"' in text  # not secret: stays visible

    as_nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups "
    shown = sd.sh(as_nobody + f"systemctl show {UNIT} -p Environment -p EnvironmentFiles")
    bus = sd.sh(
        as_nobody + "busctl --json=short get-property org.freedesktop.systemd1 "
        "/org/freedesktop/systemd1/unit/hostile_2dargv_2eservice "
        "org.freedesktop.systemd1.Service Environment"
    )
    assert "HOSTILE_PLAIN=visible value" in shown  # the check can see Environment=
    assert env_file in shown
    for out in (shown, bus):
        for secret in (SECRET_VALUE, token, 'tok\\"en', "A1b2C3d4"):
            assert secret not in out
    assert sd.box.ssh_run(as_nobody + f"cat {shlex.quote(env_file)}").returncode != 0

    # Restore takes the environment file away with the drop-in.
    sd.manager.restore()
    assert sd.box.ssh_run(f"test -e {shlex.quote(env_file)}").returncode != 0
    assert sd.box.ssh_run(f"test -e {shlex.quote(dropin)}").returncode != 0
    sd.manager.prepare()


def test_env_file_tampered_after_writing_is_a_read_back_mismatch(sd: SdBox, files: Files) -> None:
    """The read-back compares the environment file's content, not just its name."""
    batch = sort_out(files, [], ["${HOSTILE_SECRET}"], exec_=SD_EXEC, unit=UNIT)
    # Another EnvironmentFile= after ours would override it: the read-back must notice.
    sd.box.install_unit(
        f"{UNIT}.d/zz-other.conf", "[Service]\nEnvironmentFile=-/etc/hostile-other.env\n"
    )
    try:
        problem = sd.manager.install(batch.exp, env_keys=frozenset(), run_id="tamper")
        assert problem is not None and "EnvironmentFiles read back differs" in problem
    finally:
        sd.sh(f"rm -f /etc/systemd/system/{UNIT}.d/zz-other.conf; systemctl daemon-reload")


# --------------------------------------------------------------- 1b. the process manager


@pytest.fixture(scope="module")
def proc_host(
    sshd: SshdEndpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ProcessManager, Path]]:
    d = tmp_path_factory.mktemp("proc-hosts")
    hosts = d / "hosts.yaml"
    hosts.write_text(sshd.hosts_yaml("p", run_dir=str(d / "run")))
    host = load_inventory(hosts).host("p")
    transport = SSHTransport(host)
    try:
        manager = ProcessManager(host, transport, name="hostile", campaign="hostile")
        manager.prepare()
        yield manager, d / "dump"
        manager.restore()
    finally:
        transport.close()


@cases(5, shrink=False)
@given(
    flags=st.lists(flag_value, min_size=20, max_size=30),
    envs=st.lists(env_value, min_size=5, max_size=10),
)
def test_values_round_trip_through_the_process_manager_or_are_refused(
    proc_host: tuple[ProcessManager, Path], files: Files, flags: list[Any], envs: list[Any]
) -> None:
    manager, dump = proc_host
    exec_ = shlex.join(["python3", "-c", DUMPER, str(dump)])
    batch = sort_out(files, flags, envs, exec_=exec_)
    for suffix in (".argv", ".environ"):
        Path(f"{dump}{suffix}").unlink(missing_ok=True)
    assert manager.install(batch.exp, env_keys=frozenset(), run_id="p") is None
    manager.start(batch.exp, run_id=f"p{next(_runs)}")
    argv_file = Path(f"{dump}.argv")
    wait_until(argv_file.exists, timeout=20, what="the server's argv dump")
    check_argv(nul_split(argv_file.read_bytes()), batch, ["python3", "-c", DUMPER, str(dump)])
    check_env(environ_of(Path(f"{dump}.environ").read_bytes()), batch)


def test_ssh_output_keeps_multibyte_characters_whole(
    proc_host: tuple[ProcessManager, Path],
) -> None:
    """Output is read in chunks; a character cut by a chunk boundary must stay whole."""
    manager, _ = proc_host
    text = "aü😀‮b" * 3000  # 11 bytes: chunk boundaries fall at every offset of it
    r = manager.t.run(
        f"python3 -c {shlex.quote(f'print({text!r})')} >&2; "
        f"python3 -c {shlex.quote(f'print({text!r})')}",
        timeout=30,
    )
    assert r.stdout == text + "\n" and r.stderr == text + "\n"


# ------------------------------------------------------------ 2. names and paths refused

unit_text = st.one_of(
    st.lists(
        st.sampled_from(
            [
                "/",
                "..",
                ".",
                "x",
                "service",
                ".service",
                "\\",
                "@",
                ":",
                "-",
                "_",
                "etc",
                "~",
                " ",
                "\n",
                "\x00",
                "%n",
                "$X",
                "*",
                "ü",
                "A",
                "9",
            ]
        ),
        max_size=10,
    ).map("".join),
    st.text(max_size=30),
    st.sampled_from(
        [
            "x.service/../../etc",
            "../x.service",
            "/etc/passwd",
            "..",
            ".",
            "a/b.service",
            "-H.service",
            "--root=.service",
            "x" * 300 + ".service",
            "..service",
            "...service",
            "x.service\n",
            "x.Service",
            "x.",
            "x.service/",
            "./x.service",
        ]
    ),
)


@cases(400)
@given(
    unit=unit_text,
    unit_dir=st.sampled_from(
        ["/etc/systemd/system", "/run/systemd/system/", "/x/../etc/systemd/system"]
    ),
)
def test_a_unit_name_is_refused_at_load_or_its_drop_in_stays_in_unit_dir(
    files: Files, unit: str, unit_dir: str
) -> None:
    path = write_yaml(
        files.fresh() / "u.yaml", experiment_doc({}, {}, exec_="/bin/true", unit=unit)
    )
    try:
        exp = load_experiment(path)
    except ConfigError as exc:
        assert exc.key == "service.unit" and str(path) in str(exc)
        return
    assert exp.unit == unit
    host = Host(name="h", address="127.0.0.1", transport="local", unit_dir=unit_dir)
    mgr = SystemdManager(host, LocalTransport(host), name=unit)  # accepts what load accepts
    inside = posixpath.normpath(unit_dir) + "/"
    for p in (mgr.dropin, mgr.env_file):
        norm = posixpath.normpath(p)
        assert norm.startswith(inside), p
        assert posixpath.dirname(norm) == inside + unit + ".d"
    assert not unit.startswith("-") and "/" not in unit and "\x00" not in unit


@cases(150)
@given(
    workdir=st.one_of(
        hostile_text,
        st.sampled_from(
            [
                "relative/dir",
                ".",
                "..",
                "~",
                "",
                "/ok",
                "/a\nExecStartPre=/bin/false",
                "/x\x00",
                "-/opt",
                "/opt ",
                "/opt/%n",
                "/a b/ü",
            ]
        ),
    )
)
def test_workdir_is_refused_unless_an_absolute_single_line_path(files: Files, workdir: str) -> None:
    doc = experiment_doc({}, {}, exec_="/bin/true")
    doc["service"]["workdir"] = workdir
    path = write_yaml(files.fresh() / "w.yaml", doc)
    ok = (
        workdir.startswith("/")
        and not re.search(r"[\x00-\x1f\x7f]", workdir)
        and not refused(workdir)
        and workdir == workdir.rstrip()
    )
    try:
        exp = load_experiment(path)
    except ConfigError as exc:
        assert not ok, str(exc)
        assert exc.key == "service.workdir" and str(path) in str(exc)
        return
    assert ok and exp.workdir == workdir


@cases(100)
@given(
    key=st.sampled_from(["unit_dir", "run_dir"]),
    value=st.one_of(
        hostile_text,
        st.sampled_from(["etc/systemd/system", "./units", "../x", "~/units", "/ok/dir", "/a\nb"]),
    ),
)
def test_host_directories_must_be_absolute(files: Files, key: str, value: str) -> None:
    entry = {"address": "127.0.0.1", "transport": "local", key: value}
    path = write_yaml(files.fresh() / "hosts.yaml", {"hosts": {"h": entry}})
    ok = value.startswith("/") and not re.search(r"[\x00-\x1f\x7f]", value)
    try:
        host = load_inventory(path).host("h")
    except ConfigError as exc:
        assert not ok, str(exc)
        assert exc.key == f"hosts.h.{key}" and str(path) in str(exc)
        return
    assert ok and getattr(host, key) == value


def test_process_manager_directory_stays_in_run_dir() -> None:
    for name in ("..", ".", "../..", "a/../../b", "/etc", "x\x00y", ""):
        host = Host(name="h", address="127.0.0.1", transport="local", run_dir="/srv/run")
        mgr = ProcessManager(host, LocalTransport(host), name=name)
        assert posixpath.dirname(posixpath.normpath(mgr.dir)) == "/srv/run", (name, mgr.dir)


def test_lone_surrogates_from_yaml_escapes_are_refused(files: Files) -> None:
    """YAML's `\\ud800` escape makes a lone surrogate, which no host can receive."""
    d = files.fresh()
    for key, where in (("flags", "service.flags.v"), ("env", "service.env.V")):
        name = where.rsplit(".", 1)[1]
        path = d / f"{key}.yaml"
        path.write_text(
            f'service:\n  exec: /bin/true\n  {key}: {{{name}: "a\\ud800b"}}\nhealth: {{port: 1}}\n'
        )
        with pytest.raises(ConfigError) as err:
            load_experiment(path)
        assert err.value.key == where and "surrogate" in str(err.value)


# ------------------------------------------------------ 3. malformed files: our error only

EXPERIMENT_KEYS = [
    "name",
    "description",
    "extends",
    "service",
    "health",
    "probe",
    "requires",
    "version",
    "unit",
    "exec",
    "flags",
    "env",
    "workdir",
    "path",
    "port",
    "timeout",
    "ready_after",
    "interval",
    "run",
    "metric",
    "pass_if",
]
HOSTS_KEYS = [
    "hosts",
    "pools",
    "defaults",
    "address",
    "user",
    "port",
    "identity_file",
    "known_hosts",
    "sudo",
    "transport",
    "service_manager",
    "unit_dir",
    "run_dir",
    "labels",
    "class",
    "env",
    "connect_timeout",
    "local",
    "ssh",
    "systemd",
    "process",
]
SWEEP_KEYS = [
    "name",
    "base",
    "matrix",
    "env_matrix",
    "configs",
    "repeat",
    "host",
    "reference",
    "tp-size",
    "NCCL_ALGO",
]


def typos(keys: list[str]) -> st.SearchStrategy[str]:
    """Real key names, misspelt ones, and anything."""
    return st.one_of(
        st.sampled_from(keys),
        st.sampled_from(keys).map(lambda k: k[:-1] or "x"),
        st.sampled_from(keys).map(lambda k: k.upper()),
        st.sampled_from(keys).map(lambda k: k.replace("_", "-")),
        st.text(max_size=8),
    )


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63, max_value=2**80),
    st.floats(),
    hostile_text,
    st.sampled_from(
        [
            "15m",
            "1h30m",
            "0s",
            "-5s",
            "5 parsecs",
            "ms",
            "1e400",
            "nan",
            ".inf",
            "30000",
            "yes",
            "no",
            "on",
            "~",
            ">= 3000",
            ">=",
            "(((",
            "[",
            "{",
            "experiments/x.yaml",
            "../../../../etc/passwd",
            "/dev/zero",
            "/etc",
            "a.yaml\x00b",
            "",
            ".",
        ]
    ),
)


def documents(keys: list[str]) -> st.SearchStrategy[Any]:
    """Nested mappings and lists whose keys are mostly the file kind's real names."""
    tree = st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(typos(keys), inner, max_size=5)
        ),
        max_leaves=25,
    )
    return st.one_of(st.dictionaries(typos(keys), tree, max_size=6), tree)


@st.composite
def file_bytes(draw: st.DrawFn, keys: list[str]) -> bytes:
    """A document as YAML, then maybe damaged: duplicate keys, tabs, bad bytes, garbage."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200))
    doc = draw(documents(keys))
    try:
        text = yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)
    except yaml.YAMLError:
        text = repr(doc)
    data = text.encode("utf-8", "surrogatepass")
    lines = data.split(b"\n")
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        damage = draw(st.sampled_from(["dup", "tab", "bytes", "cut", "indent", "anchor"]))
        if damage == "dup":
            lines.insert(i, lines[i])
        elif damage == "tab":
            lines[i] = b"\t" + lines[i]
        elif damage == "bytes":
            lines[i] += draw(
                st.sampled_from([b"\xff\xfe", b"\xc3", b"\x00", b"\xed\xa0\x80", b"\x1b", b"\x85"])
            )
        elif damage == "cut":
            lines[i] = lines[i][: len(lines[i]) // 2]
        elif damage == "indent":
            lines[i] = b"   " + lines[i]
        else:
            lines[i] += b" &a *a"
    return b"\n".join(lines)


def assert_our_error(exc: BaseException, *files_: Path) -> None:
    assert isinstance(exc, ConfigError | UsageError), repr(exc)
    message = str(exc)
    assert any(str(f) in message for f in files_), message


@pytest.mark.slow
@cases(300)
@given(body=file_bytes(EXPERIMENT_KEYS))
def test_any_experiment_file_loads_or_names_itself_in_our_error(files: Files, body: bytes) -> None:
    path = files.fresh() / "exp.yaml"
    path.write_bytes(body)
    try:
        load_experiment(path)
    except Exception as exc:  # noqa: BLE001 (the property: only our errors escape)
        assert_our_error(exc, path)


@pytest.mark.slow
@cases(200)
@given(
    parent=file_bytes(EXPERIMENT_KEYS),
    child=documents(EXPERIMENT_KEYS),
    target=st.one_of(st.just("parent.yaml"), st.just("child.yaml"), scalars),
)
@example(parent=b"", child={}, target="/dev/zero")  # a device: read forever
@example(parent=b"", child={}, target="/etc")  # a directory
def test_extends_chains_load_or_name_the_bad_file(
    files: Files, parent: bytes, child: Any, target: Any
) -> None:
    d = files.fresh()
    (d / "parent.yaml").write_bytes(parent)
    doc = dict(child) if isinstance(child, dict) else {"service": child}
    doc["extends"] = target
    path = write_yaml(d / "child.yaml", doc, exact=False)
    try:
        load_experiment(path)
    except Exception as exc:  # noqa: BLE001
        assert_our_error(exc, path, d / "parent.yaml", d)


@pytest.mark.slow
@cases(300)
@given(body=file_bytes(HOSTS_KEYS))
def test_any_hosts_file_loads_or_names_itself_in_our_error(files: Files, body: bytes) -> None:
    path = files.fresh() / "hosts.yaml"
    path.write_bytes(body)
    try:
        inv = load_inventory(path)
        for name in list(inv.hosts) + list(inv.pools):
            inv.resolve(name)
    except Exception as exc:  # noqa: BLE001
        assert_our_error(exc, path)


@pytest.mark.slow
@cases(200)
@given(body=file_bytes(SWEEP_KEYS), base=st.booleans())
def test_any_sweep_file_loads_or_names_the_bad_file(files: Files, body: bytes, base: bool) -> None:
    d = files.fresh()
    write_yaml(d / "base.yaml", experiment_doc({"tp-size": 8}, {}, exec_="/bin/true"))
    path = d / "sweep.yaml"
    if base:  # a valid base, so the matrix is reached
        try:
            doc = yaml.safe_load(body)
        except yaml.YAMLError:
            doc = None
        if isinstance(doc, dict):
            doc["base"] = "base.yaml"
            body = yaml.safe_dump(doc, allow_unicode=True).encode("utf-8", "surrogatepass")
    path.write_bytes(body)
    try:
        load_sweep(path)
    except Exception as exc:  # noqa: BLE001
        assert_our_error(exc, path, d)


@pytest.mark.slow
@cases(100, health=(HealthCheck.function_scoped_fixture,))
@given(body=file_bytes(EXPERIMENT_KEYS))
def test_cli_plan_exits_2_with_one_error_line_and_no_traceback(
    files: Files, capsys: pytest.CaptureFixture[str], body: bytes
) -> None:
    d = files.fresh()
    good = write_yaml(d / "good.yaml", experiment_doc({"tp-size": 8}, {}, exec_="/bin/true"))
    bad = d / "bad.yaml"
    bad.write_bytes(body)
    capsys.readouterr()
    code = main(["plan", "--good", str(good), "--bad", str(bad)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if code == 0:
        return
    assert code == 2, (code, err)
    lines = err.splitlines()
    assert lines and lines[0].startswith("error: "), err
    try:
        load_experiment(bad)
    except ConfigError:
        assert str(bad) in lines[0], err
    assert all(line.startswith("  hint: ") for line in lines[1:]), err


@pytest.mark.parametrize(
    "text",
    [
        "root:$6$SECRETHASH:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n",  # /etc/shadow
        "hosts: {}\n'SECRET token=abc def': 1\n",  # one line of it among a real file
        "SECRETLINE\n",  # a plain text file
    ],
)
def test_a_file_that_is_no_hosts_file_is_refused_without_its_content(
    tmp_path: Path, text: str
) -> None:
    from orchestrator.config.hosts import load_inventory
    from orchestrator.errors import ConfigError

    path = tmp_path / "shadow"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_inventory(path)
    said = str(err.value) + (err.value.hint or "") + (err.value.key or "")
    assert str(path) in said
    assert "SECRET" not in said and "19000" not in said, said
    # a typo of a real key is still quoted, with the close match
    path.write_text("hostss: {}\n")
    with pytest.raises(ConfigError, match="did you mean 'hosts'"):
        load_inventory(path)
