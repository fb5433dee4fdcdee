"""The distilled query encoder when a distillation did not finish: an index root whose
``distilled`` directory lacks ``encoder.json`` is refused, not served the shipped encoder, and a
save that fails part way leaves the encoder saved before it whole."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from small_index import small_index

from indexes.distilled_encoder import (
    META,
    SCALES,
    SHIPPED,
    TABLE,
    DistilledEncoder,
    DistilledEncoderError,
    save_table,
    table_checksum,
)
from retrieval import Retriever

DISTILLED = {"encoder_backend": "distilled", "cache": {"backend": "none"}}


@pytest.fixture(scope="module")
def small_root(dataset, encoder) -> Path:
    return small_index(dataset("cranfield"), encoder)


@pytest.mark.parametrize("left", ["nothing", "arrays", "partial file"])
def test_a_distilled_directory_without_its_json_is_refused(small_root, tmp_path, left):
    root = Path(shutil.copytree(small_root, tmp_path / "root"))
    own = root / "distilled"
    own.mkdir()
    if left == "arrays":  # a first save stopped before its JSON was renamed into place
        for name in (TABLE, SCALES):
            shutil.copy(SHIPPED / name, own / name)
    elif left == "partial file":  # a first save killed while writing
        (own / f".{TABLE}.abc123.tmp").write_bytes(b"\x93NUMPY")
    build = next((root / "builds").iterdir())
    for path in (root, build):  # an index root, or one of its builds
        with pytest.raises(DistilledEncoderError) as refused:
            Retriever.load(path, DISTILLED)
        message = str(refused.value)
        assert f"{own} holds no {META}" in message
        assert f"`retrieval distill {root}` again" in message
        assert f"remove {own}" in message


def test_a_save_that_fails_part_way_keeps_the_previous_encoder(tmp_path):
    folder = Path(shutil.copytree(SHIPPED, tmp_path / "enc"))
    before = DistilledEncoder.load(folder)
    newer_rows = np.roll(before.rows, 1, axis=0)  # a valid table, unlike the saved one
    # numpy writes the header of an object array's file, then cannot store the lock in it
    unstorable = np.array([threading.Lock()] * len(before.scales), dtype=object)
    with pytest.raises((ValueError, TypeError)):
        save_table(newer_rows, unstorable, before.info, folder)
    after = DistilledEncoder.load(folder)
    assert after.encoder_id == before.encoder_id and after.info == before.info
    assert np.array_equal(after.rows, before.rows)
    assert np.array_equal(after.scales, before.scales)
    assert sorted(p.name for p in folder.iterdir()) == sorted([META, SCALES, TABLE])


def test_a_save_over_an_encoder_replaces_it_and_leaves_no_partial_files(tmp_path):
    folder = Path(shutil.copytree(SHIPPED, tmp_path / "enc"))
    before = DistilledEncoder.load(folder)
    rows = np.roll(before.rows, 1, axis=0)
    info = before.info.model_copy(update={"checksum": table_checksum(rows, before.scales)})
    save_table(rows, before.scales, info, folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted([META, SCALES, TABLE])
    after = DistilledEncoder.load(folder)
    assert after.info == info and np.array_equal(after.rows, rows)
