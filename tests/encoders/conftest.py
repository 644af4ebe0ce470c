"""Fixtures of the encoder tests: the registry, a small image batch and the demo ViT."""

import pytest
import torch

from fmaudit.encoders import build_encoder
from fmaudit.registry import get_encoder_spec, load_registry


@pytest.fixture(scope="package")
def registry():
    return load_registry()


@pytest.fixture(scope="package")
def images() -> torch.Tensor:
    return torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="package")
def vit(registry):
    return build_encoder(get_encoder_spec("demo-vit-tiny", registry))
