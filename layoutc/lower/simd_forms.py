"""LLVM IR text of the SIMD kernel's forms that load whole runs of words and transpose them in registers.

Pieces of :mod:`layoutc.lower.native_simd`'s kernel, which chooses among its forms from a plan's tables: here the
text of the two that load instead of gathering, each for one pattern of its tables, and what every form shares
(the function's start and its experts' loop, the check of a group's reads, the nibble lookups of a word's bytes,
the parts loop ``nx_body``). The tile form (:func:`_nx_tile_ir`): 8
blocks' pieces of the same rows (Marlin's and CUTLASS W4A8's weights) as n runs of 16 words loaded whole and an
n x n transpose of pieces; the columns form (:func:`_nx_cols_ir`): 8 chunks' strided words (GPTQ's) as two spans
of 64 words and a 16 x 8 transpose of words (:func:`_nx_cols_network`). The functions build strings from integers
and flags only; no text from a spec, a file or a tensor reaches them. Copied into converters before
:mod:`layoutc.lower.native_simd` (``torch_emit.native_source``); ``tests/lower/test_native_simd.py`` holds each
form to the kernel's definition and the shipped specs that take it to the eager lowering.
"""


def _nx_head(luts, declares, entry):
    # The start every form of nx_blocks shares: `declares` (its intrinsics) and the prefetch's, the function's
    # signature (the same in every form: nx_body calls any), `entry` (lines of its entry block), the rows of the
    # lookup's operand (%T0 ..; `luts` a lookup form of _nx_lookup_ir, or None), then the experts' loop (ehead;
    # kpre sets %eoff and %eblk and goes to khead, which the form writes; the form ends an expert at elatch)
    v = "<16 x i32>"
    if luts == "bytes":
        declares = [*declares, "declare <64 x i8> @llvm.x86.avx512.pshuf.b.512(<64 x i8>, <64 x i8>)"]
    lines = ["declare void @llvm.prefetch.p0(i8*, i32, i32, i32)", *declares, "",
             "define i32 @nx_blocks(i8* %src, i64 %nw, i32* %gidx, i8* %perm, i64* %zm, i64* %outer, i64 %nblocks,",
             "    i64 %chunks, i64 %shift, i64 %copies, i32* %tabs, i32* %out, i64 %slo, i64 %shi, i64 %lo, i64 %hi) {",
             "entry:", *entry]
    for t in range(_nx_lookup_rows(luts)):
        lines += [f"  %tq{t} = getelementptr i32, i32* %tabs, i64 {16 * t}", f"  %tp{t} = bitcast i32* %tq{t} to {v}*",
                  f"  %T{t} = load {v}, {v}* %tp{t}, align 4"]
    return lines + ["  br label %ehead",
                    "ehead:", "  %e = phi i64 [0, %entry], [%e1, %elatch]", "  %emore = icmp slt i64 %e, %copies",
                    "  br i1 %emore, label %kpre, label %done",
                    "kpre:", "  %eoff = mul i64 %e, %shift", "  %eblk = mul i64 %e, %nblocks", "  br label %khead"]


def _nx_check_group():
    # Blocks %k .. %kend - 1 (from block kgroup), each block's reads (its least and largest word, moved by its
    # offset and the expert's) checked against the nw source words before any is read: to fail, else chunk.pre
    return ["  br label %chk",
            "chk:", "  %cb = phi i64 [%k, %kgroup], [%cb1, %chkok]",
            "  %okp = getelementptr i64, i64* %outer, i64 %cb", "  %ok = load i64, i64* %okp",
            "  %off = add i64 %ok, %eoff", "  %a0 = add i64 %slo, %off", "  %a1 = add i64 %shi, %off",
            "  %bad0 = icmp slt i64 %a0, 0", "  %bad1 = icmp sge i64 %a1, %nw", "  %bad = or i1 %bad0, %bad1",
            "  br i1 %bad, label %fail, label %chkok",
            "chkok:", "  %cb1 = add i64 %cb, 1", "  %cbmore = icmp slt i64 %cb1, %kend",
            "  br i1 %cbmore, label %chk, label %chunk.pre"]


def _nx_nibbles(lines, tag):
    # Appends to `lines` the nibble lookups of the words %w{tag} (tables %T0 .. %T7; value names suffixed by `tag`)
    # and returns the result's name: nibble t of each word indexes table t (VPERMD reads an index's low 4 bits);
    # byte b of the result is table 2b's image XOR table 2b + 1's
    v, w = "<16 x i32>", f"%w{tag}"
    for t in range(8):
        index = w if t == 0 else f"%n{tag}{t}"
        if t:
            lines.append(f"  %n{tag}{t} = lshr {v} {w}, <" + ", ".join([f"i32 {4 * t}"] * 16) + ">")
        lines.append(f"  %p{tag}{t} = call {v} @llvm.x86.avx512.permvar.si.512({v} %T{t}, {v} {index})")
    lines += [f"  %y{tag}{j} = xor {v} %p{tag}{2 * j}, %p{tag}{2 * j + 1}" for j in range(4)]
    lines += [f"  %r{tag}01 = or {v} %y{tag}0, %y{tag}1", f"  %r{tag}23 = or {v} %y{tag}2, %y{tag}3",
              f"  %r{tag} = or {v} %r{tag}01, %r{tag}23"]
    return f"%r{tag}"


def _nx_lookup_rows(lookup):
    # rows of 16 int32 of the lookup form's operand (tabs) its head loads as %T0 ..: none without a lookup, the 8
    # nibble tables, the two byte tables of "bytes", a mask a shift and the constant of ("shifts", ...)
    if not lookup:
        return 0
    if lookup == "nibbles":
        return 8
    if lookup == "bytes":
        return 2
    if (isinstance(lookup, tuple) and lookup[:1] == ("shifts",) and len(lookup) > 1
            and len(set(lookup[1:])) == len(lookup) - 1
            and all(type(s) is int and -32 < s < 32 for s in lookup[1:])):  # a shift by 32 or more: LLVM's poison
        return len(lookup)
    raise ValueError(f"the SIMD kernel knows no lookup form {lookup!r}")


def _nx_lookup_ir(lines, tag, lookup):
    # Appends to `lines` the lookup form `lookup` (_nx_lookup's: "nibbles", "bytes" or ("shifts", s0, s1, ..)) of
    # the words %w{tag} and returns the result's name. Raises on a form it does not know.
    _nx_lookup_rows(lookup)  # the check
    if lookup == "nibbles":
        return _nx_nibbles(lines, tag)
    v, b, w = "<16 x i32>", "<64 x i8>", f"%w{tag}"
    splat = lambda value: "<" + ", ".join([f"i32 {value}"] * 16) + ">"
    if lookup == "bytes":
        # every byte y = A[low nibble] ^ B[high nibble], A and B the same for each byte (VPSHUFB: a 16-byte table
        # in each 128-bit lane, %T0 and %T1, indexed by a byte's low 4 bits where its bit 7 is clear)
        lines += [f"  %bl{tag} = and {v} {w}, {splat(0x0F0F0F0F)}", f"  %bs{tag} = lshr {v} {w}, {splat(4)}",
                  f"  %bh{tag} = and {v} %bs{tag}, {splat(0x0F0F0F0F)}"]
        for n, (idx, table) in enumerate(((f"%bl{tag}", "%T0"), (f"%bh{tag}", "%T1"))):
            lines += [f"  %bi{tag}{n} = bitcast {v} {idx} to {b}", f"  %bt{tag}{n} = bitcast {v} {table} to {b}",
                      f"  %bp{tag}{n} = call {b} @llvm.x86.avx512.pshuf.b.512({b} %bt{tag}{n}, {b} %bi{tag}{n})"]
        lines += [f"  %bx{tag} = xor {b} %bp{tag}0, %bp{tag}1", f"  %r{tag} = bitcast {b} %bx{tag} to {v}"]
        return f"%r{tag}"
    # ("shifts", s...): word = C ^ XOR_j (w moved by s_j bits: left where s_j > 0) & M_j (%Tj the masks, the last %T
    # the constant C)
    acc = f"%T{len(lookup) - 1}"
    for j, s in enumerate(lookup[1:]):
        moved = w if s == 0 else f"%ms{tag}.{j}"
        if s:
            lines.append(f"  {moved} = {'shl' if s > 0 else 'lshr'} {v} {w}, {splat(abs(s))}")
        lines += [f"  %mm{tag}.{j} = and {v} {moved}, %T{j}", f"  %mx{tag}.{j} = xor {v} {acc}, %mm{tag}.{j}"]
        acc = f"%mx{tag}.{j}"
    return acc


def _nx_body_ir():
    # nx_body(job): parts of job[3] blocks from an atomic counter (job[0]) while below job[2], each nx_blocks of
    # blocks [lo, hi); job[1] set where a part failed; job[4:] nx_blocks' other arguments, as int64
    names = ("src", "nw", "gidx", "perm", "zm", "outer", "nblocks", "chunks", "shift", "copies", "tabs", "out", "slo",
             "shi")
    pointers = {"src": "i8*", "gidx": "i32*", "perm": "i8*", "zm": "i64*", "outer": "i64*", "tabs": "i32*",
                "out": "i32*"}
    lines = ["define void @nx_body(i64* %job) {", "entry:"]
    for i, name in enumerate(("parts", "per") + names, 2):
        lines += [f"  %{name}.q = getelementptr i64, i64* %job, i64 {i}", f"  %{name}.v = load i64, i64* %{name}.q"]
        if name in pointers:
            lines.append(f"  %{name} = inttoptr i64 %{name}.v to {pointers[name]}")
    args = ", ".join(f"{pointers[n]} %{n}" if n in pointers else f"i64 %{n}.v" for n in names)
    lines += ["  %failed = getelementptr i64, i64* %job, i64 1", "  br label %take",
              "take:", "  %p = atomicrmw add i64* %job, i64 1 monotonic", "  %more = icmp slt i64 %p, %parts.v",
              "  br i1 %more, label %run, label %finish",
              "run:", "  %lo = mul i64 %p, %per.v", "  %hi0 = add i64 %lo, %per.v",
              "  %over = icmp sgt i64 %hi0, %nblocks.v", "  %hi = select i1 %over, i64 %nblocks.v, i64 %hi0",
              f"  %r = call i32 @nx_blocks({args}, i64 %lo, i64 %hi)", "  %rb = icmp ne i32 %r, 0",
              "  br i1 %rb, label %flag, label %take",
              "flag:", "  store atomic i64 1, i64* %failed monotonic, align 8", "  br label %take",
              "finish:", "  ret void", "}"]
    return lines


def _nx_tile_ir(luts, ahead, stream, piece=2):
    # LLVM IR of the tile form of nx_blocks (same arguments and result, nx_body the same), for plans whose chunks
    # are n = 16 / piece runs of `piece` consecutive words (16 lanes) and whose groups of 8 blocks are s = 8 / n
    # tiles of n blocks, tile t's block j (block k + t + s * j) at tile t's first offset + piece * j words: piece i
    # of that block's chunk is then piece j of the 16 words starting at gidx[c, piece * i] + the tile's offset.
    # Marlin's weights (piece 2: 8 bytes of each of 8 rows, the 8 blocks the 8 columns of a row's line) and
    # CUTLASS W4A8's (piece 4, two tiles of 4 interleaved). Per chunk and tile: the n runs of 16 words loaded whole,
    # an n x n transpose of pieces (24 two-register shuffles for 8, 8 for 4) gives each block its pieces in gather
    # order, then each block's byte permute, padding, nibble tables and store as in the gather form. Each line is
    # read once where the gathers read it once per block; the group's blocks are checked as there (a run's 16 words
    # are its tile's blocks' reads). The caller guarantees the pattern (_nx_tiled) and parts of whole groups.
    runs = 16 // piece
    tiles = 8 // runs
    v, b, q = "<16 x i32>", "<64 x i8>", "<8 x i64>"
    lines = _nx_head(luts, [f"declare {b} @llvm.x86.avx512.permvar.qi.512({b}, {b})",
                            f"declare {v} @llvm.x86.avx512.permvar.si.512({v}, {v})"],
                     ["  %words = mul i64 %chunks, 16"])
    lines += ["khead:", "  %k = phi i64 [%lo, %kpre], [%kend, %chunk]", "  %kmore = icmp slt i64 %k, %hi",
              "  br i1 %kmore, label %kgroup, label %elatch",
              "kgroup:", "  %kend = add i64 %k, 8", *_nx_check_group(),
              "chunk.pre:", "  %nlast = icmp sge i64 %kend, %hi", "  %nk = select i1 %nlast, i64 %k, i64 %kend"]
    for t in range(tiles):  # each tile's offset, and the next group's (the chunks `ahead` past this group's end)
        lines += [f"  %tk{t} = add i64 %k, {t}", f"  %obp{t} = getelementptr i64, i64* %outer, i64 %tk{t}",
                  f"  %ob0.{t} = load i64, i64* %obp{t}", f"  %ob{t} = add i64 %ob0.{t}, %eoff",
                  f"  %nt{t} = add i64 %nk, {t}", f"  %nbp{t} = getelementptr i64, i64* %outer, i64 %nt{t}",
                  f"  %nb0.{t} = load i64, i64* %nbp{t}", f"  %nob{t} = add i64 %nb0.{t}, %eoff"]
    lines += ["  br label %chunk",
              "chunk:", "  %c = phi i64 [0, %chunk.pre], [%c1, %chunk]",
              f"  %fc0 = add i64 %c, {ahead}", "  %fover = icmp sge i64 %fc0, %chunks",
              "  %fc1 = sub i64 %fc0, %chunks", "  %fc = select i1 %fover, i64 %fc1, i64 %fc0",
              "  %fg = mul i64 %fc, 16", "  %gr = mul i64 %c, 16", "  %pi = mul i64 %c, 64",
              "  %pq = getelementptr i8, i8* %perm, i64 %pi", f"  %pp = bitcast i8* %pq to {b}*",
              f"  %pv = load {b}, {b}* %pp, align 1",
              "  %zq = getelementptr i64, i64* %zm, i64 %c", "  %z = load i64, i64* %zq",
              "  %zb = bitcast i64 %z to <64 x i1>"]
    for i in range(runs):  # run i's first word in the chunk's table, this chunk's and the one `ahead` on
        for at, chunk in (("f", "%fg"), ("l", "%gr")):
            lines += [f"  %{at}i{i} = add i64 {chunk}, {piece * i}",
                      f"  %{at}q{i} = getelementptr i32, i32* %gidx, i64 %{at}i{i}",
                      f"  %{at}w{i} = load i32, i32* %{at}q{i}", f"  %{at}x{i} = sext i32 %{at}w{i} to i64"]

    def shuffle(name, first, second, mask):  # two registers' 16 pairs, `mask` picking 8 of them
        return (f"  %{name} = shufflevector {q} %{first}, {q} %{second}, <8 x i32> <"
                + ", ".join(f"i32 {m}" for m in mask) + ">")
    for t in range(tiles):
        lines.append(f"  %fob{t} = select i1 %fover, i64 %nob{t}, i64 %ob{t}")
        for i in range(runs):  # prefetch run i of the chunk `ahead` on, load this chunk's
            for at, offset in (("f", f"%fob{t}"), ("l", f"%ob{t}")):
                lines += [f"  %{at}y{i}.{t} = add i64 %{at}x{i}, {offset}",
                          f"  %{at}b{i}.{t} = mul i64 %{at}y{i}.{t}, 4",
                          f"  %{at}a{i}.{t} = getelementptr i8, i8* %src, i64 %{at}b{i}.{t}"]
            lines += [f"  call void @llvm.prefetch.p0(i8* %fa{i}.{t}, i32 0, i32 3, i32 1)",
                      f"  %lp{i}.{t} = bitcast i8* %la{i}.{t} to {q}*",
                      f"  %L{i}.{t} = load {q}, {q}* %lp{i}.{t}, align 4"]
        L = [f"L{i}.{t}" for i in range(runs)]
        if runs == 8:  # in three rounds: pairs, pairs of pairs, halves (O_j's pair i is L_i's pair j)
            for r in range(4):  # t_2r: the even pairs of runs 2r, 2r + 1 interleaved; t_2r+1: the odd ones
                lines += [shuffle(f"t{2 * r}.{t}", L[2 * r], L[2 * r + 1], [0, 8, 2, 10, 4, 12, 6, 14]),
                          shuffle(f"t{2 * r + 1}.{t}", L[2 * r], L[2 * r + 1], [1, 9, 3, 11, 5, 13, 7, 15])]
            for h in (0, 4):  # u_h+m: pairs m and m + 4 of runs h .. h + 3 (m = 0, 2 from the even t, 1, 3 the odd)
                lines += [shuffle(f"u{h}.{t}", f"t{h}.{t}", f"t{h + 2}.{t}", [0, 1, 8, 9, 4, 5, 12, 13]),
                          shuffle(f"u{h + 2}.{t}", f"t{h}.{t}", f"t{h + 2}.{t}", [2, 3, 10, 11, 6, 7, 14, 15]),
                          shuffle(f"u{h + 1}.{t}", f"t{h + 1}.{t}", f"t{h + 3}.{t}", [0, 1, 8, 9, 4, 5, 12, 13]),
                          shuffle(f"u{h + 3}.{t}", f"t{h + 1}.{t}", f"t{h + 3}.{t}", [2, 3, 10, 11, 6, 7, 14, 15])]
            for m in range(4):  # O_m: the low halves of u_m (runs 0-3) and u_m+4 (runs 4-7); O_m+4: the high ones
                lines += [shuffle(f"O{m}.{t}", f"u{m}.{t}", f"u{m + 4}.{t}", [0, 1, 2, 3, 8, 9, 10, 11]),
                          shuffle(f"O{m + 4}.{t}", f"u{m}.{t}", f"u{m + 4}.{t}", [4, 5, 6, 7, 12, 13, 14, 15])]
        else:  # runs == 4, in two rounds: quads (two pairs each), then halves (O_j's quad i is L_i's quad j)
            for r in range(2):  # t_2r: the even quads of runs 2r, 2r + 1 interleaved; t_2r+1: the odd ones
                lines += [shuffle(f"t{2 * r}.{t}", L[2 * r], L[2 * r + 1], [0, 1, 8, 9, 4, 5, 12, 13]),
                          shuffle(f"t{2 * r + 1}.{t}", L[2 * r], L[2 * r + 1], [2, 3, 10, 11, 6, 7, 14, 15])]
            for m in range(2):  # O_m: low halves of t_m and t_m+2; O_m+2: high halves
                lines += [shuffle(f"O{m}.{t}", f"t{m}.{t}", f"t{m + 2}.{t}", [0, 1, 2, 3, 8, 9, 10, 11]),
                          shuffle(f"O{m + 2}.{t}", f"t{m}.{t}", f"t{m + 2}.{t}", [4, 5, 6, 7, 12, 13, 14, 15])]
        for j in range(runs):  # block k + t + tiles * j's chunk c
            n = f"{j}.{t}"
            lines += [f"  %gb{n} = bitcast {q} %O{n} to {b}",
                      f"  %sh{n} = call {b} @llvm.x86.avx512.permvar.qi.512({b} %gb{n}, {b} %pv)",
                      f"  %sz{n} = select <64 x i1> %zb, {b} zeroinitializer, {b} %sh{n}",
                      f"  %w{n}. = bitcast {b} %sz{n} to {v}"]
            word = _nx_lookup_ir(lines, f"{n}.", luts) if luts else f"%w{n}."
            lines += [f"  %bn{n} = add i64 %k, {t + tiles * j}", f"  %blkn{n} = add i64 %eblk, %bn{n}",
                      f"  %obase{n} = mul i64 %blkn{n}, %words", f"  %oi{n} = add i64 %obase{n}, %gr",
                      f"  %oq{n} = getelementptr i32, i32* %out, i64 %oi{n}",
                      f"  %op{n} = bitcast i32* %oq{n} to {v}*",
                      f"  store {v} {word}, {v}* %op{n}, " + ("align 64, !nontemporal !0" if stream else "align 4")]
    lines += ["  %c1 = add i64 %c, 1", "  %cmore = icmp slt i64 %c1, %chunks",
              "  br i1 %cmore, label %chunk, label %khead",
              "elatch:", "  %e1 = add i64 %e, 1", "  br label %ehead",
              "done:", "  ret i32 0", "fail:", "  ret i32 1", "}", ""]
    return "\n".join(lines + _nx_body_ir() + (["!0 = !{i32 1}"] if stream else [])) + "\n"


def _nx_cols_network():
    # The 24 two-register shuffles (3 rounds of 8) that turn 8 registers of 16 words, register p holding rows 2p and
    # 2p + 1 of a 16 x 8 matrix M (slot 8h + c: M[2p + h][c]), into 8 registers of its columns (register c, slot r:
    # M[r][c]). Round b swaps bit b of the register number with bit b of the column in the slot; the last also
    # puts each column's rows in order. Each round's register r reads registers r and r ^ 2^b: [(r, low, high, 16
    # picks of the two's 32 words)].
    def place(b, p, h, c):  # (register, slot) of M[2p + h][c] after b rounds
        if b == 3:
            return c, 2 * p + h
        m = (1 << b) - 1
        return (p & ~m) | (c & m), 8 * h + ((c & ~m) | (p & m))
    rounds = []
    for b in range(3):
        came = {place(b + 1, p, h, c): place(b, p, h, c) for p in range(8) for h in range(2) for c in range(8)}
        low_bit = 1 << b
        rounds.append([(r, r & ~low_bit, r | low_bit,
                        [came[r, slot][1] + (16 if came[r, slot][0] == r | low_bit else 0) for slot in range(16)])
                       for r in range(8)])
    return rounds


def _nx_cols_ir(luts, stream):
    # LLVM IR of the columns form of nx_blocks (same arguments and result, nx_body the same), for plans whose chunks
    # go in groups of 8 whose chunk j reads the first's words + j, and whose first reads two spans of 8 words 8
    # apart (GPTQ's weights: 8 columns of 4-byte words, their rows 32 bytes apart): the 8 chunks of a group then read
    # exactly the 64 words of each span, as an 8 x 8 matrix of words whose column j is chunk j's lanes. Per block
    # and group: the two spans' 128 words loaded as 8 registers, the columns found by 24 two-register shuffles
    # (_nx_cols_network), then each chunk's byte permute, padding, nibble tables and store as in the gather form.
    # One block at a time (such blocks share no lines); each block checked before it reads; the next group's spans
    # prefetched. The caller guarantees the pattern (_nx_columns).
    v, b = "<16 x i32>", "<64 x i8>"
    lines = _nx_head(luts, [f"declare {b} @llvm.x86.avx512.permvar.qi.512({b}, {b})",
                            f"declare {v} @llvm.x86.avx512.permvar.si.512({v}, {v})"],
                     ["  %words = mul i64 %chunks, 16", "  %clast = sub i64 %chunks, 8"])
    lines += ["khead:", "  %k = phi i64 [%lo, %kpre], [%k1, %cgroup]", "  %kmore = icmp slt i64 %k, %hi",
              "  br i1 %kmore, label %kblock, label %elatch",
              "kblock:", "  %okp = getelementptr i64, i64* %outer, i64 %k", "  %ok = load i64, i64* %okp",
              "  %off = add i64 %ok, %eoff", "  %a0 = add i64 %slo, %off", "  %a1 = add i64 %shi, %off",
              "  %bad0 = icmp slt i64 %a0, 0", "  %bad1 = icmp sge i64 %a1, %nw", "  %bad = or i1 %bad0, %bad1",
              "  %k1 = add i64 %k, 1", "  %sbo = mul i64 %off, 4", "  %sb = getelementptr i8, i8* %src, i64 %sbo",
              "  %blkn = add i64 %eblk, %k", "  %obase = mul i64 %blkn, %words",
              "  br i1 %bad, label %fail, label %cgroup",
              "cgroup:", "  %c0 = phi i64 [0, %kblock], [%c8, %cgroup]",
              "  %c8 = add i64 %c0, 8", "  %cnext = icmp slt i64 %c0, %clast",
              "  %cf = select i1 %cnext, i64 %c8, i64 %c0"]  # the group whose spans are prefetched
    for at, chunk in (("", "%c0"), ("f", "%cf")):  # this group's two spans' first words, and the next group's
        for h, lane in ((0, 0), (1, 8)):
            n = f"{at}s{h}"
            lines += [f"  %{n}.i = mul i64 {chunk}, 16", f"  %{n}.j = add i64 %{n}.i, {lane}",
                      f"  %{n}.q = getelementptr i32, i32* %gidx, i64 %{n}.j", f"  %{n}.w = load i32, i32* %{n}.q",
                      f"  %{n}.x = sext i32 %{n}.w to i64", f"  %{n}.b = mul i64 %{n}.x, 4"]
    for h in range(2):
        for i in range(4):  # span h's words 16i .. 16i + 15: register 4h + i (rows 8h + 2i, + 1 of M)
            r = 4 * h + i
            lines += [f"  %lb{r} = add i64 %s{h}.b, {64 * i}", f"  %la{r} = getelementptr i8, i8* %sb, i64 %lb{r}",
                      f"  %lp{r} = bitcast i8* %la{r} to {v}*", f"  %R0.{r} = load {v}, {v}* %lp{r}, align 4",
                      f"  %fb{r} = add i64 %fs{h}.b, {64 * i}", f"  %fa{r} = getelementptr i8, i8* %sb, i64 %fb{r}",
                      f"  call void @llvm.prefetch.p0(i8* %fa{r}, i32 0, i32 3, i32 1)"]
    for rnd, shuffles in enumerate(_nx_cols_network()):
        for r, low, high, picks in shuffles:
            mask = "<" + ", ".join(f"i32 {p}" for p in picks) + ">"
            lines.append(f"  %R{rnd + 1}.{r} = shufflevector {v} %R{rnd}.{low}, {v} %R{rnd}.{high}, <16 x i32> {mask}")
    lines += ["  %pi = mul i64 %c0, 64"]
    for j in range(8):  # chunk c0 + j: column j
        n = f"{j}."
        lines += [f"  %pi{j} = add i64 %pi, {64 * j}", f"  %pq{j} = getelementptr i8, i8* %perm, i64 %pi{j}",
                  f"  %pp{j} = bitcast i8* %pq{j} to {b}*", f"  %pv{j} = load {b}, {b}* %pp{j}, align 1",
                  f"  %zc{j} = add i64 %c0, {j}", f"  %zq{j} = getelementptr i64, i64* %zm, i64 %zc{j}",
                  f"  %z{j} = load i64, i64* %zq{j}", f"  %zb{j} = bitcast i64 %z{j} to <64 x i1>",
                  f"  %gb{j} = bitcast {v} %R3.{j} to {b}",
                  f"  %sh{j} = call {b} @llvm.x86.avx512.permvar.qi.512({b} %gb{j}, {b} %pv{j})",
                  f"  %sz{j} = select <64 x i1> %zb{j}, {b} zeroinitializer, {b} %sh{j}",
                  f"  %w{n} = bitcast {b} %sz{j} to {v}"]
        word = _nx_lookup_ir(lines, n, luts) if luts else f"%w{n}"
        lines += [f"  %oc{j} = mul i64 %zc{j}, 16", f"  %oi{j} = add i64 %obase, %oc{j}",
                  f"  %oq{j} = getelementptr i32, i32* %out, i64 %oi{j}", f"  %op{j} = bitcast i32* %oq{j} to {v}*",
                  f"  store {v} {word}, {v}* %op{j}, " + ("align 64, !nontemporal !0" if stream else "align 4")]
    lines += ["  %cmore = icmp slt i64 %c8, %chunks", "  br i1 %cmore, label %cgroup, label %khead",
              "elatch:", "  %e1 = add i64 %e, 1", "  br label %ehead",
              "done:", "  ret i32 0", "fail:", "  ret i32 1", "}", ""]
    return "\n".join(lines + _nx_body_ir() + (["!0 = !{i32 1}"] if stream else [])) + "\n"
