"""Shard I/O for the pipelined ``layoutc convert``: read a safetensors shard straight onto the
conversion device while hashing it, and write a shard from device tensors.

Reading streams the file once, in order, in chunks: each chunk is hashed for the resume stamp
(:class:`TreeHash`: the file cut into 16 MiB leaves, each leaf's sha256 computed in a shared pool of
hashing threads as its bytes arrive, so reading and hashing overlap and one file is hashed on
several cores) and copied into the tensors it overlaps. On CUDA the chunks go through a small
ring of pinned host buffers per thread and are copied to the GPU asynchronously on the thread's
own stream, so host memory stays a few chunks per thread however large the shard, and every tensor
gets its own allocation with the dtype and shape of the header. On the CPU the tensors are views of
a copy-on-write memory map of the file (no copy, no write reaches the file; a tensor at an offset
that is not a multiple of its element size is copied out), hashed from the same map.

Writing produces exactly :func:`layoutc.convert.shardfile.write`'s bytes (its header, tensors sorted by
name): on CUDA through a ring of pinned buffers, the device-to-host copy of the next chunks
overlapping the ``write`` of the current one. On the CPU through direct I/O (``O_DIRECT``, where the
system and the file system take it): the bytes are copied into a page-aligned bounce buffer per writer
thread, reused for every chunk, and written in whole aligned chunks that bypass the page cache (the last
one padded to the alignment, the file then cut to its size). A buffered write costs a copy into newly
allocated page-cache pages: on the CPU machine 2.8 s of CPU a GB when those pages come from the free pool
(a virtual machine whose free memory goes back to its host), the largest CPU cost of a CPU conversion;
the direct write costs the bounce copy (~0.1 s a GB), and the shard is not left in the page cache,
where it would push out the input shards still to be read (``LAYOUTC_DIRECT_IO=0``: buffered writes;
a file system without direct I/O, tmpfs for one, gets them too). The caller fsyncs and renames.

A file this reader does not understand (an unknown dtype, offsets that do not tile the data) is
left to ``safetensors`` (:class:`Fallback`), whose own messages then name the problem.

:class:`Profile` (layoutc.convert.stageprofile) adds up the seconds each stage spends for ``--profile``; the digest
of the resume stamps is layoutc.convert.sharddigest's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import json
import math
import mmap
import os
import struct
import threading
from pathlib import Path
from typing import Any, Mapping

import torch

from . import shardfile
from ..runtime.checks import LayoutError
# the stamp's digest and the stage profile live apart; their names are shardio's too (one import for callers)
from .sharddigest import (DIGEST, HASH_THREADS, TREE_LEAF, EarlyDigests, TreeHash, _Known,  # noqa: F401
                          file_digest, file_identity, hash_pool, tree_root)
from .stageprofile import NULL_PROFILE, Profile  # noqa: F401

#: safetensors dtype name -> torch dtype (the ones layoutc writes)
TORCH_DTYPES = {code: dtype for dtype, code in shardfile.DTYPES.items()}
CHUNK = 16 << 20  # bytes per read/write chunk
SLOTS = 4  # pinned chunks per writer thread (CUDA)
# pinned chunks per reader thread (CUDA): a slot is refilled only once its bytes are hashed, so the
# ring bounds how many leaves of one file are hashed at once (about READ_SLOTS - 1)
READ_SLOTS = 8
MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header
#: alignment of direct writes (buffer address, length and file offset): a page, a multiple of the logical
#: block size of the disks this runs on (512 or 4096 bytes)
DIRECT_ALIGN = 4096


class Fallback(Exception):
    """This file is left to safetensors (its header uses something this reader does not handle)."""




def _read_exact(f, view: memoryview, path: Path) -> None:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise LayoutError(f"{path}: cannot read (the file ended early: it changed while being read?)")
        got += n


def parse_header(raw: bytes, size: int, path: Path) -> tuple[list[tuple[str, torch.dtype, tuple[int, ...], int, int]], int]:
    """Entries ``(name, dtype, shape, start, end)`` sorted by start (offsets from the data start),
    and the data size. Raises :class:`Fallback` for what safetensors should judge."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise Fallback("header") from None
    if not isinstance(header, dict):
        raise Fallback("header")
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise Fallback(name)  # safetensors refuses it, with its message
            continue
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: it could never be written back
            raise Fallback(name) from None
        if not isinstance(info, dict) or info.get("dtype") not in TORCH_DTYPES:
            raise Fallback(name)
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if (not isinstance(shape, list) or not all(type(s) is int and 0 <= s < 1 << 63 for s in shape)
                or not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)):
            raise Fallback(name)
        dtype = TORCH_DTYPES[info["dtype"]]
        start, end = offsets
        if end - start != math.prod(shape) * dtype.itemsize:
            raise Fallback(name)
        entries.append((name, dtype, tuple(shape), start, end))
    entries.sort(key=lambda e: (e[3], e[4]))
    pos = 0
    for e in entries:  # the data must be tiled exactly, as safetensors requires
        if e[3] != pos:
            raise Fallback(e[0])
        pos = e[4]
    if pos != size:
        raise Fallback("size")
    return entries, size


class _Ring:
    """Host chunks with the event of the copy that last used each (one ring per thread): pinned,
    copied on the thread's own CUDA stream; or, staged on the CPU (tests), plain and synchronous."""

    def __init__(self, device: torch.device, chunk: int, slots: int):
        self.device = device
        self.chunk = chunk
        cuda = device.type == "cuda"
        # CUDA's current device is per thread (0 in a new one): pin and make the stream on ours
        with torch.cuda.device(device) if cuda else contextlib.nullcontext():
            self.buffers = [torch.empty(chunk, dtype=torch.uint8, pin_memory=cuda) for _ in range(slots)]
            self.stream = torch.cuda.Stream(device) if cuda else None
        self.views = [shardfile._raw(b) for b in self.buffers]
        self.events: list[Any] = [None] * slots
        self.next = 0

    @contextlib.contextmanager
    def context(self):
        """This thread on our device and stream."""
        if self.stream is None:
            yield
            return
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            yield

    def record(self) -> Any:
        if self.stream is None:
            return None
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return ev

    def wait(self, slot: int) -> None:
        if self.events[slot] is not None:
            self.events[slot].synchronize()

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()


class ShardIO:
    """Reads and writes shards for one device; safe to use from several threads at once.
    ``staged``: go through the chunk ring (always on CUDA; on the CPU only to test it). ``slots``:
    chunks per ring (default :data:`READ_SLOTS` for readers, :data:`SLOTS` for writers);
    ``hash_threads``: the hashing pool shared by every reader (default :data:`HASH_THREADS`)."""

    def __init__(self, device: str | torch.device, profile: Profile | None = None, chunk: int = CHUNK,
                 slots: int | None = None, staged: bool | None = None, hash_threads: int | None = None,
                 known: Mapping[str, tuple[tuple[int, ...], str]] | None = None):
        self.known = dict(known or {})  # resolved path -> (identity, digest): EarlyDigests.stop()'s
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.staged = self.cuda if staged is None else (staged or self.cuda)
        self.profile = profile or NULL_PROFILE
        self.chunk = chunk
        self.read_slots = slots or READ_SLOTS
        self.write_slots = slots or SLOTS
        self._local = threading.local()
        # one pool for every reader thread: whichever file has leaves waiting gets the cores
        self.hash_pool = hash_pool(hash_threads)

    def digest(self, path: Path) -> str:
        """:data:`DIGEST` of ``path`` without reading it onto the device (resume, fallback)."""
        known = self._known(path)
        return known.digest if known is not None else file_digest(path, self.hash_pool, self.profile)

    def _known(self, path: Path) -> _Known | None:
        # the digest found early, if the file is still the one hashed then
        entry = self.known.get(str(Path(path).resolve()))
        if entry is None or file_identity(path) != entry[0]:
            return None
        self.profile.add("hash_early", 0.0, entry[0][2])
        return _Known(entry[1])

    def close(self) -> None:
        """Stop the hashing threads (after the last read)."""
        self.hash_pool.shutdown(wait=True)

    def _ring(self, slots: int) -> _Ring:
        """This thread's ring (a thread only reads or only writes, so one ring each)."""
        ring = getattr(self._local, "ring", None)
        if ring is None:
            with self.profile.span("pin_alloc"):
                ring = self._local.ring = _Ring(self.device, self.chunk, slots)
        return ring

    # -- reading ------------------------------------------------------------------------------

    def read(self, path: Path) -> tuple[dict[str, torch.Tensor], str, int]:
        """``path``'s tensors on the device, the file's :data:`DIGEST` and its size. Raises
        :class:`Fallback` before reading the data when safetensors should read this file. On the CPU
        (not staged) the tensors are views of a private, copy-on-write memory map of the file
        (:meth:`_read_mapped`): no copy, and no write of theirs can reach the file."""
        prof = self.profile
        digest = self._known(path) or TreeHash(self.hash_pool, prof)
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            head = bytearray(8)
            if size < 8:
                raise Fallback("size")
            _read_exact(f, memoryview(head), path)
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise Fallback("header")
            raw = bytearray(n)
            _read_exact(f, memoryview(raw), path)
            entries, data = parse_header(bytes(raw), size - 8 - n, path)
            digest.update(head)  # neither buffer is reused: no need to wait for these
            digest.update(raw)
            if self.staged:
                tensors = self._read_staged(f, entries, data, digest, path)
                if f.read(1):
                    raise LayoutError(f"{path}: cannot read (the file grew while being read)")
            else:
                tensors = self._read_mapped(f, entries, 8 + n, size, digest)
        prof.add("read_bytes", 0.0, size)
        return tensors, digest.hexdigest(), size

    def _read_mapped(self, f, entries, start: int, size: int, digest: TreeHash) -> dict[str, torch.Tensor]:
        """The tensors as views of a copy-on-write map of the file (``mmap.ACCESS_COPY``: pages are the
        page cache's until written, and a write goes to a private copy, never to the file), hashed
        from the same map by the pool. Reading a shard into fresh memory cost a copy and a page
        fault per 4 KiB, more CPU than the conversion's own reads on a 2-core machine. A tensor whose
        offset is not a multiple of its element size is copied out (torch expects aligned elements).
        The map lives as long as a tensor viewing it. The file may change under a map: the caller
        compares :func:`file_identity` before and after (:meth:`layoutc.convert.shardpipeline._Run.finish_shard`)."""
        prof = self.profile
        with prof.span("map"):
            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
            with contextlib.suppress(AttributeError, OSError):  # the pool reads it in order, once
                mm.madvise(mmap.MADV_SEQUENTIAL)
            if len(mm) != size:  # shrunk since the fstat
                raise LayoutError(f"{f.name}: cannot read (the file changed while being read)")
        view = memoryview(mm)
        tensors = {}
        try:
            with prof.span("hash_wait"):
                digest.update(view[start:size])
                digest.wait()
            for name, dtype, shape, a, b in entries:
                if a == b:
                    tensors[name] = torch.empty(shape, dtype=dtype)
                    continue
                flat = torch.frombuffer(mm, dtype=torch.uint8, count=b - a, offset=start + a)
                if (start + a) % dtype.itemsize:
                    with prof.span("read", b - a):
                        flat = flat.clone()
                tensors[name] = flat.view(dtype).view(shape)
        finally:
            view.release()  # the tensors hold the map itself (torch.frombuffer keeps a reference)
        return tensors

    def _read_staged(self, f, entries, data: int, digest, path: Path) -> dict[str, torch.Tensor]:
        ring = self._ring(self.read_slots)
        hashed: list[list[concurrent.futures.Future]] = [[] for _ in ring.buffers]
        try:
            return self._stream_staged(f, entries, data, digest, path, ring, hashed)
        finally:
            for futs in hashed:  # never leave a hash running over a slot the next read refills
                for fut in futs:
                    fut.exception()

    def _stream_staged(self, f, entries, data, digest, path, ring, hashed) -> dict[str, torch.Tensor]:
        prof = self.profile
        with ring.context():
            tensors = {name: torch.empty(shape, dtype=dtype, device=self.device)
                       for name, dtype, shape, _, _ in entries}
            flat = {name: tensors[name].reshape(-1).view(torch.uint8) for name, *_ in entries if tensors[name].numel()}
            k, pos = 0, 0  # first entry that may overlap the chunk, data offset of the chunk
            while pos < data:
                n = min(self.chunk, data - pos)
                slot = ring.next
                ring.next = (slot + 1) % len(ring.buffers)
                with prof.span("h2d_wait"):
                    ring.wait(slot)  # its last copy to the device is done
                if hashed[slot]:
                    with prof.span("hash_wait"):
                        for fut in hashed[slot]:
                            fut.result()  # and its bytes are hashed
                view = ring.views[slot][:n]
                with prof.span("read", n):
                    _read_exact(f, view, path)
                hashed[slot] = digest.update(view)
                buf = ring.buffers[slot]
                while k < len(entries) and entries[k][4] <= pos:
                    k += 1
                j = k
                while j < len(entries) and entries[j][3] < pos + n:  # every tensor the chunk overlaps
                    name, _, _, start, end = entries[j]
                    a, b = max(start, pos), min(end, pos + n)
                    if b > a:
                        flat[name][a - start:b - start].copy_(buf[a - pos:b - pos], non_blocking=True)
                    j += 1
                ring.events[slot] = ring.record()
                prof.add("h2d_bytes", 0.0, n)
                pos += n
            with prof.span("h2d_wait"):
                ring.synchronize()
            with prof.span("hash_wait"):
                digest.wait()
        return tensors

    # -- writing ------------------------------------------------------------------------------

    def write(self, path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str],
              ready: torch.cuda.Event | None = None) -> int:
        """Write ``tensors`` as :func:`shardfile.write` would (no fsync). ``ready``: an event after
        which the device tensors hold their values. Returns the file size."""
        prof = self.profile
        head = shardfile.header(tensors, metadata)
        total = len(head)
        with shardfile.create(path) as f:
            if not self.staged:
                parts = [tensors[name].detach().contiguous() for name in sorted(tensors)]
                parts = [t for t in parts if t.numel()]
                if _direct(f.fileno(), True):  # nothing is in f's buffer yet: every byte goes through fd
                    return self._write_direct(f.fileno(), head, parts)
            with prof.span("write", len(head)):
                f.write(head)
            if not self.staged:
                for t in parts:
                    raw = shardfile._raw(t)
                    with prof.span("write", len(raw)):
                        f.write(raw)
                    total += len(raw)
                prof.add("write_buffered", 0.0, total)
                return total
            ring = self._ring(self.write_slots)
            pending: list[tuple[int, int]] = []  # (slot, bytes) in file order

            def flush_one():
                slot, n = pending.pop(0)
                with prof.span("d2h_wait"):
                    ring.wait(slot)
                with prof.span("write", n):
                    f.write(ring.views[slot][:n])

            def flush_all():
                while pending:
                    flush_one()

            with ring.context():
                if ready is not None:
                    ring.stream.wait_event(ready)
                fill, slot = 0, None
                for name in sorted(tensors):
                    t = tensors[name]
                    if not t.numel():
                        continue
                    nbytes = t.numel() * t.element_size()
                    total += nbytes
                    if t.device != self.device:  # read through safetensors: from host memory, in order
                        if slot is not None and fill:
                            self._close_slot(ring, slot, fill, pending)
                            slot, fill = None, 0
                        flush_all()
                        with prof.span("write", nbytes):
                            f.write(shardfile._raw(t.detach().contiguous()))
                        continue
                    src = t.detach().reshape(-1).view(torch.uint8)
                    a = 0
                    while a < nbytes:
                        if slot is None:
                            if len(pending) == len(ring.buffers):
                                flush_one()
                            slot, fill = ring.next, 0
                            ring.next = (slot + 1) % len(ring.buffers)
                            # the slot's last copy was written out before (flush order = slot order)
                        n = min(nbytes - a, self.chunk - fill)
                        ring.buffers[slot][fill:fill + n].copy_(src[a:a + n], non_blocking=True)
                        fill += n
                        a += n
                        if fill == self.chunk:
                            self._close_slot(ring, slot, fill, pending)
                            slot, fill = None, 0
                if slot is not None and fill:
                    self._close_slot(ring, slot, fill, pending)
                flush_all()
        return total

    def _bounce(self) -> torch.Tensor:
        """This thread's page-aligned bounce buffer for direct writes (an anonymous map of one chunk,
        rounded up to the alignment: allocated once, so its pages stay resident)."""
        buf = getattr(self._local, "bounce", None)
        if buf is None:
            size = -(-self.chunk // DIRECT_ALIGN) * DIRECT_ALIGN
            buf = self._local.bounce = torch.frombuffer(mmap.mmap(-1, size), dtype=torch.uint8)
        return buf

    def _write_direct(self, fd: int, head: bytes, parts: list[torch.Tensor]) -> int:
        """The header and ``parts`` (contiguous CPU tensors) after it, from the start of ``fd`` (open with
        ``O_DIRECT``), through the bounce buffer in whole aligned chunks; the last chunk padded with zeros,
        then the file cut to its size. Returns the size. Where the file system refuses an aligned direct
        write (EINVAL: a stricter alignment), the rest is written buffered from the same offset."""
        prof = self.profile
        buf = self._bounce()
        size = buf.numel()
        fill = 0
        state = {"written": 0, "direct": True}

        def flush(n: int) -> None:
            padded = n + (-n % DIRECT_ALIGN) if state["direct"] else n
            buf[n:padded].zero_()
            view = shardfile._raw(buf[:padded])
            with prof.span("write", n):
                at = 0
                while at < padded:
                    try:
                        at += os.write(fd, view[at:])
                    except OSError as err:
                        if err.errno != errno.EINVAL or not state["direct"] or at:
                            raise
                        _direct(fd, False)  # this file system wants more than DIRECT_ALIGN: buffered from here
                        state["direct"] = False
                        padded = n
            prof.add("write_direct" if state["direct"] else "write_buffered", 0.0, n)
            state["written"] += n

        for src in [torch.frombuffer(bytearray(head), dtype=torch.uint8)] + parts:
            flat = src.reshape(-1).view(torch.uint8)
            a, n = 0, flat.numel()
            while a < n:
                k = min(n - a, size - fill)
                buf[fill:fill + k].copy_(flat[a:a + k])
                fill += k
                a += k
                if fill == size:
                    flush(size)
                    fill = 0
        if fill:
            flush(fill)
        os.ftruncate(fd, state["written"])  # the last chunk's padding off
        return state["written"]

    def _close_slot(self, ring: _Ring, slot: int, fill: int, pending: list) -> None:
        ring.events[slot] = ring.record()
        pending.append((slot, fill))
        self.profile.add("d2h_bytes", 0.0, fill)


def _direct(fd: int, on: bool) -> bool:
    """Turn direct I/O (``O_DIRECT``) on or off for an open file; False where it cannot be turned on: the
    system has no ``O_DIRECT``, ``LAYOUTC_DIRECT_IO=0``, or the file system refuses it (tmpfs, some network
    file systems): their writes stay buffered."""
    flag = getattr(os, "O_DIRECT", 0)
    if on and (not flag or os.environ.get("LAYOUTC_DIRECT_IO", "1").strip() == "0"):
        return False
    import fcntl  # POSIX only, as O_DIRECT (checked above)

    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags | flag) if on else (flags & ~flag))
    except OSError:
        return False
    return True


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_cache(path: str | Path) -> bool:
    """Ask the kernel to forget ``path``'s cached pages (after an fsync they are clean): the next
    read comes from the disk, or from whatever caches the disk below this machine. False where
    the call is not available."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except (OSError, AttributeError):
        return False
    finally:
        os.close(fd)
