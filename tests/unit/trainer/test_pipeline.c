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
 *   - turning the pipeline off waits for the apply in flight;
 *   - prefetched lookups (mt_trainer_prefetch): the step of a prefetched batch makes no lookup
 *     of its own; the lookup of batch i runs when exactly i - 1 applies were answered (the
 *     staleness bound: one step, never more, never less), and the parameters are again the
 *     unpipelined ones when neighbours share no id; a step uses only its own batch's
 *     prefetch (unchanged, made at most one step before) and drops the older ones and the
 *     staler ones, a batch not prefetched looks itself up; a failed prefetched
 *     lookup comes back from its step, which drops the next prefetch too; the refusals
 *     (pipeline off, a third prefetch, slots of another model).
 * The backend is a table of the test's own, behind the backend interface, that counts the
 * applies and fails the one it is told to.
 */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "mt/batch.h"
#include "mt/clock.h"
#include "mt/psclient.h"
#include "mt/trainer.h"

#define NS 2
#define NB 40
#define BS 64

typedef struct backend {
    mt_table_t *t;
    _Atomic int applies, lookups;
    int fail_at;        /* 1-based apply to fail with MT_UNAVAILABLE; 0: none */
    int fail_lookup_at; /* 1-based training lookup to fail so; 0: none */
    int seen[NB + 8];   /* applies answered when the k-th training lookup (0-based) ran */
} backend_t;

static mt_err_t be_lookup(void *ud, const uint64_t *fids, size_t n, int train, uint32_t now_s,
                          float *out, size_t out_len) {
    backend_t *b = ud;
    if (train) {
        int k = atomic_fetch_add(&b->lookups, 1);
        if (k < NB + 8) b->seen[k] = atomic_load(&b->applies);
        if (k + 1 == b->fail_lookup_at) return MT_UNAVAILABLE;
    }
    return mt_table_lookup(b->t, fids, n, out, out_len, NULL, train ? MT_TABLE_TRAIN : 0, now_s,
                           NULL);
}

static mt_err_t be_apply(void *ud, const uint64_t *fids, size_t n, const float *grads, size_t len,
                         uint32_t now_s, uint64_t examples) {
    (void)examples;
    backend_t *b = ud;
    int k = atomic_load(&b->applies) + 1;
    mt_err_t err =
        k == b->fail_at ? MT_UNAVAILABLE : mt_table_apply(b->t, fids, n, grads, len, now_s, NULL);
    atomic_fetch_add(&b->applies, 1); /* counted once answered, for the lookups' record */
    return err;
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
    mt_table_slot_config_t sc[NS];
    size_t nsc = 0;
    cr_assert_eq(mt_trainer_slot_configs(&tc, sc, NS, &nsc), MT_OK);
    mt_table_config_t cfg;
    mt_table_config_init(&cfg);
    cfg.slots = sc;
    cfg.nslots = nsc;
    cr_assert_eq(mt_table_create(&cfg, &be->t), MT_OK);
    atomic_init(&be->applies, 0);
    atomic_init(&be->lookups, 0);
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

/* Every row of the two backends alike, bit for bit, and the same scores of a new batch. */
static void same_parameters(backend_t *ba, backend_t *bb, mt_trainer_t *a, mt_trainer_t *p) {
    mt_table_stats_t s1, s2;
    mt_table_stats(ba->t, &s1);
    mt_table_stats(bb->t, &s2);
    cr_assert_eq(s1.rows, s2.rows);
    for (int pool = 0; pool < 2; pool++)
        for (uint16_t slot = 1; slot <= NS; slot++)
            for (uint64_t v = 0; v < 300; v++) {
                {
                    uint64_t fid = MT_FID_MAKE(slot, (uint64_t)pool * 1000000u + v);
                    float ea[9], eb[9], sa[32], sb[32]; /* rows: embedding, first-order weight */
                    uint32_t ns = 0;
                    cr_assert_eq(mt_table_state_floats(ba->t, fid, &ns), MT_OK);
                    uint32_t t1, t2, c1, c2;
                    uint64_t v1, v2;
                    mt_err_t x1 = mt_table_get_row(ba->t, fid, ea, sa, ns, &t1, &c1, &v1);
                    mt_err_t x2 = mt_table_get_row(bb->t, fid, eb, sb, ns, &t2, &c2, &v2);
                    cr_assert_eq(x1, x2);
                    if (x1) continue;
                    uint32_t dim = 9;
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
}

static void destroy_pair(mt_trainer_t *a, mt_trainer_t *p, backend_t *ba, backend_t *bb) {
    mt_trainer_destroy(a);
    mt_trainer_destroy(p);
    mt_table_destroy(ba->t);
    mt_table_destroy(bb->t);
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
    same_parameters(&ba, &bb, a, p);
    destroy_pair(a, p, &ba, &bb);
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
        double t0 = mt_mono_s();
        cr_assert_eq(mt_trainer_train(tr, &b, 1, probs, &st), MT_OK, "step %d", i);
        double wall = mt_mono_s() - t0, sum = 0;
        cr_assert_eq(st.previous, i > 0);
        /* its phases: the apply's is handing it over and the wait for the one in flight; the
         * dense one local Adam */
        for (int k = 0; k < MT_TRAINER_NPHASES; k++) {
            cr_assert(st.seconds[k] > 0, "step %d, phase %s: %g s", i, mt_trainer_phase_name(k),
                      st.seconds[k]);
            sum += st.seconds[k];
        }
        cr_assert_leq(sum, wall);
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

/* The loop of mt/trainer.h: prefetch the next batch, train this one. */
Test(pipeline, prefetched_lookups_are_one_step_stale_exactly) {
    backend_t ba = {0}, bb = {0};
    mt_trainer_backend_t ia, ib;
    mt_trainer_t *a = make(&ba, &ia), *p = make(&bb, &ib);
    cr_assert_eq(mt_trainer_set_pipelined(p, 1), MT_OK);
    mt_batch_t bs[NB];
    for (int i = 0; i < NB; i++)
        batch_of(&bs[i], i);
    float probs[BS];
    for (int i = 0; i < NB; i++) {
        mt_trainer_step_t sa, sp;
        if (i + 1 < NB)
            cr_assert_eq(mt_trainer_prefetch(p, &bs[i + 1], 100 + (uint32_t)i + 1), MT_OK);
        cr_assert_eq(mt_trainer_train(a, &bs[i], 100 + (uint32_t)i, probs, &sa), MT_OK);
        cr_assert_eq(mt_trainer_train(p, &bs[i], 100 + (uint32_t)i, probs, &sp), MT_OK);
        cr_assert_eq(sp.previous, i > 0, "step %d confirms the one before", i);
        cr_assert_eq(sa.loss, sp.loss, "step %d: the same loss", i);
    }
    cr_assert_eq(mt_trainer_wait(p, NULL), MT_OK);
    cr_assert_eq(atomic_load(&bb.lookups), NB, "one lookup per batch: the prefetched ones");
    cr_assert_eq(atomic_load(&bb.applies), NB);
    /* batch 0 is looked up by its step, batch 1 prefetched before any apply was sent */
    cr_assert_eq(bb.seen[0], 0);
    for (int i = 1; i < NB; i++)
        cr_assert_eq(bb.seen[i], i - 1, "batch %d's lookup ran after %d applies, saw %d", i, i - 1,
                     bb.seen[i]);
    same_parameters(&ba, &bb, a, p);
    for (int i = 0; i < NB; i++)
        mt_batch_free(&bs[i]);
    destroy_pair(a, p, &ba, &bb);
}

/* The same loop over trainers' own tables (no backend): their steps hand the apply the rows
 * the lookup found (row hints), the prefetched lookups' from the pipeline thread, the
 * applies' copied for it; the parameters must again be the unpipelined ones. */
Test(pipeline, own_tables_pipelined_give_the_unpipelined_parameters) {
    mt_trainer_config_t tc;
    config(&tc);
    mt_trainer_t *a = NULL, *p = NULL;
    cr_assert_eq(mt_trainer_create(&tc, &a), MT_OK);
    cr_assert_eq(mt_trainer_create(&tc, &p), MT_OK);
    cr_assert_eq(mt_trainer_set_pipelined(p, 1), MT_OK);
    mt_batch_t bs[NB];
    for (int i = 0; i < NB; i++)
        batch_of(&bs[i], i);
    float probs[BS];
    for (int i = 0; i < NB; i++) {
        mt_trainer_step_t sa, sp;
        if (i + 1 < NB && i % 2) /* every other batch prefetched, the others looked up */
            cr_assert_eq(mt_trainer_prefetch(p, &bs[i + 1], 100 + (uint32_t)i + 1), MT_OK);
        cr_assert_eq(mt_trainer_train(a, &bs[i], 100 + (uint32_t)i, probs, &sa), MT_OK);
        cr_assert_eq(mt_trainer_train(p, &bs[i], 100 + (uint32_t)i, probs, &sp), MT_OK);
        cr_assert_eq(sa.loss, sp.loss, "step %d: the same loss", i);
    }
    cr_assert_eq(mt_trainer_wait(p, NULL), MT_OK);
    backend_t ba = {.t = mt_trainer_table(a)}, bb = {.t = mt_trainer_table(p)};
    same_parameters(&ba, &bb, a, p);
    for (int i = 0; i < NB; i++)
        mt_batch_free(&bs[i]);
    mt_trainer_destroy(a);
    mt_trainer_destroy(p);
}

Test(pipeline, prefetches_are_used_only_by_their_batch_one_step_later) {
    backend_t be = {0};
    mt_trainer_backend_t ifc;
    mt_trainer_t *tr = make(&be, &ifc);
    mt_batch_t b0, b1, b2;
    batch_of(&b0, 0);
    batch_of(&b1, 1);
    batch_of(&b2, 2);
    float probs[BS];
    mt_trainer_step_t st;
    cr_assert_eq(mt_trainer_prefetch(tr, &b1, 1), MT_INVALID, "the pipeline is off");
    cr_assert_eq(atomic_load(&be.lookups), 0);
    cr_assert_eq(mt_trainer_set_pipelined(tr, 1), MT_OK);
    /* two may wait; a third is refused with nothing looked up */
    cr_assert_eq(mt_trainer_prefetch(tr, &b1, 1), MT_OK);
    cr_assert_eq(mt_trainer_prefetch(tr, &b2, 1), MT_OK);
    cr_assert_eq(mt_trainer_prefetch(tr, &b0, 1), MT_LIMIT);
    /* an empty batch needs none and leaves them alone; scoring leaves them alone */
    mt_batch_t empty;
    uint16_t slots[NS] = {1, 2};
    cr_assert_eq(mt_batch_init(&empty, slots, NS), MT_OK);
    cr_assert_eq(mt_trainer_prefetch(tr, &empty, 1), MT_OK);
    cr_assert_eq(mt_trainer_train(tr, &empty, 1, probs, &st), MT_OK);
    cr_assert_eq(mt_trainer_predict(tr, &b0, probs), MT_OK);
    /* b0 was not prefetched: it looks itself up and leaves the prefetches alone */
    cr_assert_eq(mt_trainer_train(tr, &b0, 1, probs, &st), MT_OK);
    /* b2 one step after its prefetch: used; b1's, older, is dropped (both waited for) */
    cr_assert_eq(mt_trainer_train(tr, &b2, 1, probs, &st), MT_OK);
    cr_assert_eq(atomic_load(&be.lookups), 3, "b1's and b2's prefetches, b0's own");
    cr_assert_eq(mt_trainer_train(tr, &b1, 1, probs, &st), MT_OK);
    cr_assert_eq(atomic_load(&be.lookups), 4, "b1 again: its prefetch was dropped");
    /* the same batch changed since its prefetch: dropped (waited for), looked up afresh */
    cr_assert_eq(mt_trainer_prefetch(tr, &b0, 1), MT_OK);
    mt_batch_free(&b0);
    batch_of(&b0, 4);
    cr_assert_eq(mt_trainer_train(tr, &b0, 1, probs, &st), MT_OK);
    cr_assert_eq(atomic_load(&be.lookups), 6);
    /* two steps between a prefetch and its batch: too stale, looked up afresh */
    cr_assert_eq(mt_trainer_prefetch(tr, &b1, 1), MT_OK);
    cr_assert_eq(mt_trainer_train(tr, &b2, 1, probs, &st), MT_OK);
    cr_assert_eq(mt_trainer_train(tr, &b0, 1, probs, &st), MT_OK);
    cr_assert_eq(mt_trainer_train(tr, &b1, 1, probs, &st), MT_OK);
    cr_assert_eq(atomic_load(&be.lookups), 10);
    /* slots of another model are refused at the prefetch */
    mt_batch_t other;
    uint16_t oslots[1] = {7};
    cr_assert_eq(mt_batch_init(&other, oslots, 1), MT_OK);
    uint64_t f = MT_FID_MAKE(7, 1);
    const uint64_t *fp[1] = {&f};
    uint32_t c[1] = {1};
    cr_assert_eq(mt_batch_add(&other, 1.0f, 0, 1, fp, c), MT_OK);
    cr_assert_eq(mt_trainer_prefetch(tr, &other, 1), MT_MISMATCH);
    cr_assert_eq(atomic_load(&be.lookups), 10);
    cr_assert_eq(mt_trainer_wait(tr, NULL), MT_OK);
    cr_assert_eq(atomic_load(&be.applies), 7);
    /* a prefetch left waiting is dropped by turning the pipeline off, and by destroy */
    cr_assert_eq(mt_trainer_prefetch(tr, &b0, 1), MT_OK);
    cr_assert_eq(mt_trainer_set_pipelined(tr, 0), MT_OK);
    cr_assert_eq(mt_trainer_set_pipelined(tr, 1), MT_OK);
    cr_assert_eq(mt_trainer_prefetch(tr, &b1, 1), MT_OK);
    mt_trainer_destroy(tr);
    cr_assert_eq(atomic_load(&be.lookups), 12);
    mt_batch_free(&b0);
    mt_batch_free(&b1);
    mt_batch_free(&b2);
    mt_batch_free(&empty);
    mt_batch_free(&other);
    mt_table_destroy(be.t);
}

Test(pipeline, a_failed_prefetched_lookup_comes_back_from_its_step) {
    backend_t be = {0};
    mt_trainer_backend_t ifc;
    mt_trainer_t *tr = make(&be, &ifc);
    be.fail_lookup_at = 2; /* b1's prefetch (b0 looks itself up first) */
    cr_assert_eq(mt_trainer_set_pipelined(tr, 1), MT_OK);
    mt_batch_t bs[4];
    for (int i = 0; i < 4; i++)
        batch_of(&bs[i], i);
    float probs[BS];
    mt_trainer_step_t st;
    cr_assert_eq(mt_trainer_train(tr, &bs[0], 1, probs, &st), MT_OK); /* its own lookup */
    cr_assert_eq(mt_trainer_prefetch(tr, &bs[1], 1), MT_OK);
    cr_assert_eq(mt_trainer_prefetch(tr, &bs[2], 1), MT_OK);
    cr_assert_eq(mt_trainer_train(tr, &bs[1], 1, probs, &st), MT_UNAVAILABLE);
    cr_assert_eq(st.previous, 1, "b0's apply was confirmed all the same");
    cr_assert_eq(atomic_load(&be.applies), 1, "b1 sent nothing");
    /* b2's prefetch was dropped with the error: b2 looks itself up */
    int before = atomic_load(&be.lookups);
    cr_assert_eq(before, 3);
    cr_assert_eq(mt_trainer_train(tr, &bs[2], 1, probs, &st), MT_OK);
    cr_assert_eq(st.previous, 0, "nothing was in flight");
    cr_assert_eq(atomic_load(&be.lookups), before + 1);
    cr_assert_eq(mt_trainer_wait(tr, NULL), MT_OK);
    cr_assert_eq(atomic_load(&be.applies), 2);
    for (int i = 0; i < 4; i++)
        mt_batch_free(&bs[i]);
    mt_trainer_destroy(tr);
    mt_table_destroy(be.t);
}
