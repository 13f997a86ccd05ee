/*
 * test_gen_request.c - the generator as a live environment (mt/gen.h, "requests"): drawing a
 * user and a page of candidates at any time, and the true probability of any pair.
 *
 * Why: the closed loop (monolith-loadgen) draws its clicks from these functions and judges
 * serving against them; if they disagreed with the stream the trainer learned from, the
 * loop would measure the wrong thing.
 *
 * What is covered:
 *  - consistency with the stream: for stream examples, mt_gen_true_p() of their (user, item,
 *    timestamp) is the stream's true probability, and mt_gen_user_fids()/mt_gen_item_fids()
 *    are exactly the batch's fids;
 *  - requests: deterministic in (index, time), distinct candidates, every id alive at the
 *    request's time, a page as large as the live population, the stream position untouched;
 *  - popularity: the most drawn candidate over many requests is far above uniform;
 *  - drift: a pair's probability moves with time;
 *  - errors: NULL arguments, k above the population, a time before the start.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "mt/gen.h"

#define FID_VALUE(f) ((f)&0xFFFFFFFFFFFFull)

static mt_gen_t *make(const mt_gen_config_t *cfg) {
    mt_gen_t *g = NULL;
    cr_assert_eq(mt_gen_create(cfg, &g), MT_OK);
    return g;
}

static void small_config(mt_gen_config_t *cfg) {
    mt_gen_config_init(cfg);
    cfg->num_users = 500;
    cfg->num_items = 300;
    cfg->users_born_per_s = 0.5;
    cfg->items_born_per_s = 2;
    cfg->item_half_life_s = 100;
    cfg->drift_period_s = 3600;
    cfg->seed = 7;
}

Test(gen_request, agrees_with_the_stream) {
    mt_gen_config_t cfg;
    small_config(&cfg);
    mt_gen_t *g = make(&cfg);
    mt_batch_t b;
    memset(&b, 0, sizeof(b));
    enum { N = 3000 };
    static float p[N];
    cr_assert_eq(mt_gen_next(g, &b, N, p), MT_OK);
    for (size_t i = 0; i < N; i++) {
        size_t cnt;
        const uint64_t *uf = mt_batch_fids(&b, i, 0, &cnt);
        const uint64_t *itf = mt_batch_fids(&b, i, 1, &cnt);
        uint64_t user = FID_VALUE(uf[0]), item = FID_VALUE(itf[0]);
        double q;
        cr_assert_eq(mt_gen_true_p(g, user, item, b.timestamps_ms[i], &q), MT_OK);
        cr_assert(fabs(q - p[i]) < 1e-6, "example %zu: %g vs %g", i, q, (double)p[i]);

        uint64_t ufids[MT_GEN_USER_FIDS], ifids[MT_GEN_MAX_ITEM_FIDS];
        mt_gen_user_fids(g, user, b.timestamps_ms[i], ufids);
        size_t ni = mt_gen_item_fids(g, item, ifids);
        /* batch slots in order: user, item, segment, category, hour, tags */
        cr_assert_eq(ufids[0], mt_batch_fids(&b, i, 0, &cnt)[0]);
        cr_assert_eq(ufids[1], mt_batch_fids(&b, i, 2, &cnt)[0]);
        cr_assert_eq(ufids[2], mt_batch_fids(&b, i, 4, &cnt)[0]);
        cr_assert_eq(ifids[0], mt_batch_fids(&b, i, 1, &cnt)[0]);
        cr_assert_eq(ifids[1], mt_batch_fids(&b, i, 3, &cnt)[0]);
        const uint64_t *tags = mt_batch_fids(&b, i, 5, &cnt);
        cr_assert_eq(ni, 2 + cnt);
        cr_assert_eq(memcmp(ifids + 2, tags, cnt * sizeof(uint64_t)), 0);
    }
    mt_batch_free(&b);
    mt_gen_destroy(g);
}

/* With sequences (slot 7): the batch's recent clicks are mt_gen_user_sequence()'s, the true
 * probability of a pair counts them as the stream does, a user's clicks are the same within
 * a window and move across windows; and they carry signal: an item among the user's recent
 * clicks is clicked far more often than one that is not (the nearest behaviour's term). */
Test(gen_request, sequences_agree_with_the_stream_and_carry_the_interest) {
    mt_gen_config_t cfg;
    small_config(&cfg);
    cfg.sequence_length = 5;
    cfg.num_items = 60;
    cfg.items_born_per_s = 0;
    cfg.item_half_life_s = 0;
    cfg.events_per_s = 10; /* N examples span windows */
    mt_gen_t *g = make(&cfg);
    cr_assert_eq(mt_gen_nslots(g), 7);
    mt_batch_t b;
    memset(&b, 0, sizeof(b));
    enum { N = 20000 };
    static float p[N];
    cr_assert_eq(mt_gen_next(g, &b, N, p), MT_OK);
    cr_assert_eq(b.nslots, 7);
    cr_assert_eq(b.slot_ids[6], MT_GEN_SLOT_SEQUENCE);
    double clicks[2] = {0}, shown[2] = {0};
    for (size_t i = 0; i < N; i++) {
        size_t cnt;
        uint64_t user = FID_VALUE(mt_batch_fids(&b, i, 0, &cnt)[0]);
        uint64_t item = FID_VALUE(mt_batch_fids(&b, i, 1, &cnt)[0]);
        const uint64_t *seq = mt_batch_fids(&b, i, 6, &cnt);
        cr_assert_eq(cnt, 5);
        uint64_t want[MT_GEN_MAX_SEQUENCE];
        cr_assert_eq(mt_gen_user_sequence(g, user, b.timestamps_ms[i], want), 5);
        cr_assert_eq(memcmp(seq, want, 5 * sizeof(uint64_t)), 0, "example %zu", i);
        double q;
        cr_assert_eq(mt_gen_true_p(g, user, item, b.timestamps_ms[i], &q), MT_OK);
        cr_assert(fabs(q - p[i]) < 1e-6, "example %zu: %g vs %g", i, q, (double)p[i]);
        int in = 0;
        for (size_t j = 0; j < cnt; j++)
            in |= FID_VALUE(seq[j]) == item && seq[j] >> 48 == MT_GEN_SLOT_SEQUENCE;
        clicks[in] += b.labels[i];
        shown[in]++;
    }
    int64_t t0 = cfg.start_time_ms;
    uint64_t a[MT_GEN_MAX_SEQUENCE], c[MT_GEN_MAX_SEQUENCE], d[MT_GEN_MAX_SEQUENCE];
    mt_gen_user_sequence(g, 3, t0 + 1000, a);
    mt_gen_user_sequence(g, 3, t0 + 599000, c);  /* the same 10-minute window */
    mt_gen_user_sequence(g, 3, t0 + 1201000, d); /* another */
    cr_expect_eq(memcmp(a, c, sizeof(uint64_t) * 5), 0);
    cr_expect_neq(memcmp(a, d, sizeof(uint64_t) * 5), 0);
    cr_assert(shown[1] > 100, "%g examples of an item among the recent clicks", shown[1]);
    double in_ctr = clicks[1] / shown[1], out_ctr = clicks[0] / shown[0];
    cr_expect(in_ctr > 2 * out_ctr, "CTR %g among the recent clicks, %g otherwise", in_ctr,
              out_ctr);
    mt_batch_free(&b);
    mt_gen_destroy(g);
}

Test(gen_request, requests) {
    mt_gen_config_t cfg;
    small_config(&cfg);
    mt_gen_t *g = make(&cfg);
    int64_t t0 = cfg.start_time_ms + 50000; /* 50 s: 100 items and 25 users born */
    uint64_t u1, u2, a[100], b[100];
    cr_assert_eq(mt_gen_draw_request(g, 17, t0, 100, &u1, a), MT_OK);
    cr_assert_eq(mt_gen_draw_request(g, 17, t0, 100, &u2, b), MT_OK);
    cr_assert_eq(u1, u2);
    cr_assert_eq(memcmp(a, b, sizeof(a)), 0);
    cr_assert_eq(mt_gen_draw_request(g, 18, t0, 100, &u2, b), MT_OK);
    cr_assert(memcmp(a, b, sizeof(a)) != 0, "another index, another page");
    for (size_t i = 0; i < 100; i++) {
        cr_assert(a[i] >= 100 && a[i] < 100 + cfg.num_items, "item %llu not alive",
                  (unsigned long long)a[i]);
        for (size_t j = 0; j < i; j++)
            cr_assert_neq(a[i], a[j], "candidates must be distinct");
    }
    cr_assert(u1 >= 25 && u1 < 25 + cfg.num_users);

    /* a page of the whole live population: every live item exactly once */
    static uint64_t all[300];
    cr_assert_eq(mt_gen_draw_request(g, 1, t0, 300, &u1, all), MT_OK);
    static uint8_t seen[300];
    for (size_t i = 0; i < 300; i++) {
        cr_assert(all[i] >= 100 && all[i] < 400);
        cr_assert_eq(seen[all[i] - 100], 0);
        seen[all[i] - 100] = 1;
    }
    cr_assert_eq(mt_gen_position(g), 0, "requests do not move the stream");

    /* popularity: over 2,000 requests of 10, the top item far above uniform (10/300) */
    static uint32_t hits[1000];
    for (uint64_t r = 0; r < 2000; r++) {
        uint64_t page[10];
        cr_assert_eq(mt_gen_draw_request(g, r, t0, 10, &u1, page), MT_OK);
        for (size_t i = 0; i < 10; i++)
            hits[page[i] - 100]++;
    }
    uint32_t top = 0;
    for (size_t i = 0; i < 300; i++)
        top = hits[i] > top ? hits[i] : top;
    cr_assert(top > 3 * 2000 * 10 / 300, "top item drawn %u times", top);
    mt_gen_destroy(g);
}

Test(gen_request, drift_moves_a_pair) {
    mt_gen_config_t cfg;
    small_config(&cfg);
    cfg.daily_amplitude = 0; /* only drift moves p */
    mt_gen_t *g = make(&cfg);
    double moved = 0;
    for (uint64_t u = 0; u < 20; u++) {
        double p0, p1, p2;
        cr_assert_eq(mt_gen_true_p(g, u, 5, cfg.start_time_ms, &p0), MT_OK);
        cr_assert_eq(mt_gen_true_p(g, u, 5, cfg.start_time_ms + 1800000, &p1), MT_OK);
        cr_assert_eq(mt_gen_true_p(g, u, 5, cfg.start_time_ms + 3600000, &p2), MT_OK);
        cr_assert(fabs(p0 - p2) < 1e-9, "a full turn comes back");
        moved += fabs(p0 - p1);
    }
    cr_assert(moved > 0.01, "half a turn moves probabilities (sum %g)", moved);
    mt_gen_destroy(g);
}

Test(gen_request, errors) {
    mt_gen_config_t cfg;
    small_config(&cfg);
    mt_gen_t *g = make(&cfg);
    uint64_t u, items[4];
    double p;
    int64_t t = cfg.start_time_ms;
    cr_assert_eq(mt_gen_draw_request(NULL, 0, t, 4, &u, items), MT_INVALID);
    cr_assert_eq(mt_gen_draw_request(g, 0, t, 4, NULL, items), MT_INVALID);
    cr_assert_eq(mt_gen_draw_request(g, 0, t, 4, &u, NULL), MT_INVALID);
    cr_assert_eq(mt_gen_draw_request(g, 0, t, 301, &u, items), MT_INVALID);
    cr_assert_eq(mt_gen_draw_request(g, 0, t - 1, 4, &u, items), MT_LIMIT);
    cr_assert_eq(mt_gen_draw_request(g, 0, t, 0, &u, NULL), MT_OK);
    cr_assert_eq(mt_gen_true_p(NULL, 1, 1, t, &p), MT_INVALID);
    cr_assert_eq(mt_gen_true_p(g, 1, 1, t, NULL), MT_INVALID);
    cr_assert_eq(mt_gen_true_p(g, 1ull << 48, 1, t, &p), MT_INVALID);
    cr_assert_eq(mt_gen_true_p(g, 1, 1, t - 1, &p), MT_LIMIT);
    cr_assert_eq(mt_gen_time_ms(g, 1000), t + 1000); /* 1000 events/s */
    mt_gen_destroy(g);
}
