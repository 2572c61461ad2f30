"""Command-line interface (``servesim``); see :mod:`servesim.cli.app`."""
