"""Fixtures for the equiv/infer tests: the pytest plugin's fixture, imported (as an engine's conftest would
list ``pytest_plugins = ["layoutc.testing"]``; a non-root conftest may not)."""

from layoutc.testing import layoutc_equiv  # noqa: F401
