/* One BiGLM decoder layer in one call, float32 activations, the four products on bf16_linear.c's bfloat16 panels
 * (built into the same library; `packed.KernelLayer` calls it).
 *
 * A batch-1 decoding call on a CPU multiplies a few rows by every weight: once the products read bfloat16, what is left
 * of a layer is some forty small PyTorch ops (the norms, RoPE, the cache's concatenation or write, attention and its
 * mask conversion, SwiGLU, the gated adapters, the residuals), each a dispatch and an allocation, together as long as
 * the products at one row (SmolLM2-135M, one thread, AMD EPYC: docs/LOG.md). Here they are loops over the call's few
 * rows: the same formulas as modeling.py's BiGLMBlock, in another summation order (float32).
 *
 * Layout: x, y (R = B * L, hidden) row-major; cos, sin (R, D), sin signed (its first half negated: `apply_rope`); the
 * q/k/v product's columns [q heads | k heads | v heads]; mask (B, L, keys) bytes, 1 = attend, or NULL (all); the
 * cached keys/values `ka`/`va` (B, Hkv, >= na, D) with strides (rows, heads, columns; D contiguous). Without
 * `columns` the call's keys/values (kout/vout, (B, Hkv, L, D)) follow the cache's na columns (keys = na + L); with
 * `columns` (R) they are also written into ka/va at those columns and attention reads ka/va's first na (= keys). */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void bf16_linear(const float *x, const uint16_t *packed, const float *bias, float *y, long M, long N, long K,
                 int threads);
void rms_norm(const float *x, const float *w, float eps, float *y, long rows, long dim);

typedef struct {
    long hidden, heads, kv_heads, head_dim, inter, rank;
    float eps;
    const float *norm1, *norm2;                 /* (hidden) */
    const uint16_t *qkv, *o, *gate_up, *down;   /* bf16_linear panels */
    const float *qkv_bias;                      /* padded to qkv_n, or NULL */
    long qkv_n, o_n, gate_up_n, down_n;         /* the panels' widths (multiples of 16) */
    /* the gated adapters (`BiGLMMaskAdapter`: up(down(x)) at mask rows), nn.Linear weights (out, in); NULL: none */
    const float *qkv_a, *qkv_b, *o_a, *o_b, *gate_up_a, *gate_up_b, *down_a, *down_b;
} layer_weights;

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static inline float dot(const float *a, const float *b, long n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    float s = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* the dot products of q with 8 keys k[0..7] (D a multiple of 8): 8 running sums, then one horizontal reduction tree */
static inline __m256 dot8(const float *q, const float *const *k, long D) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (long d = 0; d < D; d += 8) {
        __m256 qv = _mm256_loadu_ps(q + d);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[0] + d), a0); a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[1] + d), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[2] + d), a2); a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[3] + d), a3);
        a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[4] + d), a4); a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[5] + d), a5);
        a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[6] + d), a6); a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[7] + d), a7);
    }
    __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));  /* halves of keys 0-3 */
    __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));  /* halves of keys 4-7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
}

/* exp of 8 floats: 2^n * e^r, r in [-ln2/2, ln2/2] (ln 2 split in two parts), a degree-6 polynomial: within 2 ulp */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* y (rows, d_out, row stride ldy) += gate[r] * up(down(x)) for rows whose gate is not 0 (x row stride ldx) */
static void adapter(const float *x, long ldx, const float *down, const float *up, long rank, long d_in, long d_out,
                    const float *gate, long rows, float *y, long ldy, float *t) {
    for (long r = 0; r < rows; r++) {
        if (gate[r] == 0.0f) continue;
        for (long j = 0; j < rank; j++) t[j] = dot(down + j * d_in, x + r * ldx, d_in);
        for (long o = 0; o < d_out; o++) y[r * ldy + o] += gate[r] * dot(up + o * rank, t, rank);
    }
}

static void rope(float *v, const float *cos, const float *sin, long D) {
    long h = D / 2;
    float tmp[512];
    memcpy(tmp, v, D * sizeof(float));
    for (long i = 0; i < D; i++) v[i] = tmp[i] * cos[i] + tmp[(i + h) % D] * sin[i];
}

void decoder_layer(const layer_weights *W, const float *x, float *y, long B, long L, const float *cos,
                   const float *sin, const uint8_t *mask, long keys, float *ka, float *va, long ka_b, long ka_g,
                   long ka_j, long va_b, long va_g, long va_j, long na, const long *columns, float *kout,
                   float *vout, const float *gate, int threads) {
    const long R = B * L, Hd = W->hidden, H = W->heads, Hkv = W->kv_heads, D = W->head_dim, I = W->inter;
    const long rep = H / Hkv, QK = (H + Hkv) * D;
    float *n1 = malloc(sizeof(float) * R * Hd), *qkv = malloc(sizeof(float) * R * W->qkv_n);
    float *att = malloc(sizeof(float) * R * H * D), *o = malloc(sizeof(float) * R * W->o_n);
    float *gu = malloc(sizeof(float) * R * W->gate_up_n), *act = malloc(sizeof(float) * R * I);
    float *dn = malloc(sizeof(float) * R * W->down_n), *scores = malloc(sizeof(float) * (keys + 8));
    float *t = malloc(sizeof(float) * (W->rank + 8));
    const float scale = 1.0f / sqrtf((float)D);

    /* attention */
    rms_norm(x, W->norm1, W->eps, n1, R, Hd);
    bf16_linear(n1, W->qkv, W->qkv_bias, qkv, R, W->qkv_n, Hd, threads);
    if (gate && W->qkv_a) adapter(n1, Hd, W->qkv_a, W->qkv_b, W->rank, Hd, (H + 2 * Hkv) * D, gate, R, qkv, W->qkv_n, t);
    for (long r = 0; r < R; r++) {
        float *row = qkv + r * W->qkv_n;
        for (long h = 0; h < H + Hkv; h++) rope(row + h * D, cos + r * D, sin + r * D, D);
        long b = r / L, l = r % L;
        for (long g = 0; g < Hkv; g++) {
            float *k = kout + ((b * Hkv + g) * L + l) * D, *v = vout + ((b * Hkv + g) * L + l) * D;
            memcpy(k, row + H * D + g * D, D * sizeof(float));
            memcpy(v, row + QK + g * D, D * sizeof(float));
            if (columns) {
                memcpy(ka + b * ka_b + g * ka_g + columns[r] * ka_j, k, D * sizeof(float));
                memcpy(va + b * va_b + g * va_g + columns[r] * va_j, v, D * sizeof(float));
            }
        }
    }
    const long own = columns ? 0 : L;  /* the call's own keys after the cache's (not written into it) */
    for (long r = 0; r < R; r++) {
        long b = r / L;
        const uint8_t *m = mask ? mask + r * keys : 0;
        for (long h = 0; h < H; h++) {
            long g = h / rep;
            const float *q = qkv + r * W->qkv_n + h * D;
            const float *kc = ka + b * ka_b + g * ka_g, *vc = va + b * va_b + g * va_g;
            const float *ko = kout + (b * Hkv + g) * L * D, *vo = vout + (b * Hkv + g) * L * D;
            float best = -INFINITY;
            long j = 0;
            if (D % 8 == 0)  /* eight keys at a time (a masked one too: its score is then dropped) */
                for (; j + 8 <= na + own; j += 8) {
                    const float *kp[8];
                    for (int t = 0; t < 8; t++) kp[t] = j + t < na ? kc + (j + t) * ka_j : ko + (j + t - na) * D;
                    _mm256_storeu_ps(scores + j, _mm256_mul_ps(dot8(q, kp, D), _mm256_set1_ps(scale)));
                }
            for (; j < na + own; j++) scores[j] = scale * dot(q, j < na ? kc + j * ka_j : ko + (j - na) * D, D);
            for (j = 0; j < na + own; j++) {
                if (m && !m[j]) scores[j] = -INFINITY;
                else if (scores[j] > best) best = scores[j];
            }
            float *out = att + r * H * D + h * D;
            memset(out, 0, D * sizeof(float));
            if (best == -INFINITY) continue;  /* (no key to see: zeros) */
            float total = 0.0f;
            j = 0;
            __m256 mx = _mm256_set1_ps(best), acc = _mm256_setzero_ps();
            for (; j + 8 <= na + own; j += 8) {
                __m256 sc = _mm256_loadu_ps(scores + j);  /* a masked key's -inf: exactly 0 (its value unread) */
                __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(sc, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ),
                                            exp8(_mm256_sub_ps(sc, mx)));
                _mm256_storeu_ps(scores + j, e);
                acc = _mm256_add_ps(acc, e);
            }
            total = hsum(acc);
            for (; j < na + own; j++) { scores[j] = expf(scores[j] - best); total += scores[j]; }
            for (j = 0; j < na + own; j++) {
                float p = scores[j];
                if (p == 0.0f) continue;
                const float *v = j < na ? vc + j * va_j : vo + (j - na) * D;
                for (long d = 0; d < D; d++) out[d] += p * v[d];
            }
            float inv = 1.0f / total;
            for (long d = 0; d < D; d++) out[d] *= inv;
        }
    }
    bf16_linear(att, W->o, 0, o, R, W->o_n, H * D, threads);
    if (gate && W->o_a) adapter(att, H * D, W->o_a, W->o_b, W->rank, H * D, Hd, gate, R, o, W->o_n, t);
    for (long r = 0; r < R; r++)
        for (long i = 0; i < Hd; i++) y[r * Hd + i] = x[r * Hd + i] + o[r * W->o_n + i];

    /* SwiGLU */
    rms_norm(y, W->norm2, W->eps, n1, R, Hd);
    bf16_linear(n1, W->gate_up, 0, gu, R, W->gate_up_n, Hd, threads);
    if (gate && W->gate_up_a) adapter(n1, Hd, W->gate_up_a, W->gate_up_b, W->rank, Hd, 2 * I, gate, R, gu, W->gate_up_n, t);
    for (long r = 0; r < R; r++) {
        const float *g = gu + r * W->gate_up_n, *u = g + I;
        float *a = act + r * I;
        long i = 0;
        for (; i + 8 <= I; i += 8) {  /* silu(g) * u = g / (1 + exp(-g)) * u */
            __m256 gv = _mm256_loadu_ps(g + i);
            __m256 s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
            _mm256_storeu_ps(a + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
        }
        for (; i < I; i++) a[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
    bf16_linear(act, W->down, 0, dn, R, W->down_n, I, threads);
    if (gate && W->down_a) adapter(act, I, W->down_a, W->down_b, W->rank, I, Hd, gate, R, dn, W->down_n, t);
    for (long r = 0; r < R; r++)
        for (long i = 0; i < Hd; i++) y[r * Hd + i] += dn[r * W->down_n + i];
    free(n1); free(qkv); free(att); free(o); free(gu); free(act); free(dn); free(scores); free(t);
}
