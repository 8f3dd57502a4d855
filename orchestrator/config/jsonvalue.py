"""Flag values that are whole JSON documents (vLLM's `--compilation-config`, `--hf-overrides`,
`--speculative-config`; SGLang's `--json-model-override-args`): their canonical text, the
key paths that differ between two of them, and a value rebuilt from some of those changes.

Pure. A key path is a tuple of object keys (`("pass_config", "enable_fusion")`); a leaf is
any value that is not a non-empty object on both sides (a list is one value). Leaf values
travel as JSON text, so JSON's `null` stays apart from "absent" (None).

A list the server documents as a set (vLLM's `compilation-config.cudagraph_capture_sizes`:
the batch sizes captured, each on its own) is not one value: each member added or removed
is a change of its own (`SET_PATHS`; multi-value flags such as SGLang's `--cuda-graph-bs`
are in `SET_FLAGS`).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

KeyPath = tuple[str, ...]
#: (key path, good's leaf as JSON text or None when absent, bad's likewise, whether it is
#: one member of a set-valued list at that path: then old/new is that member)
LeafChange = tuple[KeyPath, "str | None", "str | None", bool]

#: JSON options' lists that their servers document as sets of independent members (flag,
#: key path): vLLM's CUDA-graph capture sizes and compile sizes, SGLang's the same
SET_PATHS: frozenset[tuple[str, KeyPath]] = frozenset(
    {
        ("compilation-config", ("cudagraph_capture_sizes",)),
        ("compilation-config", ("compile_sizes",)),
    }
)
#: multi-value flags documented as sets (batch sizes to capture, each on its own)
SET_FLAGS: frozenset[str] = frozenset({"cuda-graph-bs", "cuda-graph-sizes"})


def parse_object(value: object) -> dict[str, Any] | None:
    """The JSON object a flag value spells, or None (not text, not JSON, not an object)."""
    if not isinstance(value, str) or not value.lstrip().startswith("{"):
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def canonical(value: object) -> str | None:
    """Sorted keys, no spaces: the text of a JSON object or array value whatever its key
    order and spacing; None for any other value."""
    if not isinstance(value, str) or value.lstrip()[:1] not in ("{", "["):
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    if not isinstance(parsed, (dict, list)):
        return None
    return dump_canonical(parsed)


def dump_canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def same_json(a: object, b: object) -> bool:
    """Two flag values that are the same JSON object or array (order and spacing aside)."""
    ca = canonical(a)
    return ca is not None and ca == canonical(b)


def set_paths(flag: str) -> frozenset[KeyPath]:
    return frozenset(p for f, p in SET_PATHS if f == flag)


def leaf_changes(
    good: dict[str, Any], bad: dict[str, Any], sets: frozenset[KeyPath] = frozenset()
) -> list[LeafChange]:
    """Every key path whose value differs, in the bad value's key order, then good's
    removed keys in their order. Objects present on one side only are walked into (each of
    their leaves is added or removed); an empty one is a leaf. A list at one of `sets`,
    a list on both sides, gives one change per member added or removed."""
    out: list[LeafChange] = []
    _walk(good, bad, (), out, sets)
    return out


def _walk(
    g: dict[str, Any],
    b: dict[str, Any],
    prefix: KeyPath,
    out: list[LeafChange],
    sets: frozenset[KeyPath],
) -> None:
    for k, bv in b.items():
        path = (*prefix, k)
        if k in g:
            gv = g[k]
            if isinstance(gv, dict) and isinstance(bv, dict) and gv and bv:
                _walk(gv, bv, path, out, sets)
            elif dump_canonical(gv) == dump_canonical(bv):
                continue
            elif (
                path in sets
                and isinstance(gv, list)
                and isinstance(bv, list)
                and (changes := member_changes(gv, bv))
            ):  # (only reordered: one value)
                out.extend((path, o, n, True) for o, n in changes)
            else:
                out.append((path, _text(gv), _text(bv), False))
        elif isinstance(bv, dict) and bv:
            _walk({}, bv, path, out, sets)
        else:
            out.append((path, None, _text(bv), False))
    for k, gv in g.items():
        if k in b:
            continue
        path = (*prefix, k)
        if isinstance(gv, dict) and gv:
            _walk(gv, {}, path, out, sets)
        else:
            out.append((path, _text(gv), None, False))


def member_changes(good: list[Any], bad: list[Any]) -> list[tuple[str | None, str | None]]:
    """(None, member) per member only bad has, in its order, then (member, None) per
    member only good has; members as JSON text, compared as JSON."""
    gk = {dump_canonical(v) for v in good}
    bk = {dump_canonical(v) for v in bad}
    added = list(dict.fromkeys(_text(v) for v in bad if dump_canonical(v) not in gk))
    removed = list(dict.fromkeys(_text(v) for v in good if dump_canonical(v) not in bk))
    return [(None, a) for a in added] + [(r, None) for r in removed]


def rebuild_set(
    good: list[Any], bad: list[Any], changes: list[tuple[str | None, str | None]]
) -> list[Any]:
    """Good's members with the chosen members added or removed, in bad's order (members
    only good has where good had them)."""
    members = {dump_canonical(v): v for v in good}
    for old, new in changes:
        if new is not None:
            v = json.loads(new)
            members.setdefault(dump_canonical(v), v)
        elif old is not None:
            members.pop(dump_canonical(json.loads(old)), None)
    order = _merge_order([dump_canonical(v) for v in bad], [dump_canonical(v) for v in good])
    return [members[k] for k in dict.fromkeys(order) if k in members]


def _text(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)


def rebuild(good_text: str | None, bad_text: str | None, changes: list[LeafChange]) -> str | None:
    """The value of a variant: good's object with each change applied (bad's leaf set, or
    the key removed when bad lacks it; a set's member added or removed), rendered back as
    JSON with keys in their original order.
    None means the option is absent: a variant equal to a side that lacks the option
    lacks it too. A variant equal to good or bad keeps that side's own text."""
    g = parse_object(good_text) if good_text is not None else {}
    b = parse_object(bad_text) if bad_text is not None else {}
    g = g if g is not None else {}
    b = b if b is not None else {}
    result: dict[str, Any] = copy.deepcopy(g)
    members: dict[KeyPath, list[tuple[str | None, str | None]]] = {}
    for path, old, new, member in changes:
        if member:
            members.setdefault(path, []).append((old, new))
        elif new is None:
            _delete(result, path, b)
        else:
            _set(result, path, json.loads(new))
    for path, chosen in members.items():
        gl, bl = _get(g, path), _get(b, path)
        _set(
            result,
            path,
            rebuild_set(
                gl if isinstance(gl, list) else [], bl if isinstance(bl, list) else [], chosen
            ),
        )
    result = _ordered(result, g, b)
    text = dump_canonical(result)
    if text == dump_canonical(b):
        return bad_text
    if text == dump_canonical(g):
        return good_text
    return json.dumps(result, ensure_ascii=False)


def _set(obj: dict[str, Any], path: KeyPath, value: Any) -> None:
    for k in path[:-1]:
        if not isinstance(obj.get(k), dict):
            obj[k] = {}
        obj = obj[k]
    obj[path[-1]] = value


def _delete(obj: dict[str, Any], path: KeyPath, bad: dict[str, Any]) -> None:
    """Remove the key; a parent object this leaves empty goes too, unless bad has it."""
    chain = [obj]
    for k in path[:-1]:
        nxt = chain[-1].get(k)
        if not isinstance(nxt, dict):
            return
        chain.append(nxt)
    chain[-1].pop(path[-1], None)
    for depth in range(len(path) - 1, 0, -1):
        if chain[depth]:
            break
        if isinstance(_get(bad, path[:depth]), dict):
            break
        chain[depth - 1].pop(path[depth - 1], None)


def _get(obj: Any, path: KeyPath) -> Any:
    for k in path:
        if not isinstance(obj, dict) or k not in obj:
            return None
        obj = obj[k]
    return obj


def _ordered(result: Any, g: Any, b: Any) -> Any:
    """`result` with its keys in bad's order, keys only good has where good had them."""
    if not isinstance(result, dict):
        return result
    gd = g if isinstance(g, dict) else {}
    bd = b if isinstance(b, dict) else {}
    order = _merge_order(list(bd), list(gd))
    keys = [k for k in order if k in result] + [k for k in result if k not in bd and k not in gd]
    return {k: _ordered(result[k], gd.get(k), bd.get(k)) for k in keys}


def _merge_order(bad_keys: list[str], good_keys: list[str]) -> list[str]:
    out = list(bad_keys)
    present = set(out)
    last: str | None = None
    for k in good_keys:
        if k not in present:
            at = out.index(last) + 1 if last is not None else 0
            out.insert(at, k)
            present.add(k)
        last = k
    return out


_PLAIN = re.compile(r"[A-Za-z0-9_\-]+")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")


def path_text(path: KeyPath) -> str:
    """`pass_config.enable_fusion`; a key that is not a plain word is quoted as JSON."""
    return ".".join(k if _PLAIN.fullmatch(k) else json.dumps(k, ensure_ascii=False) for k in path)


def leaf_label(text: str) -> str:
    """A leaf for people: JSON text, a plain word string without its quotes
    (`FULL_DECODE_ONLY`, not `"FULL_DECODE_ONLY"`)."""
    try:
        v = json.loads(text)
    except ValueError:
        return text
    if isinstance(v, str) and _WORD.fullmatch(v) and v not in ("true", "false", "null"):
        return v
    return text


__all__ = [
    "SET_FLAGS",
    "SET_PATHS",
    "KeyPath",
    "LeafChange",
    "canonical",
    "dump_canonical",
    "leaf_changes",
    "leaf_label",
    "member_changes",
    "parse_object",
    "path_text",
    "rebuild",
    "rebuild_set",
    "same_json",
    "set_paths",
]
