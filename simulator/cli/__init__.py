"""Command-line interface (``servesim``); see :mod:`simulator.cli.app`."""
