"""Register trainmedic's search attributes on a namespace, once and idempotently.

Through the operator service, with the client every other command uses (TLS, mTLS, API
key). An attribute already there with the right type is left alone; one there with
another type is an error (Temporal cannot change an attribute's type, and workflows
upserting it would stall), named with both types.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client
from temporalio.service import RPCError

from trainmedic.errors import ServiceError
from trainmedic.temporal.client import INDEXED_TYPES, registered_search_attributes, rpc_problem
from trainmedic.temporal.search_attributes import REQUIRED


class SetupResult(BaseModel):
    namespace: str
    added: list[str]
    present: list[str]


class ConflictingSearchAttributes(ServiceError):
    """An attribute of ours exists with another type."""


async def register_search_attributes(client: Client) -> SetupResult:
    present = await registered_search_attributes(client)
    conflicts = [
        f"{name} is {present[name]}, trainmedic needs {kind}"
        for name, kind in REQUIRED.items()
        if name in present and present[name] != kind
    ]
    if conflicts:
        raise ConflictingSearchAttributes(
            f"namespace {client.namespace!r} already has search attributes of another type: "
            f"{'; '.join(conflicts)}. Temporal cannot change a type: remove them "
            f"(`temporal operator search-attribute remove --namespace {client.namespace} "
            "--name NAME`, on a namespace no workflow uses them in) or use another namespace."
        )
    missing = {name: kind for name, kind in REQUIRED.items() if name not in present}
    if missing:
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(
                    namespace=client.namespace,
                    search_attributes={name: INDEXED_TYPES[kind] for name, kind in missing.items()},
                )
            )
        except RPCError as error:
            raise rpc_problem(error, client, "registering the search attributes") from None
        # Read back: the add is asynchronous on some visibility stores.
        after = await registered_search_attributes(client)
        absent = [name for name, kind in missing.items() if after.get(name) != kind]
        if absent:
            raise ServiceError(
                f"Temporal accepted the search attributes but namespace {client.namespace!r} "
                f"does not list {', '.join(absent)} yet; run `trainmedic setup temporal` again "
                "in a minute"
            )
    return SetupResult(
        namespace=client.namespace,
        added=sorted(missing),
        present=sorted(name for name in REQUIRED if name not in missing),
    )
