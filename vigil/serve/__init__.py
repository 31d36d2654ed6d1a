"""Vigil serve package."""
