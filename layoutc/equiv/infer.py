"""``layoutc infer``: recover the index maps of a black-box conversion function and write a spec for it.

An engine migrating to layoutc has conversion code, not specs. ``infer`` runs that code on the same
self-describing inputs as ``layoutc equiv`` (:mod:`layoutc.equiv.compare`), at a few shapes, and reads back,
for every output element (bit, where bits move), the input element it holds. Then, per tensor:

1. *Packings.* The output is peeled of kernel packing families (the prelude's ``sm90_mixed``,
   ``sf_128x4``, ``trtllm(epilogue_tile)``, ``block_layout(block_k)``; one or two of them, for the
   tensor's role): the family's map at the concrete shape is inverted on the measured sources (each
   element the family places is put back), which must leave every element accounted for exactly once.
2. *Logical moves.* What remains must keep the tensor's axes and move each axis by itself (the
   experts stay). Each axis's function (output row -> input row, padding) is explained as a short
   chain of the registered row ops (``swap_halves``, ``swap_pairs``, ``reorder_gated_rows``,
   ``interleave_rows(group)``, ``deinterleave(group)``) and ``pad(multiple, parts)``, found by an
   iterative-deepening search that peels the last op, on all sampled shapes at once: the dims are
   sampled (the given ones, one period more, twice as large) so that size-dependent formulas
   (``pad`` to 64 or to 128, a 64-row group or a half) are told apart.
3. *Values.* A changed element type is a ``cast`` (values survived, bits did not) or a ``view``.
4. *Fallback.* An axis no chain explains gets an explicit ``permute(t, dim=d, table=[...])`` when its
   permutation repeats with a period at every sampled shape, flagged in a comment for the reviewer;
   anything else is reported, not guessed.

The checkpoint contract (names, element types, shapes, ties, row order) comes from ``--names vllm``
(vLLM's FusedMoE names, for ``--quant mxfp4 | nvfp4 | fp8_block | bf16``, ``--rows contiguous |
gpt_oss | single``, ``--bias``) or from ``--inputs FILE`` (a spec fragment: ``dims``, ``assume``,
``param`` and ``input`` lines). Scale ties missing there are proposed where a scale's rows follow a
weight's. Sizes the function rejects become ``assume`` lines. The output declarations (types, row
order, packings) are read off the chains. The written spec is then verified and proved equal to the
function with ``equiv``.

Importing the function's module runs its code, as with ``equiv --against``.

This module is the driver (:func:`infer`, :class:`Inferred`); the parts live beside it:
:mod:`.infer_contract` (the checkpoint contract and ties), :mod:`.infer_measure` (running the function at
sampled dims), :mod:`.infer_tensors` (step 1, and each tensor's search), :mod:`.infer_axes` (steps 2 and 4,
per axis) and :mod:`.infer_write` (the spec text).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import attrs

from .compare import Result, _threads, equivalent
from .function_runner import EquivError, FunctionFailed, Target, as_target
from .usercode import CALL_TIMEOUT
from .infer_axes import TensorChain
from .infer_contract import _choose_contract, _program, _propose_ties, _with_ties
from .infer_measure import _contract_ok, _measure, _modes, _sample_dims, _zeros, probe_periods
from .infer_tensors import search_tensor
from .infer_write import _check_name, _harmonise, _param_text, _write


@attrs.frozen
class Inferred:
    """What ``infer`` found: the spec text, per tensor whether registered ops/families explain it, notes
    for the reviewer, and the ``equiv`` verdict of the written spec against the function."""

    text: str
    chains: tuple[TensorChain, ...]
    notes: tuple[str, ...]
    samples: tuple[dict, ...]
    verdict: Result | None
    verify_errors: tuple[str, ...] = ()

    @property
    def named(self) -> bool:
        return all(c.named for c in self.chains)

    @property
    def ok(self) -> bool:
        return self.verdict is not None and self.verdict.ok and not self.verify_errors


def infer(fn: Callable[..., Any] | str | Target, dims: Mapping[str, int], names: str | None = "vllm",
          quant: str | None = None, rows: str = "contiguous", bias: bool = False, inputs: str | None = None,
          params: Mapping[str, Any] | None = None, spec_name: str = "inferred", check: bool = True,
          shapes: int = 4, progress: Callable[[str], None] | None = None, threads: int | None = 1,
          timeout: float | None = CALL_TIMEOUT, hard_exit: bool = False) -> Inferred:
    """Infer a spec for ``fn`` (see the module docstring). ``inputs``: the checkpoint contract as spec
    lines (``dims``, ``assume``, ``input`` ...); else ``names="vllm"`` with ``quant``/``rows``/``bias``.
    ``params`` are passed to the function (a ``params`` parameter) and written into the spec."""
    target = as_target(fn, timeout=timeout, hard_exit=hard_exit)
    params = dict(params or {})
    # Both are written into the spec text: a name or value that is not one token could add statements.
    _check_name("spec name", spec_name)
    for k, v in params.items():
        _check_name("parameter name", k)
        _param_text(k, v)
    say = progress or (lambda text: None)
    with _threads(threads):
        contract = _choose_contract(target, dims, names, quant, rows, bias, inputs, params, say)
        program = _program(contract)
        missing = [d for d in program.dims if d not in dims]
        if missing:
            raise EquivError(f"--dims must give {', '.join(missing)} (the contract's dims: {', '.join(program.dims)})")
        given = {d: int(dims[d]) for d in program.dims}
        if not _contract_ok(program, given):
            raise EquivError(f"the dims {given} do not fit the input shapes "
                             f"({', '.join(t.shape_str() for t in program.inputs)})")
        try:
            first = target.call(_zeros(program, given), params, f"at {given}")
        except FunctionFailed as err:
            raise EquivError(f"{err}; check --dims, --quant, --rows and -D") from None
        say("probing the sizes the function accepts")
        contract_p, function_p = probe_periods(target, program, given, params)
        envs = _sample_dims(target, program, given, contract_p, function_p, params)
        say("measuring at " + "; ".join(", ".join(f"{k}={v}" for k, v in e.items()) for e in envs))
        modes = _modes(program, {k: v.dtype for k, v in first.items()})
        samples = [_measure(target, program, env, params, modes) for env in envs]
        modes_final = {n: e.mode for n, e in samples[-1].plan.inputs.items()}
        if any(modes_final[n] != s.plan.inputs[n].mode for s in samples for n in modes_final):
            samples = [_measure(target, program, env, params, dict(modes_final)) for env in envs]
        notes: list[str] = []
        # Ties first: a tie gives the tensor its role (a bias's rows are its last axis, a scale follows
        # its weight's packings), which the search below needs.
        ties = _propose_ties(program, samples)
        notes += [f"proposed tie: {n}" for _, n in ties]
        if ties:
            contract = _with_ties(contract, ties)
            program = _program(contract)
        chains: dict[str, TensorChain] = {}
        for t in program.inputs:
            if t.name not in samples[0].codes:
                notes.append(f"{t.name}: the function returns no tensor of that name; no statements written")
                continue
            say(f"searching {t.name}")
            tied = chains.get(t.tie.weight) if t.tie is not None else None
            c = search_tensor(t, samples, prefer=[st.family for st in tied.statements if st.kind == "family"]
                              if tied is not None else ())
            chains[t.name] = c
            if c.note:
                notes.append(c.note)
        _harmonise(program, chains)
        extra = sorted(set(samples[0].codes) - {t.name for t in program.inputs})
        if extra:
            notes.append(f"the function also returns {', '.join(extra)}, "
                         "which has no input of its name: not in the spec")
        assumes = [f"assume {d} % {function_p[d]} == 0" for d in program.dims if function_p[d] > contract_p[d]]
        text, verify_errors = _write(program, contract, chains, assumes, params, target, envs, spec_name)
    verdict = None
    if check and text is not None and not verify_errors:
        say("checking the written spec with equiv")
        try:
            verdict = equivalent(text, target, given, params={}, shapes=shapes, threads=threads)
        except EquivError as err:
            notes.append(f"equiv could not check the written spec: {err}")
    return Inferred(text or "", tuple(chains.values()), tuple(notes), tuple(envs), verdict, tuple(verify_errors))


