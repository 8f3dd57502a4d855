"""The repair ladder at its edges, and what the answer says of bad's resource failure.

Pure: the ladder (`planner.repair.decide`), the arguments a server prints at start
(`server_logs.printed_args`, and the lab server printing the values it chose as SGLang
does), and the answer's words (`campaign.answer.resource_answer`). The same behaviours end
to end on the sshd lab: tests/test_answer_edges_sshd.py.
"""

from __future__ import annotations

from orchestrator.campaign.answer import resource_answer
from orchestrator.campaign.records import Culprit, Outcome, RepairNote, Status
from orchestrator.config.repair import policy
from orchestrator.diagnosis.logtail import keep_what_matters
from orchestrator.diagnosis.server_logs import printed_args
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.lab import scenario, sglang_text
from orchestrator.planner.repair import Next, Rung, Settled, decide
from tests.test_repair import first, sglang, then

OOM_KV = Signature(Phase.KV_CACHE, "cuda_oom", "CUDA out of memory.")
OOM_GRAPH = Signature(Phase.CUDA_GRAPH, "cuda_oom", "CUDA out of memory. @ capture")
SGL_ARGS = (
    "server_args=ServerArgs(model_path='/m', port=30000, mem_fraction_static=0.88, tp_size=8)"
)


def test_the_lab_server_prints_the_values_it_chose_as_sglang_does() -> None:
    scen = scenario.load("rtx6000-repair")  # defaults: mem-fraction-static 0.88
    n = sglang_text.numbers(scen.model, {"tp-size": 8}, scen.defaults, 8)
    line = sglang_text.phase_begin("init", n, scen.model, {"tp-size": 8}, "h", 1, 2)[0][1]
    got = printed_args(line)
    assert got["mem-fraction-static"] == "0.88" and got["tp-size"] == "8"
    # a flag on the command line is printed as given
    n = sglang_text.numbers(scen.model, {"mem-fraction-static": 0.8}, scen.defaults, 8)
    line = sglang_text.phase_begin("init", n, scen.model, {"mem-fraction-static": 0.8}, "h", 1, 2)
    assert printed_args(line[0][1])["mem-fraction-static"] == "0.8"


def test_printed_args_read_sglang_and_vllm_lines() -> None:
    log = f"[2026-01-01 10:00:00] {SGL_ARGS}\nother line\n"
    assert printed_args(log)["mem-fraction-static"] == "0.88"
    vllm = "INFO 05-07 02:14:18 [utils.py:1] non-default args: {'gpu_memory_utilization': 0.5}"
    assert printed_args(vllm) == {"gpu-memory-utilization": "0.5"}
    assert printed_args("no arguments here\n") == {}


def test_an_unset_knob_moves_from_the_value_the_server_printed() -> None:
    v = sglang()  # no --mem-fraction-static: the server chooses it
    rung = Rung("c.1", None, Verdict.OTHER, OOM_KV, printed=printed_args(SGL_ARGS))
    step = decide([rung], policy([]), variant=v, deltas=[])
    assert isinstance(step, Next) and step.move.knob == "mem-fraction-static"
    assert (step.before, step.value, step.assumed) == (0.88, 0.92, "chosen by the server")
    applied = step.applied(str(OOM_KV), "c.1", 1)
    assert applied.describe() == "--mem-fraction-static 0.88 (chosen by the server) -> 0.92"
    # the server printed nothing: the answer says why no move ran and what to set
    got = decide([first(OOM_KV)], policy([]), variant=v, deltas=[])
    assert isinstance(got, Settled) and got.state == "unrepaired"
    assert "set --mem-fraction-static in both configs" in got.why


def test_no_working_window_leaves_the_start_as_written_to_speak() -> None:
    pol = policy([])
    v = sglang(**{"mem-fraction-static": 0.85, "cuda-graph-max-bs": 256})
    rungs = [first(OOM_KV)]
    step = decide(rungs, pol, variant=v, deltas=[])
    assert isinstance(step, Next) and step.value == 0.89
    rungs.append(then(step, "c.2", OOM_GRAPH, "c.1", 1))
    step = decide(rungs, pol, variant=v, deltas=[])
    assert isinstance(step, Next) and step.move.knob == "cuda-graph-max-bs"
    rungs.append(then(step, "c.3", OOM_GRAPH, "c.2", 2))
    got = decide(rungs, pol, variant=v, deltas=[])
    assert isinstance(got, Settled) and (got.final, got.last, got.state) == (0, 2, "unrepaired")
    assert got.why.startswith("no working window for --mem-fraction-static: at 0.85")
    assert "at 0.89 wanting less" in got.why
    # once bad's failure as written is the target, the ladder stays as it ended
    again = decide(rungs, pol, variant=v, deltas=[], target=OOM_KV)
    assert isinstance(again, Settled) and (again.final, again.last) == (0, 2)


def test_a_start_as_written_that_shows_the_target_speaks_though_a_repair_passed() -> None:
    pol = policy([])
    v = sglang(**{"mem-fraction-static": 0.85})
    rungs = [first(OOM_KV, Verdict.FAIL)]
    step = decide(rungs, pol, variant=v, deltas=[])
    assert isinstance(step, Next)
    rungs.append(then(step, "c.2", None, "c.1", 1, Verdict.PASS))
    assert decide(rungs, pol, variant=v, deltas=[]) == Settled(1, "repaired")
    got = decide(rungs, pol, variant=v, deltas=[], target=OOM_KV)
    assert got == Settled(0, "repaired", "", 1)


def _note(state: str, after: str, after_run: str, **kw: object) -> RepairNote:
    return RepairNote(
        variant="bad",
        deltas=[0, 1],
        state=state,
        moves=["--mem-fraction-static 0.85 -> 0.89"],
        before_run="c.2",
        before=f"failed on a resource ({OOM_KV})",
        after_run=after_run,
        after=after,
        **kw,  # type: ignore[arg-type]
    )


def _found(note: RepairNote) -> Outcome:
    cul = Culprit(["+ --x"], ["--x"], [0], False, "c.5", {}, confirmed=True)
    return Outcome("c", Status.FOUND, target=OOM_KV, culprits=[cul], repairs=[note])


def test_the_answer_says_what_the_repair_made_of_bad_s_resource_failure() -> None:
    avoided = _found(_note("repaired", "passed", "c.3", needs=["--mem-fraction-static >= 0.89"]))
    resource_answer(avoided, 2)
    assert avoided.status is Status.FOUND
    assert avoided.culprits[0].needs == ["--mem-fraction-static >= 0.89"]
    assert "the repair avoids" in avoided.resource and "[run c.3]" in avoided.resource
    why = "no working window for --mem-fraction-static: at 0.85 it failed wanting more (...)"
    window = _found(_note("unrepaired", f"ended other ({OOM_GRAPH})", "c.4", why=why))
    resource_answer(window, 2)
    assert window.status is Status.INCOMPLETE and window.message == window.resource
    assert window.resource.startswith("no working window") and "run c.4" in window.resource
    assert "run c.2" in window.resource
    steps = _found(_note("unrepaired", f"ended other ({OOM_KV})", "c.4", why="still cuda_oom"))
    resource_answer(steps, 2)
    assert steps.resource.startswith("no working window found") and "[run c.2]" in steps.resource
    unset = _found(_note("unrepaired", "", "c.2", why="set --mem-fraction-static"))
    resource_answer(unset, 2)
    assert unset.status is Status.FOUND and "could not address" in unset.resource
    assert "set --mem-fraction-static" in unset.resource
    # a repair that revealed the target behind the resource failure needs no words
    seen = _found(_note("repaired", f"failed with the target ({OOM_GRAPH})", "c.3"))
    seen.target = OOM_GRAPH
    resource_answer(seen, 2)
    assert seen.resource == "" and seen.status is Status.FOUND


def test_the_stored_log_keeps_the_server_s_arguments_above_a_long_tail() -> None:
    """A real start prints its arguments first and hundreds of lines after: the stored
    form of its log keeps that line, so a repair can read what the server chose."""
    log = f"[2026-01-01 10:00:00] {SGL_ARGS}\n" + "".join(f"[TP0] line {i}\n" for i in range(900))
    kept = keep_what_matters(log, 400)
    assert len(kept.splitlines()) < 410
    assert printed_args(kept)["mem-fraction-static"] == "0.88"
