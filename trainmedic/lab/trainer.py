"""The lab's fake distributed trainer: one task per node, run by `srun` inside the job.

It behaves like a torchrun/PyTorch job as far as trainmedic can see: one progress line
per step with a `[rankN]:` prefix, periodic checkpoints written atomically by rank 0,
resume from the newest checkpoint after a requeue, and, when `trainmedic lab inject`
asks (see `faults`), the log lines, kernel lines and exit codes of real failures. No
torch, no GPU: it sleeps through its steps.

Ranks do not talk to each other; they share small marker files under
`<lab root>/jobs/run-<job>-<restart>/` so that one rank's death makes the others time
out "in the next collective" as NCCL's watchdog would, and a hang stops everyone.

This program writes its output with `print` on purpose: its stdout *is* the job log.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import resource
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

from trainmedic.lab import faults
from trainmedic.lab.faults import Fault

_WATCHDOG_TIMEOUT_MS = 600000


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        env = os.environ
        self.rank = int(env.get("SLURM_PROCID", "0"))
        self.world = int(env.get("SLURM_NTASKS", "1"))
        self.local_rank = int(env.get("SLURM_LOCALID", "0"))
        self.job_id = env.get("SLURM_JOB_ID", "local")
        self.node = env.get("SLURMD_NODENAME") or os.uname().nodename
        self.restart = int(env.get("SLURM_RESTART_COUNT", "0") or 0)
        self.steps: int = args.steps
        self.step_seconds: float = args.step_seconds
        self.ckpt_every: int = args.ckpt_every
        self.ckpt_dir = Path(args.ckpt_dir)
        self.lab_root = Path(args.lab_root)
        self.cascade_seconds: float = args.cascade_seconds or max(1.0, 2 * self.step_seconds)
        self.run_dir = self.lab_root / "jobs" / f"run-{self.job_id}-{self.restart}"
        self.seq = 0  # NCCL collective sequence number, one allreduce per step

    # ---------------------------------------------------------------- output

    def out(self, text: str, *, err: bool = False) -> None:
        stream = sys.stderr if err else sys.stdout
        for line in text.splitlines():
            print(f"[rank{self.rank}]: {line}", file=stream, flush=True)

    def glog(self, source: str) -> str:
        """PyTorch's C++ log header: `[E1016 04:12:55.883417112 ProcessGroupNCCL.cpp:616]`."""
        now = datetime.now(UTC)
        return f"[E{now:%m%d %H:%M:%S}.{now.microsecond:06d}000 {source}]"

    # ------------------------------------------------------------ checkpoint

    def latest_checkpoint(self) -> int:
        best = 0
        with contextlib.suppress(OSError):
            for path in self.ckpt_dir.iterdir():
                name = path.name
                if name.startswith("step-") and name[5:].isdigit():
                    best = max(best, int(name[5:]))
        return best

    def save(self, step: int) -> None:
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        final = self.ckpt_dir / f"step-{step}"
        tmp = self.ckpt_dir / f".step-{step}.tmp"
        tmp.write_text(f"job={self.job_id} restart={self.restart} step={step}\n")
        os.replace(tmp, final)  # readers never see half a checkpoint
        self.out(f"saved checkpoint at step {step}")

    # ------------------------------------------------------------------ main

    def run(self) -> int:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        start = self.latest_checkpoint()
        if start:
            self.out(f"resuming from checkpoint step {start}")
        else:
            self.out("no checkpoint found, starting from step 0")
        self.out(
            f"world_size={self.world} rank={self.rank} local_rank={self.local_rank}"
            f" node={self.node} job={self.job_id} restart={self.restart}"
        )
        rng = random.Random(self.rank)
        for step in range(start + 1, self.steps + 1):
            request = faults.claim_fault(
                self.lab_root, self.node, self.job_id, f"{self.job_id}.{self.rank}"
            )
            if request is not None:
                self.play(Fault(request["fault"]), str(request.get("token", "")))
            self.check_peers()
            time.sleep(self.step_seconds)
            self.seq += 1
            loss = 2.5 * math.exp(-step / 300) + 0.8 + rng.uniform(-0.02, 0.02)
            rate = 1.0 / self.step_seconds if self.step_seconds > 0 else 0.0
            self.out(f"step {step}/{self.steps} | loss {loss:.4f} | {rate:.1f} it/s")
            if self.rank == 0 and self.ckpt_every > 0 and step % self.ckpt_every == 0:
                self.save(step)
        self.out("training complete")
        return 0

    # ----------------------------------------------------------------- peers

    def mark(self, what: str) -> None:
        (self.run_dir / f"rank{self.rank}.{what}").write_text(f"{time.time()}\n")

    def check_peers(self) -> None:
        markers = {p.name for p in self.run_dir.glob("rank*.*")}
        mine = {f"rank{self.rank}.failed", f"rank{self.rank}.hung"}
        if any(m.endswith(".hung") for m in markers - mine):
            self.hang()
        if any(m.endswith(".failed") for m in markers - mine):
            self.watchdog_timeout()

    def hang(self) -> NoReturn:
        # Blocked in a collective: alive, silent, until Slurm or trainmedic ends it.
        while True:
            time.sleep(3600)

    def watchdog_timeout(self) -> NoReturn:
        """A peer died: our next allreduce never completes; NCCL's watchdog aborts us."""
        time.sleep(self.cascade_seconds)
        seq = self.seq + 1
        ran = _WATCHDOG_TIMEOUT_MS + random.randint(40, 400)
        work = (
            f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576,"
            f" Timeout(ms)={_WATCHDOG_TIMEOUT_MS})"
        )
        caught = (
            f"[Rank {self.rank}] Watchdog caught collective operation timeout: {work}"
            f" ran for {ran} milliseconds before timing out."
        )
        pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {self.rank}]"
        lines = [
            f"{self.glog('ProcessGroupNCCL.cpp:616')} {caught}",
            f"{self.glog('ProcessGroupNCCL.cpp:1785')} {pg} Exception (either an error or"
            f" timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq},"
            f" last completed NCCL work: {seq - 1}.",
            f"{self.glog('ProcessGroupNCCL.cpp:630')} [Rank {self.rank}] Some NCCL operations"
            " have failed or timed out. Due to the asynchronous nature of CUDA kernels,"
            " subsequent GPU operations might run on corrupted/incomplete data.",
            f"{self.glog('ProcessGroupNCCL.cpp:636')} [Rank {self.rank}] To avoid data"
            " inconsistency, we are taking the entire process down.",
        ]
        # torch prints these without a rank prefix: PyTorch prefixes each line
        # itself, and std::terminate's message bypasses it.
        for line in lines:
            print(f"[rank{self.rank}]:{line}", file=sys.stderr, flush=True)
        print(
            "terminate called after throwing an instance of 'c10::DistBackendError'\n"
            f"  what():  {pg} Process group watchdog thread terminated with exception: {caught}",
            file=sys.stderr,
            flush=True,
        )
        # SIGABRT like the real thing, without leaving a core file in the lab.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.abort()

    # ---------------------------------------------------------------- faults

    def play(self, fault: Fault, token: str) -> None:
        pid = os.getpid()
        gpu = self.local_rank
        kernel = faults.kernel_lines(fault, pid=pid, node=self.node, gpu=gpu)
        record = {
            "token": token,
            "fault": fault.value,
            "job_id": self.job_id,
            "rank": self.rank,
            "node": self.node,
            "pid": pid,
            "gpu": gpu,
            "at": time.time(),
        }
        if fault is Fault.NODE_DEATH:
            return  # the injector kills the node; nothing for us to do
        if fault is Fault.HANG:
            faults.record_fault(self.lab_root, self.node, record)
            self.mark("hung")
            self.hang()
        # The hardware speaks first: kernel lines and NVML state appear before the
        # application notices.
        faults.append_kernel(self.lab_root, self.node, kernel)
        faults.update_nvml(self.lab_root, self.node, gpu, fault)
        faults.record_fault(self.lab_root, self.node, record)
        self.mark("failed")
        if fault is Fault.HOST_OOM:
            os.kill(pid, signal.SIGKILL)
            time.sleep(10)  # not reached
        self.die(fault)

    def traceback(self, frames: list[tuple[str, int, str, str]], last: str) -> None:
        lines = ["Traceback (most recent call last):"]
        for file, line, func, code in frames:
            lines.append(f'  File "{file}", line {line}, in {func}')
            lines.append(f"    {code}")
        lines.append(last)
        self.out("\n".join(lines), err=True)

    def die(self, fault: Fault) -> NoReturn:
        train = "/workspace/train.py"
        step_frames = [
            (train, 412, "<module>", "main()"),
            (train, 388, "main", "loss = train_step(model, batch, optimizer)"),
        ]
        cuda_hint = (
            "CUDA kernel errors might be asynchronously reported at some other API call,"
            " so the stacktrace below might be incorrect.\n"
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
        )
        match fault:
            case Fault.XID79:
                self.traceback(
                    [*step_frames, (train, 301, "train_step", "loss.backward()")],
                    "RuntimeError: CUDA error: unspecified launch failure",
                )
                self.out(cuda_hint, err=True)
            case Fault.ECC:
                self.traceback(
                    [*step_frames, (train, 297, "train_step", "logits = model(**batch)")],
                    "RuntimeError: CUDA error: uncorrectable ECC error encountered",
                )
                self.out(cuda_hint, err=True)
            case Fault.NCCL_CASCADE:
                self.traceback(
                    [*step_frames, (train, 305, "train_step", "optimizer.step()")],
                    "RuntimeError: CUDA error: an illegal memory access was encountered",
                )
                self.out(cuda_hint, err=True)
            case Fault.CUDA_OOM:
                self.traceback(
                    [*step_frames, (train, 297, "train_step", "logits = model(**batch)")],
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
                    f" GPU {self.local_rank} has a total capacity of 79.11 GiB of which"
                    " 1.12 GiB is free. Including non-PyTorch memory, this process has"
                    " 77.98 GiB memory in use. Of the allocated memory 75.31 GiB is allocated"
                    " by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated.",
                )
            case Fault.USER_EXCEPTION:
                self.traceback(
                    [
                        *step_frames,
                        (train, 290, "train_step", 'labels = batch["labels"]'),
                    ],
                    "KeyError: 'labels'",
                )
            case _:
                self.out(f"unexpected fault {fault.value}", err=True)
        sys.exit(1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--lab-root", required=True)
    parser.add_argument(
        "--cascade-seconds",
        type=float,
        default=0.0,
        help="how long peers 'wait in the collective' before the watchdog fires",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    # Default SIGTERM handling would print nothing; Slurm's scancel/requeue sends it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return Trainer(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
