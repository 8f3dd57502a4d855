"""The simulated inference server: `python3 -m orchestrator.lab.server --scenario NAME ...`.

It takes the command line SGLang's `launch_server` takes, prints SGLang's startup lines
phase by phase (init, load_weights, kv_cache, cuda_graph, warmup), then binds `--port`
(default 30000, host 127.0.0.1) and serves `/health`, `/health_generate`, `/generate`,
`/v1/completions`, `/v1/chat/completions`, `/get_server_info` and `/get_model_info`.
Tokens come out at the scenario's throughput, shared by all requests like one GPU's
decode budget, so a benchmark measures the scenario's tok/s whatever its concurrency.
With a throughput `noise:` the rate is drawn again for every burst of work (a benchmark
run: the lab bench names its run in a header; another client's requests after the engine
was idle for BURST_GAP seconds), from the start's own
level, the warm-up, a rare outlier and the variation inside a start, as
`MetricModel.start` draws them, from a stream fixed by the start's seed.
The OpenAI routes answer as vLLM and SGLang do (`orchestrator.lab.openai_api`: logprobs,
token ids, usage, seed, temperature), right by default and wrong by the scenario's
`answers:` rules (`orchestrator.lab.answering`).

Faults come from the scenario (see `orchestrator.lab.scenario`):
  - crash at a phase: a scheduler traceback ending in the rule's error, the parent's
    `Received sigquit ...` line, then exit code 1 (the rule's `exit_code`), or death by
    SIGKILL with `kill: true` (what SGLang's kill_process_tree does to itself);
  - `effect: hang`: logging stops and the port is never bound, until SIGTERM;
  - `after_requests: N`: the running server crashes (or stalls) once N requests are done;
  - `phase: args`: argparse-style usage and error on stderr, exit 2.

Over several nodes (`--nnodes N --node-rank R --dist-init-addr HOST:PORT`, with the
watchdog's `--dist-timeout S`), the ranks meet over real TCP at the end of every startup
phase and only node-rank 0 serves HTTP; see `orchestrator.lab.multinode`.

Knobs: `--time-scale X` or ORCH_LAB_TIME_SCALE scale the startup phases (the flag wins);
`--seed N`, else ORCH_LAB_SEED, else the scenario's `seed` fixes flaky rules' draws;
`random` (in any of the three) draws afresh on every start; `random:N` too, from a sequence
fixed by N (starts counted in ORCH_LAB_DIR), to replay one flaky history.
SIGTERM/SIGINT stop it cleanly with exit 0, saying so first as SGLang does ("SIGTERM
received. ... Draining requests and shutting down..."); requests arriving meanwhile get 503.
All log lines go to stdout, flushed line by line; argparse messages go to stderr.
Exit codes: 0 stopped, 1 crashed (or the rule's code), 2 bad command line or scenario.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from orchestrator.lab import answering, cmdline, multinode, openai_api, sglang_text
from orchestrator.lab.bench import BENCH_RUN_HEADER, ENGINE_WINDOW_HEADER
from orchestrator.lab.scenario import load as load_scenario
from orchestrator.lab.scenario_model import (
    LAB_ONLY_FLAGS,
    ROUTES,
    STARTUP_PHASES,
    AnswerRule,
    MetricNoise,
    Rule,
    Scenario,
    ScenarioError,
)
from orchestrator.lab.sglang_text import RAW, Line

#: the distribution a lab build installs: its version is the server's release
LAB_DIST = "orchestrator-lab-server"

TIME_SCALE_ENV = "ORCH_LAB_TIME_SCALE"
SEED_ENV = "ORCH_LAB_SEED"
DEFAULT_PORT = 30000
DEFAULT_HOST = "127.0.0.1"
DRAIN_SECONDS = 5.0
#: how long a request waits for others to join it when an answers rule asks for
#: concurrency: the scheduler's batch forms from what arrives meanwhile (a concurrent
#: batch arrives within milliseconds; a request alone answers after this)
BATCH_WINDOW = 0.3


class Log:
    """SGLang's log prefix (`[2025-01-01 12:00:00 TP0] `), one flushed line at a time."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self.lock = threading.Lock()
        #: (first, count) of a node's own scheduler ranks over several nodes: rank r < count
        #: prints as TP{first + r}, the others belong to other nodes; None: all of them
        self.ranks: tuple[int, int] | None = None

    def emit(self, lines: Sequence[Line]) -> None:
        with self.lock:
            for rank, text in lines:
                stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
                if rank == RAW:
                    line = text
                elif rank is None:
                    line = f"[{stamp}] {text}"
                else:
                    if self.ranks is not None:
                        if rank >= self.ranks[1]:
                            continue
                        rank += self.ranks[0]
                    line = f"[{stamp} TP{rank}] {text}"
                try:
                    self.stream.write(line + "\n")
                    self.stream.flush()
                except (BrokenPipeError, ValueError):
                    pass  # the reader went away; the server's behaviour must not change

    def main(self, text: str) -> None:
        self.emit([(None, text)])


_ROUTE_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
#: an engine idle this long (seconds) starts a new burst: a new benchmark run's rate
BURST_GAP = 0.25


class Engine:
    """What the running server shares between request threads: token budget and faults."""

    def __init__(
        self,
        rate: float,
        rule: Rule | None,
        log: Log,
        answer_rules: tuple[AnswerRule, ...] = (),
        book: dict[str, answering.Known] | None = None,
        model: str = "",
        routes: tuple[str, ...] = ROUTES,
    ) -> None:
        self.rate = rate
        self.base_rate = rate
        #: the rate's multiplier for the i-th burst of work (a noisy throughput), or None
        self.pace: Callable[[int], float] | None = None
        self.bursts = 0
        self.run: str | None = None  # the lab bench run of the last request (its header)
        self.rule = rule
        self.log = log
        self.answer_rules = answer_rules
        self.book = book or {}
        self.model = model
        #: the OpenAI paths it serves (the scenario's `routes:`); the others answer 404
        self.paths = frozenset(_ROUTE_PATHS[r] for r in routes)
        self.lock = threading.Lock()
        self.joined = threading.Condition(self.lock)
        self.live: list[list[int]] = []  # each request in flight: [the most in flight with it]
        self._serial = 0
        self.next_free = 0.0
        self.completed = 0
        self.tokens_out = 0
        self.in_flight = 0
        self.stopping = threading.Event()
        self.crashed = threading.Event()
        self.stalled = threading.Event()
        self.wake = threading.Event()  # tells the main thread to look at the flags

    def reserve(
        self, tokens: int, *, now: float | None = None, run: str | None = None
    ) -> tuple[float, float]:
        """Book `tokens` of decode time; returns (seconds queued, seconds generating).
        `run` names the lab bench's run the request belongs to (None: another client,
        whose runs are told apart by the engine's idle gap)."""
        now = time.monotonic() if now is None else now
        with self.lock:
            new_run = run != self.run if run is not None else now > self.next_free + BURST_GAP
            if run is not None:
                self.run = run
            if self.pace is not None and (self.bursts == 0 or new_run):
                self.rate = self.base_rate * self.pace(self.bursts)
                self.bursts += 1
            start = max(now, self.next_free)
            self.next_free = start + tokens / self.rate
            return start - now, self.next_free - start

    def enter(self) -> list[int]:
        """A request arrives: counted in flight, and in every live request's peak."""
        with self.lock:
            self.in_flight += 1
            peak = [self.in_flight]
            self.live.append(peak)
            for other in self.live:
                other[0] = max(other[0], self.in_flight)
            self.joined.notify_all()
            return peak

    def leave(self, peak: list[int]) -> None:
        with self.lock:
            self.in_flight -= 1
            # by identity: two requests' peaks may be equal lists
            self.live = [p for p in self.live if p is not peak]

    def serial(self) -> int:
        with self.lock:
            self._serial += 1
            return self._serial

    def effect_for(self, ask: openai_api.Ask, peak: list[int]) -> answering.Effect | None:
        """The first rule in force that takes this request, as what it does to the answer."""
        if not self.answer_rules:
            return None
        wanted = max((r.concurrency or 0 for r in self.answer_rules), default=0)
        if wanted:
            with self.lock:
                self.joined.wait_for(lambda: peak[0] >= wanted, timeout=BATCH_WINDOW)
        known = self.book.get(ask.key)
        for r in self.answer_rules:
            if not r.takes(peak[0], ask.prompt_tokens, ask.prompt_chars):
                continue
            longer = r.from_token if r.effect == "drift" else -1
            takes = answering.selected(r.fraction, (r.index, r.effect), ask.key, known, longer)
            if r.effect == "drift":  # every answer's numbers move; the fraction's text too
                return answering.Effect(r.effect, r.index, r.from_token, flip=takes)
            if takes:
                return answering.Effect(r.effect, r.index, r.from_token)
        return None

    def done(self, tokens: int) -> None:
        with self.lock:
            self.completed += 1
            self.tokens_out += tokens
            count = self.completed
        if count % 20 == 0:
            self.log.emit(
                [
                    (
                        0,
                        f"Decode batch. #running-req: {min(count, 64)}, #token: "
                        f"{self.tokens_out}, token usage: 0.01, cuda graph: True, "
                        f"gen throughput (token/s): {self.rate:.2f}, #queue-req: 0, ",
                    )
                ]
            )
        rule = self.rule
        if rule is not None and rule.after_requests is not None and count == rule.after_requests:
            self.fire()

    def fire(self) -> None:
        if self.rule is not None and self.rule.effect == "hang":
            self.stalled.set()
        else:
            self.crashed.set()
        self.wake.set()

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()


class Handler(BaseHTTPRequestHandler):
    """SGLang's HTTP surface, just enough of it for health checks and benchmarks."""

    server_version = "uvicorn"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, each response would wait
    # for the client's delayed ACK (~40 ms) and the bench would measure that, not tok/s.
    disable_nagle_algorithm = True

    @property
    def engine(self) -> Engine:
        return self.server.engine  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (base signature)
        pass  # access lines are printed in uvicorn's format by _access()

    def _access(self, code: int) -> None:
        host, port = self.client_address[:2]
        phrase = {200: "OK", 404: "Not Found", 400: "Bad Request", 503: "Service Unavailable"}.get(
            code, ""
        )
        self.engine.log.main(
            f'INFO:     {host}:{port} - "{self.command} {self.path} HTTP/1.1" {code} {phrase}'
        )

    def _gate(self) -> bool:
        """False when the request must not be answered normally (crashed, stalled, stopping)."""
        eng = self.engine
        if eng.crashed.is_set():
            self.close_connection = True
            return False  # a dead server says nothing; the socket just closes
        if eng.stalled.is_set():
            eng.stopping.wait()
            self.close_connection = True
            return False
        if eng.stopping.is_set():
            self._send(503, {"detail": "Server is shutting down"})
            return False
        return True

    def _send(
        self, code: int, body: object | None, headers: Mapping[str, str] | None = None
    ) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self.close_connection = True
            return
        self._access(code)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if not self._gate():
            return
        path = self.path.split("?", 1)[0]
        server: LabServer = self.server  # type: ignore[assignment]
        if path in ("/health", "/health_generate"):
            self._send(200, None)
        elif path in ("/get_server_info", "/server_info"):
            self._send(200, server.info)
        elif path in ("/get_model_info", "/model_info"):
            self._send(200, {"model_path": server.info.get("model_path"), "is_generation": True})
        elif path == "/v1/models":
            self._send(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": server.info.get("model_path"),
                            "object": "model",
                            "owned_by": "sglang",
                        }
                    ],
                },
            )
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not self._gate():
            return
        path = self.path.split("?", 1)[0]
        if path != "/generate" and path not in self.engine.paths:
            self._send(404, {"detail": "Not Found"})
            return
        server: LabServer = self.server  # type: ignore[assignment]
        try:
            req = json.loads(raw or b"{}")
            if not isinstance(req, dict):
                raise ValueError("expected a JSON object")
            ask = openai_api.parse(path, req, str(server.info.get("model_path")))
        except (ValueError, TypeError) as exc:
            self._send(400, {"error": {"message": f"bad request: {exc}", "code": 400}})
            return
        eng = self.engine
        peak = eng.enter()
        try:
            self._generate(ask, peak)
        finally:
            eng.leave(peak)

    def _generate(self, ask: openai_api.Ask, peak: list[int]) -> None:
        eng = self.engine
        effect = eng.effect_for(ask, peak)
        gen = answering.generate(
            ask.key,
            eng.book.get(ask.key),
            eng.model,
            max_tokens=ask.max_tokens,
            top_k=ask.top_k or 0,
            effect=effect,
            ignore_eos=ask.ignore_eos,
            temperature=ask.temperature,
            seed=ask.seed,
        )
        out = max(len(gen.tokens), 1)
        booked = time.monotonic()
        run = self.headers.get(BENCH_RUN_HEADER)
        queued, generating = eng.reserve(out, now=booked, run=run)
        # Waiting on `crashed` lets a crash cut in-flight requests off, as a dead server does.
        if eng.crashed.wait(queued + generating):
            self.close_connection = True
            return
        if eng.stalled.is_set():
            eng.stopping.wait()
            self.close_connection = True
            return
        per_token = generating / out
        meta = {"e2e_latency": queued + generating, "ttft": queued + per_token}
        # when the engine generated it, on the engine's clock: the lab bench's duration is
        # the engine's own busy span, not the client's wall clock (ENGINE_WINDOW_HEADER)
        window = f"{booked + queued:.6f} {booked + queued + generating:.6f}"
        body = openai_api.response(ask, gen, meta, eng.serial())
        self._send(200, body, {ENGINE_WINDOW_HEADER: window})
        eng.done(len(gen.tokens))


class LabServer(ThreadingHTTPServer):
    daemon_threads = True
    # A restarted run must be able to bind the port again at once (TIME_WAIT from the last).
    allow_reuse_address = True
    # socketserver's default backlog is 5: a burst of benchmark connections beyond it has
    # its SYNs dropped and retried a second later, which would show up as lost throughput.
    request_queue_size = 512

    def __init__(self, addr: tuple[str, int], engine: Engine, info: dict[str, Any]) -> None:
        super().__init__(addr, Handler)
        self.engine = engine
        self.info = info


# ---------------------------------------------------------------------------- running


class Run:
    """One server process: startup phases, serving, and the way it ends."""

    def __init__(
        self, scen: Scenario, flags: dict[str, Any], rule: Rule | None, scale: float, seed: int
    ) -> None:
        self.scen = scen
        self.flags = flags
        self.rule = rule
        self.scale = scale
        self.seed = seed
        self.log = Log()
        self.host = str(flags.get("host", DEFAULT_HOST))
        self.port = _port(flags.get("port", DEFAULT_PORT))
        self.tp = _tp(flags.get("tp-size", 1))
        self.pid = os.getpid()
        rate = scen.tokens_per_second(flags, os.environ)
        self.engine = Engine(
            rate,
            rule,
            self.log,
            scen.answer_rules(flags, os.environ, seed, version=installed_version()),
            answering.read_book((answering.DEFAULT_SET, *scen.prompt_sets)),
            str(flags.get("model-path", "/models/model")),
            scen.routes,
        )
        if scen.throughput_noise != MetricNoise():
            model = scen.throughput_model()
            draws = random.Random(f"{seed}:throughput")
            level = model.level(draws)
            self.engine.pace = lambda i: level * model.run_factor(draws, i)
        self.nums = sglang_text.numbers(scen.model, flags, scen.defaults, self.tp)
        self.stop_signal: int | None = None  # the signal that asked it to stop
        self._noticed = False
        #: the other nodes of a multi-node server (`orchestrator.lab.multinode`), or None
        self.group: multinode.Group | None = None

    def on_signal(self, signum: int, _frame: object = None) -> None:
        # A handler runs on the main thread between bytecodes: only flags here (the log's
        # lock may be held); the main thread says it once it sees the stop.
        self.stop_signal = signum
        self.engine.stop()

    def stop_notice(self) -> None:
        """SGLang's own line for a stop signal (TokenizerManager's SIGTERM handler)."""
        if self.stop_signal is None or self._noticed:
            return
        self._noticed = True
        name = signal.Signals(self.stop_signal).name
        self.log.main(
            f"{name} received. signum={self.stop_signal} frame=None. Draining "
            "requests and shutting down..."
        )

    def sleep(self, seconds: float) -> bool:
        """Sleep scaled time; True if a stop was requested meanwhile."""
        return self.engine.stopping.wait(max(seconds * self.scale, 0.0))

    def hang(self) -> int:
        # Hung like a deadlocked NCCL call: silent and alive until someone stops it.
        self.engine.stopping.wait()
        return 0

    def crash(self, phase: str) -> int:
        assert self.rule is not None
        self.log.emit(sglang_text.traceback_lines(phase, self.rule.error, self.rule.frames))
        sys.stdout.flush()
        if self.rule.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(self.rule.exit_code)

    def start(self) -> int:
        scen = self.scen
        group = self.group
        for phase in STARTUP_PHASES:
            # a node other than rank 0 serves no HTTP: it says nothing of uvicorn
            quiet = group is not None and phase == "warmup" and not group.serves_http
            if not quiet:
                self.log.emit(
                    sglang_text.phase_begin(
                        phase, self.nums, scen.model, self.flags, self.host, self.port, self.pid
                    )
                )
            duration = (
                scen.load_seconds(self.flags) if phase == "load_weights" else scen.startup[phase]
            )
            failing = self.rule is not None and self.rule.phase == phase
            if failing:
                assert self.rule is not None
                if self.rule.effect == "hang":
                    return self.hang()
                if self.sleep(duration / 2):
                    return 0
                return self.crash(phase)
            if phase == "load_weights":
                if self.load_weights(duration):
                    return 0
            elif self.sleep(duration):
                return 0
            if group is not None and group.barrier(phase):
                return 0  # stopped while the other nodes were awaited
            if not quiet:
                self.log.emit(
                    sglang_text.phase_end(phase, self.nums, scen.model, duration * self.scale)
                )
            if phase == "warmup":
                if group is not None and quiet:
                    return group.follow()
                # The port opens only now: until ready, connections are refused.
                return self.serve()
        return 0

    def load_weights(self, duration: float) -> bool:
        if str(self.flags.get("load-format", "")) == "dummy":
            return self.sleep(duration)  # random weights: nothing read, no shard progress
        total = self.scen.model.shards
        steps = min(total, 4)
        start = time.monotonic()
        for i in range(1, steps + 1):
            if self.sleep(duration / steps):
                return True
            done = round(total * i / steps)
            self.log.emit([sglang_text.load_progress(done, total, time.monotonic() - start)])
        return False

    def serve(self) -> int:
        info = {
            "model_path": self.flags.get("model-path", "/models/model"),
            "scenario": self.scen.name,
            "seed": self.seed,
            "tp_size": self.tp,
            "host": self.host,
            "port": self.port,
            "flags": self.flags,
            "throughput_tok_s": self.engine.rate,
        }
        for name, value in self.flags.items():
            info.setdefault(name.replace("-", "_"), value)
        try:
            httpd = LabServer((self.host, self.port), self.engine, info)
        except OSError as exc:
            self.log.main(
                f"ERROR:    [Errno {exc.errno}] error while attempting to bind on "
                f"address ('{self.host}', {self.port}): {exc.strerror.lower()}"
            )
            self.log.emit([(None, sglang_text.SIGQUIT_LINE)])
            return 1
        thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="http", daemon=True
        )
        thread.start()
        if self.group is not None:
            self.group.watch_peers()
        rule = self.rule
        if rule is not None and rule.phase == "serving" and not rule.after_requests:
            self.engine.fire()
        eng = self.engine
        while True:
            eng.wake.wait()
            eng.wake.clear()
            if eng.crashed.is_set():
                assert rule is not None
                self.log.emit(sglang_text.traceback_lines("serving", rule.error, rule.frames))
                httpd.socket.close()
                sys.stdout.flush()
                if rule.kill:
                    os.kill(os.getpid(), signal.SIGKILL)
                os._exit(rule.exit_code)
            if eng.stopping.is_set():
                break
            # stalled: keep the port open but answer nothing, until stopped
        self.stop_notice()
        self.log.main("INFO:     Shutting down")
        # Like uvicorn's graceful shutdown: requests already running may finish (bounded),
        # new ones get 503 meanwhile.
        deadline = time.monotonic() + DRAIN_SECONDS
        while eng.in_flight > 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        self.log.emit(
            [
                (None, "INFO:     Waiting for application shutdown."),
                (None, "INFO:     Application shutdown complete."),
                (None, f"INFO:     Finished server process [{self.pid}]"),
            ]
        )
        httpd.shutdown()
        httpd.server_close()
        return 0


def _port(v: object) -> int:
    if isinstance(v, int) and 0 < v < 65536:
        return v
    raise _Usage(f"argument --port: invalid int value: '{v}'")


def _tp(v: object) -> int:
    if isinstance(v, int) and v >= 1:
        return min(v, 64)
    raise _Usage(f"argument --tp-size: invalid int value: '{v}'")


class _Usage(Exception):
    pass


def _time_scale(pre: cmdline.Pre) -> float:
    text = pre.time_scale if pre.time_scale is not None else os.environ.get(TIME_SCALE_ENV)
    if text is None or text == "":
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        src = "--time-scale" if pre.time_scale is not None else TIME_SCALE_ENV
        raise _Usage(f"{src}: expected a non-negative number, got {text!r}")
    return value


def _seed(pre: cmdline.Pre, scen: Scenario) -> int:
    """The seed of this start's draws: a fresh one when it is `random` (each start of the
    same command line can then come out differently, like an intermittent crash)."""
    text = pre.seed if pre.seed is not None else os.environ.get(SEED_ENV)
    if text is None or text == "":
        return scen.seed if scen.seed is not None else _fresh_seed()
    text = text.strip()
    if text == "random":
        return _fresh_seed()
    try:
        if text.startswith("random:"):
            return _replayed_seed(int(text[len("random:") :]))
        return int(text)
    except ValueError:
        src = "--seed" if pre.seed is not None else SEED_ENV
        raise _Usage(
            f"{src}: expected a whole number, 'random' or 'random:N', got {text!r}"
        ) from None


def _fresh_seed() -> int:
    import random

    return random.SystemRandom().randrange(2**63)


def _replayed_seed(base: int) -> int:
    """`random:N`: afresh on every start, like `random`, but from a sequence fixed by N:
    the k-th start on this machine (counted in ORCH_LAB_DIR, else the temp directory)
    always draws the same, so a test can replay one flaky history exactly."""
    import fcntl
    import tempfile
    from pathlib import Path

    root = Path(os.environ.get("ORCH_LAB_DIR") or tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"lab-starts-{base}", "a+", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        text = fh.read().strip()
        count = int(text) + 1 if text.isdigit() else 1
        fh.seek(0)
        fh.truncate()
        fh.write(str(count))
    return replayed_seed(base, count)


def replayed_seed(base: int, start: int) -> int:
    """The seed of the `start`-th start (1, 2, ...) of a `random:base` sequence."""
    import random

    return random.Random(f"lab-start:{base}:{start}").randrange(2**63)


def installed_version() -> str | None:
    """The release this server is: the distribution a lab build installs on its path
    (`orchestrator.lab.builds`), as importlib.metadata reads it; None outside a build."""
    from importlib import metadata

    try:
        return metadata.version(LAB_DIST)
    except metadata.PackageNotFoundError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = cmdline.prescan(argv)
    if pre.scenario is None:
        if cmdline.wants_help(argv):
            cmdline.build_parser(None).print_help()
            return 0
        cmdline.print_usage_error("the following arguments are required: --scenario", None)
        return 2
    try:
        scen = load_scenario(pre.scenario)
    except ScenarioError as exc:
        message = " ".join(str(exc).split())
        print(f"{cmdline.PROG}: error: bad scenario: {message}", file=sys.stderr, flush=True)
        return 2
    specs = scen.known_flags
    try:
        if specs is not None:
            flags = cmdline.parse_strict(argv, specs)  # argparse exits 2 (or 0 for --help)
        elif cmdline.wants_help(argv):
            cmdline.build_parser(None).print_help()
            return 0
        else:
            flags = cmdline.parse_permissive(argv)
        for name in LAB_ONLY_FLAGS:
            flags.pop(name, None)
        scale = _time_scale(pre)
        seed = _seed(pre, scen)
        _port(flags.get("port", DEFAULT_PORT))
        _tp(flags.get("tp-size", 1))
        topo = multinode.topology(flags)
    except (cmdline.UsageError, _Usage, multinode.TopologyError) as exc:
        cmdline.print_usage_error(str(exc), specs)
        return 2
    rule = scen.select_fault(flags, os.environ, seed, version=installed_version())
    if rule is not None and rule.phase == "args":
        message = rule.error or "invalid arguments"
        message = message[len("error:") :].strip() if message.startswith("error:") else message
        cmdline.print_usage_error(message, specs)
        return rule.exit_code
    run = Run(scen, flags, rule, scale, seed)
    if topo is not None:
        try:
            run.group = multinode.Group(topo, run.log.emit, run.engine.stopping)
            run.log.ranks = (topo.node_rank * topo.ranks_per_node, topo.ranks_per_node)
        except OSError as exc:
            run.log.main(multinode.listen_failed(topo, exc))
            return 1
    # SIGTERM/SIGINT end the run cleanly wherever it is; handlers run on the main thread.
    signal.signal(signal.SIGTERM, run.on_signal)
    signal.signal(signal.SIGINT, run.on_signal)
    code = run.start()
    run.stop_notice()  # stopped during startup: said now, once
    return code


if __name__ == "__main__":
    sys.exit(main())
