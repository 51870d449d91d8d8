"""plexus's image pipeline gives the tensors torchvision gives.

Decode + center crop + normalise, and decode + random crop + flip + normalise
(at the window and flip plexus drew, reported by tests/tools/px_image_dump),
must be bit-identical to torchvision's read_image/decode_jpeg + CenterCrop /
F.crop + F.hflip + ToTensor-style v/255 + Normalize: same pixels, same float
operations.  Resize is compared with torchvision's tensor Resize(BILINEAR,
antialias=False), the same align_corners=False bilinear: up to one u8 level
(1/(255·std) after normalising) may differ where the interpolated value lies
within float rounding of a .5 tie, since the two sum the four weighted
neighbours in a different order; we require at most 1 level anywhere and at
most 1% of values off.  (PIL's and antialias=True resizes average over a wider
window when shrinking; plexus does not, so those are not compared.)

If this fails, a model trained with plexus sees different inputs than the
same model trained with torchvision would: shifted crops, mirrored flips,
other normalisation, a different decoder.
"""

import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torchvision.io as tio
import torchvision.transforms as T
import torchvision.transforms.functional as F

BUILD = os.environ.get("PX_BUILD_DIR", "")
TOOL = os.path.join(BUILD, "tests", "px_image_dump")
MEAN = ["0.485", "0.456", "0.406"]
STD = ["0.229", "0.224", "0.225"]
failures = 0


def check(cond, msg):
    global failures
    if not cond:
        print("FAIL:", msg)
        failures += 1


def plexus(path, channels, resize, crop, random_crop, hflip, seed):
    out = path + ".f32"
    args = [TOOL, path, out, str(channels), str(resize), str(crop), str(int(random_crop)), str(int(hflip)), str(seed)]
    subprocess.run(args + MEAN + STD, check=True)
    with open(out, "rb") as f:
        c, h, w, top, left, flip = map(int, f.readline().split())
        x = np.frombuffer(f.read(), dtype="<f4").reshape(c, h, w)
    os.remove(out)
    return torch.from_numpy(x.copy()), top, left, flip


def normalize(u8, channels):
    # ToTensor on u8 is x.float().div(255); then Normalize.
    mean = [float(np.float32(m)) for m in MEAN[:channels]]
    std = [float(np.float32(s)) for s in STD[:channels]]
    return F.normalize(u8.float().div(255), mean, std)


def same(a, b, what):
    check(a.shape == b.shape, f"{what}: shape {tuple(a.shape)} vs torchvision {tuple(b.shape)}")
    if a.shape == b.shape:
        d = (a - b).abs().max().item()
        check(torch.equal(a, b), f"{what}: differs from torchvision by up to {d:g}")


def main():
    if not os.path.exists(TOOL):
        print(f"missing {TOOL}: set PX_BUILD_DIR to a build with tests/tools built")
        return 1
    torch.manual_seed(0)
    tmp = tempfile.mkdtemp(prefix="px_tv_")
    try:
        # A 61×47 RGB image: noise over a gradient (so resizes are not trivial).
        yy, xx = torch.meshgrid(torch.arange(47), torch.arange(61), indexing="ij")
        base = torch.stack([xx * 4, yy * 5, (xx + yy) * 2]).float()
        img = (base + torch.randint(0, 60, (3, 47, 61))).clamp(0, 255).to(torch.uint8)
        png = os.path.join(tmp, "img.png")
        tio.write_png(img, png)
        gray = img[1:2].contiguous()
        gpng = os.path.join(tmp, "gray.png")
        tio.write_png(gray, gpng)
        jpg = os.path.join(tmp, "img.jpg")
        tio.write_jpeg(img, jpg, quality=90)

        # Decode + center crop + normalise: bit-identical.
        ref = tio.read_image(png, tio.ImageReadMode.RGB)
        check(torch.equal(ref, img), "torchvision does not read back its own PNG")
        x, *_ = plexus(png, 3, 0, 32, False, False, 0)
        same(x, normalize(T.CenterCrop(32)(ref), 3), "PNG center crop 32")
        x, *_ = plexus(png, 3, 0, 0, False, False, 0)
        same(x, normalize(ref, 3), "PNG, no crop")
        x, *_ = plexus(gpng, 1, 0, 21, False, False, 0)
        same(x, normalize(T.CenterCrop(21)(tio.read_image(gpng, tio.ImageReadMode.GRAY)), 1), "gray PNG center crop 21")

        # JPEG: the same libjpeg-turbo decoder (islow IDCT, fancy upsampling).
        jref = tio.decode_jpeg(tio.read_file(jpg))
        x, *_ = plexus(jpg, 3, 0, 40, False, False, 0)
        same(x, normalize(T.CenterCrop(40)(jref), 3), "JPEG center crop 40")

        # Random crop + flip at the window plexus drew.
        flips = set()
        for seed in range(12):
            x, top, left, flip = plexus(png, 3, 0, 32, True, True, seed)
            flips.add(flip)
            r = F.crop(ref, top, left, 32, 32)
            if flip:
                r = F.hflip(r)
            same(x, normalize(r, 3), f"random crop at ({top},{left}) flip {flip} (seed {seed})")
        check(flips == {0, 1}, f"12 seeds drew flips {flips}; want both")

        # Resize (shrink and enlarge) + center crop, against the tensor Resize.
        for size, crop in ((40, 32), (30, 0), (80, 64)):
            x, *_ = plexus(png, 3, size, crop, False, False, 0)
            r = F.resize(ref, [size], interpolation=T.InterpolationMode.BILINEAR, antialias=False)
            if crop:
                r = T.CenterCrop(crop)(r)
            want = normalize(r, 3)
            check(x.shape == want.shape, f"resize {size} crop {crop}: shape {tuple(x.shape)} vs {tuple(want.shape)}")
            if x.shape != want.shape:
                continue
            std = torch.tensor([float(s) for s in STD]).view(3, 1, 1)
            levels = ((x - want).abs() * 255 * std).round()
            worst, off = levels.max().item(), (levels > 0).float().mean().item()
            print(f"resize {size} crop {crop}: max {worst:g} u8 level(s), {100 * off:.2f}% of values off")
            check(worst <= 1 and off <= 0.01, f"resize {size} crop {crop}: max {worst:g} levels, {100 * off:.2f}% off")
    finally:
        for f in os.listdir(tmp):
            os.remove(os.path.join(tmp, f))
        os.rmdir(tmp)
    if failures:
        print(f"test_image_transforms_match_torchvision: {failures} check(s) failed")
        return 1
    print("test_image_transforms_match_torchvision: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
