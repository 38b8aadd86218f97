"""The ``layoutc`` command line and the review tools (diff, explain, draw, review)."""

from .main import main

__all__ = ['main']
