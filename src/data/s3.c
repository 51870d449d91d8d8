// S3 objects as data paths (s3.h): SigV4-signed GET/HEAD and ListObjectsV2
// through libcurl, with retries, ranged reads and an optional local cache.
#define _GNU_SOURCE  // strcasestr, fnmatch's FNM_PATHNAME
#include "data/s3.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

// sha256 of the empty body: every request here is a GET or HEAD.
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

bool px_s3_is_url(const char *path) { return path && strncmp(path, "s3://", 5) == 0; }

void px_s3_list_free(char **urls, uint64_t *sizes, size_t n) {
  for (size_t k = 0; urls && k < n; k++) free(urls[k]);
  free(urls);
  free(sizes);
}

void px_s3_etags_free(char **etags, size_t n) {
  for (size_t k = 0; etags && k < n; k++) free(etags[k]);
  free(etags);
}

#ifdef PX_HAVE_CURL
#include <curl/curl.h>

// ---- Configuration (once per process) ----------------------------------------

typedef struct s3_conf {
  char key_id[256], secret[256], token[4096];
  char profile[128], region[64], endpoint[512], cache[1024];
  char cred_from[1200];  // where the credentials came from, for messages
  int attempts;
  long backoff_ms;
  long list_max_keys;  // 0: the store's default (1000); tests set a small page
  int in_flight;       // requests of one loader batch sent at once (PX_S3_IN_FLIGHT)
} s3_conf;

static s3_conf conf;
static pthread_once_t conf_once = PTHREAD_ONCE_INIT;
static bool curl_ok;
static pthread_mutex_t stat_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t retries_total;

static void copy_env(char *dst, size_t cap, const char *name) {
  const char *v = getenv(name);
  if (v && *v && !*dst) snprintf(dst, cap, "%s", v);
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
  return s;
}

// `key` in section `section` of an INI file (the AWS CLI's format); false
// when the file, the section or the key is missing.
static bool ini_get(const char *path, const char *section, const char *key, char *out, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f) return false;
  char line[4096];
  bool in = false, found = false;
  while (!found && fgets(line, sizeof line, f)) {
    char *s = trim(line);
    if (*s == '#' || *s == ';' || !*s) continue;
    if (*s == '[') {
      char *e = strchr(s, ']');
      if (e) *e = '\0';
      in = strcmp(trim(s + 1), section) == 0;
      continue;
    }
    char *eq = strchr(s, '=');
    if (!in || !eq) continue;
    *eq = '\0';
    if (strcmp(trim(s), key) == 0) {
      snprintf(out, cap, "%s", trim(eq + 1));
      found = true;
    }
  }
  fclose(f);
  return found;
}

static void conf_init(void) {
  s3_conf *c = &conf;
  copy_env(c->profile, sizeof c->profile, "AWS_PROFILE");
  if (!*c->profile) snprintf(c->profile, sizeof c->profile, "default");
  const char *home = getenv("HOME");
  char cred_file[1024] = "", config_file[1024] = "", config_section[160];
  copy_env(cred_file, sizeof cred_file, "AWS_SHARED_CREDENTIALS_FILE");
  copy_env(config_file, sizeof config_file, "AWS_CONFIG_FILE");
  if (!*cred_file && home) snprintf(cred_file, sizeof cred_file, "%s/.aws/credentials", home);
  if (!*config_file && home) snprintf(config_file, sizeof config_file, "%s/.aws/config", home);
  // ~/.aws/config names a profile "[profile NAME]", except "[default]".
  if (strcmp(c->profile, "default") == 0) snprintf(config_section, sizeof config_section, "default");
  else snprintf(config_section, sizeof config_section, "profile %.127s", c->profile);

  copy_env(c->key_id, sizeof c->key_id, "AWS_ACCESS_KEY_ID");
  copy_env(c->secret, sizeof c->secret, "AWS_SECRET_ACCESS_KEY");
  if (*c->key_id && *c->secret) {
    copy_env(c->token, sizeof c->token, "AWS_SESSION_TOKEN");
    snprintf(c->cred_from, sizeof c->cred_from, "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY");
  } else {
    c->key_id[0] = c->secret[0] = '\0';
    const char *files[2] = {cred_file, config_file};
    const char *sections[2] = {c->profile, config_section};
    for (int k = 0; k < 2 && !*c->key_id; k++) {
      if (ini_get(files[k], sections[k], "aws_access_key_id", c->key_id, sizeof c->key_id) &&
          ini_get(files[k], sections[k], "aws_secret_access_key", c->secret, sizeof c->secret)) {
        ini_get(files[k], sections[k], "aws_session_token", c->token, sizeof c->token);
        snprintf(c->cred_from, sizeof c->cred_from, "%.1000s [%.150s]", files[k], sections[k]);
      } else {
        c->key_id[0] = c->secret[0] = '\0';
      }
    }
  }
  copy_env(c->region, sizeof c->region, "AWS_REGION");
  copy_env(c->region, sizeof c->region, "AWS_DEFAULT_REGION");
  if (!*c->region) ini_get(config_file, config_section, "region", c->region, sizeof c->region);
  if (!*c->region) snprintf(c->region, sizeof c->region, "us-east-1");
  copy_env(c->endpoint, sizeof c->endpoint, "PX_S3_ENDPOINT");
  copy_env(c->endpoint, sizeof c->endpoint, "AWS_ENDPOINT_URL_S3");
  copy_env(c->endpoint, sizeof c->endpoint, "AWS_ENDPOINT_URL");
  if (!*c->endpoint) ini_get(config_file, config_section, "endpoint_url", c->endpoint, sizeof c->endpoint);
  size_t n = strlen(c->endpoint);
  while (n > 0 && c->endpoint[n - 1] == '/') c->endpoint[--n] = '\0';
  copy_env(c->cache, sizeof c->cache, "PX_S3_CACHE");
  const char *a = getenv("PX_S3_ATTEMPTS"), *b = getenv("PX_S3_BACKOFF_MS"), *m = getenv("PX_S3_LIST_MAX_KEYS");
  c->attempts = a && atoi(a) > 0 ? atoi(a) : 5;
  c->backoff_ms = b && atol(b) >= 0 ? atol(b) : 200;
  c->list_max_keys = m && atol(m) > 0 ? atol(m) : 0;
  const char *f = getenv("PX_S3_IN_FLIGHT");
  c->in_flight = f && atoi(f) > 0 ? atoi(f) : 8;
  if (c->in_flight > 64) c->in_flight = 64;
  curl_ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
}

static px_status conf_get(const char *what, const char *url) {
  pthread_once(&conf_once, conf_init);
  if (!curl_ok) return px_error(PX_ERR_INTERNAL, "%s %s: libcurl failed to initialise", what, url);
  if (!*conf.key_id)
    return px_error(PX_ERR_INVALID,
                    "%s %s: no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or write "
                    "aws_access_key_id/aws_secret_access_key under [%s] in ~/.aws/credentials (profile from "
                    "AWS_PROFILE)",
                    what, url, conf.profile);
  return PX_OK;
}

uint64_t px_s3_retries(void) {
  pthread_mutex_lock(&stat_mu);
  uint64_t n = retries_total;
  pthread_mutex_unlock(&stat_mu);
  return n;
}

// ---- URLs --------------------------------------------------------------------

typedef struct s3_obj {
  char bucket[256];
  const char *key;  // into the url given
} s3_obj;

static px_status parse_url(const char *url, const char *what, s3_obj *o) {
  if (!px_s3_is_url(url)) return px_error(PX_ERR_INVALID, "%s %s: not an s3:// URL", what, url ? url : "(null)");
  const char *b = url + 5, *slash = strchr(b, '/');
  size_t nb = slash ? (size_t)(slash - b) : strlen(b);
  if (nb < 3 || nb > 63)
    return px_error(PX_ERR_INVALID, "%s %s: expected s3://BUCKET/KEY with a bucket name of 3 to 63 characters", what,
                    url);
  memcpy(o->bucket, b, nb);
  o->bucket[nb] = '\0';
  o->key = slash ? slash + 1 : "";
  return PX_OK;
}

// RFC 3986 percent-encoding as SigV4 wants it (unreserved characters stay;
// '/' stays in a path).  Appends to out (cap bytes); false when it is full.
static bool encode(char *out, size_t cap, const char *s, bool keep_slash) {
  size_t k = strlen(out);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    bool plain = isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~' || (keep_slash && ch == '/');
    if (k + 4 > cap) return false;
    if (plain) out[k++] = (char)ch;
    else k += (size_t)snprintf(out + k, 4, "%%%02X", ch);
  }
  out[k] = '\0';
  return true;
}

// The request URL of key in bucket (+ "?query", already encoded).
static px_status request_url(const s3_obj *o, const char *key, const char *query, char *out, size_t cap,
                             const char *what, const char *url) {
  int n = *conf.endpoint ? snprintf(out, cap, "%s/%s/", conf.endpoint, o->bucket)
                         : snprintf(out, cap, "https://%s.s3.%s.amazonaws.com/", o->bucket, conf.region);
  if (n < 0 || (size_t)n >= cap || !encode(out, cap, key, true) || (query && strlen(out) + strlen(query) + 2 > cap))
    return px_error(PX_ERR_INVALID, "%s %s: URL too long", what, url);
  if (query) {
    strcat(out, "?");
    strcat(out, query);
  }
  return PX_OK;
}

// ---- Connections: a pool of curl handles (each keeps its connections) --------

#define POOL_MAX 64
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static CURL *pool[POOL_MAX];
static int pool_n;

static CURL *handle_take(void) {
  CURL *h = NULL;
  pthread_mutex_lock(&pool_mu);
  if (pool_n > 0) h = pool[--pool_n];
  pthread_mutex_unlock(&pool_mu);
  if (h) curl_easy_reset(h);
  else h = curl_easy_init();
  return h;
}

static void handle_give(CURL *h) {
  pthread_mutex_lock(&pool_mu);
  if (pool_n < POOL_MAX) {
    pool[pool_n++] = h;
    h = NULL;
  }
  pthread_mutex_unlock(&pool_mu);
  if (h) curl_easy_cleanup(h);
}

// ---- One request, retried -----------------------------------------------------

typedef struct sink {
  CURL *h;
  unsigned char *dst;  // a ranged read's destination (dst_cap bytes), or NULL: grow buf
  size_t dst_cap;
  unsigned char *buf;
  size_t cap, len;  // body bytes received (2xx)
  bool overflow;    // more than dst_cap
  char err[4096];   // an error response's body (XML)
  size_t err_len;
} sink;

static size_t on_body(char *p, size_t size, size_t nmemb, void *arg) {
  sink *s = arg;
  size_t n = size * nmemb;
  long code = 0;
  curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &code);
  if (code >= 300) {
    size_t room = sizeof s->err - 1 - s->err_len, k = n < room ? n : room;
    memcpy(s->err + s->err_len, p, k);
    s->err_len += k;
    s->err[s->err_len] = '\0';
    return n;
  }
  if (s->dst) {
    if (s->len + n > s->dst_cap) {
      s->overflow = true;
      return 0;
    }
    memcpy(s->dst + s->len, p, n);
    s->len += n;
    return n;
  }
  if (s->len + n + 1 > s->cap) {
    size_t cap = s->cap ? s->cap : 1 << 16;
    while (cap < s->len + n + 1) cap *= 2;
    unsigned char *q = realloc(s->buf, cap);
    if (!q) return 0;  // curl: write error; reported as out of memory below
    s->buf = q;
    s->cap = cap;
  }
  memcpy(s->buf + s->len, p, n);
  s->len += n;
  return n;
}

// The text of <tag>...</tag> in xml from `from` on (entities decoded), or
// false.  *next: just past it.
static bool xml_tag(const char *xml, const char *tag, char *out, size_t cap, const char **next) {
  char open[64], close[64];
  snprintf(open, sizeof open, "<%s>", tag);
  snprintf(close, sizeof close, "</%s>", tag);
  const char *a = strstr(xml, open);
  if (!a) return false;
  a += strlen(open);
  const char *e = strstr(a, close);
  if (!e) return false;
  size_t k = 0;
  for (const char *p = a; p < e && k + 1 < cap; p++) {
    static const struct {
      const char *ent;
      char ch;
    } ents[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    bool done = false;
    if (*p == '&')
      for (size_t j = 0; j < sizeof ents / sizeof *ents && !done; j++)
        if (strncmp(p, ents[j].ent, strlen(ents[j].ent)) == 0) {
          out[k++] = ents[j].ch;
          p += strlen(ents[j].ent) - 1;
          done = true;
        }
    if (!done) out[k++] = *p;
  }
  out[k] = '\0';
  if (next) *next = e + strlen(close);
  return true;
}

typedef enum { REQ_GET, REQ_HEAD } req_method;

typedef struct req_result {
  long code;            // HTTP status of the last attempt (0: none)
  uint64_t total_size;  // from Content-Range (ranged) or Content-Length (HEAD)
} req_result;

// A 4xx: the error naming the object and what the store said.
static px_status client_error(const char *what, const char *url, const s3_obj *o, long code, const sink *s) {
  char ecode[128] = "", emsg[512] = "";
  xml_tag(s->err, "Code", ecode, sizeof ecode, NULL);
  xml_tag(s->err, "Message", emsg, sizeof emsg, NULL);
  const char *sep = *emsg ? ": " : "";
  if (strcmp(ecode, "NoSuchBucket") == 0)
    return px_error(PX_ERR_NOT_FOUND, "%s %s: no bucket \"%s\" (HTTP %ld NoSuchBucket%s%s) at %s", what, url, o->bucket,
                    code, sep, emsg, *conf.endpoint ? conf.endpoint : "AWS");
  if (strcmp(ecode, "NoSuchKey") == 0 || (code == 404 && !*ecode))
    return px_error(PX_ERR_NOT_FOUND, "%s %s: no object \"%s\" in bucket \"%s\" (HTTP %ld%s%s%s%s)", what, url, o->key,
                    o->bucket, code, *ecode ? " " : "", ecode, sep, emsg);
  if (strcmp(ecode, "InvalidAccessKeyId") == 0 || strcmp(ecode, "SignatureDoesNotMatch") == 0 ||
      strcmp(ecode, "InvalidToken") == 0 || strcmp(ecode, "ExpiredToken") == 0 ||
      strcmp(ecode, "AuthorizationHeaderMalformed") == 0)
    return px_error(PX_ERR_IO,
                    "%s %s: the store refused the credentials (HTTP %ld %s%s%s): access key id %s from %s, region %s%s",
                    what, url, code, ecode, sep, emsg, conf.key_id, conf.cred_from, conf.region,
                    strcmp(ecode, "SignatureDoesNotMatch") == 0 ? " (is the secret access key right?)" : "");
  if (strcmp(ecode, "AccessDenied") == 0 || code == 403)
    return px_error(PX_ERR_IO, "%s %s: access denied (HTTP %ld%s%s%s%s) for access key id %s from %s", what, url, code,
                    *ecode ? " " : "", ecode, sep, emsg, conf.key_id, conf.cred_from);
  if (code == 301 || strcmp(ecode, "PermanentRedirect") == 0)
    return px_error(PX_ERR_IO,
                    "%s %s: HTTP %ld%s%s%s%s: bucket \"%s\" is not in region %s (set AWS_REGION to its region)", what,
                    url, code, *ecode ? " " : "", ecode, sep, emsg, o->bucket, conf.region);
  return px_error(PX_ERR_IO, "%s %s: HTTP %ld%s%s%s%s", what, url, code, *ecode ? " " : "", ecode, sep, emsg);
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

// One request: its URL, signature provider and headers, and the checks of
// each attempt's outcome.  request() runs it (blocking, retried in place);
// the batch fetch (below) runs many of them at once on a multi handle.
typedef struct req_spec {
  req_method method;
  const char *what, *url;
  const s3_obj *o;
  uint64_t off;
  size_t range_n;
  char req_url[8192];
  char provider[128];
  struct curl_slist *hdrs;
} req_spec;

static px_status req_prepare(req_spec *q, req_method method, const char *what, const char *url, const s3_obj *o,
                             const char *key, const char *query, uint64_t off, size_t range_n) {
  q->method = method;
  q->what = what;
  q->url = url;
  q->o = o;
  q->off = off;
  q->range_n = range_n;
  q->hdrs = NULL;
  px_status st = request_url(o, key, query, q->req_url, sizeof q->req_url, what, url);
  if (st != PX_OK) return st;
  char hdr_range[96], hdr_token[4200];
  snprintf(q->provider, sizeof q->provider, "aws:amz:%s:s3", conf.region);
  struct curl_slist *hdrs = curl_slist_append(NULL, "x-amz-content-sha256: " EMPTY_SHA256);
  if (hdrs && *conf.token) {
    snprintf(hdr_token, sizeof hdr_token, "x-amz-security-token: %s", conf.token);
    struct curl_slist *h2 = curl_slist_append(hdrs, hdr_token);
    if (!h2) curl_slist_free_all(hdrs);
    hdrs = h2;
  }
  if (hdrs && range_n > 0) {
    snprintf(hdr_range, sizeof hdr_range, "Range: bytes=%llu-%llu", (unsigned long long)off,
             (unsigned long long)(off + range_n - 1));
    struct curl_slist *h2 = curl_slist_append(hdrs, hdr_range);
    if (!h2) curl_slist_free_all(hdrs);
    hdrs = h2;
  }
  if (!hdrs) return px_error(PX_ERR_NOMEM, "%s %s: out of memory", what, url);
  q->hdrs = hdrs;
  return PX_OK;
}

// Set up h (reset) for one attempt of q into s.
static void req_setopt(const req_spec *q, CURL *h, sink *s) {
  curl_easy_reset(h);
  s->h = h;
  s->len = 0;
  s->err_len = 0;
  s->err[0] = '\0';
  s->overflow = false;
  curl_easy_setopt(h, CURLOPT_URL, q->req_url);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, q->hdrs);
  curl_easy_setopt(h, CURLOPT_AWS_SIGV4, q->provider);
  curl_easy_setopt(h, CURLOPT_USERNAME, conf.key_id);
  curl_easy_setopt(h, CURLOPT_PASSWORD, conf.secret);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 20L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);  // a stalled transfer: 60 s without a byte
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
  if (q->method == REQ_HEAD) curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
}

typedef enum { ATTEMPT_DONE, ATTEMPT_FAILED, ATTEMPT_RETRY } attempt_verdict;

// Judge one finished attempt (rc: curl's result).  DONE: the body is in s,
// r filled; FAILED: *st is the error (px_error set); RETRY: `last` says why.
static attempt_verdict req_judge(const req_spec *q, CURL *h, CURLcode rc, sink *s, req_result *r, char *last,
                                 size_t last_cap, px_status *st) {
  const char *what = q->what, *url = q->url;
  uint64_t off = q->off;
  size_t range_n = q->range_n;
  long code = 0;
  curl_off_t cl = -1;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_getinfo(h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
  r->code = code;
  if (rc == CURLE_WRITE_ERROR && s->overflow) {
    *st = px_error(PX_ERR_FORMAT, "%s %s: the store sent more than the %zu bytes asked for (bytes %llu..)", what, url,
                   range_n, (unsigned long long)off);
    return ATTEMPT_FAILED;
  }
  if (rc == CURLE_WRITE_ERROR) {
    *st = px_error(PX_ERR_NOMEM, "%s %s: out of memory after %zu bytes", what, url, s->len);
    return ATTEMPT_FAILED;
  }
  // Below, a failure that is worth another try sets `last` and returns
  // RETRY; anything else is final.
  if (rc != CURLE_OK) {
    // A dropped connection (CURLE_PARTIAL_FILE: the body ended before its
    // Content-Length), a refused one, a timeout...
    if (cl >= 0 && (code >= 200 && code < 300))
      snprintf(last, last_cap, "%s (truncated object: Content-Length %lld, received %zu bytes)", curl_easy_strerror(rc),
               (long long)cl, s->len);
    else snprintf(last, last_cap, "%s (curl error %d)", curl_easy_strerror(rc), (int)rc);
    return ATTEMPT_RETRY;
  }
  if (code >= 200 && code < 300) {
    if (q->method == REQ_GET && cl >= 0 && (uint64_t)cl != s->len) {
      snprintf(last, last_cap, "truncated object: Content-Length %lld, received %zu bytes", (long long)cl, s->len);
      return ATTEMPT_RETRY;
    }
    if (range_n > 0 && s->len != range_n) {
      *st = px_error(PX_ERR_FORMAT, "%s %s: asked for bytes %llu..%llu (%zu), the store sent %zu%s", what, url,
                     (unsigned long long)off, (unsigned long long)(off + range_n - 1), range_n, s->len,
                     code == 200 ? " (HTTP 200: it ignored the Range header)" : " (the object is shorter)");
      return ATTEMPT_FAILED;
    }
    if (range_n > 0) {
      // Content-Range: bytes a-b/TOTAL
      struct curl_header *ch;
      if (curl_easy_header(h, "Content-Range", 0, CURLH_HEADER, -1, &ch) == CURLHE_OK) {
        const char *slash = strrchr(ch->value, '/');
        if (slash) r->total_size = strtoull(slash + 1, NULL, 10);
      }
    } else if (cl >= 0) {
      r->total_size = (uint64_t)cl;
    }
    *st = PX_OK;
    return ATTEMPT_DONE;
  }
  if (code >= 500 || code == 429) {
    char ecode[128] = "";
    xml_tag(s->err, "Code", ecode, sizeof ecode, NULL);
    snprintf(last, last_cap, "HTTP %ld%s%s", code, *ecode ? " " : "", ecode);
    return ATTEMPT_RETRY;
  }
  *st = client_error(what, url, q->o, code, s);
  return ATTEMPT_FAILED;
}

// A failed attempt that will be tried again: counted, and one line on stderr.
static void note_retry(const char *url, int attempt, const char *last, long wait) {
  pthread_mutex_lock(&stat_mu);
  retries_total++;
  pthread_mutex_unlock(&stat_mu);
  fprintf(stderr, "plexus: s3: %s: attempt %d of %d failed: %s; retrying in %.2f s\n", url, attempt, conf.attempts,
          last, (double)wait / 1000.0);
}

static px_status gave_up(const char *what, const char *url, int attempt, const char *last) {
  return px_error(PX_ERR_IO, "%s %s: gave up after %d attempts; the last: %s", what, url, attempt, last);
}

static long next_wait(long wait) { return wait * 2 > 10000 ? 10000 : wait * 2; }

// One request with retries.  range_n > 0: "Range: bytes=off-(off+range_n-1)",
// and exactly range_n bytes must come.  The body lands in s (dst or buf).
static px_status request(req_method method, const char *what, const char *url, const s3_obj *o, const char *key,
                         const char *query, uint64_t off, size_t range_n, sink *s, req_result *r) {
  req_spec q;
  px_status st = req_prepare(&q, method, what, url, o, key, query, off, range_n);
  if (st != PX_OK) return st;
  CURL *h = handle_take();
  if (!h) {
    curl_slist_free_all(q.hdrs);
    return px_error(PX_ERR_NOMEM, "%s %s: libcurl could not make a handle", what, url);
  }
  char last[600] = "";
  long wait = conf.backoff_ms;
  st = PX_ERR_IO;
  for (int attempt = 1; attempt <= conf.attempts; attempt++) {
    req_setopt(&q, h, s);
    CURLcode rc = curl_easy_perform(h);
    attempt_verdict v = req_judge(&q, h, rc, s, r, last, sizeof last, &st);
    if (v != ATTEMPT_RETRY) break;
    if (attempt == conf.attempts) {
      st = gave_up(what, url, attempt, last);
      break;
    }
    note_retry(url, attempt, last, wait);
    sleep_ms(wait);
    wait = next_wait(wait);
  }
  curl_slist_free_all(q.hdrs);
  handle_give(h);
  return st;
}

// ---- Batches: a loader worker's requests, several in flight -------------------
//
// px_s3_batch_begin puts this thread in "plan" mode: the reads it makes are
// recorded (and answered with zeros / an empty object, nothing sent); the
// loader runs the batch's gets once so, then px_s3_batch_fetch sends every
// recorded request on one multi handle, at most conf.in_flight at a time,
// each retried as request() retries it, and keeps the bodies (or each one's
// error message) for this thread.  The loader's second, real pass of gets
// then finds its reads answered from them (a read is served only by a
// recorded request of exactly the same object and bytes; anything else is
// sent as before).  px_s3_batch_end drops what is left.

typedef struct held {
  char *url;
  char *what;  // the reader's ("tokens", "image", ...), for messages
  uint64_t off;
  size_t n;  // ranged: the bytes asked for; whole: 0
  bool whole;
  bool used;
  px_status st;
  void *data;  // ranged: n bytes; whole: len bytes (malloc'ed, at least 1)
  size_t len;
  char *msg;  // st != PX_OK: the message the sequential read would have given
} held;

enum { BATCH_OFF = 0, BATCH_PLAN, BATCH_SERVE };

static _Thread_local struct {
  int mode;
  held *v;
  size_t n, cap;
} tb;

static void held_clear(void) {
  for (size_t k = 0; k < tb.n; k++) {
    free(tb.v[k].url);
    free(tb.v[k].what);
    free(tb.v[k].data);
    free(tb.v[k].msg);
  }
  free(tb.v);
  tb.v = NULL;
  tb.n = tb.cap = 0;
}

// Record a read in plan mode; false when out of memory (then the batch is
// fetched without it: the real pass sends it itself).
static bool plan_record(const char *url, const char *what, uint64_t off, size_t n, bool whole) {
  if (tb.n == tb.cap) {
    size_t cap = tb.cap ? 2 * tb.cap : 64;
    held *v = realloc(tb.v, cap * sizeof *v);
    if (!v) return false;
    tb.v = v;
    tb.cap = cap;
  }
  char *u = strdup(url), *w = strdup(what);
  if (!u || !w) {
    free(u);
    free(w);
    return false;
  }
  tb.v[tb.n++] = (held){.url = u, .what = w, .off = off, .n = n, .whole = whole, .st = PX_OK};
  return true;
}

static held *serve_find(const char *url, uint64_t off, size_t n, bool whole) {
  if (tb.mode != BATCH_SERVE) return NULL;
  for (size_t k = 0; k < tb.n; k++) {
    held *e = &tb.v[k];
    if (!e->used && e->whole == whole && e->off == off && e->n == n && strcmp(e->url, url) == 0) {
      e->used = true;
      return e;
    }
  }
  return NULL;
}

// The error a held request ended with, raised again on this thread.
static px_status held_error(const held *e) { return px_error(e->st, "%s", e->msg ? e->msg : "(no message)"); }

#define MULTI_MAX 64
static pthread_mutex_t multi_mu = PTHREAD_MUTEX_INITIALIZER;
static CURLM *multi_pool[MULTI_MAX];
static int multi_n;

// A multi handle keeps its connections between batches: one per worker,
// taken for a batch and given back.
static CURLM *multi_take(void) {
  CURLM *m = NULL;
  pthread_mutex_lock(&multi_mu);
  if (multi_n > 0) m = multi_pool[--multi_n];
  pthread_mutex_unlock(&multi_mu);
  if (!m && (m = curl_multi_init()) != NULL) curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, (long)conf.in_flight);
  return m;
}

static void multi_give(CURLM *m) {
  pthread_mutex_lock(&multi_mu);
  if (multi_n < MULTI_MAX) {
    multi_pool[multi_n++] = m;
    m = NULL;
  }
  pthread_mutex_unlock(&multi_mu);
  if (m) curl_multi_cleanup(m);
}

typedef struct xfer {
  held *e;
  s3_obj o;
  req_spec q;
  sink s;
  req_result r;
  CURL *h;
  int attempt;      // the attempt running or next
  long wait;        // the backoff before the next retry
  double ready_at;  // px_time_now() from which the next attempt may start
  int state;        // 0 waiting, 1 in flight, 2 done
  char last[600];
} xfer;

static void xfer_finish(xfer *x, px_status st) {
  held *e = x->e;
  e->st = st;
  if (st == PX_OK) {
    if (x->e->whole) {
      if (!x->s.buf) x->s.buf = malloc(1);
      if (!x->s.buf) {
        e->st = px_error(PX_ERR_NOMEM, "%s %s: out of memory", x->q.what, x->q.url);
      } else {
        e->data = x->s.buf;
        e->len = x->s.len;
        x->s.buf = NULL;
      }
    }
  } else {
    free(e->data);
    e->data = NULL;
  }
  if (e->st != PX_OK) e->msg = strdup(px_last_error());
  free(x->s.buf);
  x->s.buf = NULL;
  curl_slist_free_all(x->q.hdrs);
  x->q.hdrs = NULL;
  if (x->h) handle_give(x->h);
  x->h = NULL;
  x->state = 2;
}

// Send tb's recorded requests, at most conf.in_flight at a time.
static void fetch_all(void) {
  size_t n = tb.n;
  xfer *xs = calloc(n, sizeof *xs);
  CURLM *m = xs ? multi_take() : NULL;
  if (!m) {  // no multi handle: every read is sent by the real pass itself
    free(xs);
    for (size_t k = 0; k < n; k++) tb.v[k].used = true;
    return;
  }
  size_t done = 0;
  int active = 0;
  for (size_t k = 0; k < n; k++) {
    xfer *x = &xs[k];
    x->e = &tb.v[k];
    x->attempt = 1;
    x->wait = conf.backoff_ms;
    const char *what = x->e->what;
    px_status st = parse_url(x->e->url, what, &x->o);
    if (st == PX_OK) st = req_prepare(&x->q, REQ_GET, what, x->e->url, &x->o, x->o.key, NULL, x->e->off, x->e->n);
    if (st == PX_OK && !x->e->whole) {
      x->e->data = malloc(x->e->n ? x->e->n : 1);
      if (!x->e->data) st = px_error(PX_ERR_NOMEM, "%s %s: out of memory for %zu bytes", what, x->e->url, x->e->n);
      x->s.dst = x->e->data;
      x->s.dst_cap = x->e->n;
    }
    if (st != PX_OK) {
      xfer_finish(x, st);
      done++;
    }
  }
  while (done < n) {
    double now = px_time_now(), soonest = -1;
    for (size_t k = 0; k < n && active < conf.in_flight; k++) {
      xfer *x = &xs[k];
      const char *what = x->e->what;
      if (x->state != 0) continue;
      if (x->ready_at > now) {
        if (soonest < 0 || x->ready_at < soonest) soonest = x->ready_at;
        continue;
      }
      if (!x->h) x->h = handle_take();
      if (!x->h) {
        xfer_finish(x, px_error(PX_ERR_NOMEM, "%s %s: libcurl could not make a handle", what, x->e->url));
        done++;
        continue;
      }
      req_setopt(&x->q, x->h, &x->s);
      curl_easy_setopt(x->h, CURLOPT_PRIVATE, (void *)x);
      if (curl_multi_add_handle(m, x->h) != CURLM_OK) {
        xfer_finish(x, px_error(PX_ERR_INTERNAL, "%s %s: libcurl could not start the request", what, x->e->url));
        done++;
        continue;
      }
      x->state = 1;
      active++;
    }
    int running = 0;
    curl_multi_perform(m, &running);
    CURLMsg *msg;
    int queued;
    while ((msg = curl_multi_info_read(m, &queued)) != NULL) {
      if (msg->msg != CURLMSG_DONE) continue;
      CURL *h = msg->easy_handle;
      CURLcode rc = msg->data.result;
      xfer *x = NULL;
      curl_easy_getinfo(h, CURLINFO_PRIVATE, (char **)&x);
      curl_multi_remove_handle(m, h);
      active--;
      const char *what = x->e->what;
      px_status st = PX_ERR_IO;
      attempt_verdict v = req_judge(&x->q, h, rc, &x->s, &x->r, x->last, sizeof x->last, &st);
      if (v == ATTEMPT_RETRY && x->attempt == conf.attempts) {
        st = gave_up(what, x->e->url, x->attempt, x->last);
        v = ATTEMPT_FAILED;
      }
      if (v == ATTEMPT_RETRY) {
        note_retry(x->e->url, x->attempt, x->last, x->wait);
        x->ready_at = px_time_now() + (double)x->wait / 1000.0;
        x->wait = next_wait(x->wait);
        x->attempt++;
        x->state = 0;
        continue;
      }
      xfer_finish(x, st);
      done++;
    }
    if (done == n) break;
    // Wait for the sockets, or until the next retry is due.
    int ms = 100;
    if (active == 0 && soonest > 0) {
      double d = (soonest - px_time_now()) * 1000.0;
      ms = d < 0 ? 0 : d > 100 ? 100 : (int)d + 1;
    }
    if (active > 0 || ms > 0) curl_multi_poll(m, NULL, 0, ms, NULL);
  }
  multi_give(m);
  free(xs);
}

int px_s3_in_flight(void) {
  pthread_once(&conf_once, conf_init);
  return conf.in_flight;
}

bool px_s3_batch_begin(void) {
  pthread_once(&conf_once, conf_init);
  held_clear();
  tb.mode = BATCH_OFF;
  if (conf.in_flight <= 1 || !curl_ok || !*conf.key_id) return false;
  tb.mode = BATCH_PLAN;
  return true;
}

size_t px_s3_batch_planned(void) { return tb.mode == BATCH_PLAN ? tb.n : 0; }

bool px_s3_batch_fetch(void) {
  if (tb.mode != BATCH_PLAN) return false;
  if (tb.n == 0) {
    tb.mode = BATCH_OFF;
    return false;
  }
  fetch_all();
  tb.mode = BATCH_SERVE;
  return true;
}

void px_s3_batch_end(void) {
  tb.mode = BATCH_OFF;
  held_clear();
}

// ---- Objects -------------------------------------------------------------------

px_status px_s3_size(const char *url, const char *what, uint64_t *size, bool *missing_key) {
  *size = 0;
  if (missing_key) *missing_key = false;
  s3_obj o;
  px_status st = parse_url(url, what, &o);
  if (st == PX_OK) st = conf_get(what, url);
  if (st != PX_OK) return st;
  sink s = {0};
  req_result r = {0};
  st = request(REQ_HEAD, what, url, &o, o.key, NULL, 0, 0, &s, &r);
  if (st != PX_OK && r.code >= 400 && r.code < 500) {
    // A HEAD's error has no body: ask with a GET of one byte for the
    // store's error code (NoSuchBucket or NoSuchKey, the credentials').
    unsigned char one;
    sink g = {.dst = &one, .dst_cap = 1};
    req_result rg = {0};
    px_status st2 = request(REQ_GET, what, url, &o, o.key, NULL, 0, 1, &g, &rg);
    if (st2 != PX_OK && rg.code >= 400) st = st2;
    char ecode[64] = "";
    xml_tag(g.err, "Code", ecode, sizeof ecode, NULL);
    if (missing_key && rg.code == 404 && (strcmp(ecode, "NoSuchKey") == 0 || !*ecode)) *missing_key = true;
    free(g.buf);
  }
  free(s.buf);
  if (st == PX_OK) *size = r.total_size;
  return st;
}

static px_status get_whole(const char *url, const char *what, const s3_obj *o, void **out, size_t *out_n) {
  sink s = {0};
  req_result r = {0};
  px_status st = request(REQ_GET, what, url, o, o->key, NULL, 0, 0, &s, &r);
  if (st == PX_OK && !s.buf) {
    s.buf = malloc(1);
    if (!s.buf) st = px_error(PX_ERR_NOMEM, "%s %s: out of memory", what, url);
  }
  if (st != PX_OK) {
    free(s.buf);
    return st;
  }
  *out = s.buf;
  *out_n = s.len;
  return PX_OK;
}

px_status px_s3_read_range(const char *url, const char *what, uint64_t offset, size_t n, void *dst) {
  s3_obj o;
  px_status st = parse_url(url, what, &o);
  if (st == PX_OK) st = conf_get(what, url);
  if (st != PX_OK || n == 0) return st;
  if (tb.mode == BATCH_PLAN) {  // record it; the real pass gets the bytes
    memset(dst, 0, n);
    plan_record(url, what, offset, n, false);
    return PX_OK;
  }
  const held *e = serve_find(url, offset, n, false);
  if (e) {
    if (e->st != PX_OK) return held_error(e);
    memcpy(dst, e->data, n);
    return PX_OK;
  }
  sink s = {.dst = dst, .dst_cap = n};
  req_result r = {0};
  st = request(REQ_GET, what, url, &o, o.key, NULL, offset, n, &s, &r);
  free(s.buf);
  return st;
}

// ---- The cache -----------------------------------------------------------------

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;

char *px_s3_cache_path(const char *url) {
  pthread_once(&conf_once, conf_init);
  if (!*conf.cache || !px_s3_is_url(url)) return NULL;
  size_t n = strlen(conf.cache) + strlen(url) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s", conf.cache, url + 5);
  return p;
}

// A key that could leave the cache directory ("..", "." or empty parts).
static bool key_escapes(const char *key) {
  const char *p = key;
  for (;;) {
    const char *e = strchr(p, '/');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return true;
    if (!e) return false;
    p = e + 1;
  }
}

static bool local_size(const char *path, uint64_t *size) {
  struct stat sb;
  if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return false;
  *size = (uint64_t)sb.st_size;
  return true;
}

static px_status read_local(const char *path, const char *what, uint64_t size, void **out, size_t *out_n) {
  FILE *f = fopen(path, "rb");
  if (!f) return px_error(PX_ERR_IO, "%s %s: cannot open the cached copy: %s", what, path, strerror(errno));
  unsigned char *buf = malloc(size ? (size_t)size : 1);
  size_t got = buf ? fread(buf, 1, (size_t)size, f) : 0;
  fclose(f);
  if (!buf) return px_error(PX_ERR_NOMEM, "%s %s: out of memory for %llu bytes", what, path, (unsigned long long)size);
  if (got != size) {
    free(buf);
    return px_error(PX_ERR_IO, "%s %s: the cached copy read short (%zu of %llu bytes)", what, path, got,
                    (unsigned long long)size);
  }
  *out = buf;
  *out_n = (size_t)size;
  return PX_OK;
}

static px_status cache_store(const char *path, const char *what, const void *data, size_t n) {
  char *dir = strdup(path);
  if (!dir) return px_error(PX_ERR_NOMEM, "%s %s: out of memory", what, path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  pthread_mutex_lock(&cache_mu);  // one writer per path in this process (the temporary is per process)
  px_status st = slash ? px_mkdir_p(dir, "s3 cache", false) : PX_OK;
  if (st == PX_OK) st = px_write_file_atomic(path, data, n);
  pthread_mutex_unlock(&cache_mu);
  free(dir);
  if (st != PX_OK) return px_error_wrap(st, "%s: storing the cached copy", what);
  return PX_OK;
}

px_status px_s3_read(const char *url, const char *what, void **out, size_t *out_n) {
  *out = NULL;
  *out_n = 0;
  s3_obj o;
  px_status st = parse_url(url, what, &o);
  if (st == PX_OK) st = conf_get(what, url);
  if (st != PX_OK) return st;
  char *cached = key_escapes(o.key) ? NULL : px_s3_cache_path(url);
  if (tb.mode == BATCH_PLAN) {  // record it (not with a cache: that path HEADs first); answer ""
    if (!cached) plan_record(url, what, 0, 0, true);
    free(cached);
    *out = malloc(1);
    return *out ? PX_OK : px_error(PX_ERR_NOMEM, "%s %s: out of memory", what, url);
  }
  if (!cached) {
    held *e = serve_find(url, 0, 0, true);
    if (!e) return get_whole(url, what, &o, out, out_n);
    if (e->st != PX_OK) return held_error(e);
    *out = e->data;
    *out_n = e->len;
    e->data = NULL;
    return PX_OK;
  }
  uint64_t size = 0, have = 0;
  st = px_s3_size(url, what, &size, NULL);
  if (st == PX_OK && local_size(cached, &have) && have == size) {
    st = read_local(cached, what, size, out, out_n);
  } else if (st == PX_OK) {
    st = get_whole(url, what, &o, out, out_n);
    if (st == PX_OK) st = cache_store(cached, what, *out, *out_n);
    if (st != PX_OK) {
      free(*out);
      *out = NULL;
      *out_n = 0;
    }
  }
  free(cached);
  return st;
}

px_status px_s3_cache_fetch(const char *url, const char *what, uint64_t size, char **local_path) {
  *local_path = NULL;
  s3_obj o;
  px_status st = parse_url(url, what, &o);
  if (st != PX_OK) return st;
  char *cached = key_escapes(o.key) ? NULL : px_s3_cache_path(url);
  if (!cached)
    return px_error(PX_ERR_INVALID, "%s %s: no cache (PX_S3_CACHE unset, or a key with . or .. parts)", what, url);
  uint64_t have = 0;
  if (!(local_size(cached, &have) && have == size)) {
    void *data;
    size_t n;
    st = conf_get(what, url);
    if (st == PX_OK) st = get_whole(url, what, &o, &data, &n);
    if (st == PX_OK && n != size)
      st = px_error(PX_ERR_IO, "%s %s: listed at %llu bytes, read %zu: changed meanwhile?", what, url,
                    (unsigned long long)size, n);
    if (st == PX_OK || n == size) {
      if (st == PX_OK) st = cache_store(cached, what, data, n);
      free(data);
    }
  }
  if (st != PX_OK) {
    free(cached);
    return st;
  }
  *local_path = cached;
  return PX_OK;
}

// ---- Listing -------------------------------------------------------------------

typedef struct listed {
  char **urls;
  uint64_t *sizes;
  char **etags;  // the entries' ETags (quotes removed), when asked for
  size_t n, cap;
} listed;

static bool listed_push(listed *l, const char *bucket, const char *key, uint64_t size, const char *etag) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    char **u = realloc(l->urls, cap * sizeof *u);
    if (u) l->urls = u;
    uint64_t *s = realloc(l->sizes, cap * sizeof *s);
    if (s) l->sizes = s;
    char **t = etag ? realloc(l->etags, cap * sizeof *t) : NULL;
    if (t) l->etags = t;
    if (!u || !s || (etag && !t)) return false;
    l->cap = cap;
  }
  size_t n = strlen(bucket) + strlen(key) + 7;
  char *url = malloc(n);
  char *tag = etag ? strdup(etag) : NULL;
  if (!url || (etag && !tag)) {
    free(url);
    free(tag);
    return false;
  }
  snprintf(url, n, "s3://%s/%s", bucket, key);
  l->urls[l->n] = url;
  if (etag) l->etags[l->n] = tag;
  l->sizes[l->n++] = size;
  return true;
}

static int cmp_url(const void *a, const void *b) {
  const char *const *x = a, *const *y = b;
  return strcmp(*x, *y);
}

px_status px_s3_list(const char *pattern, const char *what, char ***urls, uint64_t **sizes, size_t *n) {
  return px_s3_list_etags(pattern, what, urls, sizes, NULL, n);
}

px_status px_s3_list_etags(const char *pattern, const char *what, char ***urls, uint64_t **sizes, char ***etags,
                           size_t *n) {
  *urls = NULL;
  *sizes = NULL;
  if (etags) *etags = NULL;
  *n = 0;
  s3_obj o;
  px_status st = parse_url(pattern, what, &o);
  if (st == PX_OK) st = conf_get(what, pattern);
  if (st != PX_OK) return st;
  size_t glob_at = strcspn(o.key, "*?[");
  bool glob = o.key[glob_at] != '\0';
  char prefix[1024];
  if (glob_at >= sizeof prefix) return px_error(PX_ERR_INVALID, "%s %s: key too long", what, pattern);
  memcpy(prefix, o.key, glob_at);
  prefix[glob_at] = '\0';
  listed l = {0};
  char token[2048] = "";
  bool exact = false;
  for (int page = 0; st == PX_OK; page++) {
    char query[4096] = "";
    // The parameters in SigV4's canonical order (sorted by name).
    if (*token) {
      strcat(query, "continuation-token=");
      encode(query, sizeof query, token, false);
      strcat(query, "&");
    }
    strcat(query, "list-type=2");
    if (conf.list_max_keys > 0)
      snprintf(query + strlen(query), sizeof query - strlen(query), "&max-keys=%ld", conf.list_max_keys);
    strcat(query, "&prefix=");
    if (!encode(query, sizeof query, prefix, false)) {
      st = px_error(PX_ERR_INVALID, "%s %s: prefix too long", what, pattern);
      break;
    }
    sink s = {0};
    req_result r = {0};
    st = request(REQ_GET, what, pattern, &o, "", query, 0, 0, &s, &r);
    if (st != PX_OK) {
      free(s.buf);
      break;
    }
    const char *xml = s.buf ? (const char *)s.buf : "";
    if (s.buf) s.buf[s.len] = '\0';  // on_body keeps one byte spare
    const char *p = xml, *next;
    char key[1024], size_s[32], block[4096], etag[256];
    while (st == PX_OK && xml_tag(p, "Contents", block, sizeof block, &next)) {
      p = next;
      if (!xml_tag(block, "Key", key, sizeof key, NULL) || !xml_tag(block, "Size", size_s, sizeof size_s, NULL)) {
        st = px_error(PX_ERR_FORMAT, "%s %s: a listing entry without Key or Size", what, pattern);
        break;
      }
      bool keep = glob ? fnmatch(o.key, key, FNM_PATHNAME) == 0 : key[strlen(key) - 1] != '/';
      // A key equal to the pattern names one object, unless it is a "folder"
      // marker (a key ending in '/', as the AWS console makes): then the
      // pattern is a prefix and the objects under it are the listing.
      if (!glob && keep && strcmp(key, o.key) == 0) exact = true;
      if (etags) {  // "&quot;hex&quot;" decoded, the quotes dropped; a store without ETags: ""
        char raw[256] = "";
        xml_tag(block, "ETag", raw, sizeof raw, NULL);
        size_t k = 0;
        for (const char *c = raw; *c; c++)
          if (*c != '"') etag[k++] = *c;
        etag[k] = '\0';
      }
      if (keep && !listed_push(&l, o.bucket, key, strtoull(size_s, NULL, 10), etags ? etag : NULL))
        st = px_error(PX_ERR_NOMEM, "%s %s: out of memory listing", what, pattern);
    }
    char truncated[16] = "";
    xml_tag(xml, "IsTruncated", truncated, sizeof truncated, NULL);
    bool more = strcmp(truncated, "true") == 0 && xml_tag(xml, "NextContinuationToken", token, sizeof token, NULL);
    free(s.buf);
    if (!more) break;
  }
  if (st == PX_OK && exact) {
    // The pattern names one object: that one only.
    size_t k = 0;
    for (size_t j = 0; j < l.n; j++) {
      if (strcmp(l.urls[j] + 6 + strlen(o.bucket), o.key) == 0) {
        char *u = l.urls[j];
        l.urls[j] = l.urls[0];
        l.urls[0] = u;
        uint64_t z = l.sizes[j];
        l.sizes[j] = l.sizes[0];
        l.sizes[0] = z;
        if (l.etags) {
          char *t = l.etags[j];
          l.etags[j] = l.etags[0];
          l.etags[0] = t;
        }
        k = 1;
        break;
      }
    }
    for (size_t j = k; j < l.n; j++) {
      free(l.urls[j]);
      if (l.etags) free(l.etags[j]);
    }
    l.n = k;
  }
  if (st == PX_OK && l.n == 0)
    st = px_error(PX_ERR_NOT_FOUND, "%s %s: no object in bucket \"%s\" %s \"%s\"", what, pattern, o.bucket,
                  glob ? "matches" : "has a key starting with", glob ? o.key : prefix);
  struct entry {
    char *url;
    uint64_t size;
    char *etag;
  } *e = st == PX_OK ? malloc(l.n * sizeof *e) : NULL;
  if (st == PX_OK && !e) st = px_error(PX_ERR_NOMEM, "%s %s: out of memory", what, pattern);
  if (st != PX_OK) {
    if (etags) px_s3_etags_free(l.etags, l.n);
    px_s3_list_free(l.urls, l.sizes, l.n);
    return st;
  }
  // Sorted bytewise, as the local glob's shards are: the same order
  // everywhere (S3 lists in that order already; other stores may not).
  for (size_t j = 0; j < l.n; j++) e[j] = (struct entry){l.urls[j], l.sizes[j], l.etags ? l.etags[j] : NULL};
  qsort(e, l.n, sizeof *e, cmp_url);  // by the first member, the URL
  for (size_t j = 0; j < l.n; j++) {
    l.urls[j] = e[j].url;
    l.sizes[j] = e[j].size;
    if (l.etags) l.etags[j] = e[j].etag;
  }
  free(e);
  *urls = l.urls;
  *sizes = l.sizes;
  if (etags) *etags = l.etags;
  *n = l.n;
  return PX_OK;
}

#else  // built without libcurl: every s3:// path is refused, saying why

static px_status no_curl(const char *what, const char *url) {
  return px_error(PX_ERR_UNSUPPORTED,
                  "%s %s: this plexus was built without libcurl, so it cannot read s3:// paths "
                  "(apt-get install libcurl4-openssl-dev, then configure and build again)",
                  what, url ? url : "(null)");
}

px_status px_s3_size(const char *url, const char *what, uint64_t *size, bool *missing_key) {
  *size = 0;
  if (missing_key) *missing_key = false;
  return no_curl(what, url);
}

px_status px_s3_read(const char *url, const char *what, void **out, size_t *out_n) {
  *out = NULL;
  *out_n = 0;
  return no_curl(what, url);
}

px_status px_s3_read_range(const char *url, const char *what, uint64_t offset, size_t n, void *dst) {
  (void)offset, (void)n, (void)dst;
  return no_curl(what, url);
}

px_status px_s3_list(const char *pattern, const char *what, char ***urls, uint64_t **sizes, size_t *n) {
  return px_s3_list_etags(pattern, what, urls, sizes, NULL, n);
}

px_status px_s3_list_etags(const char *pattern, const char *what, char ***urls, uint64_t **sizes, char ***etags,
                           size_t *n) {
  *urls = NULL;
  *sizes = NULL;
  if (etags) *etags = NULL;
  *n = 0;
  return no_curl(what, pattern);
}

char *px_s3_cache_path(const char *url) {
  (void)url;
  return NULL;
}

px_status px_s3_cache_fetch(const char *url, const char *what, uint64_t size, char **local_path) {
  (void)size;
  *local_path = NULL;
  return no_curl(what, url);
}

uint64_t px_s3_retries(void) { return 0; }

int px_s3_in_flight(void) { return 1; }
bool px_s3_batch_begin(void) { return false; }
size_t px_s3_batch_planned(void) { return 0; }
bool px_s3_batch_fetch(void) { return false; }
void px_s3_batch_end(void) {}

#endif
