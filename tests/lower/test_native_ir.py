"""The native kernels as LLVM IR of our own (layoutc.lower.native_ir) equal the numba kernels, the torch forms and the
element gather bit for bit.

The data-driven tests of ``test_native.py`` run here again with the IR kernels on (``LAYOUTC_NATIVE_IR=1``; the SIMD
kernel off): the same words plans, block tables of quads and pairs, SM90 quads with unread words, reads past the
input, value lookups, and the shipped specs that take the kernels against the eager lowering. Then what is the IR
kernels' own: every element type an array may have, parts on threads, an empty array, a negative step, and a first
call that imports no numba.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layoutc.lower import native_ir
from tests.lower.test_native import (  # noqa: F401  (collected here again, with the IR kernels on)
    _kernel_ran, native_ns, test_a_per_quad_index_of_rows_at_a_step_runs_as_those_rows,
    test_a_table_that_reads_past_its_input_raises_and_reads_nothing,
    test_block_periodic_tables_are_one_block_and_offsets, test_one_byte_images_by_the_native_lookup,
    test_quads_equal_the_transpose_then_the_permutation,
    test_shipped_specs_take_the_native_kernels_and_equal_eager, test_value_conversions_of_bytes_by_a_lookup,
    test_word_groups_equal_the_per_byte_kernel_and_the_reference,
    test_words_gather_and_permutation_fused_equal_the_torch_form)

pytestmark = pytest.mark.skipif(not native_ir._ni_on(), reason="llvmlite or an x86-64 host missing")


@pytest.fixture(autouse=True, scope="module")
def _ir_kernels_on():
    with pytest.MonkeyPatch.context() as m:
        m.setenv("LAYOUTC_SIMD", "0")
        m.setenv("LAYOUTC_NATIVE_IR", "1")
        yield


def _quads_reference(src, rows, quads, step, unread, luts):
    # the quads kernel's definition, one word at a time
    out = []
    for r in range(rows.shape[0]):
        for q in range(quads):
            words = [0 if unread.size and unread[r, b] else int(src[rows[r, b] + q * step]) & 0xFFFFFFFF
                     for b in range(4)]
            for j in range(4):
                v = 0
                for b in range(4):
                    v |= int(luts[b, (words[b] >> (8 * j)) & 255]) & 0xFFFFFFFF
                out.append(v)
    return out


@given(seed=st.integers(0, 2**16), rows_type=st.sampled_from(["<i4", "<i8"]), masked=st.booleans(),
       threads=st.sampled_from([1, 2, 3]), omp=st.booleans())
@settings(max_examples=16, deadline=None)
def test_quads_for_each_index_type_on_any_threads(seed, rows_type, masked, threads, omp):
    # threads > 1: one OpenMP region of torch's runtime, or (omp False) the calling thread and Python threads
    g = np.random.default_rng(seed)
    src = g.integers(-2**31, 2**31, 64, dtype=np.int64).astype(np.int32)
    quads, step = 3, int(g.integers(-4, 5))
    lo, hi = max(0, -2 * step), 64 - max(0, 2 * step)
    rows = g.integers(lo, hi, (7, 4)).astype(np.dtype(rows_type))
    unread = (g.random((7, 4)) < 0.3).astype(np.uint8) if masked else np.zeros((0, 4), dtype=np.uint8)
    luts = g.integers(-2**31, 2**31, (4, 256), dtype=np.int64).astype(np.int32)
    out = np.full(7 * quads * 4, 7, dtype=np.int32)
    with pytest.MonkeyPatch.context() as m:
        if not omp:
            m.setattr(native_ir, "_fp_gomp", lambda: None)
        assert not native_ir._ni_run("quads", (src, rows, quads, step, unread, luts, out), 7, threads)
    assert [int(v) & 0xFFFFFFFF for v in out] == _quads_reference(src, rows, quads, step, unread, luts)


def test_a_negative_step_past_the_end_fails_before_reading():
    # a row of 2 quads at step -4 from word 5 of 4 reads words 5 and 1: outside at its first quad, not its last
    src, luts = np.arange(4, dtype=np.int32), np.zeros((4, 256), dtype=np.int32)
    out = np.zeros(8, dtype=np.int32)
    rows = np.array([[5, 5, 5, 5]], dtype=np.int32)
    assert native_ir._ni_run("quads", (src, rows, 2, -4, np.zeros((0, 4), np.uint8), luts, out), 1, 1)
    assert not out.any()


def test_empty_arrays_and_empty_ranges():
    luts = np.zeros((4, 256), dtype=np.int32)
    out = np.zeros(0, dtype=np.int32)
    empty = np.zeros((0, 4), dtype=np.int32)
    assert not native_ir._ni_run("quads", (np.zeros(0, np.int32), empty, 2, 1, np.zeros((0, 4), np.uint8), luts, out),
                                 0, 1)
    # padding only (every inner entry negative) from an empty source: luts[b, 0] a byte, no read
    inner = np.full(8, -1, dtype=np.int32)
    luts[:, 0] = [1, 1 << 8, 1 << 16, 1 << 24]
    words = np.zeros(2, dtype=np.int32)
    assert not native_ir._ni_run("words", (np.zeros(0, np.uint8), inner, np.zeros(1, np.int32), 62, 0, 1, luts, words),
                                 2, 1)
    assert words.tolist() == [0x01010101, 0x01010101]


def test_an_array_of_another_type_is_refused():
    with pytest.raises(TypeError, match="does not take"):
        native_ir._ni_run("lut8", (np.zeros(4, np.float32), np.zeros(256, np.uint8), np.zeros(4, np.uint8)), 4, 1)
    with pytest.raises(TypeError, match="takes 3 arguments"):
        native_ir._ni_run("lut8", (np.zeros(4, np.uint8),), 4, 1)


def test_the_ir_is_made_from_names_and_types_alone():
    # the same text for the same kernel and types; every kernel of every table's types compiles
    types = {"src": "<i4", "qsrc": "<i8", "qdst": "<i4", "span": "<i8", "outer": "<i8", "order": "<i8", "luts": "<i4",
             "out": "<i4"}
    assert native_ir._ni_ir("wquads", types) == native_ir._ni_ir("wquads", dict(types))
    for name, t in (("words", {"src": "|u1", "inner": "<i8", "outer": "<i4", "luts": "<i4", "out": "<i4"}),
                    ("wpairs", types), ("lut8", {"src": "|u1", "lut": "|u1", "out": "|u1"})):
        native_ir._fp_jit(*native_ir._NI_STATE["host"], native_ir._ni_ir(name, t))


@pytest.mark.slow  # a process imports torch and converts a layer
def test_a_first_call_imports_no_numba(tmp_path):
    from tests.helpers import spec as _spec
    from layoutc.convert.synthckpt import synthetic_inputs

    spec = _spec("marlin_mxfp4")
    spec.write(tmp_path / "conv.py")
    torch.save(synthetic_inputs(spec, {"E": 2, "I": 256, "H": 512}, seed=1), tmp_path / "x.pt")
    code = ("import sys, importlib.util, torch; s = importlib.util.spec_from_file_location('c', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); m.convert(torch.load(sys.argv[2])); "
            "print('numba' in sys.modules, any(k[0] == 'wquads' for k in m._NI_STATE if isinstance(k, tuple)), "
            "m._nx_on())")
    env = {k: v for k, v in os.environ.items() if k not in ("LAYOUTC_NATIVE_IR", "LAYOUTC_SIMD", "PYTHONPATH")}
    for simd in ("0", "1"):  # the SIMD kernel (where the CPU has AVX-512 VBMI) takes the plans it can: no numba either
        run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "conv.py"), str(tmp_path / "x.pt")],
                             capture_output=True, text=True, env={**env, "LAYOUTC_SIMD": simd})
        assert run.returncode == 0, run.stderr
        numba_loaded, ir_ran, simd_on = run.stdout.split()
        assert numba_loaded == "False" and (ir_ran == "True" or simd_on == "True"), run.stdout


def _groups_reference(src, qsrc, qdst, outer, copies, shift, luts, width):
    # the quads (width 4) and pairs (width 2) kernels' definition, one word at a time, blocks in their own order
    nq, blocks = qsrc.shape[0], outer.shape[0]
    out = [None] * (copies * blocks * width * nq)
    for e in range(copies):
        for k in range(blocks):
            off = int(outer[k]) + e * shift
            for q in range(nq):
                words = [int(src[int(qsrc[q, b]) + off]) & 0xFFFFFFFF for b in range(width)]
                for j in range(width):
                    if width == 4:
                        v = 0
                        for b in range(4):
                            v |= int(luts[b, (words[b] >> (8 * j)) & 255]) & 0xFFFFFFFF
                    else:
                        v = int(luts[0, (words[0] >> (16 * j)) & 65535]) | int(luts[1, (words[1] >> (16 * j)) & 65535])
                    out[(e * blocks + k) * width * nq + int(qdst[q, j])] = v & 0xFFFFFFFF
    return out


def _groups_case(seed, width, blocks, group):
    g = np.random.default_rng(seed)
    nq, copies = 3, int(g.integers(1, 3))
    src = g.integers(-2**31, 2**31, 200, dtype=np.int64).astype(np.int32)
    qsrc = g.integers(0, 40, (nq, width)).astype(np.int64)
    qdst = g.permutation(nq * width).reshape(nq, width).astype(np.int32)
    outer = g.integers(0, 100, blocks).astype(np.int64)
    span = np.array([qsrc.min(), qsrc.max()], dtype=np.int64)
    luts = g.integers(-2**31, 2**31, (4, 256) if width == 4 else (2, 65536), dtype=np.int64).astype(np.int32)
    order = g.permutation(blocks).astype(np.int64)
    out = np.full(copies * blocks * width * nq, 7, dtype=np.int32)
    args = (src, qsrc, qdst, span, outer, order, group, 50, copies, luts, out)
    return args, _groups_reference(src, qsrc, qdst, outer, copies, 50, luts, width)


@given(seed=st.integers(0, 2**16), width=st.sampled_from([2, 4]), blocks=st.integers(0, 40),
       group=st.sampled_from([1, 3, 8, 16]), threads=st.sampled_from([1, 2]))
@settings(max_examples=24, deadline=None)
def test_blocks_in_any_order_and_group_write_the_same_words(seed, width, blocks, group, threads):
    # `order` and `group` set the order of the reads only: any permutation of the blocks, any group (whole groups,
    # then the rest one by one; at most blocks / threads a group), the same output as the definition's block order
    args, expected = _groups_case(seed, width, blocks, group)
    assert not native_ir._ni_run("wquads" if width == 4 else "wpairs", args, blocks, threads)
    assert [int(v) & 0xFFFFFFFF for v in args[-1]] == expected


def test_whole_groups_and_a_rest_on_two_threads():
    for width in (2, 4):  # 19 blocks in groups of 8 on 2 threads: groups of 8, 1 and the rest one by one
        args, expected = _groups_case(5, width, 19, 8)
        assert not native_ir._ni_run("wquads" if width == 4 else "wpairs", args, 19, 2)
        assert [int(v) & 0xFFFFFFFF for v in args[-1]] == expected


def test_an_order_that_is_not_a_permutation_or_a_group_out_of_range_is_refused():
    args, _ = _groups_case(1, 4, 19, 8)
    for order in (args[5][:-1], np.zeros(19, np.int64), np.arange(1, 20, dtype=np.int64)):
        with pytest.raises(TypeError, match="every block once"):
            native_ir._ni_run("wquads", args[:5] + (np.ascontiguousarray(order),) + args[6:], 19, 1)
    for group in (0, -1, native_ir._NI_MOST_GROUP + 1):
        with pytest.raises(ValueError, match="groups of 1 to"):
            native_ir._ni_run("wquads", args[:6] + (group,) + args[7:], 19, 1)


def test_two_converters_of_the_same_kernels_compile_them_once(tmp_path):
    # each converter carries its own copy of the kernels' code; the machine code of one IR text is made once a process
    import importlib.util

    import llvmlite.binding as llvm

    from tests.helpers import spec as _spec
    from layoutc.convert.synthckpt import synthetic_inputs

    spec = _spec("marlin_mxfp4")
    x = synthetic_inputs(spec, {"E": 2, "I": 256, "H": 512}, seed=3)
    mods = []
    for name in ("conv_a", "conv_b"):
        spec.write(tmp_path / f"{name}.py")
        found = importlib.util.spec_from_file_location(name, tmp_path / f"{name}.py")
        mods.append(importlib.util.module_from_spec(found))
        found.loader.exec_module(mods[-1])
    outs = [m.convert(x) for m in mods]
    assert all(torch.equal(outs[0][k].view(torch.uint8), outs[1][k].view(torch.uint8)) for k in outs[0])
    engines = [{k: v[0] for k, v in m._NI_STATE.items() if isinstance(k, tuple) and k[0] == "wquads"} for m in mods]
    assert engines[0] and engines[0].keys() == engines[1].keys()
    assert all(engines[0][k] is engines[1][k] for k in engines[0])  # the same engine, not a second compile
    assert any("ni_body" in k[0] for k in llvm.__dict__["_layoutc_engines_v1"])


def test_blocks_that_share_lines_go_in_groups_sorted_by_offset(native_ns):
    order_of = native_ns["_ni_block_order"]
    marlin = torch.arange(128, dtype=torch.int32) * 8  # 8 bytes a block of each row: 8 blocks a line
    order, group = order_of(marlin, True)
    assert order.tolist() == list(range(128)) and group == 8
    w4a8 = torch.stack([torch.arange(64) * 16, torch.arange(64) * 16 + (1 << 20)], 1).reshape(-1)  # 0, 1 MiB, 16, ...
    order, group = order_of(w4a8, True)
    assert group == 4 and w4a8[torch.from_numpy(order)].tolist() == sorted(w4a8.tolist())
    assert sorted(order.tolist()) == list(range(128))
    assert order_of(w4a8, False)[1] == 1 and order_of(w4a8, False)[0].tolist() == list(range(128))  # pairs: one by one
    apart = torch.arange(16, dtype=torch.int64).flip(0) * 16384  # blocks of their own lines: as they are
    assert order_of(apart, True)[0].tolist() == list(range(16)) and order_of(apart, True)[1] == 1
    assert order_of(torch.zeros(1, dtype=torch.int32), True)[1] == 1
    assert order_of(torch.tensor([0, 1, 2, 3]), True)[1] == native_ir._NI_MOST_GROUP  # at most 16 a group
