"""The native CPU kernels (layoutc.lower.native, numba) equal the torch forms and the element gather bit for bit.

The SIMD kernel is switched off here (``LAYOUTC_SIMD=0``): these are the numba kernels' tests (where the SIMD kernel
does not run, they run); ``test_native_simd.py`` holds the SIMD kernel to the same forms.

Each kernel is driven as generated converters drive it, from the text they carry (``runs_source``,
``native_source`` and ``bit_tables_source`` executed in one namespace): words plans (random byte maps in
runs of 1 to 8 bytes, padding, expert-0 tables moved per expert, random permutations, bytewise
conversions; block tables of quads or pairs of words, against the per-byte kernel too), SM90 quads (rows of quads at a step, per-quad indices with unread words), the permutation
alone, and the lookups of value conversions. The same namespace with ``_nb`` returning None is the torch
form. The kernels compile once per test process (the ``native_ns`` fixture; numba caches them on disk
by this package's file), so each test stays well under a second after that.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.lower import codegen, native, torch_emit
from layoutc.runtime import cpu_kernels, fingerprint
from tests.helpers import assert_same_bits
from tests.helpers import spec as _spec

numba = pytest.importorskip("numba")


@pytest.fixture(autouse=True, scope="module")
def _numba_kernels_only():
    # The numba kernels themselves here: the SIMD kernel (LLVM IR, its switch read per call) would take the plans
    # whose chunks it can; tests/lower/test_native_simd.py holds it to the same forms.
    # The IR kernels of the same names (layoutc.lower.native_ir, switch read per call) are off too:
    # tests/lower/test_native_ir.py runs these tests with them on.
    with pytest.MonkeyPatch.context() as m:
        m.setenv("LAYOUTC_SIMD", "0")
        m.setenv("LAYOUTC_NATIVE_IR", "0")
        yield


def _namespace(on: bool) -> dict:
    namespace = {"torch": torch, "__name__": "native_test_namespace"}
    # the CPU kernels' and the fingerprint's run time, which every converter carries (the native code takes its
    # GOMP_parallel look-up and threads from the first)
    runtime = codegen.module_text(cpu_kernels) + codegen.module_text(fingerprint)
    exec("import ctypes, hashlib, linecache, os\n" + runtime, namespace)
    exec(torch_emit.runs_source(), namespace)  # the text generated converters carry
    exec(torch_emit.native_source(), namespace)
    exec(torch_emit.bit_tables_source(), namespace)
    if not on:
        namespace["_nb"] = lambda: None
        namespace["_ni_on"] = lambda: False
    return namespace


def _kernel_ran(ns, name):
    # whether kernel `name` ran in namespace `ns`: compiled as IR (where the IR kernels are on) or by numba
    if ns["_ni_on"]():
        return any(isinstance(k, tuple) and k[0] == name for k in ns["_NI_STATE"])
    return bool(ns["_nb"]()[name].signatures)


@pytest.fixture(scope="session")
def native_ns():
    """The converters' text with numba on, its two kernels compiled once (shared by every test here)."""
    assert native._nb() is not None  # this package's kernels first: numba caches them by its file, and the
    ns = _namespace(True)  # converters' text (the same code) shares them in this process
    assert ns["_nb"]() is not None
    flat = torch.arange(64, dtype=torch.uint8)
    ns["_nb_words"](flat, ("native", torch.arange(8, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), 62, 1, 0),
                    (2,), tuple(range(32)))
    ns["_nb_quads"](flat.view(torch.int32), torch.zeros(1, 4, dtype=torch.int32), 1, 0, None, tuple(range(32)), (4,))
    return ns


def _per_bit(words: torch.Tensor, table) -> torch.Tensor:
    w = words.to(torch.int64) & 0xFFFFFFFF
    return sum(((w >> s) & 1) << i for i, s in enumerate(table))


def _element_gather(flat, index, fill):
    ok = index >= 0
    return torch.where(ok, flat[torch.where(ok, index, 0)], torch.as_tensor(fill, dtype=flat.dtype))


def _random_map(g: torch.Generator, experts: int, per: int, run: int, src_per: int, holes: bool):
    """Expert 0's source element of each of ``per`` outputs, in runs of ``run`` (-1: fill), reading
    [0, src_per); every expert reads its own the same way."""
    runs = per // run
    starts = torch.randint(0, src_per - run + 1, (runs,), generator=g)
    if holes:
        starts[torch.rand(runs, generator=g) < 0.3] = -1
    index = (starts.unsqueeze(1) + torch.arange(run)).reshape(-1)
    index[(starts < 0).repeat_interleave(run)] = -1
    return index


@given(seed=st.integers(0, 2**16), table=st.permutations(range(32)), ps=st.integers(2, 5), blocks=st.integers(1, 6),
       experts=st.integers(1, 2))
@settings(max_examples=6, deadline=None)
def test_block_periodic_tables_are_one_block_and_offsets(native_ns, seed, table, ps, blocks, experts):
    g = torch.Generator().manual_seed(seed)
    size = 1 << ps
    block = torch.randint(0, 40, (size,), generator=g)
    block[torch.rand(size, generator=g) < 0.2] = -1
    offsets = torch.randint(0, 40, (blocks,), generator=g)
    index0 = torch.where(block >= 0, block + offsets.unsqueeze(1), -1).reshape(-1)
    src_per = 80
    x = torch.randint(0, 256, (experts * src_per,), generator=g).to(torch.uint8)
    native_ns["_RUN_PLANS"].clear()
    per = blocks * size
    plan = native_ns["_run_plan"](("b",), lambda s, e: index0.view(1, per), (), (experts, per), 1, src_per, words=True)
    assert plan[0] == "native"
    if blocks > 1 and bool((block >= 0).any()):
        assert plan[3] >= ps and plan[1].numel() == 1 << plan[3] and plan[2].numel() == per >> plan[3]
    whole = torch.cat([torch.where(index0 >= 0, index0 + e * src_per, -1) for e in range(experts)])
    want = _per_bit(_element_gather(x, whole, 0).view(torch.int32), tuple(table)).view(experts, per // 4)
    got = native_ns["_nb_words"](x, plan, (experts, per // 4), tuple(table))
    assert torch.equal(got.to(torch.int64) & 0xFFFFFFFF, want)


def _group_table(g: torch.Generator, groups: int, src_words: int, size: int):
    """A block table of ``groups`` quads (``size`` 4) or pairs (2): expert 0's source byte of each output byte.
    Group q reads ``size`` random words of [0, src_words) (no word read twice) and writes ``size`` output words
    at random places; a quad's output word j has byte j of source word b as its byte b, a pair's output word j has bytes
    2j, 2j + 1 of source word c as its bytes 2c, 2c + 1."""
    qsrc = torch.randperm(src_words, generator=g)[:size * groups].view(groups, size)
    qdst = torch.randperm(size * groups, generator=g).view(groups, size)
    inner = torch.empty(size * groups, 4, dtype=torch.int64)
    for j in range(size):
        if size == 4:
            inner[qdst[:, j]] = 4 * qsrc + j
        else:
            inner[qdst[:, j]] = (4 * qsrc + 2 * j).repeat_interleave(2, dim=1) + torch.tensor([0, 1, 0, 1])
    return inner.reshape(-1).to(torch.int32)


@given(seed=st.integers(0, 2**16), table=st.permutations(range(32)), groups=st.sampled_from([4, 8]),
       size=st.sampled_from([2, 4]), blocks=st.integers(1, 3), experts=st.integers(1, 2), convert=st.booleans(),
       split=st.sampled_from([1, 1 << 16]))
@settings(max_examples=16, deadline=None)
def test_word_groups_equal_the_per_byte_kernel_and_the_reference(native_ns, seed, table, groups, size, blocks, experts,
                                                                 convert, split):
    """A block table of quads or pairs takes their kernel, found in the table's data; its words equal the
    per-byte kernel's (the plan without its groups) and the element gather's."""
    native_ns["_NB_MIN_SPLIT"] = split
    g = torch.Generator().manual_seed(seed)
    src_per = 4 * 80  # bytes an expert
    inner = _group_table(g, groups, 64, size)
    outer = (4 * torch.randint(0, 8, (blocks,), generator=g)).to(torch.int32)  # whole words
    ps = (inner.numel() - 1).bit_length()
    found = native_ns["_nb_word_quads"](inner)
    assert found is not None and found[0].shape == (groups, size)
    plan = ("native", inner, outer, ps if blocks > 1 else 62, experts, src_per, found)
    x = torch.randint(0, 256, (experts * src_per,), generator=g).to(torch.uint8)
    conv = _bytewise_xor if convert else None
    shape = (experts, blocks * groups * size)
    table = tuple(table)
    got = native_ns["_nb_words"](x, plan, shape, table, conv)
    assert _kernel_ran(native_ns, "wquads" if size == 4 else "wpairs")
    per_byte = native_ns["_nb_words"](x, plan[:6], shape, table, conv)
    index0 = (inner.unsqueeze(0) + outer.unsqueeze(1)).reshape(-1)
    whole = torch.cat([index0 + e * src_per for e in range(experts)])
    w = _element_gather(x, whole, 0).view(torch.int32)
    w = conv(w) if conv is not None else w
    want = _per_bit(w, table).view(shape)
    assert torch.equal(got.to(torch.int64) & 0xFFFFFFFF, want)
    assert torch.equal(per_byte, got)
    # what is neither stays on the per-byte kernel: a byte of another place, a padding byte
    other = inner.clone()
    other[0] = other[0] // 4 * 4 + (other[0] + 1) % 4
    assert native_ns["_nb_word_quads"](other) is None
    assert native_ns["_nb_word_quads"](torch.where(torch.arange(inner.numel()) == 5, -1, inner)) is None
    # blocks or experts moved by other than whole words, a source at an odd address: the per-byte kernel, same bits
    for moved, step, at in ((outer + 2, src_per, 0), (outer, src_per + 2, 0), (outer, src_per, 1)):
        y = torch.randint(0, 256, (experts * (src_per + 2) + 8,), generator=g).to(torch.uint8)[at:]
        index2 = (inner.unsqueeze(0) + moved.unsqueeze(1)).reshape(-1)
        w2 = _element_gather(y, torch.cat([index2 + e * step for e in range(experts)]), 0).view(torch.int32)
        w2 = conv(w2) if conv is not None else w2
        got2 = native_ns["_nb_words"](y, ("native", inner, moved, plan[3], experts, step, found), shape, table, conv)
        assert torch.equal(got2.to(torch.int64) & 0xFFFFFFFF, _per_bit(w2, table).view(shape))


def test_shipped_marlin_hopper_and_w4a8_tables_are_quads_or_pairs(native_ns):
    """The words plans of Marlin's and triton_kernels hopper's weights are quads, CUTLASS W4A8's pairs."""
    for name, size in (("marlin_gptq_int4", 4), ("triton_kernels_mxfp4_hopper", 4), ("vllm_cutlass_w4a8", 2)):
        spec = _spec(name)
        x = synthetic_inputs(spec, {"E": 2, "I": 256, "H": 256}, seed=3)
        spec.module._RUN_PLANS.clear()
        spec.convert(x, lowering="gather")
        plans = [v for v in spec.module._RUN_PLANS.values() if v is not None and v[0] == "native"]
        assert plans and all(p[6] is not None and p[6][0].shape[1] == size for p in plans), name


def _bytewise_xor(w):  # a conversion of each byte on its own (for the words kernel's byte tables)
    return w ^ 0x5A5A5A5A


@given(seed=st.integers(0, 2**16), table=st.permutations(range(32)), experts=st.integers(1, 3),
       run=st.sampled_from([1, 2, 4, 8]), holes=st.booleans(), convert=st.booleans(), split=st.sampled_from([1, 1 << 16]))
@settings(max_examples=10, deadline=None)
def test_words_gather_and_permutation_fused_equal_the_torch_form(native_ns, seed, table, experts, run, holes, convert,
                                                                 split):
    native_ns["_NB_MIN_SPLIT"] = split  # 1: every call in parts, on every intra-op thread
    g = torch.Generator().manual_seed(seed)
    words = 8 * run  # per expert
    per, src_per = 4 * words, 4 * words + 16
    index0 = _random_map(g, experts, per, run, src_per, holes)
    x = torch.randint(0, 256, (experts * src_per,), generator=g).to(torch.uint8)
    shape = (experts, words)
    table = tuple(table)
    conv = _bytewise_xor if convert else None
    torch_ns = _namespace(False)
    results = []
    for ns in (native_ns, torch_ns):
        ns["_RUN_PLANS"].clear()
        plan = ns["_run_plan"](("w",), lambda s, e: index0.view(1, per), (), (experts, per), 1, src_per, words=True)
        assert plan is not None
        assert (plan[0] == "native") == (ns is native_ns) or plan[0] == "view"
        if plan[0] == "native":
            results.append(ns["_nb_words"](x, plan, shape, table, conv))
        else:
            w = ns["_run_gather"](x, plan, (experts, per), 0).view(torch.int32)
            if conv is not None:
                w = conv(w)
            results.append(ns["_permute_words"](w, table))
    whole = torch.cat([torch.where(index0 >= 0, index0 + e * src_per, -1) for e in range(experts)])
    w = _element_gather(x, whole, 0).view(torch.int32)
    w = conv(w) if conv is not None else w
    want = _per_bit(w, table).view(shape)
    for got in results:
        assert torch.equal(got.to(torch.int64) & 0xFFFFFFFF, want)


@given(seed=st.integers(0, 2**16), table=st.permutations(range(32)), rows=st.integers(1, 6), quads=st.integers(1, 5),
       step=st.integers(0, 3), unread=st.booleans(), split=st.sampled_from([1, 1 << 16]))
@settings(max_examples=25, deadline=None)
def test_quads_equal_the_transpose_then_the_permutation(native_ns, seed, table, rows, quads, step, unread, split):
    native_ns["_NB_MIN_SPLIT"] = split  # 1: every call in parts, on every intra-op thread
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(-2**31, 2**31, (64,), dtype=torch.int64, generator=g).to(torch.int32)
    hi = 64 - (quads - 1) * step
    base = torch.randint(0, hi, (rows, 4), generator=g)
    mask = (torch.rand(rows, 4, generator=g) < 0.3) if unread else None
    if mask is not None:
        quads, step = 1, 0  # the per-quad index form: one quad a row
    got = native_ns["_nb_quads"](src, base, quads, step, mask, tuple(table), (rows, 4 * quads))
    # reference: source word b of quad q: base[r, b] + q * step (0 where unread); output word j's byte b is
    # byte j of source word b; then the permutation
    s = torch.stack([src[base[:, b].unsqueeze(1) + step * torch.arange(quads)] for b in range(4)], dim=-1)
    if mask is not None:
        s = torch.where(mask.unsqueeze(1), 0, s)
    w = s.contiguous().view(torch.uint8).view(rows, quads, 4, 4).transpose(-1, -2).contiguous().view(torch.int32)
    want = _per_bit(w.reshape(-1), tuple(table)).view(rows, 4 * quads)
    assert torch.equal(got.to(torch.int64) & 0xFFFFFFFF, want)


@given(seed=st.integers(0, 2**16), rows=st.integers(1, 6), per_row=st.integers(1, 6), step=st.integers(-2, 3),
       padding=st.booleans(), break_at=st.one_of(st.none(), st.integers(0, 10**6)))
@settings(max_examples=40, deadline=None)
def test_a_per_quad_index_of_rows_at_a_step_runs_as_those_rows(native_ns, seed, rows, per_row, step, padding,
                                                               break_at):
    # _nb_quads given a per-quad index (quads 1) whose data is rows of quads at one step (padding rows: every quad of
    # the row leaves the same words unread) runs it as those rows: the same words as the per-quad kernel; an index
    # that is not such rows (a read entry moved off the step, or one quad's word unread alone) is left as it is.
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(-2**31, 2**31, (257,), dtype=torch.int64, generator=g).to(torch.int32)  # one past a move
    lo = max(0, -step * (per_row - 1))
    first = torch.randint(lo, 256 - max(0, step * (per_row - 1)), (rows, 1, 4), generator=g)
    index = (first + step * torch.arange(per_row).view(1, -1, 1)).to(torch.int32)  # [row, quad, b]
    unread = None
    if padding:
        unread = (torch.rand(rows, 1, 4, generator=g) < 0.4).expand(-1, per_row, -1).contiguous()
        index = torch.where(unread, 0, index)
    broken = False
    if break_at is not None:
        at = break_at % index.numel()
        if unread is not None and break_at % 2:
            unread.view(-1)[at] = ~unread.view(-1)[at]  # one word unread (or read) alone in its row
            broken = True
        else:
            index.view(-1)[at] += 1  # off the step (with padding, the moved word may be unread, or the row's only
            broken = unread is None  # word read, whose rows are still at one step: the words above decide)
    table = tuple(torch.randperm(32, generator=g).tolist())
    shape = (rows, 4 * per_row)
    got = native_ns["_nb_quads"](src, index, 1, 0, unread, table, shape)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(native_ns, "_nb_quad_rows", lambda *a: None)
        want = native_ns["_nb_quads"](src, index, 1, 0, unread, table, shape)
    assert torch.equal(got, want)
    found = native_ns["_nb_quad_rows"](index, unread, per_row)
    if per_row == 1 or broken:
        assert found is None
    elif break_at is None:
        assert found is not None and found[1] == per_row
        assert found[2] == step or (unread is not None and bool(unread.all()))  # no word read: any step


@pytest.mark.parametrize("threads, total, bad", [(2, 1000, None), (3, 1000, None), (3, 5, None), (2, 1000, 999),
                                                 (3, 1000, 0)])
def test_parts_are_taken_once_each_and_a_failing_part_raises(native_ns, monkeypatch, threads, total, bad):
    # _nb_run's threads take parts from one counter (a thread slowed by another process takes fewer): the parts
    # cover [0, total) once each, whichever thread ran them, and a part whose kernel reports a bad read raises.
    import threading

    kernels = native_ns["_nb"]()
    seen, lock = [], threading.Lock()

    def kernel(lo, hi):
        if hi > lo:
            with lock:
                seen.append((lo, hi, threading.get_ident()))
        return int(bad is not None and lo <= bad < hi)

    monkeypatch.setitem(kernels, "fake", kernel)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    monkeypatch.setitem(native_ns, "_nb_gomp", lambda: None)  # Python threads (the OpenMP form: the next test)
    if bad is not None:
        with pytest.raises(IndexError, match="outside its input"):
            native_ns["_nb_run"]("fake", (), total, native_ns["_NB_MIN_SPLIT"])
        return
    native_ns["_nb_run"]("fake", (), total, native_ns["_NB_MIN_SPLIT"])
    parts = sorted((lo, hi) for lo, hi, _ in seen)
    assert parts[0][0] == 0 and parts[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # contiguous, none twice
    assert len(parts) == min(total, threads * native_ns["_NB_PARTS_PER_THREAD"])


@pytest.mark.parametrize("threads, total, bad", [(2, 1000, None), (3, 1000, None), (3, 5, None), (2, 1000, 999),
                                                 (3, 1000, 0), (2, 1, None)])
def test_openmp_threads_take_every_part_once_and_a_failing_part_raises(native_ns, monkeypatch, threads, total, bad):
    # Where torch runs on OpenMP, _nb_run runs a kernel's parts in one OpenMP region of torch's runtime (a numba
    # cfunc taking parts by an atomic counter): every index of [0, total) is written once, whichever thread took
    # its part, and a part whose kernel reports a bad read raises. The fake kernel is compiled as the real ones.
    gomp = native_ns["_nb_gomp"]()
    if gomp is None:
        pytest.skip("torch's CPU ops do not run on OpenMP here")
    kernels = native_ns["_nb"]()

    def fake(seen, bad, lo, hi):
        failed = 0
        for i in range(lo, hi):
            seen[i] += 1
            if i == bad:
                failed = 1
        return failed

    monkeypatch.setitem(kernels, "fake", numba.njit(nogil=True)(fake))
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    regions, run = [], native_ns["_nb_omp_run"]
    monkeypatch.setitem(native_ns, "_nb_omp_run", lambda *a: regions.append(a[-1]) or run(*a))
    seen = torch.zeros(total, dtype=torch.int64)
    args = (seen.numpy(), -1 if bad is None else bad)
    if bad is not None:
        with pytest.raises(IndexError, match="outside its input"):
            native_ns["_nb_run"]("fake", args, total, native_ns["_NB_MIN_SPLIT"])
        assert int(seen.sum()) == total  # the other parts still ran, each once
        return
    native_ns["_nb_run"]("fake", args, total, native_ns["_NB_MIN_SPLIT"])
    assert seen.tolist() == [1] * total
    assert regions == ([threads] if total > 1 else [])  # one region of all threads; one part: the caller alone


def test_calls_from_several_python_threads_at_once_give_the_eager_bits(monkeypatch):
    # Converters called from four Python threads at once (each call an OpenMP region of its own thread's team, or
    # the Python worker threads): every output equals the eager lowering's, on every kernel kind.
    import threading

    jobs = []
    for name in ("vllm_cutlass_w4a8", "flashinfer_cutlass_bf16", "marlin_nvfp4", "flashinfer_cutlass_mxfp4_padded"):
        s = _spec(name)
        x = synthetic_inputs(s, {"E": 2, "I": 512, "H": 1024}, seed=5)  # large enough for parts on 2 threads
        jobs.append((s, x, s.convert(x, lowering="eager", fingerprint=False)))
    regions = []
    for s, _, _ in jobs:  # count the OpenMP regions (where torch runs on OpenMP), each module's own function
        run = s.module._nb_omp_run
        monkeypatch.setattr(s.module, "_nb_omp_run", lambda *a, run=run: regions.append(a[2]) or run(*a))
    wrong = []

    def work(i):
        for r in range(4):
            s, x, want = jobs[(i + r) % len(jobs)]
            got = s.convert(x, fingerprint=False)
            wrong.extend((s.name, k) for k in want if not torch.equal(got[k].view(torch.uint8),
                                                                       want[k].view(torch.uint8)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    if jobs[0][0].module._nb_gomp() is not None and torch.get_num_threads() > 1:
        assert {"wpairs", "wquads", "quads"} <= set(regions)


def test_the_openmp_switch_leaves_python_threads(native_ns, monkeypatch):
    # LAYOUTC_NUMBA_OMP=0 (read on the first look-up in a process): the kernels' parts on Python threads.
    monkeypatch.delitem(native_ns["_NB_STATE"], "gomp", raising=False)
    monkeypatch.setenv("LAYOUTC_NUMBA_OMP", "0")
    assert native_ns["_nb_gomp"]() is None
    monkeypatch.delitem(native_ns["_NB_STATE"], "gomp")
    monkeypatch.delenv("LAYOUTC_NUMBA_OMP")
    on_openmp = "parallel backend: OpenMP" in torch.__config__.parallel_info()
    assert (native_ns["_nb_gomp"]() is not None) == (on_openmp and sys.platform.startswith("linux"))


def test_openmp_and_python_threads_give_the_same_words(native_ns, monkeypatch):
    # The three grouped kernels of the shipped specs through both thread forms: the same bits.
    spec = _spec("vllm_cutlass_w4a8")
    x = synthetic_inputs(spec, {"E": 2, "I": 256, "H": 512}, seed=3)
    if native_ns["_nb_gomp"]() is None:
        pytest.skip("torch's CPU ops do not run on OpenMP here")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setitem(native_ns, "_NB_MIN_SPLIT", 1)  # these small calls in parts too
    regions, run = [], native_ns["_nb_omp_run"]
    monkeypatch.setitem(native_ns, "_nb_omp_run", lambda *a: regions.append(a[2]) or run(*a))
    flat = x["w13_weight_packed"].reshape(-1).view(torch.uint8)
    table = tuple(reversed(range(32)))
    for inner in (torch.arange(1 << 12, dtype=torch.int32).view(-1, 4, 4).transpose(1, 2).reshape(-1),
                  torch.arange(1 << 12, dtype=torch.int32).view(-1, 2, 2, 2).transpose(1, 2).reshape(-1)):
        found = native_ns["_nb_word_quads"](inner)
        assert found is not None
        plan = ("native", inner, torch.arange(0, flat.numel() // 2, 1 << 12, dtype=torch.int32), 12, 2,
                flat.numel() // 2, found)
        omp = native_ns["_nb_words"](flat, plan, (flat.numel() // 4,), table)
        with monkeypatch.context() as m:
            m.setitem(native_ns, "_nb_gomp", lambda: None)
            pool = native_ns["_nb_words"](flat, plan, (flat.numel() // 4,), table)
        assert torch.equal(omp, pool)
    assert regions == ["wquads", "wpairs"]  # each through one OpenMP region (the pool's: none)


def test_a_table_that_reads_past_its_input_raises_and_reads_nothing(native_ns):
    flat = torch.arange(16, dtype=torch.uint8)
    inner, outer = torch.tensor([0, 7, -1, 14, 15, 3, 2, 1], dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    plan = ("native", inner, outer, 62, 1, 0)
    got = native_ns["_nb_words"](flat, plan, (2,), tuple(range(32)))
    assert got.view(torch.uint8).tolist() == [0, 7, 0, 14, 15, 3, 2, 1]
    with pytest.raises(IndexError, match="outside its input"):  # expert 1 (1 byte on): entry 15 reads byte 16
        native_ns["_nb_words"](flat, plan[:4] + (2, 1), (4,), tuple(range(32)))
    wide = torch.arange(32, dtype=torch.uint8)  # blocks of 4 bytes, block k moved by outer[k]
    blocks = ("native", inner[:4], torch.tensor([0, 12], dtype=torch.int32), 2, 1, 0)
    assert native_ns["_nb_words"](wide, blocks, (2,), tuple(range(32))).view(torch.uint8).tolist() == \
        [0, 7, 0, 14, 12, 19, 0, 26]
    with pytest.raises(IndexError, match="outside its input"):  # block 2: 20 + 14 is past 32
        native_ns["_nb_words"](wide, blocks[:2] + (torch.tensor([0, 12, 20], dtype=torch.int32),) + blocks[3:], (3,),
                               tuple(range(32)))
    with pytest.raises(IndexError, match="outside its input"):
        native_ns["_nb_quads"](flat.view(torch.int32), torch.tensor([[0, 1, 2, 4]]), 1, 0, None, tuple(range(32)),
                               (4,))
    words = flat.view(torch.int32)  # 4 words: a row of 2 quads at step 1 from word 2 reads word 3 (in), from 3: 4
    assert native_ns["_nb_quads"](words, torch.tensor([[2, 2, 2, 2]]), 2, 1, None, tuple(range(32)), (8,)).numel() == 8
    # the row's last quad, a negative step, a step whose (quads - 1) multiple wraps to 0 in int64
    for rows, quads, step in (([[0, 0, 3, 0]], 2, 1), ([[0, 0, 0, 0]], 3, 2), ([[3, 3, 3, 3]], 2, -4),
                              ([[0, 0, 0, 0]], 9, 2**61), ([[0, 0, 0, 0]], 3, -2**63)):
        with pytest.raises(IndexError, match="outside its input"):
            native_ns["_nb_quads"](words, torch.tensor(rows), quads, step, None, tuple(range(32)), (4 * quads,))
    quads = torch.tensor([0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15], dtype=torch.int32)  # words 0-3
    found = native_ns["_nb_word_quads"](quads)
    plan = ("native", quads, torch.zeros(1, dtype=torch.int32), 62, 1, 0, found)
    assert native_ns["_nb_words"](flat, plan, (4,), tuple(range(32))).view(torch.uint8).tolist() == \
        flat.view(4, 4).t().reshape(-1).tolist()
    with pytest.raises(IndexError, match="outside its input"):  # expert 1: its words 4-7 are past 16 bytes
        native_ns["_nb_words"](flat, plan[:4] + (2, 16) + plan[6:], (8,), tuple(range(32)))


def test_value_conversions_of_bytes_by_a_lookup(native_ns):
    y = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)[torch.randperm(256)]
    convert = lambda v: v.to(torch.float16) * 2  # noqa: E731
    got = native_ns["_nb_values"](y, convert)
    assert got.dtype == torch.float16 and torch.equal(got.view(torch.int16), convert(y).view(torch.int16))

    def refuses_nan(v):  # a checked conversion: one of the 256 values is refused, the data are converted as is
        if bool(torch.isnan(v.float()).any()):
            raise ValueError("nan")
        return v.to(torch.float32)

    finite = y[~torch.isnan(y.float())]
    assert torch.equal(native_ns["_nb_values"](finite, refuses_nan), finite.to(torch.float32))
    with pytest.raises(ValueError):
        native_ns["_nb_values"](y, refuses_nan)


@pytest.mark.parametrize("size", [1000, 300_007])  # 300_007: in parts on two threads
def test_one_byte_images_by_the_native_lookup(native_ns, monkeypatch, size):
    # marlin_nvfp4's scales: fp8 in, one byte out (a cast and a bit field), by _nb_lut8_k; the torch lookup (no
    # numba) and the conversion itself give the same bytes
    g = torch.Generator().manual_seed(size)
    y = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)[1:].view(-1, 9)

    def convert(v):  # the bits moved and flipped: any byte to one byte
        b = v.view(torch.uint8)
        return ((b << 3) | (b >> 5)).bitwise_xor(0x5A).view(torch.float8_e5m2)

    runs, run = [], native_ns["_nb_run"]
    monkeypatch.setitem(native_ns, "_nb_run", lambda name, *a: runs.append(name) or run(name, *a))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    got = native_ns["_nb_values"](y, convert)
    assert runs == ["lut8"] and got.dtype == torch.float8_e5m2 and got.shape == y.shape
    assert torch.equal(got.view(torch.uint8), convert(y).view(torch.uint8))
    off = _namespace(False)
    assert torch.equal(off["_nb_values"](y, convert).view(torch.uint8), got.view(torch.uint8))


def test_the_switch_and_a_missing_numba_leave_the_torch_forms(monkeypatch):
    monkeypatch.setenv("LAYOUTC_NUMBA", "0")
    assert _namespace(True)["_nb"]() is None and not native._nb_on("cpu")
    monkeypatch.delenv("LAYOUTC_NUMBA")
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba fails
    assert _namespace(True)["_nb"]() is None
    assert not native._nb_on("meta")


def test_only_a_module_imported_by_its_name_from_a_file_caches_kernels_on_disk():
    import types

    mod = types.ModuleType("conv_x")
    mod.__file__ = "/somewhere/conv_x.py"
    assert native._nb_cacheable(mod.__dict__, {"conv_x": mod})
    assert not native._nb_cacheable(mod.__dict__, {})  # run without an entry in sys.modules
    assert not native._nb_cacheable({"__name__": "conv_x", "__file__": "<layoutc x.lyt>"}, {"conv_x": mod})
    assert not native._nb_cacheable(_namespace(True), sys.modules)  # the converter text from a string
    assert native._nb_cacheable(vars(native), sys.modules)


@pytest.mark.slow  # three processes compile a spec
def test_generated_text_does_not_depend_on_numba(tmp_path):
    """Codegen does not look at the environment: the same text with numba importable, refused, or off."""
    code = ("import sys, layoutc; sys.modules['numba'] = None if sys.argv[1] == 'none' else sys.modules.get('numba'); "
            "sys.stdout.write(layoutc.compile_file('specs/marlin_gptq_int4.lyt').source)")
    texts = set()
    for how, env in (("on", {}), ("none", {}), ("on", {"LAYOUTC_NUMBA": "0"})):
        run = subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True,
                             env={**os.environ, **env}, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        assert run.returncode == 0, run.stderr
        texts.add(run.stdout)
    assert len(texts) == 1 and "_nb_words(" in texts.pop()


@pytest.mark.slow  # compiles three specs and runs the eager reference
@pytest.mark.parametrize("name, dims", [("flashinfer_cutlass_mxfp4_padded", {"E": 2, "I": 96, "H": 160}),
                                        ("flashinfer_cutlass_bf16", {"E": 2, "I": 128, "H": 256}),
                                        ("marlin_nvfp4", {"E": 2, "I": 256, "H": 512}),
                                        ("triton_kernels_mxfp4_hopper", {"E": 1, "I": 96, "H": 160}),
                                        ("vllm_cutlass_w4a8", {"E": 2, "I": 256, "H": 256})])
def test_shipped_specs_take_the_native_kernels_and_equal_eager(name, dims, monkeypatch):
    spec = _spec(name)
    x = synthetic_inputs(spec, dims, seed=11)
    want = spec.convert(x, lowering="eager")
    spec.module._RUN_PLANS.clear()
    assert_same_bits(spec.convert(x, lowering="gather"), want, name)
    assert spec.module._nb_on("cpu")
    if 'runs[0] == "native"' in spec.source:  # a words plan's driver: its table is a native plan
        assert any(v is not None and v[0] == "native" for v in spec.module._RUN_PLANS.values()), name
    if "return _nb_quads(" in spec.source:  # a quads part: the kernel ran
        assert _kernel_ran(vars(spec.module), "quads"), name
    monkeypatch.setenv("LAYOUTC_NUMBA", "0")
    monkeypatch.setenv("LAYOUTC_NATIVE_IR", "0")
    spec.module._RUN_PLANS.clear()
    assert_same_bits(spec.convert(x, lowering="gather"), want, f"{name} without native kernels")


@pytest.mark.slow  # two processes import torch and numba
def test_a_converter_file_imported_by_name_caches_its_kernels(tmp_path):
    """A converter imported from its file under its own name: numba's cache sits next to it."""
    spec = _spec("flashinfer_cutedsl_nvfp4")
    spec.write(tmp_path / "conv_cached.py")
    code = ("import sys, torch; sys.path.insert(0, sys.argv[1]); import conv_cached as m; "
            "m._nb_quads(torch.arange(8, dtype=torch.int32), torch.zeros(1, 4), 1, 0, None, tuple(range(32)), (4,)); "
            "print(m._nb()['cache'])")
    for _ in range(2):  # the second loads what the first wrote
        run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == "True"
        assert list((tmp_path / "__pycache__").glob("conv_cached._nb_quads_k-*.nbi"))
