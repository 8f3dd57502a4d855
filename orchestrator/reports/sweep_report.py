"""Sweep reports: the table (config, verdict, signature, metric, duration) in Markdown and
a self-contained HTML page with an inline SVG plot of the probe metric, and the comparison
with the previous run of the same sweep (the night before): per config, the metric change
and the verdict change, with regressions beyond the bar called out at the top.

The plot: the metric against the first swept axis, one line per value of the other axes;
a sweep without axes (a `configs:` list, or configs outside the matrix) gets one point per
config. Points whose run did not pass are drawn as a red cross (at their metric, or on the
bottom edge when the run has none), so a failed config never silently drops out.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.campaign.records import SweepAnswer, SweepSpec, SweepTableRow
from orchestrator.config.experiment import Experiment
from orchestrator.store.store import CampaignRow, Store

PALETTE = ["#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037"]
FAILED = "#c62828"
CHAR_W = 6.6  # px per character of the 11px sans-serif labels (generous: labels never clip)


def _answer(camp: CampaignRow) -> SweepAnswer:
    return SweepAnswer.from_dict(camp.answer or {})


def _rows(camp: CampaignRow) -> list[SweepTableRow]:
    return _answer(camp).rows


def _values(camp: CampaignRow) -> dict[str, dict[str, Any]]:
    return {it.label: dict(it.values) for it in SweepSpec.from_dict(camp.spec).items}


def fmt(value: Any) -> str:
    """A swept value: a flag set to null/false is absent from the command line."""
    return "(absent)" if value is None or value is False else str(value)


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def _metric(v: Any) -> str:
    return "" if v is None else f"{v:g}"


# ---------------------------------------------------------------------------- night to night


@dataclass(frozen=True)
class Change:
    config: str
    before: float | None  # mean metric over the repeats
    now: float | None
    verdict_before: str
    verdict_now: str
    regression: str  # why this is a regression, or ""

    @property
    def ratio(self) -> float | None:
        if self.before is None or self.now is None or self.before == 0:
            return None
        return self.now / self.before - 1.0

    def describe(self) -> str:
        parts = []
        if self.before is not None or self.now is not None:
            change = f" ({self.ratio:+.1%})" if self.ratio is not None else ""
            parts.append(
                f"metric {_metric(self.before) or '-'} -> {_metric(self.now) or '-'}{change}"
            )
        if self.verdict_before != self.verdict_now:
            parts.append(f"verdict {self.verdict_before} -> {self.verdict_now}")
        return ", ".join(parts) or "unchanged"


@dataclass(frozen=True)
class Comparison:
    previous: CampaignRow
    changes: list[Change]
    #: the reference config moved beyond the bar since the previous run: relative bars moved
    #: with it, so verdicts may have changed with no change of their own metric ("" if not)
    reference_moved: str = ""

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]

    def headline(self) -> str:
        when = _when(self.previous.created)
        regs = self.regressions
        moved = f"; {self.reference_moved}" if self.reference_moved else ""
        if not regs:
            return (
                f"compared with campaign {self.previous.id} ({when}): "
                f"no regression beyond the bar{moved}"
            )
        return (
            f"REGRESSION since campaign {self.previous.id} ({when}): "
            + "; ".join(f"{c.config}: {c.regression}" for c in regs)
            + moved
        )

    def regression_lines(self) -> list[str]:
        """One line per regression (config: why), then the reference's move, if any."""
        return [f"{c.config}: {c.regression}" for c in self.regressions] + (
            [self.reference_moved] if self.reference_moved else []
        )


def _summary(rows: list[SweepTableRow]) -> dict[str, tuple[float | None, str]]:
    """config -> (mean metric, verdict over the repeats: pass only if every repeat passed)."""
    by: dict[str, list[SweepTableRow]] = {}
    for r in rows:
        by.setdefault(r.config, []).append(r)
    out: dict[str, tuple[float | None, str]] = {}
    for config, rs in by.items():
        ms = [float(r.metric) for r in rs if r.metric is not None]
        verdicts = [r.verdict for r in rs if r.verdict]
        bad = [v for v in verdicts if v != "pass"]
        verdict = bad[0] if bad else ("pass" if verdicts else "not run")
        out[config] = (sum(ms) / len(ms) if ms else None, verdict)
    return out


def _bars(camp: CampaignRow) -> dict[str, Any]:
    out = {}
    for it in SweepSpec.from_dict(camp.spec).items:
        try:
            exp = Experiment.from_dict(it.config)
        except Exception:  # noqa: BLE001 - an unreadable old record: no bar, verdicts only
            continue
        out[it.label] = exp.probe
    return out


def compare(previous: CampaignRow, camp: CampaignRow) -> Comparison:
    """Each config of `camp` against the same config in `previous` (the night before)."""
    before, now = _summary(_rows(previous)), _summary(_rows(camp))
    probes = _bars(camp)
    changes = []
    for config, (m_now, v_now) in now.items():
        if config not in before:
            continue
        m_before, v_before = before[config]
        why = []
        probe = probes.get(config)
        cond = probe.condition if probe is not None else None
        if (
            cond is not None
            and cond.relative_to_good
            and m_before is not None
            and m_now is not None
            and not cond.holds(m_now, m_before)
        ):
            why.append(
                f"metric {m_before:g} -> {m_now:g} ({m_now / m_before - 1:+.1%}), beyond "
                f"the bar {probe.pass_if} against the previous run"
            )
        if v_before == "pass" and v_now not in ("pass", "not run"):
            why.append(f"verdict pass -> {v_now}")
        changes.append(Change(config, m_before, m_now, v_before, v_now, "; ".join(why)))
    return Comparison(previous, changes, _reference_moved(previous, camp, changes, probes))


def _reference_moved(
    previous: CampaignRow, camp: CampaignRow, changes: list[Change], probes: dict[str, Any]
) -> str:
    """Why the verdicts against the reference moved with it, or "" when it held still (within
    its relative bar, either way) or there is none to compare."""
    ref = _answer(camp).reference
    if not ref or ref != _answer(previous).reference:
        return ""
    change = next((c for c in changes if c.config == ref), None)
    probe = probes.get(ref)
    cond = probe.condition if probe is not None else None
    if (
        change is None
        or cond is None
        or not cond.relative_to_good
        or not change.before
        or change.now is None
    ):
        return ""
    if cond.holds(change.now, change.before) and cond.holds(change.before, change.now):
        return ""
    # verdicts that changed while the config's own metric stayed within the bar: the
    # reference's move, not the config's, changed them
    flipped = [
        c
        for c in changes
        if c.config != ref
        and c.verdict_before != c.verdict_now
        and c.before is not None
        and c.now is not None
        and c.before > 0
        and cond.holds(c.now, c.before)
        and cond.holds(c.before, c.now)
    ]
    text = (
        f"the reference {ref} itself moved {change.now / change.before - 1:+.1%} "
        f"({change.before:g} -> {change.now:g}), beyond its bar {probe.pass_if}: relative "
        "bars moved with it"
    )
    if flipped:
        text += "; verdicts that changed with it, not with their own metric: " + ", ".join(
            f"{c.config} {c.verdict_before} -> {c.verdict_now}" for c in flipped
        )
    return text


def previous_run(store: Store, camp: CampaignRow) -> CampaignRow | None:
    """The same sweep's previous campaign (same configs, repeats and hosts) with results."""
    prev = store.latest_campaign(camp.key, before=camp.created)
    while prev is not None and not _rows(prev):
        prev = store.latest_campaign(camp.key, before=prev.created)
    return prev


def comparison(store: Store, camp: CampaignRow) -> Comparison | None:
    prev = previous_run(store, camp)
    return compare(prev, camp) if prev is not None else None


# ---------------------------------------------------------------------------- Markdown


def _totals(camp: CampaignRow) -> str:
    a = _answer(camp)
    return f"runs: {a.total_executed} executed, {a.total_reused} reused from earlier campaigns"


def _reference_line(camp: CampaignRow) -> str:
    ref = _answer(camp).reference
    if not ref:
        return ""
    return (
        f"probe bars relative to good are judged against the reference config "
        f"{ref}, measured in this sweep (each repeat against its own)"
    )


def _said(camp: CampaignRow, text: Callable[[str], str], code: Callable[[str], str]) -> list[str]:
    """Why the sweep stopped, how to resume it and what relative bars are judged against, in
    one format (`text` escapes words, `code` marks up a command)."""
    a = _answer(camp)
    out = [text(a.message)] if a.message else []
    if a.resume:
        out.append(text("resume with: ") + code(a.resume))
    if _reference_line(camp):
        out.append(text(_reference_line(camp)))
    return out


def _verdict_cell(r: SweepTableRow) -> str:
    v = r.verdict or "not run"
    return f"{v} (reused)" if r.reused_from else v


def _run_cell(r: SweepTableRow) -> str:
    run = r.run or ""
    return f"{run}, reused from {r.reused_from}" if r.reused_from else run


def markdown(camp: CampaignRow, comp: Comparison | None = None) -> str:
    spec = SweepSpec.from_dict(camp.spec)
    out = [f"# Sweep {spec.name} (campaign {camp.id})", ""]
    if comp is not None:
        out += [f"**{comp.headline()}**", ""]
    out += [
        f"- sweep file: `{spec.sweep}`; hosts: {', '.join(spec.hosts)}",
        f"- started {_when(camp.created)}, status **{camp.status}**; {_totals(camp)}",
    ]
    out += [f"- {line}" for line in _said(camp, str, lambda c: f"`{c}`")]
    out += [
        *_removed_lines(camp),
        "",
        "| config | repeat | verdict | signature | metric | time | run |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in _rows(camp):
        dur = "" if r.duration is None else f"{r.duration:.0f}s"
        out.append(
            f"| {r.config} | {r.repeat + 1} | {_verdict_cell(r)} | "
            f"{r.signature or ''} | {_metric(r.metric)} | {dur} | "
            f"{_run_cell(r)} |"
        )
    if comp is not None:
        out += [
            "",
            f"## Against the previous run (campaign {comp.previous.id}, "
            f"{_when(comp.previous.created)})",
            "",
            "| config | metric before | metric now | change | verdict before | verdict now "
            "| regression |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in comp.changes:
            change = f"{c.ratio:+.1%}" if c.ratio is not None else ""
            out.append(
                f"| {c.config} | {_metric(c.before)} | {_metric(c.now)} | {change} | "
                f"{c.verdict_before} | {c.verdict_now} | {c.regression} |"
            )
    return "\n".join(out) + "\n"


def _removed(camp: CampaignRow) -> list[tuple[str, str]]:
    return _answer(camp).removed_hosts


def _removed_lines(camp: CampaignRow) -> list[str]:
    return [f"- host {h} was taken out of the pool: {why}" for h, why in _removed(camp)]


# ---------------------------------------------------------------------------- the plot


@dataclass(frozen=True)
class _Point:
    series: str
    x: str
    y: float | None  # None: no metric (the run failed before the probe measured)
    passed: bool
    title: str


def _points(camp: CampaignRow) -> tuple[str, list[str], list[_Point]]:
    """(x axis title, x categories in order, points). Line mode: the first swept axis when
    every row has a value for it; else one category per config."""
    axes = SweepSpec.from_dict(camp.spec).axes
    values = _values(camp)
    rows = [r for r in _rows(camp) if r.verdict]
    line_mode = bool(axes) and all(axes[0] in values.get(r.config, {}) for r in rows)
    points: list[_Point] = []
    xs: list[str] = []
    for r in rows:
        vals = values.get(r.config, {})
        if line_mode:
            x = fmt(vals[axes[0]])
            series = ", ".join(f"{a}={fmt(vals.get(a))}" for a in axes[1:]) or axes[0]
        else:
            x, series = r.config, "metric"
        if x not in xs:
            xs.append(x)
        y = None if r.metric is None else float(r.metric)
        title = f"{r.config} (repeat {r.repeat + 1}): {r.verdict}" + (
            f", {y:g}" if y is not None else ", no metric"
        )
        points.append(_Point(series, x, y, r.verdict == "pass", title))
    if line_mode:
        raw = {fmt(v): v for r in rows for k, v in values.get(r.config, {}).items() if k == axes[0]}

        def order(label: str) -> tuple[int, float, str]:
            v = raw.get(label)  # numbers by value, then words, the absent flag last
            if v is None or v is False:
                return (2, 0.0, "")
            if isinstance(v, int | float) and not isinstance(v, bool):
                return (0, float(v), "")
            return (1, 0.0, str(v))

        xs.sort(key=order)
        return axes[0], xs, points
    return "config", xs, points


def svg_plot(camp: CampaignRow, width: int = 640, height: int = 320) -> str:
    """The probe metric per config; '' when no run has a metric."""
    x_title, xs, points = _points(camp)
    ys = [p.y for p in points if p.y is not None]
    if not ys:
        return ""
    e = html.escape
    lo, hi = min(ys), max(ys)
    pad = (hi - lo) * 0.1 or max(abs(hi) * 0.1, 1.0)
    lo, hi = lo - pad, hi + pad
    series_names = sorted({p.series for p in points})
    legend = [
        *series_names,
        *(
            ["x: did not pass (at the bottom edge: no metric)"]
            if any(not p.passed for p in points)
            else []
        ),
    ]
    categorical = x_title == "config"
    longest_x = max(len(x) for x in xs)
    left, right, top = 60, 20, 20
    # rotated config names need room below the axis; legend lines follow, each in full
    x_labels_h = int(CHAR_W * longest_x * 0.6) + 24 if categorical else 24
    bottom = x_labels_h + 20 + 16 * len(legend)
    pw = max(width - left - right, 48 * len(xs))
    width = max(left + pw + right, left + int(CHAR_W * max(len(s) for s in legend)) + 40)
    ph = height - top - 40
    height = top + ph + bottom

    def px(x: str) -> float:
        return left + (pw * (xs.index(x) + 0.5) / len(xs))

    def py(y: float) -> float:
        return top + ph * (1 - (y - lo) / (hi - lo))

    parts = [
        f"<svg id=plot xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"font-family='sans-serif' font-size='11'>",
        f"<rect x='{left}' y='{top}' width='{pw}' height='{ph}' fill='#fafafa' stroke='#ccc'/>",
    ]
    for k in range(5):
        y = lo + (hi - lo) * k / 4
        parts.append(f"<text x='{left - 6}' y='{py(y) + 4:.1f}' text-anchor='end'>{y:.4g}</text>")
        parts.append(
            f"<line x1='{left}' x2='{left + pw}' y1='{py(y):.1f}' y2='{py(y):.1f}' stroke='#eee'/>"
        )
    for x in xs:
        if categorical:
            parts.append(
                f"<text x='{px(x):.1f}' y='{top + ph + 14}' text-anchor='end' "
                f"transform='rotate(-35 {px(x):.1f} {top + ph + 14})'>{e(x)}</text>"
            )
        else:
            parts.append(
                f"<text x='{px(x):.1f}' y='{top + ph + 16}' text-anchor='middle'>{e(x)}</text>"
            )
    parts.append(
        f"<text x='{left + pw / 2}' y='{top + ph + x_labels_h + 4}' "
        f"text-anchor='middle'>{e(x_title)}</text>"
    )
    for i, series in enumerate(series_names):
        color = PALETTE[i % len(PALETTE)]
        pts = [p for p in points if p.series == series]
        avg: dict[str, list[float]] = {}
        for p in pts:
            if p.y is not None:
                avg.setdefault(p.x, []).append(p.y)
        line = sorted(((x, sum(v) / len(v)) for x, v in avg.items()), key=lambda q: xs.index(q[0]))
        if len(line) > 1 and not categorical:
            d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in line)
            parts.append(f"<polyline fill='none' stroke='{color}' stroke-width='2' points='{d}'/>")
        for p in pts:
            cx = px(p.x)
            if p.passed and p.y is not None:
                parts.append(
                    f"<circle cx='{cx:.1f}' cy='{py(p.y):.1f}' r='3.5' fill='{color}'>"
                    f"<title>{e(p.title)}</title></circle>"
                )
                continue
            cy = py(p.y) if p.y is not None else top + ph - 5
            parts.append(
                f"<path class=failed d='M{cx - 4:.1f},{cy - 4:.1f} l8,8 m0,-8 l-8,8' "
                f"stroke='{FAILED}' stroke-width='2.5'><title>{e(p.title)}</title>"
                "</path>"
            )
    ly = top + ph + x_labels_h + 22
    for i, name in enumerate(legend):
        color = FAILED if i >= len(series_names) else PALETTE[i % len(PALETTE)]
        parts.append(
            f"<text class=legend x='{left}' y='{ly + 16 * i}' fill='{color}'>{e(name)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------------------- HTML


def html_page(camp: CampaignRow, comp: Comparison | None = None) -> str:
    from orchestrator.reports.report import _CSS, COLORS

    e = html.escape
    spec = SweepSpec.from_dict(camp.spec)
    parts = [
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>Sweep "
        f"{e(spec.name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Sweep {e(spec.name)} (campaign {e(camp.id)})</h1>",
    ]
    if comp is not None:
        color = FAILED if comp.regressions else "#2e7d32"
        parts.append(f"<p id=comparison style='color:{color}'><b>{e(comp.headline())}</b></p>")
    parts.append(
        f"<p>sweep file <code>{e(spec.sweep)}</code>, hosts "
        f"{e(', '.join(spec.hosts))}, started {e(_when(camp.created))}, status "
        f"<b>{e(camp.status)}</b>; {e(_totals(camp))}</p>"
    )
    parts += [f"<p>{line}</p>" for line in _said(camp, e, lambda c: f"<code>{e(c)}</code>")]
    parts += [
        f"<p class=removed>host <b>{e(h)}</b> was taken out of the pool: {e(why)}</p>"
        for h, why in _removed(camp)
    ]
    plot = svg_plot(camp)
    if plot:
        parts.append("<h2>Probe metric</h2>" + plot)
    parts.append(
        "<h2>Results</h2><table id=results><tr><th>config</th><th>repeat</th>"
        "<th>verdict</th><th>signature</th><th>metric</th><th>time</th><th>run</th></tr>"
    )
    for r in _rows(camp):
        v = r.verdict or "not run"
        dur = "" if r.duration is None else f"{r.duration:.0f}s"
        parts.append(
            f"<tr><td>{e(r.config)}</td><td>{r.repeat + 1}</td>"
            f"<td class=v style='color:{COLORS.get(v, '#000')}'>{e(_verdict_cell(r))}</td>"
            f"<td><code>{e(r.signature or '')}</code></td><td>{_metric(r.metric)}"
            f"</td><td>{dur}</td><td>{e(_run_cell(r))}</td></tr>"
        )
    parts.append("</table>")
    if comp is not None:
        parts.append(
            f"<h2>Against the previous run (campaign {e(comp.previous.id)}, "
            f"{e(_when(comp.previous.created))})</h2><table id=comparison-table><tr>"
            "<th>config</th><th>metric before</th><th>metric now</th><th>change</th>"
            "<th>verdict before</th><th>verdict now</th><th>regression</th></tr>"
        )
        for c in comp.changes:
            change = f"{c.ratio:+.1%}" if c.ratio is not None else ""
            style = f" style='color:{FAILED}'" if c.regression else ""
            parts.append(
                f"<tr{style}><td>{e(c.config)}</td><td>{_metric(c.before)}</td>"
                f"<td>{_metric(c.now)}</td><td>{change}</td><td>{e(c.verdict_before)}"
                f"</td><td>{e(c.verdict_now)}</td><td>{e(c.regression)}</td></tr>"
            )
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_sweep_reports(store: Store, campaign_id: str) -> list[Path]:
    from orchestrator.reports import env_report
    from orchestrator.reports.report import write_private

    camp = store.campaign(campaign_id)
    comp = comparison(store, camp)
    seen = store.campaign_environments(camp.id)
    md = markdown(camp, comp) + "\n" + "\n".join(env_report.markdown_section(seen))
    page = html_page(camp, comp).removesuffix("</body></html>")
    page += env_report.html_section(seen) + "</body></html>"
    return write_private(store, camp.id, {".md": md, ".html": page})
