/*
 * test_optim.c - optimizers, fp16 storage, row initializers and configuration checks of the
 * embedding table (embedding/src/optim.c and the matching parts of table.c).
 *
 * Why these tests: a wrong optimizer step or initializer does not crash anything, it only
 * trains a worse model, and replicas that build rows differently drift apart silently. So:
 *  - each optimizer (SGD, Adagrad, FTRL-Proximal, Adam) is checked against numbers worked
 *    out by hand in the comments, over 2-3 steps on small rows whose start is known, reading
 *    back the embedding AND the optimizer state; the special cases are pinned: FTRL's l1
 *    zeroing a weight, Adam's per-row bias correction, Adagrad's init_accum;
 *  - fp16 conversion is checked on known bit patterns (ties to even, subnormals, overflow,
 *    NaN), against an independent decoder for all 65536 halves, and on every rounding
 *    midpoint; an fp16 slot stores fp16-rounded values and keeps fp32 optimizer state;
 *  - the initializer is a pure function of (fid, init_seed): same rows in tables of different
 *    shapes, other rows for another seed, and the right distribution;
 *  - configuration errors name the field, and calls with unknown slots or a wrong buffer
 *    length do nothing at all (no row, no sketch count, no version, no touch).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt/table.h"

/* ============================== helpers ============================== */

/* A table with small change log and sketch so that many parts stay cheap. */
static mt_table_t *mk_table(const mt_table_slot_config_t *slots, size_t nslots,
                            uint32_t shards_log2) {
    mt_table_config_t c;
    mt_table_config_init(&c);
    c.slots = slots;
    c.nslots = nslots;
    c.shards_log2 = shards_log2;
    c.changelog_entries = 256ull << shards_log2;
    c.filter_bytes = 4096ull << shards_log2;
    mt_table_t *t = NULL;
    char err[256] = "";
    cr_assert_eq(mt_table_config_validate(&c, err, sizeof(err)), MT_OK, "config: %s", err);
    cr_assert_eq(mt_table_create(&c, &t), MT_OK);
    cr_assert_not_null(t);
    return t;
}

static void assign1(mt_table_t *t, uint64_t fid, const float *w, uint32_t dim) {
    mt_table_op_stats_t st = {0};
    cr_assert_eq(mt_table_assign(t, &fid, 1, w, dim, 1, &st), MT_OK);
    cr_assert_eq(st.admitted, 1);
}

static void apply1(mt_table_t *t, uint64_t fid, const float *g, uint32_t dim, uint32_t now_s) {
    mt_table_op_stats_t st = {0};
    cr_assert_eq(mt_table_apply(t, &fid, 1, g, dim, now_s, &st), MT_OK);
    cr_assert_eq(st.found, 1);
    cr_assert_eq(st.missing, 0);
}

/* Reads fid's row with get_row (embedding and state) and with a read-only lookup, and checks
 * both against the expected values within tol (absolute). */
static void check_row(mt_table_t *t, uint64_t fid, const double *emb, uint32_t dim,
                      const double *state, uint32_t nstate, double tol, const char *what) {
    float e[16], s[64], l[16];
    uint32_t nf = 0;
    cr_assert_eq(mt_table_state_floats(t, fid, &nf), MT_OK);
    cr_assert_eq(nf, nstate, "%s: %u state floats, want %u", what, nf, nstate);
    cr_assert_eq(mt_table_get_row(t, fid, e, s, 64, NULL, NULL, NULL), MT_OK, "%s", what);
    for (uint32_t i = 0; i < dim; i++)
        cr_assert(fabs((double)e[i] - emb[i]) <= tol, "%s: emb[%u] = %.9g, want %.9g", what, i,
                  (double)e[i], emb[i]);
    for (uint32_t i = 0; i < nstate; i++)
        cr_assert(fabs((double)s[i] - state[i]) <= tol, "%s: state[%u] = %.9g, want %.9g", what, i,
                  (double)s[i], state[i]);
    uint8_t found = 0;
    cr_assert_eq(mt_table_lookup(t, &fid, 1, l, dim, &found, 0, 0, NULL), MT_OK);
    cr_assert_eq(found, 1);
    cr_assert_eq(memcmp(l, e, dim * sizeof(float)), 0, "%s: lookup differs from get_row", what);
}

static int stats_eq(const mt_table_stats_t *a, const mt_table_stats_t *b) {
    return a->rows == b->rows && a->capacity == b->capacity && a->bytes_rows == b->bytes_rows &&
           a->version == b->version && a->inserts == b->inserts && a->removals == b->removals &&
           a->evictions == b->evictions && a->grows == b->grows && a->filtered == b->filtered &&
           a->changelog_drops == b->changelog_drops && a->full_sync_below == b->full_sync_below;
}

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ============================== SGD ============================== */

Test(optim, sgd_by_hand) {
    mt_table_slot_config_t s;
    mt_table_slot_config_init(&s, 1, 3);
    s.opt = MT_OPT_SGD;
    s.init = MT_INIT_ZEROS;
    s.lr = 0.5f;
    mt_table_t *t = mk_table(&s, 1, 2);
    uint64_t a = MT_FID_MAKE(1, 11), z = MT_FID_MAKE(1, 12);

    /* Row a starts at w = [1, -2, 0.25] (assign); SGD has no state. lr = 0.5, w -= 0.5 g.
     * Every number below is exact in binary, so the comparison is exact. */
    const float w0[3] = {1.0f, -2.0f, 0.25f};
    assign1(t, a, w0, 3);
    check_row(t, a, (const double[]){1, -2, 0.25}, 3, NULL, 0, 0, "sgd start");
    /* g1 = [0.5, 1, -2]: w = [1 - 0.25, -2 - 0.5, 0.25 + 1] = [0.75, -2.5, 1.25] */
    apply1(t, a, (const float[]){0.5f, 1.0f, -2.0f}, 3, 10);
    check_row(t, a, (const double[]){0.75, -2.5, 1.25}, 3, NULL, 0, 0, "sgd step 1");
    /* g2 = [1, -1, 0.5]: w = [0.75 - 0.5, -2.5 + 0.5, 1.25 - 0.25] = [0.25, -2, 1] */
    apply1(t, a, (const float[]){1.0f, -1.0f, 0.5f}, 3, 11);
    check_row(t, a, (const double[]){0.25, -2, 1}, 3, NULL, 0, 0, "sgd step 2");
    /* g3 = [-0.5, 0, 4]: w = [0.25 + 0.25, -2 - 0, 1 - 2] = [0.5, -2, -1] */
    apply1(t, a, (const float[]){-0.5f, 0.0f, 4.0f}, 3, 12);
    check_row(t, a, (const double[]){0.5, -2, -1}, 3, NULL, 0, 0, "sgd step 3");

    /* Row z is created by a training lookup with MT_INIT_ZEROS: w = [0, 0, 0].
     * g = [1, 2, 3]: w = [-0.5, -1, -1.5] */
    float out[3] = {9, 9, 9};
    mt_table_op_stats_t st = {0};
    cr_assert_eq(mt_table_lookup(t, &z, 1, out, 3, NULL, MT_TABLE_TRAIN, 5, &st), MT_OK);
    cr_assert_eq(st.admitted, 1);
    cr_assert(out[0] == 0.0f && out[1] == 0.0f && out[2] == 0.0f);
    apply1(t, z, (const float[]){1.0f, 2.0f, 3.0f}, 3, 13);
    check_row(t, z, (const double[]){-0.5, -1, -1.5}, 3, NULL, 0, 0, "sgd from zeros");

    /* Each apply touched the row and took a new version. */
    uint32_t touch = 0;
    uint64_t v1 = 0, v2 = 0;
    cr_assert_eq(mt_table_get_row(t, a, NULL, NULL, 0, &touch, NULL, &v1), MT_OK);
    cr_assert_eq(touch, 12);
    apply1(t, a, (const float[]){0, 0, 0}, 3, 14);
    cr_assert_eq(mt_table_get_row(t, a, NULL, NULL, 0, &touch, NULL, &v2), MT_OK);
    cr_assert_eq(touch, 14);
    cr_assert_gt(v2, v1);
    mt_table_destroy(t);
}

/* ============================== Adagrad ============================== */

Test(optim, adagrad_by_hand_with_init_accum) {
    mt_table_slot_config_t s;
    mt_table_slot_config_init(&s, 2, 3);
    s.opt = MT_OPT_ADAGRAD;
    s.lr = 2.0f;
    s.eps = 0.0f;        /* allowed since init_accum > 0; keeps the arithmetic exact */
    s.init_accum = 7.0f; /* chosen so that 7 + 3^2 = 16 and 16 + 3^2 = 25 */
    mt_table_t *t = mk_table(&s, 1, 3);
    uint64_t a = MT_FID_MAKE(2, 99);

    /* Start: w = [1, 0, 0.25], accumulator a = [7, 7, 7] (init_accum, also for an assigned
     * row). Rule: a += g^2; w -= lr * g / sqrt(a). */
    assign1(t, a, (const float[]){1.0f, 0.0f, 0.25f}, 3);
    check_row(t, a, (const double[]){1, 0, 0.25}, 3, (const double[]){7, 7, 7}, 3, 0,
              "adagrad start");
    /* g1 = [3, -3, 0]:
     *   a = [7 + 9, 7 + 9, 7 + 0] = [16, 16, 7]
     *   w0 = 1    - 2 * 3  / 4 = 1 - 1.5 = -0.5
     *   w1 = 0    - 2 * -3 / 4 = 1.5
     *   w2 = 0.25 - 2 * 0  / sqrt(7) = 0.25 */
    apply1(t, a, (const float[]){3.0f, -3.0f, 0.0f}, 3, 10);
    check_row(t, a, (const double[]){-0.5, 1.5, 0.25}, 3, (const double[]){16, 16, 7}, 3, 0,
              "adagrad step 1");
    /* g2 = [3, 0, -3]:
     *   a = [16 + 9, 16 + 0, 7 + 9] = [25, 16, 16]
     *   w0 = -0.5 - 2 * 3 / 5  = -0.5 - 1.2 = -1.7
     *   w1 =  1.5 - 0          =  1.5
     *   w2 = 0.25 - 2 * -3 / 4 = 0.25 + 1.5 = 1.75 */
    apply1(t, a, (const float[]){3.0f, 0.0f, -3.0f}, 3, 11);
    check_row(t, a, (const double[]){-1.7, 1.5, 1.75}, 3, (const double[]){25, 16, 16}, 3, 2e-7,
              "adagrad step 2");
    mt_table_destroy(t);
}

Test(optim, adagrad_defaults) {
    /* Defaults: lr 0.01, eps 1e-8, init_accum 0.1. A zero-initialized row created by a
     * training lookup has a = [0.1, 0.1]. g = [0.3, -0.3]:
     *   a = 0.1 + 0.09 = 0.19, sqrt(0.19) = 0.435889894
     *   w = -/+ 0.01 * 0.3 / (0.435889894 + 1e-8) = -/+ 0.00688247 */
    mt_table_slot_config_t s;
    mt_table_slot_config_init(&s, 3, 2);
    s.init = MT_INIT_ZEROS;
    cr_assert_eq(s.opt, MT_OPT_ADAGRAD);
    mt_table_t *t = mk_table(&s, 1, 2);
    uint64_t f = MT_FID_MAKE(3, 5);
    float out[2];
    cr_assert_eq(mt_table_lookup(t, &f, 1, out, 2, NULL, MT_TABLE_TRAIN, 1, NULL), MT_OK);
    check_row(t, f, (const double[]){0, 0}, 2, (const double[]){0.1, 0.1}, 2, 2e-8,
              "adagrad default start");
    apply1(t, f, (const float[]){0.3f, -0.3f}, 2, 2);
    check_row(t, f, (const double[]){-0.00688247, 0.00688247}, 2, (const double[]){0.19, 0.19}, 2,
              2e-8, "adagrad default step");
    mt_table_destroy(t);
}

/* ============================== FTRL-Proximal ============================== */

Test(optim, ftrl_by_hand_l1_zeroes_weights) {
    /* McMahan et al. 2013, per coordinate, alpha = lr = 1, beta = 1, l1 = 1, l2 = 1:
     *   n' = n + g^2; sigma = (sqrt(n') - sqrt(n)) / alpha; z += g - sigma * w; n = n'
     *   w = 0 if |z| <= l1, else -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)
     * Slot 4 has l1 = 1; slot 5 is the same with l1 = 0 (control). State = [z0 z1 z2 n0 n1 n2].
     * Both start from zeros (training lookup, MT_INIT_ZEROS): w = z = n = 0. */
    mt_table_slot_config_t s[2];
    for (int i = 0; i < 2; i++) {
        mt_table_slot_config_init(&s[i], (uint16_t)(4 + i), 3);
        s[i].opt = MT_OPT_FTRL;
        s[i].init = MT_INIT_ZEROS;
        s[i].lr = 1.0f;
        s[i].ftrl_beta = 1.0f;
        s[i].l2 = 1.0f;
    }
    s[0].l1 = 1.0f;
    s[1].l1 = 0.0f;
    mt_table_t *t = mk_table(s, 2, 2);
    uint64_t f[2] = {MT_FID_MAKE(4, 1), MT_FID_MAKE(5, 1)};
    float out[6];
    cr_assert_eq(mt_table_lookup(t, f, 2, out, 6, NULL, MT_TABLE_TRAIN, 1, NULL), MT_OK);
    check_row(t, f[0], (const double[]){0, 0, 0}, 3, (const double[]){0, 0, 0, 0, 0, 0}, 6, 0,
              "ftrl start");

    /* Step 1, g = [0.75, 3, 3] (one apply call for both rows):
     *   c0: n = 0.5625, sigma = 0.75, z = 0.75 - 0.75 * 0 = 0.75
     *       l1 = 1: |z| <= 1 -> w = 0 (the gradient is absorbed by l1)
     *       l1 = 0: w = -0.75 / ((1 + 0.75) + 1) = -0.75 / 2.75 = -0.272727273
     *   c1, c2: n = 9, sigma = 3, z = 3
     *       l1 = 1: w = -(3 - 1) / ((1 + 3) + 1) = -0.4
     *       l1 = 0: w = -3 / 5 = -0.6 */
    const float g1[6] = {0.75f, 3.0f, 3.0f, 0.75f, 3.0f, 3.0f};
    mt_table_op_stats_t st = {0};
    cr_assert_eq(mt_table_apply(t, f, 2, g1, 6, 2, &st), MT_OK);
    cr_assert_eq(st.found, 2);
    check_row(t, f[0], (const double[]){0, -0.4, -0.4}, 3,
              (const double[]){0.75, 3, 3, 0.5625, 9, 9}, 6, 1e-7, "ftrl l1 step 1");
    check_row(t, f[1], (const double[]){-0.272727273, -0.6, -0.6}, 3,
              (const double[]){0.75, 3, 3, 0.5625, 9, 9}, 6, 1e-7, "ftrl l1=0 step 1");
    float e[3];
    cr_assert_eq(mt_table_get_row(t, f[0], e, NULL, 0, NULL, NULL, NULL), MT_OK);
    cr_assert_eq(f2u(e[0]), 0u, "l1 must zero w0 exactly, got %.9g", (double)e[0]);

    /* Step 2 on the l1 row, g = [1, 4, -4]:
     *   c0: n = 1.5625, sigma = 1.25 - 0.75 = 0.5, z = 0.75 + 1 - 0.5 * 0 = 1.75
     *       w = -(1.75 - 1) / ((1 + 1.25) + 1) = -0.75 / 3.25 = -0.230769231
     *   c1: n = 25, sigma = 5 - 3 = 2, z = 3 + 4 - 2 * (-0.4) = 7.8
     *       w = -(7.8 - 1) / ((1 + 5) + 1) = -6.8 / 7 = -0.971428571
     *   c2: n = 25, sigma = 2, z = 3 - 4 - 2 * (-0.4) = -0.2
     *       |z| <= 1 -> w = 0: l1 sets a weight that was -0.4 back to exactly zero */
    apply1(t, f[0], (const float[]){1.0f, 4.0f, -4.0f}, 3, 3);
    check_row(t, f[0], (const double[]){-0.230769231, -0.971428571, 0}, 3,
              (const double[]){1.75, 7.8, -0.2, 1.5625, 25, 25}, 6, 4e-7, "ftrl l1 step 2");
    cr_assert_eq(mt_table_get_row(t, f[0], e, NULL, 0, NULL, NULL, NULL), MT_OK);
    cr_assert_eq(f2u(e[2]) & 0x7FFFFFFFu, 0u, "l1 must zero w2 exactly, got %.9g", (double)e[2]);
    mt_table_destroy(t);
}

/* ============================== Adam ============================== */

Test(optim, adam_by_hand_per_row_bias_correction) {
    /* lr = 0.1, beta1 = 0.5, beta2 = 0.75, eps = 1e-8. State = [m0 m1 v0 v1 b1^t b2^t].
     *   b1^t *= beta1; b2^t *= beta2; c1 = 1 - b1^t; c2 = 1 - b2^t
     *   m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2
     *   w -= lr * (m / c1) / (sqrt(v / c2) + eps)
     * Rows A and B both start at w = [1, -1], state [0, 0, 0, 0, 1, 1]. */
    mt_table_slot_config_t s;
    mt_table_slot_config_init(&s, 6, 2);
    s.opt = MT_OPT_ADAM;
    s.lr = 0.1f;
    s.beta1 = 0.5f;
    s.beta2 = 0.75f;
    s.eps = 1e-8f;
    mt_table_t *t = mk_table(&s, 1, 2);
    uint64_t A = MT_FID_MAKE(6, 100), B = MT_FID_MAKE(6, 200);
    assign1(t, A, (const float[]){1.0f, -1.0f}, 2);
    assign1(t, B, (const float[]){1.0f, -1.0f}, 2);
    check_row(t, A, (const double[]){1, -1}, 2, (const double[]){0, 0, 0, 0, 1, 1}, 6, 0,
              "adam start");

    /* Step 1, row A only, g = [2, -1]:
     *   b1^t = 0.5, b2^t = 0.75, c1 = 0.5, c2 = 0.25
     *   m = [0.5 * 2, 0.5 * -1] = [1, -0.5]; v = [0.25 * 4, 0.25 * 1] = [1, 0.25]
     *   m/c1 = [2, -1]; v/c2 = [4, 1]; sqrt = [2, 1]
     *   w = [1 - 0.1 * 2 / 2, -1 - 0.1 * -1 / 1] = [0.9, -0.9] */
    apply1(t, A, (const float[]){2.0f, -1.0f}, 2, 10);
    check_row(t, A, (const double[]){0.9, -0.9}, 2, (const double[]){1, -0.5, 1, 0.25, 0.5, 0.75},
              6, 1e-7, "adam A step 1");

    /* Step 2: one apply call with A and B, both g = [0, 3].
     * Row A, its 2nd step: b1^t = 0.25, b2^t = 0.5625, c1 = 0.75, c2 = 0.4375
     *   m = [0.5 * 1 + 0, 0.5 * -0.5 + 0.5 * 3] = [0.5, 1.25]
     *   v = [0.75 * 1 + 0, 0.75 * 0.25 + 0.25 * 9] = [0.75, 2.4375]
     *   m/c1 = [0.666666667, 1.666666667]; v/c2 = [1.714285714, 5.571428571]
     *   sqrt(v/c2) = [1.309307341, 2.360387377]
     *   w0 = 0.9  - 0.1 * 0.666666667 / 1.309307341 = 0.9  - 0.050917507 =  0.849082493
     *   w1 = -0.9 - 0.1 * 1.666666667 / 2.360387377 = -0.9 - 0.070609879 = -0.970609879
     * Row B, its 1st step (its own count, not A's): b1^t = 0.5, b2^t = 0.75
     *   m = [0, 1.5]; v = [0, 2.25]; m/c1 = [0, 3]; v/c2 = [0, 9]; sqrt = [0, 3]
     *   w = [1 - 0.1 * 0 / (0 + eps), -1 - 0.1 * 3 / 3] = [1, -1.1]
     * (With a shared step count B would get c1 = 0.75, c2 = 0.4375 and w1 = -1.0882.) */
    uint64_t AB[2] = {A, B};
    const float g2[4] = {0.0f, 3.0f, 0.0f, 3.0f};
    cr_assert_eq(mt_table_apply(t, AB, 2, g2, 4, 11, NULL), MT_OK);
    check_row(t, A, (const double[]){0.849082493, -0.970609879}, 2,
              (const double[]){0.5, 1.25, 0.75, 2.4375, 0.25, 0.5625}, 6, 3e-7, "adam A step 2");
    check_row(t, B, (const double[]){1, -1.1}, 2, (const double[]){0, 1.5, 0, 2.25, 0.5, 0.75}, 6,
              3e-7, "adam B step 1");
    mt_table_destroy(t);
}

/* ============================== fp16 conversion ============================== */

/* Independent decoder of a half (exact in double). */
static double half_ref(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double sgn = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 0) return sgn * ldexp(m, -24);
    if (e == 31) return m ? NAN : sgn * INFINITY;
    return sgn * ldexp(1024 + m, e - 25);
}

static int half_is_nan(uint16_t h) {
    return (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
}

Test(fp16, known_values) {
    static const struct {
        float f;
        uint16_t h;
    } cases[] = {
        {1.0f, 0x3C00},
        {-2.0f, 0xC000},
        {0.5f, 0x3800},
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {65504.0f, 0x7BFF}, /* largest finite half */
        {-65504.0f, 0xFBFF},
        {0x1p-14f, 0x0400}, /* smallest normal */
        {0x1p-24f, 0x0001}, /* smallest subnormal */
        {-0x1p-24f, 0x8001},
        {0x3FFp-24f, 0x03FF},  /* largest subnormal */
        {0.1f, 0x2E66},        /* 0.0999755859375 */
        {1.0f / 3.0f, 0x3555}, /* 0.333251953125 */
        /* ties go to the even neighbour */
        {1.0f + 0x1p-11f, 0x3C00},            /* halfway 0x3C00 / 0x3C01 -> 0x3C00 */
        {1.0f + 0x3p-11f, 0x3C02},            /* halfway 0x3C01 / 0x3C02 -> 0x3C02 */
        {1.0f + 0x1p-11f + 0x1p-23f, 0x3C01}, /* just above halfway -> up */
        {1.0f + 0x3p-11f - 0x1p-23f, 0x3C01}, /* just below halfway -> down */
        {0x1p-25f, 0x0000},                   /* halfway 0 / 2^-24 -> 0 */
        {0x3p-25f, 0x0002},                   /* halfway 1 / 2 subnormal -> 2 */
        {0x1p-25f + 0x1p-40f, 0x0001},        /* just above -> smallest subnormal */
        {0x7FFp-25f, 0x0400}, /* rounds up from subnormal into the smallest normal */
        {65519.0f, 0x7BFF},   /* below the halfway point to 2^16 */
        {65520.0f, 0x7C00},   /* halfway, 0x7BFF is odd -> overflows to inf */
        /* overflow and infinities */
        {1e5f, 0x7C00},
        {-1e5f, 0xFC00},
        {3.4028235e38f, 0x7C00},
        {INFINITY, 0x7C00},
        {-INFINITY, 0xFC00},
        /* underflow to signed zero */
        {1e-10f, 0x0000},
        {-1e-10f, 0x8000},
        {0x1p-26f, 0x0000},
        {1e-45f, 0x0000}, /* float subnormal */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint16_t h = mt_fp16_from_float(cases[i].f);
        cr_assert_eq(h, cases[i].h, "from_float(%a) = 0x%04X, want 0x%04X", (double)cases[i].f, h,
                     cases[i].h);
    }
    /* to_float on known patterns */
    cr_assert_eq(f2u(mt_fp16_to_float(0x3C00)), f2u(1.0f));
    cr_assert_eq(f2u(mt_fp16_to_float(0xC000)), f2u(-2.0f));
    cr_assert_eq(f2u(mt_fp16_to_float(0x7BFF)), f2u(65504.0f));
    cr_assert_eq(f2u(mt_fp16_to_float(0x0001)), f2u(0x1p-24f));
    cr_assert_eq(f2u(mt_fp16_to_float(0x03FF)), f2u(0x3FFp-24f));
    cr_assert_eq(f2u(mt_fp16_to_float(0x8000)), f2u(-0.0f));
    cr_assert_eq(f2u(mt_fp16_to_float(0x7C00)), f2u(INFINITY));
    cr_assert_eq(f2u(mt_fp16_to_float(0xFC00)), f2u(-INFINITY));
    cr_assert_eq(f2u(mt_fp16_to_float(0x2E66)), f2u(0.0999755859375f));

    /* NaN stays NaN both ways, sign kept, even when the payload sits only in bits that a
     * half cannot hold (float 0x7F800001). */
    const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FBFFFFFu, 0xFF800001u};
    for (size_t i = 0; i < sizeof(nans) / sizeof(nans[0]); i++) {
        uint16_t h = mt_fp16_from_float(u2f(nans[i]));
        cr_assert(half_is_nan(h), "NaN 0x%08X -> 0x%04X is not a NaN", nans[i], h);
        cr_assert_eq(h >> 15, nans[i] >> 31, "NaN sign lost");
    }
    cr_assert(isnan(mt_fp16_to_float(0x7E00)));
    cr_assert(isnan(mt_fp16_to_float(0x7C01)));
    cr_assert(isnan(mt_fp16_to_float(0xFFFF)));
}

Test(fp16, exhaustive_round_trip) {
    unsigned nans = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = mt_fp16_to_float(h);
        double want = half_ref(h);
        if (half_is_nan(h)) {
            nans++;
            cr_assert(isnan(f), "to_float(0x%04X) = %g, want NaN", i, (double)f);
            uint16_t back = mt_fp16_from_float(f);
            cr_assert(half_is_nan(back), "0x%04X -> NaN -> 0x%04X", i, back);
            cr_assert_eq(back & 0x8000, h & 0x8000);
            continue;
        }
        cr_assert((double)f == want, "to_float(0x%04X) = %a, want %a", i, (double)f, want);
        cr_assert_eq(signbit(f) != 0, (h & 0x8000) != 0, "sign of 0x%04X", i);
        uint16_t back = mt_fp16_from_float(f);
        cr_assert_eq(back, h, "0x%04X -> %a -> 0x%04X", i, (double)f, back);
    }
    cr_assert_eq(nans, 2 * 1023);
}

Test(fp16, every_midpoint_rounds_to_nearest_even) {
    /* For every pair of neighbouring positive finite halves lo < hi, the midpoint (exact in
     * float: 12 significant bits) must go to the even one, and the floats right beside it to
     * the nearer one; the same holds mirrored for negatives. */
    for (uint32_t h = 0; h < 0x7BFF; h++) {
        float lo = mt_fp16_to_float((uint16_t)h), hi = mt_fp16_to_float((uint16_t)(h + 1));
        float mid = (float)(((double)lo + (double)hi) / 2.0);
        cr_assert((double)mid * 2.0 == (double)lo + (double)hi);
        uint16_t even = (uint16_t)((h & 1) ? h + 1 : h);
        cr_assert_eq(mt_fp16_from_float(mid), even, "mid of 0x%04X/0x%04X", h, h + 1);
        cr_assert_eq(mt_fp16_from_float(-mid), even | 0x8000);
        cr_assert_eq(mt_fp16_from_float(nextafterf(mid, 0.0f)), h, "below mid of 0x%04X", h);
        cr_assert_eq(mt_fp16_from_float(nextafterf(mid, INFINITY)), h + 1, "above mid of 0x%04X",
                     h);
        cr_assert_eq(mt_fp16_from_float(-nextafterf(mid, INFINITY)), (h + 1) | 0x8000);
    }
    /* Past the largest finite half: the midpoint to 2^16 overflows, just below does not. */
    cr_assert_eq(mt_fp16_from_float(nextafterf(65520.0f, 0.0f)), 0x7BFF);
    cr_assert_eq(mt_fp16_from_float(65520.0f), 0x7C00);
}

/* ============================== fp16 table slots ============================== */

Test(fp16, table_slot_stores_halves) {
    mt_table_slot_config_t s[3];
    mt_table_slot_config_init(&s[0], 7, 5); /* fp16, SGD lr 1 */
    s[0].precision = MT_PREC_FP16;
    s[0].opt = MT_OPT_SGD;
    s[0].lr = 1.0f;
    mt_table_slot_config_init(&s[1], 8, 3); /* fp16, Adagrad: state stays fp32 */
    s[1].precision = MT_PREC_FP16;
    s[1].init = MT_INIT_ZEROS;
    s[1].lr = 0.5f;
    s[1].eps = 0.0f;
    s[1].init_accum = 0.1f;
    mt_table_slot_config_init(&s[2], 9, 5); /* fp32 twin of slot 7 */
    s[2].opt = MT_OPT_SGD;
    s[2].lr = 1.0f;
    mt_table_t *t = mk_table(s, 3, 2);

    /* fp16 rows take less memory than fp32 ones of the same shape. */
    uint32_t rb16 = 0, rb32 = 0;
    cr_assert_eq(mt_table_row_bytes(t, MT_FID_MAKE(7, 0), &rb16), MT_OK);
    cr_assert_eq(mt_table_row_bytes(t, MT_FID_MAKE(9, 0), &rb32), MT_OK);
    cr_assert_lt(rb16, rb32);

    /* Assigned values read back as their fp16 roundings (values worked out by hand):
     *   0.1 -> 0x2E66 = 0.0999755859375, 1/3 -> 0x3555 = 0.333251953125,
     *   1000.7 -> 0x63D1 = 1000.5 (spacing 0.5), -2e-6 -> 0x8022 = -34 * 2^-24,
     *   -1.25 -> exact */
    uint64_t a = MT_FID_MAKE(7, 1);
    const float v[5] = {0.1f, 1.0f / 3.0f, 1000.7f, -2e-6f, -1.25f};
    const float want[5] = {0.0999755859375f, 0.333251953125f, 1000.5f, -34.0f * 0x1p-24f, -1.25f};
    assign1(t, a, v, 5);
    float out[5];
    cr_assert_eq(mt_table_lookup(t, &a, 1, out, 5, NULL, 0, 0, NULL), MT_OK);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(f2u(out[i]), f2u(want[i]), "fp16 slot [%d] = %a, want %a", i, (double)out[i],
                     (double)want[i]);
        cr_assert_eq(f2u(out[i]), f2u(mt_fp16_to_float(mt_fp16_from_float(v[i]))));
    }

    /* SGD (lr 1) on fp16 storage, w = [1, 1, 0.5, 0, 0] (assign):
     *   g1 = [2^-12, 2^-10, 0.25, 0, 0]:
     *     w0 = 1 - 2^-12: halfway between 0x3BFF (1 - 2^-11, odd) and 0x3C00 -> 1.0, the
     *          update is lost to fp16 rounding (an fp32 row keeps it)
     *     w1 = 1 - 2^-10 = 0x3BFE exactly, w2 = 0.25 exactly
     *   g2 = [2^-12, 0, -0.1, 0, 0]:
     *     w0 = 1.0 again; w2 = 0.25 + 0.1 = 0.35 -> 1433.6 * 2^-12 -> 1434 * 2^-12
     *        = 0.35009765625 */
    uint64_t b = MT_FID_MAKE(7, 2), b32 = MT_FID_MAKE(9, 2);
    const float w0[5] = {1.0f, 1.0f, 0.5f, 0.0f, 0.0f};
    assign1(t, b, w0, 5);
    assign1(t, b32, w0, 5);
    const float g1[5] = {0x1p-12f, 0x1p-10f, 0.25f, 0, 0}, g2[5] = {0x1p-12f, 0, -0.1f, 0, 0};
    apply1(t, b, g1, 5, 2);
    apply1(t, b32, g1, 5, 2);
    check_row(t, b, (const double[]){1.0, 1.0 - 0x1p-10, 0.25, 0, 0}, 5, NULL, 0, 0,
              "fp16 sgd step 1");
    check_row(t, b32, (const double[]){1.0 - 0x1p-12, 1.0 - 0x1p-10, 0.25, 0, 0}, 5, NULL, 0, 0,
              "fp32 twin step 1");
    apply1(t, b, g2, 5, 3);
    check_row(t, b, (const double[]){1.0, 1.0 - 0x1p-10, 0.35009765625, 0, 0}, 5, NULL, 0, 0,
              "fp16 sgd step 2");

    /* Adagrad on an fp16 slot: the accumulator is fp32. Zero row, init_accum 0.1, lr 0.5,
     * eps 0, g = [0.3, 0, -1]:
     *   a = [0.1 + 0.09, 0.1, 0.1 + 1] = [0.19, 0.1, 1.1] (0.19 would be 0.18994140625
     *       in fp16, 1.1 would be 1.099609375)
     *   w0 = -0.5 * 0.3 / 0.435889894 = -0.344123601 -> 1409.53 * 2^-12 -> fp16 -1410 * 2^-12
     *        = -0.34423828125 (0xB582)
     *   w2 = 0.5 / 1.048808848 = 0.476731295 -> 1952.69 * 2^-12 -> 1953 * 2^-12
     *        = 0.476806641 (0x37A1) */
    uint64_t c = MT_FID_MAKE(8, 3);
    float o3[3];
    cr_assert_eq(mt_table_lookup(t, &c, 1, o3, 3, NULL, MT_TABLE_TRAIN, 1, NULL), MT_OK);
    apply1(t, c, (const float[]){0.3f, 0.0f, -1.0f}, 3, 4);
    float e[3], st[3];
    cr_assert_eq(mt_table_get_row(t, c, e, st, 3, NULL, NULL, NULL), MT_OK);
    cr_assert_eq(f2u(st[0]), f2u(0.1f + 0.3f * 0.3f), "accum %a", (double)st[0]);
    cr_assert_eq(f2u(st[1]), f2u(0.1f));
    cr_assert_eq(f2u(st[2]), f2u(0.1f + 1.0f));
    cr_assert_eq(mt_fp16_from_float(e[0]), 0xB582, "w0 = %.9g", (double)e[0]);
    cr_assert_eq(f2u(e[1]), f2u(0.0f));
    cr_assert_eq(mt_fp16_from_float(e[2]), 0x37A1, "w2 = %.9g", (double)e[2]);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(f2u(mt_fp16_to_float(mt_fp16_from_float(e[i]))), f2u(e[i]));

    /* Rows created by the initializer in an fp16 slot are the fp16 roundings of the fp32
     * slot's rows for the same fid and seed (slots 7 and 9 share the default seed, but the
     * slot is part of the fid, so compare two tables with slot 7 in fp16 and fp32). */
    mt_table_slot_config_t s32 = s[0];
    s32.precision = MT_PREC_FP32;
    mt_table_t *t32 = mk_table(&s32, 1, 3);
    for (uint64_t i = 100; i < 164; i++) {
        uint64_t fid = MT_FID_MAKE(7, i);
        float x16[5], x32[5];
        cr_assert_eq(mt_table_lookup(t, &fid, 1, x16, 5, NULL, MT_TABLE_TRAIN, 1, NULL), MT_OK);
        cr_assert_eq(mt_table_lookup(t32, &fid, 1, x32, 5, NULL, MT_TABLE_TRAIN, 1, NULL), MT_OK);
        for (int k = 0; k < 5; k++)
            cr_assert_eq(f2u(x16[k]), f2u(mt_fp16_to_float(mt_fp16_from_float(x32[k]))),
                         "fid %llu [%d]: %a vs %a", (unsigned long long)i, k, (double)x16[k],
                         (double)x32[k]);
    }
    mt_table_destroy(t32);
    mt_table_destroy(t);
}

/* ============================== initializers ============================== */

#define INIT_N 4000

/* Creates (training lookup) fids value0 + i * stride in slot, i < n; returns the packed rows. */
static float *init_rows(mt_table_t *t, uint16_t slot, uint32_t dim, size_t n) {
    uint64_t *fids = malloc(n * sizeof(uint64_t));
    float *out = malloc(n * dim * sizeof(float));
    cr_assert(fids && out);
    for (size_t i = 0; i < n; i++)
        fids[i] = MT_FID_MAKE(slot, 1000003ull * i + 17);
    mt_table_op_stats_t st = {0};
    cr_assert_eq(mt_table_lookup(t, fids, n, out, n * dim, NULL, MT_TABLE_TRAIN, 1, &st), MT_OK);
    cr_assert_eq(st.admitted, n);
    free(fids);
    return out;
}

Test(init, deterministic_per_fid_and_seed) {
    mt_table_slot_config_t s[2];
    mt_table_slot_config_init(&s[0], 1, 6);
    s[0].init = MT_INIT_UNIFORM;
    s[0].init_scale = 0.5f;
    s[0].init_seed = 12345;
    mt_table_slot_config_init(&s[1], 2, 5);
    s[1].init = MT_INIT_NORMAL;
    s[1].init_scale = 1.0f;
    s[1].init_seed = 777;

    /* Table A: 8 parts, its own hash seed. Table B: the default config (1024 parts, default
     * hash seed). Table C: like A but every init_seed + 1. */
    mt_table_t *ta = mk_table(s, 2, 3);
    mt_table_config_t cb;
    mt_table_config_init(&cb);
    cb.slots = s;
    cb.nslots = 2;
    cr_assert_eq(cb.shards_log2, 10);
    mt_table_t *tb = NULL;
    cr_assert_eq(mt_table_create(&cb, &tb), MT_OK);
    mt_table_slot_config_t s2[2] = {s[0], s[1]};
    s2[0].init_seed++;
    s2[1].init_seed++;
    mt_table_t *tc = mk_table(s2, 2, 3);

    const size_t n = 500;
    for (int k = 0; k < 2; k++) {
        uint32_t dim = s[k].dim;
        float *ra = init_rows(ta, s[k].slot, dim, n);
        float *rb = init_rows(tb, s[k].slot, dim, n);
        float *rc = init_rows(tc, s[k].slot, dim, n);
        cr_assert_eq(memcmp(ra, rb, n * dim * sizeof(float)), 0,
                     "slot %u: same fid and seed gave different rows", s[k].slot);
        size_t same_c = 0, same_next = 0, nonzero = 0;
        for (size_t i = 0; i < n; i++) {
            for (uint32_t j = 0; j < dim; j++) {
                same_c += ra[i * dim + j] == rc[i * dim + j];
                nonzero += ra[i * dim + j] != 0.0f;
            }
            if (i + 1 < n) same_next += memcmp(ra + i * dim, ra + (i + 1) * dim, dim * 4) == 0;
        }
        cr_assert_eq(same_c, 0, "slot %u: %zu values equal under another seed", s[k].slot, same_c);
        cr_assert_eq(same_next, 0, "slot %u: neighbouring fids share a row", s[k].slot);
        cr_assert_eq(nonzero, n * dim);
        free(ra);
        free(rb);
        free(rc);
    }

    /* A row removed and created again comes back identical. */
    uint64_t fid = MT_FID_MAKE(1, 17), removed = 0;
    float before[6], after[6];
    cr_assert_eq(mt_table_get_row(ta, fid, before, NULL, 0, NULL, NULL, NULL), MT_OK);
    cr_assert_eq(mt_table_remove(ta, &fid, 1, &removed), MT_OK);
    cr_assert_eq(removed, 1);
    cr_assert_eq(mt_table_get_row(ta, fid, NULL, NULL, 0, NULL, NULL, NULL), MT_NOT_FOUND);
    cr_assert_eq(mt_table_lookup(ta, &fid, 1, after, 6, NULL, MT_TABLE_TRAIN, 2, NULL), MT_OK);
    cr_assert_eq(memcmp(before, after, sizeof(before)), 0);

    mt_table_destroy(ta);
    mt_table_destroy(tb);
    mt_table_destroy(tc);
}

Test(init, uniform_distribution) {
    const float scale = 0.05f;
    const uint32_t dim = 8;
    mt_table_slot_config_t s;
    mt_table_slot_config_init(&s, 3, dim);
    s.init = MT_INIT_UNIFORM;
    s.init_scale = scale;
    mt_table_t *t = mk_table(&s, 1, 4);
    float *r = init_rows(t, 3, dim, INIT_N);
    const size_t n = (size_t)INIT_N * dim;
    double sum = 0, sum2 = 0, lo = 1, hi = -1, col[8] = {0};
    for (size_t i = 0; i < n; i++) {
        double x = r[i];
        cr_assert(x >= -scale && x <= scale, "value %zu = %g outside [-%g, %g]", i, x,
                  (double)scale, (double)scale);
        sum += x;
        sum2 += x * x;
        col[i % dim] += x;
        if (x < lo) lo = x;
        if (x > hi) hi = x;
    }
    double mean = sum / (double)n, var = sum2 / (double)n - mean * mean;
    double want_var = (double)scale * scale / 3.0; /* 8.333e-4; sd of the mean ~1.6e-4 */
    cr_assert(fabs(mean) < 8e-4, "mean %g", mean);
    cr_assert(fabs(var / want_var - 1.0) < 0.03, "variance %g, want %g", var, want_var);
    cr_assert(hi > 0.998 * scale && lo < -0.998 * scale, "range [%g, %g]", lo, hi);
    /* each coordinate of a row is drawn too, not only the first (sd of a column mean 4.6e-4) */
    for (uint32_t j = 0; j < dim; j++)
        cr_assert(fabs(col[j] / INIT_N) < 2.5e-3, "column %u mean %g", j, col[j] / INIT_N);
    free(r);
    mt_table_destroy(t);
}

Test(init, normal_distribution) {
    const double mu = 0.5, sd = 0.2;
    const uint32_t dim = 5; /* odd: the last coordinate takes the cos half of a pair */
    mt_table_slot_config_t s;
    mt_table_slot_config_init(&s, 4, dim);
    s.init = MT_INIT_NORMAL;
    s.init_mean = (float)mu;
    s.init_scale = (float)sd;
    mt_table_t *t = mk_table(&s, 1, 5);
    float *r = init_rows(t, 4, dim, INIT_N); /* 20000 values */
    const size_t n = (size_t)INIT_N * dim;
    double sum = 0, sum2 = 0, sum4 = 0, in1 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = r[i] - mu;
        cr_assert(isfinite(r[i]));
        sum += d;
        sum2 += d * d;
        sum4 += d * d * d * d;
        in1 += fabs(d) < sd;
    }
    double mean = mu + sum / (double)n, var = sum2 / (double)n - (sum / n) * (sum / n);
    double stddev = sqrt(var), kurt = (sum4 / (double)n) / (var * var);
    /* sd of the sample mean = 0.2 / sqrt(20000) = 0.0014; of the sample sd ~0.5% */
    cr_assert(fabs(mean - mu) < 0.007, "mean %g", mean);
    cr_assert(fabs(stddev / sd - 1.0) < 0.03, "stddev %g", stddev);
    cr_assert(fabs(in1 / (double)n - 0.6827) < 0.015, "within 1 sd: %g", in1 / (double)n);
    cr_assert(fabs(kurt - 3.0) < 0.25, "kurtosis %g", kurt);
    /* per coordinate (4000 values each), and the cos/sin pair (0, 1) uncorrelated */
    double sxy = 0;
    for (uint32_t j = 0; j < dim; j++) {
        double cs = 0, cs2 = 0;
        for (size_t i = 0; i < INIT_N; i++) {
            double d = r[i * dim + j] - mu;
            cs += d;
            cs2 += d * d;
        }
        double cm = cs / INIT_N, csd = sqrt(cs2 / INIT_N - cm * cm);
        cr_assert(fabs(cm) < 0.016, "coordinate %u mean %g", j, mu + cm);
        cr_assert(fabs(csd / sd - 1.0) < 0.08, "coordinate %u stddev %g", j, csd);
    }
    for (size_t i = 0; i < INIT_N; i++)
        sxy += (r[i * dim] - mu) * (r[i * dim + 1] - mu);
    double corr = sxy / INIT_N / (sd * sd);
    cr_assert(fabs(corr) < 0.07, "corr(w0, w1) = %g", corr);
    free(r);
    mt_table_destroy(t);
}

Test(init, zeros) {
    mt_table_slot_config_t s;
    mt_table_slot_config_init(&s, 5, 7);
    s.init = MT_INIT_ZEROS;
    s.init_scale = 3.0f; /* ignored */
    mt_table_t *t = mk_table(&s, 1, 2);
    float *r = init_rows(t, 5, 7, 300);
    for (size_t i = 0; i < 300 * 7; i++)
        cr_assert_eq(f2u(r[i]), 0u, "value %zu", i);
    free(r);
    mt_table_destroy(t);
}

/* A zero tail: the row's last floats start at 0, the others are those of a slot as wide as
 * the rest with the same seed (a first-order weight kept beside its embedding), for each
 * initializer. */
Test(init, zero_tail_starts_at_zero) {
    const mt_table_init_t inits[] = {MT_INIT_UNIFORM, MT_INIT_NORMAL, MT_INIT_ZEROS};
    for (size_t q = 0; q < 3; q++) {
        /* a 17-wide slot with a tail of 1 beside a 16-wide one, same id and seed */
        mt_table_slot_config_t w[1], n[1];
        mt_table_slot_config_init(&w[0], 3, 17);
        mt_table_slot_config_init(&n[0], 3, 16);
        w[0].init = n[0].init = inits[q];
        w[0].init_scale = n[0].init_scale = 0.5f;
        w[0].zero_tail = 1;
        mt_table_t *tw = mk_table(w, 1, 2), *tn = mk_table(n, 1, 2);
        float *rw = init_rows(tw, 3, 17, 100), *rn = init_rows(tn, 3, 16, 100);
        for (size_t i = 0; i < 100; i++) {
            cr_assert_eq(f2u(rw[i * 17 + 16]), 0u, "init %d, row %zu: tail %g", (int)inits[q], i,
                         (double)rw[i * 17 + 16]);
            cr_assert_eq(memcmp(rw + i * 17, rn + i * 16, 16 * sizeof(float)), 0, "row %zu", i);
        }
        free(rw);
        free(rn);
        mt_table_destroy(tw);
        mt_table_destroy(tn);
    }
}

/* ============================== configuration ============================== */

static void base_cfg(mt_table_config_t *c, mt_table_slot_config_t *s) {
    mt_table_config_init(c);
    mt_table_slot_config_init(&s[0], 1, 8);
    mt_table_slot_config_init(&s[1], 2, 4);
    c->slots = s;
    c->nslots = 2;
    c->shards_log2 = 2;
}

static void expect_bad(const mt_table_config_t *c, const char *field, const char *field2,
                       const char *what) {
    char buf[256];
    memset(buf, 0, sizeof(buf));
    cr_assert_eq(mt_table_config_validate(c, buf, sizeof(buf)), MT_CONFIG, "%s: accepted", what);
    cr_assert(strstr(buf, field) != NULL, "%s: message \"%s\" does not name \"%s\"", what, buf,
              field);
    if (field2)
        cr_assert(strstr(buf, field2) != NULL, "%s: message \"%s\" does not name \"%s\"", what, buf,
                  field2);
    cr_assert_eq(mt_table_config_validate(c, NULL, 0), MT_CONFIG, "%s: no errbuf", what);
    mt_table_t *t = NULL;
    cr_assert_eq(mt_table_create(c, &t), MT_CONFIG, "%s: create accepted it", what);
    cr_assert_null(t);
}

static void expect_ok(const mt_table_config_t *c, int create, const char *what) {
    char buf[256] = "";
    cr_assert_eq(mt_table_config_validate(c, buf, sizeof(buf)), MT_OK, "%s: %s", what, buf);
    if (create) {
        mt_table_t *t = NULL;
        cr_assert_eq(mt_table_create(c, &t), MT_OK, "%s", what);
        cr_assert_not_null(t);
        mt_table_destroy(t);
    }
}

/* Applies the statement(s) to a fresh valid config (c, s[2]) and expects MT_CONFIG with a
 * message naming field (and field2 if not NULL). Slot mutations go to s[1], slot 2. */
#define BAD(field, field2, ...)                      \
    do {                                             \
        mt_table_config_t c;                         \
        mt_table_slot_config_t s[2];                 \
        base_cfg(&c, s);                             \
        __VA_ARGS__;                                 \
        expect_bad(&c, field, field2, #__VA_ARGS__); \
    } while (0)

#define GOOD(create, ...)                    \
    do {                                     \
        mt_table_config_t c;                 \
        mt_table_slot_config_t s[2];         \
        base_cfg(&c, s);                     \
        __VA_ARGS__;                         \
        expect_ok(&c, create, #__VA_ARGS__); \
    } while (0)

Test(config, bad_fields_are_named) {
    BAD("slot id", "slot 1", s[1].slot = 1);
    BAD("dim", "slot 2", s[1].dim = 0);
    BAD("dim", "slot 2", s[1].dim = 1025);
    BAD("zero_tail", "slot 2", s[1].zero_tail = 5);
    BAD("lr", "slot 2", s[1].lr = 0.0f);
    BAD("lr", "slot 2", s[1].lr = NAN);
    BAD("lr", "slot 2", s[1].lr = -0.1f);
    BAD("lr", "slot 2", s[1].lr = INFINITY);
    BAD("min_count", "slot 2", s[1].min_count = 256);
    BAD("min_count", "filter_bytes", s[1].min_count = 2, c.filter_bytes = 0);
    BAD("max_load", NULL, c.max_load = 0.3);
    BAD("max_load", NULL, c.max_load = 0.98);
    BAD("max_load", NULL, c.max_load = NAN);
    BAD("shards_log2", NULL, c.shards_log2 = 17);
    BAD("changelog_entries", NULL, c.changelog_entries = 64 * 4 - 1);
    BAD("changelog_entries", NULL, c.changelog_entries = 1);
    /* more fields */
    BAD("slots", NULL, c.nslots = 0);
    BAD("slots", NULL, c.slots = NULL);
    BAD("filter_depth", NULL, c.filter_depth = 0);
    BAD("filter_depth", NULL, c.filter_depth = 9);
    BAD("filter_bytes", NULL, c.filter_bytes = 4 * 64 * 4 - 1);
    BAD("init", "slot 2", s[1].init = (mt_table_init_t)3);
    BAD("init_scale", "slot 2", s[1].init_scale = NAN);
    BAD("init_mean", "slot 2", s[1].init_mean = NAN);
    BAD("opt", "slot 2", s[1].opt = (mt_table_opt_t)4);
    BAD("eps", "slot 2", s[1].eps = 1.0f);
    BAD("init_accum", "slot 2", s[1].init_accum = -1.0f);
    BAD("init_accum", "slot 2", s[1].init_accum = 0.0f, s[1].eps = 0.0f);
    BAD("beta1", "slot 2", s[1].opt = MT_OPT_ADAM, s[1].beta1 = 1.0f);
    BAD("beta2", "slot 2", s[1].opt = MT_OPT_ADAM, s[1].beta2 = -0.5f);
    BAD("eps", "slot 2", s[1].opt = MT_OPT_ADAM, s[1].eps = 0.0f);
    BAD("ftrl_beta", "slot 2", s[1].opt = MT_OPT_FTRL, s[1].ftrl_beta = -1.0f);
    BAD("l1", "slot 2", s[1].l1 = -1.0f);
    BAD("l2", "slot 2", s[1].l2 = NAN);
    BAD("precision", "slot 2", s[1].precision = (mt_table_precision_t)2);

    /* A NULL config is refused too. */
    char buf[64] = "";
    cr_assert_eq(mt_table_config_validate(NULL, buf, sizeof(buf)), MT_CONFIG);
    mt_table_t *t = NULL;
    cr_assert_eq(mt_table_create(NULL, &t), MT_CONFIG);
    cr_assert_null(t);
}

Test(config, defaults_and_bounds_are_accepted) {
    GOOD(1, (void)0); /* defaults (1024 parts) too: */
    {
        mt_table_config_t c;
        mt_table_slot_config_t s[2];
        base_cfg(&c, s);
        c.shards_log2 = 10;
        mt_table_config_t d;
        mt_table_config_init(&d);
        cr_assert_eq(d.shards_log2, 10);
        cr_assert(d.max_load == 0.9 && d.filter_depth == 4);
        expect_ok(&c, 1, "default shards");
    }
    GOOD(1, s[1].dim = 1);
    GOOD(1, s[1].dim = 1024);
    GOOD(1, s[1].zero_tail = 4);
    GOOD(1, s[1].min_count = 255);
    GOOD(1, s[1].min_count = 1, c.filter_bytes = 0);
    GOOD(1, c.max_load = 0.5);
    GOOD(1, c.max_load = 0.97);
    GOOD(1, c.shards_log2 = 0);
    GOOD(1, c.changelog_entries = 64 * 4);
    GOOD(1, c.changelog_entries = 0); /* 0: change tracking off */
    GOOD(0, c.shards_log2 = 16, c.changelog_entries = 64ull << 16,
         c.filter_bytes = 4ull * 64 << 16);
    GOOD(1, s[1].opt = MT_OPT_ADAM);
    GOOD(1, s[1].opt = MT_OPT_FTRL, s[1].l1 = 1.0f, s[1].l2 = 0.5f);
    GOOD(1, s[1].opt = MT_OPT_ADAGRAD, s[1].eps = 0.0f);        /* init_accum 0.1 > 0 */
    GOOD(1, s[1].opt = MT_OPT_ADAGRAD, s[1].init_accum = 0.0f); /* eps 1e-8 > 0 */
    GOOD(1, s[1].opt = MT_OPT_SGD, s[1].init_accum = -1.0f);    /* unused by SGD */
    GOOD(1, s[1].precision = MT_PREC_FP16);
    GOOD(1, s[1].slot = 65535);
}

Test(config, short_errbuf_is_truncated_safely) {
    mt_table_config_t c;
    mt_table_slot_config_t s[2];
    base_cfg(&c, s);
    s[1].min_count = 256;
    char buf[16];
    memset(buf, 'x', sizeof(buf));
    cr_assert_eq(mt_table_config_validate(&c, buf, 5), MT_CONFIG);
    cr_assert_eq(buf[4], '\0');
    cr_assert_eq(strlen(buf), 4);
    for (size_t i = 5; i < sizeof(buf); i++)
        cr_assert_eq(buf[i], 'x', "wrote past errlen");
}

Test(config, all_65536_slots_are_usable) {
    /* nslots may be 65536 (one per slot id): every configured slot must then be usable,
     * including the one at index 65535 of the slots array. */
    mt_table_slot_config_t *s = calloc(65536, sizeof(*s));
    cr_assert_not_null(s);
    for (uint32_t i = 0; i < 65536; i++) {
        mt_table_slot_config_init(&s[i], (uint16_t)i, 1);
        s[i].opt = MT_OPT_SGD;
        s[i].init = MT_INIT_ZEROS;
    }
    mt_table_t *t = mk_table(s, 65536, 0);
    free(s);
    /* Collect the outcome first, so that the table is freed even when a check fails. */
    const uint16_t probe[] = {0, 1, 4660, 65534, 65535};
    mt_err_t err[5][4];
    uint32_t dims[5];
    float ws[5];
    for (size_t i = 0; i < 5; i++) {
        uint64_t fid = MT_FID_MAKE(probe[i], 42);
        float w = 1.0f;
        dims[i] = 0;
        err[i][0] = mt_table_dim(t, fid, &dims[i]);
        err[i][1] = mt_table_lookup(t, &fid, 1, &w, 1, NULL, MT_TABLE_TRAIN, 1, NULL);
        err[i][2] = mt_table_apply(t, &fid, 1, (const float[]){2.0f}, 1, 2, NULL);
        err[i][3] = mt_table_get_row(t, fid, &w, NULL, 0, NULL, NULL, NULL);
        ws[i] = w;
    }
    mt_table_destroy(t);
    for (size_t i = 0; i < 5; i++) {
        for (int k = 0; k < 4; k++)
            cr_assert_eq(err[i][k], MT_OK, "slot %u is configured but call %d gives %s", probe[i],
                         k, mt_err_name(err[i][k]));
        cr_assert_eq(dims[i], 1);
        cr_assert(ws[i] == -0.02f, "slot %u: w = %g", probe[i], (double)ws[i]); /* -0.01 * 2 */
    }
}

/* ============================== unknown slots and wrong lengths ============================== */

typedef struct row_snap {
    float emb[4], state[8];
    uint32_t touch, count;
    uint64_t version;
} row_snap_t;

static void snap(mt_table_t *t, uint64_t fid, row_snap_t *r) {
    memset(r, 0, sizeof(*r));
    cr_assert_eq(mt_table_get_row(t, fid, r->emb, r->state, 8, &r->touch, &r->count, &r->version),
                 MT_OK);
}

static void same_row(mt_table_t *t, uint64_t fid, const row_snap_t *before, const char *what) {
    row_snap_t now;
    snap(t, fid, &now);
    cr_assert_eq(memcmp(&now, before, sizeof(now)), 0, "%s: row changed", what);
}

Test(config, unknown_slot_does_nothing) {
    mt_table_slot_config_t s[2];
    mt_table_slot_config_init(&s[0], 1, 4); /* Adagrad, uniform init */
    mt_table_slot_config_init(&s[1], 2, 2);
    s[1].min_count = 3;
    mt_table_t *t = mk_table(s, 2, 2);
    const uint64_t a1 = MT_FID_MAKE(1, 1), a2 = MT_FID_MAKE(1, 2), a3 = MT_FID_MAKE(1, 3);
    const uint64_t f = MT_FID_MAKE(2, 7);                         /* filtered, seen once */
    const uint64_t u = MT_FID_MAKE(9, 1), u0 = MT_FID_MAKE(0, 1); /* slots 9, 0: unknown */
    float out[16];
    uint64_t pre[3] = {a1, a2, f};
    cr_assert_eq(mt_table_lookup(t, pre, 3, out, 10, NULL, MT_TABLE_TRAIN, 100, NULL), MT_OK);
    cr_assert_eq(mt_table_get_row(t, f, NULL, NULL, 0, NULL, NULL, NULL), MT_NOT_FOUND);

    mt_table_stats_t s0, s1;
    mt_table_stats(t, &s0);
    cr_assert_eq(s0.rows, 2);
    cr_assert_eq(s0.filtered, 1);
    row_snap_t r1;
    snap(t, a1, &r1);

    /* lookups (training and not) with an unknown id anywhere in the batch */
    const uint64_t batch[4] = {a1, a3, f, u};
    for (int train = 0; train < 2; train++) {
        float o[16];
        uint8_t found[4] = {7, 7, 7, 7};
        for (int i = 0; i < 16; i++)
            o[i] = 42.0f;
        mt_table_op_stats_t st = {0};
        mt_err_t err =
            mt_table_lookup(t, batch, 4, o, 16, found, train ? MT_TABLE_TRAIN : 0, 200, &st);
        cr_assert_eq(err, MT_UNKNOWN_SLOT, "train=%d: %d", train, err);
        for (int i = 0; i < 16; i++)
            cr_assert(o[i] == 42.0f, "train=%d: out[%d] written", train, i);
        for (int i = 0; i < 4; i++)
            cr_assert_eq(found[i], 7, "found[%d] written", i);
        cr_assert(st.found == 0 && st.missing == 0 && st.admitted == 0 && st.filtered == 0);
    }
    cr_assert_eq(mt_table_lookup(t, &u0, 1, out, 16, NULL, MT_TABLE_TRAIN, 200, NULL),
                 MT_UNKNOWN_SLOT);

    /* apply / assign / remove with an unknown id */
    const uint64_t ab[2] = {a1, u};
    const float g[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    mt_table_op_stats_t st = {0};
    for (size_t len = 0; len <= 16; len++)
        cr_assert_eq(mt_table_apply(t, ab, 2, g, len, 200, &st), MT_UNKNOWN_SLOT);
    const uint64_t asg[2] = {a3, u};
    for (size_t len = 0; len <= 16; len++)
        cr_assert_eq(mt_table_assign(t, asg, 2, g, len, 200, &st), MT_UNKNOWN_SLOT);
    cr_assert(st.found == 0 && st.missing == 0 && st.admitted == 0 && st.filtered == 0);
    uint64_t removed = 12345;
    cr_assert_eq(mt_table_remove(t, ab, 2, &removed), MT_UNKNOWN_SLOT);
    cr_assert(removed == 12345 || removed == 0, "removed = %llu", (unsigned long long)removed);

    /* the small queries */
    uint32_t v32 = 777;
    size_t nf = 777;
    cr_assert_eq(mt_table_dim(t, u, &v32), MT_UNKNOWN_SLOT);
    cr_assert_eq(mt_table_dim(t, u0, &v32), MT_UNKNOWN_SLOT);
    cr_assert_eq(mt_table_state_floats(t, u, &v32), MT_UNKNOWN_SLOT);
    cr_assert_eq(mt_table_row_bytes(t, u, &v32), MT_UNKNOWN_SLOT);
    cr_assert_eq(v32, 777);
    cr_assert_eq(mt_table_batch_floats(t, ab, 2, &nf), MT_UNKNOWN_SLOT);
    cr_assert_eq(nf, 777);
    cr_assert_eq(mt_table_get_row(t, u, out, NULL, 0, NULL, NULL, NULL), MT_UNKNOWN_SLOT);

    /* nothing happened: same stats, a1 untouched (count, touch, version, embedding, state),
     * a3 not created, f not counted again by the sketch */
    mt_table_stats(t, &s1);
    cr_assert(stats_eq(&s0, &s1), "stats changed: rows %llu->%llu version %llu->%llu",
              (unsigned long long)s0.rows, (unsigned long long)s1.rows,
              (unsigned long long)s0.version, (unsigned long long)s1.version);
    same_row(t, a1, &r1, "a1");
    cr_assert_eq(mt_table_get_row(t, a3, NULL, NULL, 0, NULL, NULL, NULL), MT_NOT_FOUND);
    mt_table_op_stats_t fs = {0};
    cr_assert_eq(mt_table_lookup(t, &f, 1, out, 2, NULL, MT_TABLE_TRAIN, 300, &fs), MT_OK);
    cr_assert_eq(fs.filtered, 1, "2nd sighting of f must still be filtered");
    cr_assert_eq(mt_table_lookup(t, &f, 1, out, 2, NULL, MT_TABLE_TRAIN, 300, &fs), MT_OK);
    cr_assert_eq(fs.admitted, 1, "3rd sighting of f admits it");
    mt_table_destroy(t);
}

Test(config, wrong_length_does_nothing) {
    mt_table_slot_config_t s[2];
    mt_table_slot_config_init(&s[0], 1, 3); /* Adagrad */
    mt_table_slot_config_init(&s[1], 2, 2);
    s[1].opt = MT_OPT_ADAM;
    mt_table_t *t = mk_table(s, 2, 3);
    const uint64_t r1 = MT_FID_MAKE(1, 10), r2 = MT_FID_MAKE(2, 10), nw = MT_FID_MAKE(1, 11);
    assign1(t, r1, (const float[]){1, 2, 3}, 3);
    assign1(t, r2, (const float[]){4, 5}, 2);
    apply1(t, r1, (const float[]){0.1f, 0.2f, 0.3f}, 3, 50);
    mt_table_stats_t s0, s1;
    mt_table_stats(t, &s0);
    row_snap_t b1, b2;
    snap(t, r1, &b1);
    snap(t, r2, &b2);

    const uint64_t both[2] = {r1, r2}; /* needs 3 + 2 = 5 floats */
    const float g[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    mt_table_op_stats_t st = {0};
    const size_t bad[] = {0, 1, 3, 4, 6, 8};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(mt_table_apply(t, both, 2, g, bad[i], 60, &st), MT_TOO_SMALL,
                     "apply grads_len %zu", bad[i]);
        const uint64_t na[2] = {nw, r2};
        cr_assert_eq(mt_table_assign(t, na, 2, g, bad[i], 60, &st), MT_TOO_SMALL,
                     "assign values_len %zu", bad[i]);
    }
    cr_assert_eq(mt_table_apply(t, both, 0, g, 1, 60, &st), MT_TOO_SMALL); /* needs 0 */
    float o[8];
    const uint64_t lk[2] = {nw, r1};
    cr_assert_eq(mt_table_lookup(t, lk, 2, o, 5, NULL, MT_TABLE_TRAIN, 60, &st), MT_TOO_SMALL);
    cr_assert(st.found == 0 && st.missing == 0 && st.admitted == 0 && st.filtered == 0);

    mt_table_stats(t, &s1);
    cr_assert(stats_eq(&s0, &s1), "stats changed");
    same_row(t, r1, &b1, "r1");
    same_row(t, r2, &b2, "r2");
    cr_assert_eq(mt_table_get_row(t, nw, NULL, NULL, 0, NULL, NULL, NULL), MT_NOT_FOUND);

    /* the right length works (so the checks above could have seen a change) */
    cr_assert_eq(mt_table_apply(t, both, 2, g, 5, 60, &st), MT_OK);
    cr_assert_eq(st.found, 2);
    row_snap_t a1;
    snap(t, r1, &a1);
    cr_assert_neq(memcmp(&a1, &b1, sizeof(a1)), 0);
    cr_assert_eq(a1.touch, 60);
    mt_table_destroy(t);
}

/* ============================== row layouts ============================== */

/* Both row layouts (table_int.h): an embedding that tiles cache lines (dim 16 fp32, dim 2)
 * is split from its header and state; others (dim 17 fp32, the model's rows; dim 5 fp16)
 * keep a row's bytes together. Sizes worked out by hand, and 600 neighbouring rows of each
 * written and stepped with values of their own: no row's embedding, state, touch time or
 * count overlaps another's. */
Test(layout, rows_of_both_layouts_keep_their_own_bytes) {
    enum { N = 600 };
    static const struct {
        uint16_t slot;
        uint32_t dim;
        int fp16;
        uint32_t bytes;
    } L[4] = {
        {1, 16, 0, 64 + 16 + 64}, /* split: 64 embedding, header, 16 accumulators */
        {2, 17, 0, 16 + 68 + 68}, /* together: header, embedding, accumulators */
        {3, 5, 1, 16 + 12 + 20},  /* together: 10 bytes of halves padded to 12 */
        {4, 2, 0, 8 + 24},        /* split: 8 embedding, header + 2 accumulators */
    };
    mt_table_slot_config_t s[4];
    for (int k = 0; k < 4; k++) {
        mt_table_slot_config_init(&s[k], L[k].slot, L[k].dim);
        s[k].precision = L[k].fp16 ? MT_PREC_FP16 : MT_PREC_FP32;
        s[k].opt = MT_OPT_ADAGRAD;
        s[k].lr = 0.5f;
        s[k].eps = 0.0f;
        s[k].init_accum = 0.25f;
    }
    mt_table_t *t = mk_table(s, 4, 1);
    for (int k = 0; k < 4; k++) {
        uint32_t rb = 0;
        cr_assert_eq(mt_table_row_bytes(t, MT_FID_MAKE(L[k].slot, 0), &rb), MT_OK);
        cr_assert_eq(rb, L[k].bytes, "slot %u: %u bytes a row, want %u", L[k].slot, rb, L[k].bytes);
    }
    /* Row i of slot k: embedding (k + 1) * 1000 + i + j / 8 (fp16: i % 64 + j / 8, exact in
     * halves), then one apply of gradient g = 1 + (i % 7) / 4: the accumulator becomes
     * 0.25 + g^2, the embedding w - 0.5 g / sqrt(a). */
    float w[17], g[17], e[17], st[17];
    for (int k = 0; k < 4; k++)
        for (uint32_t i = 0; i < N; i++) {
            uint64_t fid = MT_FID_MAKE(L[k].slot, i + 1);
            for (uint32_t j = 0; j < L[k].dim; j++)
                w[j] = L[k].fp16 ? (float)(i % 64) + (float)j / 8
                                 : (float)((k + 1) * 1000 + i) + (float)j / 8;
            assign1(t, fid, w, L[k].dim);
        }
    for (int k = 0; k < 4; k++)
        for (uint32_t i = 0; i < N; i++) {
            uint64_t fid = MT_FID_MAKE(L[k].slot, i + 1);
            for (uint32_t j = 0; j < L[k].dim; j++)
                g[j] = 1.0f + (float)(i % 7) / 4;
            apply1(t, fid, g, L[k].dim, 100 + i);
        }
    for (int k = 0; k < 4; k++)
        for (uint32_t i = 0; i < N; i++) {
            uint64_t fid = MT_FID_MAKE(L[k].slot, i + 1);
            uint32_t touch = 0, count = 0;
            uint64_t version = 0;
            cr_assert_eq(mt_table_get_row(t, fid, e, st, L[k].dim, &touch, &count, &version),
                         MT_OK);
            cr_assert_eq(touch, 100 + i, "slot %u row %u: touch %u", L[k].slot, i, touch);
            float gi = 1.0f + (float)(i % 7) / 4, a = 0.25f + gi * gi;
            for (uint32_t j = 0; j < L[k].dim; j++) {
                float w0 = L[k].fp16 ? (float)(i % 64) + (float)j / 8
                                     : (float)((k + 1) * 1000 + i) + (float)j / 8;
                float want = w0 - 0.5f * gi / sqrtf(a);
                float tol = L[k].fp16 ? 0.04f : 1e-3f;
                cr_assert_float_eq(st[j], a, 1e-6f, "slot %u row %u: state[%u] %g, want %g",
                                   L[k].slot, i, j, st[j], a);
                cr_assert_float_eq(e[j], want, tol, "slot %u row %u: emb[%u] %g, want %g",
                                   L[k].slot, i, j, e[j], want);
            }
        }
    mt_table_destroy(t);
}

/* reserve_rows: with initial_rows the rows' memory is taken at create (every page touched);
 * that many inserts take no more, and past it the table grows as usual. Without it nothing is
 * taken before the first insert. */
Test(layout, reserve_rows_takes_the_rows_memory_at_create) {
    enum { N = 20000 };
    mt_table_slot_config_t s;
    mt_table_slot_config_init(&s, 1, 17);
    s.opt = MT_OPT_ADAGRAD;
    for (int reserve = 0; reserve <= 1; reserve++) {
        mt_table_config_t c;
        mt_table_config_init(&c);
        c.slots = &s;
        c.nslots = 1;
        c.shards_log2 = 2;
        c.filter_bytes = 0;
        c.changelog_entries = 0;
        c.initial_rows = N;
        c.reserve_rows = reserve;
        mt_table_t *t = NULL;
        cr_assert_eq(mt_table_create(&c, &t), MT_OK);
        uint32_t rb = 0;
        cr_assert_eq(mt_table_row_bytes(t, MT_FID_MAKE(1, 0), &rb), MT_OK);
        mt_table_stats_t st0, st1, st2;
        mt_table_stats(t, &st0);
        if (reserve)
            cr_assert_geq(st0.bytes_rows, (uint64_t)N * rb, "%llu bytes reserved for %d rows",
                          (unsigned long long)st0.bytes_rows, N);
        else
            cr_assert_eq(st0.bytes_rows, 0);
        static float w[17];
        for (uint64_t i = 0; i < N; i++)
            assign1(t, MT_FID_MAKE(1, i), w, 17);
        mt_table_stats(t, &st1);
        cr_assert_eq(st1.rows, N);
        if (reserve)
            cr_assert_eq(st1.bytes_rows, st0.bytes_rows, "inserts within the reserve took more");
        else
            cr_assert_geq(st1.bytes_rows, (uint64_t)N * rb);
        for (uint64_t i = N; i < 3 * N; i++) /* past the reserve: grows */
            assign1(t, MT_FID_MAKE(1, i), w, 17);
        mt_table_stats(t, &st2);
        cr_assert_eq(st2.rows, 3 * N);
        cr_assert_gt(st2.bytes_rows, st1.bytes_rows);
        for (uint64_t i = 0; i < 3 * N; i += 997) { /* rows read back */
            float e[17], a[17];
            cr_assert_eq(mt_table_get_row(t, MT_FID_MAKE(1, i), e, a, 17, NULL, NULL, NULL), MT_OK);
        }
        mt_table_destroy(t);
    }
}
