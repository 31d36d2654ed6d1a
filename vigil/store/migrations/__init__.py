"""Alembic migrations of Vigil's relational store."""
