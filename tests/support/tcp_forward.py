"""A TCP forwarder to stand between the controller and one host's sshd: `python -m
tests.support.tcp_forward LISTEN_PORT TARGET_PORT` (127.0.0.1 both). Killing it cuts that
host alone off, for good, every connection through it at once, as a host that goes away
does (the other hosts keep their own path to the same sshd)."""

from __future__ import annotations

import socket
import sys
import threading


def _pipe(a: socket.socket, b: socket.socket) -> None:
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def main(listen: int, target: int) -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", listen))
    server.listen(50)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection(("127.0.0.1", target), timeout=10)
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
