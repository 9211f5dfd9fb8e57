"""vLLM's worker and model runner on a tpu chip.

:class:`TPUModelRunner` is vLLM's own GPU model runner (input preparation, persistent
batch, block tables, sampler, logits processors) with its device tensors on
``torch.device("tpu", i)``: CUDA streams and events become the chip's
(``torch.tpu.Stream`` / ``torch.tpu.Event``) and the KV cache is allocated without
filling it (HBM pages of the vTPU are committed when first written; a full
``torch.zeros`` of a 30 GiB cache would touch all of it).

:class:`TPUWorker` sizes the KV cache from the chip's HBM without a profiling run:
``gpu_memory_utilization`` x capacity, less what is allocated after the weights load and
an activation reserve (:func:`activation_reserve_bytes`).
"""

from __future__ import annotations

import contextlib
import gc
from functools import partial

import torch
from torch.overrides import TorchFunctionMode
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.mem_utils import format_gib
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes

logger = init_logger(__name__)


@contextlib.contextmanager
def _tpu_as_cuda():
    """torch.cuda's stream and event names, which vLLM's GPU runner calls, as the tpu ones."""
    saved = {
        n: getattr(torch.cuda, n)
        for n in ("Stream", "Event", "current_stream", "default_stream", "stream", "set_stream")
    }

    def _event(*args, blocking=None, **kwargs):
        return torch.tpu.Event(*args, **kwargs)

    torch.cuda.Stream = torch.tpu.Stream
    torch.cuda.Event = _event
    torch.cuda.current_stream = partial(torch.tpu.current_stream)
    torch.cuda.default_stream = partial(torch.tpu.default_stream)
    torch.cuda.stream = partial(torch.tpu.stream)
    torch.cuda.set_stream = partial(torch.tpu.set_stream)
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(torch.cuda, n, v)


class _NoFillOnTpu(TorchFunctionMode):
    """``torch.zeros(..., device=tpu)`` becomes ``torch.empty``: the KV cache's backing buffer
    stays untouched (reads of never-written slots are masked by the attention backend)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.zeros and torch.device(kwargs.get("device", "cpu")).type == "tpu":
            return torch.empty(*args, **kwargs)
        return func(*args, **kwargs)


class TPUModelRunner(GPUModelRunner):
    """vLLM's GPU model runner with its device on a tpu chip (eager execution)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        with _tpu_as_cuda():
            super().__init__(vllm_config, device)
        self.use_cuda_graph = False

    def initialize_kv_cache_tensors(self, kv_cache_config, kernel_block_sizes, kv_cache_allocation_context=None):
        with _NoFillOnTpu():
            return super().initialize_kv_cache_tensors(kv_cache_config, kernel_block_sizes, kv_cache_allocation_context)

    def _sync_device(self) -> None:
        torch.tpu.synchronize(self.device)

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        return sampled_token_ids.tolist()


def activation_reserve_bytes(vllm_config: VllmConfig) -> int:
    """HBM kept free for activations of the largest step, in bytes: an estimate, in place of
    vLLM's profiling run (which would run a full ``max_num_batched_tokens`` batch).

    Per scheduled token: the logits (vocab x 4 bytes, float32) plus the widest hidden
    activations (4 x max(hidden, intermediate) x dtype bytes), times 2 for temporaries.
    """
    mc = vllm_config.model_config
    tokens = vllm_config.scheduler_config.max_num_batched_tokens
    hf = mc.hf_text_config
    hidden = int(getattr(hf, "hidden_size", 0) or getattr(hf, "n_embd", 0) or 1024)
    inter = int(getattr(hf, "intermediate_size", 0) or getattr(hf, "n_inner", 0) or 4 * hidden)
    vocab = int(mc.get_vocab_size())
    dtype_bytes = torch.empty((), dtype=mc.dtype).element_size()
    return 2 * tokens * (4 * vocab + 4 * max(hidden, inter) * dtype_bytes)


class TPUWorker(Worker):
    """vLLM's worker on one tpu chip (``tpu:<local_rank>``); collectives over ``tpu_dist``."""

    def init_device(self):
        self.device = torch.device("tpu", self.local_rank)
        torch.tpu.set_device(self.device)
        current_platform.check_if_supports_dtype(self.model_config.dtype)
        init_worker_distributed_environment(
            self.vllm_config, self.rank, self.distributed_init_method, self.local_rank, current_platform.dist_backend
        )
        set_random_seed(self.model_config.seed)
        gc.collect()
        self._init_workspace_and_model_runner()

    def _maybe_get_memory_pool_context(self, tag: str):
        # No sleep-mode (CuMem) allocator on tpu: weights and KV cache use the chip's allocator.
        return contextlib.nullcontext()

    def sleep(self, level: int = 1) -> None:
        raise NotImplementedError("vLLM on tpu: sleep mode is not supported")

    def wake_up(self, tags: list[str] | None = None) -> None:
        raise NotImplementedError("vLLM on tpu: sleep mode is not supported")

    def _make_model_runner(self):
        if self.use_v2_model_runner:
            raise NotImplementedError(
                "vLLM on tpu: the V2 model runner is not supported; unset VLLM_USE_V2_MODEL_RUNNER"
            )
        return TPUModelRunner(self.vllm_config, self.device)

    def determine_available_memory(self) -> int:
        """Bytes of HBM for the KV cache: ``kv_cache_memory_bytes`` when given, else
        ``gpu_memory_utilization`` x the chip's capacity - allocated now - activation reserve."""
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit is not None:
            return int(explicit)
        total = int(torch.tpu.get_device_properties(self.device).total_memory)
        requested = int(total * self.cache_config.gpu_memory_utilization)
        torch.tpu.synchronize(self.device)
        used = int(torch.tpu.memory_allocated(self.device))
        reserve = activation_reserve_bytes(self.vllm_config)
        available = requested - used - reserve
        logger.info(
            "vLLM on tpu: %s of %s GiB HBM (gpu_memory_utilization %.2f): %s GiB allocated, %s GiB "
            "activation reserve, %s GiB KV cache",
            format_gib(requested),
            format_gib(total),
            self.cache_config.gpu_memory_utilization,
            format_gib(used),
            format_gib(reserve),
            format_gib(max(available, 0)),
        )
        if available <= 0:
            raise ValueError(
                f"vLLM on tpu: no HBM left for the KV cache on {self.device}: "
                f"gpu_memory_utilization {self.cache_config.gpu_memory_utilization} of {format_gib(total)} GiB "
                f"is {format_gib(requested)} GiB, the weights and buffers take {format_gib(used)} GiB and the "
                f"activation reserve {format_gib(reserve)} GiB; raise gpu_memory_utilization, lower "
                "max_num_batched_tokens or set kv_cache_memory_bytes"
            )
        self.available_kv_cache_memory_bytes = available
        return available

    def compile_or_warm_up_model(self) -> CompilationTimes:
        # Eager execution: no graphs to capture or compile, and no warm-up batches (a dummy
        # max-size batch would cost minutes on the vTPU's host cores).
        set_random_seed(self.model_config.seed)
        return CompilationTimes(
            language_model=self.compilation_config.compilation_time,
            encoder=self.compilation_config.encoder_compilation_time,
        )
