"""vLLM on the tpu device: the platform plugin of ``pip install torch_tpu[serve]``.

vLLM finds it through the ``vllm.platform_plugins`` entry point (``tpu``) and then runs
unchanged above it: its scheduler, continuous batching, KV-cache manager with automatic
prefix caching, sampler and OpenAI-compatible API server. Below them this package gives
the platform (:mod:`.platform`: device type ``tpu``, dispatch key ``PrivateUse1``,
distributed backend ``tpu_dist``), the worker and model runner (:mod:`.worker`, vLLM's
GPU model runner on a tpu device) and an attention backend over a paged KV cache in HBM
(:mod:`.attention`). See docs/serving.md.

Importing ``torch_tpu`` never imports vLLM: only vLLM calls :func:`platform_plugin`.
"""

from __future__ import annotations

import os

PLATFORM = "torch_tpu.serving.platform.TpuPlatform"


def platform_plugin() -> str | None:
    """The ``vllm.platform_plugins`` entry point: the qualified name of the tpu platform.

    Returns None (vLLM then looks for another platform) when ``TORCH_TPU_VLLM=0`` or when
    this process sees no tpu chip (``TPU_VISIBLE_CHIPS=""``).
    """
    if os.environ.get("TORCH_TPU_VLLM", "1") == "0":
        return None
    try:
        import torch

        import torch_tpu  # noqa: F401  (registers the device when torch's autoload did not)

        if torch.tpu.device_count() == 0:
            return None
    except Exception:  # noqa: BLE001  (a runtime that cannot start: no tpu platform)
        return None
    return PLATFORM
