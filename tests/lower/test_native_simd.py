"""The SIMD kernel of the words and quads plans (layoutc.lower.native_simd, LLVM IR for AVX-512 VBMI): the plans' bits.

Driven from the text converters carry (the namespace of ``test_native``): the kernel against its definition written
in torch here (random chunk tables, padding, offsets per block and expert, nibble tables, 1-3 threads, OpenMP and
Python threads), the chunk tables against the element gather of random byte tables, the nibble tables against the
byte tables they stand for, words and quads plans against the torch forms, and shipped specs against the eager
lowering. Where the host is x86-64 with AVX-512 VBMI and llvmlite imports (the CPU machine and CI), the tests fail
if the kernel is not built, rather than skip.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layoutc.convert.synthckpt import synthetic_inputs
from tests.helpers import assert_same_bits, cpu_flags
from tests.helpers import spec as _spec

pytest.importorskip("numba")
from tests.lower.test_native import _element_gather, _namespace  # noqa: E402


@pytest.fixture(scope="module")
def ns():
    try:
        import llvmlite.binding  # noqa: F401
    except ImportError:
        pytest.skip("llvmlite is not installed (the kernel's compiler)")
    if not {"avx512f", "avx512bw", "avx512vbmi"} <= cpu_flags():
        pytest.skip("this CPU has no AVX-512 VBMI")
    namespace = _namespace(True)
    for luts in (True, False):
        assert namespace["_nx_kernel"](luts) is not None, "x86-64 with AVX-512 VBMI and llvmlite, but no SIMD kernel"
    return namespace


@pytest.fixture(autouse=True, scope="module")
def _simd_on():
    with pytest.MonkeyPatch.context() as m:
        m.delenv("LAYOUTC_SIMD", raising=False)
        yield


def _definition(src, gidx, perm, zm, outer, shift, copies, tabs):
    # The kernel's output by its definition, in torch (int64 arithmetic): for expert e, block k, chunk c, the 16,
    # 32 or 64 words src[gidx[c] + outer[k] + e * shift], byte perm[c, i] of their bytes at byte i (0 where bit i of
    # zm[c]), then each word's byte b as tabs[2b][low nibble] ^ tabs[2b + 1][high nibble], OR'd over b.
    blocks, chunks = outer.numel(), gidx.shape[0]
    offsets = (torch.arange(copies).view(-1, 1) * shift + outer.view(1, -1)).view(copies, blocks, 1, 1)
    lanes = gidx.shape[1]
    words = src[(gidx.to(torch.int64).view(1, 1, chunks, lanes) + offsets)]  # [copies, blocks, chunks, lanes]
    data = words.contiguous().view(torch.uint8).view(copies, blocks, chunks, 4 * lanes)
    picked = torch.gather(data, 3, perm.to(torch.int64).view(1, 1, chunks, 64).expand(copies, blocks, chunks, 64))
    padding = ((zm.view(-1, 1) >> torch.arange(64)) & 1).bool().view(1, 1, chunks, 64)
    picked = torch.where(padding, 0, picked).contiguous()
    w = picked.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    if not isinstance(tabs, str):
        t = tabs.to(torch.int64) & 0xFFFFFFFF
        y = 0
        for b in range(4):
            y = y | (t[2 * b][(w >> (8 * b)) & 15] ^ t[2 * b + 1][(w >> (8 * b + 4)) & 15])
        w = y
    return torch.where(w >= 2**31, w - 2**32, w).to(torch.int32).reshape(-1)


#: the nibble tables the kernel's tests draw: none, any (eight VPERMD), every byte alike (two VPSHUFB), linear maps of
#: few bit moves (masked shifts)
LOOKUPS = ("identity", "nibbles", "bytes", "shifts")


def _tables(g, kind):
    # Random nibble tables ([8, 16] int32, _nx_tables' form) of one kind of LOOKUPS, built from the kind's own
    # description (not by _nx_lookup): "bytes" from two random 16-byte tables; "shifts" from a constant and 1-6 random
    # moves, word = C ^ XOR_j (w << s_j) & M_j, as the images of each nibble's values
    if kind == "identity":
        return "identity"
    if kind == "nibbles":
        return torch.randint(-2**31, 2**31 - 1, (8, 16), generator=g, dtype=torch.int32)
    n = torch.arange(16, dtype=torch.int64)
    if kind == "bytes":
        low, high = torch.randint(0, 256, (2, 16), generator=g, dtype=torch.int64)
        rows = [t << (8 * b) for b in range(4) for t in (low, high)]
    else:  # each output bit one input bit's, moved by one of the shifts, or 0 (a bit permutation of few moves, the
        # input's bits flipped first): each input bit's image at most one bit, so the bytes' images never overlap
        masks = {}
        while not masks:  # at least one bit moved (with none, all tables are zeros: the bytes form)
            shifts = (torch.randperm(63, generator=g)[:int(torch.randint(1, 7, (1,), generator=g))] - 31).tolist()
            used = set()
            for o in torch.randperm(32, generator=g).tolist():
                free = [s_ for s_ in shifts if 0 <= o - s_ < 32 and o - s_ not in used]
                if free and int(torch.randint(0, 8, (1,), generator=g)):
                    s_ = free[int(torch.randint(0, len(free), (1,), generator=g))]
                    masks[s_] = masks.get(s_, 0) | 1 << o
                    used.add(o - s_)
        constant = int(torch.randint(0, 2**32, (1,), generator=g, dtype=torch.int64))

        def image(w):  # the linear part of the map, of int64 words
            y = torch.zeros_like(w)
            for s_, m in masks.items():
                y ^= ((w << s_) if s_ >= 0 else (w >> -s_)) & m & 0xFFFFFFFF
            return y

        flips = torch.tensor([(constant >> (8 * b) & 0xFF) << (8 * b) for b in range(4)])
        rows = [image(n << (4 * p)) ^ (image(flips[p // 2]) if p % 2 == 0 else 0)
                for p in range(8)]  # bits flipped, then moved (as _nb_luts: each byte's constant in its table 2b)
    t = torch.stack(rows)
    return torch.where(t >= 2**31, t - 2**32, t).to(torch.int32)


def _form(ns, tabs):
    # the lookup form the kernel's key holds for these tables (None: none)
    return None if isinstance(tabs, str) else ns["_nx_lookup"](tabs)[0]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), chunks=st.integers(1, 4), blocks=st.integers(1, 5), copies=st.integers(1, 3),
       luts=st.sampled_from(LOOKUPS), threads=st.integers(1, 3), openmp=st.booleans(),
       gathers=st.sampled_from([1, 2, 4]))
def test_the_kernel_equals_its_definition(ns, seed, chunks, blocks, copies, luts, threads, openmp, gathers):
    g = torch.Generator().manual_seed(seed)
    span = 40
    gidx = torch.randint(0, span, (chunks, 16 * gathers), generator=g, dtype=torch.int32)
    perm = torch.randint(0, 64 * gathers, (chunks, 64), generator=g, dtype=torch.uint8)
    zm = torch.randint(-2**62, 2**62, (chunks,), generator=g, dtype=torch.int64) & (
        torch.randint(-2**62, 2**62, (chunks,), generator=g, dtype=torch.int64))  # about a quarter padding
    outer = torch.randint(0, 30, (blocks,), generator=g, dtype=torch.int64)
    shift = 70
    src = torch.randint(-2**31, 2**31 - 1, (shift * (copies - 1) + 30 + span,), generator=g, dtype=torch.int32)
    tabs = _tables(g, luts)
    chunk_tables = (gidx, perm, zm, (int(gidx.min()), int(gidx.max())))
    out = torch.full((copies * blocks * chunks * 16,), 7, dtype=torch.int32)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch, "get_num_threads", lambda: threads)
        m.setitem(ns, "_NX_MIN_SPLIT", 1)  # these small calls in parts too
        gomp = ns["_nb_gomp"]() if openmp else None  # None: the calling thread and Python threads
        assert ns["_nx_run"](src, chunk_tables, outer, shift, copies, tabs, out, gomp)
    assert torch.equal(out, _definition(src, gidx, perm, zm, outer, shift, copies, tabs))


def _against_definition(ns, g, gidx, outer, copies, luts, threads, stream=True, holes=True, out=None):
    # The kernel over random source words, byte orders, padding (where `holes`) and nibble tables for these chunk
    # words and block offsets, on `threads` threads in parts of any size, every output large enough to stream where
    # `stream`; asserted equal to the definition. Returns whether its stores could be streamed (64-byte aligned).
    chunks, lanes = gidx.shape
    perm = torch.randint(0, 4 * lanes, (chunks, 64), generator=g, dtype=torch.uint8)
    zm = (torch.randint(-2**62, 2**62, (chunks,), generator=g, dtype=torch.int64) & (
        torch.randint(-2**62, 2**62, (chunks,), generator=g, dtype=torch.int64))) if holes else torch.zeros(
        chunks, dtype=torch.int64)  # about a quarter padding
    shift = int(gidx.max()) + int(outer.max()) + 1  # an expert's words past the one before's
    src = torch.randint(-2**31, 2**31 - 1, (shift * copies,), generator=g, dtype=torch.int32)
    tabs = _tables(g, luts)
    out = torch.full((copies * outer.numel() * chunks * 16,), 7, dtype=torch.int32) if out is None else out
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch, "get_num_threads", lambda: threads)
        m.setitem(ns, "_NX_MIN_SPLIT", 1)
        m.setitem(ns, "_NX_STREAM_BYTES", 1 if stream else 2**62)
        assert ns["_nx_run"](src, (gidx, perm, zm, (int(gidx.min()), int(gidx.max()))), outer, shift, copies, tabs,
                             out, ns["_nb_gomp"]())
    assert torch.equal(out, _definition(src, gidx, perm, zm, outer, shift, copies, tabs))
    return stream and out.data_ptr() % 64 == 0, _form(ns, tabs)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), chunks=st.integers(1, 4), blocks=st.integers(1, 19), copies=st.integers(1, 3),
       luts=st.sampled_from(LOOKUPS), threads=st.integers(1, 3), gathers=st.sampled_from([1, 2, 4]), near=st.booleans(),
       misaligned=st.booleans())
def test_pairs_shared_lines_and_streamed_stores_equal_the_definition(ns, seed, chunks, blocks, copies, luts, threads,
                                                                       gathers, near, misaligned):
    # The kernel's other forms: every chunk's words in pairs (eight-byte gathers), blocks a line apart (groups of
    # _NX_SHARED_GROUP) or far apart, and outputs stored past the caches unless not aligned to 64 bytes. Each call's
    # kernel is looked up in the state to show which form ran.
    g = torch.Generator().manual_seed(seed)
    first = torch.randint(0, 39, (chunks, 8 * gathers), generator=g, dtype=torch.int32)
    gidx = torch.stack([first, first + 1], dim=2).reshape(chunks, 16 * gathers).contiguous()
    outer = torch.arange(blocks) * (2 if near else 20)  # words: less than a line apart, or more
    words = copies * blocks * chunks * 16
    store = torch.full((words + 16,), 7, dtype=torch.int32)
    at = (16 - store.data_ptr() // 4 % 16) % 16 + (1 if misaligned else 0)  # 64-byte aligned, or one word past it
    streamed, form = _against_definition(ns, g, gidx, outer, copies, luts, threads, out=store[at: at + words])
    group = ns["_NX_SHARED_GROUP"] if near and blocks > 1 else ns["_NX_GROUP"]
    assert streamed != misaligned
    assert ("nx", form, ns["_NX_AHEAD"], gathers, group, True, streamed) in ns["_NX_STATE"]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), chunks=st.integers(1, 12), groups=st.integers(1, 3), copies=st.integers(1, 3),
       luts=st.sampled_from(LOOKUPS), threads=st.integers(1, 3), stream=st.booleans(), holes=st.booleans(),
       piece=st.sampled_from([2, 4]))
def test_the_tile_form_equals_the_definition(ns, seed, chunks, groups, copies, luts, threads, stream, holes, piece):
    # Marlin's pattern (piece 2): blocks in groups of 8 at a group's offset + 0, 2, .., 14 words, each chunk 8 pairs
    # of words (lanes 2i, 2i + 1) anywhere in the source: the 8 blocks' pairs i are one run of 16 words, loaded
    # whole and transposed. W4A8's (piece 4): chunks of 4 quads, a group two tiles of 4 blocks (blocks t, t + 2,
    # t + 4, t + 6 at tile t's offset + 0, 4, 8, 12). Offsets at random (not a line apart), padding at random,
    # chunks past `ahead` (prefetches into the next group's offsets); the tile kernel is the one that ran.
    g = torch.Generator().manual_seed(seed)
    runs = 16 // piece
    first = torch.randint(0, 300, (chunks, runs, 1), generator=g, dtype=torch.int32)
    gidx = (first + torch.arange(piece, dtype=torch.int32)).reshape(chunks, 16).contiguous()
    starts = torch.randint(0, 100, (groups, 1, 8 // runs), generator=g) * 3  # any word, not only a line's first
    outer = (starts + (torch.arange(runs) * piece).view(1, -1, 1)).reshape(-1)  # [group, j, tile]
    streamed, form = _against_definition(ns, g, gidx, outer, copies, luts, threads, stream, holes)
    assert streamed == stream  # torch's CPU allocations are 64-byte aligned: the streamed form's alignment
    assert ("nx", form, ns["_NX_AHEAD"], 1, 8, True, stream, "tile", piece) in ns["_NX_STATE"]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), chunks=st.integers(1, 12), blocks=st.integers(1, 9), copies=st.integers(1, 3),
       luts=st.sampled_from(LOOKUPS), threads=st.integers(1, 3), stream=st.booleans(), run=st.sampled_from([4, 8, 16]))
def test_loads_of_runs_equal_the_definition(ns, seed, chunks, blocks, copies, luts, threads, stream, run):
    # Hopper's pattern (runs of 8 words: 32 bytes of each of two rows), and runs of 4 and 16: every chunk's 16
    # lanes are runs of `run` consecutive words starting anywhere (not aligned); the blocks far apart (no tile):
    # one vector load a run instead of a gather, the kernel of that form the one that ran
    g = torch.Generator().manual_seed(seed)
    first = torch.randint(0, 300, (chunks, 16 // run, 1), generator=g, dtype=torch.int32)
    gidx = (first + torch.arange(run, dtype=torch.int32)).reshape(chunks, 16).contiguous()
    outer = torch.randperm(blocks, generator=g) * 37  # words, more than a line apart
    streamed, form = _against_definition(ns, g, gidx, outer, copies, luts, threads, stream)
    assert ("nx", form, ns["_NX_AHEAD"], 1, ns["_NX_GROUP"], True, streamed, "runs", run) in ns["_NX_STATE"]


def test_the_columns_network_transposes_a_16_by_8_matrix(ns):
    # register p holds rows 2p, 2p + 1 (slot 8h + c: M[2p + h][c]); after the three rounds register c holds column c
    regs = [[(2 * p + slot // 8, slot % 8) for slot in range(16)] for p in range(8)]
    rounds = ns["_nx_cols_network"]()
    assert [len(r) for r in rounds] == [8, 8, 8]
    for shuffles in rounds:
        regs = [[(regs[low] + regs[high])[i] for i in picks] for _, low, high, picks in sorted(shuffles)]
    assert regs == [[(r, c) for r in range(16)] for c in range(8)]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), groups=st.integers(1, 4), blocks=st.integers(1, 9), copies=st.integers(1, 3),
       luts=st.sampled_from(LOOKUPS), threads=st.integers(1, 3), stream=st.booleans(), holes=st.booleans())
def test_the_columns_form_equals_the_definition(ns, seed, groups, blocks, copies, luts, threads, stream, holes):
    # GPTQ's pattern: chunks in groups of 8, chunk j reading the group's first's words + j, whose lanes are two spans
    # of 8 words 8 apart, anywhere (not aligned); blocks anywhere; the columns kernel the one that ran
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, 400, (groups, 1, 2, 1), generator=g, dtype=torch.int32)
    first = starts + 8 * torch.arange(8, dtype=torch.int32)  # [group, 1, span, 8]
    gidx = (first + torch.arange(8, dtype=torch.int32).view(1, 8, 1, 1)).reshape(groups * 8, 16).contiguous()
    outer = torch.randint(0, 300, (blocks,), generator=g)
    streamed, form = _against_definition(ns, g, gidx, outer, copies, luts, threads, stream, holes)
    group = ns["_nx_group"](outer)
    assert ("nx", form, ns["_NX_AHEAD"], 1, group, False, streamed, "cols") in ns["_NX_STATE"]


def test_the_columns_form_is_taken_only_for_its_pattern(ns):
    lanes = torch.cat([torch.arange(8) * 8, 2048 + torch.arange(8) * 8]).to(torch.int32)
    gptq = (lanes.view(1, 16) + torch.arange(8, dtype=torch.int32).view(8, 1)).contiguous()
    assert ns["_nx_columns"](gptq) and ns["_nx_columns"](torch.cat([gptq, gptq + 64]))
    assert not ns["_nx_columns"](gptq[:7])  # not whole groups
    assert not ns["_nx_columns"](gptq.flip(0).contiguous())  # chunk j not the first's words + j
    assert not ns["_nx_columns"]((lanes.view(1, 16) * 2 + torch.arange(8, dtype=torch.int32).view(8, 1)).contiguous())
    with pytest.raises(ValueError, match="columns form"):
        ns["_nx_kernel"](True, 1, 4, True, False, 0, 4, True)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), q=st.integers(1, 3), share=st.sampled_from([2, 4, 8]), d=st.integers(2, 5),
       blocks=st.integers(1, 6), copies=st.integers(1, 3), luts=st.sampled_from(LOOKUPS), threads=st.integers(1, 3),
       gathers=st.sampled_from([1, 2, 4]))
def test_shared_gathers_equal_the_definition(ns, seed, q, share, d, blocks, copies, luts, threads, gathers):
    # A byte transpose's pattern: chunks c + s d (s < share) read chunk c's words for every c with (c // d) % share
    # == 0, each with its own byte order and padding; the words at random otherwise; the shared kernel ran
    g = torch.Generator().manual_seed(seed)
    lead = torch.randint(0, 200, (q, 1, d, 16 * gathers), generator=g, dtype=torch.int32)
    gidx = lead.expand(q, share, d, 16 * gathers).reshape(-1, 16 * gathers).contiguous()
    outer = torch.randint(0, 100, (blocks,), generator=g)
    _against_definition(ns, g, gidx, outer, copies, luts, threads)
    found = ns["_nx_shared"](gidx)
    assert found == (share, d) or (share == 2 and found[1] == d)
    kernels = [k for k in ns["_NX_STATE"] if isinstance(k, tuple) and k[:1] == ("nx",) and "share" in k]
    assert any(k[k.index("share") + 1:] == found for k in kernels)


def test_shared_gathers_are_taken_only_for_their_pattern(ns):
    rows = torch.randint(0, 99, (2, 1, 3, 16), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    assert ns["_nx_shared"](rows.expand(2, 4, 3, 16).reshape(-1, 16).contiguous()) == (4, 3)
    assert ns["_nx_shared"](rows.expand(2, 4, 3, 16).reshape(-1, 16)[:20].contiguous()) is None  # not whole
    consecutive = rows[:, :, :1].expand(2, 4, 1, 16).reshape(-1, 16).contiguous()
    assert ns["_nx_shared"](consecutive) is None  # D = 1: below _NX_SHARE_LEAST_D
    ns["_NX_SHARE_LEAST_D"], least = 1, ns["_NX_SHARE_LEAST_D"]
    try:
        assert ns["_nx_shared"](consecutive) == (4, 1)  # the same pattern where the constant allows D = 1
    finally:
        ns["_NX_SHARE_LEAST_D"] = least
    assert ns["_nx_shared"](torch.arange(64, dtype=torch.int32).view(4, 16)) is None  # nothing shared
    with pytest.raises(ValueError, match="shares gathers"):
        ns["_nx_kernel"](False, 4, 4, False, False, 0, 0, False, (3, 2))


def test_the_tile_form_is_taken_only_for_its_pattern(ns):
    rows = torch.arange(8, dtype=torch.int32).view(8, 1) * 256
    pairs = (rows + torch.tensor([0, 1], dtype=torch.int32)).reshape(1, 16)  # 8 pairs from 8 rows
    quads = (rows[:4] + torch.arange(4, dtype=torch.int32)).reshape(1, 16)  # 4 quads from 4 rows
    w4a8 = torch.tensor([0, 262144, 4, 262148, 8, 262152, 12, 262156])
    assert ns["_nx_tiled"](torch.arange(128) * 2, pairs) == 2  # Marlin's weights
    assert ns["_nx_tiled"](torch.cat([torch.arange(0, 16, 2) + 5, torch.arange(0, 16, 2) + 900]), pairs) == 2
    assert ns["_nx_tiled"](w4a8, quads) == 4  # W4A8's: two tiles of 4
    assert ns["_nx_tiled"](torch.arange(12) * 2, pairs) == 0  # not whole groups
    assert ns["_nx_tiled"](torch.arange(8) * 4, pairs) == 0  # pairs 4 words apart
    assert ns["_nx_tiled"](w4a8, pairs) == 0
    assert ns["_nx_tiled"](torch.arange(8) * 3, quads) == 0  # blocks 3 words apart
    with pytest.raises(ValueError, match="tile form"):
        ns["_nx_kernel"](True, 2, 8, True, False, 2)
    with pytest.raises(ValueError, match="tile form"):
        ns["_nx_kernel"](True, 1, 8, True, False, 3)
    with pytest.raises(ValueError, match="loads of runs"):
        ns["_nx_kernel"](True, 1, 4, True, False, 0, 2)
    assert ns["_nx_runs_of"](quads, 4) and not ns["_nx_runs_of"](quads, 8) and not ns["_nx_runs_of"](pairs, 4)


def test_groups_are_larger_where_blocks_read_the_same_lines(ns):
    assert ns["_nx_group"](torch.arange(128) * 2) == ns["_NX_SHARED_GROUP"] == 8  # Marlin's columns of a line
    assert ns["_nx_group"](torch.tensor([0, 262144, 4, 262148, 8, 262152, 12, 262156])) == 8  # W4A8's
    assert ns["_nx_group"](torch.arange(128) * 4096) == ns["_NX_GROUP"] == 4  # hopper's: a block's own rows
    assert ns["_nx_group"](torch.tensor([0, 16, 32, 48])) == 4  # a line apart: nothing shared
    assert ns["_nx_group"](torch.tensor([5])) == 4


def _byte_table(g, chunks, span, holes):
    # a block's source bytes: each 16 bytes of output the 16 bytes of 4 source words in a random order (so at most
    # 16 words a 64-byte chunk), -1 where padding
    parts = []
    for _ in range(chunks * 4):
        start = 4 * int(torch.randint(0, (span - 16) // 4, (1,), generator=g))  # 4 whole words
        part = start + torch.randperm(16, generator=g)
        if holes:
            part[torch.rand(16, generator=g) < 0.25] = -1
        parts.append(part)
    return torch.cat(parts)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), chunks=st.integers(1, 6), blocks=st.integers(1, 4), holes=st.booleans())
def test_chunk_tables_gather_every_byte_of_a_table(ns, seed, chunks, blocks, holes):
    g = torch.Generator().manual_seed(seed)
    span = 400
    inner = _byte_table(g, chunks, span, holes)
    found = ns["_nx_chunks"](inner)
    assert found is not None
    outer = torch.arange(blocks) * 8  # words
    flat = torch.randint(0, 256, (span + 32 * blocks,), generator=g, dtype=torch.uint8)
    out = torch.empty(blocks * inner.numel() // 4, dtype=torch.int32)
    assert ns["_nx_run"](flat.view(torch.int32), found, outer, 0, 1, "identity", out, None)
    index = (inner.view(1, -1) + torch.where(inner < 0, 0, 4 * outer.view(-1, 1))).reshape(-1)
    assert torch.equal(out.view(torch.uint8), _element_gather(flat, index, 0))


def test_chunks_take_as_many_gathers_as_their_widest_chunk_and_none_past_the_limits(ns):
    for words, lanes in ((1, 16), (16, 16), (17, 32), (32, 32), (33, 64), (64, 64)):
        i = torch.arange(64)
        table = torch.cat([(i % words) * 4 + i // words % 4, i])  # a chunk of `words` words, then one of 16
        found = ns["_nx_chunks"](table)
        assert found is not None and found[0].shape == (2, lanes), (words, lanes)
    assert ns["_nx_chunks"](torch.arange(63)) is None  # not whole chunks
    assert ns["_nx_chunks"](torch.full((64,), -1)) is None  # all padding
    assert ns["_nx_chunks"](torch.arange(ns["_NX_MOST_TABLE"] + 64)) is None
    assert ns["_nx_chunks"](torch.arange(64) + 4 * 2**31) is None  # a word past int32
    assert ns["_nx_chunks"](torch.arange(ns["_NX_MOST_TABLE"])) is not None


@settings(max_examples=25, deadline=None)
@given(table=st.permutations(range(32)), flip=st.integers(0, 2**32 - 1))
def test_nibble_tables_stand_for_bit_permutations_and_bit_flips(ns, table, flip):
    # A bit permutation then a bitwise XOR (a conversion acting on each bit alone): the nibble tables give every
    # byte table's images, as the kernel combines them
    conv = (lambda w, f=flip: w ^ torch.tensor(f, dtype=torch.int64).to(torch.int32)) if flip else None
    luts = ns["_nb_luts"](tuple(table), conv)
    tabs = ns["_nx_tables"](luts)
    v = torch.arange(256)
    if tabs == "identity":
        assert table == list(range(32)) and not flip
        return
    assert tabs is not None
    t = tabs.to(torch.int64) & 0xFFFFFFFF
    for b in range(4):
        assert torch.equal(t[2 * b][v & 15] ^ t[2 * b + 1][v >> 4], luts[b].to(torch.int64) & 0xFFFFFFFF)


def test_identity_tables_skip_the_lookups_and_other_conversions_are_none(ns):
    assert ns["_nx_tables"](ns["_nb_luts"](tuple(range(32)))) == "identity"
    square = ns["_nb_luts"](tuple(range(32)), lambda w: w * w)  # not a sum of its nibbles' images
    assert ns["_nx_tables"](square) is None


def _apply(tabs, w):
    # the nibble tables' map of int64 words w (0 .. 2**32 - 1), as the kernel's definition combines them
    t = tabs.to(torch.int64) & 0xFFFFFFFF
    y = torch.zeros_like(w)
    for b in range(4):  # OR of the bytes' images, each the XOR of its nibbles'
        y |= t[2 * b][(w >> (8 * b)) & 15] ^ t[2 * b + 1][(w >> (8 * b + 4)) & 15]
    return y


def _run_form(form, operand, w):
    # a lookup form of _nx_lookup written out in torch from its own description (int64 words)
    if form == "bytes":
        low = (operand[0].to(torch.int64) & 0xFFFFFFFF).view(-1)[:4]
        high = (operand[1].to(torch.int64) & 0xFFFFFFFF).view(-1)[:4]
        lo_t = [(int(low[j // 4]) >> (8 * (j % 4))) & 255 for j in range(16)]
        hi_t = [(int(high[j // 4]) >> (8 * (j % 4))) & 255 for j in range(16)]
        lo_t, hi_t = torch.tensor(lo_t), torch.tensor(hi_t)
        return sum((lo_t[(w >> (8 * b)) & 15] ^ hi_t[(w >> (8 * b + 4)) & 15]) << (8 * b) for b in range(4))
    rows = (operand.to(torch.int64) & 0xFFFFFFFF)[:, 0].tolist()
    y = torch.full_like(w, rows[-1])
    for s_, m in zip(form[1:], rows):
        y ^= ((w << s_) if s_ >= 0 else (w >> -s_)) & m & 0xFFFFFFFF
    return y


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), kind=st.sampled_from(LOOKUPS[1:]))
def test_the_lookup_forms_stand_for_their_tables(ns, seed, kind):
    # _nx_lookup's form and operand, written out from their description, map every word as the nibble tables do;
    # tables of each kind get their own form (random tables the nibbles, unless by chance)
    g = torch.Generator().manual_seed(seed)
    tabs = _tables(g, kind)
    form, operand = ns["_nx_lookup"](tabs)
    w = torch.randint(0, 2**32, (4096,), generator=g, dtype=torch.int64)
    if kind == "bytes":
        assert form == "bytes" and operand.shape == (2, 16)
    if kind == "shifts":
        assert form[0] == "shifts" and 1 <= len(form) - 1 <= ns["_NX_MOST_SHIFTS"]
    if form == "nibbles":
        assert torch.equal(operand, tabs)
    else:
        assert torch.equal(_run_form(form, operand, w), _apply(tabs, w))


def _words_of_tables(rows):
    # [8, 16] int32 nibble tables of int64 rows
    t = torch.stack([torch.as_tensor(r, dtype=torch.int64) & 0xFFFFFFFF for r in rows])
    return torch.where(t >= 2**31, t - 2**32, t).to(torch.int32)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), apart=st.booleans())
def test_linear_maps_with_constants_anywhere_take_shifts_only_where_exact(ns, seed, apart):
    # Linear maps of few moves where an input bit may set several output bits and an output bit sum several input
    # bits, each table's image of 0 (its constant) anything. `apart`: each output bit belongs to one byte of the
    # input, whose bits alone (and whose tables' constants) may set it: the shifts form is taken and maps every word
    # as the tables do; else the bytes' images may overlap (the tables OR them) and the nibble tables stay
    g = torch.Generator().manual_seed(seed)
    shifts = (torch.randperm(63, generator=g)[:int(torch.randint(1, 7, (1,), generator=g))] - 31).tolist()
    owner = torch.randint(0, 4, (32,), generator=g).tolist()  # output bit o: the input byte that may set it
    images = []
    for i in range(32):  # input bit i: a random choice of its moves
        image = 0
        for s_ in shifts:
            o = i + s_
            if 0 <= o < 32 and (owner[o] == i // 8 or not apart) and int(torch.randint(0, 3, (1,), generator=g)) < 2:
                image |= 1 << o
        images.append(image)
    constants = torch.randint(0, 2**32, (8,), generator=g, dtype=torch.int64).tolist()
    if apart:
        constants = [c & sum(1 << o for o in range(32) if owner[o] == p // 2) for p, c in enumerate(constants)]
    rows = [[constants[p] ^ _xor([images[4 * p + b] for b in range(4) if v >> b & 1]) for v in range(16)]
            for p in range(8)]
    tabs = _words_of_tables(rows)
    form, operand = ns["_nx_lookup"](tabs)
    w = torch.randint(0, 2**32, (4096,), generator=g, dtype=torch.int64)
    if form != "nibbles":
        assert torch.equal(_run_form(form, operand, w), _apply(tabs, w))
    support = [0] * 4
    for p, row in enumerate(rows):
        for value in row:
            support[p // 2] |= value
    if any(support[a] & support[b] for a in range(4) for b in range(a)):
        assert form == "nibbles"
    elif any(images):
        assert form != "nibbles"  # the shifts (or, by chance, the bytes form)


def _xor(values):
    y = 0
    for v in values:
        y ^= v
    return y


def test_the_shipped_tables_take_the_cheap_forms(ns):
    # Marlin's nibble moves (the interleave of every Marlin spec's weights): three masked shifts; CUTLASS W4A8's value
    # map of every nibble: two byte lookups; a bit permutation of many distances (the SM90 interleave's: 17) stays
    # with the nibble tables, as do maps whose bytes' images overlap; constants in any table count
    marlin = ns["_nx_tables"](ns["_nb_luts"]((0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27, 4, 5, 6, 7, 20,
                                             21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31)))  # marlin_nvfp4's words
    assert ns["_nx_lookup"](marlin)[0] == ("shifts", -12, 0, 12)
    value = (8, 15, 14, 13, 12, 11, 10, 9, 0, 1, 2, 3, 4, 5, 6, 7)  # a nibble value map, as W4A8's two composed
    luts = torch.tensor([[(value[v & 15] | value[v >> 4] << 4) << (8 * b) for v in range(256)] for b in range(4)])
    luts = torch.where(luts >= 2**31, luts - 2**32, luts).to(torch.int32)
    assert ns["_nx_lookup"](ns["_nx_tables"](luts))[0] == "bytes"
    n = torch.arange(16, dtype=torch.int64)
    identity = [(n << (4 * (p % 2))) << (8 * (p // 2)) for p in range(8)]
    flipped = [r.clone() for r in identity]
    flipped[1] ^= 0x10  # a constant in byte 0's high nibble's table: bit 4 of every word flipped
    form, operand = ns["_nx_lookup"](_words_of_tables(flipped))
    w = torch.randint(0, 2**32, (4096,), generator=torch.Generator().manual_seed(1), dtype=torch.int64)
    assert form == ("shifts", 0) and torch.equal(_run_form(form, operand, w), w ^ 0x10)
    spread = torch.randperm(32, generator=torch.Generator().manual_seed(2)).tolist()  # bit i -> bit spread[i]
    rows = [[sum(1 << spread[4 * p + b] for b in range(4) if v >> b & 1) for v in range(16)] for p in range(8)]
    assert len({spread[i] - i for i in range(32)}) > ns["_NX_MOST_SHIFTS"]
    assert ns["_nx_lookup"](_words_of_tables(rows))[0] == "nibbles"
    overlap = [r.clone() for r in identity]
    overlap[2] = overlap[2] | (n & 1)  # byte 1's low nibble's bit 0 also sets bit 0 (byte 0's): OR is not XOR
    assert ns["_nx_lookup"](_words_of_tables(overlap))[0] == "nibbles"
    with pytest.raises(ValueError, match="lookup form"):
        ns["_nx_kernel"]("squares")
    for bad in (("shifts", 32), ("shifts", 0, 0), ("shifts",), ("shifts", 1.0)):
        with pytest.raises(ValueError, match="lookup form"):
            ns["_nx_kernel"](bad)
    with pytest.raises(ValueError, match="8, 16"):
        ns["_nx_lookup"](torch.zeros(2, 16, dtype=torch.int32))


def test_byte_tables_are_a_tensor_or_identity(ns):
    found = ns["_nx_chunks"](torch.arange(64))
    with pytest.raises(ValueError, match="identity"):
        ns["_nx_run"](torch.arange(16, dtype=torch.int32), found, torch.tensor([0]), 0, 1, "none",
                      torch.empty(16, dtype=torch.int32), None)


def test_a_block_that_reads_past_its_input_raises_before_any_write(ns):
    inner = torch.arange(64)
    found = ns["_nx_chunks"](inner)
    src = torch.arange(16, dtype=torch.int32)
    out = torch.full((32,), 7, dtype=torch.int32)
    with pytest.raises(IndexError, match="outside its input"):
        ns["_nx_run"](src, found, torch.tensor([0, 1]), 0, 1, "identity", out, None)  # block 1: words 1..16 of 16
    assert out[16:].tolist() == [7] * 16  # the block that failed wrote nothing
    with pytest.raises(IndexError):
        ns["_nx_run"](src, found, torch.tensor([-1]), 0, 1, "identity", out[:16], None)


def _counting(ns, m):
    # the kernel's runs in ns from here (m: a MonkeyPatch), each True where it ran
    ran = []
    run = ns["_nx_run"]
    m.setitem(ns, "_nx_run", lambda *a: ran.append(run(*a)) or ran[-1])
    return ran


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), table=st.permutations(range(32)), blocks=st.integers(1, 4),
       experts=st.integers(1, 3), holes=st.booleans())
def test_words_plans_take_the_kernel_and_equal_their_definition(ns, seed, table, blocks, experts, holes):
    g = torch.Generator().manual_seed(seed)
    inner = _byte_table(g, 4, 200, holes).to(torch.int32)  # 256-byte blocks
    per_expert = 64 * (blocks + 4)
    outer = (torch.arange(blocks, dtype=torch.int32) * 16)
    flat = torch.randint(0, 256, (per_expert * experts,), generator=g, dtype=torch.uint8)
    plan = ("native", inner, outer, 8, experts, per_expert)
    shape = (experts * blocks * 64,)
    with pytest.MonkeyPatch.context() as m:
        ran = _counting(ns, m)
        got = ns["_nb_words"](flat, plan, shape, tuple(table))
    assert ran == [True]
    assert torch.equal(got, _words_reference(flat, plan, table))


def _words_reference(flat, plan, table):
    # the words plan's definition: output byte i of expert e is flat[inner[i % block] + outer[i // block] + e * shift]
    # (0 where padding), each word's bits permuted by table (output bit i: input bit table[i])
    _, inner, outer, ps, experts, shift = plan
    block = 1 << ps
    index = (inner.to(torch.int64).view(1, 1, -1) + outer.to(torch.int64).view(1, -1, 1)
             + (torch.arange(experts) * shift).view(-1, 1, 1))
    index = torch.where(inner.view(1, 1, -1) < 0, -1, index).reshape(-1)
    assert block == inner.numel()
    data = _element_gather(flat, index, 0).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    bits = sum(((data >> s) & 1) << i for i, s in enumerate(table))
    return torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), table=st.permutations(range(32)), rows=st.integers(1, 6),
       quads=st.sampled_from([4, 8, 12]), step=st.integers(1, 5))
def test_quads_plans_take_the_kernel_and_equal_the_numba_kernel(ns, seed, table, rows, quads, step):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(-2**31, 2**31 - 1, (4000,), generator=g, dtype=torch.int32)
    first = torch.randint(0, 1000, (1, 4), generator=g)
    index = (first + (torch.arange(rows) * 300).view(-1, 1)).to(torch.int32)
    with pytest.MonkeyPatch.context() as m:
        ran = _counting(ns, m)
        got = ns["_nb_quads"](src, index, quads, step, None, tuple(table), (rows * quads * 4,))
        assert ran == [True]
        m.setenv("LAYOUTC_SIMD", "0")
        want = ns["_nb_quads"](src, index, quads, step, None, tuple(table), (rows * quads * 4,))
        assert ran == [True]  # the numba kernel this time
    assert torch.equal(got, want)


def test_the_switch_leaves_the_numba_kernels(ns, monkeypatch):
    monkeypatch.setenv("LAYOUTC_SIMD", "0")
    assert ns["_nx_kernel"](True) is None and ns["_nx_kernel"](False) is None
    monkeypatch.delenv("LAYOUTC_SIMD")
    assert ns["_nx_kernel"](True) is not None


@pytest.mark.parametrize("name, dims", [("flashinfer_cutlass_bf16", {"E": 2, "I": 128, "H": 256}),
                                        ("flashinfer_cutlass_mxfp4_padded", {"E": 2, "I": 128, "H": 256}),
                                        ("marlin_nvfp4", {"E": 2, "I": 256, "H": 512}),
                                        ("marlin_gptq_int4", {"E": 2, "I": 256, "H": 512}),
                                        ("triton_kernels_mxfp4_hopper", {"E": 2, "I": 128, "H": 256}),
                                        ("vllm_cutlass_w4a8", {"E": 2, "I": 256, "H": 256})])
def test_shipped_specs_take_the_kernel_and_equal_eager(ns, monkeypatch, name, dims):
    spec = _spec(name)
    x = synthetic_inputs(spec, dims, seed=13)
    want = spec.convert(x, lowering="eager", fingerprint=False)
    ran = []
    run = spec.module._nx_run
    monkeypatch.setattr(spec.module, "_nx_run", lambda *a: ran.append(run(*a)) or ran[-1])
    assert_same_bits(spec.convert(x, lowering="gather", fingerprint=False), want, name)
    assert True in ran, name


def _shuffle_map(g, per, runs, src_runs):
    # a map of `per` outputs in runs of g elements, run r reading source run src_runs[r] (a permutation: each read)
    def index_of(start, stop):
        o0 = torch.arange(start, stop).view(-1, 1, 1)
        r = torch.arange(runs).view(1, -1, 1)
        j = torch.arange(g).view(1, 1, -1)
        return (o0 * per + src_runs[r] * g + j).reshape(stop - start, per)
    return index_of


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), g=st.sampled_from([1, 2, 4, 8]), itemsize=st.sampled_from([1, 2]),
       experts=st.integers(1, 3), offset=st.integers(0, 3))
def test_short_runs_on_the_cpu_take_a_simd_plan_equal_to_the_element_gather(ns, seed, g, itemsize, experts, offset):
    if g * itemsize > ns["_RUN_SIMD_BYTES"]:
        return
    dtype = {1: torch.uint8, 2: torch.int16}[itemsize]
    gen = torch.Generator().manual_seed(seed)
    per = 4096 // itemsize  # elements an expert: whole 64-byte chunks
    runs = per // g
    index_of = _shuffle_map(g, per, runs, torch.randperm(runs, generator=gen))
    base = torch.randint(0, 2**8 if itemsize == 1 else 2**15, (experts * per + offset,), generator=gen).to(dtype)
    flat = base[offset:]  # at any storage offset: the kernel's words then come from a padded copy
    want = _element_gather(flat, index_of(0, experts).reshape(-1), 0).view(experts, per)
    for simd in ("1", "0"):
        with pytest.MonkeyPatch.context() as m:
            m.setenv("LAYOUTC_SIMD", simd)
            ns["_RUN_PLANS"].clear()
            plan = ns["_run_plan"](("t", experts), lambda s, e: index_of(0, 1) if e else index_of(s, e), (),
                                   (experts, per), itemsize, per)
            ran = _counting(ns, m)
            got = ns["_run_gather"](flat, plan, (experts, per), 0)
        assert plan[0] == ("simd" if simd == "1" else "table")
        assert ran == ([True] if simd == "1" else [])
        assert torch.equal(got, want)


def test_runs_with_padding_or_longer_than_the_limit_keep_their_table(ns):
    per, g = 1024, 1
    index_of = _shuffle_map(g, per, per, torch.randperm(per))
    padded = lambda s, e: torch.where(torch.arange(per) % 7 == 0, -1, index_of(s, e))  # noqa: E731
    ns["_RUN_PLANS"].clear()
    assert ns["_run_plan"](("p",), padded, (), (1, per), 1, None)[0] == "table"
    long_runs = _shuffle_map(16, per, per // 16, torch.randperm(per // 16))
    assert ns["_run_plan"](("l",), long_runs, (), (1, per), 1, None)[0] == "table"


def test_a_simd_plan_met_with_the_kernel_switched_off_says_so(ns, monkeypatch):
    per = 1024
    index_of = _shuffle_map(1, per, per, torch.randperm(per))
    ns["_RUN_PLANS"].clear()
    plan = ns["_run_plan"](("s",), index_of, (), (1, per), 1, None)
    assert plan[0] == "simd"
    monkeypatch.setenv("LAYOUTC_SIMD", "0")
    with pytest.raises(RuntimeError, match="LAYOUTC_SIMD=0"):
        ns["_run_gather"](torch.zeros(per, dtype=torch.uint8), plan, (1, per), 0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.sampled_from([0, 1, 63, 64, 65, 1000, 4096 + 17]), offset=st.integers(0, 3),
       threads=st.integers(1, 3), openmp=st.booleans(), part=st.sampled_from([64, 128, 1 << 18]))
def test_the_byte_lookup_equals_indexing_its_table(ns, seed, n, offset, threads, openmp, part):
    # every whole 64-byte chunk by the kernel (in parts of `part` bytes on 1-3 threads), any rest by index_select;
    # the source at any storage offset (unaligned loads), the table's both halves used
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n + offset,), generator=g, dtype=torch.uint8)[offset:]
    lut = torch.randint(0, 256, (256,), generator=g, dtype=torch.uint8)
    out = torch.full((n,), 7, dtype=torch.uint8)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch, "get_num_threads", lambda: threads)
        m.setitem(ns, "_NX_LUT_PART", part)
        assert ns["_nx_lut8"](x, lut, out, ns["_nb_gomp"]() if openmp else None)
    assert torch.equal(out, lut[x.to(torch.int64)])


def test_one_byte_value_conversions_take_the_byte_lookup_and_equal_eager(ns, monkeypatch):
    # marlin_nvfp4's FP8 scales: cast through float16 and back, 256 values once, then the lookup per byte
    spec = _spec("marlin_nvfp4")
    x = synthetic_inputs(spec, {"E": 2, "I": 256, "H": 512}, seed=5)
    want = spec.convert(x, lowering="eager", fingerprint=False)
    ran = []
    lookup = spec.module._nx_lut8
    monkeypatch.setattr(spec.module, "_nx_lut8", lambda *a: ran.append(lookup(*a)) or ran[-1])
    assert_same_bits(spec.convert(x, lowering="gather", fingerprint=False), want, "marlin_nvfp4")
    assert True in ran
    with pytest.raises(AssertionError, match="byte lookup"):
        ns["_nx_lut8"](torch.zeros(4, dtype=torch.uint8), torch.zeros(255, dtype=torch.uint8),
                       torch.zeros(4, dtype=torch.uint8), None)


# (spec, the check that picks a form, what its calls must show): at the benchmark's K (2048; narrower rows give
# the planner other blocks), every check's calls as (arguments, result)
SHIPPED_FORMS = [
    ("marlin_mxfp4", "_nx_tiled", lambda calls: [r for _, r in calls].count(2) == 2),  # both weights: pairs
    ("marlin_nvfp4", "_nx_tiled", lambda calls: [r for _, r in calls].count(2) == 2),
    ("vllm_cutlass_w4a8", "_nx_tiled", lambda calls: [r for _, r in calls].count(4) == 2),  # quads
    ("triton_kernels_mxfp4_hopper", "_nx_runs_of", lambda calls: any(a[1] == 8 and r for a, r in calls)),
    ("marlin_gptq_int4", "_nx_columns", lambda calls: [r for _, r in calls].count(True) == 2),
    ("marlin_mxfp4", "_nx_shared", lambda calls: sum(r is not None and r[0] == 4 for _, r in calls) == 2),  # scales
    ("marlin_nvfp4", "_nx_shared", lambda calls: sum(r is not None and r[0] == 4 for _, r in calls) == 2),
]


@pytest.mark.parametrize("name, check, shows", SHIPPED_FORMS, ids=[f"{n}-{c}" for n, c, _ in SHIPPED_FORMS])
def test_shipped_specs_take_their_forms_and_equal_eager(ns, monkeypatch, name, check, shows):
    spec = _spec(name)
    x = synthetic_inputs(spec, {"E": 1, "I": 1024, "H": 2048}, seed=3)
    want = spec.convert(x, lowering="eager", fingerprint=False)
    monkeypatch.setitem(spec.module._NX_STATE, "nx forms", {})  # found again here (a cached plan may hold it)
    calls = []
    real = getattr(spec.module, check)
    monkeypatch.setattr(spec.module, check, lambda *a: calls.append((a, real(*a))) or calls[-1][1])
    assert_same_bits(spec.convert(x, lowering="gather", fingerprint=False), want, name)
    assert shows(calls), [r for _, r in calls]
