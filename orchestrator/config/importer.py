"""Import what users already have into an experiment config.

Sources: a systemd unit file (its `ExecStart=` and `Environment=` lines), a shell launch
script, or a command line (`VAR=x python -m sglang.launch_server --tp-size 8 ...`, with
backslash continuations, quotes and `--flag=value`). The result is a plain mapping in
the experiment YAML's shape; `render_yaml` writes it, and importing the rendered command
gives the same config back.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.yamlio import read_text_file
from orchestrator.errors import ConfigError

_SHELL_BUILTINS = frozenset(
    "set cd echo source . trap wait sleep exit return true false ulimit umask if then fi "
    "for do done while case esac function local printf test [ [[ mkdir rm cp mv".split()
)
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
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


def parse_command(words: list[str], *, source: str) -> dict[str, Any]:
    """argv words (maybe with leading VAR=x or `env`) -> {exec, flags, env}."""
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
    exec_words, i, build = container_exec(words, i)
    while i < len(words) and not words[i].startswith("--"):
        exec_words.append(words[i])
        i += 1
    if not exec_words:
        raise ConfigError("no command found before the first --flag", file=source)
    flags: dict[str, Any] = {}
    while i < len(words):
        word = words[i]
        if not word.startswith("--") or word == "--":
            raise ConfigError(
                f"positional argument {word!r} after the flags is not supported",
                file=source,
                hint="move positional arguments before the first --flag (they become part of exec)",
            )
        name, eq, inline = word[2:].partition("=")
        i += 1
        if eq:
            value: Any = typed(inline)
        else:
            values = []
            while i < len(words) and not (words[i].startswith("--") and len(words[i]) > 2):
                values.append(typed(words[i]))
                i += 1
            value = True if not values else values[0] if len(values) == 1 else values
        if name in flags:
            raise ConfigError(f"flag --{name} is given twice", file=source)
        flags[name] = value
    spec: dict[str, Any] = {"exec": shlex.join(exec_words), "flags": flags, "env": env}
    if build:
        spec["build"] = build
    return spec


def container_exec(words: list[str], i: int) -> tuple[list[str], int, str | None]:
    """A `docker run ... IMAGE CMD --flags` / `podman run` command line from word i: the
    runtime, its own options and the image open the exec (the runtime's options are never
    the server's flags), the image is the build, and the words after it are the server's
    own command line. Not a container command: ([], i, None)."""
    from orchestrator.config.builds import container_split

    cc = container_split(words[i:])
    if cc is None:
        return [], i, None
    head = [*cc.runtime, *cc.options, cc.image]
    return head, i + len(head), cc.image


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


def _join_continuations(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
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


def import_command_line(text: str, *, source: str = "<command line>") -> dict[str, Any]:
    """A shell command line or launch script -> experiment mapping."""
    env: dict[str, str] = {}
    command: list[str] | None = None
    fallback: list[str] | None = None
    venv: str | None = None
    for line in _join_continuations(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            words = shlex.split(stripped, comments=True)
        except ValueError as exc:
            raise ConfigError(
                f"cannot parse shell line: {exc}: {stripped[:80]}", file=source
            ) from None
        activated, words = venv_activation(words)
        venv = activated or venv
        if not words:
            continue
        if words[0] == "export":
            for w in words[1:]:
                m = _ASSIGN.match(w)
                if m:
                    env[m[1]] = m[2]
            continue
        if all(_ASSIGN.match(w) for w in words):
            for w in words:
                m = _ASSIGN.match(w)
                assert m
                env[m[1]] = m[2]
            continue
        if any(w.startswith("--") for w in words):
            command = words  # the launch line: the last line that passes flags
        elif words[0] not in _SHELL_BUILTINS:
            fallback = words
    command = command or fallback
    if command is None:
        raise ConfigError(
            "no launch command found",
            file=source,
            hint="expected a line like: "
            "python -m sglang.launch_server --model-path ... --port 30000",
        )
    spec = parse_command(command, source=source)
    spec["env"] = {**env, **spec["env"]}
    if venv and "build" not in spec:
        spec["build"] = venv
        # the interpreter comes from the build's bin/ (config.builds): a bare word or one
        # already in the venv stays its own name
        first, *rest = shlex.split(spec["exec"])
        if "/" not in first or first.startswith(venv.rstrip("/") + "/bin/"):
            spec["exec"] = shlex.join([Path(first).name, *rest])
    return spec


def import_unit_file(text: str, *, source: str) -> dict[str, Any]:
    """A systemd unit -> experiment mapping (ExecStart=, Environment=)."""
    section = ""
    exec_start: str | None = None
    env: dict[str, str] = {}
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
            exec_start = value.lstrip("-@:+!") if value else None  # systemd's prefix chars
        elif key == "Environment":
            if not value:
                env.clear()
                continue
            for word in shlex.split(value):
                m = _ASSIGN.match(word)
                if m:
                    env[m[1]] = m[2]
    if not exec_start:
        raise ConfigError("no ExecStart= line in the [Service] section", file=source)
    spec = parse_command(shlex.split(exec_start), source=source)
    spec["env"] = {**env, **spec["env"]}
    spec["unit"] = Path(source).name if source.endswith(".service") else None
    return spec


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
    words = [f"{k}={v}" for k, v in (spec.get("env") or {}).items()]
    words += shlex.split(spec["exec"])
    for name, value in spec["flags"].items():
        if value is False or value is None:
            continue
        words.append(f"--{name}")
        if value is True:
            continue
        values = value if isinstance(value, list) else [value]
        words += [repr(v) if isinstance(v, float) else str(v) for v in values]
    return shlex.join(words)
