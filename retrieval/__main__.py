"""``python -m retrieval ...`` runs the ``retrieval`` command."""

import sys

from retrieval.cli import main

sys.exit(main())
