"""What trainmedic knows about Slurm jobs and nodes, independent of how it was read.

Pure models (no I/O): the command-line adapter fills them from `squeue --json`,
`sinfo --json` or `scontrol -o show ...` of Slurm 22.05 or 24.11, and workflows record
them. States are normalised to Slurm's upper-case names: a *base* state (RUNNING, IDLE)
plus *flags* (REQUEUE_HOLD, DRAIN, NOT_RESPONDING).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainmedic.domain.diagnosis import SlurmObservation
from trainmedic.domain.enums import Category

# Base job states (Slurm's JOB_STATE_BASE values); anything else in a state list is a flag.
JOB_BASE_STATES: frozenset[str] = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
JOB_FINISHED_STATES: frozenset[str] = JOB_BASE_STATES - {"PENDING", "RUNNING", "SUSPENDED"}

# Base node states (NODE_STATE_BASE); DRAIN, NOT_RESPONDING, ... are flags.
NODE_BASE_STATES: frozenset[str] = frozenset(
    {"UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE"}
)

# States a node's reason explains (what `sinfo -R` lists): base DOWN, or these flags.
NODE_REASON_FLAGS: frozenset[str] = frozenset(
    {
        "DRAIN",
        "DRAINED",
        "DRAINING",
        "FAIL",
        "FAILING",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "POWER_DOWN",
        "POWERING_DOWN",
        "POWERED_DOWN",
        "MAINTENANCE",
        "INVALID_REG",
    }
)

# Pending reasons that mean "held": a released job loses them.
HELD_REASONS: frozenset[str] = frozenset(
    {"JobHeldUser", "JobHeldAdmin", "job_requeued_in_held_state", "JobHeld"}
)

# Words that, in a node's base state or any flag, mean slurmctld cannot place work there:
# not registered (UNKNOWN, FUTURE, INVALID_REG), not answering, or down / powered down.
_NOT_REGISTERED = ("DOWN", "UNKNOWN", "FUTURE", "INVALID", "NOT_RESPONDING", "POWERED_DOWN")

# ----------------------------------------------------------------------------- ours

# The reason trainmedic gives Slurm when it drains or downs a node, and the comment it
# writes on a job it acts on (workflows/planning.py `slurm_reason`):
#     "trainmedic <incident id>: <category>: <detail>"
# Only that exact shape, with one of the catalog's categories, is ours. A reason a person
# wrote that merely starts with, or mentions, "trainmedic" ("trainmedic-test", "TRAINMEDIC
# ...", "trainmedic note: disk", "see trainmedic incident x") is theirs: trainmedic never
# resumes, and always reports, such a node.
OUR_REASON_PREFIX = "trainmedic"
_OUR_REASON = re.compile(
    rf"^{OUR_REASON_PREFIX} (?P<incident>[A-Za-z0-9._-]+): "
    rf"(?P<category>{'|'.join(sorted((c.value for c in Category), key=len, reverse=True))})"
    r"(?=:|$)"
)


def parse_our_reason(reason: str | None) -> tuple[str, str] | None:
    """(incident id, category) from a reason trainmedic wrote; None for anyone else's."""
    match = _OUR_REASON.match(reason or "")
    return (match["incident"], match["category"]) if match else None


def is_ours(reason: str | None) -> bool:
    """Whether a node's drain/down reason (or a job's comment) was written by trainmedic.

    The one test for "drained by trainmedic" (planning, the Slurm watcher, the
    quarantine and its resume guard all ask here)."""
    return parse_our_reason(reason) is not None


def job_is_held(state: str, reason: str | None, flags: Sequence[str]) -> bool:
    """A pending job held back: by a user, an admin or a requeue-hold (priority 0; the
    reason says by whom)."""
    return state == "PENDING" and (
        reason in HELD_REASONS or "REQUEUE_HOLD" in flags or "SPECIAL_EXIT" in flags
    )


class ExitStatus(BaseModel):
    """A process's end: its exit code, or the signal that killed it (never both)."""

    model_config = ConfigDict(frozen=True)

    code: int | None = None
    signal: int | None = None

    @classmethod
    def from_wait_status(cls, raw: int) -> ExitStatus:
        """Decode a raw wait(2) status, as Slurm 22.05's JSON `exit_code` holds it."""
        if raw & 0x7F:
            return cls(code=None, signal=raw & 0x7F)
        return cls(code=(raw >> 8) & 0xFF, signal=None)

    @classmethod
    def from_colon(cls, text: str) -> ExitStatus:
        """Decode scontrol's 'ExitCode=3:0' form (exit code, then signal)."""
        code_text, _, signal_text = text.partition(":")
        code = int(code_text) if code_text.strip().isdigit() else None
        signal = int(signal_text) if signal_text.strip().isdigit() else 0
        if signal:
            return cls(code=None, signal=signal)
        return cls(code=code, signal=None)

    @property
    def success(self) -> bool:
        return self.code == 0 and self.signal is None


class SlurmVersion(BaseModel):
    model_config = ConfigDict(frozen=True)

    major: int
    minor: int
    micro: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    @property
    def has_scontrol_json(self) -> bool:
        return (self.major, self.minor) >= (23, 2)


class SlurmJob(BaseModel):
    """One job (or one array task) as Slurm reports it."""

    job_id: str  # "123", or "123_4" for an array task
    numeric_id: int | None = None  # Slurm's internal JobId (differs from job_id for arrays)
    array_job_id: int | None = None
    array_task_id: int | None = None
    name: str = ""
    user: str | None = None
    partition: str | None = None
    state: str  # base state: PENDING, RUNNING, FAILED, ...
    state_flags: list[str] = Field(default_factory=list)  # REQUEUED, REQUEUE_HOLD, ...
    state_reason: str | None = None  # None, NonZeroExitCode, NodeDown, JobHeldUser, ...
    nodes: list[str] = Field(default_factory=list)  # expanded, Slurm's order
    node_count: int | None = None
    tasks: int | None = None
    tasks_per_node: int | None = None
    excluded_nodes: list[str] = Field(default_factory=list)
    # ReqNodeList (sbatch -w/--nodelist): nodes the job must run on. Excluding one of
    # them would leave the job pending forever (BadConstraints).
    required_nodes: list[str] = Field(default_factory=list)
    comment: str = ""
    stdout_path: str | None = None
    stderr_path: str | None = None
    work_dir: str | None = None
    requeue: bool | None = None  # whether Slurm may requeue it
    restarts: int = 0  # Slurm's restart count (requeues so far)
    batch: bool | None = None  # BatchFlag: a batch job (requeue works on these only)
    priority: int | None = None
    batch_host: str | None = None
    exit: ExitStatus | None = None

    @property
    def is_pending(self) -> bool:
        return self.state == "PENDING"

    @property
    def is_running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def is_finished(self) -> bool:
        return self.state in JOB_FINISHED_STATES

    @property
    def is_held(self) -> bool:
        return job_is_held(self.state, self.state_reason, self.state_flags)

    def observation(self, nodes: list[SlurmNode] | None = None) -> SlurmObservation:
        """The attributor's view of this job and (optionally) its nodes."""
        obs = SlurmObservation(
            job_state=self.state,
            state_reason=self.state_reason,
            exit_code=self.exit.code if self.exit else None,
            signal=self.exit.signal if self.exit else None,
        )
        for node in nodes or []:
            obs.node_states[node.name] = node.state_text
            if node.reason:
                obs.node_reasons[node.name] = node.reason
        return obs


class NodeStates:
    """What a node's base state and flags mean, in one place: shared by `SlurmNode` and
    the Slurm adapter's lean `NodeView` (the watcher's per-cycle record)."""

    __slots__ = ()

    if TYPE_CHECKING:
        state: str
        state_flags: Sequence[str]
        reason: str | None

    @property
    def state_text(self) -> str:
        """Slurm's own 'IDLE+DRAIN' form."""
        return "+".join([self.state, *self.state_flags])

    @property
    def drain_flag(self) -> bool:
        return "DRAIN" in self.state_flags

    @property
    def is_drained(self) -> bool:
        """Drain set and nothing left running on it."""
        return self.drain_flag and self.state in {"IDLE", "DOWN"}

    @property
    def is_draining(self) -> bool:
        """Drain set while jobs still run there."""
        return self.drain_flag and not self.is_drained

    @property
    def is_down(self) -> bool:
        """Out by failure: base state DOWN, or a FAIL flag."""
        return self.state == "DOWN" or "FAIL" in self.state_flags

    @property
    def marked_down(self) -> bool:
        """Base state DOWN (set down, or not answering past SlurmdTimeout); a FAIL flag
        alone is not (the watcher tells the two apart)."""
        return self.state == "DOWN"

    @property
    def not_responding(self) -> bool:
        return "NOT_RESPONDING" in self.state_flags

    @property
    def is_failing(self) -> bool:
        """FAIL or FAILING set (`scontrol update state=fail`)."""
        return "FAIL" in self.state_flags or "FAILING" in self.state_flags

    @property
    def is_out(self) -> bool:
        """Already out of service: drained (by anyone) or down."""
        return self.drain_flag or self.is_down

    @property
    def is_ours(self) -> bool:
        """Its reason is trainmedic's (see `is_ours`); says nothing about its state."""
        return is_ours(self.reason)

    @property
    def is_available(self) -> bool:
        """Can take new work: up, not drained, responding."""
        return (
            self.state in {"IDLE", "MIXED", "ALLOCATED"}
            and not self.drain_flag
            and not self.not_responding
            and "FAIL" not in self.state_flags
        )

    @property
    def is_registered(self) -> bool:
        """Registered with slurmctld and answering, so Slurm could place work here unless
        it is drained: nothing DOWN (or powered down), UNKNOWN, FUTURE, INVALID or
        NOT_RESPONDING in its state."""
        words = (self.state, *self.state_flags)
        return not any(bad in word for word in words for bad in _NOT_REGISTERED)

    def already(self, state: Literal["DRAIN", "DOWN"]) -> str | None:
        """How the node already is `state`, for an idempotent drain or down: 'drained' /
        'draining' (drain flag set) or 'down' (`is_down`); None when it is not."""
        if state == "DRAIN":
            return ("drained" if self.is_drained else "draining") if self.drain_flag else None
        return "down" if self.is_down else None


class SlurmNode(NodeStates, BaseModel):
    """One node as Slurm reports it."""

    name: str
    state: str  # base state: IDLE, MIXED, ALLOCATED, DOWN, ...
    state_flags: list[str] = Field(default_factory=list)  # DRAIN, NOT_RESPONDING, ...
    reason: str | None = None
    reason_user: str | None = None
    partitions: list[str] = Field(default_factory=list)
    gres: str | None = None
    cpus: int | None = None
    hostname: str | None = None
    address: str | None = None  # NodeAddr: where slurmctld reaches its slurmd

    @model_validator(mode="after")
    def _reason_only_while_it_applies(self) -> SlurmNode:
        # Slurm 25.11 keeps a node's last reason after `State=RESUME` (22.05 clears it;
        # seen in the lab with scontrol and pyslurm alike). Like `sinfo -R`, count a
        # reason only while the node is down, drained, failing, rebooting or powered
        # down: else a healthy node would carry a stale "Xid 79" into attribution.
        if self.reason is not None and not (
            self.state in {"DOWN", "UNKNOWN", "ERROR", "FUTURE"}
            or NODE_REASON_FLAGS & set(self.state_flags)
        ):
            self.reason = None
            self.reason_user = None
        return self


class EffectResult(BaseModel):
    """What one effect did: the exact command (empty when none was needed) and what it found."""

    command: list[str] = Field(default_factory=list)
    changed: bool
    detail: str
    before: str | None = None  # the state found right before the effect
    after: str | None = None  # the state read back afterwards, when re-read
