#!/usr/bin/env python3
"""Draws the GPT-2 example's loss curves (zero at several stages, ranks and dtypes) over
PyTorch's, in one PNG.

    tools/plot_loss.py CURVES.csv OUT.png

CURVES.csv is what `tests/gpt2_reference.py --curves CURVES.csv` writes: a column `step` and
one column per run, named "pytorch ..." for the references and "zero ..." for the C example.
The left panel shows every curve; the right one each zero curve's relative difference from
the PyTorch run of the same precision (fp32 runs against "pytorch fp32", bf16/f16 runs against
"pytorch bf16/f16 emulation"), on a log scale.
"""
import csv
import sys

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    rows = list(csv.DictReader(open(sys.argv[1])))
    names = [n for n in rows[0] if n != 'step']
    steps = [int(r['step']) for r in rows]
    col = {n: [float(r[n]) for r in rows] for n in names}
    fig, (ax, ad) = plt.subplots(1, 2, figsize=(13, 5))
    refs = [n for n in names if n.startswith('pytorch')]
    for n in refs:
        ax.plot(steps, col[n], color='black' if 'fp32' in n else 'gray', linewidth=4, alpha=0.35, label=n)
    for n in names:
        if n in refs:
            continue
        ax.plot(steps, col[n], linewidth=1, label=n)
        kind = next((d for d in ('bf16', 'f16') if f' {d} ' in f' {n} '), 'fp32')
        ref = 'pytorch fp32' if kind == 'fp32' else f'pytorch {kind} emulation'
        if ref in col:
            rel = [max(abs(a - b) / abs(b), 1e-12) for a, b in zip(col[n], col[ref])]
            ad.semilogy(steps, rel, linewidth=1, label=f'{n} vs {ref}')
    ax.set_xlabel('step')
    ax.set_ylabel('training loss (nats per byte)')
    ax.set_title('GPT-2 (L2 H4 C64 T32, bytes): zero over PyTorch / Hugging Face')
    ax.legend(fontsize=7)
    ad.set_xlabel('step')
    ad.set_ylabel('|loss - reference| / reference')
    ad.axhline(1e-4, color='red', linestyle='--', linewidth=0.8, label='fp32 bound 1e-4')
    ad.set_title('relative difference from PyTorch')
    ad.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    return 0


if __name__ == '__main__':
    sys.exit(main())
