"""What Ctrl-C, SIGTERM and SIGHUP do while a campaign runs.

The first of them stops the campaign the way Ctrl-C always did: the core cancels the runs
in progress, restores every host and reads it back (SIGTERM: systemd stopping a scheduled
job, a `kill`; SIGHUP: the terminal closed or the SSH session dropped, the commonest way an
overnight run loses its shell). A restore takes seconds to minutes and must not be cut
short by an impatient second Ctrl-C: the second one only says "restoring, please wait"; a
third abandons the restore (the command line then prints what was not read back and the
`restore` command that finishes it).

A closing terminal sends SIGHUP more than once (the kernel to the foreground job, the shell
to its jobs): only the first counts. It also sends this process's terminal output to
/dev/null, where that output was a terminal: writing to a hung-up terminal fails, and
nothing may fail while the hosts are restored. Output to a file or a pipe is left alone.

The output closing is the same kind of loss: `orchestrator bisect ... | head` once head has
its lines, `less` quit early. The console goes quiet (orchestrator.cli.output) and the
campaign stops as on SIGHUP, counted as one interrupt (raised in the main thread, whichever
thread wrote); the command line then says what it would have said on stderr.
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType

from orchestrator import shield

#: the interrupt that abandons a restore in progress (the first one starts it, or, during a
#: restore that was already running, stops the command once it ends)
ABANDON_AT = 3

_HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


class Interrupts:
    """A context in which the three signals stop a campaign, shielding its restore."""

    def __init__(self, say: Callable[[str], None] | None = None) -> None:
        self.count = 0
        #: the signals that counted, in order (SIGINT, SIGTERM, SIGHUP)
        self.received: list[str] = []
        self.hung_up = False
        self._say = say or _say
        self._previous: dict[int, object] = {}
        self._ttys: list[int] = []
        #: the output closed (see `output_closed`); it counts once
        self.output_gone = False
        self._output_pending = False

    def __enter__(self) -> Interrupts:
        from orchestrator.cli import output

        # Known before any hang-up: a hung-up terminal no longer answers isatty.
        self._ttys = [fd for fd in (1, 2) if _isatty(fd)]
        for sig in _HANDLED:
            self._previous[sig] = signal.signal(sig, self._handle)
        output.on_closed(self.output_closed)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        from orchestrator.cli import output

        output.on_closed(None)
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]

    def output_closed(self) -> None:
        """Our output's reader is gone: an interrupt, like SIGHUP. Raised in the main thread
        (signal handlers run there): at once when the main thread wrote, else as a Ctrl-C
        delivered to it, which `_handle` counts as the closed output."""
        if self.output_gone:
            return
        self.output_gone = True
        if threading.current_thread() is threading.main_thread():
            self._count("closed output")
        else:
            self._output_pending = True
            _thread.interrupt_main(signal.SIGINT)

    @property
    def abandoned(self) -> bool:
        return self.count >= ABANDON_AT

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            if self.hung_up:
                return  # the same hang-up, sent again by the shell
            self.hung_up = True
            self._quiet_terminal()
        if signum == signal.SIGINT and self._output_pending:
            self._output_pending = False
            self._count("closed output")
            return
        self._count(signal.Signals(signum).name)

    def _count(self, what: str) -> None:
        """One more interrupt: the first stops the campaign (after a restore in progress has
        read the hosts back), the third abandons the restore."""
        self.count += 1
        self.received.append(what)
        if self.count >= ABANDON_AT:
            raise KeyboardInterrupt
        if self.count == 1 and not shield.active():
            raise KeyboardInterrupt
        if self.count == 1:  # a restore is running: stop once it has read the hosts back
            shield.defer()
        self._say(
            f"restoring the hosts, please wait ({ABANDON_AT - self.count} more Ctrl-C "
            "abandons the restore and leaves them as they are)"
        )

    def _quiet_terminal(self) -> None:
        if not self._ttys:
            return
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            for fd in self._ttys:
                os.dup2(null, fd)
        finally:
            os.close(null)


def _say(message: str) -> None:
    # Straight to the file descriptor: the handler may run while the console is mid-print.
    try:
        os.write(2, f"\n{message}\n".encode())
    except OSError:
        pass


__all__ = ["ABANDON_AT", "Interrupts"]
