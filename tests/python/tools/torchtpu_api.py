"""TorchTPU 0.2.0's public names and signatures, as facts (names, parameters, defaults), for
tests/python/tools/test_torchtpu_api.py. Copied from the list read from the public
``torch-tpu`` 0.2.0 wheel (no code of TorchTPU is here).

Each namespace maps a name to ``(kind, detail)``:

* ``("function", "(params)")`` / ``("class", "(self, params)")``: the signature as TorchTPU
  spells it (of ``__init__`` for a class); the test compares parameter names, kinds and
  defaults, not annotations;
* ``("enum", (members, ...))``: an enum and its member names;
* ``("device", None)``: a device-module attribute; TorchTPU follows ``torch.cuda``'s signature;
* ``("property", None)``: a module property (read and assign);
* ``("attribute", None)``: a name whose signature the list does not give.
"""

API = {'torch.tpu': {'EagerMode': ('enum', ('DEFER_AND_FUSE', 'DEFER_NEVER', 'DEFER_NEVER_AND_LAUNCH_BLOCKING')),
               'Event': ('device', None),
               'Precision': ('enum', ('DEFAULT', 'HIGH', 'HIGHEST')),
               'Stream': ('device', None),
               'allow_excess_precision': ('attribute', None),
               'current_device': ('device', None),
               'current_stream': ('device', None),
               'default_generators': ('device', None),
               'default_stream': ('device', None),
               'device': ('device', None),
               'device_count': ('device', None),
               'device_of': ('device', None),
               'eager_mode': ('property', None),
               'get_amp_supported_dtype': ('device', None),
               'get_device_name': ('device', None),
               'get_device_properties': ('device', None),
               'get_rng_state': ('device', None),
               'initial_seed': ('device', None),
               'is_available': ('device', None),
               'is_initialized': ('device', None),
               'manual_seed': ('device', None),
               'manual_seed_all': ('device', None),
               'precision': ('function', '(mode: Precision)'),
               'set_device': ('device', None),
               'set_eager_mode': ('function', '(mode: EagerMode)'),
               'set_rng_state': ('device', None),
               'set_stream': ('device', None),
               'stream': ('device', None),
               'synchronize': ('device', None),
               'topology_aware_mesh': ('device', None)},
 'torch.tpu.compiler': {'custom_compiler_options': ('function', '(options: dict[str, str])')},
 'torch.tpu.distributed': {'set_tpu_launch_env': ('function',
                                                  '(*, nnodes: int | None = None, nproc_per_node: int | None = '
                                                  'None)'),
                           'spmd_safe': ('function', '(func: _F)'),
                           'topology_aware_mesh': ('function',
                                                   '(mesh_shape: tuple[int, ...], *, dcn_mesh_shape: tuple[int, '
                                                   '...] | None = None, allow_split_physical_axes: bool = False, '
                                                   'contiguous_submeshes: bool = False)'),
                           'window_num_stripes': ('attribute', None),
                           'window_stripe_chunk_mb': ('attribute', None)},
 'torch.tpu.ops': {'align_jagged_to_multiple': ('function',
                                                '(nt: torch.Tensor, multiple: int = 128, padding_value: '
                                                'typing.Union[float, int, bool] = 0.0)'),
                   'all_gather_dim': ('function',
                                      '(input: torch.Tensor, dim: int, group: Optional[dist.ProcessGroup] = None)'),
                   'max_pool1d': ('function',
                                  '(input: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int], '
                                  'padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool)'),
                   'max_pool1d_backward': ('function',
                                           '(grad_output: torch.Tensor, input: torch.Tensor, kernel_size: '
                                           'Sequence[int], stride: Sequence[int], padding: Sequence[int], '
                                           'dilation: Sequence[int], ceil_mode: bool)'),
                   'max_pool2d': ('function',
                                  '(input: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int], '
                                  'padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool)'),
                   'max_pool2d_backward': ('function',
                                           '(grad_output: torch.Tensor, input: torch.Tensor, kernel_size: '
                                           'Sequence[int], stride: Sequence[int], padding: Sequence[int], '
                                           'dilation: Sequence[int], ceil_mode: bool)'),
                   'max_pool3d': ('function',
                                  '(input: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int], '
                                  'padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool)'),
                   'max_pool3d_backward': ('function',
                                           '(grad_output: torch.Tensor, input: torch.Tensor, kernel_size: '
                                           'Sequence[int], stride: Sequence[int], padding: Sequence[int], '
                                           'dilation: Sequence[int], ceil_mode: bool)'),
                   'optimization_barrier': ('function', '(inputs: Sequence[torch.Tensor])'),
                   'ragged_all_to_all': ('function',
                                         '(operand: torch.Tensor, output: torch.Tensor, input_offsets: '
                                         'torch.Tensor, send_sizes: torch.Tensor, output_offsets: torch.Tensor, '
                                         'recv_sizes: torch.Tensor, process_group_name: str, *, out: torch.Tensor '
                                         '| None = None)'),
                   'ragged_dot': ('function',
                                  '(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, *, out: '
                                  'torch.Tensor | None = None)'),
                   'ragged_dot_weight_grad': ('function',
                                              '(lhs: torch.Tensor, grad_output: torch.Tensor, group_sizes: '
                                              'torch.Tensor)'),
                   'recv': ('function', '(tensors: Sequence[torch.Tensor], src: int, tag: int)'),
                   'reduce_scatter_dim': ('function',
                                          '(input: torch.Tensor, dim: int, group: Optional[dist.ProcessGroup] = '
                                          "None, reduce_op: str = 'sum')"),
                   'send': ('function', '(tensors: Sequence[torch.Tensor], dst: int, tag: int)'),
                   'sparse_dense_matmul': ('function',
                                           '(row_pointers: torch.Tensor, embedding_ids: torch.Tensor, sample_ids: '
                                           'torch.Tensor, gains: torch.Tensor, embedding_table: torch.Tensor, '
                                           'device_batch_size: int, max_ids_per_partition: int, '
                                           'max_unique_ids_per_partition: int)'),
                   'sparse_dense_matmul_activation_unstack': ('function',
                                                              '(stacked_activations: torch.Tensor, '
                                                              'per_feature_batch_sizes: Sequence[int], '
                                                              'per_feature_dims: Sequence[int])'),
                   'sparse_dense_matmul_grad_with_adagrad': ('function',
                                                             '(row_pointers: torch.Tensor, embedding_ids: '
                                                             'torch.Tensor, sample_ids: torch.Tensor, gains: '
                                                             'torch.Tensor, embedding_table: torch.Tensor, '
                                                             'accumulator: torch.Tensor, activations_grad: '
                                                             'torch.Tensor, learning_rate: torch.Tensor, epsilon: '
                                                             'float, device_batch_size: int, '
                                                             'max_ids_per_partition: int, '
                                                             'max_unique_ids_per_partition: int, computation_name: '
                                                             'str)'),
                   'sparse_dense_matmul_grad_with_adam': ('function',
                                                          '(row_pointers: torch.Tensor, embedding_ids: '
                                                          'torch.Tensor, sample_ids: torch.Tensor, gains: '
                                                          'torch.Tensor, embedding_table: torch.Tensor, momentum: '
                                                          'torch.Tensor, velocity: torch.Tensor, activations_grad: '
                                                          'torch.Tensor, alpha_t: torch.Tensor, beta_1: float, '
                                                          'beta_2: float, epsilon: float, device_batch_size: int, '
                                                          'max_ids_per_partition: int, '
                                                          'max_unique_ids_per_partition: int, computation_name: '
                                                          'str)'),
                   'sparse_dense_matmul_grad_with_sgd': ('function',
                                                         '(row_pointers: torch.Tensor, embedding_ids: '
                                                         'torch.Tensor, sample_ids: torch.Tensor, gains: '
                                                         'torch.Tensor, embedding_table: torch.Tensor, '
                                                         'activations_grad: torch.Tensor, learning_rate: '
                                                         'torch.Tensor, device_batch_size: int, '
                                                         'max_ids_per_partition: int, '
                                                         'max_unique_ids_per_partition: int, computation_name: '
                                                         'str)'),
                   'sparse_dense_matmul_gradient_stack': ('function',
                                                          '(unstacked_gradients: Sequence[torch.Tensor], '
                                                          'stacked_batch_size: int, stacked_feature_dim: int)'),
                   'sparse_gather': ('function',
                                     '(row_pointers: torch.Tensor, indices: torch.Tensor, operand: torch.Tensor, '
                                     'max_non_zeroes_per_row: int)'),
                   'sparse_gather_backward': ('function',
                                              '(grad_output: torch.Tensor, indices: torch.Tensor, grad_operand: '
                                              'torch.Tensor)'),
                   'sparse_iota': ('function',
                                   '(row_pointers: torch.Tensor, max_non_zeroes: int, max_non_zeroes_per_row: '
                                   'int)'),
                   'sparse_map_row': ('function',
                                      '(csr_tensors: Sequence[torch.Tensor], csr_lengths: Sequence[int], '
                                      'dense_args: Sequence[torch.Tensor], body_mlir: str, dummy_outputs: '
                                      'Sequence[torch.Tensor], max_non_zeroes_per_row: int, pad_value: int, '
                                      'max_pad_per_row: int, wait_threshold: float, result_row_pointer_op_index: '
                                      'int)'),
                   'splash_sdpa': ('function',
                                   '(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: Optional[float] '
                                   '= None, is_causal: bool = True, local_window_size: Optional[int] = None, '
                                   'enable_gqa: bool = False, block_q: int = 512, block_kv: int = 512, block_dkv: '
                                   'int = 512, block_kv_compute: int = 512, block_q_dkv: int = 512, block_kv_dkv: '
                                   'int = 512, block_kv_dkv_compute: int = 512, block_q_dq: Optional[int] = None, '
                                   'block_kv_dq: Optional[int] = None, use_fused_bwd_kernel: bool = True, '
                                   "use_vmap_bwd: bool = True, q_layout: str = 'HEAD_DIM_MINOR', k_layout: str = "
                                   "'HEAD_DIM_MINOR', v_layout: str = 'HEAD_DIM_MINOR')"),
                   'strip_jagged_padding': ('function',
                                            '(nt: torch.Tensor, valid_tokens: typing.Optional[int] = None)')},
 'torch.tpu.optimizers': {'AdamW': ('class',
                                    '(self, lr: float = 0.001, weight_decay: float = 0.01, beta1: float = 0.9, '
                                    'beta2: float = 0.999, eps: float = 1e-08, use_bfloat16_moments: bool = True, '
                                    'amsgrad: bool = False, maximize: bool = False, foreach: bool | None = False, '
                                    'capturable: bool = True, differentiable: bool = False, fused: bool | None = '
                                    'False, grad_scale: torch.Tensor | None = None, found_inf: torch.Tensor | None '
                                    '= None)'),
                          'Muon': ('class',
                                   '(self, lr: float = 0.001, weight_decay: float = 0.1, momentum: float = 0.95, '
                                   'nesterov: bool = True, ns_coefficients: tuple[float, float, float] = '
                                   '(DEFAULT_A, DEFAULT_B, DEFAULT_C), eps: float = EPS, ns_steps: int = '
                                   'DEFAULT_NS_STEPS, adjust_lr_fn: str | None = None, use_bfloat16_moments: bool '
                                   '= False, foreach: bool | None = False, has_complex: bool = False)'),
                          'Optimizer': ('class', '(self, lr: float = 0.001, weight_decay: float = 0.0)'),
                          'Sgd': ('class',
                                  '(self, lr: float = 0.001, momentum: float = 0.0, dampening: float = 0.0, '
                                  'weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False, '
                                  'foreach: bool | None = False, fused: bool | None = True, grad_scale: '
                                  'torch.Tensor | None = None, found_inf: torch.Tensor | None = None, '
                                  'has_sparse_grad: bool = False)'),
                          'SingleTraceTrainer': ('class',
                                                 '(self, model: torch.nn.Module, optimizer: Any = None, '
                                                 'compile_fn: Callable[..., Any] | None = None, compute_loss_fn: '
                                                 'Callable[..., torch.Tensor] | None = None)')},
 'torch.tpu.pallas': {'get_pallas_mesh': ('function',
                                          '(axis_names: Sequence[str] | str, mesh_shape: Sequence[int] | None = '
                                          'None, process_group: dist.ProcessGroup | None = None)'),
                      'jax_op': ('function',
                                 '(name: str, fn: None = None, /, *, donate_argnums: Sequence[int] | None = None, '
                                 'mesh: jax.sharding.Mesh | None = None, input_partition_specs: tuple[tuple[str, '
                                 '...], ...] | None = None, output_partition_specs: tuple[tuple[str, ...], ...] | '
                                 'None = None)')},
 'torch.tpu.profiler': {'TpuProfilerConfig': ('class',
                                              '(self, *, host_tracer_level: int = 2, device_tracer_level: int = 1, '
                                              'python_tracer_level: int = 0, run_dir: os.PathLike[str] | str | '
                                              'None = None, worker_rank: str | None = None, experimental_options: '
                                              'Mapping[str, _ExperimentalValue] | None = None, '
                                              'check_experimental_options: bool = True)')}}
