"""A corpus of real layouts from other installed libraries, written as specs (issue 11).

Each ``NAME.lyt`` in this folder states one library's weight/scale/bias preparation (header: the
library, the function, the version, the facts from its source); kernel packings are families of
``families.lyt``. For each:

* the library's own function, called here on CPU, and the compiled spec give the same bits
  (and ``inverse`` undoes the spec where it is invertible);
* ``check --strict`` passes (no coverage warning: the ties are declared);
* ``NAME_mistake.lyt`` applies the layout wrongly and is rejected with the message and line its
  header states (``# expect:``, ``# expect-line:``);
* the dynamic verification (``check --probe``) runs without an internal error.

``*_gap.lyt`` are correct layouts the language or the verifier cannot accept yet: strict xfails.
Without FlashInfer installed the comparisons skip; a function missing from it fails.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import layoutc
from layoutc.equiv.probe import probe
from tests.helpers import ROOT, SPECS, assert_same_bits, compiled, expectations

HERE = Path(__file__).parent
LAYOUTS = sorted(p for p in HERE.glob("*.lyt") if p.stem != "families" and not p.stem.endswith(("_mistake", "_gap")))
MISTAKES = sorted(HERE.glob("*_mistake.lyt"))
GAPS = sorted(HERE.glob("*_gap.lyt"))

#: Every parameter combination of each corpus spec.
PARAMS = {
    "trtllm_moe_padding": [{"format": f, "gated": g} for f in ("nvfp4", "mxfp4") for g in (True, False)],
    "gate_up_interleaves": [{"kernel": k} for k in ("sm90_cute_dsl", "monomoe")],
}


def library(module: str, name: str):
    """The installed library's function. Skips only when the library itself is not installed (its
    top package fails to import): once it is, a moved or renamed function is a failure, since the
    spec's header names the function and its version, and a skip would hide that it went."""
    top = module.split(".")[0]
    try:
        importlib.import_module(top)
    except ImportError as err:
        pytest.skip(f"{top} is not installed here: {type(err).__name__}: {err}")
    return getattr(importlib.import_module(module), name)


def spec(name: str, **params) -> layoutc.CompiledSpec:
    return compiled(HERE / f"{name}.lyt", **params)


def codes(*shape, dtype=torch.uint8, seed=0, high=256) -> torch.Tensor:
    """Deterministic bytes: every value 0..high-1 occurs (a run of them, then random ones)."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    flat = torch.randint(0, high, (n,), dtype=torch.int64, generator=g)
    flat[: min(n, high)] = torch.arange(min(n, high))
    return flat.to(torch.uint8).reshape(shape).view(dtype)


def same_bits(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    """Bit for bit; byte-identical dtypes (E4M3 scales handed over as uint8) count as the same."""
    assert_same_bits(ours, theirs, what, same_dtype=False)


def round_trip(compiled: layoutc.CompiledSpec, inputs: dict, out: dict, dims: dict) -> None:
    assert compiled.invertible
    back = compiled.inverse(out, dims=dims)
    for name, x in inputs.items():
        same_bits(back[name], x, f"inverse: {name}")


def test_the_corpus_has_eleven_layouts_each_with_a_mistake():
    assert len(LAYOUTS) >= 11
    assert {p.stem for p in MISTAKES} == {f"{p.stem}_mistake" for p in LAYOUTS}


#: The corpus layouts that take another packing at some sizes in the library's own code, each one spec whose
#: size conditions are the library's branches (spec-level, outputs declared per branch, or a family role's
#: `if` on the sizes it binds), each compared below with the library's own function on both sides.
SIZE_SWITCHES = {
    "prims_ts_shuffle_bias": ["2*I >= 32"],  # shuffle_matrix: fewer than 32 rows returned as they are
    "sm12x_w4a16": ["H/32 == 1", "I/32 == 1"],  # _permute_packed_scales: one K group takes the channelwise table
    "b12x_w8a8_mxfp8_scales": ["I mod 128 != 0"],  # w13_split_halves: the halves swizzled apart
    "marlin_gptq_scales": ["K/128 > 1"],  # marlin_permute_scales / _permute_packed_scales: group_size < size_k
}


@pytest.mark.parametrize("name", sorted(SIZE_SWITCHES))
def test_size_switching_layouts_are_one_spec_with_the_branch(name):
    assert [c.label for c in spec(name).program.conditions] == SIZE_SWITCHES[name]


# ---------------------------------------------------------------------------------------------
# bit for bit against the library


def test_alphamoe_nvfp4_panels():
    fm = "flashinfer.fused_moe"
    w1_data, w1_scales = library(fm, "prepare_nvfp4_w1_data"), library(fm, "prepare_nvfp4_w1_scales")
    w2_data, w2_scales = library(fm, "prepare_nvfp4_w2_data"), library(fm, "prepare_nvfp4_w2_scales")
    compiled = spec("alphamoe_nvfp4_panels")
    for E, I, H in [(1, 128, 256), (2, 256, 512)]:
        x = {"w13": codes(E, 2 * I, H // 2, seed=1), "w13_scale": codes(E, 2 * I, H // 16, dtype=torch.float8_e4m3fn, seed=2),
             "w2": codes(E, H, I // 2, seed=3), "w2_scale": codes(E, H, I // 16, dtype=torch.float8_e4m3fn, seed=4)}
        out = compiled.convert(x)
        same_bits(out["w13"], w1_data(x["w13"]), "prepare_nvfp4_w1_data")
        same_bits(out["w13_scale"], w1_scales(x["w13_scale"]), "prepare_nvfp4_w1_scales")
        same_bits(out["w2"], w2_data(x["w2"]), "prepare_nvfp4_w2_data")
        same_bits(out["w2_scale"], w2_scales(x["w2_scale"]), "prepare_nvfp4_w2_scales")
        round_trip(compiled, x, out, {"E": E, "I": I, "H": H})


def test_sm12x_w4a16_repack():
    mod = "flashinfer.fused_moe.cute_dsl.blackwell_sm12x.moe_w4a16_prepare"
    repack, pack_scales = library(mod, "_repack_weight"), library(mod, "_pack_e8m0_k32_scales")
    compiled = spec("sm12x_w4a16")
    for E, I, H in [(1, 32, 64), (1, 64, 64), (2, 96, 128), (1, 32, 128)]:  # I == 32: w2's channelwise table
        # E8M0 bytes up to 247: the library clamps larger ones (a value change the spec does not make)
        x = {"w13": codes(E, 2 * I, H // 2, seed=1), "w13_scale": codes(E, 2 * I, H // 32, seed=2, high=248),
             "w2": codes(E, H, I // 2, seed=3), "w2_scale": codes(E, H, I // 32, seed=4, high=248)}
        out = compiled.convert(x)
        same_bits(out["w13"], repack(x["w13"], size_k=H, size_n=2 * I, row_rotation=I), "_repack_weight w13")
        same_bits(out["w13_scale"], pack_scales(x["w13_scale"], size_k=H, size_n=2 * I, row_rotation=I),
                  "_pack_e8m0_k32_scales w13")
        same_bits(out["w2"], repack(x["w2"], size_k=I, size_n=H), "_repack_weight w2")
        same_bits(out["w2_scale"], pack_scales(x["w2_scale"], size_k=I, size_n=H), "_pack_e8m0_k32_scales w2")
        round_trip(compiled, x, out, {"E": E, "I": I, "H": H})


def test_deepgemm_packed_ue8m0():
    pack = library("flashinfer.deep_gemm", "get_col_major_tma_aligned_packed_tensor")
    compiled = spec("deepgemm_packed_ue8m0")
    for E, N, K in [(2, 6, 9 * 128), (3, 128, 512), (1, 5, 128)]:
        # any fp32 bits, negative numbers and NaNs included: only the exponent field is kept
        sf = codes(E, N, K // 128, 4, seed=N).view(torch.float32).reshape(E, N, K // 128)
        w = torch.zeros(E, N, K, dtype=torch.float8_e4m3fn)
        out = compiled.convert({"w": w, "sf": sf})["sf"]
        view = pack(sf)  # a strided view [E, N, k4/4] of the MN-major storage
        k4, n4 = -(-(K // 128) // 4) * 4, -(-N // 4) * 4
        assert view.stride() == (k4 // 4 * n4, 1, n4)
        same_bits(out, torch.as_strided(view, (E, k4 // 4, n4), (k4 // 4 * n4, n4, 1)), "storage")
        same_bits(out.transpose(1, 2)[:, :N], view, "the returned view")
    # extract_bits keeps 8 of 32 bits: inverse(convert(x)) == x holds for x = 2^e only
    sf = torch.ldexp(torch.ones(2, 8, 3), torch.arange(-20, 28).reshape(2, 8, 3))
    w = torch.zeros(2, 8, 384, dtype=torch.float8_e4m3fn)
    round_trip(compiled, {"w": w, "sf": sf}, compiled.convert({"w": w, "sf": sf}), {"E": 2, "N": 8, "K": 384})


def test_cute_dsl_bf16_fp4():
    prepare = library("flashinfer.gemm.gemm_bf16_fp4_cute_dsl", "_prepare_cute_dsl_sm12x")
    swizzle = library("flashinfer.batch_invariant.quantization.layout", "swizzle_sf")
    compiled = spec("cute_dsl_bf16_fp4")
    for N, K in [(64, 16), (128, 64), (192, 32)]:
        b = codes(N, K // 2, seed=N)
        s = codes(N, K // 16, seed=K)
        s = torch.where((s == 0x7F) | (s == 0xFF), 0x38, s)  # finite scales (NaN: see the spec's header)
        out = compiled.convert({"b": b, "b_scale": s.view(torch.float8_e4m3fn)})
        # the function takes the scales 128x4-swizzled, as fp4_quantize writes them
        packed, sf, _ = prepare(b, swizzle(s, N, K, 16, "128x4"), None, 16)
        same_bits(out["b"], packed, "_cute_dsl_pack_fp4_weight")
        same_bits(out["b_scale"], sf, "scales: unswizzle, transpose, _e4m3_to_s0e5m3")


def test_cute_dsl_mma_sf_view():
    to_mma = library("flashinfer.cute_dsl", "convert_sf_to_mma_layout")
    from_mma = library("flashinfer.cute_dsl", "convert_sf_from_mma_layout")
    swizzle = library("flashinfer.fused_moe.cute_dsl.blackwell_sm12x.moe_w4a16_fp4_helpers", "swizzle_block_scale")
    compiled = spec("cute_dsl_mma_sf")
    for G, M, K in [(2, 128, 64), (3, 100, 80), (1, 256, 256)]:
        sf = codes(G, M, K // 16, seed=M)
        w = torch.zeros(G, M, K // 2, dtype=torch.uint8)
        out = compiled.convert({"w": w, "sf": sf.view(torch.float8_e4m3fn)})["sf"]
        swizzled = swizzle(sf)  # FlashInfer's pure-torch 128x4 swizzle, per expert
        view = to_mma(swizzled, M, K, num_groups=G)
        assert view.data_ptr() == swizzled.data_ptr()  # the kernel reads a view of the swizzled storage
        same_bits(out, view, "convert_sf_to_mma_layout")
        same_bits(from_mma(out.view(torch.uint8), M, K, num_groups=G), swizzled.reshape(-1, swizzled.shape[-1]),
                  "convert_sf_from_mma_layout")
        round_trip(compiled, {"w": w, "sf": sf.view(torch.float8_e4m3fn)}, {"w": w, "sf": out}, {"G": G, "M": M, "K": K})


@pytest.mark.parametrize("params", PARAMS["trtllm_moe_padding"], ids=lambda p: f"{p['format']}-gated{p['gated']}")
def test_trtllm_moe_padding(params):
    pad = library("flashinfer.fused_moe", "pad_trtllm_moe_weights")
    compiled = spec("trtllm_moe_padding", **params)
    sfv = 16 if params["format"] == "nvfp4" else 32
    sdt = torch.float8_e4m3fn if params["format"] == "nvfp4" else torch.uint8
    f = 2 if params["gated"] else 1
    for E, I, H in [(1, 96, 320), (2, 128, 512)]:
        x = {"w13": codes(E, f * I, H // 2, seed=1), "w13_scale": codes(E, f * I, H // sfv, dtype=sdt, seed=2),
             "w2": codes(E, H, I // 2, seed=3), "w2_scale": codes(E, H, I // sfv, dtype=sdt, seed=4)}
        ref = pad(x["w13"], x["w13_scale"], x["w2"], x["w2_scale"], H, I, is_gated_act=params["gated"])
        for lowering in ("eager", "gather"):  # the fill is a bit pattern in both (E4M3 1.0 = 0x38)
            out = compiled.convert(x, lowering=lowering)
            same_bits(out["w13"], ref.gemm1_weights, f"gemm1_weights ({lowering})")
            same_bits(out["w13_scale"], ref.gemm1_weights_scale, f"gemm1_weights_scale ({lowering})")
            same_bits(out["w2"], ref.gemm2_weights, f"gemm2_weights ({lowering})")
            same_bits(out["w2_scale"], ref.gemm2_weights_scale, f"gemm2_weights_scale ({lowering})")
        round_trip(compiled, x, out, {"E": E, "I": I, "H": H})


def test_batch_invariant_sf_8x4():
    swizzle = library("flashinfer.batch_invariant.quantization.layout", "swizzle_sf")
    unswizzle = library("flashinfer.batch_invariant.quantization.layout", "unswizzle_sf")
    compiled = spec("batch_invariant_sf_8x4")
    for E, M, K in [(2, 8, 64), (3, 13, 96), (1, 1, 16), (2, 24, 48)]:
        sf = codes(E, M, K // 16, seed=M)
        w = torch.zeros(E, M, K // 2, dtype=torch.uint8)
        out = compiled.convert({"w": w, "sf": sf.view(torch.float8_e4m3fn)})["sf"]
        same_bits(out, torch.stack([swizzle(sf[e], M, K, 16, "8x4") for e in range(E)]), "swizzle_sf 8x4")
        same_bits(torch.stack([unswizzle(out[e].view(torch.uint8), M, K, 16, "8x4") for e in range(E)]), sf,
                  "unswizzle_sf 8x4")
        round_trip(compiled, {"w": w, "sf": sf.view(torch.float8_e4m3fn)}, {"w": w, "sf": out}, {"E": E, "M": M, "K": K})


@pytest.mark.parametrize("params", PARAMS["gate_up_interleaves"], ids=lambda p: p["kernel"])
def test_gate_up_interleaves(params):
    if params["kernel"] == "sm90_cute_dsl":
        fn = library("flashinfer.fused_moe.cute_dsl.sm90_contiguous_gather_grouped_gemm_act_fusion",
                     "interleave_up_gate_sm90")
    else:
        fn = library("flashinfer.fused_moe", "interleave_for_tma_wgmma_up")
    compiled = spec("gate_up_interleaves", **params)
    for E, I, H in [(1, 64, 16), (2, 192, 32)]:
        # 2*I*H distinct codes per expert would not fit a byte: the rows are tagged by their index
        w = (torch.arange(E * 2 * I, dtype=torch.int64).reshape(E, 2 * I, 1) * 7 + torch.arange(H)) % 251
        w = w.to(torch.uint8).view(torch.float8_e4m3fn)
        out = compiled.convert({"w13": w})["w13"]
        same_bits(out, fn(w.clone()), params["kernel"])  # a clone: monoMoE caches its result on the input
        round_trip(compiled, {"w13": w}, {"w13": out}, {"E": E, "I": I, "H": H})


def test_prims_ts_shuffle_bias():
    mod = "flashinfer.prims_ts.batched_gemm.batched_gemm_run"
    gated, shuffle = library(mod, "reorder_rows_for_gated_act"), library(mod, "shuffle_matrix")
    shuffle_bias = library(mod, "_shuffle_bias_m_storage")
    compiled = spec("prims_ts_shuffle_bias")
    # both sides of shuffle_matrix's branch: fewer than 32 rows are returned as they are (I = 4, 8)
    for E, I, H in [(1, 4, 8), (2, 8, 4), (1, 16, 8), (2, 48, 16)]:
        w = (torch.arange(E * 2 * I).reshape(E, 2 * I, 1) + 256 * torch.arange(H)).to(torch.int32)
        w = (w % 251).to(torch.uint8).view(torch.float8_e4m3fn)
        b = torch.randn(E, 2 * I, generator=torch.Generator().manual_seed(I))
        out = compiled.convert({"w13": w, "w13_bias": b})
        same_bits(out["w13"], shuffle(gated(w), 128), "shuffle_matrix(reorder_rows_for_gated_act(w))")
        if 2 * I >= 32:  # the library refuses a bias of fewer than 32 rows; the spec keeps it in the gated order
            want = shuffle_bias(gated(b.unsqueeze(-1)).squeeze(-1), 128)
        else:
            want = gated(b.unsqueeze(-1)).squeeze(-1)
            with pytest.raises(ValueError):
                shuffle_bias(want, 128)
        same_bits(out["w13_bias"], want, "_shuffle_bias_m_storage(gated bias)")
        same_bits(compiled.convert({"w13": w})["w13"], out["w13"], "without the optional bias")
        round_trip(compiled, {"w13": w, "w13_bias": b}, out, {"E": E, "I": I, "H": H})


def _marlin_permute_scales(s: torch.Tensor, size_k: int, size_n: int, group_size: int) -> torch.Tensor:
    """A reference written from vLLM's marlin_permute_scales (github.com/vllm-project/vllm, commit
    6eb287065174504cb862f792c2150c603e225edb, vllm/model_executor/layers/quantization/utils/marlin_utils.py,
    with get_scale_perms): [groups, N] scales, every row permuted in blocks. vLLM is not installed here
    (its kernels need CUDA); the tables are rebuilt from their definitions: with group_size < size_k (and
    not -1), block 64 with position 8i + j taking i + 8j; else block 32 with position 8i + c taking
    2i + [0, 1, 8, 9, 16, 17, 24, 25][c]."""
    if group_size < size_k and group_size != -1:
        table = [i + 8 * j for i in range(8) for j in range(8)]
    else:
        table = [2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)]
    blocks = s.reshape(-1, len(table))
    return blocks[:, torch.tensor(table)].reshape(-1, size_n).contiguous()


def test_marlin_gptq_scales():
    """Compared with a reference written here from vLLM's public code (``_marlin_permute_scales`` above,
    commit cited), not with vLLM itself, which is not installable on this CPU machine; and with
    FlashInfer's own copy of the Marlin scale permutation, ``moe_w4a16_prepare._permute_packed_scales``
    (same tables and branch, ``group_size < size_k``: the 64-column table, else the 32-column
    channelwise one), called on both sides of the branch (K == 128, the boundary, and K > 128)."""
    permute = library("flashinfer.fused_moe.cute_dsl.blackwell_sm12x.moe_w4a16_prepare", "_permute_packed_scales")
    compiled = spec("marlin_gptq_scales")
    assert [c.label for c in compiled.program.conditions] == ["K/128 > 1"]
    # K == 128: one group spans all of K (the channelwise table); K > 128: the grouped table
    for E, K, N in [(1, 128, 64), (2, 128, 128), (1, 256, 64), (2, 384, 192)]:
        q = torch.randint(-2**31, 2**31 - 1, (E, K // 8, N), dtype=torch.int32, generator=torch.Generator().manual_seed(K))
        s = torch.randn(E, K // 128, N, generator=torch.Generator().manual_seed(N)).to(torch.float16)
        for lowering in ("gather", "eager"):
            out = compiled.convert({"qweight": q, "scales": s}, lowering=lowering)
            want = torch.stack([_marlin_permute_scales(s[e], K, N, 128) for e in range(E)])
            same_bits(out["scales"], want, f"marlin_permute_scales K={K} N={N} ({lowering})")
            same_bits(out["qweight"], q, "qweight passes through")
        theirs = torch.stack([permute(s[e], size_k=K, size_n=N, group_size=128) for e in range(E)])
        same_bits(out["scales"], theirs, f"FlashInfer _permute_packed_scales K={K} N={N}")
        round_trip(compiled, {"qweight": q, "scales": s}, out, {"E": E, "K": K, "N": N})


def test_b12x_w8a8_mxfp8_scales():
    mod = "flashinfer.experimental.b12x.moe._shared.kernels.w8a8.weights"
    prepare, split = library(mod, "prepare_w8a8_mxfp8_weights"), library(mod, "w13_split_halves")
    compiled = spec("b12x_w8a8_mxfp8_scales")
    # I % 128 != 0 (halves swizzled apart, half-major): 32, 96, 160; == 0 (one grid, expert-major): 128, 256;
    # the boundary 128 between 96 and 160
    for E, I, H in [(1, 32, 128), (2, 96, 256), (2, 128, 128), (1, 160, 128), (2, 256, 256)]:
        x = {"w13": codes(E, 2 * I, H, dtype=torch.float8_e4m3fn, seed=1), "w13_scale": codes(E, 2 * I, H // 32, seed=2, high=255),
             "w2": codes(E, H, I, dtype=torch.float8_e4m3fn, seed=3), "w2_scale": codes(E, H, I // 32, seed=4, high=255)}
        # UE8M0 bytes up to 0xFE: the function rejects the NaN byte 0xFF
        ref = prepare(w13_values=x["w13"], w13_scale=x["w13_scale"], w13_scale_2=torch.ones(E), w2_values=x["w2"],
                      w2_scale=x["w2_scale"], w2_scale_2=torch.ones(E), num_experts=E, hidden_size=H, intermediate_size=I)
        rows = -(-I // 128) * 128
        assert tuple(ref.w13_sf_swizzled.shape) == ((2, E, rows, -(-H // 128) * 4) if split(I) else (E, 2 * I, H // 128 * 4))
        for lowering in ("gather", "eager"):
            out = compiled.convert(x, lowering=lowering)
            same_bits(out["w13"], ref.w13_values, f"w13_values I={I} ({lowering})")
            same_bits(out["w2"], ref.w2_values, f"w2_values I={I} ({lowering})")
            # the library's storage, [2, E, rows, c] or [E, 2*I, c], viewed as the spec's [2*E, rows, c]
            same_bits(out["w13_scale"], ref.w13_sf_swizzled.view(2 * E, rows, -1), f"w13_sf_swizzled I={I} ({lowering})")
            same_bits(out["w2_scale"], ref.w2_sf_swizzled, f"w2_sf_swizzled I={I} ({lowering})")
        round_trip(compiled, x, out, {"E": E, "I": I, "H": H})



# ---------------------------------------------------------------------------------------------
# check --strict, the mistakes, the probe


def _combos(path: Path) -> list[dict]:
    return PARAMS.get(path.stem, [{}])


@pytest.mark.parametrize("path", LAYOUTS, ids=lambda p: p.stem)
def test_corpus_spec_passes_strict_check(path):
    for params in _combos(path):
        compiled = layoutc.compile_file(path, params)
        assert compiled.warnings == (), [d.message for d in compiled.warnings]
        per_tensor, gaps = compiled.coverage
        warnings = [d for d in gaps if d.severity != "note"]  # notes say which parameter values were verified
        assert warnings == [], [d.message for d in warnings]
        tied = [t for t in compiled.program.inputs if t.tie is not None]
        for t in tied:  # the ties are declared and the verifier says what it proved about them
            proved = next(c for c in per_tensor if c.tensor == t.name).proved
            assert any(p.startswith("sync:") for p in proved), (t.name, proved)


@pytest.mark.slow  # over 2.5 s on the 2-core machine: `make test-slow`
def test_cli_strict_check_accepts_the_corpus_and_rejects_the_mistakes():
    run = subprocess.run([sys.executable, "-m", "layoutc", "check", "--strict", *map(str, LAYOUTS + MISTAKES + GAPS)],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr, run.stderr
    ok = {Path(line.split(":")[0]).stem for line in run.stdout.splitlines() if ": ok" in line}
    assert ok == {p.stem for p in LAYOUTS}, run.stdout
    assert run.stdout.count(": ok") == sum(len(_combos(p)) for p in LAYOUTS)
    assert f"{len(MISTAKES) + len(GAPS)} specs failed" in run.stderr


@pytest.mark.parametrize("path", MISTAKES, ids=lambda p: p.stem)
def test_mistake_is_rejected_with_its_message(path):
    expects, line = expectations(path)
    assert expects
    with pytest.raises(layoutc.SpecError) as info:
        layoutc.compile_file(path)
    text = info.value.render()
    for fragment in expects:
        assert fragment in text, f"missing {fragment!r} in:\n{text}"
    assert any(d.pos is not None and d.pos.line == line for d in info.value.errors), text
    assert path.read_text().splitlines()[line - 1] in text  # the offending line is quoted


#: Probing these takes most of the time of this file: their whole probe runs with the slow tests.
PROBE_SLOW = {"alphamoe_nvfp4_panels"}


def _probe_case(path: Path):
    marks = []
    if path.stem in PROBE_SLOW:
        marks.append(pytest.mark.slow)
    return pytest.param(path, marks=marks, id=path.stem)


@pytest.mark.parametrize("path", [_probe_case(p) for p in LAYOUTS])
def test_probe_agrees_on_the_corpus_spec(path):
    # one parameter combination, the eager lowering; the slow CLI test probes all of them
    assert probe(layoutc.compile_file(path, _combos(path)[0]), lowerings=("eager",)) == []


@pytest.mark.slow
def test_cli_probe_runs_on_every_spec_of_the_repo_and_the_corpus():
    specs = sorted(SPECS.glob("*.lyt")) + LAYOUTS
    run = subprocess.run([sys.executable, "-m", "layoutc", "check", "--probe", *map(str, specs)],
                         capture_output=True, text=True, cwd=ROOT)
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr, run.stderr
    failed = {Path(line.split(":")[0]).stem for line in run.stderr.splitlines() if ": error: " in line}
    assert failed == set(), run.stderr
    assert run.returncode == 0, run.stderr
    ok = {Path(line.split(":")[0]).stem for line in run.stdout.splitlines() if ": ok, static and probed" in line}
    assert ok == {p.stem for p in specs}, run.stdout


# ---------------------------------------------------------------------------------------------
# known gaps: correct layouts rejected today


@pytest.mark.xfail(strict=True, raises=layoutc.SpecError,
                   reason="a family cannot relate its scale rows to its weight rows other than block for block: "
                          "alphamoe's rep-8 weight / rep-1 block-scale interleave splits 128-row blocks")
def test_gap_alphamoe_fp8_gated_interleave_is_accepted():
    layoutc.compile_file(HERE / "alphamoe_fp8_gated_gap.lyt")


def test_gap_alphamoe_fp8_gated_interleave_is_the_library_layout():
    fn = library("flashinfer.fused_moe", "alphamoe_interleave_gated_weights")
    path = HERE / "alphamoe_fp8_gated_gap.lyt"
    unverified = layoutc.compile_source(path.read_text(), str(path), verify_spec=False)
    E, I, H = 2, 256, 256
    w = codes(E, 2 * I, H, dtype=torch.float8_e4m3fn)
    s = torch.randn(E, 2 * I // 128, H // 128, generator=torch.Generator().manual_seed(0))
    out = unverified.convert({"w13": w, "w13_scale": s})
    ref_w, ref_s = fn(w, s)
    same_bits(out["w13"], ref_w, "weights, 8-row chunks")
    same_bits(out["w13_scale"], ref_s, "block scales, one row at a time")


def test_prims_ts_small_matrices_are_left_unshuffled_in_the_same_spec():
    # once a gap (the spec assumed 2*I >= 32 and refused smaller layers): the packing is declared per branch
    compiled = spec("prims_ts_shuffle_bias")
    assert [c.label for c in compiled.program.conditions] == ["2*I >= 32"]
    mod = "flashinfer.prims_ts.batched_gemm.batched_gemm_run"
    gated, shuffle = library(mod, "reorder_rows_for_gated_act"), library(mod, "shuffle_matrix")
    for rows in (8, 16, 32):
        w = (torch.arange(2 * rows).reshape(2, rows, 1) % 251).to(torch.uint8).expand(2, rows, 4).contiguous()
        w = w.view(torch.float8_e4m3fn)
        for lowering in ("gather", "eager"):
            same_bits(compiled.convert({"w13": w}, lowering=lowering)["w13"], shuffle(gated(w), 128),
                      f"{rows} rows, {lowering}")
