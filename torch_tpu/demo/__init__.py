"""The main job of torch_tpu: train a small GPT on the vTPU.

``python -m torch_tpu.demo --help`` lists the flags. The job reads the Python
standard library's own source as bytes, trains a decoder-only transformer on the
``tpu`` device with AdamW, prints validation loss as it goes and a generated
sample at the end, and ends with one JSON line: ``val_loss``, ``unigram_nats``,
``tokens_per_s``, ``steps``, ``params`` and ``estimate`` (the cost of the same
step on TPU generations, from the runtime's cost model).

Modules: ``data`` (corpus, split, batches, unigram entropy), ``loop`` (the training
loop, evaluation, sampling), ``train`` (the single-chip job, ``torch.save``
checkpoints), ``fsdp`` (FSDP2 over tpu_dist, DCP checkpoints), ``estimate``
(per-generation cost), ``errors``. The model is ``torch_tpu.estimate.models.gpt``.
Importing this package does not import the others (the CLI must parse
``--topology`` before the runtime starts).
"""
