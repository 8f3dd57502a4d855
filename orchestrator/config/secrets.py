"""Secrets: which values are secret, and redacting them from everything we write or print.

A value is secret when its environment variable or flag is named like one (`HF_TOKEN`,
`--api-key`, `..._PASSWORD`), when it comes from a `${NAME}` reference (resolved from the
controller's environment at load time, so the YAML never holds it), or when it looks like
a token (`hf_...`, `sk-...`, `ghp_...`, long hex/base64 keys). Redaction replaces each
secret value with `[REDACTED:NAME]` in logs, the store, reports and terminal output. A
recorded config keeps the marker; `rerun` takes the value from the environment again.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.errors import ConfigError

SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|API[_-]?KEY|ACCESS[_-]?KEY|PRIVATE[_-]?KEY|"
    r"CREDENTIAL|AUTH)",
    re.IGNORECASE,
)
TOKEN_VALUE = re.compile(
    r"\b(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|"
    r"xox[abpr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"
    r"\.[A-Za-z0-9_-]{10,})\b"
)
MARKER = re.compile(r"\[REDACTED:([A-Za-z_][A-Za-z0-9_.-]*)\]")
REFERENCE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
MIN_SECRET_LEN = 4  # shorter values would redact ordinary words and numbers


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def resolve_reference(value: str, *, file: str, key: str) -> tuple[str, str | None]:
    """`${NAME}` -> (the controller's $NAME, "NAME"); anything else -> (value, None)."""
    m = REFERENCE.match(value)
    if not m:
        return value, None
    name = m[1]
    if name not in os.environ:
        raise ConfigError(
            f"refers to ${{{name}}}, which is not set in this environment",
            file=file,
            key=key,
            hint=f"export {name}=... before running orchestrator (the value is never stored)",
        )
    return os.environ[name], name


def env_name(name: str) -> str:
    """The environment variable a secret is read back from: `api-key` -> `API_KEY`."""
    return re.sub(r"\W", "_", name).upper()


def secrets_of(
    env: Mapping[str, str],
    flags: Iterable[tuple[str, Any]] = (),
    marked: Mapping[str, str] | Iterable[str] = (),
) -> dict[str, str]:
    """variable name -> secret value, for a config's environment and flags. `marked` maps
    a flag or env var to the `${VAR}` it came from (or just names what is secret)."""
    out: dict[str, str] = {}
    refs = dict(marked) if isinstance(marked, Mapping) else {m: env_name(m) for m in marked}
    for k, v in env.items():
        if (k in refs or is_secret_name(k) or TOKEN_VALUE.search(v)) and len(v) >= MIN_SECRET_LEN:
            out[refs.get(k, k)] = v
    for k, v in flags:
        if (
            isinstance(v, str)
            and len(v) >= MIN_SECRET_LEN
            and (k in refs or is_secret_name(k) or TOKEN_VALUE.search(v))
        ):
            out[refs.get(k, env_name(k))] = v
    return out


class Redactor:
    def __init__(self, secrets: Mapping[str, str] | None = None) -> None:
        # longest first, so a secret containing another is replaced whole
        self.pairs = sorted((secrets or {}).items(), key=lambda kv: -len(kv[1]))

    def text(self, s: str | None) -> str | None:
        if not s:
            return s
        for name, value in self.pairs:
            if value and value in s:
                s = s.replace(value, f"[REDACTED:{name}]")
        return TOKEN_VALUE.sub("[REDACTED:token]", s)

    def obj(self, o: Any) -> Any:
        """Redact every string inside a JSON-like structure."""
        if isinstance(o, str):
            return self.text(o)
        if isinstance(o, list | tuple):
            return [self.obj(x) for x in o]
        if isinstance(o, dict):
            return {k: self.obj(v) for k, v in o.items()}
        return o


def unredact(value: str) -> str:
    """A recorded value with markers -> the secret values from this environment."""

    def sub(m: re.Match[str]) -> str:
        name = m[1]
        if name not in os.environ:
            raise ConfigError(
                f"the recorded config needs the secret {name}, which is not set here",
                hint=f"export {name}=... and run the command again (secrets are never stored)",
            )
        return os.environ[name]

    return MARKER.sub(sub, value)
