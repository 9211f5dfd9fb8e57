"""Paths of the repository the tests run from."""

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EXAMPLES_DIR = os.path.join(REPO_ROOT, "examples")
TORCH_TPU_DIR = os.path.join(REPO_ROOT, "torch_tpu")
