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
* Resumes: a finished shard is written atomically and marked done; a rerun skips it.
* Verifies a sample: for the first layer of every shard, ``convert(inverse(out)) == out`` bit for bit
  (for a tensor-parallel slice, which has no inverse: the eager reference lowering agrees).
* Never writes into the input folder.
* Under ``torchrun``, rank r of n converts shards ``r, r+n, ...`` (gloo on CPU, NCCL on GPUs).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import attrs
import torch

from . import __version__
from .api import CompiledSpec
from .dtypes import bit_view
from .lower.runtime import LayoutError

INDEX = "model.safetensors.index.json"
MANIFEST = "layoutc_manifest.json"
DONE = ".layoutc-done"


@attrs.frozen
class NameRule:
    template: str  # e.g. "{layer}.w13_weight"
    merge_last: bool = False  # merge the last two axes (gpt-oss stores MXFP4 as [.., K/32, 16] blocks)
    dtype: str | None = None  # convert values to this torch dtype on load (e.g. bf16 biases -> float32)
    rows: str | None = None  # the row order the checkpoint stores ("interleaved" for gpt-oss gate/up)

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
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
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


def _shard_map(in_dir: Path) -> dict[str, str]:
    """Tensor name -> shard file name."""
    from safetensors import safe_open

    index = in_dir / INDEX
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    files = sorted(p.name for p in in_dir.glob("*.safetensors"))
    if not files:
        raise LayoutError(f"{in_dir}: no *.safetensors file and no {INDEX}")
    out = {}
    for f in files:
        with safe_open(str(in_dir / f), "pt") as h:
            out.update({k: f for k in h.keys()})
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


def convert_checkpoint(
    spec: CompiledSpec, in_dir: str | Path, out_dir: str | Path, names: str | Path = "vllm",
    device: str = "cpu", rank: int = 0, world: int = 1, progress: Callable[[Iterable], Iterable] | None = None,
    lowering: str = "auto", verify: bool = True,
) -> dict[str, Any]:
    """Convert the shards this rank owns; returns a summary. See the module docstring."""
    from safetensors.torch import save_file

    in_dir, out_dir = Path(in_dir).resolve(), Path(out_dir).resolve()
    if not in_dir.is_dir():
        raise LayoutError(f"{in_dir} is not a folder")
    if out_dir == in_dir:
        raise LayoutError(f"--out {out_dir} is the input folder; layoutc convert never overwrites its input")
    out_dir.mkdir(parents=True, exist_ok=True)
    rules = name_rules(spec, names)
    weight_map = _shard_map(in_dir)
    groups = _groups(weight_map, rules, spec)
    member = {tensor: (layer, n) for layer, g in groups.items() for n, tensor in g.items()}
    shards = sorted(set(weight_map.values()))
    mine = shards[rank::world]
    reader = _Reader(in_dir, weight_map)
    meta = metadata(spec)
    done_dir = out_dir / DONE
    done_dir.mkdir(exist_ok=True)
    summary = {"converted_layers": 0, "skipped_shards": 0, "written_shards": 0, "verified_layers": 0}
    iterator = progress(mine) if progress else mine
    for shard in iterator:
        marker = done_dir / f"{shard}.json"
        source = in_dir / shard
        stamp = {"size": source.stat().st_size, "mtime_ns": source.stat().st_mtime_ns, "sha256": spec.sha256,
                 "params": spec.params, "names": str(names)}
        if marker.is_file() and (out_dir / shard).is_file() and json.loads(marker.read_text()) == stamp:
            summary["skipped_shards"] += 1
            continue
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
            out = spec.convert(inputs, lowering=lowering)
            if verify and i == 0:
                _verify_sample(spec, inputs, out, layer)
                summary["verified_layers"] += 1
            for n, tensor_name in group.items():
                if weight_map[tensor_name] == shard:
                    tensors[tensor_name] = out[n].cpu().contiguous()
            summary["converted_layers"] += 1
            del inputs, out
        tmp = out_dir / f".{shard}.tmp"
        save_file(tensors, str(tmp), metadata=meta)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out_dir / shard)  # atomic: a shard is either absent or complete
        marker.write_text(json.dumps(stamp))
        summary["written_shards"] += 1
    return summary


def finish(spec: CompiledSpec, in_dir: str | Path, out_dir: str | Path, names: str | Path) -> None:
    """Index and manifest, once every shard is written (rank 0 after the others)."""
    in_dir, out_dir = Path(in_dir).resolve(), Path(out_dir).resolve()
    weight_map = _shard_map(in_dir)
    missing = [s for s in sorted(set(weight_map.values())) if not (out_dir / s).is_file()]
    if missing:
        raise LayoutError(f"shards not converted yet: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    if (in_dir / INDEX).is_file():
        index = json.loads((in_dir / INDEX).read_text())
        index.setdefault("metadata", {}).update(metadata(spec))
        (out_dir / INDEX).write_text(json.dumps(index, indent=2))
    manifest = metadata(spec) | {"names": str(names), "shards": sorted(set(weight_map.values())),
                                 "source": str(in_dir)}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))
