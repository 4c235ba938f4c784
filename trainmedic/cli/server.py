"""`trainmedic server start|stop|status`: the embedded Temporal dev server."""

from __future__ import annotations

import typer

from trainmedic.cli.common import console, dev_server, settings
from trainmedic.temporal.devserver import DevServerStatus

app = typer.Typer(help="The embedded Temporal dev server (SQLite under the state directory).")


def _show(status: DevServerStatus) -> None:
    state = (
        "[green]serving[/]"
        if status.serving
        else ("[yellow]starting[/]" if status.running else "[red]stopped[/]")
    )
    console.print(f"Temporal dev server: {state}" + (f" (pid {status.pid})" if status.pid else ""))
    console.print(f"  address  {status.address}")
    console.print(f"  UI       {status.ui_url}")
    console.print(f"  database {status.db_file}")
    console.print(f"  log      {status.log_file}")


@app.command()
def start(
    timeout: float = typer.Option(60.0, help="Seconds to wait until it serves."),
) -> None:
    """Start the dev server, or reuse the one already running; wait until it serves."""
    server = dev_server(settings())
    with console.status("starting the Temporal dev server..."):
        status = server.start(timeout_s=timeout)
    _show(status)


@app.command()
def stop() -> None:
    """Stop our dev server (never another process on the port)."""
    server = dev_server(settings())
    if server.stop():
        console.print("Temporal dev server stopped.")
    else:
        console.print("No trainmedic dev server was running.")


@app.command()
def status() -> None:
    """Say whether our dev server runs and where."""
    server = dev_server(settings())
    current = server.status()
    _show(current)
    if not current.running:
        raise typer.Exit(1)
