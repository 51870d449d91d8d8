#!/usr/bin/python3
"""tta_gpt_torch.py — PyTorch's side of bench/run_tta_gpt.sh (time to a validation loss).

    tta_gpt_torch.py prepare --src DIR --work DIR [--train-tokens N] [--val-tokens N]
                             [--vocab-size V] [--val-every 10]
    tta_gpt_torch.py train --train 'W/train_*.bin' --val 'W/valid_*.bin' --vocab W/vocab.vocab
                           --target-loss L [--max-epochs 3] [--eval-every K] [--ranks 2] [--threads 1]
                           [--batch 16] [--context 128] [--n-layer 4] [--n-head 4] [--n-embd 256]
                           [--lr 6e-4] [--weight-decay 0.01] [--warmup-steps 75] [--seed 0]

`prepare` makes the corpus: the files DIR/**/*.rst.txt (Debian's
python3.11-doc: /usr/share/doc/python3.11/html/_sources, the reStructuredText
sources of Python's documentation) in bytewise sorted order of their paths
relative to DIR; file i (0-based) goes to validation when i % val_every ==
val_every - 1 (every 10th file), else to training.  Each line is cut into
words as WikiText cuts its text (runs of letters, digits and '_' are words,
every other non-space character is a word of its own), lines that are only a
reStructuredText title adornment ("=====", "-----", ...) are dropped, runs of
blank lines become one.  The vocabulary is capped as WikiText caps its own:
the vocab_size - 2 most frequent words of the whole training split (ties in
bytewise order) are kept, every other word is written <unk>.  WORK/vocab.txt
is the whole training split so written (what the vocabulary is built from:
with <eos> and <unk>, `plexus tokenize` makes it at most vocab_size
entries), WORK/train.txt its first train_tokens tokens (words + one <eos> a
line, as `plexus tokenize` counts them; whole lines), WORK/valid.txt the
validation files' first val_tokens tokens likewise.  Deterministic: same
inputs, same bytes.  run_tta_gpt.sh then runs `plexus tokenize` on
vocab.txt (for its vocabulary), and on train.txt and valid.txt with that
vocabulary; both sides read those shards.

`train` trains the README's GPT recipe ("A language model") in PyTorch DDP
over gloo (R processes on 127.0.0.1, T threads each; `plexus train --threads
2` is 2 ranks of 1 compute thread each on this machine) on plexus's token
shards, as `plexus train --model gpt --data tokens` does:

- the model: tests/gpt2_torch.py's GPT (plexus's zoo GPT: pre-LN blocks,
  causal attention, tanh GELU, head tied to wte, dropout 0), vocabulary size
  from the vocabulary file's header, GPT-2's initialisation rule
  (gpt2_torch.gpt2_init, as px_zoo_gpt's; the draws differ);
- the optimizer: AdamW over every parameter (plexus has no parameter
  groups), betas 0.9/0.999, eps 1e-8, decoupled weight decay 0.01 (plexus's
  default for --optim adamw when --weight-decay is not given, PyTorch's
  default), no gradient clipping (--clip-grad 0), lr 6e-4 with a linear
  warm-up then cosine to 0 over max_epochs epochs (src/optim/schedule.c);
- the data (docs/DATA.md, token shards): training windows of T+1 tokens at
  j·T + o, o drawn in [0, T) per sample and epoch (random_offset), a shard
  of n tokens holding floor((n - T)/T) of them; each epoch one shuffle of
  the window indices from (seed, epoch), identical on every rank, padded by
  wrapping to a multiple of R, rank r taking positions r, r+R, ... (the
  distributed sampler), batches of B per rank, the last partial; the
  shuffle is torch.randperm's, not plexus's Philox Fisher-Yates (same
  policy, different order);
- the loss: cross-entropy averaged over the batch's B·T tokens, gradients
  averaged over the ranks (DDP);
- evaluation (src/train/evaluate.c): every validation window j·T (floor((n -
  1)/T) a shard, no offset), rank r taking the contiguous share [r·n/R,
  (r+1)·n/R) in batches of B, the sums of loss × tokens and tokens
  all-reduced: the mean loss per token over the whole split; every K steps
  (--eval-every K, plexus's) or at each epoch's end (K = 0), and, as plexus,
  once more after the last step when that step had none.

What differs from plexus, by necessity: the random draws (weights, the
epoch's shuffle, the windows' offsets: torch's generator, not plexus's
Philox streams; same rules and policy, other numbers); the batches are cut
from the token tensor in the training process, where plexus's loader fills
them on a worker thread per rank (--workers 1, its default); the attention
is tests/gpt2_torch.py's (the (T, T) scores materialised, as nanoGPT for
PyTorch 1.13 writes it), plexus's keeps one log-sum-exp per row.

Training stops at the first evaluation with loss <= target.  The clock
starts when this script starts (before the processes spawn, the shards are
read and the model is built; the spawned processes take the parent's start,
not their own), as run_tta_gpt.sh's clock for plexus starts when plexus is
launched; the evaluations are inside the timed span.

Output, one line per evaluation and a final line:

    eval step 20 epoch 1 loss 6.1234 wall_s 21.43
    tta torch reached=1 loss=4.9876 steps=150 epochs=3 wall_s=120.1 target_loss=5.0
"""
import argparse
import collections
import math
import os
import re
import sys
import time

T0 = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))


def wall():
    return time.perf_counter() - T0


# ---- prepare ---------------------------------------------------------------

WORD = re.compile(r"\w+|[^\w\s]")
ADORNMENT = re.compile(r"^\s*([^\w\s])\1{2,}\s*$")


def corpus_files(src):
    files = []
    for d, _, names in os.walk(src):
        for n in names:
            if n.endswith(".rst.txt"):
                files.append(os.path.relpath(os.path.join(d, n), src))
    files.sort(key=lambda p: p.encode())
    return files


def file_lines(path):
    """The file's lines as lists of words: adornments dropped, runs of blank lines as one."""
    out = []
    with open(path, encoding="utf-8", errors="replace", newline=None) as f:
        text = f.read()
    for line in text.split("\n"):
        if ADORNMENT.match(line):
            continue
        words = WORD.findall(line)
        if not words and out and not out[-1]:
            continue
        out.append(words)
    while out and not out[-1]:
        out.pop()
    return out


def take(src, files, cap):
    """Lines of `files` in order until `cap` tokens (words + <eos>), whole lines."""
    lines, n = [], 0
    for rel in files:
        for words in file_lines(os.path.join(src, rel)):
            if n + len(words) + 1 > cap:
                return lines, n
            lines.append(words)
            n += len(words) + 1
    return lines, n


def prepare(a):
    if not os.path.isdir(a.src):
        raise SystemExit(f"tta_gpt_torch prepare: no corpus at {a.src} (Debian's python3.11-doc: "
                         "apt-get install python3.11-doc)")
    files = corpus_files(a.src)
    if not files:
        raise SystemExit(f"tta_gpt_torch prepare: no *.rst.txt under {a.src} (Debian's python3.11-doc)")
    val_files = [f for i, f in enumerate(files) if i % a.val_every == a.val_every - 1]
    train_files = [f for i, f in enumerate(files) if i % a.val_every != a.val_every - 1]
    full, n_full = take(a.src, train_files, float("inf"))
    train, n_train = full, n_full
    if a.train_tokens < n_full:
        train, n_train = take(a.src, train_files, a.train_tokens)
    valid, n_valid = take(a.src, val_files, a.val_tokens)
    counts = collections.Counter(w for words in full for w in words)
    counts.pop("<unk>", None)
    counts.pop("<eos>", None)
    keep = set(w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].encode()))[:a.vocab_size - 2])
    os.makedirs(a.work, exist_ok=True)
    stats = {}
    for name, lines in (("vocab", full), ("train", train), ("valid", valid)):
        unk = words_n = 0
        tmp = os.path.join(a.work, f".{name}.txt.tmp")
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            for words in lines:
                out = [w if w in keep else "<unk>" for w in words]
                unk += sum(1 for w in out if w == "<unk>")
                words_n += len(out)
                line = " ".join(out)
                assert line.split() == out  # plexus splits as str.split(): the words survive
                f.write(line + "\n")
        os.replace(tmp, os.path.join(a.work, f"{name}.txt"))
        stats[name] = (words_n, unk)
    print(f"prepare: {len(files)} files in {a.src}: {len(train_files)} train, {len(val_files)} validation "
          f"(every {a.val_every}th); vocab.txt (the training split) {n_full} tokens, {len(keep)} words kept of "
          f"{len(counts)} ({stats['vocab'][1] / max(1, stats['vocab'][0]):.2%} <unk>); train.txt {n_train} tokens "
          f"({stats['train'][1] / max(1, stats['train'][0]):.2%} <unk>), valid.txt {n_valid} tokens "
          f"({stats['valid'][1] / max(1, stats['valid'][0]):.2%} <unk>)", flush=True)
    return 0


# ---- shards ----------------------------------------------------------------

def read_shard(path):
    import numpy as np
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 1024:
        raise SystemExit(f"tta_gpt_torch: {path}: shorter than the 1024-byte header")
    hdr = np.frombuffer(data[:1024], dtype="<i4")
    magic, version, n = int(hdr[0]), int(hdr[1]), int(hdr[2])
    if magic == 20240520 and version == 1:
        dt = "<u2"
    elif magic == 20240801 and version == 7:
        dt = "<u4"
    else:
        raise SystemExit(f"tta_gpt_torch: {path}: magic {magic} version {version} is not a token shard")
    toks = np.frombuffer(data[1024:], dtype=dt)
    if toks.size != n:
        raise SystemExit(f"tta_gpt_torch: {path}: the header says {n} tokens, the file has {toks.size}")
    return toks.astype(np.int64)


def read_shards(pattern):
    import glob
    paths = sorted(glob.glob(pattern), key=lambda p: p.encode())
    if not paths:
        raise SystemExit(f"tta_gpt_torch: no file matches {pattern!r}")
    return [read_shard(p) for p in paths]


def vocab_size(path):
    with open(path, encoding="utf-8") as f:
        head = f.readline().split()
    if len(head) != 4 or head[0] != "plexus-vocab":
        raise SystemExit(f"tta_gpt_torch: {path}: not a plexus vocabulary (first line {' '.join(head)!r})")
    return int(head[3])


# ---- train -----------------------------------------------------------------

def lr_at(a, step, total):
    if a.warmup_steps > 0 and step < a.warmup_steps:
        return (step + 1) / a.warmup_steps
    span = total - a.warmup_steps
    p = (step - a.warmup_steps) / span if span > 0 else 1.0
    p = min(max(p, 0.0), 1.0)
    return 0.5 * (1.0 + math.cos(math.pi * p))  # a factor of the base lr, min_lr 0


def train(rank, a, port, t0):
    # The parent's start: spawned processes import this file afresh (a new
    # T0), and perf_counter is CLOCK_MONOTONIC, one clock for all processes.
    global T0
    T0 = t0
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import gpt2_torch
    torch.set_num_interop_threads(1)
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.ranks)
    R, T, B = a.ranks, a.context, a.batch
    V = vocab_size(a.vocab)
    # Windows: (shard, start) for training (start j·T, plus the epoch's offset) and validation.
    tr_shards = [torch.from_numpy(s) for s in read_shards(a.train)]
    va_shards = [torch.from_numpy(s) for s in read_shards(a.val)]
    tr_tok = torch.cat(tr_shards)
    tr_base, off = [], 0
    for s in tr_shards:
        k = max(0, (s.numel() - T) // T)
        tr_base.append(off + torch.arange(k, dtype=torch.int64) * T)
        off += s.numel()
    tr_base = torch.cat(tr_base)
    va_tok = torch.cat(va_shards)
    va_base, off = [], 0
    for s in va_shards:
        k = max(0, (s.numel() - 1) // T)
        va_base.append(off + torch.arange(k, dtype=torch.int64) * T)
        off += s.numel()
    va_base = torch.cat(va_base)
    n, nv = tr_base.numel(), va_base.numel()
    if n == 0 or nv == 0:
        raise SystemExit(f"tta_gpt_torch: {n} training and {nv} validation windows of {T} tokens: too little text")
    if int(tr_tok.max()) >= V or int(va_tok.max()) >= V:
        raise SystemExit(f"tta_gpt_torch: a token is outside the vocabulary of {V}")
    ar = torch.arange(T + 1, dtype=torch.int64)

    torch.manual_seed(a.seed)
    model = gpt2_torch.GPT(V, T, a.n_layer, a.n_head, a.n_embd)
    gpt2_torch.gpt2_init(model)
    ddp = torch.nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's weights
    ddp.train()
    opt = torch.optim.AdamW(ddp.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=a.weight_decay)
    per_rank = (n + R - 1) // R
    per_epoch = (per_rank + B - 1) // B
    total = per_epoch * a.max_epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(a, s, total))
    lo, hi = nv * rank // R, nv * (rank + 1) // R
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"ready (processes, shards, model) wall_s {wall():.2f}: {n} training windows, {nv} validation "
              f"windows of {T}, vocabulary {V}, {params} parameters, {per_epoch} steps an epoch, {total} in all",
              flush=True)

    def evaluate():
        model.eval()
        sums = torch.zeros(2, dtype=torch.float64)
        with torch.no_grad():
            for i in range(lo, hi, B):
                w = va_tok[va_base[i:min(i + B, hi)].unsqueeze(1) + ar]
                out = model(w[:, :-1])
                sums[0] += float(F.cross_entropy(out.reshape(-1, V), w[:, 1:].reshape(-1), reduction="sum"))
                sums[1] += w.shape[0] * T
        dist.all_reduce(sums)
        model.train()
        return float(sums[0] / sums[1])

    def report(step, epoch):
        # One evaluation, printed by rank 0 as plexus's eval line; the loss.
        loss = evaluate()
        if rank == 0:
            print(f"eval step {step} epoch {epoch} loss {loss:.4f} wall_s {wall():.2f}", flush=True)
        return loss

    step = 0
    reached = False
    loss = float("nan")
    epoch = 0
    evaluated = -1  # the step of the last evaluation
    for epoch in range(1, a.max_epochs + 1):
        g = torch.Generator()
        g.manual_seed(a.seed * 1000003 + epoch)
        order = torch.randperm(n, generator=g)
        order = torch.cat([order, order[:per_rank * R - n]])  # pad by wrapping
        offsets = torch.randint(0, T, (n, ), generator=g)  # the epoch's offset of each window
        mine = order[rank::R]
        for b in range(per_epoch):
            idx = mine[b * B:(b + 1) * B]
            w = tr_tok[(tr_base[idx] + offsets[idx]).unsqueeze(1) + ar]
            opt.zero_grad(set_to_none=True)
            out = ddp(w[:, :-1])
            F.cross_entropy(out.reshape(-1, V), w[:, 1:].reshape(-1)).backward()
            opt.step()
            sched.step()
            step += 1
            if a.eval_every > 0 and step % a.eval_every == 0:
                loss, evaluated = report(step, epoch), step
                reached = loss <= a.target_loss
                if reached:
                    break
        if reached:
            break
        if a.eval_every == 0:
            loss, evaluated = report(step, epoch), step
            reached = loss <= a.target_loss
            if reached:
                break
    if not reached and evaluated != step:
        # plexus evaluates once more at the end of a run whose last step had no evaluation
        # (src/train/train.c, px_train's final run_eval).
        loss = report(step, epoch)
        reached = loss <= a.target_loss
    if rank == 0:
        print(f"tta torch reached={int(reached)} loss={loss:.4f} steps={step} epochs={epoch} "
              f"wall_s={wall():.2f} target_loss={a.target_loss}", flush=True)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # gloo's teardown can hang after a peer left (bench_train_torch.py)


def main():
    ap = argparse.ArgumentParser(description="Time to a validation loss of the README's GPT recipe in PyTorch DDP "
                                 "(gloo), and the corpus it is measured on.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="write WORK/train.txt and WORK/valid.txt from the corpus")
    p.add_argument("--src", default="/usr/share/doc/python3.11/html/_sources")
    p.add_argument("--work", required=True)
    p.add_argument("--train-tokens", type=int, default=200000)
    p.add_argument("--val-tokens", type=int, default=20000)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--val-every", type=int, default=10)
    t = sub.add_parser("train", help="train and time (PyTorch's side)")
    t.add_argument("--train", required=True, help="glob of the training shards")
    t.add_argument("--val", required=True, help="glob of the validation shards")
    t.add_argument("--vocab", required=True, help="the plexus vocabulary file (its size sets the model's)")
    t.add_argument("--target-loss", type=float, required=True)
    t.add_argument("--max-epochs", type=int, default=3)
    t.add_argument("--eval-every", type=int, default=10, help="evaluate every K steps (0: each epoch)")
    t.add_argument("--ranks", type=int, default=2)
    t.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    t.add_argument("--batch", type=int, default=16, help="windows per rank per step")
    t.add_argument("--context", type=int, default=128)
    t.add_argument("--n-layer", type=int, default=4)
    t.add_argument("--n-head", type=int, default=4)
    t.add_argument("--n-embd", type=int, default=256)
    t.add_argument("--lr", type=float, default=6e-4)
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--warmup-steps", type=int, default=75)
    t.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.cmd == "prepare":
        if a.train_tokens < 1 or a.val_tokens < 1 or a.vocab_size < 3 or a.val_every < 2:
            ap.error("--train-tokens, --val-tokens >= 1, --vocab-size >= 3, --val-every >= 2")
        return prepare(a)
    if a.ranks < 1 or a.threads < 1 or a.batch < 1 or a.max_epochs < 1 or a.eval_every < 0 or a.context < 1:
        ap.error("--ranks, --threads, --batch, --max-epochs, --context must be >= 1 and --eval-every >= 0")
    sys.path.insert(0, HERE)
    import tta_torch  # its spawn: the same gloo set-up and clock hand-over as the CNN's side
    tta_torch.spawn_ranks(train, a, T0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
