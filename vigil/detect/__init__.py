"""Vigil detect package."""
