"""Claim: the language-model path of the plexus command works end to end, as
a user runs it on WikiText-2: `plexus tokenize` turns a word-level corpus
into token shards and a vocabulary (the validation split with the training
split's vocabulary); `plexus train --model gpt` trains on the shards data
parallel (2 ranks as threads) and on the text file directly, reporting
validation loss and perplexity at each evaluation; the validation loss
comes within 25% of the corpus's entropy rate; and `plexus generate`
continues a prompt with words of the vocabulary, the same text for the same
seed.

The corpus is drawn from a first-order Markov chain over 24 words and the
end-of-line token, each with three successors, so its entropy rate (nats
per token) is known exactly: H = sum_s pi(s) H(next | s), pi the chain's
stationary distribution.  (The GPT's own test, test_gpt_learns_markov_chain,
holds the model to 10% in a longer run.)

If it fails, the tokenizer, the shards, the token dataset, the GPT, the loop's
language-model loss and perplexity, the vocabulary saved with the run, or
sampling is broken."""

import json
import math
import os
import random
import re
import shutil
import tempfile

import cli_util as cu

WORDS = ["w%02d" % i for i in range(24)]
EOS = "<eos>"


def make_chain(seed):
    rng = random.Random(seed)
    states = WORDS + [EOS]
    chain = {}
    for s in states:
        succ = rng.sample(states, 3)
        chain[s] = list(zip(succ, (0.6, 0.3, 0.1)))
    return states, chain


def entropy_rate(states, chain):
    pi = {s: 1.0 / len(states) for s in states}
    for _ in range(2000):
        nxt = {s: 0.0 for s in states}
        for s, p in pi.items():
            for t, q in chain[s]:
                nxt[t] += p * q
        pi = nxt
    h = -sum(q * math.log(q) for q in (0.6, 0.3, 0.1))
    return sum(pi[s] * h for s in states)  # every state has the same successor distribution shape


def write_corpus(path, chain, n_tokens, seed):
    rng = random.Random(seed)
    s = EOS
    lines, line = [], []
    for _ in range(n_tokens):
        r, acc = rng.random(), 0.0
        for t, q in chain[s]:
            acc += q
            if r < acc:
                break
        s = t
        if s == EOS:
            lines.append(" ".join(line))
            line = []
        else:
            line.append(s)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


tmp = tempfile.mkdtemp(prefix="px_cli_gpt_")
try:
    states, chain = make_chain(7)
    H = entropy_rate(states, chain)
    train_txt, valid_txt = os.path.join(tmp, "train.txt"), os.path.join(tmp, "valid.txt")
    write_corpus(train_txt, chain, 60000, 1)
    write_corpus(valid_txt, chain, 6000, 2)

    data = os.path.join(tmp, "data")  # tokenize makes it
    p = cu.run(["tokenize", "--input", train_txt, "--out", os.path.join(data, "train")])
    cu.check(p.returncode == 0, "tokenize of the training text failed")
    p = cu.run(["tokenize", "--input", valid_txt, "--out", os.path.join(data, "valid"), "--vocab",
                os.path.join(data, "train.vocab")])
    cu.check(p.returncode == 0, "tokenize of the validation text failed")
    cu.check(os.path.exists(os.path.join(data, "train_000000.bin")), "no training shard")

    gpt = ["--model", "gpt", "--context", "32", "--n-layer", "2", "--n-head", "2", "--n-embd", "64",
           "--optim", "adamw", "--lr", "0.003", "--weight-decay", "0", "--schedule", "cosine",
           "--warmup-steps", "20", "--batch-size", "16", "--log-every", "50", "--progress", "lines", "--quiet"]
    out = os.path.join(tmp, "run")
    p = cu.run(["train", "--threads", "2", "--data", "tokens", "--data-path", os.path.join(data, "train_*.bin"),
                "--val-path", os.path.join(data, "valid_*.bin"), "--vocab", os.path.join(data, "train.vocab"),
                "--steps", "300", "--eval-every", "100", "--out", out] + gpt)
    cu.check(p.returncode == 0, "training on shards failed")
    evals = [r for r in cu.jsonl(os.path.join(out, "metrics.jsonl")) if r["type"] == "eval"]
    cu.check(len(evals) == 3, "%d evaluations, expected 3 (steps 100, 200, 300)" % len(evals))
    if evals:
        last = evals[-1]
        cu.check(last["accuracy"] is None and last["perplexity"] is not None,
                 "a language model reports perplexity, not accuracy: %s" % last)
        cu.check(abs(last["perplexity"] - math.exp(last["loss"])) < 1e-3 * last["perplexity"],
                 "perplexity %s is not exp(loss %s)" % (last["perplexity"], last["loss"]))
        cu.check(last["loss"] < 1.25 * H, "validation loss %.4f not within 25%% of the entropy rate %.4f" %
                 (last["loss"], H))
        cu.check(evals[0]["loss"] > last["loss"], "validation loss did not fall: %s" % [e["loss"] for e in evals])
        print("entropy rate %.4f nats/token; validation loss %.4f (perplexity %.3f)" %
              (H, last["loss"], last["perplexity"]))

    # Generation with the tokenizer of training.
    first = open(train_txt).readline().split()[:2]
    gen = ["generate", "--checkpoint", os.path.join(out, "checkpoints"), "--prompt", " ".join(first), "--tokens", "30",
           "--temperature", "0.8", "--top-k", "5", "--seed", "4"]
    a, b = cu.run(gen), cu.run(gen)
    cu.check(a.returncode == 0 and a.stdout == b.stdout, "generate is not repeatable for one seed")
    words = a.stdout.split()
    cu.check(words[:2] == first, "the output does not start with the prompt %r: %r" % (first, a.stdout[:80]))
    cu.check(len(words) >= 20 and all(w in WORDS for w in words), "generated words outside the vocabulary: %r" %
             a.stdout[:200])
    # Most generated transitions are ones the chain allows.
    toks = re.split(r"(\n)", a.stdout)
    seq = [EOS if t == "\n" else w for t in toks for w in ([t] if t == "\n" else t.split())]
    allowed = sum(1 for s, t in zip(seq, seq[1:]) if s in chain and any(t == u for u, _ in chain[s]))
    cu.check(allowed >= 0.8 * (len(seq) - 1), "only %d of %d generated transitions are in the chain" %
             (allowed, len(seq) - 1))

    # The text file directly: the word vocabulary is built and saved with the run.
    out2 = os.path.join(tmp, "run_text")
    p = cu.run(["train", "--data", "text", "--data-path", train_txt, "--val-path", valid_txt, "--steps", "20",
                "--out", out2] + gpt)
    cu.check(p.returncode == 0, "training on the text file failed")
    cu.check(os.path.exists(os.path.join(out2, "vocab.txt")), "the run did not save its vocabulary")
    g = cu.run(["generate", "--checkpoint", os.path.join(out2, "checkpoints"), "--tokens", "5", "--seed", "1"])
    cu.check(g.returncode == 0 and len(g.stdout.split()) >= 1, "generate from the text run failed")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_cli_trains_gpt_on_text_and_generates")
