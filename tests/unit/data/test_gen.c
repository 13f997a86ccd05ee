/*
 * test_gen.c - the synthetic click stream (mt/gen.h).
 *
 * Why: the generator is the yardstick of the trainer ("AUC close to the ground-truth model's")
 * and the source of every large-scale benchmark, so it must be reproducible, hit its configured
 * CTR, carry a learnable signal, and keep its promises on popularity, births and memory.
 *
 * What is covered:
 *  - config defaults, every kind of bad field (MT_CONFIG with a message), bad arguments;
 *  - determinism: one seed gives byte-identical batches however the stream is cut into calls
 *    (and after a seek); another seed gives another stream;
 *  - the shape of examples: slots, fid slot bits, one fid per single-valued slot, 1..max_tags
 *    tags, hour = hour of the timestamp, side features fixed per id, sample rate 1, clock;
 *  - CTR within 10% of the target over 200k examples (two targets);
 *  - the ground-truth AUC (exact, from the true probabilities and the labels) above 0.7;
 *  - Zipf: the top item's share is 1 / H(N, e) within 10%, the second's is 2^-e of it;
 *  - births: every id lies in its live window, most ids of the last 10% of a long stream were
 *    never seen in the first 10%, and the oldest ids are gone;
 *  - drift: the daily cycle moves the true probability by hour; item vectors turn with
 *    period drift_period_s (one user-item pair: p moves and comes back after a turn);
 *  - memory: a 100M-id config generates without growing the resident set (no per-id arrays);
 *  - MT_LIMIT when births would overflow 48 bits; MT_MISMATCH on a foreign batch.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt/gen.h"

#define FID_VALUE(f) ((f)&0xFFFFFFFFFFFFull)
#define FID_SLOT(f)  ((uint16_t)((f) >> 48))

static mt_gen_t *make(const mt_gen_config_t *cfg) {
    mt_gen_t *g = NULL;
    cr_assert_eq(mt_gen_create(cfg, &g), MT_OK);
    cr_assert_not_null(g);
    return g;
}

/* The single fid value of example i, slot index s. */
static uint64_t one_value(const mt_batch_t *b, size_t i, uint32_t s) {
    size_t c;
    const uint64_t *f = mt_batch_fids(b, i, s, &c);
    cr_assert_eq(c, 1, "example %zu slot %u has %zu fids", i, s, c);
    return FID_VALUE(f[0]);
}

/* ---------------- exact AUC ---------------- */

typedef struct scored {
    float p;
    float label;
} scored_t;

static int cmp_scored(const void *a, const void *b) {
    float x = ((const scored_t *)a)->p, y = ((const scored_t *)b)->p;
    return x < y ? -1 : x > y;
}

/* Mann-Whitney: ties get their average rank. */
static double exact_auc(const float *p, const float *labels, size_t n) {
    scored_t *s = malloc(n * sizeof(*s));
    cr_assert_not_null(s);
    for (size_t i = 0; i < n; i++)
        s[i] = (scored_t){p[i], labels[i]};
    qsort(s, n, sizeof(*s), cmp_scored);
    double pos = 0, rank_sum = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        double npos = 0;
        while (j < n && s[j].p == s[i].p)
            npos += s[j++].label;
        rank_sum += npos * (0.5 * (double)(i + 1 + j)); /* ranks i+1..j, averaged */
        pos += npos;
        i = j;
    }
    free(s);
    double neg = (double)n - pos;
    cr_assert(pos > 0 && neg > 0);
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

Test(gen, exact_auc_helper) {
    float p[] = {0.1f, 0.4f, 0.35f, 0.8f}, l[] = {0, 0, 1, 1};
    cr_assert_float_eq(exact_auc(p, l, 4), 0.75, 1e-12);
    float pt[] = {0.5f, 0.5f, 0.5f}, lt[] = {1, 0, 0};
    cr_assert_float_eq(exact_auc(pt, lt, 3), 0.5, 1e-12);
}

/* ---------------- config ---------------- */

Test(gen, config_defaults_and_errors) {
    mt_gen_config_t cfg;
    char err[256];
    mt_gen_config_init(&cfg);
    cr_assert_eq(mt_gen_config_validate(&cfg, err, sizeof(err)), MT_OK);
    cr_assert_eq(cfg.latent_dim, 8);
    cr_assert_float_eq(cfg.target_ctr, 0.05, 1e-12);

#define EXPECT_BAD(field, value, word)                                                  \
    do {                                                                                \
        mt_gen_config_t c2 = cfg;                                                       \
        c2.field = value;                                                               \
        err[0] = 0;                                                                     \
        cr_assert_eq(mt_gen_config_validate(&c2, err, sizeof(err)), MT_CONFIG, #field); \
        cr_assert(strstr(err, word), "message for " #field ": %s", err);                \
        mt_gen_t *g2 = (mt_gen_t *)1;                                                   \
        cr_assert_eq(mt_gen_create(&c2, &g2), MT_CONFIG);                               \
        cr_assert_eq(g2, (mt_gen_t *)1, "out must stay untouched");                     \
    } while (0)
    EXPECT_BAD(num_users, 0, "num_users");
    EXPECT_BAD(num_items, (1ull << 40) + 1, "num_items");
    EXPECT_BAD(user_zipf_exponent, 0, "user_zipf_exponent");
    EXPECT_BAD(item_zipf_exponent, NAN, "item_zipf_exponent");
    EXPECT_BAD(items_born_per_s, -1, "items_born_per_s");
    EXPECT_BAD(users_born_per_s, INFINITY, "users_born_per_s");
    EXPECT_BAD(item_half_life_s, -5, "item_half_life_s");
    EXPECT_BAD(num_user_segments, 0, "num_user_segments");
    EXPECT_BAD(num_item_categories, 0, "num_item_categories");
    EXPECT_BAD(num_tags, 0, "num_tags");
    EXPECT_BAD(max_tags, 65, "max_tags");
    EXPECT_BAD(latent_dim, 0, "latent_dim");
    EXPECT_BAD(latent_dim, 65, "latent_dim");
    EXPECT_BAD(target_ctr, 1.0, "target_ctr");
    EXPECT_BAD(target_ctr, 0.0, "target_ctr");
    EXPECT_BAD(bias_scale, -0.1, "bias_scale");
    EXPECT_BAD(interaction_scale, NAN, "interaction_scale");
    EXPECT_BAD(daily_amplitude, -1, "daily_amplitude");
    EXPECT_BAD(drift_period_s, -1, "drift_period_s");
    EXPECT_BAD(events_per_s, 0, "events_per_s");
    EXPECT_BAD(start_time_ms, -1, "start_time_ms");
#undef EXPECT_BAD
    /* a half-life needs births */
    mt_gen_config_t c3 = cfg;
    c3.items_born_per_s = 0;
    cr_assert_eq(mt_gen_config_validate(&c3, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "item_half_life_s"), "%s", err);
    cr_assert_eq(mt_gen_config_validate(&c3, NULL, 0), MT_CONFIG);

    mt_gen_t *g = NULL;
    cr_assert_eq(mt_gen_create(NULL, &g), MT_INVALID);
    cr_assert_eq(mt_gen_create(&cfg, NULL), MT_INVALID);
    cr_assert_eq(mt_gen_config_validate(NULL, err, sizeof(err)), MT_CONFIG);
    mt_gen_destroy(NULL);
}

/* ---------------- determinism ---------------- */

static void assert_same_batch(const mt_batch_t *a, size_t off, const mt_batch_t *b) {
    /* b's examples equal a's examples off .. off + b->n */
    for (size_t i = 0; i < b->n; i++) {
        cr_assert_eq(a->labels[off + i], b->labels[i], "label %zu", i);
        cr_assert_eq(a->timestamps_ms[off + i], b->timestamps_ms[i], "ts %zu", i);
        cr_assert_eq(a->sample_rates[off + i], b->sample_rates[i]);
        for (uint32_t s = 0; s < MT_GEN_NSLOTS; s++) {
            size_t ca, cb;
            const uint64_t *fa = mt_batch_fids(a, off + i, s, &ca);
            const uint64_t *fb = mt_batch_fids(b, i, s, &cb);
            cr_assert_eq(ca, cb, "count %zu/%u", i, s);
            cr_assert_eq(memcmp(fa, fb, ca * sizeof(uint64_t)), 0, "fids %zu/%u", i, s);
        }
    }
}

Test(gen, determinism) {
    mt_gen_config_t cfg;
    mt_gen_config_init(&cfg);
    cfg.seed = 7;
    mt_gen_t *g1 = make(&cfg), *g2 = make(&cfg);
    cr_assert_eq(mt_gen_global_bias(g1), mt_gen_global_bias(g2));
    mt_batch_t whole = {0}, part = {0};
    float pw[4000], pp[4000];
    cr_assert_eq(mt_gen_next(g1, &whole, 4000, pw), MT_OK);
    cr_assert_eq(whole.n, 4000);
    cr_assert_eq(mt_gen_position(g1), 4000);

    /* g2 produces the same stream in pieces of 1000, 1500, 1500 */
    size_t off = 0, sizes[] = {1000, 1500, 1500};
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(mt_gen_next(g2, &part, sizes[k], pp), MT_OK);
        cr_assert_eq(part.n, sizes[k]);
        assert_same_batch(&whole, off, &part);
        cr_assert_eq(memcmp(pw + off, pp, sizes[k] * sizeof(float)), 0);
        off += sizes[k];
    }
    /* a seek replays */
    mt_gen_seek(g2, 2500);
    cr_assert_eq(mt_gen_next(g2, &part, 1500, pp), MT_OK);
    assert_same_batch(&whole, 2500, &part);

    /* another seed: another stream (ids and labels) */
    cfg.seed = 8;
    mt_gen_t *g3 = make(&cfg);
    cr_assert_neq(mt_gen_global_bias(g1), mt_gen_global_bias(g3));
    cr_assert_eq(mt_gen_next(g3, &part, 4000, pp), MT_OK);
    size_t same_item = 0, same_user = 0;
    for (size_t i = 0; i < 4000; i++) {
        same_user += one_value(&whole, i, 0) == one_value(&part, i, 0);
        same_item += one_value(&whole, i, 1) == one_value(&part, i, 1);
        cr_assert_eq(whole.timestamps_ms[i], part.timestamps_ms[i]); /* the clock is no seed's */
    }
    cr_assert_lt(same_user, 400, "%zu of 4000 users equal across seeds", same_user);
    cr_assert_lt(same_item, 400, "%zu of 4000 items equal across seeds", same_item);
    mt_batch_free(&whole);
    mt_batch_free(&part);
    mt_gen_destroy(g1);
    mt_gen_destroy(g2);
    mt_gen_destroy(g3);
}

/* ---------------- shape ---------------- */

Test(gen, example_shape) {
    mt_gen_config_t cfg;
    mt_gen_config_init(&cfg);
    cfg.num_users = 500; /* small: ids repeat, so per-id features can be compared */
    cfg.num_items = 500;
    cfg.users_born_per_s = 0;
    cfg.items_born_per_s = 0;
    cfg.item_half_life_s = 0;
    cfg.events_per_s = 0.2; /* 20000 examples span 100000 s: every hour */
    mt_gen_t *g = make(&cfg);
    mt_batch_t b = {0};
    size_t n = 20000;
    float *p = malloc(n * sizeof(float));
    cr_assert_eq(mt_gen_next(g, &b, n, p), MT_OK);
    cr_assert_eq(b.nslots, MT_GEN_NSLOTS);
    for (uint32_t s = 0; s < MT_GEN_NSLOTS; s++)
        cr_assert_eq(b.slot_ids[s], s + 1);
    uint64_t seg_of[500], cat_of[500];
    memset(seg_of, 0xFF, sizeof(seg_of));
    memset(cat_of, 0xFF, sizeof(cat_of));
    int hours_seen[24] = {0};
    for (size_t i = 0; i < n; i++) {
        for (uint32_t s = 0; s < MT_GEN_NSLOTS; s++) {
            size_t c;
            const uint64_t *f = mt_batch_fids(&b, i, s, &c);
            for (size_t k = 0; k < c; k++)
                cr_assert_eq(FID_SLOT(f[k]), s + 1);
            if (s == 5) {
                cr_assert(c >= 1 && c <= 3, "tags %zu", c);
                for (size_t k = 0; k < c; k++)
                    cr_assert_lt(FID_VALUE(f[k]), 1000);
            }
        }
        uint64_t u = one_value(&b, i, 0), it = one_value(&b, i, 1);
        uint64_t seg = one_value(&b, i, 2), cat = one_value(&b, i, 3), hour = one_value(&b, i, 4);
        cr_assert_lt(u, 500);
        cr_assert_lt(it, 500);
        cr_assert_lt(seg, 16);
        cr_assert_lt(cat, 64);
        if (seg_of[u] == UINT64_MAX) seg_of[u] = seg;
        if (cat_of[it] == UINT64_MAX) cat_of[it] = cat;
        cr_assert_eq(seg_of[u], seg, "user %llu changed segment", (unsigned long long)u);
        cr_assert_eq(cat_of[it], cat, "item %llu changed category", (unsigned long long)it);
        int64_t ts = b.timestamps_ms[i];
        cr_assert_eq(ts, cfg.start_time_ms + (int64_t)i * 5000);
        cr_assert_eq(hour, (uint64_t)((ts / 3600000) % 24));
        hours_seen[hour] = 1;
        cr_assert_eq(b.sample_rates[i], 1.0f);
        cr_assert(b.labels[i] == 0.0f || b.labels[i] == 1.0f);
        cr_assert(p[i] > 0 && p[i] < 1);
    }
    for (int h = 0; h < 24; h++)
        cr_assert(hours_seen[h], "hour %d never seen", h);
    /* with max_tags 0 the tag slot is empty */
    cfg.max_tags = 0;
    mt_gen_t *g0 = make(&cfg);
    cr_assert_eq(mt_gen_next(g0, &b, 100, NULL), MT_OK);
    for (size_t i = 0; i < 100; i++) {
        size_t c;
        mt_batch_fids(&b, i, 5, &c);
        cr_assert_eq(c, 0);
    }
    /* n = 0: an empty batch */
    cr_assert_eq(mt_gen_next(g0, &b, 0, NULL), MT_OK);
    cr_assert_eq(b.n, 0);
    free(p);
    mt_batch_free(&b);
    mt_gen_destroy(g);
    mt_gen_destroy(g0);
}

/* ---------------- CTR and AUC ---------------- */

static void ctr_case(double target, uint64_t seed) {
    mt_gen_config_t cfg;
    mt_gen_config_init(&cfg);
    cfg.seed = seed;
    cfg.target_ctr = target;
    cfg.daily_amplitude = 0; /* 200k examples span 200 s: one phase of the day only */
    mt_gen_t *g = make(&cfg);
    mt_batch_t b = {0};
    size_t n = 200000;
    float *p = malloc(n * sizeof(float));
    cr_assert_eq(mt_gen_next(g, &b, n, p), MT_OK);
    double clicks = 0, psum = 0;
    for (size_t i = 0; i < n; i++) {
        clicks += b.labels[i];
        psum += p[i];
    }
    double ctr = clicks / (double)n, mean_p = psum / (double)n;
    cr_log_info("target %.3f: ctr %.4f, mean p %.4f, b0 %.3f", target, ctr, mean_p,
                mt_gen_global_bias(g));
    cr_assert(fabs(ctr - target) < 0.1 * target, "ctr %.4f vs target %.4f", ctr, target);
    cr_assert(fabs(mean_p - target) < 0.1 * target, "mean p %.4f vs %.4f", mean_p, target);
    free(p);
    mt_batch_free(&b);
    mt_gen_destroy(g);
}

Test(gen, ctr_matches_target) {
    ctr_case(0.05, 1);
    ctr_case(0.10, 2);
}

Test(gen, ground_truth_auc) {
    mt_gen_config_t cfg;
    mt_gen_config_init(&cfg);
    mt_gen_t *g = make(&cfg);
    mt_batch_t b = {0};
    size_t n = 200000;
    float *p = malloc(n * sizeof(float));
    cr_assert_eq(mt_gen_next(g, &b, n, p), MT_OK);
    double auc = exact_auc(p, b.labels, n);
    cr_log_info("ground-truth AUC %.4f", auc);
    cr_assert_gt(auc, 0.7, "ground-truth AUC %.4f", auc);
    cr_assert_lt(auc, 0.95, "ground-truth AUC %.4f: too easy to be a benchmark", auc);
    /* without any signal the true probability is constant: AUC 0.5 */
    cfg.bias_scale = 0;
    cfg.interaction_scale = 0;
    cfg.daily_amplitude = 0;
    mt_gen_t *flat = make(&cfg);
    cr_assert_eq(mt_gen_next(flat, &b, 20000, p), MT_OK);
    cr_assert_float_eq(exact_auc(p, b.labels, 20000), 0.5, 1e-12);
    cr_assert_float_eq(p[0], 0.05, 1e-6);
    free(p);
    mt_batch_free(&b);
    mt_gen_destroy(g);
    mt_gen_destroy(flat);
}

/* ---------------- popularity ---------------- */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

Test(gen, zipf_top_share) {
    mt_gen_config_t cfg;
    mt_gen_config_init(&cfg);
    cfg.num_items = 10000;
    cfg.item_zipf_exponent = 1.05;
    cfg.items_born_per_s = 0;
    cfg.item_half_life_s = 0;
    mt_gen_t *g = make(&cfg);
    mt_batch_t b = {0};
    size_t n = 200000;
    cr_assert_eq(mt_gen_next(g, &b, n, NULL), MT_OK);
    uint64_t *ids = malloc(n * sizeof(uint64_t));
    for (size_t i = 0; i < n; i++)
        ids[i] = one_value(&b, i, 1);
    qsort(ids, n, sizeof(uint64_t), cmp_u64);
    size_t best = 0, second = 0;
    uint64_t best_id = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && ids[j] == ids[i])
            j++;
        if (j - i > best) {
            second = best;
            best = j - i;
            best_id = ids[i];
        } else if (j - i > second) {
            second = j - i;
        }
        i = j;
    }
    double h = 0;
    for (int k = 1; k <= 10000; k++)
        h += pow(k, -1.05);
    double expect = 1 / h, share = (double)best / (double)n;
    cr_log_info("top item %llu: share %.4f, expected %.4f", (unsigned long long)best_id, share,
                expect);
    cr_assert(fabs(share - expect) < 0.1 * expect, "top share %.4f vs %.4f", share, expect);
    double ratio = (double)second / (double)best;
    cr_assert(fabs(ratio - pow(2, -1.05)) < 0.05, "second/first %.3f", ratio);
    cr_assert_neq(best_id, 0, "popularity is scrambled over ids, not id 0 first");
    free(ids);
    mt_batch_free(&b);
    mt_gen_destroy(g);
}

Test(gen, ids_are_born_and_fade) {
    mt_gen_config_t cfg;
    mt_gen_config_init(&cfg);
    cfg.num_items = 10000;
    cfg.items_born_per_s = 100; /* 200k examples at 1000/s = 200 s = 20000 births: 2 windows */
    cfg.item_half_life_s = 30;
    cfg.num_users = 10000;
    cfg.users_born_per_s = 100;
    mt_gen_t *g = make(&cfg);
    mt_batch_t b = {0};
    size_t n = 200000, tenth = n / 10;
    cr_assert_eq(mt_gen_next(g, &b, n, NULL), MT_OK);
    uint64_t *first = malloc(tenth * sizeof(uint64_t));
    double age_sum = 0;
    for (size_t i = 0; i < n; i++) {
        double t = (double)(b.timestamps_ms[i] - cfg.start_time_ms) / 1000.0;
        uint64_t lo = (uint64_t)floor(100 * t);
        for (uint32_t s = 0; s < 2; s++) {
            uint64_t id = one_value(&b, i, s);
            cr_assert(id >= lo && id < lo + 10000,
                      "example %zu slot %u: id %llu outside [%llu, +N)", i, s,
                      (unsigned long long)id, (unsigned long long)lo);
        }
        if (i < tenth) first[i] = one_value(&b, i, 1);
        /* items: age = t - (id + 1 - N) / rate */
        age_sum += t - ((double)one_value(&b, i, 1) + 1 - 10000) / 100;
    }
    qsort(first, tenth, sizeof(uint64_t), cmp_u64);
    size_t last_new = 0;
    for (size_t i = n - tenth; i < n; i++) {
        uint64_t id = one_value(&b, i, 1);
        if (!bsearch(&id, first, tenth, sizeof(uint64_t), cmp_u64)) last_new++;
    }
    /* the last 10% (t in 180..200 s, window [18000, 30000)) share no id with the first 10%
     * (window within [0, 12000)) except through the overlap [18000, 12000) = none */
    cr_assert_eq(last_new, tenth, "%zu of %zu late items were seen early", tenth - last_new, tenth);
    /* popularity decays with age: the mean age is far below the uniform 50 s (lifetime 100 s) */
    double mean_age = age_sum / (double)n;
    cr_log_info("mean item age %.1f s", mean_age);
    cr_assert_lt(mean_age, 45, "mean item age %.1f s", mean_age);
    free(first);
    mt_batch_free(&b);
    mt_gen_destroy(g);
}

/* ---------------- drift ---------------- */

Test(gen, daily_cycle) {
    mt_gen_config_t cfg;
    mt_gen_config_init(&cfg);
    cfg.daily_amplitude = 1.0;
    cfg.events_per_s = 1; /* 86400 examples: one day */
    cfg.start_time_ms = 0;
    mt_gen_t *g = make(&cfg);
    mt_batch_t b = {0};
    size_t n = 86400;
    float *p = malloc(n * sizeof(float));
    cr_assert_eq(mt_gen_next(g, &b, n, p), MT_OK);
    double sum[24] = {0}, cnt[24] = {0};
    for (size_t i = 0; i < n; i++) {
        uint64_t h = one_value(&b, i, 4);
        sum[h] += p[i];
        cnt[h]++;
    }
    double morning = (sum[5] + sum[6]) / (cnt[5] + cnt[6]); /* sin peaks at 6:00 */
    double evening = (sum[17] + sum[18]) / (cnt[17] + cnt[18]);
    cr_log_info("mean p at 5-7h %.4f, at 17-19h %.4f", morning, evening);
    cr_assert_gt(morning, 2 * evening, "morning %.4f evening %.4f", morning, evening);
    free(p);
    mt_batch_free(&b);
    mt_gen_destroy(g);
}

/* ---------------- scale and errors ---------------- */

static double rss_bytes(void) {
    long pages = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
    fclose(f);
    return (double)res * 4096.0;
}

Test(gen, hundred_million_ids_bounded_memory) {
    mt_gen_config_t cfg;
    mt_gen_config_init(&cfg);
    cfg.num_users = 100000000;
    cfg.num_items = 100000000;
    mt_gen_t *g = make(&cfg);
    mt_batch_t b = {0};
    cr_assert_eq(mt_gen_next(g, &b, 1000, NULL), MT_OK); /* warm the batch */
    double before = rss_bytes();
    uint64_t max_user = 0, max_item = 0;
    for (int r = 0; r < 20; r++) {
        cr_assert_eq(mt_gen_next(g, &b, 1000, NULL), MT_OK);
        for (size_t i = 0; i < b.n; i++) {
            uint64_t u = one_value(&b, i, 0), it = one_value(&b, i, 1);
            if (u > max_user) max_user = u;
            if (it > max_item) max_item = it;
        }
    }
    double grown = rss_bytes() - before;
    cr_assert_lt(grown, 32e6, "resident set grew by %.0f bytes", grown);
    cr_assert_gt(max_user, 10000000, "ids span the space: max user %llu",
                 (unsigned long long)max_user);
    cr_assert_gt(max_item, 10000000, "max item %llu", (unsigned long long)max_item);
    mt_batch_free(&b);
    mt_gen_destroy(g);
}

Test(gen, errors_on_next) {
    mt_gen_config_t cfg;
    mt_gen_config_init(&cfg);
    cfg.items_born_per_s = 1e9; /* ids pass 2^48 after about 2.8e5 s */
    cfg.item_half_life_s = 0;
    cfg.events_per_s = 1;
    mt_gen_t *g = make(&cfg);
    mt_batch_t b = {0};
    cr_assert_eq(mt_gen_next(NULL, &b, 1, NULL), MT_INVALID);
    cr_assert_eq(mt_gen_next(g, NULL, 1, NULL), MT_INVALID);
    cr_assert_eq(mt_gen_next(g, &b, 10, NULL), MT_OK);
    mt_gen_seek(g, 1000000);
    cr_assert_eq(mt_gen_next(g, &b, 10, NULL), MT_LIMIT);
    cr_assert_eq(mt_gen_position(g), 1000000, "the position does not move on error");
    mt_gen_seek(g, UINT64_MAX); /* the clock itself overflows */
    cr_assert_eq(mt_gen_next(g, &b, 1, NULL), MT_LIMIT);
    mt_batch_free(&b);

    /* a batch with other slots */
    uint16_t other[] = {1, 2};
    cr_assert_eq(mt_batch_init(&b, other, 2), MT_OK);
    mt_gen_seek(g, 0);
    cr_assert_eq(mt_gen_next(g, &b, 1, NULL), MT_MISMATCH);
    mt_batch_free(&b);
    mt_gen_destroy(g);
}

Test(gen, item_vectors_drift) {
    /* one user, one item, one tag: only <u, R(t) i> moves, with period drift_period_s */
    mt_gen_config_t cfg;
    mt_gen_config_init(&cfg);
    cfg.num_users = 1;
    cfg.num_items = 1;
    cfg.users_born_per_s = 0;
    cfg.items_born_per_s = 0;
    cfg.item_half_life_s = 0;
    cfg.daily_amplitude = 0;
    cfg.events_per_s = 1;
    cfg.drift_period_s = 1000;
    mt_gen_t *g = make(&cfg);
    mt_batch_t b = {0};
    float p[2001];
    cr_assert_eq(mt_gen_next(g, &b, 2001, p), MT_OK);
    float lo = 1, hi = 0;
    for (int i = 0; i < 1000; i++) {
        lo = fminf(lo, p[i]);
        hi = fmaxf(hi, p[i]);
    }
    cr_log_info("drift: p in [%.4f, %.4f]", lo, hi);
    cr_assert_gt(hi - lo, 0.01f, "p does not move: [%.4f, %.4f]", lo, hi);
    cr_assert_float_eq(p[0], p[1000], 1e-5, "one full turn: %.6f vs %.6f", p[0], p[1000]);
    cr_assert_float_eq(p[500], p[1500], 1e-5);
    /* without drift the pair's probability is constant */
    cfg.drift_period_s = 0;
    mt_gen_t *g0 = make(&cfg);
    cr_assert_eq(mt_gen_next(g0, &b, 1000, p), MT_OK);
    for (int i = 1; i < 1000; i++)
        cr_assert_eq(p[i], p[0]);
    mt_batch_free(&b);
    mt_gen_destroy(g);
    mt_gen_destroy(g0);
}

/* tasks = 2: the clicks are the one-task stream's, a conversion only follows a click, the
 * conversion rate of clicks is near conversion_rate's ballpark, and the conversions follow a
 * ground truth of their own: ranking the clicks by the click's true probability separates
 * converting clicks worse than chance allows for a signal of theirs (the two truths differ). */
Test(gen, conversions_follow_clicks) {
    mt_gen_config_t cfg;
    mt_gen_config_init(&cfg);
    cfg.seed = 5;
    mt_gen_t *one, *two;
    cr_assert_eq(mt_gen_create(&cfg, &one), MT_OK);
    cfg.tasks = 3;
    char err[128];
    cr_assert_eq(mt_gen_config_validate(&cfg, err, sizeof(err)), MT_CONFIG);
    cfg.tasks = 2;
    cfg.conversion_rate = 1.0;
    cr_assert_eq(mt_gen_config_validate(&cfg, err, sizeof(err)), MT_CONFIG);
    cfg.conversion_rate = 0.2;
    cr_assert_eq(mt_gen_create(&cfg, &two), MT_OK);
    mt_batch_t a = {0}, b = {0};
    const size_t n = 100000;
    float *p = malloc(n * sizeof(float));
    cr_assert_eq(mt_gen_next(one, &a, n, NULL), MT_OK);
    cr_assert_eq(mt_gen_next(two, &b, n, p), MT_OK);
    cr_assert_eq(b.ntasks, 2);
    cr_assert_eq(mt_gen_next(two, &a, 1, NULL), MT_MISMATCH); /* a one-task batch */
    size_t clicks = 0, conv = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(b.labels[2 * i], a.labels[i], "example %zu: not the same click", i);
        cr_assert(b.labels[2 * i + 1] <= b.labels[2 * i], "a conversion without a click");
        clicks += b.labels[2 * i] > 0;
        conv += b.labels[2 * i + 1] > 0;
    }
    cr_assert_eq(memcmp(a.fids, b.fids, a.nfids * sizeof(uint64_t)), 0);
    double rate = (double)conv / (double)clicks;
    cr_expect(rate > 0.1 && rate < 0.45, "conversion rate of clicks %g", rate);
    /* among clicks: the click's own truth barely ranks conversions */
    float *sc = malloc(clicks * sizeof(float)), *y = malloc(clicks * sizeof(float));
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (b.labels[2 * i] > 0) {
            sc[k] = p[i];
            y[k++] = b.labels[2 * i + 1];
        }
    double auc = exact_auc(sc, y, k);
    cr_expect(auc > 0.4 && auc < 0.6, "click truth ranks conversions with AUC %g", auc);
    free(sc);
    free(y);
    free(p);
    mt_batch_free(&a);
    mt_batch_free(&b);
    mt_gen_destroy(one);
    mt_gen_destroy(two);
}
