"""``python -m servesim`` runs the ``servesim`` CLI."""

from servesim.cli.app import main

if __name__ == "__main__":  # not again in sweep worker processes, which re-import this module
    main()
