"""The request path of every search, on every layout, one module per stage. In stage order:

1. ``validate``: the request checked and normalized (typed errors), filters parsed once per
   build (``FilterMemo``).
2. ``cache_lookup``: result + embedding in one round trip; a result hit returns here.
3. ``encode_policy``, ``batching``: the query embedding, computed while the next stages run
   (dynamic batching across concurrent searches, the in-flight bound).
4. ``pipeline``: filter mask → BM25 top C (+ the dense leg) → re-rank → fuse → hydrate. On a
   sharded build each component fans out to its shards and merges their answers
   (``retrieval.sharding``); an unsharded build is the one-shard case, a direct call.
   Score fusion is ``fusion``.
5. ``feature_stage``: nightly features from the online store plus request-time ones.
6. ``grouping``: passages grouped by their document.

``run`` strings the stages together (``RequestPath``); ``deadline`` is the per-search time
budget each stage takes what is left of, ``timing`` the per-stage clock.
"""
