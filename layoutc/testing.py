"""Pin a spec to the conversion code it replaces, from an engine's own test suite.

    from layoutc.testing import assert_equivalent

    def test_cutlass_layout_is_the_old_code():
        assert_equivalent("specs/flashinfer_cutlass_bf16.lyt", my_engine.convert_cutlass_bf16,
                          dims={"E": 2, "I": 128, "H": 256})

A failure is an ``AssertionError`` whose message is ``layoutc equiv``'s report: the first differing
output elements, what the spec reads there and which spec line moved it, and what the function read.

As a pytest plugin (``pytest_plugins = ["layoutc.testing"]`` in a ``conftest.py``, or automatically
where layoutc is installed, through its ``pytest11`` entry point) it adds the fixture
``layoutc_equiv``: ``layoutc_equiv(spec, fn, dims=..., params=...)`` runs the same assertion and
returns the :class:`~layoutc.equiv.compare.Result`.

Nothing is imported from layoutc's compiler until an assertion runs, so loading the plugin costs
nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

__all__ = ["assert_equivalent", "layoutc_equiv"]


def assert_equivalent(spec_or_path: Any, fn: Callable[..., Any] | str, dims: Mapping[str, int] | None = None,
                      params: Mapping[str, Any] | None = None, shapes: int = 4, args: Sequence[str] | None = None,
                      returns: Sequence[str] | None = None, variants: str = "all"):
    """Assert that ``fn`` converts like the spec (a path, spec text or a compiled spec), at ``shapes``
    shapes sampled around ``dims`` and for every combination of optional inputs. ``fn`` takes and returns
    the spec's named tensors (dicts; ``args``/``returns`` name positional tensors and tuple results); a
    function with a ``params`` parameter also receives the spec's parameters. Returns the result."""
    __tracebackhide__ = True  # pytest shows the report, not this frame
    from .equiv.compare import EquivError, equivalent

    try:
        result = equivalent(spec_or_path, fn, dims, params, shapes=shapes, args=args, returns=returns,
                            variants=variants)
    except EquivError as err:
        raise AssertionError(f"layoutc equiv could not compare: {err}") from None
    if not result.ok:
        raise AssertionError("\n" + result.report())
    return result


try:  # the fixture, when pytest is there
    import pytest
except ImportError:  # pragma: no cover - layoutc itself does not need pytest
    pytest = None

if pytest is not None:

    @pytest.fixture
    def layoutc_equiv():
        """``layoutc_equiv(spec, fn, dims=..., params=..., ...)``: :func:`assert_equivalent`."""
        return assert_equivalent
