"""The hostile-input corpus: file names, spec texts and ``-D`` values written the way an attacker
writes them (issue 10 reproduced each of these on an earlier main).

Every payload tries to create a file named ``PWNED`` in the current folder, through Python code
smuggled into a generated converter: the tests run each case in a fresh folder and require that
no such file ever appears, at ``check``, ``compile``, import of the written module or ``convert``.
"""

from __future__ import annotations

MARKER = "PWNED"
PAYLOAD = f'__import__("pathlib").Path("{MARKER}").touch()'
PAYLOAD_SQ = f"__import__('pathlib').Path('{MARKER}').touch()"  # for places a double quote cannot go

#: A valid spec without a ``spec`` line: its name and its comments come from the file name.
BODY = """dims E, I
param tag = "plain"
input w : bf16[E, 2*I, 2] rows [w1; w3]
swap_halves(w, dim=1)
output w : bf16[E, 2*I, 2] rows [w3; w1]
"""

#: File names that once ran code through the generated module's header, docstring or comments.
FILE_NAMES = {
    "triple_quotes": f'q"""+str({PAYLOAD})+"""q.lyt',
    "single_triple_quotes": f"q'''+str({PAYLOAD})+'''q.lyt",
    "newline": f"a\n{PAYLOAD}\n#.lyt",
    "carriage_return": f"a\r{PAYLOAD}\r#.lyt",
    "line_separator": f"a\u2028{PAYLOAD}\u2028#.lyt",
    "backslash_N": "x\\N{EVIL}.lyt",
    "backslash_quote": 'x\\"y.lyt',
    "escape_sequence": "x\x1b[31mred.lyt",
    "non_ascii": "é.lyt",
    "digits_first": "123.lyt",
}

#: Spec texts: (text, expected) where expected is "ok" (compiles, converter is safe) or the
#: (line, column, message fragment) of the error it must be rejected with.
SPECS = {
    # the CR-in-comment attack inside a shape expression (issue 10, case 2)
    "cr_in_shape_comment": (
        "dims E, H\ninput w : bf16[E, 2 * #a\r    " + PAYLOAD + " ; _a = \"\"\" ''' ; _ = [\n H]\noutput w : bf16[E, 2*H]\n",
        "error",
    ),
    "triple_quotes_in_comments": ("# \"\"\" ''' \\N{x} \\\n" + BODY.replace("swap_halves(w, dim=1)",
                                  "swap_halves(w, dim=1)  # \"\"\"+" + PAYLOAD + "+\"\"\""), "ok"),
    "string_parameter_with_quotes": (BODY.replace('"plain"', "\"'''+" + PAYLOAD_SQ + "+'''\""), "ok"),
    "nul_byte": (BODY.replace("# ", "") + "# a\x00b\n", (6, 4, "U+0000")),
    "line_separator": (BODY + "# a\u2028" + PAYLOAD + "\n", (6, 4, "U+2028 LINE SEPARATOR")),
    "paragraph_separator": (BODY + "# a\u2029b\n", (6, 4, "U+2029")),
    "bidi_override": (BODY + "# \u202eswap_halves(w)\n", (6, 3, "U+202E")),
    "escape_sequence": (BODY + "# \x1b[2Jclear\n", (6, 3, "U+001B")),
    "form_feed": (BODY + "# a\x0cb\n", (6, 4, "U+000C")),
    "vertical_tab": ("dims E\x0b\n" + BODY, (1, 7, "U+000B")),
    "zero_width_space": (BODY.replace("rows [w3; w1]", "rows [w3;\u200b w1]"), (5, 37, "U+200B")),
    "dim_named_lambda": (BODY.replace("dims E, I", "dims E, lambda").replace("I]", "lambda]"), (1, 9, "keyword")),
    "dim_named_tensors": (BODY.replace("dims E, I", "dims E, tensors").replace("I]", "tensors]"), (1, 9, "generated")),
    "dim_named_torch": (BODY.replace("dims E, I", "dims E, torch").replace("I]", "torch]"), (1, 9, "generated")),
    "dim_named_out": (BODY.replace("dims E, I", "dims E, out").replace("I]", "out]"), (1, 9, "generated")),
    "dim_named_range": (BODY.replace("dims E, I", "dims E, range").replace("I]", "range]"), (1, 9, "builtin")),
    "dim_named_like_a_coordinate": (BODY.replace("dims E, I", "dims E, o1").replace("I]", "o1]"), (1, 9, "coordinate")),
    "dim_named_like_a_private": (BODY.replace("dims E, I", "dims E, _I").replace("I]", "_I]"), (1, 9, "start with a letter")),
}

#: -D values: (NAME=VALUE, expected) with expected "ok" or a fragment of the error.
DEFINES = {
    "triple_quotes": (f'tag=x"""+str({PAYLOAD})+"""y', "ok"),
    "single_triple_quotes": (f"tag=x'''+str({PAYLOAD})+'''y", "ok"),
    "backslashes": ("tag=\\N{x}\\u2028\\", "ok"),
    "newline": ("tag=x\n" + PAYLOAD, "U+000A"),
    "carriage_return": ("tag=x\r" + PAYLOAD, "U+000D"),
    "nul": ("tag=x\x00y", "U+0000"),
    "line_separator": ("tag=x\u2028y", "U+2028"),
    "huge_integer": ("tag=" + "9" * 100, "too large"),
    "long_string": ("tag=" + "x" * 5000, "characters long"),
    "bad_name": ("ta g=1", "not a parameter name"),
}
