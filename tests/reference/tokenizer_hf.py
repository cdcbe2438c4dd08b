#!/usr/bin/env python3
"""Reference ids for kiln's tokenizer tests, from Hugging Face `tokenizers` (pip install tokenizers).

Writes, next to this script:
  hf_trained_tokenizer.json  a byte-level BPE trained by `tokenizers` on data/tokenizer_corpus.txt
  tokenizer_expected.json    ids of data/multilingual.txt under (a) that tokenizer and
                             (b) kiln_tokenizer.json, the tokenizer kiln trains on the same corpus
                             (make it first: build/kiln tokenizer train --text
                             tests/reference/data/tokenizer_corpus.txt --vocab-size 600
                             --out tests/reference/kiln_tokenizer.json)
The C++ test (tests/tokenizer/test_tokenizer.cpp) checks kiln against these without Python.
"""
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

here = os.path.dirname(os.path.abspath(__file__))
corpus = os.path.join(here, "data", "tokenizer_corpus.txt")
text = open(os.path.join(here, "data", "multilingual.txt"), encoding="utf-8").read()

hf = Tokenizer(models.BPE())
hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
hf.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=600, min_frequency=2, special_tokens=["<|endoftext|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
hf.train([corpus], trainer)
hf.save(os.path.join(here, "hf_trained_tokenizer.json"))

kiln = Tokenizer.from_file(os.path.join(here, "kiln_tokenizer.json"))
out = {
    "tokenizers_version": __import__("tokenizers").__version__,
    "hf_trained_ids": hf.encode(text).ids,
    "kiln_trained_ids_by_hf": kiln.encode(text).ids,
    "kiln_decoded_by_hf_roundtrip": kiln.decode(kiln.encode(text).ids, skip_special_tokens=False) == text,
}
with open(os.path.join(here, "tokenizer_expected.json"), "w") as f:
    json.dump(out, f)
print("hf vocab", hf.get_vocab_size(), "kiln vocab", kiln.get_vocab_size(),
      "ids", len(out["hf_trained_ids"]), len(out["kiln_trained_ids_by_hf"]))
