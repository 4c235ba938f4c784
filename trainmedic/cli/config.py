"""`trainmedic config check|show`: validate settings and policy before they bite."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml

from trainmedic.cli.common import console, settings
from trainmedic.config import load_policy

app = typer.Typer(help="Check and show configuration (environment TRAINMEDIC_* + policy file).")


@app.command()
def check(
    policy_file: Path | None = typer.Argument(
        None, help="Policy file to validate (default: TRAINMEDIC_POLICY_FILE, if set)."
    ),
) -> None:
    """Validate a policy file (and the environment); name every offending key."""
    config = settings()
    path = policy_file or config.policy_file
    policy = load_policy(path)
    where = str(path) if path else "built-in defaults"
    console.print(
        f"[green]ok[/]: policy {policy.version!r} from {where}; cluster {config.cluster!r}"
    )


@app.command()
def show(
    policy_file: Path | None = typer.Argument(None, help="Policy file (default: configured)."),
) -> None:
    """Print the effective settings and policy (secrets masked)."""
    config = settings()
    policy = load_policy(policy_file or config.policy_file)
    out = {
        "settings": config.model_dump(mode="json"),
        "policy": policy.model_dump(mode="json"),
    }
    console.print(yaml.safe_dump(out, sort_keys=False), end="")
