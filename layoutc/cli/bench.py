"""``layoutc bench``: the converter against the anchor and the physical floor, in one run.

Three things are timed on the same synthetic layer and device:

* the generated converter (fused lowering on CUDA, the torch gather on CPU; ``--lowering`` picks);
* the *anchor*: the vLLM-style sequence of torch ops and FlashInfer helpers it replaces
  (:mod:`layoutc.reference`), with FlashInfer's real CUDA kernels on a GPU;
* a plain copy of the same input bytes (the floor: read every input once, write once).

CUDA timings use events after warm-up and report the median of many runs; CPU timings use a
monotonic clock around synchronous calls. Bandwidth counts bytes read plus bytes written.
Peak extra memory is the CUDA allocator's high-water mark during one conversion, minus
what was allocated before, divided by the size of the outputs.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from typing import Any, Callable, Mapping

import torch

from ..front import progress
from ..api import CompiledSpec
from ..convert.synthckpt import synthetic_inputs


def _nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values() if t is not None)


def timeit(fn: Callable[[], Any], device: str, warmup: int = 3, reps: int = 20, calls: int = 1) -> float:
    """Median seconds of one call of ``fn`` (CUDA events on a GPU). With ``calls`` > 1 each sample
    times that many calls back to back, as when a model's layers are converted in a row: the host
    work of one call then overlaps the device work of the one before."""
    for _ in range(warmup):
        fn()
    times = []
    if device.startswith("cuda"):
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / calls)
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


#: Calls per sample of the back-to-back figures (a layer after layer conversion).
BACK_TO_BACK = 10


def host_time(fn: Callable[[], Any], reps: int = 100, warmup: int = 5) -> float:
    """Median seconds until ``fn`` returns, the CUDA device idle at each start: the host's share of a call
    (what it launches is not waited for; :func:`timeit` gives the device's)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times)


def peak_extra(fn: Callable[[], Any], device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del result
    return peak


def bench(spec: CompiledSpec, dims: Mapping[str, int], device: str = "cpu", lowering: str = "auto",
          reps: int = 20, anchor: bool = True, eager: bool = False, seed: int = 0) -> dict[str, Any]:
    from .. import reference

    cuda = device.startswith("cuda")
    stages = 4 + 2 * cuda + (anchor and spec.name in reference.ANCHORS) + eager
    with progress.bar(total=stages, desc=f"bench {spec.name}", unit="step") as b:
        return _bench(spec, dims, device, lowering, reps, anchor, eager, seed, b)


def _bench(spec: CompiledSpec, dims: Mapping[str, int], device: str, lowering: str, reps: int, anchor: bool,
           eager: bool, seed: int, b) -> dict[str, Any]:
    from .. import reference

    started = [False]

    def stage(what: str) -> None:  # the one before is done
        b.set_postfix_str(what, refresh=False)
        if started[0]:
            b.update(1)
        b.refresh()  # every stage shown, however soon after the last (update() draws at most every 0.1 s)
        started[0] = True

    stage("inputs and a first call")
    x = synthetic_inputs(spec, dims, seed, device)
    out = spec.convert(x, lowering=lowering)
    read, written = _nbytes(x), _nbytes(out)
    moved = read + written
    flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in x.values()])
    copy_buf = torch.empty_like(flat)
    result: dict[str, Any] = {
        "spec": spec.name, "sha256": spec.sha256, "params": spec.params, "dims": dict(dims), "device": device,
        "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or platform.machine(),
        "torch": str(torch.__version__), "flashinfer": _version("flashinfer-python"), "triton": _version("triton"),
        "lowering": lowering, "bytes_read": read, "bytes_written": written, "date": time.strftime("%Y-%m-%d"),
    }
    stage("device copy")
    t_copy = timeit(lambda: copy_buf.copy_(flat), device, reps=reps)
    # One plain clone of every input (allocation included, as the converter's outputs are).
    stage("clone")
    t_clone = timeit(lambda: [t.clone() for t in x.values()], device, reps=reps)
    result.update(clone_s=t_clone, convert_vs_clone=None)
    stage(f"layoutc ({lowering})")
    t_conv = timeit(lambda: spec.convert(x, lowering=lowering), device, reps=reps)
    copy_bw = 2 * flat.numel() / t_copy
    result.update(copy_s=t_copy, copy_GBps=copy_bw / 1e9, convert_s=t_conv, convert_GBps=moved / t_conv / 1e9,
                  fraction_of_copy=moved / t_conv / copy_bw, convert_vs_clone=t_conv / t_clone)
    if device.startswith("cuda"):  # steady state of converting layer after layer: host time hidden
        stage("back to back")
        b2b = max(3, reps // 4)
        t_conv_b2b = timeit(lambda: spec.convert(x, lowering=lowering), device, reps=b2b, calls=BACK_TO_BACK)
        t_copy_b2b = timeit(lambda: copy_buf.copy_(flat), device, reps=b2b, calls=BACK_TO_BACK)
        result.update(back_to_back=BACK_TO_BACK, convert_b2b_s=t_conv_b2b, copy_b2b_s=t_copy_b2b,
                      fraction_of_copy_b2b=moved / t_conv_b2b / (2 * flat.numel() / t_copy_b2b))
    if device.startswith("cuda"):
        stage("peak memory")
    extra = peak_extra(lambda: spec.convert(x, lowering=lowering), device)
    if extra is not None:
        result.update(peak_extra_bytes=extra, peak_extra_vs_outputs=extra / written)
        for mode, kwargs in (("chunk1", {"chunk": 1}), ("inplace", {"inplace": True})):
            fresh = {k: v.clone() for k, v in x.items()}
            extra_mode = peak_extra(lambda: spec.convert(fresh, lowering=lowering, **kwargs), device)
            result[f"peak_extra_vs_outputs_{mode}"] = extra_mode / written
            del fresh
    missing = _anchor_missing(device, spec.name, x) if anchor and spec.name in reference.ANCHORS else None
    if missing is not None:  # the anchor is a comparison: without FlashInfer the converter is still timed
        result["anchor_skipped"] = missing
    elif anchor and spec.name in reference.ANCHORS:
        stage("anchor")
        kernels, note = reference.kernels_for(device)
        run = lambda: reference.anchor(spec.name, x, spec.params, kernels)  # noqa: E731
        t_anchor = timeit(run, device, reps=reps)
        result.update(anchor=note, anchor_s=t_anchor, anchor_GBps=moved / t_anchor / 1e9, speedup=t_anchor / t_conv)
        extra = peak_extra(run, device)
        if extra is not None:
            result["anchor_peak_extra_vs_outputs"] = extra / written
    if eager:
        stage("eager")
        t_eager = timeit(lambda: spec.convert(x, lowering="eager"), device, reps=max(3, reps // 4))
        result.update(eager_s=t_eager, eager_GBps=moved / t_eager / 1e9)
    return result


def _anchor_missing(device: str, name: str, x: Mapping[str, torch.Tensor]) -> str | None:
    """Why the anchor cannot run here (its recipes call FlashInfer's Python helpers), or None."""
    from .. import reference

    try:
        kernels, _ = reference.kernels_for(device)
        reference.anchor(name, x, {}, kernels)
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("flashinfer"):
            raise
        return "skipped: flashinfer is not installed (pip install flashinfer-python)"
    return None


def _version(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def rate(bytes_per_s: float) -> str:
    """A bandwidth with a unit that shows its digits: ``1.31 TB/s``, ``742 GB/s``, ``86.4 MB/s``."""
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= scale:
            v = bytes_per_s / scale
            return f"{v:.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{bytes_per_s:.3g} B/s"


def times(ratio: float) -> str:
    """``4.7x``, ``38x``, ``1968x``: a ratio with as many digits as mean something."""
    return f"{ratio:.2g}x" if ratio < 10 else f"{ratio:.0f}x"


def report(r: Mapping[str, Any]) -> str:
    ms = lambda s: f"{s * 1e3:9.3f} ms"  # noqa: E731
    dims = ",".join(f"{k}={v}" for k, v in r["dims"].items())
    moved = r["bytes_read"] + r["bytes_written"]
    lines = [
        f"{r['spec']} {dims} on {r['device']} ({r['device_name']}), torch {r['torch']}, "
        f"flashinfer {r['flashinfer'] or 'not installed'}, triton {r['triton'] or 'not installed'}, {r['date']}",
        f"  bytes read + written   {moved / 1e6:.3f} MB" if moved < 1e9 else
        f"  bytes read + written   {moved / 1e9:.3f} GB",
        f"  device copy            {ms(r['copy_s'])}  {rate(r['copy_GBps'] * 1e9):>10}",
        f"  clone of the inputs    {ms(r['clone_s'])}",
        f"  layoutc ({r['lowering']:<6})       {ms(r['convert_s'])}  {rate(r['convert_GBps'] * 1e9):>10}  "
        f"{r['fraction_of_copy']:.1%} of copy, {times(r['convert_vs_clone'])} the time of a clone"
        + (f", {times(r['speedup'])} faster than the anchor" if r.get("speedup", 0) >= 1 else
           f", {times(1 / r['speedup'])} slower than the anchor" if "speedup" in r else ""),
    ]
    if "convert_b2b_s" in r:
        lines.append(f"  {r['back_to_back']} calls back to back {ms(r['convert_b2b_s'])} per call  "
                     f"{r['fraction_of_copy_b2b']:.1%} of {r['back_to_back']} copies back to back "
                     f"({r['copy_b2b_s'] * 1e3:.3f} ms each)")
    if "peak_extra_vs_outputs" in r:
        lines.append(f"  peak extra memory      {r['peak_extra_vs_outputs']:.2f}x outputs (chunk=1: "
                     f"{r['peak_extra_vs_outputs_chunk1']:.2f}x, inplace: {r['peak_extra_vs_outputs_inplace']:.2f}x)")
    if "anchor_s" in r:
        extra = f"  peak extra {r['anchor_peak_extra_vs_outputs']:.2f}x" if "anchor_peak_extra_vs_outputs" in r else ""
        lines.append(f"  anchor (vLLM-style)    {ms(r['anchor_s'])}  {rate(r['anchor_GBps'] * 1e9):>10}{extra}  "
                     f"[{r['anchor']}]")
    if "anchor_skipped" in r:
        lines.append(f"  anchor (vLLM-style)    {r['anchor_skipped']}")
    if "eager_s" in r:
        lines.append(f"  eager lowering         {ms(r['eager_s'])}  {rate(r['eager_GBps'] * 1e9):>10}")
    if not r["device"].startswith("cuda"):
        lines.append("  note: on the CPU the converter runs torch ops (no generated kernels) and the anchor runs CPU "
                     "ports of FlashInfer's CUDA helpers: a check that everything runs, not a speed measurement")
    return "\n".join(lines)


def to_json(r: Mapping[str, Any]) -> str:
    return json.dumps(r, indent=2, sort_keys=True)
