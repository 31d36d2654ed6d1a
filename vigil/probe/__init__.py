"""Vigil probe package."""
