"""The ``retrieval`` command (also ``python -m retrieval``).

One module per subcommand (or small group): each defines ``register(subparsers)``, which adds
its parser with the handler beside it. ``retrieval.cli.app.COMMANDS`` lists the registrations;
a new subcommand is a new module plus one line there.
"""

from retrieval.cli.app import COMMANDS, main, parser

__all__ = ["COMMANDS", "main", "parser"]
