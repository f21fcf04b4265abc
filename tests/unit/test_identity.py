"""A state directory remembers which topics it was restored from (identity.py)."""

from pathlib import Path

import pytest

from processor.runtimes.errors import WorkerError
from processor.runtimes.identity import FILE, Identity, reconcile

pytestmark = pytest.mark.unit
FIRST = Identity("cluster-a", {"t.proposals": "id1", "t.runs-changelog": "id2"}, 6)


def _stores(root: Path) -> list[Path]:
    stores = [root / "p0", root / "p1"]
    for store in stores:
        store.mkdir(parents=True)
        (store / "data").write_text("x")
    return stores


def test_the_same_topics_keep_the_stores(tmp_path: Path) -> None:
    stores = _stores(tmp_path)
    assert reconcile(tmp_path, FIRST, stores) is False  # first start: kept as they are
    assert (tmp_path / FILE).exists()
    assert reconcile(tmp_path, FIRST, stores) is False
    assert all((s / "data").exists() for s in stores)


@pytest.mark.parametrize(
    "now",
    [
        Identity("cluster-b", FIRST.topic_ids, 6),  # another cluster
        Identity("cluster-a", {**FIRST.topic_ids, "t.runs-changelog": "id9"}, 6),  # recreated
    ],
)
def test_other_topics_discard_the_stores(tmp_path: Path, now: Identity) -> None:
    stores = _stores(tmp_path)
    reconcile(tmp_path, FIRST, stores)
    assert reconcile(tmp_path, now, stores) is True
    assert not any(s.exists() for s in stores)
    assert reconcile(tmp_path, now, []) is False  # and the new identity is kept


def test_a_changed_partition_count_stops_the_worker(tmp_path: Path) -> None:
    stores = _stores(tmp_path)
    reconcile(tmp_path, FIRST, stores)
    grown = Identity(FIRST.cluster_id, FIRST.topic_ids, 12)
    with pytest.raises(WorkerError, match=r"has 12 partitions, but the state .* built with 6"):
        reconcile(tmp_path, grown, stores)
    assert all((s / "data").exists() for s in stores)  # nothing discarded, nothing moved
    with pytest.raises(WorkerError):  # not forgotten by a second try either
        reconcile(tmp_path, grown, stores)


def test_an_unreadable_identity_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / FILE).write_text("{not json")
    with pytest.raises(WorkerError, match="delete it"):
        reconcile(tmp_path, FIRST, [])
