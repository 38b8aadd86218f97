"""The editor grammar (TextMate, for VS Code and others), generated from the language itself.

Keywords come from the parser's grammar, element types from :mod:`layoutc.algebra.dtypes`, operation names
from the op registry, family names from the prelude: one source of truth. ``make docs`` writes
``editors/vscode/syntaxes/lyt.tmLanguage.json``; a test fails when the committed file is stale.
"""

from __future__ import annotations

import json

from ..algebra.dtypes import ELEMENT_TYPES
from ..lang.families import prelude
from ..lang.ops import ALL_NAMES
from ..front.parse import parser


def keywords() -> list[str]:
    words = {t.pattern.value for t in parser().terminals if t.pattern.type == "str" and t.pattern.value.isalpha()}
    return sorted(words - {"true", "false", "input", "output"})


def textmate_grammar() -> dict:
    alt = "|".join
    return {
        "$schema": "https://raw.githubusercontent.com/martinring/tmlanguage/master/tmlanguage.json",
        "name": "layoutc spec",
        "scopeName": "source.lyt",
        "fileTypes": ["lyt"],
        "patterns": [{"include": f"#{k}"} for k in
                     ("comment", "declaration", "keyword", "type", "call", "constant", "operator")],
        "repository": {
            "comment": {"name": "comment.line.number-sign.lyt", "match": "#.*$"},
            "declaration": {
                "match": "\\b(input|output)\\s+([A-Za-z_][A-Za-z_0-9]*)(\\??)",
                "captures": {"1": {"name": "storage.type.lyt"}, "2": {"name": "variable.other.tensor.lyt"},
                             "3": {"name": "keyword.operator.optional.lyt"}},
            },
            "keyword": {"name": "keyword.control.lyt", "match": f"\\b({alt(keywords())})\\b"},
            "type": {"name": "support.type.lyt", "match": f"\\b({alt(ELEMENT_TYPES)})\\b"},
            "call": {"match": f"\\b({alt(ALL_NAMES)})\\s*(?=\\()",
                     "captures": {"1": {"name": "entity.name.function.lyt"}}},
            "constant": {"patterns": [
                {"name": "constant.language.lyt", "match": "\\b(true|false)\\b"},
                {"name": "constant.numeric.lyt", "match": "\\b[0-9]+(\\.[0-9]+)*\\b"},
                {"name": "string.quoted.double.lyt", "match": "\"[^\"\\n]*\""},
                {"name": "support.constant.family.lyt", "match": f"\\b({alt(sorted(f.name for f in prelude()))})\\b"},
            ]},
            "operator": {"name": "keyword.operator.lyt", "match": ">=|<=|==|!=|~=|//|->|\\.\\.\\.|[<>=+\\-*/%;:?]"},
        },
    }


def textmate_json() -> str:
    return json.dumps(textmate_grammar(), indent=2) + "\n"
