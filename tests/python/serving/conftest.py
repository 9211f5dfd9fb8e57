"""Serving tests leave the environment as they found it: vLLM and its platform set variables
(LOCAL_WORLD_SIZE, ...) in this process that later test folders must not see."""

import os

import pytest


@pytest.fixture(autouse=True, scope="module")
def _restore_environment():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
