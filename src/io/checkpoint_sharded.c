// A checkpoint every rank writes into (px_checkpoint_write_all): the files
// of a sharded model (ZeRO), one or more per rank, in one step directory
// with one SHA256SUMS.  The order is that of a single writer
// (checkpoint_write.c), spread over the ranks:
//
//   rank 0       mkdir <dir>/.step_<step>.partial.<host>.<pid>/   -> broadcast its path (or the failure)
//   every rank   writes and fsyncs its files there, hashing them  -> all-gather (status, "hash  name" lines)
//                and lists its pieces for the index               -> sent to rank 0 (a few bytes per piece)
//   rank 0       metadata.json (the index: every tensor's boxes in every file, checkpoint_index.c), fsync;
//                SHA256SUMS (rank 0's lines, then rank 1's, ..., metadata.json's), fsync,
//                rename to step_<step>, fsync <dir>, rotation      -> broadcast the outcome
//
// So the index is the last data file, written by one rank once every
// rank's files are durable; the rename, which makes the checkpoint exist
// (the commit), comes after it and SHA256SUMS; and a failure anywhere
// leaves only a .partial directory (removed here, or by the next write on
// this host).
#include "io/checkpoint.h"
#include "io/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PX_CKPT_STEP_MAX INT64_C(999999999999999999)

// What rank 0 tells everyone after making the temporary directory, and
// again at the end: a status, whether step_<step> exists, and a path or a
// message.
typedef struct root_news {
  int32_t status;
  int32_t complete;
  char text[4096];
} root_news;

// What each rank reports after writing: its status, and its SHA256SUMS
// lines (or its error message).  One line is at most 64 + 2 + 255 + 1 bytes.
#define REPORT_TEXT 4096
typedef struct rank_report {
  int32_t status;
  int32_t n_files;
  char text[REPORT_TEXT];
} rank_report;

// Rank 0: the temporary directory (into news->text) and the final path.
static px_status make_tmp(const char *dir_in, int64_t step, char *final, size_t cap, char *tmp, size_t tcap) {
  char why[128];
  char *dir = px_ckpt_clean_dir(dir_in);
  if (!dir) return px_error(PX_ERR_NOMEM, "checkpoint: out of memory writing step %" PRId64 " in %s", step, dir_in);
  px_status st = PX_OK;
  if (!px_ckpt_step_path(dir, step, final, cap)) {
    st = px_error(PX_ERR_INVALID, "checkpoint: the path of step %" PRId64 " in %s is too long", step, dir_in);
    goto done;
  }
  if ((st = px_ckpt_make_dirs(dir, final)) != PX_OK) goto done;
  char host[PX_CKPT_HOST_MAX + 1], name[384];
  px_ckpt_host(host);
  px_ckpt_temp_name(step, PX_CKPT_PARTIAL, host, (long)getpid(), name, sizeof name);
  if (snprintf(tmp, tcap, "%s/%s", dir, name) >= (int)tcap) {
    st = px_error(PX_ERR_INVALID, "checkpoint %s: the temporary path is too long", final);
    goto done;
  }
  if ((st = px_ckpt_remove_tree(tmp)) != PX_OK) goto done;  // this process's own earlier attempt
  if (mkdir(tmp, 0755) != 0) {
    int err = errno;
    st = px_error(PX_ERR_IO, "checkpoint %s: cannot create the temporary directory %s: %s", final, tmp,
                  px_io_strerror(err, why, sizeof why));
  }
done:
  free(dir);
  return st;
}

// This rank's files into tmp; their SHA256SUMS lines into r->text.
// Each item's chunk CRCs into crcs[i], n_crcs[i] (for the index, without a
// second pass over the bytes).
static px_status write_mine(const char *tmp, const char *final, const px_ckpt_item *items, int n_items, rank_report *r,
                            px_ckpt_chunk_crc **crcs, int *n_crcs) {
  size_t used = 0;
  char(*hex)[PX_SHA256_HEX] = malloc((size_t)(n_items > 0 ? n_items : 1) * sizeof *hex);
  if (!hex) return px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", final);
  px_status st = px_ckpt_write_items(tmp, final, items, n_items, hex, crcs, n_crcs);
  for (int i = 0; i < n_items && st == PX_OK; i++) {
    const px_ckpt_item *it = &items[i];
    int k = snprintf(r->text + used, REPORT_TEXT - used, "%s  %s\n", hex[i], it->name);
    if (k < 0 || (size_t)k >= REPORT_TEXT - used) {
      st = px_error(PX_ERR_INVALID, "checkpoint %s: one rank's file names exceed %d bytes in all", final, REPORT_TEXT);
      break;
    }
    used += (size_t)k;
    r->n_files++;
  }
  free(hex);
  return st;
}

// Rank 0: every name listed once over all ranks (each rank checked its own).
static px_status names_distinct(const rank_report *all, int world, const char *final) {
  for (int a = 0; a < world; a++)
    for (const char *p = all[a].text; *p; p = strchr(p, '\n') + 1) {
      const char *name = p + PX_SHA256_HEX - 1 + 2;
      size_t len = (size_t)(strchr(p, '\n') - name);
      for (int b = 0; b <= a; b++)
        for (const char *q = all[b].text; *q && q < p; q = strchr(q, '\n') + 1) {
          const char *other = q + PX_SHA256_HEX - 1 + 2;
          if ((size_t)(strchr(q, '\n') - other) == len && memcmp(name, other, len) == 0)
            return px_error(PX_ERR_INVALID, "checkpoint %s: ranks %d and %d both wrote a file named \"%.*s\"", final, b,
                            a, (int)len, name);
        }
    }
  return PX_OK;
}

// Rank 0, once every rank has written: SHA256SUMS, install, rotation.
static px_status finish(const char *dir_in, int64_t step, const char *tmp, const char *final, const rank_report *all,
                        int world, char *const *parts, int keep_last, bool *complete) {
  *complete = false;
  px_status st = names_distinct(all, world, final);
  if (st != PX_OK) return st;
  size_t total = sizeof PX_CKPT_INDEX + PX_SHA256_HEX + 4;
  for (int r = 0; r < world; r++) total += strlen(all[r].text);
  char *sums = malloc(total + 1), *dir = px_ckpt_clean_dir(dir_in);
  size_t plen = strlen(final) + PX_CKPT_NAME_MAX + 64;
  char *file = malloc(plen), *old = malloc(plen);
  if (!sums || !dir || !file || !old) {
    st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", final);
    goto done;
  }
  size_t used = 0;
  for (int r = 0; r < world; r++) {
    size_t n = strlen(all[r].text);
    memcpy(sums + used, all[r].text, n);
    used += n;
  }
  sums[used] = '\0';
  if (used == 0) {
    st = px_error(PX_ERR_INVALID, "checkpoint %s: no rank gave a file to write", final);
    goto done;
  }
  if (parts) {
    char hex[PX_SHA256_HEX];
    if ((st = px_ckpt_index_write(tmp, final, parts, world, step, hex)) != PX_OK) goto done;
    used += (size_t)snprintf(sums + used, total + 1 - used, "%s  %s\n", hex, PX_CKPT_INDEX);
  }
  unsigned char ignored[PX_SHA256_BYTES];
  snprintf(file, plen, "%s/%s", tmp, PX_CKPT_SUMS);
  px_io_chunk c = {sums, used};
  if ((st = px_ckpt_write_file(file, final, PX_CKPT_SUMS, &c, 1, ignored)) != PX_OK) goto done;
  if ((st = px_ckpt_fsync_dir(tmp, final)) != PX_OK) goto done;
  if ((st = px_ckpt_install(dir, tmp, final, step, true, old, plen)) != PX_OK) goto done;
  if ((st = px_ckpt_fsync_dir(dir, final)) != PX_OK) goto done;
  *complete = true;
  if (old[0] && (st = px_ckpt_remove_tree(old)) != PX_OK) {
    st = px_error_wrap(st, "checkpoint %s is complete, but removing the checkpoint it replaced failed", final);
    goto done;
  }
  st = px_ckpt_rotate(dir, step, keep_last);
  if (st != PX_OK) st = px_error_wrap(st, "checkpoint %s is complete, but rotation in %s failed", final, dir);
done:
  free(old);
  free(file);
  free(dir);
  free(sums);
  return st;
}

// Rank 0 receives every rank's part of the index into *parts (NULL on the
// other ranks, and on rank 0 when no rank wrote a safetensors file: then
// there is nothing to index).  Collective; a part is a few hundred bytes
// per piece.
#define PART_TAG 7301
static px_status gather_parts(px_comm *comm, const char *part, const px_ckpt_item *items, int n_items, char ***parts) {
  const int rank = px_comm_rank(comm), world = px_comm_size(comm);
  int has = 0;
  for (int i = 0; i < n_items; i++) has |= items[i].tensors != NULL;
  int64_t mine[2] = {(int64_t)strlen(part) + 1, has};
  int64_t *lens = malloc((size_t)world * sizeof mine);
  if (!lens) {
    px_comm_abort(comm, "checkpoint: out of memory");
    return px_error(PX_ERR_NOMEM, "checkpoint: out of memory");
  }
  px_status st = px_comm_allgather(comm, mine, lens, 2, PX_I64);
  int any = 0;
  for (int r = 0; st == PX_OK && r < world; r++) any |= lens[2 * r + 1] != 0;
  if (st != PX_OK || !any) {
    free(lens);
    return st;
  }
  if (rank != 0) {
    st = px_comm_send(comm, part, (size_t)mine[0], PX_U8, 0, PART_TAG);
    free(lens);
    return st;
  }
  char **p = calloc((size_t)world, sizeof *p);
  for (int r = 0; p && r < world; r++)
    if (!(p[r] = malloc((size_t)lens[2 * r]))) {
      for (int k = 0; k < r; k++) free(p[k]);
      free(p);
      p = NULL;
    }
  if (!p) {
    free(lens);
    px_comm_abort(comm, "checkpoint: out of memory for the index");
    return px_error(PX_ERR_NOMEM, "checkpoint: out of memory for the index");
  }
  memcpy(p[0], part, (size_t)mine[0]);
  for (int r = 1; r < world && st == PX_OK; r++) st = px_comm_recv(comm, p[r], (size_t)lens[2 * r], PX_U8, r, PART_TAG);
  free(lens);
  *parts = p;
  return st;
}

px_status px_checkpoint_write_all(px_comm *comm, const char *dir, int64_t step, const px_ckpt_item *items, int n_items,
                                  int keep_last, char *path_out, size_t cap) {
  if (path_out && cap) path_out[0] = '\0';
  if (!comm) {
    // A world of one writes the same checkpoint, index included.
    px_comm *self;
    px_status st = px_comm_init_self(&self);
    if (st != PX_OK) return st;
    st = px_checkpoint_write_all(self, dir, step, items, n_items, keep_last, path_out, cap);
    px_comm_free(self);
    return st;
  }
  const int rank = px_comm_rank(comm), world = px_comm_size(comm);
  // Arguments every rank can judge alike: no communication needed to agree.
  if (!dir || !*dir) return px_error(PX_ERR_INVALID, "checkpoint: empty directory name");
  if (step < 0 || step > PX_CKPT_STEP_MAX)
    return px_error(PX_ERR_INVALID, "checkpoint: step %" PRId64 " is out of range (0 to 10^18 - 1)", step);
  if (keep_last < 0)
    return px_error(PX_ERR_INVALID, "checkpoint: keep_last is %d; expected 0 (keep all) or more", keep_last);

  char *part = NULL, **parts = NULL;
  px_ckpt_chunk_crc **crcs = NULL;
  int *n_crcs = NULL;
  root_news *news = calloc(1, sizeof *news);
  rank_report *mine = calloc(1, sizeof *mine);
  rank_report *all = calloc((size_t)world, sizeof *all);
  char *final = malloc(4096);
  if (!news || !mine || !all || !final) {
    free(news);
    free(mine);
    free(all);
    free(final);
    // Every rank allocates the same sizes but one may fail alone: abort the
    // job rather than leave the others waiting in the broadcast below.
    px_comm_abort(comm, "checkpoint: out of memory");
    return px_error(PX_ERR_NOMEM, "checkpoint: out of memory");
  }
  if (rank == 0) {
    px_status st = make_tmp(dir, step, final, 4096, news->text, sizeof news->text);
    news->status = (int32_t)st;
    if (st != PX_OK) snprintf(news->text, sizeof news->text, "%s", px_last_error());
  }
  px_status st = px_comm_broadcast(comm, news, sizeof *news, PX_U8, 0);
  if (st != PX_OK) goto done;
  if (news->status != PX_OK) {
    st = px_error((px_status)news->status, "%s", news->text);
    goto done;
  }
  char *tmp = news->text;
  {
    char *d = px_ckpt_clean_dir(dir);
    if (!d || !px_ckpt_step_path(d, step, final, 4096)) final[0] = '\0';
    free(d);
  }
  px_status mst = n_items > 0 ? px_ckpt_check_items(items, n_items) : PX_OK;
  for (int i = 0; i < n_items && mst == PX_OK; i++)
    if (strcmp(items[i].name, PX_CKPT_INDEX) == 0)
      mst = px_error(PX_ERR_INVALID, "checkpoint: \"%s\" is the index's name; a file cannot be called so",
                     PX_CKPT_INDEX);
  crcs = calloc((size_t)(n_items > 0 ? n_items : 1), sizeof *crcs);
  n_crcs = calloc((size_t)(n_items > 0 ? n_items : 1), sizeof *n_crcs);
  if (mst == PX_OK && (!crcs || !n_crcs)) mst = px_error(PX_ERR_NOMEM, "checkpoint: out of memory");
  if (mst == PX_OK) mst = write_mine(tmp, final, items, n_items, mine, crcs, n_crcs);
  // This rank's part of the index (its pieces: where, which box, checksum).
  if (mst == PX_OK) mst = px_ckpt_index_part_crc(items, n_items, rank, crcs, n_crcs, &part);
  mine->status = (int32_t)mst;
  if (mst != PX_OK) snprintf(mine->text, sizeof mine->text, "rank %d: %s", rank, px_last_error());
  if ((st = px_comm_allgather(comm, mine, all, sizeof *mine, PX_U8)) != PX_OK) goto done;
  bool all_ok = true;
  for (int r = 0; r < world; r++) all_ok = all_ok && all[r].status == PX_OK;
  if (all_ok && (st = gather_parts(comm, part, items, n_items, &parts)) != PX_OK) goto done;

  root_news *out = news;  // reused for the outcome (tmp is copied first on rank 0)
  if (rank == 0) {
    char tmp_copy[sizeof news->text];
    snprintf(tmp_copy, sizeof tmp_copy, "%s", tmp);
    int failed = -1;
    for (int r = 0; r < world && failed < 0; r++)
      if (all[r].status != PX_OK) failed = r;
    bool complete = false;
    px_status rst;
    if (failed >= 0) rst = px_error((px_status)all[failed].status, "%s", all[failed].text);
    else rst = finish(dir, step, tmp_copy, final, all, world, parts, keep_last, &complete);
    if (!complete) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", px_last_error());
      px_ckpt_remove_tree(tmp_copy);
      px_error(rst, "%s", msg);
    }
    memset(out, 0, sizeof *out);
    out->status = (int32_t)rst;
    out->complete = complete;
    if (rst != PX_OK) snprintf(out->text, sizeof out->text, "%s", px_last_error());
  }
  if ((st = px_comm_broadcast(comm, out, sizeof *out, PX_U8, 0)) != PX_OK) goto done;
  if (out->complete && path_out && cap) {
    if (strlen(final) < cap) memcpy(path_out, final, strlen(final) + 1);
    else if (out->status == PX_OK) {
      st = px_error(PX_ERR_INVALID, "checkpoint %s: path_out holds %zu bytes, the path needs %zu", final, cap,
                    strlen(final) + 1);
      goto done;
    }
  }
  st = out->status == PX_OK ? PX_OK : px_error((px_status)out->status, "%s", out->text);
done:
  if (crcs)
    for (int i = 0; i < n_items; i++) free(crcs[i]);
  free(crcs);
  free(n_crcs);
  if (parts)
    for (int r = 0; r < world; r++) free(parts[r]);
  free(parts);
  free(part);
  free(final);
  free(all);
  free(mine);
  free(news);
  return st;
}
