"""One console for all commands.

On a terminal, text wraps at its width (at least 100 columns, so tables stay readable). Piped
into a file, a log or CI, nothing is hard-wrapped: a line of output is one line, whatever the
width of the machine that ran it (rich would otherwise break lines mid-phrase at 80 columns or
at the width of the terminal that launched the job), and tables take their natural width.
"""

from __future__ import annotations

import shutil
import sys

from rich.console import Console

WIDTH = shutil.get_terminal_size((140, 40)).columns
INTERACTIVE = sys.stdout.isatty()
PIPED_WIDTH = 1000
"""Wide enough for any table row; only tables use it (text is never wrapped when piped)."""

console = Console(highlight=False, width=max(WIDTH, 100) if INTERACTIVE else PIPED_WIDTH,
                  soft_wrap=not INTERACTIVE)
error_console = Console(stderr=True, highlight=False, soft_wrap=True)
