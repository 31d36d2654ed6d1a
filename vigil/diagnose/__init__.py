"""Vigil diagnose package."""
