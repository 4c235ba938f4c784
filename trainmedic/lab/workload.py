"""A training job for the lab that fails on purpose.

`submit_training` puts the fake trainer (`trainmedic.lab.trainer`) on N lab nodes with
sbatch, one task per node; `inject` makes it fail the way real jobs fail (see
`trainmedic.lab.faults` for the shapes and the file protocol).

Paths: job output `<lab root>/jobs/train-<jobid>.out`, checkpoints
`<lab root>/jobs/ckpt-<name>/step-<n>`, per node `<lab root>/nodes/<node>/kern.log`
(what the node agent tails) and `nvml.json` (what `FakeNvml` reads).
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

from trainmedic.domain.hostlist import HostlistError, validate_node_name
from trainmedic.lab import faults
from trainmedic.lab.faults import Fault
from trainmedic.lab.lab import Lab, LabError

log = logging.getLogger(__name__)

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class TrainingSpec(BaseModel):
    nodes: int = Field(2, ge=1, le=99)
    steps: int = Field(1000, ge=1)
    step_seconds: float = Field(0.5, ge=0.0, le=600)
    ckpt_every: int = Field(10, ge=0)
    name: str = Field("train", min_length=1, max_length=64)
    # How long surviving ranks "block in the collective" before their watchdog fires
    # (a real one waits 10 min); 0 = twice the step time, at least 1 s.
    cascade_seconds: float = Field(0.0, ge=0.0)
    nodelist: list[str] = Field(default_factory=list)  # pin to these nodes (sbatch -w)
    # --open-mode=append: a requeued run adds to the log instead of truncating it, so
    # the earlier runs' errors stay in the file (as many sites configure it).
    append_log: bool = False


class Injection(BaseModel):
    """What `inject` did: when it asked, and when (and by which task) the fault happened."""

    fault: Fault
    node: str
    job_id: str | None = None
    token: str
    requested_at: datetime
    happened_at: datetime | None = None  # when the trainer played it out (or the node died)
    rank: int | None = None
    pid: int | None = None
    killed_pids: list[int] = Field(default_factory=list)


def checkpoint_dir(lab: Lab, name: str) -> Path:
    return lab.layout.jobs / f"ckpt-{name}"


def job_output(lab: Lab, job_id: str) -> Path:
    return lab.layout.jobs / f"train-{job_id}.out"


def kernel_log(lab: Lab, node: str) -> Path:
    return faults.node_dir(lab.root, node) / faults.KERNEL_LOG


def nvml_state(lab: Lab, node: str) -> Path:
    return faults.node_dir(lab.root, node) / faults.NVML_STATE


def lab_nodes(lab: Lab) -> list[str]:
    spec = lab.spec
    if spec is None:
        raise LabError(f"no lab in {lab.root}; start one with `trainmedic lab up`")
    return spec.node_names


def prepare_nodes(lab: Lab) -> None:
    """Give every lab node its kernel log and fake-GPU state, so agents can follow them."""
    spec = lab.spec
    if spec is None:
        raise LabError(f"no lab in {lab.root}; start one with `trainmedic lab up`")
    for node in spec.node_names:
        directory = faults.node_dir(lab.root, node)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / faults.KERNEL_LOG).touch()
        state = directory / faults.NVML_STATE
        if not state.exists():
            faults.write_json_atomic(state, faults.default_nvml_state(node, spec.gpus))


def reset_nodes(lab: Lab) -> None:
    """Healthy fake GPUs again and no pending fault (after a test or a demo)."""
    spec = lab.spec
    if spec is None:
        return
    for node in spec.node_names:
        directory = faults.node_dir(lab.root, node)
        (directory / faults.FAULT_FILE).unlink(missing_ok=True)
        if directory.exists():
            faults.write_json_atomic(
                directory / faults.NVML_STATE, faults.default_nvml_state(node, spec.gpus)
            )


def clear_faults(lab: Lab) -> list[str]:
    """Every lab node as if no fault had ever been injected, as after a repair and a
    reboot: no pending request, healthy fake GPUs, an empty kernel log, no fault records.

    Returns the nodes that still showed an earlier fault. The kernel log is truncated in
    place, which a node agent following it handles (it reads a truncated file from the
    start); `reset_nodes` keeps it, for tests that read what their fault wrote.
    """
    spec = lab.spec
    if spec is None:
        return []
    touched = []
    healthy = {node: faults.default_nvml_state(node, spec.gpus) for node in spec.node_names}
    for node in spec.node_names:
        directory = faults.node_dir(lab.root, node)
        kern, records = directory / faults.KERNEL_LOG, directory / faults.FAULT_RECORDS
        state = directory / faults.NVML_STATE
        try:
            faulty_gpus = json.loads(state.read_text()) != healthy[node]
        except (OSError, ValueError):
            faulty_gpus = state.exists()
        if (
            (directory / faults.FAULT_FILE).exists()
            or faulty_gpus
            or (kern.exists() and kern.stat().st_size > 0)
            or records.exists()
        ):
            touched.append(node)
        if kern.exists():
            kern.write_bytes(b"")
        records.unlink(missing_ok=True)
    reset_nodes(lab)
    return touched


def training_script(lab: Lab, spec: TrainingSpec) -> str:
    argv = [
        sys.executable,
        "-m",
        "trainmedic.lab.trainer",
        "--steps",
        str(spec.steps),
        "--step-seconds",
        str(spec.step_seconds),
        "--ckpt-every",
        str(spec.ckpt_every),
        "--ckpt-dir",
        str(checkpoint_dir(lab, spec.name)),
        "--lab-root",
        str(lab.root),
        "--cascade-seconds",
        str(spec.cascade_seconds),
    ]
    # exec: the job's exit status is srun's, which reports the worst task. No
    # --kill-on-bad-exit: surviving ranks must live on to time out like NCCL's do.
    return (
        "#!/bin/bash\n"
        "# Written by `trainmedic lab train`: a fake multi-node training job.\n"
        f"exec srun --ntasks-per-node=1 {shlex.join(argv)}\n"
    )


def submit_training(lab: Lab, spec: TrainingSpec | None = None) -> str:
    """sbatch the fake trainer; returns the job id."""
    spec = spec or TrainingSpec()
    if not set(spec.name) <= _NAME_CHARS:
        raise LabError(f"job name {spec.name!r}: use letters, digits, '-', '_' and '.'")
    prepare_nodes(lab)
    jobs = lab.layout.jobs
    jobs.mkdir(parents=True, exist_ok=True)
    script = jobs / f"train-{spec.name}.sh"
    script.write_text(training_script(lab, spec))
    argv = [
        "sbatch",
        "--parsable",
        "--job-name",
        spec.name,
        "--nodes",
        str(spec.nodes),
        "--ntasks-per-node",
        "1",
        "--requeue",
        "--chdir",
        str(jobs),
        "--output",
        f"{jobs}/train-%j.out",
    ]
    if spec.nodelist:
        argv += ["--nodelist", ",".join(spec.nodelist)]
    if spec.append_log:
        argv.append("--open-mode=append")
    argv.append(str(script))
    out = lab.run_client(argv).stdout.strip()
    job_id = out.split(";", 1)[0]
    if not job_id.isdigit():
        raise LabError(f"sbatch said {out!r}, not a job id")
    log.info("submitted training job %s (%s on %d nodes)", job_id, spec.name, spec.nodes)
    return job_id


def inject(
    lab: Lab,
    fault: Fault | str,
    node: str,
    job_id: str | None = None,
    *,
    wait: float = 15.0,
) -> Injection:
    """Make the training task on `node` fail as `fault` does in real life.

    Waits up to `wait` seconds for the task to play it out (it checks once per step)
    and returns when it did; with `wait=0` returns at once. A request nobody takes is
    withdrawn, so it cannot surprise a later job; LabError says so.
    """
    fault = Fault(fault)
    try:
        validate_node_name(node)
    except HostlistError as error:
        raise LabError(str(error)) from None
    if node not in lab_nodes(lab):
        raise LabError(f"no node {node!r} in this lab")
    token = uuid.uuid4().hex[:12]
    requested = datetime.now(UTC)
    if fault is Fault.NODE_DEATH:
        # Silent: no log line, no kernel line; only Slurm notices (after SlurmdTimeout).
        killed = lab.kill_node(node)
        return Injection(
            fault=fault,
            node=node,
            job_id=job_id,
            token=token,
            requested_at=requested,
            happened_at=datetime.now(UTC),
            killed_pids=killed,
        )
    faults.request_fault(lab.root, node, fault, token, job_id)
    result = Injection(fault=fault, node=node, job_id=job_id, token=token, requested_at=requested)
    if wait <= 0:
        return result
    deadline = time.monotonic() + wait
    extended = False
    while True:
        record = faults.find_record(lab.root, node, token)
        if record is not None:
            return result.model_copy(
                update={
                    "job_id": str(record.get("job_id") or job_id or "") or None,
                    "happened_at": datetime.fromtimestamp(float(record["at"]), UTC),
                    "rank": record.get("rank"),
                    "pid": record.get("pid"),
                }
            )
        if time.monotonic() >= deadline:
            if faults.withdraw_fault(lab.root, node, token):
                whose = f"job {job_id}'s" if job_id else "training"
                raise LabError(
                    f"no {whose} task on {node} took the {fault.value} fault within {wait:.0f} s"
                    " (is `trainmedic lab train` running there?); request withdrawn"
                )
            if extended:
                raise LabError(
                    f"the {fault.value} fault on {node} was claimed but never played out"
                )
            # Claimed at the last moment: its record follows within a moment.
            extended = True
            deadline = time.monotonic() + 5.0
        time.sleep(0.05)
