"""Logging set-up shared by the script adapters and the command line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path


FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def file_handler(path: str | Path, mode: str = "a") -> logging.FileHandler:
    """A handler writing one timestamped line per record to ``path`` (its folder created)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode=mode)
    handler.setFormatter(logging.Formatter(FORMAT))
    return handler


def setup_logging(path: str | Path | None = None, level: int = logging.INFO) -> logging.Logger:
    """Send fmaudit's log records (and warnings) to ``path`` (or stderr), one line each with a timestamp."""
    handler: logging.Handler
    if path:
        handler = file_handler(path, mode="w")
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)
    return logging.getLogger("fmaudit")
