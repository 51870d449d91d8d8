// Checkpoint directories, internal to the io layer: names, listing, the
// SHA256SUMS file, rotation.  The public contract is in plexus/io.h; the
// files are checkpoint_dir.c (names, listing, removal, rotation),
// checkpoint_sums.c (SHA256SUMS), checkpoint_read.c (verify, latest, reads),
// checkpoint_write.c (write, write0), checkpoint_sharded.c (write_all),
// checkpoint_pieces.c (files of pieces, format versions 1 and 2),
// checkpoint_boxes.c (box intersection, the loader), checkpoint_index.c
// (metadata.json: written by rank 0, read to load only what is needed) and
// crc32c_fast.c (the index's checksums).
//
//   <dir>/step_00001200/                      a complete checkpoint
//   <dir>/.step_00001300.partial.<host>.<pid>/  being written (or a crash)
//   <dir>/.step_00001200.old.<host>.<pid>/      a replaced checkpoint, set
//                                               aside only where the file
//                                               system cannot swap two
//                                               directories atomically
#ifndef PX_IO_CHECKPOINT_H
#define PX_IO_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>

#include "io/internal.h"
#include "io/sha256.h"
#include "plexus/io.h"

#define PX_CKPT_SUMS "SHA256SUMS"
#define PX_CKPT_NAME_MAX 255         // longest file name (NAME_MAX on Linux)
#define PX_CKPT_SUMS_MAX (1u << 20)  // a SHA256SUMS longer than this is not ours
#define PX_CKPT_HOST_MAX 64

/* ---- names (checkpoint_dir.c) ------------------------------------------- */

// "step_00000042" for 42: at least 8 digits.  out holds 32 bytes.
void px_ckpt_step_name(int64_t step, char out[32]);
// The step of a canonical step directory name (exactly what
// px_ckpt_step_name makes: "step_42" and "step_000000042" are not ours).
bool px_ckpt_parse_step_name(const char *name, int64_t *step);

typedef enum px_ckpt_temp_kind { PX_CKPT_PARTIAL, PX_CKPT_OLD } px_ckpt_temp_kind;

typedef struct px_ckpt_temp {
  int64_t step;
  px_ckpt_temp_kind kind;
  char host[PX_CKPT_HOST_MAX + 1];
  long pid;
} px_ckpt_temp;

// ".step_<8 digits>.<partial|old>.<host>.<pid>"; out holds 384 bytes.
void px_ckpt_temp_name(int64_t step, px_ckpt_temp_kind kind, const char *host, long pid, char *out, size_t cap);
bool px_ckpt_parse_temp_name(const char *name, px_ckpt_temp *out);

// This machine's name as it appears in temporary names: gethostname with
// anything but [A-Za-z0-9._-] turned into '_', at most PX_CKPT_HOST_MAX.
void px_ckpt_host(char out[PX_CKPT_HOST_MAX + 1]);
// Whether process pid exists on this host (EPERM counts as alive).
bool px_ckpt_pid_alive(long pid);

// A file name the checkpoint may hold (see px_checkpoint_write); else
// false with *why set to the reason.
bool px_ckpt_name_ok(const char *name, const char **why);

/* ---- listing (checkpoint_dir.c) ----------------------------------------- */

typedef struct px_ckpt_entry {
  char name[PX_CKPT_NAME_MAX + 1];
  bool is_temp;  // else a step directory
  int64_t step;
  px_ckpt_temp temp;  // when is_temp
} px_ckpt_entry;

typedef struct px_ckpt_listing {
  px_ckpt_entry *entries;  // step directories newest first, then temporaries
  int n_steps, n_temps;
} px_ckpt_listing;

// The directories of dir whose names are ours (symbolic links and other
// files are not listed: they are not ours).  PX_ERR_NOT_FOUND when dir does
// not exist.
px_status px_ckpt_list(const char *dir, px_ckpt_listing *out);
void px_ckpt_listing_free(px_ckpt_listing *l);

// rm -r path, never following symbolic links.
px_status px_ckpt_remove_tree(const char *path);

/* ---- writing helpers (checkpoint_write.c), shared with the collective
 * writer (checkpoint_sharded.c) ------------------------------------------- */

// fsync a directory (file systems that cannot are let be); ckpt names the
// checkpoint in messages.
px_status px_ckpt_fsync_dir(const char *dir, const char *ckpt);
// mkdir -p dir (modified in place while walking it, restored), each new
// directory fsynced in its parent.
px_status px_ckpt_make_dirs(char *dir, const char *ckpt);
// Writes the concatenation of chunks to path (a new file), fsynced, and its
// SHA-256 into digest; errors name the checkpoint and the file.
px_status px_ckpt_write_file(const char *path, const char *ckpt, const char *name, const px_io_chunk *chunks, int n,
                             unsigned char digest[PX_SHA256_BYTES]);
// px_ckpt_write_file that also gives each chunk's CRC-32C into crcs (n
// entries), computed in the same pass over the bytes as the SHA-256.
px_status px_ckpt_write_file_crc(const char *path, const char *ckpt, const char *name, const px_io_chunk *chunks, int n,
                                 unsigned char digest[PX_SHA256_BYTES], uint32_t *crcs);
// A chunk of a written file and its CRC-32C (the index's piece checksums,
// taken while writing rather than in a second pass).
typedef struct px_ckpt_chunk_crc {
  const void *data;
  size_t size;
  uint32_t crc;
} px_ckpt_chunk_crc;
// px_ckpt_write_item that also gives the CRC-32C of each chunk of a
// safetensors item (malloc'ed into *crcs, *n_crcs entries; NULL, 0 for bytes).
px_status px_ckpt_write_item_crc(const char *tmp, const char *final, const px_ckpt_item *it, char hex[PX_SHA256_HEX],
                                 px_ckpt_chunk_crc **crcs, int *n_crcs);
// One item (a safetensors image or raw bytes) written as tmp/<name>, fsynced,
// its SHA-256 in hex into hex; messages name final/<name>.
px_status px_ckpt_write_item(const char *tmp, const char *final, const px_ckpt_item *it, char hex[PX_SHA256_HEX]);
// Every item written as px_ckpt_write_item_crc does (hex[i] for items[i];
// crcs and n_crcs may be NULL, else crcs[i], n_crcs[i] for items[i], each
// the caller's to free, also after a failure), the large ones at the same
// time, each on a thread of its own (with its own hashing thread): their
// hashing and the disk's writeback of each overlap the others', and one
// flush of the disk's cache serves the fsyncs that wait together.  On a
// failure, the first failed item's error (every write is waited for).
px_status px_ckpt_write_items(const char *tmp, const char *final, const px_ckpt_item *items, int n_items,
                              char (*hex)[PX_SHA256_HEX], px_ckpt_chunk_crc **crcs, int *n_crcs);
// Item names are valid and distinct (see px_checkpoint_write).
px_status px_ckpt_check_items(const px_ckpt_item *items, int n_items);
// dir without trailing slashes, malloc'ed (NULL: out of memory).
char *px_ckpt_clean_dir(const char *dir);
// "<dir>/step_<step>" into out; false when it does not fit.
bool px_ckpt_step_path(const char *dir, int64_t step, char *out, size_t cap);

/* ---- install (checkpoint_write.c) ---------------------------------------- */

// The complete, fsynced directory tmp becomes final (<dir>/step_<step>).
// When final exists: with swap, one renameat2(RENAME_EXCHANGE) where the
// file system has it, else (or without swap: for tests of that path) final
// is renamed aside to .step_<step>.old.<host>.<pid>, then tmp to final.
// *old_left receives the directory that now holds the replaced checkpoint,
// for the caller to delete ("" if none).  dir is not fsynced here.
px_status px_ckpt_install(const char *dir, const char *tmp, const char *final, int64_t step, bool swap, char *old_left,
                          size_t cap);

// Rotation after step `written` was written: see px_checkpoint_write.
px_status px_ckpt_rotate(const char *dir, int64_t written, int keep_last);

/* ---- SHA256SUMS (checkpoint_sums.c) -------------------------------------- */

typedef struct px_ckpt_sum {
  char name[PX_CKPT_NAME_MAX + 1];
  unsigned char digest[PX_SHA256_BYTES];
} px_ckpt_sum;

typedef struct px_ckpt_sums {
  px_ckpt_sum *items;  // in file order
  int n;
} px_ckpt_sums;

// Reads and parses ckpt/SHA256SUMS.  Errors name the checkpoint and line.
px_status px_ckpt_sums_read(const char *ckpt, px_ckpt_sums *out);
void px_ckpt_sums_free(px_ckpt_sums *s);
// Without hashing: every listed file is present as a regular file, and the
// directory holds nothing SHA256SUMS does not list.
px_status px_ckpt_check_files(const char *ckpt, const px_ckpt_sums *sums);
// The entry of s for file `name`, or NULL.
const px_ckpt_sum *px_ckpt_sum_find(const px_ckpt_sums *s, const char *name);

/* ---- pieces and boxes (checkpoint_pieces.c, checkpoint_boxes.c) ---------- */

// A piece with its box spelled out (box_size all zero turned into the
// whole tensor; a 0-d tensor is a box of shape (1,)): what the box
// arithmetic works on.  key points into the piece or the JSON it came from.
typedef struct px_ckpt_box {
  const char *key;
  int ndim;         // >= 1 (a 0-d tensor is one of shape (1,))
  int tensor_ndim;  // the tensor's own: 0 for a 0-d tensor
  int64_t shape[PX_MAX_DIMS];
  int64_t off[PX_MAX_DIMS], size[PX_MAX_DIMS];
  size_t offset, count;  // the flat range of the box
} px_ckpt_box;

// p's box, checked: inside the shape, the range inside the box.  false with
// a reason in why (for a message) when it is not.
bool px_ckpt_box_of(const px_tensor_piece *p, px_ckpt_box *out, char *why, size_t cap);
// Whether the box is the whole tensor.
bool px_ckpt_box_whole(const px_ckpt_box *b);
// "[0:64, 128:192]" (empty for a whole box) into out.
void px_ckpt_box_str(const px_ckpt_box *b, char *out, size_t cap);
// Whether the elements of a and b (same key and shape) overlap.
bool px_ckpt_box_overlap(const px_ckpt_box *a, const px_ckpt_box *b);

// One entry of a file's "pieces" table (version 1 or 2), read and checked.
typedef struct px_ckpt_piece_entry {
  const char *name;  // the tensor's name in the file
  px_ckpt_box box;   // key points into the JSON
} px_ckpt_piece_entry;

// Reads the "pieces" table of f (format and version checked: "1" or "2")
// into *table (a cJSON object; the caller deletes it).
struct cJSON;
px_status px_ckpt_pieces_table(const px_safetensors *f, struct cJSON **table);
px_status px_ckpt_pieces_table_json(const char *path, const char *format, const char *version, const char *json,
                                    struct cJSON **table);
px_status px_ckpt_piece_entry_read(const struct cJSON *e, const char *file, int version, px_ckpt_piece_entry *out);
// The version of a "pieces" table px_ckpt_pieces_table accepted: 1 or 2.
int px_ckpt_pieces_version(const px_safetensors *f);

// Loading by intersection: the wanted pieces, a staging buffer, and what
// every saved piece fed so far covered.
typedef struct px_ckpt_hit px_ckpt_hit;
typedef struct px_ckpt_loader {
  const char *ckpt, *prefix;
  const px_tensor_piece *want;
  px_ckpt_box *wbox;
  int n;
  float **stage;
  float *buf;
  size_t buf_bytes;  // mapped with mmap when buf_mapped (huge pages where the kernel gives them)
  bool buf_mapped;
  px_ckpt_hit *hits;
  size_t n_hits, cap_hits;
  bool strict;  // a saved piece of a key nothing wants is an error
  void **maps;  // files mapped read-only (px_ckpt_loader_keep_map), unmapped by _free
  size_t *map_len;
  int n_maps, cap_maps;
} px_ckpt_loader;

px_status px_ckpt_loader_init(px_ckpt_loader *L, const char *ckpt, const char *prefix, const px_tensor_piece *want,
                              int n, bool strict);
void px_ckpt_loader_free(px_ckpt_loader *L);
// Whether any wanted piece shares an element with the saved box s.
bool px_ckpt_loader_needs(const px_ckpt_loader *L, const px_ckpt_box *s, bool *key_known);
// A saved piece s, its count F32 values at data (little-endian, any
// alignment), from file `file` (named in messages): copies what overlaps
// each wanted piece into staging.  path names the file in messages.
px_status px_ckpt_loader_add(px_ckpt_loader *L, const char *path, const char *file, const px_ckpt_box *s,
                             const unsigned char *data);
// Where a saved piece s can be read straight into staging: when s shares
// elements with exactly one wanted piece, which has the same box and holds
// s's whole flat range, the staging address of s's first element (s's
// count floats from there), and that piece's index in *w; else NULL (the
// bytes then go through px_ckpt_loader_add).
float *px_ckpt_loader_direct(const px_ckpt_loader *L, const px_ckpt_box *s, int *w);
// Records that s's elements were read into the staging address that
// px_ckpt_loader_direct gave for wanted piece w (from file `file`).
px_status px_ckpt_loader_took(px_ckpt_loader *L, int w, const px_ckpt_box *s, const char *file);
// Records that s's elements, checked, are at src (s's count floats, in a
// file mapping the loader keeps: px_ckpt_loader_keep_map), for wanted piece
// w as px_ckpt_loader_direct found it: px_ckpt_loader_finish copies them
// from there into the caller's memory, without staging them.
px_status px_ckpt_loader_took_from(px_ckpt_loader *L, int w, const px_ckpt_box *s, const char *file,
                                   const unsigned char *src);
// The loader keeps the mapping [map, map + len) until px_ckpt_loader_free
// (which unmaps it); on failure the caller still owns it.
px_status px_ckpt_loader_keep_map(px_ckpt_loader *L, void *map, size_t len);
// Every wanted element found exactly once, then copied out (all or nothing).
px_status px_ckpt_loader_finish(px_ckpt_loader *L);

/* ---- the checkpoint's index (checkpoint_index.c) -------------------------- */

#define PX_CKPT_INDEX "metadata.json"
#define PX_CKPT_INDEX_FORMAT "plexus-checkpoint-index"
#define PX_CKPT_INDEX_VERSION 1

// CRC-32C (Castagnoli) of n bytes, continuing crc (0 to start): the
// per-piece checksum of the index (SSE4.2's crc32 instruction where the CPU
// has it).
uint32_t px_ckpt_crc32c(uint32_t crc, const void *data, size_t n);
// The table-driven path alone (what a CPU without SSE4.2 runs), for tests.
uint32_t px_ckpt_crc32c_portable(uint32_t crc, const void *data, size_t n);
// The CRC-32C of A followed by B from crc_a = CRC(A) and crc_b = CRC(B), B
// of len_b bytes (zlib's crc32_combine with Castagnoli's polynomial).
uint32_t px_ckpt_crc32c_combine(uint32_t crc_a, uint32_t crc_b, size_t len_b);
// px_ckpt_crc32c(0, data, n), from PX_CKPT_CRC_WIDE_MIN bytes on with the
// second half on a thread of its own (the two joined with _combine): a
// loader checks a large piece at twice the speed where a core is free.
#define PX_CKPT_CRC_WIDE_MIN ((size_t)8 << 20)
uint32_t px_ckpt_crc32c_wide(const void *data, size_t n);

// This rank's part of the index: a JSON array, one entry per piece (or
// whole tensor) of its safetensors items, malloc'ed into *json.
px_status px_ckpt_index_part(const px_ckpt_item *items, int n_items, int rank, char **json);
// The same, with each item's chunk CRCs from px_ckpt_write_item_crc (crcs[i]
// for items[i]; may be NULL): a piece whose bytes are such a chunk takes its
// CRC from there instead of reading the bytes again.
px_status px_ckpt_index_part_crc(const px_ckpt_item *items, int n_items, int rank, px_ckpt_chunk_crc *const *crcs,
                                 const int *n_crcs, char **json);
// Rank 0: the index from every rank's part, written as tmp/metadata.json
// (fsynced), its SHA-256 in hex.
px_status px_ckpt_index_write(const char *tmp, const char *final, char *const *parts, int world, int64_t step,
                              char hex[PX_SHA256_HEX]);
// Load through the index: only files with pieces L needs are opened, and of
// them only the header and those pieces' bytes are read, each piece checked
// against its CRC-32C.  *used is false (and nothing read) when the
// checkpoint has no index.  *files counts the files of L's prefix.
px_status px_ckpt_index_load(px_ckpt_loader *L, const px_ckpt_sums *sums, bool *used, int *files);

#endif
