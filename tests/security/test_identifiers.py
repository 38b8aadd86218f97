"""Dims are the only spec names that become identifiers in generated code: every other identifier
a converter (or its Triton kernels) uses must be reserved, so no dim can shadow it."""

from __future__ import annotations

import ast
import pytest

import layoutc
from layoutc.front.names import CODEGEN, identifier_problem
from layoutc.lang.ops import REGISTRY, generated_names
from tests.helpers import SPECS

CASES = [(p, {}) for p in sorted(SPECS.glob("*.lyt"))] + [
    (SPECS / "flashinfer_cutedsl_nvfp4.lyt", {"activation": "relu2"}),
    (SPECS / "flashinfer_cutlass_mxfp4_padded.lyt", {"checkpoint": "gpt_oss"}),
]


def exposed(source: str, dims: set[str]) -> set[str]:
    """Names used inside every function (or lambda) that binds a dim: what a dim could shadow there."""
    out = set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.Lambda)):
            continue
        bound = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        bound |= {t.id for node in ast.walk(fn) if isinstance(node, (ast.Assign, ast.For))
                  for t in ast.walk(node.targets[0] if isinstance(node, ast.Assign) else node.target)
                  if isinstance(t, ast.Name)}
        if not bound & dims:
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Name):
                out.add(node.id)
            elif isinstance(node, ast.arg):
                out.add(node.arg)
    return out


@pytest.mark.parametrize("path, params", CASES, ids=lambda c: getattr(c, "stem", str(c)))
def test_every_generated_identifier_is_reserved_or_a_dim(path, params):
    spec = layoutc.compile_file(path, params)
    dims = set(spec.program.dims)
    names = exposed(spec.source, dims) | exposed(spec.module._TRITON_SOURCE, dims)
    assert dims <= names  # the scan sees the scopes that bind dims
    loose = sorted(n for n in names - dims if identifier_problem(n, generated_names()) is None)
    assert not loose, f"generated code uses names a dim could shadow; add them to layoutc.front.names.CODEGEN: {loose}"


def test_reserved_names_are_refused_as_dims():
    for name in ["torch", "tensors", "out", "x", "lambda", "range", "o0", "o12", "swap_halves", "BLOCK", "tl"]:
        assert identifier_problem(name, generated_names()) is not None, name
    for name in ["E", "I", "H", "N", "K", "experts", "hidden", "o", "oo1"]:
        assert identifier_problem(name, generated_names()) is None, name


def test_the_ops_eager_functions_are_reserved_from_the_registry_not_a_second_list():
    eager = {cls.eager.__name__ for cls in REGISTRY.values()}
    assert {"swap_halves", "deinterleave_rows", "unpermute_axis", "view_width"} <= eager  # inverses too
    assert eager <= generated_names()
    assert not eager & CODEGEN, "the code generator's list repeats what the ops declare"
    for name in eager:
        assert identifier_problem(name) is None and identifier_problem(name, generated_names()) is not None, name


def test_a_dim_named_like_an_eager_function_is_a_spec_error():
    import layoutc

    text = "dims E, unpermute_axis\ninput w : bf16[E, unpermute_axis]\noutput w : bf16[E, unpermute_axis]\n"
    with pytest.raises(layoutc.SpecError, match="'unpermute_axis' cannot be a dim"):
        layoutc.compile_source(text, "shadow.lyt")
