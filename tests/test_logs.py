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


FAILING_JOB = """
import sys
from fmaudit.logs import setup_logging

logger = setup_logging(sys.argv[1])
logger.info("started")
logger.warning("a warning")

def load():
    raise FileNotFoundError("checkpoint.safetensors is missing")

try:
    load()
except FileNotFoundError as e:
    raise ValueError("encoder 'x': cannot build it") from e
"""


def _run_job(tmp_path, code):
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "job.py"
    script.write_text(code)
    log = tmp_path / "logs" / "job.log"
    src = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.run([sys.executable, str(script), str(log)], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    return proc, log


def test_a_failing_job_writes_its_full_exception_to_its_log_and_stderr(tmp_path):
    proc, log = _run_job(tmp_path, FAILING_JOB)
    assert proc.returncode == 1
    text = log.read_text()
    assert "INFO fmaudit: started" in text and "WARNING fmaudit: a warning" in text
    assert "CRITICAL fmaudit: the job failed: ValueError: encoder 'x': cannot build it" in text
    # the full exception: both tracebacks of the chain, with the frames
    assert "Traceback (most recent call last)" in text and 'in load' in text
    assert "FileNotFoundError: checkpoint.safetensors is missing" in text
    assert "The above exception was the direct cause of the following exception" in text
    assert text.rstrip().endswith("ValueError: encoder 'x': cannot build it")
    # stderr: warnings and the exception, once; INFO lines stay in the file
    assert proc.stderr.count("Traceback (most recent call last)") == 2  # the cause and the error, printed once
    assert "the job failed" in proc.stderr and "a warning" in proc.stderr and "started" not in proc.stderr


def test_an_earlier_custom_excepthook_still_runs(tmp_path):
    code = ("import sys\n"
            "sys.excepthook = lambda *a: print('custom hook ran', file=sys.stderr)\n" + FAILING_JOB)
    proc, log = _run_job(tmp_path, code)
    assert proc.returncode == 1
    assert "custom hook ran" in proc.stderr and "the job failed" in log.read_text()
