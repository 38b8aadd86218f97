"""Convert-time contract: tensors that break a spec's contract raise LayoutError (a ValueError)
with a message that says what was expected and what was given; converters never modify their
inputs and never hand back memory that aliases them."""

from __future__ import annotations

import itertools

import pytest
import torch

import layoutc
from layoutc import LayoutError
from layoutc.lang.resolver import resolve
from layoutc.front.parse import parse
from tests.helpers import SPECS, bits

DIMS = {"E": 2, "I": 128, "H": 256}




def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _convert_error(spec, tensors, **kw) -> str:
    with pytest.raises(LayoutError) as info:
        spec.convert(tensors, **kw)
    assert isinstance(info.value, ValueError)
    return str(info.value)


# -- names ------------------------------------------------------------------------------------


def test_layout_error_is_a_value_error():
    assert issubclass(LayoutError, ValueError)


def test_missing_tensor(bf16, synthetic_inputs):
    x = synthetic_inputs(bf16, DIMS, drop=["w2_weight"])
    msg = _convert_error(bf16, x)
    assert msg == "convert: missing tensor 'w2_weight' (fp4x2[E, H, I/2])"


def test_required_tensor_passed_as_none_is_missing(bf16, synthetic_inputs):
    x = synthetic_inputs(bf16, DIMS)
    x["w13_weight_scale"] = None
    assert "missing tensor 'w13_weight_scale'" in _convert_error(bf16, x)


def test_unexpected_tensor_name(bf16, synthetic_inputs):
    x = synthetic_inputs(bf16, DIMS)
    x["w13_weights"] = x["w13_weight"]
    msg = _convert_error(bf16, x)
    assert "unexpected tensor 'w13_weights'" in msg
    for name in bf16.program.inputs:
        assert name.name in msg


def test_not_a_mapping(bf16, synthetic_inputs):
    x = synthetic_inputs(bf16, DIMS)
    assert "takes a mapping" in _convert_error(bf16, list(x.items()))
    assert "got int" in _convert_error(bf16, 5)


@pytest.mark.parametrize("value", [3, 2.5, "w", [1, 2], object()], ids=["int", "float", "str", "list", "object"])
def test_non_tensor_values(bf16, synthetic_inputs, value):
    x = synthetic_inputs(bf16, DIMS)
    x["w2_weight_scale"] = value
    msg = _convert_error(bf16, x)
    assert msg == f"w2_weight_scale: expected a torch.Tensor, got {type(value).__name__}"


# -- dtypes, ranks, shapes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, dtype, expected",
    [
        ("w13_bias", torch.float64, "w13_bias: expected f32 (torch.float32 or torch.bfloat16), got torch.float64"),
        # bf16 is accepted (the spec says `accepts bf16`), f16 is not: the message names both accepted types
        ("w13_bias", torch.float16, "w13_bias: expected f32 (torch.float32 or torch.bfloat16), got torch.float16"),
        ("w2_weight", torch.int8, "w2_weight: expected fp4x2 (torch.uint8 or torch.float4_e2m1fn_x2), got torch.int8"),
        ("w13_weight_scale", torch.float8_e4m3fn,
         "w13_weight_scale: expected e8m0 (torch.uint8 or torch.float8_e8m0fnu), got torch.float8_e4m3fn"),
    ],
)
def test_wrong_dtype(bf16, synthetic_inputs, name, dtype, expected):
    x = synthetic_inputs(bf16, DIMS)
    x[name] = torch.zeros(x[name].shape, dtype=dtype)
    assert _convert_error(bf16, x) == expected


def test_wrong_rank(bf16, synthetic_inputs):
    x = synthetic_inputs(bf16, DIMS)
    x["w13_bias"] = x["w13_bias"][None]
    assert _convert_error(bf16, x) == "w13_bias: expected 2 axes [E, 2*I], got shape [1, 2, 256]"


def test_wrong_shape_names_tensor_symbolic_shape_bound_dims_and_given_shape(bf16, synthetic_inputs):
    x = synthetic_inputs(bf16, DIMS)
    x["w13_bias"] = x["w13_bias"][:, :64].clone()
    msg = _convert_error(bf16, x)
    assert msg.startswith("w13_bias: expected shape [E, 2*I] = [2, 256], got [2, 64]")
    assert "E=2 from w13_weight.shape[0] = E" in msg
    assert "I=128 from w13_weight.shape[1] = 2*I" in msg
    assert "H=256" in msg


def test_wrong_shape_of_a_scale(bf16, synthetic_inputs):
    x = synthetic_inputs(bf16, DIMS)
    x["w2_weight_scale"] = x["w2_weight_scale"][:1].clone()
    msg = _convert_error(bf16, x)
    assert msg.startswith("w2_weight_scale: expected shape [E, H, I/32] = [2, 256, 4], got [1, 256, 4]")


def test_size_that_no_dim_gives(bf16, synthetic_inputs):
    x = synthetic_inputs(bf16, DIMS)
    x["w13_weight"] = torch.zeros(2, 255, 128, dtype=torch.uint8)  # 2*I rows must be even
    msg = _convert_error(bf16, x)
    assert "w13_weight: axis 1 has size 255, but the spec says 2*I" in msg
    assert "no positive integer I" in msg


def test_explicit_dims(bf16, synthetic_inputs):
    x = synthetic_inputs(bf16, DIMS)
    ref = bf16.convert(x)
    out = bf16.convert(x, dims={"E": 2, "I": 128})
    assert all(_same(out[k], ref[k]) for k in ref)
    assert "dims={'Z': ...} is not a dim" in _convert_error(bf16, x, dims={"Z": 1})
    assert "dim I must be a positive integer, got 0" in _convert_error(bf16, x, dims={"I": 0})
    assert "dim E must be a positive integer, got True" in _convert_error(bf16, x, dims={"E": True})
    msg = _convert_error(bf16, x, dims={"I": 64})
    assert msg.startswith("w13_weight: expected shape [E, 2*I, H/2] = [2, 128, 128], got [2, 256, 128]")
    assert "I=64 from given" in msg


def test_a_warm_call_checks_dims_of_another_type(bf16, synthetic_inputs):
    # 2.0 and True hash equal to 2 and 1: a call that passed with ints must not let them through
    x = synthetic_inputs(bf16, DIMS)
    bf16.convert(x, dims={"E": 2})
    assert "dim E must be a positive integer, got 2.0" in _convert_error(bf16, x, dims={"E": 2.0})
    bf16.convert(x, dims={"E": 2, "I": 128})
    assert "dim I must be a positive integer, got 128.0" in _convert_error(bf16, x, dims={"E": 2, "I": 128.0})


# -- run-time divisibility ----------------------------------------------------------------------------


def test_assumption_violated_at_run_time(mxfp8, synthetic_inputs):
    x = synthetic_inputs(mxfp8, {"E": 2, "I": 64, "H": 256})
    msg = _convert_error(mxfp8, x)
    assert "the spec assumes I % 128 == 0" in msg
    assert "flashinfer_cutlass_mxfp8.lyt:" in msg
    assert "here it is 64" in msg and "I=64" in msg
    x = synthetic_inputs(mxfp8, {"E": 2, "I": 128, "H": 192})
    assert "the spec assumes H % 128 == 0" in _convert_error(mxfp8, x)


def test_statement_divisibility_violated_at_run_time(bf16, synthetic_inputs):
    x = synthetic_inputs(bf16, {"E": 2, "I": 96, "H": 256})
    msg = _convert_error(bf16, x)
    assert msg.startswith("w2_weight: interleave(w2_weight, sm90_mixed) at ")
    assert "needs k_bytes % 32 == 0, where k_bytes = I/2 (so I must be a multiple of 64); here it is 48" in msg
    assert "I=96" in msg


def test_shape_division_violated_at_run_time(compile_text):
    spec = compile_text("""
        dims E, K
        input w : u8[E, K/4]
        input k : u8[E, K]
        output w : u8[E, K/4]
        output k : u8[E, K]
    """)
    ok = spec.convert({"w": torch.zeros(2, 4, dtype=torch.uint8), "k": torch.zeros(2, 16, dtype=torch.uint8)})
    assert ok["w"].shape == (2, 4)
    with pytest.raises(LayoutError):
        spec.convert({"w": torch.zeros(2, 4, dtype=torch.uint8), "k": torch.zeros(2, 17, dtype=torch.uint8)})


# -- devices --------------------------------------------------------------------------------------------


def test_tensors_on_different_devices_meta(bf16, synthetic_inputs):
    x = synthetic_inputs(bf16, DIMS)
    x["w2_weight"] = torch.empty(x["w2_weight"].shape, dtype=torch.uint8, device="meta")
    msg = _convert_error(bf16, x)
    assert "w2_weight is on meta but w13_weight is on cpu" in msg


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU for a second real device")
def test_tensors_on_different_devices_cuda(bf16, synthetic_inputs):  # pragma: no cover - GPU only
    x = synthetic_inputs(bf16, DIMS)
    x["w2_weight"] = x["w2_weight"].cuda()
    msg = _convert_error(bf16, x)
    assert "w2_weight is on cuda:0 but w13_weight is on cpu" in msg


# -- optional tensors -----------------------------------------------------------------------------------


def test_optional_tensors_passed_as_none_are_absent(bf16, synthetic_inputs):
    full = synthetic_inputs(bf16, DIMS)
    without = {k: v for k, v in full.items() if k not in ("w13_bias", "w2_bias")}
    ref = bf16.convert(without)
    out = bf16.convert({**without, "w13_bias": None, "w2_bias": None})
    assert set(out) == set(ref) == set(without)
    assert all(_same(out[k], ref[k]) for k in ref)
    one = bf16.convert({**full, "w2_bias": None})
    assert set(one) == set(full) - {"w2_bias"}
    assert _same(one["w13_bias"], bf16.convert(full)["w13_bias"])


def test_absent_optional_tensor_is_not_checked(bf16, synthetic_inputs):
    # A None optional must not be shape- or dtype-checked (it is not there).
    x = synthetic_inputs(bf16, DIMS)
    without = {k: v for k, v in x.items() if k != "w13_bias"}
    x["w13_bias"] = None
    out = bf16.convert(x)
    assert "w13_bias" not in out and set(out) == set(without)
    assert all(_same(out[k], v) for k, v in bf16.convert(without).items())


# -- inverse --------------------------------------------------------------------------------------------


def test_inverse_checks_the_output_contract(bf16, synthetic_inputs):
    out = bf16.convert(synthetic_inputs(bf16, DIMS))
    missing = dict(out)
    del missing["w2_weight_scale"]
    with pytest.raises(LayoutError, match=r"^inverse: missing tensor 'w2_weight_scale' \(e8m0\[E, H/64, I/128, 16, 16\]\)"):
        bf16.inverse(missing)
    bad = dict(out)
    bad["w13_bias"] = bad["w13_bias"].float()
    with pytest.raises(LayoutError, match=r"w13_bias: expected bf16 \(torch.bfloat16\), got torch.float32"):
        bf16.inverse(bad)


# -- inputs untouched, outputs owned ---------------------------------------------------------------------


def _cases():
    out = []
    for path, params in [
        ("flashinfer_cutlass_bf16.lyt", {}),
        ("flashinfer_cutlass_mxfp8.lyt", {}),
        ("flashinfer_cutedsl_nvfp4.lyt", {"activation": "silu"}),
        ("flashinfer_cutedsl_nvfp4.lyt", {"activation": "relu2"}),
    ]:
        # Resolving is enough to list the optional inputs (and cheap at collection time).
        opt = resolve(parse((SPECS / path).read_text(), path), params).optional_inputs
        for r in range(len(opt) + 1):
            for present in itertools.combinations(opt, r):
                out.append(pytest.param(path, params, present, id=f"{path[:-4]}{params or ''}-{'+'.join(present) or 'none'}"))
    return out


@pytest.mark.parametrize("path, params, present", _cases())
def test_converters_never_modify_inputs_nor_alias_them(path, params, present, synthetic_inputs):
    spec = layoutc.compile_file(SPECS / path, params)
    drop = [n for n in spec.program.optional_inputs if n not in present]
    x = synthetic_inputs(spec, DIMS, seed=3, drop=drop)
    before = {k: v.clone() for k, v in x.items()}
    out = spec.convert(x)
    assert set(out) == set(x)
    for k in x:
        assert _same(x[k], before[k]), f"convert modified its input {k}"
    in_ptrs = {_ptr(v) for v in x.values()}
    for k, v in out.items():
        assert _ptr(v) not in in_ptrs, f"output {k} shares storage with an input"
    assert len({_ptr(v) for v in out.values()}) == len(out), "two outputs share storage"
    # Writing into an output leaves the inputs alone.
    for v in out.values():
        bits(v).view(-1)[:16] ^= 0xFF if v.element_size() == 1 else 1
    for k in x:
        assert _same(x[k], before[k])
    if spec.invertible:
        out = spec.convert(x)
        out_before = {k: v.clone() for k, v in out.items()}
        back = spec.inverse(out)
        for k in out:
            assert _same(out[k], out_before[k]), f"inverse modified its input {k}"
        out_ptrs = {_ptr(v) for v in out.values()}
        assert all(_ptr(v) not in out_ptrs for v in back.values())
        for k in x:
            assert torch.equal(bits(back[k]), bits(x[k])), f"inverse(convert(x))[{k}] != x[{k}]"


@pytest.mark.parametrize(
    "path, params, tensor",
    [
        ("flashinfer_cutlass_mxfp8.lyt", {}, "w13_weight"),  # swapped, but the others are plain pass-through
        ("flashinfer_cutlass_mxfp8.lyt", {}, "w2_weight"),
        ("flashinfer_cutedsl_nvfp4.lyt", {"activation": "silu"}, "w2_weight"),
        ("flashinfer_cutedsl_nvfp4.lyt", {"activation": "relu2"}, "w13_weight"),
    ],
)
def test_pass_through_tensors_are_copies(path, params, tensor, synthetic_inputs):
    spec = layoutc.compile_file(SPECS / path, params)
    x = synthetic_inputs(spec, DIMS)
    out = spec.convert(x)
    if not any(tensor in {n for n, _ in s.tensors} for s in spec.program.statements):
        assert _same(out[tensor], x[tensor])  # really passed through
    assert _ptr(out[tensor]) != _ptr(x[tensor])
    out[tensor].zero_()
    assert x[tensor].any()


@pytest.mark.parametrize(
    "body, out_decl",
    [
        ("", "u8[E, 8]"),
        ("view(w, i8)", "i8[E, 8]"),
        ("cast(w, u8)", "u8[E, 8]"),
        ("reshape(w, [E, 2, 4]); reshape(w, [E, 8])", "u8[E, 8]"),
        ("reshape(w, [E, 2, 4])", "u8[E, 2, 4]"),
        ("transpose(w, 0, 1); transpose(w, 0, 1)", "u8[E, 8]"),
        ("crop(w, 0, size=E)", "u8[E, 8]"),
        ("pad(w, 1, multiple=4)", "u8[E, 8]"),
        ("swap_halves(w, 0); swap_halves(w, 0)", "u8[2*E, 8]"),
    ],
)
def test_view_like_transforms_are_copied_out(body, out_decl, compile_text):
    rows = "2*E" if "swap_halves" in body else "E"
    spec = compile_text(f"dims E\ninput w : u8[{rows}, 8]\n{body}\noutput w : {out_decl.replace('2*E', rows)}\n")
    big = torch.arange(64, dtype=torch.uint8).reshape(8, 8)
    for w in (big[:2 if rows == "E" else 4], big[2:6 if rows != "E" else 4]):  # views into a larger buffer
        before = big.clone()
        out = spec.convert({"w": w})["w"]
        assert _ptr(out) != _ptr(big)
        out.fill_(7)
        assert torch.equal(big, before)


def test_non_contiguous_inputs(bf16, synthetic_inputs):
    x = synthetic_inputs(bf16, DIMS)
    ref = bf16.convert(x)
    y = {k: v.transpose(0, -1).contiguous().transpose(0, -1) for k, v in x.items()}
    assert not y["w13_weight"].is_contiguous()
    out = bf16.convert(y)
    assert all(_same(out[k], ref[k]) for k in ref)


# -- byte-identical dtypes the contract accepts -------------------------------------------------------------


def _alternative(spec, name, x):
    """x with tensor ``name`` relabelled as the other torch dtype its element type accepts (same bytes)."""
    alt = [d for d in spec.program.input(name).elem.accepted_torch_dtypes() if d != x[name].dtype]
    return {**x, name: x[name].view(alt[0])}, alt[0]


ALTERNATIVES = [
    ("flashinfer_cutlass_bf16.lyt", {}, "w13_weight", None),
    ("flashinfer_cutlass_bf16.lyt", {}, "w13_weight_scale", None),
    ("flashinfer_cutlass_bf16.lyt", {}, "w2_weight", None),
    ("flashinfer_cutlass_bf16.lyt", {}, "w2_weight_scale", None),
    ("flashinfer_cutlass_mxfp8.lyt", {}, "w13_weight", None),
    ("flashinfer_cutlass_mxfp8.lyt", {}, "w13_weight_scale", None),
    ("flashinfer_cutlass_mxfp8.lyt", {}, "w2_weight", None),
    ("flashinfer_cutlass_mxfp8.lyt", {}, "w2_weight_scale", None),
    ("flashinfer_cutedsl_nvfp4.lyt", {"activation": "silu"}, "w13_weight", None),
    ("flashinfer_cutedsl_nvfp4.lyt", {"activation": "silu"}, "w13_weight_scale", None),
    ("flashinfer_cutedsl_nvfp4.lyt", {"activation": "silu"}, "w2_weight", None),
    ("flashinfer_cutedsl_nvfp4.lyt", {"activation": "relu2"}, "w13_weight", None),
    ("flashinfer_cutedsl_nvfp4.lyt", {"activation": "relu2"}, "w2_weight_scale", None),
]


@pytest.mark.parametrize(
    "path, params, tensor",
    [pytest.param(p, q, t, marks=[m] if m else [], id=f"{p[:-4]}{'-' + q['activation'] if q else ''}-{t}")
     for p, q, t, m in ALTERNATIVES],
)
def test_accepted_alternative_dtype(path, params, tensor, synthetic_inputs):
    """Every torch dtype the contract accepts converts like the canonical one, into the canonical dtype."""
    spec = layoutc.compile_file(SPECS / path, params)
    x = synthetic_inputs(spec, DIMS)
    ref = spec.convert(x)
    y, alt = _alternative(spec, tensor, x)
    assert alt in spec.program.input(tensor).elem.accepted_torch_dtypes()
    out = spec.convert(y)
    for k in ref:
        assert torch.equal(bits(out[k]), bits(ref[k])), k
        assert out[k].dtype == spec.program.output(k).elem.torch_dtype, f"{k}: {out[k].dtype}"
