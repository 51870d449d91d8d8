"""The PyTorch side of bench/run_loader.sh: torch.utils.data.DataLoader on
the same files bench_loader reads, written the way users write it.

  bench_loader_torch.py fmnist DIR WORKERS EPOCHS
  bench_loader_torch.py jpeg CSV CROP WORKERS EPOCHS
  bench_loader_torch.py hdf5 FILE.h5 WORKERS EPOCHS    (h5py; also "hdf5z")

Fashion-MNIST: a Dataset over the decoded uint8 arrays whose __getitem__
applies ToTensor + Normalize((0.2860,), (0.3530,)) per sample, batch 256.
JPEGs: a Dataset over the "path,label" CSV whose __getitem__ reads the file
with torchvision.io.read_image (libjpeg-turbo, no PIL), then RandomCrop,
RandomHorizontalFlip, ConvertImageDtype(float) and ImageNet's Normalize,
batch 64.  Both shuffle; workers are persistent (PyTorch's fastest setting:
no process start per epoch) and the first epoch (worker start, page cache)
is timed apart, as in bench_loader.

Prints one line like bench_loader's:
  torch <case> workers=W samples=N warmup_s=S epoch_s=S samples_per_s=R
"""

import csv
import gzip
import os
import sys
import time

import numpy as np
import torch
import torchvision.io as tio
import torchvision.transforms as T


class FashionMNIST(torch.utils.data.Dataset):
    def __init__(self, root):
        with gzip.open(os.path.join(root, "train-images-idx3-ubyte.gz")) as f:
            self.images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28).copy()
        with gzip.open(os.path.join(root, "train-labels-idx1-ubyte.gz")) as f:
            self.labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
        self.transform = T.Compose([T.ToTensor(), T.Normalize((0.2860,), (0.3530,))])

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(self.images[i]), int(self.labels[i])


class Hdf5Images(torch.utils.data.Dataset):
    """The HDF5 copy of Fashion-MNIST that bench_loader make-h5 writes, read
    with h5py one sample per __getitem__, the file opened lazily in each
    worker process (h5py handles do not survive fork), then ToTensor +
    Normalize as FashionMNIST above."""

    def __init__(self, path):
        import h5py  # python3-h5py; only this case needs it

        self.h5py = h5py
        self.path = path
        with h5py.File(path, "r") as f:
            self.n = f["images"].shape[0]
        self.f = None
        self.transform = T.Compose([T.ToTensor(), T.Normalize((0.2860,), (0.3530,))])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.f is None:
            self.f = self.h5py.File(self.path, "r")
            self.images, self.labels = self.f["images"], self.f["labels"]
        return self.transform(self.images[i]), int(self.labels[i])


class JpegCsv(torch.utils.data.Dataset):
    def __init__(self, csv_path, crop):
        root = os.path.dirname(csv_path)
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        self.paths = [os.path.join(root, r["path"]) for r in rows]
        self.labels = [int(r["label"]) for r in rows]
        self.transform = T.Compose(
            [
                T.RandomCrop(crop),
                T.RandomHorizontalFlip(),
                T.ConvertImageDtype(torch.float),
                T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
            ]
        )

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        img = tio.read_image(self.paths[i], tio.ImageReadMode.RGB)
        return self.transform(img), self.labels[i]


def run(name, ds, batch, workers, epochs):
    loader = torch.utils.data.DataLoader(
        ds, batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=workers > 0
    )
    warm = timed = 0.0
    samples = 0
    check = 0.0
    for e in range(epochs + 1):
        t0 = time.perf_counter()
        for x, y in loader:
            check += float(x.view(-1)[0])
            if e > 0:
                samples += x.shape[0]
        dt = time.perf_counter() - t0
        if e == 0:
            warm = dt
        else:
            timed += dt
    print(
        f"torch {name} workers={workers} samples={samples} warmup_s={warm:.3f} "
        f"epoch_s={timed / epochs:.3f} samples_per_s={samples / timed:.1f}",
        flush=True,
    )


def main(argv):
    torch.manual_seed(42)
    if len(argv) == 5 and argv[1] == "fmnist":
        run("fmnist", FashionMNIST(argv[2]), 256, int(argv[3]), int(argv[4]))
    elif len(argv) == 5 and argv[1] in ("hdf5", "hdf5z"):
        run(argv[1], Hdf5Images(argv[2]), 256, int(argv[3]), int(argv[4]))
    elif len(argv) == 6 and argv[1] == "jpeg":
        run("jpeg", JpegCsv(argv[2], int(argv[3])), 64, int(argv[4]), int(argv[5]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
