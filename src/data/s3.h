/* Objects in S3 (or an S3-compatible store: MinIO, Ceph, moto) as data
 * paths (internal).  docs/DATA.md, "S3", is the user's side.
 *
 * A data path "s3://bucket/key" names one object; the sources read it with
 * these calls wherever they read a local file.  Every request is signed
 * with AWS Signature Version 4 by libcurl (CURLOPT_AWS_SIGV4,
 * "aws:amz:REGION:s3").  Once per process the configuration is resolved:
 *
 *   credentials  AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN),
 *                else the profile's keys in ~/.aws/credentials
 *                (AWS_SHARED_CREDENTIALS_FILE), else in ~/.aws/config
 *   profile      AWS_PROFILE, else "default"
 *   region       AWS_REGION, AWS_DEFAULT_REGION, the profile's `region` in
 *                ~/.aws/config (AWS_CONFIG_FILE), else us-east-1
 *   endpoint     PX_S3_ENDPOINT, AWS_ENDPOINT_URL, the profile's
 *                `endpoint_url`; with one, path-style URLs
 *                ENDPOINT/bucket/key; without, https://bucket.s3.REGION.amazonaws.com/key
 *   cache        PX_S3_CACHE: a directory; objects kept as CACHE/bucket/key
 *                and reused while their size matches the store's
 *   retries      PX_S3_ATTEMPTS (5) tries per request, waiting
 *                PX_S3_BACKOFF_MS (200) ms, doubling, at most 10 s
 *   in flight    PX_S3_IN_FLIGHT (8, at most 64): requests of one loader
 *                batch sent at once by the worker filling it (1: one at a
 *                time, as a plain read)
 *
 * A request is retried on HTTP 5xx, 429, and on a dropped or failed
 * connection (a curl error, a body shorter than its Content-Length); each
 * retry prints one line to stderr.  Errors name the object and what the
 * store said (its XML error Code: NoSuchBucket, NoSuchKey,
 * InvalidAccessKeyId, SignatureDoesNotMatch, AccessDenied, SlowDown ...).
 * Every call is safe from several threads at once. */
#ifndef PX_DATA_S3_H
#define PX_DATA_S3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plexus/base.h"

/* True when `path` starts with "s3://". */
bool px_s3_is_url(const char *path);

/* The size of an object (HEAD).  A missing object or bucket is
 * PX_ERR_NOT_FOUND; *missing_key (if not NULL) then says whether it is the
 * key that is missing (NoSuchKey), not the bucket.  `what` ("idx",
 * "tokens", ...) starts messages. */
px_status px_s3_size(const char *url, const char *what, uint64_t *size, bool *missing_key);

/* A whole object into malloc'ed memory (at least 1 byte allocated); from
 * the cache when PX_S3_CACHE holds it at the store's size. */
px_status px_s3_read(const char *url, const char *what, void **out, size_t *out_n);

/* Bytes [offset, offset + n) of an object into dst: one GET with
 * "Range: bytes=offset-(offset+n-1)"; fewer bytes than asked is an error. */
px_status px_s3_read_range(const char *url, const char *what, uint64_t offset, size_t n, void *dst);

/* The objects under an s3:// pattern, sorted by key (bytewise):
 *   - a pattern with glob characters (* ? [) lists the prefix before the
 *     first of them and keeps the keys fnmatch(3) matches ('*' stays within
 *     one '/' level);
 *   - else the object of that exact key when there is one;
 *   - else every object whose key starts with it (a "directory" given as
 *     a prefix), leaving out keys that end in '/'.
 * ListObjectsV2, page after page (continuation tokens).  *urls is n
 * malloc'ed "s3://bucket/key" strings in a malloc'ed array, *sizes their
 * sizes; free with px_s3_list_free.  No object is PX_ERR_NOT_FOUND. */
px_status px_s3_list(const char *pattern, const char *what, char ***urls, uint64_t **sizes, size_t *n);
void px_s3_list_free(char **urls, uint64_t *sizes, size_t n);

/* px_s3_list, and *etags (when not NULL): each object's ETag as the listing
 * gives it, the quotes removed ("" when the store sends none), n malloc'ed
 * strings in a malloc'ed array: free with px_s3_etags_free.  Staging
 * (stage.c) records them to see an object replaced at the same size. */
px_status px_s3_list_etags(const char *pattern, const char *what, char ***urls, uint64_t **sizes, char ***etags,
                           size_t *n);
void px_s3_etags_free(char **etags, size_t n);

/* The path a cached copy of `url` has ("CACHE/bucket/key", malloc'ed), or
 * NULL when PX_S3_CACHE is not set. */
char *px_s3_cache_path(const char *url);

/* Make sure the cache holds `url` at `size` bytes (download it if not):
 * the sources that read ranges (token shards) then read the local copy. */
px_status px_s3_cache_fetch(const char *url, const char *what, uint64_t size, char **local_path);

/* Batch fetch: the reads of one loader batch, several in flight.  The
 * loader (loader.c, fill) calls, on the worker's thread:
 *
 *   px_s3_batch_begin()   true when PX_S3_IN_FLIGHT > 1 (and S3 usable):
 *                         "plan" mode on this thread: px_s3_read_range and
 *                         px_s3_read (without a cache) record the request and
 *                         answer zeros / an empty object, sending nothing;
 *   ... the batch's px_dataset_get calls (a dry run; results discarded) ...
 *   px_s3_batch_planned() requests recorded so far;
 *   px_s3_batch_fetch()   sends them all on one curl multi handle (its
 *                         connections kept for the worker's next batch), at
 *                         most PX_S3_IN_FLIGHT at a time, each retried with
 *                         request()'s rules and messages; keeps each body
 *                         (or its error) for this thread.  False (and plan
 *                         mode off) when nothing was recorded;
 *   ... the batch's gets again: a read of exactly a recorded object/range
 *       is served from what was kept (its bytes, or its error with the
 *       message a plain read would give); any other read is sent as usual;
 *   px_s3_batch_end()     drops what is left, mode off. */
int px_s3_in_flight(void);
bool px_s3_batch_begin(void);
size_t px_s3_batch_planned(void);
bool px_s3_batch_fetch(void);
void px_s3_batch_end(void);

/* Requests retried since the process started (tests, the loader bench). */
uint64_t px_s3_retries(void);

#endif
