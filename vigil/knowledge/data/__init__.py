"""Data files shipped with Vigil."""
