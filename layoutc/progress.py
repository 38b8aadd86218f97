"""Progress on work that takes more than a few seconds (tqdm): probes, benchmarks, a first call of
the ``compiled`` lowering. Shown on standard error only when it is a terminal and the command was
not given ``--quiet``; a pipe or a log file gets none of it (no control characters in captured
output), and the command's own lines are the same either way.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from tqdm import tqdm

_QUIET = [False]


def set_quiet(quiet: bool) -> None:
    """``--quiet``: no progress for the rest of the process (the CLI sets it per command)."""
    _QUIET[0] = bool(quiet)


def enabled() -> bool:
    stream = sys.stderr
    return not _QUIET[0] and hasattr(stream, "isatty") and stream.isatty()


def bar(total: int | None = None, desc: str = "", unit: str = "it") -> tqdm:
    """A bar over ``total`` steps (``.update(n)``), a no-op one where progress is off."""
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True,
                disable=not enabled())


@contextmanager
def working(desc: str, every: float = 0.5) -> Iterator[Any]:
    """For work of unknown length (a torch.compile): the description and the time it has taken so far,
    refreshed by a thread while the work runs."""
    if not enabled():
        yield None
        return
    with tqdm(total=None, desc=desc, bar_format="{desc}: {elapsed}", file=sys.stderr, leave=False) as b:
        done = threading.Event()

        def tick() -> None:
            while not done.wait(every):
                b.refresh()

        thread = threading.Thread(target=tick, daemon=True)
        thread.start()
        try:
            yield b
        finally:
            done.set()
            thread.join()
