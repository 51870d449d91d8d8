// Image decode and encode: JPEG through the TurboJPEG API of libjpeg-turbo,
// PNG through libpng.  Everything is decoded to 8-bit RGB or gray, row-major
// H×W×C, whatever the file holds (palette, 16-bit, gray+alpha, RGBA, CMYK).
//
// libpng reports errors by longjmp; every resource that must survive the jump
// is held in a volatile local or in the png structs themselves and freed on
// the one error path.  TurboJPEG reports errors by return value.
#define _POSIX_C_SOURCE 200809L
#include "plexus/data.h"
#include "data/file.h"

#include <errno.h>
#include <png.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

// Larger images are refused rather than allocated: a corrupt header must not
// ask for gigabytes.  65,500 is JPEG's own limit per side.
#define MAX_SIDE 65500
#define MAX_BYTES ((size_t)1 << 30)

static px_status check_size(const char *name, const char *kind, int w, int h, int channels) {
  if (w <= 0 || h <= 0 || w > MAX_SIDE || h > MAX_SIDE || (size_t)w * (size_t)h * (size_t)channels > MAX_BYTES)
    return px_error(PX_ERR_FORMAT,
                    "image %s: %s of %d×%d pixels; expected sides in 1..%d and at most %zu bytes decoded", name, kind,
                    w, h, MAX_SIDE, MAX_BYTES);
  return PX_OK;
}

// ---- JPEG -------------------------------------------------------------------
// One decompressor per thread, made on first use and destroyed when the
// thread ends: tjInitDecompress allocates libjpeg's state (tens of KB), too
// much to redo for every sample of a 256×256 dataset.
static pthread_key_t tj_key;
static pthread_once_t tj_once = PTHREAD_ONCE_INIT;
static void tj_destroy(void *h) { tjDestroy((tjhandle)h); }
static void tj_key_make(void) { (void)pthread_key_create(&tj_key, tj_destroy); }

static tjhandle tj_decompressor(void) {
  pthread_once(&tj_once, tj_key_make);
  tjhandle h = pthread_getspecific(tj_key);
  if (!h) {
    h = tjInitDecompress();
    if (h && pthread_setspecific(tj_key, h) != 0) {
      tjDestroy(h);
      h = NULL;
    }
  }
  return h;
}

// Adobe CMYK JPEGs store inverted ink (255 = no ink), which libjpeg passes
// through: R = C·K/255 (likewise G from M, B from Y), as Pillow does.
static void cmyk_to_rgb_or_gray(const uint8_t *cmyk, uint8_t *out, size_t pixels, int channels) {
  for (size_t p = 0; p < pixels; p++) {
    const uint8_t *s = cmyk + 4 * p;
    int k = s[3];
    int r = (s[0] * k + 127) / 255, g = (s[1] * k + 127) / 255, b = (s[2] * k + 127) / 255;
    if (channels == 3) {
      out[3 * p] = (uint8_t)r;
      out[3 * p + 1] = (uint8_t)g;
      out[3 * p + 2] = (uint8_t)b;
    } else {
      // ITU-R 601 luma, Pillow's "L": (299 R + 587 G + 114 B) / 1000
      out[p] = (uint8_t)((299 * r + 587 * g + 114 * b + 500) / 1000);
    }
  }
}

static px_status decode_jpeg(const uint8_t *buf, size_t n, const char *name, int channels, px_image *out) {
  tjhandle tj = tj_decompressor();
  if (!tj) return px_error(PX_ERR_NOMEM, "image %s: cannot create a JPEG decompressor: %s", name, tjGetErrorStr2(NULL));
  if (n > (size_t)0xffffffffUL) return px_error(PX_ERR_FORMAT, "image %s: a JPEG of %zu bytes is too large", name, n);
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, buf, (unsigned long)n, &w, &h, &subsamp, &colorspace) != 0)
    return px_error(PX_ERR_FORMAT, "image %s: not a readable JPEG: libjpeg-turbo says \"%s\"", name,
                    tjGetErrorStr2(tj));
  if (w <= 0 || h <= 0)
    return px_error(PX_ERR_FORMAT, "image %s: JPEG header is incomplete (no frame size found)", name);
  px_status st = check_size(name, "a JPEG", w, h, channels);
  if (st != PX_OK) return st;
  bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  size_t pixels = (size_t)w * (size_t)h;
  uint8_t *data = malloc(pixels * (size_t)channels);
  uint8_t *tmp = cmyk ? malloc(pixels * 4) : NULL;
  if (!data || (cmyk && !tmp)) {
    free(data);
    free(tmp);
    return px_error(PX_ERR_NOMEM, "image %s: out of memory for %d×%d pixels", name, w, h);
  }
  int pf = cmyk ? TJPF_CMYK : channels == 3 ? TJPF_RGB : TJPF_GRAY;
  if (tjDecompress2(tj, buf, (unsigned long)n, cmyk ? tmp : data, w, 0, h, pf, 0) != 0) {
    // Warnings (extraneous bytes between markers, ...) leave a good image,
    // as they do in Pillow; a file cut short does not, so its warning
    // ("Premature end of JPEG file") is an error here.
    const char *why = tjGetErrorStr2(tj);
    if (tjGetErrorCode(tj) != TJERR_WARNING || strstr(why, "Premature end")) {
      px_error(PX_ERR_FORMAT, "image %s: JPEG of %d×%d does not decode: libjpeg-turbo says \"%s\"", name, w, h, why);
      free(data);
      free(tmp);
      return PX_ERR_FORMAT;
    }
  }
  if (cmyk) {
    cmyk_to_rgb_or_gray(tmp, data, pixels, channels);
    free(tmp);
  }
  *out = (px_image){.width = w, .height = h, .channels = channels, .data = data};
  return PX_OK;
}

// ---- PNG --------------------------------------------------------------------
typedef struct png_src {
  const uint8_t *p;
  size_t left;
  char why[160];  // libpng's message for the last error
} png_src;

static void png_on_error(png_structp png, png_const_charp msg) {
  png_src *src = png_get_error_ptr(png);
  snprintf(src->why, sizeof src->why, "%s", msg);
  png_longjmp(png, 1);
}
// Warnings (a bad CRC in an ancillary chunk, an unknown profile) leave a good
// image; the library stays silent on them.
static void png_on_warning(png_structp png, png_const_charp msg) {
  (void)png;
  (void)msg;
}

static void png_read_mem(png_structp png, png_bytep dst, size_t n) {
  png_src *src = png_get_io_ptr(png);
  if (n > src->left) png_error(png, "the file ends early (truncated)");
  memcpy(dst, src->p, n);
  src->p += n;
  src->left -= n;
}

static px_status decode_png(const uint8_t *buf, size_t n, const char *name, int channels, px_image *out) {
  png_src src = {.p = buf, .left = n, .why = ""};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  if (!png || !info) {
    png_destroy_read_struct(png ? &png : NULL, NULL, NULL);
    return px_error(PX_ERR_NOMEM, "image %s: cannot create a PNG decoder", name);
  }
  // Live across the longjmp: volatile, freed on the error path.
  uint8_t *volatile data = NULL;
  png_bytep *volatile rows = NULL;
  if (setjmp(png_jmpbuf(png))) {
    free(data);
    free(rows);
    png_destroy_read_struct(&png, &info, NULL);
    return px_error(PX_ERR_FORMAT, "image %s: not a readable PNG: libpng says \"%s\"", name, src.why);
  }
  png_set_read_fn(png, &src, png_read_mem);
  png_set_user_limits(png, MAX_SIDE, MAX_SIDE);
  png_read_info(png, info);
  png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  int color = png_get_color_type(png, info);

  // To 8-bit samples, alpha dropped (Pillow's convert("RGB") does the same),
  // then to the number of channels asked for.
  png_set_expand(png);  // palette -> RGB, gray < 8 bits -> 8, tRNS -> alpha
  png_set_strip_16(png);
  png_set_strip_alpha(png);
  bool is_gray = !(color & PNG_COLOR_MASK_COLOR);
  if (channels == 3 && is_gray) png_set_gray_to_rgb(png);
  // Pillow's "L": (299 R + 587 G + 114 B)/1000; libpng takes the red and
  // green weights in units of 1/100000.
  if (channels == 1 && !is_gray) png_set_rgb_to_gray_fixed(png, 1, 29900, 58700);
  (void)png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if ((int)png_get_channels(png, info) != channels || png_get_bit_depth(png, info) != 8)
    png_error(png, "unexpected channel count or depth after conversion");
  px_status st = check_size(name, "a PNG", (int)w, (int)h, channels);
  if (st != PX_OK) {
    png_destroy_read_struct(&png, &info, NULL);
    return st;
  }
  size_t pitch = (size_t)w * (size_t)channels;
  data = malloc(pitch * h);
  rows = malloc(sizeof(png_bytep) * h);
  if (!data || !rows) png_error(png, "out of memory");
  for (png_uint_32 y = 0; y < h; y++) rows[y] = data + y * pitch;
  png_read_image(png, rows);
  png_read_end(png, NULL);
  free(rows);
  png_destroy_read_struct(&png, &info, NULL);
  *out = (px_image){.width = (int)w, .height = (int)h, .channels = channels, .data = data};
  return PX_OK;
}

// ---- Public ------------------------------------------------------------------
px_status px_image_decode(const void *buf, size_t n, const char *name, int channels, px_image *out) {
  if (!out) return px_error(PX_ERR_INVALID, "image: NULL output");
  *out = (px_image){0};
  if (!name) name = "(memory)";
  if (channels != 3 && channels != 1)
    return px_error(PX_ERR_INVALID, "image %s: channels must be 3 (RGB) or 1 (gray), got %d", name, channels);
  if (!buf && n) return px_error(PX_ERR_INVALID, "image %s: NULL buffer", name);
  static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  const uint8_t *b = buf;
  if (n >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) return decode_jpeg(b, n, name, channels, out);
  if (n >= 8 && memcmp(b, png_sig, 8) == 0) return decode_png(b, n, name, channels, out);
  return px_error(PX_ERR_FORMAT,
                  "image %s: neither JPEG (FF D8 FF) nor PNG (89 50 4E 47 0D 0A 1A 0A) by its first bytes (%zu bytes)",
                  name, n);
}

px_status px_image_load(const char *path, int channels, px_image *out) {
  if (out) *out = (px_image){0};
  if (!path || !out) return px_error(PX_ERR_INVALID, "image: NULL path or output");
  void *buf;
  size_t n;
  px_status st = px_data_read_file(path, "image", false, &buf, &n);
  if (st != PX_OK) return st == PX_ERR_NOT_FOUND ? PX_ERR_IO : st;  // a missing image is an I/O error (skip_bad)
  st = px_image_decode(buf, n, path, channels, out);
  free(buf);
  return st;
}

void px_image_free(px_image *img) {
  if (!img) return;
  free(img->data);
  *img = (px_image){0};
}

// ---- Encode -------------------------------------------------------------------
typedef struct mem_sink {
  uint8_t *p;
  size_t n, cap;
  bool failed;
} mem_sink;

static void png_write_mem(png_structp png, png_bytep src, size_t n) {
  mem_sink *s = png_get_io_ptr(png);
  if (s->n + n > s->cap) {
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < s->n + n) cap *= 2;
    uint8_t *p = realloc(s->p, cap);
    if (!p) png_error(png, "out of memory");
    s->p = p;
    s->cap = cap;
  }
  memcpy(s->p + s->n, src, n);
  s->n += n;
}
static void png_flush_mem(png_structp png) { (void)png; }

static px_status encode_png(const char *path, const px_image *img, mem_sink *sink) {
  png_src err = {.why = ""};
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &err, png_on_error, png_on_warning);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  if (!png || !info) {
    png_destroy_write_struct(png ? &png : NULL, NULL);
    return px_error(PX_ERR_NOMEM, "image %s: cannot create a PNG encoder", path);
  }
  png_bytep *volatile rows = NULL;
  if (setjmp(png_jmpbuf(png))) {
    free(rows);
    png_destroy_write_struct(&png, &info);
    return px_error(PX_ERR_INTERNAL, "image %s: PNG encoding failed: libpng says \"%s\"", path, err.why);
  }
  png_set_write_fn(png, sink, png_write_mem, png_flush_mem);
  png_set_IHDR(png, info, (png_uint_32)img->width, (png_uint_32)img->height, 8,
               img->channels == 3 ? PNG_COLOR_TYPE_RGB : PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  rows = malloc(sizeof(png_bytep) * (size_t)img->height);
  if (!rows) png_error(png, "out of memory");
  size_t pitch = (size_t)img->width * (size_t)img->channels;
  for (int y = 0; y < img->height; y++) rows[y] = img->data + (size_t)y * pitch;
  png_write_image(png, rows);
  png_write_end(png, NULL);
  free(rows);
  png_destroy_write_struct(&png, &info);
  return PX_OK;
}

static px_status encode_jpeg(const char *path, const px_image *img, int quality, mem_sink *sink) {
  tjhandle tj = tjInitCompress();
  if (!tj) return px_error(PX_ERR_NOMEM, "image %s: cannot create a JPEG compressor", path);
  unsigned char *jpeg = NULL;
  unsigned long size = 0;
  int pf = img->channels == 3 ? TJPF_RGB : TJPF_GRAY;
  int subsamp = img->channels == 3 ? TJSAMP_420 : TJSAMP_GRAY;
  if (tjCompress2(tj, img->data, img->width, 0, img->height, pf, &jpeg, &size, subsamp, quality, 0) != 0) {
    px_error(PX_ERR_INTERNAL, "image %s: JPEG encoding failed: libjpeg-turbo says \"%s\"", path, tjGetErrorStr2(tj));
    tjFree(jpeg);
    tjDestroy(tj);
    return PX_ERR_INTERNAL;
  }
  tjDestroy(tj);
  sink->p = malloc(size);
  if (!sink->p) {
    tjFree(jpeg);
    return px_error(PX_ERR_NOMEM, "image %s: out of memory", path);
  }
  memcpy(sink->p, jpeg, size);
  sink->n = sink->cap = size;
  tjFree(jpeg);
  return PX_OK;
}

static bool ends_with_png(const char *path) {
  size_t n = strlen(path);
  if (n < 4) return false;
  const char *e = path + n - 4;
  return e[0] == '.' && (e[1] | 32) == 'p' && (e[2] | 32) == 'n' && (e[3] | 32) == 'g';
}

px_status px_image_save(const char *path, const px_image *img, int jpeg_quality) {
  if (!path || !img || !img->data) return px_error(PX_ERR_INVALID, "image save: NULL path or image");
  if (img->channels != 3 && img->channels != 1)
    return px_error(PX_ERR_INVALID, "image save %s: channels must be 3 or 1, got %d", path, img->channels);
  px_status st = check_size(path, "an image", img->width, img->height, img->channels);
  if (st != PX_OK) return st;
  bool png = ends_with_png(path);
  if (!png && (jpeg_quality < 1 || jpeg_quality > 100))
    return px_error(PX_ERR_INVALID, "image save %s: JPEG quality must be in 1..100, got %d", path, jpeg_quality);
  // Encode in memory, then one atomic write: a reader never sees half an image.
  mem_sink sink = {0};
  st = png ? encode_png(path, img, &sink) : encode_jpeg(path, img, jpeg_quality, &sink);
  if (st == PX_OK) st = px_write_file_atomic(path, sink.p, sink.n);
  free(sink.p);
  return st;
}
