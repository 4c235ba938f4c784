"""Run Slurm commands as local subprocesses (argv only, bounded timeouts)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from trainmedic.adapters.slurm.errors import SlurmCommandNotFound, SlurmTimeout
from trainmedic.adapters.slurm.protocol import CompletedCommand

log = logging.getLogger(__name__)


class LocalRunner:
    """Runs commands on this host.

    `env` is laid over this process's environment (the lab passes `SLURM_CONF`);
    `bin_dir`, when set, is where Slurm's binaries are looked up instead of `PATH`.
    """

    def __init__(self, env: Mapping[str, str] | None = None, bin_dir: Path | None = None) -> None:
        self._env = dict(env) if env is not None else None
        self._bin_dir = bin_dir

    def _argv(self, argv: Sequence[str]) -> list[str]:
        if not argv:
            raise ValueError("empty argv")
        args = [str(a) for a in argv]
        if self._bin_dir is not None and "/" not in args[0]:
            args[0] = str(self._bin_dir / args[0])
        return args

    async def run(self, argv: Sequence[str], timeout: float) -> CompletedCommand:
        args = self._argv(argv)
        env = {**os.environ, **self._env} if self._env is not None else None
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
        except FileNotFoundError as exc:
            raise SlurmCommandNotFound(
                f"{args[0]} not found (is the Slurm client installed?)", argv=list(argv)
            ) from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError as exc:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise SlurmTimeout(
                f"{' '.join(argv)}: no answer within {timeout:g}s", argv=list(argv)
            ) from exc
        duration = time.monotonic() - started
        log.debug("ran %s -> %s in %.3fs", argv, proc.returncode, duration)
        return CompletedCommand(
            argv=list(argv),
            returncode=proc.returncode if proc.returncode is not None else -1,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            duration_s=duration,
        )
