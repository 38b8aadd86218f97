"""Running a user's code (``equiv``/``infer``'s ``--against MODULE:FUNCTION``) so that it cannot pass
for a result: exiting, hanging or raising something that is not an ``Exception`` is a failure with its
reason, never the end of the command with status 0.

* ``sys.exit(0)`` (or any ``SystemExit``, ``GeneratorExit``) in the function or at the import of its
  module is caught and reported; a ``KeyboardInterrupt`` stays the user's Ctrl-C.
* A time limit per call: on the main thread an interval timer raises :class:`TimeLimit` in the code
  (a ``BaseException``, so a plain ``except Exception`` in the function does not swallow it). Code that
  the signal cannot interrupt (a long C call, a handler that swallows everything) is stopped by a
  watchdog after a grace period when ``hard_exit`` is set (the CLI): it prints the reason and ends the
  process with status 2. A library caller without ``hard_exit`` gets the signal only.
* What the code does to the process itself (``os._exit``, killing it, threads it leaves running) is
  beyond this: see docs/security.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..front.text import display

#: seconds one call of the function (or the import of its module) may take, unless told
CALL_TIMEOUT = 300.0
#: seconds past the limit before the watchdog ends a process the signal did not stop
GRACE = 10.0
EXIT_USAGE = 2


class TimeLimit(BaseException):
    """Raised inside the user's code when its time is up (not an Exception: it is not the code's to catch)."""


class Aborted(Exception):
    """The user's code exited or ran out of time: the message says which and where."""


def run(fn: Callable[[], Any], what: str, timeout: float | None = CALL_TIMEOUT, hard_exit: bool = False) -> Any:
    """``fn()``, for the user's code ``what`` (e.g. "mod:convert at E=2, I=256"). Exceptions pass
    through as they are (the caller reports them); exits and time-outs become :class:`Aborted`."""
    try:
        with _limit(timeout, what, hard_exit):
            return fn()
    except TimeLimit:
        raise Aborted(f"{what} did not finish within {timeout:g} s (a hang? give a longer --timeout)") from None
    except SystemExit as err:
        raise Aborted(f"{what} called sys.exit({err.code!r}) instead of returning; nothing was compared") from None
    except GeneratorExit:
        raise Aborted(f"{what} raised GeneratorExit instead of returning") from None


@contextlib.contextmanager
def _limit(timeout: float | None, what: str, hard_exit: bool):
    if not timeout or timeout <= 0:
        yield
        return
    watchdog = None
    if hard_exit:
        watchdog = threading.Timer(timeout + GRACE, _give_up, args=(what, timeout))
        watchdog.daemon = True
        watchdog.start()
    armed = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    if armed:
        previous = signal.signal(signal.SIGALRM, _raise_time_limit)
        old_timer = signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        yield
    finally:
        if armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if old_timer[0]:  # someone else's timer was running: give it back what is left
                signal.setitimer(signal.ITIMER_REAL, *old_timer)
        if watchdog is not None:
            watchdog.cancel()


def _raise_time_limit(signum, frame) -> None:
    raise TimeLimit()


def _give_up(what: str, timeout: float) -> None:
    """(Watchdog thread.) The code did not stop when told: say so and end the process."""
    try:
        sys.stderr.write(f"error: {display(what)} did not finish within {timeout:g} s and could not be interrupted "
                         f"(a hang in native code?); stopped\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_USAGE)
