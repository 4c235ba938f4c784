"""Helpers the lab benchmarks share: output, percentiles, lab idling, clean exits."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

from trainmedic.lab import Lab


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
