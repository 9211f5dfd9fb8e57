"""The tpu platform of vLLM (imported by vLLM only, through :func:`torch_tpu.serving.platform_plugin`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

import torch_tpu  # noqa: F401  (the tpu device)

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)


#: vLLM's KV-cache block, in tokens, when the user gives none (``--block-size``).
DEFAULT_BLOCK_SIZE = 16
#: The attention backend (vLLM's --attention-backend name) and its class.
ATTENTION_BACKEND = "TPU_PAGED"
ATTENTION_BACKEND_CLS = "torch_tpu.serving.attention.TpuPagedAttentionBackend"


class TpuPlatform(Platform):
    """vLLM's view of the tpu device: ``torch.device("tpu", i)``, PrivateUse1, ``tpu_dist``.

    KV-cache capacity: ``gpu_memory_utilization`` of the chip's HBM
    (``torch.tpu.get_device_properties(i).total_memory``: the generation's capacity in
    physical bytes, or ``TORCH_TPU_HBM_BYTES``), less the weights and an activation reserve
    (:meth:`torch_tpu.serving.worker.TPUWorker.determine_available_memory`).
    """

    _enum = PlatformEnum.OOT
    device_name: str = "tpu"
    device_type: str = "tpu"
    dispatch_key: str = "PrivateUse1"
    dist_backend: str = "tpu_dist"
    device_control_env_var: str = "TPU_VISIBLE_CHIPS"
    # Standalone helpers vLLM compiles (not the model): eager on tpu.
    simple_compile_backend: str = "eager"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.tpu.get_device_name(device_id)

    @classmethod
    def get_device_uuid(cls, device_id: int = 0) -> str:
        p = torch.tpu.get_device_properties(device_id)
        return f"tpu-{p.generation}-{p.topology}-{p.global_id}"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return int(torch.tpu.get_device_properties(device_id).total_memory)

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.tpu.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.tpu.manual_seed_all(seed)

    @classmethod
    def inference_mode(cls):
        return torch.no_grad()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        return float(torch.tpu.memory_allocated(device))

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"vLLM on tpu: dtype {dtype} is not supported (bfloat16, float16 or float32)")

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads: int | None = None) -> str:
        if attn_selector_config.use_mla or attn_selector_config.use_sparse:
            raise NotImplementedError("vLLM on tpu: MLA and sparse attention are not supported")
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        if ATTENTION_BACKEND not in AttentionBackendEnum._member_map_:
            AttentionBackendEnum.register(ATTENTION_BACKEND, ATTENTION_BACKEND_CLS)
        if selected_backend is not None and selected_backend.name != ATTENTION_BACKEND:
            logger.info("vLLM on tpu: attention backend %s ignored; using %s", selected_backend, ATTENTION_BACKEND)
        return ATTENTION_BACKEND_CLS

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        # all_reduce / all_gather / ... as torch.distributed collectives of the device group (tpu_dist).
        return "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"

    @classmethod
    def supports_structured_output(cls) -> bool:
        return False

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def num_compute_units(cls, device_id: int = 0) -> int:
        return int(torch.tpu.get_device_properties(device_id).tensorcores_per_chip)

    @classmethod
    def import_kernels(cls) -> None:
        # No vllm._C here (the pure-Python build): the model's custom ops take their
        # forward_native paths; the Triton kernels vLLM's runner launches get torch versions.
        from .kernels import register

        register()

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        from .kernels import register

        register()

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm.config import CompilationMode
        from vllm.config.compilation import CUDAGraphMode

        cache_config = vllm_config.cache_config
        if cache_config is not None and not getattr(cache_config, "user_specified_block_size", False):
            cache_config.block_size = DEFAULT_BLOCK_SIZE

        model_config = vllm_config.model_config
        compilation_config = vllm_config.compilation_config
        if compilation_config.mode != CompilationMode.NONE:
            # vLLM's piecewise torch.compile path needs Inductor kernels for its device: eager
            # execution on tpu (each op queued on the chip's stream) instead.
            logger.info("vLLM on tpu: compilation mode %s -> NONE (eager)", compilation_config.mode)
            compilation_config.mode = CompilationMode.NONE
        compilation_config.cudagraph_mode = CUDAGraphMode.NONE
        compilation_config.cudagraph_capture_sizes = []
        if model_config is not None:
            model_config.enforce_eager = True

        scheduler_config = vllm_config.scheduler_config
        scheduler_config.async_scheduling = False

        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = "torch_tpu.serving.worker.TPUWorker"
        if parallel_config.enable_dbo:
            parallel_config.enable_dbo = False
        parallel_config.disable_custom_all_reduce = True
        if parallel_config.world_size > 1 and parallel_config.distributed_executor_backend in (None, "uni"):
            parallel_config.distributed_executor_backend = "mp"
        if parallel_config.tensor_parallel_size > 1:  # for the mp executor's worker processes
            os.environ.setdefault("LOCAL_WORLD_SIZE", str(parallel_config.tensor_parallel_size))

    @classmethod
    def use_custom_allreduce(cls) -> bool:
        return False

    @classmethod
    def opaque_attention_op(cls) -> bool:
        return False
