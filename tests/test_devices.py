"""One rule for the torch device of the embedding and probe engines."""

import logging
import os
import subprocess
import sys

import pytest
import torch

from fmaudit.devices import resolve_device


def test_auto_none_and_explicit(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


def test_unavailable_cuda_falls_back_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.WARNING):
        assert resolve_device("cuda:0") == torch.device("cpu")
    assert "CUDA requested but not available" in caplog.text


# A fresh interpreter (the allocator's settings are the process's): frees a 64 MiB array, prints how much of it
# stayed resident, calls hold_freed_memory when asked and frees another; with "child", a new interpreter started
# from it (this script with no argument: no call of its own) frees one too and prints its share.
_HELD = r"""
import subprocess, sys
import numpy as np

def anon():
    return int(next(l for l in open("/proc/self/status") if l.startswith("RssAnon")).split()[1]) * 1024

def freed_but_resident():
    before = anon()
    a = np.ones(2**23)  # 64 MiB, touched
    del a
    return (anon() - before) / 2**26

print(freed_but_resident())
if "hold" in sys.argv:
    from fmaudit.devices import hold_freed_memory
    print(hold_freed_memory(children="child" in sys.argv))
    print(freed_but_resident())
if "child" in sys.argv:
    print(subprocess.run([sys.executable, __file__], capture_output=True, text=True, check=True).stdout.split()[0])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator (Linux)")
def test_hold_freed_memory_keeps_a_freed_large_array_resident(tmp_path):
    script = tmp_path / "held.py"
    script.write_text(_HELD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}  # glibc's defaults to start from

    def run(*argv):
        return subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, check=True,
                              env=env).stdout.split()

    plain = run()
    assert float(plain[0]) < 0.25  # glibc's default: a 64 MiB block is unmapped when freed
    held = run("hold")
    assert held[1] == "True"
    assert float(held[2]) > 0.75  # kept for the next allocation
    child = run("hold", "child")
    assert float(child[3]) > 0.75  # a process started after children=True holds its freed memory too
