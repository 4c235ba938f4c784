"""Placeholder: `trainmedic attribute` and `trainmedic attribution eval` (issue 4)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the attribution verbs to the root app."""
