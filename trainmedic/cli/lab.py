"""Placeholder: `trainmedic lab ...` (the Slurm lab)."""

from __future__ import annotations

import typer

app = typer.Typer(help="A real Slurm cluster on this machine, for trying and testing.")
