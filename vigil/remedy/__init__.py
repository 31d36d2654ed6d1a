"""Vigil remedy package."""
