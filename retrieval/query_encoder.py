"""The query encoder a retriever uses: the one its build names, checked against the build,
and its window: the tokens of a query it reads (``QueryWindow``)."""

from __future__ import annotations

from pathlib import Path

from indexes.distilled_encoder import META, SHIPPED, DistilledEncoder, DistilledEncoderError
from indexes.encoders import (
    DEFAULT_MODEL,
    Encoder,
    SentenceTransformerEncoder,
    compatible_query_encoder,
    default_model_path,
)
from indexes.errors import EncoderMismatchError
from indexes.passages import SPECIAL_TOKENS, TokenCounter
from retrieval.config import RetrieverConfig
from retrieval.loaded_build import LoadedBuild

DISTILLED_DIR = "distilled"  # ROOT/distilled: what `retrieval distill ROOT` trains


def default_encoder(snapshot: LoadedBuild, config: RetrieverConfig,
                    root: Path | None = None) -> Encoder | None:
    """The encoder the build names; None for builds from precomputed (external) vectors."""
    info = snapshot.manifest.encoder
    if config.encoder_model_path is None and info.model != DEFAULT_MODEL:
        return None
    if config.encoder_backend == "torch":
        return SentenceTransformerEncoder(config.encoder_model_path)
    if config.encoder_backend == "distilled":
        # Its rows are the teacher's token ids: the model configured is the one to tokenize.
        return DistilledEncoder.load(distilled_dir(config, root),
                                     model_dir=config.encoder_model_path)
    from indexes.onnx_encoder import make_encoder

    return make_encoder(config.encoder_backend, config.encoder_model_path)


def distilled_dir(config: RetrieverConfig, root: Path | None) -> Path:
    """The configured distilled encoder, else the index root's own, else the shipped one.

    Only `retrieval distill ROOT` makes ``ROOT/distilled``, when it saves the trained encoder
    (its per-token row cache lives beside the teacher's model, not there), and it writes
    ``encoder.json`` last: a ``distilled`` directory without one is an encoder the operator
    meant to use whose save did not finish, or whose JSON was removed. Serving the shipped
    encoder in its place would hide that, so it is refused.
    """
    if config.distilled_encoder_path is not None:
        return Path(config.distilled_encoder_path)
    # ``root`` is an index root, or one of its build directories (ROOT/builds/<id>).
    homes = [] if root is None else [root] + (
        [root.parent.parent] if root.parent.name == "builds" else [])
    for home in homes:
        own = home / DISTILLED_DIR
        if (own / META).is_file():
            return own
        if own.exists() or own.is_symlink():
            raise unfinished_distilled_dir(own, home)
    return SHIPPED


def unfinished_distilled_dir(own: Path, home: Path) -> DistilledEncoderError:
    return DistilledEncoderError(
        f"{own} holds no {META}: `retrieval distill` did not finish saving the index's own "
        f"query encoder there (it writes {META} last), or the file was removed. Run "
        f"`retrieval distill {home}` again to train it, or remove {own} to search with the "
        "shipped distilled encoder")


def check_encoder(encoder: Encoder, snapshot: LoadedBuild) -> None:
    expected = snapshot.manifest.encoder
    compatible = compatible_query_encoder(encoder.encoder_id, expected.encoder_id)
    if not compatible or encoder.dim != expected.dim:
        raise EncoderMismatchError(
            f"query encoder {encoder.encoder_id!r} does not match the index's "
            f"{expected.encoder_id!r}; load the retriever with the encoder the index was built "
            "with (or a declared compatible backend of the same model), or rebuild the index"
        )


class QueryWindow(TokenCounter):
    """The window of a query encoder's model (256 tokens for all-MiniLM-L6-v2): the vector of
    a longer query comes from its first tokens only, the words past them count for BM25
    alone, which ``warning`` tells the caller.

    Only a query that may not fit is tokenized (~0.5 ms for 1,500 characters): with a WordPiece
    tokenizer behind a BERT normalizer (or none) a text has at most as many tokens as UTF-8
    bytes (a token is at least one character of the normalized text, and normalizing, the
    NFD of accent stripping included, never makes more characters than a code point has bytes:
    a Hangul syllable, 3 bytes, becomes at most 3 jamo; checked over all of Unicode). Any
    other tokenizer's count has no such bound here, so it tokenizes every query.
    """

    def __init__(self, model_dir: Path, window: int, model: str) -> None:
        super().__init__(model_dir, window)
        from tokenizers import models, normalizers

        from indexes.onnx_encoder import lowercases

        self.model = model
        self._lowercase = lowercases(model_dir)  # as the encoders do before tokenizing
        bounded = isinstance(self._tokenizer.model, models.WordPiece) and (
            self._tokenizer.normalizer is None
            or isinstance(self._tokenizer.normalizer, normalizers.BertNormalizer))
        self._fitting_bytes = window - SPECIAL_TOKENS if bounded else -1

    def fits(self, query: str) -> bool:
        """Whether ``query`` surely fits the window, without tokenizing it."""
        if query.isascii():  # a flag CPython keeps on the string: no scan
            return len(query) <= self._fitting_bytes
        return (len(query) * 4 <= self._fitting_bytes  # UTF-8: at most 4 bytes a character
                or len(query.encode("utf-8", "surrogatepass")) <= self._fitting_bytes)

    def warning(self, query: str) -> str | None:
        """What the encoder leaves out of ``query``; None when it reads all of it."""
        if self.fits(query):
            return None
        tokens = int(self.count([query.lower() if self._lowercase else query])[0])
        if tokens <= self.window:
            return None
        return (f"the query encoder ({self.model}) read {self.window - SPECIAL_TOKENS} of the "
                f"query's {tokens - SPECIAL_TOKENS} tokens: the words past them count for BM25 "
                "only; shorten the query to have all of it embedded")


def query_window(encoder: Encoder | None) -> QueryWindow | None:
    """The window of ``encoder``'s model: of a model directory's encoder (``model_path``: both
    of ours), or the distilled one (it reads the shipped model's tokens); None for no encoder
    and any other, whose window is not known here (no warning)."""
    path = default_model_path() if isinstance(encoder, DistilledEncoder) \
        else getattr(encoder, "model_path", None)
    if encoder is None or path is None or not (Path(path) / "tokenizer.json").is_file():
        return None
    from indexes.onnx_encoder import max_seq_length

    return QueryWindow(Path(path), max_seq_length(Path(path)), encoder.model)
