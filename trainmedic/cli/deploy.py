"""`trainmedic deploy`: what a bare-metal install adds to Slurm (DESIGN "Where it runs").

`deploy slurm-hooks` prints the `EpilogSlurmctld=` line for slurm.conf and the
`strigger` registrations for node down/fail, as commands to paste. With `--install` it
writes the two trigger programs and registers the triggers itself (strigger needs
SlurmUser or root; registering twice keeps the first), but it never edits slurm.conf:
that file belongs to the site's configuration management, and a wrong line there stops
slurmctld. It says what to add instead, and whether the file already has it.
"""

from __future__ import annotations

import asyncio
import os
import shlex
from pathlib import Path

import typer

from trainmedic.cli.common import console, err_console

app = typer.Typer(
    help="Bare-metal deployment helpers: the Slurm hooks (epilog line, strigger triggers).",
    no_args_is_help=True,
)

DEFAULT_BIN = Path("/opt/trainmedic/bin/trainmedic")
DEFAULT_LIBEXEC = Path("/opt/trainmedic/libexec")
DEFAULT_STATE_DIR = Path("/var/lib/trainmedic")
EPILOG_NAME = "epilog.sh"  # deploy/slurm/epilog.sh
STRIGGER_TIMEOUT_S = 15.0


def epilog_line(libexec: Path) -> str:
    return f"EpilogSlurmctld={libexec / EPILOG_NAME}"


def trigger_programs(libexec: Path) -> dict[str, Path]:
    """The programs strigger runs (deploy/slurm/trainmedic-node-{down,fail}.sh)."""
    return {kind: libexec / f"trainmedic-{kind}.sh" for kind in ("node-down", "node-fail")}


def strigger_argvs(libexec: Path) -> list[list[str]]:
    """The registrations, as argv lists (what `register_node_triggers` runs)."""
    programs = trigger_programs(libexec)
    return [
        ["strigger", "--set", "--node", event, f"--program={programs[kind]}", "--flags=PERM"]
        for event, kind in (("--down", "node-down"), ("--fail", "node-fail"))
    ]


def configured_epilog(slurm_conf: Path) -> str | None:
    """The EpilogSlurmctld value in `slurm_conf` (keys are case-insensitive), or None."""
    found = None
    for raw in slurm_conf.read_text(errors="replace").splitlines():
        line = raw.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "epilogslurmctld":
            found = value.strip()
    return found


def _say(text: str = "") -> None:
    # Plain text, never wrapped: these lines are pasted into slurm.conf and a shell.
    console.print(text, markup=False, soft_wrap=True)


@app.command("slurm-hooks")
def slurm_hooks(
    install: bool = typer.Option(
        False,
        "--install",
        help="Write the trigger programs and register the triggers (as SlurmUser or root). "
        "slurm.conf is never edited.",
    ),
    slurm_conf: Path | None = typer.Option(
        None,
        "--slurm-conf",
        help="slurm.conf to check for the epilog line (and SLURM_CONF for strigger).",
    ),
    trainmedic_bin: Path = typer.Option(
        DEFAULT_BIN, "--bin", help="The trainmedic executable the hooks run."
    ),
    libexec: Path = typer.Option(
        DEFAULT_LIBEXEC, "--libexec", help="Where the epilog and trigger programs live."
    ),
    state_dir: Path | None = typer.Option(
        None,
        "--state-dir",
        help="The controller's state dir (its spool). Default: $TRAINMEDIC_STATE_DIR, "
        f"else {DEFAULT_STATE_DIR}.",
    ),
) -> None:
    """Print (or install) the Slurm hooks: the EpilogSlurmctld line and the strigger triggers."""
    state = state_dir or Path(os.environ.get("TRAINMEDIC_STATE_DIR") or DEFAULT_STATE_DIR)
    for name, path in (("--bin", trainmedic_bin), ("--libexec", libexec), ("--state-dir", state)):
        if not path.is_absolute():
            # slurmctld runs hooks with no PATH and its own working directory.
            err_console.print(f"error: {name} must be an absolute path, not {path}", markup=False)
            raise typer.Exit(2)
    line = epilog_line(libexec)
    _say("# slurm.conf, on the slurmctld host (then `scontrol reconfigure`):")
    _say(line)
    _say(f"# {libexec / EPILOG_NAME}: deploy/slurm/epilog.sh, with")
    _say(f"#   TRAINMEDIC_BIN={trainmedic_bin} TRAINMEDIC_STATE_DIR={state}")
    _say()
    _say("# node down/fail triggers, once, as SlurmUser or root (PERM: kept after firing):")
    for argv in strigger_argvs(libexec):
        _say(shlex.join(argv))
    _say(shlex.join(["strigger", "--get", "--node"]) + "   # check")
    _say()
    _say(
        f"# The reports land in {state}/spool/reports, which the controller reads only "
        "from root, its own user or TRAINMEDIC_SPOOL_OWNERS (see docs/deploy.md)."
    )
    epilog_state = _check_slurm_conf(slurm_conf, line) if slurm_conf else None
    if not install:
        return
    failed = _install(slurm_conf, trainmedic_bin, libexec, state)
    _say()
    if epilog_state != "ok":
        _say("# slurm.conf was not edited (trainmedic never edits it); add:")
        _say(line)
    if failed:
        raise typer.Exit(1)


def _check_slurm_conf(slurm_conf: Path, line: str) -> str:
    """Say whether `slurm_conf` has our epilog line: 'ok', 'missing' or 'other'."""
    try:
        current = configured_epilog(slurm_conf)
    except OSError as error:
        err_console.print(
            f"error: cannot read {slurm_conf}: {error.strerror or error}", markup=False
        )
        raise typer.Exit(2) from None
    wanted = line.partition("=")[2]
    _say()
    if current == wanted:
        _say(f"# {slurm_conf}: EpilogSlurmctld is set to trainmedic's epilog already")
        return "ok"
    if current is None:
        _say(f"# {slurm_conf}: no EpilogSlurmctld yet; add the line above")
        return "missing"
    # Slurm 22.05 takes one EpilogSlurmctld; an existing one must call ours itself.
    _say(
        f"# {slurm_conf}: EpilogSlurmctld={current} already; have that script also run "
        f"{wanted} (exit status ignored)"
    )
    return "other"


def _install(slurm_conf: Path | None, trainmedic_bin: Path, libexec: Path, state: Path) -> bool:
    """Write the trigger programs and register them; True when something failed."""
    from trainmedic.adapters.slurm.errors import SlurmError
    from trainmedic.adapters.slurm.runner import LocalRunner
    from trainmedic.watchers.epilog import install_trigger_scripts, register_node_triggers

    if not trainmedic_bin.exists():
        err_console.print(
            f"warning: {trainmedic_bin} does not exist (yet); the hooks run it", markup=False
        )
    try:
        programs = install_trigger_scripts(libexec, str(trainmedic_bin), state)
    except OSError as error:
        err_console.print(
            f"error: cannot write the trigger programs into {libexec}: {error}", markup=False
        )
        return True
    env = {"SLURM_CONF": str(slurm_conf)} if slurm_conf else None
    try:
        results = asyncio.run(
            register_node_triggers(
                LocalRunner(env=env),
                programs["node-down"],
                programs["node-fail"],
                timeout=STRIGGER_TIMEOUT_S,
            )
        )
    except SlurmError as error:
        err_console.print(f"error: {error}", markup=False)
        return True
    _say()
    for kind, path in programs.items():
        _say(f"# wrote {path} ({kind})")
    failed = False
    for result in results:
        if result.returncode == 0:
            _say(f"# registered: {shlex.join(result.argv)}")
        else:
            failed = True
            why = " ".join(result.stderr.split())[:300] or f"exit status {result.returncode}"
            err_console.print(
                f"error: {shlex.join(result.argv)} failed: {why} "
                "(strigger needs SlurmUser or root)",
                markup=False,
            )
    if not results:
        _say("# triggers already registered for these programs: nothing to do")
    return failed
