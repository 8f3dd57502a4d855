"""The classifier on real logs: the corpus figures through the benchmark's own functions,
labels.tsv checking, and inputs that are not server logs at all.

It proves the classifier as a whole: on the labelled corpus of tests/data/real_logs/ (and
tests/data/thread_logs/) it meets its precision, recall and phase targets and keeps
look-alike bugs apart; and a log as reports and journals really hold it (empty, binary,
megabytes of warnings, two workers interleaved, lost line breaks, a message quoted,
wrapped, re-raised or cut short, a log cut anywhere, any text at all) still gets the
signature its whole, plain form gets, or a note instead of an exception.

The other two classifier test files: test_classify.py checks each rule and `judge` on one
hand-picked log at a time; test_real_logs.py reads what this project's own real vLLM
printed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.diagnosis.classify.analyze import analyze_log
from orchestrator.diagnosis.classify.judge import RunEvidence, judge
from orchestrator.diagnosis.scoring import (
    TARGETS,
    Label,
    Outcome,
    classify,
    half_of,
    load,
    read_labels,
    score,
    score_halves,
)
from orchestrator.diagnosis.verdicts import Phase, Signature
from orchestrator.errors import UsageError

CORPUS = Path(__file__).parent / "data" / "real_logs"


def signature_of(text: str) -> Signature:
    """The signature of a log that must have one: two logs that both get none must not pass
    as having the same (or different) signatures."""
    sig = analyze_log(text).signature
    assert sig is not None, f"no signature for {text[:120]!r}"
    return sig


@pytest.fixture(scope="module")
def scores() -> dict:
    return score_halves(classify(load(CORPUS)))


def test_corpus_size_and_labels() -> None:
    labels = read_labels(CORPUS)
    causes = {lab.root_cause for lab in labels}
    assert len(labels) >= 100 and len(causes) >= 45
    per_cause = {c: sum(lab.root_cause == c for lab in labels) for c in causes}
    assert min(per_cause.values()) >= 2  # every bug at least twice, as reruns
    assert all(lab.source.startswith("https://github.com/") for lab in labels)
    assert {lab.klass for lab in labels} == {"crash", "hang", "timeout"}
    assert {half_of(c) for c in causes} == {"tune", "heldout"}


@pytest.mark.parametrize("half", ["heldout", "whole"])
def test_corpus_meets_the_targets(scores: dict, half: str) -> None:
    s = scores[half]
    assert s.precision >= TARGETS["precision"], s.collisions
    assert s.recall >= TARGETS["recall"], s.splits
    assert len(s.unclassified) <= TARGETS["unclassified"], s.unclassified
    assert s.phase_accuracy >= TARGETS["phase_accuracy"], s.wrong_phase
    assert s.meets_targets()


def test_look_alikes_stay_apart(scores: dict) -> None:
    """Same message, different bug: the place in the server's own code tells them apart."""
    out = {o.label.file: o.signature for o in classify(load(CORPUS))}
    ima = [f for f in out if ".a." in f and "ima" in f]
    assert len(ima) >= 8 and all(out[f] is not None for f in ima)
    assert len({out[f] for f in ima}) == len(ima)  # eight illegal memory accesses, eight bugs
    nccl = out["sgl_nccl_init_system_error.a.log"], out["vllm_nccl_system_error_mp.a.log"]
    assert None not in nccl and nccl[0] != nccl[1]
    v1, v0 = "vllm_no_cache_blocks_v1_check.a.log", "vllm_no_cache_blocks_v0_raise_if.a.log"
    assert out[v1] is not None and out[v0] is not None and out[v1] != out[v0]
    # the root, not the wrapper: EngineDeadError / "Worker failed" / engine init failed
    assert "Worker failed" not in (out["vllm_sampler_warmup_oom.a.log"] or "")
    assert (out["vllm_ima_fused_moe_triton.a.log"] or "").startswith(
        "serving|illegal_address|triton an illegal memory access"
    )


def test_hangs_name_the_stuck_place() -> None:
    a = analyze_log((CORPUS / "sgl_watchdog_hang_overlap_resolve.a.log").read_text())
    assert (a.kind, a.error_class) == ("hang", "hang")
    assert a.site == "tp_worker_overlap_thread.py:resolve_batch_result"
    b = analyze_log((CORPUS / "sgl_watchdog_hang_no_pyspy.a.log").read_text())
    assert a.signature is not None and b.signature is not None
    assert b.kind == "hang" and b.site is None and b.signature != a.signature


def test_score_counts_pairs() -> None:
    def out(name: str, key: str, sig: str | None, phase: str = "init") -> Outcome:
        return Outcome(Label(name, "crash", phase, key, ""), sig, "init")

    x = "init|ValueError|x"
    s = score(
        [out("a", "k1", x), out("b", "k1", x), out("c", "k2", x), out("d", "k2", None, "serving")]
    )
    assert (s.pairs_same_signature, s.pairs_same_cause, s.true_pairs) == (3, 2, 1)
    assert s.precision == pytest.approx(1 / 3) and s.recall == pytest.approx(1 / 2)
    assert s.unclassified == ["d"] and s.phase_right == 3 and s.phase_counted == 4
    assert [c[:2] for c in s.collisions] == [("a", "c"), ("b", "c")]
    # pairs are compared as a campaign compares signatures: an exception's type is not
    # compared when its message names the failure; a rule's class and the phase are
    s = score(
        [
            out("a", "k1", "init|RuntimeError|the server socket has failed"),
            out("b", "k1", "init|DistNetworkError|the server socket has failed"),
            out("c", "k1", "init|untyped|the server socket has failed"),
            out("d", "k2", "init|cuda_oom|the server socket has failed"),
            out("e", "k2", "serving|RuntimeError|the server socket has failed"),
        ]
    )
    assert (s.pairs_same_signature, s.true_pairs) == (3, 3)


def test_an_exceptions_type_is_shown_but_compared_only_where_the_message_needs_it() -> None:
    old = Signature(Phase.INIT, "RuntimeError", "The server socket has failed to listen")
    new = Signature(Phase.INIT, "DistNetworkError", "The server socket has failed to listen")
    assert old == new and hash(old) == hash(new) and {old: 1}[new] == 1
    assert str(old) != str(new) and old.key() != new.key()  # each shown as it was raised
    assert old == Signature(Phase.INIT, "untyped", old.message)  # a title quoting it
    assert old != Signature(Phase.LOAD_WEIGHTS, "RuntimeError", old.message)
    assert old != Signature(Phase.INIT, "nccl", old.message)  # a rule's class is compared
    # a type whose message is empty or only a place is all there is to compare
    bare = Signature(Phase.INIT, "AssertionError", "@ vllm/worker.py:load_model")
    assert bare != Signature(Phase.INIT, "IndexError", "@ vllm/worker.py:load_model")
    assert Signature(Phase.INIT, "KeyError", "") != Signature(Phase.INIT, "IndexError", "")
    # and so is the type of a message too short to name anything alone
    assert Signature(Phase.INIT, "KeyError", "'weight' @ vllm/llama.py:load_weights") != Signature(
        Phase.INIT, "IndexError", "'weight' @ vllm/llama.py:load_weights"
    )


def test_a_hang_that_just_stops_is_judged_as_a_run_would_be() -> None:
    from orchestrator.diagnosis.scoring import Case

    stops = (
        "[2025-05-01 10:00:00 TP0] Capture cuda graph begin. This can take up to several "
        "minutes. avail mem=12.00 GB\n"
    )
    label = Label("x.log", "hang", "cuda_graph", "k", "")
    [out] = classify([Case(label, stops)])
    assert out.signature == (
        "cuda_graph|hang|no readiness before the deadline after 'Capture cuda graph begin'"
    )
    assert out.phase == "cuda_graph"
    crash = Label("y.log", "crash", "cuda_graph", "k", "")
    assert classify([Case(crash, stops)])[0].signature is None  # a crash needs its log
    # a hang that a watchdog (or the deadline's stop) ended with a kill is the same hang;
    # a kill with no deadline passed stays the kill
    killed = stops + "  0%|          | 0/23 [00:00<?, ?it/s]\nKilled\n"
    [out_killed] = classify([Case(label, killed)])
    assert out_killed.signature == out.signature
    assert judge(RunEvidence(log_tail=killed, timed_out=True), None)[1] == Signature.from_key(
        out.signature
    )
    assert str(judge(RunEvidence(log_tail=killed), None)[1]) == "cuda_graph: signal: Killed"


def test_labels_tsv_is_checked(tmp_path: Path) -> None:
    (tmp_path / "x.log").write_text("boom\n")
    (tmp_path / "labels.tsv").write_text("file\tclass\tphase\troot_cause_key\n")
    with pytest.raises(UsageError, match="header must be"):
        read_labels(tmp_path)
    (tmp_path / "labels.tsv").write_text(
        "file\tclass\tphase\troot_cause_key\tsource\nx.log\tcrash\tlater\tk\thttps://x\n"
    )
    with pytest.raises(UsageError, match="phase 'later' is not one of"):
        read_labels(tmp_path)
    (tmp_path / "labels.tsv").write_text(
        "file\tclass\tphase\troot_cause_key\tsource\ny.log\tcrash\tinit\tk\thttps://x\n"
    )
    with pytest.raises(UsageError, match="no log file 'y.log'"):
        read_labels(tmp_path)


# --- inputs that are not server logs ---------------------------------------------------


def test_empty_and_blank_logs() -> None:
    for text in ("", "\n\n   \n"):
        a = analyze_log(text)
        assert a.signature is None and a.note == "empty log: nothing to classify"


def test_binary_input() -> None:
    a = analyze_log(os.urandom(200_000).decode("utf-8", errors="replace"))
    assert a.signature is None and a.note and a.note.startswith("binary data")
    assert analyze_log("\x00\x01ELF\x02" * 100).note.startswith("binary data")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "bash: line 1: /opt/sglang/bin/python: No such file or directory\n",
            "<path>/python: No such file or directory",
        ),
        ("-bash: vllm: command not found\n", "vllm: command not found"),
        ("/usr/bin/python3: No module named sglang\n", "<path>/python3: No module named sglang"),
    ],
)
def test_shell_errors_get_a_signature(text: str, message: str) -> None:
    a = analyze_log(text)
    assert a.signature is not None and a.error_class == "shell" and a.message == message


def test_megabytes_of_warnings_are_no_failure() -> None:
    warning = (
        "/usr/local/lib/python3.12/dist-packages/torch/cuda/__init__.py:61: "
        "FutureWarning: The pynvml package is deprecated.\n"
    )
    a = analyze_log(warning * (5_000_000 // len(warning)))
    assert a.signature is None and a.note and "is this a server log?" in a.note


def test_a_failure_after_megabytes_of_warnings_is_found() -> None:
    warning = "[2025-01-01 00:00:00 TP0] WARNING: something harmless, Error: retried\n"
    crash = (CORPUS / "sgl_ima_decode_sync.a.log").read_text()
    alone = signature_of(crash)
    assert analyze_log(warning * 60_000 + crash).signature == alone  # crash in the tail
    # a crash in the middle of a huge log (then more warnings) is still found
    assert analyze_log(crash + warning * 60_000).signature == alone


def test_cli_prints_a_note_for_a_non_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    path = tmp_path / "core"
    path.write_bytes(os.urandom(4096))
    assert main(["classify", str(path)]) == 0
    assert "binary data, not a text log" in capsys.readouterr().out
    (tmp_path / "empty.log").write_text("")
    assert main(["classify", str(tmp_path / "empty.log"), "--json"]) == 0
    out = capsys.readouterr().out
    assert '"note": "empty log: nothing to classify"' in out and '"signature": null' in out


@pytest.mark.parametrize("colour", ["\x1b[1;36m{}\x1b[0;0m", "#033[1;36m{}#033[0;0m"])
def test_coloured_process_tags_read_like_plain_ones(colour: str) -> None:
    import re

    text = (CORPUS / "vllm_keyerror_w13_bias_gptoss.a.log").read_text()
    coloured = re.sub(r"^(\([^)]*pid=\d+\))", lambda m: colour.format(m.group(1)), text, flags=re.M)
    assert coloured != text
    assert analyze_log(coloured).signature == analyze_log(text).signature is not None


def test_a_wrapper_alone_is_still_a_failure() -> None:
    """The cause never printed (the engine was killed): the wrapper is all there is."""
    from orchestrator.diagnosis.classify.judge import RunEvidence, judge
    from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict

    engine = (
        "(APIServer pid=1) INFO 01-01 00:00:00 [api_server.py:1] vLLM API server "
        "version 0.10\n(EngineCore_DP0 pid=5) INFO 01-01 00:00:01 "
        "[gpu_model_runner.py:1] Starting to load model m...\n(APIServer pid=1) "
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}\n"
    )
    a = analyze_log(engine)
    assert a.phase == Phase.LOAD_WEIGHTS and a.error_class == "RuntimeError"
    child = (
        "[2025-01-01 00:00:00 TP0] Load weight begin. avail mem=70.00 GB\n"
        "[2025-01-01 00:01:00] Received sigquit from a child process. It usually means "
        "the child failed.\n"
    )
    assert analyze_log(child).error_class == "child_died"
    # with the process's exit known, the run is named by how it ended
    exited = RunEvidence(log_tail=child, exit_code=1, unit_result="exit-code")
    assert judge(exited, None)[1] == Signature(Phase.LOAD_WEIGHTS, "exit", "exit status 1")
    # and a kill from outside, seen only as the parent's note, is infra (not the config)
    killed = RunEvidence(log_tail=child, exit_signal="KILL", unit_result="signal")
    assert judge(killed, None) == (Verdict.INFRA, None)


def test_two_workers_interleaved_line_by_line() -> None:
    """Two vLLM workers failing at once print their tracebacks into each other."""
    text = (CORPUS / "vllm_sampler_warmup_oom.a.log").read_text()
    lines = text.splitlines()
    tag = "(VllmWorker rank=1 pid=2445156)"
    block = [i for i, ln in enumerate(lines) if ln.startswith(tag)]
    # rank 0 fails a moment later, somewhere else (its frames name other functions)
    other = [
        ln.replace(tag, "(VllmWorker rank=0 pid=2445155)").replace(", in ", ", in other_")
        for ln in (lines[i] for i in block)
    ]
    mixed: list[str] = []
    for i, line in enumerate(lines):
        if i in block:
            mixed.append(other.pop(0))  # the two workers' lines alternate
        mixed.append(line)
    assert analyze_log("\n".join(mixed)).signature == analyze_log(text).signature is not None


def test_a_paste_that_lost_its_line_breaks_reads_like_the_log() -> None:
    """A report copied as one paragraph runs the logger's records together on one line:
    it is cut before each record start and gets the signature of the log it came from,
    while a worker tag in front of a record is not cut off it."""
    text = (THREADS / "vllm_pynccl_unhandled_cuda_error.a.log").read_text()
    lines = [ln for ln in text.splitlines() if not ln.startswith("# source:")]
    records = [ln.split(") ", 1)[1] for ln in lines]  # without the worker tag
    joined = " ".join(records) + " 0a1b2c:213:213 [1] NCCL INFO cudaDriverVersion 12080\n"
    assert "\n" not in joined.rstrip("\n") and len(joined) > 500
    whole = analyze_log(text).signature
    assert whole is not None and analyze_log(joined).signature == whole
    # a tag glued to its record is one record, not a cut point
    from orchestrator.diagnosis.classify.lines import _source_lines

    assert _source_lines(lines[1] + " " * 200) == [lines[1] + " " * 200]


def test_pydantic_detail_quoted_without_its_header() -> None:
    """A report that quotes only pydantic's `Value error, ...` line names the same error as
    the whole `N validation error for X` block."""
    detail = (
        "  Value error, Total number of attention heads (64) must be divisible by tensor "
        "parallel size (3). [type=value_error, input_value=ArgsKwargs((), {}), "
        "input_type=ArgsKwargs]"
    )
    whole = analyze_log(
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for "
        f"ParallelConfig\n{detail}\n"
    )
    alone = analyze_log(detail.strip() + "\n")
    assert whole.signature is not None and alone.signature is not None
    assert (
        (alone.error_class, alone.message)
        == (whole.error_class, whole.message)
        == (
            "ValueError",
            "Total number of attention heads must be divisible by tensor parallel size",
        )
    )


def test_a_message_cut_short_keeps_its_name() -> None:
    """A report that cut the exception line mid-word names the failure like the whole line:
    the signature keeps the head of the message."""
    full = (
        "ValueError: TP rank 1 could finish the model loading, but there are other ranks "
        "that didn't finish loading. It is likely due to unexpected failures.\n"
    )
    cut = "ValueError: TP rank 3 could finish the model loading, but there are other ranks th\n"
    a, b = analyze_log(full).signature, analyze_log(cut).signature
    assert a is not None and a == b
    # a short message is kept whole
    short = analyze_log("ValueError: No such tokenizer mode slow2\n")
    assert short.message == "No such tokenizer mode slow2"


def test_a_reraise_with_context_in_front_is_named_by_the_error_it_quotes() -> None:
    """vLLM re-raises a model error as "Error in model execution (input dumped to ...):
    <the error>": the quoted error names the failure, as a sentence quoting it does."""
    rewrapped = (
        "RuntimeError: Error in model execution (input dumped to /tmp/err_x_1.pkl): "
        "FlashAttention only supports Ampere GPUs or newer.\n"
    )
    plain = "RuntimeError: FlashAttention only supports Ampere GPUs or newer.\n"
    prose = (
        "When running it, I still encounter the error: \u201cRuntimeError: FlashAttention "
        "only supports Ampere GPUs or newer. \u201d\n"
    )
    sigs = [analyze_log(t).signature for t in (rewrapped, plain, prose)]
    assert sigs[0] is not None and sigs[0] == sigs[1] == sigs[2]
    assert sigs[0].message == "FlashAttention only supports Ampere GPUs or newer"


def test_an_exception_a_sentence_runs_into_is_read_when_nothing_else_is() -> None:
    """A report whose only error is at the end of a sentence names that error; a log with
    an error line of its own is not read for such mentions."""
    prose = (
        "Qwen SFT then deploying with vllm fails ValueError: Tokenizer class "
        "TokenizersBackend does not exist or is not currently imported.\n"
    )
    line = (
        "ValueError: Tokenizer class TokenizersBackend does not exist or is not currently "
        "imported.\n"
    )
    a, b = analyze_log(prose).signature, analyze_log(line).signature
    assert a is not None and a == b
    both = "retrying after a ConnectionError: reset by peer\n" + line
    assert analyze_log(both).signature == b


def test_an_error_raised_for_a_client_of_the_running_engine_is_a_serving_failure() -> None:
    """vLLM's engine core handles client RPCs (add_lora) and loads LoRA adapters once it
    is up: an error raised there is a failure while serving, not at startup."""
    from orchestrator.diagnosis.verdicts import Phase

    for name in ("vllm_lora_unsupported_weight.a.log", "vllm_lora_unsupported_weight.b.log"):
        assert analyze_log((THREADS / name).read_text()).phase == Phase.SERVING, name


def test_a_request_the_server_rejects_is_a_serving_failure() -> None:
    from orchestrator.diagnosis.verdicts import Phase

    line = (
        "ValueError: This model's maximum context length is 512 tokens. However, you "
        "requested 1451 tokens in the input for embedding generation.\n"
    )
    assert analyze_log(line).phase == Phase.SERVING


def test_a_message_that_starts_on_the_next_line_is_read_there() -> None:
    """Python prints "ImportError: " and then, on the next line, a message that starts with
    a newline: that line names the error, not an empty message."""
    text = (
        "ImportError: \n[sgl_kernel] CRITICAL: Could not load any common_ops library!\n"
        "Attempted locations:\n"
    )
    a = analyze_log(text)
    assert a.error_class == "ImportError"
    assert a.message == "[sgl_kernel] CRITICAL: Could not load any common_ops library!"


def test_a_message_is_named_by_its_words_not_its_values() -> None:
    """Versions add a device name or reword a parenthesized value, markdown drops
    backticks, a check prints the value it got: one error keeps one name, and errors that
    differ in their words stay apart."""
    old = (
        "ValueError: Free memory on device (31.44/47.38 GiB) on startup is less than "
        "desired GPU memory utilization (0.95, 45.01 GiB). Decrease GPU memory utilization."
    )
    new = (
        "ValueError: Free memory on device cuda:0 (1.54/22.05 GiB) on startup is less than "
        "desired GPU memory utilization (0.9, 19.84 GiB). Decrease GPU memory"
    )
    assert signature_of(old + "\n") == signature_of(new + "\n")
    ticks = (
        "ValueError: `rope_scaling` must be a dictionary with two fields, `type` and "
        "`factor`, got {'factor': 8.0, 'rope_type': 'llama3'}\n"
    )
    plain = "ValueError: rope_scaling must be a dictionary with two fields, type and factor\n"
    assert signature_of(ticks) == signature_of(plain)
    a = analyze_log(
        "ValueError: User-specified max_model_len (4096) is greater than the "
        "derived max_model_len (None=2048 in model's config.json). This may\n"
    )
    b = analyze_log(
        "ValueError: User-specified max_model_len (513) is greater than the "
        "derived max_model_len (max_position_embeddings=512 or model_max_length="
        "None in model's config.json). This may lead to\n"
    )
    assert a.signature is not None and a.signature == b.signature
    assert a.message == "User-specified max_model_len is greater than the derived max_model_len"
    # a short quoted name is a word, not a value
    assert signature_of("ModuleNotFoundError: No module named 'flash_attn'\n") != signature_of(
        "ModuleNotFoundError: No module named 'vllm._C'\n"
    )
    # a message that is all values keeps them
    assert analyze_log("ValueError: bad size (3)\n").message == "bad size (<n>)"


def test_a_clause_a_wrapper_or_a_checkpoint_adds_is_not_the_name() -> None:
    """A title adds when it happened ("... when importing vLLM"), a wrapper says what it
    was doing before the error it caught ("Failed to derive max model length: ..."), an
    adapter names its own weights: one error keeps one name. A clause that would leave too
    few words, and a quoted key a KeyError names, stay."""
    assert signature_of("RuntimeError: operator torchvision::nms does not exist\n") == signature_of(
        "operator torchvision::nms does not exist when importing vLLM\n"
    )
    assert signature_of("AssertionError: Torch not compiled with CUDA enabled\n") == signature_of(
        "AssertionError: Torch not compiled with CUDA enabled when specified --device tpu\n"
    )
    short = analyze_log("RuntimeError: Error when loading the model\n")
    assert short.message == "Error when loading the model"
    wrapped = analyze_log(
        "2025-04-17T08:59:26+00:00 - a.worker - ERROR - Failed to derive max "
        "model length: Unrecognized model in /tmp/m. Should have a "
        "`model_type` key in its config.json\n"
    )
    direct = analyze_log(
        "ValueError: Unrecognized model in /app/m. Should have a `model_type` "
        "key in its config.json\n"
    )
    assert wrapped.signature is not None and wrapped.signature == direct.signature
    assert analyze_log("RuntimeError: Failed to load model: out of luck\n").message == (
        "Failed to load model: out of luck"
    )  # too few words to name the cause alone
    lora = analyze_log("ValueError: base_model.model.lm_head.weight is unsupported LoRA weight\n")
    other = analyze_log(
        "ValueError: base_model.model.lm_head.base_layer.weight is unsupported LoRA weight\n"
    )
    assert lora.signature is not None and lora.signature == other.signature
    assert lora.message == "is unsupported LoRA weight"
    # a quoted key is a word
    assert signature_of("KeyError: 'layers.0.mlp.gate.g_idx'\n") != signature_of(
        "KeyError: 'layers.0.mlp.down_proj.weight_scale'\n"
    )


def _tb(*frames: tuple[str, str], exc: str) -> str:
    out = ["Traceback (most recent call last):"]
    for path, func in frames:
        out += [
            f'  File "/usr/lib/python3/dist-packages/{path}", line 10, in {func}',
            "    x = y()",
        ]
    return "\n".join([*out, exc]) + "\n"


def test_a_compile_assertion_keeps_its_name_wherever_it_is_raised_or_re_raised() -> None:
    """A JIT compiler's host-side assertion names its file and condition: the module that
    started the compile, or re-raised it, is not part of its name."""
    exc = (
        "RuntimeError: Assertion error (csrc/apis/../jit/compiler.hpp:38): "
        "not library_root_path.empty()"
    )
    one = _tb(
        ("sglang/srt/model_executor/model_runner.py", "load_model"),
        ("sglang/srt/layers/quantization/fp8_utils.py", "_transform_scale"),
        exc=exc,
    )
    other = _tb(
        ("sglang/srt/model_executor/model_runner.py", "load_model"),
        ("sglang/srt/layers/deep_gemm_wrapper/compile_utils.py", "update_config"),
        exc=exc,
    )
    a, b = analyze_log(one), analyze_log(other)
    assert a.signature is not None and a.signature == b.signature
    assert a.error_class == "assertion"
    assert a.message == "Assertion error (compiler.hpp:<n>): not library_root_path.empty()"


def test_nccl_names_its_cause_by_the_warn_line_or_the_last_error_it_repeats() -> None:
    """NCCL's summary (`internal error`, `unhandled system error`) says little; the cause
    is its `NCCL WARN` line, which newer NCCL repeats after `Last error:`: a report that
    kept either names one failure."""
    warn = (
        "host:1:1 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend "
        "/dev/shm/nccl-abc to 9637892 bytes\n"
    )
    summary = (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
        "c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with "
        "NCCL_DEBUG=INFO for details), NCCL version 2.20.5\nncclSystemError: System "
        "call (e.g. socket, malloc) or external library call failed or device error.\n"
        "Last error:\nError: failed to extend /dev/shm/nccl-abc to 9637892 bytes"
    )
    stack = ("vllm/distributed/parallel_state.py", "all_reduce")
    kept_warn = analyze_log(warn + _tb(stack, exc=summary))
    kept_summary = analyze_log(_tb(stack, exc=summary))
    assert kept_warn.signature is not None and kept_warn.signature == kept_summary.signature
    assert kept_summary.message is not None
    assert kept_summary.message.startswith("NCCL WARN Error: failed to extend <path>/nccl-abc")


def test_a_clients_exception_is_named_by_the_servers_error_answer_it_carries() -> None:
    """The OpenAI client raises `BadRequestError: Error code: 400 - {..., 'message': ...}`
    around the server's answer: the answer's message names the failure, as the server's
    own error line and a sentence quoting the answer do."""
    client = analyze_log(
        "openai.BadRequestError: Error code: 400 - {'object': 'error', 'message': \"This "
        "model's maximum context length is 4096 tokens. However, you requested 5000 tokens."
        "\", 'type': 'BadRequestError', 'param': None, 'code': 400}\n"
    )
    server = analyze_log(
        "ValueError: This model's maximum context length is 2048 tokens. "
        "However, you requested 3000 tokens.\n"
    )
    assert client.signature is not None and client.signature == server.signature
    assert client.message == "This model's maximum context length is <n> tokens"
    # an answer without a message long enough to name anything stays the client's words
    short = analyze_log("openai.NotFoundError: Error code: 404 - {'detail': 'Not Found'}\n")
    assert short.message == "Error code: <n> -"


def test_a_message_quoted_without_its_type_is_named_by_its_words() -> None:
    """An issue title or a sentence quotes the message without its exception type: it is
    still a failure (class `untyped`), and two such quotes of one error read alike; an
    error answer a client printed is named by its `message`. A server log that only went
    silent is not read this way (it is a hang)."""
    from orchestrator.diagnosis.verdicts import Phase

    a = analyze_log(
        "Quantization method specified in the model config (fp8) does not match "
        "the quantization method specified in the `quantization` argument (gguf).\n"
    )
    b = analyze_log(
        "Quantization method specified in the model config (modelopt_fp4) does "
        "not match the quantization method specified in the `quantization` "
        "argument (modelopt).\n"
    )
    assert a.signature is not None and a.signature == b.signature
    assert a.error_class == "untyped"
    said = analyze_log(
        'But I hit the error "The checkpoint you are trying to load has model '
        'type `x` but Transformers does not recognize this architecture." This '
        "could be because\n"
    )
    assert said.message is not None and said.message.startswith("The checkpoint you are")
    answer = analyze_log(
        "Error Occurs: \"Error code: 400 - {'object': 'error', 'message': \"This model's "
        'maximum context length is 16384 tokens. However, you requested 19591 tokens. None", '
        "'type': 'BadRequestError', 'code': 400}\"\n"
    )
    assert answer.message == "This model's maximum context length is <n> tokens"
    assert answer.phase == Phase.SERVING
    silent = analyze_log(
        "Loading safetensors checkpoint shards: 50% Completed | 1/2\n"
        "Could not find the optional module, using the default one\n"
    )
    assert silent.signature is None
    assert analyze_log("just some words here\n").signature is None


def test_an_error_quoted_by_a_wrapper_or_in_markdown_is_read() -> None:
    """A wrapper prints the exception's repr, a title puts the line in parentheses, a
    comment quotes a whole log line in backticks (prefix and all), a wrapper's logger stamps
    its lines in ISO form: each still names the error, and where the user keeps the model
    (a directory, a repo id) is not part of the name."""
    from orchestrator.diagnosis.verdicts import Phase

    repr_ = analyze_log(
        "`Runner failed with exception: RuntimeError('Cannot find any model "
        "weights with /llamas/c123ian/irish_eng_transl_2k_test_uuix')`\n"
    )
    ticked = analyze_log(
        "`(RayWorkerVllm pid=1842765) ERROR 04-24 09:33:04 ray_utils.py:44] "
        "RuntimeError: Cannot find any model weights with "
        "'meta-llama/CodeLlama-7b-Instruct-hf'`\n"
    )
    nested = analyze_log(
        "`RuntimeError: Cannot find any model weights with `/home/models/"
        "snapshots/3deb0106f72a3a433f0c6ea0cb978bdf14bcd3a6``\n"
    )
    assert repr_.signature is not None
    assert repr_.signature == ticked.signature == nested.signature
    assert (repr_.error_class, repr_.phase) == ("RuntimeError", Phase.LOAD_WEIGHTS)
    assert repr_.message == "Cannot find any model weights with"
    # a file's own name stays: it says which file
    lib = analyze_log("OSError: /opt/x/libcudart.so.12: cannot open shared object file\n")
    assert lib.message == "libcudart.so.<n>: cannot open shared object file"
    title = analyze_log(
        "vllm does not start (RuntimeError: operator torchvision::nms does not exist)\n"
    )
    assert (title.error_class, title.message) == (
        "RuntimeError",
        "operator torchvision::nms does not exist",
    )
    iso = analyze_log(
        "2025-04-17T08:59:26+00:00 - gpustack.worker.backends.vllm - ERROR - "
        "ValueError: Unrecognized model in /tmp/m. Should have a model_type\n"
    )
    assert iso.error_class == "ValueError"


def test_the_callers_own_function_names_no_phase() -> None:
    """A script's `load_model` that starts the engine is not the server loading weights:
    only frames of the server's own code say the phase."""
    from orchestrator.diagnosis.verdicts import Phase

    text = (
        "Traceback (most recent call last):\n"
        '  File "D:\\ai\\demo\\web_demo.py", line 127, in load_model\n'
        "    llm = AsyncLLMEngine.from_engine_args(engine_args)\n"
        '  File "D:\\env\\Lib\\site-packages\\vllm\\executor\\ray_utils.py", line 265, '
        "in initialize_ray_cluster\n"
        "    raise ValueError(\n"
        "ValueError: The number of required GPUs exceeds the total number of available "
        "GPUs in the placement group.\n"
    )
    assert analyze_log(text).phase == Phase.INIT


def test_a_watchdog_timeout_after_many_collectives_is_while_serving() -> None:
    """An NCCL watchdog's work item counts the collectives its group ran: the first one
    timing out is startup, the five-millionth is a server that was serving."""
    from orchestrator.diagnosis.verdicts import Phase

    line = (
        "[E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum={n}, OpType=ALLREDUCE, NumelIn=73728, NumelOut=73728, "
        "Timeout(ms)=1800000) ran for 1800542 milliseconds before timing out.\n"
    )
    first, late = analyze_log(line.format(n=1)), analyze_log(line.format(n=4967570))
    assert (first.phase, late.phase) == (Phase.INIT, Phase.SERVING)
    assert first.error_class == late.error_class == "nccl_timeout"
    assert first.signature is not None and late.signature is not None
    assert first.signature != late.signature


_PIECES = [
    "Traceback (most recent call last):",
    '  File "/x/sglang/srt/a.py", line 3, in f',
    '  File "/x/vllm/b.py", line 9 in g',
    "Thread 0x7f00 (most recent call first):",
    'Thread 12 (idle): "MainThread"',
    "    f (a.py:1)",
    "KeyError",
    "what():  x",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "(EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [core.py:1] ",
    "[2025-01-01 00:00:00 TP0] ",
    "During handling of the above exception, another exception occurred:",
    "\x1b[1;36m(",
    "Watchdog timeout (self.watchdog_timeout=300)",
    "pid=",
    "  | ",
    "\ufffd",
    "\t",
    "Killed",
    "Received sigquit from a child process.",
    "x: error: unrecognized arguments: --a b",
]


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_PIECES) | st.text(max_size=8), max_size=4), max_size=40))
def test_any_text_gets_an_answer_never_an_exception(rows: list[list[str]]) -> None:
    from orchestrator.diagnosis.classify.judge import RunEvidence, judge

    text = "\n".join("".join(row) for row in rows)
    analysis = analyze_log(text)
    if not text.strip():
        assert analysis.note == "empty log: nothing to classify"
    if analysis.signature is not None:
        assert analysis.message is not None and analysis.phase is not None
    judge(RunEvidence(log_tail=text, timed_out=True), analysis.signature)


# --- a log cut anywhere above its deepest server frame keeps its signature -------------

THREADS = Path(__file__).parent / "data" / "thread_logs"


def _cut_points(text: str) -> tuple[list[str], int, int, bool] | None:
    """The log's lines, the first line of its root traceback, the line of that traceback's
    deepest frame in the server's own code, and whether its frames say the phase."""
    from orchestrator.diagnosis.classify.lines import _source_lines, strip_prefix
    from orchestrator.diagnosis.classify.tracebacks import _FRAME_RE
    from orchestrator.diagnosis.server_logs import own_file, profiles_for

    lines = _source_lines(text)  # the lines the classifier reads (run-together ones cut)
    analysis = analyze_log(text)
    if analysis.signature is None or analysis.kind != "crash" or not analysis.excerpt:
        return None
    start = [ln.rstrip() for ln in lines].index(analysis.excerpt[0])  # excerpts are rstripped
    deepest, frames = None, []
    for i in range(start, start + len(analysis.excerpt)):
        fm = _FRAME_RE.match(strip_prefix(lines[i]))
        if fm is not None:
            frames.append((fm.group("file"), fm.group("func")))
            if own_file(fm.group("file")) is not None:
                deepest = i
    if deepest is None:
        return None
    # a startup function on the stack says the phase; the serving loop leaves it to the
    # milestones (the loop also runs the server's own warmup request)
    says_phase = any(
        pattern.match(func)
        for prof in profiles_for(text)
        for _phase, pattern in prof.startup_frames
        for path, func in frames
        if own_file(path) is not None
    )
    return lines, start, deepest, says_phase


@pytest.mark.parametrize("corpus", [CORPUS, THREADS], ids=["real_logs", "thread_logs"])
def test_a_cut_above_the_deepest_server_frame_keeps_the_signature(corpus: Path) -> None:
    """Journal tails start anywhere, reports quote tracebacks cut short: wherever a log of
    a crash starts, above the deepest frame of the server's own code that raised it, it
    keeps its error class and message (with the place); and while the cut leaves that
    traceback whole, its phase too when the traceback's frames say it."""
    checked, broken = 0, []
    for case in load(corpus):
        found = _cut_points(case.text)
        if found is None:
            continue
        lines, start, deepest, says_phase = found
        whole = analyze_log(case.text).signature
        assert whole is not None
        checked += 1
        for cut in range(1, deepest + 1):
            got = analyze_log("\n".join(lines[cut:]) + "\n").signature
            same = got is not None and (got.error_class, got.message) == (
                whole.error_class,
                whole.message,
            )
            if same and cut <= start and says_phase:
                same = got.phase == whole.phase
            if not same:
                broken.append(f"{case.label.file} cut at line {cut}: {whole} -> {got}")
                break
    assert checked >= 7  # logs of a crash with a traceback through the server's code
    assert broken == []


def test_thread_corpus_labels_and_sources() -> None:
    """The second corpus: every log names the public thread it comes from, and most root
    causes are reported by two or more people; both halves exist."""
    labels = read_labels(THREADS)
    causes = {lab.root_cause for lab in labels}
    assert len(causes) >= 50 and len(labels) >= 130
    assert all(lab.source.startswith("https://github.com/") for lab in labels)
    for lab in labels:
        first = (THREADS / lab.file).read_text(encoding="utf-8").splitlines()[0]
        assert first == f"# source: {lab.source}"
    reported_twice = [c for c in causes if sum(lab.root_cause == c for lab in labels) >= 2]
    assert len(reported_twice) >= len(causes) - 1
    assert {half_of(c) for c in causes} == {"tune", "heldout"}


def test_bench_prints_both_corpora(capsys: pytest.CaptureFixture[str]) -> None:
    import runpy
    import sys

    module = runpy.run_path(
        str(Path(__file__).parents[1] / "bench" / "diagnosis.py"), run_name="bench_diagnosis"
    )
    sys.modules.pop("bench_diagnosis", None)
    module["main"]([])
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert "real_logs heldout" in header and "thread_logs heldout" in header
    assert "pairwise recall" in out
