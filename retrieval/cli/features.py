"""``retrieval features ...``: the feature store's commands, with the input formats in --help."""

from __future__ import annotations

import argparse

from retrieval.cli.common import Subparsers
from retrieval.cli.formats import FEATURE_FORMATS
from retrieval.features.offline.cli import add_features_parser


def register(subparsers: Subparsers) -> None:
    features = add_features_parser(subparsers)
    for parser in (features, *_children(features)):
        parser.epilog = FEATURE_FORMATS
        parser.formatter_class = argparse.RawDescriptionHelpFormatter


def _children(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [child for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)
            for child in action.choices.values()]
