"""Evidence and diagnosis: what attribution produces and every incident records."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from trainmedic.domain.enums import Action, Category, EvidenceSource


class Evidence(BaseModel):
    """One line (or one observation) that counted toward a diagnosis."""

    model_config = ConfigDict(frozen=True)

    source: EvidenceSource
    text: str
    file: str | None = None
    line_no: int | None = None
    rule_id: str | None = None
    node: str | None = None
    rank: int | None = None
    gpu: int | None = None


class Diagnosis(BaseModel):
    category: Category
    action: Action
    culprit_nodes: list[str] = Field(default_factory=list)
    culprit_ranks: list[int] = Field(default_factory=list)
    culprit_gpus: list[str] = Field(default_factory=list)  # "node:index"
    transient: bool | None = None
    confidence: float = Field(ge=0.0, le=1.0)
    evidence: list[Evidence] = Field(default_factory=list)
    rule_ids: list[str] = Field(default_factory=list)
    catalog_version: str
    summary: str = ""

    def headline(self) -> str:
        """One line an operator reads first: 'gpu_hardware on gpu02: Xid 79 ...'."""
        where = f" on {', '.join(self.culprit_nodes)}" if self.culprit_nodes else ""
        why = f": {self.summary}" if self.summary else ""
        return f"{self.category.value}{where}{why}"


class SlurmObservation(BaseModel):
    """What Slurm said about the failed job and its nodes, as the attributor sees it."""

    job_state: str | None = None  # e.g. FAILED, NODE_FAIL, OUT_OF_MEMORY, TIMEOUT, PREEMPTED
    state_reason: str | None = None  # e.g. NonZeroExitCode, NodeDown
    exit_code: int | None = None  # the job's exit status (not a raw wait status)
    signal: int | None = None  # terminating signal, when the job died by one
    node_states: dict[str, str] = Field(default_factory=dict)  # node -> DOWN/DRAIN/IDLE/...
    node_reasons: dict[str, str] = Field(default_factory=dict)  # node -> Slurm's reason


class AttributionRequest(BaseModel):
    """Everything known about one failure, handed to the attribution engine."""

    job_id: str | None = None
    nodelist: list[str] = Field(default_factory=list)  # expanded, in Slurm's order
    tasks_per_node: int | None = None
    # Slurm's NodeAddr per node, as address (or alias) -> NodeName: logs that name a node
    # by its IP address (NCCL peers, Ray's "ip=") then name the node itself.
    node_addrs: dict[str, str] = Field(default_factory=dict)
    # Each node's GPUs, PCI bus id -> index (NVML, the node agent): an Xid names its GPU
    # only by bus id.
    gpu_bus_ids: dict[str, dict[str, int]] = Field(default_factory=dict)
    log_paths: list[str] = Field(default_factory=list)  # files to scan (stdout/stderr)
    # Where the diagnosed run's output begins in each file: earlier runs' lines (an
    # appending requeued job) are not read. Absent: the whole file (within the caps).
    log_from: dict[str, int] = Field(default_factory=dict)
    evidence: list[Evidence] = Field(default_factory=list)  # lines already gathered
    slurm: SlurmObservation | None = None
