"""The name mapping of ``layoutc convert``: which checkpoint tensor is which spec input.

For every spec input a :class:`NameRule` (a template with a ``{layer}`` placeholder, and how to
load the tensor: merge the last two axes, convert the dtype, the row order stored). The presets
(``vllm``, ``gpt-oss``) and a ``--names`` JSON file are read here, checked against the spec's
declared row orders, and given an identity for the run record (:func:`load_names`): the preset's
name or the file's sha256, so an edited file is another mapping. Kept apart from the checkpoint
scan and the conversion, which only consume the rules.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import attrs

from ..api import CompiledSpec
from ..runtime.checks import LayoutError
from .shardheader import load_json, utf8_name
from ..front.text import display

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
