"""A spec's identity: one hash of everything that decides what its converter does.

That is the spec's text, the content of every file it imports (after symlinks are followed; the
content, not the path, so the same files give the same identity on any machine and from any
folder), the prelude of this layoutc (the built-in families), and the parameter values. It is
``SPEC_SHA256`` in generated converters, the ``sha256`` of provenance stamps and of
``CompiledSpec``, the key of the compile cache and of ``convert``'s run identity: when any part
changes, a conversion is redone or refused, never mixed with shards of the old layout.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Mapping

#: Bumped when what the identity covers changes.
VERSION = 1


def spec_identity(spec_sha256: str, imports: Iterable[tuple[str, str]], prelude_sha256: str,
                  params: Mapping[str, Any]) -> str:
    """The identity from the spec text's sha256, (import as written, content sha256) in import order,
    the prelude's sha256 and the parameters."""
    document = {
        "layoutc-spec-identity": VERSION,
        "spec": spec_sha256,
        "imports": [[path, sha] for path, sha in imports],
        "prelude": prelude_sha256,
        "params": [[k, repr(v)] for k, v in sorted(params.items())],
    }
    text = json.dumps(document, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()
