/*
 * trainer.c - lookup, pool, forward/backward, sparse and dense updates (see mt/trainer.h).
 *
 * Per batch: the n x S slot lists hold N id occurrences; they map to U unique ids (an
 * open-addressing map rebuilt per batch). The table is asked once for the U embeddings and
 * once for the U first-order weights; pooling, the gradient scatter and the updates all
 * work on the unique ids.
 *
 * Pipelined steps: the trainer's thread (pipe_t) takes its jobs in the order they were
 * queued: applies (at most one queued or running; a step copies its unique fids, gradients
 * and cover into the job, so that the next step reuses the trainer's scratch while the apply
 * runs) and prefetched lookups (at most two; each fills an id set of its own). Order on the
 * one thread is what bounds the staleness: the prefetch of b+1, queued before b's apply, runs
 * after b-1's apply was answered and before b's is sent.
 * Locks: pipe.lock guards the queue, the apply job's state (busy, err) and every id
 * set's state; a job's buffers (the apply job's, or a queued set's ids and values) belong to
 * the thread from the hand-off until its state says done.
 */
#include "mt/trainer.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "mt/clock.h"
#include "mt/psclient.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* The ids of one batch and their looked-up values: a step's own, or a prefetched batch's. */
enum { IDS_FREE, IDS_QUEUED, IDS_READY, IDS_STEP };
#define NIDS      3    /* two prefetched batches and the step's own */
#define JOB_APPLY (-1) /* a queue entry; 0..NIDS-1: the lookup of that id set */

typedef struct idset {
    size_t cap_occ; /* of uidx; ufid, uemb are sized for as many unique ids */
    uint32_t *uidx; /* [occurrences] unique index */
    /* [U]: the unique fids, so that a step makes one lookup and one apply (one request per
     * shard: docs/checkpoint.md, "Many trainers") */
    uint64_t *ufid;
    float *uemb;     /* [U * (dim + 1)]: their rows, each the embedding then the first-order
                    weight (mt_model_row_floats()); with per-slot dims packed, id u's row at
                    uoff[u] */
    uint16_t *uslot; /* per-slot dims: [U] each id's model slot index */
    size_t *uoff;    /* per-slot dims: [U + 1] each id's row offset in uemb (and ug) */
    /* the trainer's own table: [U] where a training lookup left each id's row, for the
     * step's apply (mt_table_hint_t) */
    mt_table_hint_t *uhint;
    size_t nu;
    /* a prefetch's (state under pipe.lock) */
    int state;
    mt_err_t err;
    uint64_t seq;            /* prefetch order */
    uint64_t step_at;        /* the trainer's steps when it was made */
    const mt_batch_t *batch; /* borrowed until its step, compared with it */
    size_t n, nfids;
    uint64_t hash; /* of its fids and offsets */
    uint32_t now_s;
} idset_t;

/* The apply thread of pipelined steps and its queue. */
typedef struct pipe {
    int on;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int queue[4], qhead, qlen; /* JOB_APPLY or an id set's index, in the order queued */
    int busy, quit;            /* busy: an apply is queued or running (not answered yet) */
    int sent;     /* a job was handed over and its answer not collected (step thread) */
    mt_err_t err; /* the last job's */
    uint32_t skipped;
    /* the job (the apply thread's while busy) */
    uint64_t *fids;
    mt_table_hint_t *hints; /* the trainer's own table: [n] the ids' rows */
    float *grads;
    size_t n, len, cap_fids, cap_grads;
    uint32_t now_s;
    uint64_t examples;
    mt_psc_range_t *cover;
    size_t ncover, cap_cover;
} pipe_t;

struct mt_trainer {
    mt_trainer_config_t cfg;
    mt_trainer_backend_t backend; /* lookup/apply: the local table's or the caller's */
    int dense_remote;             /* 1: the dense parameters are updated elsewhere (no Adam) */
    const mt_psc_range_t *cover;  /* of the next step (mt_trainer_set_cover), borrowed */
    size_t ncover;
    mt_table_t *table;
    mt_model_t *model;
    mt_model_ws_t *ws;
    size_t nparams;
    float **am, **av; /* Adam moments per dense parameter */
    uint64_t step;
    /* Scratch, grown as needed. */
    idset_t ids[NIDS];
    uint64_t prefetch_seq;
    uint64_t steps; /* non-empty steps that returned MT_OK (a prefetch's staleness) */
    size_t cap_ug, cap_n, cap_map; /* unique ids of ug, examples, map slots */
    /* [U * (dim + 1)]: the gradients of a step's ids, packed like its idset's uemb */
    float *ug;
    uint32_t *ucnt; /* [cap_ug]: with CowClip, each unique id's occurrences in the step */
    float *E, *W1, *dE, *dW1, *probs; /* probs: [n x ntasks] */
    uint32_t ntasks;                  /* the model's tasks: labels and scores per example */
    uint32_t *map;                    /* unique index + 1 (the calling thread's only) */
    /* the own table's: its parts, ids per part + 1 ([nparts + 1]) and, the calling thread's
     * only, the unique ids (and model slots) in part order ([cap_sort]) */
    uint32_t nparts, *pcount;
    uint64_t *sfid;
    uint16_t *sslot;
    size_t cap_sort;
    /* the model's feature layout (model.h): each slot's table ids, pooling, dims and cells;
     * mixed: the slots' dims differ, rows are packed at uoff[] (else id u's row is at
     * u * (dim + 1)) */
    mt_model_layout_t lay;
    int mixed;
    pipe_t pipe;
};

_Static_assert(sizeof(((mt_trainer_config_t *)0)->hidden) ==
                   sizeof(((mt_model_config_t *)0)->hidden),
               "the MLP's widths are the model's");

void mt_trainer_config_init(mt_trainer_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->dim = 8; /* dim, optimizer and lr: [trainer]'s defaults (docs/trainer.md's sweep) */
    mt_model_config_t mc; /* the model's own defaults: MLP, family, cross layers */
    mt_model_config_init(&mc);
    cfg->nhidden = mc.nhidden;
    memcpy(cfg->hidden, mc.hidden, sizeof(cfg->hidden));
    mt_model_family_get(&mc, &cfg->family);
    cfg->cowclip_zeta = 1e-5f;
    cfg->seed = 1;
    cfg->sparse_opt = MT_OPT_FTRL;
    cfg->sparse_lr = 0.05f;
    cfg->init_scale = 0.01f;
    cfg->dense_lr = 0.001f;
    cfg->dense_beta1 = 0.9f;
    cfg->dense_beta2 = 0.999f;
    cfg->dense_eps = 1e-8f;
    cfg->table_shards_log2 = 6;
}

void mt_trainer_destroy(mt_trainer_t *tr) {
    if (!tr) return;
    mt_trainer_set_pipelined(tr, 0);
    free(tr->pipe.fids);
    free(tr->pipe.hints);
    free(tr->pipe.grads);
    free(tr->pipe.cover);
    mt_table_destroy(tr->table);
    mt_model_destroy(tr->model);
    mt_model_ws_destroy(tr->ws);
    for (size_t i = 0; i < tr->nparams; i++) {
        if (tr->am) free(tr->am[i]);
        if (tr->av) free(tr->av[i]);
    }
    free(tr->am);
    free(tr->av);
    for (int i = 0; i < NIDS; i++) {
        free(tr->ids[i].uidx);
        free(tr->ids[i].ufid);
        free(tr->ids[i].uemb);
        free(tr->ids[i].uslot);
        free(tr->ids[i].uoff);
        free(tr->ids[i].uhint);
    }
    free(tr->ug);
    free(tr->ucnt);
    free(tr->E);
    free(tr->W1);
    free(tr->dE);
    free(tr->dW1);
    free(tr->probs);
    free(tr->map);
    free(tr->pcount);
    free(tr->sfid);
    free(tr->sslot);
    free(tr);
}

static mt_err_t local_lookup(void *ud, const uint64_t *fids, size_t n, int train, uint32_t now_s,
                             float *out, size_t out_len) {
    return mt_table_lookup(ud, fids, n, out, out_len, NULL, train ? MT_TABLE_TRAIN : 0, now_s,
                           NULL);
}

static mt_err_t local_apply(void *ud, const uint64_t *fids, size_t n, const float *grads,
                            size_t len, uint32_t now_s, uint64_t examples) {
    (void)examples;
    return mt_table_apply(ud, fids, n, grads, len, now_s, NULL);
}

/* The model configuration of @p cfg; @p dims ([256]) holds the slots' dims when they differ
 * (mc->slot_dims points to it), and @returns whether they do. */
static int model_config_of(const mt_trainer_config_t *cfg, mt_model_config_t *mc, uint32_t *dims) {
    int mixed = 0;
    for (uint32_t s = 0; s < cfg->nslots && s < 256; s++) {
        dims[s] = cfg->slot_dim[s] ? cfg->slot_dim[s] : cfg->dim;
        mixed |= dims[s] != cfg->dim;
    }
    mt_model_config_init(mc);
    mc->nslots = cfg->nslots;
    mc->dim = cfg->dim;
    mc->nhidden = cfg->nhidden;
    memcpy(mc->hidden, cfg->hidden, sizeof(mc->hidden));
    mc->init_seed = cfg->seed;
    mt_model_family_set(mc, &cfg->family);
    mc->slot_dims = mixed ? dims : NULL;
    return mixed;
}

/* The table slots' configurations (@p sc[0, nt)) of the layout's table slots @p ids, @p floats
 * (mt_model_layout_tables()) under @p cfg's settings. */
static void slot_configs_of(const mt_trainer_config_t *cfg, const uint16_t *ids,
                            const uint32_t *floats, size_t nt, mt_table_slot_config_t *sc) {
    for (size_t k = 0; k < nt; k++) {
        mt_table_slot_config_t *e = &sc[k];
        mt_table_slot_config_init(e, ids[k], floats[k]);
        e->zero_tail = MT_MODEL_ROW_TAIL; /* the first-order weight starts at 0 */
        e->init = MT_INIT_UNIFORM;
        e->init_scale = cfg->init_scale;
        e->init_seed = cfg->seed;
        e->opt = cfg->sparse_opt;
        e->lr = cfg->sparse_lr;
        e->min_count = cfg->min_count;
    }
}

mt_err_t mt_trainer_slot_configs(const mt_trainer_config_t *cfg, mt_table_slot_config_t *sc,
                                 size_t cap, size_t *n) {
    if (!cfg || cfg->nslots < 1 || cfg->nslots > 256) return MT_CONFIG;
    uint32_t dims[256], floats[256];
    uint16_t ids[256];
    mt_model_config_t mc;
    model_config_of(cfg, &mc, dims);
    size_t nt;
    mt_err_t err = mt_model_tables(&mc, cfg->slot_ids, cfg->slot_mean, cfg->slot_hash_buckets,
                                   cfg->hash_buckets, ids, floats, &nt, NULL, 0);
    if (err) return err;
    if (cap < nt) return MT_TOO_SMALL;
    slot_configs_of(cfg, ids, floats, nt, sc);
    *n = nt;
    return MT_OK;
}

mt_err_t mt_trainer_create(const mt_trainer_config_t *cfg, mt_trainer_t **out) {
    if (!cfg || cfg->nslots < 1 || cfg->nslots > 256 || cfg->dim < 1 ||
        cfg->dim > MT_TABLE_MAX_DIM || !(cfg->sparse_lr > 0) || !(cfg->dense_lr > 0) ||
        !(cfg->dense_beta1 >= 0 && cfg->dense_beta1 < 1) ||
        !(cfg->dense_beta2 >= 0 && cfg->dense_beta2 < 1) ||
        !(cfg->dense_eps > 0 && cfg->dense_eps < 1) || cfg->nhidden > 8 ||
        !(cfg->cowclip_ratio >= 0 && cfg->cowclip_ratio < 1e30f) ||
        !(cfg->cowclip_zeta >= 0 && cfg->cowclip_zeta < 1e30f))
        return MT_CONFIG;
    /* slot_hash_buckets is indexed like slot_ids, not by slot id: catch the mix-up */
    for (uint32_t s = cfg->nslots; s < 256; s++)
        if (cfg->slot_hash_buckets[s] || cfg->slot_mean[s] || cfg->slot_dim[s]) return MT_CONFIG;
    for (uint32_t s = 0; s < cfg->nslots; s++)
        if (cfg->slot_dim[s] >= MT_TABLE_MAX_DIM) return MT_CONFIG;
    for (uint32_t s = 0; s < cfg->nslots; s++)
        if (cfg->slot_mean[s] > 1) return MT_CONFIG;
    for (uint32_t s = 0; s < cfg->nslots; s++) {
        if (cfg->slot_ids[s] >= MT_MODEL_SLOT_LIMIT) return MT_CONFIG;
        for (uint32_t k = 0; k < s; k++)
            if (cfg->slot_ids[k] == cfg->slot_ids[s]) return MT_CONFIG;
    }
    mt_trainer_t *tr = calloc(1, sizeof(*tr));
    if (!tr) return MT_NOMEM;
    tr->cfg = *cfg;
    uint32_t dims[256];
    mt_model_config_t mc;
    tr->mixed = model_config_of(cfg, &mc, dims);
    mt_err_t err = mt_model_create(&mc, &tr->model);
    if (err) goto fail;
    /* (a mean-pooled din sequence: MT_CONFIG) */
    err = mt_model_layout_init(&tr->lay, mt_model_config(tr->model), cfg->slot_ids, cfg->slot_mean,
                               cfg->slot_hash_buckets, cfg->hash_buckets, NULL, 0);
    if (err) goto fail;
    if (cfg->backend) {
        tr->backend = *cfg->backend;
        tr->cfg.backend = NULL;
    } else { /* the table slots of the layout (mt_trainer_slot_configs()'s) */
        mt_table_slot_config_t *sc = calloc(cfg->nslots, sizeof(*sc));
        uint16_t ids[256];
        uint32_t floats[256];
        err = MT_NOMEM;
        if (!sc) goto fail;
        size_t nsc = mt_model_layout_tables(&tr->lay, ids, floats);
        slot_configs_of(cfg, ids, floats, nsc, sc);
        mt_table_config_t tc;
        mt_table_config_init(&tc);
        tc.slots = sc;
        tc.nslots = nsc;
        tc.shards_log2 = cfg->table_shards_log2;
        tc.initial_rows = cfg->table_initial_rows;
        tc.reserve_rows = 1;      /* and their memory, faulted in now */
        tc.changelog_entries = 0; /* a local training table has no replicas to sync */
        if (cfg->min_count <= 1) tc.filter_bytes = 0;
        err = mt_table_create(&tc, &tr->table);
        free(sc);
        if (err) goto fail;
        tr->nparts = mt_table_parts_of(tr->table, NULL, 0, NULL);
        if (!(tr->pcount = calloc(tr->nparts + 1, sizeof(uint32_t)))) {
            err = MT_NOMEM;
            goto fail;
        }
        tr->backend =
            (mt_trainer_backend_t){.ud = tr->table, .lookup = local_lookup, .apply = local_apply};
    }
    tr->ntasks = mt_model_ntasks(tr->model);
    err = mt_model_ws_create(&tr->ws);
    if (err) goto fail;
    tr->nparams = mt_model_nparams(tr->model);
    tr->am = calloc(tr->nparams, sizeof(float *));
    tr->av = calloc(tr->nparams, sizeof(float *));
    err = MT_NOMEM;
    if (!tr->am || !tr->av) goto fail;
    for (size_t i = 0; i < tr->nparams; i++) {
        mt_model_param_t p;
        mt_model_param(tr->model, i, &p);
        tr->am[i] = calloc(p.size, sizeof(float));
        tr->av[i] = calloc(p.size, sizeof(float));
        if (!tr->am[i] || !tr->av[i]) goto fail;
    }
    *out = tr;
    return MT_OK;
fail:
    mt_trainer_destroy(tr);
    return err;
}

void mt_trainer_set_dense_remote(mt_trainer_t *tr, int remote) {
    tr->dense_remote = remote != 0;
}

mt_table_t *mt_trainer_table(mt_trainer_t *tr) {
    return tr->table;
}
mt_model_t *mt_trainer_model(mt_trainer_t *tr) {
    return tr->model;
}

/* Reallocates *p to @p bytes; on failure *p stays as it was. @returns 0 or -1. */
static int resize(void **p, size_t bytes) {
    void *np = realloc(*p, bytes ? bytes : 1);
    if (!np) return -1;
    *p = np;
    return 0;
}

/* The capacity to grow @p cap to so that it holds @p need (doubling from @p first). */
static size_t grown(size_t cap, size_t need, size_t first) {
    size_t c = cap ? cap : first;
    while (c < need)
        c *= 2;
    return c;
}

/* Grows an id set for a batch of occ occurrences. A capacity is recorded only once all its
 * buffers have it. */
static mt_err_t reserve_ids(const mt_trainer_t *tr, idset_t *s, size_t occ) {
    if (occ > s->cap_occ || !s->uidx) {
        size_t c = grown(s->cap_occ, occ, 1024);
        size_t d = tr->lay.max_dim;
        /* unique ids never outnumber occurrences: their buffers share the capacity */
        if (resize((void **)&s->uidx, c * sizeof(uint32_t)) ||
            resize((void **)&s->ufid, c * sizeof(uint64_t)) ||
            resize((void **)&s->uemb, c * mt_model_row_floats((uint32_t)d) * sizeof(float)) ||
            (tr->mixed && (resize((void **)&s->uslot, c * sizeof(uint16_t)) ||
                           resize((void **)&s->uoff, (c + 1) * sizeof(size_t)))) ||
            (tr->table && resize((void **)&s->uhint, c * sizeof(mt_table_hint_t))))
            return MT_NOMEM;
        s->cap_occ = c;
    }
    return MT_OK;
}

/* Grows the step's scratch for a batch of n examples, occ occurrences (the map too, which
 * every id set's mapping uses). */
static mt_err_t reserve(mt_trainer_t *tr, size_t n, size_t occ) {
    size_t d = tr->lay.max_dim, S = tr->cfg.nslots, D = tr->lay.width;
    if (occ > tr->cap_ug || !tr->ug) {
        size_t c = grown(tr->cap_ug, occ, 1024);
        if (resize((void **)&tr->ug, c * mt_model_row_floats((uint32_t)d) * sizeof(float)) ||
            (tr->cfg.cowclip_ratio > 0 && resize((void **)&tr->ucnt, c * sizeof(uint32_t))))
            return MT_NOMEM;
        tr->cap_ug = c;
    }
    if (n > tr->cap_n || !tr->E) {
        size_t c = grown(tr->cap_n, n, 256);
        if (resize((void **)&tr->E, c * D * sizeof(float)) ||
            resize((void **)&tr->W1, c * S * sizeof(float)) ||
            resize((void **)&tr->dE, c * D * sizeof(float)) ||
            resize((void **)&tr->dW1, c * S * sizeof(float)) ||
            resize((void **)&tr->probs, c * tr->ntasks * sizeof(float)))
            return MT_NOMEM;
        tr->cap_n = c;
    }
    size_t want = 16;
    while (want < 2 * occ)
        want *= 2;
    if (want > tr->cap_map) {
        uint32_t *m = realloc(tr->map, want * sizeof(uint32_t));
        if (!m) return MT_NOMEM;
        tr->map = m;
        tr->cap_map = want;
    }
    if (tr->table && occ > tr->cap_sort) {
        size_t c = grown(tr->cap_sort, occ, 1024);
        if (resize((void **)&tr->sfid, c * sizeof(uint64_t)) ||
            (tr->mixed && resize((void **)&tr->sslot, c * sizeof(uint16_t))))
            return MT_NOMEM;
        tr->cap_sort = c;
    }
    return MT_OK;
}

/* Orders an id set's U unique ids by the part of the trainer's own table they are in
 * (mt_table_part_order()) and maps the occurrences to their new places: the table's writers
 * then take each part's lock once for its run of ids and stay in one part's buckets and rows
 * (a few MB of memory where the whole table spans a GB) at a time. The map (its probing
 * done) holds each id's new place. */
static void order_by_part(mt_trainer_t *tr, idset_t *ids, const mt_batch_t *b) {
    const size_t nu = ids->nu;
    uint32_t *to = tr->map;
    /* it fails on no more than a batch of over 2^32 ids (the count is the trainer's) */
    if (mt_table_part_order(tr->table, ids->ufid, nu, to, tr->pcount) != MT_OK) return;
    for (size_t u = 0; u < nu; u++) {
        tr->sfid[to[u]] = ids->ufid[u];
        if (tr->mixed) tr->sslot[to[u]] = ids->uslot[u];
    }
    memcpy(ids->ufid, tr->sfid, nu * sizeof(uint64_t));
    if (tr->mixed) memcpy(ids->uslot, tr->sslot, nu * sizeof(uint16_t));
    for (size_t k = 0; k < b->nfids; k++)
        if (ids->uidx[k] != UINT32_MAX) ids->uidx[k] = to[ids->uidx[k]];
}

/* Maps the batch's occurrences to unique ids in @p ids (ufid[0..U)), with the own table in
 * its parts' order; sets and @returns U. The map must hold 2 * b->nfids (reserve()). */
static size_t unique_ids(mt_trainer_t *tr, idset_t *ids, const mt_batch_t *b) {
    size_t sz = 16, nu = 0;
    while (sz < 2 * b->nfids)
        sz *= 2;
    memset(tr->map, 0, sz * sizeof(uint32_t));
    /* An occurrence's table id is the layout's for its slot and position (the reduction by
     * the slot's buckets; a din sequence's ids are the query slot's, past its length none:
     * uidx UINT32_MAX, not looked up). Occurrences are in cell order (example i, slot s), so
     * the slot follows the offsets; a uniform layout reduces every id alike. */
    const uint64_t hb = tr->cfg.hash_buckets;
    size_t cell = 0;
    uint32_t slot = 0;
    const int track = !tr->lay.uniform;
    for (size_t k = 0; k < b->nfids; k++) {
        uint64_t f = b->fids[k];
        if (track) {
            while (k >= b->offsets[cell + 1]) {
                cell++;
                slot = slot + 1 == b->nslots ? 0 : slot + 1;
            }
            f = mt_model_layout_id(&tr->lay.slot[slot], (uint32_t)(k - b->offsets[cell]), f);
            if (f == MT_MODEL_NO_ID) {
                ids->uidx[k] = UINT32_MAX;
                continue;
            }
        } else {
            f = mt_model_reduce_fid(f, hb);
        }
        size_t h = (size_t)((f * 0x9E3779B97F4A7C15ull) >> 17) & (sz - 1);
        while (tr->map[h] && ids->ufid[tr->map[h] - 1] != f)
            h = (h + 1) & (sz - 1);
        if (!tr->map[h]) {
            ids->ufid[nu] = f;
            if (tr->mixed) ids->uslot[nu] = (uint16_t)slot; /* a fid holds its slot */
            tr->map[h] = (uint32_t)++nu;
        }
        ids->uidx[k] = tr->map[h] - 1;
    }
    ids->nu = nu;
    if (tr->table && tr->nparts > 1) order_by_part(tr, ids, b);
    if (tr->mixed) { /* packed rows: each id's offset */
        size_t off = 0;
        for (size_t u = 0; u < nu; u++) {
            ids->uoff[u] = off;
            off += mt_model_row_floats(tr->lay.slot[ids->uslot[u]].dim);
        }
        ids->uoff[nu] = off;
    }
    return nu;
}

/* The batch's slots and tasks are the model's. */
static mt_err_t check_slots(const mt_trainer_t *tr, const mt_batch_t *b) {
    if (b->nslots != tr->cfg.nslots || b->ntasks != tr->ntasks) return MT_MISMATCH;
    for (uint32_t s = 0; s < b->nslots; s++)
        if (b->slot_ids[s] != tr->cfg.slot_ids[s]) return MT_MISMATCH;
    return MT_OK;
}

/* Id u's row in an id set's uemb (and in ug): packed by the slots' dims. */
static inline size_t row_at(const mt_trainer_t *tr, const idset_t *ids, size_t u) {
    return tr->mixed ? ids->uoff[u] : u * mt_model_row_floats(tr->cfg.dim);
}

/* The floats of an id set's rows. */
static inline size_t rows_len(const mt_trainer_t *tr, const idset_t *ids) {
    return row_at(tr, ids, ids->nu);
}

/* The one lookup of an id set's rows (embedding, then first-order weight). */
static mt_err_t look_up(const mt_trainer_t *tr, idset_t *ids, int train, uint32_t now_s) {
    if (train && tr->table) /* and where the rows are, for the apply */
        return mt_table_lookup_rows(tr->table, ids->ufid, ids->nu, ids->uemb, rows_len(tr, ids),
                                    now_s, ids->uhint, NULL);
    return tr->backend.lookup(tr->backend.ud, ids->ufid, ids->nu, train, now_s, ids->uemb,
                              rows_len(tr, ids));
}

/* The ids of a cell the model reads: [k, end) of the batch, at most the slot's length. */
static inline size_t cell_stop(const mt_model_slot_t *ls, size_t k, size_t end) {
    return end - k > ls->len ? k + ls->len : end;
}

/* Pools the looked-up values of @p ids into E and W1: each cell by the layout (model.h),
 * from its ids' rows in order. Cells are in E's order (example i, slot s): cell (i, s)
 * starts where cell (i, s - 1) ends; a cell starts from its first id's row (no clearing pass
 * over E). */
static void pool(mt_trainer_t *tr, const mt_batch_t *b, const idset_t *ids) {
    size_t S = tr->cfg.nslots;
    const uint32_t *uidx = ids->uidx;
    const float *uemb = ids->uemb;
    size_t s = 0;
    float *e = tr->E;
    for (size_t cell = 0; cell < b->n * S; cell++, s = s + 1 == S ? 0 : s + 1) {
        const mt_model_slot_t *ls = &tr->lay.slot[s];
        float *w1 = tr->W1 + cell;
        const size_t k0 = b->offsets[cell], end = b->offsets[cell + 1];
        const size_t stop = cell_stop(ls, k0, end);
        for (size_t k = k0; k < stop; k++)
            mt_model_layout_add(ls, (uint32_t)(k - k0), e, w1, uemb + row_at(tr, ids, uidx[k]));
        mt_model_layout_end(ls, (uint32_t)(end - k0), e, w1);
        e += ls->width;
    }
}

/* ---------------- id sets (the step's own and prefetched batches') ---------------- */

/* Sets an id set's state (under the pipe's lock when the pipeline runs: its thread reads the
 * states of queued sets). */
static void set_state(mt_trainer_t *tr, idset_t *s, int state) {
    if (!tr->pipe.on) {
        s->state = state;
        return;
    }
    pthread_mutex_lock(&tr->pipe.lock);
    s->state = state;
    pthread_mutex_unlock(&tr->pipe.lock);
}

/* A set no prefetch holds, for the calling thread's own use (there is one: at most NIDS - 1
 * prefetches wait, and the step's set is free again when it returns). */
static idset_t *free_ids(mt_trainer_t *tr) {
    idset_t *s = NULL;
    if (tr->pipe.on) pthread_mutex_lock(&tr->pipe.lock);
    for (int i = 0; i < NIDS && !s; i++)
        if (tr->ids[i].state == IDS_FREE) s = &tr->ids[i];
    if (tr->pipe.on) pthread_mutex_unlock(&tr->pipe.lock);
    assert(s);
    return s;
}

static uint64_t batch_hash(const mt_batch_t *b) {
    uint64_t h = XXH3_64bits(b->fids, b->nfids * sizeof(uint64_t));
    return XXH3_64bits_withSeed(b->offsets, (b->n * b->nslots + 1) * sizeof(size_t), h);
}

uint32_t mt_trainer_ntasks(const mt_trainer_t *tr) {
    return tr ? tr->ntasks : 0;
}

mt_err_t mt_trainer_predict(mt_trainer_t *tr, const mt_batch_t *b, float *probs) {
    mt_err_t err = check_slots(tr, b);
    if (err) return err;
    if (b->n == 0) return MT_OK;
    if ((err = reserve(tr, b->n, b->nfids)) != MT_OK) return err;
    idset_t *ids = free_ids(tr); /* stays free: no prefetch is made while this runs */
    if ((err = reserve_ids(tr, ids, b->nfids)) != MT_OK) return err;
    unique_ids(tr, ids, b);
    if ((err = look_up(tr, ids, 0, 0)) != MT_OK) return err;
    pool(tr, b, ids);
    return mt_model_forward(tr->model, tr->ws, tr->E, tr->W1, b->n, probs);
}

/* Dense Adam on the model's parameters (the PS's dense store runs the same code). */
static void adam_step(mt_trainer_t *tr) {
    mt_model_adam_t o = {tr->cfg.dense_lr, tr->cfg.dense_beta1, tr->cfg.dense_beta2,
                         tr->cfg.dense_eps};
    tr->step++;
    for (size_t i = 0; i < tr->nparams; i++) {
        mt_model_param_t p;
        mt_model_param(tr->model, i, &p);
        mt_model_adam_step(&o, tr->step, p.values, tr->am[i], tr->av[i], p.grads, p.size);
    }
}

/* ---------------- pipelined steps ---------------- */

/* One apply of fids/grads with the step's examples and cover (either mode). */
static mt_err_t do_apply(mt_trainer_t *tr, const uint64_t *fids, const mt_table_hint_t *hints,
                         size_t n, const float *grads, size_t len, uint32_t now_s,
                         uint64_t examples, const mt_psc_range_t *cover, size_t ncover,
                         uint32_t *skipped) {
    *skipped = 0;
    if (tr->table && !ncover) /* the rows the step's lookup found */
        return mt_table_apply_rows(tr->table, fids, hints, n, grads, len, now_s, NULL);
    if (!ncover) return tr->backend.apply(tr->backend.ud, fids, n, grads, len, now_s, examples);
    if (!tr->backend.apply_cover) return MT_INVALID;
    return tr->backend.apply_cover(tr->backend.ud, fids, n, grads, len, now_s, examples, cover,
                                   ncover, skipped);
}

/* Queues a job (pipe.lock held). */
static void enqueue(pipe_t *p, int job) {
    assert(p->qlen < (int)(sizeof(p->queue) / sizeof(p->queue[0])));
    p->queue[(p->qhead + p->qlen) % 4] = job;
    p->qlen++;
    pthread_cond_broadcast(&p->cond);
}

static void *pipe_main(void *arg) {
    mt_trainer_t *tr = arg;
    pipe_t *p = &tr->pipe;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->qlen && !p->quit)
            pthread_cond_wait(&p->cond, &p->lock);
        if (!p->qlen) break; /* quit with nothing to do */
        int job = p->queue[p->qhead];
        p->qhead = (p->qhead + 1) % 4;
        p->qlen--;
        pthread_mutex_unlock(&p->lock);
        if (job == JOB_APPLY) {
            uint32_t skipped = 0;
            mt_err_t err = do_apply(tr, p->fids, p->hints, p->n, p->grads, p->len, p->now_s,
                                    p->examples, p->cover, p->ncover, &skipped);
            pthread_mutex_lock(&p->lock);
            p->err = err;
            p->skipped = skipped;
            p->busy = 0;
        } else {
            idset_t *s = &tr->ids[job];
            mt_err_t err = look_up(tr, s, 1, s->now_s);
            pthread_mutex_lock(&p->lock);
            s->err = err;
            s->state = IDS_READY;
        }
        pthread_cond_broadcast(&p->cond);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* Waits for every prefetch and forgets them (their lookups happened: they are not undone). */
static void drop_prefetches(mt_trainer_t *tr) {
    pipe_t *p = &tr->pipe;
    if (!p->on) return;
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < NIDS; i++) {
        while (tr->ids[i].state == IDS_QUEUED)
            pthread_cond_wait(&p->cond, &p->lock);
        if (tr->ids[i].state == IDS_READY) tr->ids[i].state = IDS_FREE;
    }
    pthread_mutex_unlock(&p->lock);
}

/* The prefetch of @p b (the same batch, unchanged) made at most one step ago, looked up (its
 * state IDS_STEP; its err the lookup's), or NULL. Prefetches older than it, and those made two
 * or more steps ago (which could only be used staler than one step), and those of the same
 * batch whose contents changed since, are dropped; a batch not prefetched leaves the others
 * alone. */
static idset_t *take_prefetched(mt_trainer_t *tr, const mt_batch_t *b) {
    pipe_t *p = &tr->pipe;
    idset_t *use = NULL;
    uint64_t hash = 0;
    int hashed = 0;
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < NIDS; i++) { /* the oldest one of b */
        idset_t *x = &tr->ids[i];
        if (x->state != IDS_QUEUED && x->state != IDS_READY) continue;
        if (x->batch != b || x->n != b->n || x->nfids != b->nfids) continue;
        if (!hashed) hash = batch_hash(b), hashed = 1;
        if (x->hash == hash && (!use || x->seq < use->seq)) use = x;
    }
    if (use && tr->steps - use->step_at > 1) use = NULL; /* too stale: dropped below */
    for (int i = 0; i < NIDS; i++) {
        idset_t *x = &tr->ids[i];
        if (x->state != IDS_QUEUED && x->state != IDS_READY) continue;
        int changed = x->batch == b && x != use; /* the caller's batch is another now */
        if (x != use && ((use && x->seq < use->seq) || tr->steps - x->step_at > 1 || changed)) {
            while (x->state == IDS_QUEUED)
                pthread_cond_wait(&p->cond, &p->lock);
            x->state = IDS_FREE;
        }
    }
    if (use) {
        while (use->state == IDS_QUEUED)
            pthread_cond_wait(&p->cond, &p->lock);
        use->state = IDS_STEP;
    }
    pthread_mutex_unlock(&p->lock);
    return use;
}

mt_err_t mt_trainer_prefetch(mt_trainer_t *tr, const mt_batch_t *b, uint32_t now_s) {
    pipe_t *p = &tr->pipe;
    if (!p->on) return MT_INVALID;
    mt_err_t err = check_slots(tr, b);
    if (err || b->n == 0) return err;
    int waiting = 0;
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < NIDS; i++)
        waiting += tr->ids[i].state == IDS_QUEUED || tr->ids[i].state == IDS_READY;
    pthread_mutex_unlock(&p->lock);
    if (waiting >= NIDS - 1) return MT_LIMIT;
    idset_t *s = free_ids(tr);
    if ((err = reserve(tr, b->n, b->nfids)) != MT_OK ||
        (err = reserve_ids(tr, s, b->nfids)) != MT_OK)
        return err;
    unique_ids(tr, s, b);
    s->batch = b;
    s->n = b->n;
    s->nfids = b->nfids;
    s->hash = batch_hash(b);
    s->now_s = now_s;
    s->seq = ++tr->prefetch_seq;
    s->step_at = tr->steps;
    s->err = MT_OK;
    pthread_mutex_lock(&p->lock);
    s->state = IDS_QUEUED;
    enqueue(p, (int)(s - tr->ids));
    pthread_mutex_unlock(&p->lock);
    return MT_OK;
}

mt_err_t mt_trainer_wait(mt_trainer_t *tr, mt_trainer_step_t *st) {
    pipe_t *p = &tr->pipe;
    if (!p->on) return MT_OK;
    int was = p->sent;
    p->sent = 0;
    pthread_mutex_lock(&p->lock);
    while (p->busy)
        pthread_cond_wait(&p->cond, &p->lock);
    mt_err_t err = was ? p->err : MT_OK;
    uint32_t skipped = was ? p->skipped : 0;
    p->err = MT_OK;
    p->skipped = 0;
    pthread_mutex_unlock(&p->lock);
    if (st) {
        st->skipped_shards = skipped;
        st->previous = was && !err;
    }
    return err;
}

mt_err_t mt_trainer_set_pipelined(mt_trainer_t *tr, int on) {
    pipe_t *p = &tr->pipe;
    if (!!on == p->on) return MT_OK;
    if (on) {
        if (pthread_mutex_init(&p->lock, NULL)) return MT_NOMEM;
        if (pthread_cond_init(&p->cond, NULL)) {
            pthread_mutex_destroy(&p->lock);
            return MT_NOMEM;
        }
        p->busy = p->quit = p->sent = 0;
        p->qhead = p->qlen = 0;
        p->err = MT_OK;
        if (pthread_create(&p->thread, NULL, pipe_main, tr)) {
            pthread_cond_destroy(&p->cond);
            pthread_mutex_destroy(&p->lock);
            return MT_NOMEM;
        }
        p->on = 1;
        return MT_OK;
    }
    drop_prefetches(tr);
    (void)mt_trainer_wait(tr, NULL); /* its result is the caller's to ask for first */
    pthread_mutex_lock(&p->lock);
    p->quit = 1;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->lock);
    p->on = 0;
    return MT_OK;
}

/* Hands the step's apply to the apply thread (nothing is in flight: the caller waited). */
static mt_err_t pipe_send(mt_trainer_t *tr, const idset_t *ids, size_t len, uint32_t now_s,
                          uint64_t examples, const mt_psc_range_t *cover, size_t ncover) {
    pipe_t *p = &tr->pipe;
    size_t n = ids->nu;
    if (n > p->cap_fids) {
        size_t c = grown(p->cap_fids, n, 2048);
        if (resize((void **)&p->fids, c * sizeof(uint64_t)) ||
            (tr->table && resize((void **)&p->hints, c * sizeof(mt_table_hint_t))))
            return MT_NOMEM;
        p->cap_fids = c;
    }
    if (len > p->cap_grads) {
        size_t c = grown(p->cap_grads, len, 4096);
        if (resize((void **)&p->grads, c * sizeof(float))) return MT_NOMEM;
        p->cap_grads = c;
    }
    if (ncover > p->cap_cover) {
        size_t c = grown(p->cap_cover, ncover, 16);
        if (resize((void **)&p->cover, c * sizeof(mt_psc_range_t))) return MT_NOMEM;
        p->cap_cover = c;
    }
    memcpy(p->fids, ids->ufid, n * sizeof(uint64_t));
    if (tr->table) memcpy(p->hints, ids->uhint, n * sizeof(mt_table_hint_t));
    memcpy(p->grads, tr->ug, len * sizeof(float));
    if (ncover) memcpy(p->cover, cover, ncover * sizeof(mt_psc_range_t));
    p->n = n;
    p->len = len;
    p->now_s = now_s;
    p->examples = examples;
    p->ncover = ncover;
    p->sent = 1;
    pthread_mutex_lock(&p->lock);
    p->busy = 1;
    enqueue(p, JOB_APPLY);
    pthread_mutex_unlock(&p->lock);
    return MT_OK;
}

void mt_trainer_set_cover(mt_trainer_t *tr, const mt_psc_range_t *cover, size_t n) {
    tr->cover = n ? cover : NULL;
    tr->ncover = n;
}

const char *mt_trainer_phase_name(mt_trainer_phase_t p) {
    static const char *names[MT_TRAINER_NPHASES] = {"ids", "lookup", "model", "apply", "dense"};
    return (unsigned)p < MT_TRAINER_NPHASES ? names[p] : "?";
}

/* Adds the time since *t to phase @p p of @p sec and moves *t to now. */
static inline void phase_end(double *sec, mt_trainer_phase_t p, double *t) {
    double now = mt_mono_s();
    sec[p] += now - *t;
    *t = now;
}

/* The step's lookup, pooling and forward/backward into the trainer's scratch; *ids: the id
 * set used (a prefetched one, or a free one looked up here), IDS_STEP when the pipeline runs.
 * Their times are added to @p sec from *t (moved to the end). */
static mt_err_t compute(mt_trainer_t *tr, const mt_batch_t *b, uint32_t now_s, float *probs,
                        float *loss, idset_t **ids, double *sec, double *t) {
    mt_err_t err = reserve(tr, b->n, b->nfids);
    if (err) return err;
    if (*ids) {
        if ((err = (*ids)->err) != MT_OK) return err; /* its prefetched lookup's */
    } else {
        idset_t *s = *ids = free_ids(tr);
        set_state(tr, s, IDS_STEP);
        if ((err = reserve_ids(tr, s, b->nfids)) != MT_OK) return err;
        unique_ids(tr, s, b);
        phase_end(sec, MT_TRAINER_PHASE_IDS, t);
        err = look_up(tr, s, 1, now_s);
        phase_end(sec, MT_TRAINER_PHASE_LOOKUP, t);
        if (err) return err;
    }
    pool(tr, b, *ids);
    err = mt_model_forward_backward(tr->model, tr->E, tr->W1, b->labels, NULL, b->n,
                                    probs ? probs : tr->probs, loss, tr->dE, tr->dW1);
    phase_end(sec, MT_TRAINER_PHASE_MODEL, t);
    return err;
}

mt_err_t mt_trainer_train(mt_trainer_t *tr, const mt_batch_t *b, uint32_t now_s, float *probs,
                          mt_trainer_step_t *st) {
    /* the cover is this step's only, whatever happens to it */
    const mt_psc_range_t *cover = tr->cover;
    size_t ncover = tr->ncover;
    tr->cover = NULL;
    tr->ncover = 0;
    double sec[MT_TRAINER_NPHASES] = {0}, t = mt_mono_s();
    /* this batch's prefetch, if the caller made one (an empty batch leaves them alone) */
    idset_t *ids = tr->pipe.on && b->n ? take_prefetched(tr, b) : NULL;
    phase_end(sec, MT_TRAINER_PHASE_LOOKUP, &t);
    mt_err_t err = check_slots(tr, b);
    for (size_t i = 0; i < b->n * b->ntasks && !err; i++)
        if (!(b->labels[i] >= 0.0f && b->labels[i] <= 1.0f)) err = MT_INVALID;
    size_t S = tr->cfg.nslots;
    float loss = 0;
    /* pipelined: the previous step's apply may be in flight meanwhile */
    if (!err && b->n) err = compute(tr, b, now_s, probs, &loss, &ids, sec, &t);
    mt_trainer_step_t prev = {0};
    if (tr->pipe.on) { /* the previous step's apply first: one in flight, in order */
        mt_err_t perr = mt_trainer_wait(tr, &prev);
        if (!err) err = perr;
        phase_end(sec, MT_TRAINER_PHASE_APPLY, &t);
    }
    if (st) { /* an error leaves st as it was, but for whether the previous step landed */
        if (!err) memset(st, 0, sizeof(*st));
        st->previous = prev.previous;
        if (!err) st->skipped_shards = prev.skipped_shards;
    }
    if (!err && b->n) {
        /* Scatter: an id's gradient is the sum over its occurrences of the per-example
         * gradient (the batch mean's gradient times n). */
        size_t nu = ids->nu, len = rows_len(tr, ids);
        float scale = (float)b->n;
        float *ug = tr->ug;
        memset(ug, 0, len * sizeof(float));
        const uint32_t *uidx = ids->uidx;
        size_t s = 0;
        const float *de = tr->dE; /* cell (i, s)'s part of dE: in cell order, as in pool() */
        for (size_t cell = 0; cell < b->n * S; cell++, s = s + 1 == S ? 0 : s + 1) {
            /* each id's row gets its share of the cell's gradient (the layout's: all of it,
             * 1 / count of a mean, its position's of a sequence) */
            const mt_model_slot_t *ls = &tr->lay.slot[s];
            const size_t k0 = b->offsets[cell], end = b->offsets[cell + 1];
            const size_t stop = cell_stop(ls, k0, end);
            const float dw1 = tr->dW1[cell];
            for (size_t k = k0; k < stop; k++)
                mt_model_layout_grad(ls, (uint32_t)(k - k0), (uint32_t)(end - k0), de, dw1, scale,
                                     ug + row_at(tr, ids, uidx[k]));
            de += ls->width;
        }
        if (tr->cfg.cowclip_ratio > 0) { /* each id's embedding gradient, against its row */
            uint32_t *cnt = tr->ucnt;
            memset(cnt, 0, nu * sizeof(uint32_t));
            for (size_t k = 0; k < b->nfids; k++)
                if (uidx[k] != UINT32_MAX) cnt[uidx[k]]++; /* (din: past L, none) */
            for (size_t u = 0; u < nu; u++) {
                size_t at = row_at(tr, ids, u);
                uint32_t du = tr->mixed ? tr->lay.slot[ids->uslot[u]].dim : tr->cfg.dim;
                mt_model_cowclip(ug + at, ids->uemb + at, du, cnt[u], tr->cfg.cowclip_ratio,
                                 tr->cfg.cowclip_zeta);
            }
        }
        phase_end(sec, MT_TRAINER_PHASE_MODEL, &t);
        /* one apply of the rows, with the step's examples */
        uint32_t skipped = 0;
        if (tr->pipe.on) {
            if (ncover && !tr->backend.apply_cover)
                err = MT_INVALID;
            else
                err = pipe_send(tr, ids, len, now_s, b->n, cover, ncover);
            skipped = prev.skipped_shards;
        } else {
            err = do_apply(tr, ids->ufid, ids->uhint, nu, tr->ug, len, now_s, b->n, cover, ncover,
                           &skipped);
        }
        phase_end(sec, MT_TRAINER_PHASE_APPLY, &t);
        if (!err && st) {
            st->loss = loss;
            st->examples = b->n;
            st->ids = b->nfids;
            st->unique_ids = nu;
            st->skipped_shards = skipped;
            st->previous = prev.previous;
        }
    }
    if (ids) set_state(tr, ids, IDS_FREE);
    if (err) {
        drop_prefetches(tr); /* after an error nothing is in flight and nothing prefetched */
        return err;
    }
    if (b->n) {
        tr->steps++;
        if (!tr->dense_remote) adam_step(tr);
        phase_end(sec, MT_TRAINER_PHASE_DENSE, &t);
    }
    if (st) memcpy(st->seconds, sec, sizeof(sec));
    return MT_OK;
}
