"""Verification: ties in sync, kernel contracts, coverage, and probes of generated converters."""
