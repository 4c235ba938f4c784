"""`trainmedic setup temporal`: prepare a (production) Temporal namespace for trainmedic."""

from __future__ import annotations

import asyncio

import typer

from trainmedic.cli.common import console, settings
from trainmedic.temporal.client import connect
from trainmedic.temporal.search_attributes import REQUIRED
from trainmedic.temporal.setup import SetupResult, register_search_attributes

app = typer.Typer(
    help="Prepare external services for trainmedic.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _group() -> None:
    """Prepare external services for trainmedic."""
    # A callback keeps `temporal` a subcommand (typer collapses a lone command otherwise).


async def _setup() -> SetupResult:
    client = await connect(settings())
    return await register_search_attributes(client)


@app.command()
def temporal() -> None:
    """Register trainmedic's search attributes on the configured namespace (idempotent).

    Uses the same settings as the worker (TRAINMEDIC_TEMPORAL_ADDRESS, _NAMESPACE, TLS,
    mTLS, API key); the credentials need operator rights on the namespace.
    """
    result = asyncio.run(_setup())
    for name in result.added:
        console.print(f"  [green]added[/]            {name} ({REQUIRED[name]})")
    for name in result.present:
        console.print(f"  already present  {name} ({REQUIRED[name]})")
    if result.added:
        console.print(
            f"[green]ok[/]: registered {len(result.added)} search attribute(s) on namespace "
            f"{result.namespace!r}; {len(result.present)} already present"
        )
    else:
        console.print(
            f"[green]ok[/]: all {len(result.present)} search attributes already present on "
            f"namespace {result.namespace!r}; nothing to do"
        )
