"""Code generation done once per distinct chain, not once per presence variant and parameter combination.

A spec with n optional inputs compiles 2^n presence variants, and ``check`` compiles every combination of
its parameters: most of their chains convert a tensor the same way (the weight's chain whether a bias is
given or not, the same ops under two parameter values). Planning a chain, printing its composed map and
writing its Triton body and its CPU gather are pure functions of what the chain computes, so they are kept
here by that content (:func:`chain_key`), never by object identity, together with the names the written
text uses. Statements are not part of the key: the header that cites them is written for each chain, with
the map text kept here. A 1.5 KB spec with 6 bool parameters and 6 optional inputs wrote 768 kernel
headers and map texts per parameter combination (20 s of its 25 s); it now writes one per distinct chain.

The memo holds at most :data:`SIZE` entries per kind (least recently used dropped) and counts what it
computes (:func:`computed`), so tests count the work instead of timing it.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, TypeVar

from ..lang.compiler import Chain

T = TypeVar("T")

#: Entries kept per kind of result (plans, map texts, bodies, gathers).
SIZE = 2048

_LOCK = threading.Lock()
_ENTRIES: dict[str, collections.OrderedDict] = {}
_COMPUTED: collections.Counter = collections.Counter()


def chain_key(chain: Chain) -> tuple:
    """Everything a chain's plan, composed map and emitted code read of it: the tensor's name, its input type,
    every step's op and types, and the constraints and assumes the planner draws sample sizes from. Reprs are complete
    for these frozen values (the verifier keys its axis maps the same way)."""
    return (chain.tensor, repr(chain.in_type),
            tuple((repr(s.op), repr(s.in_type), repr(s.out_type)) for s in chain.steps),
            tuple((repr(c.value), c.multiple) for c in chain.constraints),
            tuple((repr(v), m) for v, m in chain.assumed))


def get(kind: str, key: tuple, make: Callable[[], T]) -> T:
    """The result of ``make()`` for ``key``, computed once (while the entry is kept). ``make`` runs outside
    the lock: two threads may compute one entry twice, and keep the same value."""
    with _LOCK:
        entries = _ENTRIES.setdefault(kind, collections.OrderedDict())
        if key in entries:
            entries.move_to_end(key)
            return entries[key]
    value = make()
    with _LOCK:
        _COMPUTED[kind] += 1
        entries[key] = value
        while len(entries) > SIZE:
            entries.popitem(last=False)
    return value


def computed() -> dict[str, int]:
    """How many results of each kind were computed (not found) since the last :func:`clear`."""
    with _LOCK:
        return dict(_COMPUTED)


def clear() -> None:
    """Forget every kept result and the counts (``layoutc.api.clear_cache``; tests that change an op's code)."""
    with _LOCK:
        _ENTRIES.clear()
        _COMPUTED.clear()

