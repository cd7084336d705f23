"""Ports chosen now and bound later (app/fleet/ports.py): a port one live process was given
is never given to another, nor twice to the same one, even before anyone binds it (the
suite's two lanes each choose dozens, and one lane's server once bound the port the
other's fleet had chosen for its router); a claim whose process exited is taken over."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.fleet import ports


class _Rigged:
    """A random source that offers `offers` in turn, then gives up."""

    def __init__(self, offers: list[int]) -> None:
        self._offers = iter(offers)

    def choice(self, _: range) -> int:
        try:
            return next(self._offers)
        except StopIteration:
            raise LookupError("no port offered was given") from None


@pytest.fixture
def claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(ports, "_CLAIMS", tmp_path)
    monkeypatch.setattr(ports, "_mine", set())
    yield tmp_path


def _offering(monkeypatch: pytest.MonkeyPatch, *offers: int) -> None:
    monkeypatch.setattr(ports, "_random", _Rigged(list(offers)))


def test_a_port_is_given_once_in_a_process(claims: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _offering(monkeypatch, 23001, 23001, 23002)
    assert [ports.free_port(), ports.free_port()] == [23001, 23002]
    assert (claims / "23001").read_text() == str(os.getpid())


def test_a_live_processs_claim_keeps_its_port_from_others(
    claims: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (claims / "23001").write_text(str(other.pid))
        _offering(monkeypatch, 23001, 23003)
        assert ports.free_port() == 23003
        assert (claims / "23001").read_text() == str(other.pid)
    finally:
        other.kill()
        other.wait()


def test_an_exited_processs_claim_is_taken_over(
    claims: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    (claims / "23001").write_text(gone.stdout.strip())
    _offering(monkeypatch, 23001)
    assert ports.free_port() == 23001


def test_another_process_is_never_given_a_claimed_port(claims: Path) -> None:
    """Two real processes, each choosing many ports from a range barely larger: none
    is given to both."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from app.fleet import ports\n"
        f"ports._CLAIMS = Path({str(claims)!r})\n"
        "ports._PORTS = range(24000, 24100)\n"
        "print(*(ports.free_port() for _ in range(40)))\n"
        "sys.stdout.flush(); sys.stdin.read()\n"  # holds its claims until told to exit
    )
    root = Path(__file__).resolve().parents[2]
    pickers = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            cwd=root,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    try:
        given = [set(map(int, p.stdout.readline().split())) for p in pickers if p.stdout]
    finally:
        for picker in pickers:
            picker.communicate("")
    assert [len(g) for g in given] == [40, 40]
    assert not given[0] & given[1]
    assert not list(claims.iterdir()), "each process removes its claims as it exits"


def test_a_process_removes_its_claims_as_it_exits(claims: Path) -> None:
    script = (
        "from pathlib import Path\n"
        "from app.fleet import ports\n"
        f"ports._CLAIMS = Path({str(claims)!r})\n"
        "ports.free_port()\n"
        "assert len(list(ports._CLAIMS.iterdir())) == 1\n"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", script], cwd=root, check=True)
    assert not list(claims.iterdir())
