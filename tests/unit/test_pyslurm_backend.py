"""The pyslurm backend without a cluster: the refusal when pyslurm cannot serve (missing,
or built for another Slurm release), the mapping of pyslurm's objects, and the libslurm
call each scontrol/scancel request becomes. A fake module stands in for pyslurm (the
real one runs against the 25.11 lab in tests/integration, under `make test-pyslurm`)."""

from __future__ import annotations

import importlib
import types
from pathlib import Path
from typing import Any

import pytest

from trainmedic.adapters.slurm import JobStateConflict, NoSuchJob
from trainmedic.adapters.slurm import pyslurm_backend as pb
from trainmedic.adapters.slurm.pyslurm_backend import (
    PySlurmBackend,
    PySlurmUnavailable,
    job_from_pyslurm,
    node_from_pyslurm,
)
from trainmedic.config import Settings
from trainmedic.workers.controller import slurm_backend


class FakeRPCError(Exception):
    def __init__(self, msg: str) -> None:
        self.msg = msg
        super().__init__(msg)


def fake_job(**overrides: Any) -> types.SimpleNamespace:
    base: dict[str, Any] = {
        "id": 12,
        "array_id": None,
        "array_task_id": None,
        "name": "train",
        "user_name": "alice",
        "partition": "gpu",
        "state": "RUNNING",
        "state_reason": "None",
        "allocated_nodes": "gpu[01-02]",
        "num_nodes": 2,
        "ntasks": 4,
        "ntasks_per_node": 2,
        "excluded_nodes": None,
        "required_nodes": None,
        "comment": "hi",
        "standard_output": "/jobs/12.out",
        "standard_error": "",
        "working_directory": "/jobs",
        "is_requeueable": True,
        "requeue_count": 0,
        "is_batch_job": True,
        "priority": 1,
        "batch_host": "gpu01",
        "exit_code": 0,
        "exit_code_signal": 0,
    }
    base.update(overrides)
    return types.SimpleNamespace(**base)


def fake_node(**overrides: Any) -> types.SimpleNamespace:
    base: dict[str, Any] = {
        "name": "gpu02",
        "state": "IDLE",
        "reason": None,
        "reason_user": None,
        "partitions": ["gpu"],
        "configured_gres": {"gpu": 8},
        "total_cpus": 8,
        "hostname": "localhost",
    }
    base.update(overrides)
    return types.SimpleNamespace(**base)


class Calls:
    """What the fake pyslurm was asked to do, in order."""

    def __init__(self) -> None:
        self.made: list[tuple[Any, ...]] = []


def fake_module(controller: str = "25.11.7", *, jobs: dict[int, Any] | None = None) -> Any:
    calls = Calls()
    jobs = jobs if jobs is not None else {12: fake_job()}
    nodes = {"gpu02": fake_node()}

    class Node:
        def __init__(self, name: str | None = None, **changes: Any) -> None:
            self.name, self.changes = name, changes

        def modify(self, update: Node) -> None:
            calls.made.append(("node", self.name, update.changes))

        @staticmethod
        def load(name: str) -> Any:
            if name not in nodes:
                raise FakeRPCError(f"Node '{name}' does not exist")
            return nodes[name]

    class JobSubmitDescription:
        def __init__(self, **fields: Any) -> None:
            self.fields = fields

    class Job:
        def __init__(self, job_id: int) -> None:
            self.id = job_id

        @staticmethod
        def load(job_id: int) -> Any:
            if job_id not in jobs:
                raise FakeRPCError("Invalid job id specified")
            return jobs[job_id]

        def requeue(self, hold: bool = False) -> None:
            calls.made.append(("requeue", self.id, hold))

        def hold(self) -> None:
            calls.made.append(("hold", self.id))

        def release(self) -> None:
            calls.made.append(("release", self.id))

        def cancel(self) -> None:
            calls.made.append(("cancel", self.id))

        def modify(self, changes: JobSubmitDescription) -> None:
            if jobs[self.id].state == "CANCELLED":
                raise FakeRPCError("Job has already finished")
            calls.made.append(("modify", self.id, changes.fields))

    class Collection(dict[Any, Any]):
        pass

    module = types.ModuleType("pyslurm")
    module.__version__ = "25.11.2"  # type: ignore[attr-defined]
    module.RPCError = FakeRPCError  # type: ignore[attr-defined]
    module.Node = Node  # type: ignore[attr-defined]
    module.Job = Job  # type: ignore[attr-defined]
    module.JobSubmitDescription = JobSubmitDescription  # type: ignore[attr-defined]
    module.Jobs = types.SimpleNamespace(load=lambda: Collection(jobs))  # type: ignore[attr-defined]
    module.Nodes = types.SimpleNamespace(load=lambda: Collection(nodes))  # type: ignore[attr-defined]
    config = types.SimpleNamespace(version=controller)
    module.slurmctld = types.SimpleNamespace(  # type: ignore[attr-defined]
        Config=types.SimpleNamespace(load=lambda: config)
    )
    module.calls = calls  # type: ignore[attr-defined]
    return module


# ----------------------------------------------------------------------------- refusal


@pytest.fixture
def no_pyslurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyslurm does not import here (whether or not this venv has it)."""
    real = importlib.import_module

    def refuse(name: str, package: str | None = None) -> types.ModuleType:
        if name == "pyslurm":
            raise ImportError("No module named 'pyslurm'")
        return real(name, package)

    monkeypatch.setattr(pb, "_loaded", None)
    monkeypatch.setattr(pb.importlib, "import_module", refuse)


@pytest.mark.usefixtures("no_pyslurm")
def test_slurm_access_pyslurm_is_refused_clearly_without_pyslurm(tmp_path: Path) -> None:
    settings = Settings(slurm_access="pyslurm", slurm_conf=tmp_path / "slurm.conf")
    with pytest.raises(PySlurmUnavailable) as refused:
        slurm_backend(settings)
    message = str(refused.value)
    assert "pyslurm does not import" in message and "make test-pyslurm" in message
    assert not refused.value.retryable


async def test_a_pyslurm_for_another_release_is_refused() -> None:
    backend = PySlurmBackend(fake_module(controller="24.11.5"))
    with pytest.raises(PySlurmUnavailable, match=r"built for Slurm 25\.11.*slurmctld is 24\.11"):
        await backend.version()
    with pytest.raises(PySlurmUnavailable):
        await backend.list_jobs()  # no read either
    backend.close()


async def test_the_matching_release_is_accepted() -> None:
    backend = PySlurmBackend(fake_module(controller="25.11.7"))
    assert str(await backend.version()) == "25.11.7"
    backend.close()


# ----------------------------------------------------------------------------- objects


def test_jobs_read_like_scontrol() -> None:
    job = job_from_pyslurm(fake_job())
    assert job.job_id == "12" and job.nodes == ["gpu01", "gpu02"] and job.is_running
    assert job.tasks_per_node == 2 and job.state_reason is None
    assert job.stderr_path == job.stdout_path == "/jobs/12.out"  # unset stderr: stdout
    assert job.exit is not None and job.exit.success
    # pyslurm gives the description; scontrol prints it with '_' for spaces
    held = job_from_pyslurm(
        fake_job(state="PENDING", state_reason="job requeued in held state", priority=0)
    )
    assert held.state_reason == "job_requeued_in_held_state" and held.is_held
    task = job_from_pyslurm(fake_job(id=40, array_id=38, array_task_id=2))
    assert task.job_id == "38_2" and task.numeric_id == 40
    first = job_from_pyslurm(fake_job(id=39, array_id=38, array_task_id=None))
    assert first.job_id == "38_0"  # pyslurm reads task 0 as unset
    meta = job_from_pyslurm(
        fake_job(id=38, array_id=38, array_task_id=None, array_tasks_waiting="3-5", state="PENDING")
    )
    assert meta.job_id == "38_[3-5]"
    signalled = job_from_pyslurm(fake_job(state="FAILED", exit_code=0, exit_code_signal=9))
    assert signalled.exit is not None and signalled.exit.signal == 9
    assert job_from_pyslurm(fake_job(state="REQUEUED")).state == "PENDING"


def test_nodes_read_like_scontrol_and_stale_reasons_are_dropped() -> None:
    drained = node_from_pyslurm(fake_node(state="IDLE+DRAIN", reason="Xid 79", reason_user="root"))
    assert drained.is_drained and drained.reason == "Xid 79" and drained.gres == "gpu:8"
    # Slurm 25.11 keeps the reason after a resume: it no longer explains anything
    resumed = node_from_pyslurm(fake_node(state="IDLE+NOT_RESPONDING", reason="Xid 79"))
    assert resumed.reason is None and resumed.reason_user is None


# ----------------------------------------------------------------------------- effects


async def test_effects_become_libslurm_calls_and_say_so() -> None:
    module = fake_module()
    backend = PySlurmBackend(module)
    drained = await backend.drain_node("gpu02", "trainmedic incident-x-12-1: Xid 79")
    assert drained.command == [
        "pyslurm",
        "scontrol",
        "update",
        "NodeName=gpu02",
        "State=DRAIN",
        "Reason=trainmedic incident-x-12-1: Xid 79",
    ]
    requeued = await backend.requeue("12", hold=True)
    assert requeued.command == ["pyslurm", "scontrol", "requeuehold", "12"]
    await backend.exclude_nodes("12", ["gpu01"])
    await backend.set_comment("12", "a=b c")
    cancelled = await backend.cancel("12")
    assert cancelled.command == ["pyslurm", "scancel", "12"]
    assert module.calls.made == [
        ("node", "gpu02", {"state": "DRAIN", "reason": "trainmedic incident-x-12-1: Xid 79"}),
        ("requeue", 12, True),
        ("modify", 12, {"excluded_nodes": "gpu01"}),
        ("modify", 12, {"comment": "a=b c"}),
        ("cancel", 12),
    ]
    backend.close()


async def test_libslurm_errors_become_the_same_typed_errors() -> None:
    module = fake_module(jobs={12: fake_job(state="CANCELLED")})
    backend = PySlurmBackend(module)
    with pytest.raises(NoSuchJob) as missing:
        await backend.get_job("987654")
    assert not missing.value.retryable and missing.value.argv[0] == "pyslurm"
    with pytest.raises(JobStateConflict, match="already finished"):
        await backend.set_comment("12", "too late")
    backend.close()
