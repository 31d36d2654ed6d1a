"""Vigil precheck package."""
