"""Vigil logs package."""
