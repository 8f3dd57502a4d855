"""Prompt sets for the answers check (orchestrator/config/prompts.py): the shipped default
set, and a user's JSONL refused with the file, line, key and what was expected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config.prompts import DEFAULT_PROMPTS, load_prompts
from orchestrator.errors import ConfigError


def test_the_default_set_covers_arithmetic_facts_format_and_a_long_context() -> None:
    prompts = load_prompts()
    ids = [p.id for p in prompts]
    assert len(set(ids)) == len(ids) >= 8
    assert {i.split("-")[0] for i in ids} >= {"arith", "fact", "format", "long"}
    assert all(p.scored for p in prompts)
    assert any(p.prompt is not None for p in prompts)  # the completions endpoint too
    longest = max(prompts, key=lambda p: sum(len(c) for _, c in p.messages or ()))
    assert longest.id == "long-context" and sum(len(c) for _, c in longest.messages or ()) > 6000
    assert DEFAULT_PROMPTS.name.endswith(".jsonl")


def test_a_users_file(tmp_path: Path) -> None:
    f = tmp_path / "mine.jsonl"
    f.write_text(
        '{"prompt": "1+1=", "regex": "2"}\n\n'
        '{"id": "chat", "messages": [{"role": "system", "content": "Be brief."},'
        ' {"role": "user", "content": "Hi"}]}\n'
    )
    a, b = load_prompts(f)
    assert (a.id, a.prompt, a.regex) == ("line1", "1+1=", "2")
    assert b.id == "chat" and b.messages == (("system", "Be brief."), ("user", "Hi"))
    assert not b.scored


@pytest.mark.parametrize(
    "line, where, says",
    [
        ("not json", ":2", "is not JSON (Expecting value at column 1); expected one object"),
        ('["a"]', ":2", "is JSON a list; expected an object"),
        ('{"promt": "x"}', ":2: promt", "unknown key (did you mean 'prompt'?); expected one of"),
        ('{"expect": "x"}', ":2", "has neither prompt nor messages"),
        ('{"prompt": "x", "messages": []}', ":2", "has both prompt and messages"),
        ('{"prompt": "x", "expect": "a", "regex": "a"}', ":2", "has both expect and regex"),
        ('{"prompt": 3}', ":2: prompt", "is a number; expected a non-empty string"),
        ('{"prompt": "x", "regex": "("}', ":2: regex", "is not a regular expression"),
        ('{"messages": "hi"}', ":2: messages", "expected a non-empty list of {role, content}"),
        ('{"messages": [{"role": "user"}]}', ":2: messages[0]", "is ['role']; expected an object"),
        (
            '{"messages": [{"role": "robot", "content": "x"}]}',
            ":2: messages[0].role",
            "is 'robot'; expected one of system, user, assistant",
        ),
        ('{"id": "a", "prompt": "y"}', ":2: id", "'a' is already the id of line 1"),
    ],
)
def test_bad_lines_are_named(tmp_path: Path, line: str, where: str, says: str) -> None:
    f = tmp_path / "set.jsonl"
    f.write_text(json.dumps({"id": "a", "prompt": "x"}) + "\n" + line + "\n")
    with pytest.raises(ConfigError) as err:
        load_prompts(f)
    assert str(err.value).startswith(f"{f}{where}: "), str(err.value)
    assert says in str(err.value)


def test_unreadable_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing.jsonl: cannot be read"):
        load_prompts(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ConfigError, match="empty.jsonl: holds no prompt"):
        load_prompts(tmp_path / "empty.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe{")
    with pytest.raises(ConfigError, match="bin.jsonl: is not UTF-8"):
        load_prompts(tmp_path / "bin.jsonl")


def test_a_byte_order_mark_is_read_past_or_named(tmp_path: Path) -> None:
    # some editors write UTF-8 with a byte order mark: the set reads as without it
    f = tmp_path / "bom.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + b'{"id": "q", "prompt": "2+2=", "expect": "4"}\n')
    [q] = load_prompts(f)
    assert (q.id, q.prompt) == ("q", "2+2=")
    # UTF-16 (Notepad's "Unicode") is named, not Python's decode error
    f16 = tmp_path / "utf16.jsonl"
    f16.write_bytes('{"prompt": "2+2="}\n'.encode("utf-16"))
    with pytest.raises(ConfigError) as err:
        load_prompts(f16)
    assert str(err.value) == (
        f"{f16}: is not UTF-8 text: it is UTF-16 (it starts with a byte order mark)"
    )
    assert err.value.hint == "save the prompt set as UTF-8"


def test_a_recorded_configs_deleted_prompt_set_names_the_key(tmp_path: Path) -> None:
    from orchestrator.config.loading import load_experiment

    (tmp_path / "p.jsonl").write_text('{"id": "q", "prompt": "2+2=", "expect": "4"}\n')
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(
        "name: x\nservice: {exec: python3 -m s, flags: {port: 30000}}\n"
        "answers: {prompts: p.jsonl}\n"
    )
    exp = load_experiment(exp_file)
    recorded = type(exp).from_dict(exp.to_dict(), source="run x.1")  # as a rerun reads it
    (tmp_path / "p.jsonl").unlink()
    with pytest.raises(ConfigError) as err:
        recorded.answers.load()  # type: ignore[union-attr]
    assert str(err.value) == (
        f"answers.prompts: the prompt set {tmp_path / 'p.jsonl'}: cannot be read: "
        "No such file or directory"
    )
    assert err.value.hint and "restore the prompt set" in err.value.hint
    # at load the experiment file is named before the key, once
    with pytest.raises(ConfigError) as err:
        load_experiment(exp_file)
    assert str(err.value) == (
        f"{exp_file}: answers.prompts: the prompt set {tmp_path / 'p.jsonl'}: cannot be read: "
        "No such file or directory"
    )
