"""The effect table of a bisection that measured a probe metric: each named flag's effect
with its interval, bad against good, how much the named flags explain, the flags cleared
inside the noise, the noise and the drift measured (`campaign/measured.py` makes it)."""

from __future__ import annotations

from typing import Any


def _row(e: dict[str, Any], width: int) -> str:
    name = " + ".join(e.get("flags") or []) or "?"
    return f"  {name:<{width}}  {e['change']:+.1f}% [{e['low']:+.1f}, {e['high']:+.1f}]"


def lines(effects: dict[str, Any], message: str) -> list[str]:
    """The table as plain lines (the caller prints them)."""
    total = effects.get("total") or {}
    named = effects.get("named") or []
    cleared = effects.get("cleared") or []
    kind = "throughput" if effects.get("higher_is_better", True) else "latency"
    out = [
        f"{kind} ({effects.get('metric') or 'probe metric'}), bar {effects.get('bar')}: "
        f"bad against good {total.get('change', 0):+.1f}% "
        f"[{total.get('low', 0):+.1f}, {total.get('high', 0):+.1f}]",
    ]
    width = max((len(" + ".join(e.get("flags") or [])) for e in named + cleared), default=0)
    status = effects.get("status")
    if status == "found":
        out.append(
            f"named (they explain {100 * float(effects.get('explained') or 0):.0f}% of it, "
            f"confidence {float(effects.get('confidence') or 0):.3f}):"
        )
        out += [_row(e, width) for e in named]
    elif status == "none":
        out.append("nothing misses the bar: " + message)
    else:
        out.append("unsure: " + message)
    if cleared:
        out.append("cleared (their effect lies inside the noise):")
        out += [_row(e, width) for e in cleared]
    out.append(
        f"noise: {100 * float(effects.get('noise_within') or 0):.1f}% between runs of one "
        f"start, {100 * float(effects.get('noise_between') or 0):.1f}% between starts; "
        f"drift {float(effects.get('drift') or 0):+.1f}% over the campaign"
    )
    out.append(
        f"measured: {effects.get('starts', 0)} starts, {effects.get('runs', 0)} benchmark runs"
    )
    return out
