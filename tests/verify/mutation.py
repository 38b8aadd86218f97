"""Mutation testing of the verifier: every mutant of a shipped spec must be rejected
(at compile time, or loudly at convert time) or convert exactly like the original."""

from __future__ import annotations

from pathlib import Path

import attrs
import torch

import layoutc

from layoutc.convert.synthckpt import synthetic_inputs
from tests.helpers import bits
from tests.verify.mutants import mutants

#: Per shipped spec: the parameter sets to try and two layer shapes that satisfy it. Every
#: parameter is set explicitly (as engines do), so a mutated default is not a layout change.
SPEC_CASES = {
    "flashinfer_cutlass_bf16": ([{"tp_size": 1, "tp_rank": 0}, {"tp_size": 2, "tp_rank": 1}],
                                [{"E": 2, "I": 256, "H": 128}, {"E": 1, "I": 512, "H": 384}]),
    "flashinfer_cutlass_mxfp8": ([{"tp_size": 1, "tp_rank": 0}, {"tp_size": 2, "tp_rank": 1}],
                                 [{"E": 2, "I": 256, "H": 128}, {"E": 1, "I": 512, "H": 384}]),
    "flashinfer_cutedsl_nvfp4": ([{"activation": a, "tp_size": n, "tp_rank": n - 1}
                                  for n in (1, 2) for a in ("silu", "relu2")],
                                 [{"E": 2, "I": 128, "H": 128}, {"E": 1, "I": 384, "H": 80}]),
    "flashinfer_trtllm_mxfp4": ([{"tp_size": n, "tp_rank": n - 1, "pad_to": 256, "pad_hidden": 256} for n in (1, 4)],
                                [{"E": 2, "I": 128, "H": 128}, {"E": 1, "I": 256, "H": 384}]),
    "flashinfer_cutlass_mxfp4_padded": ([{"checkpoint": c, "tp_size": n, "tp_rank": n - 1}
                                         for n in (1, 4) for c in ("contiguous", "gpt_oss")],
                                        [{"E": 2, "I": 384, "H": 160}, {"E": 1, "I": 256, "H": 128}]),
    "flashinfer_trtllm_nvfp4": ([{"activation": a, "tp_size": n, "tp_rank": n - 1, "pad_hidden": 256}
                                 for n in (1, 4) for a in ("silu", "relu2")],
                                [{"E": 2, "I": 128, "H": 128}, {"E": 1, "I": 192, "H": 384}]),
    "flashinfer_cutlass_nvfp4": ([{"activation": a, "pad_to": 128, "tp_size": n, "tp_rank": n - 1}
                                  for n in (1, 4) for a in ("silu", "relu2")],
                                 [{"E": 2, "I": 192, "H": 80}, {"E": 1, "I": 256, "H": 64}]),
    "flashinfer_trtllm_fp8_block": ([{"tp_size": n, "tp_rank": n - 1} for n in (1, 2)],
                                    [{"E": 2, "I": 256, "H": 256}, {"E": 1, "I": 512, "H": 128}]),
    "flashinfer_trtllm_bf16": ([{"activation": a, "tp_size": n, "tp_rank": n - 1, "pad_to": 128}
                                for n in (1, 4) for a in ("silu", "relu2")],
                               [{"E": 2, "I": 64, "H": 128}, {"E": 1, "I": 192, "H": 64}]),
    "triton_kernels_mxfp4_hopper": ([{"tp_size": n, "tp_rank": n - 1, "pad_to": 64} for n in (1, 2)],
                                    [{"E": 2, "I": 64, "H": 64}, {"E": 1, "I": 192, "H": 96}]),
    "triton_kernels_mxfp4_blackwell": ([{"tp_size": n, "tp_rank": n - 1, "pad_to": 64} for n in (1, 2)],
                                       [{"E": 2, "I": 64, "H": 64}, {"E": 1, "I": 192, "H": 96}]),
    "aiter_mxfp4": ([{"tp_size": n, "tp_rank": n - 1, "pad_to": 128, "pad_hidden": 128} for n in (1, 2)],
                    [{"E": 2, "I": 64, "H": 64}, {"E": 1, "I": 256, "H": 160}]),
    "aiter_fp8_block": ([{"tp_size": n, "tp_rank": n - 1} for n in (1, 2)],
                        [{"E": 2, "I": 256, "H": 128}, {"E": 1, "I": 512, "H": 256}]),
    # (sm90 under TP shares every statement with sm100 under TP: three sets, not four, for the slow suite)
    "deepgemm_fp8_block": ([{"arch": "sm90", "tp_size": 1, "tp_rank": 0}, {"arch": "sm100", "tp_size": 1, "tp_rank": 0},
                            {"arch": "sm100", "tp_size": 2, "tp_rank": 1}],
                           [{"E": 2, "I": 256, "H": 128}, {"E": 1, "I": 512, "H": 256}]),
    "vllm_cutlass_nvfp4": ([{"activation": a, "tp_size": n, "tp_rank": n - 1} for n in (1, 2) for a in ("silu", "relu2")],
                           [{"E": 2, "I": 128, "H": 64}, {"E": 1, "I": 384, "H": 80}]),
    # I = 128 takes the single-group scale table at group 128, the grouped one at 64 and 32
    "marlin_gptq_int4": ([{"group_size": g, "tp_size": n, "tp_rank": n - 1} for g in (128, 64, 32) for n in (1, 2)],
                         [{"E": 2, "I": 256, "H": 256}, {"E": 1, "I": 512, "H": 128}]),
    "marlin_mxfp4": ([{"tp_size": n, "tp_rank": n - 1} for n in (1, 2)],
                     [{"E": 2, "I": 64, "H": 64}, {"E": 1, "I": 192, "H": 192}]),
    "marlin_nvfp4": ([{"activation": a, "act_dtype": d, "tp_size": n, "tp_rank": n - 1}
                      for n in (1, 2) for a, d in (("silu", "bf16"), ("relu2", "f16"))],
                     [{"E": 2, "I": 128, "H": 64}, {"E": 1, "I": 256, "H": 192}]),
    "vllm_cutlass_w4a8": ([{"tp_size": n, "tp_rank": n - 1} for n in (1, 2)],
                          [{"E": 2, "I": 512, "H": 256}, {"E": 1, "I": 1024, "H": 512}]),
}


@attrs.frozen
class Outcome:
    description: str
    verdict: str  # "rejected" | "rejected at convert" | "equivalent" | "SURVIVED"
    detail: str = ""


def _same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(bits(a[k]), bits(b[k])) for k in a
    )


def run(path: Path) -> list[Outcome]:
    params_list, dims_list = SPEC_CASES[path.stem]
    text = path.read_text()
    reference = {}
    for params in params_list:
        spec = layoutc.compile_file(path, params)
        for dims in dims_list:
            x = synthetic_inputs(spec, dims, seed=11)
            reference[(tuple(params.items()), tuple(dims.items()))] = (x, spec.convert(x))
    out = []
    for description, mutated in mutants(text):
        verdict, detail = "equivalent", ""
        for params in params_list:
            try:
                spec = layoutc.compile_source(mutated, f"{path.stem}-mutant.lyt", params)
            except layoutc.SpecError as err:
                verdict, detail = "rejected", err.errors[0].message if err.errors else ""
                break
            for dims in dims_list:
                x, expected = reference[(tuple(params.items()), tuple(dims.items()))]
                try:
                    got = spec.convert(x)
                except layoutc.LayoutError as err:
                    verdict, detail = "rejected at convert", str(err)
                    break
                if not _same(got, expected):
                    verdict, detail = "SURVIVED", f"params {params}, dims {dims}: outputs differ"
                    break
            if verdict != "equivalent":
                break
        out.append(Outcome(description, verdict, detail))
    return out


def score(outcomes: list[Outcome]) -> tuple[int, int, int]:
    killed = sum(o.verdict.startswith("rejected") for o in outcomes)
    survived = sum(o.verdict == "SURVIVED" for o in outcomes)
    equivalent = sum(o.verdict == "equivalent" for o in outcomes)
    return killed, survived, equivalent


