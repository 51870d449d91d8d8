/* plexus/data.h — datasets, sources, the distributed sampler, the
 * prefetching loader.
 *
 * The pieces, in the order data flows:
 *
 *   source (IDX, token shards, text, images+CSV, HDF5)  -> px_dataset
 *   px_sampler (which indices this rank reads this epoch)
 *   px_loader  (worker threads fetch samples straight into batch tensors,
 *               batches come out in sampler order, prefetched)
 *
 * A px_dataset is a table of samples of one fixed shape: input x (for
 * example C×H×W f32 or T i32 tokens) and target y (a scalar i32 label or T
 * i32 next tokens).  Fetching sample i writes it into one row ("slot") of
 * a batch: there is no separate collate copy.
 *
 * Determinism: a sample's random transforms (crops, flips, window offsets)
 * draw from a Philox stream keyed by (loader seed, epoch, sample index), so
 * a batch is the same whichever worker decodes it and however many there
 * are.  Errors name the file and the record. */
#ifndef PLEXUS_DATA_H
#define PLEXUS_DATA_H

#include "plexus/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exported from libplexus.so, which hides everything else (-fvisibility=hidden). */
#pragma GCC visibility push(default)

/* ---- Distributed sampler ------------------------------------------------
 * px_sampler is PyTorch's DistributedSampler: each epoch a permutation of
 * [0, n) drawn from (seed, epoch) — the same on every rank — is padded
 * (by repeating its head) or cut (drop_last) to a multiple of the world
 * size, and rank r takes positions r, r + world, r + 2·world, ...  So every
 * rank gets the same number of samples, and the union over ranks is the
 * dataset exactly once (drop_last: minus at most world - 1 samples; padding:
 * plus at most world - 1 repeats). */
typedef struct px_sampler {
  size_t dataset_size;
  int rank, world;
  bool shuffle;
  bool drop_last;
  uint64_t seed;
  uint64_t epoch;
  size_t num_samples; /* per rank, every epoch */
  size_t *indices;    /* (num_samples,) this rank's indices for the epoch */
  size_t *scratch;    /* (dataset_size,) the epoch's permutation */
} px_sampler;

/* This rank's share of a dataset of dataset_size samples over `world` ranks (shuffled by seed and
 * epoch when shuffle; drop_last: every rank the same count, the tail dropped, else padded by wrapping). */
px_status px_sampler_init(px_sampler *s, size_t dataset_size, int rank, int world, bool shuffle, uint64_t seed,
                          bool drop_last);
/* Draw the epoch's order (call at the start of every epoch). */
void px_sampler_set_epoch(px_sampler *s, uint64_t epoch);
void px_sampler_free(px_sampler *s);

/* ---- Batches --------------------------------------------------------------
 * x: (n, ...sample shape) and y: (n, ...target shape), with n <= capacity.
 * A batch owns its buffers (sized for `capacity` samples); x.shape[0] and
 * y.shape[0] say how many rows hold samples now. */
typedef struct px_batch {
  px_tensor x;     /* (n, C, H, W) f32 images, (n, T) i32 tokens, ... */
  px_tensor y;     /* (n,) i32 labels or (n, T) i32 next tokens */
  size_t n;        /* samples in the batch */
  size_t capacity; /* rows allocated */
  size_t *indices; /* (capacity,) dataset index of each row */
  uint64_t epoch;
  size_t number; /* batch number within the epoch, from 0 */
} px_batch;

/* ---- Datasets ------------------------------------------------------------- */
typedef struct px_dataset px_dataset;

typedef struct px_dataset_ops {
  /* Write sample i into row `slot` of b->x and b->y.  `rng` is the sample's
   * own stream, for random transforms.  Called from several worker threads
   * at once on different slots: it must not change shared state.  A bad
   * record returns PX_ERR_FORMAT (or PX_ERR_IO) naming file and record. */
  px_status (*get)(px_dataset *d, size_t i, px_batch *b, size_t slot, px_rng *rng);
  /* Free everything the source owns, including d itself. */
  void (*destroy)(px_dataset *d);
} px_dataset_ops;

struct px_dataset {
  const px_dataset_ops *ops;
  const char *kind;          /* "idx", "tokens", "images", "subset", ... */
  size_t length;             /* number of samples */
  px_dtype x_dtype, y_dtype; /* element types of x and y */
  int x_ndim, y_ndim;        /* dims of one sample (0..3); y_ndim 0: a scalar */
  int64_t x_shape[3], y_shape[3];
  size_t num_classes; /* labels in [0, num_classes); vocabulary size for tokens; 0 unknown */
  void *impl;         /* the source's own state */
};

/* Sample i into row `slot` (checks i < length and slot < capacity). */
px_status px_dataset_get(px_dataset *d, size_t i, px_batch *b, size_t slot, px_rng *rng);
void px_dataset_free(px_dataset *d);
/* A view of `count` samples of base starting at `start` (a held-out split,
 * a small subset for a quick run).  The subset does not own base. */
px_status px_dataset_subset(px_dataset **out, px_dataset *base, size_t start, size_t count);

/* Batch buffers for up to `capacity` samples of d. */
px_status px_batch_alloc(px_batch *b, const px_dataset *d, size_t capacity);
void px_batch_free(px_batch *b);

/* ---- Prefetching loader ---------------------------------------------------
 * Each epoch the loader asks its px_sampler for this rank's indices, cuts
 * them into batches of batch_size, and has `workers` threads fill batches
 * ahead of the training loop (up to `prefetch` batches ready).  Batches come
 * out in order; their contents depend on (seed, epoch, rank, world) only,
 * not on the number of workers.
 *
 * With skip_bad, a sample whose fetch fails is left out of its batch (the
 * batch is one shorter), counted, and reported once at the end of the epoch
 * on stderr with the first error's message; without it, px_loader_next
 * returns that error. */
typedef struct px_loader_opts {
  size_t batch_size;    /* per rank */
  int workers;          /* decoding threads; 0: decode on the caller's thread */
  int prefetch;         /* batches decoded ahead; 0: 2 per worker (at least 2) */
  bool shuffle;         /* a new order every epoch (the sampler's) */
  bool drop_last;       /* sampler: cut to a multiple of world (else pad by repeats) */
  bool drop_last_batch; /* drop the short final batch of each epoch */
  uint64_t seed;        /* order and random transforms */
  int rank, world;      /* this rank's share (world 0 means 1) */
  bool skip_bad;        /* skip and count bad records instead of failing */
} px_loader_opts;

#define PX_LOADER_DEFAULTS                    \
  ((px_loader_opts){.batch_size = 32,         \
                    .workers = 0,             \
                    .prefetch = 0,            \
                    .shuffle = true,          \
                    .drop_last = false,       \
                    .drop_last_batch = false, \
                    .seed = 0,                \
                    .rank = 0,                \
                    .world = 1,               \
                    .skip_bad = false})

typedef struct px_loader px_loader;

/* The loader does not own d; free d after the loader. */
px_status px_loader_create(px_loader **out, px_dataset *d, const px_loader_opts *opts);
/* Start epoch `epoch` at batch `first_batch` (0, or where a resumed run
 * stopped).  Workers start filling at once. */
px_status px_loader_start_epoch(px_loader *l, uint64_t epoch, size_t first_batch);
/* The next batch of the epoch, or *out = NULL when the epoch is over.  The
 * batch stays valid until the next call. */
px_status px_loader_next(px_loader *l, const px_batch **out);
/* Batches per epoch on this rank (the same on every rank). */
size_t px_loader_num_batches(const px_loader *l);
/* Bad records skipped so far in the current epoch. */
size_t px_loader_skipped(const px_loader *l);
/* Seconds px_loader_next spent waiting for workers this epoch (a loop that
 * never waits shows ~0). */
double px_loader_wait_seconds(const px_loader *l);
void px_loader_free(px_loader *l);

/* ---- IDX (MNIST, Fashion-MNIST) -------------------------------------------
 * IDX: big-endian magic 0x0000TTDD (TT type code: 0x08 u8, 0x09 i8, 0x0B
 * i16, 0x0C i32, 0x0D f32, 0x0E f64; DD number of dims), DD big-endian u32
 * dims, then the data, big-endian.  Files may be gzip-compressed (by
 * content, whatever the name). */
typedef struct px_idx {
  px_dtype dtype; /* PX_U8, PX_I8, PX_I16, PX_I32, PX_F32, PX_F64 */
  int ndim;       /* 1..8 */
  int64_t dims[8];
  void *data; /* host byte order, owned */
  size_t nbytes;
} px_idx;

/* Parse an in-memory IDX file (already decompressed).  `name` is used in
 * messages.  Checks the magic, type code, dims (1..8) and that the data is
 * exactly there: a truncated file or trailing bytes are PX_ERR_FORMAT. */
px_status px_idx_parse(const void *buf, size_t n, const char *name, px_idx *out);
/* Read a file, plain or gzip. */
px_status px_idx_read(const char *path, px_idx *out);
void px_idx_free(px_idx *idx);

/* Images (N×H×W u8) and labels (N u8) → x: (1, H, W) f32 = (v/255 - mean)/std,
 * y: i32 label.  Counts must agree; num_classes = largest label + 1.  Both
 * files are checked and held in memory at open, so get never fails. */
px_status px_idx_dataset_open(px_dataset **out, const char *images_path, const char *labels_path, float mean,
                              float std);
/* The four files of an MNIST-layout directory ("train-images-idx3-ubyte"
 * and friends, plain or with ".gz"); split "train" or "test". */
px_status px_mnist_open(px_dataset **out, const char *dir, const char *split, float mean, float std);

/* ---- Token shards (llm.c's format) ---------------------------------------
 * 256 little-endian int32 header: [0] magic, [1] version, [2] token count;
 * then the tokens.  20240520/1: uint16 tokens (GPT-2, llm.c);
 * 20240801/7: uint32 tokens (llm.c's Llama 3 files), for vocabularies past
 * 65,536. */
#define PX_SHARD_MAGIC_U16 20240520
#define PX_SHARD_VERSION_U16 1
#define PX_SHARD_MAGIC_U32 20240801
#define PX_SHARD_VERSION_U32 7
#define PX_SHARD_HEADER_BYTES 1024

typedef struct px_shard_info {
  int token_bytes; /* 2 or 4 */
  uint64_t num_tokens;
} px_shard_info;

/* Check a shard's header and that the body holds exactly num_tokens tokens
 * (`file_size` is the whole file's size). */
px_status px_shard_parse_header(const void *header, size_t header_bytes, uint64_t file_size, const char *name,
                                px_shard_info *out);
/* Write tokens as a shard (atomically); token_bytes 2 or 4 (2 refuses
 * tokens >= 65,536). */
px_status px_shard_write(const char *path, const uint32_t *tokens, size_t n, int token_bytes);

/* Windows of T+1 tokens from every shard matching `pattern` (a glob, files
 * in bytewise sorted order): sample i is window j of shard k (samples
 * numbered shard after shard), x = tokens[s .. s+T), y = tokens[s+1 .. s+T]
 * with s = j·T (+ a per-epoch random offset in [0, T) when random_offset,
 * drawn from the sample's stream).  Windows do not cross shard boundaries:
 * a shard of n tokens gives floor((n-1)/T) samples, floor((n-T)/T) with
 * random offsets.  vocab_size (0: do not check) bounds every token read;
 * num_classes = vocab_size.  Open checks each header and file size (no
 * match: PX_ERR_NOT_FOUND); shards stay on disk, get reads its window with
 * pread (one descriptor per shard stays open), and a token past the
 * vocabulary or a shard cut short since open is a bad record naming the
 * shard and the token position. */
px_status px_token_dataset_open(px_dataset **out, const char *pattern, int64_t T, bool random_offset,
                                size_t vocab_size);

/* ---- Node-local staging (--stage) -------------------------------------------
 * Copy a dataset's files once per node into a fast local directory (the
 * course's /dev/shm) and read them from there.  A set lives in
 * stage_dir/<name>-<12 hex of the source's SHA-256>/: the files under their
 * base names (an image listing's: their paths below its root,
 * px_stage_images) and MANIFEST ("plexus-stage 1", the source, then per file its
 * CRC-32C, size, source mtime and name), written atomically after the last
 * copy.  A later run keeps each file whose source has the recorded size and
 * mtime and whose copy has the recorded size (PX_STAGE_VERIFY_SIZE) and, by
 * default, CRC-32C (PX_STAGE_VERIFY_FULL); it copies the others again.  No
 * MANIFEST (a copy cut short) means everything is copied; files of the set
 * directory not in the set are removed.  Copies go to a temporary name and
 * are renamed; an flock serialises jobs of one node staging the same set.
 * docs/DATA.md, "Node-local staging". */
typedef struct px_comm px_comm;

typedef enum px_stage_verify {
  PX_STAGE_VERIFY_FULL = 0, /* a reused copy: size and CRC-32C of every byte */
  PX_STAGE_VERIFY_SIZE      /* a reused copy: size only (sources: size and mtime in both modes) */
} px_stage_verify;

typedef struct px_stage_result {
  size_t files;   /* files in the set */
  size_t copied;  /* copied by this call (0: all reused) */
  size_t reused;  /* kept from an earlier run */
  size_t damaged; /* copies whose source was unchanged but that failed the check (re-copied) */
  uint64_t bytes; /* the set's size */
  uint64_t bytes_copied, bytes_verified;
  double seconds; /* the whole call */
  char dir[4096]; /* the set's directory */
} px_stage_result;

/* The files a data kind reads from `path`: "mnist" (a directory: the four
 * IDX files, plain or .gz, that exist), "tokens" (a glob: the shards, sorted;
 * wildcards only in the last part), "text" and "hdf5" (the file).  Other
 * kinds are PX_ERR_UNSUPPORTED (images and imagenet: px_stage_images).  An
 * s3:// path is listed (mnist: the IDX objects under the prefix; tokens: a
 * glob in the last part or a key prefix ending in part of a name; text,
 * hdf5: one key) and *files are
 * s3:// URLs, which px_stage_files copies by ranged GETs, recording each
 * object's ETag in place of the mtime.  *files is malloc'ed: free with
 * px_stage_files_free. */
px_status px_stage_source_files(const char *kind, const char *path, char ***files, size_t *n);
void px_stage_files_free(char **files, size_t n);
/* Stage files[0..n) (distinct base names) as the set of `source`, on the
 * calling thread (no communicator: one caller per node). */
px_status px_stage_files(const char *stage_dir, const char *source, char *const *files, size_t n,
                         px_stage_verify verify, px_stage_result *res);
/* Where the staged copy of `source` is read from: the set's directory
 * (mnist), or the directory and the source's last part (tokens' glob, a
 * text or HDF5 file; an s3:// key prefix of shards: that part and '*'). */
px_status px_stage_path(const char *stage_dir, const char *kind, const char *source, char *out, size_t cap);
/* Collective over comm: local rank 0 of each node (px_comm_local_rank)
 * stages `source` (made absolute) while the node's other ranks wait in an
 * all-reduce over comm that also tells every rank whether any node failed;
 * then every rank gets the staged path in staged[cap].  res is filled on the
 * copying ranks (zeros elsewhere). */
px_status px_stage_source(px_comm *comm, const char *stage_dir, const char *kind, const char *source,
                          px_stage_verify verify, char *staged, size_t cap, px_stage_result *res);

/* ---- Text tokenizers --------------------------------------------------------
 * Word level (WikiText-2, as PyTorch's word_language_model reads it): lines
 * end at "\n", "\r\n" or "\r"; each line is split on whitespace (Python's
 * str.split(): ASCII and Unicode spaces in UTF-8) and followed by "<eos>";
 * words outside the vocabulary become "<unk>".  The vocabulary is built
 * from the training split, in order of first appearance ("<unk>" appended
 * if the text lacks it), and saved as a versioned text file
 * ("plexus-vocab 1 word N", then one token per line, id = line - 2), read
 * back strictly: errors name the file and line.
 * Byte level: the 256 byte values, no file needed (its file, as
 * px_text_to_shards writes it, is the one line "plexus-vocab 1 byte 256").
 * Text files may be gzip-compressed (by content). */
typedef enum px_tokenizer_kind { PX_TOKENIZER_WORD = 0, PX_TOKENIZER_BYTE } px_tokenizer_kind;

typedef struct px_vocab px_vocab;

/* A word vocabulary built from a text file, the byte vocabulary, or one read from / written to a
 * vocabulary file (format above). */
px_status px_vocab_build(px_vocab **out, const char *text_path);
px_status px_vocab_byte(px_vocab **out);
px_status px_vocab_load(px_vocab **out, const char *path);
px_status px_vocab_save(const px_vocab *v, const char *path);
/* Parse a vocabulary file held in memory (`name` for messages). */
px_status px_vocab_parse(px_vocab **out, const char *text, size_t n, const char *name);
void px_vocab_free(px_vocab *v);
px_tokenizer_kind px_vocab_kind(const px_vocab *v);
size_t px_vocab_size(const px_vocab *v);
/* Token id of a word (the id of "<unk>" when absent; in a byte vocabulary
 * a 1-byte word's value, else UINT32_MAX), and back (NULL past the end). */
uint32_t px_vocab_id(const px_vocab *v, const char *word, size_t len);
const char *px_vocab_token(const px_vocab *v, uint32_t id);
/* Tokenize text in memory; *tokens is malloc'ed. */
px_status px_vocab_encode(const px_vocab *v, const char *text, size_t n, uint32_t **tokens, size_t *n_tokens);
px_status px_vocab_encode_file(const px_vocab *v, const char *path, uint32_t **tokens, size_t *n_tokens);
/* Tokens back to text (word: words joined by spaces, "<eos>" as a newline;
 * byte: the bytes).  Writes at most cap-1 chars and a NUL; returns the
 * length the whole text needs. */
size_t px_vocab_decode(const px_vocab *v, const uint32_t *tokens, size_t n, char *buf, size_t cap);

/* Text file → token shards "<out_prefix>_000000.bin", ... of at most
 * shard_tokens tokens each (0: 100,000,000), uint16 when the vocabulary has
 * at most 65,536 tokens, else uint32, plus the vocabulary
 * "<out_prefix>.vocab".  vocab_path: an existing vocabulary to use (the
 * train split's, when converting the validation split; its kind must be
 * `kind`), or NULL to build one from this file.  Numbered shards of an
 * earlier conversion with this prefix past the new last one are removed. */
px_status px_text_to_shards(const char *text_path, const char *out_prefix, px_tokenizer_kind kind,
                            const char *vocab_path, size_t shard_tokens);
/* A token dataset straight from a text file, tokenized in memory. */
px_status px_text_dataset_open(px_dataset **out, const char *text_path, const px_vocab *v, int64_t T,
                               bool random_offset);

/* ---- Images ------------------------------------------------------------------
 * JPEG through libjpeg-turbo, PNG through libpng, decoded to 8-bit RGB or
 * gray, row-major H×W×C. */
typedef struct px_image {
  int width, height, channels;
  uint8_t *data; /* (height, width, channels), owned */
} px_image;

/* Decode JPEG or PNG bytes (by signature). channels: 3 or 1. */
px_status px_image_decode(const void *buf, size_t n, const char *name, int channels, px_image *out);
px_status px_image_load(const char *path, int channels, px_image *out);
void px_image_free(px_image *img);
/* Write an image (for tests and tools): ".png" by libpng, else JPEG. */
px_status px_image_save(const char *path, const px_image *img, int jpeg_quality);

typedef enum px_csv_layout {
  PX_CSV_PATH_LABEL = 0, /* "path,label": path relative to root, label an integer */
  PX_CSV_IMAGENET        /* LOC_train_solution.csv: "ImageId,PredictionString" */
} px_csv_layout;

typedef struct px_image_opts {
  const char *csv;  /* the listing */
  const char *root; /* images relative to this (NULL: the CSV's directory) */
  px_csv_layout layout;
  const char *synsets;   /* LOC_synset_mapping.txt (imagenet layout): line k's synset is class k */
  int channels;          /* 3 or 1 */
  int resize;            /* shorter side to this many pixels, bilinear (0: keep) */
  int crop;              /* square crop of this size (0: none; then all images must share one size) */
  bool random_crop;      /* random crop (training) instead of the center crop */
  bool hflip;            /* random horizontal flip with p = 0.5 */
  float mean[3], std[3]; /* x = (v/255 - mean[c]) / std[c] */
} px_image_opts;

#define PX_IMAGE_DEFAULTS                       \
  ((px_image_opts){.csv = NULL,                 \
                   .root = NULL,                \
                   .layout = PX_CSV_PATH_LABEL, \
                   .synsets = NULL,             \
                   .channels = 3,               \
                   .resize = 0,                 \
                   .crop = 0,                   \
                   .random_crop = false,        \
                   .hflip = false,              \
                   .mean = {0, 0, 0},           \
                   .std = {1, 1, 1}})

/* Reads and checks the whole listing up front (malformed rows and unknown
 * synsets are errors naming the CSV and the line); images are decoded in
 * get, by the loader's workers. */
px_status px_image_dataset_open(px_dataset **out, const px_image_opts *opts);

/* Where px_stage_images put the staged listing and synset mapping. */
typedef struct px_staged_images {
  char csv[4096], synsets[4096];
} px_staged_images;

/* Node-local staging (above) of an image listing: src->csv, every image it
 * names (below src->root; NULL: the CSV's directory) and, in the ImageNet
 * layout, the synset mapping src->synsets (the other fields are not used),
 * as one set whose directory holds the listing and the mapping under their
 * base names and each image under its path below the root (sub-directories
 * made: ImageNet's synset folders), so the staged listing's directory is
 * the staged images' root.  The listing's paths must be relative, without
 * ".." or parts starting with '.' (errors name the CSV line); an image
 * listed twice is copied once.  Local files, or s3:// (everything below
 * the root listed once for the objects' sizes and ETags).  The set is
 * reused, verified and re-copied file by file as any other (MANIFEST).
 * Collective over comm as px_stage_source; every rank gets the staged
 * listing in out->csv (open it with root NULL) and mapping in out->synsets
 * ("" in the path,label layout); res is filled on the copying ranks. */
px_status px_stage_images(px_comm *comm, const char *stage_dir, const px_image_opts *src, px_stage_verify verify,
                          px_staged_images *out, px_stage_result *res);

/* ---- HDF5 ------------------------------------------------------------------
 * One HDF5 file (Debian's libhdf5), in one of two layouts:
 *   images: x names an (N, H, W) or (N, C, H, W) dataset of uint8 or float32
 *           images, y an (N,) dataset of integer labels (any integer type).
 *           Sample i: x = (N-slice i) as (C, H, W) f32 (C = 1 for (N, H, W)),
 *           uint8: (v/255 - mean[c]) / std[c], exactly as the IDX source
 *           computes it; float32: (v - mean[c]) / std[c].  y = label i (i32).
 *           C = 3 takes mean/std per channel; any other C takes mean[0],
 *           std[0] for every channel.  The labels are read and checked at
 *           open (in [0, num_classes), num_classes 0: largest label + 1).
 *   tokens: x names a 1-D dataset of integer tokens (uint16, uint32, int32,
 *           any integer type), read as one token stream and cut into
 *           windows of T+1 tokens exactly as px_token_dataset_open cuts one
 *           shard (same sample count, same random offsets from the sample's
 *           stream), each token checked against vocab_size.
 * Samples are read when the loader asks for them, from contiguous or
 * chunked and compressed datasets (deflate; whatever filters the library
 * has): one hyperslab (H5Sselect_hyperslab) per image or window, except
 * that a chunked image dataset whose chunks hold whole samples is read a
 * chunk at a time into a cache of decompressed chunks (cache_bytes; shuffled
 * reads then decompress each chunk about once an epoch when they all fit).
 * Every HDF5 call of plexus takes one process-wide lock (a libhdf5 built
 * without thread safety must not be entered by two threads; one built with
 * it, as Debian's is, serialises its calls itself), so the loader's workers
 * read chunked datasets one at a time; their conversion and normalisation
 * run in parallel.  A contiguous, unfiltered dataset stored in the
 * machine's byte order (u8, little-endian f32 / u16 / u32 / i32 on x86) is
 * read without the library: its raw data's file offset (H5Dget_offset) is
 * taken at open and get reads the sample with pread, in parallel, no lock
 * (library_reads turns this off).  Errors
 * name the file and the dataset: a missing dataset (with the names the file
 * holds), a wrong rank, shape or type ("hdf5: dataset 'labels' in f.h5:
 * expected 1 dimension of N=60000 integers, found (60000, 2) float64"), a
 * label or token out of range.  An s3:// path is PX_ERR_UNSUPPORTED
 * (libhdf5 reads local files): stage it (px_stage_source, kind "hdf5"). */
typedef enum px_hdf5_layout { PX_HDF5_IMAGES = 0, PX_HDF5_TOKENS } px_hdf5_layout;

typedef struct px_hdf5_opts {
  const char *path; /* the HDF5 file */
  px_hdf5_layout layout;
  const char *x;         /* images or tokens dataset (a path in the file: "images", "/train/x") */
  const char *y;         /* images layout: the labels dataset */
  float mean[3], std[3]; /* images layout: normalisation (above) */
  size_t num_classes;    /* images layout: labels in [0, num_classes); 0: largest label + 1 */
  int64_t T;             /* tokens layout: window length */
  bool random_offset;    /* tokens layout: a random start offset in [0, T) per sample and epoch */
  size_t vocab_size;     /* tokens layout: tokens in [0, vocab_size) (0: int32 range); num_classes */
  size_t cache_bytes;    /* decompressed chunks kept per dataset (0: 64 MiB; must hold 2 chunks, else
                                   per-sample reads) */
  bool library_reads;    /* read contiguous datasets through libhdf5 too (see above) */
} px_hdf5_opts;

#define PX_HDF5_DEFAULTS                    \
  ((px_hdf5_opts){.path = NULL,             \
                  .layout = PX_HDF5_IMAGES, \
                  .x = "images",            \
                  .y = "labels",            \
                  .mean = {0, 0, 0},        \
                  .std = {1, 1, 1},         \
                  .num_classes = 0,         \
                  .T = 0,                   \
                  .random_offset = false,   \
                  .vocab_size = 0,          \
                  .cache_bytes = 0,         \
                  .library_reads = false})

/* Opens the file and its datasets and checks their rank, shape and type
 * (and, images layout, every label); the file stays open until the dataset
 * is freed. */
px_status px_hdf5_dataset_open(px_dataset **out, const px_hdf5_opts *opts);
/* Whether the linked libhdf5 is thread-safe (H5is_library_threadsafe); plexus serialises its calls either
 * way. */
bool px_hdf5_library_threadsafe(void);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
