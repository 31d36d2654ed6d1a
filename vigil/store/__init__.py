"""Vigil store package."""
