"""Logging set-up shared by the script adapters and the command line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path


def setup_logging(path: str | Path | None = None, level: int = logging.INFO) -> logging.Logger:
    """Send fmaudit's log records (and warnings) to ``path`` (or stderr), one line each with a timestamp."""
    handler: logging.Handler
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, mode="w")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)
    return logging.getLogger("fmaudit")
