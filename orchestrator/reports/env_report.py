"""The environment section of the reports (Markdown and HTML) and of `--json`.

One table per host and environment: a host whose environment changed during the
campaign gets one table per environment, with what changed and the run that first saw it.
"""

from __future__ import annotations

import html
from typing import Any

from orchestrator.execution.environment import changes
from orchestrator.store.store import EnvironmentSeen


def _changed(seen: list[EnvironmentSeen], i: int) -> list[str] | None:
    """What changed on this entry's host since its previous environment (None: first)."""
    before = [s for s in seen[:i] if s.host == seen[i].host]
    return changes(before[-1].env, seen[i].env) if before else None


def markdown_section(seen: list[EnvironmentSeen]) -> list[str]:
    out = ["## Environment", ""]
    if not seen:
        return out + ["Not recorded (no run reached the host).", ""]
    for i, s in enumerate(seen):
        what = _changed(seen, i)
        title = f"### {s.host}" + (f" (from run {s.runs[0]})" if what is not None else "")
        out += [title, ""]
        if what is not None:
            out += [
                f"**The environment changed during the campaign**: {'; '.join(what)}. "
                "Runs after the change are not mixed with those before.",
                "",
            ]
        out += ["| | |", "|---|---|"]
        out += [f"| {k} | {v} |" for k, v in s.env.rows()]
        out.append("")
    return out


def html_section(seen: list[EnvironmentSeen]) -> str:
    e = html.escape
    parts = ["<h2>Environment</h2>"]
    if not seen:
        return parts[0] + "<p>Not recorded (no run reached the host).</p>"
    for i, s in enumerate(seen):
        what = _changed(seen, i)
        parts.append(
            f"<h3>{e(s.host)}"
            + (f" (from run {e(s.runs[0])})" if what is not None else "")
            + "</h3>"
        )
        if what is not None:
            parts.append(
                f"<p class=changed><b>The environment changed during the campaign</b>:"
                f" {e('; '.join(what))}. Runs after the change are not mixed with "
                "those before.</p>"
            )
        parts.append(
            "<table class=env>"
            + "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in s.env.rows())
            + "</table>"
        )
    return "\n".join(parts)


def to_json(seen: list[EnvironmentSeen]) -> list[dict[str, Any]]:
    out = []
    for i, s in enumerate(seen):
        entry = s.to_json()
        what = _changed(seen, i)
        if what is not None:
            entry["changed"] = what
        out.append(entry)
    return out


def text_lines(seen: list[EnvironmentSeen]) -> list[str]:
    """One line per host environment, for the terminal."""
    out = []
    for i, s in enumerate(seen):
        what = _changed(seen, i)
        line = f"environment on {s.host}: {s.env.summary()}"
        if what is not None:
            line += f"  [changed at run {s.runs[0]}: {'; '.join(what)}]"
        out.append(line)
    return out
