"""``layoutc demo`` / ``make run``: one spec end to end on a deterministic synthetic layer."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from ..algebra import expr as ex
from ..front import progress
from ..api import CompiledSpec, compile_file
from ..convert.synthckpt import synthetic_inputs
from ..algebra.dtypes import bit_view
from ..shipped import SPECS
from ..lang.versions import NotInstalled

DEFAULT_SPEC = SPECS / "flashinfer_cutlass_bf16.lyt"


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n}"


def run_demo(
    spec_path: Path | None, dims: Mapping[str, int], seed: int, device: str, params: Mapping[str, Any],
    echo: Callable[[str], None] = print,
) -> bool:
    path = Path(spec_path) if spec_path else DEFAULT_SPEC
    t0 = time.perf_counter()
    with progress.working(f"compiling and verifying {path.name}"):
        spec = compile_file(path, params)
    compile_ms = (time.perf_counter() - t0) * 1e3
    p = spec.program
    dims = {k: v for k, v in dims.items() if k in p.dims}
    missing = [d for d in p.dims if d not in dims]
    if missing:
        echo(f"--shape does not give {', '.join(missing)}")
        return False
    statements = len(p.statements)
    checks = len({(k.tensor, k.value, k.multiple) for v in spec.compiled.variants for c in v.chains
                  for k in c.constraints if k.status == "runtime"})
    echo(f"layoutc demo: {p.name}  ({path})")
    echo(f"  spec sha256 {spec.sha256[:16]}  params {spec.params or '{}'}  requires "
         f"{', '.join(str(r) for r in p.requires) or 'nothing'}")
    echo(f"  compiled and verified in {compile_ms:.0f} ms: {len(p.inputs)} tensors, {statements} statements, "
         f"{len(spec.compiled.variants)} bias variants, {checks} run-time size checks")
    for w in spec.warnings:
        echo("  " + (w.one_line() if isinstance(w, NotInstalled) else f"warning: {w.message}"))
    inputs = synthetic_inputs(spec, dims, seed, device)
    echo(f"  synthetic layer ({', '.join(f'{k}={v}' for k, v in dims.items())}, seed {seed}, {device}):")
    t0 = time.perf_counter()
    out = spec.convert(inputs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    convert_ms = (time.perf_counter() - t0) * 1e3
    total = 0
    for name, x in inputs.items():
        y = out[name]
        total += x.numel() * x.element_size() + y.numel() * y.element_size()
        src = f"{p.input(name).elem.name}{list(x.shape)}"
        dst = f"{p.output(name).elem.name}{list(y.shape)}"
        echo(f"    {name:<18} {src:<26} -> {dst:<34} {_fmt_bytes(y.numel() * y.element_size())}")
    echo(f"  convert: {convert_ms:.1f} ms for {_fmt_bytes(total)} read+written (eager lowering)")
    ok = True
    if spec.invertible:
        back = spec.inverse(out, dims)  # padded outputs do not determine the unpadded dims: give them
        exact = all(torch.equal(bit_view(back[k]), bit_view(inputs[k])) for k in inputs)
        ok &= exact
        echo(f"  inverse(convert(x)) == x bit for bit: {'yes' if exact else 'NO'}")
    untouched = all(torch.equal(bit_view(v), bit_view(w)) for v, w in zip(inputs.values(), synthetic_inputs(spec, dims, seed, device).values()))
    ok &= untouched
    echo(f"  inputs left unmodified: {'yes' if untouched else 'NO'}")
    echo("  result: " + ("OK" if ok else "FAILED"))
    return ok
