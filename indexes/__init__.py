"""Offline layer: building indexes and their on-disk formats. Never imports ``retrieval``."""

from indexes.analyzer import Analyzer, AnalyzerConfig
from indexes.bm25 import BM25Index, BM25Params
from indexes.build import BuildConfig, BuildReport, build_index
from indexes.corpus import read_corpus, read_jsonl, read_qrels, read_queries
from indexes.docstore import DocStore, Document
from indexes.encoders import Encoder, SentenceTransformerEncoder, default_model_path
from indexes.long_documents import WindowReport, split_documents
from indexes.manifest import EncoderInfo, Manifest
from indexes.metadata import MetadataIndex
from indexes.passages import PassageConfig, PassageMap
from indexes.shard_build import GivenRows, build_streamed
from indexes.sources import FieldMapping
from indexes.vectors import VectorStore

__all__ = [
    "Analyzer",
    "AnalyzerConfig",
    "BM25Index",
    "BM25Params",
    "BuildConfig",
    "BuildReport",
    "DocStore",
    "Document",
    "Encoder",
    "EncoderInfo",
    "FieldMapping",
    "GivenRows",
    "Manifest",
    "MetadataIndex",
    "PassageConfig",
    "PassageMap",
    "SentenceTransformerEncoder",
    "VectorStore",
    "WindowReport",
    "build_index",
    "build_streamed",
    "default_model_path",
    "read_corpus",
    "read_jsonl",
    "read_qrels",
    "read_queries",
    "split_documents",
]
