/* plexus/io.h — safetensors read and write, atomic file writes, checkpoints.
 *
 * safetensors layout: u64 little-endian header size N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
 *  "__metadata__": {"key": "value"}}, then the data, offsets relative to
 * the end of the header.  Files written here load in PyTorch and Hugging
 * Face, and theirs load here.
 *
 * io/ knows tensors, not models: a model hands over its state as a
 * px_state_dict (px_model_state_dict) of views into its flat buffers. */
#ifndef PLEXUS_IO_H
#define PLEXUS_IO_H

#include "plexus/comm.h"
#include "plexus/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exported from libplexus.so, which hides everything else (-fvisibility=hidden). */
#pragma GCC visibility push(default)

/* ---- Reading: an opened file whose tensors are views of its bytes ------- */
typedef struct px_safetensors px_safetensors;

/* Reads and validates the whole file: header JSON, dtypes, shapes, that
 * every offset lies inside the body, that byte sizes match shapes, and that
 * tensors do not overlap.  Errors name the file and the tensor. */
px_status px_safetensors_open(const char *path, px_safetensors **out);
void px_safetensors_close(px_safetensors *f);
int px_safetensors_count(const px_safetensors *f);
/* Tensor i: name and a view of its bytes (little-endian, as stored). */
const px_named_tensor *px_safetensors_get(const px_safetensors *f, int i);
/* NULL if absent. */
const px_named_tensor *px_safetensors_find(const px_safetensors *f, const char *name);
/* Value of a "__metadata__" key, or NULL. */
const char *px_safetensors_metadata(const px_safetensors *f, const char *key);
const char *px_safetensors_path(const px_safetensors *f);

/* ---- Whole state dicts ----------------------------------------------------
 * save: all tensors of sd (+ optional metadata pairs), written atomically.
 * load: fills every tensor of sd from the file, all or nothing: it first
 * checks that each name is present with the same dtype and shape, then
 * copies.  With strict, a tensor in the file that sd lacks is an error too
 * (except PyTorch's "*.num_batches_tracked", which plexus does not keep). */
typedef struct px_kv {
  const char *key;
  const char *value;
} px_kv;

/* Write sd (and metadata key/values) as a safetensors file, atomically; load fills sd's tensors
 * from a file by name (strict: every file tensor must be in sd), checking dtypes and shapes. */
px_status px_safetensors_save(const char *path, const px_state_dict *sd, const px_kv *metadata, int n_metadata);
px_status px_safetensors_load(const char *path, const px_state_dict *sd, bool strict);

/* Save on rank 0 only (the course's save0), then tell every rank how it
 * went: all ranks return rank 0's status.  Collective over comm. */
px_status px_safetensors_save0(px_comm *comm, const char *path, const px_state_dict *sd, const px_kv *metadata,
                               int n_metadata);

/* Atomic writes: px_write_file_atomic, in plexus/base.h. */

/* SHA-256 of n bytes as 64 lowercase hex digits and a NUL, the digest
 * SHA256SUMS lists (`sha256sum` prints the same). */
void px_digest_sha256(const void *data, size_t n, char hex[65]);

/* ---- Checkpoints -------------------------------------------------------------
 * A checkpoint is a directory <dir>/step_<step, 8 digits or more>/ holding
 * the caller's files and SHA256SUMS ("<64 hex>  <name>\n" per file), which
 * `sha256sum -c SHA256SUMS` checks.  It is written into
 * <dir>/.step_<step>.partial.<host>.<pid>/ (files fsynced, SHA256SUMS last,
 * the directory fsynced), then renamed to step_<step> and <dir> fsynced: a
 * crash leaves a complete step directory or a .partial one that readers
 * ignore.  Writing a step that exists swaps the new directory in before the
 * old one is deleted.  docs/CHECKPOINTS.md has the whole story. */
typedef struct px_ckpt_item {
  const char *name;             /* file name in the checkpoint: "model.safetensors" */
  const px_state_dict *tensors; /* written as safetensors when not NULL ... */
  const px_kv *metadata;        /* ... with these metadata pairs */
  int n_metadata;
  const void *bytes; /* else written as these bytes */
  size_t n_bytes;
} px_ckpt_item;

/* Write step's checkpoint (dir is created if missing), then keep only the
 * keep_last newest complete checkpoints in dir (0: keep all): a checkpoint
 * is deleted when keep_last complete ones newer than it exist, but never the
 * newest nor the one just written; .partial directories of dead writers on
 * this host are removed.  Names: at least one item, each a plain file name
 * (no '/', no "..", not starting with '.', not "SHA256SUMS", no control
 * characters or '\\'), no two alike.  path_out (may be NULL) receives the
 * checkpoint's path.  When only the rotation fails, the checkpoint is
 * complete, path_out is set, and the error says so. */
px_status px_checkpoint_write(const char *dir, int64_t step, const px_ckpt_item *items, int n_items, int keep_last,
                              char *path_out, size_t cap);
/* Collective: rank 0 writes, every rank returns rank 0's status and message
 * (as px_safetensors_save0); every rank's path_out receives the path.  A
 * NULL comm is a world of one. */
px_status px_checkpoint_write0(px_comm *comm, const char *dir, int64_t step, const px_ckpt_item *items, int n_items,
                               int keep_last, char *path_out, size_t cap);
/* SHA256SUMS present and well formed, every file listed there present with
 * the same SHA-256, no file in the directory that SHA256SUMS does not list,
 * no listed name with a '/' or "..".  Errors (PX_ERR_FORMAT; PX_ERR_NOT_FOUND
 * when there is no such directory) name the checkpoint, the file, and the
 * expected and found hashes. */
px_status px_checkpoint_verify(const char *ckpt_path);
/* The newest step_* directory in dir that verifies; PX_ERR_NOT_FOUND when
 * there is none (also when dir does not exist).  note (may be NULL)
 * receives one line per thing skipped: a .partial directory ("incomplete: a
 * writer was interrupted"), a checkpoint that failed verification (with the
 * reason), so the caller can print it; "" when nothing was skipped. */
px_status px_checkpoint_latest(const char *dir, char *path_out, size_t cap, char *note, size_t note_cap);
/* Read one file of a checkpoint whole, checking its SHA-256 against
 * SHA256SUMS; *bytes is malloc'ed (the caller frees it). */
px_status px_checkpoint_read_file(const char *ckpt_path, const char *name, void **bytes, size_t *n);
/* Load a safetensors file of a checkpoint into sd (as px_safetensors_load),
 * after checking its SHA-256; the file is read once. */
px_status px_checkpoint_load_tensors(const char *ckpt_path, const char *name, const px_state_dict *sd, bool strict);

/* ---- Sharded checkpoints ---------------------------------------------------
 * Collective: every rank writes its own items into one checkpoint (names
 * distinct across ranks: "optim.rank00001-of-00004.safetensors"); rank 0
 * makes the .partial directory, and after every rank has written and
 * fsynced its files, gathers every rank's list of pieces (small) and writes
 * the index "metadata.json" (every tensor's dtype, global shape, and the
 * boxes, flat ranges, byte ranges and CRC-32C of its pieces in every file;
 * a plain state dict's tensors as whole pieces) when any rank wrote
 * safetensors, then SHA256SUMS (rank 0's files first, then rank 1's, ...,
 * metadata.json last), installs and rotates as px_checkpoint_write does:
 * the index is the last data file, by one rank, and the rename of the
 * .partial directory is the commit.  No item may be named "metadata.json".
 * All ranks must
 * see the same file system at dir (one node, or a shared file system).  A
 * rank that fails makes every rank return its status and message (the
 * lowest failing rank's), and no checkpoint appears.  A rank may pass no
 * items.  A NULL comm is a world of one. */
px_status px_checkpoint_write_all(px_comm *comm, const char *dir, int64_t step, const px_ckpt_item *items, int n_items,
                                  int keep_last, char *path_out, size_t cap);

/* A piece of a named tensor (DESIGN decision 8: a shard is a box of a named
 * global tensor).  Version 2 of the pieces format: a piece is the flat
 * range [offset, offset + count) of a BOX of the tensor `key` whose whole
 * (global) shape is `shape`:
 *   box_offset[d], box_size[d]  for d < ndim: the box's corner and extent in
 *                               the global tensor (a tensor-parallel column
 *                               block: box_offset = {0, c0}, box_size =
 *                               {rows, w});
 *   offset, count               a flat range of the box in ITS row-major
 *                               order (a ZeRO slice of this rank's box);
 *   data                        count floats, contiguous, in that order.
 * box_size all zero (a zero-initialised piece) means the whole tensor, so a
 * version-1 piece (a flat range of the whole tensor: ZeRO over DDP) is the
 * special case, and version-1 files still load.  key is independent of the
 * layout: "h.0.attn.c_attn.weight" for a parameter,
 * "exp_avg.h.0.attn.c_attn.weight" for optimizer state. */
typedef struct px_tensor_piece {
  char key[PX_NAME_MAX + 32];
  int ndim;
  int64_t shape[PX_MAX_DIMS];
  int64_t box_offset[PX_MAX_DIMS];
  int64_t box_size[PX_MAX_DIMS]; /* all 0: the whole tensor */
  size_t offset, count;
  float *data; /* count floats (F32) */
} px_tensor_piece;

/* The pieces as a safetensors file: tensor k is named "<key>@<offset>" (a
 * whole-tensor box) or "<key>[a:b, c:d]@<offset>" (a box), of shape
 * (count,), a view of data; *pieces_json (malloc'ed) is the value of the
 * "pieces" metadata key, {"<tensor name>": {"key": .., "dtype": "F32",
 * "shape": [..], "box_offset": [..], "box_size": [..], "offset": ..,
 * "count": ..}, ...} (box_offset and box_size only for a box that is not
 * the whole tensor), which readers use to put the pieces back.  Pieces of
 * count 0 are left out (they hold nothing; two of one key would share a
 * name).  Version 2 (boxes); readers take versions 1 and 2. */
#define PX_PIECES_FORMAT "plexus-pieces"
#define PX_PIECES_VERSION "2"
/* The pieces as a state dict of their names and the pieces JSON (above) describing them; *pieces_json
 * is malloc'd. */
px_status px_pieces_state_dict(const px_tensor_piece *pieces, int n, px_state_dict *sd, char **pieces_json);

/* Load pieces from a checkpoint's file written with the same pieces (the
 * same layout): the file must hold exactly these names, ranges and shapes
 * (checked against SHA256SUMS first).  Errors name the file and the piece. */
px_status px_checkpoint_load_pieces(const char *ckpt_path, const char *name, const px_tensor_piece *pieces, int n);

/* Assemble whole tensors from pieces: every file of the checkpoint whose
 * name starts with `prefix` and ends in ".safetensors" ("model.rank" takes
 * model.rank00000-of-00004.safetensors, ...) is read (checked against
 * SHA256SUMS) and its pieces are copied into the tensors of sd with the
 * same key and shape.  Every element of every tensor of sd must be covered
 * exactly once; a piece of a tensor sd lacks is an error with strict.
 * (Loading a sharded checkpoint into one process.) */
px_status px_checkpoint_assemble(const char *ckpt_path, const char *prefix, const px_state_dict *sd, bool strict);

/* Load by intersection (resharding): fill each wanted piece (a flat range of
 * a box of a named tensor, any layout: a ZeRO slice of any world size and
 * stage, a tensor-parallel block, or a whole tensor) from whatever the
 * checkpoint's files "<prefix>*.safetensors" hold.  A file is either a file
 * of pieces (any saved layout, versions 1 and 2) or a plain state dict
 * (DDP's model.safetensors, optim.safetensors: each tensor the piece
 * [0, numel) of itself).  With an index (metadata.json, checked against
 * SHA256SUMS) only the files holding a piece that overlaps a wanted one are
 * opened, and of them only the header and those pieces are read, each
 * checked against the index (header CRC-32C, names, boxes, byte ranges) and
 * its own CRC-32C; without one (checkpoints of version 1, and of DDP) every
 * file is read whole and checked against SHA256SUMS.  A wanted box and a
 * saved box are intersected by contiguous runs of the last dimension.
 * Saved pieces of keys nothing wants are skipped.  Every wanted element must
 * be found in exactly one saved piece, with the same whole shape: a hole
 * (a missing rank's file) or an overlap is PX_ERR_FORMAT naming the tensor,
 * the elements and the file.  All or nothing: on error no wanted piece has
 * changed. */
px_status px_checkpoint_load_boxes(const char *ckpt_path, const char *prefix, const px_tensor_piece *want, int n);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
