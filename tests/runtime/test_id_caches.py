"""Caches keyed on id(obj) must keep obj and compare it: once obj is freed, CPython hands its id to the next
object of its size, and an entry made for the freed one must not be read for the new one.

Each test drops its references to an object after its entry was made and allocates objects of the same kind
until one takes that id (CPython's free lists give a freed id back within a few allocations): that one must
get its own result. Where none does, the cache must be what keeps the objects alive.
"""

from __future__ import annotations

import pytest
import torch

from layoutc.lower import registry
from layoutc.runtime import checks
from tests.lower.test_launch import FakeArg, FakeKernel


def _reuse(make, used):
    # Objects from make() until one has an id in `used`: that one (the others are kept so ids move on).
    kept = []
    for _ in range(1000):
        obj = make()
        if id(obj) in used:
            return obj
        kept.append(obj)
    return None


def test_the_output_shapes_of_a_freed_table_are_not_read_for_another_at_its_id(monkeypatch):
    monkeypatch.setattr(checks, "_EXPECTED", {})
    d, y = {"E": 2}, {"y": torch.empty(2)}
    used = set()
    for _ in range(20):
        shapes = {"y": lambda E: (E,)}
        checks._check_outputs(y, shapes, d, "convert")
        used.add(id(shapes))
        del shapes
    other = _reuse(lambda: {"y": lambda E: (E, 3)}, used)
    if other is None:  # no id was freed: the entries hold their tables
        assert {id(entry[0]) for entry in checks._EXPECTED.values()} == used
        other = {"y": lambda E: (E, 3)}
    with pytest.raises(checks.LayoutError, match=r"the output declaration gives \[2, 3\]"):
        checks._check_outputs(y, other, d, "convert")


def test_a_freed_kernel_s_compiled_launch_is_not_taken_for_another_at_its_id(monkeypatch):
    monkeypatch.setattr(checks, "_LAUNCHES", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    args, consts = [FakeArg(), FakeArg()], {"E": 4, "_G0": 7}
    used = set()
    for _ in range(20):
        k = FakeKernel(["_x0", "_y0", "E", "_G0"])
        checks._launch(k, 7, args, consts, 4)
        used.add(id(k))
        del k
    other = _reuse(lambda: FakeKernel(["_x0", "_y0", "E", "_G0"]), used)
    if other is None:  # no id was freed: the entries hold their kernels
        assert {id(entry[0]) for entry in checks._LAUNCHES.values()} == used
        other = FakeKernel(["_x0", "_y0", "E", "_G0"])
    checks._launch(other, 7, args, consts, 4)
    assert [entry[0] for entry in other.log] == ["triton"]  # its own first launch, not the freed one's kernel


def test_a_removed_lowering_s_signature_is_not_given_by_another_at_its_id():
    base = registry.lowerings()[0]
    seen = set()
    try:
        for _ in range(20):
            lw = registry.register(_copy(base, "t25h_probe"))
            seen.add(registry.signature())
            registry.unregister("t25h_probe")
            del lw
        for _ in range(200):  # a new lowering of that name: a signature never given before
            registry.register(_copy(base, "t25h_probe"))
            assert registry.signature() not in seen
            registry.unregister("t25h_probe")
    finally:
        registry.unregister("t25h_probe")


def _copy(lowering, name):
    import attrs

    return attrs.evolve(lowering, name=name)


def test_a_freed_lookup_table_s_device_copy_is_not_taken_for_another_at_its_id():
    from layoutc.lower.triton_emit import TABLE_ON

    ns = {"torch": torch}
    exec(TABLE_ON, ns)  # the text every converter with lookup tables carries
    used = set()
    for _ in range(20):
        values = tuple(range(5))
        ns["_table_on"](values, "cpu")
        used.add(id(values))
        del values
    other = _reuse(lambda: tuple(range(10, 15)), used)
    if other is None:  # no id was freed: the entries hold their tables
        assert {id(entry[0]) for entry in ns["_TABLES_ON_DEVICES"].values()} == used
        other = tuple(range(10, 15))
    assert ns["_table_on"](other, "cpu").tolist() == list(other)
