"""Vigil sim package."""
