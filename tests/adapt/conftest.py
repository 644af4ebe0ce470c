"""Tests of fmaudit.adapt run torch on one thread: its reference loops and the scratch ResNet are tiny, and on
the shared 2-core machines torch's thread pool spinning against other jobs made them 30x slower."""

import pytest
import torch


@pytest.fixture(autouse=True)
def single_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
