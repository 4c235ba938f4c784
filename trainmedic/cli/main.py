"""The `trainmedic` command. Each verb group lives in its own module."""

from __future__ import annotations

import logging
import sys

import typer
from rich.console import Console

from trainmedic import __version__
from trainmedic.cli import advice as advice_cli
from trainmedic.cli import attribute as attribute_cli
from trainmedic.cli import audit as audit_cli
from trainmedic.cli import config as config_cli
from trainmedic.cli import demo as demo_cli
from trainmedic.cli import deploy as deploy_cli
from trainmedic.cli import incidents as incidents_cli
from trainmedic.cli import lab as lab_cli
from trainmedic.cli import nodes as nodes_cli
from trainmedic.cli import report as report_cli
from trainmedic.cli import server as server_cli
from trainmedic.cli import setup as setup_cli
from trainmedic.cli import status as status_cli
from trainmedic.cli import up as up_cli
from trainmedic.errors import TrainmedicError

app = typer.Typer(
    name="trainmedic",
    help="Keeps distributed GPU training running on Slurm: detect, attribute, isolate, act.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(server_cli.app, name="server")
app.add_typer(lab_cli.app, name="lab")
app.add_typer(config_cli.app, name="config")
app.add_typer(incidents_cli.app, name="incidents")
app.add_typer(nodes_cli.app, name="nodes")
app.add_typer(audit_cli.app, name="audit")
app.add_typer(deploy_cli.app, name="deploy")
app.add_typer(setup_cli.app, name="setup")
advice_cli.register(app)
attribute_cli.register(app)
up_cli.register(app)
demo_cli.register(app)
report_cli.register(app)
status_cli.register(app)


def _version(value: bool) -> None:
    if value:
        print(f"trainmedic {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log debug detail."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def main() -> None:
    try:
        app()
    except TrainmedicError as error:
        Console(stderr=True).print(f"[bold red]error:[/] {error}", highlight=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
