"""Vigil collect package."""
