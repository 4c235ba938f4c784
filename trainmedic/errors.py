"""Typed errors shared across the package. Each says what went wrong and what to do."""

from __future__ import annotations


class TrainmedicError(Exception):
    """Base class: the CLI prints these as one clean message, no traceback."""


class ConfigError(TrainmedicError):
    """Settings or policy file invalid. The message names every offending key."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        listed = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid configuration in {source}:\n{listed}")


class MissingDependencyError(TrainmedicError):
    """A system package or binary that trainmedic needs is not installed."""


class ServiceError(TrainmedicError):
    """A local service (Temporal dev server, lab daemon) could not be started or reached."""


class DeliveryError(TrainmedicError):
    """A signal could not be handed to Temporal (server unreachable, RPC failed).

    Raised by the router's `submit` so that a caller holding the report durably (a
    spool) keeps it and tries again; a bad signal is never this (it is logged and
    dropped)."""
