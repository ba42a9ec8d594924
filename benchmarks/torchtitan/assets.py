"""Offline assets for torchtitan runs: a byte-level BPE tokenizer trained on tinyshakespeare and
the same text as a local dataset in the form torchtitan's `c4_test` loader reads.

torchtitan 0.3.0's wheel ships no tokenizer and no test data, and nothing may be downloaded at
test time, so both are made here in a few seconds:

    python benchmarks/torchtitan/assets.py OUT [--text PATH] [--vocab 2048]

writes OUT/tokenizer/{tokenizer.json, tokenizer_config.json} (torchtitan's
`HuggingFaceTokenizer` reads them: `--hf_assets_path OUT/tokenizer`) and OUT/data/train.jsonl,
one {"text": ...} record per paragraph (`--dataloader.dataset c4_test
--dataloader.dataset_path OUT/data`, which `datasets.load_dataset(path, split="train")`
reads offline). The default text is ../shared/data/tinyshakespeare.txt beside the repository,
the file the other tests use.
"""

import argparse
import json
import os

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_TEXT = os.path.normpath(os.path.join(ROOT, "..", "shared", "data",
                                             "tinyshakespeare.txt"))


def paragraphs(text):
    """The text's blank-line separated paragraphs (speeches), stripped, none empty."""
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def train_tokenizer(texts, vocab_size):
    """A byte-level BPE `tokenizers.Tokenizer` with BOS/EOS as ids 0 and 1."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def make_assets(out, text_path=DEFAULT_TEXT, vocab_size=2048):
    """Write the tokenizer and the dataset under `out`; returns (tokenizer dir, data dir)."""
    if not isinstance(vocab_size, int) or not 258 <= vocab_size <= 1 << 20:
        raise ValueError(f"vocab_size ({vocab_size!r}) must be an int in [258, 2^20]")
    if not os.path.isfile(text_path):
        raise FileNotFoundError(f"text_path ({text_path}) is not a file")
    with open(text_path, encoding="utf-8") as f:
        texts = paragraphs(f.read())
    tok_dir, data_dir = os.path.join(out, "tokenizer"), os.path.join(out, "data")
    os.makedirs(tok_dir, exist_ok=True)
    os.makedirs(data_dir, exist_ok=True)
    train_tokenizer(texts, vocab_size).save(os.path.join(tok_dir, "tokenizer.json"))
    cfg = {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": False,
           "model_max_length": 1 << 20, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(data_dir, "train.jsonl"), "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return tok_dir, data_dir


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--vocab", type=int, default=2048)
    a = ap.parse_args(argv)
    make_assets(a.out, a.text, a.vocab)


if __name__ == "__main__":
    main()
