"""Vigil: end-to-end AIOps for AI training clusters."""

__version__ = "0.1.0"
