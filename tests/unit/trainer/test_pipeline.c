/*
 * test_pipeline.c - pipelined steps (mt_trainer_set_pipelined): a step's apply runs on the
 * trainer's apply thread while the next step looks up and computes.
 *   - when no two consecutive batches share an id, a pipelined run leaves exactly the
 *     parameters of an unpipelined one (bit for bit: the rows the backend holds and the
 *     scores of the dense model), since every lookup still sees every apply but the one in
 *     flight, which touches none of its ids;
 *   - an apply that fails comes back from the next step (which then sends nothing) with
 *     previous = 0; the steps before it were confirmed (previous = 1); nothing is left in
 *     flight, and training goes on;
 *   - a cover without a backend able to carry it is refused, nothing sent;
 *   - turning the pipeline off waits for the apply in flight.
 * The backend is a table of the test's own, behind the backend interface, that counts the
 * applies and fails the one it is told to.
 */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "mt/batch.h"
#include "mt/psclient.h"
#include "mt/trainer.h"

#define NS 2
#define NB 40
#define BS 64

typedef struct backend {
    mt_table_t *t;
    _Atomic int applies;
    int fail_at; /* 1-based apply to fail with MT_UNAVAILABLE; 0: none */
} backend_t;

static mt_err_t be_lookup(void *ud, const uint64_t *fids, size_t n, int train, uint32_t now_s,
                          float *out, size_t out_len) {
    backend_t *b = ud;
    return mt_table_lookup(b->t, fids, n, out, out_len, NULL, train ? MT_TABLE_TRAIN : 0, now_s,
                           NULL);
}

static mt_err_t be_apply(void *ud, const uint64_t *fids, size_t n, const float *grads, size_t len,
                         uint32_t now_s, uint64_t examples) {
    (void)examples;
    backend_t *b = ud;
    int k = atomic_fetch_add(&b->applies, 1) + 1;
    if (k == b->fail_at) return MT_UNAVAILABLE;
    return mt_table_apply(b->t, fids, n, grads, len, now_s, NULL);
}

static void config(mt_trainer_config_t *tc) {
    mt_trainer_config_init(tc);
    tc->nslots = NS;
    tc->slot_ids[0] = 1;
    tc->slot_ids[1] = 2;
    tc->dim = 8;
    tc->hidden[0] = 16;
    tc->hidden[1] = 8;
}

static mt_trainer_t *make(backend_t *be, mt_trainer_backend_t *ifc) {
    mt_trainer_config_t tc;
    config(&tc);
    mt_table_slot_config_t sc[2 * NS];
    cr_assert_eq(mt_trainer_slot_configs(&tc, sc, 2 * NS), MT_OK);
    mt_table_config_t cfg;
    mt_table_config_init(&cfg);
    cfg.slots = sc;
    cfg.nslots = 2 * NS;
    cr_assert_eq(mt_table_create(&cfg, &be->t), MT_OK);
    atomic_init(&be->applies, 0);
    *ifc = (mt_trainer_backend_t){.ud = be, .lookup = be_lookup, .apply = be_apply};
    tc.backend = ifc;
    mt_trainer_t *tr = NULL;
    cr_assert_eq(mt_trainer_create(&tc, &tr), MT_OK);
    return tr;
}

/* Batch i: ids of pool i % 2 only (consecutive batches share none; i and i + 2 do). */
static void batch_of(mt_batch_t *b, int i) {
    uint16_t slots[NS] = {1, 2};
    cr_assert_eq(mt_batch_init(b, slots, NS), MT_OK);
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    for (int e = 0; e < BS; e++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t pool = (uint64_t)(i % 2) * 1000000u;
        uint64_t f0 = MT_FID_MAKE(1, pool + (x >> 40) % 300);
        uint64_t f1 = MT_FID_MAKE(2, pool + (x >> 20) % 50);
        const uint64_t *f[NS] = {&f0, &f1};
        uint32_t c[NS] = {1, 1};
        float label = ((x >> 8) % 3 == 0) ? 1.0f : 0.0f;
        cr_assert_eq(mt_batch_add(b, label, 0, 1, f, c), MT_OK);
    }
}

Test(pipeline, no_shared_ids_between_neighbours_gives_the_unpipelined_parameters) {
    backend_t ba = {0}, bb = {0};
    mt_trainer_backend_t ia, ib;
    mt_trainer_t *a = make(&ba, &ia), *p = make(&bb, &ib);
    cr_assert_eq(mt_trainer_set_pipelined(p, 1), MT_OK);
    float probs[BS];
    for (int i = 0; i < NB; i++) {
        mt_batch_t b;
        batch_of(&b, i);
        mt_trainer_step_t sa, sp;
        cr_assert_eq(mt_trainer_train(a, &b, 100 + (uint32_t)i, probs, &sa), MT_OK);
        cr_assert_eq(mt_trainer_train(p, &b, 100 + (uint32_t)i, probs, &sp), MT_OK);
        cr_assert_eq(sa.previous, 0, "unpipelined: nothing is ever in flight");
        cr_assert_eq(sp.previous, i > 0, "step %d confirms the one before", i);
        cr_assert_eq(sa.loss, sp.loss, "step %d: the same loss", i);
        mt_batch_free(&b);
    }
    mt_trainer_step_t w;
    cr_assert_eq(mt_trainer_wait(p, &w), MT_OK);
    cr_assert_eq(w.previous, 1, "the last apply was in flight");
    cr_assert_eq(mt_trainer_wait(p, &w), MT_OK);
    cr_assert_eq(w.previous, 0, "nothing is in flight any more");
    cr_assert_eq(atomic_load(&ba.applies), NB);
    cr_assert_eq(atomic_load(&bb.applies), NB);
    /* every row alike, bit for bit */
    mt_table_stats_t s1, s2;
    mt_table_stats(ba.t, &s1);
    mt_table_stats(bb.t, &s2);
    cr_assert_eq(s1.rows, s2.rows);
    for (int pool = 0; pool < 2; pool++)
        for (uint16_t slot = 1; slot <= NS; slot++)
            for (uint64_t v = 0; v < 300; v++) {
                for (int fo = 0; fo < 2; fo++) {
                    uint64_t fid =
                        MT_FID_MAKE(slot | (fo ? 0x8000 : 0), (uint64_t)pool * 1000000u + v);
                    float ea[8], eb[8], sa[32], sb[32];
                    uint32_t ns = 0;
                    cr_assert_eq(mt_table_state_floats(ba.t, fid, &ns), MT_OK);
                    uint32_t t1, t2, c1, c2;
                    uint64_t v1, v2;
                    mt_err_t x1 = mt_table_get_row(ba.t, fid, ea, sa, ns, &t1, &c1, &v1);
                    mt_err_t x2 = mt_table_get_row(bb.t, fid, eb, sb, ns, &t2, &c2, &v2);
                    cr_assert_eq(x1, x2);
                    if (x1) continue;
                    uint32_t dim = fo ? 1 : 8;
                    cr_assert_eq(memcmp(ea, eb, dim * sizeof(float)), 0, "row %llx",
                                 (unsigned long long)fid);
                    cr_assert_eq(memcmp(sa, sb, ns * sizeof(float)), 0);
                }
            }
    /* and the dense model: the same scores */
    mt_batch_t b;
    batch_of(&b, NB);
    float pa[BS], pp[BS];
    cr_assert_eq(mt_trainer_predict(a, &b, pa), MT_OK);
    cr_assert_eq(mt_trainer_predict(p, &b, pp), MT_OK);
    cr_assert_eq(memcmp(pa, pp, sizeof(pa)), 0);
    mt_batch_free(&b);
    mt_trainer_destroy(a);
    mt_trainer_destroy(p);
    mt_table_destroy(ba.t);
    mt_table_destroy(bb.t);
}

Test(pipeline, a_failed_apply_comes_back_from_the_next_step) {
    backend_t be = {0};
    mt_trainer_backend_t ifc;
    mt_trainer_t *tr = make(&be, &ifc);
    be.fail_at = 3;
    cr_assert_eq(mt_trainer_set_pipelined(tr, 1), MT_OK);
    cr_assert_eq(mt_trainer_set_pipelined(tr, 1), MT_OK, "twice is once");
    float probs[BS];
    mt_trainer_step_t st;
    for (int i = 0; i < 3; i++) {
        mt_batch_t b;
        batch_of(&b, i);
        cr_assert_eq(mt_trainer_train(tr, &b, 1, probs, &st), MT_OK, "step %d", i);
        cr_assert_eq(st.previous, i > 0);
        mt_batch_free(&b);
    }
    mt_batch_t b;
    batch_of(&b, 3);
    cr_assert_eq(mt_trainer_train(tr, &b, 1, probs, &st), MT_UNAVAILABLE, "the 3rd apply's error");
    cr_assert_eq(st.previous, 0, "the 3rd step is not applied");
    cr_assert_eq(atomic_load(&be.applies), 3, "the 4th step sent nothing");
    cr_assert_eq(mt_trainer_wait(tr, &st), MT_OK);
    cr_assert_eq(st.previous, 0, "nothing in flight after an error");
    /* training goes on; turning the pipeline off waits for the apply in flight */
    cr_assert_eq(mt_trainer_train(tr, &b, 1, probs, &st), MT_OK);
    cr_assert_eq(mt_trainer_set_pipelined(tr, 0), MT_OK);
    cr_assert_eq(atomic_load(&be.applies), 4);
    cr_assert_eq(mt_trainer_train(tr, &b, 1, probs, &st), MT_OK);
    cr_assert_eq(st.previous, 0);
    cr_assert_eq(atomic_load(&be.applies), 5, "unpipelined again: applied before it returns");
    /* a cover needs a backend that carries it: refused with nothing sent */
    cr_assert_eq(mt_trainer_set_pipelined(tr, 1), MT_OK);
    mt_psc_range_t cover = {.topic = "examples", .partition = 0, .lo = 0, .hi = BS};
    mt_trainer_set_cover(tr, &cover, 1);
    cr_assert_eq(mt_trainer_train(tr, &b, 1, probs, &st), MT_INVALID);
    cr_assert_eq(mt_trainer_wait(tr, &st), MT_OK);
    cr_assert_eq(atomic_load(&be.applies), 5);
    mt_batch_free(&b);
    mt_trainer_destroy(tr); /* with the pipeline on */
    mt_table_destroy(be.t);
}
