/* Claim: a vocabulary saved and loaded gives the same ids (word and byte
 * kinds); a vocabulary file is read strictly — a missing or foreign first
 * line, another version or kind, a count that disagrees with the tokens
 * listed, an empty token, a repeated token, whitespace (a CRLF file) or NUL
 * inside a token, no "<eos>" or "<unk>", tokens listed in a byte vocabulary
 * — each an error naming the file and line; unknown words map to "<unk>";
 * decoding joins words with spaces and "<eos>" as newlines and reports the
 * length it needs; and the token dataset over px_text_to_shards' shards
 * gives the same samples as px_text_dataset_open on the text (plain or
 * gzip), for words and bytes, with stale shards of an earlier conversion
 * removed.  If it failed, valid/test splits would be encoded with ids that
 * differ from training's, a hand-edited or damaged vocabulary would be
 * accepted and shift every id, or the two ways to feed text would disagree. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "test_dir.h"

static void write_text(const char *path, const char *text, size_t n) {
  FILE *f = fopen(path, "wb");
  fwrite(text, 1, n, f);
  fclose(f);
}

static const char corpus[] =
  " \n = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 : <unk> Chronicles ( Japanese ) , a role @-@ playing "
  "game \n the game is a game of the <unk> \n\n = = Gameplay = = \n As with previous games , the game is played "
  "in turns \n";

static void expect_parse_error(const char *text, const char *a, const char *b) {
  px_vocab *v = (px_vocab *)1;
  px_status st = px_vocab_parse(&v, text, strlen(text), "my.vocab");
  CHECK(st == PX_ERR_FORMAT && v == NULL, "parse of \"%.30s...\" gave %s", text, px_status_name(st));
  CHECK(strstr(px_last_error(), "my.vocab") && strstr(px_last_error(), a) && (!b || strstr(px_last_error(), b)),
        "message lacks the file, \"%s\" or \"%s\": %s", a, b ? b : "", px_last_error());
}

static void vocab_files(void) {
  write_text(in_dir("train.txt"), corpus, sizeof corpus - 1);
  px_vocab *v, *w;
  CHECK_OK(px_vocab_build(&v, in_dir("train.txt")));
  CHECK(px_vocab_kind(v) == PX_TOKENIZER_WORD, "kind");
  // First appearance: "<eos>" (the blank first line), "=", "Valkyria", ...
  CHECK(strcmp(px_vocab_token(v, 0), "<eos>") == 0 && strcmp(px_vocab_token(v, 1), "=") == 0 &&
          strcmp(px_vocab_token(v, 2), "Valkyria") == 0,
        "first ids: %s %s %s", px_vocab_token(v, 0), px_vocab_token(v, 1), px_vocab_token(v, 2));
  uint32_t unk = px_vocab_id(v, "<unk>", 5);
  CHECK(unk != UINT32_MAX && px_vocab_id(v, "never-seen", 10) == unk, "unknown words must map to <unk>");
  CHECK(px_vocab_id(v, "game", 4) != unk && strcmp(px_vocab_token(v, px_vocab_id(v, "game", 4)), "game") == 0, "game");
  CHECK(px_vocab_token(v, (uint32_t)px_vocab_size(v)) == NULL, "token past the end");
  CHECK_OK(px_vocab_save(v, in_dir("v.vocab")));
  CHECK_OK(px_vocab_load(&w, in_dir("v.vocab")));
  CHECK(px_vocab_size(w) == px_vocab_size(v), "size %zu after load, %zu before", px_vocab_size(w), px_vocab_size(v));
  for (uint32_t id = 0; id < px_vocab_size(v); id++)
    CHECK(strcmp(px_vocab_token(v, id), px_vocab_token(w, id)) == 0 &&
            px_vocab_id(w, px_vocab_token(v, id), strlen(px_vocab_token(v, id))) == id,
          "id %u differs after load", id);
  px_vocab_free(w);

  // A text without "<unk>" gets it as the last id.
  write_text(in_dir("plain.txt"), "a b\nb c", 7);
  CHECK_OK(px_vocab_build(&w, in_dir("plain.txt")));
  CHECK(px_vocab_size(w) == 5 && strcmp(px_vocab_token(w, 2), "<eos>") == 0 &&
          strcmp(px_vocab_token(w, 4), "<unk>") == 0,
        "plain vocabulary");
  px_vocab_free(w);
  write_text(in_dir("nul.txt"), "ok line\nbad\0line\n", 17);
  px_status st = px_vocab_build(&w, in_dir("nul.txt"));
  CHECK(st == PX_ERR_FORMAT && strstr(px_last_error(), "nul.txt line 2: a NUL byte"), "NUL: %s", px_last_error());
  write_text(in_dir("empty.txt"), "", 0);
  st = px_vocab_build(&w, in_dir("empty.txt"));
  CHECK(st == PX_ERR_FORMAT && strstr(px_last_error(), "empty"), "empty text: %s", px_last_error());

  // Byte vocabulary: 256 ids, a file with only its header.
  px_vocab *b;
  CHECK_OK(px_vocab_byte(&b));
  CHECK(px_vocab_size(b) == 256 && px_vocab_id(b, "A", 1) == 65 && px_vocab_id(b, "AB", 2) == UINT32_MAX, "bytes");
  CHECK_OK(px_vocab_save(b, in_dir("b.vocab")));
  CHECK_OK(px_vocab_load(&w, in_dir("b.vocab")));
  CHECK(px_vocab_kind(w) == PX_TOKENIZER_BYTE && px_vocab_size(w) == 256, "byte vocabulary after load");
  px_vocab_free(w);

  // Decoding.
  uint32_t ids[4] = {px_vocab_id(v, "the", 3), px_vocab_id(v, "game", 4), 0, px_vocab_id(v, "=", 1)};
  char out[64];
  size_t need = px_vocab_decode(v, ids, 4, out, sizeof out);
  CHECK(need == 10 && strcmp(out, "the game\n=") == 0, "decoded \"%s\" (%zu)", out, need);
  need = px_vocab_decode(v, ids, 4, out, 5);
  CHECK(need == 10 && strcmp(out, "the ") == 0, "cut decode \"%s\" (%zu)", out, need);
  const uint32_t hi[3] = {104, 105, 10};
  need = px_vocab_decode(b, hi, 3, out, sizeof out);
  CHECK(need == 3 && strcmp(out, "hi\n") == 0, "byte decode \"%s\"", out);
  px_vocab_free(b);
  px_vocab_free(v);

  // Strict parsing.
  CHECK_OK(px_vocab_parse(&w, "plexus-vocab 1 word 2\n<eos>\n<unk>", 33, "ok.vocab"));  // no final newline: fine
  px_vocab_free(w);
  expect_parse_error("", "empty file", NULL);
  expect_parse_error("<eos>\n<unk>\n", "line 1: not a plexus vocabulary", "plexus-vocab 1 word N");
  expect_parse_error("plexus-vocab 2 word 2\n<eos>\n<unk>\n", "line 1: version 2", "reads version 1");
  expect_parse_error("plexus-vocab 1 bpe 2\n<eos>\n<unk>\n", "line 1: kind must be", NULL);
  expect_parse_error("plexus-vocab 1 word x\n<eos>\n<unk>\n", "line 1: bad token count", NULL);
  expect_parse_error("plexus-vocab 1 word 3\n<eos>\n<unk>\n", "header says 3 tokens, the file lists 2", NULL);
  expect_parse_error("plexus-vocab 1 word 2\n<eos>\n<unk>\nextra\n", "line 4: more tokens than the 2", NULL);
  expect_parse_error("plexus-vocab 1 word 3\n<eos>\n\n<unk>\n", "line 3: empty token", NULL);
  expect_parse_error("plexus-vocab 1 word 4\n<eos>\nthe\n<unk>\nthe\n", "line 5: token \"the\" repeats line 3", NULL);
  expect_parse_error("plexus-vocab 1 word 2\r\n<eos>\r\n<unk>\r\n", "line 1", NULL);
  expect_parse_error("plexus-vocab 1 word 2\n<eos>\r\n<unk>\r\n", "line 2: token", "CRLF");
  expect_parse_error("plexus-vocab 1 word 2\n<eos>\na b\n", "line 3: token \"a b\" holds whitespace", NULL);
  expect_parse_error("plexus-vocab 1 word 2\n<eos>\nword\n", "no \"<unk>\" token", NULL);
  expect_parse_error("plexus-vocab 1 byte 256\na\n", "line 2: a byte vocabulary lists no tokens", NULL);
  expect_parse_error("plexus-vocab 1 byte 255\n", "256 tokens, not 255", NULL);
  px_vocab *z = (px_vocab *)1;
  st = px_vocab_parse(&z, "plexus-vocab 1 word 2\n<eos>\n<u\0k>\n", 34, "my.vocab");
  CHECK(st == PX_ERR_FORMAT && strstr(px_last_error(), "line 3") && strstr(px_last_error(), "NUL"), "NUL token: %s",
        px_last_error());
  st = px_vocab_load(&z, in_dir("absent.vocab"));
  CHECK(st == PX_ERR_NOT_FOUND && strstr(px_last_error(), "absent.vocab"), "absent: %s", px_last_error());
}

// Every sample of a and b equal (T tokens of x and y).
static void same_samples(px_dataset *a, px_dataset *b, const char *what) {
  CHECK(a->length == b->length && a->x_shape[0] == b->x_shape[0] && a->num_classes == b->num_classes,
        "%s: %zu vs %zu samples, %zu vs %zu classes", what, a->length, b->length, a->num_classes, b->num_classes);
  if (a->length != b->length) return;
  px_batch ba, bb;
  CHECK_OK(px_batch_alloc(&ba, a, 1));
  CHECK_OK(px_batch_alloc(&bb, b, 1));
  size_t T = (size_t)a->x_shape[0];
  for (size_t i = 0; i < a->length; i++) {
    px_rng r1 = px_rng_make(9, i), r2 = px_rng_make(9, i);
    CHECK_OK(px_dataset_get(a, i, &ba, 0, &r1));
    CHECK_OK(px_dataset_get(b, i, &bb, 0, &r2));
    CHECK(memcmp(ba.x.data, bb.x.data, T * 4) == 0 && memcmp(ba.y.data, bb.y.data, T * 4) == 0,
          "%s: sample %zu differs", what, i);
  }
  px_batch_free(&ba);
  px_batch_free(&bb);
}

static void shards_and_text_dataset_agree(void) {
  // gzip the corpus: px_text_dataset_open reads it by content.
  gzFile g = gzopen(in_dir("train.txt.gz"), "wb");
  gzwrite(g, corpus, sizeof corpus - 1);
  gzclose(g);
  // A stale shard from an earlier conversion of something longer.
  write_text(in_dir("wt_000007.bin"), "stale", 5);
  write_text(in_dir("wt_000012.bin"), "stale", 5);
  write_text(in_dir("wt_notes.bin"), "keep", 4);
  // 53 tokens in shards of 10: wt_000000.bin .. wt_000005.bin.
  CHECK_OK(px_text_to_shards(in_dir("train.txt"), in_dir("wt"), PX_TOKENIZER_WORD, NULL, 10));
  CHECK(access(in_dir("wt_000007.bin"), F_OK) != 0 && access(in_dir("wt_000012.bin"), F_OK) != 0,
        "stale shards 7 and 12 were left");
  CHECK(access(in_dir("wt_000005.bin"), F_OK) == 0 && access(in_dir("wt_000006.bin"), F_OK) != 0,
        "shards 0..5 expected");
  CHECK(access(in_dir("wt_notes.bin"), F_OK) == 0, "a file that is not a numbered shard was removed");
  px_vocab *v;
  CHECK_OK(px_vocab_load(&v, in_dir("wt.vocab")));
  // Shards of 10 tokens and T = 4: floor((10 - 1)/4) = 2 windows in each of
  // the five full shards, none in the last (3 tokens).
  px_dataset *from_shards, *from_text;
  char pattern[256];
  snprintf(pattern, sizeof pattern, "%s/wt_0*.bin", dir);
  CHECK_OK(px_token_dataset_open(&from_shards, pattern, 4, false, px_vocab_size(v)));
  CHECK(from_shards->length == 10, "%zu samples from 10-token shards, expected 10", from_shards->length);
  // One shard of everything, and the text dataset: the same windows.
  CHECK_OK(px_text_to_shards(in_dir("train.txt"), in_dir("all"), PX_TOKENIZER_WORD, in_dir("wt.vocab"), 0));
  snprintf(pattern, sizeof pattern, "%s/all_*.bin", dir);
  px_dataset *all;
  CHECK_OK(px_token_dataset_open(&all, pattern, 4, true, px_vocab_size(v)));
  CHECK_OK(px_text_dataset_open(&from_text, in_dir("train.txt.gz"), v, 4, true));
  same_samples(all, from_text, "word shards vs text (random offsets)");
  px_dataset_free(from_shards);
  px_dataset_free(all);
  px_dataset_free(from_text);

  px_status st = px_text_to_shards(in_dir("train.txt"), in_dir("x"), PX_TOKENIZER_BYTE, in_dir("wt.vocab"), 0);
  CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "word vocabulary") && strstr(px_last_error(), "byte"),
        "kind mismatch: %s", px_last_error());
  px_vocab_free(v);

  CHECK_OK(px_text_to_shards(in_dir("train.txt"), in_dir("bytes"), PX_TOKENIZER_BYTE, NULL, 0));
  CHECK_OK(px_vocab_load(&v, in_dir("bytes.vocab")));
  snprintf(pattern, sizeof pattern, "%s/bytes_*.bin", dir);
  CHECK_OK(px_token_dataset_open(&all, pattern, 8, false, 256));
  CHECK_OK(px_text_dataset_open(&from_text, in_dir("train.txt"), v, 8, false));
  CHECK(all->length == (sizeof corpus - 2) / 8, "byte samples %zu", all->length);
  same_samples(all, from_text, "byte shards vs text");
  px_dataset_free(all);
  px_dataset_free(from_text);
  px_vocab_free(v);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/px_vocab_XXXXXX");
  if (!mkdtemp(dir)) return 1;
  vocab_files();
  shards_and_text_dataset_agree();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return px_test_finish("test_vocab_files_strict_and_text_datasets_agree");
}
