"""Model directories other than the packaged one, on every backend: the layout the installed
sentence-transformers (6.x) saves, modules the ONNX backends do not run, and the weights that
name a model in encoder ids.

Each model here is the packaged MiniLM copied into ``tmp_path`` with its weights symlinked and
its sentence-transformers files edited. The transformer graph depends on the weights and
``config.json`` alone, which the copies keep, so the ONNX backends reuse the packaged model's
cached export instead of exporting again.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from indexes.build import build_index
from indexes.corpus import read_corpus
from indexes.encoders import (
    DEFAULT_MODEL,
    SentenceTransformerEncoder,
    compatible_query_encoder,
    default_model_path,
    model_name,
    weights_digest,
    weights_files,
)
from indexes.errors import EncoderMismatchError, RetrievalError
from indexes.onnx_encoder import (
    OnnxEncoder,
    UnknownBackendError,
    check_mean_pooling,
    check_onnx_runs,
    default_cache_dir,
    make_encoder,
    max_seq_length,
)
from indexes.passages import TokenCounter
from retrieval import Retriever

SHIPPED = default_model_path()
DISTILLED_META = Path(__file__).resolve().parents[1] / "indexes" / "distilled" / DEFAULT_MODEL
ST6 = "sentence_transformers"
TRANSFORMER = {"idx": 0, "name": "0", "path": "",
               "type": f"{ST6}.base.modules.transformer.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling",
           "type": f"{ST6}.sentence_transformer.modules.pooling.Pooling"}
DENSE = {"idx": 2, "name": "2", "path": "2_Dense", "type": f"{ST6}.base.modules.dense.Dense"}
NORMALIZE = {"idx": 3, "name": "3", "path": "3_Normalize",
             "type": f"{ST6}.base.modules.normalize.Normalize"}
# Long enough (about 400 tokens) that a 512-token window reads more of it than torch's 256.
LONG_TEXT = " ".join(["the boundary layer on a flat plate at supersonic speed"] * 40)
TEXTS = ["heat transfer to a blunt body in hypersonic flow", "flutter of panels", LONG_TEXT]


def write_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


def st6_copy(target: Path) -> Path:
    """The packaged model re-laid out as sentence-transformers 6.x saves it: 6.x module
    types, ``{"pooling_mode": "mean"}``, no ``max_seq_length`` in sentence_bert_config.json
    (6.x writes the window to tokenizer_config.json's ``model_max_length``)."""
    shutil.copytree(SHIPPED, target, ignore=shutil.ignore_patterns("model.safetensors"))
    (target / "model.safetensors").symlink_to(SHIPPED / "model.safetensors")
    tokenizer_config = json.loads((target / "tokenizer_config.json").read_text())
    window = json.loads((SHIPPED / "sentence_bert_config.json").read_text())["max_seq_length"]
    write_json(target / "tokenizer_config.json", {**tokenizer_config, "model_max_length": window})
    write_json(target / "sentence_bert_config.json", {
        "transformer_task": "feature-extraction", "module_output_name": "token_embeddings"})
    write_json(target / "1_Pooling" / "config.json",
               {"embedding_dimension": 384, "pooling_mode": "mean", "include_prompt": True})
    write_json(target / "3_Normalize" / "config.json", {})
    write_json(target / "modules.json", [TRANSFORMER, POOLING, NORMALIZE])
    return target


def with_dense(source: Path, target: Path, seed: int = 0) -> Path:
    """``source`` with a Dense head (384 -> 384) between pooling and normalization."""
    shutil.copytree(source, target, symlinks=True)
    write_json(target / "2_Dense" / "config.json", {
        "in_features": 384, "out_features": 384, "bias": True,
        "activation_function": "torch.nn.modules.linear.Identity"})
    write_dense_weights(target / "2_Dense" / "model.safetensors", seed)
    write_json(target / "modules.json", [TRANSFORMER, POOLING, DENSE, NORMALIZE])
    return target


def write_dense_weights(path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    save_file({"linear.weight": (rng.standard_normal((384, 384)) / 20).astype(np.float32),
               "linear.bias": np.zeros(384, dtype=np.float32)}, str(path))


@pytest.fixture(scope="module")
def st6_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Named as the packaged directory: a retriever loading it finds the packaged model's
    # export in the default cache (<directory name>-<weights digest>), already made.
    return st6_copy(tmp_path_factory.mktemp("st6") / SHIPPED.name)


@pytest.fixture(scope="module")
def shared_cache() -> Path:
    """The packaged model's own export cache: the copies' graph is the same."""
    return default_cache_dir(SHIPPED)


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("nd,nd->n", a.astype(np.float64), b.astype(np.float64))


def test_a_model_saved_by_sentence_transformers_6_runs_on_onnx_with_the_torch_vectors(
        st6_model, shared_cache):
    torch_encoder = SentenceTransformerEncoder(st6_model)
    onnx = OnnxEncoder(st6_model, cache_dir=shared_cache)
    assert onnx.encoder_id == f"{DEFAULT_MODEL}:onnx:fp32:384"  # the same weights, the same name
    assert compatible_query_encoder(onnx.encoder_id, torch_encoder.encoder_id)
    assert onnx.max_seq_length == torch_encoder._model.max_seq_length == 256
    cosines = row_cosines(onnx.encode(TEXTS, batch_size=2), torch_encoder.encode(TEXTS))
    assert cosines.min() > 0.999, cosines  # the long text too: both read its first 256 tokens
    int8 = make_encoder("onnx-int8", st6_model, cache_dir=shared_cache)
    assert row_cosines(int8.encode(TEXTS), torch_encoder.encode(TEXTS)).min() > 0.95


def test_a_retriever_loads_a_sentence_transformers_6_model_on_its_default_backend(
        st6_model, dataset, tmp_path):
    docs = list(itertools.islice(read_corpus(dataset("cranfield")), 10))
    build_index(docs, tmp_path / "root", encoder=SentenceTransformerEncoder(st6_model),
                progress=False)
    config = {"encoder_model_path": str(st6_model), "cache": {"backend": "none"},
              "live_lag_seconds": None}
    with Retriever.load(tmp_path / "root", config) as retriever:  # onnx-int8, the default
        assert retriever.search("flow over a flat plate", k=3).hits


def test_the_window_is_sentence_bert_config_then_tokenizer_config_capped_at_positions(
        st6_model, tmp_path):
    assert max_seq_length(st6_model) == 256
    assert TokenCounter.for_model(st6_model).window == 256  # passages are cut to fit it
    assert max_seq_length(SHIPPED) == 256  # sentence_bert_config.json says 256, tokenizer 512
    model = tmp_path / "model"
    write_json(model / "config.json", {"max_position_embeddings": 512})
    assert max_seq_length(model) == 512  # nothing configured: the position embeddings
    write_json(model / "tokenizer_config.json", {"model_max_length": 1_000_000_000_000})
    assert max_seq_length(model) == 512  # transformers' "no limit", capped
    write_json(model / "tokenizer_config.json", {"model_max_length": 200})
    assert max_seq_length(model) == 200
    write_json(model / "sentence_bert_config.json", {"max_seq_length": 128})
    assert max_seq_length(model) == 128


@pytest.mark.parametrize("config", [
    {"embedding_dimension": 384, "pooling_mode": "mean", "include_prompt": True},
    {"embedding_dimension": 384, "pooling_mode": ["mean"]},
    {"word_embedding_dimension": 384, "pooling_mode_cls_token": False,
     "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
     "pooling_mode_mean_sqrt_len_tokens": False},
])
def test_mean_pooling_is_read_in_both_layouts(tmp_path, config):
    write_json(tmp_path / "1_Pooling" / "config.json", config)
    check_mean_pooling(tmp_path / "1_Pooling" / "config.json")


@pytest.mark.parametrize("config", [
    {"embedding_dimension": 384, "pooling_mode": "cls"},
    {"embedding_dimension": 384, "pooling_mode": ["mean", "max"]},
    {"embedding_dimension": 384, "pooling_mode": None},
    {"word_embedding_dimension": 384, "pooling_mode_cls_token": True,
     "pooling_mode_mean_tokens": False},
    {"word_embedding_dimension": 384, "pooling_mode_mean_tokens": True,
     "pooling_mode_max_tokens": True},
])
def test_other_pooling_is_refused_naming_the_file_and_the_torch_backend(tmp_path, config):
    write_json(tmp_path / "1_Pooling" / "config.json", config)
    with pytest.raises(EncoderMismatchError) as error:
        check_mean_pooling(tmp_path / "1_Pooling" / "config.json")
    assert str(tmp_path / "1_Pooling" / "config.json") in str(error.value)
    assert 'encoder_backend="torch"' in str(error.value)


def test_a_dense_head_is_refused_by_the_onnx_backends(st6_model, shared_cache, tmp_path):
    """The ONNX graph runs the transformer, then pooling and normalization: a Dense head in
    between was dropped without a word, and torch and ONNX gave other vectors for the same
    directory (cosine about 0.1) under ids declared compatible."""
    dense = with_dense(st6_model, tmp_path / "minilm-dense")
    for backend in ("onnx", "onnx-int8"):
        with pytest.raises(EncoderMismatchError, match="Transformer, Pooling, Dense, Normalize"
                           ) as error:
            make_encoder(backend, dense, cache_dir=shared_cache)
        assert str(dense / "modules.json") in str(error.value)
        assert 'encoder_backend="torch"' in str(error.value)
    plain = SentenceTransformerEncoder(st6_model).encode(TEXTS[:2])
    torch_dense = SentenceTransformerEncoder(dense)  # torch runs every module
    assert row_cosines(torch_dense.encode(TEXTS[:2]), plain).max() < 0.9


def modules_dir(root: Path, modules: list[dict[str, str]], **configs: object) -> Path:
    write_json(root / "modules.json", modules)
    for relative, value in configs.items():
        write_json(root / relative.replace("__", "/"), value)
    return root


@pytest.mark.parametrize(("modules", "configs", "message"), [
    ([TRANSFORMER, {**POOLING, "type": "my_package.Pooling"}], {}, "my_package.Pooling"),
    ([{**TRANSFORMER, "path": "0_Transformer"}, POOLING], {}, "subfolder '0_Transformer'"),
    ([TRANSFORMER], {}, "its modules are Transformer;"),
    ([TRANSFORMER, POOLING, {**NORMALIZE, "path": "2_Normalize"}],
     {"2_Normalize__config.json": {"module_input_name": "token_embeddings"}}, "normalizes"),
    ([TRANSFORMER, POOLING],
     {"config_sentence_transformers.json": {"default_prompt_name": "query",
                                            "prompts": {"query": "query: "}}}, "prompt"),
])
def test_what_the_onnx_backends_do_not_run_is_refused(tmp_path, modules, configs, message):
    model = modules_dir(tmp_path, modules, **configs)
    with pytest.raises(EncoderMismatchError, match=message):
        check_onnx_runs(model)


def test_what_the_onnx_backends_run_is_accepted(st6_model, tmp_path):
    check_onnx_runs(SHIPPED)  # the pre-6.x layout
    check_onnx_runs(st6_model)
    check_onnx_runs(tmp_path)  # no modules.json: sentence-transformers pools by mean itself
    check_onnx_runs(modules_dir(tmp_path / "prompts", [TRANSFORMER, POOLING], **{
        "config_sentence_transformers.json": {"default_prompt_name": None,
                                              "prompts": {"query": "", "document": ""}}}))


def test_a_dense_head_model_keeps_the_name_its_indexes_hold(st6_model, tmp_path):
    """Indexes built with a Dense-head model hold the name digested from its top-level
    weights alone: digesting the head too made every one of them refuse its query encoder."""
    dense = with_dense(st6_model, tmp_path / "minilm-dense")
    assert weights_files(dense) == [dense / "model.safetensors"]
    top = hashlib.sha256((dense / "model.safetensors").read_bytes()).hexdigest()[:12]
    assert weights_digest(dense) == top
    encoder = SentenceTransformerEncoder(dense)
    assert encoder.model == DEFAULT_MODEL  # its transformer is the packaged one, byte for byte
    assert compatible_query_encoder(encoder.encoder_id, f"{DEFAULT_MODEL}:torch:fp32:384")


def test_the_packaged_model_keeps_its_digest_and_name(st6_model):
    """Every index, ONNX cache directory and calibration names the packaged model by its
    weights' digest as it was before module weights counted: the sha256 of its one weights
    file (it has no module weights: Pooling and Normalize hold none)."""
    weights = SHIPPED / "model.safetensors"
    assert weights_files(SHIPPED) == [weights]
    assert weights_digest(SHIPPED) == hashlib.sha256(weights.read_bytes()).hexdigest()[:12]
    assert default_cache_dir(SHIPPED).name == f"{SHIPPED.name}-{weights_digest(SHIPPED)}"
    assert model_name(SHIPPED) == model_name(st6_model) == DEFAULT_MODEL
    teacher = json.loads((DISTILLED_META / "encoder.json").read_text())["teacher_id"]
    assert teacher == f"{model_name(SHIPPED)}:onnx:fp32:384"  # what the shipped table recorded


def test_encode_ids_of_nothing_and_past_the_window(shared_cache):
    onnx = OnnxEncoder(cache_dir=shared_cache)
    assert onnx.encode_ids([]).shape == (0, 384)
    (cls, sep), word = onnx.token_ids([""])[0], onnx.token_ids(["flow"])[0][1]
    long_row = [cls] + [word] * 600 + [sep]
    cut = [cls] + [word] * (onnx.max_seq_length - 2) + [sep]  # as the tokenizer cuts a text
    np.testing.assert_allclose(onnx.encode_ids([long_row]), onnx.encode_ids([cut]), atol=1e-6)
    np.testing.assert_allclose(onnx.encode_ids([cut]), onnx.encode([" ".join(["flow"] * 600)]),
                               atol=1e-5)


def test_an_unknown_backend_is_a_typed_error():
    with pytest.raises(UnknownBackendError, match="onnx-fp16") as error:
        make_encoder("onnx-fp16")
    assert isinstance(error.value, RetrievalError) and isinstance(error.value, ValueError)
