"""One rule for the torch device of the embedding and probe engines."""

import logging

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
