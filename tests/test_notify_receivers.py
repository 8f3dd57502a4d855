"""Webhook receivers that misbehave: real sockets on 127.0.0.1, opened here.

Each receiver misbehaves one way: it answers in another protocol, sends its headers
byte by byte and never finishes them, sends its body byte by byte, redirects the POST
(302), or closes the connection without a word. Whatever it does, one delivery ends by
its deadline with one line saying why (`send` never raises), a redirect is not followed
(the receiver sees one POST with the message, never a bodyless GET), and a URL that cannot
be sent to is a usage error (exit 2) before anything runs. On the sshd lab host, a whole
bisection whose receiver does not speak HTTP prints its answer and exits 0.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config.webhook import check_url
from orchestrator.errors import UsageError
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.reports.notify import send
from orchestrator.store.store import Store
from tests.support.campaign_lab import LAB, check_b300_answer, cli, lab_pair, sshd_hosts_file

PATH = "/hooks/T0/B0/s3cr3tpath"


class RawReceiver:
    """A TCP listener on 127.0.0.1: for each connection, reads the request (headers and
    a Content-Length body), records it, then does `act(conn)`. Bounded: it stops at exit."""

    def __init__(self, act: Callable[[socket.socket, RawReceiver], None]) -> None:
        self.act = act
        self.requests: list[tuple[str, bytes]] = []  # (request line, body)
        self.stop = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}{PATH}"
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    self._read(conn)
                    self.act(conn, self)
                except OSError:
                    pass

    def _read(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data and len(data) < 65536:
            chunk = conn.recv(4096)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next(
            (int(x.split(":", 1)[1]) for x in lines[1:] if x.lower().startswith("content-length:")),
            0,
        )
        while len(body) < length:
            chunk = conn.recv(4096)
            if not chunk:
                break
            body += chunk
        self.requests.append((lines[0], body))

    def trickle(self, conn: socket.socket, data: bytes, every: float = 0.05) -> None:
        """Send `data` one byte at a time until told to stop (bounded by its length)."""
        for b in data:
            if self.stop.wait(every):
                return
            conn.sendall(bytes([b]))

    def __enter__(self) -> RawReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.sock.close()


def not_http(conn: socket.socket, r: RawReceiver) -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\nProtocol mismatch.\r\n")


def headers_forever(conn: socket.socket, r: RawReceiver) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    r.trickle(conn, b"X-Slow: " + b"a" * 100_000)  # never the end of the headers


def body_forever(conn: socket.socket, r: RawReceiver) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
    r.trickle(conn, b"x" * 100_000)


def redirect(conn: socket.socket, r: RawReceiver) -> None:
    conn.sendall(
        b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/elsewhere/hook\r\n"
        b"Content-Length: 0\r\nConnection: close\r\n\r\n"
    )


def hang_up(conn: socket.socket, r: RawReceiver) -> None:
    pass  # closes without a word


def _no_sleep(_: float) -> None:
    pass


def test_a_receiver_that_does_not_speak_http_is_one_line() -> None:
    with RawReceiver(not_http) as r:
        problem = send(r.url, {"text": "x"}, deadline=10, sleep=_no_sleep)
    assert problem is not None and "does not answer in HTTP" in problem, problem
    assert problem.startswith("http://127.0.0.1:") and "s3cr3tpath" not in problem
    assert len(problem.splitlines()) == 1
    assert len(r.requests) == 1  # not sent again: retrying a wrong protocol gains nothing


def test_headers_that_never_end_are_given_up_at_the_deadline() -> None:
    with RawReceiver(headers_forever) as r:
        problem = send(r.url, {"text": "x"}, deadline=1.5, timeout=5, sleep=_no_sleep)
    assert problem is not None and "no complete answer within 1.5s" in problem, problem
    assert len(r.requests) == 1


def test_a_body_sent_byte_by_byte_is_not_waited_for() -> None:
    # the status line and headers say 200: the message was taken, the body says nothing
    with RawReceiver(body_forever) as r:
        assert send(r.url, {"text": "hello"}, deadline=10, sleep=_no_sleep) is None
    [(line, body)] = r.requests
    assert line == f"POST {PATH} HTTP/1.1" and json.loads(body) == {"text": "hello"}


def test_a_redirect_is_not_followed_and_not_called_delivered() -> None:
    with RawReceiver(redirect) as r:
        problem = send(r.url, {"text": "x"}, deadline=10, sleep=_no_sleep)
    assert problem is not None and "HTTP 302" in problem and "not followed" in problem
    assert "http://127.0.0.1:9" in problem and "elsewhere" not in problem  # no path shown
    [(line, body)] = r.requests  # one POST with the message; no GET anywhere
    assert line.startswith("POST ") and json.loads(body) == {"text": "x"}


def test_a_receiver_that_hangs_up_is_retried_then_one_line() -> None:
    with RawReceiver(hang_up) as r:
        problem = send(r.url, {"text": "x"}, deadline=10, attempts=3, sleep=_no_sleep)
    assert problem is not None and "after 3 attempts" in problem, problem
    assert len(r.requests) == 3


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1",
        "http://127.0.0.1:99999/x",
        "http://127.0.0.1:port/x",
        "http://exa mple.com/x",
        "https://h/x\n",
        "http://127.0.0.1:0/x",
    ],
)
def test_a_url_that_cannot_be_sent_to_is_a_usage_error(url: str) -> None:
    with pytest.raises(UsageError) as info:
        check_url(url)
    assert "--notify" in str(info.value)
    assert check_url("http://[::1]:8080/hook")  # a valid IPv6 one still passes


def test_a_bad_notify_url_stops_the_command_before_anything_runs(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hosts = tmp_path / "hosts.yaml"
    (tmp_path / "known_hosts").write_text("")
    # an address nothing answers (TEST-NET-1): a late URL check would end as exit 3
    hosts.write_text(
        "hosts:\n  nowhere: {address: 192.0.2.1, service_manager: process, "
        f"known_hosts: {tmp_path / 'known_hosts'}, connect_timeout: 1}}\n"
    )
    results = tmp_path / "results"
    code = main(
        [
            "bisect",
            "--good",
            str(LAB / "b300" / "good.yaml"),
            "--bad",
            str(LAB / "b300" / "bad.yaml"),
            "--host",
            "nowhere",
            "--hosts",
            str(hosts),
            "--results",
            str(results),
            "--notify",
            "http://[::1",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--notify: not a valid URL" in err and "Traceback" not in err
    if (results / "orchestrator.db").exists():
        store = Store(results)
        try:
            assert store.campaigns() == []
        finally:
            store.close()


@pytest.fixture
def silent_receiver() -> Iterator[RawReceiver]:
    with RawReceiver(not_http) as r:
        yield r


def test_a_bisection_whose_receiver_does_not_speak_http_still_answers(
    sshd: SshdEndpoint,
    tmp_path: Path,
    silent_receiver: RawReceiver,
) -> None:
    pair = lab_pair(tmp_path, "b300")
    results = tmp_path / "results"
    res = cli(
        "bisect",
        "--good",
        pair.good,
        "--bad",
        pair.bad,
        "--host",
        "lab",
        "--hosts",
        sshd_hosts_file(sshd, tmp_path),
        "--results",
        results,
        "--notify",
        silent_receiver.url,
        "--json",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    check_b300_answer(json.loads(res.stdout), results)  # the answer, printed whole
    assert "Traceback" not in res.stderr
    [note] = [x for x in res.stderr.splitlines() if "notification was not delivered" in x]
    assert "does not answer in HTTP" in note and "s3cr3tpath" not in res.stderr
    assert "notified" not in res.stderr
    assert len(silent_receiver.requests) == 1
