"""The lab's prefill/decode split: a router in front of a prefill and a decode lab server.

    python -m orchestrator.lab.pd --port 30000 \\
        --prefill http://127.0.0.1:30001 --decode http://127.0.0.1:30002

The two workers are lab servers (`python -m orchestrator.lab.server ...
--disaggregation-mode prefill|decode`), each a unit of its own; the router serves the
requests as SGLang's PD router does: each one goes to prefill, then its KV cache moves to
decode, which answers. Before a transfer the two workers' KV layout is compared
(`/get_server_info`: `page_size`, 1 when absent, and `kv_cache_dtype`, `auto` when
absent), as the transfer engine's bootstrap does:

- page sizes that differ: the transfer never completes, so the router's request to decode
  never returns and every request hangs, while `/health` answers 200 (sglang#14474);
- KV cache dtypes that differ: the transfer completes, but decode reads the pages as
  another dtype and answers garbage (sglang#19398);
- matched layouts serve decode's answer.

`/health` answers 200 while both workers answer theirs, 503 otherwise. A hung request waits
until the router stops (SIGTERM/SIGINT end it at once); a worker's request has a deadline
(`--worker-timeout`). Stdlib only, like the lab server.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PROG = "orchestrator.lab.pd"
#: SGLang's defaults when a worker's command line does not name them
DEFAULT_PAGE_SIZE = 1
DEFAULT_KV_DTYPE = "auto"
GENERATE_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")


def log(line: str) -> None:
    print(line, flush=True)


class Router(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, addr: tuple[str, int], prefill: str, decode: str, worker_timeout: float
    ) -> None:
        super().__init__(addr, Handler)
        self.prefill = prefill.rstrip("/")
        self.decode = decode.rstrip("/")
        self.worker_timeout = worker_timeout
        self.stopping = threading.Event()

    def call(self, base: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """One request to a worker, bounded by the worker timeout: (status, body); status
        0 when the worker did not answer."""
        req = urllib.request.Request(
            base + path,
            data=body,
            method="POST" if body is not None else "GET",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.worker_timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (OSError, ValueError):
            return 0, b""

    def layout(self, base: str) -> dict[str, Any] | None:
        """A worker's KV layout from its `/get_server_info`, or None when it does not say."""
        status, body = self.call(base, "/get_server_info")
        if status != 200:
            return None
        try:
            info = json.loads(body)
        except ValueError:
            return None
        if not isinstance(info, dict):
            return None
        return {
            "page_size": str(info.get("page_size", DEFAULT_PAGE_SIZE)),
            "kv_cache_dtype": str(info.get("kv_cache_dtype", DEFAULT_KV_DTYPE)),
        }


class Handler(BaseHTTPRequestHandler):
    server: Router
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib's name)
        log(f"INFO:     {self.client_address[0]} - {format % args}")

    def _send(self, code: int, body: bytes) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        r = self.server
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            up = all(r.call(w, "/health")[0] == 200 for w in (r.prefill, r.decode))
            self._send(200 if up else 503, b"" if up else b'{"detail": "workers not ready"}')
        elif path in ("/get_server_info", "/server_info", "/v1/models", "/get_model_info"):
            status, body = r.call(r.decode, path)
            self._send(status or 502, body)
        else:
            self._send(404, b'{"detail": "Not Found"}')

    def do_POST(self) -> None:  # noqa: N802
        r = self.server
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b"{}"
        path = self.path.split("?", 1)[0]
        if path not in GENERATE_PATHS:
            self._send(404, b'{"detail": "Not Found"}')
            return
        pre, dec = r.layout(r.prefill), r.layout(r.decode)
        if pre is None or dec is None:
            self._send(502, b'{"error": {"message": "a worker did not answer"}}')
            return
        status, answer = r.call(r.prefill, path, body)  # the prompt's KV cache
        if status != 200:
            self._send(status or 502, answer)
            return
        if pre["page_size"] != dec["page_size"]:
            # the transfer engine waits for pages that never arrive as decode expects them:
            # the request to decode never completes; only a stop of the router ends it
            log(
                f"[PD] KV transfer to decode waiting: prefill page_size {pre['page_size']}, "
                f"decode page_size {dec['page_size']}"
            )
            r.stopping.wait()
            self.close_connection = True
            return
        status, answer = r.call(r.decode, path, body)
        if status == 200 and pre["kv_cache_dtype"] != dec["kv_cache_dtype"]:
            answer = _garbled(answer)
        self._send(status or 502, answer)


def _garbled(body: bytes) -> bytes:
    """Decode's answer read from KV pages of another dtype: the same shape, wrong text."""
    try:
        data = json.loads(body)
    except ValueError:
        return body

    def scramble(text: str) -> str:
        return " ".join(w[::-1] + "!!" for w in text.split()) or "!!"

    if isinstance(data, dict):
        if isinstance(data.get("text"), str):
            data["text"] = scramble(data["text"])
        for choice in data.get("choices") or []:
            if isinstance(choice, dict):
                if isinstance(choice.get("text"), str):
                    choice["text"] = scramble(choice["text"])
                msg = choice.get("message")
                if isinstance(msg, dict) and isinstance(msg.get("content"), str):
                    msg["content"] = scramble(msg["content"])
    return json.dumps(data).encode()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--prefill", required=True, help="the prefill server's URL")
    p.add_argument("--decode", required=True, help="the decode server's URL")
    p.add_argument(
        "--worker-timeout",
        type=float,
        default=30.0,
        help="seconds a request to a worker may take (not the hung transfer's wait)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not 0 < args.port < 65536:
        parser().error(f"argument --port: expected 1..65535, got {args.port}")
    try:
        router = Router((args.host, args.port), args.prefill, args.decode, args.worker_timeout)
    except OSError as exc:
        log(f"ERROR:    could not bind {args.host}:{args.port}: {exc.strerror}")
        return 1

    def stop(signum: int, frame: object) -> None:
        router.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    thread = threading.Thread(target=router.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    log(
        f"[PD] router on http://{args.host}:{args.port}: "
        f"prefill {args.prefill}, decode {args.decode}"
    )
    while not router.stopping.wait(0.5):
        pass
    log("[PD] router stopping")
    router.shutdown()
    thread.join(timeout=10)
    router.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
