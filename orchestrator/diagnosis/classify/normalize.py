"""Normalization: a message's words with what varies between ranks, days, hosts and
installs taken out, so reruns of one failure get one signature."""

from __future__ import annotations

import re

from orchestrator.diagnosis.classify.lines import strip_prefix
from orchestrator.diagnosis.server_logs import (
    CIRCUMSTANCES,
    GENERIC_CLASSES,
    SELF_NAMING,
    SPECIFIC_WORDS,
    VALUE_PARTS,
)

# ---------------------------------------------------------------------------------------
# Normalization: what varies between ranks, days, hosts and installs goes
# ---------------------------------------------------------------------------------------

_PATH = re.compile(
    r"""(?:(?<=^)|(?<=[\s'"(\[=`]))(?:\.{1,2}/|~/|/)(?:[^\s'"():,\[\]]+/)+"""
    r"""(?=[^\s/'"():,\[\]]+)"""
)

# Order matters: specific shapes before the generic number rules.
_NORMALIZERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?Z?"), "<time>"),
    (re.compile(r"\b\d\d:\d\d:\d\d(?:\.\d+)?\b"), "<time>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{12,}\b"), "<id>"),
    (re.compile(r"\b(?:https?|file)://\S+"), "<url>"),
    (_PATH, "<path>/"),
    (re.compile(r"\(\d+(?:\.\d+)?/\d+(?:\.\d+)?\s?(?:[KMGTP]i?B)\)"), "(<size>)"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:[KMGTP]i?B|bytes|B)\b"), "<size>"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+\b|<\d+>|\b)"), "<addr>"),  # NCCL: ip<port>
    (re.compile(r"\[(?:[A-Z]{2,3}\d+ ?)+\]"), ""),
    (re.compile(r"\b(pid|PID|tid|rank|Rank|device|GPU|gpu|cuda:|TP|DP|EP|PP)[ =]?\d+\b"), r"\1<n>"),
    (re.compile(r"(?<![\w.])-?\d+\.\d+(?![\w.])"), "<num>"),
    (re.compile(r"(?<![\w<])-?\d+(?![\w>])"), "<n>"),
    (re.compile(r"\s+"), " "),
)


# A wrapper's tag in front of a message: "[address=0.0.0.0:37591, pid=324770] The ..."
_TAG = re.compile(r"^\[\w+=[^\]]*\]\s*")
# The end of a message's first sentence: what follows is advice or a dump that versions
# reword ("Make sure that ...", "Please verify ...").
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)\]'`\">])\.\s+(?=[A-Z(])")


_QUOTED = re.compile(r"'[^'\s][^']*'|\"[^\"\s][^\"]*\"")
# A quoted value that changes with the host, the day or the reporter: a path, a repo id
# or URL, a long dump. Short names (a module, an attribute, a method, a dtype) name the
# failure and stay: "No module named 'flash_attn'" is not "No module named 'vllm._C'".
_VARIABLE_QUOTE = re.compile(r"[/\\]|^.{41,}$|\s")


# A printed list of quoted values (`['Glm4ForCausalLM']`) is what the input held (the
# model's architectures, the devices), not the name of what broke.
_QUOTED_LIST = re.compile(r"\[\s*(?:'[^']*'|\"[^\"]*\")(?:\s*,\s*(?:'[^']*'|\"[^\"]*\"))*\s*\]")
# So is a printed set of them (`{'model.layers.2.input_layernorm.weight', ...}`), whose
# order changes from one process to the next (Python randomizes string hashes): the same
# failure would otherwise get another signature on every start.
_QUOTED_SET = re.compile(r"\{\s*(?:'[^']*'|\"[^\"]*\")(?:\s*,\s*(?:'[^']*'|\"[^\"]*\"))*\s*\}")


def _mask_variable_quotes(message: str) -> str:
    def one(m: re.Match[str]) -> str:
        inner = m.group(0)[1:-1]
        # one quoting style: Python's repr and a formatted message quote alike names apart
        return "'<v>'" if _VARIABLE_QUOTE.search(inner) else f"'{inner}'"

    message = _QUOTED_SET.sub("{'<v>'}", _QUOTED_LIST.sub("['<v>']", message))
    return _QUOTED.sub(one, message)


def first_sentence(message: str) -> str:
    """The first sentence of a message that has several (when it is long enough to name
    something on its own)."""
    m = _SENTENCE_END.search(message)
    if m is not None and len(message[: m.start()].split()) >= SPECIFIC_WORDS:
        message = message[: m.start()]
    return message.rstrip(" .")


# What a message's words keep when they are its name (server_logs.VALUE_PARTS): markdown's
# backticks and typographic quotes come and go between reports of one line.
_MARKUP = str.maketrans({"`": None, "\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})
_SPACE_PUNCT = re.compile(r"\s+(?=[,.;:)\]])|(?<=[(\[])\s+")


def message_words(message: str) -> str:
    """A normalized message without the parts that hold values rather than words (a
    parenthesized value, a device name, a trailing `got ...`), so reports of one error from
    other versions, devices and inputs read alike; the message itself when that would
    leave too few words to name anything."""
    out = _mask_variable_quotes(message).translate(_MARKUP)
    for pattern in VALUE_PARTS:
        out = pattern.sub("", out)
    out = _SPACE_PUNCT.sub("", re.sub(r"\s{2,}", " ", out)).strip(" ,;:")
    if len(out.split()) < SPECIFIC_WORDS:
        return message.translate(_MARKUP)
    for pattern in CIRCUMSTANCES:  # "... does not exist when importing vLLM"
        head = pattern.sub("", out).rstrip(" ,;:")
        if len(head.split()) >= SPECIFIC_WORDS:
            out = head
    return out


def names_itself(error_class: str, message: str) -> bool:
    """True when the message says what went wrong in its own words, so the place that
    raised it is not needed to tell it from other failures (server_logs.GENERIC_CLASSES)."""
    if SELF_NAMING.search(message):
        return True
    return error_class not in GENERIC_CLASSES and len(message.split()) >= SPECIFIC_WORDS


def normalize_message(text: str) -> str:
    """The message with everything that varies between ranks, days and hosts replaced."""
    out = _TAG.sub("", strip_prefix(text))
    for pattern, repl in _NORMALIZERS:
        out = pattern.sub(repl, out)
    return out.strip()


__all__ = [
    "normalize_message",
]
