"""The fingerprint's first product by its native CPU kernels (LLVM IR for AVX-512 VNNI, and for AVX2) gives the
definition's integers.

Each form runs where the host is x86-64 with its features and llvmlite imports (the CPU machines and CI have AVX2 at
least): there these tests fail if it does not run, so a broken look-up cannot pass as a skip. Each is held to torch's
int8 GEMM and to the definition computed in int64 (``reference``), through the OpenMP region and through Python
threads; every test runs for each form the host has.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings, strategies as st

from layoutc.runtime import fingerprint as fp
from tests.helpers import cpu_flags
from tests.runtime.test_guard_copies import reference

#: The forms and the CPU flags (as /proc/cpuinfo names them) each needs.
FORMS = {"vnni": {"avx512f", "avx512bw", "avx512_vnni"}, "avx2": {"avx2"}}


def _native(form):
    try:
        import llvmlite.binding  # noqa: F401
    except ImportError:
        pytest.skip("llvmlite is not installed (the kernel's compiler)")
    if not FORMS[form] <= cpu_flags():
        pytest.skip(f"this CPU has no {form.upper()}")
    got = fp._fp_native(form)
    assert got is not None, f"x86-64 with {form.upper()} and llvmlite, but the native kernel was not built"
    return got


@pytest.fixture(params=list(FORMS))
def native(request, monkeypatch):
    # the form under test is also the one _fingerprints takes (the host's best, unless told)
    got = _native(request.param)
    monkeypatch.setitem(fp._FP_NATIVE_STATE, (fp._FP_ROW, fp._FP_COLS, None), got)
    return got


def test_the_host_takes_its_best_form():
    # VNNI where the host has it, else AVX2; the group of rows the form was built with
    flags = cpu_flags()
    best = next((f for f, need in FORMS.items() if need <= flags), None)
    if best is None:
        pytest.skip("this CPU has neither form")
    got = _native(best)
    assert fp._fp_native() is got and got[4] == fp._FP_NATIVE_FORMS[best][1]


def _rows(n, seed, fill=None):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-128, 128, (n, fp._FP_ROW), dtype=torch.int8, generator=g)
    return a.fill_(fill) if fill is not None else a


def _int_mm(a):
    return torch._int_mm(a, fp._fp_matrix(b"R", fp._FP_ROW, torch.device("cpu")))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 9, 16, 17, 70])
def test_the_kernels_rows_are_int8_gemms(native, n):
    # groups of 8 (VNNI) or 3 (AVX2) rows with a short last one (rows past the last read and write the last row again)
    a = _rows(n, n)
    y = torch.full((n, fp._FP_COLS), -1, dtype=torch.int32)
    fp._fp_rows_native(a, y, native)
    assert torch.equal(y, _int_mm(a))


@pytest.mark.parametrize("fill", [-128, 127, 0, -1])
def test_extreme_bytes(native, fill):
    # all -128: the largest row sums the kernel takes away (128 * 32768 * -128); all 127 the largest products
    a = _rows(9, 0, fill)
    y = torch.empty((9, fp._FP_COLS), dtype=torch.int32)
    fp._fp_rows_native(a, y, native)
    assert torch.equal(y, _int_mm(a))


#: The forms this host runs (the property test draws from them; none: it skips).
HOST_FORMS = [f for f, need in FORMS.items() if need <= cpu_flags()]


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 24), seed=st.integers(0, 2**31 - 1), threads=st.sampled_from([1, 2, 3]),
       form=st.sampled_from(HOST_FORMS or list(FORMS)))
def test_any_rows_on_any_threads(n, seed, threads, form):
    native = _native(form)  # skips where the host has no form at all
    a = _rows(n, seed)
    y = torch.empty((n, fp._FP_COLS), dtype=torch.int32)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fp._fp_rows_native(a, y, native)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(y, _int_mm(a))


def test_fingerprints_through_the_kernel_are_the_definition(native, monkeypatch):
    g = torch.Generator().manual_seed(5)
    ts = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
          for n in (1, 7, 32768, 32768 * 9 + 3, 32768 * 64, 32768 * 70 + 5)]
    ts += [torch.randn(3, 5, generator=g).to(torch.bfloat16), torch.empty(0)]
    calls, run = [], fp._fp_rows_native_many
    monkeypatch.setattr(fp, "_fp_rows_native_many",
                        lambda pairs, n: calls.append([a.shape[0] for a, _ in pairs]) or run(pairs, n))
    assert fp._fingerprints(ts) == [reference(t) for t in ts]
    # one run of the kernel: every whole row where it lies (1, 9, 64, 70 rows), then the staged rests of rows (1, 7,
    # 3, 5 bytes and the bfloat16's 30: five rows) and zero rows up to a multiple of 8 rows of Y (149 -> 152)
    assert calls == [[1, 9, 64, 70, 8]], calls


@pytest.mark.parametrize("form", list(FORMS))
def test_segments_and_small_rows_through_the_kernel(monkeypatch, form):
    # 256-byte rows (a kernel of its own), 24-row segments: every segment's rows, in order
    monkeypatch.setattr(fp, "_FP_ROW", 256)
    monkeypatch.setattr(fp, "_FP_SEGMENT_ROWS", 24)
    monkeypatch.setitem(fp._FP_OWN_ROWS, "cpu", 1)
    monkeypatch.setitem(fp._FP_NATIVE_STATE, (256, fp._FP_COLS, None), _native(form))
    g = torch.Generator().manual_seed(6)
    ts = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in (5, 256 * 24, 256 * 24 + 1,
                                                                                256 * 60 + 9)]
    assert fp._fingerprints(ts) == [reference(t) for t in ts]


def test_rows_read_in_place_at_any_address(native):
    # whole rows are read where the tensor lies, whatever its alignment (a slice of a byte buffer at an odd offset,
    # a scale tensor of one row): the same fingerprint as an aligned copy and as the definition
    g = torch.Generator().manual_seed(11)
    buf = torch.randint(0, 256, (32768 * 5 + 70,), dtype=torch.uint8, generator=g)
    ts = [buf[3: 3 + 32768 * 3 + 5], buf[1: 1 + 32768], buf[64: 64 + 32768 * 2]]
    assert [t.data_ptr() % 64 for t in ts] == [(buf.data_ptr() + o) % 64 for o in (3, 1, 64)]
    assert fp._fingerprints(ts) == [reference(t) for t in ts] == fp._fingerprints([t.clone() for t in ts])


def test_one_run_for_many_pairs_is_each_pairs_product(native, monkeypatch):
    # the job's table of segments: groups numbered across pairs, a short last group in each, empty pairs skipped,
    # and one OpenMP region for them all
    pairs = [(_rows(n, 20 + n), torch.full((n, fp._FP_COLS), -1, dtype=torch.int32)) for n in (3, 0, 8, 17, 1)]
    gomp = fp._fp_gomp()
    regions = []
    if gomp is not None:
        monkeypatch.setitem(fp._FP_NATIVE_STATE, "gomp", lambda *args: regions.append(args) or gomp(*args))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    fp._fp_rows_native_many(pairs, native)
    for a, y in pairs:
        assert torch.equal(y, _int_mm(a))
    assert len(regions) == (1 if gomp is not None else 0)
    bad = [pairs[0], (pairs[2][0], pairs[2][1][:7])]
    with pytest.raises(ValueError, match="fingerprint kernel"):
        fp._fp_rows_native_many(bad, native)


def test_the_openmp_region_and_python_threads_give_the_same(native, monkeypatch):
    a = _rows(40, 9)
    want = _int_mm(a)
    gomp = fp._fp_gomp()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    if gomp is not None:  # torch on OpenMP (Linux): one region of its runtime
        regions = []
        monkeypatch.setitem(fp._FP_NATIVE_STATE, "gomp", lambda *args: regions.append(args) or gomp(*args))
        y = torch.empty_like(want)
        fp._fp_rows_native(a, y, native)
        assert torch.equal(y, want) and len(regions) == 1 and regions[0][2] == 2
    monkeypatch.setitem(fp._FP_NATIVE_STATE, "gomp", None)  # Python threads
    monkeypatch.delitem(fp._FP_NATIVE_STATE, "pool", raising=False)
    y = torch.empty_like(want)
    fp._fp_rows_native(a, y, native)
    assert torch.equal(y, want) and fp._FP_NATIVE_STATE["pool"]._max_workers == 1


def test_a_misaligned_r_is_copied_to_an_aligned_address():
    # the kernels load R with aligned vector loads: _fp_aligned gives the same values at a 64-byte multiple
    base = torch.arange(200, dtype=torch.int16)
    for t in (base[3:131].view(8, 16), base[:128].view(8, 16)):
        got = fp._fp_aligned(t)
        assert got.data_ptr() % 64 == 0 and torch.equal(got, t) and got.dtype == t.dtype and got.shape == t.shape
    aligned = base[:128]
    if aligned.data_ptr() % 64 == 0:
        assert fp._fp_aligned(aligned) is aligned


def test_wrong_operands_raise(native):
    a = _rows(4, 1)
    y = torch.empty((4, fp._FP_COLS), dtype=torch.int32)
    for bad_a, bad_y in [(a.t().contiguous().t(), y), (a[:, :64], y), (a, y[:3]), (a, y.to(torch.int64)),
                         (a.view(torch.uint8), y), (a, torch.empty((fp._FP_COLS, 4), dtype=torch.int32).t())]:
        with pytest.raises(ValueError, match="fingerprint kernel"):
            fp._fp_rows_native(bad_a, bad_y, native)


def test_the_switch_turns_the_kernel_off():
    # LAYOUTC_FP_NATIVE=0 (read at import): torch's int8 GEMM, the same fingerprint
    code = ("import torch; from layoutc.runtime import fingerprint as fp; "
            "t = torch.arange(70000, dtype=torch.int32); print(fp._fp_native() is None, fp._fingerprints([t])[0])")
    out = {}
    for flag in ("0", "1"):
        env = dict(os.environ, LAYOUTC_FP_NATIVE=flag)
        out[flag] = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                   check=True).stdout.split()
    assert out["0"][0] == "True" and out["0"][1] == out["1"][1]
    if any(need <= cpu_flags() for need in FORMS.values()) and out["1"][0] == "True":
        pytest.importorskip("llvmlite")
        pytest.fail("the kernel runs here but was not built with LAYOUTC_FP_NATIVE=1")


def test_threads_fingerprinting_at_once(native):
    # `layoutc convert`'s pipeline and engines fingerprint from several Python threads: each call its own OpenMP
    # region (or Python threads), the same values as one at a time
    import concurrent.futures

    g = torch.Generator().manual_seed(8)
    ts = [torch.randint(0, 256, (32768 * n + n,), dtype=torch.uint8, generator=g) for n in (70, 9, 131, 64)]
    want = [reference(t) for t in ts]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            assert list(pool.map(lambda t: fp._fingerprints([t])[0], ts)) == want
