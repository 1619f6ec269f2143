"""The one rich console and logging setup (rich handler) that every command shares."""

from __future__ import annotations

import logging

from rich.console import Console
from rich.logging import RichHandler

console = Console(stderr=False, soft_wrap=True)


def setup_logging(level: int = logging.INFO) -> None:
    root = logging.getLogger()
    if not any(isinstance(h, RichHandler) for h in root.handlers):
        root.addHandler(RichHandler(console=console, show_path=False, rich_tracebacks=False))
    root.setLevel(level)
    for noisy in ("httpx", "urllib3", "transformers", "datasets", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
