"""The files a launch names, during a campaign and across campaigns.

A file is part of the launch that names it: a variant whose own deltas name a file good
does not (a chat template, a draft model, a JSON config) is that variant, not a change of
the host; a file good and bad both name that reads otherwise between two runs is a host
change and stops the campaign as `changed`. A file named by a bare name in the launch's
working directory is in the cache key: a verdict is not reused after it was edited.

Fast tier: whole campaigns over the scripted host, the files read by the files section of
the real environment capture run by this machine's shell in the launch's directory. The
same on a real sshd: tests/test_named_files_watch_lab.py.
"""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.bisect import Bisection
from orchestrator.campaign.envwatch import EnvironmentChanged
from orchestrator.campaign.planning import make_plan
from orchestrator.config.experiment import Experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.execution.environment import (
    files_section,
    parse_file_digests,
    parse_files,
    public_env,
)
from orchestrator.execution.inputs import LaunchInputs, launch_inputs, named_files
from orchestrator.store.store import Store
from tests.support.scripted import (
    TARGET_ERROR,
    Faults,
    Oracle,
    Rule,
    ScriptedExecutor,
    host,
    write_pair,
)

#: --feature-2 fails as the target; the other deltas are harmless
ORACLE = Oracle([Rule(frozenset({2}), "cuda_graph", TARGET_ERROR)])


class FilesHost(ScriptedExecutor):
    """The scripted host, reading the files each launch names as the executor's capture
    does: the files section of the environment command, run by `sh` in the launch's
    working directory. `after_run` is called after each run (an operator's edit)."""

    after_run = staticmethod(lambda runs: None)

    def run(self, exp: Experiment, **kw: object):  # noqa: ANN201
        result = super().run(exp, **kw)  # type: ignore[arg-type]
        type(self).after_run(self.runs)
        return result

    def inputs(self, exp: Experiment) -> LaunchInputs:
        named = named_files(exp.argv(), public_env(exp))
        text = subprocess.run(
            ["sh", "-c", files_section(named)],
            cwd=exp.workdir or "/",
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return launch_inputs(
            self.host,
            unit="",
            environment="scripted",
            files=parse_files(text, named),
            named=parse_file_digests(text, named),
        )


def _pair(tmp: Path, good_flags: dict, bad_flags: dict, workdir: Path | None = None):  # noqa: ANN202
    good, bad = write_pair(tmp / "exp", 4)
    for path, extra in ((good, good_flags), (bad, bad_flags)):
        data = yaml.safe_load(path.read_text())
        data["service"].setdefault("flags", {}).update(extra)
        if workdir is not None and path == good:
            data["service"]["workdir"] = str(workdir)
        path.write_text(yaml.safe_dump(data))
    return make_plan(good, bad)


class RefusesMissing(FilesHost):
    """The server refuses its command line (`invalid`, as argparse does) when a file it
    names is not there, as a server given a deleted template or scenario does."""

    def run(self, exp: Experiment, **kw: object):  # noqa: ANN201
        where = Path(exp.workdir or "/")
        names = [w for w in exp.argv() if w.endswith((".jinja", ".json"))]
        missing = any(not (where / w).is_file() for w in names)
        result = super().run(exp, **kw)
        if missing:
            return replace(result, verdict=Verdict.INVALID, signature=None, detail="not found")
        return result


def _bisect(store: Store, plan, executor=FilesHost):  # noqa: ANN001, ANN202
    return Bisection(
        store,
        plan,
        [host("lab")],
        command="test",
        executor_factory=lambda h, s, c, li: executor(h, ORACLE, Faults()),
    ).run()


def test_a_file_only_bad_names_is_part_of_the_variant_not_a_host_change(
    tmp_path: Path,
) -> None:
    template = tmp_path / "raw.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    plan = _pair(tmp_path, {}, {"chat-template": str(template)})
    store = Store(tmp_path / "results")
    outcome = _bisect(store, plan)
    runs = store.runs(outcome.campaign_id)
    assert outcome.status == "found", (outcome.status, [(r.label, r.detail) for r in runs])
    assert not [r for r in runs if r.verdict is Verdict.INFRA]
    [culprit] = outcome.culprits
    assert culprit.flags == ["--feature-2"], culprit
    # the runs that named the template read it (it is part of their key), the others not
    for r in runs:
        assert r.inputs is not None and r.inputs.named is not None, r.label
        read = dict(r.inputs.named)
        assert (str(template) in read) == (str(template) in r.argv), (r.label, read)
        assert read.get(str(template), "x") != "-"
    store.close()


def test_a_file_both_name_edited_between_runs_stops_the_campaign(tmp_path: Path) -> None:
    shared = tmp_path / "override.json"
    shared.write_text('{"a": 1}')
    both = {"json-model-override-args": str(shared)}

    class Edited(FilesHost):
        after_run = staticmethod(lambda runs: shared.write_text('{"a": 2}') if runs == 2 else None)

    plan = _pair(tmp_path, both, both)
    store = Store(tmp_path / "results")
    with pytest.raises(EnvironmentChanged, match=f"the files the launch names changed: {shared}"):
        _bisect(store, plan, Edited)
    [camp] = store.campaigns()
    runs = store.runs(camp.id)
    assert camp.status == "changed" and len(runs) == 3, [(r.label, r.verdict) for r in runs]
    assert runs[-1].verdict is Verdict.INFRA and str(shared) in runs[-1].detail
    store.close()


def test_a_bare_name_in_the_workdir_is_read_and_an_edit_is_not_answered_from_the_cache(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "raw.jinja").write_text("{{ messages[0].content }}")
    plan = _pair(tmp_path, {}, {"chat-template": "raw.jinja"}, workdir=work)
    store = Store(tmp_path / "results")
    first = _bisect(store, plan)
    assert first.status == "found"
    runs = store.runs(first.campaign_id)
    naming = [r for r in runs if "raw.jinja" in " ".join(r.argv)]
    assert naming and all(r.inputs and dict(r.inputs.named or ()).get("raw.jinja") for r in naming)

    # unchanged: the next campaign reuses every start; edited: none that names the file
    again = _bisect(store, plan)
    assert again.runs_reused > 0
    assert {r.cached_from for r in store.runs(again.campaign_id)} != {None}
    (work / "raw.jinja").write_text("{{ messages[-1].content }}")
    edited = _bisect(store, plan)
    fresh = [r for r in store.runs(edited.campaign_id) if "raw.jinja" in " ".join(r.argv)]
    assert fresh and all(r.cached_from is None for r in fresh), [
        (r.label, r.cached_from) for r in fresh
    ]
    store.close()


def test_bare_names_come_after_paths_and_numbers_name_nothing() -> None:
    argv = [
        "python3",
        "-m",
        "s",
        "--chat-template",
        "t.jinja",
        "--model-path",
        "/models/m",
        "--mem-fraction-static",
        "0.85",
        "--host",
        "127.0.0.1",
        "--dtype=auto",
    ]
    assert named_files(argv) == ("/models/m", "t.jinja", "auto")  # not the module
    # a bare word that is no file there counts for nothing: the key is the one before
    text = "@@FILES\n- /models/m\nabcd t.jinja\n- auto\n"
    named = named_files(argv)
    assert parse_file_digests(text, named) == (
        ("/models/m", "-"),
        ("t.jinja", "abcd"),
        ("auto", "-"),
    )
    assert parse_files(text.replace("abcd t.jinja", "- t.jinja"), named) == parse_files(
        "@@FILES\n- /models/m\n", ("/models/m",)
    )


@pytest.mark.parametrize("where", ["bare", "absolute"])
def test_a_file_both_name_deleted_between_runs_stops_the_campaign(
    tmp_path: Path, where: str
) -> None:
    # the deleted file made bad's start `invalid` ("the bad config could not be judged",
    # exit 1), or with a bare name went unseen: a host change either way
    work = tmp_path / "work"
    work.mkdir()
    shared = work / "t.jinja"
    shared.write_text("{{ messages[0].content }}")
    word = "t.jinja" if where == "bare" else str(shared)
    both = {"chat-template": word}

    class Deleted(RefusesMissing):
        after_run = staticmethod(lambda runs: shared.unlink() if runs == 1 else None)

    good, bad = write_pair(tmp_path / "exp", 4)
    for path in (good, bad):
        data = yaml.safe_load(path.read_text())
        data["service"].setdefault("flags", {}).update(both)
        data["service"]["workdir"] = str(work)
        path.write_text(yaml.safe_dump(data))
    store = Store(tmp_path / "results")
    with pytest.raises(EnvironmentChanged, match=f"the files the launch names changed: {word}"):
        _bisect(store, make_plan(good, bad), Deleted)
    [camp] = store.campaigns()
    runs = store.runs(camp.id)
    assert camp.status == "changed", (camp.status, [(r.label, r.verdict) for r in runs])
    assert runs[-1].verdict is Verdict.INFRA and word in runs[-1].detail
    store.close()
