"""The checkpoint contract ``infer`` writes a spec for: input names, element types, shapes, ties.

It comes from ``--names vllm`` (vLLM's FusedMoE names per ``--quant``, ``--rows``, ``--bias``;
:func:`vllm_contract`) or from ``--inputs FILE`` (a spec fragment, compiled with :func:`_program`); without
``--quant`` the function is tried with each format (:func:`_choose_contract`). Scale ties missing from the
contract are proposed where a scale's rows follow a weight's (:func:`_propose_ties`, :func:`_with_ties`). Kept
apart from :mod:`layoutc.equiv.infer`: what is declared, not what is measured.
"""

from __future__ import annotations

import math

import torch

from .function_runner import EquivError, FunctionAborted, FunctionFailed
from ..algebra.indexmap import concrete_shape
from .infer_measure import Sample, _contract_ok, _zeros


# ---------------------------------------------------------------------------
# the checkpoint contract

#: --names vllm: vLLM FusedMoE parameter names per checkpoint format: (weight type, scale type,
#: w13 scale shape, w2 scale shape, tie)
_VLLM = {
    "mxfp4": ("fp4x2", "e8m0", "H/32", "I/32", "block 32"),
    "nvfp4": ("fp4x2", "e4m3", "H/16", "I/16", "block 16"),
    "fp8_block": ("e4m3", "f32", None, None, "block 128x128"),
    "bf16": ("bf16", None, None, None, None),
}
QUANTS = tuple(_VLLM)
ROWS = ("contiguous", "gpt_oss", "single")


def vllm_contract(quant: str, rows: str = "contiguous", bias: bool = False) -> str:
    """The ``dims``/``input`` lines of a vLLM FusedMoE layer of this format (``rows``: w13 stored
    [w1; w3], interleaved gpt-oss style, or a single shard for non-gated activations)."""
    if quant not in _VLLM:
        raise EquivError(f"--quant {quant!r}: choose one of {', '.join(QUANTS)}")
    if rows not in ROWS:
        raise EquivError(f"--rows {rows!r}: choose one of {', '.join(ROWS)}")
    wtype, stype, s13, s2, tie = _VLLM[quant]
    r13 = "I" if rows == "single" else "2*I"
    order = {"contiguous": "rows [w1; w3]", "gpt_oss": "rows interleave(w1, w3)", "single": "rows [w1]"}[rows]
    packed = wtype == "fp4x2"
    lines = ["dims E, I, H"]
    lines.append(f"input w13_weight : {wtype}[E, {r13}, {'H/2' if packed else 'H'}]   {order}")
    if quant == "fp8_block":
        lines.append(f"input w13_weight_scale : f32[E, {r13}/128, H/128]   scales w13_weight {tie}")
    elif stype is not None:
        lines.append(f"input w13_weight_scale : {stype}[E, {r13}, {s13}]   scales w13_weight {tie}")
    if bias:
        lines.append(f"input w13_bias? : f32[E, {r13}]   bias of w13_weight")
    lines.append(f"input w2_weight : {wtype}[E, H, {'I/2' if packed else 'I'}]")
    if quant == "fp8_block":
        lines.append(f"input w2_weight_scale : f32[E, H/128, I/128]   scales w2_weight {tie}")
    elif stype is not None:
        lines.append(f"input w2_weight_scale : {stype}[E, H, {s2}]   scales w2_weight {tie}")
    if bias:
        lines.append("input w2_bias? : f32[E, H]   bias of w2_weight")
    return "\n".join(lines) + "\n"


def _program(text: str, filename: str = "<inputs>"):
    from ..front.errors import SpecError
    from ..lang.resolver import resolve
    from ..front.parse import parse

    try:
        return resolve(parse(f"spec inferred\n{text}", filename), {})
    except SpecError as err:
        raise EquivError("the input contract does not parse:\n" + "\n".join(
            d.format(filename, err.source) for d in err.diagnostics)) from None


def _choose_contract(target, dims, names, quant, rows, bias, inputs, params, say) -> str:
    if inputs is not None:
        return inputs
    if names not in ("vllm", None):
        raise EquivError(f"--names {names!r}: only 'vllm' is built in; give the inputs with --inputs FILE")
    if quant is not None:
        return vllm_contract(quant, rows, bias)
    fits = []
    for q in QUANTS:
        text = vllm_contract(q, rows, bias)
        program = _program(text)
        env = {d: int(dims[d]) for d in program.dims if d in dims}
        if len(env) != len(program.dims) or not _contract_ok(program, env):
            continue
        try:
            out = target.call(_zeros(program, env), params, f"with --quant {q}")
        except FunctionAborted:
            raise  # it exited or hung: no other format will tell more
        except (FunctionFailed, EquivError):
            continue
        if {t.name for t in program.inputs if not t.optional} <= set(out):
            fits.append(q)
    if len(fits) == 1:
        say(f"checkpoint format: {fits[0]} (the only one the function accepts)")
        return vllm_contract(fits[0], rows, bias)
    if not fits:
        raise EquivError("the function accepts none of the vLLM checkpoint formats at these dims "
                         f"({', '.join(QUANTS)}); give --quant, or the inputs with --inputs FILE")
    raise EquivError(f"the function accepts several checkpoint formats ({', '.join(fits)}); choose one with --quant")


def _propose_ties(program, samples) -> list[tuple[str, str]]:
    """``scales W block B`` / ``bias of W`` for inputs declared without a tie whose rows follow a weight's
    (same rows, K in blocks of B): (tensor, clause)."""
    out = []
    s = samples[0]
    weights = [t for t in program.inputs if t.tie is None]
    for t in program.inputs:
        if t.tie is not None or t.name not in s.codes:
            continue
        shape = concrete_shape(t.shape, s.dims)
        for w in weights:
            if w is t or w.name not in s.codes:
                continue
            wshape = concrete_shape(w.shape, s.dims)
            if len(shape) == len(wshape) and shape[:-1] == wshape[:-1] and shape[-1] < wshape[-1]:
                k_w = wshape[-1] * w.elem.values
                if k_w % shape[-1] == 0 and _rows_follow(s, t.name, w.name):
                    out.append((t.name, f"scales {w.name} block {k_w // shape[-1]}"))
                    break
            if len(shape) == len(wshape) - 1 and shape == wshape[:-1] and _rows_follow(s, t.name, w.name):
                out.append((t.name, f"bias of {w.name}"))
                break
    return out


def _rows_follow(s: Sample, a: str, b: str) -> bool:
    """Whether outputs ``a`` and ``b`` (same leading output axes) read the same input row at each output row."""
    def rows(name):
        enc = s.plan.inputs[name]
        codes = s.codes[name]
        if enc.mode == "bits":
            first = codes[..., 0]
            codes = torch.where(first >= 0,
                                torch.div(first - enc.offset, enc.width, rounding_mode="floor") + enc.offset, -1)
        inner = math.prod(enc.shape[2:]) if len(enc.shape) > 2 else 1
        if codes.dim() < 2:
            return None
        r = torch.where(codes >= 0, torch.div(codes - enc.offset, inner, rounding_mode="floor"), -1)
        return r.reshape(*codes.shape[:2], -1)[..., 0]

    ra, rb = rows(a), rows(b)
    return ra is not None and rb is not None and ra.shape == rb.shape and torch.equal(ra, rb)


def _with_ties(contract: str, ties) -> str:
    """The contract with the proposed tie clauses on their input lines, marked for the reviewer."""
    tie_of = dict(ties)
    lines = []
    for line in contract.splitlines():
        stripped = line.strip()
        if stripped.startswith("input "):
            name = stripped.split()[1].rstrip(":").rstrip("?")
            if name in tie_of:
                code, hash_, comment = line.partition("#")
                line = f"{code.rstrip()}   {tie_of[name]}   # proposed by layoutc infer: its rows follow the weight's" \
                    + (f"; {comment.strip()}" if hash_ else "")
        lines.append(line)
    return "\n".join(lines)
