"""The write-ahead log of live updates: its format (``log``), the state its records describe
(``state``), the checks a write or a build must pass against it (``checks``) and the passage
split of written documents (``split``). Its one writer is ``indexes.writer``; compaction into
the next build is ``indexes.compaction`` (both build on ``indexes.build``, which this package
never imports)."""

from indexes.wal.log import LogCorruptionError, Record, read_all, segments
from indexes.wal.state import Changes

__all__ = ["Changes", "LogCorruptionError", "Record", "read_all", "segments"]
