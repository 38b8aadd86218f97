"""``layoutc convert``: pre-convert a safetensors checkpoint into a kernel layout.

* Reads a single ``*.safetensors`` file or a sharded checkpoint with
  ``model.safetensors.index.json``, lazily (one MoE layer in memory at a time).
* Finds each layer's MoE tensors through a **name mapping**: for every spec input a template
  with a ``{layer}`` placeholder. Presets: ``vllm`` (``{layer}.w13_weight``, ...) and ``gpt-oss``
  (``{layer}.gate_up_proj_blocks``, ... with the 16-byte blocks merged into rows); or a JSON file
  ``{"w13_weight": {"name": "{layer}.experts.w13", "merge_last": false, "dtype": null}, ...}``.
* Writes one output shard per input shard (same names, converted MoE tensors, everything else
  copied), an index, and metadata (spec name, sha256, parameters, library versions) in every
  shard's safetensors header and in ``layoutc_manifest.json``.
* Resumes: a finished shard is written atomically and marked done with a stamp (the input shard's
  sha256, the spec's sha256, parameters, name mapping); a rerun skips shards whose stamp matches
  and redoes the others. A folder holding a conversion with another spec, other parameters or
  another name mapping is refused, not mixed into.
* Verifies a sample: for the first layer of every shard, ``convert(inverse(out)) == out`` bit for bit
  (for a tensor-parallel slice, which has no inverse: the eager reference lowering agrees).
* Files named by the checkpoint's index stay inside ``--in`` (plain file names only) and outputs
  inside ``--out``; the input folder is never written to; a lock keeps two runs from writing one
  ``--out`` at once.
* A run that finds no MoE layer with its name mapping fails instead of copying everything.
* Under ``torchrun``, rank r of n converts shards ``r, r+n, ...`` (gloo on CPU, NCCL on GPUs).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import attrs
import torch

from . import __version__, shardfile
from .api import CompiledSpec
from .dtypes import bit_view
from .lower.runtime import LayoutError

INDEX = "model.safetensors.index.json"
MANIFEST = "layoutc_manifest.json"
DONE = ".layoutc-done"
RUN = ".layoutc-run.json"  # which spec, parameters and names this folder holds a conversion of
LOCK = ".layoutc-lock"
#: dtypes a name mapping may convert a tensor to on load (bf16 biases to float32, ...).
LOAD_DTYPES = ("float32", "float16", "bfloat16", "uint8", "int8", "int32")


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
    if names == "vllm":
        return {n: NameRule(f"{{layer}}.{n}") for n in spec.input_names}
    if names == "gpt-oss":
        missing = [n for n in spec.input_names if n not in GPT_OSS]
        if missing:
            raise LayoutError(f"the gpt-oss preset has no checkpoint name for {', '.join(missing)}")
        rules = {n: GPT_OSS[n] for n in spec.input_names}
    else:
        rules = _rules_from_json(spec, Path(names))
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
    return rules


def _rules_from_json(spec: CompiledSpec, path: Path) -> dict[str, NameRule]:
    if not path.is_file():
        raise LayoutError(f"--names must be 'vllm', 'gpt-oss' or a JSON file; {path} is none of them")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise LayoutError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise LayoutError(f"{path}: expected an object mapping spec inputs to checkpoint names")
    rules = {}
    for n in spec.input_names:
        entry = raw.get(n)
        if entry is None:
            raise LayoutError(f"{path}: no name for spec input {n!r}")
        try:
            if isinstance(entry, str):
                rules[n] = NameRule(entry)
            else:
                fields = dict(entry)
                rules[n] = NameRule(fields.pop("name"), **fields)
        except (TypeError, KeyError, ValueError) as err:
            raise LayoutError(f"{path}: entry for {n!r}: {err}; fields are name, merge_last, dtype, rows") from None
        if "{layer}" not in rules[n].template:
            raise LayoutError(f"{path}: the name for {n!r} must contain {{layer}}, e.g. \"{{layer}}.{n}\"")
    unknown = sorted(set(raw) - set(spec.input_names))
    if unknown:
        raise LayoutError(f"{path}: {', '.join(unknown)} are not inputs of {spec.name} ({', '.join(spec.input_names)})")
    return rules


def _plain_file_name(name: Any, where: str) -> str:
    """A shard file name from a checkpoint index: a plain name in the checkpoint's folder. A path
    (``../victim.safetensors``, ``/etc/x``) would read outside ``--in`` and write outside ``--out``."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
            or "\0" in name or any(not c.isprintable() for c in name)):
        raise LayoutError(f"{where}: {name!r} is not a plain file name in the checkpoint's folder; "
                          f"an index may only name files beside it")
    return name


def _shard_map(in_dir: Path) -> dict[str, str]:
    """Tensor name -> shard file name (checked: plain names inside ``in_dir``)."""
    from safetensors import safe_open

    index = in_dir / INDEX
    if index.is_file():
        try:
            raw = json.loads(index.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise LayoutError(f"{index}: not a valid index ({err})") from None
        weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise LayoutError(f"{index}: expected an object with a non-empty \"weight_map\" of tensor name -> file")
        out = {}
        for tensor, file in weight_map.items():
            out[str(tensor)] = _plain_file_name(file, str(index))
            if not (in_dir / file).is_file():
                raise LayoutError(f"{index}: names {file!r} for {tensor!r}, which is not a file in {in_dir}")
        return out
    files = sorted(p.name for p in in_dir.glob("*.safetensors") if p.is_file())
    if not files:
        raise LayoutError(f"{in_dir}: no *.safetensors file and no {INDEX}")
    out = {}
    for f in files:
        try:
            with safe_open(str(in_dir / f), "pt") as h:
                out.update({k: f for k in h.keys()})
        except Exception as err:  # safetensors raises its own error types; the message is what matters
            raise LayoutError(f"{in_dir / f}: cannot read ({err})") from None
    return out


def _groups(weight_map: Mapping[str, str], rules: Mapping[str, NameRule], spec: CompiledSpec) -> dict[str, dict[str, str]]:
    """Layer -> {spec input: checkpoint name}, for layers that have every required input."""
    regexes = {n: r.regex() for n, r in rules.items()}
    groups: dict[str, dict[str, str]] = {}
    for tensor in weight_map:
        for n, rx in regexes.items():
            m = rx.match(tensor)
            if m:
                groups.setdefault(m.group("layer"), {})[n] = tensor
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


def _load_group(reader: _Reader, group: Mapping[str, str], rules: Mapping[str, NameRule]) -> dict[str, torch.Tensor]:
    out = {}
    for n, tensor_name in group.items():
        t = reader.get(tensor_name)
        rule = rules[n]
        if rule.merge_last:
            t = t.reshape(*t.shape[:-2], t.shape[-2] * t.shape[-1])
        if rule.dtype:
            t = t.to(getattr(torch, rule.dtype))
        out[n] = t
    return out


def metadata(spec: CompiledSpec) -> dict[str, str]:
    from .versions import installed_version

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


def _file_sha256(path: Path) -> str:
    """sha256 of a file's bytes (hashlib releases the GIL: this runs beside the conversion)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` so ``path`` is either absent, the old content or the whole new content, even if
    the process is killed or the disk fills: a temporary file, fsync, rename, fsync of the folder."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_json(path: Path) -> Any:
    """A marker or run file, or None when it is absent or unreadable (a crash mid-write leaves none:
    they are written atomically; an empty or foreign file is treated as absent, never trusted)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def run_identity(spec: CompiledSpec, names: str | Path) -> dict[str, Any]:
    """What a conversion folder holds: resuming with anything else would mix two layouts."""
    return {"spec": spec.name, "sha256": spec.sha256, "params": spec.params, "names": str(names),
            "layoutc_version": __version__}


@contextlib.contextmanager
def _folder_lock(out_dir: Path):
    """An exclusive lock on ``out_dir`` while the run's identity is checked or written (ranks of one
    torchrun take it in turn; a second, different run finds the identity of the first)."""
    with open(out_dir / LOCK, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def claim_folder(out_dir: Path, identity: Mapping[str, Any], rank: int, world: int):
    """Record (or check) what ``out_dir`` holds, and hold this rank's lock for the run. Returns the
    open lock file (closing it releases the lock)."""
    with _folder_lock(out_dir):
        held = _read_json(out_dir / RUN)
        if held is None and any(out_dir.glob("*.safetensors")):
            raise LayoutError(f"--out {out_dir} already holds safetensors files that no layoutc conversion wrote; "
                              f"use an empty folder")
        if held is not None and held != dict(identity):
            changed = ", ".join(k for k in identity if held.get(k) != identity[k]) or "the run"
            raise LayoutError(
                f"--out {out_dir} holds a conversion with another {changed} ({held.get('spec')}, parameters "
                f"{held.get('params')}, names {held.get('names')}); resuming into it would mix two layouts. "
                f"Use a new --out folder, or delete this one to start over")
        if held is None:
            _write_atomically(out_dir / RUN, json.dumps(dict(identity), sort_keys=True))
    lock = open(out_dir / f"{LOCK}-rank{rank}-of-{world}", "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise LayoutError(f"another layoutc convert (rank {rank} of {world}) is writing into {out_dir}; "
                          f"wait for it or use another --out folder") from None
    return lock


def convert_checkpoint(
    spec: CompiledSpec, in_dir: str | Path, out_dir: str | Path, names: str | Path = "vllm",
    device: str = "cpu", rank: int = 0, world: int = 1, progress: Callable[[Iterable], Iterable] | None = None,
    lowering: str = "auto", verify: bool = True,
) -> dict[str, Any]:
    """Convert the shards this rank owns; returns a summary. See the module docstring."""
    in_dir, out_dir = Path(in_dir).resolve(), Path(out_dir).resolve()
    if not in_dir.is_dir():
        raise LayoutError(f"{in_dir} is not a folder")
    if out_dir == in_dir:
        raise LayoutError(f"--out {out_dir} is the input folder; layoutc convert never overwrites its input")
    rules = name_rules(spec, names)
    weight_map = _shard_map(in_dir)
    groups = _groups(weight_map, rules, spec)  # fails before anything is written when no layer matches
    # What a failed run may remove: only what it made. Other ranks share the folder (only a lone run
    # cleans up); a folder that already holds a run's record is a resume, whose state is kept.
    created = not out_dir.exists()
    fresh = world == 1 and not (out_dir / RUN).exists() and not (out_dir / DONE).exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {"converted_layers": 0, "skipped_shards": 0, "written_shards": 0, "verified_layers": 0}
    try:
        lock = claim_folder(out_dir, run_identity(spec, names), rank, world)
        with lock, concurrent.futures.ThreadPoolExecutor(1) as hasher:
            _convert_shards(spec, in_dir, out_dir, names, device, rank, world, progress, lowering, verify, rules,
                            weight_map, groups, hasher, summary)
    except BaseException:
        if fresh and summary["written_shards"] == 0:
            # a failed first run leaves no folder of bookkeeping behind (nor bookkeeping in the user's folder)
            _remove_bookkeeping(out_dir, remove_folder=created)
        raise
    return summary


def _remove_bookkeeping(out_dir: Path, remove_folder: bool) -> None:
    """Remove the files layoutc writes beside the shards (never a file of the user's), and the folder
    when it was created by this run and is empty then."""
    done = out_dir / DONE
    for p in done.glob("*.json") if done.is_dir() else ():
        with contextlib.suppress(OSError):
            p.unlink()
    for p in [done, *out_dir.glob(f"{LOCK}*"), out_dir / RUN, *out_dir.glob(".*.safetensors.tmp")]:
        with contextlib.suppress(OSError):
            p.rmdir() if p.is_dir() else p.unlink()
    if remove_folder:
        with contextlib.suppress(OSError):
            out_dir.rmdir()  # fails, and keeps the folder, if anything else is in it


def _convert_shards(spec, in_dir, out_dir, names, device, rank, world, progress, lowering, verify, rules, weight_map,
                    groups, hasher, summary) -> None:
    member = {tensor: (layer, n) for layer, g in groups.items() for n, tensor in g.items()}
    shards = sorted(set(weight_map.values()))
    mine = shards[rank::world]
    reader = _Reader(in_dir, weight_map)
    meta = metadata(spec)
    done_dir = out_dir / DONE
    done_dir.mkdir(exist_ok=True)
    identity = run_identity(spec, names)
    iterator = progress(mine) if progress else mine
    for shard in iterator:
        marker = done_dir / f"{shard}.json"
        source = in_dir / shard
        stamp = _read_json(marker)
        if (isinstance(stamp, dict) and (out_dir / shard).is_file() and stamp.get("run") == identity
                and stamp.get("input_size") == source.stat().st_size
                and stamp.get("output_size") == (out_dir / shard).stat().st_size
                and stamp.get("input_sha256") == _file_sha256(source)):
            summary["skipped_shards"] += 1
            continue
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()  # redone from here: never trust an old stamp for a new shard
        digest = hasher.submit(_file_sha256, source)  # read beside the conversion
        tensors: dict[str, torch.Tensor] = {}
        layers = []
        for name in reader.names_in(shard):
            if name in member:
                layer = member[name][0]
                if layer not in layers:
                    layers.append(layer)
            else:
                tensors[name] = reader.get(name)
        for i, layer in enumerate(layers):
            group = groups[layer]
            inputs = {k: v.to(device) for k, v in _load_group(reader, group, rules).items()}
            try:
                out = spec.convert(inputs, lowering=lowering)
            except LayoutError as err:
                raise LayoutError(f"layer {layer!r} (shard {shard}): {err}") from None
            if verify and i == 0:
                _verify_sample(spec, inputs, out, layer)
                summary["verified_layers"] += 1
            for n, tensor_name in group.items():
                if weight_map[tensor_name] == shard:
                    tensors[tensor_name] = out[n].cpu().contiguous()
            summary["converted_layers"] += 1
            del inputs, out
        tmp = out_dir / f".{shard}.tmp"
        try:
            shardfile.write(tmp, tensors, meta)
            os.chmod(tmp, 0o644)
            os.replace(tmp, out_dir / shard)  # atomic: a shard is either absent or complete
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        _write_atomically(marker, json.dumps({
            "run": identity, "input_sha256": digest.result(), "input_size": source.stat().st_size,
            "output_size": (out_dir / shard).stat().st_size,
        }, sort_keys=True))
        summary["written_shards"] += 1


def finish(spec: CompiledSpec, in_dir: str | Path, out_dir: str | Path, names: str | Path) -> None:
    """Index and manifest, once every shard is written (rank 0 after the others)."""
    in_dir, out_dir = Path(in_dir).resolve(), Path(out_dir).resolve()
    weight_map = _shard_map(in_dir)
    identity = run_identity(spec, names)
    missing = [s for s in sorted(set(weight_map.values()))
               if not (out_dir / s).is_file() or (_read_json(out_dir / DONE / f"{s}.json") or {}).get("run") != identity]
    if missing:
        raise LayoutError(f"shards not converted yet: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    if (in_dir / INDEX).is_file():
        index = json.loads((in_dir / INDEX).read_text(encoding="utf-8"))
        index.setdefault("metadata", {}).update(metadata(spec))
        _write_atomically(out_dir / INDEX, json.dumps(index, indent=2))
    manifest = metadata(spec) | {"names": str(names), "shards": sorted(set(weight_map.values())),
                                 "source": str(in_dir)}
    _write_atomically(out_dir / MANIFEST, json.dumps(manifest, indent=2))
