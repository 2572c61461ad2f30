"""One console for all commands: wide enough that tables stay readable when piped or logged."""

from __future__ import annotations

import shutil

from rich.console import Console

WIDTH = shutil.get_terminal_size((140, 40)).columns

console = Console(highlight=False, width=max(WIDTH, 100))
error_console = Console(stderr=True, highlight=False, soft_wrap=True)
