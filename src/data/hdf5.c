// The HDF5 dataset (data.h, px_hdf5_dataset_open): images and labels, or a
// token array, read from one HDF5 file through Debian's libhdf5.
//
// Reading.  A sample is one hyperslab: image i is the block
// [i, 0, 0(, 0)] of shape (1, H, W) or (1, C, H, W); token window s is
// [s, s + T].  Three ways to read it, chosen at open:
//  - a contiguous, unfiltered dataset in the machine's own type and byte
//    order is read directly: the file offset of its raw data
//    (H5Dget_offset) is taken at open, and sample i is one pread of its
//    bytes, no lock (libhdf5's own cost per read is most of the time of a
//    28x28 image otherwise: docs/PERFORMANCE.md, "Figures behind code
//    comments");
//  - a chunked image dataset whose chunks hold whole samples is read a
//    chunk at a time into a direct-mapped cache of decompressed chunks
//    (setup_chunk_cache): one library call and one decompression per chunk
//    while the cache holds it, not per sample;
//  - anything else (other chunk shapes, big-endian or converted types,
//    token arrays that are chunked, library_reads) by H5Sselect_hyperslab +
//    H5Dread per sample, through libhdf5's chunk cache (cache_bytes), which
//    decompresses deflate chunks (or any filter it was built with).
// Labels are small (N integers): they are read whole at open and checked
// there, like the IDX source's.
//
// Threads.  HDF5's library has global state (its error stack, identifier
// tables, chunk caches), and only a build configured with
// --enable-threadsafe may be called from two threads at once; that build
// serialises every API call under its own global lock.  Debian bookworm's
// "serial" libhdf5 1.10.8 is such a build (h5cc -showconfig: "Threadsafety:
// yes"; H5is_library_threadsafe() is true), other builds are not.  So every
// HDF5 call here runs under one process-wide mutex (h5_lock), whichever
// dataset it is for, and it is correct with either build; it also guards
// the dataset's one file dataspace, whose selection each read sets.  The
// loader's workers read one at a time (no parallelism is lost: the library
// would serialise them anyway), and convert and normalise their rows (uint8
// -> f32 through a lookup table, int -> i32 tokens with the vocabulary
// check) outside the lock, in parallel.  A program that calls a non-thread-
// safe HDF5 itself while a loader runs must do it from one thread between
// epochs: the mutex is private to plexus.
//
// Errors name the file and the dataset; inside the lock, HDF5's automatic
// printing of its error stack to stderr is turned off and put back after.
#define _POSIX_C_SOURCE 200809L
#include "plexus/data.h"

#include "data/s3.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pthread_mutex_t h5_lock = PTHREAD_MUTEX_INITIALIZER;
#define PX_HDF5_CACHE_DEFAULT ((size_t)64 << 20)  // data.h: px_hdf5_opts.cache_bytes

typedef struct h5_quiet {
  H5E_auto2_t func;
  void *data;
} h5_quiet;

// Take the lock and silence HDF5's error printing (our messages say it).
static void h5_enter(h5_quiet *q) {
  pthread_mutex_lock(&h5_lock);
  q->func = NULL;
  q->data = NULL;
  H5Eget_auto2(H5E_DEFAULT, &q->func, &q->data);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

static void h5_leave(h5_quiet *q) {
  H5Eset_auto2(H5E_DEFAULT, q->func, q->data);
  pthread_mutex_unlock(&h5_lock);
}

bool px_hdf5_library_threadsafe(void) {
  hbool_t ts = 0;
  h5_quiet q;
  h5_enter(&q);
  herr_t r = H5is_library_threadsafe(&ts);
  h5_leave(&q);
  return r >= 0 && ts;
}

typedef struct h5_source {
  char *path;
  char *xname;
  hid_t file, dset, fspace, mspace;  // mspace: one sample
  int fd;                            // direct reads: the file, for pread (else -1)
  int64_t direct_off;                // direct reads: file offset of the x dataset's raw data (else -1)
  hid_t tok_type;                    // tokens, direct reads: the native type the file holds
  size_t tok_bytes;
  // Images in a chunked dataset whose chunks hold whole samples: a cache of
  // decompressed chunk rows (chunk_n samples each), used under the lock.
  size_t chunk_n;  // samples per chunk along N (0: no cache, per-sample library reads)
  size_t n_slots;
  int64_t *slot_chunk;       // (n_slots,) chunk number held, -1 empty; chunk c goes to slot c % n_slots
  unsigned char *slot_data;  // (n_slots, chunk_n, pixels · elem)
  hid_t chunk_mspace;
  px_hdf5_layout layout;
  int rank;  // of the x dataset
  hsize_t dims[4];
  // images
  bool is_float;                   // float32 images (else uint8)
  size_t channels, plane, pixels;  // C, H·W, C·H·W
  float mean[3], std[3];
  float lut[3][256];  // uint8: per channel (v/255 - mean) / std
  int32_t *labels;    // (N,)
  // tokens
  uint64_t num_tokens;
  int64_t T;
  bool random_offset;
  size_t vocab_size;
} h5_source;

// "uint8", "int32", "float64", "string", ... for messages.
static void type_name(hid_t t, char *buf, size_t cap) {
  H5T_class_t cls = H5Tget_class(t);
  size_t size = H5Tget_size(t);
  switch (cls) {
  case H5T_INTEGER: snprintf(buf, cap, "%sint%zu", H5Tget_sign(t) == H5T_SGN_NONE ? "u" : "", size * 8); break;
  case H5T_FLOAT: snprintf(buf, cap, "float%zu", size * 8); break;
  case H5T_STRING: snprintf(buf, cap, "string"); break;
  case H5T_COMPOUND: snprintf(buf, cap, "compound (%zu bytes)", size); break;
  case H5T_ENUM: snprintf(buf, cap, "enum"); break;
  case H5T_ARRAY: snprintf(buf, cap, "array"); break;
  case H5T_BITFIELD: snprintf(buf, cap, "bitfield"); break;
  case H5T_OPAQUE: snprintf(buf, cap, "opaque"); break;
  case H5T_REFERENCE: snprintf(buf, cap, "reference"); break;
  case H5T_VLEN: snprintf(buf, cap, "variable-length"); break;
  default: snprintf(buf, cap, "unknown type"); break;
  }
}

// "(60000, 28, 28)", "()" for a scalar.
static void shape_str(int rank, const hsize_t *dims, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "(");
  for (int k = 0; k < rank && n < cap; k++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%llu", k ? ", " : "", (unsigned long long)dims[k]);
  if (rank == 1 && n < cap) n += (size_t)snprintf(buf + n, cap - n, ",");
  if (n < cap) snprintf(buf + n, cap - n, ")");
}

typedef struct names_acc {
  char *buf;
  size_t cap, len;
  int count;
} names_acc;

static herr_t add_name(hid_t g, const char *name, const H5L_info_t *info, void *op) {
  (void)g;
  (void)info;
  names_acc *a = op;
  if (a->count < 12 && a->len < a->cap)
    a->len += (size_t)snprintf(a->buf + a->len, a->cap - a->len, "%s'%s'", a->count ? ", " : "", name);
  else if (a->count == 12 && a->len < a->cap) a->len += (size_t)snprintf(a->buf + a->len, a->cap - a->len, ", ...");
  a->count++;
  return 0;
}

// Open dataset `name` of the file (lock held); a missing one is an error
// listing what the file's root holds.
static px_status open_dset(h5_source *s, const char *name, size_t cache_bytes, hid_t *out) {
  *out = H5I_INVALID_HID;
  htri_t ok = name && *name ? H5Lexists(s->file, name, H5P_DEFAULT) : 0;
  if (ok <= 0) {
    char names[512] = "";
    names_acc a = {names, sizeof names, 0, 0};
    hsize_t idx = 0;
    H5Literate(s->file, H5_INDEX_NAME, H5_ITER_INC, &idx, add_name, &a);
    return px_error(PX_ERR_NOT_FOUND, "hdf5: no dataset '%s' in %s (its root holds %s%s)", name ? name : "", s->path,
                    a.count ? "" : "nothing", names);
  }
  hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
  if (dapl >= 0) H5Pset_chunk_cache(dapl, 12421, cache_bytes, 1.0);
  *out = H5Dopen2(s->file, name, dapl >= 0 ? dapl : H5P_DEFAULT);
  if (dapl >= 0) H5Pclose(dapl);
  if (*out < 0) {
    hid_t obj = H5Oopen(s->file, name, H5P_DEFAULT);
    H5I_type_t t = obj >= 0 ? H5Iget_type(obj) : H5I_BADID;
    if (obj >= 0) H5Oclose(obj);
    if (t == H5I_GROUP || t == H5I_DATATYPE)
      return px_error(PX_ERR_FORMAT, "hdf5: '%s' in %s is a %s, not a dataset", name, s->path,
                      t == H5I_GROUP ? "group" : "named datatype");
    return px_error(PX_ERR_IO, "hdf5: cannot open dataset '%s' in %s", name, s->path);
  }
  return PX_OK;
}

// The rank, dims and type of a dataset (lock held).  *type must be closed.
static px_status describe(h5_source *s, hid_t d, const char *name, int *rank, hsize_t dims[8], hid_t *type) {
  hid_t sp = H5Dget_space(d);
  *type = H5Dget_type(d);
  int r = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
  if (r >= 0 && r <= 8) H5Sget_simple_extent_dims(sp, dims, NULL);
  if (sp >= 0) H5Sclose(sp);
  if (r < 0 || *type < 0)
    return px_error(PX_ERR_IO, "hdf5: cannot read the shape and type of dataset '%s' in %s", name, s->path);
  if (r > 8) return px_error(PX_ERR_FORMAT, "hdf5: dataset '%s' in %s has %d dimensions", name, s->path, r);
  *rank = r;
  return PX_OK;
}

// Whether the x dataset can be read without the library (lock held): stored
// contiguous, unfiltered, not external, allocated, in `native` (the
// memory's own type and byte order), and wholly inside the file.  Then
// element k's bytes lie at file offset H5Dget_offset() + k·size, and get
// reads them with pread, in parallel, without the lock.
static void try_direct(h5_source *s, hid_t type, hid_t native, hsize_t elements, const px_hdf5_opts *o) {
  s->direct_off = -1;
  if (o->library_reads || H5Tequal(type, native) <= 0) return;
  hid_t dcpl = H5Dget_create_plist(s->dset);
  if (dcpl < 0) return;
  bool plain = H5Pget_layout(dcpl) == H5D_CONTIGUOUS && H5Pget_nfilters(dcpl) == 0 && H5Pget_external_count(dcpl) == 0;
  H5Pclose(dcpl);
  haddr_t off = plain ? H5Dget_offset(s->dset) : HADDR_UNDEF;
  struct stat sb;
  if (off == HADDR_UNDEF || stat(s->path, &sb) != 0) return;
  if ((uint64_t)off + (uint64_t)elements * H5Tget_size(native) > (uint64_t)sb.st_size) return;
  s->fd = open(s->path, O_RDONLY | O_CLOEXEC);
  if (s->fd >= 0) s->direct_off = (int64_t)off;
}

// A chunked image dataset whose chunks span whole samples ((k, C, H, W)
// or (k, H, W)) is read a chunk at a time: a read of sample i takes the
// chunk c holding it into slot c % slots of a direct-mapped cache of
// decompressed chunks (cache_bytes in all, which must hold 2; for shuffled
// reads LRU would keep no better chunks), unless the slot has it already,
// and copies the sample from there.  Shuffled reads then decompress each
// chunk about once an epoch when the cache holds the dataset, and make one
// library call per chunk, not per sample (Fashion-MNIST chunked by 64:
// 738k samples/s against 237k with a library read per sample, 1 worker,
// docs/PERFORMANCE.md).  Other chunk shapes are read per sample by the
// library.  Lock held.
static px_status setup_chunk_cache(h5_source *s, const px_hdf5_opts *o) {
  if (o->library_reads || s->direct_off >= 0) return PX_OK;
  hid_t dcpl = H5Dget_create_plist(s->dset);
  if (dcpl < 0) return PX_OK;
  hsize_t cd[8] = {0};
  int r = H5Pget_layout(dcpl) == H5D_CHUNKED ? H5Pget_chunk(dcpl, 8, cd) : -1;
  H5Pclose(dcpl);
  if (r != s->rank) return PX_OK;
  for (int k = 1; k < s->rank; k++)
    if (cd[k] != s->dims[k]) return PX_OK;
  const size_t elem = s->is_float ? 4 : 1, sample_bytes = s->pixels * elem;
  const size_t n = (size_t)cd[0], chunk_bytes = n * sample_bytes;
  const size_t budget = o->cache_bytes ? o->cache_bytes : PX_HDF5_CACHE_DEFAULT;
  if (budget / chunk_bytes < 2) return PX_OK;  // chunks too big to keep two: per-sample reads
  // The library's own chunk cache would hold the same chunks again: reopen
  // the dataset without one (a read of a whole chunk then goes straight
  // into our slot).
  hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
  hid_t again = H5I_INVALID_HID;
  if (dapl >= 0 && H5Pset_chunk_cache(dapl, 1, 0, 1.0) >= 0) again = H5Dopen2(s->file, o->x, dapl);
  if (dapl >= 0) H5Pclose(dapl);
  if (again >= 0) {
    H5Dclose(s->dset);
    s->dset = again;
  }
  size_t slots = budget / chunk_bytes;
  const size_t chunks = ((size_t)s->dims[0] + n - 1) / n;
  if (slots > chunks) slots = chunks;
  s->slot_chunk = malloc(slots * sizeof *s->slot_chunk);
  s->slot_data = malloc(slots * chunk_bytes);
  // The memory space has the file selection's shape: with another rank
  // libhdf5 maps element runs one by one (slow per element: the figure is in
  // docs/PERFORMANCE.md, "Figures behind code comments").
  hsize_t mdims[4] = {(hsize_t)n, s->dims[1], s->dims[2], s->dims[3]};
  s->chunk_mspace = H5Screate_simple(s->rank, mdims, NULL);
  if (!s->slot_chunk || !s->slot_data || s->chunk_mspace < 0)
    return px_error(PX_ERR_NOMEM, "hdf5: dataset '%s' in %s: out of memory for a cache of %zu chunks of %zu bytes",
                    o->x, s->path, slots, chunk_bytes);
  for (size_t k = 0; k < slots; k++) s->slot_chunk[k] = -1;
  s->n_slots = slots;
  s->chunk_n = n;
  return PX_OK;
}

static px_status open_images(h5_source *s, const px_hdf5_opts *o) {
  int rank;
  hsize_t dims[8] = {0};
  hid_t type;
  px_status st = describe(s, s->dset, o->x, &rank, dims, &type);
  if (st != PX_OK) return st;
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  bool u8 = cls == H5T_INTEGER && size == 1 && H5Tget_sign(type) == H5T_SGN_NONE;
  bool f32 = cls == H5T_FLOAT && size == 4;
  bool zero = false;
  for (int k = 0; k < rank; k++) zero |= dims[k] == 0;
  char tn[48], sh[160];
  type_name(type, tn, sizeof tn);
  shape_str(rank, dims, sh, sizeof sh);
  if (rank >= 3 && (u8 || f32) && !zero) {
    hsize_t elements = 1;
    for (int k = 0; k < rank; k++) elements *= dims[k];
    try_direct(s, type, u8 ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT, elements, o);
  }
  H5Tclose(type);
  if ((rank != 3 && rank != 4) || !(u8 || f32) || zero)
    return px_error(PX_ERR_FORMAT,
                    "hdf5: dataset '%s' in %s: expected (N, H, W) or (N, C, H, W) images of uint8 or float32, found %s "
                    "%s",
                    o->x, s->path, sh, tn);
  const hsize_t N = dims[0];
  const hsize_t C = rank == 4 ? dims[1] : 1, H = dims[rank - 2], W = dims[rank - 1];
  if (N > (hsize_t)SIZE_MAX / 2 || C > 4096 || H > (1u << 20) || W > (1u << 20) || C * H * W > ((hsize_t)1 << 31))
    return px_error(PX_ERR_FORMAT, "hdf5: dataset '%s' in %s: %s images are too large for a sample", o->x, s->path, sh);
  s->rank = rank;
  memcpy(s->dims, dims, sizeof s->dims);
  s->is_float = f32;
  s->channels = (size_t)C;
  s->plane = (size_t)(H * W);
  s->pixels = (size_t)(C * H * W);

  // The labels: (N,) integers, read whole and checked.
  hid_t ld;
  st = open_dset(s, o->y, 1 << 20, &ld);
  if (st != PX_OK) return st;
  int lrank;
  hsize_t ldims[8] = {0};
  st = describe(s, ld, o->y, &lrank, ldims, &type);
  if (st != PX_OK) {
    H5Dclose(ld);
    return st;
  }
  cls = H5Tget_class(type);
  type_name(type, tn, sizeof tn);
  H5Tclose(type);
  if (lrank != 1 || ldims[0] != N || cls != H5T_INTEGER) {
    shape_str(lrank, ldims, sh, sizeof sh);
    H5Dclose(ld);
    return px_error(PX_ERR_FORMAT,
                    "hdf5: dataset '%s' in %s: expected 1 dimension of N=%llu integers (one label per image of "
                    "'%s'), found %s %s",
                    o->y, s->path, (unsigned long long)N, o->x, sh, tn);
  }
  int64_t *raw = malloc((size_t)N * sizeof *raw);
  s->labels = malloc((size_t)N * sizeof *s->labels);
  if (!raw || !s->labels) {
    free(raw);
    H5Dclose(ld);
    return px_error(PX_ERR_NOMEM, "hdf5: out of memory for the %llu labels of '%s' in %s", (unsigned long long)N, o->y,
                    s->path);
  }
  herr_t r = H5Dread(ld, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw);
  H5Dclose(ld);
  if (r < 0) {
    free(raw);
    return px_error(PX_ERR_IO, "hdf5: cannot read dataset '%s' in %s (a filter missing, or the file damaged?)", o->y,
                    s->path);
  }
  const int64_t bound = o->num_classes ? (int64_t)o->num_classes : (int64_t)1 << 24;
  for (hsize_t i = 0; i < N; i++) {
    if (raw[i] < 0 || raw[i] >= bound) {
      int64_t v = raw[i];
      free(raw);
      if (o->num_classes)
        return px_error(PX_ERR_FORMAT, "hdf5: dataset '%s' in %s: label %lld at index %llu is out of range [0, %zu)",
                        o->y, s->path, (long long)v, (unsigned long long)i, o->num_classes);
      return px_error(PX_ERR_FORMAT,
                      "hdf5: dataset '%s' in %s: label %lld at index %llu is out of range: labels are class numbers "
                      "0, 1, 2, ... (at most 2^24)",
                      o->y, s->path, (long long)v, (unsigned long long)i);
    }
    s->labels[i] = (int32_t)raw[i];
  }
  free(raw);
  for (size_t c = 0; c < 3; c++) {
    s->mean[c] = o->mean[s->channels == 3 ? c : 0];
    s->std[c] = o->std[s->channels == 3 ? c : 0];
    for (int v = 0; v < 256; v++) s->lut[c][v] = ((float)v / 255.0f - s->mean[c]) / s->std[c];
  }
  // One sample, in the file selection's shape (see setup_chunk_cache).
  s->mspace = H5Screate_simple(rank, (hsize_t[]){1, dims[1], dims[2], dims[3]}, NULL);
  if (s->mspace < 0) return px_error(PX_ERR_IO, "hdf5: %s: cannot create a dataspace", s->path);
  return setup_chunk_cache(s, o);
}

static size_t windows_of(uint64_t n, int64_t T, bool random_offset) {
  // As the token shard source cuts one shard (src/data/tokens.c).
  uint64_t t = (uint64_t)T;
  if (random_offset) return n >= t ? (size_t)((n - t) / t) : 0;
  return n >= 1 ? (size_t)((n - 1) / t) : 0;
}

static px_status open_tokens(h5_source *s, const px_hdf5_opts *o) {
  int rank;
  hsize_t dims[8] = {0};
  hid_t type;
  px_status st = describe(s, s->dset, o->x, &rank, dims, &type);
  if (st != PX_OK) return st;
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  char tn[48], sh[160];
  type_name(type, tn, sizeof tn);
  shape_str(rank, dims, sh, sizeof sh);
  const hid_t natives[3] = {H5T_NATIVE_UINT16, H5T_NATIVE_UINT32, H5T_NATIVE_INT32};
  for (int k = 0; k < 3 && rank == 1 && s->direct_off < 0; k++)
    if (H5Tequal(type, natives[k]) > 0) {
      try_direct(s, type, natives[k], dims[0], o);
      s->tok_type = natives[k];
      s->tok_bytes = H5Tget_size(natives[k]);
    }
  H5Tclose(type);
  if (rank != 1 || cls != H5T_INTEGER || size > 8)
    return px_error(PX_ERR_FORMAT,
                    "hdf5: dataset '%s' in %s: expected 1 dimension of integer tokens (uint16, uint32 or int32), "
                    "found %s %s",
                    o->x, s->path, sh, tn);
  s->rank = 1;
  s->dims[0] = dims[0];
  s->num_tokens = dims[0];
  s->mspace = H5Screate_simple(1, (hsize_t[]){(hsize_t)o->T + 1}, NULL);
  if (s->mspace < 0) return px_error(PX_ERR_IO, "hdf5: %s: cannot create a dataspace", s->path);
  return PX_OK;
}

// Read one sample's hyperslab into buf (memory type mtype).
static px_status read_slab(h5_source *s, const hsize_t *start, const hsize_t *count, hid_t mtype, void *buf,
                           size_t sample) {
  h5_quiet q;
  h5_enter(&q);
  herr_t r = H5Sselect_hyperslab(s->fspace, H5S_SELECT_SET, start, NULL, count, NULL);
  if (r >= 0) r = H5Dread(s->dset, mtype, s->mspace, s->fspace, H5P_DEFAULT, buf);
  h5_leave(&q);
  if (r < 0)
    return px_error(PX_ERR_IO,
                    "hdf5: dataset '%s' in %s: sample %zu: reading failed (a filter missing, or the file "
                    "damaged or changed since open?)",
                    s->xname, s->path, sample);
  return PX_OK;
}

// Direct reads: `n` bytes at `at` past the dataset's raw data.
static px_status read_direct(const h5_source *s, uint64_t at, size_t n, void *buf, size_t sample) {
  size_t got = 0;
  const off_t base = (off_t)s->direct_off + (off_t)at;
  while (got < n) {
    ssize_t r = pread(s->fd, (char *)buf + got, n - got, base + (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      char why[128] = "the file ends there (cut short since open?)";
      if (r < 0 && strerror_r(errno, why, sizeof why) != 0) snprintf(why, sizeof why, "error %d", errno);
      return px_error(PX_ERR_IO,
                      "hdf5: dataset '%s' in %s: sample %zu: reading %zu bytes at file offset %lld failed: %s",
                      s->xname, s->path, sample, n, (long long)(base + (off_t)got), why);
    }
    got += (size_t)r;
  }
  return PX_OK;
}

// Sample i's bytes through the chunk cache into buf.
static px_status read_cached(h5_source *s, size_t i, void *buf) {
  const size_t elem = s->is_float ? 4 : 1, sample_bytes = s->pixels * elem;
  const size_t n = s->chunk_n, c = i / n, chunk_bytes = n * sample_bytes;
  h5_quiet q;
  h5_enter(&q);
  const size_t k = c % s->n_slots;
  herr_t r = 0;
  if (s->slot_chunk[k] != (int64_t)c) {
    s->slot_chunk[k] = -1;
    hsize_t rows = (hsize_t)n;
    if ((c + 1) * n > (size_t)s->dims[0]) rows = s->dims[0] - (hsize_t)(c * n);
    hsize_t start[4] = {(hsize_t)(c * n), 0, 0, 0}, count[4] = {rows, s->dims[1], s->dims[2], s->dims[3]};
    r = H5Sselect_hyperslab(s->fspace, H5S_SELECT_SET, start, NULL, count, NULL);
    if (r >= 0) r = H5Sselect_hyperslab(s->chunk_mspace, H5S_SELECT_SET, (hsize_t[]){0, 0, 0, 0}, NULL, count, NULL);
    if (r >= 0)
      r = H5Dread(s->dset, s->is_float ? H5T_NATIVE_FLOAT : H5T_NATIVE_UINT8, s->chunk_mspace, s->fspace, H5P_DEFAULT,
                  s->slot_data + k * chunk_bytes);
    if (r >= 0) s->slot_chunk[k] = (int64_t)c;
  }
  if (r >= 0) {
    memcpy(buf, s->slot_data + k * chunk_bytes + (i - c * n) * sample_bytes, sample_bytes);
  }
  h5_leave(&q);
  if (r < 0)
    return px_error(PX_ERR_IO,
                    "hdf5: dataset '%s' in %s: sample %zu: reading its chunk (samples %zu..%zu) failed (a "
                    "filter missing, or the file damaged or changed since open?)",
                    s->xname, s->path, i, c * n, c * n + n - 1);
  return PX_OK;
}

static px_status h5_get_image(px_dataset *d, size_t i, px_batch *b, size_t slot, px_rng *rng) {
  (void)rng;
  h5_source *s = d->impl;
  float *x = (float *)b->x.data + slot * s->pixels;
  hsize_t start[4] = {(hsize_t)i, 0, 0, 0}, count[4] = {1, s->dims[1], s->dims[2], s->dims[3]};
  px_status st;
  if (s->is_float) {
    st = s->direct_off >= 0 ? read_direct(s, (uint64_t)i * s->pixels * 4, s->pixels * 4, x, i)
      : s->chunk_n          ? read_cached(s, i, x)
                            : read_slab(s, start, count, H5T_NATIVE_FLOAT, x, i);
    if (st != PX_OK) return st;
    for (size_t k = 0; k < s->pixels; k++) {
      size_t c = s->channels == 3 ? k / s->plane : 0;
      x[k] = (x[k] - s->mean[c]) / s->std[c];
    }
  } else {
    // The bytes land at the start of the row and widen back to front: byte k
    // is read before float k (bytes 4k..4k+3, all at or past k) overwrites it.
    uint8_t *raw = (uint8_t *)x;
    st = s->direct_off >= 0 ? read_direct(s, (uint64_t)i * s->pixels, s->pixels, raw, i)
      : s->chunk_n          ? read_cached(s, i, raw)
                            : read_slab(s, start, count, H5T_NATIVE_UINT8, raw, i);
    if (st != PX_OK) return st;
    for (size_t k = s->pixels; k-- > 0;) {
      size_t c = s->channels == 3 ? k / s->plane : 0;
      x[k] = s->lut[c][raw[k]];
    }
  }
  ((int32_t *)b->y.data)[slot] = s->labels[i];
  return PX_OK;
}

static px_status h5_get_tokens(px_dataset *d, size_t i, px_batch *b, size_t slot, px_rng *rng) {
  h5_source *s = d->impl;
  const size_t T = (size_t)s->T;
  uint64_t at = (uint64_t)i * T;
  if (s->random_offset && rng) at += px_rng_below(rng, T);
  int64_t small[1024];
  int64_t *tok = T + 1 <= 1024 ? small : malloc((T + 1) * sizeof *tok);
  if (!tok) return px_error(PX_ERR_NOMEM, "hdf5: %s: out of memory for a window of %zu tokens", s->path, T + 1);
  px_status st;
  if (s->direct_off >= 0) {
    // The raw tokens go to the tail of the buffer and widen front to back:
    // token k's bytes lie at or past tok[k] and past every tok[j < k].
    const size_t tb = s->tok_bytes;
    unsigned char *raw = (unsigned char *)tok + (T + 1) * (sizeof *tok - tb);
    st = read_direct(s, at * tb, (T + 1) * tb, raw, i);
    for (size_t k = 0; st == PX_OK && k <= T; k++) {
      if (s->tok_type == H5T_NATIVE_UINT16) {
        uint16_t v;
        memcpy(&v, raw + k * tb, sizeof v);
        tok[k] = v;
      } else if (s->tok_type == H5T_NATIVE_UINT32) {
        uint32_t v;
        memcpy(&v, raw + k * tb, sizeof v);
        tok[k] = v;
      } else {
        int32_t v;
        memcpy(&v, raw + k * tb, sizeof v);
        tok[k] = v;
      }
    }
  } else {
    hsize_t start = (hsize_t)at, count = (hsize_t)T + 1;
    st = read_slab(s, &start, &count, H5T_NATIVE_INT64, tok, i);
  }
  const int64_t bound = s->vocab_size ? (int64_t)s->vocab_size : (int64_t)INT32_MAX + 1;
  for (size_t k = 0; st == PX_OK && k <= T; k++)
    if (tok[k] < 0 || tok[k] >= bound)
      st = px_error(PX_ERR_FORMAT,
                    "hdf5: dataset '%s' in %s: token at position %llu (sample %zu) is %lld, outside %s %lld", s->xname,
                    s->path, (unsigned long long)(at + k), i, (long long)tok[k],
                    s->vocab_size ? "the vocabulary: 0 .." : "the int32 range: 0 ..", (long long)(bound - 1));
  if (st == PX_OK) {
    int32_t *x = (int32_t *)b->x.data + slot * T, *y = (int32_t *)b->y.data + slot * T;
    for (size_t k = 0; k < T; k++) {
      x[k] = (int32_t)tok[k];
      y[k] = (int32_t)tok[k + 1];
    }
  }
  if (tok != small) free(tok);
  return st;
}

static px_status h5_get(px_dataset *d, size_t i, px_batch *b, size_t slot, px_rng *rng) {
  const h5_source *s = d->impl;
  return s->layout == PX_HDF5_TOKENS ? h5_get_tokens(d, i, b, slot, rng) : h5_get_image(d, i, b, slot, rng);
}

static void source_free(h5_source *s) {
  if (!s) return;
  h5_quiet q;
  h5_enter(&q);
  if (s->chunk_mspace > 0) H5Sclose(s->chunk_mspace);
  if (s->mspace > 0) H5Sclose(s->mspace);
  if (s->fspace > 0) H5Sclose(s->fspace);
  if (s->dset > 0) H5Dclose(s->dset);
  if (s->file > 0) H5Fclose(s->file);
  h5_leave(&q);
  if (s->fd >= 0) close(s->fd);
  free(s->slot_chunk);
  free(s->slot_data);
  free(s->labels);
  free(s->path);
  free(s->xname);
  free(s);
}

static void h5_destroy(px_dataset *d) {
  source_free(d->impl);
  free(d);
}

static const px_dataset_ops h5_ops = {h5_get, h5_destroy};

static px_status check_opts(const px_hdf5_opts *o) {
  const char *p = o->path;
  if (!p || !*p) return px_error(PX_ERR_INVALID, "hdf5: no file given");
  if (!o->x || !*o->x)
    return px_error(PX_ERR_INVALID, "hdf5 %s: no dataset named for the %s", p,
                    o->layout == PX_HDF5_TOKENS ? "tokens" : "images");
  if (o->layout == PX_HDF5_TOKENS) {
    if (o->T < 1 || o->T > (1 << 24))
      return px_error(PX_ERR_INVALID, "hdf5 %s: sequence length T = %lld; expected 1 .. 2^24", p, (long long)o->T);
    if (o->vocab_size > (size_t)INT32_MAX + 1)
      return px_error(PX_ERR_INVALID, "hdf5 %s: vocab_size %zu does not fit int32 tokens", p, o->vocab_size);
  } else if (o->layout == PX_HDF5_IMAGES) {
    if (!o->y || !*o->y) return px_error(PX_ERR_INVALID, "hdf5 %s: no dataset named for the labels", p);
    for (int c = 0; c < 3; c++)
      if (!isfinite(o->mean[c]) || !isfinite(o->std[c]) || !(o->std[c] > 0))
        return px_error(PX_ERR_INVALID, "hdf5 %s: mean %g and std %g (channel %d) must be finite and std > 0", p,
                        (double)o->mean[c], (double)o->std[c], c);
    if (o->num_classes > ((size_t)1 << 24))
      return px_error(PX_ERR_INVALID, "hdf5 %s: num_classes %zu; at most 2^24", p, o->num_classes);
  } else {
    return px_error(PX_ERR_INVALID, "hdf5 %s: unknown layout %d", p, (int)o->layout);
  }
  return PX_OK;
}

px_status px_hdf5_dataset_open(px_dataset **out, const px_hdf5_opts *o) {
  if (!out || !o) return px_error(PX_ERR_INVALID, "hdf5: NULL argument");
  *out = NULL;
  px_status st = check_opts(o);
  if (st != PX_OK) return st;
  // libhdf5 reads a local file; an object is copied to local disk first.
  if (px_s3_is_url(o->path))
    return px_error(PX_ERR_UNSUPPORTED,
                    "hdf5 %s: an HDF5 file is read from local disk, not from S3; stage it (plexus train --stage "
                    "DIR: copied once per node, then read there) or copy it to local disk",
                    o->path);
  struct stat sb;
  if (stat(o->path, &sb) != 0) {
    int err = errno;
    return px_error(err == ENOENT ? PX_ERR_NOT_FOUND : PX_ERR_IO, "hdf5 %s: cannot open: %s", o->path, strerror(err));
  }
  if (!S_ISREG(sb.st_mode)) return px_error(PX_ERR_INVALID, "hdf5 %s: not a regular file", o->path);
  h5_source *s = calloc(1, sizeof *s);
  px_dataset *d = calloc(1, sizeof *d);
  if (s) {
    s->file = s->dset = s->fspace = s->mspace = s->chunk_mspace = H5I_INVALID_HID;
    s->fd = -1;
    s->direct_off = -1;
    s->path = strdup(o->path);
    s->xname = strdup(o->x);
  }
  if (!s || !d || !s->path || !s->xname) {
    if (s) {
      free(s->path);
      free(s->xname);
    }
    free(s);
    free(d);
    return px_error(PX_ERR_NOMEM, "hdf5 %s: out of memory", o->path);
  }
  s->layout = o->layout;
  s->T = o->T;
  s->random_offset = o->random_offset;
  s->vocab_size = o->vocab_size;
  h5_quiet q;
  h5_enter(&q);
  htri_t is = H5Fis_hdf5(o->path);
  if (is <= 0) {
    st = px_error(PX_ERR_FORMAT, "hdf5 %s: not an HDF5 file (no HDF5 signature)", o->path);
  } else {
    s->file = H5Fopen(o->path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (s->file < 0) st = px_error(PX_ERR_IO, "hdf5 %s: cannot open the file (damaged?)", o->path);
  }
  const size_t cache = o->cache_bytes ? o->cache_bytes : PX_HDF5_CACHE_DEFAULT;
  if (st == PX_OK) st = open_dset(s, o->x, cache, &s->dset);
  if (st == PX_OK) st = o->layout == PX_HDF5_TOKENS ? open_tokens(s, o) : open_images(s, o);
  if (st == PX_OK) {
    s->fspace = H5Dget_space(s->dset);
    if (s->fspace < 0) st = px_error(PX_ERR_IO, "hdf5: dataset '%s' in %s: cannot get its dataspace", o->x, o->path);
  }
  h5_leave(&q);
  size_t length = 0;
  if (st == PX_OK && o->layout == PX_HDF5_TOKENS) {
    length = windows_of(s->num_tokens, o->T, o->random_offset);
    if (length == 0)
      st = px_error(PX_ERR_INVALID,
                    "hdf5: dataset '%s' in %s: %llu tokens give no sample: a window needs %lld + 1 tokens%s", o->x,
                    o->path, (unsigned long long)s->num_tokens, (long long)o->T,
                    o->random_offset ? ", 2·T with random offsets" : "");
  } else if (st == PX_OK) {
    length = (size_t)s->dims[0];
  }
  if (st != PX_OK) {
    source_free(s);
    free(d);
    return st;
  }
  d->ops = &h5_ops;
  d->kind = "hdf5";
  d->length = length;
  d->impl = s;
  d->y_dtype = PX_I32;
  if (o->layout == PX_HDF5_TOKENS) {
    d->x_dtype = PX_I32;
    d->x_ndim = 1;
    d->x_shape[0] = o->T;
    d->y_ndim = 1;
    d->y_shape[0] = o->T;
    d->num_classes = o->vocab_size;
  } else {
    d->x_dtype = PX_F32;
    d->x_ndim = 3;
    d->x_shape[0] = (int64_t)s->channels;
    d->x_shape[1] = (int64_t)s->dims[s->rank - 2];
    d->x_shape[2] = (int64_t)s->dims[s->rank - 1];
    d->y_ndim = 0;
    size_t max = 0;
    for (size_t i = 0; i < length; i++)
      if ((size_t)s->labels[i] > max) max = (size_t)s->labels[i];
    d->num_classes = o->num_classes ? o->num_classes : max + 1;
  }
  *out = d;
  return PX_OK;
}
