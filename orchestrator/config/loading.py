"""Loading an experiment file: its `extends:` chain merged, then frozen.

A YAML file may `extends:` another (relative path, cycles refused); keys of the child
override the parent's, mappings merge key by key, and a flag or env var set to
`false`/null in the child is removed. Every file is validated on its own, so an error
names the file the bad key is in. A `${ORCH_NAME:-default}` in a value is the controller's
setting (`settings_refs.py`). The result is a frozen `Experiment`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.config.containers import container_problem
from orchestrator.config.experiment import Experiment, _build
from orchestrator.config.schema import ExperimentModel
from orchestrator.config.settings_refs import expand
from orchestrator.config.yamlio import load_model, not_a_file
from orchestrator.errors import ConfigError


def load_experiment(path: str | Path) -> Experiment:
    """Load, merge the `extends:` chain, validate, and freeze one experiment YAML."""
    path = Path(path)
    merged = expand(_load_chain(path, stack=()))  # `${ORCH_NAME:-default}`: settings_refs.py
    exp = _build(merged, str(path))
    # what no run can start as written (a recorded run still loads: see launch_of)
    why = container_problem(exp.exec)  # `docker run -d`, an option of unknown arity
    if why:
        raise ConfigError(why, file=str(path), key="service.exec")
    return exp


#: an `extends:` chain longer than this is a mistake (and would exhaust the stack)
MAX_EXTENDS_DEPTH = 64


def _load_chain(path: Path, stack: tuple[Path, ...]) -> dict[str, Any]:
    resolved = path.resolve()
    if len(stack) >= MAX_EXTENDS_DEPTH:
        raise ConfigError(
            f"'extends' chain is longer than {MAX_EXTENDS_DEPTH} files (from {stack[0]})",
            file=str(path),
            key="extends",
        )
    if resolved in stack:
        chain = " -> ".join(str(p) for p in (*stack, resolved))
        raise ConfigError(f"'extends' makes a cycle: {chain}", file=str(path), key="extends")
    model = load_model(path, ExperimentModel, what="experiment")
    data = model.model_dump(exclude_unset=True, by_alias=False)
    parent_ref = data.pop("extends", None)
    if parent_ref is None:
        return data
    parent_path = (
        (path.parent / parent_ref) if not Path(parent_ref).is_absolute() else Path(parent_ref)
    )
    try:
        found = parent_path.exists()
    except (OSError, ValueError) as exc:  # a name too long, a NUL in it
        raise ConfigError(
            f"'extends' target {parent_ref[:200]!r} cannot be looked up: {exc}",
            file=str(path),
            key="extends",
        ) from None
    if not found:
        raise ConfigError(
            f"'extends' target {parent_ref!r} not found (looked for {parent_path})",
            file=str(path),
            key="extends",
            hint="the path is relative to the file that extends it",
        )
    why = not_a_file(parent_path)  # a directory, a device, a pipe: named from here
    if why is not None:
        raise ConfigError(
            f"'extends' target {parent_ref!r} {why} ({parent_path}), expected an experiment file",
            file=str(path),
            key="extends",
        )
    parent = _load_chain(parent_path, (*stack, resolved))
    parent.pop("name", None)  # a child without a name is named after its own file
    parent.pop("description", None)
    return _merge(parent, data)


def _merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out
