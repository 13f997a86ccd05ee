/*
 * gen.c - the synthetic click stream; the model and its invariants are described in mt/gen.h.
 *
 * Invariants:
 *  - nothing is stored per id: an entity's bias and vector are recomputed from
 *    mix64(slot_key[slot] ^ id) each time (about dim + 1 splitmix64 steps);
 *  - example k draws all its randomness from its own splitmix64 stream seeded by
 *    mix64(stream_key ^ k * golden), so it depends on (config, k) only;
 *  - the generator's only mutable state is `pos`.
 */
#include "mt/gen.h"
#include "mt/zipf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------- types ---------------- */

#define GOLDEN             0x9E3779B97F4A7C15ull
#define FID_VALUE_LIMIT    (1ull << 48)
#define MAX_AGE_REJECTIONS 64
#define CALIB_SAMPLES      32768
#define CALIB_ITERS        60
#define CALIB_SPAN_MS      3600000.0
#define DAY_MS             86400000ll
#define MAX_ELAPSED_MS     4503599627370496.0 /* 2^52: start + elapsed fits int64 */
#define PI                 3.14159265358979323846

/* Zipf ranks (mt/zipf.h): 0..n-1, rank 0 the most likely. */
typedef mt_zipf_t zipf_t;

/* One population (users or items): see "Popularity and life cycle" in mt/gen.h. */
typedef struct pop {
    uint64_t n;         /* live ids */
    zipf_t zipf;        /* over ranks */
    uint64_t perm_a;    /* rank -> residue: (perm_a * r + perm_b) mod n, gcd(perm_a, n) = 1 */
    uint64_t perm_b;    /* < n */
    double born_per_s;  /* 0: the window never moves */
    double decay_per_s; /* ln 2 / half-life, 0: none */
    uint16_t slot;      /* its slot id (for the key) */
} pop_t;

/* One drawn example before it is written to a batch. */
typedef struct example {
    uint64_t user, item, segment, category, hour;
    uint64_t tags[64];
    uint32_t ntags;
    uint64_t seq[MT_GEN_MAX_SEQUENCE]; /* the user's recent clicks (sequence_length) */
    int64_t ts_ms;
    double z; /* logit minus b0 */
} example_t;

struct mt_gen {
    mt_gen_config_t cfg;
    pop_t users, items;
    uint64_t slot_key[MT_GEN_NSLOTS + 1]; /* by slot id */
    uint64_t conv_key[MT_GEN_NSLOTS + 1]; /* the conversion model's entities, by slot id */
    uint64_t stream_key, calib_key;
    uint64_t request_key; /* seeds mt_gen_draw_request()'s draws */
    uint64_t seq_key;     /* seeds the users' recent clicks */
    double b0;
    double inv_sqrt_dim;
    double drift_rad_per_s;
    uint64_t pos; /* the only mutable field */
};

/* ---------------- private prototypes ---------------- */

static uint64_t mix64(uint64_t z);
static uint64_t splitmix64(uint64_t *x);
static double rand01(uint64_t *x);
static void zipf_init(zipf_t *z, uint64_t n, double e);
static uint64_t zipf_next(const zipf_t *z, uint64_t *rng);
static void pop_init(pop_t *p, uint16_t slot, uint64_t n, double e, double born_per_s,
                     double half_life_s, uint64_t key);
static uint64_t pop_sample(const pop_t *p, double elapsed_s, uint64_t *rng);
static double entity(const mt_gen_t *g, int slot, uint64_t id, double *vec);
static double entity_of(uint64_t key, uint32_t dim, uint64_t id, double *vec);
static mt_err_t draw(const mt_gen_t *g, uint64_t *rng, int64_t ts_ms, int64_t clock_ms,
                     example_t *ex);
static void features(const mt_gen_t *g, uint64_t user, uint64_t item, int64_t ts_ms,
                     int64_t clock_ms, example_t *ex);
static mt_err_t elapsed_of(const mt_gen_t *g, int64_t ts_ms, double *elapsed_s);
static double sigmoid(double x);
static double conversion_p(const mt_gen_t *g, const example_t *ex);
static double daily_term(const mt_gen_t *g, int64_t ts_ms);
static mt_err_t calibrate(mt_gen_t *g);
static void behaviours(const mt_gen_t *g, uint64_t user, const double *u, double elapsed_s,
                       uint64_t *seq, double *vecs);

/* The window of a user's recent clicks (mt/gen.h). */
#define SEQ_WINDOW_S 600.0
#define SEQ_TRIES    16

/* ---------------- API ---------------- */

void mt_gen_config_init(mt_gen_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->seed = 42;
    cfg->num_users = 1000000;
    cfg->user_zipf_exponent = 0.95;
    cfg->users_born_per_s = 1.0;
    cfg->user_half_life_s = 0.0;
    cfg->num_items = 1000000;
    cfg->item_zipf_exponent = 1.05;
    cfg->items_born_per_s = 100.0;
    cfg->item_half_life_s = 21600.0;
    cfg->num_user_segments = 16;
    cfg->num_item_categories = 64;
    cfg->num_tags = 1000;
    cfg->max_tags = 3;
    cfg->latent_dim = 8;
    cfg->target_ctr = 0.05;
    cfg->bias_scale = 0.5;
    cfg->interaction_scale = 0.7;
    cfg->daily_amplitude = 0.3;
    cfg->drift_period_s = 604800.0;
    cfg->tasks = 1;
    cfg->conversion_rate = 0.1;
    cfg->sequence_scale = 1.0;
    cfg->events_per_s = 1000.0;
    cfg->start_time_ms = 1700000000000ll;
}

#define BAD(...)                                                     \
    do {                                                             \
        if (errbuf && errlen) snprintf(errbuf, errlen, __VA_ARGS__); \
        return MT_CONFIG;                                            \
    } while (0)

/* isfinite and >= 0 (NaN fails both). */
static int nonneg(double x) {
    return isfinite(x) && x >= 0;
}

mt_err_t mt_gen_config_validate(const mt_gen_config_t *cfg, char *errbuf, size_t errlen) {
    if (!cfg) BAD("config is NULL");
    if (cfg->num_users < 1 || cfg->num_users > MT_GEN_MAX_IDS)
        BAD("num_users must be in [1, 2^40], got %llu", (unsigned long long)cfg->num_users);
    if (cfg->num_items < 1 || cfg->num_items > MT_GEN_MAX_IDS)
        BAD("num_items must be in [1, 2^40], got %llu", (unsigned long long)cfg->num_items);
    if (!(cfg->user_zipf_exponent > 0 && cfg->user_zipf_exponent <= 10))
        BAD("user_zipf_exponent must be in (0, 10], got %g", cfg->user_zipf_exponent);
    if (!(cfg->item_zipf_exponent > 0 && cfg->item_zipf_exponent <= 10))
        BAD("item_zipf_exponent must be in (0, 10], got %g", cfg->item_zipf_exponent);
    if (!nonneg(cfg->users_born_per_s) || cfg->users_born_per_s > 1e9)
        BAD("users_born_per_s must be in [0, 1e9], got %g", cfg->users_born_per_s);
    if (!nonneg(cfg->items_born_per_s) || cfg->items_born_per_s > 1e9)
        BAD("items_born_per_s must be in [0, 1e9], got %g", cfg->items_born_per_s);
    if (!nonneg(cfg->user_half_life_s))
        BAD("user_half_life_s must be >= 0, got %g", cfg->user_half_life_s);
    if (!nonneg(cfg->item_half_life_s))
        BAD("item_half_life_s must be >= 0, got %g", cfg->item_half_life_s);
    if (cfg->user_half_life_s > 0 && cfg->users_born_per_s == 0)
        BAD("user_half_life_s needs users_born_per_s > 0 (ages come from births)");
    if (cfg->item_half_life_s > 0 && cfg->items_born_per_s == 0)
        BAD("item_half_life_s needs items_born_per_s > 0 (ages come from births)");
    if (cfg->num_user_segments < 1) BAD("num_user_segments must be >= 1");
    if (cfg->num_item_categories < 1) BAD("num_item_categories must be >= 1");
    if (cfg->num_tags < 1) BAD("num_tags must be >= 1");
    if (cfg->max_tags > 64) BAD("max_tags must be <= 64, got %u", cfg->max_tags);
    if (cfg->latent_dim < 1 || cfg->latent_dim > MT_GEN_MAX_DIM)
        BAD("latent_dim must be in [1, %u], got %u", MT_GEN_MAX_DIM, cfg->latent_dim);
    if (!(cfg->target_ctr > 0 && cfg->target_ctr < 1))
        BAD("target_ctr must be in (0, 1), got %g", cfg->target_ctr);
    if (!nonneg(cfg->bias_scale) || cfg->bias_scale > 10)
        BAD("bias_scale must be in [0, 10], got %g", cfg->bias_scale);
    if (!nonneg(cfg->interaction_scale) || cfg->interaction_scale > 10)
        BAD("interaction_scale must be in [0, 10], got %g", cfg->interaction_scale);
    if (!nonneg(cfg->daily_amplitude) || cfg->daily_amplitude > 10)
        BAD("daily_amplitude must be in [0, 10], got %g", cfg->daily_amplitude);
    if (!nonneg(cfg->drift_period_s))
        BAD("drift_period_s must be >= 0, got %g", cfg->drift_period_s);
    if (cfg->tasks < 1 || cfg->tasks > 2) BAD("tasks must be 1 or 2, got %u", cfg->tasks);
    if (!(cfg->conversion_rate > 0 && cfg->conversion_rate < 1))
        BAD("conversion_rate must be in (0, 1), got %g", cfg->conversion_rate);
    if (cfg->sequence_length > MT_GEN_MAX_SEQUENCE)
        BAD("sequence_length must be <= %u, got %u", MT_GEN_MAX_SEQUENCE, cfg->sequence_length);
    if (!nonneg(cfg->sequence_scale) || cfg->sequence_scale > 10)
        BAD("sequence_scale must be in [0, 10], got %g", cfg->sequence_scale);
    if (!(isfinite(cfg->events_per_s) && cfg->events_per_s > 0 && cfg->events_per_s <= 1e12))
        BAD("events_per_s must be in (0, 1e12], got %g", cfg->events_per_s);
    if (cfg->start_time_ms < 0 || cfg->start_time_ms > (1ll << 52))
        BAD("start_time_ms must be in [0, 2^52], got %lld", (long long)cfg->start_time_ms);
    return MT_OK;
}

mt_err_t mt_gen_create(const mt_gen_config_t *cfg, mt_gen_t **out) {
    if (!cfg || !out) return MT_INVALID;
    mt_err_t err = mt_gen_config_validate(cfg, NULL, 0);
    if (err != MT_OK) return err;
    mt_gen_t *g = calloc(1, sizeof(*g));
    if (!g) return MT_NOMEM;
    g->cfg = *cfg;
    uint64_t seed_key = mix64(cfg->seed ^ 0x6D6F6E6F6C697468ull); /* "monolith" */
    for (int s = 0; s <= MT_GEN_NSLOTS; s++)
        g->slot_key[s] = mix64(seed_key + (uint64_t)s * GOLDEN);
    for (int s = 0; s <= MT_GEN_NSLOTS; s++)
        g->conv_key[s] = mix64((seed_key ^ 0x636F6E76ull) + (uint64_t)s * GOLDEN); /* "conv" */
    g->stream_key = mix64(seed_key ^ 0x73747265616D0000ull);
    g->calib_key = mix64(seed_key ^ 0x63616C6962000000ull);
    g->request_key = mix64(seed_key ^ 0x7265717565737400ull); /* "request" */
    g->seq_key = mix64(seed_key ^ 0x73657175656E6365ull);     /* "sequence" */
    pop_init(&g->users, MT_GEN_SLOT_USER, cfg->num_users, cfg->user_zipf_exponent,
             cfg->users_born_per_s, cfg->user_half_life_s, mix64(seed_key ^ 0x7573ull));
    pop_init(&g->items, MT_GEN_SLOT_ITEM, cfg->num_items, cfg->item_zipf_exponent,
             cfg->items_born_per_s, cfg->item_half_life_s, mix64(seed_key ^ 0x6974ull));
    g->inv_sqrt_dim = 1.0 / sqrt((double)cfg->latent_dim);
    g->drift_rad_per_s = cfg->drift_period_s > 0 ? 2 * PI / cfg->drift_period_s : 0;
    err = calibrate(g);
    if (err != MT_OK) {
        free(g);
        return err;
    }
    *out = g;
    return MT_OK;
}

void mt_gen_destroy(mt_gen_t *g) {
    free(g);
}

uint32_t mt_gen_nslots(const mt_gen_t *g) {
    return g && g->cfg.sequence_length ? MT_GEN_NSLOTS + 1 : MT_GEN_NSLOTS;
}

mt_err_t mt_gen_next(mt_gen_t *g, mt_batch_t *batch, size_t n, float *true_p_out) {
    static const uint16_t slots[MT_GEN_NSLOTS + 1] = {
        MT_GEN_SLOT_USER,          MT_GEN_SLOT_ITEM, MT_GEN_SLOT_USER_SEGMENT,
        MT_GEN_SLOT_ITEM_CATEGORY, MT_GEN_SLOT_HOUR, MT_GEN_SLOT_ITEM_TAGS,
        MT_GEN_SLOT_SEQUENCE};
    if (!g || !batch) return MT_INVALID;
    const uint32_t ns = mt_gen_nslots(g);
    if (batch->nslots == 0) {
        mt_err_t err = mt_batch_init(batch, slots, ns);
        if (!err) err = mt_batch_set_tasks(batch, g->cfg.tasks);
        if (err != MT_OK) return err;
    } else if (batch->nslots != ns || memcmp(batch->slot_ids, slots, ns * sizeof(slots[0])) != 0 ||
               batch->ntasks != g->cfg.tasks) {
        return MT_MISMATCH;
    }
    mt_batch_clear(batch);
    const mt_gen_config_t *c = &g->cfg;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = g->pos + i;
        uint64_t rng = mix64(g->stream_key ^ (k * GOLDEN));
        double dt_ms = floor((double)k * 1000.0 / c->events_per_s);
        if (!(dt_ms < MAX_ELAPSED_MS)) return MT_LIMIT; /* the clock would overflow */
        int64_t ts_ms = c->start_time_ms + (int64_t)dt_ms;
        example_t ex;
        mt_err_t err = draw(g, &rng, ts_ms, ts_ms, &ex);
        if (err != MT_OK) return err;
        double p = sigmoid(g->b0 + ex.z);
        float label[2] = {rand01(&rng) < p ? 1.0f : 0.0f, 0.0f};
        if (c->tasks == 2 && label[0] > 0) label[1] = rand01(&rng) < conversion_p(g, &ex);
        uint64_t one[5] = {
            mt_fid_of_int(MT_GEN_SLOT_USER, ex.user),
            mt_fid_of_int(MT_GEN_SLOT_ITEM, ex.item),
            mt_fid_of_int(MT_GEN_SLOT_USER_SEGMENT, ex.segment),
            mt_fid_of_int(MT_GEN_SLOT_ITEM_CATEGORY, ex.category),
            mt_fid_of_int(MT_GEN_SLOT_HOUR, ex.hour),
        };
        uint64_t tags[64];
        for (uint32_t t = 0; t < ex.ntags; t++)
            tags[t] = mt_fid_of_int(MT_GEN_SLOT_ITEM_TAGS, ex.tags[t]);
        uint64_t seq[MT_GEN_MAX_SEQUENCE];
        for (uint32_t j = 0; j < c->sequence_length; j++)
            seq[j] = mt_fid_of_int(MT_GEN_SLOT_SEQUENCE, ex.seq[j]);
        const uint64_t *per_slot[MT_GEN_NSLOTS + 1] = {one,     one + 1, one + 2, one + 3,
                                                       one + 4, tags,    seq};
        const uint32_t counts[MT_GEN_NSLOTS + 1] = {1, 1, 1, 1, 1, ex.ntags, c->sequence_length};
        err = mt_batch_add_labels(batch, label, ex.ts_ms, 1.0f, per_slot, counts);
        if (err != MT_OK) return err;
        if (true_p_out) true_p_out[i] = (float)p;
    }
    g->pos += n;
    return MT_OK;
}

void mt_gen_seek(mt_gen_t *g, uint64_t index) {
    if (g) g->pos = index;
}

uint64_t mt_gen_position(const mt_gen_t *g) {
    return g ? g->pos : 0;
}

double mt_gen_global_bias(const mt_gen_t *g) {
    return g ? g->b0 : 0;
}

int64_t mt_gen_time_ms(const mt_gen_t *g, uint64_t index) {
    if (!g) return 0;
    return g->cfg.start_time_ms + (int64_t)floor((double)index * 1000.0 / g->cfg.events_per_s);
}

mt_err_t mt_gen_draw_request(const mt_gen_t *g, uint64_t index, int64_t ts_ms, size_t k,
                             uint64_t *user, uint64_t *items) {
    if (!g || !user || (k > 0 && !items)) return MT_INVALID;
    if (k > g->cfg.num_items || k > MT_GEN_MAX_CANDIDATES) return MT_INVALID;
    double elapsed_s;
    mt_err_t err = elapsed_of(g, ts_ms, &elapsed_s);
    if (err != MT_OK) return err;
    uint64_t rng = mix64(g->request_key ^ (index * GOLDEN));
    uint64_t u = pop_sample(&g->users, elapsed_s, &rng);
    if (u >= FID_VALUE_LIMIT) return MT_LIMIT;
    size_t got = 0;
    /* Distinct items by popularity; a page rarely needs many retries, but a k close to the
     * live population would: after 64 k draws the rest are taken in id order from a random
     * live id (k <= num_items, so this ends). */
    for (size_t tries = 0; got < k && tries < 64 * k; tries++) {
        uint64_t it = pop_sample(&g->items, elapsed_s, &rng);
        if (it >= FID_VALUE_LIMIT) return MT_LIMIT;
        size_t j = 0;
        while (j < got && items[j] != it)
            j++;
        if (j == got) items[got++] = it;
    }
    if (got < k) {
        uint64_t lo =
            g->items.born_per_s > 0 ? (uint64_t)floor(g->items.born_per_s * elapsed_s) : 0;
        uint64_t off = splitmix64(&rng) % g->cfg.num_items;
        for (uint64_t step = 0; got < k && step < g->cfg.num_items; step++) {
            uint64_t it = lo + (off + step) % g->cfg.num_items;
            size_t j = 0;
            while (j < got && items[j] != it)
                j++;
            if (j == got) items[got++] = it;
        }
    }
    *user = u;
    return MT_OK;
}

mt_err_t mt_gen_true_p(const mt_gen_t *g, uint64_t user, uint64_t item, int64_t ts_ms, double *p) {
    if (!g || !p) return MT_INVALID;
    if (user >= FID_VALUE_LIMIT || item >= FID_VALUE_LIMIT) return MT_INVALID;
    double elapsed_s;
    mt_err_t err = elapsed_of(g, ts_ms, &elapsed_s);
    if (err != MT_OK) return err;
    example_t ex;
    features(g, user, item, ts_ms, ts_ms, &ex);
    *p = sigmoid(g->b0 + ex.z);
    return MT_OK;
}

void mt_gen_user_fids(const mt_gen_t *g, uint64_t user, int64_t ts_ms,
                      uint64_t out[MT_GEN_USER_FIDS]) {
    const mt_gen_config_t *c = &g->cfg;
    uint64_t segment = mix64(g->slot_key[MT_GEN_SLOT_USER_SEGMENT] + user) % c->num_user_segments;
    uint64_t hour = (uint64_t)((ts_ms / 3600000) % 24);
    out[0] = mt_fid_of_int(MT_GEN_SLOT_USER, user);
    out[1] = mt_fid_of_int(MT_GEN_SLOT_USER_SEGMENT, segment);
    out[2] = mt_fid_of_int(MT_GEN_SLOT_HOUR, hour);
}

size_t mt_gen_user_sequence(const mt_gen_t *g, uint64_t user, int64_t ts_ms,
                            uint64_t out[MT_GEN_MAX_SEQUENCE]) {
    const uint32_t L = g->cfg.sequence_length;
    double elapsed_s, u[MT_GEN_MAX_DIM];
    if (!L || user >= FID_VALUE_LIMIT || elapsed_of(g, ts_ms, &elapsed_s) != MT_OK) return 0;
    entity(g, MT_GEN_SLOT_USER, user, u);
    uint64_t seq[MT_GEN_MAX_SEQUENCE];
    behaviours(g, user, u, elapsed_s, seq, NULL);
    for (uint32_t j = 0; j < L; j++)
        out[j] = mt_fid_of_int(MT_GEN_SLOT_SEQUENCE, seq[j]);
    return L;
}

size_t mt_gen_item_fids(const mt_gen_t *g, uint64_t item, uint64_t out[MT_GEN_MAX_ITEM_FIDS]) {
    const mt_gen_config_t *c = &g->cfg;
    size_t n = 0;
    out[n++] = mt_fid_of_int(MT_GEN_SLOT_ITEM, item);
    uint64_t category =
        mix64(g->slot_key[MT_GEN_SLOT_ITEM_CATEGORY] + item) % c->num_item_categories;
    out[n++] = mt_fid_of_int(MT_GEN_SLOT_ITEM_CATEGORY, category);
    if (c->max_tags > 0) {
        uint64_t st = mix64(g->slot_key[MT_GEN_SLOT_ITEM_TAGS] + item);
        uint32_t ntags = 1 + (uint32_t)(splitmix64(&st) % c->max_tags);
        for (uint32_t t = 0; t < ntags; t++)
            out[n++] = mt_fid_of_int(MT_GEN_SLOT_ITEM_TAGS, splitmix64(&st) % c->num_tags);
    }
    return n;
}

/* ---------------- private: random numbers ---------------- */

/* The splitmix64 finalizer: a bijection of uint64 that mixes every bit. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t splitmix64(uint64_t *x) {
    return mix64(*x += GOLDEN);
}

/* Uniform in [0, 1). */
static double rand01(uint64_t *x) {
    return (double)(splitmix64(x) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---------------- private: Zipf (mt/zipf.h) ---------------- */

static double rand01_cb(void *rng) {
    return rand01(rng);
}

static void zipf_init(zipf_t *z, uint64_t n, double e) {
    mt_zipf_init(z, n, e);
}

static uint64_t zipf_next(const zipf_t *z, uint64_t *rng) {
    return mt_zipf_next(z, rand01_cb, rng);
}

/* ---------------- private: populations ---------------- */

static uint64_t gcd64(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static void pop_init(pop_t *p, uint16_t slot, uint64_t n, double e, double born_per_s,
                     double half_life_s, uint64_t key) {
    p->slot = slot;
    p->n = n;
    zipf_init(&p->zipf, n, e);
    /* perm_a < 2^16 keeps perm_a * r < 2^56 (r < n <= 2^40): no overflow. */
    uint64_t a = (1u << 15) + (mix64(key) & 0x7FFF);
    while (gcd64(a, n) != 1)
        a++;
    p->perm_a = a % n ? a % n : 1;
    if (gcd64(p->perm_a, n) != 1) p->perm_a = 1;
    p->perm_b = mix64(key + 1) % n;
    p->born_per_s = born_per_s;
    p->decay_per_s = half_life_s > 0 ? log(2.0) / half_life_s : 0;
}

/* An id alive at elapsed_s, by Zipf rank and (optionally) age decay. */
static uint64_t pop_sample(const pop_t *p, double elapsed_s, uint64_t *rng) {
    double lo_d = p->born_per_s > 0 ? floor(p->born_per_s * elapsed_s) : 0;
    if (!(lo_d < (double)FID_VALUE_LIMIT)) return UINT64_MAX; /* ids past 48 bits */
    uint64_t lo = (uint64_t)lo_d;
    uint64_t id = 0;
    for (int tries = 0; tries < MAX_AGE_REJECTIONS; tries++) {
        uint64_t r = zipf_next(&p->zipf, rng);
        uint64_t residue = (p->perm_a * r + p->perm_b) % p->n;
        id = lo + (residue + p->n - lo % p->n) % p->n; /* the live id = residue (mod n) */
        if (p->decay_per_s == 0) break;
        /* id j is born when the window's low end reaches j - n + 1 */
        double born_s = ((double)id + 1 - (double)p->n) / p->born_per_s;
        double age_s = elapsed_s - born_s;
        if (age_s < 0) age_s = 0;
        if (rand01(rng) < exp(-p->decay_per_s * age_s)) break;
    }
    return id;
}

/* ---------------- private: the hidden model ---------------- */

/* Seconds since start_time_ms; MT_LIMIT before the start or past the 2^52 ms clock. */
static mt_err_t elapsed_of(const mt_gen_t *g, int64_t ts_ms, double *elapsed_s) {
    if (ts_ms < g->cfg.start_time_ms) return MT_LIMIT;
    double dt_ms = (double)(ts_ms - g->cfg.start_time_ms);
    if (!(dt_ms < MAX_ELAPSED_MS)) return MT_LIMIT;
    *elapsed_s = dt_ms / 1000.0;
    return MT_OK;
}

/* Bias (returned) and vector (dim entries into vec, if non-NULL) of (slot, id): uniform,
 * mean 0, variance 1, from the hash of (seed, slot, id). */
static double entity(const mt_gen_t *g, int slot, uint64_t id, double *vec) {
    return entity_of(g->slot_key[slot], g->cfg.latent_dim, id, vec);
}

/* An entity's bias (returned) and vector of @p dim entries from @p key. */
static double entity_of(uint64_t key, uint32_t dim, uint64_t id, double *vec) {
    static const double sqrt3 = 1.7320508075688772;
    uint64_t st = mix64(key ^ (id * 0xD1B54A32D192ED03ull));
    double bias = (2 * rand01(&st) - 1) * sqrt3;
    if (vec)
        for (uint32_t j = 0; j < dim; j++)
            vec[j] = (2 * rand01(&st) - 1) * sqrt3;
    return bias;
}

static double dot(const double *a, const double *b, uint32_t n) {
    double s = 0;
    for (uint32_t j = 0; j < n; j++)
        s += a[j] * b[j];
    return s;
}

/* A clicked example's conversion probability q (mt/gen.h). */
static double conversion_p(const mt_gen_t *g, const example_t *ex) {
    const mt_gen_config_t *c = &g->cfg;
    double u[MT_GEN_MAX_DIM], v[MT_GEN_MAX_DIM];
    double bu = entity_of(g->conv_key[MT_GEN_SLOT_USER], c->latent_dim, ex->user, u);
    double bi = entity_of(g->conv_key[MT_GEN_SLOT_ITEM], c->latent_dim, ex->item, v);
    double z = log(c->conversion_rate / (1 - c->conversion_rate)) + c->bias_scale * (bu + bi) +
               c->interaction_scale * dot(u, v, c->latent_dim) * g->inv_sqrt_dim;
    return sigmoid(z);
}

static double sigmoid(double x) {
    if (x >= 0) return 1 / (1 + exp(-x));
    double e = exp(x);
    return e / (1 + e);
}

/* The daily cycle: a sine over the day plus a wobble per hour (the hour slot's bias). */
static double daily_term(const mt_gen_t *g, int64_t ts_ms) {
    if (g->cfg.daily_amplitude == 0) return 0;
    double day_frac = (double)(ts_ms % DAY_MS) / (double)DAY_MS;
    uint64_t hour = (uint64_t)((ts_ms / 3600000) % 24);
    return g->cfg.daily_amplitude *
           (sin(2 * PI * day_frac) + 0.5 * entity(g, MT_GEN_SLOT_HOUR, hour, NULL));
}

/* Draws the ids of one example at ts_ms from rng and computes its logit minus b0. The hour
 * and the daily cycle follow clock_ms instead (equal to ts_ms except when calibrating). */
static mt_err_t draw(const mt_gen_t *g, uint64_t *rng, int64_t ts_ms, int64_t clock_ms,
                     example_t *ex) {
    double elapsed_s = (double)(ts_ms - g->cfg.start_time_ms) / 1000.0;
    uint64_t user = pop_sample(&g->users, elapsed_s, rng);
    uint64_t item = pop_sample(&g->items, elapsed_s, rng);
    if (user >= FID_VALUE_LIMIT || item >= FID_VALUE_LIMIT) return MT_LIMIT;
    features(g, user, item, ts_ms, clock_ms, ex);
    return MT_OK;
}

/* The side features of (user, item) and the logit minus b0 at ts_ms (drift) and clock_ms
 * (hour, daily cycle). Uses no randomness of the stream: a pure function of its inputs. */
static void features(const mt_gen_t *g, uint64_t user, uint64_t item, int64_t ts_ms,
                     int64_t clock_ms, example_t *ex) {
    const mt_gen_config_t *c = &g->cfg;
    uint32_t d = c->latent_dim;
    double elapsed_s = (double)(ts_ms - c->start_time_ms) / 1000.0;
    ex->ts_ms = ts_ms;
    ex->user = user;
    ex->item = item;
    ex->segment = mix64(g->slot_key[MT_GEN_SLOT_USER_SEGMENT] + ex->user) % c->num_user_segments;
    ex->category =
        mix64(g->slot_key[MT_GEN_SLOT_ITEM_CATEGORY] + ex->item) % c->num_item_categories;
    ex->hour = (uint64_t)((clock_ms / 3600000) % 24);
    ex->ntags = 0;
    if (c->max_tags > 0) {
        uint64_t st = mix64(g->slot_key[MT_GEN_SLOT_ITEM_TAGS] + ex->item);
        ex->ntags = 1 + (uint32_t)(splitmix64(&st) % c->max_tags);
        for (uint32_t t = 0; t < ex->ntags; t++)
            ex->tags[t] = splitmix64(&st) % c->num_tags;
    }

    double u[MT_GEN_MAX_DIM], v[MT_GEN_MAX_DIM], s[MT_GEN_MAX_DIM], cat[MT_GEN_MAX_DIM];
    double tag[MT_GEN_MAX_DIM], tagsum[MT_GEN_MAX_DIM];
    double bias = entity(g, MT_GEN_SLOT_USER, ex->user, u) +
                  entity(g, MT_GEN_SLOT_ITEM, ex->item, v) +
                  0.5 * entity(g, MT_GEN_SLOT_USER_SEGMENT, ex->segment, s) +
                  0.5 * entity(g, MT_GEN_SLOT_ITEM_CATEGORY, ex->category, cat);
    memset(tagsum, 0, d * sizeof(double));
    for (uint32_t t = 0; t < ex->ntags; t++) {
        bias += 0.5 * entity(g, MT_GEN_SLOT_ITEM_TAGS, ex->tags[t], tag);
        for (uint32_t j = 0; j < d; j++)
            tagsum[j] += tag[j];
    }
    double near = 0; /* the nearest recent click's term (before drift) */
    if (c->sequence_length) {
        double vecs[MT_GEN_MAX_SEQUENCE * MT_GEN_MAX_DIM], best = -INFINITY;
        behaviours(g, ex->user, u, elapsed_s, ex->seq, vecs);
        for (uint32_t j = 0; j < c->sequence_length; j++)
            best = fmax(best, dot(v, vecs + (size_t)j * d, d));
        near = c->sequence_scale * best * g->inv_sqrt_dim;
    }
    if (g->drift_rad_per_s != 0) {
        double a = g->drift_rad_per_s * elapsed_s, ca = cos(a), sa = sin(a);
        for (uint32_t j = 0; j + 1 < d; j += 2) {
            double x = v[j], y = v[j + 1];
            v[j] = ca * x - sa * y;
            v[j + 1] = sa * x + ca * y;
        }
    }
    double inter = dot(u, v, d) + dot(s, cat, d) + dot(u, tagsum, d);
    ex->z = daily_term(g, clock_ms) + c->bias_scale * bias +
            c->interaction_scale * inter * g->inv_sqrt_dim + near;
}

/* The recent clicks of @p user (vector @p u) at elapsed_s into seq[0, sequence_length), and
 * their item vectors into vecs (sequence_length x dim) when not NULL (mt/gen.h). A pure
 * function of (user, the window of elapsed_s); items alive at the window's start. */
static void behaviours(const mt_gen_t *g, uint64_t user, const double *u, double elapsed_s,
                       uint64_t *seq, double *vecs) {
    const mt_gen_config_t *c = &g->cfg;
    const double w = floor(elapsed_s / SEQ_WINDOW_S);
    const double at_s = w * SEQ_WINDOW_S;
    double v[MT_GEN_MAX_DIM];
    for (uint32_t j = 0; j < c->sequence_length; j++) {
        uint64_t rng = mix64(g->seq_key ^ mix64(user * GOLDEN + (uint64_t)w) ^ (j * GOLDEN));
        uint64_t it = 0;
        for (int t = 0; t < SEQ_TRIES; t++) {
            it = pop_sample(&g->items, at_s, &rng);
            if (it >= FID_VALUE_LIMIT) it = 0;
            entity(g, MT_GEN_SLOT_ITEM, it, v);
            if (rand01(&rng) < sigmoid(2 * dot(u, v, c->latent_dim) * g->inv_sqrt_dim)) break;
        }
        seq[j] = it;
        if (vecs) memcpy(vecs + (size_t)j * c->latent_dim, v, c->latent_dim * sizeof(double));
    }
}

/* b0 such that the mean of sigmoid(b0 + z) over CALIB_SAMPLES examples is target_ctr
 * (bisection: the mean increases with b0). The examples' ids and drift are drawn at uniform
 * times of the first simulated hour, their hour and daily cycle at uniform times of a day:
 * with Zipf popularity a few heavy ids move the CTR, and those change as ids are born, fade
 * and drift, so the stream is calibrated where it starts (later it drifts, as real ones do),
 * with the daily cycle averaged out. A calibration example whose ids overflow 48 bits (absurd
 * birth rates) is skipped. */
static mt_err_t calibrate(mt_gen_t *g) {
    double *zs = malloc(CALIB_SAMPLES * sizeof(double));
    if (!zs) return MT_NOMEM;
    size_t m = 0;
    uint64_t rng = g->calib_key;
    for (size_t i = 0; i < CALIB_SAMPLES; i++) {
        int64_t ts_ms = g->cfg.start_time_ms + (int64_t)(rand01(&rng) * CALIB_SPAN_MS);
        int64_t clock_ms = g->cfg.start_time_ms + (int64_t)(rand01(&rng) * (double)DAY_MS);
        example_t ex;
        if (draw(g, &rng, ts_ms, clock_ms, &ex) == MT_OK) zs[m++] = ex.z;
    }
    double lo = -40, hi = 40;
    for (int it = 0; m > 0 && it < CALIB_ITERS; it++) {
        double mid = 0.5 * (lo + hi), sum = 0;
        for (size_t i = 0; i < m; i++)
            sum += sigmoid(mid + zs[i]);
        if (sum / (double)m < g->cfg.target_ctr)
            lo = mid;
        else
            hi = mid;
    }
    g->b0 = m > 0 ? 0.5 * (lo + hi) : log(g->cfg.target_ctr / (1 - g->cfg.target_ctr));
    free(zs);
    return MT_OK;
}
