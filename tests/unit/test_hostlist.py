from __future__ import annotations

import pytest

from trainmedic.domain.hostlist import HostlistError, compress, expand, validate_node_name


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("gpu01", ["gpu01"]),
        ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
        ("gpu[1-2,10],login", ["gpu1", "gpu2", "gpu10", "login"]),
        ("n[8-10]-ib", ["n8-ib", "n9-ib", "n10-ib"]),
        ("gpu[01-02],gpu01", ["gpu01", "gpu02"]),
    ],
)
def test_expand(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


@pytest.mark.parametrize("expr", ["gpu[01-", "gpu]", "gpu[3-1]", "gpu[a-b]", "-rf", "a b", "x=y"])
def test_expand_rejects(expr: str) -> None:
    with pytest.raises(HostlistError):
        expand(expr)


def test_expand_is_bounded() -> None:
    with pytest.raises(HostlistError, match="more than"):
        expand("n[1-100000000]")


def test_compress_round_trips() -> None:
    names = ["gpu01", "gpu02", "gpu03", "gpu07", "login", "gpu09"]
    assert compress(names) == "gpu[01-03,07,09],login"
    assert sorted(expand(compress(names))) == sorted(names)


def test_validate_node_name() -> None:
    assert validate_node_name("gpu-a100.rack3") == "gpu-a100.rack3"
    for bad in ["", "--all", "gpu01;reboot", "gpu 01", "a" * 200]:
        with pytest.raises(HostlistError):
            validate_node_name(bad)
