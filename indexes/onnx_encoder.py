"""ONNX Runtime encoders: the sentence-transformers model exported once, run without torch.

``OnnxEncoder`` reproduces ``SentenceTransformerEncoder`` (same tokenization, mean pooling over
the attention mask, L2 normalization) on onnxruntime + the ``tokenizers`` library. The fp32 graph
matches torch to cosine 1.0000; the INT8 graph (dynamic quantization, per-channel weights) is
several times faster per query and stays within 0.005 nDCG@10 on SciFact.

sentence-transformers' own ``backend="onnx"`` needs optimum, which would downgrade transformers,
so the export is ``torch.onnx.export`` here and torch is only imported when a graph is exported.
The exported files are cached per model weights (see ``default_cache_dir``).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from indexes.cpu import usable_cores
from indexes.encoders import (
    Encoder,
    SentenceTransformerEncoder,
    default_model_path,
    model_modules,
    model_name,
    weights_digest,
)
from indexes.errors import EncoderMismatchError, RetrievalError

BACKENDS = ("torch", "onnx", "onnx-int8")
# Part of the cached file names: bump it when the export or quantization settings change, so a
# cache written by an older version is never picked up.
EXPORT_FORMAT = 1
FP32_FORMAT = 1  # the export with attention fused: what the fp32 backend runs
INT8_FORMAT = 2  # 2: attention fused before quantizing
OPSET = 17
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAME = "token_embeddings"


# -- the model directory ---------------------------------------------------------------------


def default_cache_dir(model_dir: Path) -> Path:
    """``~/.cache/retrieval/onnx/<model directory>-<weights digest>`` (``$XDG_CACHE_HOME``
    honoured)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "retrieval" / "onnx" / f"{model_dir.name}-{weights_digest(model_dir)}"


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def max_seq_length(model_dir: Path) -> int:
    """Tokens kept per text, as sentence-transformers truncates (256 for MiniLM).

    Not the tokenizer.json value: MiniLM's says 128 there, but sentence-transformers uses
    ``sentence_bert_config.json``'s ``max_seq_length``, else (sentence-transformers 6 saves
    none there) ``tokenizer_config.json``'s ``model_max_length``, capped at the model's
    position embeddings.
    """
    configured = (_read_json(model_dir / "sentence_bert_config.json").get("max_seq_length")
                  or _read_json(model_dir / "tokenizer_config.json").get("model_max_length"))
    positions = _read_json(model_dir / "config.json").get("max_position_embeddings", 512)
    return int(min(configured or positions, positions))


def lowercases(model_dir: Path) -> bool:
    """sentence-transformers lowercases before tokenizing when the model asks for it."""
    return bool(_read_json(model_dir / "sentence_bert_config.json").get("do_lower_case"))


# The sentence-transformers modules OnnxEncoder reproduces, in this order: the transformer
# (the exported graph), mean pooling and L2 normalization (``mean_pool_normalize``). Any other
# module (a Dense head, a LayerNorm) would change the vectors torch computes from the same
# directory, whose encoder id the ONNX one is declared compatible with.
RUN_MODULES = ("Transformer", "Pooling", "Normalize")
USE_TORCH = ('load it with encoder_backend="torch" (retrieval), or build with '
             '--doc-encoder torch, which run every module of the model')


def _refuse(path: Path, what: str) -> EncoderMismatchError:
    return EncoderMismatchError(
        f"{path}: {what}; the ONNX backends run a sentence-transformers model's Transformer, "
        f"mean Pooling and Normalize modules only, so their vectors would not be the model's: "
        f"{USE_TORCH}")


def check_onnx_runs(model_dir: Path) -> None:
    """Refuse (``EncoderMismatchError``, naming the file) a model whose vectors OnnxEncoder
    would not reproduce: other modules than Transformer + mean Pooling (+ Normalize), a
    transformer in a subfolder, or a default prompt that torch would prepend."""
    modules = model_modules(model_dir)
    if modules:  # no modules.json: sentence-transformers adds mean pooling itself
        _check_module_chain(model_dir, modules)
        check_mean_pooling(model_dir / modules[1]["path"] / "config.json")
        if len(modules) == 3:
            _check_normalize(model_dir / modules[2]["path"] / "config.json")
    _check_no_default_prompt(model_dir / "config_sentence_transformers.json")


def _module_kind(module_type: str) -> str:
    """``sentence_transformers.models.Pooling`` (before 6.x) and
    ``sentence_transformers.sentence_transformer.modules.pooling.Pooling`` (6.x): "Pooling";
    a class from another package is never one of ours."""
    package, _, name = module_type.rpartition(".")
    return name if package.split(".")[0] == "sentence_transformers" else module_type


def _check_module_chain(model_dir: Path, modules: list[dict[str, str]]) -> None:
    kinds = [_module_kind(m["type"]) for m in modules]
    if kinds not in (list(RUN_MODULES[:2]), list(RUN_MODULES)):
        raise _refuse(model_dir / "modules.json",
                      f"its modules are {', '.join(kinds)}")
    if modules[0]["path"]:
        raise _refuse(model_dir / "modules.json",
                      f"its Transformer lies in the subfolder {modules[0]['path']!r}")


def check_mean_pooling(pooling_config: Path) -> None:
    """Only mean pooling is implemented; refuse a Pooling module that pools otherwise. Reads
    both layouts of its ``config.json``: ``{"pooling_mode": "mean"}`` (sentence-transformers
    6.x, a list when modes are concatenated) and ``pooling_mode_mean_tokens: true`` with
    the other ``pooling_mode_*`` flags false (earlier versions)."""
    config = _read_json(pooling_config)
    if not config:  # no config: the Pooling module's default, mean
        return
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        modes = mode if isinstance(mode, list) else [mode]
    else:
        modes = [key.removeprefix("pooling_mode_") for key, value in config.items()
                 if key.startswith("pooling_mode_") and value is True]
    if modes not in (["mean"], ["mean_tokens"]):
        raise _refuse(pooling_config, f"its pooling is {modes or 'none'}, not mean")


def _check_normalize(normalize_config: Path) -> None:
    source = _read_json(normalize_config).get("module_input_name", "sentence_embedding")
    if source != "sentence_embedding":
        raise _refuse(normalize_config, f"its Normalize module normalizes {source!r}, not the "
                                        "sentence embedding")


def _check_no_default_prompt(config_path: Path) -> None:
    config = _read_json(config_path)
    name = config.get("default_prompt_name")
    prompt = (config.get("prompts") or {}).get(name) if name else None
    if prompt:
        raise _refuse(config_path, f"torch prepends its default prompt {name!r} ({prompt!r}) "
                                   "to every text")


def load_tokenizer(model_dir: Path) -> Any:
    """``tokenizers.Tokenizer`` truncating at ``max_seq_length`` and never padding.

    MiniLM's tokenizer.json pads every input to 128 tokens, which makes one short query 5x
    slower; batches are padded to their longest text by ``pad_batch`` instead.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_seq_length(model_dir))
    return tokenizer


# -- export and quantization -----------------------------------------------------------------


def _atomic_write(out_path: Path, write: Callable[[Path], object]) -> Path:
    """``write(tmp)`` then rename to ``out_path``: concurrent readers never see half a file."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{out_path.stem}.", suffix=".tmp.onnx",
                                dir=out_path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        tmp.chmod(0o644)  # mkstemp makes 0600 files; a shared cache must be readable by others
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path


def _example_inputs(model_dir: Path, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Two texts of different lengths, padded: the trace sees a real, non-trivial mask."""
    tokenizer = load_tokenizer(model_dir)
    encodings = tokenizer.encode_batch(["a short query", "a longer document about proteins"])
    batch = pad_batch(encodings, pad_id=_pad_id(tokenizer))
    return {name: batch[name] for name in names}


def export_onnx(model_dir: str | Path, out_path: str | Path) -> Path:
    """Export the transformer of a sentence-transformers directory to ONNX (fp32).

    Graph inputs: ``input_ids``, ``attention_mask`` (+ ``token_type_ids`` when the model takes
    them), int64 (batch, sequence); output ``token_embeddings`` float32 (batch, sequence, dim).
    Batch and sequence axes are dynamic.
    """
    import torch
    from transformers import AutoModel

    model_dir, out_path = Path(model_dir), Path(out_path)
    # Eager attention: the legacy tracer turns it into a smaller graph than SDPA's masking path
    # (fewer Shape/Gather/Where nodes) and ORT fuses its bias + GELU; outputs are identical.
    model = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    accepted = inspect.signature(model.forward).parameters
    names = [name for name in INPUT_NAMES if name in accepted]
    example = _example_inputs(model_dir, names)

    class TokenEmbeddings(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return self.model(**dict(zip(names, inputs, strict=True))).last_hidden_state

    # eval() on the wrapper too: the exporter restores the top module's training flag after
    # tracing, and a wrapper left in training mode would switch dropout on in the model.
    wrapper = TokenEmbeddings().eval()
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, OUTPUT_NAME]}
    args = tuple(torch.from_numpy(example[name]) for name in names)

    def write(tmp: Path) -> None:
        with torch.no_grad(), warnings.catch_warnings():
            # dynamo=False: the dynamo exporter needs onnxscript (not installed); the legacy
            # tracer reproduces torch to ~4e-6 on padded batches of any shape. Its deprecation
            # notice and the tracer's warning about transformers' mask code (a padding check
            # that is constant for any input shape) are expected, so they are not shown.
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export")
            # Its advanced-indexing warning is about negative indices; the mask code indexes
            # with aranges, which are never negative.
            warnings.filterwarnings("ignore", message="Exporting aten::index operator")
            torch.onnx.export(wrapper, args, str(tmp), input_names=names,
                              output_names=[OUTPUT_NAME], dynamic_axes=axes,
                              opset_version=OPSET, do_constant_folding=True, dynamo=False)

    return _atomic_write(out_path, write)


def fuse_attention(fp32_path: Path, model_dir: Path, out_path: Path) -> Path:
    """The exported graph with each layer's attention fused into one ``Attention`` node.

    The fp32 backend runs this graph (one kernel instead of MatMul, Softmax and Transpose
    chains over (batch, heads, sequence, sequence) tensors). Quantized, that node becomes one
    ``QAttention`` (Q, K and V in one INT8 GEMM, no
    Reshape/Transpose chain). The optimizer's other fusions stay off because they are slower
    on CPU (measured with SciFact queries): ``SkipLayerNormalization`` runs at about a fifth of
    the speed of Add + ``LayerNormalization``, and ``BiasGelu`` takes the bias out of the
    quantized MatMul, where it is free. Fusion does not change the function (fp32 cosine 1.0).
    """
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    config = _read_json(model_dir / "config.json")
    options = FusionOptions("bert")
    options.enable_skip_layer_norm = False
    options.enable_bias_skip_layer_norm = False
    options.enable_embed_layer_norm = False
    options.enable_bias_gelu = False
    model = optimize_model(str(fp32_path), model_type="bert",
                           num_heads=int(config["num_attention_heads"]),
                           hidden_size=int(config["hidden_size"]), opt_level=0,
                           optimization_options=options, use_gpu=False)
    model.save_model_to_file(str(out_path))
    return out_path


def quantize_model_int8(fp32_path: str | Path, model_dir: str | Path, out_path: str | Path) -> Path:
    """Attention fused (``fuse_attention``), then dynamic INT8 quantization (weights per
    channel, QInt8).

    Per-tensor weights lose up to 0.010 nDCG@10 and ``reduce_range=True`` drops the query
    cosine to ~0.85; per-channel keeps it at ~0.99 and nDCG@10 within 0.005. onnxruntime's
    ``quant_pre_process`` (which it logs a hint about) produced the same vectors: not used.
    """
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    def write(tmp: Path) -> None:
        with tempfile.TemporaryDirectory(dir=tmp.parent) as work:
            fused = fuse_attention(Path(fp32_path), Path(model_dir), Path(work) / "fused.onnx")
            # DefaultTensorType: shape inference cannot type the outputs of the fused
            # (contrib-domain) Attention nodes; every activation here is float32.
            with _without_preprocessing_hint():
                quantize_dynamic(fused, tmp, per_channel=True, reduce_range=False,
                                 weight_type=QuantType.QInt8,
                                 extra_options={"DefaultTensorType": TensorProto.FLOAT})

    return _atomic_write(Path(out_path), write)


@contextmanager
def _without_preprocessing_hint() -> Iterator[None]:
    """onnxruntime warns on the root logger that ``quant_pre_process`` could help; it gave
    the same vectors here (above), so a build's output does not show the hint."""
    def drop(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Please consider to run pre-processing")

    root = logging.getLogger()
    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)


def ensure_onnx(model_dir: Path, quantized: bool, cache_dir: Path | None = None) -> Path:
    """The cached graph for ``model_dir``, exported (and quantized) on first use.

    ``cache_dir`` holds one model's files; the default is keyed by the weights digest.
    """
    cache = cache_dir if cache_dir is not None else default_cache_dir(model_dir)
    fp32 = cache / f"model-fp32-v{EXPORT_FORMAT}.onnx"
    if not fp32.is_file():
        export_onnx(model_dir, fp32)
    if not quantized:
        # Fused attention runs SciFact documents 5-10% and single queries 10-25% faster than
        # the plain export (fresh processes, alternated); same function (cosine 1.0000).
        fused = cache / f"model-fp32-attention-v{FP32_FORMAT}.onnx"
        if not fused.is_file():
            _atomic_write(fused, lambda tmp: fuse_attention(fp32, model_dir, tmp))
        return fused
    int8 = cache / f"model-int8-v{INT8_FORMAT}.onnx"
    if not int8.is_file():
        quantize_model_int8(fp32, model_dir, int8)
    return int8


# -- inference -------------------------------------------------------------------------------


def _pad_id(tokenizer: Any) -> int:
    pad = tokenizer.token_to_id("[PAD]")
    return int(pad) if pad is not None else 0


def pad_batch(encodings: Sequence[Any], pad_id: int = 0) -> dict[str, np.ndarray]:
    """Encodings -> ``input_ids``, ``attention_mask``, ``token_type_ids``: int64 (b, longest)."""
    longest = max(len(e.ids) for e in encodings)
    ids = np.full((len(encodings), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(encodings), longest), dtype=np.int64)
    types = np.zeros((len(encodings), longest), dtype=np.int64)
    for row, encoding in enumerate(encodings):
        n = len(encoding.ids)
        ids[row, :n] = encoding.ids
        mask[row, :n] = encoding.attention_mask
        types[row, :n] = encoding.type_ids
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def mean_pool_normalize(token_embeddings: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """float32 (b, s, d) + int (b, s) mask -> float32 (b, d): masked mean, then unit length.

    The same arithmetic as sentence-transformers' Pooling (count clamped at 1e-9) and Normalize
    (norm clamped at 1e-12).
    """
    mask = attention_mask.astype(np.float32)
    summed = np.einsum("bsd,bs->bd", token_embeddings, mask)
    mean = summed / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
    norms = np.linalg.norm(mean, axis=1, keepdims=True)
    return (mean / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


def make_session(path: Path, threads: int) -> Any:
    """A CPU InferenceSession with all graph optimizations and ``threads`` intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1  # one graph, run sequentially: no use for parallel nodes
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # SkipLayerNormalization is about 5x slower than the Add + LayerNormalization it replaces
    # (MiniLM, 20-40 token queries): without it the INT8 graph runs 7-9% faster.
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=["SkipLayerNormFusion"])


# A batch is cut where its longest text would exceed its shortest by this factor: padding then
# wastes at most 25% of the compute, which batching (about 1.7x per query at most for INT8, see
# benchmarks/README.md) would otherwise give back.
MAX_PADDING = 1.25


def _chunks(order: np.ndarray, lengths: np.ndarray, size: int, progress: bool
            ) -> Iterable[np.ndarray]:
    """``order`` (indices sorted by length) cut into batches of at most ``size`` texts whose
    lengths stay within ``MAX_PADDING`` of each other."""
    chunks: list[np.ndarray] = []
    start = 0
    for end in range(1, order.size + 1):
        if (end == order.size or end - start == size
                or lengths[order[end]] > MAX_PADDING * lengths[order[start]]):
            chunks.append(order[start:end])
            start = end
    if not progress:
        return chunks
    from tqdm import tqdm

    return tqdm(chunks, desc="encode", unit="batch")


def default_threads() -> int:
    """Intra-op threads for a call that runs alone: the cores, at most 4 (small GEMMs of a
    short query stop scaling beyond that)."""
    return min(usable_cores(), 4)


class OnnxEncoder:
    """Sentence embeddings with onnxruntime (fp32, or dynamic INT8 with ``quantized=True``).

    Thread-safe, and it sizes its parallelism to the load: a call made while no other call is
    running uses ``threads`` intra-op threads (default ``default_threads()``), so one query at a
    time gets every core (1.4x faster on 2 cores); a call that overlaps another, or asks for
    ``single_thread=True`` (the retriever does when other searches are in flight, which the
    encoder cannot see between its calls), runs on one thread, so concurrent callers never
    oversubscribe the cores.
    """

    def __init__(self, model_dir: str | Path | None = None, *, quantized: bool = False,
                 cache_dir: str | Path | None = None, threads: int | None = None) -> None:
        path = Path(model_dir) if model_dir else default_model_path()
        check_onnx_runs(path)
        self.model_path = path
        self.model = model_name(path)
        self.backend = "onnx-int8" if quantized else "onnx"
        self.precision = "int8" if quantized else "fp32"
        self.threads = threads or default_threads()
        self.onnx_path = ensure_onnx(path, quantized, Path(cache_dir) if cache_dir else None)
        self._alone = make_session(self.onnx_path, self.threads)
        self._shared = make_session(self.onnx_path, 1) if self.threads > 1 else self._alone
        self._running = 0
        self._running_lock = threading.Lock()
        self.calls = {"every_core": 0, "one_thread": 0}  # session runs, for stats and tests
        self._input_names = [i.name for i in self._alone.get_inputs()]
        self._tokenizer = load_tokenizer(path)
        self.max_seq_length = max_seq_length(path)
        self._pad_id = _pad_id(self._tokenizer)
        self._lowercase = lowercases(path)
        self.dim = self._output_dim()
        self.encoder_id = f"{self.model}:{self.backend}:{self.precision}:{self.dim}"

    def _output_dim(self) -> int:
        dim = self._alone.get_outputs()[0].shape[-1]
        if isinstance(dim, int):
            return dim
        return int(self._run(self._tokenizer.encode_batch([""])).shape[1])

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False,
               single_thread: bool = False) -> np.ndarray:
        """``texts`` -> float32 (n, dim), L2-normalized rows in the order of ``texts``.

        One text is run unpadded. Several are sorted by token count and cut into batches of
        ``batch_size`` padded to their longest text, so padding stays small; rows are put
        back in input order. The INT8 graph runs each text alone: its activation scales are
        computed per batch, so a query's vector (and its hits) depended on the queries
        batched with it, and a batch's vectors went into the cache single searches read.
        """
        texts = [t.lower() for t in texts] if self._lowercase else list(texts)
        if len(texts) == 1:
            return self._run([self._tokenizer.encode(texts[0])], single_thread)
        if self.precision == "int8":
            batch_size = 1
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizer.encode_batch(texts)
        lengths = np.array([len(e.ids) for e in encodings])
        order = np.argsort(lengths, kind="stable")
        for chunk in _chunks(order, lengths, max(1, batch_size), progress):
            out[chunk] = self._run([encodings[i] for i in chunk], single_thread)
        return out

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size())

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids as ``encode`` sees them (lowercased when the model asks)."""
        texts = [t.lower() for t in texts] if self._lowercase else list(texts)
        return [e.ids for e in self._tokenizer.encode_batch(texts)]

    def encode_ids(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """Already tokenized texts (special tokens included) -> float32 (n, dim), one call.

        A row longer than ``max_seq_length`` is cut as the tokenizer cuts a text: its first
        ids and its last one (the closing special token) kept, ``max_seq_length`` in all.
        """
        if not ids:
            return np.empty((0, self.dim), dtype=np.float32)
        return self._run([_Tokens(self._within_window(list(row))) for row in ids])

    def _within_window(self, row: list[int]) -> list[int]:
        if len(row) <= self.max_seq_length:
            return row
        return row[:self.max_seq_length - 1] + row[-1:]

    def _run(self, encodings: Sequence[Any], single_thread: bool = False) -> np.ndarray:
        """Tokenized texts -> float32 (b, dim) sentence embeddings."""
        batch = pad_batch(encodings, self._pad_id)
        feed = {name: batch[name] for name in self._input_names}
        with self._running_lock:
            alone = self._running == 0 and not single_thread
            self._running += 1
            self.calls["every_core" if alone else "one_thread"] += 1
        try:
            session = self._alone if alone else self._shared
            (tokens,) = session.run([OUTPUT_NAME], feed)
        finally:
            with self._running_lock:
                self._running -= 1
        return mean_pool_normalize(tokens, batch["attention_mask"])


class _Tokens:
    """The three fields of a ``tokenizers.Encoding`` that ``pad_batch`` reads."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.attention_mask = [1] * len(ids)
        self.type_ids = [0] * len(ids)


class UnknownBackendError(RetrievalError, ValueError):
    """``make_encoder`` was given a backend name it does not know (a ``ValueError`` too)."""


def make_encoder(backend: str, model_dir: str | Path | None = None,
                 cache_dir: str | Path | None = None) -> Encoder:
    """An encoder for ``backend`` in ``BACKENDS`` ("torch", "onnx", "onnx-int8")."""
    if backend == "torch":
        return SentenceTransformerEncoder(model_dir)
    if backend in ("onnx", "onnx-int8"):
        return OnnxEncoder(model_dir, quantized=backend == "onnx-int8", cache_dir=cache_dir)
    raise UnknownBackendError(f"unknown encoder backend {backend!r}; valid backends: "
                              f"{', '.join(BACKENDS)}")
