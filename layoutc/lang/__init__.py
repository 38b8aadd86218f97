"""The language: packing families, the checked program, expansion into ops, typed chains."""
