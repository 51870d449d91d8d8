// Images written by px_image_save decode back: PNG exactly, JPEG within the
// loss of quality 95; PNG's other forms (palette, 16-bit, gray+alpha, RGBA,
// interlaced) come out as 8-bit RGB or gray; gray <-> RGB follow Pillow.
// If this fails, training data is silently wrong (swapped channels, wrong
// rows, alpha read as color), or a corrupt or truncated file crashes a
// worker or passes as an image instead of an error that names it.
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <dirent.h>
#include <png.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_dir.h"

static px_image make_image(int w, int h, int c, bool smooth) {
  px_image img = {.width = w, .height = h, .channels = c, .data = malloc((size_t)w * h * c)};
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int k = 0; k < c; k++) {
        int v = smooth ? x * 200 / (w - 1) + k * 25 : (x * 37 + y * 91 + k * 53) % 256;
        if (smooth && k == 1) v = y * 255 / (h - 1);
        img.data[((size_t)y * w + x) * c + k] = (uint8_t)v;
      }
  return img;
}

static void write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  fwrite(p, 1, n, f);
  fclose(f);
}

static void *read_bytes(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  rewind(f);
  void *p = malloc(*n);
  if (fread(p, 1, *n, f) != *n) *n = 0;
  fclose(f);
  return p;
}

// A PNG in a form px_image_save does not write, straight through libpng.
// rows: 16-bit samples are given as values 0..65535; 8-bit as 0..255.
static void write_png_raw(const char *path, int w, int h, int color_type, int depth, const uint16_t *samples, int spp,
                          const png_color *palette, int n_palette, bool interlace) {
  FILE *f = fopen(path, "wb");
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
  png_infop info = png_create_info_struct(png);
  png_init_io(png, f);
  png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, depth, color_type,
               interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (palette) png_set_PLTE(png, info, palette, n_palette);
  png_write_info(png, info);
  size_t rowbytes = png_get_rowbytes(png, info);
  png_bytep *rows = malloc(sizeof(png_bytep) * (size_t)h);
  for (int y = 0; y < h; y++) {
    rows[y] = calloc(rowbytes, 1);
    for (int x = 0; x < w * spp; x++) {
      uint16_t v = samples[(size_t)y * w * spp + x];
      if (depth == 16) {
        rows[y][2 * x] = (uint8_t)(v >> 8);
        rows[y][2 * x + 1] = (uint8_t)v;
      } else if (depth == 8) {
        rows[y][x] = (uint8_t)v;
      } else {  // 4-bit palette indices, high nibble first
        rows[y][x / 2] |= (uint8_t)(v << (x % 2 ? 0 : 4));
      }
    }
  }
  png_write_image(png, rows);
  png_write_end(png, NULL);
  png_destroy_write_struct(&png, &info);
  for (int y = 0; y < h; y++) free(rows[y]);
  free(rows);
  fclose(f);
}

static int max_abs_diff(const px_image *a, const px_image *b) {
  int m = 0;
  for (size_t k = 0; k < (size_t)a->width * a->height * a->channels; k++) {
    int d = abs((int)a->data[k] - (int)b->data[k]);
    if (d > m) m = d;
  }
  return m;
}

static double mean_abs_diff(const px_image *a, const px_image *b) {
  double s = 0;
  size_t n = (size_t)a->width * a->height * a->channels;
  for (size_t k = 0; k < n; k++) s += abs((int)a->data[k] - (int)b->data[k]);
  return s / (double)n;
}

static int pillow_gray(const uint8_t *rgb) { return (299 * rgb[0] + 587 * rgb[1] + 114 * rgb[2] + 500) / 1000; }

static void png_roundtrips_exactly(void) {
  px_image rgb = make_image(37, 23, 3, false), gray = make_image(19, 11, 1, false), back;
  CHECK_OK(px_image_save(in_dir("rgb.png"), &rgb, 0));
  CHECK_OK(px_image_load(in_dir("rgb.png"), 3, &back));
  CHECK(back.width == 37 && back.height == 23 && back.channels == 3, "rgb.png came back %d×%d×%d", back.width,
        back.height, back.channels);
  CHECK(memcmp(back.data, rgb.data, 37 * 23 * 3) == 0, "rgb.png differs from what was written");
  px_image_free(&back);

  // RGB read as gray: Pillow's "L" weights (libpng rounds its own way: ±1).
  CHECK_OK(px_image_load(in_dir("rgb.png"), 1, &back));
  CHECK(back.channels == 1, "gray read has %d channels", back.channels);
  int worst = 0;
  for (int p = 0; p < 37 * 23; p++) {
    int d = abs(back.data[p] - pillow_gray(rgb.data + 3 * p));
    if (d > worst) worst = d;
  }
  CHECK(worst <= 1, "RGB -> gray differs from (299R + 587G + 114B)/1000 by up to %d", worst);
  px_image_free(&back);

  CHECK_OK(px_image_save(in_dir("gray.png"), &gray, 0));
  CHECK_OK(px_image_load(in_dir("gray.png"), 1, &back));
  CHECK(back.width == 19 && back.height == 11 && memcmp(back.data, gray.data, 19 * 11) == 0, "gray.png differs");
  px_image_free(&back);
  // Gray read as RGB: the value in all three channels.
  CHECK_OK(px_image_load(in_dir("gray.png"), 3, &back));
  int bad = 0;
  for (int p = 0; p < 19 * 11; p++)
    for (int k = 0; k < 3; k++) bad += back.data[3 * p + k] != gray.data[p];
  CHECK(bad == 0, "gray -> RGB: %d samples are not the gray value", bad);
  px_image_free(&back);
  px_image_free(&rgb);
  px_image_free(&gray);

  // No temporary file is left beside the images (atomic writes).
  DIR *dp = opendir(dir);
  struct dirent *e;
  while ((e = readdir(dp))) CHECK(!strstr(e->d_name, ".tmp"), "temporary file %s left behind", e->d_name);
  closedir(dp);
}

static void jpeg_roundtrips_within_tolerance(void) {
  px_image rgb = make_image(64, 48, 3, true), gray = make_image(40, 30, 1, true), back;
  CHECK_OK(px_image_save(in_dir("rgb.jpg"), &rgb, 95));
  CHECK_OK(px_image_load(in_dir("rgb.jpg"), 3, &back));
  CHECK(back.width == 64 && back.height == 48 && back.channels == 3, "rgb.jpg came back %d×%d×%d", back.width,
        back.height, back.channels);
  // Quality 95 with 4:2:0 chroma on a smooth image: a few levels on average.
  double mad = mean_abs_diff(&back, &rgb);
  int mx = max_abs_diff(&back, &rgb);
  CHECK(mad < 3.0 && mx < 40, "rgb.jpg: mean |diff| %.2f (want < 3), max %d (want < 40)", mad, mx);
  px_image_free(&back);

  CHECK_OK(px_image_save(in_dir("gray.jpeg"), &gray, 95));
  CHECK_OK(px_image_load(in_dir("gray.jpeg"), 1, &back));
  mad = mean_abs_diff(&back, &gray);
  CHECK(back.channels == 1 && mad < 2.0, "gray.jpeg: %d channels, mean |diff| %.2f", back.channels, mad);
  px_image_free(&back);
  // Quality matters: 10 is visibly worse than 95 (the argument is used).
  CHECK_OK(px_image_save(in_dir("rgb10.jpg"), &rgb, 10));
  CHECK_OK(px_image_load(in_dir("rgb10.jpg"), 3, &back));
  CHECK(mean_abs_diff(&back, &rgb) > mad, "quality 10 is no worse than 95");
  px_image_free(&back);
  CHECK(px_image_save(in_dir("bad.jpg"), &rgb, 0) == PX_ERR_INVALID, "JPEG quality 0 accepted");
  px_image_free(&rgb);
  px_image_free(&gray);
}

static void png_forms_become_8bit(void) {
  enum { W = 5, H = 3 };
  uint16_t s[W * H * 4];
  px_image img;
  // RGBA: alpha dropped, colour kept.
  for (int p = 0; p < W * H; p++)
    for (int k = 0; k < 4; k++) s[4 * p + k] = (uint16_t)((p * 40 + k * 70) % 256);
  write_png_raw(in_dir("rgba.png"), W, H, PNG_COLOR_TYPE_RGB_ALPHA, 8, s, 4, NULL, 0, false);
  CHECK_OK(px_image_load(in_dir("rgba.png"), 3, &img));
  int bad = 0;
  for (int p = 0; p < W * H; p++)
    for (int k = 0; k < 3; k++) bad += img.data[3 * p + k] != s[4 * p + k];
  CHECK(bad == 0 && img.channels == 3, "RGBA -> RGB: %d samples wrong", bad);
  px_image_free(&img);

  // Gray + alpha -> gray.
  for (int p = 0; p < W * H; p++) s[2 * p] = (uint16_t)(p * 17), s[2 * p + 1] = 9;
  write_png_raw(in_dir("ga.png"), W, H, PNG_COLOR_TYPE_GRAY_ALPHA, 8, s, 2, NULL, 0, false);
  CHECK_OK(px_image_load(in_dir("ga.png"), 1, &img));
  bad = 0;
  for (int p = 0; p < W * H; p++) bad += img.data[p] != s[2 * p];
  CHECK(bad == 0 && img.channels == 1, "gray+alpha -> gray: %d samples wrong", bad);
  px_image_free(&img);

  // 16-bit RGB (interlaced): the high byte.
  for (int k = 0; k < W * H * 3; k++) s[k] = (uint16_t)(k * 4099 % 65536);
  write_png_raw(in_dir("rgb16.png"), W, H, PNG_COLOR_TYPE_RGB, 16, s, 3, NULL, 0, true);
  CHECK_OK(px_image_load(in_dir("rgb16.png"), 3, &img));
  bad = 0;
  for (int k = 0; k < W * H * 3; k++) bad += img.data[k] != (s[k] >> 8);
  CHECK(bad == 0, "16-bit -> 8-bit: %d samples are not the high byte", bad);
  px_image_free(&img);

  // 4-bit palette -> the palette's colours.
  png_color pal[3] = {{255, 0, 0}, {0, 128, 0}, {10, 20, 250}};
  for (int p = 0; p < W * H; p++) s[p] = (uint16_t)(p % 3);
  write_png_raw(in_dir("pal.png"), W, H, PNG_COLOR_TYPE_PALETTE, 4, s, 1, pal, 3, false);
  CHECK_OK(px_image_load(in_dir("pal.png"), 3, &img));
  bad = 0;
  for (int p = 0; p < W * H; p++) {
    const png_color *c = &pal[p % 3];
    bad += img.data[3 * p] != c->red || img.data[3 * p + 1] != c->green || img.data[3 * p + 2] != c->blue;
  }
  CHECK(bad == 0, "palette -> RGB: %d pixels wrong", bad);
  px_image_free(&img);
}

// A failed load names the file and says what was wrong.
static void expect_error(const char *path, px_status want, const char *why_contains) {
  px_image img = {.width = 7};
  px_status st = px_image_load(path, 3, &img);
  CHECK(st == want, "%s: got %s, want %s", path, px_status_name(st), px_status_name(want));
  CHECK(strstr(px_last_error(), path) != NULL, "the message does not name %s: %s", path, px_last_error());
  CHECK(strstr(px_last_error(), why_contains) != NULL, "the message for %s lacks \"%s\": %s", path, why_contains,
        px_last_error());
  CHECK(img.data == NULL && img.width == 0, "a failed load left an image behind");
}

static void corrupt_files_are_rejected_by_name(void) {
  size_t n;
  uint8_t *png = read_bytes(in_dir("rgb.png"), &n);
  write_bytes(in_dir("cut.png"), png, n / 2);
  expect_error(in_dir("cut.png"), PX_ERR_FORMAT, "libpng");
  // A flipped byte inside the image data: libpng's CRC check catches it.
  png[n / 2] ^= 0x55;
  write_bytes(in_dir("flip.png"), png, n);
  expect_error(in_dir("flip.png"), PX_ERR_FORMAT, "PNG");
  write_bytes(in_dir("sig.png"), png, 8);  // the signature and nothing else
  expect_error(in_dir("sig.png"), PX_ERR_FORMAT, "libpng");
  free(png);

  uint8_t *jpg = read_bytes(in_dir("rgb.jpg"), &n);
  write_bytes(in_dir("cut.jpg"), jpg, n / 2);
  expect_error(in_dir("cut.jpg"), PX_ERR_FORMAT, "libjpeg-turbo");
  write_bytes(in_dir("head.jpg"), jpg, 3);  // FF D8 FF then nothing
  expect_error(in_dir("head.jpg"), PX_ERR_FORMAT, "JPEG");
  free(jpg);

  write_bytes(in_dir("text.jpg"), "hello, not an image", 19);
  expect_error(in_dir("text.jpg"), PX_ERR_FORMAT, "neither JPEG");
  write_bytes(in_dir("empty.png"), "", 0);
  expect_error(in_dir("empty.png"), PX_ERR_FORMAT, "neither JPEG");
  expect_error(in_dir("missing.png"), PX_ERR_IO, "cannot open");

  px_image img;
  CHECK(px_image_load(in_dir("rgb.png"), 2, &img) == PX_ERR_INVALID, "2 channels accepted");
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/px_image_XXXXXX");
  if (!mkdtemp(dir)) return 1;
  png_roundtrips_exactly();
  jpeg_roundtrips_within_tolerance();
  png_forms_become_8bit();
  corrupt_files_are_rejected_by_name();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return px_test_finish("test_image_decode_jpeg_and_png");
}
