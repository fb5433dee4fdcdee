"""The search console ``retrieval serve`` serves at ``/console``: try queries under filters, see
why each hit ranked where it did, compare two builds or two configurations, run the publish
gate over a query file.

The page is plain HTML, CSS and JavaScript shipped in ``assets/`` (no CDN, no build step); it
calls the public ``/v1/search`` and the console's API (``retrieval.console.routes``), and shows
what the library computed: it ranks nothing itself.
"""
