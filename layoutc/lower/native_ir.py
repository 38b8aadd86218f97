"""The native kernels of :mod:`layoutc.lower.native` as LLVM IR of our own: no numba compile in a first call.

The numba kernels (``_nb_words_k``, ``_nb_wquads_k``, ``_nb_wpairs_k``, ``_nb_quads_k``, ``_nb_lut8_k``) cost a
fresh process 1.5-2.5 s before their first word: importing numba (~0.5 s) and its typing and compiling of each
kernel and of its OpenMP body (~1 s a kernel on the 2-core Zen 3 machine), every time a converter is loaded
without numba's disk cache (BENCHMARKS.md). Here each is written as scalar LLVM IR from a few integers and the
element types of its arrays, optimised by LLVM's O3 pipeline and compiled by llvmlite's LLVM (numba's own
dependency: ``_fp_jit`` of :mod:`layoutc.runtime.cpu_kernels`), and run in parts from an atomic counter on torch's
OpenMP threads (one ``GOMP_parallel`` region) or on Python threads, like the fingerprint's kernel. Same
definitions, same checks: every address a kernel reads is checked against its source's length, and a call that
would read outside raises. Where llvmlite (0.44 or later, for its new pass manager) does not import or the host
is not x86-64, or ``LAYOUTC_NATIVE_IR=0`` (read per call), the numba kernels run as before.

The quads and pairs kernels take a plan's blocks in an order and in groups given with their arguments
(``_ni_block_order``): a group's blocks quad by quad, the group a constant of the IR (one compile for each
group a process meets), their source lines prefetched ahead where blocks share lines (Marlin's weights: about half
the kernel time).

A kernel's job is int64 slots: the parts' counter, failed parts, parts, total, then two slots an argument (an
array's address and first dimension, or an integer and 0). ``kernel(args..., lo, hi)`` is the numba kernel's
signature and meaning (for the quads and pairs kernels lo and hi count groups of blocks); ``body(job)`` takes parts
``k`` and runs ``[total k / parts, total (k + 1) / parts)``.
Copied into converters with :mod:`layoutc.lower.native` (``torch_emit.native_source``);
``tests/lower/test_native_ir.py`` holds each kernel to the numba one and to the torch forms.
"""

# not copied into converters (torch_emit.native_source copies what follows `import torch`)
import ctypes

from ..runtime.cpu_kernels import _fp_gomp, _fp_jit, _fp_llvm, _fp_run_job
import torch

_NI_STATE = {}  # "host": llvmlite and the host's features (None: not here); (name, types): (engine, body, call)
#: the IR type of each element type a kernel's array may have (numpy's dtype strings), and whether its values are
#: signed when used as an index or a value
_NI_TYPES = {"|u1": ("i8", False), "<i4": ("i32", True), "<i8": ("i64", True)}
#: each kernel's arguments: an array's name, or "=name" an integer (the numba kernel's order)
_NI_ARGS = {
    "words": ("src", "inner", "outer", "=ps", "=shift", "=copies", "luts", "out"),
    "wquads": ("src", "qsrc", "qdst", "span", "outer", "order", "=group", "=shift", "=copies", "luts", "out"),
    "wpairs": ("src", "qsrc", "qdst", "span", "outer", "order", "=group", "=shift", "=copies", "luts", "out"),
    "quads": ("src", "rows", "=quads", "=step", "unread", "luts", "out"),
    "lut8": ("src", "lut", "out"),
}
_NI_INDEX = ("<i4", "<i8")
#: each kernel's arrays: the element types it takes and the dimensions after the first it assumes (None: any)
_NI_ARRAYS = {
    "words": {"src": (("|u1",), None), "inner": (_NI_INDEX, ()), "outer": (_NI_INDEX, ()),
              "luts": (("<i4",), (256,)), "out": (("<i4",), None)},
    "wquads": {"src": (("<i4",), ()), "qsrc": (_NI_INDEX, (4,)), "qdst": (_NI_INDEX, (4,)), "span": (_NI_INDEX, ()),
               "outer": (_NI_INDEX, ()), "order": (("<i8",), ()), "luts": (("<i4",), (256,)),
               "out": (("<i4",), None)},
    "wpairs": {"src": (("<i4",), ()), "qsrc": (_NI_INDEX, (2,)), "qdst": (_NI_INDEX, (2,)), "span": (_NI_INDEX, ()),
               "outer": (_NI_INDEX, ()), "order": (("<i8",), ()), "luts": (("<i4",), (65536,)),
               "out": (("<i4",), None)},
    "quads": {"src": (("<i4",), ()), "rows": (_NI_INDEX, (4,)), "unread": (("|u1",), (4,)),
              "luts": (("<i4",), (256,)), "out": (("<i4",), None)},
    "lut8": {"src": (("|u1",), None), "lut": (("|u1",), ()), "out": (("|u1",), None)},
}
_NI_LEAST = {("wquads", "luts"): 4, ("wpairs", "luts"): 2, ("words", "luts"): 4, ("quads", "luts"): 4,
             ("wquads", "span"): 2, ("wpairs", "span"): 2, ("lut8", "lut"): 256}  # rows an array needs at least
_NI_PARTS_PER_THREAD = 8  # parts a thread takes in turn (a slowed thread takes fewer)
_NI_MOST_GROUP = 16  # blocks the quads and pairs kernels take quad by quad, at most
#: quads ahead whose source lines a kernel of grouped blocks prefetches (blocks that share lines read across rows,
#: which the hardware's prefetch did not follow: with the groups, Marlin's weights' kernel about half its time; 4-32
#: ahead alike; blocks one by one read runs it follows, and prefetching took hopper's and GPTQ's 1.1-1.35x)
_NI_AHEAD = 8
_NI_ZERO = (ctypes.c_int64 * 1)()  # the address an empty array is given


class _Ir:
    # lines of one function's IR and the label of the block being written (a phi names its predecessors)
    def __init__(self, types):
        self.lines, self.block, self.types, self.n = [], "entry", types, 0

    def emit(self, *lines):
        self.lines += [f"  {line}" for line in lines]

    def label(self, name):
        self.lines.append(f"{name}:")
        self.block = name

    def fresh(self, stem):
        self.n += 1
        return f"%{stem}.{self.n}"

    def at(self, array, index, wide=True):
        # array[index] (index an i64 value), extended to i64 where `wide` (signed or not, as its type is)
        ty, signed = _NI_TYPES[self.types[array]]
        p, v = self.fresh(f"{array}.p"), self.fresh(f"{array}.v")
        self.emit(f"{p} = getelementptr {ty}, {ty}* %{array}, i64 {index}", f"{v} = load {ty}, {ty}* {p}")
        if not wide or ty == "i64":
            return v
        w = self.fresh(f"{array}.w")
        self.emit(f"{w} = {'sext' if signed else 'zext'} {ty} {v} to i64")
        return w

    def store(self, array, index, value):
        ty = _NI_TYPES[self.types[array]][0]
        p = self.fresh(f"{array}.q")
        self.emit(f"{p} = getelementptr {ty}, {ty}* %{array}, i64 {index}", f"store {ty} {value}, {ty}* {p}")

    def check(self, *bad):
        # to %fail (the kernel returns 1) where any of the i1 values `bad` is set
        got = bad[0]
        for b in bad[1:]:
            o = self.fresh("bad")
            self.emit(f"{o} = or i1 {got}, {b}")
            got = o
        ok = self.fresh("ok")[1:]
        self.emit(f"br i1 {got}, label %fail, label %{ok}")
        self.label(ok)

    def outside(self, a, n="%n"):
        # i1: a < 0 or a >= n
        lo, hi, o = self.fresh("lt"), self.fresh("ge"), self.fresh("out")
        self.emit(f"{lo} = icmp slt i64 {a}, 0", f"{hi} = icmp sge i64 {a}, {n}", f"{o} = or i1 {lo}, {hi}")
        return o

    def loop(self, var, start, end, body):
        # for var in [start, end): body(); `body` may add blocks (it ends in the block it leaves)
        head, run, latch, done = (self.fresh(f"{var}.{s}")[1:] for s in ("head", "body", "latch", "done"))
        before = self.block
        self.emit(f"br label %{head}")
        self.label(head)
        self.emit(f"%{var} = phi i64 [{start}, %{before}], [%{var}.next, %{latch}]",
                  f"%{var}.more = icmp slt i64 %{var}, {end}", f"br i1 %{var}.more, label %{run}, label %{done}")
        self.label(run)
        body()
        self.emit(f"br label %{latch}")
        self.label(latch)
        self.emit(f"%{var}.next = add i64 %{var}, 1", f"br label %{head}")
        self.label(done)


def _ni_lookup(ir, table, row, byte, width=256):
    # table[row, byte] of a [rows, width] int32 table (byte: an i64 in [0, width)), as i32
    i = ir.fresh("li")
    ir.emit(f"{i} = add i64 {byte}, {row * width}")
    return ir.at(table, i, wide=False)


def _ni_byte(ir, word, j, width=8):
    # bits 8 j .. 8 j + width - 1 of the i32 `word`, as an i64
    s, m, w = ir.fresh("sh"), ir.fresh("m"), ir.fresh("b")
    ir.emit(f"{s} = lshr i32 {word}, {8 * j}", f"{m} = and i32 {s}, {(1 << width) - 1}", f"{w} = zext i32 {m} to i64")
    return w


def _ni_or(ir, values):
    got = values[0]
    for v in values[1:]:
        o = ir.fresh("or")
        ir.emit(f"{o} = or i32 {got}, {v}")
        got = o
    return got


def _ni_words(ir):
    # output byte i of expert e: src[inner[i & (2^ps - 1)] + outer[i >> ps] + e shift], 0 where the inner entry
    # is negative; word w = OR_b luts[b, byte 4 w + b]
    ir.emit("%per0 = mul i64 %outer.n, %inner.n", "%per = sdiv i64 %per0, 4", "%pm0 = shl i64 1, %ps",
            "%pm = sub i64 %pm0, 1")

    def word():
        ir.emit("%i = mul i64 %w, 4", "%blk = ashr i64 %i, %ps")
        o = ir.at("outer", "%blk")
        ir.emit(f"%off = add i64 {o}, %es", "%j = and i64 %i, %pm")
        parts = []
        for b in range(4):
            ir.emit(f"%jb{b} = add i64 %j, {b}")
            v = ir.at("inner", f"%jb{b}")
            ir.emit(f"%a{b} = add i64 {v}, %off", f"%live{b} = icmp sge i64 {v}, 0")
            out = ir.outside(f"%a{b}")
            ir.emit(f"%bad{b} = and i1 %live{b}, {out}")
            ir.check(f"%bad{b}")
            ir.emit(f"%as{b} = select i1 %live{b}, i64 %a{b}, i64 0")
            s = ir.at("src", f"%as{b}")
            ir.emit(f"%sv{b} = select i1 %live{b}, i64 {s}, i64 0")
            parts.append(_ni_lookup(ir, "luts", b, f"%sv{b}"))
        ir.emit("%ow = add i64 %base, %w")
        ir.store("out", "%ow", _ni_or(ir, parts))

    def expert():
        ir.emit("%es = mul i64 %e, %shift", "%base = mul i64 %e, %per")
        ir.loop("w", "%lo", "%hi", word)

    ir.loop("e", "0", "%copies", expert)


def _ni_groups(ir, width, group):
    # wquads (width 4) and wpairs (width 2): group q of block k of expert e reads source words qsrc[q, b] +
    # outer[k] + e shift; quads: output word j (at qdst[q, j]) is OR_b luts[b, byte j of word b]; pairs: half-word
    # j of word 0, then of word 1, through halves[c, v] (65536 entries a table). Blocks go in the order
    # order[lo:hi], `group` of them quad by quad (the rest of a part's blocks one by one): each reads its words of
    # a quad's source lines while they are in L1 (_ni_block_order). `group` is the IR's: with the blocks'
    # offsets and bases as values, not a loop over a stack array of them (that took 1.7x the time on Marlin's)
    def expert():
        ir.emit("%es = mul i64 %e, %shift", "%eb = mul i64 %e, %outer.n")
        ir.loop("g", "%lo", "%whole", blocks)
        if group > 1:
            ir.loop("i", "%rest", "%upto", lambda: one_block("%i"))

    def setup(i, t):
        # block order[i]'s source offset %off.t and output base %base.t, its reads checked
        ir.check(ir.outside(i, "%order.n"))
        k = ir.at("order", i)
        ir.check(ir.outside(k, "%outer.n"))
        o = ir.at("outer", k)
        ir.emit(f"%off.{t} = add i64 {o}, %es")
        s0, s1 = ir.at("span", "0"), ir.at("span", "1")
        lo, hi, lob, hib = (ir.fresh(v) for v in ("lo.a", "hi.a", "lo.bad", "hi.bad"))
        ir.emit(f"{lo} = add i64 {s0}, %off.{t}", f"{hi} = add i64 {s1}, %off.{t}", f"{lob} = icmp slt i64 {lo}, 0",
                f"{hib} = icmp sge i64 {hi}, %n")
        ir.check(lob, hib)
        ebk, base = ir.fresh("ebk"), ir.fresh("base")
        ir.emit(f"{ebk} = add i64 %eb, {k}", f"{base} = mul i64 {ebk}, {width}",
                f"%base.{t} = mul i64 {base}, %qsrc.n")

    def blocks():
        ir.emit(f"%i0 = mul i64 %g, {group}")
        for t in range(group):
            i = ir.fresh("i")
            ir.emit(f"{i} = add i64 %i0, {t}")
            setup(i, f"g{t}")
        ir.loop("q", "0", "%qsrc.n", lambda: quad("%q", [f"g{t}" for t in range(group)]))

    def one_block(i):
        setup(i, "one")
        ir.loop("qo", "0", "%qsrc.n", lambda: quad("%qo", ["one"]))

    def quad(q, tags):
        qw = ir.fresh("qw")
        ir.emit(f"{qw} = mul i64 {q}, {width}")
        at, to = [], []
        for b in range(width):
            qi = ir.fresh("qi")
            ir.emit(f"{qi} = add i64 {qw}, {b}")
            at.append(ir.at("qsrc", qi))
            to.append(ir.at("qdst", qi))
        if group > 1 and _NI_AHEAD:  # the source lines of the quad _NI_AHEAD on (its index clamped to the table)
            ah, al, ac, aw = ir.fresh("ah"), ir.fresh("al"), ir.fresh("ac"), ir.fresh("aw")
            ir.emit(f"{ah} = add i64 {q}, {_NI_AHEAD}", f"{al} = sub i64 %qsrc.n, 1",
                    f"{ac} = call i64 @llvm.smin.i64(i64 {ah}, i64 {al})", f"{aw} = mul i64 {ac}, {width}")
            for b in range(width):
                ai, pa, pp = ir.fresh("ai"), ir.fresh("pa"), ir.fresh("pp")
                ir.emit(f"{ai} = add i64 {aw}, {b}")
                v = ir.at("qsrc", ai)
                pb = ir.fresh("pb")
                ir.emit(f"{pa} = add i64 {v}, %off.{tags[0]}", f"{pp} = getelementptr i32, i32* %src, i64 {pa}",
                        f"{pb} = bitcast i32* {pp} to i8*",
                        f"call void @llvm.prefetch.p0i8(i8* {pb}, i32 0, i32 3, i32 1)")
        for t in tags:
            words = []
            for b in range(width):
                sa = ir.fresh("sa")
                ir.emit(f"{sa} = add i64 {at[b]}, %off.{t}")
                words.append(ir.at("src", sa, wide=False))
            for j in range(width):
                if width == 4:
                    value = _ni_or(ir, [_ni_lookup(ir, "luts", b, _ni_byte(ir, words[b], j)) for b in range(4)])
                else:
                    value = _ni_or(ir, [_ni_lookup(ir, "luts", c, _ni_byte(ir, words[c], 2 * j, 16), 65536)
                                        for c in range(2)])
                od = ir.fresh("od")
                ir.emit(f"{od} = add i64 %base.{t}, {to[j]}")
                ir.store("out", od, value)

    # groups [lo, hi): blocks [lo group, min(hi group, blocks)); whole groups, then the rest one by one
    ir.emit(f"%from = mul i64 %lo, {group}", f"%upto0 = mul i64 %hi, {group}",
            "%upto = call i64 @llvm.smin.i64(i64 %upto0, i64 %outer.n)", "%span.b = sub i64 %upto, %from",
            "%some = icmp sgt i64 %span.b, 0", "%span.c = select i1 %some, i64 %span.b, i64 0",
            f"%nwhole = sdiv i64 %span.c, {group}", "%whole = add i64 %lo, %nwhole",
            f"%wb = mul i64 %nwhole, {group}", "%rest = add i64 %from, %wb")
    ir.loop("e", "0", "%copies", expert)


def _ni_quads(ir):
    # row r's quad q reads source words rows[r, b] + q step (b = 0..3; 0 where unread[r, b]: a row with any unread
    # word checks each read word, else the row's reads are checked once); output word j at (r quads + q) 4 + j is
    # OR_b luts[b, byte j of word b]
    # far: the quads of a row span n words or more (any read word then falls outside), found before (quads - 1)
    # step is formed, which could wrap; without it, a row's first and last quads bound all of its reads
    ir.emit("%masked = icmp sgt i64 %unread.n, 0", "%last = sub i64 %quads, 1", "%many = icmp sgt i64 %quads, 1",
            "%moves = icmp ne i64 %step, 0", "%negn = sub i64 0, %n", "%big0 = icmp sgt i64 %step, %n",
            "%big1 = icmp slt i64 %step, %negn", "%big = or i1 %big0, %big1", "%negstep = sub i64 0, %step",
            "%neg = icmp slt i64 %step, 0", "%abs = select i1 %neg, i64 %negstep, i64 %step",
            "%zero = icmp eq i64 %step, 0", "%nodiv = or i1 %big, %zero", "%div = select i1 %nodiv, i64 1, i64 %abs",
            "%n1 = sub i64 %n, 1",
            "%room = sdiv i64 %n1, %div", "%over = icmp sgt i64 %last, %room", "%wide = or i1 %big, %over",
            "%far0 = and i1 %many, %moves", "%far = and i1 %far0, %wide",
            "%lastoff0 = mul i64 %last, %step", "%lastoff = select i1 %far, i64 0, i64 %lastoff0")

    def row():
        ir.emit("%r4 = mul i64 %r, 4")
        starts = []
        for b in range(4):
            ir.emit(f"%ri{b} = add i64 %r4, {b}")
            starts.append(ir.at("rows", f"%ri{b}"))
        ir.emit("%d0q = mul i64 %r, %quads", "%d0 = mul i64 %d0q, 4")
        ir.emit("br i1 %masked, label %mrow, label %plain")
        ir.label("mrow")  # any unread word in the row? (a row of a table with no unread words never is)
        gone = []
        for b in range(4):
            u = ir.at("unread", f"%ri{b}")
            ir.emit(f"%gone{b} = icmp ne i64 {u}, 0")
            gone.append(f"%gone{b}")
        ir.emit("%g01 = or i1 %gone0, %gone1", "%g23 = or i1 %gone2, %gone3", "%anygone = or i1 %g01, %g23",
                "br i1 %anygone, label %slow, label %plain")
        ir.label("slow")
        ir.loop("qs", "0", "%quads", lambda: quad("%qs", starts, gone))
        ir.emit("br label %rowdone")
        ir.label("plain")
        ir.emit("%hasq = icmp ne i64 %quads, 0", "br i1 %hasq, label %plainrun, label %rowdone")
        ir.label("plainrun")
        ir.emit(f"%mn01 = call i64 @llvm.smin.i64(i64 {starts[0]}, i64 {starts[1]})",
                f"%mn23 = call i64 @llvm.smin.i64(i64 {starts[2]}, i64 {starts[3]})",
                "%mn = call i64 @llvm.smin.i64(i64 %mn01, i64 %mn23)",
                f"%mx01 = call i64 @llvm.smax.i64(i64 {starts[0]}, i64 {starts[1]})",
                f"%mx23 = call i64 @llvm.smax.i64(i64 {starts[2]}, i64 {starts[3]})",
                "%mx = call i64 @llvm.smax.i64(i64 %mx01, i64 %mx23)",
                "%mnl = add i64 %mn, %lastoff", "%mxl = add i64 %mx, %lastoff",
                "%pb0 = icmp slt i64 %mn, 0", "%pb1 = icmp sge i64 %mxl, %n", "%pb2 = icmp slt i64 %mnl, 0",
                "%pb3 = icmp sge i64 %mx, %n", "%pb4 = icmp slt i64 %mxl, 0")
        ir.check("%far", "%pb0", "%pb1", "%pb2", "%pb3", "%pb4")
        ir.loop("qp", "0", "%quads", lambda: quad("%qp", starts, None))
        ir.emit("br label %rowdone")
        ir.label("rowdone")

    def quad(q, starts, gone):
        o = ir.fresh("o")
        ir.emit(f"{o} = mul i64 {q}, %step")
        words = []
        for b in range(4):
            a = ir.fresh("a")
            ir.emit(f"{a} = add i64 {starts[b]}, {o}")
            if gone is None:
                words.append(ir.at("src", a, wide=False))
                continue
            out = ir.outside(a)
            live, bad, safe, w = ir.fresh("live"), ir.fresh("bad"), ir.fresh("safe"), ir.fresh("w")
            wide = ir.fresh("wide")
            ir.emit(f"{live} = xor i1 {gone[b]}, true", f"{wide} = or i1 {out}, %far",
                    f"{bad} = and i1 {live}, {wide}")
            ir.check(bad)
            ir.emit(f"{safe} = select i1 {live}, i64 {a}, i64 0")
            s = ir.at("src", safe, wide=False)
            ir.emit(f"{w} = select i1 {live}, i32 {s}, i32 0")
            words.append(w)
        d = ir.fresh("d")
        ir.emit(f"{d} = mul i64 {q}, 4")
        for j in range(4):
            value = _ni_or(ir, [_ni_lookup(ir, "luts", b, _ni_byte(ir, words[b], j)) for b in range(4)])
            at = ir.fresh("at")
            ir.emit(f"{at} = add i64 %d0, {d}")
            at2 = ir.fresh("at")
            ir.emit(f"{at2} = add i64 {at}, {j}")
            ir.store("out", at2, value)

    ir.loop("r", "%lo", "%hi", row)


def _ni_lut8(ir):
    def byte():
        v = ir.at("src", "%i")
        ir.store("out", "%i", ir.at("lut", v, wide=False))

    ir.loop("i", "%lo", "%hi", byte)


_NI_GROUPED = ("wquads", "wpairs")  # the kernels whose IR takes blocks in groups (and lo, hi in groups)
_NI_WRITERS = {"words": _ni_words, "wquads": lambda ir, group: _ni_groups(ir, 4, group),
               "wpairs": lambda ir, group: _ni_groups(ir, 2, group), "quads": _ni_quads, "lut8": _ni_lut8}


def _ni_ir(name, types, group=1):
    """LLVM IR of kernel ``name`` for arrays of element ``types`` (numpy dtype strings by argument name):
    ``ni_kernel(...)`` (each argument as an i64 pointer or integer and its first dimension, then lo, hi; returns 1
    where a read would fall outside the source, else 0) and ``ni_body(job)``. Made from the names and types
    only, and for the quads and pairs kernels the blocks a group (an int in [1, _NI_MOST_GROUP]; their lo and hi
    count groups of blocks then)."""
    group = int(group)
    if not 1 <= group <= (_NI_MOST_GROUP if name in _NI_GROUPED else 1):
        raise ValueError(f"native IR kernel {name!r} takes no group of {group} blocks")
    args = _NI_ARGS[name]
    params = []
    for a in args:
        if a.startswith("="):
            params += [f"i64 %{a[1:]}", f"i64 %{a[1:]}.unused"]
        else:
            params += [f"{_NI_TYPES[types[a]][0]}* %{a}", f"i64 %{a}.n"]
    ir = _Ir(types)
    ir.lines += ["declare i64 @llvm.smin.i64(i64, i64)", "declare i64 @llvm.smax.i64(i64, i64)",
                 "declare void @llvm.prefetch.p0i8(i8*, i32, i32, i32)", "",
                 f"define i32 @ni_kernel({', '.join(params)}, i64 %lo, i64 %hi) {{", "entry:"]
    ir.emit("%n = add i64 %src.n, 0")
    if name in _NI_GROUPED:
        _NI_WRITERS[name](ir, group)
    else:
        _NI_WRITERS[name](ir)
    ir.emit("ret i32 0")
    ir.lines += ["fail:", "  ret i32 1", "}", "", "define void @ni_body(i64* %job) {", "entry:"]
    call = []
    for i, a in enumerate(args):
        slot = 4 + 2 * i
        ir.emit(f"%j{i}.p = getelementptr i64, i64* %job, i64 {slot}", f"%j{i} = load i64, i64* %j{i}.p",
                f"%j{i}.np = getelementptr i64, i64* %job, i64 {slot + 1}", f"%j{i}.n = load i64, i64* %j{i}.np")
        if a.startswith("="):
            call.append(f"i64 %j{i}")
        else:
            ty = _NI_TYPES[types[a]][0]
            ir.emit(f"%j{i}.a = inttoptr i64 %j{i} to {ty}*")
            call.append(f"{ty}* %j{i}.a")
        call.append(f"i64 %j{i}.n")
    ir.emit("%parts.p = getelementptr i64, i64* %job, i64 2", "%parts = load i64, i64* %parts.p",
            "%total.p = getelementptr i64, i64* %job, i64 3", "%total = load i64, i64* %total.p",
            "%failed = getelementptr i64, i64* %job, i64 1", "br label %take")
    ir.lines += ["take:"]
    ir.emit("%k = atomicrmw add i64* %job, i64 1 monotonic", "%more = icmp slt i64 %k, %parts",
            "br i1 %more, label %run, label %done")
    ir.lines += ["run:"]
    ir.emit("%k1 = add i64 %k, 1", "%t0 = mul i64 %total, %k", "%lo = sdiv i64 %t0, %parts",
            "%t1 = mul i64 %total, %k1", "%hi = sdiv i64 %t1, %parts",
            f"%bad = call i32 @ni_kernel({', '.join(call)}, i64 %lo, i64 %hi)", "%isbad = icmp ne i32 %bad, 0",
            "br i1 %isbad, label %mark, label %take")
    ir.lines += ["mark:"]
    ir.emit("%old = atomicrmw add i64* %failed, i64 1 monotonic", "br label %take")
    ir.lines += ["done:", "  ret void", "}"]
    return "\n".join(ir.lines) + "\n"


def _ni_block_order(outer, quads):
    """The order in which the quads and pairs kernels take a words plan's blocks (source offsets ``outer``, in
    bytes), and how many in turn share a cache line, as ``(order, group)``. Quads: blocks sorted by offset, and 64
    bytes over the least gap between two offsets where it is less than a line (Marlin's blocks each read 8 bytes of
    the same rows: 8 a line), else the blocks as they are and 1. The IR kernel takes a group's blocks quad by quad,
    so a line is read by all of them while it is in L1: Marlin's rows lie 1 KiB apart, a block's 2048 lines fell in
    4 of L1's sets and each was fetched again for the next block (its weights' kernel about half the time in groups
    of 8, their lines prefetched ahead: _NI_AHEAD). Pairs one by one: W4A8's blocks (4 a line) took 1.3-1.9x the
    time in groups of 2, 4 or 8, their 512 KiB of half-word tables beside the group's lines (BENCHMARKS.md)."""
    so, order = torch.sort(outer.to(torch.int64), stable=True)
    gaps = torch.diff(so)
    gaps = gaps[gaps > 0]
    least = int(gaps.min()) if gaps.numel() else 0
    if not quads or not 0 < least < 64:
        return torch.arange(outer.numel(), dtype=torch.int64).numpy(), 1
    return order.contiguous().numpy(), min(_NI_MOST_GROUP, 64 // least)


def _ni_permutation(order, n):
    # whether the int64 array `order` holds each of 0 .. n - 1 once (the kernels' block order: every output block
    # written, none read outside the blocks)
    if order.shape[0] != n:
        return False
    if n == 0:
        return True
    ranked = order.copy()
    ranked.sort()
    return int(ranked[0]) == 0 and int(ranked[-1]) == n - 1 and bool((ranked[1:] > ranked[:-1]).all())


def _ni_on():
    """Whether the IR kernels run here (``LAYOUTC_NATIVE_IR`` is not ``0``, read per call; llvmlite 0.44 or later
    imports and the host is x86-64, looked up once), without compiling any."""
    import os

    if os.environ.get("LAYOUTC_NATIVE_IR", "1").strip() == "0":
        return False
    if "host" not in _NI_STATE:
        host = _fp_llvm(())
        # the kernels are written plainly and left to LLVM's O3 pipeline (new pass manager: llvmlite 0.44 on);
        # without it the wpairs kernel took 1.7x numba's time
        _NI_STATE["host"] = host if host is not None and hasattr(host[0], "create_pass_builder") else None
    return _NI_STATE["host"] is not None


def _ni_run(name, args, total, threads):
    """Kernel ``name`` of the numba kernel's arguments ``args`` (contiguous numpy arrays and integers) over [0,
    total) in parts on ``threads`` threads; True where any part would read outside its source (nothing past it
    read). Compiled once per process for each kernel and its arrays' element types."""
    names = _NI_ARGS[name]
    if len(args) != len(names):
        raise TypeError(f"native IR kernel {name!r} takes {len(names)} arguments, not {len(args)}")
    types, slots = {}, [0, 0, 0, total]
    for a, value in zip(names, args):
        if a.startswith("="):
            slots += [int(value), 0]
            continue
        kind = value.dtype.str
        kinds, inner = _NI_ARRAYS[name][a]
        if (kind not in kinds or not value.flags.c_contiguous or (inner is not None and value.shape[1:] != inner)
                or value.shape[0] < _NI_LEAST.get((name, a), 0)):
            raise TypeError(f"native IR kernel {name!r}: argument {a} is a {kind} array of shape {value.shape}, "
                            "which the kernel does not take")
        types[a] = kind
        # an empty array's address may be anything: a zero word's instead (a kernel loads an element it then
        # does not use, e.g. src[0] for padding, only at addresses its checks allow or at 0)
        slots += [value.ctypes.data if value.size else ctypes.addressof(_NI_ZERO), int(value.shape[0])]
    group = 1
    if name in _NI_GROUPED:  # parts of whole groups of blocks: the blocks a group are the IR's
        group, order = int(args[names.index("=group")]), args[names.index("order")]
        if not 1 <= group <= _NI_MOST_GROUP:
            raise ValueError(f"native IR kernel {name!r} takes groups of 1 to {_NI_MOST_GROUP} blocks, not {group}")
        if total != args[names.index("outer")].shape[0] or not _ni_permutation(order, total):
            raise TypeError(f"native IR kernel {name!r} runs every block once (total {total}, an order of "
                            f"{order.shape[0]})")
        # at least a group a thread (experts go inside a part: a plan of few blocks would else run on one thread)
        group = max(1, min(group, total // max(1, threads)))
        total = slots[3] = -(-total // group)
    key = (name, tuple(sorted(types.items())), group)
    got = _NI_STATE.get(key)
    if got is None:
        engine = _fp_jit(*_NI_STATE["host"], _ni_ir(name, types, group), optimize=True)
        body = engine.get_function_address("ni_body")
        got = _NI_STATE[key] = engine, body, ctypes.CFUNCTYPE(None, ctypes.c_void_p)(body)
    _, body, call = got
    parts = max(1, min(total, threads * _NI_PARTS_PER_THREAD)) if threads > 1 else 1
    slots[2] = parts
    job = (ctypes.c_int64 * len(slots))(*slots)
    _fp_run_job(body, call, job, threads, _fp_gomp() if threads > 1 else None)
    return job[1] != 0
