"""How adapter errors cross into Temporal: retryable ones retry, the rest fail fast."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from temporalio.exceptions import ApplicationError

from trainmedic.adapters.slurm.errors import SlurmError

T = TypeVar("T")


async def slurm_call(call: Awaitable[T]) -> T:
    """Await a Slurm adapter call; a non-retryable SlurmError becomes a non-retryable
    ApplicationError with the error's class as its type (so histories say which)."""
    try:
        return await call
    except SlurmError as error:
        if error.retryable:
            raise
        raise ApplicationError(str(error), type=type(error).__name__, non_retryable=True) from error
