"""`trainmedic report`: what a Slurm epilog or strigger program calls at a failure.

It reads the job's end from the environment Slurm gives the epilog (flags override),
writes one report into the controller's spool and exits 0 — always, within about two
seconds: a failing slurmd Epilog would drain the node, and a slow one delays the job's
end. Problems go to stderr (Slurm's epilog log), never into the exit status.

What it spools is checked first (`report_problems`): a job id must read N, N_M (array
task) or N+M (het component), a node list must be a hostlist (no shell metacharacters,
spaces or control characters), free text loses its control characters. Garbage is
refused with a message and nothing is spooled: the exit status is still 0. With
TRAINMEDIC_SPOOL_KEY_FILE readable, the report is signed with the site key.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import NoReturn

import typer

BUDGET_S = 2


class _OutOfTime(Exception):
    pass


@contextlib.contextmanager
def _bounded(seconds: int) -> Iterator[None]:
    """SIGALRM-bounded block (the CLI runs in the main thread)."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise _OutOfTime

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _state_dir() -> Path:
    try:
        from trainmedic.config import Settings

        return Settings().state_dir
    except Exception:  # a bad unrelated setting must not lose the report
        from trainmedic.config import default_state_dir

        return Path(os.environ.get("TRAINMEDIC_STATE_DIR") or default_state_dir())


def report(
    job_id: str | None = typer.Option(None, "--job-id", help="Default: $SLURM_JOB_ID."),
    nodes: str | None = typer.Option(
        None,
        "--nodes",
        "--node",
        help="Hostlist. Default: $SLURMD_NODENAME, else $SLURM_JOB_NODELIST.",
    ),
    exit_code: int | None = typer.Option(
        None, "--exit-code", help="Default: from $SLURM_JOB_EXIT_CODE2 or $SLURM_JOB_EXIT_CODE."
    ),
    signal_number: int | None = typer.Option(None, "--signal", help="Signal that ended the job."),
    restart_count: int | None = typer.Option(
        None, "--restart-count", help="Default: $SLURM_RESTART_COUNT."
    ),
    node_down: bool = typer.Option(False, "--node-down", help="strigger: the nodes went down."),
    node_fail: bool = typer.Option(False, "--node-fail", help="strigger: the nodes failed."),
    detail: str = typer.Option("", help="Free text carried into the incident."),
    spool: Path | None = typer.Option(None, help="Spool directory (default: under the state dir)."),
) -> None:
    """Report a job's end (Slurm epilog) or a node failure (strigger) to the controller."""
    try:
        with _bounded(BUDGET_S):
            from trainmedic.domain.hostlist import HostlistError
            from trainmedic.watchers.epilog import (
                ReportKind,
                clean_detail,
                parse_nodes,
                report_from_env,
                report_problems,
                spool_dir,
                valid_job_id,
                write_report,
            )
            from trainmedic.watchers.spoolfile import KEY_FILE_ENV, SpoolConfigError, load_key

            kind: ReportKind = (
                "node_down" if node_down else "node_failed" if node_fail else "epilog"
            )
            if job_id is not None and not valid_job_id(job_id):
                _refuse(f"--job-id {job_id[:40]!r} is not a Slurm job id (N, N_M or N+M)")
            try:
                names = parse_nodes(nodes) if nodes else []
            except HostlistError as error:
                _refuse(f"--nodes: {error}")
            made = report_from_env(
                os.environ,
                kind=kind,
                job_id=job_id,
                nodes=names,
                exit_code=exit_code,
                signal=signal_number,
                restart_count=restart_count,
                detail=clean_detail(detail),
            )
            problems = report_problems(made)
            if problems:
                _refuse("; ".join(problems[:4]))
            key = None
            if os.environ.get(KEY_FILE_ENV):
                try:
                    key = load_key(Path(os.environ[KEY_FILE_ENV]))
                except SpoolConfigError as error:
                    why = " ".join(str(error).split())
                    sys.stderr.write(f"trainmedic report: unsigned ({why})\n")
            path = write_report(made, spool or spool_dir(_state_dir()), key=key)
            sys.stderr.write(f"trainmedic report: {made.kind} job={made.job_id} -> {path}\n")
    except _Refused as refused:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"trainmedic report: refused, nothing spooled: {refused}\n")
    except BaseException as error:  # never fail the epilog: not even on Ctrl-C or timeout
        with contextlib.suppress(Exception):
            what = "out of time" if isinstance(error, _OutOfTime) else repr(error)
            sys.stderr.write(f"trainmedic report: not delivered ({what})\n")
    raise typer.Exit(0)


class _Refused(Exception):
    """The report's input is garbage: say so, spool nothing, still exit 0."""


def _refuse(message: str) -> NoReturn:
    # Control characters from the input must not reach the epilog log raw either.
    raise _Refused("".join(c if c.isprintable() else "?" for c in message))


def register(app: typer.Typer) -> None:
    """Add `trainmedic report` to the root app."""
    app.command("report")(report)
