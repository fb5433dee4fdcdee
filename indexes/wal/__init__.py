"""The write-ahead log of live updates: its format (``log``), the one writer of a root
(``writer``), the state its records describe (``state``) and compaction into a build
(``compact``)."""

from indexes.wal.compact import CompactionReport, compact
from indexes.wal.log import Record, read_all, segments
from indexes.wal.state import Changes
from indexes.wal.writer import IndexWriter

__all__ = ["Changes", "CompactionReport", "IndexWriter", "Record", "compact", "read_all",
           "segments"]
