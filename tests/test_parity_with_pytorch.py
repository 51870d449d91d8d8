"""Claim: plexus trains like PyTorch.  An MLP and a CNN (conv-batchnorm-relu-
maxpool twice, then linear) start from the same weights (exchanged through
safetensors) and take the same batches for 20 steps under each optimizer (SGD,
SGD with momentum and weight decay, Nesterov SGD, Adam, AdamW, and a cosine
schedule with warm-up plus gradient clipping; the MLP also at batch 96,
where an AVX-512 CPU takes plexus's packed GEMM and fuses Linear and Tanh
into it); the loss of every step and
every final tensor (weights, biases, batchnorm running statistics) agree to
1e-5 relative.

If it fails, some piece of plexus computes something other than what PyTorch
computes: a layer's forward or backward (linear, conv2d, batchnorm in training
mode, maxpool, relu, gelu, tanh), a loss (MSE, cross-entropy with label
smoothing), an optimizer's update rule, the learning-rate schedule, gradient
clipping, or the safetensors exchange of names, shapes and bytes.  The message
names the configuration, the tensor, the worst element and the values of
plexus, torch float32 and torch float64; the first step's gradients are
compared too, which points at the layer whose backward differs.

How "relative" is measured.  For the per-step scalars (losses, gradient
norms): |a - b| / max(|a|, |b|) (all are >= 0.001 here).  For a tensor: the
maximum over its elements of |a_i - b_i| / max(|a_i|, |b_i|, rms(b)), rms(b)
the root mean square of PyTorch's tensor.  The floor is the tensor's own
scale rather than an absolute number because float32 rounding in training is
absolute at the scale of the tensor: an element that passes near zero (a
weight crossing zero, a running mean near 0) carries the rounding error of
the updates that moved it, which are sized like the tensor, not like the
element.  With an absolute floor of 1e-3 instead, even PyTorch float32 misses
its own float64 run by up to 1e-4 on the CNN; the table prints that stricter
number too (column abs1e-3).

The float64 referee.  Every configuration is also trained by torch in float64
from the same start, and NOISE_RUNS more times in float32 with the rows of
each batch permuted (the same mathematics in other summation orders: samples
of float32 noise).  Two float32 implementations can legitimately differ by
more than 1e-5 where float32 cannot resolve a value: Adam divides each
gradient by its own running magnitude, so a weight whose gradient is a
near-cancelling sum moves by lr x (its relative rounding error) -- the
quick-start MLP under Adam has such weights, and there even PyTorch's float32
runs differ from its float64 run by 1e-4..1e-3.  So a configuration passes
when every quantity is within TOL of torch float32 ("ok"), or else
("referee": plexus resolves the values about as well as PyTorch does) when
plexus's worst distance from float64 over all quantities is at most max(TOL,
REFEREE_FACTOR x the same for the float32 torch run closest to float64), or
when its worst distance from torch float32 is at most REFEREE_FACTOR x that
of the closest permuted float32 torch run (this covers a plain torch run that
took another branch than float64, see below, with plexus alongside).  Over 25
seeds of the Adam MLP runs the first ratio had median 0.87 and maximum 10.2;
REFEREE_FACTOR is 20.  Bugs planted to check the test each made it fail, in
every configuration they touch but the flip-prone CNN ones now and then, by
27x and more over that yardstick: Adam's eps inside the square root, a biased
batchnorm running variance, eps outside batchnorm's square root, decoupled
weight decay in momentum SGD, label smoothing spread over C - 1 classes in
the gradient.
(The permuted runs stay much closer to each other than to float64 in the
Adam MLP: the differences come from elementwise kernels -- tanh, the Adam
update -- which a permutation does not change; hence float64 as yardstick.)

Branch points.  ReLU and max-pool take decisions; where the exact (float64)
run takes one on a margin below KINK_MARGIN of the activations' scale (a pre-
ReLU value that is a max-pool window's maximum lying within 1e-5 x rms of 0, a
window's top two within that of each other), a float32 run may go either way
and one gradient element lands elsewhere.  When a configuration fails and
such a branch point lies at the step where the gradient norms part (or one
before), the comparison is repeated for the steps before it, where the claim
must hold in full, and the 20-step results must still agree to SANITY
("branch@k").  A flipped decision moves a whole gradient element at once, so
the rule also asks that the gradient norms part abruptly (JUMP x the step
before), not by a drift that grows step by step as a wrong formula's would.

The CNN's convolutions have no bias: each feeds a batchnorm, which subtracts
the per-channel batch mean, so a bias there has an exactly zero gradient and
under Adam its value (and the running mean it feeds) is rounding noise driven
by +-lr per step: nothing to compare.  SGD with momentum runs at lr 0.01
(plain SGD at 0.05): at 0.05 with momentum 0.9 the quick-start MLP diverges,
in float64 too, and a diverging run compares nothing.

A second test hands the runner an initial-weights file with one tensor of the
wrong shape and checks that it refuses with a message naming the tensor, both
shapes and the file, and writes nothing.

Knobs: PX_PARITY_ONLY=<substring> runs the matching configurations,
PX_PARITY_SEED=<n> moves the seeds, PX_PARITY_STRICT=1 turns the referee and
the branch rule off (the bare 1e-5 claim).
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pxst  # noqa: E402  (the sibling safetensors reader/writer)

STEPS = 20
TOL = 1e-5
STRICT = os.environ.get("PX_PARITY_STRICT", "0") == "1"
REFEREE_FACTOR = 20.0
NOISE_RUNS = 4    # float32 torch runs on permuted batches, besides the plain one
KINK_MARGIN = 1e-5
JUMP = 10.0       # a flipped decision makes the gradient norms part at once
SANITY = 0.1
ABS_FLOOR = 1e-3  # only for the printed comparison column
THREADS = 1       # torch and plexus alike
SEED = int(os.environ.get("PX_PARITY_SEED", "1234"))  # the first config's; the others count up

BUILD_DIR = os.environ.get("PX_BUILD_DIR")
RUNNER = os.path.join(BUILD_DIR, "tests", "parity_runner") if BUILD_DIR else os.path.abspath("parity_runner")


# ---- Models: nn.Sequential, so state_dict names are "0.weight", "1.running_mean"

def build_torch(model):
    if model == "mlp":  # the quick start: y = x^2 with tanh
        return nn.Sequential(nn.Linear(1, 256), nn.Tanh(), nn.Linear(256, 512), nn.Tanh(),
                             nn.Linear(512, 256), nn.Tanh(), nn.Linear(256, 1))
    if model == "mlp_cls":
        return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(),
                             nn.Linear(64, 5))
    if model == "cnn":
        return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(16 * 7 * 7, 10))
    raise ValueError(model)


def init_state(model, seed):
    """PyTorch's initialisation from `seed`, with the batchnorm affine
    parameters and running statistics moved off their defaults (1, 0, 0, 1)
    so that a runner which ignored them would be caught."""
    torch.manual_seed(seed)
    m = build_torch(model)
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                c = mod.num_features
                mod.weight.copy_(1 + 0.1 * torch.randn(c, generator=g))
                mod.bias.copy_(0.1 * torch.randn(c, generator=g))
                mod.running_mean.copy_(0.1 * torch.randn(c, generator=g))
                mod.running_var.copy_(1 + 0.2 * torch.rand(c, generator=g))
    return {k: v.detach().numpy().copy() for k, v in m.state_dict().items()
            if not k.endswith("num_batches_tracked")}


def make_batches(model, seed, batch=16):
    rng = np.random.default_rng(seed)
    data = {}
    if model == "mlp":  # regression of y = x^2 on [-1, 1], batch 16 (or `batch`)
        for s in range(STEPS):
            x = rng.uniform(-1, 1, size=(batch, 1)).astype(np.float32)
            data[f"x_{s}"], data[f"y_{s}"] = x, (x * x).astype(np.float32)
    elif model == "mlp_cls":  # 5 classes of a fixed random projection, batch 16
        proj = rng.standard_normal((20, 5))
        for s in range(STEPS):
            x = rng.standard_normal((16, 20)).astype(np.float32)
            data[f"x_{s}"], data[f"y_{s}"] = x, np.argmax(x @ proj, axis=1).astype(np.int32)
    else:  # 28x28 images whose class sets the brightness of one stripe, batch 8
        for s in range(STEPS):
            y = rng.integers(0, 10, size=8).astype(np.int32)
            x = rng.standard_normal((8, 1, 28, 28)).astype(np.float32) * 0.5
            for i, c in enumerate(y):
                x[i, 0, 2 * c + 4: 2 * c + 6, :] += 2.0
            data[f"x_{s}"], data[f"y_{s}"] = x, y
    return data


# ---- Configurations: one per (model, optimizer); hyper-parameters are passed
# verbatim to torch.optim and to the runner.

SGD = dict(optim="sgd", lr=0.05)
SGD_MOM = dict(optim="sgd", lr=0.01, momentum=0.9, weight_decay=1e-4)
NESTEROV = dict(optim="sgd", lr=0.01, momentum=0.9, dampening=0.0, nesterov=True)
ADAM = dict(optim="adam", lr=1e-3)
ADAMW = dict(optim="adamw", lr=1e-3, weight_decay=0.01)
OPTIMS = [("sgd", SGD), ("sgd_mom_wd", SGD_MOM), ("nesterov", NESTEROV), ("adam", ADAM), ("adamw", ADAMW)]

CONFIGS = []
for _model in ("mlp", "mlp_cls", "cnn"):
    for _oname, _o in OPTIMS:
        CONFIGS.append(dict(name=f"{_model}/{_oname}", model=_model, **_o))
CONFIGS += [
    dict(name="mlp_cls/adam+ls0.1", model="mlp_cls", label_smoothing=0.1, **ADAM),
    # warm-up 5 steps, cosine down to min_lr at step 20, global-norm clipping
    dict(name="mlp/adam+cos+clip", model="mlp", schedule="cosine", warmup=5, min_lr=1e-4, clip=1.0,
         optim="adam", lr=3e-3),
    # batch 96: more rows than the few-row kernels take, so on an AVX-512 CPU
    # the packed GEMM runs, with the Linear-Tanh fusion in both directions
    dict(name="mlp_b96/adam", model="mlp", batch=96, **ADAM),
    dict(name="cnn/sgd_mom+cos+clip", model="cnn", schedule="cosine", warmup=5, min_lr=0.0, clip=1.0,
         optim="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4),
]


def lr_at(cfg, step):
    """px_lr_at as documented in optim.h, in float64: linear warm-up from
    base/warmup to base over the first `warmup` steps, then cosine from base
    down to min_lr at step `total` (= STEPS), then min_lr."""
    base = cfg["lr"]
    if cfg.get("schedule") != "cosine":
        return base
    warmup, total, lo = cfg.get("warmup", 0), STEPS, cfg.get("min_lr", 0.0)
    if step < warmup:
        return base * (step + 1) / warmup
    if step >= total:
        return lo
    t = (step - warmup) / (total - warmup)
    return lo + 0.5 * (base - lo) * (1 + math.cos(math.pi * t))


def make_optimizer(cfg, params):
    if cfg["optim"] == "sgd":
        return torch.optim.SGD(params, lr=cfg["lr"], momentum=cfg.get("momentum", 0.0),
                               dampening=cfg.get("dampening", 0.0), weight_decay=cfg.get("weight_decay", 0.0),
                               nesterov=cfg.get("nesterov", False))
    if cfg["optim"] == "adam":
        return torch.optim.Adam(params, lr=cfg["lr"], weight_decay=cfg.get("weight_decay", 0.0))
    return torch.optim.AdamW(params, lr=cfg["lr"], weight_decay=cfg.get("weight_decay", 0.01))


def watch_branches(m, margins):
    """Record, per forward, the smallest margin of a ReLU/max-pool decision
    that reaches the gradient, relative to the rms of the activations."""
    def relu_only(mod, inp, out):
        x = inp[0].detach()
        margins.append(float(x.abs().min() / x.pow(2).mean().sqrt()))

    def relu_then_pool(mod, inp, out):
        # maxpool(relu(x)) = relu(maxpool(x)): per 2x2 window of x, the
        # chosen maximum's sign decides whether the gradient passes, and the
        # gap to the runner-up decides where it goes.
        x = inp[0].detach()
        n, c, h, w = x.shape
        win = x.reshape(n, c, h // 2, 2, w // 2, 2).permute(0, 1, 2, 4, 3, 5).reshape(n, c, h // 2, w // 2, 4)
        top = torch.sort(win, dim=-1, descending=True).values
        rms = x.pow(2).mean().sqrt()
        sign = top[..., 0].abs().min()
        gaps = (top[..., 0] - top[..., 1])[top[..., 0] > 0]
        gap = gaps.min() if gaps.numel() else sign.new_tensor(float("inf"))
        margins.append(float(torch.minimum(sign, gap) / rms))

    for i, mod in enumerate(m):
        if isinstance(mod, nn.ReLU):
            pooled = i + 1 < len(m) and isinstance(m[i + 1], nn.MaxPool2d)
            mod.register_forward_hook(relu_then_pool if pooled else relu_only)


def train_torch(cfg, init, data, dtype, steps=STEPS, perm=None):
    """The reference: `steps` steps of PyTorch training in `dtype`, the rows of
    every batch in the order `perm` (None: as stored).  Returns the final
    state, losses, lrs, gradient norms (before clipping), the first step's
    gradients ("grad0.<name>") and the smallest branch margin of each step."""
    m = build_torch(cfg["model"]).to(dtype)
    sd = {k: torch.from_numpy(v).to(dtype) for k, v in init.items()}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), (missing, unexpected)
    m.train()
    step_margins = []
    watch_branches(m, step_margins)
    opt = make_optimizer(cfg, m.parameters())
    if cfg["model"] == "mlp":
        loss_fn = nn.MSELoss()
    else:
        loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg.get("label_smoothing", 0.0))
    losses, lrs, norms, margins, grad0 = [], [], [], [], {}
    for s in range(steps):
        x = torch.from_numpy(data[f"x_{s}"]).to(dtype)
        y = torch.from_numpy(data[f"y_{s}"])
        y = y.to(dtype) if cfg["model"] == "mlp" else y.long()
        if perm is not None:
            x, y = x[perm], y[perm]
        opt.zero_grad()
        step_margins.clear()
        loss = loss_fn(m(x), y)
        loss.backward()
        margins.append(min(step_margins, default=math.inf))
        if s == 0:
            for name, p in m.named_parameters():
                grad0[f"grad0.{name}"] = p.grad.detach().double().numpy().copy()
        if cfg.get("clip"):
            norm = float(torch.nn.utils.clip_grad_norm_(m.parameters(), cfg["clip"]))
        else:
            norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in m.parameters()))
        lr = lr_at(cfg, s)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        losses.append(loss.item())
        lrs.append(lr)
        norms.append(norm)
    state = {k: v.detach().double().numpy().copy() for k, v in m.state_dict().items()
             if not k.endswith("num_batches_tracked")}
    state["losses"] = np.array(losses)
    state["lrs"] = np.array(lrs)
    state["grad_norms"] = np.array(norms)
    state.update(grad0)
    return state, margins


def runner_args(cfg, init_path, data_path, out_path, steps=STEPS):
    args = [RUNNER, "--model", cfg["model"], "--optim", cfg["optim"], "--init", init_path,
            "--data", data_path, "--steps", str(steps), "--out", out_path, "--lr", repr(cfg["lr"])]
    for key, flag in (("momentum", "--momentum"), ("dampening", "--dampening"),
                      ("weight_decay", "--weight-decay"), ("label_smoothing", "--label-smoothing"),
                      ("clip", "--clip"), ("warmup", "--warmup"), ("min_lr", "--min-lr")):
        if key in cfg:
            args += [flag, repr(cfg[key])]
    if cfg.get("nesterov"):
        args.append("--nesterov")
    if cfg.get("schedule"):  # the schedule's horizon stays STEPS when a run is cut short
        args += ["--schedule", cfg["schedule"], "--total", str(STEPS)]
    return args


def runner_env():
    env = dict(os.environ)
    env.update(PX_NUM_THREADS=str(THREADS), OMP_NUM_THREADS=str(THREADS), OPENBLAS_NUM_THREADS=str(THREADS))
    return env


def worst_rel(a, b, floor):
    """(max_i |a_i - b_i| / max(|a_i|, |b_i|, floor), argmax as an index
    tuple).  A NaN or infinity on one side only is an infinite difference."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.size == 0:
        return 0.0, ()
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        r = np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)), floor)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    r = np.where(same, 0.0, np.where(np.isfinite(r), r, np.inf))
    i = int(np.argmax(r))
    return float(r.flat[i]), np.unravel_index(i, r.shape)


def scale_floor(name, ref):
    """No floor for the per-step scalars; the tensor's rms for tensors."""
    if name in ("losses", "grad_norms"):
        return 0.0
    v = np.asarray(ref[name], dtype=np.float64)
    return max(float(np.sqrt(np.mean(v * v))), 1e-30)


def judge(name, px, t32, t64, noise):
    """One named quantity: plexus vs torch float32; plexus and each float32
    torch run (t32 and the permuted runs in `noise`) vs float64; each
    permuted run vs t32."""
    fl = scale_floor(name, t32)
    r, idx = worst_rel(px[name], t32[name], fl)
    return dict(name=name, r=r, idx=idx, floor=fl, px64=worst_rel(px[name], t64[name], fl)[0],
                t64s=[worst_rel(t[name], t64[name], fl)[0] for t in [t32] + noise],
                spread=[worst_rel(t[name], t32[name], fl)[0] for t in noise],
                px=px[name][idx], t32=t32[name][idx], f64=t64[name][idx])


def run_plexus(cfg, paths, steps):
    """Returns (results dict or None, error message, seconds)."""
    init_path, data_path, out_path = paths
    t0 = time.time()
    proc = subprocess.run(runner_args(cfg, init_path, data_path, out_path, steps), env=runner_env(),
                          capture_output=True, text=True)
    seconds = time.time() - t0
    if proc.returncode != 0:
        return None, f"parity_runner exited {proc.returncode}:\n    {proc.stderr.strip()}", seconds
    return {k: v.astype(np.float64) for k, v in pxst.load(out_path).items()}, "", seconds


def compare(cfg, init, data, paths, steps):
    """Train `steps` steps both ways and judge.  Returns a dict (results per
    quantity, the verdict, the distances from float64, the branch margins) or
    an error string.  Verdict: "ok" when every quantity is within TOL of torch
    float32; "referee" when not, but plexus's worst distance from float64 over
    all quantities is at most max(TOL, REFEREE_FACTOR x that of the float32
    torch run closest to float64), or its worst distance from torch float32
    at most REFEREE_FACTOR x that of the closest permuted float32 torch run;
    else "FAIL"."""
    px, err, t_px = run_plexus(cfg, paths, steps)
    if px is None:
        return err
    t0 = time.time()
    t32, _ = train_torch(cfg, init, data, torch.float32, steps)
    t_torch = time.time() - t0
    t64, margins = train_torch(cfg, init, data, torch.float64, steps)
    batch = data["x_0"].shape[0]
    rng = np.random.default_rng(0)
    perms = [np.arange(batch)[::-1].copy()] + [rng.permutation(batch) for _ in range(NOISE_RUNS - 1)]
    noise = [train_torch(cfg, init, data, torch.float32, steps, perm)[0] for perm in perms]
    if set(px) != set(t32):
        return (f"the runner wrote {sorted(set(px) - set(t32))} that torch lacks and lacks "
                f"{sorted(set(t32) - set(px))}")
    # The first step's gradients come first: where they differ, that layer's
    # backward (or the loss gradient) is the place to look.
    names = [k for k in t32 if k.startswith("grad0.")] + ["losses", "grad_norms"] + list(init)
    results = [judge(n, px, t32, t64, noise) for n in names]
    # Each run's worst distance over all quantities.  The float32 noise level
    # is that of the float32 torch run closest to float64 (the closest, so
    # runs that took another branch at a ReLU/max-pool tie do not set it).
    px64 = max(j["px64"] for j in results)
    t64_best = min(max(j["t64s"][i] for j in results) for i in range(1 + NOISE_RUNS))
    pxt = max(j["r"] for j in results)
    spread = min(max(j["spread"][i] for j in results) for i in range(NOISE_RUNS))
    for j in results:
        j["t64"] = min(j["t64s"])
    if pxt <= TOL:
        verdict = "ok"
    elif not STRICT and (px64 <= max(TOL, REFEREE_FACTOR * t64_best) or pxt <= REFEREE_FACTOR * spread):
        verdict = "referee"
    else:
        verdict = "FAIL"
    return dict(px=px, t32=t32, results=results, verdict=verdict, px64=px64, t64=t64_best, spread=spread,
                margins=margins, t_px=t_px, t_torch=t_torch, lr=worst_rel(px["lrs"], t32["lrs"], 0.0))


def describe(cfg, j, c, extra=""):
    return (f"{cfg['name']}: {j['name']}{list(j['idx'])}: plexus {j['px']:.9g}, torch {j['t32']:.9g}, "
            f"torch float64 {j['f64']:.9g}: rel {j['r']:.3g} > {TOL:g} (floor {j['floor']:.3g}); from float64 "
            f"over {j['name']}: plexus {j['px64']:.3g}, float32 torch (closest) {j['t64']:.3g}; over all: "
            f"plexus {c['px64']:.3g}, float32 torch {c['t64']:.3g}; plexus-torch {max(x['r'] for x in c['results']):.3g}, "
            f"closest permuted torch run-torch {c['spread']:.3g}{extra}")


def run_config(cfg, tmp, seed):
    """Train one configuration both ways.  Returns (failures, summary row)."""
    init = init_state(cfg["model"], seed)
    data = make_batches(cfg["model"], seed, cfg.get("batch", 16))
    tag = cfg["name"].replace("/", "_").replace("+", "_")
    paths = [os.path.join(tmp, f"{tag}_{what}.st") for what in ("init", "data", "out")]
    pxst.save(paths[0], init)
    pxst.save(paths[1], data)
    c = compare(cfg, init, data, paths, STEPS)
    if isinstance(c, str):
        return [f"{cfg['name']}: {c}"], None
    px, t32, results = c["px"], c["t32"], c["results"]

    failures = []
    # The schedule first: if the lrs differ, every later number differs too.
    r, idx = c["lr"]
    if r > 1e-6:  # the runner's lr is a float32, the expected one a float64
        failures.append(f"{cfg['name']}: px_lr_at differs from the schedule documented in optim.h at step "
                        f"{idx[0]}: plexus {px['lrs'][idx]:.9g}, expected {t32['lrs'][idx]:.9g} (rel {r:.3g})\n"
                        f"    plexus lrs: {np.array2string(px['lrs'], precision=6)}\n"
                        f"    expected:   {np.array2string(t32['lrs'], precision=6)}")

    verdict, note = c["verdict"], ""
    # Where the gradient norms first part (abruptly), and a branch point of
    # the float64 run there or one step before (a decision flipped in step k's backward
    # shows in its gradient norm; one in its forward, by step k + 1).  Step 0
    # starts from equal weights, so nothing has drifted to flip it.
    parted = next((s for s in range(STEPS)
                   if worst_rel(px["grad_norms"][s], t32["grad_norms"][s], 0.0)[0] > TOL), None)
    gn = [worst_rel(px["grad_norms"][s], t32["grad_norms"][s], 0.0)[0] for s in range(STEPS)]
    jump = parted is not None and parted >= 1 and gn[parted] >= JUMP * max(gn[parted - 1], TOL / JUMP)
    branches = [s for s in ((parted - 1, parted) if jump else ())
                if s >= 1 and c["margins"][s] < KINK_MARGIN]
    if verdict == "FAIL" and not STRICT and branches:
        k = branches[-1]
        early = compare(cfg, init, data, paths, k)
        worst_final = max(j["r"] for j in results if j["name"] in init)
        if isinstance(early, str):
            failures.append(f"{cfg['name']} (first {k} steps): {early}")
        elif early["verdict"] != "FAIL" and worst_final <= SANITY:
            verdict = f"branch@{k}"
            note = (f"  branch: {cfg['name']}: at step {k} the float64 run takes a ReLU/max-pool decision on a "
                    f"margin of {c['margins'][k]:.2g} x rms (< {KINK_MARGIN:g}); the gradient norms part at step "
                    f"{parted}; the first {k} steps agree ({early['verdict']}: worst rel "
                    f"{max(j['r'] for j in early['results']):.2g}); after {STEPS} steps the worst tensor differs by "
                    f"{worst_final:.2g} (<= {SANITY:g})")
        else:
            failures += [describe(cfg, j, early, f" (the first {k} steps, before the branch point at step {k})")
                         for j in early["results"] if j["r"] > TOL]
            if worst_final > SANITY:
                failures.append(f"{cfg['name']}: after the branch point at step {k} the final tensors differ by "
                                f"{worst_final:.3g} (> {SANITY:g})")
    if verdict == "FAIL":
        failures += [describe(cfg, j, c, f"; gradient norms part at step {'never' if parted is None else parted}")
                     for j in results if j["r"] > TOL]

    by_name = {j["name"]: j for j in results}
    tensors = [by_name[n] for n in init]
    worst_t = max(tensors, key=lambda j: j["r"])
    row = dict(name=cfg["name"], g0=max(j["r"] for j in results if j["name"].startswith("grad0.")),
               loss=by_name["losses"]["r"], norm=by_name["grad_norms"]["r"], t=worst_t["r"],
               tname=worst_t["name"], abs_floor=max(worst_rel(px[n], t32[n], ABS_FLOOR)[0] for n in init),
               px64=c["px64"], t64=c["t64"], spread=c["spread"], verdict=verdict, note=note,
               beyond=[j for j in results if j["r"] > TOL],
               loss0=float(px["losses"][0]), loss_last=float(px["losses"][-1]),
               clipped=sum(1 for n in t32["grad_norms"] if cfg.get("clip") and n > cfg["clip"]),
               t_px=c["t_px"], t_torch=c["t_torch"])
    return failures, row


def test_parity():
    failures, rows = [], []
    only = os.environ.get("PX_PARITY_ONLY")
    with tempfile.TemporaryDirectory(prefix="px_parity_") as tmp:
        for i, cfg in enumerate(CONFIGS):
            if only and only not in cfg["name"]:
                continue
            f, row = run_config(cfg, tmp, seed=SEED + i)
            failures += f
            if row:
                rows.append(row)
    print(f"parity with PyTorch {torch.__version__}: {STEPS} steps, {THREADS} thread(s), seeds from {SEED}, "
          f"tolerance {TOL:g}" + (" (strict)" if STRICT else f", referee factor {REFEREE_FACTOR:g}, "
                                  f"branch margin {KINK_MARGIN:g}"))
    print("rel per element = |a-b| / max(|a|,|b|, rms of the tensor), max over elements and steps.  Columns: plexus\n"
          "vs torch float32 for the first step's gradients, the losses, the gradient norms and the final tensors\n"
          "(worst named); the final tensors again with an absolute floor of 1e-3; the worst distance from torch\n"
          "float64 of plexus and of the closest float32 torch run; the closest permuted torch run's distance from\n"
          "torch; the verdict.")
    print(f"{'config':20} {'grads0':>7} {'losses':>7} {'gnorms':>7} {'tensors':>7} {'(worst)':14} {'abs1e-3':>7}"
          f" {'px-f64':>7} {'pt-f64':>7} {'spread':>7} {'verdict':>9} {'loss 0 -> 19':>16} {'clip':>4} {'px s':>5} {'pt s':>5}")
    for r in rows:
        print(f"{r['name']:20} {r['g0']:7.1e} {r['loss']:7.1e} {r['norm']:7.1e} {r['t']:7.1e} {r['tname']:14}"
              f" {r['abs_floor']:7.1e} {r['px64']:7.1e} {r['t64']:7.1e} {r['spread']:7.1e} {r['verdict']:>9}"
              f" {r['loss0']:7.4f}->{r['loss_last']:7.4f} {r['clipped']:4d} {r['t_px']:5.2f} {r['t_torch']:5.2f}")
    for r in rows:
        if r["note"]:
            print(r["note"])
        elif r["verdict"] == "referee":
            for j in sorted(r["beyond"], key=lambda j: -j["r"])[:3]:
                print(f"  referee: {r['name']} {j['name']}{list(j['idx'])}: plexus {j['px']:.8g}, torch "
                      f"{j['t32']:.8g}, float64 {j['f64']:.8g}; rel plexus-torch {j['r']:.2g}; from float64: "
                      f"plexus {j['px64']:.2g}, float32 torch (closest) {j['t64']:.2g}")
    return failures


def test_bad_init_is_refused():
    """A tensor of the wrong shape in the initial weights: the runner must
    stop before training, say which tensor and which file, and write nothing."""
    failures = []
    with tempfile.TemporaryDirectory(prefix="px_parity_bad_") as tmp:
        init = init_state("mlp_cls", 7)
        data = make_batches("mlp_cls", 7)
        init["2.weight"] = init["2.weight"][:, :63].copy()  # (64, 63) where the model has (64, 64)
        init_path = os.path.join(tmp, "wrong_shape_init.st")
        data_path = os.path.join(tmp, "data.st")
        out_path = os.path.join(tmp, "out.st")
        pxst.save(init_path, init)
        pxst.save(data_path, data)
        cfg = dict(name="bad", model="mlp_cls", **SGD)
        proc = subprocess.run(runner_args(cfg, init_path, data_path, out_path), env=runner_env(),
                              capture_output=True, text=True)
        msg = proc.stderr.strip()
        print(f"wrong shape refused: exit {proc.returncode}: {msg}")
        if proc.returncode == 0:
            failures.append("bad init: parity_runner accepted a (64, 63) \"2.weight\" for a (64, 64) layer")
        if '2.weight' not in msg or init_path not in msg:
            failures.append(f"bad init: the message should name the tensor \"2.weight\" and the file {init_path}; "
                            f"got: {msg!r}")
        if "(64, 63)" not in msg or "(64, 64)" not in msg:
            failures.append(f"bad init: the message should give both shapes (64, 63) and (64, 64); got: {msg!r}")
        if os.path.exists(out_path):
            failures.append("bad init: parity_runner wrote an output file despite failing")
    return failures


def main():
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    if not os.path.exists(RUNNER):
        print(f"test_parity_with_pytorch: runner not found at {RUNNER} (set PX_BUILD_DIR)", file=sys.stderr)
        return 1
    t0 = time.time()
    failures = test_parity() + test_bad_init_is_refused()
    print(f"test_parity_with_pytorch: {time.time() - t0:.1f} s")
    if failures:
        print(f"\ntest_parity_with_pytorch: {len(failures)} mismatch(es):", file=sys.stderr)
        for f in failures:
            print("  " + f, file=sys.stderr)
        return 1
    print("test_parity_with_pytorch: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
