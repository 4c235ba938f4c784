"""Helpers the lab benchmarks share: output, percentiles, lab idling, a run on a fresh
Temporal dev server and lab, clean exits."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trainmedic import procs
from trainmedic.domain.incident import IncidentSignal
from trainmedic.lab import Lab, faults, find_free_port_base
from trainmedic.temporal.devserver import DevServer


def say(text: str) -> None:
    print(text, flush=True)


def pct(values: list[float], q: float) -> float:
    """Percentile with linear interpolation (q in 0..100)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


async def wait_lab_idle(lab: Lab, nodes: int, timeout: float, *, no_jobs: bool = False) -> None:
    """Every node back to IDLE (and, with `no_jobs`, nothing left in the queue)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = lab.run_client(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout
        states = [line.split()[1] for line in out.splitlines() if line.strip()]
        idle = len(states) >= nodes and all(s == "idle" for s in states)
        if idle and no_jobs:
            idle = not lab.run_client(["squeue", "-h", "-o", "%i"], check=False).stdout.strip()
        if idle:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError("the lab's nodes did not all return to IDLE")


def sigterm_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the same clean-up path as Ctrl-C


def exit_code(code: int, runner: threading.Thread) -> int:
    if runner.is_alive():
        # The worker did not shut down (its threads would keep the interpreter alive);
        # everything it used is already stopped and removed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


class Outcome(Protocol):
    """What a bench thread hands the main thread (at least)."""

    error: BaseException | None
    finished: threading.Event


@dataclass
class LabRun:
    """How a `run_on_lab` ended: exit code (130 on Ctrl-C), the bench's thread, start."""

    code: int
    runner: threading.Thread
    began: float

    def wall_s(self) -> float:
        return time.monotonic() - self.began

    def failure(self, outcome: Outcome, results: Sized, after: str = "") -> int | None:
        """The exit code if the run failed or measured nothing (saying why), else None."""
        if outcome.error is not None and self.code != 130:
            say(f"failed{after}: {outcome.error!r}")
        if self.code != 0 or not results:
            return exit_code(self.code or 1, self.runner)
        return None

    def exit(self) -> int:
        return exit_code(0, self.runner)


def run_on_lab(
    bench: Callable[[DevServer, Lab, Path], Coroutine[Any, Any, None]],
    outcome: Outcome,
    ready: str,
    *,
    nodes: int,
    **lab_options: Any,
) -> LabRun:
    """Run `bench(server, lab, state_dir)` on its own Temporal dev server and `nodes`-node
    lab (8 GPUs each), on free ports in a temp dir, until `outcome.finished`; then stop
    and remove everything, on success, failure and Ctrl-C (SIGTERM counts as Ctrl-C).

    The event loop (and the Temporal worker) run in a thread of their own, so that Ctrl-C
    always reaches this one and the clean-up runs whatever the loop does. `ready` is said
    once both are up; `lab_options` go to `Lab.up`.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, sigterm_as_interrupt)

    tmp = Path(tempfile.mkdtemp(prefix="trainmedic-bench-"))
    server = DevServer(tmp / "temporal", port=procs.free_port(), ui_port=procs.free_port())
    lab = Lab(tmp / "lab", port_base=find_free_port_base(nodes + 2))

    def run() -> None:
        try:
            asyncio.run(bench(server, lab, tmp / "state"))
        except BaseException as error:
            outcome.error = outcome.error or error
        finally:
            outcome.finished.set()

    runner = threading.Thread(target=run, daemon=True)
    began = time.monotonic()
    try:
        say(f"starting a Temporal dev server on {server.address} and a {nodes}-node lab")
        server.start(timeout_s=90)
        lab.up(nodes=nodes, gpus=8, **lab_options)
        say(f"ready after {time.monotonic() - began:.1f} s; {ready}")
        runner.start()
        while not outcome.finished.wait(0.5):
            pass
    except KeyboardInterrupt:
        say("interrupted; cleaning up")
        code = 130
    else:
        code = 1 if outcome.error else 0
    finally:
        lab.down()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if runner.is_alive():
        runner.join(10)
    return LabRun(code, runner, began)


def xid79(node: str) -> IncidentSignal:
    """What the node agent would report: the kernel's Xid 79 line for GPU 0 of `node`."""
    return faults.xid79_signal(node, gpu=0)
