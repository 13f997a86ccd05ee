/*
 * optim.c - optimizers applied in place on a row, and the deterministic row initializer.
 *
 * State layout per optimizer (floats after the embedding, see table_int.h):
 *   SGD      none
 *   Adagrad  a[dim]                      accumulated squared gradients (starts at init_accum)
 *   FTRL     z[dim] n[dim]               FTRL-Proximal, McMahan et al., KDD 2013, Algorithm 1
 *   Adam     m[dim] v[dim] b1^t b2^t     moments and this row's bias-correction powers
 *
 * Adam counts steps per row (Monolith and TF's LazyAdam use the global step instead; a row
 * that is rarely updated would then get a step size that ignores its own history).
 *
 * The initializer draws from a splitmix64 stream seeded with XXH3(fid, init_seed), so every
 * replica that knows the seed builds the same row for the same fid without talking.
 */
#include <math.h>
#include <string.h>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "table_int.h"

uint32_t mt__opt_state_floats(const mt_table_slot_config_t *s) {
    switch (s->opt) {
    case MT_OPT_SGD: return 0;
    case MT_OPT_ADAGRAD: return s->dim;
    case MT_OPT_FTRL: return 2 * s->dim;
    case MT_OPT_ADAM: return 2 * s->dim + 2;
    }
    return 0;
}

void mt__opt_init_state(const mt_table_slot_config_t *s, float *state) {
    uint32_t n = mt__opt_state_floats(s);
    switch (s->opt) {
    case MT_OPT_SGD: break;
    case MT_OPT_ADAGRAD:
        for (uint32_t i = 0; i < n; i++)
            state[i] = s->init_accum;
        break;
    case MT_OPT_FTRL: memset(state, 0, n * sizeof(float)); break;
    case MT_OPT_ADAM:
        memset(state, 0, 2 * s->dim * sizeof(float));
        state[2 * s->dim] = 1.0f;     /* beta1^t, t = 0 */
        state[2 * s->dim + 1] = 1.0f; /* beta2^t */
        break;
    }
}

static void opt_sgd(const mt_table_slot_config_t *s, float *w, const float *g) {
    const float lr = s->lr;
    for (uint32_t i = 0; i < s->dim; i++)
        w[i] -= lr * g[i];
}

/* Four coordinates at a time with SSE where available: GCC keeps sqrtf scalar (errno
 * semantics: a branch to the library call per coordinate, so the loop does not vectorize
 * without -fno-math-errno) and the divisions then dominate (measured: 4.5% of a warm
 * training step, most of it on the divss/sqrtss chain). The vector lanes do the same IEEE
 * operations in the same order as the scalar loop (sqrt and division correctly rounded,
 * no contraction), so results are identical bit for bit. */
static void opt_adagrad(const mt_table_slot_config_t *s, float *w, float *a, const float *g) {
    const float lr = s->lr, eps = s->eps;
    uint32_t i = 0;
#if defined(__SSE2__)
    const __m128 vlr = _mm_set1_ps(lr), veps = _mm_set1_ps(eps);
    for (; i + 4 <= s->dim; i += 4) {
        __m128 gv = _mm_loadu_ps(g + i);
        __m128 av = _mm_add_ps(_mm_loadu_ps(a + i), _mm_mul_ps(gv, gv));
        _mm_storeu_ps(a + i, av);
        __m128 step = _mm_div_ps(_mm_mul_ps(vlr, gv), _mm_add_ps(_mm_sqrt_ps(av), veps));
        _mm_storeu_ps(w + i, _mm_sub_ps(_mm_loadu_ps(w + i), step));
    }
#endif
    for (; i < s->dim; i++) {
        a[i] += g[i] * g[i];
        w[i] -= lr * g[i] / (sqrtf(a[i]) + eps);
    }
}

static void opt_ftrl(const mt_table_slot_config_t *s, float *w, float *st, const float *g) {
    float *z = st, *n = st + s->dim;
    const float alpha = s->lr, beta = s->ftrl_beta, l1 = s->l1, l2 = s->l2;
    for (uint32_t i = 0; i < s->dim; i++) {
        float n_new = n[i] + g[i] * g[i];
        float sigma = (sqrtf(n_new) - sqrtf(n[i])) / alpha;
        z[i] += g[i] - sigma * w[i];
        n[i] = n_new;
        if (fabsf(z[i]) <= l1) {
            w[i] = 0.0f;
        } else {
            float sign = z[i] < 0 ? -1.0f : 1.0f;
            w[i] = -(z[i] - sign * l1) / ((beta + sqrtf(n[i])) / alpha + l2);
        }
    }
}

static void opt_adam(const mt_table_slot_config_t *s, float *w, float *st, const float *g) {
    float *m = st, *v = st + s->dim, *p = st + 2 * s->dim;
    const float b1 = s->beta1, b2 = s->beta2, lr = s->lr, eps = s->eps;
    p[0] *= b1;
    p[1] *= b2;
    const float c1 = 1.0f - p[0], c2 = 1.0f - p[1];
    for (uint32_t i = 0; i < s->dim; i++) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        w[i] -= lr * (m[i] / c1) / (sqrtf(v[i] / c2) + eps);
    }
}

void mt__opt_apply(const mt_table_slot_config_t *s, float *w, float *state, const float *g) {
    switch (s->opt) {
    case MT_OPT_SGD: opt_sgd(s, w, g); break;
    case MT_OPT_ADAGRAD: opt_adagrad(s, w, state, g); break;
    case MT_OPT_FTRL: opt_ftrl(s, w, state, g); break;
    case MT_OPT_ADAM: opt_adam(s, w, state, g); break;
    }
}

static inline uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double unit_double(uint64_t *x) {
    return (double)(splitmix64(x) >> 11) * (1.0 / 9007199254740992.0);
}

void mt__init_emb(const mt_table_slot_config_t *s, uint64_t fid, float *w) {
    uint64_t x = XXH3_64bits_withSeed(&fid, sizeof(fid), s->init_seed);
    switch (s->init) {
    case MT_INIT_ZEROS: memset(w, 0, s->dim * sizeof(float)); break;
    case MT_INIT_UNIFORM:
        /* Two values per draw: 24 random bits each, uniform in [-scale, scale). */
        for (uint32_t i = 0; i < s->dim; i += 2) {
            uint64_t r = splitmix64(&x);
            w[i] = ((float)(r >> 40) * (2.0f / 16777216.0f) - 1.0f) * s->init_scale;
            if (i + 1 < s->dim)
                w[i + 1] =
                    ((float)((r >> 8) & 0xFFFFFFu) * (2.0f / 16777216.0f) - 1.0f) * s->init_scale;
        }
        break;
    case MT_INIT_NORMAL:
        for (uint32_t i = 0; i < s->dim; i += 2) {
            /* Box-Muller: two normals from two uniforms; 1 - u keeps log() finite. */
            double u1 = 1.0 - unit_double(&x), u2 = unit_double(&x);
            double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
            w[i] = (float)(s->init_mean + s->init_scale * r * cos(th));
            if (i + 1 < s->dim) w[i + 1] = (float)(s->init_mean + s->init_scale * r * sin(th));
        }
        break;
    }
    /* the draws above fill every float, so the first dim - zero_tail are those of a slot of
     * that dim with the same seed */
    if (s->zero_tail) memset(w + (s->dim - s->zero_tail), 0, s->zero_tail * sizeof(float));
}
