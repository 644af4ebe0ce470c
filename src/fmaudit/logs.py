"""Logging set-up shared by the script adapters and the command line.

Every workflow job calls :func:`setup_logging` with its rule's ``log:`` file first. From then on:

- fmaudit's records (and Python warnings) go to the log file, one timestamped line each, and warnings and
  errors also to stderr (on Slurm, the job's own Slurm log; locally, Snakemake's console);
- an exception that ends the job (uncaught in the script) is written with its full traceback, chained causes
  included, to the log file and to stderr, before the process exits with an error. This is installed as
  ``sys.excepthook``, so every job inherits it by calling ``setup_logging`` first: Snakemake runs each
  ``script:`` in its own Python process, where an uncaught exception reaches the hook.
"""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path
from types import TracebackType

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

__all__ = ["FORMAT", "file_handler", "log_uncaught_exceptions", "setup_logging", "switch_log_file"]


def file_handler(path: str | Path, mode: str = "a") -> logging.FileHandler:
    """A handler writing one timestamped line per record to ``path`` (its folder created).

    Parameters
    ----------
    path : str or Path
        The log file.
    mode : str
        ``open`` mode: ``a`` (append, default) or ``w`` (truncate).

    Returns
    -------
    logging.FileHandler
        With the :data:`FORMAT` formatter and no level of its own.
    """
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode=mode)
    handler.setFormatter(logging.Formatter(FORMAT))
    return handler


def _stderr_handler(level: int) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.setLevel(level)
    return handler


def _log_uncaught(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """sys.excepthook: the failing job's full exception to every handler of the root logger (log file, stderr)."""
    logger = logging.getLogger("fmaudit")
    root = logging.getLogger()
    if root.handlers:
        what = "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed"
        logger.critical("the job %s: %s: %s", what, exc_type.__name__, exc, exc_info=(exc_type, exc, tb))
        for handler in root.handlers:
            handler.flush()
    else:  # logging was torn down: print it the way Python does
        traceback.print_exception(exc_type, exc, tb)
    previous = _previous_hook[0]
    if previous is not None and previous is not sys.__excepthook__ and previous is not _log_uncaught:
        previous(exc_type, exc, tb)  # somebody else's hook (a debugger, a test harness) still runs


_previous_hook: list = [None]


def log_uncaught_exceptions() -> None:
    """Install :func:`_log_uncaught` as ``sys.excepthook`` (once; an earlier custom hook still runs after it)."""
    if sys.excepthook is not _log_uncaught:
        _previous_hook[0] = sys.excepthook
        sys.excepthook = _log_uncaught


def setup_logging(path: str | Path | None = None, level: int = logging.INFO) -> logging.Logger:
    """Send fmaudit's log records (and warnings) to ``path`` and stderr, and a job's uncaught exception with its
    full traceback to both (see the module doc).

    With ``path`` (a job's ``log:`` file, truncated), every record of ``level`` and above goes to the file and
    warnings and errors also to stderr; without it (the command line), every record goes to stderr.

    Parameters
    ----------
    path : str or Path, optional
        The job's log file, truncated; None: log to stderr only.
    level : int
        Level of the root logger (default ``logging.INFO``).

    Returns
    -------
    logging.Logger
        The ``fmaudit`` logger.
    """
    handlers: list[logging.Handler] = []
    if path:
        handlers.append(file_handler(path, mode="w"))
        handlers.append(_stderr_handler(logging.WARNING))
    else:
        handlers.append(_stderr_handler(logging.NOTSET))
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(True)
    log_uncaught_exceptions()
    _opened.clear()
    if path:
        _opened.add(str(Path(path).resolve()))
    return logging.getLogger("fmaudit")


_opened: set[str] = set()


def switch_log_file(path: str | Path) -> None:
    """From now on send the records :func:`setup_logging` sends to a file to ``path`` instead (truncated the first
    time this job switches to it, appended to afterwards); stderr is kept. A job with one ``log:`` file per
    output (a cell section at each magnification) switches before each output, so each log holds that output's
    records and, if it fails there, the job's exception.

    Parameters
    ----------
    path : str or Path
        The next output's log file; its folder is created.
    """
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(handler)
        handler.close()
    key = str(Path(path).resolve())
    root.addHandler(file_handler(path, mode="a" if key in _opened else "w"))
    _opened.add(key)
