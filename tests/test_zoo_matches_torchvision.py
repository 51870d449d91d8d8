"""Claim: the image models of the zoo are torchvision's models.  A state_dict
saved from torchvision.models.resnet18(num_classes=10) (as safetensors, with
its num_batches_tracked counters) loads into px_zoo_resnet18 by name, and the
two then give the same logits in eval mode (running statistics) and in train
mode (batch statistics), the same loss and the same gradient of every
parameter on one batch, and the same losses and final tensors (weights and
running statistics) after a few steps of SGD with momentum and weight decay.
The same holds for px_zoo_resnet_small (ResNet-20 and a one-block variant:
torchvision's BasicBlock in the CIFAR-style ResNet written below), px_zoo_cnn
and px_zoo_mlp against the nn.Sequential models written below.  A second
test hands the runner torchvision's 1000-class resnet18 state_dict for a
10-class model and checks that it is refused with a message naming the
tensor, both shapes and the file, and that nothing is written.

If it fails, a zoo model differs from the PyTorch model whose weights users
will load into it: a layer in the wrong place or with the wrong stride or
padding, a shortcut missing or wrong, a parameter under another name (the
load fails and says which), a layer (padded max-pool, global pooling, the
residual's sum, batchnorm's batch statistics) computed differently, or a
backward that differs (the per-parameter gradients of the first step point
at the layer).

Branch decisions.  ReLU and max-pool decide: a ReLU whose input lies within
float32 rounding of 0, or a window whose two largest values do, may go either
way in two correct float32 programs, and where they part a gradient element
jumps by its whole size.  ResNet-18 at 224x224 takes millions of decisions
and some are that close (in these runs plexus and PyTorch each part from
float64 at a few).  So zoo_runner records every ReLU and max-pool decision
plexus takes in training (tests/tools/zoo_runner.c), and torch takes the same
ones (ForcedReLU: x * mask; ForcedMaxPool: a gather at plexus's argmax),
which compares the two programs on one branch; the dropout of the cnn is
handled the same way.  That plexus decides correctly is checked apart: on
plexus's branch, the float64 run must agree with every decision but those
within KINK_MARGIN = 1e-4 x rms of the activations of a tie (column "ties":
how many there were; a decision off by more fails the test).  Forward values
are continuous at a tie, so the logits and losses are compared as they are.

Tolerance.  Every quantity must agree with torch float32 to TOL = 1e-5
relative, measured as in test_parity_with_pytorch.py: per tensor, the largest
|a - b| / max(|a|, |b|, rms(torch's tensor)); for the losses |a - b| / max(|a|,
|b|).  Where float32 cannot resolve a quantity that finely, two correct
float32 programs differ by more: a ResNet's gradients pass back through up to
17 batchnorms in train mode, and torch float32 itself is 2e-5 to 1e-4 from
float64 on the deep layers' weight gradients.  So each model is also run by
torch in float64 (on the same branch), and a case beyond TOL passes
("referee") when plexus's worst distance from float64 over all quantities is
at most REFEREE_FACTOR times torch float32's, and plexus is within SANITY of
torch float32 everywhere.  The table shows, per case, the worst plexus-torch
distance of each kind of quantity and both distances from float64.

Bugs planted to check the test (each made it fail): the stem max-pool
without padding, the projection shortcut with stride 1, the shortcut's
gradient replaced by dy, global pooling divided by H·W + 1, the cnn's
dropout mask left out of backward.  (A fan_in/fan_out swap in the ResNets'
initialisation is test_zoo_models_names_shapes_and_init's to catch: here
the weights come from torch.)

Knobs: PX_ZOO_ONLY=<substring> runs the matching cases; PX_ZOO_STRICT=1 turns
the referee off.
"""

import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torchvision
from torchvision.models.resnet import BasicBlock, conv1x1

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pxst  # noqa: E402  (the sibling safetensors reader/writer)

TOL = 1e-5
REFEREE_FACTOR = 20.0
SANITY = 1e-3
STRICT = os.environ.get("PX_ZOO_STRICT", "0") == "1"
KINK_MARGIN = 1e-4  # a decision this close (x rms) to its tie may go either way in float32
THREADS = 1
SGD = dict(lr=0.01, momentum=0.9, weight_decay=1e-4)
CNN_DROPOUT = 0.25  # zoo_vision.c

BUILD_DIR = os.environ.get("PX_BUILD_DIR")
RUNNER = os.path.join(BUILD_DIR, "tests", "zoo_runner") if BUILD_DIR else os.path.abspath("zoo_runner")


# ---- The torch models ------------------------------------------------------

class MaskDropout(nn.Module):
    """Dropout with a mask given from outside (plexus's, recorded by the
    runner): x * mask, mask 0 or 1/(1 - p), which is what nn.Dropout computes
    with that mask.  Identity in eval mode."""

    def __init__(self):
        super().__init__()
        self.mask = None

    def forward(self, x):
        return x * self.mask.to(x.dtype) if self.training else x


class Decisions:
    """The branch decisions plexus took (zoo_runner's decision_<s>_<k>), handed
    out in call order to the forced ReLUs and max-pools of one step.  What
    each forced module saw is kept in `seen` for near_tie_flips."""

    def __init__(self, recorded):
        self.recorded = recorded
        self.queue, self.seen = [], []

    def start(self, step):
        self.queue, k = [], 0
        while f"decision_{step}_{k}" in self.recorded:
            self.queue.append(self.recorded[f"decision_{step}_{k}"])
            k += 1
        self.seen = []

    def finish(self, step):
        if self.queue:
            raise RuntimeError(f"step {step}: plexus recorded {len(self.queue)} more ReLU/max-pool decisions than "
                               f"torch's forward took: the models differ")

    def next(self, kind, out_shape):
        if not self.queue:
            raise RuntimeError(f"torch's forward takes more ReLU/max-pool decisions than plexus recorded (at a "
                               f"{kind}): the models differ")
        d = torch.from_numpy(self.queue.pop(0))
        if tuple(d.shape) != tuple(out_shape):
            raise RuntimeError(f"a recorded decision has shape {tuple(d.shape)} where torch's {kind} gives "
                               f"{tuple(out_shape)}: the models differ")
        return d


class ForcedReLU(nn.Module):
    """ReLU taking plexus's decision: y = x * mask (dx = dy * mask), which is
    relu(x) wherever the two agree.  Plain ReLU in eval mode."""

    def __init__(self, decisions):
        super().__init__()
        self.decisions = decisions

    def forward(self, x):
        if not self.training:
            return torch.relu(x)
        d = self.decisions.next("ReLU", x.shape)
        self.decisions.seen.append(("ReLU", x.detach(), d, None))
        return x * d.to(x.dtype)


class ForcedMaxPool(nn.Module):
    """nn.MaxPool2d(k, s, p) taking plexus's argmax (index h*W + w in each
    input plane): a gather, whose backward scatters dy to it as max-pool's
    does.  Plain max-pool in eval mode."""

    def __init__(self, decisions, pool):
        super().__init__()
        self.decisions = decisions
        self.window = (pool.kernel_size, pool.stride, pool.padding)

    def forward(self, x):
        k, s, p = self.window
        if not self.training:
            return nn.functional.max_pool2d(x, k, s, p)
        n, c, h, w = x.shape
        shape = (n, c, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1)
        d = self.decisions.next("MaxPool2d", shape)
        self.decisions.seen.append(("MaxPool2d", x.detach(), d, self.window))
        return x.flatten(2).gather(2, d.long().flatten(2)).view(shape)


def force_decisions(m, decisions):
    """Every nn.ReLU and nn.MaxPool2d of m replaced by its forced twin
    (torchvision's BasicBlock calls its one ReLU twice; so does the twin)."""
    for mod in list(m.modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, nn.ReLU):
                setattr(mod, child_name, ForcedReLU(decisions))
            elif isinstance(child, nn.MaxPool2d):
                setattr(mod, child_name, ForcedMaxPool(decisions, child))


def near_tie_flips(seen, margin):
    """Plexus's decisions against exact arithmetic: `seen` from the float64
    run on plexus's branch.  Returns (near, wrong): decisions that differ
    from float64's within margin x rms of the activations (a ReLU input
    within it of 0, a window whose chosen value is within it of the window's
    maximum), and decisions that differ beyond it."""
    near = wrong = 0
    for kind, x, d, window in seen:
        x = x.double()
        tol = margin * float(x.pow(2).mean().sqrt())
        if kind == "ReLU":
            differ = d.bool() != (x > 0)
            close = x.abs() <= tol
        else:
            k, s, p = window
            chosen = x.flatten(2).gather(2, d.long().flatten(2)).view(d.shape)
            gap = nn.functional.max_pool2d(x, k, s, p) - chosen
            differ, close = gap > 0, gap <= tol
        near += int((differ & close).sum())
        wrong += int((differ & ~close).sum())
    return near, wrong


class FlatMLP(nn.Sequential):
    """px_zoo_mlp: nn.Sequential(Linear, ReLU, ..., Linear) on x.flatten(1)."""

    def forward(self, x):
        return super().forward(x.flatten(1))


class SmallResNet(nn.Module):
    """px_zoo_resnet_small: He et al. 2016 section 4.2 with 1x1 projection
    shortcuts, from torchvision's BasicBlock, named as torchvision names."""

    def __init__(self, in_channels, classes, blocks, width):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.inplanes = width
        self.layer1 = self._make_layer(width, blocks, 1)
        self.layer2 = self._make_layer(2 * width, blocks, 2)
        self.layer3 = self._make_layer(4 * width, blocks, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * width, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, planes, blocks, stride):
        down = None
        if stride != 1 or self.inplanes != planes:
            down = nn.Sequential(conv1x1(self.inplanes, planes, stride), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, down)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_torch(model, args):
    if model == "resnet18":
        in_channels, classes = args
        m = torchvision.models.resnet18(num_classes=classes)
        if in_channels != 3:
            raise ValueError("the test builds torchvision's 3-channel resnet18")
        return m
    if model == "resnet_small":
        return SmallResNet(*args)
    if model == "cnn":
        c, h, w, ch, classes = args
        return nn.Sequential(
            nn.Conv2d(c, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(ch, 2 * ch, 3, padding=1, bias=False), nn.BatchNorm2d(2 * ch), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(2 * ch * (h // 4) * (w // 4), 128), nn.ReLU(), MaskDropout(),
            nn.Linear(128, classes))
    if model == "mlp":
        fin, hidden, depth, classes = args
        layers, width = [], fin
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        return FlatMLP(*layers, nn.Linear(width, classes))
    raise ValueError(model)


# ---- Cases: (model, builder arguments as zoo.h orders them, input shape, steps)

CASES = [
    dict(name="resnet18 224x224 b2", model="resnet18", args=[3, 10], shape=(2, 3, 224, 224), steps=3),
    # 50x66: odd after the stem (25x33), so the stem pool's windows are clipped at the bottom and right too
    dict(name="resnet18 50x66 b3", model="resnet18", args=[3, 10], shape=(3, 3, 50, 66), steps=3),
    dict(name="resnet20 32x32 b8", model="resnet_small", args=[3, 10, 3, 16], shape=(8, 3, 32, 32), steps=4),
    dict(name="resnet_small 28x28 b4", model="resnet_small", args=[1, 10, 1, 8], shape=(4, 1, 28, 28), steps=4),
    dict(name="cnn 28x28 b8", model="cnn", args=[1, 28, 28, 8, 10], shape=(8, 1, 28, 28), steps=5),
    dict(name="cnn 3x32x32 b4", model="cnn", args=[3, 32, 32, 4, 5], shape=(4, 3, 32, 32), steps=3),
    dict(name="mlp 784-64-64-10 b8", model="mlp", args=[784, 64, 2, 10], shape=(8, 1, 28, 28), steps=5),
    dict(name="mlp depth 0 b8", model="mlp", args=[12, 0, 0, 3], shape=(8, 3, 2, 2), steps=3),
]


def init_state(case, seed):
    """torch's initialisation from `seed` (torchvision's, for the ResNets),
    with the batchnorm affine parameters and running statistics moved off
    (1, 0, 0, 1) so that eval mode and the affine part are exercised.  The
    state_dict keeps num_batches_tracked, as a torchvision checkpoint has."""
    torch.manual_seed(seed)
    m = build_torch(case["model"], case["args"])
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                c = mod.num_features
                mod.weight.copy_(1 + 0.1 * torch.randn(c, generator=g))
                mod.bias.copy_(0.1 * torch.randn(c, generator=g))
                mod.running_mean.copy_(0.1 * torch.randn(c, generator=g))
                mod.running_var.copy_(1 + 0.2 * torch.rand(c, generator=g))
    return {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}


def make_batches(case, seed):
    rng = np.random.default_rng(seed)
    classes = case["args"][1] if case["model"].startswith("resnet") else case["args"][-1]
    data = {}
    for s in range(case["steps"]):
        data[f"x_{s}"] = rng.standard_normal(case["shape"]).astype(np.float32)
        data[f"y_{s}"] = rng.integers(0, classes, size=case["shape"][0]).astype(np.int32)
    return data


def run_torch(case, init, data, px, dtype):
    """What zoo_runner computes, in torch with `dtype`, on plexus's branch:
    its ReLU, max-pool and dropout decisions (from zoo_runner's output `px`).
    Returns the results and the (near, wrong) counts of near_tie_flips."""
    m = build_torch(case["model"], case["args"]).to(dtype)
    m.load_state_dict({k: torch.from_numpy(v).to(dtype) if v.dtype != np.int64 else torch.from_numpy(v)
                       for k, v in init.items()})
    decisions = Decisions(px)
    force_decisions(m, decisions)
    drop = next((d for d in m.modules() if isinstance(d, MaskDropout)), None)
    out = {}
    x0 = torch.from_numpy(data["x_0"]).to(dtype)
    m.eval()
    with torch.no_grad():
        out["eval_logits"] = m(x0).double().numpy().copy()
    m.train()
    opt = torch.optim.SGD(m.parameters(), **SGD)
    losses, near, wrong = [], 0, 0
    for s in range(case["steps"]):
        x = torch.from_numpy(data[f"x_{s}"]).to(dtype)
        y = torch.from_numpy(data[f"y_{s}"]).long()
        if drop is not None:
            mk = px[f"dropout_{s}"]
            # float32: plexus's multiplier as it is (what nn.Dropout computes
            # with that mask); float64: the exact 1/(1 - p) where it kept the value.
            drop.mask = torch.from_numpy(mk.astype(np.float32)) if dtype == torch.float32 else \
                torch.from_numpy((mk != 0) / (1.0 - CNN_DROPOUT))
        decisions.start(s)
        opt.zero_grad()
        logits = m(x)
        decisions.finish(s)
        n, w = near_tie_flips(decisions.seen, KINK_MARGIN)
        near, wrong = near + n, wrong + w
        loss = nn.functional.cross_entropy(logits, y)
        loss.backward()
        if s == 0:
            out["train_logits"] = logits.detach().double().numpy().copy()
            for name, p in m.named_parameters():
                out[f"grad0.{name}"] = p.grad.detach().double().numpy().copy()
        opt.step()
        losses.append(loss.item())
    out["losses"] = np.array(losses)
    for k, v in m.state_dict().items():
        if not k.endswith("num_batches_tracked"):
            out[k] = v.detach().double().numpy().copy()
    return out, (near, wrong)


def run_plexus(case, paths):
    init_path, data_path, out_path = paths
    args = [RUNNER, "--model", case["model"], "--args", ",".join(map(str, case["args"])), "--init", init_path,
            "--data", data_path, "--steps", str(case["steps"]), "--out", out_path, "--lr", repr(SGD["lr"]),
            "--momentum", repr(SGD["momentum"]), "--weight-decay", repr(SGD["weight_decay"])]
    env = dict(os.environ, PX_NUM_THREADS=str(THREADS), OMP_NUM_THREADS=str(THREADS),
               OPENBLAS_NUM_THREADS=str(THREADS))
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return None, f"zoo_runner exited {proc.returncode}: {proc.stderr.strip()}"
    return {k: v.astype(np.float64) for k, v in pxst.load(out_path).items()}, ""


def rel(a, b, floor):
    """max_i |a_i - b_i| / max(|a_i|, |b_i|, floor) and its index."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf, ()
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)), floor)
    r = np.where(a == b, 0.0, np.where(np.isfinite(r), r, np.inf))
    i = int(np.argmax(r))
    return float(r.flat[i]), np.unravel_index(i, r.shape)


def kind_of(name):
    if name.startswith("grad0."):
        return "grads0"
    if name in ("eval_logits", "train_logits", "losses"):
        return name
    return "tensors"


def compare_case(case, tmp, seed):
    init = init_state(case, seed)
    data = make_batches(case, seed)
    tag = case["name"].replace(" ", "_")
    paths = [os.path.join(tmp, f"{tag}_{w}.st") for w in ("init", "data", "out")]
    pxst.save(paths[0], init)
    pxst.save(paths[1], data)
    t0 = time.time()
    px, err = run_plexus(case, paths)
    t_px = time.time() - t0
    if px is None:
        return [f"{case['name']}: {err}"], None
    t0 = time.time()
    t32, _ = run_torch(case, init, data, px, torch.float32)
    t_pt = time.time() - t0
    t64, (near, wrong) = run_torch(case, init, data, px, torch.float64)
    names = [k for k in t32]
    missing = sorted(set(names) - set(px))
    if missing:
        return [f"{case['name']}: the runner did not write {missing}"], None
    rows = []
    for n in names:
        floor = 0.0 if n == "losses" else max(float(np.sqrt(np.mean(t32[n] ** 2))), 1e-30)
        r, idx = rel(px[n], t32[n], floor)
        rows.append(dict(name=n, kind=kind_of(n), r=r, idx=idx, px=px[n][idx], pt=t32[n][idx], f64=t64[n][idx],
                         px64=rel(px[n], t64[n], floor)[0], pt64=rel(t32[n], t64[n], floor)[0]))
    worst = max(rows, key=lambda j: j["r"])
    px64 = max(j["px64"] for j in rows)
    pt64 = max(j["pt64"] for j in rows)
    if worst["r"] <= TOL:
        verdict = "ok"
    elif not STRICT and px64 <= max(TOL, REFEREE_FACTOR * pt64) and worst["r"] <= SANITY:
        verdict = "referee"
    else:
        verdict = "FAIL"
    failures = []
    if wrong:
        failures.append(f"{case['name']}: {wrong} ReLU/max-pool decision(s) of plexus differ from exact arithmetic "
                        f"by more than {KINK_MARGIN:g} x rms of the activations (a wrong forward)")
    if verdict == "FAIL":
        for j in sorted(rows, key=lambda j: -j["r"])[:5]:
            if j["r"] > TOL:
                failures.append(f"{case['name']}: {j['name']}{list(j['idx'])}: plexus {j['px']:.9g}, torch "
                                f"{j['pt']:.9g}, float64 {j['f64']:.9g}: rel {j['r']:.3g} > {TOL:g}; from float64 "
                                f"over the model: plexus {px64:.3g}, torch float32 {pt64:.3g}")
    summary = dict(name=case["name"], verdict=verdict, px64=px64, pt64=pt64, t_px=t_px, t_pt=t_pt, near=near,
                   worst=worst, loss0=float(px["losses"][0]), loss1=float(px["losses"][-1]))
    for k in ("eval_logits", "train_logits", "losses", "grads0", "tensors"):
        summary[k] = max(j["r"] for j in rows if j["kind"] == k)
    return failures, summary


def test_cases():
    failures, rows = [], []
    only = os.environ.get("PX_ZOO_ONLY")
    with tempfile.TemporaryDirectory(prefix="px_zoo_") as tmp:
        for i, case in enumerate(CASES):
            if only and only not in case["name"]:
                continue
            f, row = compare_case(case, tmp, seed=100 + i)
            failures += f
            if row:
                rows.append(row)
    print(f"zoo vs torchvision {torchvision.__version__} (torch {torch.__version__}), {THREADS} thread(s), "
          f"tolerance {TOL:g}" + (" (strict)" if STRICT else f", referee factor {REFEREE_FACTOR:g}"))
    print(f"{'case':24} {'eval':>7} {'train':>7} {'losses':>7} {'grads0':>7} {'tensors':>7} {'px-f64':>7} "
          f"{'pt-f64':>7} {'verdict':>8} {'ties':>4} {'loss 0 -> last':>16} {'px s':>5} {'pt s':>5}")
    for r in rows:
        print(f"{r['name']:24} {r['eval_logits']:7.1e} {r['train_logits']:7.1e} {r['losses']:7.1e} "
              f"{r['grads0']:7.1e} {r['tensors']:7.1e} {r['px64']:7.1e} {r['pt64']:7.1e} {r['verdict']:>8} {r['near']:4d} "
              f"{r['loss0']:7.4f}->{r['loss1']:7.4f} {r['t_px']:5.2f} {r['t_pt']:5.2f}")
        if r["verdict"] == "referee":
            w = r["worst"]
            print(f"  referee: {w['name']}{list(w['idx'])}: plexus {w['px']:.8g}, torch {w['pt']:.8g}, float64 "
                  f"{w['f64']:.8g}; rel {w['r']:.2g}")
    return failures


def test_wrong_classes_refused():
    """torchvision's ImageNet resnet18 (1000 classes) into a 10-class zoo
    resnet18: refused, naming fc.weight, both shapes and the file; nothing
    written."""
    failures = []
    with tempfile.TemporaryDirectory(prefix="px_zoo_bad_") as tmp:
        torch.manual_seed(0)
        sd = {k: v.numpy() for k, v in torchvision.models.resnet18(num_classes=1000).state_dict().items()}
        case = dict(name="bad", model="resnet18", args=[3, 10], shape=(2, 3, 32, 32), steps=1)
        paths = [os.path.join(tmp, n) for n in ("resnet18_imagenet.st", "data.st", "out.st")]
        pxst.save(paths[0], sd)
        pxst.save(paths[1], make_batches(case, 0))
        px, msg = run_plexus(case, paths)
        print(f"1000-class weights into a 10-class resnet18: {msg}")
        if px is not None:
            failures.append("wrong classes: zoo_runner accepted a (1000, 512) fc.weight for a 10-class resnet18")
        for part in ('"fc.weight"', "(1000, 512)", "(10, 512)", paths[0]):
            if part not in msg:
                failures.append(f"wrong classes: the message should contain {part}; got: {msg!r}")
        if os.path.exists(paths[2]):
            failures.append("wrong classes: zoo_runner wrote an output file despite failing")
    return failures


def main():
    torch.set_num_threads(THREADS)
    if not os.path.exists(RUNNER):
        print(f"test_zoo_matches_torchvision: runner not found at {RUNNER} (set PX_BUILD_DIR)", file=sys.stderr)
        return 1
    t0 = time.time()
    failures = test_cases() + test_wrong_classes_refused()
    print(f"test_zoo_matches_torchvision: {time.time() - t0:.1f} s")
    if failures:
        print(f"\ntest_zoo_matches_torchvision: {len(failures)} mismatch(es):", file=sys.stderr)
        for f in failures:
            print("  " + f, file=sys.stderr)
        return 1
    print("test_zoo_matches_torchvision: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
