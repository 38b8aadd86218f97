"""The CPU gather's run plans (layoutc.lower.runs) equal the element gather bit for bit.

Per shape, a gather plan's map is evaluated once and cut into runs; a call is then one strided
copy (the run starts are a mixed-radix affine function: a view) or one ``index_select`` of runs
(a table at most four times the output's bytes), else the element gather runs as before. The unit tests
drive the helpers with maps of known structure (a transpose, a swap of halves with padding, a
byte shuffle that needs the fallback, unaligned inputs); the property test holds every shipped
spec's generated ``gather`` lowering to the eager reference at small random (seeded) dims and
checks that the run path was taken.
"""

from __future__ import annotations

import random

import pytest
import torch

import layoutc
from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.lower import runs, torch_emit
from tests.helpers import SPECS, assert_same_bits
from tests.helpers import spec as _spec


def _helpers() -> dict:
    namespace = {"torch": torch}
    exec(torch_emit.runs_source(), namespace)  # the text generated converters carry
    namespace["_nb"] = lambda: None  # the torch forms (the native kernels: tests/lower/test_native.py)
    namespace["_nx_on"] = lambda: False  # (the SIMD kernel's plans: tests/lower/test_native_simd.py)
    return namespace


def _element_gather(flat: torch.Tensor, index: torch.Tensor, fill) -> torch.Tensor:
    ok = index >= 0
    return torch.where(ok, flat[torch.where(ok, index, 0)], torch.as_tensor(fill, dtype=flat.dtype))


def _run(h, index_of, shape, flat, fill=0, stride=None):
    h["_RUN_PLANS"].clear()
    plan = h["_run_plan"](("t",), lambda start, stop: index_of(start, stop), (), shape, flat.element_size(), stride)
    return plan, (None if plan is None else h["_run_gather"](flat, plan, shape, fill))


def test_a_transpose_is_a_strided_view():
    h = _helpers()
    x = torch.arange(3 * 4 * 6, dtype=torch.int32)  # [3, 4, 6] -> [3, 6, 4]
    full = x.view(3, 4, 6).transpose(1, 2).contiguous()

    def index_of(start, stop):
        o0, o1, o2 = torch.meshgrid(torch.arange(start, stop), torch.arange(6), torch.arange(4), indexing="ij")
        return o0 * 24 + o2 * 6 + o1

    h["_RUN_VIEW_BYTES"] = 1  # every view kept as a view
    plan, y = _run(h, index_of, (3, 6, 4), x)
    assert plan[0] == "view"
    assert torch.equal(y, full)
    plan, y = _run(h, lambda s, e: index_of(0, 1), (3, 6, 4), x, stride=24)  # expert 0, then moved
    assert plan[0] == "view" and torch.equal(y, full)
    # by default runs of 4 bytes over three strided axes go through a table (a strided copy of short
    # runs is slower); two axes stay a view
    h["_RUN_VIEW_BYTES"] = 16
    plan, y = _run(h, index_of, (3, 6, 4), x)
    assert plan[0] == "table" and torch.equal(y, full)
    plan, y = _run(h, lambda s, e: index_of(0, 1)[0], (6, 4), x[:24])
    assert plan[0] == "view" and torch.equal(y, full[0])


def test_a_view_of_runs_of_whole_words_copies_words_and_any_offset_copies_bytes():
    h = _helpers()
    base = torch.randint(0, 256, (1 + 4 * 3 * 16,), dtype=torch.uint8)

    def index_of(start, stop):  # [4, 3, 16] -> [3, 4, 16]: 16-byte runs, tiles transposed
        o0, o1, o2 = torch.meshgrid(torch.arange(start, stop), torch.arange(4), torch.arange(16), indexing="ij")
        return o1 * 48 + o0 * 16 + o2

    for x in (base[:-1], base[1:]):  # aligned (int64 words), one byte in (bytes)
        plan, y = _run(h, index_of, (3, 4, 16), x)
        assert plan[0] == "view" and plan[1][-1] == 16
        assert torch.equal(y, _element_gather(x, index_of(0, 3), 0))


def test_sixteen_byte_runs_move_as_one_element_with_every_bit_pattern():
    # an aligned view of 16-byte runs is copied as complex128 elements: a copy between one dtype moves bits,
    # so NaN payloads (quiet, signalling, negative), infinities and subnormals come out as they went in
    h = _helpers()
    words = [0x7FF0000000000001, 0x7FF8000000000000, 0xFFF0000000000001, 0xFFFFFFFFFFFFFFFF, 0x7FF0000000000000,
             0x0000000000000001, 0x8000000000000000, 0x7FF4000000000000]
    pattern = torch.tensor([w - (1 << 64) if w >= 1 << 63 else w for w in words], dtype=torch.int64)
    x = torch.cat([pattern.view(torch.uint8), torch.randint(0, 256, (8 * 6 * 16 - 64,), dtype=torch.uint8)])

    def index_of(start, stop):  # [8, 6, 16] -> [6, 8, 16]: 16-byte runs, tiles transposed
        o0, o1, o2 = torch.meshgrid(torch.arange(start, stop), torch.arange(8), torch.arange(16), indexing="ij")
        return o1 * 96 + o0 * 16 + o2

    plan, y = _run(h, index_of, (6, 8, 16), x)
    assert plan[0] == "view" and plan[1][-1] == 16 and 16 in h["_RUN_VIEW_WORDS"]
    assert torch.equal(y, _element_gather(x, index_of(0, 6), 0))


def test_a_swap_of_halves_with_padding_is_a_table_of_rows():
    h = _helpers()
    e, rows, cols, pad = 2, 6, 8, 2  # [e, 2*3 rows, 8] -> rows (r + 3) % 6, two fill rows at the end
    x = torch.randint(-2**31, 2**31 - 1, (e * rows * cols,), dtype=torch.int64).to(torch.int32)

    def index_of(start, stop):
        o0, o1, o2 = torch.meshgrid(torch.arange(start, stop), torch.arange(rows + pad), torch.arange(cols),
                                    indexing="ij")
        src = o0 * rows * cols + ((o1 + 3) % rows) * cols + o2
        return torch.where(o1 < rows, src, -1)

    plan, y = _run(h, index_of, (e, rows + pad, cols), x, fill=7)
    assert plan[0] == "table" and plan[1] == cols and plan[3] is not None
    assert torch.equal(y, _element_gather(x, index_of(0, e), 7))


def test_a_byte_shuffle_is_a_table_of_bytes_and_past_int32_falls_back_to_the_element_gather():
    """An int32 per byte (four times the output) is kept: re-evaluating the map per call costs far more
    (the element gather); an int64 per byte (addresses past 2**31, eight times) is not."""
    h = _helpers()
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(4096, generator=g)
    x = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=g)
    plan, y = _run(h, lambda start, stop: perm.view(64, 64)[start:stop], (64, 64), x)
    assert plan[0] == "table" and plan[1] == 1 and plan[2].dtype == torch.int32
    assert torch.equal(y, _element_gather(x, perm.view(64, 64), 0))
    plan, _ = _run(h, lambda start, stop: perm.view(64, 64)[start:stop] + 2**31, (64, 64), x)
    assert plan is None


def test_runs_that_start_anywhere_and_unaligned_inputs():
    h = _helpers()
    base = torch.randint(0, 256, (1 + 10 * 16,), dtype=torch.uint8)
    x = base[1:]  # one byte into its storage: no aligned word view
    assert x.storage_offset() == 1

    def index_of(start, stop):  # rows of 8 bytes from odd offsets 3 + 16 * r, reversed row order
        o0, o1 = torch.meshgrid(torch.arange(start, stop), torch.arange(8), indexing="ij")
        return 3 + 16 * (9 - o0) + o1

    plan, y = _run(h, index_of, (10, 8), x)
    assert plan[0] == "table" and not plan[4]  # not aligned: rows of an overlapping view
    assert torch.equal(y, _element_gather(x, index_of(0, 10), 0))

    def words_of(start, stop):  # 4-byte words, aligned to 4 in the tensor, shuffled
        o0, o1 = torch.meshgrid(torch.arange(start, stop), torch.arange(4), indexing="ij")
        return 4 * ((o0 * 7) % 40) + o1

    plan, y = _run(h, words_of, (40, 4), x)
    assert plan[0] == "table" and plan[4]
    assert torch.equal(y, _element_gather(x, words_of(0, 40), 0))


def test_tables_past_the_byte_budget_are_used_once_then_the_element_gather():
    h = _helpers()
    h["_RUN_BYTES_MAX"] = 100  # bytes: less than the table below
    h["_RUN_BYTES"][0] = 0
    x = torch.arange(64, dtype=torch.int64)

    def index_of(start, stop):  # rows of 2 swapped in pairs: a table of 32 runs, 128 bytes in int32
        o0, o1 = torch.meshgrid(torch.arange(start, stop), torch.arange(2), indexing="ij")
        return 2 * (o0 ^ 1) + o1

    plan, y = _run(h, index_of, (32, 2), x)
    assert plan[0] == "table" and torch.equal(y, _element_gather(x, index_of(0, 32), 0))
    assert h["_RUN_PLANS"][("t", False, False)] is None and h["_RUN_BYTES"][0] == 0  # remembered as: the element gather


def test_the_affine_check_reads_every_value():
    h = _helpers()
    starts = torch.arange(64, dtype=torch.int64).view(4, 16).t().reshape(-1)  # a transpose: two digits
    assert h["_run_affine"](starts) == ([16, 4], [1, 16], 0)
    broken = starts.clone()
    broken[37] += 1
    assert h["_run_affine"](broken) is None
    assert h["_run_affine"](torch.tensor([5, 3, 1])) is None  # a negative stride is no view


def test_the_copied_text_is_the_module():
    assert "def _run_plan(" in torch_emit.runs_source() and '"""Run tables' not in torch_emit.runs_source()
    assert runs._run_gcd(12, 18) == 6


SHIPPED = sorted(p.stem for p in SPECS.glob("*.lyt"))


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_spec_gather_equals_eager(name):
    spec = _spec(name)
    rng = random.Random(name)  # deterministic per spec
    tried = 0
    sizes = (32, 64, 96, 128, 160, 256, 384, 512)  # some specs need multiples of 128 (W4A8: of 256)
    for _ in range(24):
        dims = {"E": rng.randint(1, 3), "I": rng.choice(sizes), "H": rng.choice(sizes)}
        dims = {k: v for k, v in dims.items() if k in spec.program.dims}
        try:
            x = synthetic_inputs(spec, dims, seed=rng.randint(0, 2**16))
            want = spec.convert(x, lowering="eager")
        except layoutc.LayoutError:
            continue  # dims this spec refuses
        got = spec.convert(x, lowering="gather")
        assert_same_bits(got, want, f"{name} {dims}")
        tried += 1
        if tried == 3:
            break
    assert tried, f"{name}: no sampled dims accepted"
    if "else _run_plan((" in spec.source:  # a gather plan: its run plan was computed (taken, or None: fallback)
        assert spec.module._RUN_PLANS, name


def test_a_table_plan_fills_float8_padding_by_its_bits():
    """index_fill_ has no float8 kernels on the CPU (a mutant of flashinfer_trtllm_mxfp4 met it): the fill
    goes through an integer view of the same width."""
    flat = torch.arange(1, 9, dtype=torch.float32).to(torch.float8_e4m3fn)
    table, bad = torch.tensor([3, 0, 1], dtype=torch.int32), torch.tensor([1])
    out = runs._run_gather(flat, ("table", 2, table, bad, True, None), (6,), 0)
    assert out.dtype == torch.float8_e4m3fn
    assert out.view(torch.uint8).tolist() == flat.view(torch.uint8)[[6, 7]].tolist() + [0, 0] + \
        flat.view(torch.uint8)[[2, 3]].tolist()


def test_a_rows_plan_takes_a_run_plan_too(monkeypatch):
    """A ``Rows`` plan (a gather whose last axis is copied as is: cutedsl_nvfp4's w13_weight, row swaps and
    interleaves) was walked element by element on the CPU (an int64 index per byte, 20x a clone); its map
    is cut into runs like any gather's, bit for bit the eager reference."""
    monkeypatch.setenv("LAYOUTC_NUMBA", "0")  # the torch form's table (the native one: test_native.py)
    spec = _spec("flashinfer_cutedsl_nvfp4")
    assert "def _gather_w13_weight_0_index(" in spec.source
    x = synthetic_inputs(spec, {"E": 2, "I": 128, "H": 64}, seed=3)
    spec.module._RUN_PLANS.clear()
    got = spec.convert(x, lowering="gather")
    assert_same_bits(got, spec.convert(x, lowering="eager"), "cutedsl_nvfp4")
    plans = {k[0]: v for k, v in spec.module._RUN_PLANS.items()}
    assert plans["_gather_w13_weight_0"] is not None and plans["_gather_w13_weight_0"][0] == "table"


@pytest.mark.slow  # compiling the spec takes 10-30 s on the 2-core machine
def test_a_words_plan_without_quads_gathers_bytes_by_a_run_plan_then_permutes_bits():
    """triton_kernels_mxfp4_hopper's weights (a bit permutation within 32-bit words whose source bytes
    form no quads) read each byte through an int64 index and permuted bits with masked shifts, per call
    (100x a clone); now the source bytes come from a run plan (a table or a view, per shape) and the
    words are permuted by the half-word tables, bit for bit the eager reference."""
    spec = _spec("triton_kernels_mxfp4_hopper")
    assert "def _gather_w13_weight_0_index(" in spec.source and "_permute_words(" in spec.source
    spec.module._RUN_PLANS.clear()
    for dims in ({"E": 2, "I": 128, "H": 256}, {"E": 1, "I": 96, "H": 160}):  # the second pads
        x = synthetic_inputs(spec, dims, seed=5)
        assert_same_bits(spec.convert(x, lowering="gather"), spec.convert(x, lowering="eager"), str(dims))
    plans = {k[0]: v for k, v in spec.module._RUN_PLANS.items()}
    assert plans["_gather_w13_weight_0"] is not None and plans["_gather_w2_weight_2"] is not None


def test_a_fill_with_the_sign_bit_set_moves_as_its_bits_in_both_paths():
    """bf16 -1.0 (0xBF80 = 49024) as a pad value, moved as int16 bits: the run plan's fill and the element
    gather's (the fallback) both write 0xBF80 (torch.as_tensor(49024, dtype=int16) overflowed)."""
    spec = layoutc.compile_source("dims E, N\ninput x : bf16[E, N]\npad(x, dim=1, multiple=4, value=49024)\n"
                                  "output x : bf16[E, round_up(N, 4)]\n", "pad_fill_sign_runs.lyt")
    x = torch.zeros(2, 3, dtype=torch.bfloat16)
    spec.module._RUN_PLANS.clear()
    ran = spec.convert({"x": x}, lowering="gather")["x"]
    assert any(v is not None for v in spec.module._RUN_PLANS.values())
    for k in list(spec.module._RUN_PLANS):
        spec.module._RUN_PLANS[k] = None  # every later call of this shape: the element gather
    walked = spec.convert({"x": x}, lowering="gather")["x"]
    for out in (ran, walked):
        assert out[:, 3].tolist() == [-1.0, -1.0] and out[:, :3].abs().sum().item() == 0


@pytest.mark.parametrize("seed", range(4))
def test_a_fill_that_varies_rides_in_the_table_as_minus_one_minus_its_byte(seed):
    """AITER's padded scales fill 0 or 127 by where the padding is: their maps had no run plan (a constant
    fill only) and took the element gather, 38x a clone. The index gives a fill byte b as -1 - b; runs of
    fill join only over one byte, and the table path writes each fill run's byte (the element gather's
    bytes, fill bytes 0 included, which read as -1 like a constant fill)."""
    h = _helpers()
    g = torch.Generator().manual_seed(seed)
    e, rows, cols, pad = 2, 5, 8, 3
    x = torch.randint(0, 256, (e * rows * cols,), dtype=torch.uint8, generator=g)
    fills = torch.tensor([0, 127, 255, 127, 0, 0, 7, 127], dtype=torch.int64)[torch.randperm(8, generator=g)]

    def index_of(start, stop):
        o0, o1, o2 = torch.meshgrid(torch.arange(start, stop), torch.arange(rows + pad), torch.arange(cols),
                                    indexing="ij")
        src = o0 * rows * cols + ((o1 + 2) % rows) * cols + o2
        return torch.where(o1 < rows, src, -1 - fills[o2])

    plan, y = _run(h, index_of, (e, rows + pad, cols), x, fill=None)
    assert plan[0] == "table" and plan[3] is not None
    index = index_of(0, e)
    want = torch.where(index >= 0, x[index.clamp(min=0)], (-1 - index).to(torch.uint8))
    assert torch.equal(y, want)
    zeros, y0 = _run(h, lambda start, stop: torch.where(index_of(start, stop) >= 0, index_of(start, stop), -1),
                     (e, rows + pad, cols), x, fill=None)
    assert zeros[5] is None and torch.equal(y0, torch.where(index >= 0, want, 0))  # every fill byte 0: no values


@pytest.mark.slow  # compiles aiter_mxfp4: seconds
def test_aiter_scales_take_a_run_plan_and_equal_eager():
    spec = _spec("aiter_mxfp4")
    assert "-1 - ((" in spec.source  # the scales' index carries their fill bytes
    dims = {"E": 2, "I": 256, "H": 512}
    x = synthetic_inputs(spec, dims, seed=3)
    spec.module._RUN_PLANS.clear()
    got = spec.convert(x, lowering="gather", fingerprint=False)
    assert_same_bits(got, spec.convert(x, lowering="eager", fingerprint=False))
    planned = {k[0]: v for k, v in spec.module._RUN_PLANS.items() if k[1:4] == (2, 256, 512)}
    for name in ("_gather_w13_weight_scale_1", "_gather_w2_weight_scale_3"):
        # a table, or where the SIMD kernel runs and nothing is padding at these dims, its plan of the same runs
        assert planned[name] is not None and planned[name][0] in ("table", "simd"), name


@pytest.mark.parametrize("seed", range(6))
def test_expert_zero_tables_moved_per_expert_equal_the_whole_map(seed):
    """Where every expert reads itself alike, the table is expert 0's, moved by e strides at the end (int32
    where it fits, fill runs read 0): the same plan and bytes as the map evaluated over every expert (the
    moved int64 starts of every expert cost Marlin's first call seconds)."""
    h = _helpers()
    rnd = random.Random(seed)
    e, rows, cols = rnd.randint(1, 4), rnd.randint(1, 6), rnd.choice([1, 2, 4, 8])
    stride = rows * cols + rnd.choice([0, 0, 1])  # an input expert may be longer than it is read
    x = torch.randint(0, 256, (e * stride,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    perm = torch.randperm(rows * cols, generator=torch.Generator().manual_seed(seed)).view(rows, cols)
    fills = torch.tensor([-1, -1 - rnd.choice([0, 9])])[torch.randint(0, 2, (rows, cols))]
    pad = torch.rand(rows, cols, generator=torch.Generator().manual_seed(seed)) < 0.3

    def index_of(start, stop):
        o0 = torch.arange(start, stop).view(-1, 1, 1)
        return torch.where(pad, fills, perm + o0 * stride)

    whole, y = _run(h, index_of, (e, rows, cols), x, fill=None)
    moved, y0 = _run(h, index_of, (e, rows, cols), x, fill=None, stride=stride)
    assert whole[0] == moved[0] and torch.equal(y, y0)
    if whole[0] == "table":
        assert whole[1] == moved[1] and whole[4] == moved[4] and torch.equal(whole[2], moved[2])
        for a, b in ((whole[3], moved[3]), (whole[5], moved[5])):
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


def test_a_run_plan_of_an_unknown_kind_raises():
    # _run_gather takes the kinds _run_plan makes; anything else is an error, never unpacked as a table
    flat = torch.arange(8, dtype=torch.uint8)
    with pytest.raises(ValueError, match="unknown kind: 'rows'"):
        runs._run_gather(flat, ("rows", 2, torch.tensor([0], dtype=torch.int32), None, True, None), (2,), 0)


@pytest.mark.parametrize("offset", [0, 1])
def test_runs_that_join_into_long_spans_copy_span_by_span(offset):
    """A swap of whole halves (per expert, its runs a row each) is a table of rows by its runs; on the CPU its
    rows join into two spans an expert, copied as such: bit for bit the element gather, aligned or not, the
    experts' tables moved or the whole map; a source shorter than the spans reach raises."""
    h = _helpers()
    h["_RUN_SPAN_BYTES"] = 64  # this test's spans: 3 rows of 8 int32
    e, rows, cols = 3, 6, 8
    base = torch.randint(-2**31, 2**31 - 1, (offset + e * rows * cols,), dtype=torch.int64).to(torch.int32)
    x = base[offset:]

    def index_of(start, stop):
        o0, o1, o2 = torch.meshgrid(torch.arange(start, stop), torch.arange(rows), torch.arange(cols), indexing="ij")
        return o0 * rows * cols + ((o1 + 3) % rows) * cols + o2

    want = _element_gather(x, index_of(0, e), 0)
    for stride in (None, rows * cols):
        plan, y = _run(h, (lambda s, t: index_of(0, 1)) if stride else index_of, (e, rows, cols), x, stride=stride)
        assert plan[0] == "spans" and plan[1][2].tolist() == [3 * cols] * (2 * e)
        assert torch.equal(y, want)
    with pytest.raises(IndexError, match="reads 144 elements of an input of 143"):
        h["_run_gather"](x[:-1], plan, (e, rows, cols), 0)
    h["_RUN_SPAN_BYTES"] = 4 * 3 * cols + 1  # spans a byte shorter than asked: the table of rows
    plan, y = _run(h, index_of, (e, rows, cols), x)
    assert plan[0] == "table" and torch.equal(y, want)
    h["_RUN_SPAN_BYTES"] = 64

    def moved(start, stop):  # the same swap read 3 elements on: runs that start off their rows (element offsets)
        return index_of(start, stop) + 3

    longer = torch.cat([x, x[:3]])
    plan, y = _run(h, moved, (e, rows, cols), longer)
    assert plan[0] == "spans" and plan[1][0][0] == 3 * cols + 3
    assert torch.equal(y, _element_gather(longer, moved(0, e), 0))
    with pytest.raises(ValueError, match="spans plan of 144 elements for an output of 143"):
        h["_run_gather"](longer, plan, (143,), 0)


def test_a_shipped_swap_of_halves_takes_spans_and_equals_eager():
    # flashinfer_cutlass_mxfp8's w13 weights (swap_halves on dim 1): spans at a layer's size (here made small by
    # lowering the span threshold), the same bits as the eager reference
    spec = _spec("flashinfer_cutlass_mxfp8")
    x = synthetic_inputs(spec, {"E": 2, "I": 128, "H": 256}, seed=5)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(spec.module, "_RUN_SPAN_BYTES", 1024)
        spec.module._RUN_PLANS.clear()
        got = spec.convert(x, lowering="gather")
        plans = {k[0]: v for k, v in spec.module._RUN_PLANS.items()}
        spec.module._RUN_PLANS.clear()
    assert plans["_gather_w13_weight_0"][0] == "spans"
    assert_same_bits(got, spec.convert(x, lowering="eager"), "cutlass_mxfp8")
