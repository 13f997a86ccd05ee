/*
 * gen.h - the synthetic click stream ("monolith gen"): a hidden ground-truth model, Zipf id
 * popularity, ids born and fading over time, and drift; seeded and reproducible.
 *
 * It feeds the demo, the tests and the benchmarks at scales the real samples cannot reach
 * (10 million ids and more) and, because it knows the true click probability of every example
 * it emits, it gives the best AUC any model can reach on its stream ("AUC close to the
 * ground-truth model's").
 *
 * The hidden model. Every entity (user id, item id, user segment, item category, hour of day,
 * item tag) has a bias and a latent vector of cfg.latent_dim entries, drawn on demand from a
 * hash of (seed, slot, id): nothing is stored per id, so memory does not depend on the id space.
 * Entries are uniform with unit variance. For user u, item i at time t:
 *
 *   logit = b0 + daily_amplitude * (sin(2 pi * time_of_day / 1 day) + 0.5 b_hour)
 *         + bias_scale * (b_u + b_i + 0.5 b_segment + 0.5 b_category + 0.5 * sum over tags b_tag)
 *         + interaction_scale * (<u, R(t) i> + <segment, category> + <u, sum of tags>) / sqrt(dim)
 *   p     = sigmoid(logit),   label ~ Bernoulli(p)
 *
 * With cfg.tasks = 2 each example has a second label, a conversion, whose ground truth differs
 * from the click's: a clicked example converts with probability
 *
 *   q     = sigmoid(logit(conversion_rate) + bias_scale * (c_u + c_i)
 *                   + interaction_scale * <v_u, v_i> / sqrt(dim))
 *
 * where (c, v) are a second bias and latent vector per user and item, drawn like the first
 * from another key; unclicked examples never convert. The clicks are the same stream as with
 * one task (the conversion's draw comes after the click's).
 *
 * With cfg.sequence_length = L > 0 each example also carries the user's recent clicks (slot 7,
 * most recent first): L items drawn by popularity among those alive at the start of the
 * user's current 10-minute window, each kept with probability sigmoid(2 <u, v_s> / sqrt(dim))
 * (the items the user is drawn to; after 16 draws the last is kept). The behaviours are a pure
 * function of (user, window) and the click's logit gains the candidate's closeness to the
 * nearest of them (what target attention finds and a sum over the sequence blurs):
 *
 *   + sequence_scale * max_j <v_i, v_(s_j)> / sqrt(dim)       (item vectors before drift)
 *
 * R(t) rotates each coordinate pair of the item vectors by 2 pi t / drift_period_s (drift: what
 * a user likes moves slowly). b0 is calibrated at creation (Monte Carlo,
 * then bisection) so that the mean of p is cfg.target_ctr over the first simulated hour
 * (ids and drift of that hour, the daily cycle averaged); the CTR drifts afterwards as heavy
 * ids are born and fade.
 *
 * Popularity and life cycle (users and items alike). Ranks r ~ Zipf(N, exponent) (Hörmann and
 * Derflinger's rejection-inversion, O(1) memory). The ids alive at elapsed time t are the window
 * [lo, lo + N) with lo = floor(born_per_s * t): a new id is born every 1 / born_per_s seconds and
 * the oldest dies. Rank r owns residue class perm(r) mod N (perm: a seeded affine bijection of
 * [0, N)), held at any time by exactly one live id; the newborn takes over its class from the
 * id that dies. With half_life_s > 0 the popularity of an id also halves every half_life_s of
 * age (rejection on age; after 64 rejections the last draw is kept, which only matters when the
 * half-life is tiny next to the lifetime N / born_per_s).
 *
 * Example k of the stream is a pure function of (config, k): the stream does not depend on how
 * it is cut into mt_gen_next() calls, and mt_gen_seek() jumps anywhere. Same seed and config,
 * byte-identical batches (on one build: libm's exp/sin are assumed deterministic).
 *
 * Slots (fixed, top 16 bits of each fid; values are the integers themselves, see batch.h):
 *
 *   slot | name          | fids per example | value
 *   -----+---------------+------------------+------------------------------------------
 *    1   | user id       | 1                | 0 .. (2^48 - 1), grows as users are born
 *    2   | item id       | 1                | 0 .. (2^48 - 1), grows as items are born
 *    3   | user segment  | 1                | 0 .. num_user_segments - 1 (fixed per user)
 *    4   | item category | 1                | 0 .. num_item_categories - 1 (fixed per item)
 *    5   | hour of day   | 1                | 0 .. 23 (UTC, from the timestamp)
 *    6   | item tags     | 0 .. max_tags    | 0 .. num_tags - 1 (fixed per item; multi-hot)
 *    7   | recent clicks | sequence_length  | item ids (only with sequence_length > 0)
 *
 * Timestamps: example k is at start_time_ms + floor(k * 1000 / events_per_s). Sample rate 1.
 *
 * Ownership: mt_gen_create() copies the config; the caller frees the generator with
 * mt_gen_destroy(). Batches stay the caller's.
 *
 * Thread safety: a generator is a small mutable cursor: use one from one thread at a time.
 * Different generators (even with the same config) are independent; to generate in parallel,
 * give each thread its own generator and mt_gen_seek() it to its own range.
 */
#ifndef MT_GEN_H
#define MT_GEN_H

#include <stddef.h>
#include <stdint.h>

#include "mt/batch.h"
#include "mt/err.h"

/** The fixed slot ids of the generated examples (see the table above). */
enum {
    MT_GEN_SLOT_USER = 1,
    MT_GEN_SLOT_ITEM = 2,
    MT_GEN_SLOT_USER_SEGMENT = 3,
    MT_GEN_SLOT_ITEM_CATEGORY = 4,
    MT_GEN_SLOT_HOUR = 5,
    MT_GEN_SLOT_ITEM_TAGS = 6,
    MT_GEN_NSLOTS = 6, /* slots per example, in this order (7 with sequences) */
    MT_GEN_SLOT_SEQUENCE = 7
};

/** Behaviours per example at most (cfg.sequence_length). */
#define MT_GEN_MAX_SEQUENCE 64

/** Largest number of live ids per population (user or item) and of latent dimensions. */
#define MT_GEN_MAX_IDS (1ull << 40)
#define MT_GEN_MAX_DIM 64u

/** Fids of one user (slots 1, 3, 5) and at most of one item (slots 2, 4, then 1..64 tags). */
#define MT_GEN_USER_FIDS      3
#define MT_GEN_MAX_ITEM_FIDS  66
/** Largest number of candidates of one mt_gen_draw_request(). */
#define MT_GEN_MAX_CANDIDATES 65536

typedef struct mt_gen_config {
    uint64_t seed; /* everything derives from it */

    /* Users and items: N live ids, Zipf popularity, births per simulated second (0: the id
     * range never moves), popularity half-life by age in seconds (0: no decay; needs births). */
    uint64_t num_users;        /* [1, MT_GEN_MAX_IDS]; default 1,000,000 */
    double user_zipf_exponent; /* (0, 10]; default 0.95 */
    double users_born_per_s;   /* >= 0; default 1 */
    double user_half_life_s;   /* >= 0; default 0 */
    uint64_t num_items;        /* [1, MT_GEN_MAX_IDS]; default 1,000,000 */
    double item_zipf_exponent; /* (0, 10]; default 1.05 */
    double items_born_per_s;   /* >= 0; default 100 (an item lives 10,000 s by default) */
    double item_half_life_s;   /* >= 0; default 21,600 (6 hours) */

    /* Side features. */
    uint32_t num_user_segments;   /* [1, 2^32); default 16 */
    uint32_t num_item_categories; /* [1, 2^32); default 64 */
    uint32_t num_tags;            /* [1, 2^32); default 1000 */
    uint32_t max_tags;            /* tags per item: 1..max_tags (0: slot 6 stays empty); <= 64;
                                     default 3 */

    /* The hidden model. */
    uint32_t latent_dim;      /* [1, MT_GEN_MAX_DIM]; default 8 */
    double target_ctr;        /* (0, 1): mean click probability; default 0.05 */
    double bias_scale;        /* >= 0: weight of the per-entity biases; default 0.5 */
    double interaction_scale; /* >= 0: weight of the dot products; default 0.7 */
    double daily_amplitude;   /* >= 0: logit swing over the day; default 0.3 */
    double drift_period_s;    /* >= 0: one full turn of the item vectors (0: none); default
                                 604,800 (a week) */

    /* Labels per example: 1 (the click) or 2 (the click, then a conversion: see above). */
    uint32_t tasks;         /* 1 or 2; default 1 */
    double conversion_rate; /* (0, 1): a click's conversion probability when the second
                               model's terms are 0; default 0.1 */

    /* The user's recent clicks (slot 7; see above): 0 = none (6 slots). */
    uint32_t sequence_length; /* 0..MT_GEN_MAX_SEQUENCE; default 0 */
    double sequence_scale;    /* [0, 10]: weight of the nearest behaviour's term; default 1 */

    /* The clock. */
    double events_per_s;   /* > 0; default 1000 */
    int64_t start_time_ms; /* >= 0: the first example's timestamp; default 1,700,000,000,000 */
} mt_gen_config_t;

typedef struct mt_gen mt_gen_t;

/** Sets every field of @p cfg to its default (listed beside each field). */
void mt_gen_config_init(mt_gen_config_t *cfg);

/**
 * Checks @p cfg. On error writes a one-line reason naming the field into @p errbuf (if
 * non-NULL and @p errlen > 0).
 * @returns MT_OK or MT_CONFIG.
 */
mt_err_t mt_gen_config_validate(const mt_gen_config_t *cfg, char *errbuf, size_t errlen);

/**
 * Creates a generator positioned at example 0 and calibrates its global bias (a few
 * milliseconds). @p cfg is copied.
 * @param[in]  cfg  the configuration (validated here).
 * @param[out] out  the generator; free it with mt_gen_destroy(). Untouched on error.
 * @returns MT_OK, MT_INVALID (NULL argument), MT_CONFIG (invalid @p cfg), MT_NOMEM.
 */
mt_err_t mt_gen_create(const mt_gen_config_t *cfg, mt_gen_t **out);

/** Frees @p g. NULL is a no-op. */
void mt_gen_destroy(mt_gen_t *g);

/**
 * Replaces the contents of @p batch with the next @p n examples of the stream and advances.
 * @param[in,out] batch      a zeroed batch (it is initialized with the mt_gen_nslots() slots in
 *                           order) or one already holding exactly those slots (its memory is
 *                           reused). Owned by the caller: mt_batch_free() it.
 * @param[in]     n          examples to generate (0 leaves an empty batch).
 * @param[out]    true_p_out NULL, or an array of @p n floats receiving each example's true
 *                           click probability.
 * @returns MT_OK; MT_INVALID (NULL g or batch); MT_MISMATCH (batch holds other slots);
 *          MT_LIMIT (the ids born so far would exceed 48 bits, or the
 *          clock 2^52 ms past the start); MT_NOMEM. On error the
 *          batch holds a prefix of the examples and the position does not move.
 */
mt_err_t mt_gen_next(mt_gen_t *g, mt_batch_t *batch, size_t n, float *true_p_out);

/** @returns the slots of @p g's examples: MT_GEN_NSLOTS, one more with sequences. */
uint32_t mt_gen_nslots(const mt_gen_t *g);

/** The recent clicks of @p user at @p ts_ms (slot 7's fids, most recent first), as the stream
 *  has them. @returns how many were written: cfg.sequence_length. */
size_t mt_gen_user_sequence(const mt_gen_t *g, uint64_t user, int64_t ts_ms,
                            uint64_t out[MT_GEN_MAX_SEQUENCE]);

/** Moves @p g to example @p index of its stream (the next mt_gen_next() starts there). */
void mt_gen_seek(mt_gen_t *g, uint64_t index);

/** @returns the index of the next example @p g will generate. */
uint64_t mt_gen_position(const mt_gen_t *g);

/** @returns the calibrated global bias b0 (the logit of a neutral example). */
double mt_gen_global_bias(const mt_gen_t *g);

/* ---------------- requests: the hidden model as a live environment ----------------
 *
 * For a closed loop (a load generator asking serving to rank candidates, clicks drawn from
 * the truth): instead of the stream's (user, item) pairs, draw a user and a page of
 * candidate items at any time t, and score any (user, item) pair at t with the hidden model.
 * Time t is a timestamp on the generator's clock (>= start_time_ms): births, fading and drift
 * follow t - start_time_ms, the hour slot and the daily cycle follow t itself. None of these
 * functions moves the stream's position, and each is a pure function of (config, arguments):
 * they are safe to call from several threads on one generator at once.
 */

/** @returns the timestamp of example @p index of the stream (start + index / events_per_s). */
int64_t mt_gen_time_ms(const mt_gen_t *g, uint64_t index);

/**
 * Draws request number @p index at time @p ts_ms: a user by popularity among the users alive
 * at ts_ms, and @p k distinct items by popularity among the items alive at ts_ms (fading by
 * age included), as a recommender's candidate retrieval would hand them over. Deterministic in
 * (config, index, ts_ms); independent of the stream of mt_gen_next().
 * @param[out] user   the user id (the value of slot 1)
 * @param[out] items  @p k item ids (values of slot 2), caller-provided, popular ones first
 *                    more often but in draw order
 * @returns MT_OK; MT_INVALID (NULL argument, k > num_items or > MT_GEN_MAX_CANDIDATES);
 *          MT_LIMIT (ts_ms before start_time_ms, or ids or the clock past their limits).
 */
mt_err_t mt_gen_draw_request(const mt_gen_t *g, uint64_t index, int64_t ts_ms, size_t k,
                             uint64_t *user, uint64_t *items);

/**
 * The true click probability of @p user shown @p item at @p ts_ms (the formula at the top of
 * this file: drift at ts_ms, hour and daily cycle of ts_ms). Any ids are accepted, alive or
 * not (an id's bias and vector depend on the id only).
 * @returns MT_OK; MT_INVALID (NULL argument, an id of 2^48 or more); MT_LIMIT (ts_ms before
 *          start_time_ms or past the clock's limit).
 */
mt_err_t mt_gen_true_p(const mt_gen_t *g, uint64_t user, uint64_t item, int64_t ts_ms, double *p);

/** The user-side fids of @p user at @p ts_ms, as the stream has them: user (slot 1), segment
 *  (slot 3), hour of ts_ms (slot 5). */
void mt_gen_user_fids(const mt_gen_t *g, uint64_t user, int64_t ts_ms,
                      uint64_t out[MT_GEN_USER_FIDS]);

/** The item-side fids of @p item: item (slot 2), category (slot 4), its tags (slot 6).
 *  @returns how many were written (2 + the item's tags). */
size_t mt_gen_item_fids(const mt_gen_t *g, uint64_t item, uint64_t out[MT_GEN_MAX_ITEM_FIDS]);

#endif /* MT_GEN_H */
