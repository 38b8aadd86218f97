"""Cost of the pre-kernel guard in an engine's load path, next to a conversion and a device move.

    python benchmarks/guard_overhead.py --device cuda                  # gpt-oss-120b layer (E=128, I=H=2880)
    python benchmarks/guard_overhead.py --device cpu --small           # the same steps, small, on the CPU
    python benchmarks/guard_overhead.py --device cuda --spec specs/flashinfer_trtllm_mxfp4.lyt --json out.json

Times (median of several, synchronised):

* ``convert``: one conversion of the layer (it stamps provenance and queues the fingerprints), and
  its host time alone (``convert_host``: the call returns before the device finishes);
* ``fingerprint``: the fingerprints of the layer's outputs alone (a pass over their bytes on the
  device, one read-back); ``fingerprint_host``: the host time to queue them (what the stamp adds
  to a warm convert call on CUDA, where the device work overlaps);
* ``move``: the converted layer copied host -> device (``.to(device)`` from pinned and from pageable
  memory; on the CPU a copy);
* ``first_check``: the guard's first call on the moved copy (fingerprints it on the device, matches
  it with the converted bytes, stamps it); ``check``: every later call (dict lookups, no device
  work); ``module_guard``: the standalone module's guard; ``rehash``: ``check(rehash=True)``.

It also asserts what the numbers rely on: the fingerprint of each tensor is the same on the host and
on the device (exact integer GEMMs) and equals the one the stamp queued, the moved copy is
accepted, and a copy with one byte changed is rejected.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import layoutc
import layoutc.guard as guard
from layoutc.convert.synthckpt import synthetic_inputs
from layoutc.runtime.fingerprint import _fingerprint_finish, _fingerprint_start

ROOT = Path(__file__).resolve().parent.parent
GPT_OSS_120B = "E=128,I=2880,H=2880"
SMALL = "E=4,I=256,H=256"


def median_s(fn, reps, sync, setup=None) -> float:
    """Median seconds of ``fn()`` (synchronised before and after); ``setup()`` runs untimed before each."""
    if setup is None:
        fn()
    times = []
    for _ in range(reps):
        arg = setup() if setup is not None else None
        sync()
        t0 = time.perf_counter()
        fn() if setup is None else fn(arg)
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def host_s(fn, reps, sync) -> float:
    """Median host seconds of ``fn()`` without waiting for the device inside the timing."""
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        sync()
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "specs" / "flashinfer_cutlass_bf16.lyt"))
    ap.add_argument("--shape", default=None, help=f"dims (default {GPT_OSS_120B}, or {SMALL} with --small)")
    ap.add_argument("--small", action="store_true", help=f"small layer ({SMALL}): a quick run, e.g. on the CPU")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions (default 20 on CUDA, 5 on the CPU)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args()
    shape = args.shape or (SMALL if args.small else GPT_OSS_120B)
    dims = {k: int(v) for k, v in (kv.split("=") for kv in shape.split(","))}
    cuda = args.device.startswith("cuda")
    reps = args.reps or (20 if cuda else 5)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    spec = layoutc.compile_file(args.spec)

    x = synthetic_inputs(spec, dims, 0, args.device)
    out = spec.convert(x)
    sync()
    nbytes = sum(v.numel() * v.element_size() for v in out.values())
    res = {"spec": spec.name, "shape": shape, "device": args.device, "layer_bytes": nbytes}
    res["convert"] = median_s(lambda: spec.convert(x), reps, sync)
    res["convert_host"] = host_s(lambda: spec.convert(x), reps, sync)
    res["fingerprint"] = median_s(lambda: _fingerprint_finish(_fingerprint_start(list(out.values())), len(out)),
                                  reps, sync)
    res["fingerprint_host"] = host_s(lambda: _fingerprint_start(list(out.values())), reps, sync)

    # The converted layer in host memory, as an engine converting on the CPU has it: the guard
    # adopts it there once (a CPU pass, untimed here), so copies of it can be matched.
    host = {k: v.cpu() for k, v in out.items()} if cuda else out
    guard.check(host, spec)
    gpu_fp = [guard.fingerprint(v) for v in out.values()]
    cpu_fp = [guard.fingerprint(v) for v in host.values()]
    assert gpu_fp == cpu_fp, "the fingerprints differ between the device and the host"
    assert gpu_fp == [guard.fingerprint(v, converted=True) for v in out.values()], "the stamp's fingerprints differ"
    pinned = {k: v.pin_memory() for k, v in host.items()} if cuda else None
    if pinned is not None:
        guard.check(pinned, spec)

    def move(src):
        return {k: v.to(args.device, copy=True, non_blocking=src is pinned) for k, v in src.items()}

    res["move_pageable"] = median_s(lambda: move(host), reps, sync)
    if pinned is not None:
        res["move_pinned"] = median_s(lambda: move(pinned), reps, sync)
    res["first_check"] = median_s(lambda moved: guard.check(moved, spec), reps, sync, setup=lambda: move(host))
    moved = move(host)
    guard.check(moved, spec)
    res["check"] = median_s(lambda: guard.check(moved, spec), 200, sync)
    res["module_guard"] = median_s(lambda: spec.module.guard(moved), 200, sync)
    res["rehash"] = median_s(lambda: guard.check(moved, spec, rehash=True), reps, sync)

    bad = move(host)
    name = next(iter(bad))
    bad[name].view(-1).view(torch.uint8)[-1] ^= 1
    try:
        guard.check(bad, spec)
        raise AssertionError("a copy with one changed byte was accepted")
    except layoutc.LayoutError:
        pass

    gb = nbytes / 1e9
    print(f"{spec.name} {shape} on {args.device}: layer {nbytes / 1e6:.1f} MB")
    print(f"  convert          {res['convert'] * 1e3:9.3f} ms  ({gb / res['convert']:.1f} GB/s); host time "
          f"{res['convert_host'] * 1e6:.1f} us")
    print(f"  fingerprint      {res['fingerprint'] * 1e3:9.3f} ms  ({gb / res['fingerprint']:.1f} GB/s, "
          f"{res['fingerprint'] / res['convert']:.2f} of convert); host time to queue it "
          f"{res['fingerprint_host'] * 1e6:.1f} us")
    for key in ("move_pageable", "move_pinned"):
        if key in res:
            print(f"  {key:16s} {res[key] * 1e3:9.3f} ms  ({gb / res[key]:.1f} GB/s)")
    print(f"  first check      {res['first_check'] * 1e3:9.3f} ms  (fingerprint on {args.device} + match + stamp)")
    print(f"  check            {res['check'] * 1e6:9.1f} us  | module.guard {res['module_guard'] * 1e6:.1f} us")
    print(f"  check rehash     {res['rehash'] * 1e3:9.3f} ms")
    print("  host and device fingerprints equal; a copy with one changed byte rejected")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
