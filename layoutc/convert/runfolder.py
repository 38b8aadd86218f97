"""The output folder of ``layoutc convert``: its run identity, its locks and its bookkeeping.

A folder records which conversion it holds (``.layoutc-run.json``: spec, sha256, parameters,
name mapping, layoutc version) and refuses another; ranks and runs take ``.layoutc-lock`` files so
two runs never write one folder at once; marker files are written atomically (temporary file,
fsync, rename, fsync of the folder). A failed first run removes the bookkeeping it made, and
nothing else. The shard pipeline and :func:`layoutc.convert.checkpoint.convert_checkpoint` use
these; they hold no conversion logic.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs

from . import shardfile, shardio
from .._version import __version__
from ..api import CompiledSpec
from ..runtime.checks import LayoutError
from .namemap import _names_bytes, _names_digest
from ..front.text import display

DONE = ".layoutc-done"
RUN = ".layoutc-run.json"  # which spec, parameters and names this folder holds a conversion of
LOCK = ".layoutc-lock"


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` so ``path`` is either absent, the old content or the whole new content, even if
    the process is killed or the disk fills: a temporary file, fsync, rename, fsync of the folder."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with shardfile.create(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable: a folder is opened read-only and fsynced like a file."""
    shardio.fsync_file(folder)


def _read_json(path: Path) -> Any:
    """A marker or run file, or None when it is absent or unreadable (a crash mid-write leaves none:
    they are written atomically; an empty or foreign file is treated as absent, never trusted)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def run_identity(spec: CompiledSpec, names: str | Path, names_id: str | None = None) -> dict[str, Any]:
    """What a conversion folder holds: resuming with anything else would mix two layouts. The name
    mapping is recorded by content (``names_id`` from :func:`load_names`; read here when not given)."""
    if names_id is None:
        names_id = names if names in ("vllm", "gpt-oss") else _names_digest(_names_bytes(Path(names)))
    return {"spec": spec.name, "sha256": spec.sha256, "params": spec.params, "names": names_id,
            "layoutc_version": __version__}


def _open_lock(path: Path, blocking: bool = True):
    """``path`` opened and flocked, as a file object. Never through a symlink (a link planted in --out
    would have the lock create or open a file elsewhere). The lock counts only while ``path`` still
    names the locked file: a successful run removes its lock files (under the lock), so a waiter that
    got the lock of a removed file opens the new one and locks again. Raises BlockingIOError when
    ``blocking`` is False and another process holds it."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as err:
            if os.path.islink(path):
                raise LayoutError(f"{display(str(path))} is a symbolic link; layoutc never writes through one "
                                  f"in --out (remove it)") from None
            raise
        f = os.fdopen(fd, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            st = os.fstat(fd)
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
        except BaseException:
            f.close()
            raise
        if now is not None and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            return f
        f.close()  # removed (or replaced) while we waited: lock the file the name holds now


@contextlib.contextmanager
def _folder_lock(out_dir: Path):
    """An exclusive lock on ``out_dir`` while the run's identity is checked or written (ranks of one
    torchrun take it in turn; a second, different run finds the identity of the first). The file
    exists only while someone holds it: removed before it is unlocked (waiters then lock a new one)."""
    with _open_lock(out_dir / LOCK) as f:
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(out_dir / LOCK)
            fcntl.flock(f, fcntl.LOCK_UN)


def _release_locks(out_dir: Path, rank: int, world: int) -> None:
    """After a successful run: remove this rank's lock file and the folder's (under the folder lock,
    still holding the rank's), so a finished conversion holds no ``.layoutc-lock`` files."""
    with _folder_lock(out_dir):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out_dir / f"{LOCK}-rank{rank}-of-{world}")


_RANK_LOCK = re.compile(re.escape(LOCK) + r"-rank(\d+)-of-(\d+)")


def _rank_lock_held(path: Path) -> bool:
    """Whether a run holds ``path`` (a rank's lock file) now: our own attempt to take it fails."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # never created: removed means free
    except OSError:
        return False  # gone meanwhile (or a link, which no run locks): nobody holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases our own lock
    return False


def claim_folder(out_dir: Path, identity: Mapping[str, Any], rank: int, world: int) -> tuple[Any, bool]:
    """Record (or check) what ``out_dir`` holds, and hold this rank's lock for the run. Returns the
    open lock file (closing it releases the lock) and whether the folder is this run's own (a lone
    run found no record of an earlier one: a failure may remove its bookkeeping).

    Everything is decided under the folder lock, and ``fresh`` only once this rank's lock is ours: a
    run refused because another is writing must never treat (and clean up) that run's files as its own."""
    with _folder_lock(out_dir):
        # Ranks of runs with different world sizes lock different files but would write the same
        # ``.{shard}.tmp``: while any rank of another world size holds its lock, refuse.
        for p in out_dir.glob(f"{LOCK}-rank*-of-*"):
            m = _RANK_LOCK.fullmatch(p.name)
            if m and int(m.group(2)) != world and _rank_lock_held(p):
                raise LayoutError(f"another layoutc convert (rank {m.group(1)} of {m.group(2)}) is writing into "
                                  f"{out_dir}; this run has {world} rank(s); wait for it or use another --out folder")
        held = _read_json(out_dir / RUN)
        older = held is None and (out_dir / DONE).is_dir()  # an older layoutc wrote stamps but no run file
        if held is None and not older and any(out_dir.glob("*.safetensors")):
            raise LayoutError(f"--out {out_dir} already holds safetensors files that no layoutc conversion wrote; "
                              f"use an empty folder")
        if held is not None and held != dict(identity):
            changed = ", ".join(k for k in identity if held.get(k) != identity[k]) or "the run"
            raise LayoutError(
                f"--out {out_dir} holds a conversion with another {changed} ({held.get('spec')}, parameters "
                f"{held.get('params')}, names {held.get('names')}); resuming into it would mix two layouts. "
                f"Use a new --out folder, or delete this one to start over")
        try:
            lock = _open_lock(out_dir / f"{LOCK}-rank{rank}-of-{world}", blocking=False)
        except BlockingIOError:
            raise LayoutError(f"another layoutc convert (rank {rank} of {world}) is writing into {out_dir}; "
                              f"wait for it or use another --out folder") from None
        try:
            fresh = world == 1 and held is None and not older
            if held is None:
                # An older layoutc's folder: its stamps name no layoutc_version, never this identity,
                # so every shard is converted again (the docstring's promise), not refused.
                _write_atomically(out_dir / RUN, json.dumps(dict(identity), sort_keys=True))
        except BaseException:
            lock.close()
            raise
    return lock, fresh


@attrs.define
class _Target:
    """One output folder: a spec (for tensor parallelism, one rank's slice) and where it goes."""

    spec: CompiledSpec
    out_dir: Path
    identity: dict[str, Any]
    meta: dict[str, str]
    done_dir: Path
    created: bool = False  # this run made the folder
    fresh: bool = False  # a lone run found no record of an earlier one in it: its bookkeeping is its own


def _clean_up(targets: Sequence[_Target], summary: Mapping[str, int]) -> None:
    """After a failed first run: no folder of bookkeeping behind, nor bookkeeping in the user's folder."""
    if summary["written_shards"] == 0:
        for t in targets:
            if t.fresh:
                _remove_bookkeeping(t.out_dir, remove_folder=t.created)


def _remove_bookkeeping(out_dir: Path, remove_folder: bool) -> None:
    """Remove the files layoutc writes beside the shards (never a file of the user's), and the folder
    when it was created by this run and is empty then."""
    done = out_dir / DONE
    for p in done.glob("*.json") if done.is_dir() and not done.is_symlink() else ():
        with contextlib.suppress(OSError):
            p.unlink()
    for p in [done, *out_dir.glob(f"{LOCK}*"), out_dir / RUN, *out_dir.glob(".*.safetensors.tmp")]:
        with contextlib.suppress(OSError):
            p.rmdir() if p.is_dir() else p.unlink()
    if remove_folder:
        with contextlib.suppress(OSError):
            out_dir.rmdir()  # fails, and keeps the folder, if anything else is in it
