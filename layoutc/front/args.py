"""An argument of a statement as the binder sees it: the parser's value, positions stripped."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class ArgValue:
    kind: str  # "expr" | "str" | "bool" | "list" | "ellipsis"
    value: Any  # Expr | str | bool | tuple[ArgValue, ...] | Ellipsis
    text: str
