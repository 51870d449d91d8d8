"""Claim: `plexus plot RUN RUN --out F` writes F.png and F.svg from the runs'
metrics.jsonl: the PNG is a valid PNG (signature, IHDR, every chunk's CRC,
IDAT inflating to exactly height rows of filtered scanlines) whose decoded
pixels hold both runs' curve colours; the SVG parses with xml.etree and
holds, per panel (train loss, eval loss, eval accuracy, learning rate),
exactly one stroked path in each run's colour.  A missing run is refused
with a message naming metrics.jsonl."""

import os
import re
import shutil
import struct
import sys
import tempfile
import xml.etree.ElementTree as ET
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_util as cu  # noqa: E402

# tab10's first two colours, what plexus plot gives runs 1 and 2.
COLOURS = [(31, 119, 180), (255, 127, 14)]
PANELS = 4  # train loss, eval loss, eval accuracy, learning rate (no perplexity: a classifier)


def decode_png(path):
    """(width, height, rows of RGBA tuples) of an 8-bit RGB/RGBA PNG."""
    with open(path, "rb") as f:
        data = f.read()
    cu.check(data[:8] == b"\x89PNG\r\n\x1a\n", "PNG signature")
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        cu.check(zlib.crc32(kind + body) & 0xFFFFFFFF == crc, "CRC of chunk %r" % kind)
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
        if kind == b"IEND":
            break
    w, h, depth, ctype, _, _, interlace = ihdr
    cu.check(depth == 8 and ctype in (2, 6) and interlace == 0, "8-bit RGB(A), not interlaced: %r" % (ihdr,))
    bpp = 4 if ctype == 6 else 3
    raw = zlib.decompress(idat)
    stride = w * bpp
    cu.check(len(raw) == h * (stride + 1), "IDAT inflates to %d bytes, expected %d" % (len(raw), h * (stride + 1)))
    rows, prev = [], bytearray(stride)
    for y in range(h):
        ft = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ft == 1:
                line[i] = (line[i] + a) & 255
            elif ft == 2:
                line[i] = (line[i] + b) & 255
            elif ft == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ft == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            elif ft != 0:
                cu.check(False, "filter type %d" % ft)
        rows.append(line)
        prev = line
    return w, h, bpp, rows


def svg_stroke_colours(path):
    """The stroke colour (r, g, b in 0..255) of every stroked <path> outside <defs>."""
    root = ET.parse(path).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    out = []

    def walk(el, in_defs):
        for ch in el:
            if ch.tag == ns + "defs" or ch.tag == ns + "symbol":
                continue
            if ch.tag == ns + "path":
                style = ch.get("style", "") + ";stroke:" + ch.get("stroke", "")
                m = re.search(r"stroke:rgb\(([\d.]+)%,\s*([\d.]+)%,\s*([\d.]+)%\)", style)
                if m and ("fill:none" in style.replace(" ", "") or ch.get("fill") == "none"):
                    out.append(tuple(round(float(v) * 255 / 100) for v in m.groups()))
            walk(ch, in_defs)

    walk(root, False)
    return out


def main():
    work = tempfile.mkdtemp(prefix="px_plot_")
    # fontconfig (under cairo's text) keeps its configuration until exit by
    # design: LeakSanitizer would flag it in sanitizer builds.
    supp = os.path.join(work, "lsan.supp")
    with open(supp, "w") as f:
        f.write("leak:libfontconfig\n")
    plot_env = dict(os.environ, LSAN_OPTIONS="suppressions=" + supp)
    try:
        runs = []
        for name, lr in (("run-a", "0.05"), ("run-b", "0.01")):
            d = os.path.join(work, name)
            p = cu.run(["train", "--model", "mlp", "--hidden", "16", "--data-path", cu.FMNIST, "--train-subset", "256",
                        "--val-subset", "64", "--batch-size", "32", "--epochs", "2", "--lr", lr, "--log-every", "1",
                        "--eval-every", "4", "--progress", "lines", "--out", d])
            if not cu.check(p.returncode == 0, "training %s" % name):
                cu.finish("test_cli_plot_writes_png_and_svg_one_curve_per_run")
            runs.append(d)
        out = os.path.join(work, "curves")
        p = cu.run(["plot"] + runs + ["--out", out], env=plot_env)
        cu.check(p.returncode == 0, "plexus plot exits 0")
        cu.check("4 panel(s)" in p.stdout, "four panels announced: %r" % p.stdout)

        w, h, bpp, rows = decode_png(out + ".png")
        cu.check(w >= 500 and h >= 300, "PNG size %dx%d" % (w, h))
        for col in COLOURS:
            n = sum(1 for row in rows for x in range(w) if tuple(row[x * bpp:x * bpp + 3]) == col)
            cu.check(n > 200, "PNG has %d pixels of curve colour %r (expected > 200)" % (n, col))
        n_white = sum(1 for row in rows for x in range(0, w, 7) if tuple(row[x * bpp:x * bpp + 3]) == (255, 255, 255))
        cu.check(n_white > (w // 7) * h // 2, "PNG background mostly white")

        strokes = svg_stroke_colours(out + ".svg")
        for col in COLOURS:
            n = sum(1 for s in strokes if all(abs(a - b) <= 1 for a, b in zip(s, col)))
            cu.check(n == PANELS, "SVG: %d stroked paths in %r, expected one per panel (%d)" % (n, col, PANELS))

        # A single run, and --out with an extension.
        p = cu.run(["plot", runs[0], "--out", os.path.join(work, "one.svg")], env=plot_env)
        cu.check(p.returncode == 0 and os.path.exists(os.path.join(work, "one.png")), "one run, --out one.svg")
        strokes = svg_stroke_colours(os.path.join(work, "one.svg"))
        cu.check(sum(1 for s in strokes if all(abs(a - b) <= 1 for a, b in zip(s, COLOURS[1]))) == 0,
                 "one run: no second colour")

        p = cu.run(["plot", os.path.join(work, "nope")], expect_ok=False, env=plot_env)
        cu.check(p.returncode != 0 and "metrics.jsonl" in p.stderr, "missing run refused: %r" % p.stderr)
        if os.environ.get("PX_PLOT_KEEP"):
            shutil.copy(out + ".png", os.environ["PX_PLOT_KEEP"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cu.finish("test_cli_plot_writes_png_and_svg_one_curve_per_run")


if __name__ == "__main__":
    main()
