"""The `trainmedic` command. Each verb group lives in its own module.

The modules are imported when their verb runs, not before: `trainmedic --help` and the
Slurm epilog's `trainmedic report` (run at every job end) must not pay for the Temporal
client, the audit reader or the lab. The root's help lists each verb from `VERBS` below;
tests/unit/test_cli_imports.py checks that listing against the modules' own help.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand, TyperGroup

from trainmedic import __version__
from trainmedic.errors import TrainmedicError

if TYPE_CHECKING:
    from typer._click import Command, Context, HelpFormatter

# Each root verb, in `trainmedic --help` order: the module under trainmedic.cli that
# defines it (with `register(app)`, or as its `app` group), and its line in that help
# (the first paragraph of the verb's own help).
VERBS: dict[str, tuple[str, str]] = {
    "attribute": (
        "attribute",
        "Diagnose failure logs: category, action, culprit and the evidence lines.",
    ),
    "up": (
        "up",
        "The main job on the embedded default: Temporal dev server, Slurm lab, controller.",
    ),
    "worker": (
        "up",
        "Run the controller (worker and watchers) against the configured Temporal and Slurm.",
    ),
    "demo": ("demo", "The main job's story: training, a fault, and trainmedic recovering it."),
    "report": (
        "report",
        "Report a job's end (Slurm epilog) or a node failure (strigger) to the controller.",
    ),
    "status": (
        "status",
        "The cluster at a glance: mode, breaker, nodes held out, open incidents and\n"
        "approvals, and the last day's detection, recovery and goodput figures.",
    ),
    "recover": (
        "status",
        "Open an incident for a job by hand (or add your report to the one already open).",
    ),
    "server": ("server", "The embedded Temporal dev server (SQLite under the state directory)."),
    "lab": ("lab", "A real Slurm cluster on this machine, for trying and testing."),
    "config": (
        "config",
        "Check and show configuration (environment TRAINMEDIC_* + policy file).",
    ),
    "incidents": (
        "incidents",
        "Incidents (one RecoveryWorkflow each): list, show, approve or reject, set the mode; "
        "release a quarantined node.",
    ),
    "nodes": (
        "nodes",
        "Nodes trainmedic holds out (one NodeQuarantineWorkflow each): list, release.",
    ),
    "audit": (
        "audit",
        "The audit trail: every decision and effect, read from workflow histories.",
    ),
    "deploy": (
        "deploy",
        "Bare-metal deployment helpers: the Slurm hooks (epilog line, strigger triggers).",
    ),
    "setup": ("setup", "Prepare external services for trainmedic."),
    "advice": (
        "advice",
        "Advice review: how often trainmedic's advice matched what operators did, and which "
        "action kinds have earned more autonomy.",
    ),
    "mode": (
        "advice",
        "The cluster's autonomy per action kind (the cluster's own mode: `trainmedic "
        "incidents mode`).",
    ),
    "attribution": ("attribute", "Measure the attribution engine on labelled cases."),
}


def load_verbs(module: str) -> dict[str, Command]:
    """Import trainmedic.cli.`module` and build the root verbs it defines."""
    found = importlib.import_module(f"trainmedic.cli.{module}")
    holder = typer.Typer()
    register = getattr(found, "register", None)
    if register is not None:
        register(holder)
    else:
        holder.add_typer(found.app, name=next(n for n, (m, _) in VERBS.items() if m == module))
    return dict(typer.main.get_group(holder).commands)


class _Verbs(MutableMapping[str, "Command"]):
    """The root's commands: every name in `VERBS`, its module imported on first use."""

    def __init__(self) -> None:
        self.loaded: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self.loaded:
            if name not in VERBS:
                raise KeyError(name)
            for verb, command in load_verbs(VERBS[name][0]).items():
                self.loaded.setdefault(verb, command)
        return self.loaded[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self.loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self.loaded[name]

    def __iter__(self) -> Iterator[str]:
        yield from VERBS
        yield from (name for name in self.loaded if name not in VERBS)

    def __len__(self) -> int:
        return len(VERBS) + sum(name not in VERBS for name in self.loaded)


class LazyGroup(TyperGroup):
    """A root group whose verbs are imported when run; its help lists them from `VERBS`."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        verbs = _Verbs()
        verbs.loaded.update(self.commands)
        self.commands = verbs
        self._listing = False

    def list_commands(self, ctx: Context) -> list[str]:
        return list(self.commands)  # the names only: nothing imported

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if self._listing and isinstance(self.commands, _Verbs):
            loaded = self.commands.loaded.get(cmd_name)
            if loaded is None and cmd_name in VERBS:
                return TyperCommand(cmd_name, help=VERBS[cmd_name][1])
            return loaded
        return super().get_command(ctx, cmd_name)

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="trainmedic",
    cls=LazyGroup,
    help="Keeps distributed GPU training running on Slurm: detect, attribute, isolate, act.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


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
        from rich.console import Console

        Console(stderr=True).print(f"[bold red]error:[/] {error}", highlight=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
