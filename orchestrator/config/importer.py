"""Import what users already have into an experiment config.

Sources: a systemd unit file (its `ExecStart=` and `Environment=` lines), a shell launch
script, or a command line (`VAR=x python -m sglang.launch_server --tp-size 8 ...`). Each
is read as its reader would read it: a unit as systemd does (quoting, specifiers, `$VAR`
substitution, `ExecStart=` prefixes), a script as the shell does (variables, `"$@"`,
`bash -c '...'`: see `shellwords`), options as argparse does (`-tp 8` is a known server's
long option: see `shortopts`). What cannot be read is refused naming it; what was read in
a way worth saying is in the spec's `notes`. The result is a plain mapping in the
experiment YAML's shape; `render_yaml` writes it, and importing the rendered command
gives the same config back.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from orchestrator.config import shellwords
from orchestrator.config.experiment import option_word
from orchestrator.config.shortopts import is_option, read_short, server_of
from orchestrator.config.yamlio import read_text_file
from orchestrator.errors import ConfigError

_SHELL_BUILTINS = frozenset(
    "set cd echo source . trap wait sleep exit return true false ulimit umask if then fi "
    "for do done while case esac function local printf test [ [[ mkdir rm cp mv".split()
)
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NUMBER_INT = re.compile(r"^-?\d+$")
_NUMBER_FLOAT = re.compile(r"^-?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][-+]?\d+)$")


def typed(text: str) -> int | float | str:
    """A flag value's YAML type: numbers stay numbers when they print back identically."""
    if _NUMBER_INT.match(text) and str(int(text)) == text:
        return int(text)
    if _NUMBER_FLOAT.match(text):
        value = float(text)
        if repr(value) == text:
            return value
    return text


_PYTHON = re.compile(r"^python[0-9.]*$")
#: python's own options that take the next word as their value
_PYTHON_VALUED = frozenset({"-W", "-X", "--check-hash-based-pycs"})
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
#: words that open a command without being it (`then exec python ...`)
_RESERVED = frozenset({"then", "do", "else", "{", "!", "time"})


def _program_end(words: list[str], i: int) -> int:
    """Index after the command's own words (`python -m sglang.launch_server`, `vllm serve
    /m`): the server's options start there. For python, its own options (`-u`, `-X dev`)
    and the module or script are the command's; for vLLM and SGLang the subcommand and
    positionals are; for any other program, every word before its first `--option` (a
    wrapper's `numactl -N 0 python ...` stays the command, as it always was)."""
    base = PurePosixPath(words[i]).name
    if _PYTHON.match(base):
        i += 1
        while i < len(words) and words[i].startswith("-") and words[i] != "-":
            w = words[i]
            if w in ("-m", "-c"):
                i += 2
                break
            if w.startswith(("-m", "-c")) and not w.startswith("--"):
                i += 1
                break
            i += 2 if w in _PYTHON_VALUED else 1
        else:
            i += 1  # the script
    elif base in ("vllm", "sglang"):
        i += 1
    else:
        while i < len(words) and not words[i].startswith("--"):
            i += 1
        return i
    while i < len(words) and not is_option(words[i]):
        i += 1  # positionals (`serve /models/m`) stay with the command
    return min(i, len(words))


def parse_command(
    words: list[str], *, source: str, notes: list[str] | None = None
) -> dict[str, Any]:
    """argv words (maybe with leading VAR=x or `env`) -> {exec, flags, env}.

    Options are read as argparse reads them: `--x v`, `--x=v`, `-x v`, `-x=v`; a short
    option of a known server by its long name (`-tp 8` is `tensor-parallel-size: 8`, vLLM's
    `-O3` is `optimization-level: 3`), any other kept as written (`-x`), never taken as
    the value of the flag before it."""
    env: dict[str, str] = {}
    i = 0
    if words and words[0] in ("exec", "nohup"):
        i += 1
    if i < len(words) and Path(words[i]).name == "env":
        i += 1
    while i < len(words) and _ASSIGN.match(words[i]):
        m = _ASSIGN.match(words[i])
        assert m
        env[m[1]] = m[2]
        i += 1
    # `docker run ... IMAGE` / `podman run ...`: the runtime, its options and the image
    # open the command; the image is the build; the server's own command line follows
    head, i, build, entry = container_exec(words, i, source=source, notes=notes)
    if not head and (i >= len(words) or is_option(words[i])):
        raise ConfigError("no command found before the first --flag", file=source)
    if entry:
        # the image's entry point (`--entrypoint python3`, `vllm serve` of vLLM's image)
        # runs first: the words after the image are its arguments, read as its own
        end = i + max(_program_end([*entry, *words[i:]], 0) - len(entry), 0)
    else:
        end = _program_end(words, i) if i < len(words) and not is_option(words[i]) else i
    exec_words = head + words[i:end]
    i = end
    server = server_of([*exec_words, *entry])
    flags: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    while i < len(words):
        word = words[i]
        if not is_option(word) or word == "--":
            raise ConfigError(
                f"positional argument {word!r} after the flags is not supported",
                file=source,
                hint="move positional arguments before the first --flag (they become part of exec)",
            )
        switch = False
        if word.startswith("--"):
            name, eq, text = word[2:].partition("=")
            inline: str | None = text if eq else None
        else:
            name, inline, switch = read_short(word, server)
        i += 1
        if inline is not None:
            value: Any = typed(inline)
        elif switch:
            value = True
        else:
            values = []
            while i < len(words) and not is_option(words[i]):
                values.append(typed(words[i]))
                i += 1
            value = True if not values else values[0] if len(values) == 1 else values
        if name in flags:
            again = (
                f" (as {spelled[name]} and {word.split('=', 1)[0]})"
                if spelled[name] != word.split("=", 1)[0]
                else ""
            )
            raise ConfigError(f"flag {option_word(name)} is given twice{again}", file=source)
        flags[name] = value
        spelled[name] = word.split("=", 1)[0]
    spec: dict[str, Any] = {"exec": shlex.join(exec_words), "flags": flags, "env": env}
    if build:
        spec["build"] = build
    return spec


def container_exec(
    words: list[str], i: int, *, source: str, notes: list[str] | None = None
) -> tuple[list[str], int, str | None, tuple[str, ...]]:
    """A `docker run ... IMAGE CMD --flags` / `podman run` command line from word i: the
    runtime, its own options and the image open the exec (the runtime's options are never
    the server's flags), the image is the build, the words after it are the server's own
    command line, run by the image's entry point (the last item). `-d` is dropped (runs
    keep the container in the foreground); an option whose taking a value neither runtime
    lists is refused, never guessed. Not a container command: ([], i, None, ())."""
    from orchestrator.config.containers import container_problem, container_split

    cc = container_split(words[i:])
    if cc is None:
        return [], i, None, ()
    options = list(cc.options)
    if cc.detached():
        for o in reversed([o for o in cc.parsed() if o.name == "--detach"]):
            w = options[o.start]
            if w.startswith("--") or w == "-d":
                del options[o.start]
            else:  # a cluster of short switches: `-dit` -> `-it`
                options[o.start] = w.replace("d", "", 1)
        if notes is not None:
            notes.append(
                f"{cc.runtime_name} run -d is dropped: each run keeps the container in the "
                "foreground, where the service manager watches and stops it (and removes it)"
            )
    why = container_problem([*cc.runtime, *options, cc.image, *cc.command])
    if why is not None:
        raise ConfigError(f"cannot read the container command: {why}", file=source)
    head = [*cc.runtime, *options, cc.image]
    return head, i + len(cc.runtime) + len(cc.options) + 1, cc.image, cc.entrypoint()


def _container_env(spec: dict[str, Any], *, notes: list[str], unit: bool) -> dict[str, Any]:
    """Where a container command's variables go, said honestly. `env:` is what the server
    inside the container sees (runs hand it over with `-e`): a variable the command sets
    with `-e NAME=V`, or passes with `-e NAME` from its own environment, moves there (its
    `-e` leaves the command). A variable only the runtime's own command gets (the unit's
    `Environment=`, `X=1 docker run`) never reaches the server: it stays out of `env:`
    (the unit keeps it; a command line keeps it as `env X=1` before the runtime)."""
    from orchestrator.config.containers import container_split

    words = shlex.split(spec["exec"])
    cc = container_split(words)
    if cc is None:
        return spec
    outer: dict[str, str] = dict(spec["env"])
    inner: dict[str, str] = {}
    drop: set[int] = set()
    for o in cc.parsed():
        word = cc.options[o.start]
        if o.name != "--env" or o.value is None or word not in ("-e", "--env", f"--env={o.value}"):
            continue  # not a variable, or inside a cluster of short options: left as written
        key, sep, value = o.value.partition("=")
        if not sep and key not in outer:
            continue  # from an environment the import cannot see: left as written
        inner[key] = value if sep else outer[key]
        drop.update(range(o.start, o.start + o.words))
    runtime_only = {k: v for k, v in outer.items() if k not in inner}
    options = [w for k, w in enumerate(cc.options) if k not in drop]
    prefix: list[str] = []
    if runtime_only:
        names = ", ".join(runtime_only)
        where = f"{cc.runtime_name} itself, not the server inside the container (no -e hands it on)"
        if unit:
            notes.append(
                f"Environment= {names} reaches {where}: not in env: (which the container "
                "gets); the unit keeps it for every run"
            )
        else:
            notes.append(f"{names} reaches {where}: kept before it in exec (`env`), not in env:")
            prefix = ["env", *(f"{k}={v}" for k, v in runtime_only.items())]
    if inner:
        notes.append(
            "the container's variables (" + ", ".join(inner) + ") are in env:; each run "
            f"hands env: to the container with {cc.runtime_name} run -e"
        )
    spec["exec"] = shlex.join([*prefix, *cc.runtime, *options, cc.image, *cc.command])
    spec["env"] = inner
    return spec


def venv_activation(words: list[str]) -> tuple[str | None, list[str]]:
    """`source /opt/venv/bin/activate [&& CMD...]` (or `. ...`): the virtualenv (the
    build) and the words of the command after it, if any; (None, words) otherwise."""
    if len(words) >= 2 and words[0] in ("source", ".") and words[1].endswith("/bin/activate"):
        prefix = words[1][: -len("/bin/activate")] or "/"
        rest = words[2:]
        while rest and rest[0] in ("&&", ";"):
            rest = rest[1:]
        return prefix, rest
    return None, words


def _shell_script(words: list[str]) -> tuple[str, str | None, list[str], bool] | None:
    """`bash -c 'SCRIPT' [NAME ARGS...]` (after `exec`, `env`) -> (script, $0, args,
    login shell); None for any other command."""
    i = 0
    while i < len(words) and words[i] in ("exec", "nohup"):
        i += 1
    if i < len(words) and PurePosixPath(words[i]).name == "env":
        i += 1
        while i < len(words) and _ASSIGN.match(words[i]):
            i += 1
    if i >= len(words) or PurePosixPath(words[i]).name not in _SHELLS:
        return None
    i += 1
    command = login = False
    while i < len(words) and words[i][:1] in "-+" and len(words[i]) > 1 and words[i] != "--":
        w = words[i]
        if w in ("--login", "-l") or (not w.startswith("--") and "l" in w[1:]):
            login = True
        if not w.startswith("--") and "c" in w[1:]:
            command = True
        i += 2 if w in ("-o", "+o", "-O", "+O") else 1
    if i < len(words) and words[i] == "--":
        i += 1
    if not command or i >= len(words):
        return None
    rest = words[i + 1 :]
    return words[i], (rest[0] if rest else None), rest[1:], login


def _assignment(word: shellwords.Word) -> tuple[str, shellwords.Word] | None:
    """`NAME=value` (its name literal, unquoted) -> (name, the value's parts)."""
    if not word or word[0].kind != "lit" or word[0].quoted:
        return None
    m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=", word[0].text)
    if not m:
        return None
    rest = word[0].text[m.end() :]
    head = (shellwords.Part("lit", rest),) if rest else ()
    return m[1], head + word[1:]


def _assign(vs: shellwords.Vars, name: str, value: shellwords.Word) -> None:
    try:
        vs.set(name, "".join(shellwords.expand([value], vs)) if value else "")
    except shellwords.Unreadable as exc:
        vs.set(name, None, str(exc))


def _read_script(
    text: str, *, source: str, vs: shellwords.Vars, notes: list[str]
) -> dict[str, Any]:
    """A shell script (or `bash -c` string) -> the spec of its launch command: the last
    command that passes `--flags`, else the last that is not a shell builtin."""
    try:
        commands = shellwords.scan(text)
    except shellwords.Unreadable as exc:
        raise ConfigError(f"cannot parse the script: {exc}", file=source) from None
    allexport = False
    venv: str | None = None  # the virtualenv activated before the command (`source`)
    chosen: tuple[shellwords.Command, list, object, shellwords.Vars, str | None] | None = None
    fallback: tuple[shellwords.Command, list, object, shellwords.Vars, str | None] | None = None
    for cmd in commands:
        words = list(cmd.words)
        while words and shellwords.literal(words[0]) in _RESERVED:
            words = words[1:]
        prefix: list[tuple[str, shellwords.Word]] = []
        while words and _assignment(words[0]) is not None:
            prefix.append(_assignment(words[0]))  # type: ignore[arg-type]
            words = words[1:]
        if not words:
            for name, value in prefix:
                _assign(vs, name, value)
                if allexport:
                    vs.exported.add(name)
            continue
        first = shellwords.literal(words[0])
        if first in ("source", ".") and len(words) >= 2:
            # `source VENV/bin/activate`: the virtualenv is the build the server runs from
            try:
                path = "".join(shellwords.expand([words[1]], vs))
            except shellwords.Unreadable:
                path = ""
            activated, _ = venv_activation(["source", path])
            if activated is not None:
                venv = activated
                continue
        if first in ("export", "declare", "typeset", "readonly", "local"):
            opts = [shellwords.literal(w) or "" for w in words[1:]]
            exporting = first == "export" or any(o.startswith("-") and "x" in o for o in opts)
            for w in words[1:]:
                a = _assignment(w)
                if a is not None:
                    _assign(vs, *a)
                if exporting and (a or _NAME_RE.match(shellwords.literal(w) or "")):
                    vs.exported.add(a[0] if a else shellwords.literal(w) or "")
            continue
        if first == "unset":
            for w in words[1:]:
                name = shellwords.literal(w) or ""
                vs.values.pop(name, None)
                vs.exported.discard(name)
            continue
        if first == "set":
            for w in words[1:]:
                o = shellwords.literal(w) or ""
                if o.startswith("-") and "a" in o:
                    allexport = True
                elif o.startswith("+") and "a" in o:
                    allexport = False
            continue
        try:
            expanded: list[str] | shellwords.Unreadable = shellwords.expand(words, vs)
        except shellwords.Unreadable as exc:
            expanded = exc
        if isinstance(expanded, list):
            launch = any(w.startswith("--") for w in expanded) or _shell_script(expanded)
        else:
            launch = any((shellwords.literal(w[:1]) or "").startswith("--") for w in words)
        # the command sees the variables as they are now (a later line may change them)
        entry = (cmd, prefix, expanded, _copy(vs), venv)
        if launch:
            chosen = entry
        elif first is not None and first not in _SHELL_BUILTINS:
            fallback = entry
    entry = chosen or fallback
    if entry is None:
        raise ConfigError(
            "no launch command found",
            file=source,
            hint="expected a line like: "
            "python -m sglang.launch_server --model-path ... --port 30000",
        )
    cmd, prefix, expanded, at, venv = entry
    if isinstance(expanded, shellwords.Unreadable):
        raise ConfigError(
            f"cannot read the launch line: it uses {expanded}",
            file=source,
            hint=f"the line: {cmd.text[:200]}; set what it uses in the script (or replace it "
            "by its value) and import again (a secret's flag is written `${NAME}` in the "
            "config by hand: it is read from the environment when the config is loaded)",
        )
    env = {k: at.values[k] for k in sorted(at.exported) if k in at.values}
    for name, value in prefix:
        try:
            env[name] = "".join(shellwords.expand([value], at)) if value else ""
        except shellwords.Unreadable as exc:
            raise ConfigError(
                f"cannot read the launch line's {name}=: it uses {exc}", file=source
            ) from None
    if cmd.redirected:
        notes.append(
            "the launch line's redirection (> file, 2>&1) is not kept: the server's "
            "output goes where each run's log is read from"
        )
    if at.used_args and not at.args:
        notes.append(
            'the script\'s arguments ("$@") are taken as none: add the flags a '
            "caller passes to it to the config by hand"
        )
    inner = _shell_script(expanded)
    if inner is not None:
        spec = _read_shell_c(inner, env, source=source, notes=notes)
        spec["env"] = {**env, **spec["env"]}
        return _with_venv(spec, venv)
    unexported = sorted(
        k for k in at.values if k not in at.exported and k not in at.used and k not in dict(prefix)
    )
    if unexported:
        notes.append(
            "set in the script but not exported, so not in the server's environment "
            "(and not in env:): " + ", ".join(unexported)
        )
    spec = parse_command(expanded, source=source, notes=notes)
    _script_note(spec, notes)
    spec["env"] = {**env, **spec["env"]}
    return _with_venv(spec, venv)


def _read_shell_c(
    inner: tuple[str, str | None, list[str], bool],
    env: dict[str, str],
    *,
    source: str,
    notes: list[str],
) -> dict[str, Any]:
    """The launch of a `bash -c 'SCRIPT'` command (`_shell_script`): its script, read with
    only `env` (the shell started by `bash -c` sees only what is exported to it)."""
    script, arg0, args, login = inner
    if login:
        notes.append(
            "a login shell (-l) also reads the host's profile, which the import cannot see"
        )
    return _read_script(
        script, source=source, notes=notes, vs=shellwords.Vars(env, args=args, arg0=arg0)
    )


def _with_venv(spec: dict[str, Any], venv: str | None) -> dict[str, Any]:
    """The launch ran in an activated virtualenv: that is its build, and the interpreter
    comes from the build's bin/ (config.builds): a bare word or one already in the venv
    stays its own name."""
    if venv and "build" not in spec:
        spec["build"] = venv
        first, *rest = shlex.split(spec["exec"])
        if "/" not in first or first.startswith(venv.rstrip("/") + "/bin/"):
            spec["exec"] = shlex.join([Path(first).name, *rest])
    return spec


def _script_note(spec: dict[str, Any], notes: list[str]) -> None:
    """A command that runs a script of its own (`bash /opt/launch.sh`, `/opt/run.sh`) and
    passes no flags: its flags are in that script, which the import does not open."""
    words = shlex.split(spec["exec"])
    script = next((w for w in words if w.endswith(".sh")), None)
    if script is None and PurePosixPath(words[0]).name in _SHELLS and len(words) > 1:
        script = words[1]
    if script is not None and not spec["flags"]:
        notes.append(
            f"the command runs the script {script}, whose launch line is not read "
            "here: import that script (with `orchestrator import SCRIPT`)"
        )


def _copy(vs: shellwords.Vars) -> shellwords.Vars:
    out = shellwords.Vars(args=vs.args, arg0=vs.arg0)
    out.values, out.exported, out.unknown = dict(vs.values), set(vs.exported), dict(vs.unknown)
    out.used, out.used_args = vs.used, vs.used_args  # shared: what the launch line reads
    return out


def _no_literal_references(spec: dict[str, Any], source: str) -> dict[str, Any]:
    """Refuse a value that is literally `${NAME}` (single-quoted in a script, or under
    ExecStart=:): the YAML would read it as a reference to the environment variable NAME,
    another launch than the one imported."""
    from orchestrator.config.secrets import REFERENCE

    values = [(f"env {k}", v) for k, v in spec["env"].items()]
    values += [(option_word(k), v) for k, v in spec["flags"].items()]
    for what, value in values:
        m = REFERENCE.match(value) if isinstance(value, str) else None
        if m:
            raise ConfigError(
                f"the value {value!r} of {what} is literal text, which an experiment config "
                f"would read as a reference to the environment variable {m[1]}",
                file=source,
                hint="write the config by hand for this value",
            )
    return spec


def import_command_line(text: str, *, source: str = "<command line>") -> dict[str, Any]:
    """A shell command line or launch script -> experiment mapping (and its `notes`: what
    the import read in a way worth saying)."""
    notes: list[str] = []
    spec = _read_script(text, source=source, vs=shellwords.Vars(), notes=notes)
    spec = _container_env(spec, notes=notes, unit=False)
    spec["notes"] = notes
    return _no_literal_references(spec, source)


def _join_continuations(text: str) -> list[str]:
    """A unit file's lines, a line ending in a backslash joined to the next by a space
    (as systemd joins them); a comment line inside a continuation is skipped."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        if current and raw.lstrip()[:1] in ("#", ";"):
            continue
        stripped = raw.rstrip()
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += raw
        lines.append(current)
        current = ""
    if current:
        lines.append(current)
    return lines


def import_unit_file(text: str, *, source: str) -> dict[str, Any]:
    """A systemd unit -> experiment mapping, read as systemd reads it: `Environment=`
    (and `UnsetEnvironment=`), the last `ExecStart=` with its prefixes (`-@:+!`),
    specifiers (`%n`, `%%`) and `$VAR`/`${VAR}` substitution, a `bash -c '...'` command's
    script; what it cannot read is refused naming it."""
    name = Path(source).name
    unit = name if re.fullmatch(r".+\.(service|socket|target|timer)", name) else None
    section = ""
    exec_starts: list[str] = []
    env: dict[str, str] = {}
    env_files: list[str] = []
    notes: list[str] = []

    def words(value: str, key: str) -> list[str]:
        try:
            return [shellwords.specifiers(w, unit) for w in shellwords.systemd_words(value)]
        except shellwords.Unreadable as exc:
            raise ConfigError(f"cannot read {key}=: {exc}", file=source) from None

    for line in _join_continuations(text):
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped[1:-1]
            continue
        if section != "Service" or "=" not in stripped:
            continue
        key, _, value = stripped.partition("=")
        key, value = key.strip(), value.strip()
        if key == "ExecStart":
            # each line adds a command (systemd runs them in turn, oneshot units only);
            # an empty one resets the list
            exec_starts = [*exec_starts, value] if value else []
        elif key == "Environment":
            if not value:
                env.clear()
                continue
            for word in words(value, key):
                m = _ASSIGN.match(word)
                if m:
                    env[m[1]] = m[2]
        elif key == "UnsetEnvironment":
            for word in words(value, key):
                if env.get(word.split("=", 1)[0]) == word.partition("=")[2] or "=" not in word:
                    env.pop(word.split("=", 1)[0], None)
        elif key == "EnvironmentFile":
            if not value:
                env_files.clear()
            else:
                env_files.append(value)
    if not exec_starts:
        raise ConfigError("no ExecStart= line in the [Service] section", file=source)
    if len(exec_starts) > 1:
        listed = "; ".join(e[:120] for e in exec_starts)
        raise ConfigError(
            f"the [Service] section has {len(exec_starts)} ExecStart= commands ({listed}): "
            "which one is the server cannot be told",
            file=source,
            hint="import the server's command alone (`orchestrator import -- COMMAND...`) "
            "or a copy of the unit with its ExecStart= line only",
        )
    exec_start = exec_starts[0]
    prefixes = re.match(r"[-@:+!|]*", exec_start)[0]  # type: ignore[index]
    line = exec_start[len(prefixes) :]
    if "|" in prefixes:
        raise ConfigError(
            "cannot read ExecStart=|: a command run by the user's login shell", file=source
        )
    argv = words(line, "ExecStart")
    files = ", ".join(f.lstrip("-") for f in env_files)
    if ":" not in prefixes:  # `:` turns systemd's variable substitution off
        try:
            argv = shellwords.systemd_expand(
                argv,
                env,
                f"EnvironmentFile={files}, which the import does not read"
                if files
                else "nor would systemd take it from anywhere the import can see",
            )
        except shellwords.Unreadable as exc:
            raise ConfigError(
                f"cannot read ExecStart=: it uses {exc}",
                file=source,
                hint="set it with Environment= in the unit (or replace it by its "
                "value) and import again",
            ) from None
    if "@" in prefixes and len(argv) > 1:
        notes.append(
            f"ExecStart=@: the server's argv[0] is {argv[1]!r} in the unit; runs "
            f"start {argv[0]} under its own name"
        )
        argv = [argv[0], *argv[2:]]
    if "+" in prefixes or "!" in prefixes:
        p = "+" if "+" in prefixes else "!"
        notes.append(
            f"ExecStart={p}: the unit runs the server with full privileges; runs "
            "(a drop-in's ExecStart= without the prefix) start it as the unit's "
            "User="
        )
    if env_files:
        notes.append(
            f"EnvironmentFile={files} is not read: its variables are not in env:, "
            "but they still reach the server when runs use this unit"
        )
    if not argv:
        raise ConfigError("ExecStart= has no command", file=source)
    inner = _shell_script(argv)
    if inner is not None:
        spec = _read_shell_c(inner, env, source=source, notes=notes)
    else:
        spec = parse_command(argv, source=source, notes=notes)
        _script_note(spec, notes)
    spec["env"] = {**env, **spec["env"]}
    spec = _container_env(spec, notes=notes, unit=True)
    spec["unit"] = unit if unit and unit.endswith(".service") else None
    spec["notes"] = notes
    return _no_literal_references(spec, source)


#: no unit file or launch script is this large
MAX_IMPORT_BYTES = 4 * 1024 * 1024


def import_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    text = read_text_file(path, what="unit file or launch script", limit=MAX_IMPORT_BYTES)
    if "\x00" in text:
        raise ConfigError("not a text file (it holds NUL bytes)", file=str(path))
    if path.suffix == ".service" or re.search(r"^\[Service\]", text, re.M):
        return import_unit_file(text, source=str(path))
    return import_command_line(text, source=str(path))


def secret_references(spec: dict[str, Any]) -> list[str]:
    """Replace secret env values and flags with `${NAME}` references (in place): the YAML
    must not hold them; they are read from the environment when the config is loaded."""
    from orchestrator.config.secrets import env_name, secrets_of

    env = spec.get("env") or {}
    names = []
    for key, value in list(env.items()):
        if secrets_of({key: value}):
            env[key] = f"${{{key}}}"
            names.append(key)
    for key, value in list(spec["flags"].items()):
        if isinstance(value, str) and secrets_of({}, [(key, value)]):
            spec["flags"][key] = f"${{{env_name(key)}}}"
            names.append(env_name(key))
    return names


def to_experiment_mapping(spec: dict[str, Any], *, name: str) -> dict[str, Any]:
    """Shape an imported spec as an experiment YAML mapping."""
    service: dict[str, Any] = {}
    if spec.get("unit"):
        service["unit"] = spec["unit"]
    service["exec"] = spec["exec"]
    if spec.get("build"):
        service["build"] = spec["build"]
    service["flags"] = spec["flags"]
    if spec.get("env"):
        service["env"] = spec["env"]
    return {"name": name, "service": service}


def render_yaml(mapping: dict[str, Any]) -> str:
    return yaml.safe_dump(mapping, sort_keys=False, allow_unicode=True, width=100)


def render_command(spec: dict[str, Any]) -> str:
    """The spec as a shell command line (env assignments, exec, flags)."""
    from orchestrator.config.containers import container_split, with_options

    env = [f"{k}={v}" for k, v in (spec.get("env") or {}).items()]
    exec_words = shlex.split(spec["exec"])
    if container_split(exec_words) is not None:  # env: is the container's: `-e K=V`
        words = list(with_options(exec_words, [w for e in env for w in ("-e", e)]))
    else:
        words = env + exec_words
    for name, value in spec["flags"].items():
        if value is False or value is None:
            continue
        words.append(option_word(name))
        if value is True:
            continue
        values = value if isinstance(value, list) else [value]
        words += [repr(v) if isinstance(v, float) else str(v) for v in values]
    return shlex.join(words)
