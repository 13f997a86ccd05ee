/*
 * serving.c - the serving replica (see mt/serving.h and docs/serving.md).
 *
 * File layout: types; config and lifecycle; the model reference (publish / acquire /
 * release); sparse sync (one thread per PS shard); dense sync (one thread); Predict and
 * Lookup; metrics.
 *
 * Invariants:
 *  - the replica table is written only by the sync threads, and the rows of shard i only
 *    by shard i's thread (so "the rows of shard i older than version V" is well defined
 *    while that thread sweeps after a full stream);
 *  - sv->cur (the published model) is never modified after publication: a new dense version
 *    goes into a new model, swapped in under model_lock; the holder of the last reference
 *    frees an old model (a Predict, or the dense thread);
 *  - a worker context (scratch buffers, model workspace) is owned by one Predict at a time:
 *    taken with an atomic exchange on its busy flag, never with a lock.
 *
 * Pooling is the trainer's, both model.h's (mt_model_reduce_fid(), mt_model_pool_add()):
 * for feature slot s, the sums of the embeddings and of the first-order weights of its
 * fids' rows (mt_model_row_floats()), after the same hash_buckets reduction. A request's
 * fids of slot s are the user's followed by the candidate's, a candidate fid the user side
 * already gave being left out: that is how the joiner merges an Impression into the Example
 * the trainer learns from.
 */
#include "mt/strbuf.h"
#include "mt/clock.h"
#include "mt/serving.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "monolith/v1/example.pb-c.h"
#include "monolith/v1/ps.pb-c.h"
#include "monolith/v1/serving.pb-c.h"
#include "mt/kafka.h"
#include "mt/log.h"
#include "mt/model.h"
#include "mt/psclient.h"
#include "mt/route.h"
#include "peers.h"
#include "request.h"
#include "sv_util.h"

#define WHO "serving"

/* SlotFids and Candidates a worker's request reader keeps room for between requests (a
 * request with more frees its arrays after it: sv_req_trim) */
#define REQ_KEEP  65536
#define NO_SLOT   0xFFFFu
#define SYNC_PATH "/monolith.v1.ParameterServer/Sync"

#define HIST_BUCKETS 14
static const double hist_bounds_s[HIST_BUCKETS - 1] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0};

/* ============================== types ============================== */

/* A published model: the dense parameters of one version. refs counts sv->cur's reference
 * and every Predict holding it; guarded by model_lock. */
typedef struct model_ref {
    mt_model_t *m;
    uint64_t version;
    uint32_t refs;
} model_ref_t;

/* Scratch of one Predict: grown as needed, kept for the next. */
typedef struct worker {
    atomic_int busy;
    mt_model_ws_t *ws;
    size_t cap_fids, cap_n, cap_set;
    uint64_t *fids;    /* [fids] ids (reduced) */
    uint16_t *cell;    /* [fids] model slot index of each id */
    float *emb;        /* [fids * (d + 1)] their rows: embedding, first-order weight;
                              with per-slot dims packed, fid k's row at roff[k] */
    size_t *roff;      /* per-slot dims: [fids + 1] each fid's row offset in emb */
    float *E, *W1;     /* [n * D], [n * S] (D: the slots' dims summed) */
    float *probs;      /* [n * T] the model's scores: candidate i's task t at i * T + t */
    float *scores;     /* T > 1 only: [n] task 0 of each candidate (the reply's scores) */
    uint64_t *set;     /* user fids (raw), open addressing, 0 = empty */
    uint8_t *varies;   /* [S] slots the candidates' fids fill (the others: the user's) */
    uint8_t *user_has; /* [S] slots the user's fids fill (varies + S, one allocation) */
    uint32_t *count;   /* [2 * S] mean-pooled slots' ids: the user's, the candidate's */
    size_t seq_cands;  /* din: fids of the sequence slot in candidates (refused) */
    uint8_t *pack;     /* impression encoding, and the packed reply */
    size_t cap_pack;
    size_t *ends;         /* [n] end of each candidate's fids */
    sv_req_t req;         /* the request, read in place */
    sv_fetch_ws_t *fetch; /* peer reads (sharded serving) */
} worker_t;

typedef struct shard {
    struct mt_serving *sv;
    uint32_t idx;
    pthread_t thread;
    int ever;          /* this thread applied a full stream once: the replica may hold its rows */
    int running;       /* its thread was started (held shards only) */
    atomic_int synced; /* a first sync completed (Lookup and Shards read it without a lock) */
    /* Guarded by sv->stat_lock (written by the thread, read by metrics). */
    mt_serving_shard_status_t st;
} shard_t;

typedef struct method_ctx {
    struct mt_serving *sv;
    int idx; /* 0 Predict, 1 Lookup, 2 Shards */
} method_ctx_t;

struct mt_serving {
    mt_serving_config_t cfg;
    char *topic;
    char *params_topic, *bootstrap, **kafka_conf; /* sync_kafka: owned copies */
    uint16_t *slot_index; /* [65536]: model slot index of a feature slot, or NO_SLOT */
    uint16_t mean_idx[MT_SERVING_MAX_SLOTS]; /* model slot indexes of mean-pooled slots */
    /* the model's feature layout (model.h): each slot's table ids, pooling, dim and cell;
     * mixed: the slots' dims differ (rows packed at roff[]) */
    mt_model_layout_t lay;
    int mixed;
    uint32_t n_mean;
    uint32_t ntasks; /* T: scores per candidate (the model's tasks: 1 but for mmoe) */
    mt_table_t *table;
    mt_psc_t *psc;
    mt_rpc_server_t *srv;
    uint32_t max_dim;
    double started_s;
    method_ctx_t ctx[3];

    /* Sharded serving: held[i] = 1 for the shards this node holds (all when not sharded);
     * peers: NULL unless sharded; covered: a discovery round had a peer for every other
     * shard (part of readiness). */
    uint8_t *held;
    uint32_t nheld;
    sv_peers_t *peers;
    atomic_int covered;
    _Atomic uint64_t peer_zero_fids;

    /* Threads. stop_lock guards stopping and started; stop_cond wakes the sleepers. */
    pthread_mutex_t stop_lock;
    pthread_cond_t stop_cond;
    int stopping, started;
    shard_t *shards;
    pthread_t dense_thread;

    /* The published model (model_lock). */
    pthread_mutex_t model_lock;
    model_ref_t *cur;

    /* Dense status and readiness (stat_lock), shard statuses (stat_lock). */
    pthread_mutex_t stat_lock;
    uint64_t dense_pulls, dense_failures;
    uint64_t dense_incarnation; /* shard 0's incarnation at the last good pull */
    double dense_ok_s;
    atomic_int ready;
    _Atomic uint64_t sparse_version; /* the replica's version clock after the last sync */

    /* Workers: pool of cfg.workers contexts. */
    worker_t *workers;

    /* Counters. */
    _Atomic uint64_t predicts, candidates, lookups, ignored_fids;
    _Atomic uint64_t errors[17];
    _Atomic uint64_t logged, log_dropped, log_errors;
    _Atomic uint64_t hist[HIST_BUCKETS], hist_sum_us;
};

/* ============================== config and lifecycle ============================== */

/* The model the trainer trains (mt_trainer_config_t's fields of the same names); @p dims
 * receives each slot's dim, which mc->slot_dims points to when they differ. */
static void model_config(const mt_serving_config_t *c, uint32_t *dims, mt_model_config_t *mc) {
    mt_model_config_init(mc);
    mc->nslots = c->nslots;
    mc->dim = c->dim;
    for (uint32_t s = 0; s < c->nslots && s < MT_SERVING_MAX_SLOTS; s++) {
        dims[s] = c->slot_dim[s] ? c->slot_dim[s] : c->dim;
        if (dims[s] != c->dim) mc->slot_dims = dims;
    }
    mc->nhidden = c->nhidden;
    memcpy(mc->hidden, c->hidden, sizeof(mc->hidden));
    mt_model_family_set(mc, &c->family);
}

_Static_assert(sizeof(((mt_serving_config_t *)0)->hidden) ==
                   sizeof(((mt_model_config_t *)0)->hidden),
               "the MLP's widths are the model's");

void mt_serving_config_init(mt_serving_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->dim = 16;
    mt_model_config_t mc; /* the model's own defaults: MLP, family, cross layers */
    mt_model_config_init(&mc);
    cfg->nhidden = mc.nhidden;
    memcpy(cfg->hidden, mc.hidden, sizeof(cfg->hidden));
    mt_model_family_get(&mc, &cfg->family);
    mt_table_config_init(&cfg->table);
    cfg->negative_rate = 1.0f;
    cfg->sync_interval_ms = 10000;
    cfg->sync_stream_ms = 100;
    cfg->dense_sync_interval_ms = 60000;
    cfg->sync_timeout_ms = 120000;
    cfg->max_candidates = 10000;
    cfg->max_request_fids = 1u << 20;
    cfg->max_message_bytes = 64u << 20;
    cfg->workers = 4;
    cfg->features_topic = "features";
    cfg->params_topic = "params";
    cfg->log_sample_rate = 1.0;
    cfg->peer_timeout_ms = 100;
    cfg->peer_refresh_ms = 1000;
}

static const mt_table_slot_config_t *find_slot(const mt_table_config_t *t, uint32_t slot) {
    for (size_t i = 0; i < t->nslots; i++)
        if (t->slots[i].slot == slot) return &t->slots[i];
    return NULL;
}

static mt_err_t check_config(const mt_serving_config_t *c, char *errbuf, size_t errlen) {
#define BAD(...)                              \
    do {                                      \
        mt_msgf(errbuf, errlen, __VA_ARGS__); \
        return MT_CONFIG;                     \
    } while (0)
    if (c->num_shards < 1 || !c->ps_addrs) BAD("no PS shards (cluster.ps)");
    for (uint32_t i = 0; i < c->num_shards; i++)
        if (!c->ps_addrs[i] || !*c->ps_addrs[i]) BAD("PS shard %u has no address", i);
    if (c->nslots < 1 || c->nslots > MT_SERVING_MAX_SLOTS)
        BAD("nslots: %u feature slots, 1..%d allowed", c->nslots, MT_SERVING_MAX_SLOTS);
    if (c->nhidden > MT_SERVING_MAX_HIDDEN) BAD("nhidden: %u hidden layers", c->nhidden);
    for (uint32_t s = 0; s < c->nslots; s++) {
        if (c->slot_ids[s] >= MT_MODEL_SLOT_LIMIT)
            BAD("feature slot %u is not below %u", c->slot_ids[s], MT_MODEL_SLOT_LIMIT);
        for (uint32_t k = 0; k < s; k++)
            if (c->slot_ids[k] == c->slot_ids[s])
                BAD("feature slot %u listed twice", c->slot_ids[s]);
        if (c->slot_mean[s] > 1) BAD("slot_mean[%u]: %u, 0 (sum) or 1 (mean)", s, c->slot_mean[s]);
        if (c->slot_hash_buckets[s] > (1ull << 48))
            BAD("slot_hash_buckets[%u]: %llu, at most 2^48", s,
                (unsigned long long)c->slot_hash_buckets[s]);
        uint32_t ds = c->slot_dim[s] ? c->slot_dim[s] : c->dim;
        if (ds >= MT_TABLE_MAX_DIM) BAD("slot_dim[%u]: %u, below %u", s, ds, MT_TABLE_MAX_DIM);
    }
    /* per-slot settings are indexed like slot_ids: none past nslots */
    for (uint32_t s = c->nslots; s < MT_SERVING_MAX_SLOTS; s++)
        if (c->slot_hash_buckets[s] || c->slot_mean[s] || c->slot_dim[s])
            BAD("slot_hash_buckets / slot_mean / slot_dim [%u]: set past nslots (%u): they are "
                "indexed like slot_ids",
                s, c->nslots);
    if (!(c->negative_rate > 0.0f && c->negative_rate <= 1.0f))
        BAD("negative_rate: %g is not in (0, 1]", (double)c->negative_rate);
    if (!(c->log_sample_rate >= 0.0 && c->log_sample_rate <= 1.0))
        BAD("log_sample_rate: %g is not in [0, 1]", c->log_sample_rate);
    if (c->sync_interval_ms < 1 || c->dense_sync_interval_ms < 1 || c->sync_timeout_ms < 1)
        BAD("sync intervals and timeout must be positive");
    if (c->sync_stream_ms > 60000) BAD("sync_stream_ms must be at most 60000");
    if (c->max_candidates < 1 || c->max_request_fids < 1 || c->workers < 1 || c->workers > 1024)
        BAD("max_candidates, max_request_fids and workers (1..1024) must be positive");
    if (c->max_message_bytes < 1024)
        BAD("max_message_bytes: %u, at least 1024", c->max_message_bytes);
    if (c->nheld && !c->held_shards) BAD("held_shards: NULL with nheld %u", c->nheld);
    for (uint32_t i = 0; i < c->nheld; i++) {
        if (c->held_shards[i] >= c->num_shards)
            BAD("shards: shard %u is not below the number of shards (%u)", c->held_shards[i],
                c->num_shards);
        for (uint32_t k = 0; k < i; k++)
            if (c->held_shards[k] == c->held_shards[i])
                BAD("shards: shard %u listed twice", c->held_shards[i]);
    }
    if (c->nheld && c->nheld < c->num_shards) {
        if (c->npeers == 0 || !c->peer_addrs)
            BAD("peers: none, but this node holds %u of the %u shards", c->nheld, c->num_shards);
        if (c->npeers > 1024) BAD("peers: %u, at most 1024", c->npeers);
        for (uint32_t j = 0; j < c->npeers; j++)
            if (!c->peer_addrs[j] || !*c->peer_addrs[j]) BAD("peer %u has no address", j);
        if (c->peer_timeout_ms < 1 || c->peer_refresh_ms < 1)
            BAD("peer_timeout_ms and peer_refresh_ms must be positive");
    }
    if (!c->features_topic || !*c->features_topic) BAD("features_topic is empty");
    if (c->sync_kafka && (!c->kafka_bootstrap || !*c->kafka_bootstrap))
        BAD("sync_source kafka needs the Kafka bootstrap servers");
    if (c->sync_kafka && (!c->params_topic || !*c->params_topic)) BAD("params_topic is empty");
    mt_model_config_t mc;
    uint32_t dims[MT_SERVING_MAX_SLOTS];
    model_config(c, dims, &mc);
    /* the table slots the layout reads (mt_model_tables(): none for a din sequence), each of
     * the model's row */
    uint16_t tids[MT_SERVING_MAX_SLOTS];
    uint32_t floats[MT_SERVING_MAX_SLOTS];
    size_t nt;
    mt_err_t err = mt_model_tables(&mc, c->slot_ids, c->slot_mean, c->slot_hash_buckets,
                                   c->hash_buckets, tids, floats, &nt, errbuf, errlen);
    if (err == MT_NOMEM) BAD("out of memory");
    if (err) return err;
    for (size_t k = 0; k < nt; k++) {
        const mt_table_slot_config_t *e = find_slot(&c->table, tids[k]);
        if (!e || e->dim != floats[k])
            BAD("table slot %u: missing or not of the model's row (dim %u + its first-order "
                "weight)",
                tids[k], floats[k] - MT_MODEL_ROW_TAIL);
    }
    return MT_OK;
#undef BAD
}

static void on_covered(void *ud);

mt_err_t mt_serving_create(const mt_serving_config_t *cfg, mt_serving_t **out, char *errbuf,
                           size_t errlen) {
    if (!cfg || !out) return MT_CONFIG;
    mt_err_t err = check_config(cfg, errbuf, errlen);
    if (err) return err;
    mt_serving_t *sv = calloc(1, sizeof(*sv));
    if (!sv) return MT_NOMEM;
    sv->cfg = *cfg;
    sv->cfg.ps_addrs = NULL;
    sv->cfg.table.slots = NULL;
    sv->cfg.features_topic = NULL;
    sv->cfg.kafka_bootstrap = NULL;
    sv->cfg.kafka_conf = NULL;
    sv->cfg.params_topic = NULL;
    sv->cfg.held_shards = NULL;
    sv->cfg.peer_addrs = NULL;
    pthread_mutex_init(&sv->stop_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&sv->stop_cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&sv->model_lock, NULL);
    pthread_mutex_init(&sv->stat_lock, NULL);
    sv->started_s = mt_mono_s();
    err = MT_NOMEM;
    sv->topic = strdup(cfg->features_topic);
    if (cfg->sync_kafka) {
        sv->params_topic = strdup(cfg->params_topic);
        sv->bootstrap = strdup(cfg->kafka_bootstrap);
        if (!sv->params_topic || !sv->bootstrap) goto fail;
        size_t nk = 0;
        while (cfg->kafka_conf && cfg->kafka_conf[nk])
            nk++;
        if (!(sv->kafka_conf = calloc(nk + 1, sizeof(char *)))) goto fail;
        for (size_t k = 0; k < nk; k++)
            if (!(sv->kafka_conf[k] = strdup(cfg->kafka_conf[k]))) goto fail;
    }
    sv->slot_index = malloc(65536 * sizeof(uint16_t));
    sv->shards = calloc(cfg->num_shards, sizeof(shard_t));
    sv->workers = calloc(cfg->workers, sizeof(worker_t));
    sv->held = calloc(cfg->num_shards, 1);
    if (!sv->topic || !sv->slot_index || !sv->shards || !sv->workers || !sv->held) goto fail;
    for (uint32_t i = 0; i < cfg->num_shards; i++)
        sv->held[i] = cfg->nheld == 0;
    for (uint32_t i = 0; i < cfg->nheld; i++)
        sv->held[cfg->held_shards[i]] = 1;
    sv->nheld = cfg->nheld ? cfg->nheld : cfg->num_shards;
    for (uint32_t i = 0; i < 65536; i++)
        sv->slot_index[i] = NO_SLOT;
    {
        mt_model_config_t mc;
        uint32_t dims[MT_SERVING_MAX_SLOTS];
        model_config(cfg, dims, &mc);
        /* (check_config() built it once already) */
        if (mt_model_layout_init(&sv->lay, &mc, cfg->slot_ids, cfg->slot_mean,
                                 cfg->slot_hash_buckets, cfg->hash_buckets, errbuf, errlen)) {
            err = MT_CONFIG;
            goto fail;
        }
    }
    for (uint32_t s = 0; s < cfg->nslots; s++) {
        const mt_model_slot_t *ls = &sv->lay.slot[s];
        sv->slot_index[cfg->slot_ids[s]] = (uint16_t)s;
        if (ls->kind == MT_MODEL_SLOT_MEAN) sv->mean_idx[sv->n_mean++] = (uint16_t)s;
        sv->mixed |= ls->dim != cfg->dim;
    }
    /* mt_model_ntasks() of the model the config builds (asserted against it per Predict) */
    sv->ntasks = mt_model_family_ntasks(&cfg->family);
    for (uint32_t i = 0; i < cfg->num_shards; i++) {
        sv->shards[i].sv = sv;
        sv->shards[i].idx = i;
        sv->shards[i].st.kafka_offset = -1;
    }

    /* The replica: the slots' dims and precision; no filter, no expiry (deletions come from
     * the PS), no optimizer state (SGD keeps none), no change log (nobody syncs from us; a
     * full stream of the replica is what the sweep after a full sync reads). */
    mt_table_slot_config_t *slots = calloc(cfg->table.nslots, sizeof(*slots));
    if (!slots) goto fail;
    for (size_t i = 0; i < cfg->table.nslots; i++) {
        const mt_table_slot_config_t *src = &cfg->table.slots[i];
        mt_table_slot_config_init(&slots[i], src->slot, src->dim);
        slots[i].precision = src->precision;
        slots[i].init = MT_INIT_ZEROS;
        slots[i].opt = MT_OPT_SGD;
        if (src->dim > sv->max_dim) sv->max_dim = src->dim;
    }
    mt_table_config_t tc = cfg->table;
    tc.slots = slots;
    tc.filter_bytes = 0;
    tc.changelog_entries = 0;
    err = mt_table_config_validate(&tc, errbuf, errlen);
    if (!err) err = mt_table_create(&tc, &sv->table);
    free(slots);
    if (err) goto fail;

    mt_psc_config_t pc;
    mt_psc_config_init(&pc);
    pc.addrs = cfg->ps_addrs;
    pc.num_shards = cfg->num_shards;
    pc.deadline_ms = cfg->sync_timeout_ms;
    pc.rpc.tls = cfg->ps_tls;
    if ((err = mt_psc_create(&pc, &sv->psc)) != MT_OK) {
        if (err != MT_NOMEM)
            mt_msgf(errbuf, errlen, "PS channels: %s (TLS files: see the log)", mt_strerror(err));
        goto fail;
    }
    if (sv->nheld < cfg->num_shards) {
        sv_peers_config_t prc = {.addrs = cfg->peer_addrs,
                                 .n = cfg->npeers,
                                 .num_shards = cfg->num_shards,
                                 .held = sv->held,
                                 .timeout_ms = cfg->peer_timeout_ms,
                                 .refresh_ms = cfg->peer_refresh_ms,
                                 .tls = cfg->ps_tls,
                                 .on_covered = on_covered,
                                 .ud = sv};
        if ((err = sv_peers_create(&prc, &sv->peers)) != MT_OK) {
            if (err != MT_NOMEM)
                mt_msgf(errbuf, errlen, "peer channels: %s (see the log)", mt_strerror(err));
            goto fail;
        }
    } else {
        atomic_store(&sv->covered, 1);
    }
    *out = sv;
    return MT_OK;
fail:
    if (err == MT_NOMEM) mt_msgf(errbuf, errlen, "out of memory");
    mt_serving_destroy(sv);
    return err;
}

mt_err_t mt_serving_register(mt_serving_t *sv, mt_rpc_server_t *srv);
void mt_serving_stop(mt_serving_t *sv);

static void worker_free(worker_t *w) {
    mt_model_ws_destroy(w->ws);
    free(w->fids);
    free(w->cell);
    free(w->emb);
    free(w->roff);
    free(w->E);
    free(w->W1);
    free(w->probs);
    free(w->scores);
    free(w->set);
    free(w->varies);
    free(w->count);
    free(w->pack);
    free(w->ends);
    sv_req_free(&w->req);
    sv_fetch_ws_free(w->fetch);
    memset(w, 0, sizeof(*w));
}

void mt_serving_destroy(mt_serving_t *sv) {
    if (!sv) return;
    mt_serving_stop(sv);
    if (sv->cur) {
        mt_model_destroy(sv->cur->m);
        free(sv->cur);
    }
    if (sv->workers)
        for (uint32_t i = 0; i < sv->cfg.workers; i++)
            worker_free(&sv->workers[i]);
    free(sv->workers);
    sv_peers_destroy(sv->peers);
    mt_psc_destroy(sv->psc);
    mt_table_destroy(sv->table);
    free(sv->held);
    free(sv->shards);
    free(sv->slot_index);
    free(sv->topic);
    free(sv->params_topic);
    free(sv->bootstrap);
    for (size_t k = 0; sv->kafka_conf && sv->kafka_conf[k]; k++)
        free(sv->kafka_conf[k]);
    free(sv->kafka_conf);
    pthread_mutex_destroy(&sv->stop_lock);
    pthread_cond_destroy(&sv->stop_cond);
    pthread_mutex_destroy(&sv->model_lock);
    pthread_mutex_destroy(&sv->stat_lock);
    free(sv);
}

mt_table_t *mt_serving_table(mt_serving_t *sv) {
    return sv->table;
}

int mt_serving_ready(mt_serving_t *sv) {
    return atomic_load(&sv->ready);
}

/* Ready once the model and every shard arrived; Health follows (it never goes back). */
static void update_ready(mt_serving_t *sv) {
    if (atomic_load(&sv->ready)) return;
    pthread_mutex_lock(&sv->stat_lock);
    int ok = sv->dense_ok_s > 0 && atomic_load(&sv->covered);
    for (uint32_t i = 0; i < sv->cfg.num_shards && ok; i++)
        ok = !sv->held[i] || sv->shards[i].st.last_ok_s > 0;
    pthread_mutex_unlock(&sv->stat_lock);
    if (!ok) return;
    int expected = 0;
    if (atomic_compare_exchange_strong(&sv->ready, &expected, 1)) {
        if (sv->srv) mt_rpc_server_set_serving(sv->srv, 1);
        if (sv->peers)
            mt_log(MT_LOG_INFO, WHO,
                   "ready: dense parameters and %u of %u shards synced, peers hold the others",
                   sv->nheld, sv->cfg.num_shards);
        else
            mt_log(MT_LOG_INFO, WHO, "ready: dense parameters and %u shards synced",
                   sv->cfg.num_shards);
    }
}

/* The peers' discovery thread: every shard not held here has a peer. */
static void on_covered(void *ud) {
    mt_serving_t *sv = ud;
    if (atomic_load(&sv->covered)) return;
    atomic_store(&sv->covered, 1);
    update_ready(sv);
}

/* Sleeps until @p deadline_s (monotonic) or stop. @returns 1 when stopping. */
static int sleep_until(mt_serving_t *sv, double deadline_s) {
    return sv_sleep_until(&sv->stop_lock, &sv->stop_cond, &sv->stopping, deadline_s);
}

static int stopping(mt_serving_t *sv) {
    pthread_mutex_lock(&sv->stop_lock);
    int s = sv->stopping;
    pthread_mutex_unlock(&sv->stop_lock);
    return s;
}

/* ============================== the model reference ============================== */

static model_ref_t *model_acquire(mt_serving_t *sv) {
    pthread_mutex_lock(&sv->model_lock);
    model_ref_t *r = sv->cur;
    if (r) r->refs++;
    pthread_mutex_unlock(&sv->model_lock);
    return r;
}

static void model_release(mt_serving_t *sv, model_ref_t *r) {
    if (!r) return;
    pthread_mutex_lock(&sv->model_lock);
    uint32_t left = --r->refs;
    pthread_mutex_unlock(&sv->model_lock);
    if (left == 0) {
        mt_model_destroy(r->m);
        free(r);
    }
}

static void model_publish(mt_serving_t *sv, model_ref_t *r) {
    r->refs = 1; /* sv->cur's */
    pthread_mutex_lock(&sv->model_lock);
    model_ref_t *old = sv->cur;
    sv->cur = r;
    pthread_mutex_unlock(&sv->model_lock);
    model_release(sv, old);
}

/* ============================== sparse sync ============================== */

/* Removes the rows of shard sh that the full stream started at replica version v0 did not
 * write: they are older than v0 and no longer on the shard. */
static mt_err_t sweep(shard_t *sh, uint64_t v0, uint64_t *removed_out) {
    mt_serving_t *sv = sh->sv;
    enum { CAP = 4096 };
    mt_table_changes_t *it = NULL;
    mt_table_change_t *ents = malloc(CAP * sizeof(*ents));
    float *vals = malloc((size_t)CAP * sv->max_dim * sizeof(float));
    uint64_t *gone = malloc(CAP * sizeof(uint64_t));
    uint64_t upto, removed = 0;
    int full;
    mt_err_t err = MT_NOMEM;
    if (!ents || !vals || !gone) goto out;
    if ((err = mt_table_changes_begin(sv->table, 0, &it, &upto, &full)) != MT_OK) goto out;
    for (;;) {
        size_t n = 0, ng = 0;
        err = mt_table_changes_next(it, ents, CAP, vals, (size_t)CAP * sv->max_dim, &n);
        if (err || n == 0) break;
        for (size_t i = 0; i < n; i++)
            if (!ents[i].deleted && ents[i].version <= v0 &&
                mt_route_shard_of(ents[i].fid, sv->cfg.num_shards) == sh->idx)
                gone[ng++] = ents[i].fid;
        uint64_t r = 0;
        if (ng) mt_table_remove(sv->table, gone, ng, &r);
        removed += r;
    }
out:
    mt_table_changes_end(it);
    free(ents);
    free(vals);
    free(gone);
    *removed_out = removed;
    return err;
}

/* Applies one chunk in order: runs of upserts (assign) and runs of deletions (remove). */
static mt_err_t apply_chunk(shard_t *sh, const Monolith__V1__SyncChunk *ch, uint64_t *entries,
                            uint64_t *deleted, char *why, size_t whylen) {
    mt_serving_t *sv = sh->sv;
    size_t n = ch->n_fids;
    if (ch->deleted.len != n) {
        mt_msgf(why, whylen, "chunk of %zu entries has %zu deletion flags", n, ch->deleted.len);
        return MT_CORRUPT;
    }
    size_t need = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t dim;
        if (mt_table_dim(sv->table, ch->fids[i], &dim) != MT_OK) {
            mt_msgf(why, whylen,
                    "fid 0x%016llx of slot %u: the replica has no such slot (the PS and serving "
                    "configurations differ)",
                    (unsigned long long)ch->fids[i], MT_FID_SLOT(ch->fids[i]));
            return MT_MISMATCH;
        }
        if (!ch->deleted.data[i]) need += dim;
    }
    if (need != ch->n_values) {
        mt_msgf(why, whylen, "chunk has %zu values, its entries need %zu", ch->n_values, need);
        return MT_CORRUPT;
    }
    uint32_t now_s = (uint32_t)time(NULL);
    size_t i = 0, off = 0;
    while (i < n) {
        uint8_t del = ch->deleted.data[i] != 0;
        size_t j = i, nv = 0;
        while (j < n && (ch->deleted.data[j] != 0) == del) {
            if (!del) {
                uint32_t dim;
                mt_table_dim(sv->table, ch->fids[j], &dim);
                nv += dim;
            }
            j++;
        }
        mt_err_t err;
        if (del) {
            err = mt_table_remove(sv->table, ch->fids + i, j - i, NULL);
            *deleted += j - i;
        } else {
            err =
                mt_table_assign(sv->table, ch->fids + i, j - i, ch->values + off, nv, now_s, NULL);
            off += nv;
        }
        if (err) {
            mt_msgf(why, whylen, "applying: %s", mt_strerror(err));
            return err;
        }
        *entries += j - i;
        i = j;
    }
    return MT_OK;
}

/* What one round of a Sync stream did (sync_once() commits it at its caught_up chunk). */
typedef struct sync_round {
    int started, full;
    uint64_t entries, deleted, v0;
    double t0;
} sync_round_t;

/* The round is applied whole (the replica is consistent at @p upto): sweep after a full
 * one, record the shard's position, publish, log. */
static mt_err_t round_done(shard_t *sh, sync_round_t *r, uint64_t upto, uint64_t inc, char *why,
                           size_t whylen) {
    mt_serving_t *sv = sh->sv;
    uint64_t swept = 0;
    if (r->full && sh->ever) {
        mt_err_t err = sweep(sh, r->v0, &swept);
        if (err != MT_OK) {
            mt_msgf(why, whylen, "sweeping the shard's old rows: %s", mt_strerror(err));
            return err;
        }
    }
    if (r->full) sh->ever = 1;
    double t1 = mt_mono_s();
    pthread_mutex_lock(&sv->stat_lock);
    sh->st.syncs++;
    sh->st.full_syncs += r->full != 0;
    sh->st.since_version = upto;
    sh->st.incarnation = inc;
    sh->st.last_ok_s = t1;
    sh->st.last_duration_s = t1 - r->t0;
    sh->st.entries += r->entries;
    sh->st.deleted += r->deleted;
    pthread_mutex_unlock(&sv->stat_lock);
    atomic_store(&sh->synced, 1);
    mt_table_stats_t ts;
    mt_table_stats(sv->table, &ts);
    atomic_store(&sv->sparse_version, ts.version);
    if (r->full || r->entries)
        mt_log(r->full ? MT_LOG_INFO : MT_LOG_DEBUG, WHO,
               "shard %u: %s sync, %llu entries (%llu deleted, %llu swept) in %.3f s, up to "
               "version %llu",
               sh->idx, r->full ? "full" : "incremental", (unsigned long long)r->entries,
               (unsigned long long)r->deleted, (unsigned long long)swept, t1 - r->t0,
               (unsigned long long)upto);
    update_ready(sv);
    memset(r, 0, sizeof(*r));
    return MT_OK;
}

/*
 * One Sync stream from shard sh: the catch-up round, then (following, sync_stream_ms > 0)
 * a round every sync_stream_ms until the shard ends the stream. Each round is applied in
 * order and recorded at its caught_up chunk, so a stream that breaks loses only its current
 * round (the next stream starts from the last recorded version).
 * @param[out] rounds  rounds completed
 * @returns MT_OK, or an error (logged and counted).
 */
static mt_err_t sync_once(shard_t *sh, uint32_t follow_ms, unsigned *rounds) {
    mt_serving_t *sv = sh->sv;
    char why[512] = "";
    pthread_mutex_lock(&sv->stat_lock);
    uint64_t since = sh->st.since_version, inc = sh->st.incarnation;
    pthread_mutex_unlock(&sv->stat_lock);
    Monolith__V1__SyncRequest rq = MONOLITH__V1__SYNC_REQUEST__INIT;
    rq.since_version = since;
    rq.incarnation = inc;
    rq.max_chunk_fids = sv->cfg.sync_chunk_fids;
    rq.follow_ms = follow_ms;
    uint8_t req[64];
    size_t rlen = monolith__v1__sync_request__pack(&rq, req);
    mt_rpc_stream_t *s = NULL;
    mt_rpc_status_t st = {0};
    sync_round_t r = {0};
    int done = 0;
    *rounds = 0;
    r.t0 = mt_mono_s();
    mt_err_t err = mt_rpc_stream_open(mt_psc_channel(sv->psc, sh->idx), SYNC_PATH, req, rlen,
                                      sv->cfg.sync_timeout_ms, &s);
    if (err) {
        mt_msgf(why, sizeof(why), "cannot open the stream");
        goto out;
    }
    while (!done) {
        uint8_t *buf = NULL;
        size_t len = 0;
        err = mt_rpc_stream_next(s, &buf, &len);
        if (err == MT_NOT_FOUND) {
            /* ended without a last chunk: the status says why */
            mt_rpc_stream_close(s, &st);
            s = NULL;
            err = st.code == MT_RPC_OK ? MT_CORRUPT : MT_UNAVAILABLE;
            mt_msgf(why, sizeof(why), "stream ended early: status %d: %s", st.code, st.message);
            goto out;
        }
        if (err) {
            mt_msgf(why, sizeof(why), "stream broken");
            goto out;
        }
        Monolith__V1__SyncChunk *ch = monolith__v1__sync_chunk__unpack(NULL, len, buf);
        free(buf);
        if (!ch) {
            err = MT_CORRUPT;
            mt_msgf(why, sizeof(why), "malformed SyncChunk");
            goto out;
        }
        if (!r.started) {
            r.started = 1;
            r.full = ch->full;
            if (*rounds) r.t0 = mt_mono_s();
            if (r.full && *rounds) {
                /* a shard answers a follow round that would be full with an error instead */
                monolith__v1__sync_chunk__free_unpacked(ch, NULL);
                err = MT_CORRUPT;
                mt_msgf(why, sizeof(why), "a full round in the middle of a stream");
                goto out;
            }
            if (r.full) {
                /* The sweep's barrier: every row this round writes must get a version above
                 * v0. The table's clocks are per part (a part's next version can be below
                 * mt_table_stats()' maximum); mt_table_changes_begin() publishes one above
                 * every part's, which later writes in any part exceed. (With the stats'
                 * maximum, a second full sync of a shard swept rows it had just written.) */
                mt_table_changes_t *barrier = NULL;
                int unused;
                err = mt_table_changes_begin(sv->table, 0, &barrier, &r.v0, &unused);
                mt_table_changes_end(barrier);
                if (err) {
                    monolith__v1__sync_chunk__free_unpacked(ch, NULL);
                    mt_msgf(why, sizeof(why), "full round: %s", mt_strerror(err));
                    goto out;
                }
            }
        }
        err = apply_chunk(sh, ch, &r.entries, &r.deleted, why, sizeof(why));
        done = ch->last;
        int caught_up = ch->caught_up || ch->last;
        uint64_t upto = ch->upto_version, new_inc = ch->incarnation;
        monolith__v1__sync_chunk__free_unpacked(ch, NULL);
        if (err) goto out;
        if (caught_up) {
            if ((err = round_done(sh, &r, upto, new_inc, why, sizeof(why))) != MT_OK) goto out;
            ++*rounds;
        }
        if (!done && stopping(sv)) {
            err = MT_CANCELLED;
            mt_msgf(why, sizeof(why), "stopping");
            goto out;
        }
    }
out:
    if (s) mt_rpc_stream_close(s, &st);
    pthread_mutex_lock(&sv->stat_lock);
    if (err) sh->st.failures++;
    sh->st.entries += r.entries; /* a round cut short: applied, not recorded */
    sh->st.deleted += r.deleted;
    pthread_mutex_unlock(&sv->stat_lock);
    if (err && err != MT_CANCELLED)
        mt_log(MT_LOG_WARN, WHO, "sync of shard %u failed (retried in %u ms): %s: %s", sh->idx,
               sv->cfg.sync_interval_ms, mt_strerror(err), why);
    return err;
}

static void *sync_main(void *arg) {
    shard_t *sh = arg;
    mt_serving_t *sv = sh->sv;
    /* Polling: a fixed rate, a sync starts every interval however long the last took (a
     * late one starts at once, and ticks missed meanwhile are skipped), so that the
     * replica's age stays under interval + one sync's duration. Following: a stream that
     * followed (more than its catch-up round) ended normally (the shard's age limit, its
     * shutdown): open the next one at once. A failure waits one interval when polling, and
     * at most 1 s when following (a stream that broke is reopened soon, whatever the
     * interval). */
    double period = sv->cfg.sync_interval_ms / 1000.0, next = mt_mono_s();
    while (!sleep_until(sv, next)) {
        unsigned rounds = 0;
        mt_err_t err = sync_once(sh, sv->cfg.sync_stream_ms, &rounds);
        double now = mt_mono_s();
        if (err) {
            next = now + (sv->cfg.sync_stream_ms && period > 1.0 ? 1.0 : period);
        } else if (rounds > 1) {
            next = now;
        } else {
            next += period;
            if (next < now) next = now;
        }
    }
    return NULL;
}

/* ---------------- following through Kafka (docs/serving.md) ---------------- */

#define KAFKA_POLL_MS 200 /* a poll's wait: how soon a stop is noticed */

/* Counts one return to a direct sync and says why. @returns MT_OK (a resync is not a
 * failure of the replica: the next bootstrap takes it). */
static mt_err_t kafka_resync(shard_t *sh, int failure, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static mt_err_t kafka_resync(shard_t *sh, int failure, const char *fmt, ...) {
    mt_serving_t *sv = sh->sv;
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&sv->stat_lock);
    sh->st.kafka_resyncs++;
    sh->st.failures += failure != 0;
    pthread_mutex_unlock(&sv->stat_lock);
    mt_log(failure ? MT_LOG_WARN : MT_LOG_INFO, WHO, "shard %u: %s: syncing from the shard again",
           sh->idx, why);
    return failure ? MT_CORRUPT : MT_OK;
}

/*
 * One life of following shard sh through Kafka: (1) the partition's end offset O, (2) a Sync
 * from the shard (one round: full when the replica has nothing of this incarnation), (3)
 * the partition from O on, skipping rounds the Sync already covered (upto_version <= the
 * replica's) and applying the others in order, each recorded at its caught_up chunk. It
 * returns to the caller (who starts it again) at a resync marker of a newer version, a
 * chunk of another incarnation, a round starting above the replica's version (a gap), an
 * offset out of range, a malformed message, or a stop. No message between the Sync and O
 * can be missing: each was published from a table read before the Sync's, and the one at
 * O starts where the one before it ended.
 * @returns MT_OK (a stop or a resync), or an error (logged and counted).
 */
static mt_err_t kafka_follow(shard_t *sh, mt_kafka_reader_t *r) {
    mt_serving_t *sv = sh->sv;
    const char *topic = sv->params_topic;
    int32_t part = (int32_t)sh->idx;
    char why[512] = "";
    int64_t end = -1;
    mt_err_t err = mt_kafka_reader_end(r, topic, part, 5000, NULL, &end, why, sizeof(why));
    if (err) {
        pthread_mutex_lock(&sv->stat_lock);
        sh->st.failures++;
        pthread_mutex_unlock(&sv->stat_lock);
        mt_log(MT_LOG_WARN, WHO,
               "shard %u: the end of %s[%d]: %s: %s (the partition must "
               "exist: one per shard)",
               sh->idx, topic, (int)part, mt_strerror(err), why);
        return err;
    }
    unsigned rounds = 0;
    if ((err = sync_once(sh, 0, &rounds)) != MT_OK) return err; /* logged and counted */
    if ((err = mt_kafka_reader_start(r, topic, part, end, why, sizeof(why))) != MT_OK) {
        mt_log(MT_LOG_WARN, WHO, "shard %u: reading %s[%d]: %s", sh->idx, topic, (int)part, why);
        return err;
    }
    pthread_mutex_lock(&sv->stat_lock);
    sh->st.kafka_offset = end;
    pthread_mutex_unlock(&sv->stat_lock);
    sync_round_t rd = {0};
    int64_t next = end;
    mt_kafka_msg_t msgs[64];
    while (!stopping(sv)) {
        mt_kafka_reader_event_t ev;
        size_t n = mt_kafka_reader_poll(r, msgs, 64, KAFKA_POLL_MS, &ev);
        if (ev.out_of_range) {
            err = kafka_resync(sh, 0, "offset %lld of %s[%d] is no longer in the log",
                               (long long)next, topic, (int)part);
            goto resynced;
        }
        for (size_t i = 0; i < n; i++) {
            if (msgs[i].partition != part || msgs[i].offset < next) continue; /* an old start */
            next = msgs[i].offset + 1;
            Monolith__V1__SyncChunk *ch =
                msgs[i].value ? monolith__v1__sync_chunk__unpack(NULL, msgs[i].len, msgs[i].value)
                              : NULL;
            if (!ch) {
                err = kafka_resync(sh, 1, "%s[%d] offset %lld is not a SyncChunk (%zu bytes)",
                                   topic, (int)part, (long long)msgs[i].offset, msgs[i].len);
                goto resynced;
            }
            pthread_mutex_lock(&sv->stat_lock);
            uint64_t since = sh->st.since_version, inc = sh->st.incarnation;
            sh->st.kafka_offset = next;
            pthread_mutex_unlock(&sv->stat_lock);
            uint64_t upto = ch->upto_version, from = ch->since_version;
            int old = ch->incarnation == inc && upto <= since;
            if (ch->incarnation != inc) {
                uint64_t other = ch->incarnation;
                monolith__v1__sync_chunk__free_unpacked(ch, NULL);
                err = kafka_resync(sh, 0,
                                   "%s[%d] offset %lld: incarnation %llx, the replica's "
                                   "is %llx",
                                   topic, (int)part, (long long)msgs[i].offset,
                                   (unsigned long long)other, (unsigned long long)inc);
                goto resynced;
            }
            if (ch->full && !old) {
                monolith__v1__sync_chunk__free_unpacked(ch, NULL);
                err =
                    kafka_resync(sh, 0, "resync marker at version %llu", (unsigned long long)upto);
                goto resynced;
            }
            if (old) {
                /* published before the replica's version: the Sync had it. A round's end at
                 * exactly that version is a heartbeat: nothing changed, and the replica is
                 * as fresh as the shard's last round */
                int beat = ch->caught_up && upto == since && !rd.started;
                monolith__v1__sync_chunk__free_unpacked(ch, NULL);
                pthread_mutex_lock(&sv->stat_lock);
                sh->st.kafka_skipped += !beat;
                pthread_mutex_unlock(&sv->stat_lock);
                if (beat) {
                    rd.t0 = mt_mono_s();
                    if ((err = round_done(sh, &rd, since, inc, why, sizeof(why))) != MT_OK) break;
                }
                continue;
            }
            if (from > since) {
                monolith__v1__sync_chunk__free_unpacked(ch, NULL);
                err = kafka_resync(sh, 1,
                                   "%s[%d] offset %lld starts at version %llu, the "
                                   "replica is at %llu (a round is missing)",
                                   topic, (int)part, (long long)msgs[i].offset,
                                   (unsigned long long)from, (unsigned long long)since);
                goto resynced;
            }
            if (!rd.started) {
                rd.started = 1;
                rd.t0 = mt_mono_s();
            }
            err = apply_chunk(sh, ch, &rd.entries, &rd.deleted, why, sizeof(why));
            int caught_up = ch->caught_up;
            monolith__v1__sync_chunk__free_unpacked(ch, NULL);
            if (!err && caught_up) err = round_done(sh, &rd, upto, inc, why, sizeof(why));
            if (err) break;
        }
        if (err) break;
    }
    if (err) {
        pthread_mutex_lock(&sv->stat_lock);
        sh->st.failures++;
        pthread_mutex_unlock(&sv->stat_lock);
        mt_log(MT_LOG_WARN, WHO, "shard %u: following %s[%d]: %s: %s", sh->idx, topic, (int)part,
               mt_strerror(err), why);
    }
resynced: /* kafka_resync() counted and logged it */
    pthread_mutex_lock(&sv->stat_lock);
    sh->st.entries += rd.entries; /* a round cut short: applied, not recorded */
    sh->st.deleted += rd.deleted;
    sh->st.kafka_offset = -1;
    pthread_mutex_unlock(&sv->stat_lock);
    return err;
}

static void *sync_kafka_main(void *arg) {
    shard_t *sh = arg;
    mt_serving_t *sv = sh->sv;
    mt_kafka_reader_t *r = NULL;
    double next = mt_mono_s();
    while (!sleep_until(sv, next)) {
        mt_err_t err = MT_OK;
        if (!r) {
            char why[512] = "";
            const char *const *conf = (const char *const *)sv->kafka_conf;
            if ((err = mt_kafka_reader_create(sv->bootstrap, conf, &r, why, sizeof(why))))
                mt_log(MT_LOG_ERROR, WHO, "shard %u: a Kafka reader on %s: %s", sh->idx,
                       sv->bootstrap, why);
        }
        if (!err) err = kafka_follow(sh, r);
        /* a resync at once; a failure after a pause (at most 1 s) */
        next =
            mt_mono_s() +
            (err ? (sv->cfg.sync_interval_ms > 1000 ? 1.0 : sv->cfg.sync_interval_ms / 1000.0) : 0);
    }
    mt_kafka_reader_destroy(r);
    return NULL;
}

/* ============================== dense sync ============================== */

static mt_err_t new_model(mt_serving_t *sv, mt_model_t **out) {
    mt_model_config_t mc;
    uint32_t dims[MT_SERVING_MAX_SLOTS];
    model_config(&sv->cfg, dims, &mc);
    return mt_model_create(&mc, out);
}

/* The dense thread's own state (only it publishes models). */
typedef struct dense_state {
    mt_model_t *spare;   /* pulled into; published when the PS had a newer version */
    uint64_t version;    /* of the published model */
    uint64_t inc0;       /* shard 0's incarnation when it was pulled */
    int have;            /* a model was published */
    int told;            /* "waiting for the dense parameters" was logged */
    mt_psc_tensor_t *ts; /* [mt_model_nparams()] the spare's tensors as pulled (their count
                            is the config's: dcnv2's cross layers and mmoe's towers add to
                            the MLP's) */
} dense_state_t;

static void dense_once(mt_serving_t *sv, dense_state_t *ds) {
    mt_err_t err = MT_OK;
    if (!ds->spare && (err = new_model(sv, &ds->spare)) != MT_OK) {
        mt_log(MT_LOG_ERROR, WHO, "dense: cannot create a model: %s", mt_strerror(err));
        return;
    }
    size_t n = mt_model_nparams(ds->spare);
    if (!ds->ts && !(ds->ts = calloc(n, sizeof(*ds->ts)))) {
        mt_log(MT_LOG_ERROR, WHO, "dense: out of memory");
        return;
    }
    mt_psc_tensor_t *ts = ds->ts;
    for (size_t i = 0; i < n; i++) {
        mt_model_param_t p;
        mt_model_param(ds->spare, i, &p);
        ts[i] = (mt_psc_tensor_t){p.name, p.ndim, {p.shape[0], p.shape[1]}, p.size, p.values};
    }
    pthread_mutex_lock(&sv->stat_lock);
    uint64_t inc0 = sv->shards[0].st.incarnation;
    pthread_mutex_unlock(&sv->stat_lock);
    /* another life of shard 0 restarts its version clock: ask for everything */
    uint64_t have = ds->have && inc0 == ds->inc0 ? ds->version : 0;
    uint64_t version = 0;
    int updated = 0;
    mt_rpc_status_t st = {0};
    err = mt_psc_pull_dense(sv->psc, ts, n, have, &version, &updated, &st);
    if (!err && !updated && have && version < have) {
        /* shard 0's clock went back: another life of it (seen here when this node does not
         * hold shard 0, so never learns its incarnation from a Sync): ask for everything */
        have = 0;
        err = mt_psc_pull_dense(sv->psc, ts, n, 0, &version, &updated, &st);
    }
    if (!err && updated) {
        model_ref_t *r = calloc(1, sizeof(*r));
        if (!r) {
            err = MT_NOMEM;
        } else {
            r->m = ds->spare;
            r->version = version;
            ds->spare = NULL;
            ds->version = version;
            ds->have = 1;
            model_publish(sv, r);
            mt_log(MT_LOG_DEBUG, WHO, "dense version %llu", (unsigned long long)version);
        }
    }
    if (!err) ds->inc0 = inc0;
    if (!err && !ds->have && !ds->told) {
        ds->told = 1;
        mt_log(MT_LOG_INFO, WHO,
               "shard 0 holds no dense parameters yet (no trainer pushed them): not serving "
               "until it does");
    }
    pthread_mutex_lock(&sv->stat_lock);
    if (err) {
        sv->dense_failures++;
    } else {
        sv->dense_pulls++;
        if (ds->have) sv->dense_ok_s = mt_mono_s();
    }
    pthread_mutex_unlock(&sv->stat_lock);
    if (err) {
        mt_log(err == MT_NOT_FOUND ? MT_LOG_INFO : MT_LOG_WARN, WHO,
               "dense pull from shard 0 failed (retried): %s (status %d: %s)", mt_strerror(err),
               st.code, st.message);
        return;
    }
    update_ready(sv);
}

static void *dense_main(void *arg) {
    mt_serving_t *sv = arg;
    dense_state_t ds = {0};
    double next = mt_mono_s();
    while (!sleep_until(sv, next)) {
        dense_once(sv, &ds);
        /* until the first model arrives, retry at the sparse pace (at most 1 s) */
        uint32_t ms = sv->cfg.dense_sync_interval_ms;
        if (!ds.have) {
            ms = sv->cfg.sync_interval_ms;
            if (ms > 1000) ms = 1000;
        }
        next = mt_mono_s() + ms / 1000.0;
    }
    mt_model_destroy(ds.spare);
    free(ds.ts);
    return NULL;
}

mt_err_t mt_serving_start(mt_serving_t *sv) {
    pthread_mutex_lock(&sv->stop_lock);
    if (sv->started) {
        pthread_mutex_unlock(&sv->stop_lock);
        return MT_INVALID;
    }
    sv->started = 1;
    sv->stopping = 0;
    pthread_mutex_unlock(&sv->stop_lock);
    uint32_t i = 0;
    for (; i < sv->cfg.num_shards; i++) {
        if (!sv->held[i]) continue;
        if (pthread_create(&sv->shards[i].thread, NULL,
                           sv->cfg.sync_kafka ? sync_kafka_main : sync_main, &sv->shards[i]) != 0)
            break;
        sv->shards[i].running = 1;
    }
    int dense_ok =
        i == sv->cfg.num_shards && pthread_create(&sv->dense_thread, NULL, dense_main, sv) == 0;
    if (dense_ok && (!sv->peers || sv_peers_start(sv->peers) == MT_OK)) return MT_OK;
    pthread_mutex_lock(&sv->stop_lock);
    sv->stopping = 1;
    pthread_cond_broadcast(&sv->stop_cond);
    pthread_mutex_unlock(&sv->stop_lock);
    if (dense_ok) pthread_join(sv->dense_thread, NULL);
    for (uint32_t k = 0; k < sv->cfg.num_shards; k++)
        if (sv->shards[k].running) {
            pthread_join(sv->shards[k].thread, NULL);
            sv->shards[k].running = 0;
        }
    pthread_mutex_lock(&sv->stop_lock);
    sv->started = 0;
    pthread_mutex_unlock(&sv->stop_lock);
    return MT_NOMEM;
}

void mt_serving_stop(mt_serving_t *sv) {
    pthread_mutex_lock(&sv->stop_lock);
    int was = sv->started;
    sv->stopping = 1;
    sv->started = 0;
    pthread_cond_broadcast(&sv->stop_cond);
    pthread_mutex_unlock(&sv->stop_lock);
    if (!was) return;
    sv_peers_stop(sv->peers);
    for (uint32_t i = 0; i < sv->cfg.num_shards; i++)
        if (sv->shards[i].running) {
            pthread_join(sv->shards[i].thread, NULL);
            sv->shards[i].running = 0;
        }
    pthread_join(sv->dense_thread, NULL);
}

/* ============================== Predict and Lookup ============================== */

static worker_t *worker_get(mt_serving_t *sv, worker_t *tmp) {
    for (uint32_t i = 0; i < sv->cfg.workers; i++)
        if (!atomic_exchange(&sv->workers[i].busy, 1)) return &sv->workers[i];
    memset(tmp, 0, sizeof(*tmp)); /* all busy: a scratch for this call only */
    return tmp;
}

static void worker_put(mt_serving_t *sv, worker_t *w, worker_t *tmp) {
    if (w == tmp)
        worker_free(tmp);
    else
        atomic_store(&w->busy, 0);
    (void)sv;
}

/* Sizes the scratch for @p nf fids and @p n candidates. @returns 0 or -1 (out of memory). */
static int worker_reserve(mt_serving_t *sv, worker_t *w, size_t nf, size_t n, size_t nuser) {
    size_t d = sv->lay.max_dim, S = sv->cfg.nslots, D = sv->lay.width;
    if (!w->ws && mt_model_ws_create(&w->ws) != MT_OK) return -1;
    if (!w->varies) {
        if (!(w->varies = malloc(2 * S))) return -1;
        w->user_has = w->varies + S;
    }
    if (!w->count && !(w->count = calloc(2 * S, sizeof(uint32_t)))) return -1;
    if (nf > w->cap_fids) {
        if (sv_grow((void **)&w->fids, nf, sizeof(uint64_t)) ||
            sv_grow((void **)&w->cell, nf, sizeof(uint16_t)) ||
            sv_grow((void **)&w->emb, nf * mt_model_row_floats((uint32_t)d), sizeof(float)) ||
            (sv->mixed && sv_grow((void **)&w->roff, nf + 1, sizeof(size_t))))
            return -1;
        w->cap_fids = nf;
    }
    size_t rows = n + 1; /* row 0: the user's pooled part */
    if (rows > w->cap_n) {
        if (sv_grow((void **)&w->E, rows * D, sizeof(float)) ||
            sv_grow((void **)&w->W1, rows * S, sizeof(float)) ||
            sv_grow((void **)&w->probs, rows * sv->ntasks, sizeof(float)) ||
            (sv->ntasks > 1 && sv_grow((void **)&w->scores, rows, sizeof(float))) ||
            sv_grow((void **)&w->ends, rows, sizeof(size_t)))
            return -1;
        w->cap_n = rows;
    }
    size_t sz = 16;
    while (sz < 2 * nuser)
        sz *= 2;
    if (sz > w->cap_set) {
        if (sv_grow((void **)&w->set, sz, sizeof(uint64_t))) return -1;
        w->cap_set = sz;
    }
    memset(w->set, 0, w->cap_set * sizeof(uint64_t));
    memset(w->varies, 0, 2 * S);
    return 0;
}

static size_t set_pos(const worker_t *w, uint64_t f) {
    return (size_t)((f * 0x9E3779B97F4A7C15ull) >> 17) & (w->cap_set - 1);
}

static void set_add(worker_t *w, uint64_t f) {
    if (f == 0) return; /* 0 marks empty: fid 0 is never deduplicated */
    size_t h = set_pos(w, f);
    while (w->set[h] && w->set[h] != f)
        h = (h + 1) & (w->cap_set - 1);
    w->set[h] = f;
}

static int set_has(const worker_t *w, uint64_t f) {
    if (f == 0) return 0;
    size_t h = set_pos(w, f);
    while (w->set[h]) {
        if (w->set[h] == f) return 1;
        h = (h + 1) & (w->cap_set - 1);
    }
    return 0;
}

#define FAIL(sv, c, code, ...)                    \
    do {                                          \
        atomic_fetch_add(&(sv)->errors[code], 1); \
        mt_rpc_fail(c, code, __VA_ARGS__);        \
    } while (0)

/* Reply sizes, checked against cfg.max_message_bytes before a request is worked on: gRPC
 * refuses to send a message over the server's limit, and would do so only after the work.
 * Protobuf encoding: a length-delimited field of fields 1..15 is a one-byte tag, the
 * length as a varint, the bytes; proto3 leaves an empty one out. */
static uint64_t varint_bytes(uint64_t v) {
    uint64_t n = 1;
    for (; v >= 0x80; v >>= 7)
        n++;
    return n;
}

static uint64_t len_field_bytes(uint64_t len) {
    return len ? 1 + varint_bytes(len) + len : 0;
}

/* LookupResponse: values (packed floats), found (one byte per fid). Exact. */
static uint64_t lookup_reply_bytes(uint64_t nfids, uint64_t nfloats) {
    return len_field_bytes(4 * nfloats) + len_field_bytes(nfids);
}

/* PredictResponse: scores (packed floats), then sparse_version and dense_version (a tag and
 * a varint of at most 10 bytes each); with T > 1 tasks also task_scores (n * T packed floats)
 * and tasks (a tag and a varint). The largest encoding of n candidates' scores. */
static uint64_t predict_reply_max_bytes(uint64_t n, uint32_t T) {
    uint64_t tasks = T > 1 ? len_field_bytes(4 * n * T) + 1 + varint_bytes(T) : 0;
    return len_field_bytes(4 * n) + tasks + 2 * (1 + 10);
}

/* Counts the fids of SlotFids sf[0, n): those of model slots into *nf, the others into
 * *ignored (sv_req_parse() checked their slots). */
static void count_fids(const mt_serving_t *sv, const sv_sf_t *sf, size_t n, size_t *nf,
                       size_t *ignored) {
    for (size_t i = 0; i < n; i++) {
        if (sv->slot_index[sf[i].slot] == NO_SLOT)
            *ignored += sf[i].nfids;
        else
            *nf += sf[i].nfids;
    }
}

/* Appends the fids of model slots in sf to the worker's lists, as the layout's table ids
 * (those it does not read, past a sequence's length, left out). With @p dedup (a
 * candidate's), skips those in the user set and flags the slots filled in w->varies; without
 * (the user's), adds them to the set and counts them per slot in w->count. A candidate's
 * fids of a sequence slot (din: the user's) are counted in w->seq_cands, not taken.
 * @returns the new count. */
static size_t collect(const mt_serving_t *sv, worker_t *w, size_t k, const sv_sf_t *sf, size_t n,
                      int dedup) {
    for (size_t i = 0; i < n; i++) {
        uint16_t s = sv->slot_index[sf[i].slot];
        if (s == NO_SLOT) continue;
        const mt_model_slot_t *ls = &sv->lay.slot[s];
        if (dedup && ls->kind == MT_MODEL_SLOT_SEQ) {
            w->seq_cands += sf[i].nfids;
            continue;
        }
        sv_fids_t it;
        uint64_t raw;
        sv_fids_begin(&it, &w->req, &sf[i]);
        while (sv_fids_next(&it, &raw)) {
            /* a fid holds its slot: only a slot the user fills can repeat a user fid */
            if (dedup && w->user_has[s] && set_has(w, raw)) continue;
            /* (a candidate's position only matters in a sequence, which is the user's) */
            uint64_t id = mt_model_layout_id(ls, dedup ? 0 : w->count[s], raw);
            if (id == MT_MODEL_NO_ID) continue;
            if (!dedup) {
                set_add(w, raw);
                w->user_has[s] = 1;
                w->count[s]++;
            }
            w->fids[k] = id;
            w->cell[k] = s;
            if (dedup) w->varies[s] = 1;
            k++;
        }
    }
    return k;
}

/* Adds the rows of fids [from, to) to their cells of a row of E and W1 (the layout's
 * pooling, model.h), the cells' positions going on from pos[] (the ids each already holds:
 * a candidate's come after the user's). Cells start as zeros, so only a mean slot needs its
 * end (mt_model_layout_end() after the last id: pool_end()). */
static void pool(const mt_serving_t *sv, const worker_t *w, size_t from, size_t to, float *E,
                 float *W1, uint32_t *pos) {
    const size_t rw = mt_model_row_floats(sv->cfg.dim);
    for (size_t k = from; k < to; k++) {
        const uint16_t s = w->cell[k];
        const mt_model_slot_t *ls = &sv->lay.slot[s];
        const float *row = w->emb + (sv->mixed ? w->roff[k] : k * rw);
        mt_model_layout_add(ls, pos[s]++, E + ls->off, W1 + s, row);
    }
}

/* Ends the mean-pooled cells of a pooled row of pos[s] ids each. */
static void pool_end(const mt_serving_t *sv, const uint32_t *pos, float *E, float *W1) {
    for (uint32_t i = 0; i < sv->n_mean; i++) {
        const uint16_t s = sv->mean_idx[i];
        const mt_model_slot_t *ls = &sv->lay.slot[s];
        mt_model_layout_end(ls, pos[s], E + ls->off, W1 + s);
    }
}

/* Deterministic sampling of a request: XXH3 of its id against the rate. */
static int sampled(const mt_serving_t *sv, const char *request_id, size_t len) {
    double r = sv->cfg.log_sample_rate;
    if (r <= 0.0 || !sv->cfg.producer || !len) return 0;
    if (r >= 1.0) return 1;
    uint64_t h = XXH3_64bits(request_id, len);
    return (double)(h >> 11) * 0x1.0p-53 < r;
}

static void log_impressions(mt_serving_t *sv, worker_t *w, int64_t ts_ms, const float *scores) {
    const sv_req_t *r = &w->req;
    for (size_t i = 0; i < r->n_cands; i++) {
        size_t len = sv_req_impression(r, i, ts_ms, scores[i], NULL);
        if (len > w->cap_pack) {
            uint8_t *np = realloc(w->pack, len);
            if (!np) {
                atomic_fetch_add(&sv->log_dropped, 1);
                continue;
            }
            w->pack = np;
            w->cap_pack = len;
        }
        sv_req_impression(r, i, ts_ms, scores[i], w->pack);
        mt_err_t err = mt_kafka_produce(sv->cfg.producer, sv->topic, -1, r->request_id,
                                        r->request_id_len, w->pack, len, 0);
        if (err == MT_OK) {
            atomic_fetch_add(&sv->logged, 1);
        } else if (err == MT_KAFKA_BUSY) {
            atomic_fetch_add(&sv->log_dropped, 1);
        } else {
            if (atomic_fetch_add(&sv->log_errors, 1) == 0)
                mt_log(MT_LOG_WARN, WHO, "impression log to %s: %s (further errors counted)",
                       sv->topic, mt_strerror(err));
        }
    }
}

/* A Predict's lookup in the replica (the rows of its k ids). */
typedef struct local_lookup {
    mt_serving_t *sv;
    worker_t *w;
    size_t k;
    mt_err_t err;
} local_lookup_t;

static void local_lookup(void *arg) {
    local_lookup_t *l = arg;
    size_t len = l->sv->mixed ? l->w->roff[l->k] : l->k * mt_model_row_floats(l->sv->cfg.dim);
    l->err = mt_table_lookup(l->sv->table, l->w->fids, l->k, l->w->emb, len, NULL, 0, 0, NULL);
}

static void predict(mt_serving_t *sv, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    atomic_fetch_add(&sv->predicts, 1);
    if (!atomic_load(&sv->ready)) {
        FAIL(sv, c, MT_RPC_UNAVAILABLE, "serving is starting: parameters not synced yet");
        return;
    }
    char why[256];
    worker_t tmp, *w = worker_get(sv, &tmp);
    sv_req_t *r = &w->req;
    model_ref_t *m = NULL;
    int rc = sv_req_parse(r, req, len, why, sizeof(why));
    if (rc) {
        if (rc == SV_REQ_NOMEM)
            FAIL(sv, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
        else
            FAIL(sv, c, MT_RPC_INVALID_ARGUMENT, "%s", why);
        goto out;
    }
    size_t n = r->n_cands, nf = 0, ignored = 0, nuser = 0;
    if (r->request_id_len > MT_SERVING_MAX_REQUEST_ID_BYTES) {
        FAIL(sv, c, MT_RPC_INVALID_ARGUMENT, "request_id: %zu bytes, at most %d", r->request_id_len,
             MT_SERVING_MAX_REQUEST_ID_BYTES);
        goto out;
    }
    if (n > sv->cfg.max_candidates) {
        FAIL(sv, c, MT_RPC_RESOURCE_EXHAUSTED, "%zu candidates, the limit is %u", n,
             sv->cfg.max_candidates);
        goto out;
    }
    if (predict_reply_max_bytes(n, sv->ntasks) > sv->cfg.max_message_bytes) {
        FAIL(sv, c, MT_RPC_RESOURCE_EXHAUSTED,
             "the reply to %zu candidates could be %llu bytes, over the %u-byte message limit", n,
             (unsigned long long)predict_reply_max_bytes(n, sv->ntasks), sv->cfg.max_message_bytes);
        goto out;
    }
    count_fids(sv, r->user, r->n_user, &nf, &ignored);
    nuser = nf;
    count_fids(sv, r->items, r->n_items, &nf, &ignored);
    if (nf + ignored > sv->cfg.max_request_fids) {
        FAIL(sv, c, MT_RPC_RESOURCE_EXHAUSTED, "%zu fids in one request, the limit is %u",
             nf + ignored, sv->cfg.max_request_fids);
        goto out;
    }
    if (ignored) atomic_fetch_add(&sv->ignored_fids, ignored);
    atomic_fetch_add(&sv->candidates, n);
    m = model_acquire(sv);
    if (!m) {
        FAIL(sv, c, MT_RPC_UNAVAILABLE, "no dense parameters yet");
        goto out;
    }
    if (worker_reserve(sv, w, nf, n, nuser)) {
        FAIL(sv, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    /* fids: the user's [0, ku), then candidate i's [ends[i-1], ends[i]) */
    memset(w->count, 0, 2 * sv->cfg.nslots * sizeof(uint32_t));
    w->seq_cands = 0;
    size_t ku = collect(sv, w, 0, r->user, r->n_user, 0);
    size_t *ends = w->ends;
    size_t k = ku;
    for (size_t i = 0; i < n; i++) {
        k = collect(sv, w, k, r->items + r->cands[i].from, r->cands[i].to - r->cands[i].from, 1);
        ends[i] = k;
    }
    if (w->seq_cands) { /* the joiner would hand them to the trainer as behaviours */
        FAIL(sv, c, MT_RPC_INVALID_ARGUMENT,
             "%zu fid(s) of slot %u in candidates: slot %u is the model's behaviour sequence, "
             "one of the user's slots",
             w->seq_cands, sv->cfg.slot_ids[sv->cfg.family.seq_slot],
             sv->cfg.slot_ids[sv->cfg.family.seq_slot]);
        goto out;
    }
    size_t S = sv->cfg.nslots, D = sv->lay.width;
    if (sv->mixed) { /* each fid's row in emb: packed by the slots' dims */
        size_t off = 0;
        for (size_t j = 0; j < k; j++) {
            w->roff[j] = off;
            off += mt_model_row_floats(sv->lay.slot[w->cell[j]].dim);
        }
        w->roff[k] = off;
    }
    local_lookup_t ll = {sv, w, k, MT_OK};
    mt_err_t err = MT_OK;
    if (sv->peers) {
        /* the ids of shards held elsewhere: from the peers, while the replica reads its own
         * (as zeros for the others: the peers' values are written over them after) */
        sv_fetch_list_t lists[1] = {
            {w->fids, k, mt_model_row_floats(sv->cfg.dim), w->emb, sv->mixed ? w->roff : NULL}};
        uint64_t zeroed = 0;
        err = sv_peers_fetch(sv->peers, &w->fetch, lists, 1, sv->cfg.peer_zeros, &zeroed,
                             local_lookup, &ll, why, sizeof(why));
        if (zeroed) atomic_fetch_add(&sv->peer_zero_fids, zeroed);
        if (err) {
            if (err == MT_NOMEM)
                FAIL(sv, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
            else
                FAIL(sv, c, MT_RPC_UNAVAILABLE, "reading other shards' rows: %s", why);
            goto out;
        }
    } else {
        local_lookup(&ll);
    }
    if (ll.err) {
        FAIL(sv, c, MT_RPC_INTERNAL, "replica lookup: %s", mt_strerror(ll.err));
        goto out;
    }
    /* the user's part once, in the last row; then each candidate's on top of a copy */
    float *Eu = w->E + n * D, *W1u = w->W1 + n * S;
    memset(Eu, 0, D * sizeof(float));
    memset(W1u, 0, S * sizeof(float));
    uint32_t *pos = w->count + S; /* the positions in the cells (collect() counted the
                                     user's ids per slot in w->count) */
    memset(pos, 0, S * sizeof(uint32_t));
    pool(sv, w, 0, ku, Eu, W1u, pos);
    for (size_t i = 0; i < n; i++) {
        float *E = w->E + i * D, *W1 = w->W1 + i * S;
        size_t from = i ? ends[i - 1] : ku;
        memcpy(E, Eu, D * sizeof(float));
        memcpy(W1, W1u, S * sizeof(float));
        memcpy(pos, w->count, S * sizeof(uint32_t));
        pool(sv, w, from, ends[i], E, W1, pos);
        pool_end(sv, pos, E, W1);
    }
    err = mt_model_forward_serving(m->m, w->ws, w->E, w->W1, n, sv->cfg.negative_rate, w->varies,
                                   w->probs);
    if (err) {
        FAIL(sv, c, MT_RPC_INTERNAL, "model: %s", mt_strerror(err));
        goto out;
    }
    Monolith__V1__PredictResponse resp = MONOLITH__V1__PREDICT_RESPONSE__INIT;
    const uint32_t T = sv->ntasks;
    assert(mt_model_ntasks(m->m) == T);
    resp.n_scores = n;
    resp.scores = w->probs; /* one task: the model's scores as they are */
    if (T > 1) {
        /* scores: task 0 of each candidate; task_scores: every task, as the model wrote them */
        for (size_t i = 0; i < n; i++)
            w->scores[i] = w->probs[i * T];
        resp.scores = w->scores;
        resp.n_task_scores = n * T;
        resp.task_scores = w->probs;
        resp.tasks = T;
    }
    resp.sparse_version = atomic_load(&sv->sparse_version);
    resp.dense_version = m->version;
    size_t plen = monolith__v1__predict_response__get_packed_size(&resp);
    assert(plen <= predict_reply_max_bytes(n, T));
    if (plen > w->cap_pack && sv_grow((void **)&w->pack, plen, 1)) {
        FAIL(sv, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    if (plen > w->cap_pack) w->cap_pack = plen;
    monolith__v1__predict_response__pack(&resp, w->pack);
    mt_rpc_reply(c, w->pack, plen);
    /* after the reply: the client does not wait for the log */
    if (n && sampled(sv, r->request_id, r->request_id_len)) {
        int64_t ts_ms = r->timestamp_ms;
        if (ts_ms <= 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
        }
        log_impressions(sv, w, ts_ms, resp.scores); /* task 0's: the click's */
    }
out:
    sv_req_trim(r, REQ_KEEP);
    worker_put(sv, w, &tmp);
    model_release(sv, m);
}

static void lookup(mt_serving_t *sv, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    atomic_fetch_add(&sv->lookups, 1);
    Monolith__V1__LookupRequest *r = monolith__v1__lookup_request__unpack(NULL, len, req);
    if (!r) {
        FAIL(sv, c, MT_RPC_INVALID_ARGUMENT, "malformed LookupRequest");
        return;
    }
    float *values = NULL;
    uint8_t *found = NULL;
    size_t nfloats = 0;
    if (r->train) {
        FAIL(sv, c, MT_RPC_INVALID_ARGUMENT, "serving lookups never train: train must be false");
        goto out;
    }
    if (r->n_fids > sv->cfg.max_request_fids) {
        FAIL(sv, c, MT_RPC_RESOURCE_EXHAUSTED, "%zu fids in one request, the limit is %u",
             r->n_fids, sv->cfg.max_request_fids);
        goto out;
    }
    for (size_t i = 0; i < r->n_fids; i++) {
        uint32_t dim;
        if (mt_table_dim(sv->table, r->fids[i], &dim) != MT_OK) {
            FAIL(sv, c, MT_RPC_INVALID_ARGUMENT, "fid %zu (0x%016llx): slot %u is not configured",
                 i, (unsigned long long)r->fids[i], MT_FID_SLOT(r->fids[i]));
            goto out;
        }
        nfloats += dim;
    }
    /* only rows this node holds and has synced: a peer (or a client) reading another shard's
     * id here would otherwise get zeros without knowing */
    for (size_t i = 0; i < r->n_fids; i++) {
        uint32_t s = mt_route_shard_of(r->fids[i], sv->cfg.num_shards);
        if (!sv->held[s]) {
            FAIL(sv, c, MT_RPC_FAILED_PRECONDITION,
                 "fid %zu (0x%016llx) is of shard %u, which this node does not hold", i,
                 (unsigned long long)r->fids[i], s);
            goto out;
        }
        if (!atomic_load(&sv->shards[s].synced)) {
            FAIL(sv, c, MT_RPC_UNAVAILABLE, "fid %zu (0x%016llx): shard %u is not synced yet", i,
                 (unsigned long long)r->fids[i], s);
            goto out;
        }
    }
    if (lookup_reply_bytes(r->n_fids, nfloats) > sv->cfg.max_message_bytes) {
        FAIL(sv, c, MT_RPC_RESOURCE_EXHAUSTED,
             "the reply to %zu fids would be %llu bytes, over the %u-byte message limit", r->n_fids,
             (unsigned long long)lookup_reply_bytes(r->n_fids, nfloats), sv->cfg.max_message_bytes);
        goto out;
    }
    values = malloc((nfloats ? nfloats : 1) * sizeof(float));
    found = malloc(r->n_fids ? r->n_fids : 1);
    if (!values || !found) {
        FAIL(sv, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    mt_err_t err =
        mt_table_lookup(sv->table, r->fids, r->n_fids, values, nfloats, found, 0, 0, NULL);
    if (err) {
        FAIL(sv, c, MT_RPC_INTERNAL, "replica lookup: %s", mt_strerror(err));
        goto out;
    }
    Monolith__V1__LookupResponse resp = MONOLITH__V1__LOOKUP_RESPONSE__INIT;
    resp.n_values = nfloats;
    resp.values = values;
    resp.found.len = r->n_fids;
    resp.found.data = found;
    size_t plen = monolith__v1__lookup_response__get_packed_size(&resp);
    assert(plen == lookup_reply_bytes(r->n_fids, nfloats));
    uint8_t *buf = malloc(plen ? plen : 1);
    if (!buf) {
        FAIL(sv, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    monolith__v1__lookup_response__pack(&resp, buf);
    mt_rpc_reply(c, buf, plen);
    free(buf);
out:
    free(values);
    free(found);
    monolith__v1__lookup_request__free_unpacked(r, NULL);
}

/* Serving/Shards: what this node holds, for its peers' discovery. */
static void shards(mt_serving_t *sv, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    Monolith__V1__ShardsRequest *r = monolith__v1__shards_request__unpack(NULL, len, req);
    if (!r) {
        FAIL(sv, c, MT_RPC_INVALID_ARGUMENT, "malformed ShardsRequest");
        return;
    }
    monolith__v1__shards_request__free_unpacked(r, NULL);
    uint32_t ns = sv->cfg.num_shards;
    uint32_t *held = malloc(ns * sizeof(uint32_t)), *synced = malloc(ns * sizeof(uint32_t));
    uint8_t *buf = NULL;
    if (!held || !synced) goto oom;
    Monolith__V1__ShardsResponse resp = MONOLITH__V1__SHARDS_RESPONSE__INIT;
    resp.num_shards = ns;
    resp.held = held;
    resp.synced = synced;
    for (uint32_t i = 0; i < ns; i++) {
        if (!sv->held[i]) continue;
        held[resp.n_held++] = i;
        if (atomic_load(&sv->shards[i].synced)) synced[resp.n_synced++] = i;
    }
    size_t plen = monolith__v1__shards_response__get_packed_size(&resp);
    if (!(buf = malloc(plen ? plen : 1))) goto oom;
    monolith__v1__shards_response__pack(&resp, buf);
    mt_rpc_reply(c, buf, plen);
    goto out;
oom:
    FAIL(sv, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
out:
    free(buf);
    free(held);
    free(synced);
}

/* Times Predicts into the latency histogram. */
static void handler(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    method_ctx_t *ctx = ud;
    if (ctx->idx == 1) {
        lookup(ctx->sv, c, req, len);
        return;
    }
    if (ctx->idx == 2) {
        shards(ctx->sv, c, req, len);
        return;
    }
    double t0 = mt_mono_s();
    predict(ctx->sv, c, req, len);
    double s = mt_mono_s() - t0;
    int b = 0;
    while (b < HIST_BUCKETS - 1 && s > hist_bounds_s[b])
        b++;
    atomic_fetch_add(&ctx->sv->hist[b], 1);
    atomic_fetch_add(&ctx->sv->hist_sum_us, (uint64_t)(s * 1e6));
}

mt_err_t mt_serving_register(mt_serving_t *sv, mt_rpc_server_t *srv) {
    sv->ctx[0] = (method_ctx_t){sv, 0};
    sv->ctx[1] = (method_ctx_t){sv, 1};
    sv->ctx[2] = (method_ctx_t){sv, 2};
    mt_err_t err = mt_rpc_server_add(srv, "/monolith.v1.Serving/Predict", 0, handler, &sv->ctx[0]);
    /* Lookup and Shards are what peers call from inside their Predicts: on threads of their
     * own, so that two nodes whose threads all wait for each other's Lookups cannot stall */
    if (!err)
        err = mt_rpc_server_add(srv, "/monolith.v1.Serving/Lookup", MT_RPC_OWN_THREADS, handler,
                                &sv->ctx[1]);
    if (!err)
        err = mt_rpc_server_add(srv, "/monolith.v1.Serving/Shards", MT_RPC_OWN_THREADS, handler,
                                &sv->ctx[2]);
    if (err) return err;
    sv->srv = srv;
    mt_rpc_server_set_serving(srv, atomic_load(&sv->ready));
    return MT_OK;
}

/* ============================== status and metrics ============================== */

mt_err_t mt_serving_shard_status(mt_serving_t *sv, uint32_t shard, mt_serving_shard_status_t *out) {
    if (shard >= sv->cfg.num_shards) return MT_INVALID;
    pthread_mutex_lock(&sv->stat_lock);
    *out = sv->shards[shard].st;
    pthread_mutex_unlock(&sv->stat_lock);
    return MT_OK;
}

void mt_serving_counters(mt_serving_t *sv, mt_serving_counters_t *out) {
    memset(out, 0, sizeof(*out));
    out->predicts = atomic_load(&sv->predicts);
    out->candidates = atomic_load(&sv->candidates);
    out->lookups = atomic_load(&sv->lookups);
    for (int i = 0; i < 17; i++)
        out->errors[i] = atomic_load(&sv->errors[i]);
    out->ignored_fids = atomic_load(&sv->ignored_fids);
    out->logged = atomic_load(&sv->logged);
    out->log_dropped = atomic_load(&sv->log_dropped);
    out->log_errors = atomic_load(&sv->log_errors);
    pthread_mutex_lock(&sv->stat_lock);
    out->dense_pulls = sv->dense_pulls;
    out->dense_failures = sv->dense_failures;
    pthread_mutex_unlock(&sv->stat_lock);
    model_ref_t *m = model_acquire(sv);
    out->dense_version = m ? m->version : 0;
    model_release(sv, m);
    mt_table_stats_t ts;
    mt_table_stats(sv->table, &ts);
    out->rows = ts.rows;
    out->ready = atomic_load(&sv->ready);
}

static const char *const status_names[17] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

mt_err_t mt_serving_render_metrics(mt_serving_t *sv, const char *extra, char **body, size_t *len) {
    mt_strbuf_t b = {0};
    mt_serving_counters_t k;
    mt_serving_counters(sv, &k);
    mt_table_stats_t ts;
    mt_table_stats(sv->table, &ts);
    struct {
        const char *name, *type, *help;
        double v;
    } g[] = {
        {"monolith_serving_predict_requests_total", "counter", "Predict calls.",
         (double)k.predicts},
        {"monolith_serving_predict_candidates_total", "counter", "Candidates scored.",
         (double)k.candidates},
        {"monolith_serving_lookup_requests_total", "counter", "Lookup calls.", (double)k.lookups},
        {"monolith_serving_ignored_fids_total", "counter",
         "Request fids of slots the model does not have (ignored).", (double)k.ignored_fids},
        {"monolith_serving_ready", "gauge", "1 once dense parameters and every shard synced.",
         (double)k.ready},
        {"monolith_serving_rows", "gauge", "Rows in the replica.", (double)ts.rows},
        {"monolith_serving_table_bytes", "gauge", "Bytes held by the replica table.",
         (double)ts.bytes_total},
        {"monolith_serving_dense_version", "gauge", "Version of the dense parameters served.",
         (double)k.dense_version},
        {"monolith_serving_dense_pulls_total", "counter", "Successful dense pulls.",
         (double)k.dense_pulls},
        {"monolith_serving_dense_failures_total", "counter", "Failed dense pulls.",
         (double)k.dense_failures},
        {"monolith_serving_impressions_logged_total", "counter",
         "Impressions queued to the features topic.", (double)k.logged},
        {"monolith_serving_impressions_dropped_total", "counter",
         "Impressions dropped because the producer queue was full.", (double)k.log_dropped},
        {"monolith_serving_impression_errors_total", "counter", "Impressions the producer refused.",
         (double)k.log_errors},
    };
    for (size_t i = 0; i < sizeof(g) / sizeof(g[0]); i++)
        mt_strbuf_printf(&b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", g[i].name, g[i].help,
                         g[i].name, g[i].type, g[i].name, g[i].v);
    mt_strbuf_printf(&b, "# HELP monolith_serving_errors_total Predict and Lookup calls failed, by "
                         "status.\n# TYPE monolith_serving_errors_total counter\n");
    for (int i = 1; i < 17; i++)
        if (k.errors[i])
            mt_strbuf_printf(&b, "monolith_serving_errors_total{code=\"%s\"} %llu\n",
                             status_names[i], (unsigned long long)k.errors[i]);
    mt_strbuf_printf(&b, "# HELP monolith_serving_predict_seconds Predict latency.\n"
                         "# TYPE monolith_serving_predict_seconds histogram\n");
    uint64_t cum = 0;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        cum += atomic_load(&sv->hist[i]);
        if (i < HIST_BUCKETS - 1)
            mt_strbuf_printf(&b, "monolith_serving_predict_seconds_bucket{le=\"%g\"} %llu\n",
                             hist_bounds_s[i], (unsigned long long)cum);
        else
            mt_strbuf_printf(&b, "monolith_serving_predict_seconds_bucket{le=\"+Inf\"} %llu\n",
                             (unsigned long long)cum);
    }
    mt_strbuf_printf(&b, "monolith_serving_predict_seconds_sum %.6f\n",
                     (double)atomic_load(&sv->hist_sum_us) * 1e-6);
    mt_strbuf_printf(&b, "monolith_serving_predict_seconds_count %llu\n", (unsigned long long)cum);
    /* per shard */
    double now = mt_mono_s(), max_lag = 0;
    uint32_t ns = sv->cfg.num_shards;
    mt_serving_shard_status_t *st = malloc(ns * sizeof(*st));
    if (!st) {
        free(b.p);
        return MT_NOMEM;
    }
    pthread_mutex_lock(&sv->stat_lock);
    for (uint32_t i = 0; i < ns; i++)
        st[i] = sv->shards[i].st;
    pthread_mutex_unlock(&sv->stat_lock);
    struct {
        const char *name, *type, *help;
        int field;
    } per[] = {
        {"monolith_serving_syncs_total", "counter", "Successful Sync streams per shard.", 0},
        {"monolith_serving_sync_failures_total", "counter", "Failed Sync streams per shard.", 1},
        {"monolith_serving_full_syncs_total", "counter", "Full Sync streams per shard.", 2},
        {"monolith_serving_sync_entries_total", "counter", "Sync entries applied per shard.", 3},
        {"monolith_serving_sync_deleted_total", "counter", "Deletions applied per shard.", 4},
        {"monolith_serving_sync_lag_seconds", "gauge",
         "Seconds since the last successful sync of the shard (since start if none).", 5},
        {"monolith_serving_sync_version", "gauge", "The shard's version the replica is up to.", 6},
        {"monolith_serving_sync_duration_seconds", "gauge",
         "How long the shard's last good sync took (stream and applies).", 7},
        {"monolith_serving_sync_skipped_total", "counter",
         "Parameter-topic messages skipped: their round was already applied.", 8},
        {"monolith_serving_sync_resyncs_total", "counter",
         "Returns from the parameters topic to a Sync from the shard (a resync marker, "
         "another incarnation, a gap, an offset out of range, a bad message).",
         9},
        {"monolith_serving_sync_kafka_offset", "gauge",
         "The offset of the next parameters-topic message to read (-1: not following).", 10},
    };
    for (size_t p = 0; p < sizeof(per) / sizeof(per[0]); p++) {
        if (per[p].field >= 8 && !sv->cfg.sync_kafka) continue;
        mt_strbuf_printf(&b, "# HELP %s %s\n# TYPE %s %s\n", per[p].name, per[p].help, per[p].name,
                         per[p].type);
        for (uint32_t i = 0; i < ns; i++) {
            if (!sv->held[i]) continue; /* another node's: its lag is that node's metric */
            double lag = now - (st[i].last_ok_s > 0 ? st[i].last_ok_s : sv->started_s);
            if (lag > max_lag) max_lag = lag;
            double v = per[p].field == 0   ? (double)st[i].syncs
                       : per[p].field == 1 ? (double)st[i].failures
                       : per[p].field == 2 ? (double)st[i].full_syncs
                       : per[p].field == 3 ? (double)st[i].entries
                       : per[p].field == 4 ? (double)st[i].deleted
                       : per[p].field == 5 ? lag
                       : per[p].field == 6 ? (double)st[i].since_version
                       : per[p].field == 7 ? st[i].last_duration_s
                       : per[p].field == 8 ? (double)st[i].kafka_skipped
                       : per[p].field == 9 ? (double)st[i].kafka_resyncs
                                           : (double)st[i].kafka_offset;
            mt_strbuf_printf(&b, "%s{shard=\"%u\"} %.17g\n", per[p].name, i, v);
        }
    }
    free(st);
    mt_strbuf_printf(
        &b,
        "# HELP monolith_serving_sync_lag_max_seconds The largest sync lag over shards.\n"
        "# TYPE monolith_serving_sync_lag_max_seconds gauge\n"
        "monolith_serving_sync_lag_max_seconds %.3f\n",
        max_lag);
    mt_strbuf_printf(&b, "# HELP monolith_serving_shard_held 1 for the PS shards this node "
                         "holds (serving.shards).\n# TYPE monolith_serving_shard_held gauge\n");
    for (uint32_t i = 0; i < ns; i++)
        mt_strbuf_printf(&b, "monolith_serving_shard_held{shard=\"%u\"} %d\n", i, sv->held[i]);
    if (sv->peers) {
        sv_peers_render_metrics(sv->peers, &b);
        mt_strbuf_printf(&b,
                         "# HELP monolith_serving_peer_zero_fids_total Ids read as zeros "
                         "because their peer failed (serving.peer_failure = zeros).\n"
                         "# TYPE monolith_serving_peer_zero_fids_total counter\n"
                         "monolith_serving_peer_zero_fids_total %llu\n",
                         (unsigned long long)atomic_load(&sv->peer_zero_fids));
    }
    if (extra) mt_strbuf_printf(&b, "%s", extra);
    if (b.oom) {
        free(b.p);
        return MT_NOMEM;
    }
    *body = b.p;
    *len = b.len;
    return MT_OK;
}
