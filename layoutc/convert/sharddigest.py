"""The resume stamp's digest of an input shard (``sha256-tree-16MiB``), hashed on a pool of threads, and the
shards hashed early while ``layoutc convert`` compiles (:class:`EarlyDigests`).

A shard's digest is the sha256 of every 16 MiB leaf, hashed in parallel as the bytes arrive
(:class:`TreeHash`), then the sha256 of a tag, the leaf size, the file size and those leaf digests
(:func:`tree_root`). :func:`file_identity` says when a file was written, replaced or resized: a digest found
before a read is used only for a file whose identity is still the one hashed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import os
import struct
import threading
from pathlib import Path

from .stageprofile import NULL_PROFILE, Profile


#: leaf size of the tree digest. Fixed (not the read chunk, which is a tuning knob): the stamp must
#: come out the same whatever chunk, thread count or code path (pipelined, sequential, resume) made it.
TREE_LEAF = 16 << 20
#: the digest's name, written into every stamp with it ("sha256-tree-16MiB:<hex>"): it is not the
#: plain sha256 of the file, and a stamp made with another leaf size or an older layoutc (which held
#: the plain sha256) never compares equal, so that shard is converted again.
DIGEST = "sha256-tree-16MiB"
_ROOT_TAG = b"layoutc sha256-tree\0"
#: hashing threads per conversion, unless told: hashlib releases the GIL on large buffers, each
#: thread does ~1.3 GB/s; past 8 the readers, writers and the conversion want the cores
HASH_THREADS = max(1, min(8, os.cpu_count() or 1))


def tree_root(leaves: list[bytes], size: int) -> str:
    """The digest from the leaves' sha256 digests (in file order): sha256 over a tag, the leaf size,
    the file size and the leaf digests. Collision resistance is sha256's: two files with one root
    have one size and, leaf by leaf, one sha256."""
    if len(leaves) != -(-size // TREE_LEAF):
        raise ValueError(f"{len(leaves)} leaves for {size} bytes of {TREE_LEAF}-byte leaves")
    root = hashlib.sha256(_ROOT_TAG + struct.pack("<QQ", TREE_LEAF, size))
    for d in leaves:
        root.update(d)
    return f"{DIGEST}:{root.hexdigest()}"


class _Leaf:
    """One leaf's sha256, fed its pieces in order by at most one pool thread at a time."""

    __slots__ = ("busy", "last", "queue", "sha")

    def __init__(self):
        self.sha = hashlib.sha256()
        self.queue: collections.deque = collections.deque()
        self.busy = False
        self.last: concurrent.futures.Future | None = None


class TreeHash:
    """A file's :data:`DIGEST`, fed its bytes in order in pieces of any size (:meth:`update`).
    Pieces of one leaf are hashed in order, leaves in parallel on ``pool``. A piece must stay
    unchanged until its futures are done."""

    def __init__(self, pool: concurrent.futures.Executor, profile: Profile | None = None):
        self.pool = pool
        self.profile = profile or NULL_PROFILE
        self.size = 0
        self.leaves: list[_Leaf] = []
        self._lock = threading.Lock()

    def update(self, data) -> list[concurrent.futures.Future]:
        """Queue ``data`` (bytes-like); the futures are done when it is hashed."""
        view = memoryview(data).cast("B")
        futures = []
        while len(view):
            k, off = divmod(self.size, TREE_LEAF)
            if k == len(self.leaves):
                self.leaves.append(_Leaf())
            part = view[:TREE_LEAF - off]
            futures.append(self._feed(self.leaves[k], part))
            view = view[len(part):]
            self.size += len(part)
        return futures

    def _feed(self, leaf: _Leaf, part: memoryview) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            leaf.queue.append((part, fut))
            leaf.last = fut
            if leaf.busy:  # the thread draining this leaf takes it next, in order
                return fut
            leaf.busy = True
        self.pool.submit(self._drain, leaf)
        return fut

    def _drain(self, leaf: _Leaf) -> None:
        while True:
            with self._lock:
                if not leaf.queue:
                    leaf.busy = False
                    return
                part, fut = leaf.queue.popleft()
            try:
                with self.profile.span("hash", len(part)):
                    leaf.sha.update(part)
            except BaseException as err:  # noqa: BLE001 -- handed to whoever waits on the piece
                fut.set_exception(err)
            else:
                fut.set_result(None)

    def wait(self) -> None:
        """Every piece queued so far hashed (raises what hashing raised)."""
        for leaf in self.leaves:
            if leaf.last is not None:
                leaf.last.result()  # a leaf's pieces finish in order: its last one is its end

    def hexdigest(self) -> str:
        self.wait()
        return tree_root([leaf.sha.digest() for leaf in self.leaves], self.size)


def file_digest(path: str | Path, pool: concurrent.futures.Executor, profile: Profile | None = None,
                stop: threading.Event | None = None) -> str | None:
    """:data:`DIGEST` of a file, read in leaf-sized buffers, up to two per pool thread in flight (each
    buffer reused once the pool has hashed it: its pages stay resident). None where ``stop`` was set
    before the end."""
    th = TreeHash(pool, profile)
    window = 2 * max(1, getattr(pool, "_max_workers", 1))
    inflight: collections.deque = collections.deque()  # (buffer, its futures)
    spare: list[bytearray] = []
    with open(path, "rb", buffering=0) as f:
        while True:
            if stop is not None and stop.is_set():
                th.wait()
                return None
            if len(inflight) >= window:
                buf, futures = inflight.popleft()
                for fut in futures:
                    fut.result()
                spare.append(buf)
            buf = spare.pop() if spare else bytearray(TREE_LEAF)
            n = f.readinto(buf)
            if not n:
                break
            # the pool reads this buffer while the next one is filled
            inflight.append((buf, th.update(memoryview(buf)[:n])))
    return th.hexdigest()


class _Known:
    """A digest found before the read (:class:`EarlyDigests`), in :class:`TreeHash`'s place: nothing to hash."""

    def __init__(self, digest: str):
        self.digest = digest

    def update(self, data) -> list[concurrent.futures.Future]:
        return []

    def wait(self) -> None:
        pass

    def hexdigest(self) -> str:
        return self.digest


class EarlyDigests:
    """Input shards hashed in the background while ``layoutc convert`` compiles its spec (a few seconds of one
    core, the other core reading and hashing): the pipeline then reads those shards from the page cache and
    takes their digests from :meth:`stop`'s result instead of hashing them again. Shards in the order given
    (the order one rank converts them), one after the other, until :meth:`stop`; only regular files that are
    not symbolic links. A digest is kept with the file's :func:`file_identity` before and after hashing (equal,
    or it is dropped): the pipeline uses it only for a file whose identity is still that one when read, and
    checks the identity again after converting (as for every shard read through its map). A file that cannot
    be read is left to the pipeline, which reports it."""

    def __init__(self, paths: list[Path], threads: int = 1):
        self._stop = threading.Event()
        self._found: dict[str, tuple[tuple[int, ...], str]] = {}
        self._pool = hash_pool(threads)
        self._thread = threading.Thread(target=self._run, args=(list(paths),), name="layoutc-early-hash", daemon=True)
        self._thread.start()

    def _run(self, paths: list[Path]) -> None:
        for path in paths:
            if self._stop.is_set():
                return
            try:
                if path.is_symlink() or not path.is_file():
                    continue
                before = file_identity(path)
                digest = file_digest(path, self._pool, stop=self._stop)
                if digest is not None and file_identity(path) == before:
                    self._found[str(path.resolve())] = (before, digest)
            except OSError:
                continue

    def stop(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Stop hashing (the shard under way is dropped) and return the digests found: resolved path ->
        (identity, digest)."""
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)
        return dict(self._found)


def hash_pool(threads: int | None = None) -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max(1, threads or HASH_THREADS), thread_name_prefix="layoutc-hash")


def file_identity(path: str | Path) -> tuple[int, ...]:
    """What changes when a file is written, replaced or resized: device, inode, size, mtime and
    ctime (nanoseconds). Equal before and after a conversion read it: the bytes hashed for the
    stamp are the bytes converted (the pipeline reads a shard through a memory map, not a copy)."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
