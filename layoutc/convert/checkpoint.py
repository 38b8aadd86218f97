"""``layoutc convert``: pre-convert a safetensors checkpoint into a kernel layout.

* Reads a single ``*.safetensors`` file or a sharded checkpoint with
  ``model.safetensors.index.json``, lazily (one MoE layer in memory at a time).
* Finds each layer's MoE tensors through a **name mapping**: for every spec input a template
  with a ``{layer}`` placeholder. Presets: ``vllm`` (``{layer}.w13_weight``, ...) and ``gpt-oss``
  (``{layer}.gate_up_proj_blocks``, ... with the 16-byte blocks merged into rows); or a JSON file
  ``{"w13_weight": {"name": "{layer}.experts.w13", "merge_last": false, "dtype": null}, ...}``.
* Checks everything before converting anything: the index, the name mapping and every shard's
  header (:mod:`layoutc.convert.shardheader`), then every layer's shapes against the spec (meta tensors).
  A malformed input is a LayoutError naming the file and tensor; two spec inputs on one tensor are
  refused; a tensor the index leaves out is copied (with a warning) and indexed.
* Writes one output shard per input shard (same names, converted MoE tensors, everything else
  copied), an index, and metadata (spec name, sha256, parameters, library versions) in every
  shard's safetensors header and in ``layoutc_manifest.json``.
* Resumes: a finished shard is written atomically and marked done with a stamp (the input shard's
  digest, the spec's sha256, parameters, name mapping); a rerun skips shards whose stamp matches
  and redoes the others. The input digest is :data:`layoutc.convert.shardio.DIGEST` (a sha256 tree over
  16 MiB leaves, hashed on several threads; named in the stamp): a shard changed in place, size
  and mtime kept, is converted again, and so is one whose stamp holds another kind of digest
  (an older layoutc's plain sha256). A folder holding a conversion with another spec, other
  parameters or another name mapping (recorded by content: an edited ``--names`` file is another
  mapping) is refused, not mixed into.
* Verifies a sample: for the first layer of every shard, ``convert(inverse(out)) == out`` bit for bit
  (for a tensor-parallel slice, which has no inverse: the eager reference lowering agrees).
* Files named by the checkpoint's index stay inside ``--in`` (plain file names only) and outputs
  inside ``--out``; the input folder is never written to; a lock keeps two runs from writing one
  ``--out`` at once.
* A run that finds no MoE layer with its name mapping fails instead of copying everything.
* Under ``torchrun``, the n ranks split the shards, balanced by bytes (gloo on CPU, NCCL on GPUs).
* Tensor-parallel slices: given one spec per slice and one folder each, every input shard is read
  once and converted for every slice.
* Pipelined (``prefetch`` > 0, the default): reader threads load the next shards onto the device
  while a shared pool of ``hash_threads`` hashes them (the stamp's digest is of the bytes
  converted), the calling thread converts, writer threads copy the results back, write and fsync
  them (the fsyncs of several shards run at once), and one finisher thread renames, fsyncs the
  folder and stamps the shards in order. Memory: about ``prefetch + writers + 2`` shards (inputs and outputs)
  on the device, a few 16 MiB pinned chunks per thread on the host. On the CPU a shard is read
  through a copy-on-write memory map (no copy); a shard whose file changed (size, mtime, ctime or
  inode) between its read and its rename is refused, never stamped. The output bytes are the
  sequential loop's (``prefetch=0``), which stays as the reference.

This module holds the entry points (:func:`convert_checkpoint`, :func:`finish`) and the split of
shards between ranks; the parts live beside it: :mod:`.namemap` (the name mapping),
:mod:`.inputscan` (the index and headers checked before anything is written), :mod:`.runfolder`
(the output folder's run identity, locks and bookkeeping) and :mod:`.shardpipeline` (each shard
read, converted, verified, written and stamped).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from . import shardio
from .. import trust
from .._version import __version__
from ..api import CompiledSpec
from ..runtime.checks import LayoutError
from .inputscan import INDEX, _check_layers, _groups, _scan
from .namemap import load_names
from .runfolder import (DONE, _clean_up, _read_json, _release_locks, _Target, _write_atomically, claim_folder,
                        run_identity)
from .shardpipeline import _Run
from ..front.text import display

MANIFEST = trust.MANIFEST  # also read by layoutc.guard.trust_checkpoint
#: pipeline defaults: shards read ahead of the one being converted, shards written at once
PREFETCH = 2
WRITERS = 2


class Progress(Protocol):
    """What :func:`convert_checkpoint` reports progress to (:class:`layoutc.front.progress.ShardProgress`)."""

    def start(self, shards: int, total_bytes: int) -> None: ...

    def update(self, shard: str, nbytes: int, tensors: int) -> None: ...


def metadata(spec: CompiledSpec) -> dict[str, str]:
    from ..lang.versions import installed_version

    return {
        "layoutc_spec": spec.name,
        "layoutc_sha256": spec.sha256,
        "layoutc_params": json.dumps(spec.params, sort_keys=True),
        "layoutc_requires": "; ".join(str(r) for r in spec.program.requires),
        "layoutc_libraries": json.dumps({r.library: installed_version(r.library) for r in spec.program.requires}),
        "layoutc_version": __version__,
    }


def assign_shards(sizes: Mapping[str, int], world: int) -> list[list[str]]:
    """Shards per rank, balanced by bytes: largest first, each to the rank with the fewest bytes so
    far (ties: the lower rank); each rank's list in name order. Every rank computes the same split."""
    loads = [0] * world
    out: list[list[str]] = [[] for _ in range(world)]
    for shard in sorted(sizes, key=lambda s: (-sizes[s], s)):
        r = min(range(world), key=lambda i: (loads[i], i))
        out[r].append(shard)
        loads[r] += sizes[shard]
    return [sorted(x) for x in out]


def convert_checkpoint(
    spec: CompiledSpec | Sequence[CompiledSpec], in_dir: str | Path, out_dir: str | Path | Sequence[str | Path],
    names: str | Path = "vllm", device: str = "cpu", rank: int = 0, world: int = 1,
    progress: Progress | None = None, lowering: str = "auto", verify: bool = True,
    prefetch: int = PREFETCH, writers: int = WRITERS, profile: shardio.Profile | None = None,
    io_options: Mapping[str, Any] | None = None, hash_threads: int | None = None,
    warn: Callable[[str], None] | None = None, digests: Mapping[str, tuple] | None = None,
) -> dict[str, Any]:
    """Convert the shards this rank owns; returns a summary. See the module docstring.

    ``spec`` and ``out_dir`` may be lists of the same length (every tensor-parallel slice of one
    spec, each into its own folder): each input shard is then read once and converted for each.
    ``prefetch``: shards read ahead of the one being converted (0: the plain sequential loop, one
    shard at a time in one thread); ``writers``: shards written at once. ``profile`` collects the
    seconds each stage took; ``io_options`` go to :class:`layoutc.convert.shardio.ShardIO` (chunk size,
    ``staged=True`` to run the CUDA code path's chunk ring on the CPU in tests); ``hash_threads``:
    threads hashing the input for the stamps (default :data:`layoutc.convert.shardio.HASH_THREADS`).
    ``progress`` (a :class:`Progress`) hears of this rank's shards and bytes, then of each shard as it
    is done (converted or found done); ``warn(message)`` gets what the user should know but does
    not stop the run (default: :func:`warnings.warn`). ``digests``: input digests found before the run
    (:meth:`layoutc.convert.shardio.EarlyDigests.stop`), used by the pipelined reads for files that are
    still the ones hashed."""
    specs = [spec] if isinstance(spec, CompiledSpec) else list(spec)
    outs = [out_dir] if isinstance(out_dir, (str, Path)) else list(out_dir)
    if not specs or len(specs) != len(outs):
        raise ValueError("give one output folder per spec")
    in_dir = Path(in_dir).resolve()
    outs = [Path(o).resolve() for o in outs]
    if not in_dir.is_dir():
        raise LayoutError(f"{in_dir} is not a folder")
    for o in outs:
        if o == in_dir:
            raise LayoutError(f"--out {o} is the input folder; layoutc convert never overwrites its input")
    if len(set(outs)) != len(outs):
        raise LayoutError("two slices would be written into one folder")
    if prefetch < 0 or writers < 1:
        raise LayoutError(f"--prefetch must be >= 0 and --writers >= 1 (got {prefetch}, {writers})")
    if hash_threads is not None and hash_threads < 1:
        raise LayoutError(f"--hash-threads must be >= 1 (got {hash_threads})")
    rules, names_id = load_names(specs[0], names)
    scan = _scan(in_dir)  # every header checked before anything is written
    weight_map = scan.weight_map
    groups = _groups(weight_map, rules, specs[0])  # fails before anything is written when no layer matches
    for s in specs:
        _check_layers(s, groups, rules, scan)  # every layer's shapes against the contract, from the headers
    if scan.unindexed:
        (warn or _warn)(unindexed_message(scan.unindexed))
    summary = {"converted_layers": 0, "skipped_shards": 0, "written_shards": 0, "verified_layers": 0}
    targets: list[_Target] = []
    locks = []
    try:
        for s, o in zip(specs, outs):
            # What a failed run may remove: only what it made. Other ranks share the folder (only a
            # lone run cleans up); a folder that already holds a run's record is a resume, kept as it
            # is. A target joins the cleanup list only once its lock is ours: a refused run removes nothing.
            created = not o.exists()
            o.mkdir(parents=True, exist_ok=True)
            identity = run_identity(s, names, names_id)
            lock, fresh = claim_folder(o, identity, rank, world)
            locks.append(lock)
            targets.append(_Target(s, o, identity, metadata(s), o / DONE, created, fresh))
    except BaseException:
        for lock in locks:
            lock.close()
        _clean_up(targets, summary)
        raise
    prof = profile if profile is not None else shardio.Profile()
    try:
        with contextlib.ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            run = _Run(in_dir, targets, rules, weight_map, groups, device, lowering, verify, summary, prof,
                       dict(io_options or {}), hash_threads, digests)
            sizes = {s: (in_dir / s).stat().st_size for s in sorted(set(weight_map.values()))}
            mine = assign_shards(sizes, world)[rank]
            t0 = time.perf_counter()
            if progress is not None:
                progress.start(len(mine), sum(sizes[s] for s in mine))
            if prefetch == 0:
                run.sequential(mine, progress)
            else:
                run.pipelined(mine, progress, prefetch, writers)
            prof.add("wall", time.perf_counter() - t0)
            for t in targets:
                _release_locks(t.out_dir, rank, world)
    except BaseException:
        _clean_up(targets, summary)
        raise
    summary["unindexed"] = list(scan.unindexed)
    summary["names"] = names_id
    return summary


def unindexed_message(names: Sequence[str]) -> str:
    shown = ", ".join(display(n) for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (f"{len(names)} tensor(s) in the shards are not in {INDEX}: {shown}; copied (loaders read every "
            f"tensor of a shard) and listed in the written index")


def _warn(message: str) -> None:
    import warnings

    warnings.warn(message, stacklevel=3)


def finish(spec: CompiledSpec, in_dir: str | Path, out_dir: str | Path, names: str | Path,
           names_id: str | None = None) -> None:
    """Index and manifest, once every shard is written (rank 0 after the others). ``names_id``: the
    name mapping's identity the run used (``summary["names"]``); read again from ``names`` when not given."""
    in_dir, out_dir = Path(in_dir).resolve(), Path(out_dir).resolve()
    scan = _scan(in_dir)
    weight_map = scan.weight_map
    identity = run_identity(spec, names, names_id)
    missing = [s for s in sorted(set(weight_map.values()))
               if not (out_dir / s).is_file()
               or (_read_json(out_dir / DONE / f"{s}.json") or {}).get("run") != identity]
    if missing:
        raise LayoutError(f"shards not converted yet: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    if scan.index is not None:
        index = dict(scan.index)
        index["metadata"] = dict(index.get("metadata") or {}) | metadata(spec)
        # every tensor the output shards hold, those the input's index left out too
        index["weight_map"] = dict(index["weight_map"]) | {n: weight_map[n] for n in scan.unindexed}
        _write_atomically(out_dir / INDEX, json.dumps(index, indent=2))
    manifest = metadata(spec) | {"names": str(names), "names_id": identity["names"],
                                 "shards": sorted(set(weight_map.values())), "source": str(in_dir)}
    manifest[trust.TENSORS] = {}  # every converted tensor's fingerprint (layoutc.guard.trust_checkpoint)
    for s in manifest["shards"]:
        manifest[trust.TENSORS].update((_read_json(out_dir / DONE / f"{s}.json") or {}).get(trust.TENSORS, {}))
    _write_atomically(out_dir / MANIFEST, json.dumps(manifest, indent=2))
