"""`report CAMPAIGN --issue`: a bug report to paste into an SGLang or vLLM GitHub issue.

A one-line summary; the minimal reproducing command line (the good config plus the
culprit set, as it ran, secrets as `<NAME>` placeholders); what does not reproduce (the
bad config without each member of the set, the good config); the signature and the
root traceback trimmed to the frames that matter; the environment the failing run saw;
the run counts and how often the failure reproduced. GitHub-flavoured Markdown, under
200 lines, and nothing of the controller: no local paths, no results directory (what
upstream needs is the server's command line and environment). A deployment over several
hosts is the exception that names hosts: which role on which host failed first, and each
role's command line, are what upstream needs of a multi-node failure.

Pure: the caller hands in the campaign, its runs, each run's log text and environment.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from orchestrator.campaign.records import Outcome, Status
from orchestrator.config.secrets import MARKER
from orchestrator.diagnosis.classify.analyze import analyze_log
from orchestrator.diagnosis.classify.lines import strip_prefix
from orchestrator.diagnosis.verdicts import Verdict, relative
from orchestrator.execution.environment import HostEnvironment
from orchestrator.reports import answers_view
from orchestrator.reports.deployment_view import CampaignDeployment, of_campaign
from orchestrator.store.store import CampaignRow, RunRow

MAX_LINES = 199
#: frames kept from the end of a traceback (the innermost are where it broke), plus the first
KEEP_FRAMES = 6
MAX_TRACE_LINES = 40


def _relative(run: RunRow, camp: CampaignRow) -> Verdict:
    return relative(run.verdict, run.signature, camp.target)


def placeholders(word: str) -> str:
    """`[REDACTED:HF_TOKEN]` -> `<HF_TOKEN>`: what the reader fills in."""
    return MARKER.sub(lambda m: f"<{m[1]}>", word)


def command_block(argv: Sequence[str], env: dict[str, str], unset: Sequence[str] = ()) -> str:
    """The command as a reader pastes it: env removals and assignments, then one flag per
    line (a short option `-tp` is a flag too)."""
    from orchestrator.config.shortopts import is_option

    words = [shlex.quote(placeholders(w)) for w in argv]
    first = 0
    while first < len(words) and not words[first].startswith("--"):
        first += 1
    lines = ["env " + " ".join(f"-u {k}" for k in unset)] if unset else []
    lines += [f"{k}={shlex.quote(placeholders(v))}" for k, v in sorted(env.items())]
    lines.append(" ".join(words[:first]))
    i = first
    while i < len(words):
        group = [words[i]]
        if i + 1 < len(words) and not is_option(words[i + 1]):
            group.append(words[i + 1])
            i += 1
        lines.append("  " + " ".join(group))
        i += 1
    return " \\\n".join(lines)


def trim_traceback(lines: Sequence[str], keep: int = KEEP_FRAMES) -> list[str]:
    """The traceback's header, first frame and last `keep` frames, then the error lines;
    the frames in between become one `... (N frames omitted)` line."""
    # Python 3.11's `^^^^` markers under a frame's code line say nothing in an issue.
    body = [
        b for b in (strip_prefix(x).rstrip() for x in lines) if not re.fullmatch(r"\s*[\^~]+\s*", b)
    ]
    frame_starts = [i for i, x in enumerate(body) if re.match(r"\s*File \"", x)]
    if len(frame_starts) <= keep + 1:
        out = body
    else:
        cut_from = frame_starts[1]
        cut_to = frame_starts[-keep]
        omitted = len(frame_starts) - keep - 1
        out = body[:cut_from] + [f"  ... ({omitted} frames omitted)"] + body[cut_to:]
    if len(out) > MAX_TRACE_LINES:
        out = out[:4] + ["  ..."] + out[-(MAX_TRACE_LINES - 5) :]
    return out


def _hide(text: str, paths: Iterable[str]) -> str:
    for p in sorted((p for p in paths if p and len(p) > 1), key=len, reverse=True):
        text = text.replace(p, "<local>")
    return text


def _describe(v: Verdict, run: RunRow) -> str:
    if v is Verdict.PASS:
        # a campaign with an answers check judges what a launch answers, not only that it
        # serves: say which the pass means
        judged = (run.answers or {}).get("judged") or {}
        if judged.get("passed") is True:
            return "starts, serves and answers right (passes)"
        if run.answers and run.variant == () and not judged:
            return "starts and serves; its answers are the reference (passes)"
        return "starts and serves (passes)"
    if v is Verdict.FAIL:
        return "reproduces the failure"
    if v is Verdict.OTHER:
        return f"fails differently: `{run.signature}`"
    if v is Verdict.TIMEOUT:
        return "does not become ready (timeout)" + (f": `{run.signature}`" if run.signature else "")
    return f"{v.value}: {run.detail}"


_COUNTS = re.compile(r"fail (\d+) of (\d+)")


def _flaky_rate(answer: Outcome) -> tuple[float | None, str]:
    """(the reproduction rate measured, "k of n starts") when it is below 1; (None, "")
    for a failure that showed on every start."""
    noise = answer.noise or {}
    rate = noise.get("reproduction_rate")
    if not isinstance(rate, int | float) or rate >= 1:
        return None, ""
    m = _COUNTS.fullmatch(str(noise.get("reproduction_counts") or ""))
    return float(rate), f"{m[1]} of {m[2]} starts" if m else "some starts"


def _uncertain(said: str, counts: str | None, rate: float) -> str:
    """A launch's result beside the chance that it passed although it still carries the
    failure: at reproduction rate r, n passing starts of such a launch happen with
    probability (1 - r)^n."""
    m = _COUNTS.fullmatch(counts or "")
    if m is None:
        return f"{said}; not certain: the failure shows on {rate:.0%} of starts"
    fails, n = int(m[1]), int(m[2])
    if fails:
        return f"{said} (failed in {fails} of {n} starts)"
    miss = (1 - rate) ** n
    return (
        f"passed in {n} of {n} start{'s' if n != 1 else ''}; not certain: a launch that "
        f"still fails at rate {rate:.2f} passes {'them' if n != 1 else 'it'} with "
        f"probability {miss:.2f}"
    )


def nothing_to_report(camp: CampaignRow, runs: list[RunRow]) -> str | None:
    """Why the campaign has no bug to report upstream (None: it has one). A report needs a
    failure, a signature for it and a run that reproduced it: without them it would say
    "failure in ?" and "not recorded", which is not true of anything."""
    what = f"campaign {camp.id}"
    if camp.kind != "bisect":
        return (
            f"{what} is a {camp.kind}: it measures configs and names no failing flags "
            "(its report: `orchestrator report ID` without --issue)"
        )
    status = (camp.answer or {}).get("status") or camp.status
    message = (camp.answer or {}).get("message") or ""
    said = f" ({status}{': ' + message if message else ''})"
    if camp.target is None:
        return (
            f"{what} reproduced no failure{said}: the failing config never failed, or "
            "the campaign stopped before it ran"
        )
    real = [r for r in runs if r.verdict is not Verdict.INFRA]
    if not any(_relative(r, camp) is Verdict.FAIL for r in real):
        return f"{what} recorded no run that shows its target failure{said}"
    return None


def _builds_of(culprit: Any) -> tuple[str, str] | None:
    """(last good build, first bad build) when the culprit set holds a build step."""
    if culprit is None:
        return None
    for text, what in zip(culprit.deltas, culprit.whats or [], strict=False):
        if what == "build" and " -> " in text:
            old, new = text.removeprefix("~ build ").split(" -> ", 1)
            return old, new
    return None


def _role_commands(run: RunRow, dep: CampaignDeployment) -> list[str]:
    """Each role's command line as it ran, in start order, under its role and host."""
    from orchestrator.config.experiment import Experiment

    exp = Experiment.from_dict(run.config, source=f"run {run.id}")
    ran = dep.runs.get(run.id)
    out: list[str] = []
    for r in dep.roles:
        try:
            launch = exp.role_launch(r.role)
        except KeyError:  # a role the recorded config does not name
            continue
        rank = f" rank {r.rank}" if r.rank is not None and r.kind != "router" else ""
        own = ran.role(r.role) if ran is not None else None
        argv = list(own.argv) if own is not None and own.argv else launch.argv()
        out += [
            f"{r.role} ({r.kind}{rank}) on {r.host or '?'}:",
            "",
            "```bash",
            command_block(argv, launch.env_map(), launch.unset),
            "```",
            "",
        ]
    return out


def issue_markdown(
    camp: CampaignRow,
    runs: list[RunRow],
    *,
    log_of: Callable[[RunRow], str],
    env_of: Callable[[RunRow], HostEnvironment | None],
    local_paths: Iterable[str] = (),
    record_of: Callable[[str], Any] | None = None,
) -> str:
    """`record_of(run_id)`: a run's host record (a deployment's names its roles)."""
    answer = Outcome.from_dict(camp.answer or {})
    dep = of_campaign(runs, record_of, camp.target) if record_of is not None else None
    by_id = {r.id: r for r in runs}
    # a start a repair superseded (or a repaired start the server refused) says nothing
    # of its launch's failure: the repaired start does
    # (unless it shows the target as written: then it speaks, whatever its repair found)
    superseded = {
        str(r.repair.get("after"))
        for r in runs
        if r.repair and r.verdict not in (Verdict.INFRA, Verdict.INVALID)
    } - {r.id for r in runs if camp.target is not None and r.signature == camp.target}
    real = [
        r
        for r in runs
        if r.verdict is not Verdict.INFRA
        and r.id not in superseded
        and not (r.repair and r.verdict is Verdict.INVALID)
    ]
    culprit = answer.culprits[0] if answer.culprits else None
    # a failure that shows on some starts only: the rate the campaign measured over every
    # launch carrying the set, not the one start of the launch quoted below
    rate, carried = _flaky_rate(answer)
    # an ordered search of builds records one hidden step per build after good's: not
    # differences between the two launches, nor part of the bad variant
    order = (camp.spec.get("options") or {}).get("builds") or []
    n_deltas = len(camp.spec.get("deltas") or []) - max(len(order) - 1, 0)
    full = tuple(range(n_deltas))
    repro = by_id.get(culprit.reproduced_by) if culprit and culprit.reproduced_by else None
    if repro is None:  # not narrowed: the bad config itself
        repro = next(
            (r for r in real if r.variant == full and _relative(r, camp) is Verdict.FAIL), None
        )
    if repro is None:
        repro = next((r for r in real if _relative(r, camp) is Verdict.FAIL), None)
    env = env_of(repro) if repro else None
    if env is None and repro is not None:  # a reused run: the same host's, as it was then
        env = next(
            (
                e
                for r in runs
                if r.host == repro.host and r.env_digest
                for e in [env_of(r)]
                if e is not None
            ),
            None,
        )
    server = (env.server if env and env.server else None) or "the server"
    log = log_of(repro) if repro else ""
    analysis = analyze_log(log) if log else None
    error = (analysis.raw_message if analysis and analysis.raw_message else None) or (
        camp.target.message if camp.target else "the failure"
    )
    if camp.target is not None and camp.target.error_class == "wrong_output":
        error = f"wrong answers: {camp.target.message}"  # the log has no error to quote
    phase = camp.target.phase.value if camp.target else "?"
    flags = culprit.flags if culprit else []
    set_text = " + ".join(f"`{f}`" for f in flags)

    out: list[str] = []
    title = (
        f"[Bug] {server}: {camp.target.error_class if camp.target else 'failure'} "
        f"in {phase}" + (f" with {' + '.join(flags)}" if flags else "")
    )
    out += [f"# {title}", ""]
    version = f" {env.server_version}" if env and env.server_version else ""
    if culprit:
        alone = (
            "without any one of them it does not reproduce"
            if len(flags) > 1
            else "without it the failure does not reproduce"
        )
        if rate is not None:  # flaky: what passed is evidence, and says so
            alone = (
                f"it fails on some starts only ({carried}, rate {rate:.2f}), and "
                + ("without any one of them" if len(flags) > 1 else "without it")
                + " it did not reproduce in the starts tried"
            )
        summary = (
            f"{server}{version} fails during `{phase}` with `{error}` when "
            f"{set_text} {'are' if len(flags) > 1 else 'is'} set; {alone}."
        )
    else:
        summary = (
            f"{server}{version} fails during `{phase}` with `{error}`; the flags "
            "that cause it were not narrowed down."
        )
    failed_first = dep.runs.get(repro.id) if dep is not None and repro is not None else None
    if dep is not None and failed_first is not None and failed_first.first_failure:
        summary += (
            f" The server runs as {len(dep.roles)} roles on "
            f"{len({r.host for r in dep.roles})} hosts; the failure happens first on "
            f"{failed_first.first_failure}."
        )
    out += [f"**Summary:** {summary}", ""]
    if answer.resource:  # a resource failure: what a repair made of it, runs cited
        out += [f"**Resource:** {answer.resource}.", ""]
    if answer.answers:  # the rule the answers were judged by
        out += [f"**Answers:** {answer.answers}.", ""]
    builds = _builds_of(culprit)
    if builds is not None:
        last_good, first_bad = builds
        others = [f for f, w in zip(flags, culprit.whats or [], strict=False) if w != "build"]
        out += [
            f"**Build:** the first build that fails is `{first_bad}`; the last good one is "
            f"`{last_good}`"
            + (
                " (with "
                + " + ".join(f"`{f}`" for f in others)
                + "; without them both builds pass)"
                if others
                else ""
            )
            + ".",
            "",
        ]
    if answer.status is Status.UNSURE and culprit:
        noise = answer.noise or {}
        conf = noise.get("confidence")
        out += [
            f"**Not yet conclusive:** {set_text} is the best answer so far, "
            f"{conf or 0:.0%} likely to be right (below the "
            f"{noise.get('asked_confidence') or 0.95:.0%} the bisection asked for; runs "
            f"with it: {noise.get('reproduction_counts') or 'none'}). More runs are "
            "needed before this is a finding.",
            "",
        ]

    out += ["## Reproduction", ""]
    if repro is not None:
        removed = [
            k
            for k, v in ((repro.config.get("service") or {}).get("env") or {}).items()
            if v is None
        ]
        if dep is not None:
            out += _role_commands(repro, dep)
        else:
            out += ["```bash", command_block(repro.argv, repro.env, removed), "```", ""]
        if repro.repair and culprit and culprit.repaired_with:
            moves = ", ".join(f"`{m}`" for m in culprit.repaired_with)
            first = next((n.before for n in answer.repairs if n.after_run == repro.id), "")
            out.append(
                f"This command line is the repaired one: as first launched it "
                f"{first or 'failed on a resource'}, and with {moves} it shows the "
                "failure above. Without the repair the failure is hidden behind "
                "that one."
            )
            out.append("")
        if culprit:
            out.append(
                f"The failure needs {'all of ' if len(flags) > 1 else ''}{set_text}: "
                f"found by bisecting the {n_deltas} differences between a working and a "
                f"failing launch."
            )
        out.append("")
    else:
        out += ["No run reproduced the failure.", ""]

    good_run = next((r for r in real if r.variant == ()), None)
    if repro is not None and repro.answers:  # a wrong answer: the prompt and both answers
        out += answers_view.issue_lines(
            repro.answers,
            good_run.answers if good_run is not None else None,
            command_block(good_run.argv, good_run.env) if good_run is not None else None,
        )
    out += ["## What does not reproduce", "", "| launch | result |", "|---|---|"]
    for flag, rid in (culprit.cleared_by if culprit else {}).items():
        r = by_id.get(rid) if rid else None
        if r is not None:
            said = _describe(_relative(r, camp), r)
            if rate is not None and culprit is not None:
                said = _uncertain(said, culprit.cleared_count(flag), rate)
            out.append(f"| the failing launch without `{flag}` | {said} |")
    good = next((r for r in real if r.variant == ()), None)
    if good is not None:
        out.append(
            f"| the working launch (none of these flags) | "
            f"{_describe(_relative(good, camp), good)} |"
        )
    out.append("")

    out += ["## Error", ""]
    if camp.target:
        out += [f"Signature: `{camp.target}` (phase: error class: normalized message)", ""]
    if failed_first is not None and failed_first.describe:
        out += [f"First failure across the roles: {failed_first.describe}", ""]
    if analysis and analysis.excerpt:
        out += ["```text", *trim_traceback(analysis.excerpt), "```", ""]

    out += ["## Environment", ""]
    if env is not None:
        out += ["| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in env.rows()], ""]
    else:
        out += ["Not recorded.", ""]

    out += ["## Runs", ""]
    executed = [r for r in runs if not r.cached_from]
    counts: dict[str, int] = {}
    for r in real:
        v = _relative(r, camp).value
        counts[v] = counts.get(v, 0) + 1
    out.append(
        f"- {len(runs)} runs ({len(executed)} executed, {len(runs) - len(executed)} "
        "reused from earlier campaigns): "
        + ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    )
    if rate is not None:
        out.append(
            f"- the failure is flaky: the launches carrying {set_text or 'it'} failed in "
            f"{carried}, rate {rate:.2f}; a launch that passes is evidence, not proof"
        )
    if repro is not None:
        same = [r for r in real if r.variant == repro.variant]
        hits = sum(1 for r in same if _relative(r, camp) is Verdict.FAIL)
        rate = f"{hits} of {len(same)} starts"
        flaky = bool(answer.flaky) or hits < len(same)
        out.append(
            f"- the reproducing launch failed in {rate}"
            + (f" ({100 * hits / len(same):.0f}%: the failure is flaky)" if flaky else "")
        )
        bad = [r for r in real if r.variant == full]
        if bad and repro.variant != full:
            bhits = sum(1 for r in bad if _relative(r, camp) is Verdict.FAIL)
            out.append(f"- the original failing launch failed in {bhits} of {len(bad)} starts")
    for fl in answer.flaky:
        out.append(f"- flaky: {fl}")
    for note in answer.repairs[:3]:
        out.append(f"- repair: {note.sentence()}")
    if answer.findings:
        out.append(
            "- other failures met on the way: "
            + "; ".join(f"`{f.signature}`" for f in answer.findings[:3])
        )
    out += ["", "_Found with orchestrator (automated flag bisection on the real host)._"]

    text = _hide("\n".join(out), local_paths)
    lines = text.splitlines()
    if len(lines) > MAX_LINES:  # the traceback and tables are already bounded; be safe
        lines = lines[: MAX_LINES - 1] + ["_(trimmed)_"]
    return "\n".join(lines) + "\n"
