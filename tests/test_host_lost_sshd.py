"""A deployment's role host cut off mid-campaign, over the real sshd: the lab's two-node
pair is bisected with rank 0 on n0 and rank 1 on n1 (two hosts-file names of the sshd on
127.0.0.1, each with a run_dir of its own), n1 reached through a TCP relay. Just after
good's run the relay is cut: its connections are reset and its port refuses every new
one, so the controller loses n1 as it would a host behind a firewall rule, while the
servers themselves keep running. Each run lost on n1 says why under its line as it is
recorded, and the campaign stops naming n1, not n0, with the command that checks the
deployment's hosts. The same logic on scripted hosts: tests/test_host_lost.py.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.lab.sshd import SshdEndpoint, known_hosts_line
from tests.support.campaign_lab import our_processes, popen_cli, stop_child
from tests.support.deployment_lab import two_node_pair, two_sshd_hosts

pytestmark = pytest.mark.sshd


class Relay:
    """A TCP relay from a port of its own to the sshd's; `cut()` resets every connection
    through it and closes its port (a new connection is refused)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.socks: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # cut
            server = socket.create_connection(self.target)
            with self.lock:
                self.socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def cut(self) -> None:
        # shut down before the close: a close alone leaves a blocked accept() listening
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        with self.lock:
            for s in self.socks:
                # linger 0: the close sends a reset, as a rejecting firewall does
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
            self.socks = []


@pytest.fixture
def relayed_hosts(sshd: SshdEndpoint, tmp_path: Path) -> Iterator[tuple[Path, Relay]]:
    path = two_sshd_hosts(sshd, tmp_path)
    relay = Relay((sshd.address, sshd.port))
    doc = yaml.safe_load(path.read_text())
    known = tmp_path / "known_hosts_n1"
    known.write_text(known_hosts_line(sshd.address, relay.port, sshd.host_key_pub))
    doc["hosts"]["n1"] |= {"port": relay.port, "known_hosts": str(known)}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    yield path, relay
    relay.cut()
    for name in ("n0", "n1"):  # nothing of ours may outlive a test
        for pid in our_processes(str(tmp_path / f"run-{name}")):
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except OSError:
                pass


def test_a_role_host_cut_off_after_goods_run_is_named(
    relayed_hosts: tuple[Path, Relay], tmp_path: Path
) -> None:
    hosts, relay = relayed_hosts
    good, bad = two_node_pair(tmp_path)
    log = tmp_path / "bisect.log"
    argv = ["bisect", "--good", good, "--bad", bad, "--host", "n0", "--hosts", hosts]
    child = popen_cli(*argv, "--results", tmp_path / "results", "--no-report", log=log)
    try:
        deadline = time.monotonic() + 300
        while not re.search(r"\d+\. pass\s+good\b", log.read_text()):
            assert child.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        relay.cut()
        code = child.wait(timeout=600)
    finally:
        stop_child(child)
    out = log.read_text()
    words = " ".join(out.split())  # the console wraps long lines
    assert code == 3, out
    # each run lost on n1 said so as it was recorded, and the error names n1
    assert len(re.findall(r"host trouble on n1: \S", out)) == 3, out
    assert "host trouble on n0" not in out, out
    assert "3 runs in a row failed on host trouble; last on n1: " in words, out
    check = (
        f"check n1 with: orchestrator hosts check --experiment {os.path.abspath(good)} "
        f"--hosts {os.path.abspath(hosts)}; then resume with: "
    )
    assert check in words, out
