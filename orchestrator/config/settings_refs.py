"""The orchestrator's own settings in a config's values: `${ORCH_NAME:-default}`.

A config shipped with the project names where a setting of the controller puts things
(`${ORCH_VLLM_CACHE:-/var/cache/orchestrator-vllm}/lab/bin/vllm`: the real vLLM's cached
venv, which `ORCH_VLLM_CACHE` moves). At load, each such reference in a string value is the
controller's `$ORCH_NAME` when it is set and not empty, else the default written after
`:-`. Only names starting `ORCH_` and only with a default: a config loads the same where
the setting is unset, and a `${X}` meant for the host's shell (a `bash -c` command) or a
secret's `${NAME}` (`secrets.py`) is left as it is.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

REF = re.compile(r"\$\{(ORCH_[A-Z0-9_]+):-([^}$]*)\}")


def expand(value: Any, environ: Mapping[str, str] | None = None) -> Any:
    """`value` (a config's data: mappings, lists, strings) with every reference replaced."""
    env = os.environ if environ is None else environ
    if isinstance(value, str):
        return REF.sub(lambda m: env.get(m[1]) or m[2], value)
    if isinstance(value, Mapping):
        return {k: expand(v, env) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(expand(v, env) for v in value)
    return value
