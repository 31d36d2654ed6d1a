"""Vigil checkpoint package."""
