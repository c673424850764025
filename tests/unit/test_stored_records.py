"""The records stored beside the results (docs/data/*-records.tgz) hold records only: no run's
credentials, server config or JetStream store, which two archives of 29 Nov 2026 carried when they
were packed by hand from a run directory that then held them."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "docs" / "data"
ARCHIVES = sorted(DATA.glob("*.tgz"))


def _private(name: str) -> bool:
    parts = Path(name).parts
    return name.endswith((".creds", ".conf")) or "auth" in parts or "jetstream" in parts


def test_there_are_archives_to_check():
    assert len(ARCHIVES) >= 10


@pytest.mark.parametrize("archive", ARCHIVES, ids=[a.name for a in ARCHIVES])
def test_a_stored_archive_holds_no_credentials_or_server_state(archive):
    with tarfile.open(archive) as t:
        names = t.getnames()
    assert names
    assert not [n for n in names if _private(n)]
