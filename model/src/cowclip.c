/*
 * cowclip.c - CowClip's column-wise clipping of an id's embedding gradient (mt/model.h).
 * In mt_model_core: the trainer clips before it sends the gradients of a step.
 */
#include <math.h>

#include "mt/model.h"

float mt_model_cowclip(float *restrict g, const float *restrict w, uint32_t d, uint32_t count,
                       float ratio, float zeta) {
    double gg = 0, ww = 0;
    for (uint32_t j = 0; j < d; j++) {
        gg += (double)g[j] * g[j];
        ww += (double)w[j] * w[j];
    }
    double wn = sqrt(ww), t = (double)ratio * (wn > zeta ? wn : (double)zeta) * count;
    if (gg <= t * t) return 1.0f;
    float f = (float)(t / sqrt(gg));
    for (uint32_t j = 0; j < d; j++)
        g[j] *= f;
    return f;
}
