"""Settings and policy: defaults, durations, and named-key errors for bad input."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from trainmedic.config import Policy, load_policy, load_settings, parse_policy
from trainmedic.domain import Action, Mode
from trainmedic.errors import ConfigError


def test_builtin_policy_defaults_to_monitor() -> None:
    policy = load_policy(None)
    assert policy.mode.default is Mode.MONITOR
    assert policy.mode.for_effect(Action.DRAIN_AND_RESTART, "gpu") is Mode.MONITOR


def test_policy_overrides_per_action_and_partition() -> None:
    policy = parse_policy(
        """
        version: site-7
        mode:
          default: approve
          actions: {restart: auto}
          partitions: {debug: auto, prod: monitor}
        approval: {timeout: 1h30m, fallback: abandon}
        rails: {isolation_window: 45m, restart_budget: 2}
        """
    )
    assert policy.version == "site-7"
    assert policy.mode.for_effect(Action.RESTART, None) is Mode.AUTO
    assert policy.mode.for_effect(Action.STOP, None) is Mode.APPROVE
    assert policy.mode.for_effect(Action.RESTART, "prod") is Mode.MONITOR
    assert policy.approval.timeout == timedelta(minutes=90)
    assert policy.rails.isolation_window == timedelta(minutes=45)


def test_bad_policy_names_every_offending_key() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_policy(
            "mode: {default: yolo, actions: {reboot: auto}}\n"
            "rails: {max_isolated_fraction: 2, restart_budget: -1, typo_key: 1}\n"
            "approval: {timeout: soon}\n",
            "site.yaml",
        )
    message = str(caught.value)
    assert "site.yaml" in message
    for key in (
        "mode.default",
        "mode.actions.reboot",
        "rails.max_isolated_fraction",
        "rails.restart_budget",
        "rails.typo_key",
        "approval.timeout",
    ):
        assert key in message, key
    assert len(caught.value.problems) == 6


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("mode: [", "not valid YAML"),
        ("- a\n- b\n", "expected a mapping"),
        ("rails: 5", "rails"),
    ],
)
def test_malformed_policy_files(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_policy(text)


def test_unreadable_and_binary_policy_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_policy(tmp_path / "absent.yaml")
    binary = tmp_path / "garbage.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_policy(binary)


def test_empty_policy_file_means_defaults(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    assert load_policy(empty) == Policy()


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRAINMEDIC_CLUSTER", "prod-a")
    monkeypatch.setenv("TRAINMEDIC_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("TRAINMEDIC_SLURM_COMMAND_TIMEOUT", "45s")
    monkeypatch.setenv("TRAINMEDIC_TEMPORAL_API_KEY", "s3cret")
    settings = load_settings()
    assert settings.cluster == "prod-a"
    assert settings.temporal_dir == tmp_path / "temporal"
    assert settings.slurm_command_timeout == timedelta(seconds=45)
    assert "s3cret" not in repr(settings)


def test_state_dir_defaults_under_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TRAINMEDIC_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert load_settings().state_dir == tmp_path / "trainmedic"


def test_bad_settings_name_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINMEDIC_TEMPORAL_ADDRESS", "no-port-here")
    monkeypatch.setenv("TRAINMEDIC_CLUSTER", "bad name; rm -rf")
    monkeypatch.setenv("TRAINMEDIC_SLURM_ACCESS", "telnet")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    for key in ("TRAINMEDIC_TEMPORAL_ADDRESS", "TRAINMEDIC_CLUSTER", "TRAINMEDIC_SLURM_ACCESS"):
        assert key in message


def test_ssh_access_requires_a_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINMEDIC_SLURM_ACCESS", "ssh")
    with pytest.raises(ConfigError, match="TRAINMEDIC_SSH_HOST"):
        load_settings()
