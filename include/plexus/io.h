/* plexus/io.h — safetensors read and write, atomic file writes.
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

px_status px_safetensors_save(const char *path, const px_state_dict *sd,
                              const px_kv *metadata, int n_metadata);
px_status px_safetensors_load(const char *path, const px_state_dict *sd, bool strict);

/* Save on rank 0 only (the course's save0), then tell every rank how it
 * went: all ranks return rank 0's status.  Collective over comm. */
px_status px_safetensors_save0(px_comm *comm, const char *path, const px_state_dict *sd,
                               const px_kv *metadata, int n_metadata);

/* ---- Atomic writes ---------------------------------------------------------
 * Write to "<path>.tmp.<pid>", fsync, rename over path, fsync the directory:
 * a crash leaves the old file or the new one, never a torn one. */
px_status px_write_file_atomic(const char *path, const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif
