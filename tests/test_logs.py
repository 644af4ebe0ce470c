"""Logging of jobs and the command line: one timestamped line per record, warnings included."""

import logging

from fmaudit.logs import file_handler, setup_logging


def test_setup_logging_writes_every_fmaudit_record_to_the_file(tmp_path):
    path = tmp_path / "logs" / "job.log"
    logger = setup_logging(path)
    try:
        logger.info("hello %d", 3)
        logging.getLogger("fmaudit.sub").warning("from a module")
    finally:
        logging.getLogger().handlers[:] = []
        logging.captureWarnings(False)
    text = path.read_text()
    assert "INFO fmaudit: hello 3" in text and "WARNING fmaudit.sub: from a module" in text


def test_file_handler_appends(tmp_path):
    path = tmp_path / "a.log"
    path.write_text("before\n")
    handler = file_handler(path)
    logger = logging.getLogger("fmaudit.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("after")
    finally:
        logger.removeHandler(handler)
        handler.close()
    lines = path.read_text().splitlines()
    assert lines[0] == "before" and lines[1].endswith("INFO fmaudit.test_logs: after")
