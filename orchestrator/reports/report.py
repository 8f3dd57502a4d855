"""Campaign reports: Markdown and a self-contained HTML page (no server, no scripts).

The answer comes first, then each step of the search as a table and as a matrix diagram
(one row per run, one column per delta, filled where the variant has the delta, coloured
by verdict), so the narrowing can be read at a glance; then the findings grouped by
signature with log excerpts.
"""

from __future__ import annotations

import html
import os
import time
from pathlib import Path

from orchestrator.campaign.records import Outcome, Status
from orchestrator.diagnosis.classify.analyze import analyze_log
from orchestrator.diagnosis.verdicts import Signature, relative
from orchestrator.reports import answers_view, env_report
from orchestrator.reports.deployment_view import CampaignDeployment, of_campaign
from orchestrator.store.store import CampaignRow, EnvironmentSeen, RunRow, Store

COLORS = {
    "pass": "#2e7d32",
    "fail": "#c62828",
    "other": "#8e24aa",
    "timeout": "#ef6c00",
    "invalid": "#00838f",
    "infra": "#757575",
}


def _relative(run: RunRow, camp: CampaignRow) -> str:
    return relative(run.verdict, run.signature, camp.target).value


def _excerpt(run: RunRow, limit: int = 14, runs: list[RunRow] | None = None) -> str:
    judged = (run.answers or {}).get("judged") or {}
    if judged.get("passed") is False:  # a wrong answer: good's and this run's side by side
        good = next((r for r in runs or () if r.variant == () and r.answers), None)
        return "\n".join(answers_view.lines(run.answers, good.answers if good else None))
    text = run.log_tail()
    if not text:
        return ""
    analysis = analyze_log(text)
    lines = list(analysis.excerpt) if analysis.excerpt else text.splitlines()[-limit:]
    return "\n".join(lines[-limit:])


def _deltas(camp: CampaignRow) -> list[str]:
    from orchestrator.planner.deltas import Delta

    out = []
    for d in camp.spec.get("deltas", []):
        out.append(Delta.from_dict(d).describe())
    return out


def _sureness(answer: Outcome) -> list[str]:
    """The answer's confidence, measured reproduction rate and search switch, as sentences."""
    noise = answer.noise or {}
    out = []
    if noise.get("switched"):
        out.append(str(noise["switched"]))
    if noise.get("confidence") is not None:
        out.append(f"confidence {noise['confidence']:.3f}")
    if noise.get("reproduction_rate") is not None:
        out.append(
            f"reproduction rate {noise['reproduction_rate']:.2f} "
            f"({noise.get('reproduction_counts')} runs with the culprit set)"
        )
    return out


def _rehearsed(runs: list[RunRow]) -> bool:
    """Whether any run loaded dummy weights (a rehearsal): then each step says which."""
    return any(getattr(r, "weights", "real") == "dummy" for r in runs)


def _weights(answer: Outcome) -> list[str]:
    """The rehearsal on dummy weights, and how many starts loaded which weights."""
    w = answer.weights or {}
    if not (w.get("rehearsal") or w.get("dummy_starts")):
        return []
    out = [f"weights: {w['note']}"] if w.get("note") else []
    out.append(
        f"starts on real weights: {w.get('real_starts', 0)}, on dummy weights: "
        f"{w.get('dummy_starts', 0)}"
    )
    return out


def _unsure(answer: Outcome) -> list[str]:
    """For an answer below the confidence asked: why, the next runs and how to go on."""
    if answer.status is not Status.UNSURE:
        return []
    noise = answer.noise or {}
    out = [f"unsure: {answer.message}" if answer.message else "unsure"]
    if noise.get("next_runs"):
        out.append("next runs: " + "; ".join(noise["next_runs"]))
    if noise.get("resume"):
        out.append(f"continue with: {noise['resume']}")
    return out


def _variant_counts(camp: CampaignRow, runs: list[RunRow]) -> list[tuple[str, str, int]]:
    """(variant, "fail k of m", first run) per variant, in the order first run."""
    from orchestrator.campaign.flaky import counts

    by = counts(runs, camp.target, relative)
    out, seen = [], set()
    for r in runs:
        if r.variant in seen or r.variant not in by:
            continue
        seen.add(r.variant)
        out.append((r.label, str(by[r.variant]), r.seq))
    return out


def _by_signature(runs: list[RunRow]) -> list[tuple[str, list[RunRow], RunRow]]:
    """(signature, its executed runs, the run of the smallest variant) per signature met."""
    groups: dict[Signature, list[RunRow]] = {}  # one failure is one group, shown as first met
    for r in runs:
        if r.signature and not r.cached_from:
            groups.setdefault(r.signature, []).append(r)
    return [(str(sig), rs, min(rs, key=lambda r: len(r.variant))) for sig, rs in groups.items()]


def _answer(camp: CampaignRow) -> tuple[Outcome, list[str]]:
    """The campaign's recorded answer (empty when it has none) and its cleared deltas."""
    answer = Outcome.from_dict(camp.answer or {})
    used = {i for c in answer.culprits for i in c.indices}
    return answer, [d for i, d in enumerate(_deltas(camp)) if i not in used]


def _with(text: str | None) -> str:
    return f" ({text})" if text else ""


def _builds(
    runs: list[RunRow],
    environments: list[EnvironmentSeen] | None,
) -> dict[str, str] | None:
    """Run id -> its build as the config named it and the server version read inside it
    (`0.5.23 (serves 0.5.23)`); None when no run named a build (no column then)."""
    named = {r.id: (r.config.get("service") or {}).get("build") for r in runs}
    if not any(named.values()):
        return None
    served: dict[str, str] = {}
    for seen in environments or []:
        for rid in seen.runs:
            if seen.env.server_version:
                served[rid] = seen.env.server_version
            if seen.env.image_id:
                served[rid] = served.get(rid, "") + f" {seen.env.image_id[:19]}"
    return {
        rid: (b or "as installed") + (f" (serves {served[rid].strip()})" if rid in served else "")
        for rid, b in named.items()
    }


def _failed_first(dep: CampaignDeployment | None, run: RunRow) -> str:
    """`; failed first on node1 on b300-02 (its log below)` for a deployment's run."""
    where = dep.first_failure_of(run.id) if dep else ""
    return f"; failed first on {where} (its log below)" if where else ""


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def _md_roles(dep: CampaignDeployment) -> list[str]:
    """The deployment's roles in start order, with the host and unit each ran on."""
    out = ["## Roles", "", "| role | kind | rank | host | unit |", "|---|---|---|---|---|"]
    for r in dep.roles:
        rank = "" if r.rank is None else str(r.rank)
        out.append(f"| {r.role} | {r.kind} | {rank} | {r.host or '?'} | {r.unit} |")
    return out


def markdown(
    camp: CampaignRow,
    runs: list[RunRow],
    environments: list[EnvironmentSeen] | None = None,
    deployment: CampaignDeployment | None = None,
) -> str:
    dep = deployment
    answer, cleared = _answer(camp)
    deltas = _deltas(camp)
    spec = camp.spec
    out = [f"# Campaign {camp.id}: {camp.kind}", ""]
    out.append(f"- good: `{spec.get('good_source')}`  bad: `{spec.get('bad_source')}`")
    out.append(f"- hosts: {', '.join(spec.get('hosts', []))}; strategy: {spec.get('strategy')}")
    out.append(f"- started {_when(camp.created)}, status **{camp.status}**")
    if camp.target:
        out.append(f"- target failure: `{camp.target}`")
    if dep is not None:
        out.append("- roles: " + ", ".join(f"{r.role} on {r.host or '?'}" for r in dep.roles))
        if dep.answer_line():
            out.append(f"- {dep.answer_line()}")
    unsure = answer.status is Status.UNSURE
    out += ["", "## Best answer (unsure)" if unsure else "## Answer", ""]
    out += [f"**{line}**" for line in _unsure(answer)[:1]]
    if answer.culprits:
        for c in answer.culprits:
            kind = c.kind
            if unsure:
                kind += ", not yet conclusive"
            under = (
                " with the repair " + ", ".join(f"`{m}`" for m in c.repaired_with)
                if c.repaired_with
                else ""
            )
            rep = (
                f"good + set reproduces the failure{under}: run {c.reproduced_by}"
                f"{_with(c.reproduced_counts)}"
                if c.reproduced_by is not None
                else "no run of good + exactly this set is recorded"
            )
            if c.needs:
                kind += f"; needs {', '.join(f'`{n}`' for n in c.needs)}"
            out.append(f"- **{' + '.join(f'`{f}`' for f in c.flags)}** ({kind}); {rep}")
            for flag, rid in c.cleared_by.items():
                if rid is None:  # evidence lines cite only runs that exist
                    continue
                got = _with(c.cleared_count(flag))
                out.append(f"  - {c.claim(flag).replace(flag, f'`{flag}`', 1)}: run {rid}{got}")
        if cleared:
            out.append(f"- cleared: {', '.join(f'`{d}`' for d in cleared)}")
    else:
        out.append(f"No answer: {answer.message or camp.status}")
        if answer.narrowed:
            needs = ", ".join(f"`{d}`" for d in answer.narrowed.failure_needs_some_of)
            out.append(f"- narrowed so far: the failure needs some of {needs}")
    for f in answer.findings:
        out.append(
            f"- other failure `{f.signature}`: smallest variant {f.label} "
            f"(run {f.run_id}, {f.seen()})"
        )
    if answer.resource:
        out.append(f"- resource: {answer.resource}")
    if answer.answers:
        out.append(f"- answers: {answer.answers}")
    for note in answer.repairs:
        out.append(f"- repair: {note.sentence()}")
    for inv in answer.invalid:
        out.append(f"- invalid: {inv.variant}: {inv.reason} (run {inv.run})")
    for fl in answer.flaky:
        out.append(f"- flaky: {fl}")
    out += [f"- {line}" for line in _sureness(answer)]
    out += [f"- {line}" for line in _weights(answer)]
    out += [f"- {line}" for line in _unsure(answer)[1:]]
    if environments is not None:
        out += ["", *env_report.markdown_section(environments)]
    if dep is not None:
        out += ["", *_md_roles(dep)]
    out += ["", "## Deltas", "", "| # | change |", "|---|---|"]
    out += [f"| {i} | `{d}` |" for i, d in enumerate(deltas)]
    # which weights a run loaded: a column only when some run loaded dummy ones
    rehearsed = _rehearsed(runs)
    # which build a run ran: a column only when some config named one
    built = _builds(runs, environments)
    out += [
        "",
        "## Steps",
        "",
        "| run | variant | purpose |"
        + (" weights |" if rehearsed else "")
        + (" build |" if built else "")
        + " verdict | signature |"
        + (" failed first |" if dep else "")
        + " time |",
        "|---|---|---|"
        + ("---|" if rehearsed else "")
        + ("---|" if built else "")
        + ("---|" if dep else "")
        + "---|---|---|",
    ]
    for r in runs:
        src = " (cached)" if r.cached_from else ""
        out.append(
            f"| {r.id} | {r.label} | {r.purpose} | "
            + (f"{r.weights} | " if rehearsed else "")
            + (f"{built[r.id]} | " if built else "")
            + f"{_relative(r, camp)}{src} | {r.signature or ''} | "
            + (f"{dep.first_failure_of(r.id)} | " if dep else "")
            + f"{r.duration:.0f}s |"
        )
    out += [
        "",
        "## Counts per variant",
        "",
        "| variant | target failures | first run |",
        "|---|---|---|",
    ]
    out += [f"| {label} | {got} | {seq} |" for label, got, seq in _variant_counts(camp, runs)]
    out += ["", "## Narrowing", "", "```"]
    out.append("run      " + " ".join(f"{i:>2}" for i in range(len(deltas))) + "  verdict")
    for r in runs:
        cells = " ".join(" #" if i in r.variant else " ." for i in range(len(deltas)))
        out.append(f"{r.id:<8} {cells}  {_relative(r, camp)}")
    out += ["```", "", "## Findings by signature", ""]
    for sig, rs, smallest in _by_signature(runs):
        out += [
            f"### `{sig}`",
            "",
            f"{len(rs)} run(s); smallest variant: {smallest.label} (run {smallest.id})"
            + _failed_first(dep, smallest),
            "",
            "```",
            _excerpt(smallest, runs=runs),
            "```",
            "",
        ]
    return "\n".join(out) + "\n"


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f3f3f3}
code,pre{font-family:ui-monospace,monospace;font-size:12.5px}pre{background:#f6f6f6;padding:8px;
overflow-x:auto}.answer{border:2px solid #c62828;padding:.6em 1em;border-radius:6px;
background:#fff7f7}.unsure{border-color:#ef6c00;background:#fff8e1}
.v{font-weight:600}.cell{width:18px;height:18px;border:1px solid #fff}
.matrix td{padding:0;border:1px solid #fff}.matrix th{font-weight:normal;font-size:11px}
.changed{border-left:4px solid #ef6c00;padding-left:.6em}
"""


def html_page(
    camp: CampaignRow,
    runs: list[RunRow],
    environments: list[EnvironmentSeen] | None = None,
    deployment: CampaignDeployment | None = None,
) -> str:
    dep = deployment
    e = html.escape
    answer, cleared = _answer(camp)
    deltas = _deltas(camp)
    spec = camp.spec
    parts = [
        f"<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>Campaign {e(camp.id)}</title><style>{_CSS}</style></head><body>"
    ]
    parts.append(f"<h1>Campaign {e(camp.id)}: {e(camp.kind)}</h1>")
    parts.append(
        f"<p>good <code>{e(str(spec.get('good_source')))}</code>, bad "
        f"<code>{e(str(spec.get('bad_source')))}</code>, hosts "
        f"{e(', '.join(spec.get('hosts', [])))}, strategy "
        f"{e(str(spec.get('strategy')))}, started {e(_when(camp.created))}, status "
        f"<b>{e(camp.status)}</b></p>"
    )
    unsure = answer.status is Status.UNSURE
    if unsure:  # amber, not the answer's colours: below the confidence asked
        parts.append(
            '<div class="answer unsure" id=answer><h2 style="margin-top:0">'
            "Best answer (unsure)</h2>"
        )
        parts += [f"<p><b>{e(line)}</b></p>" for line in _unsure(answer)[:1]]
    else:
        parts.append('<div class=answer id=answer><h2 style="margin-top:0">Answer</h2>')
    if camp.target:
        parts.append(f"<p>Target failure: <code>{e(str(camp.target))}</code></p>")
    if dep is not None and dep.answer_line():
        parts.append(f"<p class=first-failure>{e(str(dep.answer_line()))}</p>")
    if answer.culprits:
        parts.append("<ul>")
        for c in answer.culprits:
            kind = c.kind
            if unsure:
                kind += ", not yet conclusive"
            flags = " + ".join(f"<code>{e(f)}</code>" for f in c.flags)
            repro = c.reproduced_counts
            if c.reproduced_by is None:
                parts.append(
                    f"<li class=culprit><b>{flags}</b> ({kind}): no run of good + "
                    "exactly this set is recorded<ul>"
                )
            else:
                under = (
                    " with the repair " + ", ".join(f"<code>{e(m)}</code>" for m in c.repaired_with)
                    if c.repaired_with
                    else ""
                )
                parts.append(
                    f"<li class=culprit><b>{flags}</b> ({kind}): good + set "
                    f"reproduces the failure{under} (run {e(str(c.reproduced_by))}"
                    f"{'; ' + e(repro) if repro else ''})<ul>"
                )
            for flag, rid in c.cleared_by.items():
                if rid is None:  # evidence lines cite only runs that exist
                    continue
                got = c.cleared_count(flag)
                parts.append(
                    f"<li>{e(c.claim(flag))} (run {e(str(rid))}{'; ' + e(got) if got else ''})</li>"
                )
            parts.append("</ul></li>")
        parts.append("</ul>")
        if cleared:
            parts.append(
                "<p>Cleared: " + ", ".join(f"<code>{e(d)}</code>" for d in cleared) + "</p>"
            )
    else:
        parts.append(f"<p>No answer: {e(answer.message or camp.status)}</p>")
        if answer.narrowed:
            parts.append(
                "<p>Narrowed so far: the failure needs some of "
                + ", ".join(f"<code>{e(d)}</code>" for d in answer.narrowed.failure_needs_some_of)
                + "</p>"
            )
    for f in answer.findings:
        parts.append(
            f"<p>Other failure <code>{e(str(f.signature))}</code>: smallest variant "
            f"{e(f.label)} (run {e(f.run_id)}, {e(f.seen())})</p>"
        )
    if answer.resource:
        parts.append(f"<p class=repair>Resource: {e(answer.resource)}</p>")
    if answer.answers:
        parts.append(f"<p>Answers: {e(answer.answers)}</p>")
    for note in answer.repairs:
        parts.append(f"<p class=repair>Repair: {e(note.sentence())}</p>")
    for inv in answer.invalid:
        parts.append(f"<p>Invalid: {e(inv.variant)}: {e(inv.reason)}</p>")
    parts += [f"<p class=sureness>{e(line)}</p>" for line in _sureness(answer)]
    parts += [f"<p class=weights>{e(line)}</p>" for line in _weights(answer)]
    parts += [f"<p class=next>{e(line)}</p>" for line in _unsure(answer)[1:]]
    parts.append("</div>")
    parts.append(
        "<h2>Counts per variant</h2><table id=counts><tr><th>variant</th>"
        "<th>target failures</th><th>first run</th></tr>"
    )
    parts += [
        f"<tr><td>{e(label)}</td><td>{e(got)}</td><td>{seq}</td></tr>"
        for label, got, seq in _variant_counts(camp, runs)
    ]
    parts.append("</table>")
    if environments is not None:
        parts.append(env_report.html_section(environments))
    if dep is not None:
        parts.append(
            "<h2>Roles</h2><table id=roles><tr><th>role</th><th>kind</th><th>rank</th>"
            "<th>host</th><th>unit</th></tr>"
        )
        parts += [
            f"<tr><td>{e(r.role)}</td><td>{e(r.kind)}</td>"
            f"<td>{'' if r.rank is None else r.rank}</td><td>{e(r.host or '?')}</td>"
            f"<td>{e(r.unit)}</td></tr>"
            for r in dep.roles
        ]
        parts.append("</table>")
    rehearsed = _rehearsed(runs)
    built = _builds(runs, environments)
    parts.append(
        "<h2>Steps</h2><table id=steps><tr><th>run</th><th>variant</th>"
        "<th>purpose</th>"
        + ("<th>weights</th>" if rehearsed else "")
        + ("<th>build</th>" if built else "")
        + "<th>verdict</th><th>signature</th>"
        + ("<th>failed first</th>" if dep else "")
        + "<th>time</th></tr>"
    )
    for r in runs:
        v = _relative(r, camp)
        src = " (cached)" if r.cached_from else ""
        parts.append(
            f"<tr><td>{e(r.id)}</td><td>{e(r.label)}</td><td>{e(r.purpose)}</td>"
            + (f"<td>{e(r.weights)}</td>" if rehearsed else "")
            + (f"<td>{e(built[r.id])}</td>" if built else "")
            + f"<td class=v style='color:{COLORS.get(v, '#000')}'>{e(v)}{src}</td>"
            f"<td><code>{e(str(r.signature or ''))}</code></td>"
            + (f"<td>{e(dep.first_failure_of(r.id))}</td>" if dep else "")
            + f"<td>{r.duration:.0f}s</td></tr>"
        )
    parts.append("</table>")
    parts.append(
        "<h2>How the difference was narrowed</h2><p>One row per run; a filled cell means "
        "the variant has that delta (good + filled cells).</p><table class=matrix>"
        "<tr><th>run</th>"
    )
    parts += [f"<th title='{e(d)}'>{i}</th>" for i, d in enumerate(deltas)]
    parts.append("<th>verdict</th></tr>")
    for r in runs:
        v = _relative(r, camp)
        color = COLORS.get(v, "#000")
        parts.append(f"<tr><th>{e(r.id)}</th>")
        for i in range(len(deltas)):
            fill = color if i in r.variant else "#eee"
            parts.append(f"<td><div class=cell style='background:{fill}'></div></td>")
        parts.append(f"<td class=v style='color:{color}'>&nbsp;{e(v)}</td></tr>")
    parts.append("</table><table>")
    parts += [f"<tr><td>{i}</td><td><code>{e(d)}</code></td></tr>" for i, d in enumerate(deltas)]
    parts.append("</table><h2>Findings by signature</h2>")
    for sig, rs, smallest in _by_signature(runs):
        parts.append(
            f"<h3><code>{e(sig)}</code></h3><p>{len(rs)} run(s); smallest variant "
            f"{e(smallest.label)} (run {e(smallest.id)}){e(_failed_first(dep, smallest))}</p>"
            f"<pre>{e(_excerpt(smallest, runs=runs))}</pre>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)


def write_private(store: Store, campaign_id: str, texts: dict[str, str]) -> list[Path]:
    """Write `results/reports/<campaign><suffix>` files atomically, readable by the owner."""
    out_dir = store.root / "reports"
    out_dir.mkdir(exist_ok=True, mode=0o700)
    paths = []
    for suffix, text in texts.items():
        path = out_dir / f"{campaign_id}{suffix}"
        tmp = path.with_suffix(suffix + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
        paths.append(path)
    return paths


def write_reports(store: Store, campaign_id: str) -> list[Path]:
    camp = store.campaign(campaign_id)
    runs = store.runs(camp.id)
    envs = store.campaign_environments(camp.id)
    dep = of_campaign(runs, store.host_record, camp.target)
    return write_private(
        store,
        camp.id,
        {
            ".md": markdown(camp, runs, envs, dep),
            ".html": html_page(camp, runs, envs, dep),
        },
    )
