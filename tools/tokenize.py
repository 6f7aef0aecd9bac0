#!/usr/bin/env python3
"""tools/tokenize.py - text files to llm.c's .bin token format with a Hugging Face tokenizer.

    tools/tokenize.py --tokenizer PATH --out OUT.bin [--eot TOKEN|none] FILE...

PATH is a tokenizer.json (Hugging Face's `tokenizers` format: GPT-2's byte-level BPE, or one
of your own) or a directory holding one. Nothing is downloaded. Each FILE is one document;
its tokens follow the end-of-text token (llm.c's convention: every document starts with it),
by default "<|endoftext|>" when the vocabulary has it (--eot none: no separator).

OUT.bin: a 256 x int32 header (magic 20240520, version 1, the token count) and the tokens as
uint16, what train_gpt2 --data / --val-data read (with --vocab the tokenizer's size, 50257
for GPT-2's). Refuses a vocabulary over 65536 tokens (uint16). Needs the Python package
`tokenizers` (installed with transformers).
"""
import argparse
import os
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--tokenizer', required=True, help='tokenizer.json, or a directory holding it')
    ap.add_argument('--out', required=True, help='the .bin file to write')
    ap.add_argument('--eot', default='<|endoftext|>', help='the token before each document ("none": nothing)')
    ap.add_argument('files', nargs='+')
    a = ap.parse_args()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        sys.exit('tools/tokenize.py: needs the Python package tokenizers (pip install tokenizers)')
    path = os.path.join(a.tokenizer, 'tokenizer.json') if os.path.isdir(a.tokenizer) else a.tokenizer
    if not os.path.isfile(path):
        sys.exit(f'tools/tokenize.py: {path}: no such tokenizer.json')
    tok = Tokenizer.from_file(path)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if vocab > 65536:
        sys.exit(f'tools/tokenize.py: {path}: {vocab} tokens do not fit the .bin format\'s uint16')
    eot = None
    if a.eot != 'none':
        eot = tok.token_to_id(a.eot)
        if eot is None and a.eot != '<|endoftext|>':
            sys.exit(f'tools/tokenize.py: {path}: no token {a.eot!r} (--eot none for no separator)')
    ids = []
    for f in a.files:
        text = open(f, encoding='utf-8', newline='').read()  # the file's line ends as they are
        if eot is not None:
            ids.append(eot)
        ids.extend(tok.encode(text, add_special_tokens=False).ids)
    if len(ids) >= 2 ** 31:
        sys.exit('tools/tokenize.py: over 2^31 tokens do not fit the header\'s count')
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = 20240520, 1, len(ids)
    tmp = a.out + '.tmp'
    with open(tmp, 'wb') as out:
        out.write(hdr.tobytes())
        out.write(np.asarray(ids, dtype=np.uint16).tobytes())
    os.replace(tmp, a.out)
    print(f'{a.out}: {len(ids)} tokens from {len(a.files)} file(s), vocabulary {vocab} '
          f'({path}; end-of-text {"none" if eot is None else eot})')


if __name__ == '__main__':
    main()
