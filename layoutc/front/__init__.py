"""Text to syntax tree: one reading of spec text, the grammar, the syntax tree, diagnostics."""
