"""Input file formats, as ``--help`` and the README show them (one sample of each)."""

CORPUS_FORMAT = """\
corpus format: a BEIR folder (corpus.jsonl inside) or a JSONL file, one document per line:

  {"_id": "d1", "title": "Wing flutter", "text": "An experimental study of ...",
   "metadata": {"department": "aero", "tags": ["wind-tunnel", "subsonic"],
                "year": 1962, "published": "1962-05-01", "reviewed": true}}

  _id or id   required and unique (numbers become strings)
  text        required string; title optional (both are searched)
  metadata    optional object; any other top-level key is metadata too
  Each metadata field gets one type, inferred from its values (retrieval build prints them):
    keyword   strings, booleans, lists of strings   filter: =, !=, IN, NOT IN
    number    ints and floats                        filter: =, !=, <, <=, >, >=
    date      ISO 8601 strings (2020-01-31, 2020-01-31T08:00:00Z)   as number, dates as values
  A field mixing types (1962 in one document, "1962" in another) is an error naming both lines.
  Nested objects and lists of numbers are stored and returned with hits, not filterable.

  Other fields: --id-field body_id --text-field body --title-field headline; --keep-fields
  a,b keeps only those as metadata, --drop-fields c,d leaves them out. A field the file does
  not have is an error listing the ones it has.

Also read: CSV / TSV (header row; column types inferred: a column of years is a number)
and Parquet files, one document per row, mapped as above; and a folder of .md, .txt and
.html files, one document per file: id = its path in the folder, title = the first
"# heading" or the HTML <title>, text = the file (HTML reduced to its readable text).
"""

FEATURE_FORMATS = """\
view file (--view-file), JSON: the features of one view, keyed by document id

  {"name": "popularity", "entity_key": "doc_id", "timestamp_field": "event_time",
   "max_age_seconds": 172800,
   "features": [{"name": "clicks", "dtype": "int64", "default": 0},
                {"name": "ctr", "dtype": "float32", "default": 0.0},
                {"name": "editor_pick", "dtype": "bool", "default": false}]}

  dtype: float32, float64, int64 or bool; default is served for documents without a row.

source file (--source): .parquet, .csv or .jsonl with the entity column, one column per feature
and optionally the timestamp column (ISO 8601 or epoch seconds):

  doc_id,clicks,ctr,editor_pick,event_time
  d1,1520,0.031,true,2026-11-30T02:00:00Z
  d2,12,0.004,false,2026-11-30T02:00:00Z
"""
