"""The simulated server over several nodes: `--nnodes N --node-rank R --dist-init-addr H:P`.

SGLang takes these three flags to spread one server over N hosts; this module gives the lab
server the same shape with real sockets, so what an engineer meets on a real cluster
happens here too:

- node-rank 0 listens on the init address; every other rank connects to it over TCP
  (retrying until the watchdog's time is up, as torch's store client does);
- every startup phase ends with a real exchange between the ranks (a barrier: each rank
  says it is done, rank 0 answers once all have); a rank that died or hangs leaves the
  others blocked in it;
- a blocked rank is ended by a watchdog after `--dist-timeout` seconds (SGLang's flag; 600
  when absent, torch's default NCCL timeout), never scaled by the lab's time scale: it logs
  torch's ProcessGroupNCCL lines ("Watchdog caught collective operation timeout: WorkNCCL(...)
  ran for N milliseconds before timing out.", then `terminate called after throwing an
  instance of 'c10::DistBackendError'` and `Fatal Python error: Aborted`), the parent's
  `Received sigquit ...` line, and exits with status 1;
- only node-rank 0 serves HTTP; the others follow it until stopped, and a rank that loses
  a peer after startup times out the same way, a watchdog later.

A fault on one rank is a scenario rule like any other: `when: {node-rank: 1, ...}`.
Every wait here is bounded by the watchdog's deadline and polls a stop event, so SIGTERM
ends a blocked rank at once.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from orchestrator.lab.scenario import STARTUP_PHASES
from orchestrator.lab.sglang_text import RAW, SIGQUIT_LINE, Line, traceback_lines

#: torch's default NCCL timeout (ProcessGroupNCCL), used when `--dist-timeout` is absent
DEFAULT_WATCHDOG_S = 600.0
#: how often a blocked wait looks at the stop event and the deadline
POLL_S = 0.05
#: the exit status of a rank its watchdog ended (the lab's crash status)
WATCHDOG_EXIT = 1
#: the most ranks one simulated server takes (a bound on every per-peer loop)
MAX_NODES = 64


class TopologyError(ValueError):
    """A multi-node command line the server refuses; the message in argparse's words."""


@dataclass(frozen=True)
class Topology:
    """Where this process sits in a multi-node server."""

    nnodes: int
    node_rank: int
    host: str
    port: int
    watchdog_s: float
    #: scheduler ranks per node (`--tp-size` over the nodes): names the global ranks
    ranks_per_node: int = 1

    @property
    def serves_http(self) -> bool:
        return self.node_rank == 0


def topology(flags: Mapping[str, object]) -> Topology | None:
    """The multi-node topology a command line asks for, or None for a one-node server
    (no `--nnodes`, or `--nnodes 1`). Raises TopologyError for values SGLang refuses."""
    nnodes = flags.get("nnodes")
    if nnodes is None:
        return None
    if not isinstance(nnodes, int) or isinstance(nnodes, bool) or not 1 <= nnodes <= MAX_NODES:
        raise TopologyError(f"argument --nnodes: expected a whole number 1..{MAX_NODES}")
    if nnodes == 1:
        return None
    rank = flags.get("node-rank", 0)
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < nnodes:
        raise TopologyError(f"argument --node-rank: expected a whole number 0..{nnodes - 1}")
    addr = flags.get("dist-init-addr")
    if not isinstance(addr, str) or ":" not in addr:
        raise TopologyError("argument --dist-init-addr: expected HOST:PORT with --nnodes > 1")
    host, _, port_text = addr.rpartition(":")
    host = host.strip("[]")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise TopologyError(f"argument --dist-init-addr: expected HOST:PORT, got {addr!r}")
    timeout = flags.get("dist-timeout", DEFAULT_WATCHDOG_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise TopologyError("argument --dist-timeout: expected a positive number of seconds")
    tp = flags.get("tp-size", 1)
    per_node = max(tp // nnodes, 1) if isinstance(tp, int) and not isinstance(tp, bool) else 1
    return Topology(nnodes, rank, host, int(port_text), float(timeout), per_node)


# ---------------------------------------------------------------------------- the words


def watchdog_lines(topo: Topology, seq: int, waited_ms: int) -> list[Line]:
    """What torch's ProcessGroupNCCL prints when its watchdog ends a collective that never
    completed, for the first scheduler rank of this node (wording of torch 2.4-2.6)."""
    rank = topo.node_rank * topo.ranks_per_node
    now = datetime.now()
    stamp = f"[rank{rank}]:[E{now:%m%d} {now:%H:%M:%S}.{now.microsecond:06d}000 "
    timeout_ms = int(topo.watchdog_s * 1000)
    work = (
        f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        f"Timeout(ms)={timeout_ms}) ran for {waited_ms} milliseconds before timing out."
    )
    caught = f"[Rank {rank}] Watchdog caught collective operation timeout: {work}"
    pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}]"
    return [
        (RAW, f"{stamp}ProcessGroupNCCL.cpp:616] {caught}"),
        (
            RAW,
            f"{stamp}ProcessGroupNCCL.cpp:1785] {pg} Exception (either an error or timeout) "
            f"detected by watchdog at work: {seq}, last enqueued NCCL work: {seq}, last "
            f"completed NCCL work: {seq - 1}.",
        ),
        (
            RAW,
            f"{stamp}ProcessGroupNCCL.cpp:630] [Rank {rank}] Some NCCL operations have failed "
            "or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU "
            "operations might run on corrupted/incomplete data.",
        ),
        (
            RAW,
            f"{stamp}ProcessGroupNCCL.cpp:636] [Rank {rank}] To avoid data inconsistency, we "
            "are taking the entire process down.",
        ),
        (
            RAW,
            f"{stamp}ProcessGroupNCCL.cpp:1595] {pg} Process group watchdog thread terminated "
            f"with exception: {caught}",
        ),
        (RAW, "terminate called after throwing an instance of 'c10::DistBackendError'"),
        (RAW, f"  what():  {pg} Process group watchdog thread terminated with exception: {caught}"),
        (RAW, ""),
        (RAW, "Fatal Python error: Aborted"),
        (RAW, ""),
        (None, SIGQUIT_LINE),
    ]


def connect_timeout_lines(topo: Topology) -> list[Line]:
    """torch's store client giving up on the init address (rank 0 never listened):
    c10d's own line, then the scheduler's traceback ending in DistNetworkError."""
    now = datetime.now()
    said = (
        f"The client socket has timed out after {int(topo.watchdog_s * 1000)}ms while "
        f"trying to connect to ({topo.host}, {topo.port})."
    )
    stamp = f"[E{now:%m%d} {now:%H:%M:%S}.{now.microsecond:06d}000 socket.cpp:1023]"
    return [
        (RAW, f"{stamp} [c10d] {said}"),
        *traceback_lines("init", f"torch.distributed.DistNetworkError: {said}"),
    ]


def listen_failed(topo: Topology, exc: OSError) -> str:
    """torch's store server failing to bind the init address (rank 0)."""
    name = errno.errorcode.get(exc.errno or 0, "EUNKNOWN")
    reason = (exc.strerror or str(exc)).lower()
    return (
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
        f"local network address. port: {topo.port}, useIpv6: 0, code: -{exc.errno or 0}, "
        f"name: {name}, message: {reason}"
    )


# ---------------------------------------------------------------------------- the group


Emit = Callable[[list[Line]], None]


class Group:
    """This rank's sockets to the others (rank 0: one per peer; others: one to rank 0).

    `barrier(phase)` returns True when a stop was asked meanwhile (the caller ends the run
    cleanly), False once every rank has finished the phase; a watchdog ends the process.
    `exit` is how the process ends (os._exit outside tests of this class)."""

    def __init__(
        self,
        topo: Topology,
        emit: Emit,
        stopping: threading.Event,
        *,
        exit: Callable[[int], object] = os._exit,  # noqa: A002 (the process's own exit)
    ) -> None:
        self.topo = topo
        self.emit = emit
        self.stopping = stopping
        self._exit = exit
        self._listener: socket.socket | None = None
        self._peers: list[socket.socket] = []
        self._buffers: dict[int, bytes] = {}
        self._seq = 0
        if topo.serves_http:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((topo.host, topo.port))
            listener.listen(MAX_NODES)
            self._listener = listener

    @property
    def serves_http(self) -> bool:
        return self.topo.serves_http

    # -- the exchange

    def barrier(self, phase: str) -> bool:
        self._seq = STARTUP_PHASES.index(phase) + 1 if phase in STARTUP_PHASES else self._seq + 1
        deadline = time.monotonic() + self.topo.watchdog_s
        started = time.monotonic()
        if not self._peers and not self._join(deadline):
            return True
        if self.topo.serves_http:
            for peer in list(self._peers):
                if self._read_line(peer, deadline) is None:
                    return self._blocked(deadline, started)
            for peer in self._peers:
                self._send(peer, f"go {phase}")
            return False
        self._send(self._peers[0], f"done {phase}")
        if self._read_line(self._peers[0], deadline) is None:
            return self._blocked(deadline, started)
        return False

    def _join(self, deadline: float) -> bool:
        """Connect the group (False: stopped meanwhile). Rank 0 accepts a connection from
        every other rank; the others connect to rank 0, retrying while it is not up yet."""
        if self._listener is not None:
            self._listener.settimeout(POLL_S)
            while len(self._peers) < self.topo.nnodes - 1:
                if self.stopping.is_set():
                    return False
                if time.monotonic() >= deadline:
                    self._watchdog(int(self.topo.watchdog_s * 1000))
                try:
                    conn, _ = self._listener.accept()
                except TimeoutError:
                    continue
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._peers.append(conn)
            return True
        while not self.stopping.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                self.emit(connect_timeout_lines(self.topo))
                sys.stdout.flush()
                self._exit(WATCHDOG_EXIT)
                return False
            try:
                conn = socket.create_connection(
                    (self.topo.host, self.topo.port), timeout=min(left, 1.0)
                )
            except OSError:
                self.stopping.wait(min(0.1, max(left, 0.0)))
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._peers.append(conn)
            return True
        return False

    def _send(self, peer: socket.socket, text: str) -> None:
        try:
            peer.sendall(text.encode() + b"\n")
        except OSError:
            pass  # a dead peer: the next wait on it blocks until the watchdog, as in NCCL

    def _read_line(self, peer: socket.socket, deadline: float) -> str | None:
        """One line from a peer; None when the stop came, the peer went away or the deadline
        passed (the caller tells which)."""
        key = peer.fileno()
        while not self.stopping.is_set():
            buf = self._buffers.get(key, b"")
            if b"\n" in buf:
                line, _, rest = buf.partition(b"\n")
                self._buffers[key] = rest
                return line.decode(errors="replace")
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([peer], [], [], min(POLL_S, left))
            if not ready:
                continue
            try:
                chunk = peer.recv(4096)
            except OSError:
                chunk = b""
            if not chunk:
                return None  # the peer is gone; NCCL would not notice: keep the deadline
            self._buffers[key] = buf + chunk
        return None

    def _blocked(self, deadline: float, started: float) -> bool:
        """A collective that cannot complete: wait out the watchdog (True: stopped first)."""
        while not self.stopping.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                self._watchdog(int((time.monotonic() - started) * 1000))
                return True
            self.stopping.wait(min(POLL_S, left))
        return True

    def _watchdog(self, waited_ms: int) -> None:
        self.emit(watchdog_lines(self.topo, self._seq or 1, waited_ms))
        sys.stdout.flush()
        self._exit(WATCHDOG_EXIT)

    # -- after startup

    def follow(self) -> int:
        """A rank without HTTP after startup: runs until stopped (0), or until rank 0 is
        lost and the watchdog ends it."""
        self._seq += 1
        peer = self._peers[0]
        while not self.stopping.is_set():
            ready, _, _ = select.select([peer], [], [], POLL_S)
            if ready and self._lost(peer):
                break
        self.close()
        return 0

    def watch_peers(self) -> threading.Thread:
        """Rank 0 while it serves: a peer lost blocks the next collective; the watchdog
        ends the server `--dist-timeout` seconds later."""
        thread = threading.Thread(target=self._watch, name="nccl-watchdog", daemon=True)
        thread.start()
        return thread

    def _watch(self) -> None:
        self._seq += 1
        while not self.stopping.is_set():
            ready, _, _ = select.select(self._peers, [], [], POLL_S)
            if any(self._lost(peer) for peer in ready):
                return

    def _lost(self, peer: socket.socket) -> bool:
        """True once `peer` closed its end: the next collective blocks until the watchdog
        (which `_blocked` plays out)."""
        try:
            chunk = peer.recv(4096)
        except OSError:
            chunk = b""
        if chunk:
            return False
        started = time.monotonic()
        self._blocked(started + self.topo.watchdog_s, started)
        return True

    def close(self) -> None:
        for sock in [*self._peers, *([self._listener] if self._listener else [])]:
            try:
                sock.close()
            except OSError:
                pass
        self._peers = []
        self._listener = None
