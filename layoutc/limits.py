"""Bounds on what a spec may ask for, so the work layoutc does is bounded by the spec's size.

A spec is a few dozen lines; these limits are orders of magnitude above any real one and far
below what would exhaust memory or recursion. Exceeding one is an error with a location, never
a hang, an out-of-memory kill or a ``RecursionError``.
"""

#: Bytes in a spec file.
MAX_SOURCE_BYTES = 1 << 20
#: Nesting of the syntax tree (parenthesised expressions, unary minus chains, ``if`` blocks).
MAX_NESTING = 64
#: Transform statements in a spec (after every ``if`` is expanded).
MAX_STATEMENTS = 2000
#: Transforms applied to one tensor (its chain composes into one index map).
MAX_STEPS_PER_TENSOR = 64
#: Declared dims and optional inputs (each optional input doubles the variants verified).
MAX_DIMS = 32
MAX_OPTIONAL_INPUTS = 6
#: Parameter combinations ``layoutc check`` verifies when none is fixed with -D.
MAX_PARAM_COMBINATIONS = 64
#: Integers written in a spec or given with -D (sizes, multiples, groups, tables).
MAX_INT = (1 << 31) - 1
#: Digits of an integer literal (the value check above needs the number parsed first).
MAX_INT_DIGITS = 12
#: Elements of a tensor on the small instances the verifier evaluates maps on (layoutc.algebra.regions checks it
#: from the symbolic shapes before anything is allocated).
MAX_VERIFY_ELEMENTS = 1 << 22
#: Length of a string parameter value.
MAX_STRING = 256
#: Largest value of a dim in the sizes the verifier evaluates maps on (a region's representatives are its
#: smallest sizes; a spec whose sizes start above this is refused before anything is allocated).
MAX_REPRESENTATIVE = 1 << 16
