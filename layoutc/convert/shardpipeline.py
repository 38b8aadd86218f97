"""The shard pipeline of ``layoutc convert``: read, convert, verify, write and stamp each shard.

:class:`_Run` converts the shards this rank owns into every target folder, either with the plain
sequential loop (``prefetch=0``, the reference) or pipelined: reader threads load the next shards,
the calling thread converts, writer threads write and fsync, and a finisher thread renames, fsyncs
the folder and stamps the shards in order. A shard whose stamp matches its input's digest is
skipped. Both paths write the same bytes. The checks before the run (:mod:`.inputscan`) and the
folder's identity and locks (:mod:`.runfolder`) live apart.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import queue
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

import attrs
import torch

from . import shardfile, shardio
from .. import trust
from ..api import CompiledSpec
from ..algebra import expr as ex
from ..algebra.dtypes import bit_view
from ..runtime.checks import LayoutError
from .namemap import NameRule
from .runfolder import _fsync_dir, _read_json, _Target, _write_atomically
from ..front.text import display


class _Reader:
    """Open shards on demand, one handle each."""

    def __init__(self, in_dir: Path, weight_map: Mapping[str, str]):
        from safetensors import safe_open

        self._open = safe_open
        self.in_dir = in_dir
        self.weight_map = weight_map
        self.handles: dict[str, Any] = {}

    def get(self, name: str) -> torch.Tensor:
        shard = self.weight_map[name]
        try:
            if shard not in self.handles:
                self.handles[shard] = self._open(str(self.in_dir / shard), "pt")
            return self.handles[shard].get_tensor(name)
        except Exception as err:  # safetensors raises its own error types; the message is what matters
            raise LayoutError(f"{self.in_dir / shard}: cannot read {name} ({err})") from None

    def names_in(self, shard: str) -> list[str]:
        return [n for n, s in self.weight_map.items() if s == shard]


def experts_apart(spec: CompiledSpec, present: tuple[str, ...], outputs: tuple[str, ...]) -> bool:
    """Whether every output's composed map reads output expert e from input expert e alone, alike for
    every e (the leading axis is the same dim in and out, and no other coordinate, validity or fill
    depends on it): then the layer converted from experts [0, E-1] of the inputs is those experts of
    the whole layer's output, and a sample of experts checks the conversion as the whole layer would."""
    leading = {t.shape[0] if t.shape else None for t in spec.program.inputs if t.name in present}
    try:
        for n in outputs:
            m = spec.composed_map(n, present)
            if not (m.out_shape and m.in_shape and m.src[0] == ex.Var("o0") and m.in_shape[0] == m.out_shape[0]
                    and not any("o0" in ex.free_vars(e) for e in (*m.src[1:], m.valid, m.fill))):
                return False
            leading.add(m.out_shape[0])
    except Exception:  # noqa: BLE001 -- a chain without one composed map: check the whole layer
        return False
    return len(leading) == 1 and None not in leading  # one expert axis leads every tensor, in and out


def _sample_experts(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The first and the last expert of every tensor (its leading axis)."""
    out = {}
    for k, v in tensors.items():
        out[k] = v if v is None or v.shape[0] <= 2 else torch.cat([v[:1], v[-1:]])
    return out


def _verify_sample(spec: CompiledSpec, inputs: Mapping[str, torch.Tensor], out: Mapping[str, torch.Tensor],
                   layer: str, apart: bool = False) -> None:
    """``convert(inverse(out)) == out`` bit for bit; for a spec without an inverse (a tensor-parallel
    slice drops the other ranks' rows), the eager reference lowering must give the same bytes.
    ``apart`` (:func:`experts_apart`): the check runs on the first and the last expert, not the whole
    layer (the eager reference is tens of times slower than the conversion on the CPU: checking every
    expert of a 128-expert layer per shard cost more than the conversion itself)."""
    if apart:
        inputs, out = _sample_experts(inputs), _sample_experts(out)
    if spec.invertible:
        back = spec.inverse(out, dims=spec.dims_of(inputs))  # padded layouts cannot tell I from round_up(I, 128)
        again, how = spec.convert(back, lowering="eager"), "convert(inverse(out))"
    else:
        again, how = spec.convert(inputs, lowering="eager"), "the eager reference conversion"
    for k, v in out.items():
        if not torch.equal(bit_view(again[k]), bit_view(v)):
            raise LayoutError(f"verification failed for layer {layer!r}: {k} differs from {how}")


def _identity(path: Path) -> tuple | None:
    try:
        return shardio.file_identity(path)
    except OSError:  # removed or unreadable since: not the file that was read
        return None


@attrs.define
class _Job:
    """One input shard, read: its tensors (on the device; None when safetensors reads it), its
    digest (:data:`layoutc.convert.shardio.DIGEST`), and the targets that still need it (empty: every
    stamp matched)."""

    shard: str
    source: Path
    size: int
    digest: str
    tensors: dict[str, torch.Tensor] | None
    todo: list[_Target]
    identity: tuple | None = None  # shardio.file_identity before it was read: unchanged when written


@attrs.define
class _Write:
    job: _Job
    target: _Target
    tmp: Path
    future: concurrent.futures.Future


class _Finisher(threading.Thread):
    """Finishes written shards in order: fsync, rename into place, then the stamp. In order, so a
    kill leaves the same kind of folder as the sequential loop (a prefix of shards stamped)."""

    def __init__(self, run: "_Run", depth: int):
        super().__init__(name="layoutc-finish", daemon=True)
        self.run_ = run
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.pending: list[_Write] = []  # queued or being finished (their .tmp files, for cleanup)
        self._lock = threading.Lock()

    def put(self, item: _Write) -> None:
        with self._lock:
            self.pending.append(item)
        while True:
            if self.error is not None or not self.is_alive():
                raise self.error or LayoutError("internal error: the shard writer stopped")
            try:
                self.queue.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    def run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if self.error is not None:
                continue  # drain: never finish a shard after an earlier one failed
            try:
                self.run_.finish_shard(item)
                with self._lock:
                    self.pending.remove(item)
            except BaseException as err:  # noqa: BLE001 -- handed to the main thread
                self.error = err

    def close(self) -> None:
        while self.is_alive():
            try:
                self.queue.put(None, timeout=0.05)
                break
            except queue.Full:
                continue
        self.join()


class _Run:
    """One rank's conversion: the shards it owns, for every target."""

    def __init__(self, in_dir, targets, rules, weight_map, groups, device, lowering, verify, summary, prof,
                 io_options, hash_threads=None, digests=None):
        self.io_options = io_options
        self.hash_threads = hash_threads
        self.digests = digests  # found before the run (shardio.EarlyDigests), for the pipelined reads
        self.in_dir, self.targets, self.rules = in_dir, targets, rules
        self.weight_map, self.groups = weight_map, groups
        self.device, self.lowering, self.verify = device, lowering, verify
        self.summary, self.prof = summary, prof
        self.member = {tensor: (layer, n) for layer, g in groups.items() for n, tensor in g.items()}
        self.reader = _Reader(in_dir, weight_map)
        self.counts: dict[str, int] = {}
        for shard in weight_map.values():
            self.counts[shard] = self.counts.get(shard, 0) + 1
        self.cuda = torch.device(device).type == "cuda"
        self._events: list[tuple[str, Any, Any]] = []
        self.apart: dict[tuple, bool] = {}  # (spec, inputs present, outputs) -> experts_apart
        self.fingerprints: dict[tuple[Path, str], list] = {}  # (folder, shard) -> manifest entries pending
        for t in targets:
            if t.done_dir.is_symlink():  # the stamps would be written (and cleaned up) in another folder
                raise LayoutError(f"{display(str(t.done_dir))} is a symbolic link; layoutc keeps its stamps "
                                  f"inside --out (remove it)")
            t.done_dir.mkdir(exist_ok=True)

    # -- shared by both loops -----------------------------------------------------------------

    def stamped(self, target: _Target, shard: str, source: Path, size: int) -> bool:
        """The stamp matches, apart from the input's digest (the caller compares that)."""
        stamp = _read_json(target.done_dir / f"{shard}.json")
        out = target.out_dir / shard
        return (isinstance(stamp, dict) and out.is_file() and stamp.get("run") == target.identity
                and isinstance(stamp.get(trust.TENSORS), dict)  # a stamp without fingerprints: redone
                and stamp.get("input_size") == size and stamp.get("output_size") == out.stat().st_size)

    def stamp_digest(self, target: _Target, shard: str) -> Any:
        """The input digest the stamp holds; None for a stamp without one (an older layoutc wrote
        "input_sha256", a plain sha256): never equal to a digest, so that shard is redone."""
        stamp = _read_json(target.done_dir / f"{shard}.json")
        return stamp.get("input_digest") if isinstance(stamp, dict) else None

    def layers_of(self, shard: str) -> tuple[list[str], list[str]]:
        """The MoE layers with a tensor in ``shard`` (in index order) and its other tensors."""
        layers, copied = [], []
        for name in self.reader.names_in(shard):
            if name in self.member:
                layer = self.member[name][0]
                if layer not in layers:
                    layers.append(layer)
            else:
                copied.append(name)
        return layers, copied

    def convert_layer(self, target: _Target, shard: str, layer: str, inputs: Mapping[str, torch.Tensor],
                      first: bool) -> dict[str, torch.Tensor]:
        spec = target.spec
        try:
            out = self._timed("convert", lambda: spec.convert(inputs, lowering=self.lowering))
        except LayoutError as err:
            raise LayoutError(f"layer {layer!r} (shard {shard}): {err}") from None
        if self.verify and first:
            present = tuple(n for n in spec.input_names if inputs.get(n) is not None)
            key = (id(spec), present, tuple(sorted(out)))
            if key not in self.apart:
                self.apart[key] = experts_apart(spec, present, key[2])
            self._timed("verify", lambda: _verify_sample(spec, inputs, out, layer, self.apart[key]))
            self.summary["verified_layers"] += 1
        # The fingerprints of this shard's outputs, for the manifest (queued on the device; read at the stamp)
        mine = {n: name for n, name in self.groups[layer].items() if self.weight_map[name] == shard}
        self.fingerprints.setdefault((target.out_dir, shard), []).extend(trust.layer_entries(layer, out, mine))
        self.summary["converted_layers"] += 1
        return out

    def _timed(self, stage: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn``, adding its host time to ``stage`` and, on CUDA, its device time (events,
        read once everything is done) to ``stage + '_gpu'``."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        with self.prof.span(stage):
            result = fn()
        if self.cuda:
            end.record()
            self._events.append((stage + "_gpu", start, end))
        return result

    def _device_times(self) -> None:
        if self.cuda and self._events:
            torch.cuda.synchronize(self.device)
            for stage, start, end in self._events:
                self.prof.add(stage, start.elapsed_time(end) / 1e3)
            self._events.clear()

    def load_input(self, name: str, tensor: torch.Tensor | None, rule: NameRule) -> torch.Tensor:
        """A layer input as the sequential loop makes it: read, merged, cast on the host, on the device."""
        t = self.reader.get(name) if tensor is None else tensor
        if rule.merge_last:
            t = t.reshape(*t.shape[:-2], t.shape[-2] * t.shape[-1])
        if rule.dtype:
            t = t.cpu().to(getattr(torch, rule.dtype))  # on the host, as safetensors' tensors are cast
        return t.to(self.device)

    # -- the sequential loop (prefetch=0): one shard at a time, in this thread ------------------

    def sequential(self, mine: list[str], progress) -> None:
        device_ctx = torch.cuda.device(self.device) if self.cuda else contextlib.nullcontext()
        # the pool outlives the thread that feeds it (exits run in reverse)
        with device_ctx, shardio.hash_pool(self.hash_threads) as pool, \
                concurrent.futures.ThreadPoolExecutor(1) as hasher:
            for shard in mine:
                source = self.in_dir / shard
                size = source.stat().st_size
                todo = list(self.targets)
                if all(self.stamped(t, shard, source, size) for t in todo):
                    with self.prof.span("hash_resume", size):
                        digest = shardio.file_digest(source, pool)
                    todo = [t for t in todo if self.stamp_digest(t, shard) != digest]
                    if not todo:
                        self.summary["skipped_shards"] += 1
                        self.shard_done(progress, shard, size)
                        continue
                for t in todo:
                    with contextlib.suppress(FileNotFoundError):
                        (t.done_dir / f"{shard}.json").unlink()  # redone from here: never trust an old stamp
                digest = hasher.submit(shardio.file_digest, source, pool)  # read beside the conversion
                self.prof.add("read_bytes", 0.0, size)
                layers, copied = self.layers_of(shard)
                base = {name: self.reader.get(name) for name in copied}
                for t in todo:
                    tensors = dict(base)
                    for i, layer in enumerate(layers):
                        group = self.groups[layer]
                        inputs = {n: self.load_input(name, None, self.rules[n]) for n, name in group.items()}
                        out = self.convert_layer(t, shard, layer, inputs, i == 0)
                        for n, tensor_name in group.items():
                            if self.weight_map[tensor_name] == shard:
                                tensors[tensor_name] = out[n].cpu().contiguous()
                        del inputs, out
                    tmp = t.out_dir / f".{shard}.tmp"
                    try:
                        with self.prof.span("write"):
                            shardfile.write(tmp, tensors, t.meta)
                        os.chmod(tmp, 0o644)
                        os.replace(tmp, t.out_dir / shard)  # atomic: a shard is either absent or complete
                    finally:
                        with contextlib.suppress(FileNotFoundError):
                            tmp.unlink()
                    _fsync_dir(t.out_dir)  # the rename is durable before the stamp says so
                    self.stamp(t, shard, digest.result(), size)
                self.shard_done(progress, shard, size)
        self._device_times()

    def shard_done(self, progress, shard: str, size: int) -> None:
        if progress is not None:
            progress.update(shard, size, self.counts.get(shard, 0))

    def stamp(self, target: _Target, shard: str, digest: str, size: int) -> None:
        with self.prof.span("marker"):
            _write_atomically(target.done_dir / f"{shard}.json", json.dumps({
                "run": target.identity, "input_digest": digest, "input_size": size,
                "output_size": (target.out_dir / shard).stat().st_size,
                trust.TENSORS: trust.manifest_entries(self.fingerprints.pop((target.out_dir, shard), [])),
            }, sort_keys=True))
        self.summary["written_shards"] += 1

    # -- the pipeline --------------------------------------------------------------------------

    def load(self, io: shardio.ShardIO, shard: str) -> _Job:
        """(Reader thread.) Read ``shard`` onto the device unless every stamp matches."""
        source = self.in_dir / shard
        try:
            size = source.stat().st_size
            todo = list(self.targets)
            if all(self.stamped(t, shard, source, size) for t in todo):
                with self.prof.span("hash_resume", size):
                    digest = io.digest(source)
                todo = [t for t in todo if self.stamp_digest(t, shard) != digest]
                if not todo:
                    return _Job(shard, source, size, digest, None, [])
            identity = shardio.file_identity(source)
            try:
                tensors, digest, size = io.read(source)
            except shardio.Fallback:
                digest, tensors = io.digest(source), None  # its "hash" seconds are added up inside
                self.prof.add("read_bytes", 0.0, size)
            return _Job(shard, source, size, digest, tensors, todo, identity)
        except OSError as err:  # the file's failures name the shard; anything else (CUDA out of memory,
            # a bug) keeps its own type and traceback rather than passing for an unreadable file
            raise LayoutError(f"{source}: cannot read ({err})") from None

    def pipelined(self, mine: list[str], progress, prefetch: int, writers: int) -> None:
        io = shardio.ShardIO(self.device, self.prof, hash_threads=self.hash_threads, known=self.digests,
                             **self.io_options)
        readers = concurrent.futures.ThreadPoolExecutor(prefetch, thread_name_prefix="layoutc-read")
        write_pool = concurrent.futures.ThreadPoolExecutor(writers, thread_name_prefix="layoutc-write")
        finisher = _Finisher(self, depth=writers)
        finisher.start()
        reads: dict[int, concurrent.futures.Future] = {}
        for i in range(min(prefetch, len(mine))):
            reads[i] = readers.submit(self.load, io, mine[i])
        failed = True
        device_ctx = torch.cuda.device(self.device) if self.cuda else contextlib.nullcontext()
        try:
            with device_ctx:
                for i, shard in enumerate(mine):
                    with self.prof.span("wait_read"):
                        job = reads.pop(i).result()
                    if i + prefetch < len(mine):
                        reads[i + prefetch] = readers.submit(self.load, io, mine[i + prefetch])
                    if not job.todo:
                        self.summary["skipped_shards"] += 1
                        self.shard_done(progress, shard, job.size)
                        continue
                    self.convert_job(job, io, write_pool, finisher)
                    self.shard_done(progress, shard, job.size)
                    del job
            failed = False
        finally:
            for f in reads.values():
                f.cancel()
            readers.shutdown(wait=True, cancel_futures=True)
            finisher.close()
            write_pool.shutdown(wait=True)
            for item in finisher.pending:  # written but never finished (an error stopped the run)
                with contextlib.suppress(FileNotFoundError):
                    item.tmp.unlink()
            io.close()
            with contextlib.suppress(Exception):
                self._device_times()
        if finisher.error is not None and not failed:
            raise finisher.error

    def convert_job(self, job: _Job, io: shardio.ShardIO, write_pool, finisher: _Finisher) -> None:
        shard = job.shard
        for t in job.todo:
            with contextlib.suppress(FileNotFoundError):
                (t.done_dir / f"{shard}.json").unlink()  # redone from here: never trust an old stamp
        layers, copied = self.layers_of(shard)
        have = job.tensors
        if have is not None and self.cuda:
            # The reader thread allocated these on its own stream; this thread's kernels read them on
            # ours. Without this, freeing them (``del job``) hands the memory back to the reader's
            # stream at once, and the next read's copies could overwrite it while our kernels still run.
            stream = torch.cuda.current_stream(self.device)
            for t in have.values():
                if t.is_cuda:
                    t.record_stream(stream)
        if have is not None:
            absent = [n for n in self.reader.names_in(shard) if n not in have]
            if absent:
                raise LayoutError(f"{job.source}: cannot read {absent[0]} "
                                  f"(the index names it, the file does not hold it)")
        base = {name: (have[name] if have is not None else self.reader.get(name)) for name in copied}
        for t in job.todo:
            tensors = dict(base)
            for i, layer in enumerate(layers):
                group = self.groups[layer]
                inputs = {}
                for n, name in group.items():
                    local = have.get(name) if have is not None and self.weight_map[name] == shard else None
                    inputs[n] = self.load_input(name, local, self.rules[n])
                out = self.convert_layer(t, shard, layer, inputs, i == 0)
                for n, tensor_name in group.items():
                    if self.weight_map[tensor_name] == shard:
                        tensors[tensor_name] = out[n].contiguous()
                del inputs, out
            ready = None
            if self.cuda:
                ready = torch.cuda.Event()
                ready.record()
            tmp = t.out_dir / f".{shard}.tmp"
            future = write_pool.submit(self.write_tmp, io, tmp, tensors, t.meta, ready)
            with self.prof.span("wait_write"):
                finisher.put(_Write(job, t, tmp, future))

    def write_tmp(self, io: shardio.ShardIO, tmp: Path, tensors, meta, ready) -> int:
        """(Writer thread.) The shard's bytes into its temporary file, fsynced: here rather than in
        the finisher, so the fsyncs of shards written at once overlap (one ordered finisher did them
        one after the other); the rename and the stamp stay in order, after this."""
        try:
            n = io.write(tmp, tensors, meta, ready)
            with self.prof.span("fsync"):
                shardio.fsync_file(tmp)
            return n
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise

    def finish_shard(self, item: _Write) -> None:
        """(Finisher thread.) Put a written, fsynced shard in place, make that durable, stamp it."""
        item.future.result()  # written and fsynced by its writer thread
        t, shard = item.target, item.job.shard
        try:
            if item.job.identity is not None and _identity(item.job.source) != item.job.identity:
                # read through a memory map (hashed and converted from the file's pages, not a copy):
                # a shard written meanwhile could hold bytes the stamp's digest does not describe
                raise LayoutError(f"{item.job.source}: the file changed while it was converted; run again")
            os.chmod(item.tmp, 0o644)
            os.replace(item.tmp, t.out_dir / shard)  # atomic: a shard is either absent or complete
        finally:
            with contextlib.suppress(FileNotFoundError):
                item.tmp.unlink()
        with self.prof.span("fsync_dir"):
            _fsync_dir(t.out_dir)  # the rename is durable before the stamp says so
        self.stamp(t, shard, item.job.digest, item.job.size)
        self.prof.add("written_bytes", 0.0, (t.out_dir / shard).stat().st_size)
