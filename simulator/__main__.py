"""``python -m simulator`` runs the ``servesim`` CLI."""

from simulator.cli.app import main

main()
