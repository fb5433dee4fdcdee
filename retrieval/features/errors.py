"""Typed errors of the feature store.

The tree (rooted at ``RetrievalError``; the whole tree is drawn in ``indexes.errors``)::

    RetrievalError
    └── FeatureError                  anything the feature store raises on purpose
        ├── FeatureConfigError        a view, store or weights setting is invalid (a ConfigError)
        ├── FeatureSchemaError        a source does not fit its view: a column is missing, has
        │                             the wrong type, or holds a bad value (names the column)
        ├── FeatureSourceError        a source cannot be read (missing file, unknown format, empty)
        ├── FeatureStoreError         the online store failed during a batch operation
        │                             (materialize, admin); request-path reads never raise it
        └── FeatureRequestError       bad read input (also an ``InvalidQueryError``)
"""

from __future__ import annotations

from indexes.errors import InvalidQueryError, RetrievalError
from retrieval.errors import ConfigError


class FeatureError(RetrievalError):
    """Root of the feature-store errors."""


class FeatureConfigError(FeatureError, ConfigError):
    """A feature view, store or ranking setting is invalid; the message names it."""


class FeatureSchemaError(FeatureError, ValueError):
    """A source column is missing, mistyped or holds a bad value.

    ``column`` names the offending column; ``row`` is the 0-based source row when one row is to
    blame (None for a whole-column problem).
    """

    def __init__(self, message: str, column: str, row: int | None = None) -> None:
        super().__init__(message)
        self.column = column
        self.row = row


class FeatureSourceError(FeatureError):
    """An offline source cannot be read at all."""


class FeatureStoreError(FeatureError):
    """The online store failed during materialization or an administrative call."""


class FeatureRequestError(FeatureError, InvalidQueryError):
    """The arguments of a feature read are invalid (e.g. a non-string entity id)."""
