"""Node health: the checks the node agent runs, its `GET /health`, and the controller's
probes (see domain/health.py for the wire contract)."""

from trainmedic.health.agent import HealthEndpoint, HttpReply, build_health_endpoint, serve_health
from trainmedic.health.checks import HealthConfig, NodeHealthChecker
from trainmedic.health.probe import (
    AgentUnreachable,
    HttpNodeHealthProbe,
    NodeHealthProbe,
)

__all__ = [
    "AgentUnreachable",
    "HealthConfig",
    "HealthEndpoint",
    "HttpNodeHealthProbe",
    "HttpReply",
    "NodeHealthChecker",
    "NodeHealthProbe",
    "build_health_endpoint",
    "serve_health",
]
