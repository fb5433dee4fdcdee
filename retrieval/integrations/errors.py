"""Errors of the framework adapters, all inside the library's ``RetrievalError`` tree::

    RetrievalError
    └── IntegrationError               an adapter cannot be built or used as asked
        ├── MissingExtraError          the framework's extra is not installed (also ImportError)
        ├── NotASearchBackendError     the wrapped object lacks the search methods, or an
        │                              option set on the adapter (also TypeError)
        └── UnsupportedFilterError     a framework filter has no exact translation
                                       (also InvalidQueryError: it is bad search input)
"""

from __future__ import annotations

from retrieval.errors import InvalidQueryError, RetrievalError


class IntegrationError(RetrievalError):
    """Root of the adapters' own errors."""


class MissingExtraError(IntegrationError, ImportError):
    """An adapter module was imported without its framework installed."""

    def __init__(self, extra: str, package: str, module: str | None = None) -> None:
        super().__init__(
            f"{module or f'retrieval.integrations.{extra}'} needs {package}, which is not "
            f"installed; install it with: pip install 'retrieval[{extra}]'"
        )
        self.extra = extra


class NotASearchBackendError(IntegrationError, TypeError):
    """The object given to an adapter is neither a Retriever nor anything with its methods,
    or its methods do not take an option set on the adapter (``deadline_ms`` on a backend
    written to an older protocol)."""


class UnsupportedFilterError(IntegrationError, InvalidQueryError):
    """A framework filter uses an operator or condition the filter language cannot express."""
