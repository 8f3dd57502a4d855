"""The asker (orchestrator/execution/answers_asker.py), run by `python3 -c` through the local
transport as through SSH, against a small OpenAI-shaped server in this process: what it
sends (greedy, seeded, top-k logprobs, the endpoint by the prompt's shape), what it reads
back (chat and completions shapes), the batch sent at once, and failures kept per prompt."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.config.hosts import Host
from orchestrator.diagnosis.answers import Prompt
from orchestrator.execution.answers import AskSettings, ask
from orchestrator.execution.transport.local import LocalTransport
from tests.hosts.procs import free_port

PROMPTS = (
    Prompt("chat", messages=(("user", "capital of France?"),), expect="Paris"),
    Prompt("plain", prompt="The capital of Italy is", expect="Rome"),
    Prompt("broken", prompt="fail please"),
)


class Stand:
    """What the stand-in server saw: the bodies, and the most requests in flight at once."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, dict[str, object]]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most = 0
        #: when set, each request waits there until the whole batch has arrived
        self.gate: threading.Barrier | None = None
        self.met = 0


def _handler(stand: Stand) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, obj: object) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            self._send(200, {"data": [{"id": "stand-model"}]})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with stand.lock:
                stand.bodies.append((self.path, body))
                stand.in_flight += 1
                stand.most = max(stand.most, stand.in_flight)
            try:
                if stand.gate is not None:
                    stand.gate.wait()  # raises BrokenBarrierError unless all came together
                    with stand.lock:
                        stand.met += 1
                if body.get("prompt") == "fail please":
                    reply = (500, {"error": "engine dead"})
                elif self.path == "/v1/chat/completions":
                    top = [
                        {"token": "token_id:9", "logprob": -0.1},
                        {"token": "token_id:8", "logprob": -2.0},
                    ]
                    content = [{"token": "token_id:9", "logprob": -0.1, "top_logprobs": top}]
                    reply = (
                        200,
                        {
                            "choices": [
                                {
                                    "message": {"content": "Paris."},
                                    "logprobs": {"content": content},
                                    "finish_reason": "stop",
                                }
                            ]
                        },
                    )
                else:
                    lp = {
                        "tokens": ["token_id:7", "token_id:2"],
                        "top_logprobs": [
                            {"token_id:7": -0.2, "token_id:6": -1.5},
                            {"token_id:2": -0.01},
                        ],
                    }
                    reply = (
                        200,
                        {"choices": [{"text": " Rome.", "logprobs": lp, "finish_reason": "stop"}]},
                    )
            finally:
                # out of flight before the answer leaves: the next request of a one-at-a-time
                # pass can only come after it
                with stand.lock:
                    stand.in_flight -= 1
            self._send(*reply)

    return H


@pytest.fixture
def stand() -> Iterator[tuple[Stand, int]]:
    s = Stand()
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(s))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield s, port
    finally:
        server.shutdown()
        server.server_close()


def _local() -> LocalTransport:
    return LocalTransport(Host(name="here", address="localhost", transport="local"))  # type: ignore[arg-type]


def test_greedy_answers_in_both_shapes_one_at_a_time_and_at_once(stand: tuple[Stand, int]) -> None:
    s, port = stand
    asked = ask(_local(), PROMPTS, port, AskSettings(max_tokens=7, top_k=3, seed=11))
    assert asked.error is None and asked.model == "stand-model"
    assert asked.requests == 1 + 2 * len(PROMPTS)
    for mode in ("sequential", "batch"):
        chat, plain, broken = asked.sets[mode].answers
        assert (chat.text, chat.tokens, chat.token_ids) == ("Paris.", ("token_id:9",), (9,))
        assert chat.top == ((("token_id:9", -0.1), ("token_id:8", -2.0)),)
        assert (plain.text, plain.token_ids, plain.finish_reason) == (" Rome.", (7, 2), "stop")
        assert plain.top_k(0, 1) == {"token_id:7"}
        assert (
            broken.error is not None
            and broken.error.startswith("HTTP 500")
            and "engine dead" in broken.error
        )
    # every request greedy, seeded, bounded, with top-k logprobs by token id
    for path, body in s.bodies:
        assert (body["model"], body["temperature"], body["seed"], body["max_tokens"]) == (
            "stand-model",
            0,
            11,
            7,
        )
        assert body["return_tokens_as_token_ids"] is True
        if path == "/v1/chat/completions":
            assert body["logprobs"] is True and body["top_logprobs"] == 3 and body["messages"]
        else:
            assert path == "/v1/completions" and body["logprobs"] == 3 and body["prompt"]
    assert sorted(p for p, _ in s.bodies).count("/v1/chat/completions") == 2


def test_the_batch_is_in_flight_at_once(stand: tuple[Stand, int]) -> None:
    s, port = stand
    s.gate = threading.Barrier(len(PROMPTS), timeout=60)
    asked = ask(_local(), PROMPTS, port, AskSettings(modes=("batch",)))
    assert set(asked.sets) == {"batch"} and asked.requests == 1 + len(PROMPTS)
    # the server held each request until all had arrived: they were in flight together
    assert s.met == s.most == len(PROMPTS)
    s.gate, s.most = None, 0
    ask(_local(), PROMPTS, port, AskSettings(modes=("sequential",)))
    assert s.most == 1


def test_no_server_is_said_not_raised() -> None:
    asked = ask(_local(), PROMPTS, free_port(), AskSettings(timeout=3))
    assert asked.error is not None and asked.error.startswith("cannot list the models")
    assert asked.sets == {}


def test_a_server_whose_requests_hang_is_waited_for_once() -> None:
    # vLLM with rank 0 dead: /v1/models answers, every completion hangs. The first request
    # that times out ends the asking: the others are not sent (not one timeout each)
    posts: list[str] = []
    release = threading.Event()

    class Hang(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            data = json.dumps({"data": [{"id": "hung"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802
            posts.append(self.path)
            release.wait(60)

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Hang)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        asked = ask(_local(), PROMPTS, port, AskSettings(timeout=1))
    finally:
        release.set()
        server.shutdown()
        server.server_close()
    assert posts == ["/v1/chat/completions"], posts
    assert asked.requests == 2  # the models, one prompt
    first, *rest = asked.sets["sequential"].answers
    assert first.error is not None and "timed out" in first.error
    for a in [*rest, *asked.sets["batch"].answers]:
        assert a.error is not None and a.error.startswith("not asked: an earlier request"), a
