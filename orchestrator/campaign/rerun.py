"""What a recorded run was judged against, so that `rerun` judges the new run the same way:
the recorded probe bar (the recorded config's `pass_if`) and, for a bar relative to the good
config (`>= 0.95 * good`), the good metric of the run's own campaign: a bisection's good
endpoint, a sweep's reference run of the same repeat, or what an earlier rerun used."""

from __future__ import annotations

import re

from orchestrator.campaign.records import SweepSpec
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.store.store import CampaignRow, RunRow, Store


def recorded_reference(store: Store, run: RunRow, camp: CampaignRow) -> RunRow | None:
    """The run whose answers the recorded run's answers were judged against (the answers
    check, `answers:`): a bisection's good run, a sweep's reference, or what an earlier
    rerun used; None when the config has no such check or none is recorded. A rerun of
    the reference itself is judged against the reference's recorded answers: a start of
    good that answers otherwise than good did is no pass."""
    exp = run.experiment()
    if exp.answers is None or not exp.answers.enabled:
        return None
    ref_id = ((run.answers or {}).get("judged") or {}).get("reference_run")
    if ref_id is None and camp.kind in ("run", "rerun"):
        ref_id = camp.spec.get("answers_reference")
    if ref_id is not None:
        return store.run(str(ref_id))
    if _is_reference(run, camp) and (run.answers or {}).get("sets"):
        return run
    if camp.kind == "bisect" and run.variant != ():
        goods = [r for r in store.runs(camp.id) if r.variant == () and r.answers]
        earlier = [r for r in goods if r.seq <= run.seq] or goods
        return earlier[-1] if earlier else None
    return None


def _is_reference(run: RunRow, camp: CampaignRow) -> bool:
    """True when `run` is the run its campaign judged the others' answers by: a
    bisection's good endpoint, a sweep's reference config."""
    if camp.kind == "bisect":
        return run.variant == ()
    if camp.kind == "sweep":
        ref = SweepSpec.from_dict(camp.spec).reference
        return ref is not None and run.variant == (ref,)
    return False


def recorded_good(store: Store, run: RunRow, camp: CampaignRow) -> tuple[float, str] | None:
    """(good metric, the run that measured it) the recorded run was judged against, or None
    when its bar is not relative or no such measurement is recorded."""
    exp = run.experiment()
    cond = exp.probe.condition if exp.probe else None
    if cond is None or not cond.relative_to_good:
        return None
    if camp.kind in ("run", "rerun"):
        if camp.spec.get("good_metric") is not None:
            return float(camp.spec["good_metric"]), str(camp.spec.get("good_run") or "")
        return None
    runs = [
        r for r in store.runs(camp.id) if r.probe_metric is not None and r.verdict is Verdict.PASS
    ]
    if camp.kind == "bisect":
        goods = [r for r in runs if r.variant == ()]
        earlier = [r for r in goods if r.seq <= run.seq] or goods
        return (earlier[-1].probe_metric, earlier[-1].id) if earlier else None  # type: ignore[return-value]
    if camp.kind == "sweep":
        ref = SweepSpec.from_dict(camp.spec).reference
        if ref is None:
            return None
        refs = [r for r in runs if r.variant == (ref,)]
        same = [
            r for r in refs if r.purpose == run.purpose and re.fullmatch(r"sweep/\d+", r.purpose)
        ]
        pick = same or refs
        return (pick[-1].probe_metric, pick[-1].id) if pick else None  # type: ignore[return-value]
    return None
