"""Built-in model families of the estimator: Llama-style decoders (``llama``, built per chip)
and the demo's GPT (``gpt``, which ``torch_tpu.demo`` trains)."""

from .gpt import GPT, GPTConfig, demo_gpt, make_optimizer  # noqa: F401
from .gpt import PRESETS as GPT_PRESETS  # noqa: F401
from .llama import LLAMA_PRESETS, Llama, LlamaConfig, TPHooks, llama_config  # noqa: F401
