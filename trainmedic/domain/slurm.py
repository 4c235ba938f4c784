"""What trainmedic knows about Slurm jobs and nodes, independent of how it was read.

Pure models (no I/O): the command-line adapter fills them from `squeue --json`,
`sinfo --json` or `scontrol -o show ...` of Slurm 22.05 or 24.11, and workflows record
them. States are normalised to Slurm's upper-case names: a *base* state (RUNNING, IDLE)
plus *flags* (REQUEUE_HOLD, DRAIN, NOT_RESPONDING).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainmedic.domain.diagnosis import SlurmObservation

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
        # A held job has priority 0; the reason says by whom (user/admin/requeue-hold).
        return self.is_pending and (
            self.state_reason in HELD_REASONS
            or "REQUEUE_HOLD" in self.state_flags
            or "SPECIAL_EXIT" in self.state_flags
        )

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


class SlurmNode(BaseModel):
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
        return self.state == "DOWN" or "FAIL" in self.state_flags

    @property
    def is_available(self) -> bool:
        """Can take new work: up, not drained, responding."""
        return (
            self.state in {"IDLE", "MIXED", "ALLOCATED"}
            and not self.drain_flag
            and "NOT_RESPONDING" not in self.state_flags
            and "FAIL" not in self.state_flags
        )


class EffectResult(BaseModel):
    """What one effect did: the exact command (empty when none was needed) and what it found."""

    command: list[str] = Field(default_factory=list)
    changed: bool
    detail: str
    before: str | None = None  # the state found right before the effect
    after: str | None = None  # the state read back afterwards, when re-read
