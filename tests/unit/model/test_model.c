/*
 * test_model.c - the DeepFM model's math (model/src/model.c): forward against a hand-worked
 * example, gradients against central finite differences for every parameter kind (b0, each
 * hidden weight and bias, the output weights, dE, dW1), learning on a small fixed problem,
 * the negative sampling correction, the exact AUC, initialization and configuration checks,
 * and the dense Adam step against its formula.
 *
 * Why: a wrong gradient does not crash anything, it only trains a worse model, so every
 * gradient entry of small models is compared with (L(x+eps) - L(x-eps)) / (2 eps).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt/model.h"

/* ============================== helpers ============================== */

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static float rng_uniform(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(rng_next(s) >> 11) * 0x1.0p-53);
}

/* The family of the models mk_model() makes (deepfm unless a dcnv2 case sets it). */
typedef struct family {
    mt_model_type_t type;
    uint32_t ncross, rank;
    const uint32_t *dims;                             /* per-slot dims, or NULL */
    uint32_t ntasks, nexperts, expert_width;          /* mmoe */
    uint32_t seq_slot, seq_query, seq_len, att_width; /* din */
} family_t;

static const family_t DEEPFM = {MT_MODEL_DEEPFM};

static mt_model_t *mk_model_of(family_t f, uint32_t S, uint32_t d, uint32_t nhidden,
                               const uint32_t *hidden, uint64_t seed) {
    mt_model_config_t c;
    mt_model_config_init(&c);
    c.nslots = S;
    c.dim = d;
    c.nhidden = nhidden;
    for (uint32_t l = 0; l < nhidden; l++)
        c.hidden[l] = hidden[l];
    c.init_seed = seed;
    c.type = f.type;
    c.slot_dims = f.dims;
    if (f.type == MT_MODEL_MMOE) {
        c.ntasks = f.ntasks;
        c.nexperts = f.nexperts;
        c.expert_width = f.expert_width;
        c.task_weight[1] = 0.5f; /* weights other than 1 */
        c.task_weight[2] = 2.0f;
    }
    if (f.type == MT_MODEL_DCNV2) {
        c.ncross = f.ncross;
        c.cross_rank = f.rank;
    }
    if (f.type == MT_MODEL_DIN) {
        c.seq_slot = f.seq_slot;
        c.seq_query = f.seq_query;
        c.seq_len = f.seq_len;
        c.attention_width = f.att_width;
    }
    mt_model_t *m = NULL;
    cr_assert_eq(mt_model_create(&c, &m), MT_OK);
    cr_assert_not_null(m);
    return m;
}

static mt_model_t *mk_model(uint32_t S, uint32_t d, uint32_t nhidden, const uint32_t *hidden,
                            uint64_t seed) {
    return mk_model_of(DEEPFM, S, d, nhidden, hidden, seed);
}

static float loss_of(mt_model_t *m, const float *E, const float *W1, const float *y, const float *w,
                     size_t n) {
    float loss = -1;
    cr_assert_eq(mt_model_forward_backward(m, E, W1, y, w, n, NULL, &loss, NULL, NULL), MT_OK);
    return loss;
}

/*
 * Relative error with a floor: float losses carry ~1e-7 relative noise, so a central
 * difference with eps 1e-3 is good to ~1e-4 absolute; tiny gradients are judged on that.
 */
static void expect_close(float analytic, double numeric, const char *what, size_t j) {
    double diff = fabs(analytic - numeric);
    double scale = fmax(fabs(analytic) + fabs(numeric), 2e-2);
    cr_expect(diff / scale < 1e-2, "%s[%zu]: analytic %.6g numeric %.6g", what, j, analytic,
              numeric);
}

/* Perturbs x[j] by +-eps and compares the loss slope with grad[j], for every j. */
static void check_array(mt_model_t *m, float *x, size_t size, const float *grad, const char *what,
                        const float *E, const float *W1, const float *y, const float *w, size_t n) {
    const float eps = 1e-3f;
    for (size_t j = 0; j < size; j++) {
        float keep = x[j];
        x[j] = keep + eps;
        double lp = loss_of(m, E, W1, y, w, n);
        x[j] = keep - eps;
        double lm = loss_of(m, E, W1, y, w, n);
        x[j] = keep;
        expect_close(grad[j], (lp - lm) / (2.0 * eps), what, j);
    }
}

/*
 * Full gradient check of a model of shape S x d with the given hidden layers on a random
 * batch of n examples (with or without weights).
 */
static void grad_check_of(family_t f, uint32_t S, uint32_t d, uint32_t nhidden,
                          const uint32_t *hidden, size_t n, int use_weights, uint64_t seed) {
    mt_model_t *m = mk_model_of(f, S, d, nhidden, hidden, seed);
    uint64_t rs = seed * 7919 + 1;
    size_t D = 0;
    for (uint32_t s = 0; s < S; s++)
        D += mt_model_slot_width(mt_model_config(m), s);
    size_t ne = n * D, nw = n * S, T = mt_model_ntasks(m);
    float *E = malloc(ne * sizeof *E), *W1 = malloc(nw * sizeof *W1);
    float *y = malloc(n * T * sizeof *y), *w = malloc(n * sizeof *w);
    float *dE = malloc(ne * sizeof *dE), *dW1 = malloc(nw * sizeof *dW1);
    for (size_t j = 0; j < ne; j++)
        E[j] = rng_uniform(&rs, -0.6f, 0.6f);
    for (size_t j = 0; j < nw; j++)
        W1[j] = rng_uniform(&rs, -0.3f, 0.3f);
    for (size_t i = 0; i < n; i++) {
        for (size_t t = 0; t < T; t++) /* tasks labelled differently */
            y[i * T + t] = (float)((i + t * (i / 2)) % 2);
        w[i] = rng_uniform(&rs, 0.5f, 2.0f);
    }
    if (f.type == MT_MODEL_DIN) { /* example i's sequence holds i % (L + 1) ids: zeros after */
        const mt_model_config_t *c = mt_model_config(m);
        size_t off = 0;
        for (uint32_t s = 0; s < f.seq_slot; s++)
            off += mt_model_slot_width(c, s);
        const uint32_t dq = mt_model_slot_dim(c, f.seq_query);
        for (size_t i = 0; i < n; i++)
            for (size_t j = i % (f.seq_len + 1); j < f.seq_len; j++)
                memset(E + i * D + off + j * dq, 0, dq * sizeof(float));
    }
    const float *wp = use_weights ? w : NULL;
    /* Non-zero biases so that their gradient paths are exercised at a generic point. */
    size_t np = mt_model_nparams(m);
    for (size_t t = 0; t < np; t++) {
        mt_model_param_t p;
        cr_assert_eq(mt_model_param(m, t, &p), MT_OK);
        if (p.ndim == 1)
            for (size_t j = 0; j < p.size; j++)
                p.values[j] = rng_uniform(&rs, -0.2f, 0.2f);
    }

    float loss = 0;
    cr_assert_eq(mt_model_forward_backward(m, E, W1, y, wp, n, NULL, &loss, dE, dW1), MT_OK);
    cr_assert(loss > 0 && isfinite(loss));
    /* Keep a copy of the parameter gradients: every loss_of() call overwrites them. */
    float **g = calloc(np, sizeof *g);
    for (size_t t = 0; t < np; t++) {
        mt_model_param_t p;
        cr_assert_eq(mt_model_param(m, t, &p), MT_OK);
        g[t] = malloc(p.size * sizeof(float));
        memcpy(g[t], p.grads, p.size * sizeof(float));
    }
    for (size_t t = 0; t < np; t++) {
        mt_model_param_t p;
        cr_assert_eq(mt_model_param(m, t, &p), MT_OK);
        check_array(m, p.values, p.size, g[t], p.name, E, W1, y, wp, n);
    }
    check_array(m, E, ne, dE, "dE", E, W1, y, wp, n);
    check_array(m, W1, nw, dW1, "dW1", E, W1, y, wp, n);

    for (size_t t = 0; t < np; t++)
        free(g[t]);
    free(g);
    free(E);
    free(W1);
    free(y);
    free(w);
    free(dE);
    free(dW1);
    mt_model_destroy(m);
}

static void grad_check(uint32_t S, uint32_t d, uint32_t nhidden, const uint32_t *hidden, size_t n,
                       int use_weights, uint64_t seed) {
    grad_check_of(DEEPFM, S, d, nhidden, hidden, n, use_weights, seed);
}

/* ============================== gradient checks ============================== */

Test(model_grad, two_hidden_layers_of_different_sizes_weighted) {
    const uint32_t h[] = {7, 5};
    grad_check(3, 4, 2, h, 5, 1, 11);
}

Test(model_grad, two_hidden_layers_unweighted) {
    const uint32_t h[] = {6, 9};
    grad_check(4, 3, 2, h, 6, 0, 12);
}

Test(model_grad, three_hidden_layers) {
    const uint32_t h[] = {8, 4, 3};
    grad_check(2, 5, 3, h, 4, 1, 13);
}

Test(model_grad, one_hidden_layer_single_slot) {
    const uint32_t h[] = {5};
    grad_check(1, 6, 1, h, 3, 1, 14);
}

Test(model_grad, no_hidden_layer) {
    grad_check(3, 2, 0, NULL, 4, 1, 15);
}

Test(model_grad, dense_grads_overwritten_not_accumulated) {
    const uint32_t h[] = {4};
    mt_model_t *m = mk_model(2, 2, 1, h, 3);
    float E[8] = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f, 0.2f, 0.1f};
    float W1[4] = {0.1f, 0.2f, -0.1f, 0.05f}, y[2] = {1, 0};
    float dE1[8], dE2[8];
    mt_model_param_t p;
    cr_assert_eq(mt_model_param_find(m, "mlp.0.w", &p), MT_OK);
    cr_assert_eq(mt_model_forward_backward(m, E, W1, y, NULL, 2, NULL, NULL, dE1, NULL), MT_OK);
    float first[8];
    memcpy(first, p.grads, sizeof first);
    cr_assert_eq(mt_model_forward_backward(m, E, W1, y, NULL, 2, NULL, NULL, dE2, NULL), MT_OK);
    cr_expect_arr_eq(first, p.grads, sizeof first);
    cr_expect_arr_eq(dE1, dE2, sizeof dE1);
    mt_model_destroy(m);
}

/* dcnv2: every cross tensor (full rank: w, b; low rank: v, u, b), through the MLP or
 * straight into the output layer, one layer or several. */
Test(model_grad, dcnv2_full_rank_two_cross_layers_two_hidden) {
    const uint32_t h[] = {7, 5};
    grad_check_of((family_t){MT_MODEL_DCNV2, .ncross = 2}, 3, 2, 2, h, 5, 1, 21);
}

Test(model_grad, dcnv2_low_rank_three_cross_layers_one_hidden) {
    const uint32_t h[] = {6};
    grad_check_of((family_t){MT_MODEL_DCNV2, .ncross = 3, .rank = 2}, 2, 3, 1, h, 4, 0, 22);
}

Test(model_grad, dcnv2_one_cross_layer_no_hidden) {
    grad_check_of((family_t){MT_MODEL_DCNV2, .ncross = 1}, 3, 2, 0, NULL, 4, 1, 23);
}

/* per-slot dims (dcnv2 takes any): slots of dims 3, 1 and 5 */
Test(model_grad, dcnv2_per_slot_dims) {
    static const uint32_t dims[3] = {3, 1, 5};
    const uint32_t h[] = {6};
    grad_check_of((family_t){MT_MODEL_DCNV2, .ncross = 2, .dims = dims}, 3, 3, 1, h, 4, 1, 25);
    grad_check_of((family_t){MT_MODEL_DCNV2, .ncross = 1, .rank = 2, .dims = dims}, 3, 3, 0, NULL,
                  3, 0, 26);
}

/* din: the attention's tensors, FM and the MLP over x', dE of the query, the keys (padding
 * too) and the other slots, dW1 (the sequence's: 0); the sequence before, after and between
 * slots, no hidden layer. Unequal dims are refused (its FM term, as deepfm's). */
Test(model_grad, din_sequence_between_slots) {
    const uint32_t h[] = {5, 3};
    grad_check_of(
        (family_t){MT_MODEL_DIN, .seq_slot = 1, .seq_query = 2, .seq_len = 3, .att_width = 4}, 4, 2,
        2, h, 5, 1, 50);
}

Test(model_grad, din_sequence_first_no_hidden) {
    grad_check_of(
        (family_t){MT_MODEL_DIN, .seq_slot = 0, .seq_query = 2, .seq_len = 2, .att_width = 3}, 3, 3,
        0, NULL, 4, 0, 51);
    static const uint32_t dims[3] = {3, 2, 3};
    mt_model_config_t c;
    mt_model_config_init(&c);
    c.nslots = 3;
    c.dim = 3;
    c.slot_dims = dims;
    c.type = MT_MODEL_DIN;
    c.seq_query = 2;
    c.seq_slot = 0;
    char err[256];
    cr_assert_eq(mt_model_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    cr_expect(strstr(err, "din's FM term") != NULL, "%s", err);
}

Test(model_grad, din_sequence_last_one_position) {
    const uint32_t h[] = {4};
    grad_check_of(
        (family_t){MT_MODEL_DIN, .seq_slot = 2, .seq_query = 0, .seq_len = 1, .att_width = 2}, 3, 3,
        1, h, 3, 1, 52);
}

/* mmoe: every expert, gate and tower tensor, b0 per task, dE and dW1; with and without
 * tower hidden layers, 2 and 3 tasks, one expert (the gate's softmax is then constant). */
Test(model_grad, mmoe_two_tasks_towers_of_two_layers) {
    const uint32_t h[] = {5, 3};
    grad_check_of((family_t){MT_MODEL_MMOE, .ntasks = 2, .nexperts = 3, .expert_width = 4}, 3, 2, 2,
                  h, 5, 1, 40);
}

Test(model_grad, mmoe_three_tasks_no_tower_hidden_layer) {
    grad_check_of((family_t){MT_MODEL_MMOE, .ntasks = 3, .nexperts = 2, .expert_width = 3}, 2, 3, 0,
                  NULL, 4, 0, 32);
}

Test(model_grad, mmoe_one_expert_per_slot_dims) {
    static const uint32_t dims[3] = {2, 1, 3};
    const uint32_t h[] = {4};
    grad_check_of(
        (family_t){MT_MODEL_MMOE, .dims = dims, .ntasks = 2, .nexperts = 1, .expert_width = 3}, 3,
        2, 1, h, 3, 1, 33);
}

Test(model_grad, dcnv2_low_rank_no_hidden_single_slot) {
    grad_check_of((family_t){MT_MODEL_DCNV2, .ncross = 2, .rank = 1}, 1, 4, 0, NULL, 3, 1, 24);
}

/* The dense gradients do not depend on whether dE is asked for (without it the cross
 * layers' backward pass stops early). */
Test(model_grad, dcnv2_dense_grads_same_without_dE) {
    const uint32_t h[] = {4};
    const family_t fams[] = {{MT_MODEL_DCNV2, .ncross = 2},
                             {MT_MODEL_DCNV2, .ncross = 2, .rank = 3}};
    for (size_t q = 0; q < 2; q++) {
        mt_model_t *m = mk_model_of(fams[q], 2, 3, 1, h, 5);
        uint64_t rs = 3;
        float E[3 * 6], W1[3 * 2], y[3] = {1, 0, 1}, dE[3 * 6];
        for (int j = 0; j < 18; j++)
            E[j] = rng_uniform(&rs, -1, 1);
        for (int j = 0; j < 6; j++)
            W1[j] = rng_uniform(&rs, -1, 1);
        size_t np = mt_model_nparams(m);
        float *with[16];
        cr_assert(np <= 16);
        cr_assert_eq(mt_model_forward_backward(m, E, W1, y, NULL, 3, NULL, NULL, dE, NULL), MT_OK);
        for (size_t t = 0; t < np; t++) {
            mt_model_param_t p;
            cr_assert_eq(mt_model_param(m, t, &p), MT_OK);
            with[t] = malloc(p.size * sizeof(float));
            memcpy(with[t], p.grads, p.size * sizeof(float));
        }
        cr_assert_eq(mt_model_forward_backward(m, E, W1, y, NULL, 3, NULL, NULL, NULL, NULL),
                     MT_OK);
        for (size_t t = 0; t < np; t++) {
            mt_model_param_t p;
            cr_assert_eq(mt_model_param(m, t, &p), MT_OK);
            cr_expect_arr_eq(with[t], p.grads, p.size * sizeof(float), "%s", p.name);
            free(with[t]);
        }
        mt_model_destroy(m);
    }
}

/* ============================== forward ============================== */

/*
 * dcnv2, S = 2 slots of d = 1, one full-rank cross layer, no hidden layer:
 *   x0 = [1, 2], W = [[0.5, -1], [0.25, 0]], b = [0.1, -0.2]
 *   z  = x0 W + b = [0.5 + 0.5 + 0.1, -1 + 0 - 0.2] = [1.1, -1.2]
 *   x1 = x0 * z + x0 = [1.1 + 1, -2.4 + 2] = [2.1, -0.4]
 *   MLP: w_out = [0.3, 0.5]: 0.63 - 0.2 = 0.43; first order: b0 -0.1 + W1 0.2 + 0 = 0.1
 *   logit = 0.53 (no FM term, which would add 0.5 * (3^2 - 5) = 2)
 */
Test(model_forward, dcnv2_hand_worked_example) {
    mt_model_t *m = mk_model_of((family_t){MT_MODEL_DCNV2, .ncross = 1}, 2, 1, 0, NULL, 1);
    cr_assert_eq(mt_model_nparams(m), 4);
    mt_model_param_t b0, w, b, wout;
    cr_assert_eq(mt_model_param_find(m, "b0", &b0), MT_OK);
    cr_assert_eq(mt_model_param_find(m, "cross.0.w", &w), MT_OK);
    cr_assert_eq(mt_model_param_find(m, "cross.0.b", &b), MT_OK);
    cr_assert_eq(mt_model_param_find(m, "mlp.out.w", &wout), MT_OK);
    b0.values[0] = -0.1f;
    const float wv[4] = {0.5f, -1.0f, 0.25f, 0.0f}, bv[2] = {0.1f, -0.2f}, wo[2] = {0.3f, 0.5f};
    memcpy(w.values, wv, sizeof wv);
    memcpy(b.values, bv, sizeof bv);
    memcpy(wout.values, wo, sizeof wo);
    const float E[2] = {1, 2}, W1[2] = {0.2f, 0.0f};
    float p = 0, y = 1, dE[2];
    cr_assert_eq(mt_model_forward(m, NULL, E, W1, 1, &p), MT_OK);
    cr_expect_float_eq(p, 1.0f / (1.0f + expf(-0.53f)), 1e-6f);
    cr_assert_eq(mt_model_forward_backward(m, E, W1, &y, NULL, 1, NULL, NULL, dE, NULL), MT_OK);
    /* g = p - 1; dL/dx1 = g w_out; dz = g w_out * x0; db = dz;
     * dE = g w_out * (1 + z) + dz W^T */
    const float g = p - 1, gx[2] = {g * 0.3f, g * 0.5f}, dz[2] = {gx[0] * 1, gx[1] * 2};
    cr_expect_float_eq(b.grads[0], dz[0], 1e-6f);
    cr_expect_float_eq(b.grads[1], dz[1], 1e-6f);
    cr_expect_float_eq(w.grads[1], E[0] * dz[1], 1e-6f); /* dW[0][1] = x0_0 dz_1 */
    cr_expect_float_eq(dE[0], gx[0] * (1 + 1.1f) + dz[0] * 0.5f + dz[1] * -1.0f, 1e-6f);
    cr_expect_float_eq(dE[1], gx[1] * (1 - 1.2f) + dz[0] * 0.25f + dz[1] * 0.0f, 1e-6f);
    mt_model_destroy(m);
}

/* dcnv2 scores the same through the workspace, without one, from training, and with the
 * serving forward's shared slots (which dcnv2 reads per row). */
Test(model_forward, dcnv2_same_scores_every_way) {
    const uint32_t h[] = {8};
    const family_t fams[] = {{MT_MODEL_DCNV2, .ncross = 3},
                             {MT_MODEL_DCNV2, .ncross = 2, .rank = 4}};
    for (size_t q = 0; q < 2; q++) {
        mt_model_t *m = mk_model_of(fams[q], 4, 3, 1, h, 8);
        enum { N = 9, S = 4, D = 12 };
        uint64_t rs = 11;
        float E[N * D], W1[N * S], y[N], p1[N], p2[N], p3[N], p4[N];
        uint8_t varies[S] = {0, 1, 0, 1};
        for (size_t i = 0; i < N; i++)
            for (int s = 0; s < S; s++) {
                int own = i == 0 || varies[s];
                W1[i * S + s] = own ? rng_uniform(&rs, -1, 1) : W1[s];
                for (int k = 0; k < 3; k++)
                    E[i * D + s * 3 + k] = own ? rng_uniform(&rs, -1, 1) : E[s * 3 + k];
            }
        for (size_t i = 0; i < N; i++)
            y[i] = (float)(i % 2);
        mt_model_ws_t *ws = NULL;
        cr_assert_eq(mt_model_ws_create(&ws), MT_OK);
        cr_assert_eq(mt_model_forward(m, ws, E, W1, N, p1), MT_OK);
        cr_assert_eq(mt_model_forward(m, NULL, E, W1, N, p2), MT_OK);
        cr_assert_eq(mt_model_forward_backward(m, E, W1, y, NULL, N, p3, NULL, NULL, NULL), MT_OK);
        cr_assert_eq(mt_model_forward_serving(m, ws, E, W1, N, 1.0f, varies, p4), MT_OK);
        for (size_t i = 0; i < N; i++) {
            cr_expect_eq(p1[i], p2[i]);
            cr_expect_float_eq(p1[i], p3[i], 1e-6f);
            cr_expect_float_eq(p1[i], p4[i], 1e-6f);
        }
        mt_model_ws_destroy(ws);
        mt_model_destroy(m);
    }
}

/*
 * S = 2, d = 2, no hidden layer, parameters set by hand:
 *   E = [[1, 2], [3, -1]], W1 = [0.5, -0.25], b0 = 0.1, w_out = [0.1, 0.2, -0.3, 0.4]
 *   first order: 0.1 + 0.5 - 0.25 = 0.35
 *   FM: sums per k: 4, 1; 0.5 * ((16 + 1) - (1 + 9 + 4 + 1)) = 1
 *   MLP: 0.1*1 + 0.2*2 - 0.3*3 + 0.4*(-1) = -0.8
 *   logit = 0.55
 */
Test(model_forward, hand_worked_example) {
    mt_model_t *m = mk_model(2, 2, 0, NULL, 1);
    mt_model_param_t b0, wout;
    cr_assert_eq(mt_model_param_find(m, "b0", &b0), MT_OK);
    cr_assert_eq(mt_model_param_find(m, "mlp.out.w", &wout), MT_OK);
    cr_assert_eq(wout.shape[0], 4);
    cr_assert_eq(wout.shape[1], 1);
    b0.values[0] = 0.1f;
    const float wo[4] = {0.1f, 0.2f, -0.3f, 0.4f};
    memcpy(wout.values, wo, sizeof wo);
    const float E[4] = {1, 2, 3, -1}, W1[2] = {0.5f, -0.25f};
    float p = 0;
    cr_assert_eq(mt_model_forward(m, NULL, E, W1, 1, &p), MT_OK);
    cr_expect_float_eq(p, 1.0f / (1.0f + expf(-0.55f)), 1e-6f);

    /* Loss and its gradients at this point: g = p - 1 for y = 1. */
    float y = 1, loss = 0, dE[4], dW1[2], pp = 0;
    cr_assert_eq(mt_model_forward_backward(m, E, W1, &y, NULL, 1, &pp, &loss, dE, dW1), MT_OK);
    cr_expect_float_eq(pp, p, 1e-7f);
    cr_expect_float_eq(loss, -logf(p), 1e-6f);
    float g = p - 1;
    cr_expect_float_eq(b0.grads[0], g, 1e-6f);
    cr_expect_float_eq(dW1[0], g, 1e-6f);
    cr_expect_float_eq(dW1[1], g, 1e-6f);
    /* dE[s,k] = g * (sum_k - E[s,k] + w_out[s*d + k]) */
    const float expect_dE[4] = {g * (4 - 1 + 0.1f), g * (1 - 2 + 0.2f), g * (4 - 3 - 0.3f),
                                g * (1 + 1 + 0.4f)};
    for (int j = 0; j < 4; j++)
        cr_expect_float_eq(dE[j], expect_dE[j], 1e-6f, "dE[%d]", j);
    for (int j = 0; j < 4; j++)
        cr_expect_float_eq(wout.grads[j], g * E[j], 1e-6f);
    mt_model_destroy(m);
}

/* din: a sequence shorter than seq_len is padded with zeros, which are no behaviours at all:
 * a model of L = 2 and one of L = 5 from the same seed (their tensors are the same shapes)
 * score a sequence of 2 alike; its W1 cell is not read; a third behaviour changes the score. */
Test(model_forward, din_padding_is_no_behaviour) {
    const uint32_t h[] = {6};
    family_t f2 = {MT_MODEL_DIN, .seq_slot = 1, .seq_query = 0, .seq_len = 2, .att_width = 4};
    family_t f5 = f2;
    f5.seq_len = 5;
    mt_model_t *m2 = mk_model_of(f2, 3, 4, 1, h, 9), *m5 = mk_model_of(f5, 3, 4, 1, h, 9);
    cr_assert_eq(mt_model_nparams(m2), mt_model_nparams(m5));
    enum { N = 3, D2 = 4 + 8 + 4, D5 = 4 + 20 + 4 };
    float E2[N * D2], E5[N * D5] = {0}, W1[N * 3], p2[N], p5[N], p5b[N];
    uint64_t rs = 17;
    for (size_t j = 0; j < N * D2; j++)
        E2[j] = rng_uniform(&rs, -0.5f, 0.5f);
    for (size_t j = 0; j < N * 3; j++)
        W1[j] = rng_uniform(&rs, -0.3f, 0.3f);
    for (size_t i = 0; i < N; i++) { /* query, the 2 behaviours, then the third slot */
        memcpy(E5 + i * D5, E2 + i * D2, 12 * sizeof(float));
        memcpy(E5 + i * D5 + 24, E2 + i * D2 + 12, 4 * sizeof(float));
    }
    cr_assert_eq(mt_model_forward(m2, NULL, E2, W1, N, p2), MT_OK);
    cr_assert_eq(mt_model_forward(m5, NULL, E5, W1, N, p5), MT_OK);
    for (size_t i = 0; i < N; i++)
        cr_expect_float_eq(p2[i], p5[i], 1e-6f, "example %zu: %g vs %g", i, p2[i], p5[i]);
    float W1b[N * 3];
    memcpy(W1b, W1, sizeof W1);
    for (size_t i = 0; i < N; i++)
        W1b[i * 3 + 1] += 5.0f; /* the sequence's first-order cell */
    cr_assert_eq(mt_model_forward(m5, NULL, E5, W1b, N, p5b), MT_OK);
    for (size_t i = 0; i < N; i++)
        cr_expect_eq(p5b[i], p5[i]);
    for (size_t i = 0; i < N; i++) /* a third behaviour: the query itself */
        memcpy(E5 + i * D5 + 4 + 8, E5 + i * D5, 4 * sizeof(float));
    cr_assert_eq(mt_model_forward(m5, NULL, E5, W1, N, p5b), MT_OK);
    for (size_t i = 0; i < N; i++)
        cr_expect(fabsf(p5b[i] - p5[i]) > 1e-6f, "example %zu: a behaviour more, same score", i);
    mt_model_destroy(m2);
    mt_model_destroy(m5);
}

Test(model_forward, same_scores_with_and_without_workspace_and_from_training) {
    const uint32_t h[] = {16, 8};
    mt_model_t *m = mk_model(5, 4, 2, h, 42);
    const size_t n = 33;
    uint64_t rs = 5;
    float E[33 * 20], W1[33 * 5], y[33], p1[33], p2[33], p3[33], p4[4];
    for (size_t j = 0; j < n * 20; j++)
        E[j] = rng_uniform(&rs, -1, 1);
    for (size_t j = 0; j < n * 5; j++)
        W1[j] = rng_uniform(&rs, -1, 1);
    for (size_t i = 0; i < n; i++)
        y[i] = (float)(i % 3 == 0);
    mt_model_ws_t *ws = NULL;
    cr_assert_eq(mt_model_ws_create(&ws), MT_OK);
    cr_assert_eq(mt_model_forward(m, ws, E, W1, 4, p4), MT_OK); /* small first: ws grows */
    cr_assert_eq(mt_model_forward(m, ws, E, W1, n, p1), MT_OK);
    cr_assert_eq(mt_model_forward(m, NULL, E, W1, n, p2), MT_OK);
    cr_assert_eq(mt_model_forward_backward(m, E, W1, y, NULL, n, p3, NULL, NULL, NULL), MT_OK);
    for (size_t i = 0; i < n; i++) {
        cr_expect_eq(p1[i], p2[i]);
        cr_expect_float_eq(p1[i], p3[i], 1e-6f);
        cr_expect(p1[i] > 0 && p1[i] < 1);
    }
    for (size_t i = 0; i < 4; i++)
        cr_expect_float_eq(p4[i], p1[i], 1e-6f);
    mt_model_ws_destroy(ws);
    mt_model_destroy(m);
}

/* ============================== negative sampling correction ============================== */

Test(model_sampling, correction_formula) {
    /* p = 0.5 at rate 0.1: odds 1 become 0.1, p' = 0.1 / 1.1. */
    cr_expect_float_eq(mt_model_correct_prob(0.5f, 0.1f), 1.0f / 11.0f, 1e-7f);
    cr_expect_float_eq(mt_model_correct_logit(0.0f, 0.1f), logf(0.1f), 1e-7f);
    cr_expect_float_eq(mt_model_correct_logit(2.0f, 1.0f), 2.0f, 0.0f);
    /* p = 0.8 (odds 4) at rate 0.25: odds 1, p' = 0.5 */
    cr_expect_float_eq(mt_model_correct_prob(0.8f, 0.25f), 0.5f, 1e-6f);
}

Test(model_sampling, serving_forward_applies_it) {
    const uint32_t h[] = {6};
    mt_model_t *m = mk_model(3, 2, 1, h, 9);
    uint64_t rs = 77;
    float E[4 * 6], W1[4 * 3], p[4], ps[4], p1[4];
    for (int j = 0; j < 24; j++)
        E[j] = rng_uniform(&rs, -1, 1);
    for (int j = 0; j < 12; j++)
        W1[j] = rng_uniform(&rs, -1, 1);
    cr_assert_eq(mt_model_forward(m, NULL, E, W1, 4, p), MT_OK);
    cr_assert_eq(mt_model_forward_serving(m, NULL, E, W1, 4, 0.05f, NULL, ps), MT_OK);
    cr_assert_eq(mt_model_forward_serving(m, NULL, E, W1, 4, 1.0f, NULL, p1), MT_OK);
    for (int i = 0; i < 4; i++) {
        cr_expect_float_eq(ps[i], mt_model_correct_prob(p[i], 0.05f), 1e-6f);
        cr_expect(ps[i] < p[i]);
        cr_expect_eq(p1[i], p[i]);
    }
    cr_expect_eq(mt_model_forward_serving(m, NULL, E, W1, 4, 0.0f, NULL, ps), MT_INVALID);
    cr_expect_eq(mt_model_forward_serving(m, NULL, E, W1, 4, 1.5f, NULL, ps), MT_INVALID);
    cr_expect_eq(mt_model_forward_serving(m, NULL, E, W1, 4, NAN, NULL, ps), MT_INVALID);
    mt_model_destroy(m);
}

/* The first layer reads the slots shared by every row once: the scores are the plain
 * forward's up to rounding, for every pattern of shared slots (none, all, one block, more
 * runs than the model reads apart, the two ends) and below the rows where it pays. */
Test(model_sampling, shared_slots_give_the_plain_scores) {
    enum { S = 12, D = 4, N = 7 };
    const uint32_t h[] = {8, 5};
    mt_model_t *m = mk_model(S, D, 2, h, 21);
    uint64_t rs = 5;
    for (size_t t = 0; t < mt_model_nparams(m); t++) {
        mt_model_param_t p;
        cr_assert_eq(mt_model_param(m, t, &p), MT_OK);
        for (size_t j = 0; j < p.size; j++)
            p.values[j] = rng_uniform(&rs, -0.5f, 0.5f); /* biases too: they are folded in */
    }
    static const char *patterns[] = {"111111111111", "000000000000", "000000111111",
                                     "101010101010", "100000000001", "011101101110"};
    mt_model_ws_t *ws = NULL;
    cr_assert_eq(mt_model_ws_create(&ws), MT_OK);
    for (size_t q = 0; q < sizeof(patterns) / sizeof(patterns[0]); q++) {
        for (size_t n = 1; n <= N; n += 3) {
            uint8_t varies[S];
            float E[N * S * D], W1[N * S], plain[N], shared[N];
            for (int s = 0; s < S; s++)
                varies[s] = patterns[q][s] == '1';
            for (size_t i = 0; i < n; i++)
                for (int s = 0; s < S; s++) {
                    int own = i == 0 || varies[s];
                    W1[i * S + s] = own ? rng_uniform(&rs, -1, 1) : W1[s];
                    for (int k = 0; k < D; k++)
                        E[(i * S + s) * D + k] = own ? rng_uniform(&rs, -1, 1) : E[s * D + k];
                }
            cr_assert_eq(mt_model_forward_serving(m, ws, E, W1, n, 0.5f, NULL, plain), MT_OK);
            cr_assert_eq(mt_model_forward_serving(m, ws, E, W1, n, 0.5f, varies, shared), MT_OK);
            for (size_t i = 0; i < n; i++)
                cr_expect(fabsf(shared[i] - plain[i]) <= 1e-6f + 1e-5f * fabsf(plain[i]),
                          "pattern %s, %zu rows, row %zu: %.9g shared, %.9g plain", patterns[q], n,
                          i, shared[i], plain[i]);
        }
    }
    mt_model_ws_destroy(ws);
    mt_model_destroy(m);
}

/* ============================== learning ============================== */

/*
 * 64 examples, 4 slots of dim 4; label = [first slot's first two coordinates sum > 0]. Plain
 * SGD on the dense parameters and on E and W1 (as the PS would on embeddings) must bring the
 * loss well down and the training AUC near 1.
 */
Test(model_learn, sgd_reduces_loss) {
    const uint32_t h[] = {16, 8};
    const uint32_t S = 4, d = 4;
    const size_t n = 64, ne = 64 * 16, nw = 64 * 4;
    mt_model_t *m = mk_model(S, d, 2, h, 2024);
    uint64_t rs = 31337;
    float *E = malloc(ne * sizeof *E), *W1 = calloc(nw, sizeof *W1), y[64], p[64];
    float *dE = malloc(ne * sizeof *dE), *dW1 = malloc(nw * sizeof *dW1);
    for (size_t j = 0; j < ne; j++)
        E[j] = rng_uniform(&rs, -0.5f, 0.5f);
    for (size_t i = 0; i < n; i++)
        y[i] = (E[i * S * d] + E[i * S * d + 1] > 0) ? 1.0f : 0.0f;

    const float lr = 0.5f;
    float first = 0, loss = 0;
    for (int step = 0; step < 200; step++) {
        cr_assert_eq(mt_model_forward_backward(m, E, W1, y, NULL, n, p, &loss, dE, dW1), MT_OK);
        if (step == 0) first = loss;
        for (size_t t = 0; t < mt_model_nparams(m); t++) {
            mt_model_param_t pr;
            cr_assert_eq(mt_model_param(m, t, &pr), MT_OK);
            for (size_t j = 0; j < pr.size; j++)
                pr.values[j] -= lr * pr.grads[j];
        }
        /* Per-example rows: their gradient is 1/n of a mean loss, scale it back. */
        for (size_t j = 0; j < ne; j++)
            E[j] -= lr * (float)n * 0.1f * dE[j];
        for (size_t j = 0; j < nw; j++)
            W1[j] -= lr * (float)n * 0.1f * dW1[j];
    }
    cr_expect(first > 0.6f && first < 0.8f, "initial loss %f", first);
    cr_expect(loss < 0.5f * first, "loss %f -> %f", first, loss);
    double auc = 0;
    cr_assert_eq(mt_model_auc(p, y, n, &auc), MT_OK);
    cr_expect(auc > 0.95, "training AUC %f", auc);
    free(E);
    free(W1);
    free(dE);
    free(dW1);
    mt_model_destroy(m);
}

/* ============================== AUC ============================== */

Test(model_auc, known_values) {
    const float y[4] = {0, 0, 1, 1};
    double auc = -1;
    const float perfect[4] = {0.1f, 0.2f, 0.8f, 0.9f};
    cr_assert_eq(mt_model_auc(perfect, y, 4, &auc), MT_OK);
    cr_expect_float_eq(auc, 1.0, 1e-12);
    const float reversed[4] = {0.9f, 0.8f, 0.2f, 0.1f};
    cr_assert_eq(mt_model_auc(reversed, y, 4, &auc), MT_OK);
    cr_expect_float_eq(auc, 0.0, 1e-12);
    const float ties[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    cr_assert_eq(mt_model_auc(ties, y, 4, &auc), MT_OK);
    cr_expect_float_eq(auc, 0.5, 1e-12);
    /* 3 of 4 pairs ordered: 0.75 */
    const float mixed[4] = {0.1f, 0.4f, 0.35f, 0.8f};
    cr_assert_eq(mt_model_auc(mixed, y, 4, &auc), MT_OK);
    cr_expect_float_eq(auc, 0.75, 1e-12);
    /* pos {0.5, 0.9} vs neg {0.5, 0.2}: 0.5 + 1 + 1 + 1 over 4 pairs */
    const float s5[4] = {0.5f, 0.5f, 0.2f, 0.9f}, y5[4] = {1, 0, 0, 1};
    cr_assert_eq(mt_model_auc(s5, y5, 4, &auc), MT_OK);
    cr_expect_float_eq(auc, 0.875, 1e-12);
}

/* Against the O(P*N) pair count on a random set with many ties. */
Test(model_auc, matches_pair_count) {
    enum { N = 500 };
    float s[N], y[N];
    uint64_t rs = 99;
    for (int i = 0; i < N; i++) {
        s[i] = (float)(rng_next(&rs) % 20); /* many ties */
        y[i] = (float)(rng_next(&rs) % 3 == 0);
    }
    double num = 0, pairs = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            if (y[i] > 0.5f && y[j] < 0.5f) {
                pairs += 1;
                num += s[i] > s[j] ? 1.0 : s[i] == s[j] ? 0.5 : 0.0;
            }
    double auc = 0;
    cr_assert_eq(mt_model_auc(s, y, N, &auc), MT_OK);
    cr_expect_float_eq(auc, num / pairs, 1e-12);
}

Test(model_auc, undefined_cases) {
    const float s[3] = {0.1f, 0.2f, 0.3f}, ones[3] = {1, 1, 1}, zeros[3] = {0, 0, 0};
    const float y[3] = {0, 1, 0}, nan_s[3] = {0.1f, NAN, 0.3f};
    double auc = 0;
    cr_expect_eq(mt_model_auc(s, ones, 3, &auc), MT_INVALID);
    cr_expect_eq(mt_model_auc(s, zeros, 3, &auc), MT_INVALID);
    cr_expect_eq(mt_model_auc(s, y, 0, &auc), MT_INVALID);
    cr_expect_eq(mt_model_auc(nan_s, y, 3, &auc), MT_INVALID);
    cr_expect_eq(mt_model_auc(NULL, y, 3, &auc), MT_INVALID);
    cr_expect_eq(mt_model_auc(s, y, 3, NULL), MT_INVALID);
}

/* ============================== parameters and init ============================== */

Test(model_params, names_shapes_and_init) {
    const uint32_t h[] = {256, 128};
    mt_model_t *m = mk_model(26, 16, 2, h, 7);
    cr_assert_eq(mt_model_nparams(m), 6);
    const char *names[6] = {"b0", "mlp.0.w", "mlp.0.b", "mlp.1.w", "mlp.1.b", "mlp.out.w"};
    const uint32_t nd[6] = {1, 2, 1, 2, 1, 2};
    const uint32_t sh[6][2] = {{1, 0}, {416, 256}, {256, 0}, {256, 128}, {128, 0}, {128, 1}};
    for (size_t t = 0; t < 6; t++) {
        mt_model_param_t p, q;
        cr_assert_eq(mt_model_param(m, t, &p), MT_OK);
        cr_expect_str_eq(p.name, names[t]);
        cr_expect_eq(p.ndim, nd[t]);
        cr_expect_eq(p.shape[0], sh[t][0]);
        cr_expect_eq(p.shape[1], sh[t][1]);
        cr_expect_eq(p.size, (size_t)sh[t][0] * (nd[t] == 2 ? sh[t][1] : 1));
        cr_assert_eq(mt_model_param_find(m, names[t], &q), MT_OK);
        cr_expect_eq(q.values, p.values);
        cr_expect_eq(q.grads, p.grads);
        if (nd[t] == 1) {
            for (size_t j = 0; j < p.size; j++)
                cr_expect_eq(p.values[j], 0.0f);
        } else {
            /* Xavier uniform: inside +-a, spread over it (variance a^2/3). */
            double a = sqrt(6.0 / (sh[t][0] + sh[t][1])), var = 0;
            for (size_t j = 0; j < p.size; j++) {
                cr_expect(fabsf(p.values[j]) <= a);
                var += (double)p.values[j] * p.values[j];
            }
            var /= (double)p.size;
            cr_expect(fabs(var / (a * a / 3.0) - 1.0) < 0.1, "%s var %g", p.name, var);
        }
    }
    mt_model_param_t p;
    cr_expect_eq(mt_model_param(m, 6, &p), MT_INVALID);
    cr_expect_eq(mt_model_param_find(m, "mlp.2.w", &p), MT_NOT_FOUND);
    cr_expect_eq(mt_model_config(m)->nslots, 26);
    mt_model_destroy(m);
}

Test(model_params, init_is_deterministic_per_seed) {
    const uint32_t h[] = {12, 6};
    mt_model_t *a = mk_model(3, 4, 2, h, 5), *b = mk_model(3, 4, 2, h, 5);
    mt_model_t *c = mk_model(3, 4, 2, h, 6);
    for (size_t t = 0; t < mt_model_nparams(a); t++) {
        mt_model_param_t pa, pb, pc;
        cr_assert_eq(mt_model_param(a, t, &pa), MT_OK);
        cr_assert_eq(mt_model_param(b, t, &pb), MT_OK);
        cr_assert_eq(mt_model_param(c, t, &pc), MT_OK);
        cr_expect_arr_eq(pa.values, pb.values, pa.size * sizeof(float));
        if (pa.ndim == 2) cr_expect(memcmp(pa.values, pc.values, pa.size * sizeof(float)) != 0);
    }
    mt_model_destroy(a);
    mt_model_destroy(b);
    mt_model_destroy(c);
}

/* ============================== configuration and bad input ============================== */

Test(model_config, bad_configs) {
    mt_model_config_t c;
    mt_model_t *m = (mt_model_t *)&c; /* must be reset to NULL on failure */
    char err[128];
    mt_model_config_init(&c);
    c.dim = 8;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    cr_expect(strstr(err, "nslots") != NULL, "%s", err);
    cr_expect_eq(mt_model_create(&c, &m), MT_CONFIG);
    cr_expect_null(m);

    c.nslots = 4;
    c.dim = 0;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    cr_expect(strstr(err, "dim") != NULL, "%s", err);
    cr_expect_eq(mt_model_create(&c, &m), MT_CONFIG);

    c.dim = 8;
    c.nhidden = MT_MODEL_MAX_HIDDEN + 1;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    cr_expect(strstr(err, "nhidden") != NULL, "%s", err);

    c.nhidden = 2;
    c.hidden[1] = 0;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    cr_expect(strstr(err, "hidden[1]") != NULL, "%s", err);

    c.hidden[1] = 64;
    c.nslots = 4096;
    c.dim = 4096;
    cr_expect_eq(mt_model_config_validate(&c, NULL, 0), MT_CONFIG);

    c.nslots = 4;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_OK);
    cr_expect_eq(mt_model_create(NULL, &m), MT_CONFIG);
    cr_expect_eq(mt_model_create(&c, NULL), MT_CONFIG);
    mt_model_destroy(NULL);
    mt_model_ws_destroy(NULL);
}

Test(model_config, families_and_cross_layers) {
    mt_model_type_t t = MT_MODEL_DCNV2;
    cr_expect_str_eq(mt_model_type_name(MT_MODEL_DEEPFM), "deepfm");
    cr_expect_str_eq(mt_model_type_name(MT_MODEL_DCNV2), "dcnv2");
    cr_expect_null(mt_model_type_name((mt_model_type_t)7));
    cr_expect_eq(mt_model_type_parse("deepfm", &t), MT_OK);
    cr_expect_eq(t, MT_MODEL_DEEPFM);
    cr_expect_eq(mt_model_type_parse("dcnv2", &t), MT_OK);
    cr_expect_eq(t, MT_MODEL_DCNV2);
    cr_expect_eq(mt_model_type_parse("DCN", &t), MT_CONFIG);
    cr_expect_eq(mt_model_type_parse(NULL, &t), MT_CONFIG);

    mt_model_config_t c;
    char err[160];
    mt_model_config_init(&c);
    cr_expect_eq(c.type, MT_MODEL_DEEPFM);
    c.nslots = 26;
    c.dim = 16;
    c.type = (mt_model_type_t)9;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    cr_expect(strstr(err, "model.type") != NULL, "%s", err);
    c.type = MT_MODEL_DCNV2;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_OK, "%s", err);
    c.ncross = 0;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    cr_expect(strstr(err, "ncross") != NULL, "%s", err);
    c.ncross = MT_MODEL_MAX_CROSS + 1;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    c.ncross = 2;
    c.cross_rank = 417;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    cr_expect(strstr(err, "cross_rank") != NULL, "%s", err);
    c.cross_rank = 416;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_OK, "%s", err);
    c.cross_rank = 0;
    c.nslots = 300; /* D = 4800: full rank refused */
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    cr_expect(strstr(err, "full rank") != NULL, "%s", err);
    c.cross_rank = 64;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_OK, "%s", err);
    /* per-slot dims: dcnv2 takes any (the width is their sum), deepfm one for all */
    uint32_t dims[4] = {16, 4, 8, 1};
    c.type = MT_MODEL_DCNV2;
    c.nslots = 4;
    c.cross_rank = 0;
    c.slot_dims = dims;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_OK, "%s", err);
    c.cross_rank = 30; /* D = 29 */
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    cr_expect(strstr(err, "= 29") != NULL, "%s", err);
    c.cross_rank = 0;
    dims[2] = 0;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    cr_expect(strstr(err, "slot_dims[2]") != NULL, "%s", err);
    dims[2] = 8;
    c.type = MT_MODEL_DEEPFM;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    cr_expect(strstr(err, "slot_dims[1] = 4: deepfm") != NULL, "%s", err);
    for (int s = 0; s < 4; s++)
        dims[s] = 16; /* one dim, given per slot: fine */
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_OK, "%s", err);
    c.slot_dims = NULL;
    /* deepfm ignores the cross settings */
    c.type = MT_MODEL_DEEPFM;
    c.ncross = 0;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_OK, "%s", err);
}

/* mmoe: b0 per task, the experts and gates as one tensor each, a tower per task; the
 * scores [n x T]; the same every way (workspace, none, training); bad settings refused. */
Test(model_params, mmoe_names_shapes_and_scores) {
    const uint32_t h[] = {6};
    mt_model_t *m = mk_model_of(
        (family_t){MT_MODEL_MMOE, .ntasks = 3, .nexperts = 2, .expert_width = 5}, 4, 2, 1, h, 9);
    cr_assert_eq(mt_model_ntasks(m), 3);
    const char *names[] = {"b0",          "experts.w",    "experts.b",     "gates.w",
                           "gates.b",     "tower.0.0.w",  "tower.0.0.b",   "tower.0.out.w",
                           "tower.1.0.w", "tower.1.0.b",  "tower.1.out.w", "tower.2.0.w",
                           "tower.2.0.b", "tower.2.out.w"};
    const uint32_t sh[][2] = {{3, 0}, {8, 10}, {10, 0}, {8, 6}, {6, 0}, {5, 6}, {6, 0},
                              {6, 1}, {5, 6},  {6, 0},  {6, 1}, {5, 6}, {6, 0}, {6, 1}};
    cr_assert_eq(mt_model_nparams(m), 14);
    for (size_t t = 0; t < 14; t++) {
        mt_model_param_t p;
        cr_assert_eq(mt_model_param(m, t, &p), MT_OK);
        cr_expect_str_eq(p.name, names[t]);
        cr_expect(p.shape[0] == sh[t][0] && p.shape[1] == sh[t][1], "%s", names[t]);
    }
    enum { N = 7 };
    uint64_t rs = 3;
    float E[N * 8], W1[N * 4], y[N * 3], p1[N * 3], p2[N * 3], p3[N * 3];
    for (int j = 0; j < N * 8; j++)
        E[j] = rng_uniform(&rs, -1, 1);
    for (int j = 0; j < N * 4; j++)
        W1[j] = rng_uniform(&rs, -1, 1);
    for (int j = 0; j < N * 3; j++)
        y[j] = (float)(j % 2);
    mt_model_ws_t *ws = NULL;
    cr_assert_eq(mt_model_ws_create(&ws), MT_OK);
    cr_assert_eq(mt_model_forward(m, ws, E, W1, N, p1), MT_OK);
    cr_assert_eq(mt_model_forward(m, NULL, E, W1, N, p2), MT_OK);
    cr_assert_eq(mt_model_forward_backward(m, E, W1, y, NULL, N, p3, NULL, NULL, NULL), MT_OK);
    for (int j = 0; j < N * 3; j++) {
        cr_expect_eq(p1[j], p2[j]);
        cr_expect_float_eq(p1[j], p3[j], 1e-6f);
    }
    cr_expect(p1[0] != p1[1] && p1[1] != p1[2], "the tasks score differently");
    y[4] = 1.5f; /* a task label out of range */
    cr_expect_eq(mt_model_forward_backward(m, E, W1, y, NULL, N, NULL, NULL, NULL, NULL),
                 MT_INVALID);
    mt_model_ws_destroy(ws);
    mt_model_destroy(m);

    mt_model_config_t c;
    char err[160];
    mt_model_config_init(&c);
    c.nslots = 2;
    c.dim = 4;
    c.type = MT_MODEL_MMOE;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_OK, "%s", err);
    c.ntasks = 1;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    cr_expect(strstr(err, "ntasks") != NULL, "%s", err);
    c.ntasks = MT_MODEL_MAX_TASKS + 1;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    c.ntasks = 2;
    c.nexperts = 0;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    cr_expect(strstr(err, "nexperts") != NULL, "%s", err);
    c.nexperts = 2;
    c.task_weight[1] = -1;
    cr_expect_eq(mt_model_config_validate(&c, err, sizeof err), MT_CONFIG);
    cr_expect(strstr(err, "task_weight[1]") != NULL, "%s", err);
    cr_expect_str_eq(mt_model_type_name(MT_MODEL_MMOE), "mmoe");
}

Test(model_params, dcnv2_names_and_shapes) {
    const uint32_t h[] = {32};
    mt_model_t *m = mk_model_of((family_t){MT_MODEL_DCNV2, .ncross = 2, .rank = 8}, 5, 4, 1, h, 3);
    const char *names[] = {"b0",        "cross.0.v", "cross.0.u", "cross.0.b", "cross.1.v",
                           "cross.1.u", "cross.1.b", "mlp.0.w",   "mlp.0.b",   "mlp.out.w"};
    const uint32_t sh[][2] = {{1, 0},  {20, 8}, {8, 20},  {20, 0}, {20, 8},
                              {8, 20}, {20, 0}, {20, 32}, {32, 0}, {32, 1}};
    cr_assert_eq(mt_model_nparams(m), 10);
    for (size_t t = 0; t < 10; t++) {
        mt_model_param_t p;
        cr_assert_eq(mt_model_param(m, t, &p), MT_OK);
        cr_expect_str_eq(p.name, names[t]);
        cr_expect_eq(p.shape[0], sh[t][0], "%s", names[t]);
        cr_expect_eq(p.shape[1], sh[t][1], "%s", names[t]);
        int nonzero = 0;
        for (size_t j = 0; j < p.size; j++)
            nonzero |= p.values[j] != 0;
        cr_expect_eq(nonzero, p.ndim == 2, "%s: weights random, biases 0", names[t]);
    }
    mt_model_destroy(m);
    /* per-slot dims: the width is their sum; the model keeps its own copy of them */
    uint32_t dims[3] = {2, 7, 3};
    m = mk_model_of((family_t){MT_MODEL_DCNV2, .ncross = 1, .dims = dims}, 3, 4, 1, h, 3);
    dims[1] = 99;
    mt_model_param_t q;
    cr_assert_eq(mt_model_param_find(m, "cross.0.w", &q), MT_OK);
    cr_expect(q.shape[0] == 12 && q.shape[1] == 12);
    cr_assert_eq(mt_model_param_find(m, "mlp.0.w", &q), MT_OK);
    cr_expect(q.shape[0] == 12 && q.shape[1] == 32);
    cr_expect_eq(mt_model_config(m)->slot_dims[1], 7);
    mt_model_destroy(m);
    m = mk_model_of((family_t){MT_MODEL_DCNV2, .ncross = 1}, 5, 4, 0, NULL, 3);
    mt_model_param_t p;
    cr_assert_eq(mt_model_nparams(m), 4);
    cr_assert_eq(mt_model_param(m, 1, &p), MT_OK);
    cr_expect_str_eq(p.name, "cross.0.w");
    cr_expect_eq(p.shape[0], 20);
    cr_expect_eq(p.shape[1], 20);
    mt_model_destroy(m);
}

Test(model_input, bad_labels_weights_and_null) {
    const uint32_t h[] = {3};
    mt_model_t *m = mk_model(2, 2, 1, h, 1);
    const float E[8] = {0}, W1[4] = {0};
    float bad_y[2] = {1, 2}, y[2] = {1, 0}, bad_w[2] = {1, -1}, inf_w[2] = {INFINITY, 1};
    float loss = 123, p[2];
    cr_expect_eq(mt_model_forward_backward(m, E, W1, bad_y, NULL, 2, NULL, &loss, NULL, NULL),
                 MT_INVALID);
    cr_expect_eq(loss, 123.0f);
    cr_expect_eq(mt_model_forward_backward(m, E, W1, y, bad_w, 2, NULL, &loss, NULL, NULL),
                 MT_INVALID);
    cr_expect_eq(mt_model_forward_backward(m, E, W1, y, inf_w, 2, NULL, &loss, NULL, NULL),
                 MT_INVALID);
    cr_expect_eq(mt_model_forward_backward(m, NULL, W1, y, NULL, 2, NULL, &loss, NULL, NULL),
                 MT_INVALID);
    cr_expect_eq(mt_model_forward(m, NULL, E, NULL, 2, p), MT_INVALID);
    cr_expect_eq(mt_model_forward(NULL, NULL, E, W1, 2, p), MT_INVALID);
    /* Empty batch: loss 0, zero gradients. */
    cr_expect_eq(mt_model_forward_backward(m, NULL, NULL, NULL, NULL, 0, NULL, &loss, NULL, NULL),
                 MT_OK);
    cr_expect_eq(loss, 0.0f);
    mt_model_param_t b0;
    cr_assert_eq(mt_model_param_find(m, "b0", &b0), MT_OK);
    cr_expect_eq(b0.grads[0], 0.0f);
    /* All-zero inputs: p = 0.5, loss log 2 (weights 0 and 2: mean (0 + 2 log 2) / 2). */
    float w[2] = {0, 2};
    cr_expect_eq(mt_model_forward_backward(m, E, W1, y, w, 2, p, &loss, NULL, NULL), MT_OK);
    cr_expect_float_eq(p[0], 0.5f, 1e-7f);
    cr_expect_float_eq(loss, logf(2.0f), 1e-6f);
    /* g = (0 * (0.5 - 1) + 2 * (0.5 - 0)) / 2 = 0.5 */
    cr_expect_float_eq(b0.grads[0], 0.5f, 1e-7f);
    mt_model_destroy(m);
}

/* ============================== dense Adam ============================== */

/* CowClip: a gradient over r * max(||w||, zeta) * count is scaled to that norm, direction
 * kept; one under it is left alone; zeta bounds a small row's norm from below. */
Test(cowclip, clips_to_the_rows_norm_times_the_count) {
    float w[4] = {0.3f, 0.0f, -0.4f, 0.0f}; /* ||w|| = 0.5 */
    float g[4] = {3.0f, 0.0f, 4.0f, 0.0f};  /* ||g|| = 5 */
    /* r 2, count 3: t = 2 * 0.5 * 3 = 3: scaled by 3/5 */
    float f = mt_model_cowclip(g, w, 4, 3, 2.0f, 1e-5f); /* (the macros evaluate twice) */
    cr_expect_float_eq(f, 0.6f, 1e-6f);
    cr_expect_float_eq(g[0], 1.8f, 1e-6f);
    cr_expect_float_eq(g[2], 2.4f, 1e-6f);
    cr_expect(g[1] == 0 && g[3] == 0);
    /* now ||g|| = 3, under t = 4 with count 4: unchanged */
    f = mt_model_cowclip(g, w, 4, 4, 2.0f, 1e-5f);
    cr_expect_eq(f, 1.0f);
    cr_expect_float_eq(g[0], 1.8f, 1e-6f);
    /* a zero row: zeta 0.1 is the norm, t = 1 * 0.1 * 1 */
    const float zero[4] = {0};
    float h[4] = {0, 0.6f, 0, 0.8f};
    f = mt_model_cowclip(h, zero, 4, 1, 1.0f, 0.1f);
    cr_expect_float_eq(f, 0.1f, 1e-6f);
    cr_expect_float_eq(h[1], 0.06f, 1e-7f);
    cr_expect_float_eq(h[3], 0.08f, 1e-7f);
    /* a zero gradient stays zero */
    float z[4] = {0};
    f = mt_model_cowclip(z, w, 4, 1, 1.0f, 0.0f);
    cr_expect_eq(f, 1.0f);
    cr_expect(z[0] == 0 && z[1] == 0 && z[2] == 0 && z[3] == 0);
}

/* mt_model_adam_step against the formula in double, over three steps and a length that is
 * not a multiple of the vector width (the vector loop and the scalar tail both run). */
Test(adam, matches_the_formula) {
    enum { N = 11 };
    mt_model_adam_t o = {0.01f, 0.8f, 0.99f, 1e-6f};
    float w[N], m[N] = {0}, v[N] = {0}, g[N];
    double rw[N], rm[N] = {0}, rv[N] = {0};
    uint64_t s = 5;
    for (int i = 0; i < N; i++)
        rw[i] = w[i] = rng_uniform(&s, -1, 1);
    for (uint64_t t = 1; t <= 3; t++) {
        for (int i = 0; i < N; i++)
            g[i] = rng_uniform(&s, -2, 2);
        mt_model_adam_step(&o, t, w, m, v, g, N);
        double lr = 0.01 * sqrt(1 - pow(0.99, (double)t)) / (1 - pow(0.8, (double)t));
        for (int i = 0; i < N; i++) {
            rm[i] = 0.8 * rm[i] + 0.2 * g[i];
            rv[i] = 0.99 * rv[i] + 0.01 * (double)g[i] * g[i];
            rw[i] -= lr * rm[i] / (sqrt(rv[i]) + 1e-6);
        }
    }
    for (int i = 0; i < N; i++) {
        cr_expect_float_eq(m[i], rm[i], 1e-6, "m[%d]", i);
        cr_expect_float_eq(v[i], rv[i], 1e-6, "v[%d]", i);
        cr_expect_float_eq(w[i], rw[i], 1e-5, "w[%d]: %g vs %g", i, (double)w[i], rw[i]);
    }
}

#define FID(slot, v) (((uint64_t)(slot) << 48) | (uint64_t)(v))

/* The feature layout (model.h): each kind's table ids, cells and gradients, by hand. Slots:
 * 10 summed (its own buckets 7), 11 mean, 12 din's sequence of 2 over slot 10's rows (with
 * slot 10's buckets), 13 summed (the default buckets 5); dim 2. */
Test(model_layout, ids_cells_and_gradients_per_kind) {
    mt_model_config_t c;
    mt_model_config_init(&c);
    c.nslots = 4;
    c.dim = 2;
    c.type = MT_MODEL_DIN;
    c.seq_slot = 2;
    c.seq_query = 0;
    c.seq_len = 2;
    const uint16_t ids[4] = {10, 11, 12, 13};
    const uint8_t mean[4] = {0, 1, 0, 0};
    const uint64_t buckets[4] = {7, 0, 0, 0};
    mt_model_layout_t l;
    char err[256];
    cr_assert_eq(mt_model_layout_init(&l, &c, ids, mean, buckets, 5, err, sizeof(err)), MT_OK, "%s",
                 err);
    cr_expect(l.nslots == 4 && l.width == 2 + 2 + 4 + 2 && !l.uniform && l.max_dim == 2);
    cr_expect(l.slot[2].kind == MT_MODEL_SLOT_SEQ && l.slot[2].off == 4 && l.slot[2].width == 4);
    cr_expect(l.slot[3].off == 8 && l.slot[1].kind == MT_MODEL_SLOT_MEAN);
    /* ids: reduced by the slot's buckets; a behaviour as slot 10's id, the third not read */
    const uint64_t v = 100;
    cr_expect_eq(mt_model_layout_id(&l.slot[0], 0, FID(10, v)), FID(10, v % 7));
    cr_expect_eq(mt_model_layout_id(&l.slot[1], 3, FID(11, v)), FID(11, v % 5));
    cr_expect_eq(mt_model_layout_id(&l.slot[2], 1, FID(12, v)), FID(10, v % 7));
    cr_expect_eq(mt_model_layout_id(&l.slot[2], 2, FID(12, v)), MT_MODEL_NO_ID);
    cr_expect_eq(mt_model_layout_id(&l.slot[3], 0, FID(13, v)), FID(13, v % 5));
    /* cells: rows (e0, e1, w) */
    const float r1[3] = {1, 2, 0.5f}, r2[3] = {3, 4, 1.5f}, r3[3] = {5, 6, 9};
    float E[10], W1[4];
    memset(E, 0x7f, sizeof E); /* garbage: position 0 starts a cell */
    memset(W1, 0x7f, sizeof W1);
    mt_model_layout_add(&l.slot[0], 0, E, W1, r1);
    mt_model_layout_add(&l.slot[0], 1, E, W1, r2);
    mt_model_layout_end(&l.slot[0], 2, E, W1);
    mt_model_layout_add(&l.slot[1], 0, E + 2, W1 + 1, r1);
    mt_model_layout_add(&l.slot[1], 1, E + 2, W1 + 1, r2);
    mt_model_layout_end(&l.slot[1], 2, E + 2, W1 + 1);
    mt_model_layout_add(&l.slot[2], 0, E + 4, W1 + 2, r3);
    mt_model_layout_add(&l.slot[2], 5, E + 4, W1 + 2, r1); /* past the length: ignored */
    mt_model_layout_end(&l.slot[2], 1, E + 4, W1 + 2);
    mt_model_layout_end(&l.slot[3], 0, E + 8, W1 + 3);
    const float wantE[10] = {4, 6, 2, 3, 5, 6, 0, 0, 0, 0}, wantW[4] = {2, 1, 0, 0};
    for (int j = 0; j < 10; j++)
        cr_expect_float_eq(E[j], wantE[j], 1e-7, "E[%d] = %g", j, E[j]);
    for (int j = 0; j < 4; j++)
        cr_expect_float_eq(W1[j], wantW[j], 1e-7, "W1[%d] = %g", j, W1[j]);
    /* gradients: the sum's all, the mean's 1 / count, the sequence's position (no W1) */
    const float de[4] = {1, 2, 3, 4};
    float g[3] = {0, 0, 0};
    mt_model_layout_grad(&l.slot[0], 1, 2, de, 0.5f, 2.0f, g);
    cr_expect(g[0] == 2 && g[1] == 4 && g[2] == 1);
    memset(g, 0, sizeof g);
    mt_model_layout_grad(&l.slot[1], 0, 4, de, 0.5f, 2.0f, g);
    cr_expect(g[0] == 0.5f && g[1] == 1 && g[2] == 0.25f);
    memset(g, 0, sizeof g);
    mt_model_layout_grad(&l.slot[2], 1, 2, de, 0.5f, 2.0f, g);
    cr_expect(g[0] == 6 && g[1] == 8 && g[2] == 0);
    mt_model_layout_grad(&l.slot[2], 2, 3, de, 0.5f, 2.0f, g); /* past the length: none */
    cr_expect(g[0] == 6 && g[1] == 8 && g[2] == 0);
    /* a plain deepfm layout is uniform; a mean-pooled sequence is refused */
    mt_model_config_t p;
    mt_model_config_init(&p);
    p.nslots = 4;
    p.dim = 2;
    cr_assert_eq(mt_model_layout_init(&l, &p, ids, NULL, NULL, 0, NULL, 0), MT_OK);
    cr_expect(l.uniform && l.width == 8);
    const uint8_t mean_seq[4] = {0, 0, 1, 0};
    cr_assert_eq(mt_model_layout_init(&l, &c, ids, mean_seq, NULL, 0, err, sizeof(err)), MT_CONFIG);
    cr_expect(strstr(err, "slot 12 is din's sequence slot") != NULL, "%s", err);
}
