"""Claim: `plexus train --stage DIR --data images` (and `--data imagenet`)
copies the listing, the synset mapping and every listed image once per node
-- two ranks as threads, and two processes under mpiexec -- keeping each
image's path below the root (sub-directories: two images named 0.png in
different folders, ImageNet's synset folders), and trains from the copy
with the same losses, step by step and for the held-out split, as from the
source.  Local rank 0 alone copies (one stage line per listing); an image
listed twice (once as ./imgs/...) is copied once.  A second run copies
nothing; a staged image truncated between runs is copied again (damaged 1)
with the losses unchanged, and one damaged in place at its size, which
`--stage-verify size` passes, is what training then reads (it fails naming
the staged file); an image dropped from the listing is removed
from the stage (the listing copied again).  A listing with an absolute
path or a ".." part is refused naming the CSV line.

If it failed, every rank would copy, images in different folders with the
same name would overwrite each other or be refused, later runs would copy
again, a damaged copy would be trained on, or the staged images would not
be the source's."""

import os
import random
import re
import shutil
import tempfile

from PIL import Image  # python3-pil (a dependency of python3-torchvision)

import cli_util as cu

CLASSES = 3


def write_image(path, rng, fmt):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    im = Image.frombytes("RGB", (16, 16), bytes(rng.randrange(256) for _ in range(16 * 16 * 3)))
    im.save(path, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))


def make_listings(src):
    """path,label: imgs/class_k/<i>.png (the same names in every class
    folder), one row repeated as ./imgs/...; a held-out listing of val/."""
    rng = random.Random(3)
    rows = ["path,label"]
    for i in range(8):
        for k in range(CLASSES):
            rel = "imgs/class_%d/%d.png" % (k, i)
            write_image(os.path.join(src, rel), rng, "PNG")
            rows.append("%s,%d" % (rel, k))
    rows.append("./imgs/class_0/0.png,0")
    with open(os.path.join(src, "train.csv"), "w") as f:
        f.write("\n".join(rows) + "\n")
    vrows = ["path,label"]
    for i in range(8):
        rel = "val/%d.png" % i
        write_image(os.path.join(src, rel), rng, "PNG")
        vrows.append("%s,%d" % (rel, i % CLASSES))
    with open(os.path.join(src, "val.csv"), "w") as f:
        f.write("\n".join(vrows) + "\n")
    return 1 + 8 * CLASSES, 1 + 8  # files in each set: the listing and its distinct images


SYNSETS = ["n01440764", "n01443537", "n01484850"]


def make_imagenet(d):
    """LOC_synset_mapping.txt, train/<synset>/<synset>_<i>.JPEG listed in
    LOC_train_solution.csv, val/ILSVRC2012_val_<i>.JPEG in LOC_val_solution.csv."""
    rng = random.Random(4)
    with open(os.path.join(d, "LOC_synset_mapping.txt"), "w") as f:
        f.write("".join("%s fish %d\n" % (s, k) for k, s in enumerate(SYNSETS)))
    rows = ["ImageId,PredictionString"]
    for i in range(4):
        for s in SYNSETS:
            iid = "%s_%d" % (s, i)
            write_image(os.path.join(d, "train", s, iid + ".JPEG"), rng, "JPEG")
            rows.append("%s,%s 1 1 14 14" % (iid, s))
    with open(os.path.join(d, "LOC_train_solution.csv"), "w") as f:
        f.write("\n".join(rows) + "\n")
    vrows = ["ImageId,PredictionString"]
    for i in range(1, 5):
        iid = "ILSVRC2012_val_%08d" % i
        write_image(os.path.join(d, "val", iid + ".JPEG"), rng, "JPEG")
        vrows.append("%s,%s 2 2 12 12 %s 3 3 9 9" % (iid, SYNSETS[i % 3], SYNSETS[0]))
    with open(os.path.join(d, "LOC_val_solution.csv"), "w") as f:
        f.write("\n".join(vrows) + "\n")
    return 2 + 4 * len(SYNSETS), 2 + 4  # the listing, the mapping, the images


def train(data_args, out, stage=None, mpi_ranks=0, expect_ok=True):
    args = ["train", "--model", "cnn", "--channels", "4", "--batch-size", "8", "--steps", "4", "--eval-every", "2",
            "--log-every", "1", "--seed", "5", "--workers", "2", "--progress", "lines", "--out", out] + data_args
    if stage:
        args += ["--stage", stage]
    if not mpi_ranks:
        args += ["--threads", "2"]
    p = cu.run(args, mpi_ranks=mpi_ranks, expect_ok=expect_ok)
    losses = []
    if p.returncode == 0:
        losses = [(r["type"], r["step"], r["loss"]) for r in cu.jsonl(os.path.join(out, "metrics.jsonl"))
                  if r.get("type") in ("step", "eval")]
    return p, losses


def stage_lines(p):
    """{listing: (rank, copied, files, reused, damaged, set directory)} from the stage lines."""
    out, n = {}, 0
    for line in (p.stdout + p.stderr).splitlines():
        m = re.search(r"stage: rank (\d+) \(local rank 0\): (\S+): copied (\d+) of (\d+) files.*reused (\d+), "
                      r"damaged (\d+) .*into (\S+)", line)
        if m:
            n += 1
            out[os.path.basename(m.group(2))] = tuple(int(g) for g in m.group(1, 3, 4, 5, 6)) + (m.group(7),)
    return out, n


def check_stage(p, label, want):
    """want: {listing base name: (copied, files, damaged)}; one line per listing, rank 0's."""
    got, n = stage_lines(p)
    cu.check(n == len(want), "%s: %d stage lines, expected %d (local rank 0's, one per listing):\n%s" %
             (label, n, len(want), p.stdout[-2000:]))
    for name, (copied, files, damaged) in want.items():
        g = got.get(name)
        exp = (0, copied, files, files - copied, damaged)
        cu.check(g and g[:5] == exp, "%s: %s: stage line says (rank, copied, files, reused, damaged) %s; expected %s" %
                 (label, name, g[:5] if g else None, exp))
    return {k: v[5] for k, v in got.items()}


def same_tree(src_root, set_dir, rels, label):
    for rel in rels:
        a = os.path.join(src_root, rel)
        b = os.path.join(set_dir, rel)
        ok = os.path.exists(b) and open(a, "rb").read() == open(b, "rb").read()
        if not cu.check(ok, "%s: the staged %s is missing or not the source's bytes" % (label, b)):
            return False
    return True


def main():
    tmp = tempfile.mkdtemp(prefix="px_stage_img_")
    shm = tempfile.mkdtemp(prefix="px_stage_img_", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        # 1. path,label listings with images in folders.
        src = os.path.join(tmp, "src")
        n_train, n_val = make_listings(src)
        data = ["--data", "images", "--data-path", os.path.join(src, "train.csv"), "--val-path",
                os.path.join(src, "val.csv")]
        p, ref = train(data, os.path.join(tmp, "ref"))
        cu.check(p.returncode == 0 and len([r for r in ref if r[0] == "step"]) == 4 and
                 any(r[0] == "eval" for r in ref), "images: the unstaged run failed or logged %s" % ref)
        stage = os.path.join(shm, "threads")
        p, l1 = train(data, os.path.join(tmp, "s1"), stage)
        sets = check_stage(p, "images, first run", {"train.csv": (n_train, n_train, 0), "val.csv": (n_val, n_val, 0)})
        cu.check(l1 == ref, "images: losses from the stage %s differ from the source's %s" % (l1, ref))
        tset = sets.get("train.csv", "")
        rels = ["train.csv"] + ["imgs/class_%d/%d.png" % (k, i) for k in range(CLASSES) for i in range(8)]
        if same_tree(src, tset, rels, "images"):
            print("images: the stage holds train.csv and %d images in %d folders, as the source" %
                  (len(rels) - 1, CLASSES))
        manifest = open(os.path.join(tset, "MANIFEST")).read() if tset else ""
        cu.check(" imgs/class_2/7.png\n" in manifest and manifest.count("\n") == 2 + n_train,
                 "images: the MANIFEST names each image by its path below the root:\n%s" % manifest)
        same_tree(src, sets.get("val.csv", ""), ["val.csv"] + ["val/%d.png" % i for i in range(8)], "images, val")

        p, l2 = train(data, os.path.join(tmp, "s2"), stage)
        check_stage(p, "images, second run", {"train.csv": (0, n_train, 0), "val.csv": (0, n_val, 0)})
        cu.check(l2 == ref, "images, reused stage: losses differ")

        victim = os.path.join(tset, "imgs", "class_1", "3.png")
        if os.path.exists(victim):
            os.truncate(victim, os.path.getsize(victim) // 2)
        p, l3 = train(data, os.path.join(tmp, "s3"), stage)
        check_stage(p, "images, truncated copy", {"train.csv": (1, n_train, 1), "val.csv": (0, n_val, 0)})
        cu.check(l3 == ref, "images, after re-copying a truncated image: losses differ")

        # Training reads the stage, not the source: a staged image damaged in
        # place at its size passes --stage-verify size, and training trips on it.
        victim = os.path.join(tset, "imgs", "class_0", "5.png")
        if os.path.exists(victim):
            b = bytearray(open(victim, "rb").read())
            b[len(b) // 2:len(b) // 2 + 16] = bytes(16)
            with open(victim, "wb") as f:
                f.write(b)
        p, _ = train(data + ["--stage-verify", "size"], os.path.join(tmp, "sv"), stage, expect_ok=False)
        cu.check(p.returncode != 0 and victim in p.stderr,
                 "a staged image damaged in place (size check): exit %d, the error does not name it: %s" %
                 (p.returncode, p.stderr[-600:]))

        if cu.mpiexec():
            p, mref = train(data, os.path.join(tmp, "mref"), mpi_ranks=2)
            cu.check(p.returncode == 0 and len(mref) >= 4, "mpiexec, unstaged: failed")
            mstage = os.path.join(shm, "mpi")
            p, m1 = train(data, os.path.join(tmp, "m1"), mstage, mpi_ranks=2)
            cu.check("2 ranks (mpi backend)" in p.stdout, "mpiexec: not 2 MPI ranks: %s" % p.stdout[:300])
            check_stage(p, "mpiexec -n 2, first run", {"train.csv": (n_train, n_train, 0),
                                                       "val.csv": (n_val, n_val, 0)})
            cu.check(m1 == mref, "mpiexec: losses from the stage %s differ from the source's %s" % (m1, mref))
            p, m2 = train(data, os.path.join(tmp, "m2"), mstage, mpi_ranks=2)
            check_stage(p, "mpiexec -n 2, second run", {"train.csv": (0, n_train, 0), "val.csv": (0, n_val, 0)})
            cu.check(m2 == mref, "mpiexec, reused stage: losses differ")
        else:
            print("plexus was built without MPI: the mpiexec part is not run")

        # An image dropped from the listing: the listing is copied again and
        # the image leaves the stage.
        lines = open(os.path.join(src, "train.csv")).read().splitlines()
        lines = [l for l in lines if not l.startswith("imgs/class_2/7.png,")]
        with open(os.path.join(src, "train.csv"), "w") as f:
            f.write("\n".join(lines) + "\n")
        p, _ = train(data, os.path.join(tmp, "s4"), stage)
        # (and the image damaged above is found by the full check and copied again)
        check_stage(p, "images, one image dropped", {"train.csv": (2, n_train - 1, 1), "val.csv": (0, n_val, 0)})
        cu.check(tset and not os.path.exists(os.path.join(tset, "imgs", "class_2", "7.png")),
                 "images: the image dropped from the listing is still in the stage")

        # 2. ImageNet's layout: synset folders, the mapping, a held-out
        # listing whose images lie in their own root.
        inet = os.path.join(tmp, "inet")
        os.makedirs(inet)
        n_itrain, n_ival = make_imagenet(inet)
        idata = ["--data", "imagenet", "--data-path", os.path.join(inet, "LOC_train_solution.csv"), "--image-root",
                 os.path.join(inet, "train"), "--synsets", os.path.join(inet, "LOC_synset_mapping.txt"),
                 "--val-path", os.path.join(inet, "LOC_val_solution.csv"), "--val-image-root",
                 os.path.join(inet, "val")]
        p, iref = train(idata, os.path.join(tmp, "iref"))
        cu.check(p.returncode == 0 and any(r[0] == "eval" for r in iref), "imagenet: the unstaged run failed")
        istage = os.path.join(shm, "imagenet")
        p, i1 = train(idata, os.path.join(tmp, "i1"), istage)
        isets = check_stage(p, "imagenet, first run", {"LOC_train_solution.csv": (n_itrain, n_itrain, 0),
                                                       "LOC_val_solution.csv": (n_ival, n_ival, 0)})
        cu.check(i1 == iref, "imagenet: losses from the stage %s differ from the source's %s" % (i1, iref))
        iset = isets.get("LOC_train_solution.csv", "")
        if same_tree(os.path.join(inet, "train"), iset,
                     ["%s/%s_%d.JPEG" % (s, s, i) for s in SYNSETS for i in range(4)], "imagenet"):
            print("imagenet: the stage holds %d images in %d synset folders, the listing and the mapping" %
                  (4 * len(SYNSETS), len(SYNSETS)))
        same_tree(inet, iset, ["LOC_train_solution.csv", "LOC_synset_mapping.txt"], "imagenet")
        p, i2 = train(idata, os.path.join(tmp, "i2"), istage)
        check_stage(p, "imagenet, second run", {"LOC_train_solution.csv": (0, n_itrain, 0),
                                                "LOC_val_solution.csv": (0, n_ival, 0)})
        cu.check(i2 == iref, "imagenet, reused stage: losses differ")

        # 3. Paths the stage cannot hold below its root.
        for bad, says in (("/abs/x.png", "is absolute"), ("imgs/../../x.png", 'has a ".." part')):
            csv = os.path.join(src, "bad.csv")
            with open(csv, "w") as f:
                f.write("path,label\nimgs/class_0/0.png,0\n%s,1\n" % bad)
            p, _ = train(["--data", "images", "--data-path", csv], os.path.join(tmp, "bad"), stage, expect_ok=False)
            cu.check(p.returncode != 0 and ("csv %s line 3: the image path %s %s" % (os.path.realpath(csv), bad, says))
                     in p.stderr, "listing with %s: exit %d, %s" % (bad, p.returncode, p.stderr[-600:]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    cu.finish("test_cli_stage_image_listing_copies_once_and_trains_like_the_source")


main()
