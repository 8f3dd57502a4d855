"""Reading YAML files and turning pydantic's validation errors into `ConfigError`s.

A person reading the message must learn the file, the key path, what was expected and,
for a misspelt key, the close match. No traceback ever reaches them for a bad file.
"""

from __future__ import annotations

import difflib
import re
import stat
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

#: no config is this large; a bigger file is a mistake (a model file, a log)
MAX_BYTES = 16 * 1024 * 1024


def _a(what: str) -> str:
    return ("an " if what[:1].lower() in "aeiou" else "a ") + what


def not_a_file(path: Path) -> str | None:
    """Why `path`, named by another config, cannot be read as one ("is a directory", "is
    not a regular file", "not found"), or None when it is a regular file."""
    if path.is_file():
        return None
    return (
        "is a directory"
        if path.is_dir()
        else "is not a regular file"
        if path.exists()
        else "not found"
    )


def read_text_file(path: Path, *, what: str, limit: int = MAX_BYTES) -> str:
    """A small text file a person wrote (a config, a unit, a script), or our error naming
    it: never a device or a pipe (read forever), nothing past `limit`, UTF-8 only."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
            # a device or a pipe (`/dev/zero`, `/dev/stdin`) would be read forever
            raise ConfigError(f"not a regular file, expected {_a(what)}", file=str(path))
        if st.st_size > limit:
            raise ConfigError(
                f"{st.st_size} bytes is too large for {_a(what)} (limit {limit})", file=str(path)
            )
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} not found", file=str(path)) from None
    except IsADirectoryError:
        raise ConfigError(f"is a directory, expected {_a(what)}", file=str(path)) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name, or not UTF-8
        raise ConfigError(f"cannot read {what}: {exc}", file=str(path)) from exc


def read_yaml_mapping(path: Path, *, what: str = "config") -> dict[str, Any]:
    """Load one YAML file that must hold a mapping at the top."""
    text = read_text_file(path, what=f"{what} file")
    try:
        data = _parse(text)
    except DuplicateKey as exc:
        raise ConfigError(
            f"key '{shown_key(exc.key)}' is given twice (line {exc.line}); "
            "YAML would keep only the last",
            file=str(path),
            key=shown_key(exc.key),
            hint="remove one of them",
        ) from None
    except RecursionError:
        raise ConfigError("nested too deeply to be a config", file=str(path)) from None
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(
            f"not valid YAML{where}: {problem}",
            file=str(path),
            hint="check indentation and quoting near that line",
        ) from exc
    if data is None:
        raise ConfigError(f"the file is empty; expected a {what} mapping", file=str(path))
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a mapping of keys at the top level, got {_type_name(data)}",
            file=str(path),
        )
    return data


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: str, line: int) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key, self.line = key, line


class _Strict:
    """Refuses a key given twice in one mapping (plain PyYAML keeps the last one silently:
    a config would run with a value its author did not see)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                dup = key in seen
            except TypeError:
                continue  # an unhashable key: the constructor reports it
            if dup:
                raise DuplicateKey(str(key), key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]


class StrictLoader(_Strict, yaml.SafeLoader):
    """PyYAML's safe loader (pure Python), strict about repeated keys."""


#: the same with libyaml's parser, where PyYAML was built with it: the pure-Python parser
#: takes about a minute for a file at MAX_BYTES, libyaml a few seconds
FastStrictLoader: type = (
    type("FastStrictLoader", (_Strict, yaml.CSafeLoader), {})
    if hasattr(yaml, "CSafeLoader")
    else StrictLoader
)
#: a file libyaml refuses is read again by the pure-Python parser, whose messages (and
#: few differences, such as escaped lone surrogates) the rest of the checks expect; past
#: this size libyaml's own message is given instead (the slow parser would take minutes)
REPARSE_BYTES = 1024 * 1024


def _parse(text: str) -> Any:
    try:
        return yaml.load(text, Loader=FastStrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError:
        if FastStrictLoader is StrictLoader or len(text) > REPARSE_BYTES:
            raise
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506


def _type_name(value: object) -> str:
    return {
        list: "a list",
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
        type(None): "nothing (null)",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the model found by walking `loc` (for 'did you mean')."""
    current: Any = model
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            # a dict-typed field: the key is a free name; stay on the same model
            continue
        current = _model_in(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [f.alias or name for name, f in current.model_fields.items()]
    return []


def _model_in(annotation: Any) -> Any:
    """Find a BaseModel class inside an annotation like `Health | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


#: a key an error may quote: a name as configs spell them. Anything else is quoted by its
#: length only: a file given by mistake (`--hosts /etc/shadow`) parses as YAML whose "keys"
#: are its lines, and an error must not print them.
_KEY_SHAPED = re.compile(r"[A-Za-z0-9_.@/+-]{1,80}")


def shown_key(key: object) -> str:
    """A key as an error quotes it: itself when it is name-shaped, else its length."""
    text = str(key)
    return text if _KEY_SHAPED.fullmatch(text) else f"<a key of {len(text)} characters>"


def load_model(path: Path, model: type[M], *, what: str) -> M:
    """Read a YAML mapping and validate it as `model`; errors name the file and the key."""
    raw = read_yaml_mapping(path, what=what)
    allowed = [f.alias or name for name, f in model.model_fields.items()]
    if raw and not any(
        k in allowed or difflib.get_close_matches(str(k), allowed, n=1, cutoff=0.6) for k in raw
    ):
        # none of its keys is one of ours or a typo of one: not this kind of file at all,
        # and nothing of it is quoted back
        raise ConfigError(
            f"not a {what} file: none of its {len(raw)} top-level key(s) is "
            + ", ".join(sorted(allowed)),
            file=str(path),
            hint=f"check the path given for the {what} file",
        )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise validation_error(exc, model, file=str(path)) from None


def validation_error(
    exc: ValidationError, model: type[BaseModel], *, file: str, prefix: tuple[Any, ...] = ()
) -> ConfigError:
    """Map the first (most useful) pydantic error to a ConfigError naming file and key."""
    errors = exc.errors(include_url=False)
    # Report unknown keys first: they are the most common and most actionable mistake.
    errors.sort(key=lambda e: 0 if e["type"] == "extra_forbidden" else 1)
    err = errors[0]
    shaped = _value_shape_error(errors, file=file, prefix=prefix)
    if shaped is not None and err["type"] != "extra_forbidden":
        return shaped
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p and "]" in p))
    key = ".".join(shown_key(p) for p in (*prefix, *loc)) or "(top level)"
    hint = None
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        message = "unknown key"
        if close:
            message += f"; did you mean '{close[0]}'?"
        if allowed:
            hint = "allowed keys here: " + ", ".join(sorted(allowed))
    elif err["type"] == "missing":
        message = "required key is missing"
    else:
        got = err.get("input")
        got_text = (
            ""
            if isinstance(got, dict | list) or err["type"] == "value_error"
            else f" (got {got!r})"
        )
        message = f"{_expected(err)}{got_text}"
    more = len(errors) - 1
    if more:
        hint = (hint + "; " if hint else "") + f"{more} more problem(s) in this file"
    return ConfigError(message, file=file, key=key, hint=hint)


#: (section, key) whose values are a flag's or an environment variable's: what one may be
_VALUE_SHAPES = {
    "flags": "a flag value is a scalar (true, a number or a word), a list of them (the flag "
    "given several values) or null (the flag removed); a JSON option's value (vLLM's "
    "--compilation-config, ...) is one string of JSON",
    "env": "an environment value is a scalar (a word or a number) or null (unset)",
}


def _value_shape_error(
    errors: list[Any],
    *,
    file: str,
    prefix: tuple[Any, ...],
) -> ConfigError | None:
    """A flag or environment value of a shape no value has (a mapping; a list in a list):
    pydantic reports one error per member of the value's type ("expected a valid boolean"
    under `.bool`, ...), none of which says what a value may be. Said once, at its key."""
    for err in errors:
        full = (*prefix, *err["loc"])
        at = next(
            (
                i
                for i in range(len(full) - 2)
                if full[i] == "service" and full[i + 1] in _VALUE_SHAPES
            ),
            None,
        )
        value = err.get("input")
        if at is None or not isinstance(value, dict | list):
            continue
        section, name = full[at + 1], full[at + 2]
        member = any(isinstance(p, int) for p in full[at + 3 :])  # inside the value's list
        if section == "flags" and isinstance(value, list) and not member:
            continue  # a flag's list is fine: what is wrong is inside it (another error)
        got = ("a list holding " if member else "") + (
            "a mapping" if isinstance(value, dict) else "a list"
        )
        hint = None
        if section == "flags" and isinstance(value, dict) and not member:
            import json

            hint = f"write it quoted, as on a command line: {name}: '{json.dumps(value)}'"
        return ConfigError(
            f"{_VALUE_SHAPES[section]}; got {got}",
            file=file,
            key=".".join(str(p) for p in full[: at + 3]),
            hint=hint,
        )
    return None


def _expected(err: dict[str, Any]) -> str:
    msg = str(err["msg"])
    # pydantic's "Input should be a valid integer" reads well as "expected a valid integer"
    if msg.startswith("Input should be "):
        return "expected " + msg[len("Input should be ") :]
    if msg.startswith("Value error, "):
        return msg[len("Value error, ") :]
    return msg
