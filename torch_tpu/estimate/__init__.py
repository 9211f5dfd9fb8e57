"""Dry-run estimates: what one training step of a model costs per chip on a TPU slice,
without data or real memory (``python -m torch_tpu.estimate --help``).

- :func:`dry_run`: context manager; tpu ops inside are shaped, allocated in HBM and priced
  by the same cost model as real execution, but not computed.
- :func:`estimate`: one step of a built-in model (Llama presets, the demo's GPT) or any
  ``nn.Module`` factory, chip 0's share under data / FSDP / tensor parallelism.
"""

from .core import (  # noqa: F401
                   DRY_RUN_HBM,
                   GENERATIONS,
                   MODEL_NAMES,
                   ModelSpec,
                   check_plan,
                   dry_run,
                   estimate,
                   model_spec,
                   report,
                   run,
                   train_step,
)
from .models import LLAMA_PRESETS, LlamaConfig, llama_config  # noqa: F401
from .parallel import Parallelism  # noqa: F401

__all__ = ["dry_run", "estimate", "Parallelism", "LlamaConfig", "LLAMA_PRESETS", "llama_config", "model_spec",
           "check_plan", "run", "report", "train_step", "MODEL_NAMES", "GENERATIONS", "DRY_RUN_HBM"]
