"""Shared CLI plumbing: one console, settings loading, the embedded dev server."""

from __future__ import annotations

from rich.console import Console

from trainmedic.config import Settings, load_settings
from trainmedic.errors import ConfigError
from trainmedic.temporal.devserver import DevServer

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def settings() -> Settings:
    return load_settings()


def dev_server(config: Settings) -> DevServer:
    """The embedded server that serves the configured address (it must be local)."""
    host, _, port = config.temporal_address.rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        raise ConfigError(
            "environment (TRAINMEDIC_*)",
            [
                f"TRAINMEDIC_TEMPORAL_ADDRESS: the embedded server listens on 127.0.0.1, "
                f"but the address is {config.temporal_address}; use `trainmedic server` only "
                "for a local dev server"
            ],
        )
    return DevServer(config.temporal_dir, port=int(port), ui_port=config.temporal_ui_port)
