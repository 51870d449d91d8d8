"""plexus's word tokenizer gives the token ids PyTorch's word_language_model
example gives (examples/word_language_model/data.py: open with
encoding="utf8", for each line `line.split() + ['<eos>']`, ids in order of
first appearance), on WikiText-2-style text with every kind of line end and
Unicode whitespace Python's str.split() knows; the valid split, converted
with the train split's vocabulary, maps unseen words to "<unk>"; shards cut
at any size concatenate to the same ids; a vocabulary past 65,536 words
gives uint32 shards (magic 20240801); the byte tokenizer gives the file's
bytes.  If it failed, a model trained on plexus's shards would see other ids
than the same model trained with PyTorch's example — perplexities would not
be comparable — or a shard would not be readable by llm.c's loaders.
"""

import glob
import os
import struct
import subprocess
import sys
import tempfile

import torch

BUILD = os.environ.get("PX_BUILD_DIR", "")
TOOL = os.path.join(BUILD, "tests", "px_text_to_shards")
failures = 0


def check(cond, msg):
    global failures
    if not cond:
        print("FAIL:", msg)
        failures += 1


# ---- The reference: word_language_model's Dictionary and tokenize ----------
class Vocab:
    def __init__(self):
        self.ids = {}
        self.words = []

    def add(self, w):
        if w not in self.ids:
            self.ids[w] = len(self.words)
            self.words.append(w)


def reference_train(path):
    v = Vocab()
    with open(path, "r", encoding="utf8") as f:
        for line in f:
            for w in line.split() + ["<eos>"]:
                v.add(w)
    with open(path, "r", encoding="utf8") as f:
        ids = torch.cat([torch.tensor([v.ids[w] for w in line.split() + ["<eos>"]], dtype=torch.int64) for line in f])
    return v, ids.tolist()


def reference_encode(path, v):
    # plexus's rule for a split encoded with another split's vocabulary.
    out = []
    with open(path, "r", encoding="utf8") as f:
        for line in f:
            out += [v.ids.get(w, v.ids["<unk>"]) for w in line.split() + ["<eos>"]]
    return out


# ---- plexus's files --------------------------------------------------------------
def read_shards(prefix):
    tokens = []
    paths = sorted(glob.glob(prefix + "_*.bin"))
    magics = set()
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        magic, version, count = struct.unpack("<3i", data[:12])
        magics.add(magic)
        check(struct.unpack("<253i", data[12:1024]) == (0,) * 253, f"{p}: header words 3..255 not zero")
        size = 2 if magic == 20240520 else 4
        check((magic, version) in ((20240520, 1), (20240801, 7)), f"{p}: magic {magic} version {version}")
        check(len(data) == 1024 + size * count, f"{p}: {len(data)} bytes for {count} tokens")
        tokens += list(struct.unpack(f"<{count}{'H' if size == 2 else 'I'}", data[1024:]))
    return tokens, paths, magics


def read_vocab(path):
    with open(path, "rb") as f:
        lines = f.read().decode("utf8").split("\n")
    return lines[0], lines[1:-1]


def convert(kind, text, prefix, vocab="-", shard_tokens="0"):
    r = subprocess.run([TOOL, kind, text, prefix, vocab, shard_tokens], capture_output=True, text=True)
    check(r.returncode == 0, f"px_text_to_shards {kind} {text}: {r.stderr}")


# WikiText-2's look (leading space, " @-@ ", "<unk>", blank lines), and every
# line end and Unicode space Python handles: \r\n, lone \r, \v \f \x1c-\x1f
# inside lines, NBSP, U+2028, U+3000, ...; a last line without a newline.
TRAIN = (
    " \n"
    " = Valkyria Chronicles III = \n"
    " \n"
    " Senjō no Valkyria 3 : <unk> Chronicles ( Japanese : 戦場のヴァルキュリア3 , lit . Valkyria of the Battlefield 3 ) , "
    "commonly referred to as Valkyria Chronicles III outside Japan , is a tactical role @-@ playing video game \n"
    "\ttabs\tand  double  spaces\r\n"
    "lone\rcarriage returns\r\r"
    "vertical\x0btab\x0cform\x1cfile\x1dgroup\x1erecord\x1funit\n"
    "nbsp\u00a0word next\u0085line ogham\u1680mark en\u2002quad hair\u200aspace\n"
    "line\u2028separator para\u2029graph narrow\u202fnbsp math\u205fspace ideo\u3000graphic\n"
    "not\u200bspace zero\ufeffwidth stays one word  \n"
    "   \n"
    "\n"
    "= = Gameplay = = \n"
    " the game 's <unk> the the game last line without newline"
)
VALID = " \n = Valkyria new@word game = \n unseen words here <unk> \n"


def main():
    if not os.path.exists(TOOL):
        print(f"missing {TOOL} (set PX_BUILD_DIR)")
        return 1
    with tempfile.TemporaryDirectory() as d:
        train, valid = os.path.join(d, "wiki.train.tokens"), os.path.join(d, "wiki.valid.tokens")
        with open(train, "w", encoding="utf8", newline="") as f:
            f.write(TRAIN)
        with open(valid, "w", encoding="utf8", newline="") as f:
            f.write(VALID)
        ref_vocab, ref_ids = reference_train(train)
        check("<unk>" in ref_vocab.ids, "the corpus should hold <unk>")

        convert("word", train, os.path.join(d, "train"), "-", "7")
        ids, paths, magics = read_shards(os.path.join(d, "train"))
        head, words = read_vocab(os.path.join(d, "train.vocab"))
        check(head == f"plexus-vocab 1 word {len(ref_vocab.words)}", f"vocab header {head!r}")
        check(words == ref_vocab.words, f"vocabulary differs:\n  plexus {words}\n  torch  {ref_vocab.words}")
        check(ids == ref_ids, f"train ids differ:\n  plexus {ids}\n  torch  {ref_ids}")
        check(len(paths) == (len(ref_ids) + 6) // 7 and magics == {20240520}, f"{len(paths)} shards, magics {magics}")

        # One shard holds the same ids.
        convert("word", train, os.path.join(d, "one"))
        one, paths, _ = read_shards(os.path.join(d, "one"))
        check(one == ref_ids and len(paths) == 1, "one shard differs")

        # Valid split with the train vocabulary: unseen words become <unk>.
        convert("word", valid, os.path.join(d, "valid"), os.path.join(d, "train.vocab"))
        vids, _, _ = read_shards(os.path.join(d, "valid"))
        want = reference_encode(valid, ref_vocab)
        check(vids == want, f"valid ids differ:\n  plexus {vids}\n  want   {want}")
        check(want.count(ref_vocab.ids["<unk>"]) >= 4, "valid should hold unseen words")
        check(read_vocab(os.path.join(d, "valid.vocab")) == read_vocab(os.path.join(d, "train.vocab")),
              "valid.vocab is not the train vocabulary")

        # Past 65,536 words: uint32 tokens.
        big = os.path.join(d, "big.txt")
        with open(big, "w", encoding="utf8") as f:
            for i in range(70000):
                f.write(f"w{i} <unk>\n" if i % 10000 == 0 else f"w{i}\n")
        convert("word", big, os.path.join(d, "big"))
        bids, _, magics = read_shards(os.path.join(d, "big"))
        bref_vocab, bref = reference_train(big)
        check(magics == {20240801} and len(bref_vocab.words) > 65536, f"big vocabulary: magics {magics}")
        check(bids == bref, "big vocabulary ids differ")

        # Bytes: the file's bytes, and a vocabulary file that says so.
        convert("byte", train, os.path.join(d, "bytes"), "-", "100")
        bts, _, magics = read_shards(os.path.join(d, "bytes"))
        check(bts == list(TRAIN.encode("utf8")) and magics == {20240520}, "byte tokens differ from the file's bytes")
        with open(os.path.join(d, "bytes.vocab"), "rb") as f:
            check(f.read() == b"plexus-vocab 1 byte 256\n", "byte vocabulary file")
    if failures:
        print(f"test_text_words_match_word_language_model: {failures} check(s) failed")
        return 1
    print("test_text_words_match_word_language_model: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
