#!/usr/bin/env python3
"""Draws loss curves of the GPT example's --log CSV files into one SVG, with no plotting
library (matplotlib is not installed on the machines this project is measured on).

    tools/plot_loss_svg.py OUT.svg LABEL=run1.csv LABEL=run2.csv ... [--smooth K]

Each CSV is what `build/train_gpt2 --log FILE` writes (step,loss,lr,grad_norm,val_loss).
Each curve is the training loss averaged over the K steps up to each step (default 10);
validation losses, where logged, are drawn as dots of the same colour.
"""
import csv
import sys

COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd']


def main():
    args = sys.argv[1:]
    smooth = 10
    if '--smooth' in args:
        i = args.index('--smooth')
        smooth = int(args[i + 1])
        del args[i:i + 2]
    if len(args) < 2 or any('=' not in a for a in args[1:]):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out, runs = args[0], []
    for a in args[1:]:
        label, path = a.split('=', 1)
        rows = list(csv.DictReader(open(path)))
        steps = [int(r['step']) for r in rows]
        loss = [float(r['loss']) for r in rows]
        avg = [sum(loss[max(0, i - smooth + 1):i + 1]) / len(loss[max(0, i - smooth + 1):i + 1])
               for i in range(len(loss))]
        val = [(int(r['step']), float(r['val_loss'])) for r in rows if r.get('val_loss')]
        runs.append((label, steps, avg, val))
    W, H, L, R, T, B = 760, 420, 60, 20, 30, 50
    xmax = max(max(r[1]) for r in runs) or 1
    ys = [y for r in runs for y in r[2]] + [v for r in runs for _, v in r[3]]
    ymin, ymax = min(ys), max(ys)
    ymin, ymax = ymin - 0.02 * (ymax - ymin), ymax + 0.02 * (ymax - ymin)

    def px(x):
        return L + (W - L - R) * x / xmax

    def py(y):
        return T + (H - T - B) * (ymax - y) / (ymax - ymin)

    s = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
         'font-size="12">' % (W, H), '<rect width="100%" height="100%" fill="white"/>']
    for k in range(6):
        y = ymin + (ymax - ymin) * k / 5
        s.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, py(y), W - R, py(y)))
        s.append('<text x="%d" y="%.1f" text-anchor="end">%.2f</text>' % (L - 5, py(y) + 4, y))
    for k in range(6):
        x = xmax * k / 5
        s.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (px(x), H - B + 16, x))
    s.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>' % (L, T, W - L - R, H - T - B))
    s.append('<text x="%d" y="%d" text-anchor="middle">step</text>' % ((L + W - R) // 2, H - 12))
    s.append('<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">loss (%d-step mean; dots: '
             'validation)</text>' % ((T + H - B) // 2, (T + H - B) // 2, smooth))
    for n, (label, steps, avg, val) in enumerate(runs):
        c = COLORS[n % len(COLORS)]
        pts = ' '.join('%.1f,%.1f' % (px(x), py(y)) for x, y in zip(steps, avg))
        s.append('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>' % (c, pts))
        for x, y in val:
            s.append('<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>' % (px(x), py(y), c))
        s.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>'
                 % (W - R - 230, T + 16 + 18 * n, W - R - 205, T + 16 + 18 * n, c))
        s.append('<text x="%d" y="%d">%s</text>' % (W - R - 200, T + 20 + 18 * n, label))
    s.append('</svg>')
    open(out, 'w').write('\n'.join(s) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
