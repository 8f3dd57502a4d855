"""Sweep reports: the table (config, verdict, signature, metric, duration) in Markdown and
a self-contained HTML page with an inline SVG plot of the probe metric across the swept
values (one line per value of the second axis, when there is one)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from orchestrator.store import CampaignRow, Store

PALETTE = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f"]


def _rows(camp: CampaignRow) -> list[dict[str, Any]]:
    return list((camp.answer or {}).get("rows") or [])


def _values(camp: CampaignRow) -> dict[str, dict[str, Any]]:
    return {it["label"]: dict(it.get("values") or []) for it in camp.spec.get("items", [])}


def markdown(camp: CampaignRow) -> str:
    out = [f"# Sweep {camp.spec.get('name')} (campaign {camp.id})", "",
           f"- sweep file: `{camp.spec.get('sweep')}`; hosts: {', '.join(camp.spec['hosts'])}",
           f"- status **{camp.status}**", *_removed_lines(camp), "",
           "| config | repeat | verdict | signature | metric | time | run |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in _rows(camp):
        metric = "" if r["metric"] is None else f"{r['metric']:g}"
        dur = "" if r["duration"] is None else f"{r['duration']:.0f}s"
        out.append(f"| {r['config']} | {r['repeat'] + 1} | {r['verdict'] or 'not run'} | "
                   f"{r['signature'] or ''} | {metric} | {dur} | {r['run'] or ''} |")  # fmt: skip
    return "\n".join(out) + "\n"


def _removed(camp: CampaignRow) -> list[tuple[str, str]]:
    return [(str(h), str(why)) for h, why in (camp.answer or {}).get("removed_hosts") or []]


def _removed_lines(camp: CampaignRow) -> list[str]:
    return [f"- host {h} was taken out of the pool: {why}" for h, why in _removed(camp)]


def svg_plot(camp: CampaignRow, width: int = 640, height: int = 320) -> str:
    """The probe metric against the first swept axis; '' when there is nothing to plot."""
    axes: list[str] = list(camp.spec.get("axes") or [])
    values = _values(camp)
    points: dict[str, list[tuple[Any, float]]] = {}
    if not axes:
        return ""
    x_axis = axes[0]
    for r in _rows(camp):
        if r["metric"] is None:
            continue
        vals = values.get(r["config"], {})
        if x_axis not in vals:
            continue
        series = ", ".join(f"{a}={vals.get(a)}" for a in axes[1:]) or x_axis
        points.setdefault(series, []).append((vals[x_axis], float(r["metric"])))
    if not points:
        return ""
    xs = sorted({x for pts in points.values() for x, _ in pts}, key=lambda v: (str(type(v)), v))
    ys = [y for pts in points.values() for _, y in pts]
    lo, hi = min(ys), max(ys)
    pad = (hi - lo) * 0.1 or max(abs(hi) * 0.1, 1.0)
    lo, hi = lo - pad, hi + pad
    left, right, top, bottom = 60, 150, 20, 40
    pw, ph = width - left - right, height - top - bottom

    def px(x: Any) -> float:
        i = xs.index(x)
        return left + (pw * (i + 0.5) / len(xs))

    def py(y: float) -> float:
        return top + ph * (1 - (y - lo) / (hi - lo))

    e = html.escape
    parts = [f"<svg id=plot xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
             f"font-family='sans-serif' font-size='11'>",
             f"<rect x='{left}' y='{top}' width='{pw}' height='{ph}' fill='#fafafa' "
             "stroke='#ccc'/>"]  # fmt: skip
    for k in range(5):
        y = lo + (hi - lo) * k / 4
        parts.append(f"<text x='{left - 6}' y='{py(y) + 4:.1f}' text-anchor='end'>{y:.4g}</text>")
        parts.append(f"<line x1='{left}' x2='{left + pw}' y1='{py(y):.1f}' y2='{py(y):.1f}' "
                     "stroke='#eee'/>")  # fmt: skip
    for x in xs:
        parts.append(f"<text x='{px(x):.1f}' y='{top + ph + 16}' text-anchor='middle'>"
                     f"{e(str(x))}</text>")  # fmt: skip
    parts.append(f"<text x='{left + pw / 2}' y='{height - 6}' text-anchor='middle'>"
                 f"{e(x_axis)}</text>")  # fmt: skip
    for i, (series, pts) in enumerate(sorted(points.items())):
        color = PALETTE[i % len(PALETTE)]
        avg: dict[Any, list[float]] = {}
        for x, y in pts:
            avg.setdefault(x, []).append(y)
        line = sorted(((x, sum(v) / len(v)) for x, v in avg.items()), key=lambda p: xs.index(p[0]))
        d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in line)
        parts.append(f"<polyline fill='none' stroke='{color}' stroke-width='2' points='{d}'/>")
        for x, y in pts:
            parts.append(f"<circle cx='{px(x):.1f}' cy='{py(y):.1f}' r='3.5' fill='{color}'>"
                         f"<title>{e(series)} {e(str(x))}: {y:g}</title></circle>")  # fmt: skip
        parts.append(f"<text x='{left + pw + 8}' y='{top + 14 + 16 * i}' fill='{color}'>"
                     f"{e(series)}</text>")  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


def html_page(camp: CampaignRow) -> str:
    from orchestrator.report import _CSS, COLORS

    e = html.escape
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>Sweep "
             f"{e(str(camp.spec.get('name')))}</title><style>{_CSS}</style></head><body>",
             f"<h1>Sweep {e(str(camp.spec.get('name')))} (campaign {e(camp.id)})</h1>",
             f"<p>sweep file <code>{e(str(camp.spec.get('sweep')))}</code>, hosts "
             f"{e(', '.join(camp.spec['hosts']))}, status <b>{e(camp.status)}</b></p>"]  # fmt: skip
    parts += [f"<p class=removed>host <b>{e(h)}</b> was taken out of the pool: {e(why)}</p>"
              for h, why in _removed(camp)]  # fmt: skip
    plot = svg_plot(camp)
    if plot:
        parts.append("<h2>Probe metric</h2>" + plot)
    parts.append("<h2>Results</h2><table id=results><tr><th>config</th><th>repeat</th>"
                 "<th>verdict</th><th>signature</th><th>metric</th><th>time</th><th>run</th></tr>")
    for r in _rows(camp):
        v = r["verdict"] or "not run"
        metric = "" if r["metric"] is None else f"{r['metric']:g}"
        dur = "" if r["duration"] is None else f"{r['duration']:.0f}s"
        parts.append(f"<tr><td>{e(r['config'])}</td><td>{r['repeat'] + 1}</td>"
                     f"<td class=v style='color:{COLORS.get(v, '#000')}'>{e(v)}</td>"
                     f"<td><code>{e(r['signature'] or '')}</code></td><td>{metric}</td>"
                     f"<td>{dur}</td><td>{e(r['run'] or '')}</td></tr>")  # fmt: skip
    parts.append("</table></body></html>")
    return "\n".join(parts)


def write_sweep_reports(store: Store, campaign_id: str) -> list[Path]:
    from orchestrator import env_report
    from orchestrator.report import write_private

    camp = store.campaign(campaign_id)
    seen = store.campaign_environments(camp.id)
    md = markdown(camp) + "\n" + "\n".join(env_report.markdown_section(seen))
    page = html_page(camp).removesuffix("</body></html>")
    page += env_report.html_section(seen) + "</body></html>"
    return write_private(store, camp.id, {".md": md, ".html": page})
