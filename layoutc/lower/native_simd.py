"""A SIMD kernel of our own for the words and quads plans and short runs on the CPU: LLVM IR for AVX-512 VBMI.

The numba kernels (:mod:`layoutc.lower.native`) spend ~17 cycles on a quad of Marlin's weights (16 output bytes):
table, source and lookup loads one byte at a time; ``index_select`` of a run table one lookup a run. Here a plan is
taken in a form found from its tables once (:func:`_nx_chunks`): a block's output in 64-byte chunks, each the bytes
of at most 16, 32 or 64 source words (Marlin's and triton_kernels hopper's quads, CUTLASS W4A8's pairs, the SM90
quads of a row: :func:`_nx_quads_table`; byte transposes of scales: a word a byte). A chunk is one, two or four
512-bit gathers of its words, a byte permute that puts their bytes in output order (VPERMB, VPERMI2B, or two of
those and a blend; a mask zeroes padding), and, where the plan's byte tables change bytes, eight VPERMD lookups of
16-entry tables: each byte table must be the XOR of its two nibbles' images (:func:`_nx_tables` checks all 256
values; bit permutations are, with or without bits flipped), or the cheaper lookup form :func:`_nx_lookup` finds
in those tables (two VPSHUFB where every byte maps alike, masked shifts where the map moves bits by few distances).
Each chunk first prefetches the words of the chunk
``_NX_AHEAD`` on: the gathers alone did not start the hardware's prefetch; blocks go in groups of ``_NX_GROUP``,
chunk by chunk (blocks of a group often read the same lines), of ``_NX_SHARED_GROUP`` where blocks less than a line
apart surely do (:func:`_nx_group`). Where every chunk's words come in pairs (two consecutive words: all the shipped
plans but GPTQ's), a gather is of eight 8-byte pairs (half the loads); outputs of ``_NX_STREAM_BYTES`` or more are
stored past the caches. Forms that load instead of gathering, each taken where the plan's tables have its
pattern (:mod:`layoutc.lower.simd_forms` holds their IR): the tile form (:func:`_nx_tiled`: Marlin's and W4A8's
weights, whose 8 or 4 neighbouring blocks read pieces of the same rows' lines) loads each chunk's runs of 16 words
whole and transposes them in registers; the columns form (:func:`_nx_columns`: GPTQ's weights, 8 chunks' words at
a stride of 8) loads two spans of 64 words and transposes 16 x 8 words; chunks of runs of 4, 8 or 16 words
(hopper's) load each run. And where chunks D apart gather the same words (:func:`_nx_shared`: byte transposes of
scales, whose 4 output rows take bytes 0-3 of one word), one gather serves them all. Kernel calls took 0.43-0.67x
the numba kernels' time on the 2-core CPU machine, whole calls of the specs with such plans 0.60-0.71x, before the
later forms; with them, default calls 0.47-0.85x of that (BENCHMARKS.md has both). One more kernel: the byte
lookup of one-byte value conversions (:func:`_nx_lut8`: the 256-byte table in four registers, two VPERMI2B a
64-byte step; 2 MB in 0.04 ms where numba's took 0.54).

The IR is written from values of this module and of a plan's form (whether byte tables apply, the chunks ahead,
the gathers a chunk, the blocks a group, pairs, streamed stores, a tile's piece, runs, columns, shared S and D)
and compiled in the process by llvmlite's LLVM
(numba's own dependency; ``_fp_jit`` of :mod:`layoutc.runtime.cpu_kernels`, never cached on disk), where llvmlite
imports and the host is x86-64 with AVX-512 F, BW and VBMI; ``LAYOUTC_SIMD=0`` (read per call) turns it off. The
kernel checks every block's reads (its least and largest word, moved by its offset) against the source before the
block reads any; a call that would read outside raises. Copied into converters with :mod:`layoutc.lower.native`
(``torch_emit.native_source``); ``tests/lower/test_native_simd.py`` holds it to its definition, to the numba
kernels, to the element gather and to the eager lowering.
"""

# not copied into converters (torch_emit.native_source copies what follows `import torch`): they carry
# layoutc.runtime.cpu_kernels whole
import ctypes

from ..runtime.cpu_kernels import _fp_jit, _fp_llvm, _fp_run_job
from .simd_forms import _nx_body_ir, _nx_check_group, _nx_cols_ir, _nx_head, _nx_lookup_ir, _nx_tile_ir
import torch

#: ("nx", lookup, ahead, gathers, group, pairs, stream[, "tile", piece][, "runs", n][, "cols"][, "share", S, D]): a
#: compiled kernel; "nl": the byte lookup; "host": llvmlite and the host's features (None: it does not run here);
#: memo tables by kind ("nx forms": each plan's form)
_NX_STATE = {}
_NX_MIN_SPLIT = 1 << 16  # words of output under which a call runs on the calling thread alone
_NX_PARTS_PER_THREAD = 8  # parts a thread takes in turn (a slowed thread takes fewer)
#: chunks ahead whose source words are prefetched: without it the kernel took 1.0-1.5x the numba kernels' time on
#: the large layers (its gathers do not start the hardware's prefetch), with it 0.5-0.7x; 2-16 ahead all helped
_NX_AHEAD = 8
#: blocks a group, taken chunk by chunk together: 0.63-0.88x the time of one block at a time on W4A8's, Marlin's and
#: the SM90 quads' weights, 0.77-1.07x on hopper's (2-core CPU machine; 2 and 8 between; BENCHMARKS.md)
_NX_GROUP = 4
#: blocks a group where blocks of a group of this many read the same lines (two blocks' offsets less than a line
#: apart: Marlin's 8 columns of a row's line, W4A8's 4): each line fetched is read by all of them before it leaves L1
#: (Marlin's and W4A8's weights 0.75-0.85x of groups of 4; hopper's, whose blocks share nothing, 1.1x)
_NX_SHARED_GROUP = 8
#: output bytes from which the kernel stores with non-temporal stores (the output is written once and read later, by
#: the fingerprint or a copy: storing it past the caches saves reading each line before it is written and keeps the
#: source's lines in them; default calls 0.79-0.94x on the seven specs with such plans, BENCHMARKS.md's toggles; an
#: output no larger than a core's L2 is left in the caches, where the fingerprint reads it next)
_NX_STREAM_BYTES = 1 << 21
#: the least chunk distance D at which chunks that read the same words share their gathers (_nx_shared). Not D = 1
#: (consecutive chunks, whose words the gathers find in L1 anyway): hopper's scales took 0.59x the time shared in the
#: kernel alone, but whole calls of hopper and AITER 0.95-1.03x, within their noise (1.0-1.5x in an earlier
#: measure); Marlin's scales, D = 32, 0.47-0.65x (BENCHMARKS.md)
_NX_SHARE_LEAST_D = 2

#: host features the SIMD kernel needs (LLVM's names): 512-bit gathers, byte and dword permutes (VPERMB: VBMI)
_NX_NEEDS = ("avx512f", "avx512bw", "avx512vbmi")
_NX_MOST_TABLE = 1 << 16  # bytes of a block's table past which its chunk tables (2.1 bytes an output byte) stay off


def _nx_ir(luts, ahead, gathers, group, pairs=False, stream=False, runs=0, share=None):
    # LLVM IR (x86-64, AVX-512 VBMI) of a words plan in chunks of 16 output words: nx_blocks(...) writes blocks
    # [lo, hi) of every expert; block k of expert e reads the source words gidx[c, l] + outer[k] + e * shift of its
    # chunk c (l < 16 * gathers: `gathers` 512-bit gathers), puts byte perm[c, i] of the gathered ones at output
    # byte i (VPERMB of one register, VPERMI2B of two, two of those and a blend for four: perm's low 6, 7 or 8
    # bits pick it; 0 where bit i of zm[c] is set: padding) and, where `luts` (a lookup form of _nx_lookup; True:
    # "nibbles"), maps each word through the plan's byte tables: in nibbles, byte b of a word is y_b = A_b[low
    # nibble] ^ B_b[high nibble] (two VPERMD of 16-entry tables, tabs[2b], tabs[2b + 1]), the word OR_b y_b; the
    # other forms as _nx_lookup says, tabs then their operand. Returns 1 where a block's reads (its least and largest
    # word, slo and shi, moved by its offset) fall outside the nw source words, before it reads any; else 0. Blocks
    # go in groups of `group`, chunk by chunk: chunk c of each block of the group, then chunk c + 1. Each block's
    # chunk first prefetches the words of its chunk `ahead` on (past the block's end: the block a group on), an
    # address of checked words, never read (a prefetch does not fault). Where `pairs` (every chunk's words come in
    # pairs, lane 2j + 1 the word after lane 2j's), each gather is one of 8 eight-byte pairs (VPGATHERDQ: half the
    # loads; the same bytes in the same places) and only even lanes' words are prefetched. Where `stream`, output
    # chunks are stored past the caches (non-temporal, the output aligned to 64 bytes: _nx_run checks). Where `runs`
    # (4, 8 or 16; one gather a chunk), every chunk's lanes are runs of that many consecutive words: each run is one
    # vector load (16, 32 or 64 bytes) instead of its lanes' share of a gather, the loads put side by side, and
    # only a run's first word is prefetched. Where `share` = (S, D), chunks c + s D (s < S) read the same words as
    # chunk c for every c with (c // D) % S == 0 (a byte transpose's output rows that read bytes of the same words:
    # one gather a word for 4 bytes): the loop takes those leads only, each block gathers once and permutes, looks up
    # and stores its S chunks.
    # nx_body(job): parts of job[3] blocks from an atomic counter (job[0]) while below job[2]; job[1] set where a
    # part failed; job[4:] nx_blocks' arguments src .. shi, as int64.
    v, b = "<16 x i32>", "<64 x i8>"
    lines = _nx_head(luts, [f"declare {v} @llvm.x86.avx512.mask.gather.dpi.512({v}, i8*, {v}, <16 x i1>, i32)",
                            f"declare {b} @llvm.x86.avx512.permvar.qi.512({b}, {b})",
                            f"declare {b} @llvm.x86.avx512.vpermi2var.qi.512({b}, {b}, {b})",
                            f"declare {v} @llvm.x86.avx512.permvar.si.512({v}, {v})",
                            "declare <8 x i64> @llvm.x86.avx512.mask.gather.dpq.512(<8 x i64>, i8*, <8 x i32>, "
                            "<8 x i1>, i32)"],
                     ["  %all = bitcast i16 -1 to <16 x i1>", "  %all8 = bitcast i8 -1 to <8 x i1>",
                      "  %words = mul i64 %chunks, 16", f"  %leads = udiv i64 %chunks, {share[0] if share else 1}"])
    lines += ["khead:", "  %k = phi i64 [%lo, %kpre], [%kend, %cnext.done]", "  %kmore = icmp slt i64 %k, %hi",
              "  br i1 %kmore, label %kgroup, label %elatch",
              # a group of `group` blocks: every block's reads checked, then chunk by chunk, block by block (the
              # blocks of a group often read the same lines: Marlin's 8 consecutive blocks share each line)
              "kgroup:", f"  %kg0 = add i64 %k, {group}", "  %kover = icmp sgt i64 %kg0, %hi",
              "  %kend = select i1 %kover, i64 %hi, i64 %kg0", *_nx_check_group(),
              "chunk.pre:", "  br label %chunk",
              "chunk:", "  %li = phi i64 [0, %chunk.pre], [%li1, %cnext]",
              # each block's words of the chunk `ahead` chunks on (past its end: those of the block a group on)
              # asked for before its gathers, which alone left the source's lines to be fetched when read
              f"  %fl0 = add i64 %li, {ahead}", "  %fover = icmp sge i64 %fl0, %leads",
              "  %fl1 = sub i64 %fl0, %leads",
              "  %flast = sub i64 %leads, 1", "  %fnext = icmp slt i64 %fl1, %leads",
              "  %fl2 = select i1 %fnext, i64 %fl1, i64 %flast", "  %fl = select i1 %fover, i64 %fl2, i64 %fl0",
              *_nx_lead("%c", "%li", share), *_nx_lead("%fc", "%fl", share),
              f"  %fg = mul i64 %fc, {16 * gathers}",
              f"  %gr = mul i64 %c, {16 * gathers}"]
    members = [""] if share is None else [f"s{m}." for m in range(share[0])]
    for m, tag in enumerate(members):  # the chunks that share this one's gathers: its byte order and padding
        lines += [f"  %c{tag} = add i64 %c, {m * share[1]}"] if share else []
        lines += [f"  %gi{tag} = mul i64 %c{tag}, 16",
                  f"  %pi{tag} = mul i64 %c{tag}, 64", f"  %pq{tag} = getelementptr i8, i8* %perm, i64 %pi{tag}",
                  f"  %pp{tag} = bitcast i8* %pq{tag} to {b}*", f"  %pv{tag} = load {b}, {b}* %pp{tag}, align 1",
                  f"  %zq{tag} = getelementptr i64, i64* %zm, i64 %c{tag}", f"  %z{tag} = load i64, i64* %zq{tag}",
                  f"  %zb{tag} = bitcast i64 %z{tag} to <64 x i1>"]
    for h in range(gathers):  # gather h: the chunk's words 16h .. 16h + 15
        lines += [f"  %gs{h} = add i64 %gr, {16 * h}", f"  %gq{h} = getelementptr i32, i32* %gidx, i64 %gs{h}",
                  f"  %gp{h} = bitcast i32* %gq{h} to {v}*", f"  %iv{h} = load {v}, {v}* %gp{h}, align 4"]
    for i in range(16 // runs if runs else 0):  # run i's first word (bytes: times 4), once a chunk
        lines += [f"  %rs{i} = add i64 %gr, {runs * i}", f"  %rq{i} = getelementptr i32, i32* %gidx, i64 %rs{i}",
                  f"  %rw{i} = load i32, i32* %rq{i}", f"  %rx{i} = sext i32 %rw{i} to i64",
                  f"  %rb{i} = mul i64 %rx{i}, 4"]
    lines += ["  br label %blk",
              "blk:", "  %bk = phi i64 [%k, %chunk], [%bk1, %blk]",
              "  %bop = getelementptr i64, i64* %outer, i64 %bk", "  %bo = load i64, i64* %bop",
              "  %boff = add i64 %bo, %eoff", "  %sbo = mul i64 %boff, 4",
              "  %sb = getelementptr i8, i8* %src, i64 %sbo",
              f"  %nb0 = add i64 %bk, {group}", "  %nlast = icmp sge i64 %nb0, %hi",
              "  %nb = select i1 %nlast, i64 %bk, i64 %nb0", "  %nbp = getelementptr i64, i64* %outer, i64 %nb",
              "  %nbo = load i64, i64* %nbp", "  %noff = add i64 %nbo, %eoff", "  %nsbo = mul i64 %noff, 4",
              "  %nsb = getelementptr i8, i8* %src, i64 %nsbo", "  %fbase = select i1 %fover, i8* %nsb, i8* %sb"]
    for lane in range(0, 16 * gathers, runs or (2 if pairs else 1)):  # a run's other words: in its first's line
        lines += [f"  %fi{lane} = add i64 %fg, {lane}",
                  f"  %fq{lane} = getelementptr i32, i32* %gidx, i64 %fi{lane}",
                  f"  %fw{lane} = load i32, i32* %fq{lane}", f"  %fx{lane} = sext i32 %fw{lane} to i64",
                  f"  %fb{lane} = mul i64 %fx{lane}, 4", f"  %fa{lane} = getelementptr i8, i8* %fbase, i64 %fb{lane}",
                  f"  call void @llvm.prefetch.p0(i8* %fa{lane}, i32 0, i32 3, i32 1)"]
    q, even = "<8 x i64>", "<8 x i32> <" + ", ".join(f"i32 {2 * j}" for j in range(8)) + ">"
    if runs:  # the runs' loads side by side: lane j the word at run j // runs's first + j % runs
        r = f"<{runs} x i32>"
        for i in range(16 // runs):
            lines += [f"  %ra{i} = getelementptr i8, i8* %sb, i64 %rb{i}", f"  %rp{i} = bitcast i8* %ra{i} to {r}*",
                      f"  %rv{i} = load {r}, {r}* %rp{i}, align 4"]
        parts, width = [f"%rv{i}" for i in range(16 // runs)], runs
        while len(parts) > 1:  # pairs of vectors joined, twice as wide each round
            mask = "<" + ", ".join(f"i32 {j}" for j in range(2 * width)) + ">"
            joined = []
            for a, c in zip(parts[::2], parts[1::2]):
                name = f"%rj{width}.{len(joined)}"
                lines.append(f"  {name} = shufflevector <{width} x i32> {a}, <{width} x i32> {c}, "
                             f"<{2 * width} x i32> {mask}")
                joined.append(name)
            parts, width = joined, 2 * width
        lines.append(f"  %gb0 = bitcast {v} {parts[0]} to {b}")
    for h in range(0 if runs else gathers):
        if pairs:  # pair j: the 8 bytes at lane 2j's word, where its two words' bytes would be
            lines += [f"  %ie{h} = shufflevector {v} %iv{h}, {v} undef, {even}",
                      f"  %gw{h} = call {q} @llvm.x86.avx512.mask.gather.dpq.512({q} zeroinitializer, i8* %sb, "
                      f"<8 x i32> %ie{h}, <8 x i1> %all8, i32 4)", f"  %gb{h} = bitcast {q} %gw{h} to {b}"]
        else:
            lines += [f"  %g{h} = call {v} @llvm.x86.avx512.mask.gather.dpi.512({v} zeroinitializer, i8* %sb, "
                      f"{v} %iv{h}, <16 x i1> %all, i32 4)", f"  %gb{h} = bitcast {v} %g{h} to {b}"]
    pick = f"call {b} @llvm.x86.avx512.vpermi2var.qi.512"  # byte p of two registers' 128 (p's low 7 bits)
    lines += ["  %blkn = add i64 %eblk, %bk", "  %obase = mul i64 %blkn, %words"]
    for t in members:
        if gathers == 1:
            lines.append(f"  %sh{t} = call {b} @llvm.x86.avx512.permvar.qi.512({b} %gb0, {b} %pv{t})")
        elif gathers == 2:
            lines.append(f"  %sh{t} = {pick}({b} %gb0, {b} %pv{t}, {b} %gb1)")
        else:  # bit 7 of p: which pair of registers
            lines += [f"  %sl{t} = {pick}({b} %gb0, {b} %pv{t}, {b} %gb1)",
                      f"  %su{t} = {pick}({b} %gb2, {b} %pv{t}, {b} %gb3)",
                      f"  %up{t} = icmp ugt {b} %pv{t}, <" + ", ".join(["i8 127"] * 64) + ">",
                      f"  %sh{t} = select <64 x i1> %up{t}, {b} %su{t}, {b} %sl{t}"]
        lines += [f"  %sz{t} = select <64 x i1> %zb{t}, {b} zeroinitializer, {b} %sh{t}",
                  f"  %w{t} = bitcast {b} %sz{t} to {v}"]
        word = _nx_lookup_ir(lines, t, luts) if luts else f"%w{t}"
        lines += [f"  %oi{t} = add i64 %obase, %gi{t}", f"  %oq{t} = getelementptr i32, i32* %out, i64 %oi{t}",
                  f"  %op{t} = bitcast i32* %oq{t} to {v}*",
                  f"  store {v} {word}, {v}* %op{t}, " + ("align 64, !nontemporal !0" if stream else "align 4")]
    lines += ["  %bk1 = add i64 %bk, 1",
              "  %bkmore = icmp slt i64 %bk1, %kend",
              "  br i1 %bkmore, label %blk, label %cnext",
              "cnext:", "  %li1 = add i64 %li, 1", "  %cmore = icmp slt i64 %li1, %leads",
              "  br i1 %cmore, label %chunk, label %cnext.done",
              "cnext.done:", "  br label %khead",
              "elatch:", "  %e1 = add i64 %e, 1", "  br label %ehead",
              "done:", "  ret i32 0", "fail:", "  ret i32 1", "}", ""]
    return "\n".join(lines + _nx_body_ir() + (["!0 = !{i32 1}"] if stream else [])) + "\n"


def _nx_lead(chunk, lead, share):
    # IR setting `chunk` to the chunk number of lead number `lead`: itself, or where `share` = (S, D), the lead's
    # (q, d) = divmod(lead, D) as chunk q S D + d
    if share is None:
        return [f"  {chunk} = add i64 {lead}, 0"]
    n, d = share
    return [f"  {chunk}.q = udiv i64 {lead}, {d}", f"  {chunk}.d = urem i64 {lead}, {d}",
            f"  {chunk}.s = mul i64 {chunk}.q, {n * d}", f"  {chunk} = add i64 {chunk}.s, {chunk}.d"]


def _nx_on():
    """Whether the SIMD kernel runs here (``LAYOUTC_SIMD`` is not ``0``, read per call; llvmlite imports and the host
    is x86-64 with AVX-512 VBMI, looked up once), without compiling it."""
    import os

    if os.environ.get("LAYOUTC_SIMD", "1").strip() == "0":
        return False
    if "host" not in _NX_STATE:
        _NX_STATE["host"] = _fp_llvm(_NX_NEEDS)
    return _NX_STATE["host"] is not None


def _nx_kernel(luts, gathers=1, group=None, pairs=False, stream=False, tile=0, runs=0, cols=False, share=None):
    """The SIMD kernel (``_nx_ir(luts, _NX_AHEAD, gathers, group, pairs, stream)``, ``group`` by default
    ``_NX_GROUP``; ``runs``: 0 or 4, 8, 16, the gathers' form with loads of runs; ``share``: None or (S, D), that
    form with gathers shared by S chunks D apart; where ``tile`` (2 or 4: the
    piece), ``_nx_tile_ir(luts, _NX_AHEAD, stream, tile)``; where ``cols``, ``_nx_cols_ir(luts, stream)``), compiled
    for the host on first use: its engine, ``nx_body``'s address, a ctypes function of it), or None where it does
    not run: ``LAYOUTC_SIMD=0``, no llvmlite, a host other than x86-64 with AVX-512 VBMI."""
    if not _nx_on():
        return None
    if gathers not in (1, 2, 4):
        raise ValueError(f"the SIMD kernel gathers 1, 2 or 4 registers of words a chunk, not {gathers!r}")
    group = _NX_GROUP if group is None else group
    if tile and not (gathers == 1 and group == 8 and pairs and tile in (2, 4)):
        raise ValueError("the SIMD kernel's tile form takes chunks of 8 pairs or 4 quads in groups of 8 blocks")
    if runs and (tile or gathers != 1 or not pairs or runs not in (4, 8, 16)):
        raise ValueError("the SIMD kernel's loads of runs take chunks of 16 words in runs of 4, 8 or 16")
    if cols and (tile or runs or gathers != 1):
        raise ValueError("the SIMD kernel's columns form takes chunks of 16 words, neither tiles nor runs")
    if share is not None and (tile or runs or cols or share[0] not in (2, 4, 8) or share[1] < 1):
        raise ValueError("the SIMD kernel shares gathers among 2, 4 or 8 chunks of the gathers' form")
    luts = "nibbles" if luts is True else luts or None  # True: the nibble tables (every XOR form)
    key = (("nx", luts, _NX_AHEAD, gathers, group, bool(pairs), bool(stream)) + (("tile", tile) if tile else ())
           + (("runs", runs) if runs else ()) + (("cols",) if cols else ())
           + (("share",) + tuple(share) if share is not None else ()))
    if key not in _NX_STATE:
        ir = (_nx_tile_ir(luts, _NX_AHEAD, bool(stream), tile) if tile
              else _nx_cols_ir(luts, bool(stream)) if cols
              else _nx_ir(luts, _NX_AHEAD, gathers, group, bool(pairs), bool(stream), runs, share))
        engine = _fp_jit(*_NX_STATE["host"], ir)
        body = engine.get_function_address("nx_body")
        _NX_STATE[key] = engine, body, ctypes.CFUNCTYPE(None, ctypes.c_void_p)(body)
    return _NX_STATE[key]


#: bytes a part of a byte lookup (a multiple of 64): a few parts a thread on a layer's scales, few enough calls
_NX_LUT_PART = 1 << 18


def _nx_lut_ir():
    # LLVM IR of the byte lookup out[i] = lut[src[i]] over whole 64-byte chunks: the 256-byte table in four
    # registers; two VPERMI2B each pick one byte of a half (a byte's low 7 bits index 128 bytes) and its bit 7 picks
    # the half. nl_body(job): parts of job[3] bytes from an atomic counter (job[0]) while below job[2]; job[4:] the
    # source, table and output addresses and the bytes (a multiple of 64; the caller takes any rest).
    b = "<64 x i8>"
    lines = [f"declare {b} @llvm.x86.avx512.vpermi2var.qi.512({b}, {b}, {b})", "",
             "define void @nl_body(i64* %job) {", "entry:"]
    for i, name in enumerate(("parts", "per", "src", "lut", "out", "n"), 2):
        lines += [f"  %{name}.q = getelementptr i64, i64* %job, i64 {i}", f"  %{name} = load i64, i64* %{name}.q"]
    lines += ["  %sp = inttoptr i64 %src to i8*", "  %lp = inttoptr i64 %lut to i8*",
              "  %op = inttoptr i64 %out to i8*"]
    for t in range(4):
        lines += [f"  %tq{t} = getelementptr i8, i8* %lp, i64 {64 * t}", f"  %tp{t} = bitcast i8* %tq{t} to {b}*",
                  f"  %T{t} = load {b}, {b}* %tp{t}, align 1"]
    lines += ["  br label %take",
              "take:", "  %p = atomicrmw add i64* %job, i64 1 monotonic", "  %more = icmp slt i64 %p, %parts",
              "  br i1 %more, label %run, label %finish",
              "run:", "  %lo = mul i64 %p, %per", "  %hi0 = add i64 %lo, %per", "  %over = icmp sgt i64 %hi0, %n",
              "  %hi = select i1 %over, i64 %n, i64 %hi0", "  br label %loop",
              "loop:", "  %i = phi i64 [%lo, %run], [%i1, %body]", "  %imore = icmp slt i64 %i, %hi",
              "  br i1 %imore, label %body, label %take",
              "body:", "  %sq = getelementptr i8, i8* %sp, i64 %i", f"  %sv = bitcast i8* %sq to {b}*",
              f"  %v = load {b}, {b}* %sv, align 1",
              f"  %lo7 = call {b} @llvm.x86.avx512.vpermi2var.qi.512({b} %T0, {b} %v, {b} %T1)",
              f"  %hi7 = call {b} @llvm.x86.avx512.vpermi2var.qi.512({b} %T2, {b} %v, {b} %T3)",
              f"  %up = icmp slt {b} %v, zeroinitializer", f"  %r = select <64 x i1> %up, {b} %hi7, {b} %lo7",
              "  %oq = getelementptr i8, i8* %op, i64 %i", f"  %ov = bitcast i8* %oq to {b}*",
              f"  store {b} %r, {b}* %ov, align 1", "  %i1 = add i64 %i, 64", "  br label %loop",
              "finish:", "  ret void", "}"]
    return "\n".join(lines) + "\n"


def _nx_lut8(x, lut, out, gomp):
    """``out[i] = lut[x[i]]`` for contiguous one-byte CPU tensors ``x`` and ``out`` of one size and a 256-byte
    ``lut`` (every byte indexes inside it), by the SIMD byte lookup over whole 64-byte chunks on torch's threads and
    ``index_select`` for the rest. True where it ran; False where the kernel does not run here."""
    if not _nx_on():
        return False
    if not (x.element_size() == out.element_size() == lut.element_size() == 1 and lut.numel() == 256
            and x.numel() == out.numel() and x.is_contiguous() and out.is_contiguous() and lut.is_contiguous()
            and x.device.type == out.device.type == lut.device.type == "cpu"):
        raise AssertionError("the SIMD byte lookup's operands do not fit it")
    if "nl" not in _NX_STATE:
        engine = _fp_jit(*_NX_STATE["host"], _nx_lut_ir())
        body = engine.get_function_address("nl_body")
        _NX_STATE["nl"] = engine, body, ctypes.CFUNCTYPE(None, ctypes.c_void_p)(body)
    src, table, dst = (t.reshape(-1).view(torch.uint8) for t in (x, lut, out))
    whole = src.numel() // 64 * 64
    if whole:
        parts = -(-whole // _NX_LUT_PART)
        threads = max(1, min(torch.get_num_threads(), parts))
        job = (ctypes.c_int64 * 8)(0, 0, parts, _NX_LUT_PART, src.data_ptr(), table.data_ptr(), dst.data_ptr(), whole)
        _fp_run_job(*_NX_STATE["nl"][1:], job, threads, gomp if threads > 1 else None)
    if whole < src.numel():
        dst[whole:] = table.index_select(0, src[whole:].to(torch.int32))
    return True


def _nx_chunks(inner):
    """A block's table of source bytes (``inner[i]``: the source byte of output byte i; < 0: padding, byte 0) in
    the SIMD kernel's form, ``(gidx, perm, zm, (least, largest))``: per 64-byte chunk c the source words it reads
    (``gidx[c]``, int32, 16, 32 or 64 a chunk: as many as the chunk that reads most needs, in gathers of 16; lanes
    past a chunk's distinct words repeat one of them), output byte i as byte ``perm[c, i]`` of those words' bytes
    (``4 * lane + byte``), ``zm[c]``'s bit i set where it is padding; the least and largest word any chunk reads.
    None where the table is not whole chunks or is larger than ``_NX_MOST_TABLE``, all padding, or a word is past
    int32."""
    n = inner.numel()
    if not n or n % 64 or n > _NX_MOST_TABLE:
        return None
    table = inner.reshape(-1, 64).to(torch.int64)
    hole = table < 0
    if bool(hole.all()):
        return None
    past = torch.iinfo(torch.int64).max  # padding sorts last and is no word
    words = torch.where(hole, past, torch.div(table, 4, rounding_mode="floor"))
    ordered, order = words.sort(dim=1, stable=True)
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    first &= ordered != past
    if int(ordered[ordered != past].max()) >= 2**31:
        return None
    most = int(first.sum(1).max())
    lanes = next(w for w in (16, 32, 64) if most <= w)  # a chunk reads at most 64 words (one a byte)
    lane_sorted = first.cumsum(1) - 1  # each byte's word's lane, in sorted order
    lane = torch.empty_like(lane_sorted).scatter_(1, order, lane_sorted)
    chunks = table.shape[0]
    gidx = torch.full((chunks, lanes), int(words[~hole].min()), dtype=torch.int64)
    rows = torch.arange(chunks).unsqueeze(1).expand(chunks, 64)
    gidx[rows[first], lane_sorted[first]] = ordered[first]
    perm = torch.where(hole, 0, lane.clamp(min=0) * 4 + torch.remainder(table, 4))
    zm = (hole.to(torch.int64) << torch.arange(64)).sum(1)  # distinct bits: the sum is their OR (bit 63 wraps)
    return (gidx.to(torch.int32).contiguous(), perm.to(torch.uint8).contiguous(), zm.contiguous(),
            (int(gidx.min()), int(gidx.max())))


def _nx_tables(luts):
    """The SIMD kernel's nibble tables of a words plan's byte tables (``luts[b, v]``, :func:`_nb_luts`): [8, 16]
    int32, table 2b the images of byte b's low nibble values, 2b + 1 of its high nibble's (``luts[b, n << 4] ^
    luts[b, 0]``), where every byte table is such a sum (XOR) of its nibbles' (bit permutations are; conversions
    that act on each bit alone, such as flipping bits, are); ``"identity"`` where every table leaves its byte as it
    is; else None."""
    images = luts.to(torch.int64) & 0xFFFFFFFF
    v = torch.arange(256)
    if bool((images == v.unsqueeze(0) << (8 * torch.arange(4)).unsqueeze(1)).all()):
        return "identity"
    low, high = images[:, v & 15], images[:, v & 0xF0] ^ images[:, :1]
    if not bool((images == low ^ high).all()):
        return None
    n = torch.arange(16)
    tabs = torch.stack([t for b in range(4) for t in (images[b, n], images[b, n << 4] ^ images[b, 0])])
    return torch.where(tabs >= 2**31, tabs - 2**32, tabs).to(torch.int32).contiguous()


#: distinct bit moves up to which a linear word map is taken as masked shifts (2 or 3 operations a move; the nibble
#: tables take 22 a word of 16): Marlin's nibble moves have three
_NX_MOST_SHIFTS = 6


def _nx_lookup(tabs):
    """The cheapest lookup form of :func:`_nx_tables`' nibble tables ``tabs`` and its operand, as ``(form, [rows,
    16] int32)``; the same words in every form:

    * ``"bytes"`` where every byte of a word maps alike, by a table of its low nibble XOR one of its high nibble
      (CUTLASS W4A8's value map): two VPSHUFB a chunk, the operand those two 16-byte tables, each four times;
    * ``("shifts", s0, s1, ...)`` where the map is linear over GF(2) (each nibble table's image of a value the XOR of
      its bits' images: a bit permutation, with bits flipped or not), the bits the four bytes' images may set apart
      (the tables OR the bytes' images, the shifts XOR them), with at most ``_NX_MOST_SHIFTS`` distinct moves
      ``o - i`` of an input bit ``i`` to an output bit ``o`` (Marlin's nibble moves: -12, 0, 12): the word is ``C ^
      XOR_j (w << s_j) & M_j`` (a right shift where s_j < 0), the operand the masks M_j and the constant C, each 16
      times;
    * else ``"nibbles"``: the 8 nibble tables themselves (eight VPERMD)."""
    t = tabs.to(torch.int64) & 0xFFFFFFFF
    if tuple(t.shape) != (8, 16):
        raise ValueError(f"the SIMD kernel's nibble tables are [8, 16], not {tuple(t.shape)}")
    rows = [[int(x) for x in row] for row in t.tolist()]
    low, high = rows[0], rows[1]
    if max(low + high) < 256 and all(rows[2 * b][n] == low[n] << 8 * b and rows[2 * b + 1][n] == high[n] << 8 * b
                                     for b in range(4) for n in range(16)):
        lanes = [value for row in (low, high) for value in _nx_lane_words(row)]
        return "bytes", torch.tensor(lanes, dtype=torch.int64).view(2, 16).to(torch.int32)
    constant = 0
    for row in rows:
        constant ^= row[0]  # every table's image of 0 (_nx_tables puts a byte's constant in its low nibble's)
    linear = [[row[n] ^ row[0] for n in range(16)] for row in rows]
    masks = {}
    for p, row in enumerate(linear):
        if any(row[n] != row[n & 1] ^ row[n & 2] ^ row[n & 4] ^ row[n & 8] for n in range(16)):
            return "nibbles", tabs.to(torch.int32).contiguous()
        for bit in range(4):
            image, i = row[1 << bit], 4 * p + bit
            for o in range(32):
                if image >> o & 1:
                    masks[o - i] = masks.get(o - i, 0) | 1 << o
    support = [0] * 4  # the bits each byte's images may set: the shifts XOR what the tables OR across bytes
    for p, row in enumerate(rows):
        for value in row:
            support[p // 2] |= value
    apart = all(support[a] & support[b] == 0 for a in range(4) for b in range(a))
    if not masks or len(masks) > _NX_MOST_SHIFTS or not apart:
        return "nibbles", tabs.to(torch.int32).contiguous()
    shifts = sorted(masks)
    values = [masks[s] for s in shifts] + [constant]
    signed = torch.tensor(values, dtype=torch.int64).view(-1, 1).expand(-1, 16)
    return ("shifts", *shifts), torch.where(signed >= 2**31, signed - 2**32, signed).to(torch.int32).contiguous()


def _nx_lane_words(table):
    # a 16-byte table four times (one a 128-bit lane) as 16 int32, little-endian
    words = [table[4 * j] | table[4 * j + 1] << 8 | table[4 * j + 2] << 16 | table[4 * j + 3] << 24 for j in range(4)]
    return [w - 2**32 if w >= 2**31 else w for w in words * 4]


def _nx_run(src, chunks, outer, shift, copies, tabs, out, gomp):
    """The SIMD kernel over every block of every expert (``src``, ``out``: contiguous int32 CPU tensors; ``outer``
    the blocks' offsets and ``shift`` an expert's, in words; ``tabs`` from :func:`_nx_tables`), in parts on torch's
    threads: one region of ``gomp`` (``GOMP_parallel`` of torch's OpenMP runtime) or, where None, the calling thread
    and Python worker threads. True where it ran, False where it does not run here; raises where a block would read
    outside ``src``."""
    gidx, perm, zm, (least, largest) = chunks
    blocks = outer.numel()
    if isinstance(tabs, str) and tabs != "identity":  # _nx_tables' one word; any other is a caller's mistake
        raise ValueError(f"the SIMD kernel's byte tables: a [8, 16] int32 tensor or 'identity', not {tabs!r}")
    if not (src.dtype == out.dtype == torch.int32 and src.is_contiguous() and out.is_contiguous()
            and out.numel() == copies * blocks * gidx.shape[0] * 16 and gidx.shape[1] in (16, 32, 64)
            and perm.shape == (gidx.shape[0], 64) and zm.shape == (gidx.shape[0],)):
        raise AssertionError("the SIMD kernel's operands do not fit its plan")
    if not _nx_on():
        return False
    outer = outer.to(torch.int64).contiguous()
    group, pairs, tile, runs, cols, share = _nx_form_of(gidx, outer)
    stream = out.numel() * 4 >= _NX_STREAM_BYTES and out.data_ptr() % 64 == 0
    lookup, tabs = (None, torch.zeros(0, dtype=torch.int32)) if isinstance(tabs, str) else _nx_memo(
        "nx lookup", tabs, None, lambda: _nx_lookup(tabs))
    kernel = _nx_kernel(lookup, gidx.shape[1] // 16, group, pairs, stream, tile, runs, cols, share)

    threads = max(1, min(torch.get_num_threads(), blocks, out.numel() // _NX_MIN_SPLIT))
    per = -(-blocks // (threads * _NX_PARTS_PER_THREAD))
    per = -(-per // group) * group  # whole groups a part (16 threads took parts of one block: no group)
    parts = -(-blocks // per)
    threads = min(threads, parts)
    job = (ctypes.c_int64 * 18)(0, 0, parts, per, src.data_ptr(), src.numel(), gidx.data_ptr(), perm.data_ptr(),
                                zm.data_ptr(), outer.data_ptr(), blocks, gidx.shape[0], shift, copies,
                                tabs.data_ptr(), out.data_ptr(), least, largest)
    _fp_run_job(*kernel[1:], job, threads, gomp)
    if job[1]:
        raise IndexError("a run table reads outside its input (the converter's plan does not fit this tensor)")
    return True


def _nx_form_of(gidx, outer):
    # The kernel's form for these chunk tables and block offsets, (group, pairs, tile, runs, cols, share), found once
    # while both tensors live (a plan's own): each check is a few torch passes over the tables, tens of microseconds
    return _nx_memo("nx forms", (gidx, outer), None, lambda: _nx_form(gidx, outer))


def _nx_form(gidx, outer):
    # the checks of _nx_form_of, in the order the forms are preferred: a tile, runs, columns, shared gathers
    group = _nx_group(outer)
    pairs = bool((gidx[:, 1::2] == gidx[:, 0::2] + 1).all())
    tile = _nx_tiled(outer, gidx) if group == 8 and pairs and gidx.shape[1] == 16 else 0
    runs = 0 if tile or not pairs or gidx.shape[1] != 16 else next(
        (r for r in (16, 8, 4) if _nx_runs_of(gidx, r)), 0)
    cols = not (tile or runs) and gidx.shape[1] == 16 and _nx_columns(gidx)
    share = None if tile or runs or cols else _nx_shared(gidx)
    return group, pairs, tile, runs, cols, share


def _nx_group(outer):
    # blocks a group: _NX_SHARED_GROUP where two of the first _NX_SHARED_GROUP blocks' offsets (words) are less than a
    # line (16 words) apart, so that they read the same lines; else _NX_GROUP
    first = sorted(outer[:_NX_SHARED_GROUP].tolist())
    near = any(b - a < 16 for a, b in zip(first, first[1:]))
    return _NX_SHARED_GROUP if near else _NX_GROUP


def _nx_tiled(outer, gidx):
    # The tile form's piece (words) where the plan has its pattern, else 0: every chunk (16 lanes) runs of `piece`
    # consecutive words, and the blocks in groups of 8, each 8 / n tiles of n = 16 / piece blocks (tile t's block j:
    # block t + (8 / n) j of the group) at the tile's first offset + piece * j words. Piece 2 first (Marlin's: one
    # tile of 8 blocks), then 4 (W4A8's: two tiles of 4).
    if outer.numel() % 8 or not outer.numel():
        return 0
    for piece in (2, 4):
        runs = 16 // piece
        if not _nx_runs_of(gidx, piece):
            continue
        tiles = outer.view(-1, runs, 8 // runs)  # [group, j, t]: block t + (8 / runs) j of the group
        if bool((tiles - tiles[:, :1, :] == (torch.arange(runs) * piece).view(1, -1, 1)).all()):
            return piece
    return 0


def _nx_columns(gidx):
    # whether the chunks (a [chunks, 16] table) go in groups of 8 whose chunk j reads the first's words + j, the
    # first's lanes two spans of 8 words 8 apart (the columns form: _nx_cols_ir)
    if gidx.shape[0] % 8 or not gidx.shape[0]:
        return False
    groups = gidx.view(-1, 8, 16).to(torch.int64)
    first = groups[:, :1, :]
    spans = first.view(-1, 2, 8)
    return bool((groups == first + torch.arange(8).view(1, 8, 1)).all()
                and (spans == spans[:, :, :1] + 8 * torch.arange(8)).all())


def _nx_shared(gidx):
    # (S, D) where, for every chunk c with (c // D) % S == 0, chunks c + s D (s < S) read chunk c's words (a byte
    # transpose's output rows that take bytes 0-3 of the same words), S 8, 4 or 2, the most that hold, and D is at
    # least _NX_SHARE_LEAST_D; else None
    same = (gidx[1:] == gidx[:1]).all(1).nonzero().flatten()
    if not same.numel() or int(same[0]) + 1 < _NX_SHARE_LEAST_D:
        return None
    d, n = int(same[0]) + 1, gidx.shape[0]
    for s in (8, 4, 2):
        if n % (s * d) == 0:
            rows = gidx.view(n // (s * d), s, d, gidx.shape[1])
            if bool((rows == rows[:, :1]).all()):
                return s, d
    return None


def _nx_runs_of(gidx, piece):
    # whether every chunk's lanes (a [chunks, 16] table) are runs of `piece` consecutive words
    lanes = gidx.view(-1, 16 // piece, piece).to(torch.int64)
    return bool((lanes == lanes[:, :, :1] + torch.arange(piece)).all())


def _nx_memo(kind, tensors, extra, make):
    # make() once per (kind, tensors, extra) while `tensors` (a tensor, or a tuple of them) live: weak references,
    # each checked on a hit, so a tensor at a freed one's id is made again (a plan's tables of the run cache, not
    # copied per call)
    import weakref

    tensors = tensors if isinstance(tensors, tuple) else (tensors,)
    seen = _NX_STATE.setdefault(kind, {})
    key = (tuple(id(t) for t in tensors), extra)
    got = seen.get(key)
    if got is not None and all(ref() is t for ref, t in zip(got[0], tensors)):
        return got[1]
    value = make()
    if len(seen) >= 64:
        seen.clear()
    seen[key] = (tuple(weakref.ref(t) for t in tensors), value)
    return value


def _nx_quads_table(rows, quads, step):
    # A quads plan (row r's quad q reads words rows[r, b] + q * step, every word read) as one block a row where
    # every row is row 0 moved by one offset: (row 0's table of source bytes, the rows' offsets in words), or None
    first = rows[:1].to(torch.int64)
    moved = rows.to(torch.int64) - first
    if quads % 4 or not rows.shape[0] or not bool((moved == moved[:, :1]).all()):
        return None
    q = torch.arange(quads).view(-1, 1, 1)
    j = torch.arange(4).view(1, -1, 1)  # output word j of a quad: byte j of each source word b, at its byte b
    inner = (4 * (first.view(1, 1, 4) + q * step) + j).reshape(-1)
    return inner, moved[:, 0].contiguous()

