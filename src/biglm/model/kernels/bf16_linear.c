/* y = x . W^T + b on an x86-64 CPU with AVX2 and FMA: x (M, K) float32, W (N, K) of bfloat16 values, summed in
 * float32. What `biglm.model.cpu_kernels` builds and `biglm.model.packed.Prepacked` calls (through ctypes): where
 * the CPU has no bfloat16 matrix kernels, a bfloat16 model's weights are read as bfloat16 (half float32's bytes, and a
 * decoding call is bound by reading them) and widened in registers, exactly (a bfloat16 is a float32's top 16 bits).
 *
 * W is held in panels of NR = 16 outputs, each panel (K, 16): packed[p][k][j] = W[16 p + j][k] (N padded to a multiple
 * of 16 with zero rows by the caller). A tile of up to MR = 6 rows by one panel keeps its 6 x 16 sums in 12 registers.
 * Up to FEW rows (a decoding call at batch 1) each panel is read once, start to end, and widened in registers; past
 * that (many requests' rows, a long prompt) the panel is taken KC values of k at a time, widened once into a float32
 * buffer that every row tile of a block of MC rows then reads from L1 (the block's chunk of x stays in L2). Panels
 * are split over `threads` OpenMP threads (the libgomp torch itself loads). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define NR 16
#define MR 6
#define KC 256
#define FEW (2 * MR)
#define MC 120

static inline __m256 widen8(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* a panel streams from memory at one or two rows: prefetched PREFETCH values of k (2 KB) ahead, into the next panel
 * at its end (-20% a one-row call's products on the AMD EPYC here: docs/LOG.md) */
#ifndef PREFETCH
#define PREFETCH 64  /* (-DPREFETCH=0: none; docs/experiments/bf16_prefetch_ab.py) */
#endif
#if PREFETCH
#define LOAD_BF16(k) _mm_prefetch((const char *)(w + ((k) + PREFETCH) * NR), _MM_HINT_T0); \
    __m256 w0 = widen8(w + (k) * NR), w1 = widen8(w + (k) * NR + 8);
#else
#define LOAD_BF16(k) __m256 w0 = widen8(w + (k) * NR), w1 = widen8(w + (k) * NR + 8);
#endif
#define LOAD_F32(k) __m256 w0 = _mm256_loadu_ps(w + (k) * NR), w1 = _mm256_loadu_ps(w + (k) * NR + 8);
/* row r of the tile: sums a##r (outputs 0-7) and c##r (8-15), named so they stay in registers */
#define INIT(r) if (ROWS > r) { if (first) { a##r = b0; c##r = b1; } \
    else { a##r = _mm256_loadu_ps(y + r * ldy); c##r = _mm256_loadu_ps(y + r * ldy + 8); } }
#define STEP(r) if (ROWS > r) { __m256 s = _mm256_broadcast_ss(x + r * ldx + k); \
    a##r = _mm256_fmadd_ps(s, w0, a##r); c##r = _mm256_fmadd_ps(s, w1, c##r); }
#define STORE(r) if (ROWS > r) { _mm256_storeu_ps(y + r * ldy, a##r); _mm256_storeu_ps(y + r * ldy + 8, c##r); }

#define TILE(R, KIND, WTYPE, LOAD) \
static void tile_##KIND##_##R(const float *x, long ldx, const WTYPE *w, long kn, float *y, long ldy, int first, \
                              const float *bias) { \
    const int ROWS = R; \
    __m256 a0, a1, a2, a3, a4, a5, c0, c1, c2, c3, c4, c5; \
    __m256 b0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps(); \
    __m256 b1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps(); \
    INIT(0) INIT(1) INIT(2) INIT(3) INIT(4) INIT(5) \
    for (long k = 0; k < kn; k++) { \
        LOAD(k) \
        STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5) \
    } \
    STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5) \
}
#define TILES(R) TILE(R, bf16, uint16_t, LOAD_BF16) TILE(R, f32, float, LOAD_F32)

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
TILES(1) TILES(2) TILES(3) TILES(4) TILES(5) TILES(6)

typedef void (*tile_bf16)(const float *, long, const uint16_t *, long, float *, long, int, const float *);
typedef void (*tile_f32)(const float *, long, const float *, long, float *, long, int, const float *);
static const tile_bf16 tiles_bf16[MR + 1] = {0, tile_bf16_1, tile_bf16_2, tile_bf16_3, tile_bf16_4, tile_bf16_5,
                                             tile_bf16_6};
static const tile_f32 tiles_f32[MR + 1] = {0, tile_f32_1, tile_f32_2, tile_f32_3, tile_f32_4, tile_f32_5, tile_f32_6};

/* x (M, K) and y (M, N) row-major float32, N a multiple of 16; packed as above; bias (N) or NULL */
void bf16_linear(const float *x, const uint16_t *packed, const float *bias, float *y, long M, long N, long K,
                 int threads) {
    long panels = N / NR;
    if (M <= FEW) {
        #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (long p = 0; p < panels; p++)
            for (long m = 0; m < M; m += MR) {
                int r = M - m < MR ? (int)(M - m) : MR;
                tiles_bf16[r](x + m * K, K, packed + p * K * NR, K, y + m * N + p * NR, N, 1, bias ? bias + p * NR : 0);
            }
        return;
    }
    /* many rows: K in chunks of KC, rows in blocks of MC (a block's chunk of x stays in L2 while every panel passes) */
    for (long k0 = 0; k0 < K; k0 += KC) {
        long kn = K - k0 < KC ? K - k0 : KC;
        for (long m0 = 0; m0 < M; m0 += MC) {
            long mn = M - m0 < MC ? M - m0 : MC;
            #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
            for (long p = 0; p < panels; p++) {
                float wide[KC * NR] __attribute__((aligned(32)));
                const uint16_t *w = packed + (p * K + k0) * NR;
                for (long i = 0; i < kn * NR; i += 8) _mm256_store_ps(wide + i, widen8(w + i));
                for (long m = m0; m < m0 + mn;) {
                    long left = m0 + mn - m;  /* tiles as even as the rows allow: 8 = 4 + 4, not 6 + 2 */
                    int r = left <= MR ? (int)left : left < 2 * MR ? (int)((left + 1) / 2) : MR;
                    tiles_f32[r](x + m * K + k0, K, wide, kn, y + m * N + p * NR, N, k0 == 0, bias ? bias + p * NR : 0);
                    m += r;
                }
            }
        }
    }
}

/* RMSNorm of float32 rows, as Llama's formula writes it: y = w * (x * rsqrt(mean(x^2) + eps)), the mean summed in 32
 * float32 lanes (four registers), then across them: one call for the 30-odd element-wise ops PyTorch's CPU `rms_norm`
 * dispatches (`packed.KernelRMSNorm`). x and y (rows, dim) row-major, w (dim). */
void rms_norm(const float *x, const float *w, float eps, float *y, long rows, long dim) {
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        long i = 0;
        for (; i + 32 <= dim; i += 32) {
            __m256 a = _mm256_loadu_ps(xr + i), b = _mm256_loadu_ps(xr + i + 8);
            __m256 c = _mm256_loadu_ps(xr + i + 16), d = _mm256_loadu_ps(xr + i + 24);
            s0 = _mm256_fmadd_ps(a, a, s0); s1 = _mm256_fmadd_ps(b, b, s1);
            s2 = _mm256_fmadd_ps(c, c, s2); s3 = _mm256_fmadd_ps(d, d, s3);
        }
        float lanes[8], sum = 0.0f;
        _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
        for (int j = 0; j < 8; j++) sum += lanes[j];
        for (; i < dim; i++) sum += xr[i] * xr[i];
        float scale = 1.0f / sqrtf(sum / (float)dim + eps);
        __m256 sc = _mm256_set1_ps(scale);
        for (i = 0; i + 8 <= dim; i += 8)
            _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(xr + i), sc)));
        for (; i < dim; i++) yr[i] = w[i] * (xr[i] * scale);
    }
}
