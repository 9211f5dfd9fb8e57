"""A tiny tokenizer and text dataset for TorchTitan, built locally from the Python standard library's source.

No model hub is reachable, and TorchTitan's wheel does not ship its repository's test assets
(``tests/assets/tokenizer``, ``tests/assets/c4_test``), so this builds their stand-ins:

* ``<out>/tokenizer/tokenizer.json`` and ``tokenizer_config.json``: a byte-level BPE trained with
  the ``tokenizers`` library on stdlib modules, ``vocab_size`` ids (TorchTitan's llama3 debug
  model has a 2048-entry vocabulary), ``<|begin_of_text|>`` / ``<|end_of_text|>`` as BOS / EOS;
* ``<out>/dataset/train.jsonl``: one ``{"text": ...}`` record per stdlib module, which
  ``datasets.load_dataset(<out>/dataset, split="train")`` (TorchTitan's ``c4_test`` loader) reads.

Deterministic: the same Python version gives the same files.

    python examples/torchtitan/assets.py OUT_DIR
"""

import json
import os
import sys
import sysconfig

# Sorted, so the corpus (and so the tokenizer) does not depend on directory order.
MODULES = sorted(
    [
        "abc.py",
        "argparse.py",
        "bisect.py",
        "calendar.py",
        "colorsys.py",
        "contextlib.py",
        "copy.py",
        "csv.py",
        "dataclasses.py",
        "difflib.py",
        "enum.py",
        "fnmatch.py",
        "fractions.py",
        "functools.py",
        "getopt.py",
        "glob.py",
        "gzip.py",
        "heapq.py",
        "hmac.py",
        "inspect.py",
        "keyword.py",
        "linecache.py",
        "locale.py",
        "numbers.py",
        "operator.py",
        "optparse.py",
        "pprint.py",
        "queue.py",
        "random.py",
        "reprlib.py",
        "sched.py",
        "secrets.py",
        "shlex.py",
        "shutil.py",
        "statistics.py",
        "string.py",
        "textwrap.py",
        "threading.py",
        "timeit.py",
        "tokenize.py",
        "traceback.py",
        "types.py",
        "typing.py",
        "uuid.py",
        "warnings.py",
        "weakref.py",
        "zipfile/__init__.py",
    ]
)
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def stdlib_texts(max_chars: int = 60_000) -> list[str]:
    """The stdlib modules' source, each cut to `max_chars` characters."""
    root = sysconfig.get_paths()["stdlib"]
    texts = []
    for name in MODULES:
        path = os.path.join(root, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                texts.append(f.read()[:max_chars])
    if not texts:
        raise RuntimeError(f"no stdlib sources under {root}")
    return texts


def build(out_dir: str, vocab_size: int = 2048) -> tuple[str, str]:
    """Writes the tokenizer and dataset under `out_dir`; returns (tokenizer dir, dataset dir)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok_dir = os.path.join(out_dir, "tokenizer")
    data_dir = os.path.join(out_dir, "dataset")
    os.makedirs(tok_dir, exist_ok=True)
    os.makedirs(data_dir, exist_ok=True)
    texts = stdlib_texts()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(os.path.join(tok_dir, "tokenizer.json"))
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True}, f)
    with open(os.path.join(data_dir, "train.jsonl"), "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return tok_dir, data_dir


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(*build(sys.argv[1]), sep="\n")
