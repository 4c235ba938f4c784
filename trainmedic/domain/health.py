"""A node's health check, as asked by the controller and answered by the node agent.

Wire contract (the agent's `GET /health`, see trainmedic/health/agent.py):

    GET /health?q=<base64url(NodeHealthRequest JSON)>
    X-Trainmedic-Signature: <hex HMAC-SHA256(node key, "trainmedic-health-request-v1\\0" + q)>

    200 OK
    Content-Type: application/json
    X-Trainmedic-Signature: <hex HMAC-SHA256(node key, "trainmedic-health-response-v1\\0" + body)>
    body: NodeHealthResponse JSON (the report, and the request's nonce echoed)

Both directions are signed with the *node's* key, the agent channel's
(`trainmedic.channel.wire.node_key(site key, node)`): the controller holds the site key
(TRAINMEDIC_AGENT_KEY_FILE, else TRAINMEDIC_SPOOL_KEY_FILE) and derives it; the agent
holds only its own. So the agent runs `dcgmi diag` only for the controller, no node can
answer for another, and the controller returns a node to service only on an answer the
node's own agent gave to *this* request (nonce), never on a replayed or forged
"healthy". Refusals: 400 (malformed), 401 (bad or missing signature, stale request, or
a request signed for another node), 404 (another path), 405 (not GET), 409 (the request
names another node), 500 (the check itself failed on the agent).

Served by the node agent's probe listener (the port of its `--listen`, 8791 by default)
through `trainmedic.health.agent.HealthEndpoint.handle`.

Everything here is pure pydantic (safe to import in workflows).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

HEALTH_PATH = "/health"
SIGNATURE_HEADER = "X-Trainmedic-Signature"
REQUEST_PURPOSE = b"trainmedic-health-request-v1"
RESPONSE_PURPOSE = b"trainmedic-health-response-v1"
# How old (or how far ahead, for clock skew) a signed request may be.
MAX_REQUEST_AGE_S = 300.0
# Bounded output kept from dcgmi and the site script (the tail: where verdicts are).
MAX_OUTPUT_CHARS = 4000

CheckName = Literal[
    "agent",  # the node agent answered (false: unreachable, refused, forged)
    "slurm",  # Slurm has the node responding (not DOWN / NOT_RESPONDING / FAIL)
    "nvml",  # NVML could be opened on the node
    "gpu_count",  # as many GPUs as Slurm's gres says, none lost (fallen off the bus)
    "row_remap",  # no pending row remap, no failed remap
    "ecc",  # no uncorrectable ECC since the drain (volatile, or over the baseline)
    "recovery_action",  # the driver asks for no recovery action (r570+; absent: unknown)
    "nvlink",  # every NVLink the GPUs have is up
    "dcgm_diag",  # `dcgmi diag -r 1` passes (skipped where dcgmi is not installed)
    "site_script",  # the site's own script exits 0 (skipped where none is configured)
]


class HealthCheck(BaseModel):
    """One check's verdict. `ok` False fails the node; `unknown` marks a check that
    could not be read (an old driver, a field the GPU lacks): recorded, not a failure.
    `skipped`: not configured or not installed here."""

    model_config = ConfigDict(frozen=True)

    # One of CheckName; any other name is kept too (a newer agent's check), so an
    # agent upgrade never makes its reports unreadable.
    name: CheckName | str
    ok: bool
    detail: str = ""
    unknown: bool = False
    skipped: bool = False
    output: str | None = None  # dcgmi / site script: the tail of what it printed


class NodeHealthRequest(BaseModel):
    """What the controller asks a node's agent (the query string of `GET /health`)."""

    node: str
    nonce: str = Field(min_length=16, max_length=64)
    at: datetime  # when it was asked: the agent refuses stale requests
    # Slurm's gres GPU count for the node (None: not known, the count is not compared).
    expected_gpus: int | None = Field(None, ge=0, le=1024)
    # Uncorrectable ECC (aggregate) per GPU UUID when trainmedic first read the node in
    # this quarantine: any growth is an error "since the drain". Without one, volatile
    # counters (since the last GPU reset / driver load) decide.
    ecc_baseline: dict[str, int] = Field(default_factory=dict)
    diag: bool = True  # run `dcgmi diag -r 1` when installed


class NodeHealthReport(BaseModel):
    """A node's health: healthy only when every check is ok. Recorded in the quarantine
    workflow's history (the activity's result) and shown by `trainmedic nodes`."""

    node: str
    healthy: bool
    checks: list[HealthCheck] = Field(default_factory=list)
    at: datetime | None = None
    source: Literal["agent", "lab", "slurm"] = "agent"
    reachable: bool = True  # False: the agent did not answer (or answered falsely)
    driver_version: str | None = None
    # Uncorrectable ECC (aggregate) per GPU UUID now: the next check's baseline.
    ecc_aggregate: dict[str, int] = Field(default_factory=dict)

    @property
    def failed(self) -> list[HealthCheck]:
        return [c for c in self.checks if not c.ok]

    @property
    def detail(self) -> str:
        """One line: the failing checks with their details, or 'all checks ok'."""
        failed = self.failed
        if not failed:
            names = ", ".join(c.name for c in self.checks if not c.skipped and not c.unknown)
            return f"all checks ok ({names})" if names else "all checks ok"
        return "; ".join(f"{c.name}: {c.detail}" for c in failed)

    @classmethod
    def of(
        cls,
        node: str,
        checks: list[HealthCheck],
        at: datetime | None,
        **fields: object,
    ) -> NodeHealthReport:
        return cls.model_validate(
            {
                "node": node,
                "healthy": bool(checks) and all(c.ok for c in checks),
                "checks": checks,
                "at": at,
                **fields,
            }
        )


class NodeHealthResponse(BaseModel):
    """The body of the agent's answer: the report, bound to the request by its nonce."""

    nonce: str
    report: NodeHealthReport
    agent: str = "trainmedic-node-agent"
