"""`SlurmBackend` through libslurm in this process, with pyslurm (SLURM_ACCESS=pyslurm).

A library call costs no process start and no JSON round trip per command; on a large
cluster that is most of a watcher cycle (bench/slurm_backend.py). PyPI's pyslurm 25.11.x
builds only against Slurm 25.11 (deploy/lab/build-slurm.sh, deploy/lab/pyslurm-venv.sh),
so the backend refuses to start, with the reason, when pyslurm does not import or was
built for another Slurm release than the slurmctld it talks to.

What it shares with the command-line backend, and why:

- Effects are `SlurmCli`'s own code (re-read first, idempotent, the same conflict
  handling), so both backends behave alike by construction. Only the transport differs:
  the runner below performs each scontrol/scancel request with the matching libslurm
  RPC instead of starting the program. `EffectResult.command` records the request as
  `["pyslurm", "scontrol", "requeue", "12"]`: what was asked, and that no program ran.
- Errors: libslurm's messages are the strings scontrol prints (`slurm_strerror`), so
  the same `classify` turns them into the same typed errors.
- Reads come from pyslurm's objects (no text to parse) and are normalised with the
  command-line parsers' helpers, so states, hostlists and output paths read the same.

pyslurm holds the GIL during each RPC and reads its slurm.conf once per process: calls
run one at a time on one worker thread, and one process talks to one cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from trainmedic.adapters.slurm.cli import SlurmCli, _validate_node, validate_job_id
from trainmedic.adapters.slurm.errors import (
    NoSuchJob,
    NoSuchNode,
    SlurmError,
    SlurmInvalidArgument,
    SlurmTimeout,
    classify,
)
from trainmedic.adapters.slurm.parse import (
    expand_hosts,
    null_text,
    parse_version,
    split_job_state,
    split_node_state,
)
from trainmedic.adapters.slurm.protocol import CompletedCommand
from trainmedic.domain.slurm import (
    EffectResult,
    ExitStatus,
    SlurmJob,
    SlurmNode,
    SlurmVersion,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

INSTALL_HINT = (
    "pyslurm must be built against the Slurm it talks to: `make test-pyslurm` makes "
    ".venv-pyslurm (Slurm 25.11 from ../shared/vendor, then pyslurm==25.11.2), or "
    "SLURM_INCLUDE_DIR=P/include SLURM_LIB_DIR=P/lib pip install 'trainmedic[pyslurm]' "
    "for a Slurm 25.11 installed under P"
)


class PySlurmUnavailable(SlurmError):
    """pyslurm does not import here, or does not match the running Slurm. Not retryable:
    the deployment is wrong, not the cluster."""


# ----------------------------------------------------------------------------- loading

_lock = threading.Lock()
_loaded: tuple[ModuleType, str | None] | None = None


def load_pyslurm(slurm_conf: Path | None = None) -> ModuleType:
    """Import pyslurm and initialise libslurm with `slurm_conf` (else SLURM_CONF or the
    build's default), once per process. Raises `PySlurmUnavailable` with the reason."""
    global _loaded
    conf = str(slurm_conf) if slurm_conf is not None else os.environ.get("SLURM_CONF")
    with _lock:
        if _loaded is not None:
            module, loaded_conf = _loaded
            if conf is not None and loaded_conf is not None and conf != loaded_conf:
                raise PySlurmUnavailable(
                    f"pyslurm in this process already reads {loaded_conf}; libslurm reads "
                    f"one slurm.conf per process, so it cannot also use {conf}"
                )
            return module
        # pyslurm initialises libslurm at import, from SLURM_CONF; we do it ourselves, so
        # the configured file wins over whatever the environment says.
        previous = os.environ.get("PYSLURM_DISABLE_AUTO_INIT")
        os.environ["PYSLURM_DISABLE_AUTO_INIT"] = "1"
        try:
            module = importlib.import_module("pyslurm")
        except ImportError as error:  # not installed, or libslurmfull.so not found
            raise PySlurmUnavailable(
                f"SLURM_ACCESS=pyslurm, but pyslurm does not import here ({error}). " + INSTALL_HINT
            ) from None
        finally:
            if previous is None:
                os.environ.pop("PYSLURM_DISABLE_AUTO_INIT", None)
            else:
                os.environ["PYSLURM_DISABLE_AUTO_INIT"] = previous
        if conf is not None and not Path(conf).is_file():
            raise PySlurmUnavailable(f"slurm.conf {conf} for pyslurm does not exist")
        try:
            module.slurm_init(conf)
        except Exception as error:  # pyslurm raises its own types; keep the message
            raise PySlurmUnavailable(f"libslurm could not read {conf}: {error}") from None
        _loaded = (module, conf)
        log.info("pyslurm %s loaded (slurm.conf %s)", module.__version__, conf or "default")
        return module


def pyslurm_release(module: ModuleType) -> tuple[int, int]:
    """The Slurm release a pyslurm build is for: pyslurm 25.11.2 -> (25, 11)."""
    version = parse_version(str(module.__version__))
    return version.major, version.minor


# ----------------------------------------------------------------------------- objects


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _reason(value: Any) -> str | None:
    """pyslurm gives the job's state description when Slurm set one ("job requeued in
    held state"), else the reason's name; scontrol prints the same text with each space
    made '_' (job_requeued_in_held_state), which is what trainmedic matches on."""
    text = null_text(value)
    return "_".join(text.split()) if text else None


def _gres(value: Any) -> str | None:
    """pyslurm gives configured gres as a dict ({'gpu': 8}); Slurm's text is 'gpu:8'."""
    if isinstance(value, Mapping):
        return ",".join(f"{key}:{count}" for key, count in value.items()) or None
    return null_text(value)


def _job_id(job: Any) -> tuple[str, int | None, int | None]:
    """(job id as squeue prints it, array job id, array task id) of a `pyslurm.Job`."""
    array_job = _int(job.array_id) or None
    array_task = _int(job.array_task_id) if array_job else None
    waiting = null_text(getattr(job, "array_tasks_waiting", None))
    if array_job and array_task is None and not waiting:
        array_task = 0  # pyslurm reads a task id of 0 as "unset"
    if array_job and array_task is not None:
        return f"{array_job}_{array_task}", array_job, array_task
    if array_job and waiting:
        # a pending array's meta record, as squeue
        return f"{array_job}_[{waiting}]", array_job, array_task
    return str(int(job.id)), array_job, array_task


def job_from_pyslurm(job: Any) -> SlurmJob:
    """A `pyslurm.Job` as trainmedic's `SlurmJob`, normalised like scontrol's output."""
    numeric = int(job.id)
    job_id, array_job, array_task = _job_id(job)
    state, flags = split_job_state([str(job.state or "UNKNOWN")])
    code, signal = _int(job.exit_code), _int(job.exit_code_signal)
    stdout = null_text(job.standard_output)
    return SlurmJob(
        job_id=job_id,
        numeric_id=numeric,
        array_job_id=array_job,
        array_task_id=array_task,
        name=str(job.name or ""),
        user=null_text(job.user_name),
        partition=null_text(job.partition),
        state=state,
        state_flags=flags,
        state_reason=_reason(job.state_reason),
        nodes=expand_hosts(null_text(job.allocated_nodes)),
        node_count=_int(job.num_nodes),
        tasks=_int(job.ntasks),
        tasks_per_node=_int(job.ntasks_per_node) or None,
        excluded_nodes=expand_hosts(null_text(job.excluded_nodes)),
        required_nodes=expand_hosts(null_text(job.required_nodes)),
        comment=str(job.comment or ""),
        stdout_path=stdout,
        # Unset stderr goes to the stdout file (as the JSON parser reads it too).
        stderr_path=null_text(job.standard_error) or stdout,
        work_dir=null_text(job.working_directory),
        requeue=_bool(job.is_requeueable),
        restarts=_int(job.requeue_count) or 0,
        batch=_bool(job.is_batch_job),
        priority=_int(job.priority),
        batch_host=null_text(job.batch_host),
        exit=(
            ExitStatus(code=None, signal=signal)
            if signal
            else ExitStatus(code=code, signal=None)
            if code is not None
            else None
        ),
    )


def node_from_pyslurm(node: Any) -> SlurmNode:
    """A `pyslurm.Node` as trainmedic's `SlurmNode` ('IDLE+DRAIN' -> IDLE, [DRAIN])."""
    state, flags = split_node_state([str(node.state or "UNKNOWN")])
    reason = null_text(node.reason)
    return SlurmNode(
        name=str(node.name),
        state=state,
        state_flags=flags,
        reason=reason,
        reason_user=null_text(node.reason_user) if reason else None,
        partitions=[str(p) for p in (node.partitions or [])],
        gres=_gres(node.configured_gres),
        cpus=_int(node.total_cpus),
        hostname=null_text(node.hostname),
        address=null_text(getattr(node, "address", None)),
    )


# ----------------------------------------------------------------------------- transport


def _split_field(item: str) -> tuple[str, str]:
    """`Key=Value` of an scontrol argv element (the value may itself hold '=')."""
    key, sep, value = item.partition("=")
    if not sep:
        raise SlurmInvalidArgument(f"expected Key=Value, got {item!r}")
    return key.lower(), value


def _rpc_message(error: Exception) -> str:
    """libslurm's message of a pyslurm error (the text scontrol would print)."""
    return str(getattr(error, "msg", None) or error)


class PySlurmRunner:
    """A `CommandRunner` that performs `SlurmCli`'s requests with libslurm RPCs.

    It knows exactly the requests the command-line backend's effects make (node
    drain/resume, requeue[hold], hold/release, job updates, scancel) and refuses any
    other argv. A failed RPC comes back as a failed command carrying libslurm's message,
    for `SlurmCli` to classify as it does scontrol's."""

    def __init__(self, module: ModuleType) -> None:
        self._pyslurm = module
        # One thread: pyslurm holds the GIL during an RPC anyway, and libslurm's
        # client state is simplest used from one thread.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pyslurm")

    async def call(self, fn: Callable[[], T], what: str, timeout: float) -> T:
        """Run one pyslurm call on the worker thread, bounded by `timeout` (libslurm's own
        MessageTimeout bounds the RPC itself; past ours the caller stops waiting)."""
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._pool, fn), timeout)
        except TimeoutError:
            raise SlurmTimeout(f"pyslurm {what}: no answer within {timeout:g}s") from None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _job(self, job_id: str) -> Any:
        """A `pyslurm.Job` handle for an RPC: array tasks (A_T) by their internal id."""
        job_id = validate_job_id(job_id)
        if "_" not in job_id:
            return self._pyslurm.Job(int(job_id))
        for job in self._pyslurm.Jobs.load().values():
            if job.array_id and _job_id(job)[0] == job_id:
                return self._pyslurm.Job(int(job.id))
        raise NoSuchJob(f"job {job_id} not found", argv=["pyslurm", "job", job_id])

    def _perform(self, argv: Sequence[str]) -> None:
        pyslurm = self._pyslurm
        args = list(argv)
        if len(args) == 2 and args[0] == "scancel":
            job = self._job(args[1])
            try:
                job.cancel()
            except pyslurm.RPCError:
                # pyslurm reads errno after slurm_kill_job even when the RPC succeeded, so
                # a stale errno can look like a failure: believe Slurm's own state.
                state = str(pyslurm.Job.load(job.id).state)
                if state not in {"CANCELLED", "COMPLETING"}:
                    raise
            return
        if len(args) == 3 and args[0] == "scontrol" and args[1] in {"requeue", "requeuehold"}:
            self._job(args[2]).requeue(hold=args[1] == "requeuehold")
            return
        if len(args) == 3 and args[0] == "scontrol" and args[1] in {"hold", "release"}:
            job = self._job(args[2])
            if args[1] == "hold":
                job.hold()
            else:
                job.release()
            return
        if len(args) >= 4 and args[:2] == ["scontrol", "update"]:
            key, target = _split_field(args[2])
            changes = dict(_split_field(item) for item in args[3:])
            if key == "nodename":
                self._update_node(target, changes)
                return
            if key == "jobid":
                self._update_job(target, changes)
                return
        raise SlurmInvalidArgument(f"the pyslurm backend has no call for {args}")

    def _update_node(self, name: str, changes: dict[str, str]) -> None:
        pyslurm = self._pyslurm
        state = changes.pop("state", "").upper()
        reason = changes.pop("reason", None)
        if changes or state not in {"DRAIN", "DOWN", "RESUME"}:
            raise SlurmInvalidArgument(f"unsupported node update {state} {sorted(changes)}")
        update = pyslurm.Node(state=state, reason=reason) if reason else pyslurm.Node(state=state)
        pyslurm.Node(name).modify(update)

    def _update_job(self, job_id: str, changes: dict[str, str]) -> None:
        pyslurm = self._pyslurm
        fields: dict[str, Any] = {}
        for key, value in changes.items():
            if key == "excnodelist":
                fields["excluded_nodes"] = value
            elif key == "starttime":
                fields["begin_time"] = value
            elif key == "comment":
                if not value:
                    # An empty string means "unchanged" in pyslurm's update message.
                    raise SlurmInvalidArgument("the pyslurm backend cannot clear a comment")
                fields["comment"] = value
            else:
                raise SlurmInvalidArgument(f"unsupported job update {key}")
        self._job(job_id).modify(pyslurm.JobSubmitDescription(**fields))

    async def run(self, argv: Sequence[str], timeout: float) -> CompletedCommand:
        started = time.monotonic()
        pyslurm = self._pyslurm

        def perform() -> tuple[int, str]:
            try:
                self._perform(argv)
            except pyslurm.RPCError as error:
                return 1, _rpc_message(error)
            return 0, ""

        returncode, stderr = await self.call(perform, " ".join(argv), timeout)
        return CompletedCommand(
            argv=["pyslurm", *argv],
            returncode=returncode,
            stderr=stderr,
            duration_s=time.monotonic() - started,
        )


# ----------------------------------------------------------------------------- backend


class PySlurmBackend(SlurmCli):
    """The pyslurm `SlurmBackend`: reads through pyslurm's objects, effects through the
    command-line backend's logic over libslurm RPCs. `timeout` bounds each call."""

    def __init__(
        self,
        module: ModuleType,
        *,
        timeout: float = 45.0,
        settle_timeout: float = 60.0,
        poll_interval: float = 0.5,
    ) -> None:
        self._calls = PySlurmRunner(module)
        super().__init__(
            self._calls,
            timeout=timeout,
            settle_timeout=settle_timeout,
            poll_interval=poll_interval,
        )
        self._pyslurm = module

    @classmethod
    def open(cls, slurm_conf: Path | None = None, *, timeout: float = 45.0) -> PySlurmBackend:
        """Load pyslurm for `slurm_conf` (PySlurmUnavailable when it cannot) and check
        it against the running slurmctld when that answers (else on first use)."""
        backend = cls(load_pyslurm(slurm_conf), timeout=timeout)
        with contextlib.suppress(SlurmError):
            backend._check_release(backend._controller_version())
        return backend

    def close(self) -> None:
        self._calls.close()

    # ------------------------------------------------------------------ plumbing

    def _rpc_error(self, what: str, error: Exception) -> SlurmError:
        return classify(["pyslurm", *what.split()], None, _rpc_message(error))

    async def _run(self, argv: list[str], *, check_stderr_errors: bool = False) -> CompletedCommand:
        """An effect's request, performed by `PySlurmRunner`; a failure is classified with
        the request as pyslurm made it (the error names no program that never ran)."""
        await self._ensure_release()
        result = await self._calls.run(argv, self._timeout)
        if result.returncode != 0:
            error = classify(result.argv, result.returncode, result.stderr)
            log.info("pyslurm request failed: %s -> %s", argv, type(error).__name__)
            raise error
        return result

    async def _read(self, fn: Callable[[], T], what: str) -> T:
        """One read RPC, its failure as the typed error scontrol's message would give."""
        await self._ensure_release()
        try:
            return await self._calls.call(fn, what, self._timeout)
        except self._pyslurm.RPCError as error:
            raise self._rpc_error(what, error) from None

    def _controller_version(self) -> SlurmVersion:
        try:
            config = self._pyslurm.slurmctld.Config.load()
        except self._pyslurm.RPCError as error:
            raise self._rpc_error("slurmctld config", error) from None
        return parse_version(str(config.version))

    def _check_release(self, running: SlurmVersion) -> None:
        built = pyslurm_release(self._pyslurm)
        if (running.major, running.minor) != built:
            raise PySlurmUnavailable(
                f"pyslurm {self._pyslurm.__version__} is built for Slurm "
                f"{built[0]}.{built[1]:02d}, but the running slurmctld is {running}; "
                + INSTALL_HINT
            )
        self._version = running

    async def _ensure_release(self) -> SlurmVersion:
        if self._version is None:
            running = await self._calls.call(
                self._controller_version, "slurmctld config", self._timeout
            )
            self._check_release(running)
            return running
        return self._version

    async def version(self) -> SlurmVersion:
        """The running slurmctld's version (checked against pyslurm's release)."""
        return await self._ensure_release()

    # ------------------------------------------------------------------ reads

    async def list_jobs(self) -> list[SlurmJob]:
        pyslurm = self._pyslurm

        def load() -> list[SlurmJob]:
            return [job_from_pyslurm(job) for job in pyslurm.Jobs.load().values()]

        return await self._read(load, "load jobs")

    async def get_job(self, job_id: str) -> SlurmJob:
        job_id = validate_job_id(job_id)
        pyslurm = self._pyslurm

        def load() -> SlurmJob:
            if "_" not in job_id:
                return job_from_pyslurm(pyslurm.Job.load(int(job_id)))
            for job in pyslurm.Jobs.load().values():  # an array task, by A_T
                if _job_id(job)[0] == job_id:
                    return job_from_pyslurm(job)
            raise NoSuchJob(f"pyslurm: job {job_id} not found", argv=["pyslurm", job_id])

        return await self._read(load, f"load job {job_id}")

    async def list_nodes(self) -> list[SlurmNode]:
        pyslurm = self._pyslurm

        def load() -> list[SlurmNode]:
            return [node_from_pyslurm(node) for node in pyslurm.Nodes.load().values()]

        return await self._read(load, "load nodes")

    async def get_node(self, name: str) -> SlurmNode:
        pyslurm = self._pyslurm
        name = _validate_node(name)

        def load() -> SlurmNode:
            try:
                return node_from_pyslurm(pyslurm.Node.load(name))
            except pyslurm.RPCError as error:
                if "does not exist" in str(error):  # pyslurm's own words for no record
                    raise NoSuchNode(f"pyslurm: node {name} not found") from None
                raise

        return await self._read(load, f"load node {name}")

    # ------------------------------------------------------------------ effects
    # SlurmCli's logic; the record says the request went through pyslurm.

    async def drain_node(self, name: str, reason: str) -> EffectResult:
        return _via(await super().drain_node(name, reason))

    async def down_node(self, name: str, reason: str) -> EffectResult:
        return _via(await super().down_node(name, reason))

    async def resume_node(
        self, name: str, *, only_if_reason_contains: str | None = None, only_if_ours: bool = False
    ) -> EffectResult:
        return _via(
            await super().resume_node(
                name, only_if_reason_contains=only_if_reason_contains, only_if_ours=only_if_ours
            )
        )

    async def requeue(self, job_id: str, *, hold: bool = False) -> EffectResult:
        return _via(await super().requeue(job_id, hold=hold))

    async def hold(self, job_id: str) -> EffectResult:
        return _via(await super().hold(job_id))

    async def release(self, job_id: str) -> EffectResult:
        return _via(await super().release(job_id))

    async def exclude_nodes(self, job_id: str, nodes: Sequence[str]) -> EffectResult:
        return _via(await super().exclude_nodes(job_id, nodes))

    async def start_now(self, job_id: str) -> EffectResult:
        return _via(await super().start_now(job_id))

    async def cancel(self, job_id: str) -> EffectResult:
        return _via(await super().cancel(job_id))

    async def set_comment(self, job_id: str, comment: str) -> EffectResult:
        return _via(await super().set_comment(job_id, comment))


def _via(result: EffectResult) -> EffectResult:
    """Mark the recorded request as made through pyslurm (once: effects nest)."""
    if result.command and result.command[0] != "pyslurm":
        result.command = ["pyslurm", *result.command]
    return result


__all__ = [
    "INSTALL_HINT",
    "PySlurmBackend",
    "PySlurmRunner",
    "PySlurmUnavailable",
    "job_from_pyslurm",
    "load_pyslurm",
    "node_from_pyslurm",
    "pyslurm_release",
]
