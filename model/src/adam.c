/*
 * adam.c - the dense Adam step (mt/model.h), one copy for the trainer's local step and the
 * PS's dense store. In the library mt_model_core (with def.c): the PS takes it without the
 * model's OpenBLAS, whose threads start at load, before a daemon blocks its signals.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "mt/model.h"

void mt_model_adam_step(const mt_model_adam_t *o, uint64_t t, float *restrict w, float *restrict m,
                        float *restrict v, const float *restrict g, size_t n) {
    const float b1 = o->beta1, b2 = o->beta2, eps = o->eps;
    double c1 = 1.0 - pow(b1, (double)t), c2 = 1.0 - pow(b2, (double)t);
    float lr = (float)(o->lr * sqrt(c2) / c1);
    size_t k = 0;
#if defined(__SSE2__)
    /* Four at a time (3% of a warm training step scalar: GCC keeps sqrtf scalar, see
     * embedding/src/optim.c): the same IEEE operations in the same order as the scalar
     * loop, so the result is identical bit for bit. */
    const __m128 vb1 = _mm_set1_ps(b1), vb2 = _mm_set1_ps(b2), vc1 = _mm_set1_ps(1.0f - b1),
                 vc2 = _mm_set1_ps(1.0f - b2), vlr = _mm_set1_ps(lr), veps = _mm_set1_ps(eps);
    for (; k + 4 <= n; k += 4) {
        __m128 gk = _mm_loadu_ps(g + k);
        __m128 mk = _mm_add_ps(_mm_mul_ps(vb1, _mm_loadu_ps(m + k)), _mm_mul_ps(vc1, gk));
        __m128 vk =
            _mm_add_ps(_mm_mul_ps(vb2, _mm_loadu_ps(v + k)), _mm_mul_ps(_mm_mul_ps(vc2, gk), gk));
        _mm_storeu_ps(m + k, mk);
        _mm_storeu_ps(v + k, vk);
        __m128 step = _mm_div_ps(_mm_mul_ps(vlr, mk), _mm_add_ps(_mm_sqrt_ps(vk), veps));
        _mm_storeu_ps(w + k, _mm_sub_ps(_mm_loadu_ps(w + k), step));
    }
#endif
    for (; k < n; k++) {
        m[k] = b1 * m[k] + (1.0f - b1) * g[k];
        v[k] = b2 * v[k] + (1.0f - b2) * g[k] * g[k];
        w[k] -= lr * m[k] / (sqrtf(v[k]) + eps);
    }
}
