/* Fused rotary position embedding for CPU: one pass over x, float32 math.
 *
 * Built at first use by posenc/kernels/cpu_rope.py and called through ctypes. Plain C with no
 * torch headers. One source, compiled once per instruction-set variant with explicit flags (never
 * -march=native, so a cached build is valid on any CPU that has the variant's features); the
 * loader picks the variant from the CPU's features at run time:
 *
 *   avx512bf16  -mavx512f -mavx512bw -mavx512vl -mavx512bf16  16 float32 lanes, one-instruction
 *                                                              bf16 rounding
 *   avx512      -mavx512f -mavx512bw -mavx512vl               16 lanes
 *   avx2        -mavx2 -mfma                                  8 lanes (__m256), bf16 by shifts
 *   generic     (none)                                        GCC/Clang vector extensions, 8
 *                                                              lanes, lowered to whatever the
 *                                                              target has (SSE2, NEON, scalar)
 *
 * Which one a build holds follows from the compiler's own macros (__AVX512F__, __AVX2__, ...),
 * and posenc_rope_isa() names it. x86 intrinsics appear only under those macros, so every other
 * target compiles the generic code.
 *
 * Shapes: x, out [B, H, S, d] with any element strides except a unit stride on d; tables cos,
 * sin [Bt, n, r/2] (float32, unit stride on the last dim; batch stride 0 when shared); optional
 * positions [Bp, S] (int64) giving the table row of each position, else row = s.
 *
 * Layouts (pairs rotated together): half (x[i], x[i + r/2]); interleaved (x[2i], x[2i + 1]).
 * Dims r..d-1 are copied through when out != x and left alone in place.
 *
 * Why float32 math: bf16 keeps 8 significant bits; computing x*cos - y*sin in bf16 rounds three
 * times. Here the only bf16 rounding is the final store (round to nearest even, as torch does).
 *
 * No FMA contraction (-ffp-contract=off): x*c - y*s is rounded as PyTorch's eager ops round it,
 * so float32 results equal transformers' apply_rotary_pos_emb bit for bit.
 *
 * Work split: tiles of positions of one batch row go to the threads. A tile's cos/sin rows are
 * laid out once, in the order the layout consumes them (with the sign of sin folded in), into a
 * per-thread scratch that stays in L1 while every head of the tile is rotated. Both elements of
 * a pair are loaded before either is stored, so in place (out == x) is safe. The loop is bound
 * by memory: the next run of rows is prefetched, and on AVX-512 large out-of-place outputs are
 * written with streaming stores.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef uint16_t bf16_t;

typedef struct {
    const void *x;
    void *out;
    const float *cos;
    const float *sin;
    const int64_t *pos; /* NULL: the table row of position s is s */
    int64_t B, H, S;
    int64_t xsb, xsh, xss; /* element strides of x over b, h, s */
    int64_t osb, osh, oss; /* element strides of out */
    int64_t csb, css;      /* element strides of cos over its batch and row dims */
    int64_t ssb, sss;      /* element strides of sin */
    int64_t psb;           /* element stride of pos over its batch dim (0 when shared) */
    int64_t half;          /* r/2: pairs rotated per row */
    int64_t tail;          /* d - r: dims passed through */
    int64_t interleaved;   /* 0: half layout, 1: interleaved */
    int64_t conj;          /* 1: rotate by -angle (the backward) */
    int64_t nthreads;
    int64_t rows; /* > 0: every pos value must lie in [0, rows) (checked before any write) */
} posenc_rope_args;

/* What posenc_rope_qk returns for a position outside its table (nothing was written). */
#define POSENC_OUTSIDE_TABLE 2

static inline float bf16_to_f32(bf16_t v) {
    uint32_t u = (uint32_t)v << 16; /* bf16 is the top half of a float32 */
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline bf16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (f != f) return (bf16_t)0x7FC0; /* NaN stays NaN (torch's canonical one) */
    u += 0x7FFFu + ((u >> 16) & 1u);  /* round to nearest, ties to even */
    return (bf16_t)(u >> 16);
}

static inline float f32_load1(const float *p) { return *p; }
static inline void f32_store1(float *p, float v) { *p = v; }
static inline float bf16_load1(const bf16_t *p) { return bf16_to_f32(*p); }
static inline void bf16_store1(bf16_t *p, float v) { *p = f32_to_bf16(v); }

/* --- per variant: the vector type vf of LANES float32, its loads and stores ------------------
 * Each variant uses the machine's own vector width: a vector wider than the registers (16
 * lanes on AVX2) is split by the compiler through the stack, and bf16 ran at a quarter of copy
 * bandwidth that way. */

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#if defined(__AVX512BF16__)
#define POSENC_ISA "avx512bf16"
#else
#define POSENC_ISA "avx512"
#endif
typedef __m512 vf;
#define LANES 16
static inline vf f32_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void f32_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
/* [v0 v1 v2 v3 ..] -> [v1 v0 v3 v2 ..] */
static inline vf swap_pairs(vf v) { return _mm512_permute_ps(v, 0xB1); }

static inline vf bf16_load(const bf16_t *p) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* With AVX512-BF16, one instruction: round to nearest even like torch, except that float32
 * denormals (below 1.2e-38) are flushed to zero and NaN payloads are kept. */
static inline __m256i bf16_round16(vf f) {
#if defined(__AVX512BF16__)
    return (__m256i)_mm512_cvtneps_pbh(f);
#else
    const __m512i u = _mm512_castps_si512(f);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    r = _mm512_srli_epi32(r, 16); /* round to nearest even */
    const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
    return _mm512_cvtepi32_epi16(r);
#endif
}
static inline void bf16_store(bf16_t *p, vf f) { _mm256_storeu_si256((__m256i *)p, bf16_round16(f)); }

/* Non-temporal (streaming) stores for large out-of-place outputs: they skip the read of each
 * destination line that a normal store first does (read for ownership), so writing costs one
 * transfer instead of two, like memcpy. Need vector-aligned addresses (64 bytes f32, 32 bf16). */
#define HAVE_STREAM 1
static inline void f32_stream(float *p, vf v) { _mm512_stream_ps(p, v); }
static inline void bf16_stream(bf16_t *p, vf f) { _mm256_stream_si256((__m256i *)p, bf16_round16(f)); }

#elif defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>
#define POSENC_ISA "avx2"
typedef __m256 vf;
#define LANES 8
static inline vf f32_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void f32_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
/* [v0 v1 v2 v3 ..] -> [v1 v0 v3 v2 ..] */
static inline vf swap_pairs(vf v) { return _mm256_permute_ps(v, 0xB1); }

/* bf16 -> float32: widen 8 x 16 bits to 32 and shift into the top half. */
static inline vf bf16_load(const bf16_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __m256i bf16_round8x32(vf f);

/* float32 -> 8 bf16, round to nearest even (add 0x7FFF + the kept lsb, keep the top half), NaN
 * as torch's canonical 0x7FC0; the two 128-bit halves packed into one (values < 2^16, so the
 * saturating pack is exact). */
static inline __m128i bf16_round8(vf f) {
    const __m256i r = bf16_round8x32(f);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
static inline void bf16_store(bf16_t *p, vf f) { _mm_storeu_si128((__m128i *)p, bf16_round8(f)); }

/* A block of 16 bf16 in two vectors, in the order [0-3 8-11] and [4-7 12-15]: unpacking with
 * zero puts each bf16 in the top half of a 32-bit lane in one instruction, within 128-bit
 * lanes. The tables are laid out in that order (BLOCK_ORDER: fill_tables), and the pack of the
 * store, also within 128-bit lanes, restores the natural order: per block two instructions
 * fewer to load and two to store than bf16_load/bf16_store twice. */
#define BLOCK_ORDER 1
static inline void bf16_load2(const bf16_t *p, vf *lo, vf *hi) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p), z = _mm256_setzero_si256();
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, h));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, h));
}

static inline __m256i bf16_round8x32(vf f) { /* rounded bf16 in the low half of each lane */
    const __m256i u = _mm256_castps_si256(f);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(nan));
}

static inline void bf16_store2(bf16_t *p, vf lo, vf hi) {
    const __m256i packed = _mm256_packus_epi32(bf16_round8x32(lo), bf16_round8x32(hi));
    _mm256_storeu_si256((__m256i *)p, packed);
}

/* No streaming stores: on this class of machine (Zen 2/3, AVX2) they made float32 out of place
 * 5-10 % slower against a fresh output's time, where the output's pages are first touched. */
#define HAVE_STREAM 0

#else
#define POSENC_ISA "generic"
typedef float vf __attribute__((vector_size(32)));    /* 8 x float32 */
typedef uint32_t vu __attribute__((vector_size(32)));  /* 8 x uint32 */
typedef int32_t vi __attribute__((vector_size(32)));   /* 8 x int32 (comparison masks) */
typedef uint16_t vh __attribute__((vector_size(16)));  /* 8 x bf16 bits */
#define LANES 8
static inline vf f32_load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void f32_store(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf swap_pairs(vf v) {
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
    return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
#else
    return __builtin_shuffle(v, (vi){1, 0, 3, 2, 5, 4, 7, 6});
#endif
}

static inline vf bf16_load(const bf16_t *p) {
    vh h;
    memcpy(&h, p, sizeof h);
    vu u = __builtin_convertvector(h, vu) << 16;
    return (vf)u;
}

static inline void bf16_store(bf16_t *p, vf f) {
    vu u = (vu)f;
    vu r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16; /* round to nearest even */
    vu nan = (vu)(f != f);                         /* all ones where NaN */
    r = (r & ~nan) | (0x7FC0u & nan);
    vh h = __builtin_convertvector(r, vh);
    memcpy(p, &h, sizeof h);
}

#define HAVE_STREAM 0
#endif

/* Blocks of two vectors (2 * LANES elements): the rows' main loop. In natural order, except
 * AVX2's bf16 blocks (BLOCK_ORDER above). */
#define DEFINE_BLOCK(T, LOAD, STORE)                                                         \
    static inline void STORE##2(T *p, vf lo, vf hi) { STORE(p, lo), STORE(p + LANES, hi); }
#define DEFINE_BLOCK_LOAD(T, LOAD)                                                           \
    static inline void LOAD##2(const T *p, vf *lo, vf *hi) { *lo = LOAD(p), *hi = LOAD(p + LANES); }
DEFINE_BLOCK(float, f32_load, f32_store)
DEFINE_BLOCK_LOAD(float, f32_load)
#if HAVE_STREAM
DEFINE_BLOCK(float, f32_load, f32_stream)
DEFINE_BLOCK(bf16_t, bf16_load, bf16_stream)
#endif
#ifndef BLOCK_ORDER
#define BLOCK_ORDER 0
DEFINE_BLOCK(bf16_t, bf16_load, bf16_store)
DEFINE_BLOCK_LOAD(bf16_t, bf16_load)
#endif

/* --- one row -------------------------------------------------------------------------------- */

/* half layout: pairs (x[i], x[i + h]); c, s hold the h angles (s signed for conj). Blocks of
 * 2 * LANES pairs, then single vectors, then single pairs. */
#define DEFINE_ROW_HALF(NAME, T, VLOAD, VSTORE, LOAD1, STORE1)                           \
    static inline void NAME(const T *x, T *o, const float *c, const float *s, int64_t h) { \
        int64_t i = 0;                                                                   \
        for (; i + 2 * LANES <= h; i += 2 * LANES) {                                     \
            vf a0, a1, b0, b1;                                                           \
            VLOAD##2(x + i, &a0, &a1);                                                   \
            VLOAD##2(x + h + i, &b0, &b1);                                               \
            const vf c0 = f32_load(c + i), c1 = f32_load(c + i + LANES);                 \
            const vf s0 = f32_load(s + i), s1 = f32_load(s + i + LANES);                 \
            VSTORE##2(o + i, a0 * c0 - b0 * s0, a1 * c1 - b1 * s1);                      \
            VSTORE##2(o + h + i, b0 * c0 + a0 * s0, b1 * c1 + a1 * s1);                  \
        }                                                                                \
        for (; i + LANES <= h; i += LANES) {                                             \
            const vf a = VLOAD(x + i), b = VLOAD(x + h + i);                             \
            const vf cc = f32_load(c + i), ss = f32_load(s + i);                         \
            VSTORE(o + i, a * cc - b * ss);                                              \
            VSTORE(o + h + i, b * cc + a * ss);                                          \
        }                                                                                \
        for (; i < h; ++i) {                                                             \
            const float a = LOAD1(x + i), b = LOAD1(x + h + i);                          \
            STORE1(o + i, a * c[i] - b * s[i]);                                          \
            STORE1(o + h + i, b * c[i] + a * s[i]);                                      \
        }                                                                                \
    }

/* interleaved layout: pairs (x[2i], x[2i + 1]); c = [c0 c0 c1 c1 ..], s = [-s0 s0 -s1 s1 ..]
 * (r entries), so out = x * c + swap_pairs(x) * s: [x0 x1] -> [x0 c0 - x1 s0, x1 c0 + x0 s0].
 * A pair stays adjacent in every block order. */
#define DEFINE_ROW_INTERLEAVED(NAME, T, VLOAD, VSTORE, LOAD1, STORE1)                    \
    static inline void NAME(const T *x, T *o, const float *c, const float *s, int64_t h) { \
        const int64_t r = 2 * h;                                                         \
        int64_t j = 0;                                                                   \
        for (; j + 2 * LANES <= r; j += 2 * LANES) {                                     \
            vf v0, v1;                                                                   \
            VLOAD##2(x + j, &v0, &v1);                                                   \
            const vf c0 = f32_load(c + j), c1 = f32_load(c + j + LANES);                 \
            const vf s0 = f32_load(s + j), s1 = f32_load(s + j + LANES);                 \
            VSTORE##2(o + j, v0 * c0 + swap_pairs(v0) * s0, v1 * c1 + swap_pairs(v1) * s1); \
        }                                                                                \
        for (; j + LANES <= r; j += LANES) {                                             \
            const vf v = VLOAD(x + j);                                                   \
            VSTORE(o + j, v * f32_load(c + j) + swap_pairs(v) * f32_load(s + j));        \
        }                                                                                \
        for (; j < r; j += 2) {                                                          \
            const float a = LOAD1(x + j), b = LOAD1(x + j + 1);                          \
            STORE1(o + j, a * c[j] + b * s[j]);                                          \
            STORE1(o + j + 1, b * c[j + 1] + a * s[j + 1]);                              \
        }                                                                                \
    }

DEFINE_ROW_HALF(row_half_f32, float, f32_load, f32_store, f32_load1, f32_store1)
DEFINE_ROW_HALF(row_half_bf16, bf16_t, bf16_load, bf16_store, bf16_load1, bf16_store1)
DEFINE_ROW_INTERLEAVED(row_inter_f32, float, f32_load, f32_store, f32_load1, f32_store1)
DEFINE_ROW_INTERLEAVED(row_inter_bf16, bf16_t, bf16_load, bf16_store, bf16_load1, bf16_store1)
#if HAVE_STREAM
DEFINE_ROW_HALF(row_half_f32_nt, float, f32_load, f32_stream, f32_load1, f32_store1)
DEFINE_ROW_HALF(row_half_bf16_nt, bf16_t, bf16_load, bf16_stream, bf16_load1, bf16_store1)
DEFINE_ROW_INTERLEAVED(row_inter_f32_nt, float, f32_load, f32_stream, f32_load1, f32_store1)
DEFINE_ROW_INTERLEAVED(row_inter_bf16_nt, bf16_t, bf16_load, bf16_stream, bf16_load1, bf16_store1)
#endif

/* --- the tensor ----------------------------------------------------------------------------- */

/* Bytes of one head's rows per tile (at most 256 positions): 2 KiB is 8 bf16 rows of d = 128.
 * The tile's cos + sin rows (8 bytes per pair) are then at most 8 KiB and stay in L1 while
 * every head of the tile is rotated with them. In place, 2 KiB tiles ran 1.0-1.5x faster than
 * 8 KiB ones at the prefill shapes of `posenc bench rope` (bf16 in place 0.81-1.18 of a copy
 * against 0.64-0.83; float32 0.91-1.17 against 0.83-0.95; out of place unchanged beyond the
 * noise) on a 2-core AMD EPYC Zen 4 VM, 2026-12-04 (benchmarks/RESULTS.md); not measured on
 * an AVX2-only CPU, which takes the same size. */
#ifndef TILE_BYTES
#define TILE_BYTES 2048
#endif

/* Put each full block of 2 * LANES = 16 table entries in AVX2's bf16 block order
 * [0-3 8-11 4-7 12-15] (bf16_load2); the entries after the last full block stay in order. */
static void block_order(float *t, int64_t n) {
    for (int64_t j = 0; j + 16 <= n; j += 16) {
        for (int64_t k = j + 4; k < j + 8; ++k) {
            const float v = t[k];
            t[k] = t[k + 4];
            t[k + 4] = v;
        }
    }
}

/* Lay out the tile's table rows for the layout: per position r floats of cos and of sin (in
 * the block order of the rows' loads when `blocked`). */
static void fill_tables(const posenc_rope_args *a, int64_t b, int64_t s0, int64_t s1, float *ct,
                        float *st, int blocked) {
    const int64_t h = a->half, r = 2 * h;
    const float sign = a->conj ? -1.0f : 1.0f;
    for (int64_t s = s0; s < s1; ++s) {
        const int64_t row = a->pos ? a->pos[b * a->psb + s] : s;
        const float *c = a->cos + b * a->csb + row * a->css;
        const float *sn = a->sin + b * a->ssb + row * a->sss;
        float *cr = ct + (s - s0) * r, *sr = st + (s - s0) * r;
        if (a->interleaved) {
            for (int64_t i = 0; i < h; ++i) {
                cr[2 * i] = cr[2 * i + 1] = c[i];
                sr[2 * i] = -sign * sn[i];
                sr[2 * i + 1] = sign * sn[i];
            }
        } else {
            for (int64_t i = 0; i < h; ++i) {
                cr[i] = c[i];
                sr[i] = sign * sn[i];
            }
        }
        if (blocked) {
            block_order(cr, a->interleaved ? r : h);
            block_order(sr, a->interleaved ? r : h);
        }
    }
}

static inline void prefetch_row(const void *p, int64_t nbytes) {
    for (int64_t off = 0; off < nbytes; off += 64) __builtin_prefetch((const char *)p + off, 0, 3);
}

/* Rotate every head of positions s0..s1-1 of batch row b with the tile's tables ct, st. */
#define TILE_LOOPS(T, ROW, HALF)                                                                \
    if (a->xsh > a->xss) {                                                                      \
        /* [b, h, s, d]: a head's rows are one run of memory. Runs start cold (the hardware     \
         * prefetcher catches up only after the first lines of each), so the next run is        \
         * prefetched while this one is rotated: the next head's rows, and after the last head  \
         * the first head's rows of the next tile (this thread's next tile under a static       \
         * schedule). */                                                                        \
        for (int64_t hh = 0; hh < a->H; ++hh) {                                                 \
            const T *xr = x + hh * a->xsh;                                                      \
            T *orow = out + hh * a->osh;                                                        \
            const int last = hh + 1 == a->H;                                                    \
            const T *pf = last ? x + n * a->xss : xr + a->xsh;                                  \
            const int64_t pf_rows = last ? (next_rows < n ? next_rows : n) : n;                 \
            for (int64_t i = 0; i < n; ++i, xr += a->xss, orow += a->oss, pf += a->xss) {       \
                if (i < pf_rows) prefetch_row(pf, row_bytes);                                   \
                ROW(xr, orow, ct + i * 2 * (HALF), st + i * 2 * (HALF), (HALF));                \
                if (tail) memcpy(orow + 2 * (HALF), xr + 2 * (HALF), tail * sizeof(T));         \
            }                                                                                   \
        }                                                                                       \
    } else {                                                                                    \
        /* [b, s, h, d]: the tile is one run; walk it in memory order. */                       \
        for (int64_t i = 0; i < n; ++i) {                                                       \
            const T *xr = x + i * a->xss;                                                       \
            T *orow = out + i * a->oss;                                                         \
            for (int64_t hh = 0; hh < a->H; ++hh, xr += a->xsh, orow += a->osh) {               \
                ROW(xr, orow, ct + i * 2 * (HALF), st + i * 2 * (HALF), (HALF));                \
                if (tail) memcpy(orow + 2 * (HALF), xr + 2 * (HALF), tail * sizeof(T));         \
            }                                                                                   \
        }                                                                                       \
    }

/* The common head sizes get their own copy of the loops with r/2 a constant, so that the row's
 * vector loop is unrolled and the per-row overhead is a few instructions. */
#define DEFINE_TILE(NAME, T, ROW)                                                               \
    static void NAME(const posenc_rope_args *a, int64_t b, int64_t s0, int64_t s1,             \
                     const float *ct, const float *st) {                                        \
        const T *x = (const T *)a->x + b * a->xsb + s0 * a->xss;                                \
        T *out = (T *)a->out + b * a->osb + s0 * a->oss;                                        \
        const int64_t h = a->half, n = s1 - s0, next_rows = a->S - s1;                         \
        const int64_t tail = a->x != a->out ? a->tail : 0; /* in place: tail stays as is */    \
        const int64_t row_bytes = (2 * h + a->tail) * (int64_t)sizeof(T);                      \
        switch (h) {                                                                            \
            case 32: TILE_LOOPS(T, ROW, 32) break;                                              \
            case 64: TILE_LOOPS(T, ROW, 64) break;                                              \
            default: TILE_LOOPS(T, ROW, h) break;                                               \
        }                                                                                       \
    }

DEFINE_TILE(tile_half_f32, float, row_half_f32)
DEFINE_TILE(tile_half_bf16, bf16_t, row_half_bf16)
DEFINE_TILE(tile_inter_f32, float, row_inter_f32)
DEFINE_TILE(tile_inter_bf16, bf16_t, row_inter_bf16)
#if HAVE_STREAM
DEFINE_TILE(tile_half_f32_nt, float, row_half_f32_nt)
DEFINE_TILE(tile_half_bf16_nt, bf16_t, row_half_bf16_nt)
DEFINE_TILE(tile_inter_f32_nt, float, row_inter_f32_nt)
DEFINE_TILE(tile_inter_bf16_nt, bf16_t, row_inter_bf16_nt)
#else /* never chosen (use_stream() says no): the plain tiles stand in */
#define tile_half_f32_nt tile_half_f32
#define tile_half_bf16_nt tile_half_bf16
#define tile_inter_f32_nt tile_inter_f32
#define tile_inter_bf16_nt tile_inter_bf16
#endif

typedef void (*tile_fn)(const posenc_rope_args *, int64_t, int64_t, int64_t, const float *,
                        const float *);

/* One thread, every tile in order: small calls (a decode step) and one-thread runs. Without a
 * parallel region, and with the scratch on the stack when the rows fit (at a decode step the
 * region's set-up and a malloc cost more than the rotation). */
static int run_serial(const posenc_rope_args *a, tile_fn tile, int blocked, int64_t tile_s,
                      int64_t tiles) {
    const int64_t r = 2 * a->half, rows = tile_s < a->S ? tile_s : a->S;
    float small[2 * 512];
    const int64_t need = 2 * rows * (r > 0 ? r : 1);
    float *ct = need <= (int64_t)(sizeof small / sizeof *small) ? small
                                                                  : (float *)malloc(sizeof(float) * need);
    if (!ct) return -1;
    float *st = ct + rows * r;
    for (int64_t b = 0; b < a->B; ++b) {
        for (int64_t t = 0; t < tiles; ++t) {
            const int64_t s0 = t * tile_s;
            const int64_t s1 = s0 + tile_s < a->S ? s0 + tile_s : a->S;
            fill_tables(a, b, s0, s1, ct, st, blocked);
            tile(a, b, s0, s1, ct, st);
        }
    }
    if (ct != small) free(ct);
#if HAVE_STREAM
    _mm_sfence(); /* order the streaming stores before the caller reads out */
#endif
    return 0;
}

/* Tiles of tile_s positions of one batch row are shared among the threads. */
static int run(const posenc_rope_args *a, tile_fn tile, int64_t elem_size) {
    const int blocked = BLOCK_ORDER && elem_size == sizeof(bf16_t);
    const int64_t r = 2 * a->half;
    const int64_t row_bytes = (r + a->tail) * elem_size;
    int64_t tile_s = TILE_BYTES / (row_bytes > 0 ? row_bytes : 1);
    tile_s = tile_s < 1 ? 1 : tile_s > 256 ? 256 : tile_s;
    const int64_t tiles = (a->S + tile_s - 1) / tile_s;
    const int64_t bytes = a->B * a->H * a->S * row_bytes;
    const int nthreads = a->nthreads > 0 ? (int)a->nthreads : 1;
    int failed = 0;
    /* Below ~64 KiB a parallel region costs more than it saves. */
    if (nthreads == 1 || bytes <= 65536) return run_serial(a, tile, blocked, tile_s, tiles);
#pragma omp parallel num_threads(nthreads) reduction(| : failed)
    {
        float *ct = (float *)malloc(sizeof(float) * 2 * tile_s * (r > 0 ? r : 1));
        float *st = ct + tile_s * r;
        if (!ct) failed = 1;
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < a->B; ++b) {
            for (int64_t t = 0; t < tiles; ++t) {
                if (!ct) continue;
                const int64_t s0 = t * tile_s;
                const int64_t s1 = s0 + tile_s < a->S ? s0 + tile_s : a->S;
                fill_tables(a, b, s0, s1, ct, st, blocked);
                tile(a, b, s0, s1, ct, st);
            }
        }
        free(ct);
#if HAVE_STREAM
        _mm_sfence(); /* order the streaming stores before the caller reads out */
#endif
    }
    return failed ? -1 : 0;
}

/* Streaming stores pay off out of place on outputs too large to stay in cache, and apply when
 * every vector store is aligned: the output, its row strides and the half-row offset. */
#ifndef STREAM_MIN_BYTES
#define STREAM_MIN_BYTES (4 << 20)
#endif

static int use_stream(const posenc_rope_args *a, int64_t elem_size) {
    const int64_t align = LANES * elem_size, r = 2 * a->half; /* one vector store */
    const int64_t bytes = a->B * a->H * a->S * (r + a->tail) * elem_size;
    if (!HAVE_STREAM || a->x == a->out || bytes < STREAM_MIN_BYTES) return 0;
    if ((uintptr_t)a->out % align) return 0;
    if (((a->half % LANES) * elem_size) % align) return 0;
    return (a->osb * elem_size) % align == 0 && (a->osh * elem_size) % align == 0 &&
           (a->oss * elem_size) % align == 0;
}

/* static, and called through the exported names below: one process may load several variants,
 * and each must call its own code (an exported symbol can be interposed by another library). */
static int rope_f32(const posenc_rope_args *a) {
    const int nt = use_stream(a, sizeof(float));
    tile_fn tile = a->interleaved ? (nt ? tile_inter_f32_nt : tile_inter_f32)
                                  : (nt ? tile_half_f32_nt : tile_half_f32);
    return run(a, tile, sizeof(float));
}

static int rope_bf16(const posenc_rope_args *a) {
    const int nt = use_stream(a, sizeof(bf16_t));
    tile_fn tile = a->interleaved ? (nt ? tile_inter_bf16_nt : tile_inter_bf16)
                                  : (nt ? tile_half_bf16_nt : tile_half_bf16);
    return run(a, tile, sizeof(bf16_t));
}

int posenc_rope_f32(const posenc_rope_args *a) { return rope_f32(a); }
int posenc_rope_bf16(const posenc_rope_args *a) { return rope_bf16(a); }

/* The variant this build holds (see the top of the file): the loader checks it. */
const char *posenc_rope_isa(void) { return POSENC_ISA; }

/* Lets the loader check that the struct it fills has the layout compiled here. */
int64_t posenc_rope_args_size(void) { return (int64_t)sizeof(posenc_rope_args); }

/* q and k in one call, their argument structs back to back (packed by the caller in one
 * step): at decode shapes the caller's cost per foreign call is larger than the rotation. */
/* Whether a's positions index its table's rows (a->rows > 0; else nothing to check). A planned
 * decode step checks here, where reading the values is free, instead of in Python. */
static int outside_table(const posenc_rope_args *a) {
    if (!a->pos || a->rows <= 0) return 0;
    const int64_t batches = a->psb ? a->B : 1;
    for (int64_t b = 0; b < batches; ++b) {
        const int64_t *p = a->pos + b * a->psb;
        for (int64_t s = 0; s < a->S; ++s)
            if (p[s] < 0 || p[s] >= a->rows) return 1;
    }
    return 0;
}

int posenc_rope_qk(const posenc_rope_args *qk, int bf16) {
    int (*fn)(const posenc_rope_args *) = bf16 ? rope_bf16 : rope_f32;
    /* Both sides before either is written: in place, a bad k must leave q as it was. */
    if (outside_table(&qk[0]) || outside_table(&qk[1])) return POSENC_OUTSIDE_TABLE;
    return fn(&qk[0]) | fn(&qk[1]);
}

/* The same call from its parts: the 10 pointers of q's and k's structs (x, out, cos, sin, pos
 * each), then the integer fields of both, as a caller keeps them (packed once per layout). One
 * pack of the pointers per call and no concatenation on the caller's side. */
#define N_POINTERS 5
#define N_FIXED ((int)(sizeof(posenc_rope_args) / sizeof(int64_t)) - N_POINTERS)
int posenc_rope_qk_parts(const uint64_t *pointers, const int64_t *fixed, int bf16) {
    posenc_rope_args qk[2];
    for (int side = 0; side < 2; ++side) {
        uint64_t *dst = (uint64_t *)&qk[side];
        memcpy(dst, pointers + side * N_POINTERS, N_POINTERS * sizeof(uint64_t));
        memcpy(dst + N_POINTERS, fixed + side * N_FIXED, N_FIXED * sizeof(int64_t));
    }
    return posenc_rope_qk(qk, bf16);
}
