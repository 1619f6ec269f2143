"""The one rich console, the logging setup every command shares, and the CPU thread default.

Output follows where stdout goes. In a terminal: rich log lines and live progress bars. Anywhere else
(a file, a pipe, a batch scheduler's log): plain lines, written as they happen and never cut to a
width; a width-less log file has no use for rich's 80-column default or for padded and wrapped log
columns. Live bars are written at the end only when the output is not a terminal, so `runlog.progress`
prints its own plain lines there.
"""

from __future__ import annotations

import logging
import os
import sys

from rich.console import Console
from rich.logging import RichHandler

# Width of rich's tables, rules and wrapped help when stdout is not a terminal and $COLUMNS is not set:
# what a pager, an editor or a log viewer shows. Log lines are printed with soft wrap and never cut.
PLAIN_WIDTH = 100


def _make_console() -> Console:
    """rich's global console, configured for where stdout goes. Being the global one, it is also the
    console of any RichHandler built without one (Hydra's job logging), so log lines and live bars share
    it and a log line prints above a live bar instead of through it."""
    import rich

    probe = Console(file=sys.stdout)
    if probe.is_terminal and not probe.is_dumb_terminal:
        rich.reconfigure(stderr=False, soft_wrap=True)
    else:
        columns = os.environ.get("COLUMNS", "")
        width = int(columns) if columns.isdigit() and int(columns) > 0 else PLAIN_WIDTH
        rich.reconfigure(stderr=False, soft_wrap=True, width=width)
    return rich.get_console()


console = _make_console()


def interactive() -> bool:
    """Whether `console` writes to an interactive terminal (rich's test: honours FORCE_COLOR,
    TTY_COMPATIBLE and TERM=dumb). Decided per call: tests and callers may swap stdout."""
    return console.is_terminal and not console.is_dumb_terminal


PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LogHandler(logging.Handler):
    """Log records through `console`: rich's layout in a terminal, one plain unwrapped line per record
    (time, level, logger, message) otherwise. Hydra's job logging and `setup_logging` both use it."""

    def __init__(self, level: int = logging.NOTSET, **rich_options: object):
        super().__init__(level)
        rich_options.setdefault("show_path", False)
        rich_options.setdefault("rich_tracebacks", False)
        self._rich = RichHandler(console=console, **rich_options)
        self._plain = logging.Formatter(PLAIN_FORMAT, datefmt="%H:%M:%S")

    def setFormatter(self, fmt: logging.Formatter | None) -> None:  # noqa: N802 (logging's name)
        super().setFormatter(fmt)
        self._rich.setFormatter(fmt)

    def emit(self, record: logging.LogRecord) -> None:
        if interactive():
            self._rich.emit(record)
            return
        try:
            console.print(
                self._plain.format(record), markup=False, highlight=False, soft_wrap=True, emoji=False
            )
        except Exception:
            self.handleError(record)


def quiet_library_progress() -> None:
    """Turn off the tqdm bars of transformers, huggingface_hub and datasets ("Loading weights: 100%|..."):
    they write carriage returns into agentrl's own progress and log lines. The environment variables
    cover libraries imported later; an explicit user value of a variable is kept."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    if "datasets" in sys.modules:
        from datasets.utils import disable_progress_bars as disable_datasets_bars

        disable_datasets_bars()


def setup_logging(level: int = logging.INFO) -> None:
    quiet_library_progress()
    root = logging.getLogger()
    if not any(isinstance(h, (LogHandler, RichHandler)) for h in root.handlers):
        root.addHandler(LogHandler())
    root.setLevel(level)
    for noisy in ("httpx", "urllib3", "transformers", "datasets", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def free_cpu_threads() -> int:
    """CPU cores not busy with other work: cores minus the rounded 1-minute load average, at least 1.
    On a shared machine torch's default (every core) oversubscribes the CPU, and oversubscribed threads
    spin and wait on each other, which is several times slower than fewer threads."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this platform
        load = 0.0
    return max(1, cores - round(load))


def torch_threads(explicit: int | None = None) -> int | None:
    """The torch CPU thread count to use: `explicit` when given, None (leave torch alone) when
    $OMP_NUM_THREADS is set (the user has chosen), else `free_cpu_threads()`."""
    if explicit:
        return int(explicit)
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    return free_cpu_threads()


def set_torch_threads(explicit: int | None = None) -> int:
    """Apply `torch_threads(explicit)` to torch; return the thread count torch now uses."""
    import torch

    threads = torch_threads(explicit)
    if threads is not None and threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    return torch.get_num_threads()
