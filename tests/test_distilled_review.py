"""The distilled query encoder on bad input: damaged or mismatched encoder directories are
refused with ``DistilledEncoderError`` when loaded (not at the first query, nor by giving wrong
vectors), bad training input and settings with typed errors, and the teacher's per-token rows
are cached per precision, so which teacher ran first cannot change a trained table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from small_index import small_index

from indexes.distill import DistillSettings, distill, vocabulary_rows
from indexes.distilled_encoder import (
    META,
    SCALES,
    SHIPPED,
    TABLE,
    DistilledEncoder,
    DistilledEncoderError,
    DistilledInfo,
    quantize_rows,
    save_table,
    table_checksum,
)
from indexes.errors import CorpusError
from indexes.onnx_encoder import OnnxEncoder
from retrieval.cli import main as cli


@pytest.fixture
def shipped_copy(tmp_path) -> Path:
    return Path(shutil.copytree(SHIPPED, tmp_path / "enc"))


def _saved(rows_float: np.ndarray, folder: Path, model: str = "all-MiniLM-L6-v2") -> Path:
    """A table saved as training saves one: its checksum matches, whatever it holds."""
    rows, scales = quantize_rows(rows_float.astype(np.float32))
    info = DistilledInfo(model=model, teacher_id=f"{model}:onnx:fp32:384", dim=rows.shape[1],
                         vocab_size=rows.shape[0], checksum=table_checksum(rows, scales),
                         trained_on="random rows")
    return save_table(rows, scales, info, folder)


@pytest.mark.parametrize("name", [TABLE, SCALES])
def test_a_missing_array_is_refused(shipped_copy, name):
    (shipped_copy / name).unlink()
    with pytest.raises(DistilledEncoderError, match=f"{name} is missing"):
        DistilledEncoder.load(shipped_copy)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "archive"])
def test_a_damaged_array_is_refused(shipped_copy, damage):
    path = shipped_copy / TABLE
    data = path.read_bytes()
    if damage == "archive":  # an .npz written under the .npy name
        with path.open("wb") as out:
            np.savez(out, rows=np.load(shipped_copy / SCALES))
    else:
        path.write_bytes({"truncated": data[:1000], "garbage": b"not an array",
                          "empty": b""}[damage])
    with pytest.raises(DistilledEncoderError, match="train the encoder again"):
        DistilledEncoder.load(shipped_copy)


def test_an_encoder_of_another_model_is_refused(shipped_copy):
    """Its id would name the other model and pass the index's check, while the shipped
    model's tokenizer picked its rows."""
    info = json.loads((shipped_copy / META).read_text())
    (shipped_copy / META).write_text(json.dumps({**info, "model": "other-model@0123456789ab"}))
    with pytest.raises(DistilledEncoderError, match="distilled from 'other-model@"):
        DistilledEncoder.load(shipped_copy)


@pytest.mark.parametrize("vocab_size", [100, 40_000])
def test_a_table_of_another_vocabulary_is_refused_when_loaded(tmp_path, vocab_size):
    """Fewer rows than tokens failed at the first query (IndexError); more loaded silently."""
    folder = _saved(np.random.default_rng(0).standard_normal((vocab_size, 384)), tmp_path / "e")
    with pytest.raises(DistilledEncoderError, match=f"{vocab_size} rows"):
        DistilledEncoder.load(folder)


def test_non_finite_scales_are_refused(shipped_copy):
    """A NaN scale made every query holding its token a NaN vector."""
    rows, scales = np.load(shipped_copy / TABLE), np.load(shipped_copy / SCALES)
    scales[:] = np.nan
    np.save(shipped_copy / SCALES, scales)
    info = json.loads((shipped_copy / META).read_text())
    (shipped_copy / META).write_text(json.dumps({**info,
                                                 "checksum": table_checksum(rows, scales)}))
    with pytest.raises(DistilledEncoderError, match="positive finite"):
        DistilledEncoder.load(shipped_copy)


@pytest.fixture(scope="module")
def teacher() -> OnnxEncoder:
    return OnnxEncoder(quantized=False)


@pytest.mark.parametrize("corpus", [[], ["", "  \n\t "]])
def test_a_corpus_without_words_is_a_corpus_error(corpus, teacher):
    with pytest.raises(CorpusError, match="no words"):
        distill(corpus, "nothing", DistillSettings(texts=100), teacher, log=lambda _: None)


@pytest.mark.parametrize("settings", [{"seed": -1}, {"texts": 0}, {"held_out": 1.0},
                                      {"min_words": 5, "max_words": 2}, {"batch_size": 0}])
def test_settings_numpy_would_refuse_late_are_refused_when_made(settings):
    with pytest.raises(ValidationError):
        DistillSettings(**settings)


def test_distill_command_refuses_a_negative_seed_as_a_bad_flag(dataset, encoder, capsys):
    root = small_index(dataset("cranfield"), encoder)
    assert cli(["distill", str(root), "--seed", "-1", "--texts", "300"]) == 2
    assert "--seed" in capsys.readouterr().err
    assert not (root / "distilled").exists()


class FirstTokens(OnnxEncoder):
    """The real teacher over its first 64 token ids only: a whole vocabulary is most of a
    minute per precision on 2 cores."""

    vocab_size = 64  # type: ignore[assignment]


def test_int8_and_fp32_teachers_cache_their_token_rows_apart(monkeypatch, tmp_path):
    """An INT8 teacher's rows, cached first, were served to an fp32 teacher (0.05 apart), so
    a table trained on the same passages and seed depended on what ran before it."""
    int8, fp32 = FirstTokens(quantized=True), FirstTokens(quantized=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # a cache of this test's own
    int8_rows = vocabulary_rows(int8)
    fp32_rows = vocabulary_rows(fp32)
    ids = fp32.token_ids([""])[0]
    own = fp32.encode_ids([[ids[0], t, ids[-1]] for t in range(64)])
    assert np.allclose(fp32_rows, own, atol=1e-5)
    assert not np.allclose(int8_rows, fp32_rows, atol=1e-5)
    assert np.array_equal(vocabulary_rows(fp32), fp32_rows)  # read back from the cache


def test_a_retriever_loads_an_encoder_distilled_from_its_configured_model(
        shipped_copy, tmp_path, dataset, encoder):
    """Loading checks the tokenizing model against ``encoder.json``; the retriever loaded it
    with the shipped model whatever ``encoder_model_path`` said, so an encoder distilled from
    a user's own model (a fine-tuned MiniLM) was refused."""
    from indexes.encoders import default_model_path, model_name
    from retrieval.config import RetrieverConfig
    from retrieval.query_encoder import default_encoder

    tuned = Path(shutil.copytree(default_model_path(), tmp_path / "tuned-minilm"))
    with open(tuned / "model.safetensors", "ab") as weights:
        weights.write(b" ")  # other weights, the same tokenizer
    info = json.loads((shipped_copy / META).read_text())
    (shipped_copy / META).write_text(json.dumps({**info, "model": model_name(tuned)}))
    from retrieval.loaded_build import LoadedBuild

    build = LoadedBuild.load(small_index(dataset("cranfield"), encoder))
    config = RetrieverConfig(encoder_backend="distilled", encoder_model_path=str(tuned),
                             distilled_encoder_path=str(shipped_copy))
    encoder = default_encoder(build, config)
    assert encoder is not None and encoder.model == model_name(tuned)
