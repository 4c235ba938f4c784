"""`trainmedic audit export`: the audit trail as JSON Lines, from workflow histories."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import stat
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import TextIO

import typer
from rich.text import Text

from trainmedic.audit import AuditError, export, parse_since
from trainmedic.cli.common import err_console, settings
from trainmedic.errors import TrainmedicError
from trainmedic.temporal.client import connect

app = typer.Typer(
    help="The audit trail: every decision and effect, read from workflow histories.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _group() -> None:
    """The audit trail: every decision and effect, read from workflow histories."""
    # A callback keeps `export` a subcommand (typer collapses a lone command otherwise).


async def _export(
    out: TextIO, since: datetime | None, incident: str | None, address: str | None
) -> Counter[str]:
    client = await connect(settings(), address=address)
    counts: Counter[str] = Counter()
    workflows: set[str] = set()
    async for record in export(client, since=since, incident=incident):
        out.write(record.model_dump_json(exclude_defaults=False) + "\n")
        counts[record.kind] += 1
        workflows.add(record.workflow_id)
    counts["_workflows"] = len(workflows)
    return counts


def _export_to_file(
    output: Path, since: datetime | None, incident: str | None, address: str | None
) -> Counter[str]:
    """Export into a new file beside `output`, renamed over it only once complete: an
    unreachable Temporal or a failure half-way leaves the previous export as it was."""
    try:
        mode = os.stat(output).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        # A device or FIFO (/dev/stdout, a pipe): nothing to keep, and nothing to rename over.
        with output.open("w", encoding="utf-8") as handle:
            return asyncio.run(_export(handle, since, incident, address))
    temp = output.with_name(f".{output.name}.{secrets.token_hex(4)}.tmp")
    # 0o666 less the umask, as open() would make it; an existing export keeps its mode.
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            if mode is not None:
                os.fchmod(handle.fileno(), stat.S_IMODE(mode))
            counts = asyncio.run(_export(handle, since, incident, address))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, output)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return counts


@app.command("export")
def export_cmd(
    since: str | None = typer.Option(
        None, "--since", help="Only records from then on: a duration back (2h, 30m, 1d) or ISO."
    ),
    incident: str | None = typer.Option(
        None, "--incident", help="One workflow id (an incident, or control-<cluster>)."
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write to this file instead of stdout."
    ),
    address: str | None = typer.Option(
        None, "--address", help="Temporal address (default: TRAINMEDIC_TEMPORAL_ADDRESS)."
    ),
) -> None:
    """Write one JSON object per decision and effect: time, incident, stage, who, evidence,
    Slurm command and result. Workflows started a moment ago may not be listed yet
    (visibility is eventually consistent); --incident reads one directly."""
    try:
        try:
            start = parse_since(since) if since else None
        except OverflowError:  # e.g. 99999999999d: before the start of the calendar
            raise AuditError(f"--since {since!r}: too far back; give e.g. 30m, 2h, 1d") from None
        if output is None:
            counts = asyncio.run(_export(sys.stdout, start, incident, address))
        else:
            counts = _export_to_file(output, start, incident, address)
    except TrainmedicError as error:
        err_console.print(Text.assemble(("error: ", "bold red"), str(error)), soft_wrap=True)
        raise typer.Exit(2) from None
    except OSError as error:
        err_console.print(
            Text.assemble(("error: ", "bold red"), f"cannot write {output}: {error}"),
            soft_wrap=True,
        )
        raise typer.Exit(2) from None
    workflows = counts.pop("_workflows", 0)
    total = sum(counts.values())
    kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items())) or "none"
    where = f" to {output}" if output else ""
    err_console.print(
        f"exported {total} records from {workflows} workflows{where} ({kinds})", soft_wrap=True
    )
