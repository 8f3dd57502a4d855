"""Prompt sets for the answers check: the shipped default and a user's JSONL file.

One JSON object per line (blank lines are skipped):

    {"id": "fact-france", "messages": [{"role": "user", "content": "Capital of France?"}],
     "expect": "Paris"}
    {"prompt": "The capital of Italy is", "regex": "\\bRome\\b"}

Keys: `prompt` (a completion prompt) or `messages` (chat: objects with `role` one of
system, user, assistant and a `content` string), optional `id` (default `line<N>`; unique),
optional `expect` (the answer contains this text, case-insensitive, at word boundaries) or
`regex` (a Python regular expression searched in the answer). Anything else is refused with
the file, the line, the key and what was expected. The file is UTF-8; a byte order mark
before it (which some editors write) is read past.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

from orchestrator.diagnosis.answers import Prompt
from orchestrator.errors import ConfigError

DEFAULT_PROMPTS = Path(__file__).with_name("answers_default.jsonl")
KEYS = ("id", "prompt", "messages", "expect", "regex")
ROLES = ("system", "user", "assistant")
#: a prompt set is a handful of questions; a bigger file is a mistake (a data dump)
MAX_BYTES = 4 * 1024 * 1024
#: byte order marks of encodings a prompt set is not in (UTF-32's first: FF FE 00 00
#: starts with UTF-16's); UTF-8's own (EF BB BF) is read past
UTF_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)


def load_prompts(path: Path | None = None) -> tuple[Prompt, ...]:
    """The prompts of `path` (the shipped default set when None)."""
    path = path or DEFAULT_PROMPTS
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise ConfigError(
                f"is {size} bytes; a prompt set is at most {MAX_BYTES}", file=str(path)
            )
        data = path.read_bytes()
        # an editor's byte order mark: UTF-8's is dropped, UTF-16's and UTF-32's named
        for bom, encoding in UTF_BOMS:
            if data.startswith(bom):
                raise ConfigError(
                    f"is not UTF-8 text: it is {encoding} (it starts with a byte order mark)",
                    file=str(path),
                    hint="save the prompt set as UTF-8",
                )
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"is not UTF-8 text ({exc.reason} at byte {exc.start})",
            file=str(path),
            hint="save the prompt set as UTF-8",
        ) from exc
    except OSError as exc:
        raise ConfigError(f"cannot be read: {exc.strerror or exc}", file=str(path)) from exc
    return parse_prompts(text, str(path))


def parse_prompts(text: str, file: str) -> tuple[Prompt, ...]:
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{file}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"is not JSON ({exc.msg} at column {exc.colno}); expected one object per line",
                file=where,
            ) from exc
        if not isinstance(row, dict):
            raise ConfigError(f"is JSON {_kind(row)}; expected an object", file=where)
        prompt = _prompt(row, where, n)
        if prompt.id in seen:
            raise ConfigError(
                f"{prompt.id!r} is already the id of line {seen[prompt.id]}; expected a unique id",
                file=where,
                key="id",
            )
        seen[prompt.id] = n
        prompts.append(prompt)
    if not prompts:
        raise ConfigError("holds no prompt; expected one JSON object per line", file=file)
    return tuple(prompts)


def _prompt(row: dict[str, object], where: str, n: int) -> Prompt:
    for key in row:
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"unknown key{hint}; expected one of {', '.join(KEYS)}", file=where, key=key
            )
    has_prompt, has_messages = "prompt" in row, "messages" in row
    if has_prompt == has_messages:
        raise ConfigError(
            "has both prompt and messages" if has_prompt else "has neither prompt nor messages",
            file=where,
            hint="give exactly one: prompt (a string) or messages (a list of role/content)",
        )
    if "expect" in row and "regex" in row:
        raise ConfigError("has both expect and regex; expected at most one", file=where)
    for key in ("id", "prompt", "expect", "regex"):
        if key in row and (not isinstance(row[key], str) or not row[key]):
            raise ConfigError(
                f"is {_kind(row[key])}; expected a non-empty string", file=where, key=key
            )
    if "regex" in row:
        try:
            re.compile(str(row["regex"]))
        except re.error as exc:
            raise ConfigError(
                f"is not a regular expression ({exc}); expected Python's re syntax",
                file=where,
                key="regex",
            ) from exc
    messages = _messages(row["messages"], where) if has_messages else None
    return Prompt(
        id=str(row.get("id") or f"line{n}"),
        prompt=str(row["prompt"]) if has_prompt else None,
        messages=messages,
        expect=row.get("expect"),  # type: ignore[arg-type]
        regex=row.get("regex"),  # type: ignore[arg-type]
    )


def _messages(value: object, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(
            f"is {_kind(value)}; expected a non-empty list of {{role, content}} objects",
            file=where,
            key="messages",
        )
    out = []
    for i, msg in enumerate(value):
        key = f"messages[{i}]"
        if not isinstance(msg, dict) or set(msg) != {"role", "content"}:
            got = sorted(msg) if isinstance(msg, dict) else _kind(msg)
            raise ConfigError(
                f"is {got}; expected an object with exactly role and content", file=where, key=key
            )
        if msg["role"] not in ROLES:
            raise ConfigError(
                f"is {msg['role']!r}; expected one of {', '.join(ROLES)}",
                file=where,
                key=f"{key}.role",
            )
        if not isinstance(msg["content"], str):
            raise ConfigError(
                f"is {_kind(msg['content'])}; expected a string", file=where, key=f"{key}.content"
            )
        out.append((msg["role"], msg["content"]))
    return tuple(out)


def _kind(value: object) -> str:
    if isinstance(value, str):
        return "an empty string" if not value else f"the string {value[:40]!r}"
    names = {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        list: "a list",
        dict: "an object",
    }
    return names.get(type(value), "null" if value is None else type(value).__name__)
