"""Adapters that plug a ``Retriever`` (or anything with its search methods) into RAG frameworks.

The frameworks are optional: import ``retrieval.integrations.langchain`` (extra ``langchain``;
``langchain_store`` for a LangChain ``VectorStore`` over an index root) or
``retrieval.integrations.llamaindex`` (extra ``llamaindex``). This package itself imports
neither.
"""

from retrieval.integrations.backend import SearchBackend
from retrieval.integrations.errors import (
    IntegrationError,
    MissingExtraError,
    NotASearchBackendError,
    UnsupportedFilterError,
)

__all__ = [
    "IntegrationError",
    "MissingExtraError",
    "NotASearchBackendError",
    "SearchBackend",
    "UnsupportedFilterError",
]
