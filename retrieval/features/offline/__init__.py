"""The feature store's offline half: the nightly job that publishes snapshots.

Sources (``sources``, ``convert``; pyarrow), the job (``materialize``; tqdm), the snapshot
writers (``writers``: ``local_writer``, ``redis_writer``, which waits out a reshard with
``slot_moves``) and the ``retrieval features`` command (``cli``). It shares only the snapshot
formats with the online half (``retrieval.features.local_files``, ``redis_layout``, ``view``),
which never imports it.
Nothing is re-exported here: ``retrieval.features`` exposes the public names lazily.
"""
