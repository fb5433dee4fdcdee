"""Quiet third-party logs for the command line and the service: what our own lines say is
what happened and what to do; libraries' chatter (faiss probing instruction sets, the
transformers weight-loading bar, HTTP client request lines) stays below warning level.

A library user's logging is theirs: ``import retrieval`` changes nothing; call
``quiet_third_party()`` to get the same.
"""

from __future__ import annotations

import logging
import os

# Loggers whose INFO lines are not a user's concern (faiss logs each instruction set it
# tries, ModuleNotFoundError included; httpx logs every request).
CHATTY = ("faiss", "faiss.loader", "httpx", "httpcore", "numba", "urllib3", "filelock",
          "sentence_transformers", "transformers", "onnxruntime", "ray", "asyncio")


def quiet_third_party() -> None:
    """Third-party loggers at WARNING, and no progress bars from model loading."""
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
