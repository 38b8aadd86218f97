"""Index maps with lookup tables (``permute(table=...)``, as ``layoutc infer`` writes) in the fused lowering.

Such a map had no kernel form: the planner returned ``NoPass`` and the tensor ran op by op. A table is
now a kernel argument (int32 entries on the device, built once per converter and device) read with
``tl.load`` (``_lookup``), its values a literal of the generated module with the spec line it comes from.
The kernels run here in Triton's interpreter and equal the eager lowering bit for bit; the CPU gather
lowering still leaves such chains to the eager lowering (its code is not changed here).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is built: run Triton on CPU tensors

import pytest  # noqa: E402
import torch  # noqa: E402

import layoutc  # noqa: E402
from layoutc.algebra import expr as ex  # noqa: E402
from layoutc.convert.synthckpt import synthetic_inputs  # noqa: E402
from layoutc.lower import triton_emit  # noqa: E402
from layoutc.lower.plan import tables  # noqa: E402
from layoutc.lower.plan import plan as plan_of  # noqa: E402
from tests.helpers import assert_same_bits  # noqa: E402

SPEC = """spec tables
dims E, N, K
assume N % 8 == 0
assume K % 4 == 0
input w : bf16[E, N, K]
input s : u8[E, N, K]
input b : f32[E, N]
permute(w, dim=1, table=[3, 0, 2, 1, 7, 5, 6, 4])
permute(s, dim=2, table=[1, 0, 3, 2]); rearrange(s, "e n k -> e k n")
permute(b, dim=1, table=[2, 0, 3, 1]); permute(b, dim=1, table=[1, 3, 0, 2, 7, 6, 5, 4])
output w : bf16[E, N, K]
output s : u8[E, K, N]
output b : f32[E, N]
"""


def test_a_table_prints_as_a_lookup_of_its_kernel_argument():
    o = ex.Var("o1")
    inner = ex.table((1, 0, 3, 2), ex.mod(o, 4))
    outer = ex.add(ex.mul(8, ex.floordiv(o, 8)), ex.table((3, 0, 2, 1, 7, 5, 6, 4), ex.mod(ex.add(o, inner), 8)))
    found = [(3, 0, 2, 1, 7, 5, 6, 4), (1, 0, 3, 2)]
    text = triton_emit.table_printer(found)(outer)
    assert text == "8*(o1 // 8) + _lookup(_tab0, (o1 + _lookup(_tab1, o1 % 4, 4)) % 8, 8)", text
    with pytest.raises(ValueError):  # the plain printer still refuses a table: no silent fallback
        triton_emit.t(outer)


def test_the_layer_kernel_passes_each_bodys_tables_after_its_tensors():
    text = triton_emit.layer_kernel("_k", ["_b0", "_b1"], ("E",), [2, 0])
    assert text.startswith("@triton.jit\ndef _k(_x0, _y0, _tab0_0, _tab0_1, _x1, _y1, E: tl.constexpr")
    assert "_b0(_x0, _y0, _tab0_0, _tab0_1, pid, E, " in text and "_b1(_x1, _y1, pid - (_G0), E, " in text
    assert triton_emit.layer_kernel("_k", ["_b0"], ("E",)) == triton_emit.layer_kernel("_k", ["_b0"], ("E",), [0])


@pytest.mark.slow  # compiles a spec and runs the kernels in the interpreter: seconds
def test_tables_are_kernel_arguments_and_the_fused_kernels_equal_the_eager_lowering():
    spec = layoutc.compile_source(SPEC, "tables.lyt")
    variant = spec.compiled.variants[0]
    for chain in variant.chains:
        p = plan_of(chain)
        assert p.one_pass and tables(p), (chain.tensor, p)  # was NoPass: "a lookup table in the index map"
    text = spec.source
    assert "# lookup table 0 of w: tables.lyt:8: permute(w, dim=1, table=[3, 0, 2, 1, 7, 5, 6, 4])" in text
    assert "_TABLE_w_0_0 = (\n    3, 0, 2, 1, 7, 5, 6, 4,\n)" in text
    assert "_lookup(_tab0, o1 % 8, 8)" in text  # the rows walk reads the table once per row
    assert max(len(line) for line in text.splitlines()) <= 120
    assert layoutc.compile_source(SPEC, "tables.lyt", params={}).source == text  # deterministic
    for dims in ({"E": 1, "N": 8, "K": 4}, {"E": 3, "N": 24, "K": 36}):
        x = synthetic_inputs(spec, dims, seed=7)
        before = {k: v.clone() for k, v in x.items()}
        fused, eager = spec.convert(x, lowering="fused"), spec.convert(x, lowering="eager")
        gather = spec.convert(x, lowering="gather")  # the eager lowering on the CPU, as before
        for k in eager:
            assert_same_bits(fused[k], eager[k], f"{dims} {k}")
            assert_same_bits(gather[k], eager[k], f"{dims} {k}")
        assert all(torch.equal(x[k].view(torch.uint8), before[k].view(torch.uint8)) for k in x)
    # a warm call takes the full path again (no prepared launch) and still equals the reference
    assert_same_bits(spec.convert(x, lowering="fused")["b"], eager["b"], "warm call")
