"""The orchestrator's own settings in a config's values: `${ORCH_NAME:-default}`.

A config shipped with the project names where a setting of the controller puts things
(`${ORCH_VLLM_CACHE:-/var/cache/orchestrator-vllm}/lab/bin/vllm`: the real vLLM's cached
venv, which `ORCH_VLLM_CACHE` moves). At load, each such reference in a string value is the
controller's `$ORCH_NAME` when it is set and not empty, else the default written after
`:-`. Only names starting `ORCH_` and only with a default: a config loads the same where
the setting is unset, and a `${X}` meant for the host's shell (a `bash -c` command) or a
secret's `${NAME}` (`secrets.py`) is left as it is. A setting's value must read as one
word, as written (a path with a space or a quote in it would split the command it lands in
and start something else): one that does not is refused at load, naming the setting.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from typing import Any

from orchestrator.errors import ConfigError

REF = re.compile(r"\$\{(ORCH_[A-Z0-9_]+):-([^}$]*)\}")


def expand(value: Any, environ: Mapping[str, str] | None = None) -> Any:
    """`value` (a config's data: mappings, lists, strings) with every reference replaced."""
    env = os.environ if environ is None else environ
    if isinstance(value, str):
        return REF.sub(lambda m: _setting(m[1], env) or m[2], value)
    if isinstance(value, Mapping):
        return {k: expand(v, env) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(expand(v, env) for v in value)
    return value


def _setting(name: str, env: Mapping[str, str]) -> str | None:
    """The controller's `$name`, when it reads back as the one word it is."""
    value = env.get(name)
    if not value:
        return None
    try:
        # `$` and a backquote are a shell's or systemd's expansion where the word lands
        one_word = shlex.split(value) == [value] and not any(c in value for c in "$`")
    except ValueError:  # an unclosed quote
        one_word = False
    if not one_word:
        raise ConfigError(
            f"the setting {name}={value!r} is not one plain word (a space, quote, "
            "backslash, $ or backquote would split or expand the command it lands in)",
            hint=f"move what {name} names to a path without spaces or quotes, or unset it",
        )
    return value
