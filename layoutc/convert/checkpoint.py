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
  on the device, a few 16 MiB pinned chunks per thread on the host. The output bytes are the
  sequential loop's (``prefetch=0``), which stays as the reference.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import queue
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import attrs
import torch

from . import shardfile, shardio
from .. import trust
from .._version import __version__
from ..api import CompiledSpec
from ..algebra.dtypes import bit_view
from ..runtime.checks import LayoutError
from .shardheader import TensorInfo, load_json, read_header, utf8_name
from ..front.text import display

INDEX = "model.safetensors.index.json"
MANIFEST = trust.MANIFEST  # also read by layoutc.guard.trust_checkpoint
DONE = ".layoutc-done"
RUN = ".layoutc-run.json"  # which spec, parameters and names this folder holds a conversion of
LOCK = ".layoutc-lock"
#: dtypes a name mapping may convert a tensor to on load (bf16 biases to float32, ...).
#: pipeline defaults: shards read ahead of the one being converted, shards written at once
PREFETCH = 2
WRITERS = 2
LOAD_DTYPES = ("float32", "float16", "bfloat16", "uint8", "int8", "int32")


class Progress(Protocol):
    """What :func:`convert_checkpoint` reports progress to (:class:`layoutc.front.progress.ShardProgress`)."""

    def start(self, shards: int, total_bytes: int) -> None: ...

    def update(self, shard: str, nbytes: int, tensors: int) -> None: ...


@attrs.frozen
class NameRule:
    template: str  # e.g. "{layer}.w13_weight"
    merge_last: bool = False  # merge the last two axes (gpt-oss stores MXFP4 as [.., K/32, 16] blocks)
    dtype: str | None = None  # convert values to this torch dtype on load (e.g. bf16 biases -> float32)
    rows: str | None = None  # the row order the checkpoint stores ("interleaved" for gpt-oss gate/up)

    def __attrs_post_init__(self):
        if not isinstance(self.template, str):
            raise TypeError(f"name must be a string, got {self.template!r}")
        if not isinstance(self.merge_last, bool):
            raise TypeError(f"merge_last must be true or false, got {self.merge_last!r}")
        if self.dtype is not None and self.dtype not in LOAD_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(LOAD_DTYPES)} (or null), got {self.dtype!r}")
        if self.rows not in (None, "interleaved", "stacked"):
            raise ValueError(f"rows must be 'interleaved', 'stacked' or null, got {self.rows!r}")

    def regex(self) -> re.Pattern:
        head, _, tail = self.template.partition("{layer}")
        return re.compile("^" + re.escape(head) + "(?P<layer>.+?)" + re.escape(tail) + "$")

    def name(self, layer: str) -> str:
        return self.template.replace("{layer}", layer)


GPT_OSS = {  # gpt-oss stores gate and up rows interleaved: [g0, u0, g1, u1, ...]
    "w13_weight": NameRule("{layer}.gate_up_proj_blocks", merge_last=True, rows="interleaved"),
    "w13_weight_scale": NameRule("{layer}.gate_up_proj_scales", rows="interleaved"),
    "w13_bias": NameRule("{layer}.gate_up_proj_bias", dtype="float32", rows="interleaved"),
    "w2_weight": NameRule("{layer}.down_proj_blocks", merge_last=True),
    "w2_weight_scale": NameRule("{layer}.down_proj_scales"),
    "w2_bias": NameRule("{layer}.down_proj_bias", dtype="float32"),
}


def name_rules(spec: CompiledSpec, names: str | Path) -> dict[str, NameRule]:
    """The name mapping for ``spec``: a preset ("vllm", "gpt-oss") or a JSON file."""
    return load_names(spec, names)[0]


def load_names(spec: CompiledSpec, names: str | Path) -> tuple[dict[str, NameRule], str]:
    """The name mapping for ``spec`` and its identity for the run record: the preset's name, or the
    sha256 of the JSON file's bytes (the same bytes the rules come from), so that editing the file
    between two runs is a different mapping, never a resume that mixes two."""
    if names == "vllm":
        return {n: NameRule(f"{{layer}}.{n}") for n in spec.input_names}, "vllm"
    if names == "gpt-oss":
        missing = [n for n in spec.input_names if n not in GPT_OSS]
        if missing:
            raise LayoutError(f"the gpt-oss preset has no checkpoint name for {', '.join(missing)}")
        rules, identity = {n: GPT_OSS[n] for n in spec.input_names}, "gpt-oss"
    else:
        raw = _names_bytes(Path(names))
        rules, identity = _rules_from_json(spec, Path(names), raw), _names_digest(raw)
    for n, rule in rules.items():
        t = spec.program.input(n)
        declared = t.rows or (spec.program.input(t.tie.weight).rows if t.tie else None)  # scales/biases: their weight's
        if rule.rows is not None and (declared is None or declared.kind != rule.rows):
            # The silent bug this guards against: an interleaved checkpoint read as [w1; w3].
            raise LayoutError(
                f"the checkpoint stores {n} rows {rule.rows} ({rule.template}), but {spec.name} declares its "
                f"input rows {declared or 'without an order'}; use a spec written for this checkpoint "
                f"(e.g. one that deinterleaves gate and up rows)"
            )
    return rules, identity


#: the largest --names file read (a name mapping is a few hundred bytes)
MAX_NAMES_BYTES = 1 << 20


def _names_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise LayoutError(f"--names must be 'vllm', 'gpt-oss' or a JSON file; {display(str(path))} is none of them")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_NAMES_BYTES + 1)
    except OSError as err:
        raise LayoutError(f"{display(str(path))}: cannot read ({err.strerror or err})") from None
    if len(raw) > MAX_NAMES_BYTES:
        raise LayoutError(f"{display(str(path))}: a name mapping larger than {MAX_NAMES_BYTES} bytes; "
                          f"not a --names file")
    return raw


def _names_digest(raw: bytes) -> str:
    return "json sha256:" + hashlib.sha256(raw).hexdigest()


def _rules_from_json(spec: CompiledSpec, path: Path, raw: bytes) -> dict[str, NameRule]:
    where = display(str(path))
    raw = load_json(raw, where, "a valid name mapping: not valid JSON")
    if not isinstance(raw, dict):
        raise LayoutError(f"{where}: expected an object mapping spec inputs to checkpoint names")
    rules = {}
    for n in spec.input_names:
        entry = raw.get(n)
        if entry is None:
            raise LayoutError(f"{where}: no name for spec input {n!r}")
        try:
            if isinstance(entry, str):
                rules[n] = NameRule(entry)
            elif isinstance(entry, dict):
                fields = dict(entry)
                rules[n] = NameRule(fields.pop("name"), **fields)
            else:
                raise TypeError(f"expected a string or an object, got {type(entry).__name__}")
        except (TypeError, KeyError, ValueError) as err:
            raise LayoutError(f"{where}: entry for {n!r}: {display(str(err))[:200]}; fields are name, merge_last, "
                              f"dtype, rows") from None
        if "{layer}" not in rules[n].template:
            raise LayoutError(f"{where}: the name for {n!r} must contain {{layer}}, e.g. \"{{layer}}.{n}\"")
        if not utf8_name(rules[n].template):
            raise LayoutError(f"{where}: the name for {n!r} is not valid UTF-8 (a lone surrogate)")
    unknown = sorted(set(raw) - set(spec.input_names))
    if unknown:
        raise LayoutError(f"{where}: {display(', '.join(unknown))} are not inputs of {spec.name} "
                          f"({', '.join(spec.input_names)})")
    return rules


def _plain_file_name(name: Any, where: str) -> str:
    """A shard file name from a checkpoint index: a plain name in the checkpoint's folder. A path
    (``../victim.safetensors``, ``/etc/x``) would read outside ``--in`` and write outside ``--out``;
    a hidden name (``.layoutc-run.json``, ``.x.safetensors.tmp``) or the index or manifest would have
    a converted shard renamed over layoutc's own bookkeeping in ``--out``."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
            or "\0" in name or any(not c.isprintable() for c in name)):
        raise LayoutError(f"{where}: {name!r} is not a plain file name in the checkpoint's folder; "
                          f"an index may only name files beside it")
    if name.startswith(".") or not name.endswith(".safetensors"):  # the index and manifest end in .json
        raise LayoutError(f"{where}: {name!r} is not a shard name; an index may only name *.safetensors "
                          f"files whose names do not start with '.'")
    return name


@attrs.frozen
class _Scan:
    """What the input folder holds, read from its index and every shard's header before anything
    is converted: tensor -> shard for every tensor of every shard (the index's entries and those it
    leaves out), the tensors the index leaves out, and the index itself (None: no index)."""

    weight_map: dict[str, str]
    unindexed: tuple[str, ...]
    index: dict[str, Any] | None
    infos: dict[str, TensorInfo]  # every tensor's dtype and shape, from its header


def _shard_map(in_dir: Path) -> dict[str, str]:
    """Tensor name -> shard file name (checked: plain names inside ``in_dir``)."""
    return _scan(in_dir).weight_map


def _scan(in_dir: Path) -> _Scan:
    """Read and check the index and every shard's header (see :class:`_Scan`). Every malformed input
    is a LayoutError naming the file (and the tensor) here, before any shard is converted."""
    index_path = in_dir / INDEX
    index = None
    if index_path.is_file():
        where = display(str(index_path))
        try:
            text = index_path.read_bytes()
        except OSError as err:
            raise LayoutError(f"{where}: cannot read ({err.strerror or err})") from None
        index = load_json(text, where, "a valid index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise LayoutError(f"{where}: expected an object with a non-empty \"weight_map\" of tensor name -> file")
        if not isinstance(index.get("metadata", {}), dict):
            raise LayoutError(f"{where}: \"metadata\" must be an object (got {type(index['metadata']).__name__}); "
                              f"the converted index adds layoutc's provenance to it")
        listed = {}
        for tensor, file in weight_map.items():
            if not utf8_name(tensor):
                raise LayoutError(f"{where}: the tensor name {display(repr(tensor))} is not valid UTF-8 "
                                  f"(a lone surrogate)")
            listed[tensor] = _plain_file_name(file, f"{where}: the entry for {display(repr(tensor))}")
            if not (in_dir / file).is_file():
                raise LayoutError(f"{where}: names {display(repr(file))} for {display(repr(tensor))}, which is not a "
                                  f"file in {display(str(in_dir))}")
        files = sorted(set(listed.values()))
    else:
        listed = None
        files = sorted(p.name for p in in_dir.glob("*.safetensors") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise LayoutError(f"{display(str(in_dir))}: no *.safetensors file and no {INDEX}")
    held: dict[str, str] = {}
    infos: dict[str, TensorInfo] = {}
    for f in files:
        for info in read_header(in_dir / f).tensors:
            name = info.name
            if name in held:
                raise LayoutError(f"{display(str(in_dir))}: the tensor {display(repr(name))} is in two shards, "
                                  f"{held[name]} and {f}; a loader would keep either")
            if info.dtype not in shardio.TORCH_DTYPES:  # valid safetensors, but not one torch reads as such
                raise LayoutError(f"{display(str(in_dir / f))}: tensor {display(repr(name))} has dtype {info.dtype}, "
                                  f"which layoutc convert cannot copy (it handles "
                                  f"{', '.join(sorted(shardio.TORCH_DTYPES))})")
            held[name] = f
            infos[name] = info
    if listed is None:
        return _Scan(held, (), None, infos)
    for tensor, file in listed.items():
        if held.get(tensor) != file:
            there = f" (it is in {held[tensor]})" if tensor in held else ""
            raise LayoutError(f"{display(str(index_path))}: names {file} for {display(repr(tensor))}, which that "
                              f"file does not hold{there}")
    # vLLM and transformers load every tensor of a shard: one the index leaves out is still part of
    # the model, so it is copied (and listed in the written index), never dropped
    unindexed = tuple(n for n in held if n not in listed)
    return _Scan(dict(listed) | {n: held[n] for n in unindexed}, unindexed, index, infos)


def _groups(weight_map: Mapping[str, str], rules: Mapping[str, NameRule], spec: CompiledSpec) -> dict[str, dict[str, str]]:
    """Layer -> {spec input: checkpoint name}, for layers that have every required input."""
    regexes = {n: r.regex() for n, r in rules.items()}
    groups: dict[str, dict[str, str]] = {}
    for tensor in weight_map:
        matched = [(n, m.group("layer")) for n, rx in regexes.items() if (m := rx.match(tensor))]
        if len(matched) > 1:
            # two conversions would write this one output tensor: whichever ran last would win
            raise LayoutError(f"the name mapping maps spec inputs {' and '.join(n for n, _ in matched)} to one "
                              f"checkpoint tensor, {display(repr(tensor))}; give each input its own name (--names)")
        for n, layer in matched:
            groups.setdefault(layer, {})[n] = tensor
    required = [t.name for t in spec.program.inputs if not t.optional]
    if not groups:
        first = rules[required[0]].template if required else "?"
        seen = ", ".join(sorted(weight_map)[:3])
        raise LayoutError(f"no MoE layer matches the name mapping (e.g. {first!r} for {required[0] if required else '?'}); "
                          f"the checkpoint holds names like {seen}; check --names (vllm, gpt-oss or a JSON file)")
    incomplete = {layer: sorted(set(required) - set(g)) for layer, g in groups.items() if not set(required) <= set(g)}
    if incomplete:
        layer, missing = next(iter(incomplete.items()))
        raise LayoutError(f"layer {layer!r} has some MoE tensors but not {', '.join(missing)} "
                          f"({len(incomplete)} incomplete layer(s)); check --names")
    return groups


def _check_layers(spec: CompiledSpec, groups: Mapping[str, Mapping[str, str]], rules: Mapping[str, NameRule],
                  scan: _Scan) -> None:
    """Every MoE layer's dtypes and shapes (from the headers, as the name mapping loads them) against
    the spec's contract and divisibility checks, on meta tensors: a layer that would fail halfway
    through the run fails here, before any shard is converted."""
    module = spec.module
    for layer, group in groups.items():
        tensors = {}
        for n, name in group.items():
            info, rule = scan.infos[name], rules[n]
            shape = info.shape
            if rule.merge_last:
                if len(shape) < 2:
                    raise LayoutError(f"layer {display(repr(layer))} (shard {scan.weight_map[name]}): {n} is "
                                      f"{display(name)} with shape {list(shape)}; merge_last needs two axes to merge")
                shape = (*shape[:-2], shape[-2] * shape[-1])
            dtype = getattr(torch, rule.dtype) if rule.dtype else shardio.TORCH_DTYPES[info.dtype]
            tensors[n] = torch.empty(shape, dtype=dtype, device="meta")
        try:
            module._check_call(tensors, None, "convert", module.INPUTS, module._INPUT_SHAPES, module._INPUT_AXES,
                               module.DIMS, module._CONDITIONS, module._CONVERT_CHECKS)
        except module.LayoutError as err:
            shards = sorted({scan.weight_map[name] for name in group.values()})
            raise LayoutError(f"layer {display(repr(layer))} (shard {', '.join(shards)}): {err}") from None


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


def _verify_sample(spec: CompiledSpec, inputs: Mapping[str, torch.Tensor], out: Mapping[str, torch.Tensor],
                   layer: str) -> None:
    """``convert(inverse(out)) == out`` bit for bit; for a spec without an inverse (a tensor-parallel
    slice drops the other ranks' rows), the eager reference lowering must give the same bytes."""
    if spec.invertible:
        back = spec.inverse(out, dims=spec.dims_of(inputs))  # padded layouts cannot tell I from round_up(I, 128)
        again, how = spec.convert(back, lowering="eager"), "convert(inverse(out))"
    else:
        again, how = spec.convert(inputs, lowering="eager"), "the eager reference conversion"
    for k, v in out.items():
        if not torch.equal(bit_view(again[k]), bit_view(v)):
            raise LayoutError(f"verification failed for layer {layer!r}: {k} differs from {how}")


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
    warn: Callable[[str], None] | None = None,
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
    not stop the run (default: :func:`warnings.warn`)."""
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
                       dict(io_options or {}), hash_threads)
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
                 io_options, hash_threads=None):
        self.io_options = io_options
        self.hash_threads = hash_threads
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
            self._timed("verify", lambda: _verify_sample(spec, inputs, out, layer))
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
            try:
                tensors, digest, size = io.read(source)
            except shardio.Fallback:
                digest, tensors = io.digest(source), None  # its "hash" seconds are added up inside
                self.prof.add("read_bytes", 0.0, size)
            return _Job(shard, source, size, digest, tensors, todo)
        except OSError as err:  # the file's failures name the shard; anything else (CUDA out of memory,
            # a bug) keeps its own type and traceback rather than passing for an unreadable file
            raise LayoutError(f"{source}: cannot read ({err})") from None

    def pipelined(self, mine: list[str], progress, prefetch: int, writers: int) -> None:
        io = shardio.ShardIO(self.device, self.prof, hash_threads=self.hash_threads, **self.io_options)
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
                raise LayoutError(f"{job.source}: cannot read {absent[0]} (the index names it, the file does not hold it)")
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
            os.chmod(item.tmp, 0o644)
            os.replace(item.tmp, t.out_dir / shard)  # atomic: a shard is either absent or complete
        finally:
            with contextlib.suppress(FileNotFoundError):
                item.tmp.unlink()
        with self.prof.span("fsync_dir"):
            _fsync_dir(t.out_dir)  # the rename is durable before the stamp says so
        self.stamp(t, shard, item.job.digest, item.job.size)
        self.prof.add("written_bytes", 0.0, (t.out_dir / shard).stat().st_size)


def finish(spec: CompiledSpec, in_dir: str | Path, out_dir: str | Path, names: str | Path,
           names_id: str | None = None) -> None:
    """Index and manifest, once every shard is written (rank 0 after the others). ``names_id``: the
    name mapping's identity the run used (``summary["names"]``); read again from ``names`` when not given."""
    in_dir, out_dir = Path(in_dir).resolve(), Path(out_dir).resolve()
    scan = _scan(in_dir)
    weight_map = scan.weight_map
    identity = run_identity(spec, names, names_id)
    missing = [s for s in sorted(set(weight_map.values()))
               if not (out_dir / s).is_file() or (_read_json(out_dir / DONE / f"{s}.json") or {}).get("run") != identity]
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
