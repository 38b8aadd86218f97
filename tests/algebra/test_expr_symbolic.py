"""simplify_symbolic preserves values: on every composed map of the shipped specs, over whole small
instances, and on random sums (a*X + b) // X with b in and out of range."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import layoutc
from layoutc.algebra import expr as ex
from layoutc.algebra.instances import sample_dims
from layoutc.algebra.indexmap import concrete_shape, coordinate_grids
from tests.helpers import SPECS

CASES = [("flashinfer_cutlass_bf16", {}), ("flashinfer_cutlass_mxfp8", {}),
         ("flashinfer_cutedsl_nvfp4", {"activation": "silu"}), ("flashinfer_cutedsl_nvfp4", {"activation": "relu2"})]


@pytest.mark.parametrize("name,params", CASES)
def test_composed_maps_keep_their_values(name, params):
    spec = layoutc.compile_file(SPECS / f"{name}.lyt", params)
    variant = spec.compiled.variants[-1]
    for chain in variant.chains:
        m = chain.composed_map()
        if m.bit_level:
            continue
        ranges = ex.coordinate_ranges(m.out_shape)
        known = [(k.value, k.multiple) for k in chain.constraints]
        for dims in sample_dims(spec.program.dims, known, per_dim=2)[:4]:
            env = dict(dims)
            env.update(coordinate_grids(concrete_shape(m.out_shape, dims)))
            valid = torch.as_tensor(ex.evaluate(m.valid, env)).to(torch.bool)
            for e in m.src:
                before = torch.as_tensor(ex.evaluate(e, env))
                after = torch.as_tensor(ex.evaluate(ex.simplify_symbolic(e, ranges), env))
                assert torch.equal(torch.where(valid, before, 0), torch.where(valid, after.expand_as(before), 0)), e


@settings(max_examples=200, deadline=None)
@given(a=st.integers(0, 20), b=st.integers(0, 40), k=st.integers(1, 6), coef=st.integers(1, 4))
def test_sum_over_a_symbolic_size(a, b, k, coef):
    # x in [0, K-1], K = k*H' symbolic via H: (coef*K*y + x) // K == coef*y, mod -> x
    y, x, h = ex.Var("y"), ex.Var("o0"), ex.Var("H")
    size = ex.mul(k, h)
    e_div = ex.floordiv(ex.add(ex.mul(coef, size, y), x), size)
    e_mod = ex.mod(ex.add(ex.mul(coef, size, y), x), size)
    ranges = ex.coordinate_ranges([size])
    env = {"y": a, "H": 7, "o0": b % (7 * k)}
    for e in (e_div, e_mod):
        assert ex.evaluate(ex.simplify_symbolic(e, ranges), env) == ex.evaluate(e, env)
    # out of range: no rewrite may change the value
    env_out = {"y": a, "H": 7, "o0": 7 * k + b}
    for e in (e_div, e_mod):
        assert ex.evaluate(ex.simplify_symbolic(e, {}), env_out) == ex.evaluate(e, env_out)
