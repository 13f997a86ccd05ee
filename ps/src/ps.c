/*
 * ps.c - the ParameterServer methods over one shard's table and dense parameters.
 *
 * Every call: counted and its request unpacked by dispatch() (malformed -> INVALID_ARGUMENT
 * "malformed <RequestType>"), then the method's handler checks limits (RESOURCE_EXHAUSTED),
 * every id (unknown slot, other shard -> INVALID_ARGUMENT) and every float (NaN or infinite
 * gradients -> INVALID_ARGUMENT) before touching the table, then acts, packs and replies
 * (reply_msg). A bad request changes nothing. dispatch() frees the request after the handler.
 *
 * Answer sizes: gRPC refuses to send a message over the server's max_message_bytes (the
 * call then fails inside gRPC, after the work, uncounted). So a Lookup's answer size
 * (lookup_bytes: exact protobuf size) is checked against cfg.max_message_bytes before the
 * table is read, Sync chunks are cut to fit it (sync_chunk_fit), and reply_msg refuses any
 * other answer over it; each refusal is RESOURCE_EXHAUSTED, counted like every error.
 */
#include "mt/strbuf.h"
#include "mt/ps.h"
#include "mt/clock.h"

#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <xxhash.h>

#include "monolith/v1/ps.pb-c.h"
#include "ps_int.h"

#define PATH(m) "/monolith.v1.ParameterServer/" m

typedef struct dense_tensor {
    char *name;
    uint32_t *shape;
    size_t nshape;
    size_t n;
    float *w, *s1, *s2; /* weights, Adagrad accumulator or Adam m, Adam v */
    uint64_t steps;
} dense_tensor_t;

#define MT__HIST_BUCKETS 13
static const double hist_bounds_s[MT__HIST_BUCKETS - 1] = {
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25};

/* A method's handler: @p req is the method's request, unpacked; borrowed (dispatch() frees it
 * when the handler returns). The handler finishes the call (reply_msg or FAIL). */
typedef void (*method_fn)(struct mt_ps *ps, mt_rpc_call_t *c, const void *req);

/* One registered method (the ud of its rpc handler, timed()). */
typedef struct method_ctx {
    struct mt_ps *ps;
    int idx; /* MT_PS_LOOKUP, ...: the counters' index */
    method_fn fn;
    const ProtobufCMessageDescriptor *req_desc; /* the request message's type */
} method_ctx_t;

struct mt_ps {
    mt_ps_config_t cfg;
    method_ctx_t ctx[MT_PS_NMETHODS];
    _Atomic uint64_t hist[MT_PS_NMETHODS][MT__HIST_BUCKETS]; /* latency, cumulative at render */
    _Atomic uint64_t hist_sum_us[MT_PS_NMETHODS];
    char *admin_token;
    mt_table_t *table;
    uint32_t max_dim;      /* widest slot: sizes Sync's value buffers */
    _Atomic int restoring; /* 1: every method answers UNAVAILABLE; the table may be replaced */
    _Atomic uint64_t incarnation;  /* changed only while quiesced (mt__ps_install) */
    mt_table_slot_config_t *slots; /* owned copy of cfg.table.slots (a restore builds tables) */
    /* Calls using the table now (see mt__ps_enter): a restore waits for 0 to swap it. The
     * admin methods (Snapshot, Restore, Checkpoints) are not counted: snap_lock orders them. */
    _Atomic int64_t inflight;
    _Atomic uint64_t examples_applied, step; /* ApplyGradients' examples and highest step */
    _Atomic uint64_t epoch; /* highest coordinator epoch seen (fence_ok); 0 after a start */
    /* Dense parameters, guarded by dense_lock. */
    pthread_mutex_t dense_lock;
    dense_tensor_t *dense;
    size_t ndense;
    uint64_t dense_version;
    /* Checkpoints (ckpt.c): the store and its counters, guarded by snap_lock. */
    mt__ps_ckpt_t *ck;
    pthread_mutex_t snap_lock; /* one snapshot, restore or listing at a time */
    /* Counters. */
    _Atomic uint64_t calls[MT_PS_NMETHODS], errors[MT_PS_NMETHODS];
    _Atomic uint64_t lookup_fids, apply_fids, sync_entries;
    _Atomic int stop_streams;   /* 1: follow Sync streams end at their next round */
    _Atomic uint32_t followers; /* follow Sync streams open now */
};

/* ============================== config ============================== */

void mt_ps_dense_config_init(mt_ps_dense_config_t *d) {
    memset(d, 0, sizeof(*d));
    d->opt = MT_OPT_ADAM;
    d->lr = 0.001f;
    d->beta1 = 0.9f;
    d->beta2 = 0.999f;
    d->eps = 1e-8f;
    d->init_accum = 0.1f;
}

void mt_ps_config_init(mt_ps_config_t *c) {
    memset(c, 0, sizeof(*c));
    c->shard = 0;
    c->num_shards = 1;
    mt_table_config_init(&c->table);
    mt_ps_dense_config_init(&c->dense);
    c->max_batch_fids = 1u << 20;
    c->sync_chunk_fids = 4096;
    c->sync_follow_max_s = 300;
    c->sync_max_followers = 2;
    c->admin_token = NULL;
    mt_rpc_server_config_t rc; /* the server's default limit: one place holds the number */
    mt_rpc_server_config_init(&rc);
    c->max_message_bytes = rc.max_message_bytes;
}

uint32_t mt_ps_shard_of(uint64_t fid, uint32_t num_shards) {
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(fid >> (8 * i));
    return num_shards <= 1 ? 0 : (uint32_t)(XXH3_64bits(le, 8) % num_shards);
}

static uint32_t now_or(int64_t now_s) {
    if (now_s > 0 && now_s < (int64_t)UINT32_MAX) return (uint32_t)now_s;
    return (uint32_t)time(NULL);
}

/* A random incarnation, never 0 and never @p old. */
static uint64_t new_incarnation(uint64_t old) {
    uint64_t v = 0;
    for (int i = 0; i < 4 && (v == 0 || v == old); i++) {
        if (getrandom(&v, sizeof(v), 0) != sizeof(v)) v = 0;
        if (v == 0 || v == old) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            v = XXH3_64bits_withSeed(&ts, sizeof(ts), old + (uint64_t)i);
        }
    }
    return v ? v : 1;
}

/* ============================== lifecycle ============================== */

mt_err_t mt_ps_create(const mt_ps_config_t *cfg, mt_table_t *table, mt_ps_t **out) {
    if (!cfg || cfg->num_shards < 1 || cfg->shard >= cfg->num_shards || cfg->max_batch_fids < 1 ||
        cfg->sync_chunk_fids < 1 || cfg->max_message_bytes < 1024 ||
        (cfg->dense.opt != MT_OPT_SGD && cfg->dense.opt != MT_OPT_ADAGRAD &&
         cfg->dense.opt != MT_OPT_ADAM) ||
        !(cfg->dense.lr > 0.0f))
        return MT_CONFIG;
    mt_ps_t *ps = calloc(1, sizeof(*ps));
    if (!ps) return MT_NOMEM;
    ps->cfg = *cfg;
    ps->cfg.table.slots = NULL; /* borrowed: copied below */
    pthread_mutex_init(&ps->dense_lock, NULL);
    pthread_mutex_init(&ps->snap_lock, NULL);
    mt_err_t err = MT_NOMEM;
    if (cfg->admin_token && *cfg->admin_token && !(ps->admin_token = strdup(cfg->admin_token))) {
        mt_ps_destroy(ps);
        return MT_NOMEM;
    }
    ps->cfg.admin_token = ps->admin_token;
    if (cfg->table.nslots && cfg->table.slots) {
        ps->slots = malloc(cfg->table.nslots * sizeof(*ps->slots));
        if (!ps->slots) {
            mt_ps_destroy(ps);
            return MT_NOMEM;
        }
        memcpy(ps->slots, cfg->table.slots, cfg->table.nslots * sizeof(*ps->slots));
        ps->cfg.table.slots = ps->slots;
    }
    if ((err = mt__ps_ckpt_create(&ps->ck)) != MT_OK) {
        mt_ps_destroy(ps);
        return err;
    }
    ps->incarnation = new_incarnation(0);
    err = MT_OK;
    if (table) {
        ps->table = table;
    } else {
        err = mt_table_create(&cfg->table, &ps->table);
    }
    if (err) {
        mt_ps_destroy(ps);
        return err;
    }
    for (uint32_t slot = 0; slot < 65536; slot++) {
        uint32_t dim;
        if (mt_table_dim(ps->table, MT_FID_MAKE(slot, 0), &dim) == MT_OK && dim > ps->max_dim)
            ps->max_dim = dim;
    }
    *out = ps;
    return MT_OK;
}

static void dense_free(dense_tensor_t *d, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(d[i].name);
        free(d[i].shape);
        free(d[i].w);
        free(d[i].s1);
        free(d[i].s2);
    }
    free(d);
}

void mt_ps_destroy(mt_ps_t *ps) {
    if (!ps) return;
    mt_table_destroy(ps->table);
    dense_free(ps->dense, ps->ndense);
    mt__ps_ckpt_destroy(ps->ck);
    pthread_mutex_destroy(&ps->dense_lock);
    pthread_mutex_destroy(&ps->snap_lock);
    free(ps->admin_token);
    free(ps->slots);
    free(ps);
}

mt_table_t *mt_ps_table(mt_ps_t *ps) {
    return ps->table;
}

void mt_ps_set_restoring(mt_ps_t *ps, int restoring) {
    atomic_store_explicit(&ps->restoring, restoring ? 1 : 0, memory_order_release);
}

mt_err_t mt_ps_replace_table(mt_ps_t *ps, mt_table_t *table) {
    if (!atomic_load(&ps->restoring) || !table) return MT_INVALID;
    mt_table_destroy(ps->table);
    ps->table = table;
    return MT_OK;
}
void mt_ps_stop_streams(mt_ps_t *ps) {
    atomic_store(&ps->stop_streams, 1);
}

uint64_t mt_ps_incarnation(const mt_ps_t *ps) {
    return ps->incarnation;
}

uint64_t mt_ps_expire_tick(mt_ps_t *ps, uint32_t now_s, size_t max_buckets) {
    uint64_t evicted = 0;
    if (mt__ps_enter(ps) != 0) return 0; /* restoring: the next tick */
    mt_table_expire(ps->table, now_s, max_buckets, &evicted);
    mt__ps_leave(ps);
    return evicted;
}

uint64_t mt_ps_examples_applied(mt_ps_t *ps) {
    return atomic_load(&ps->examples_applied);
}

void mt_ps_counters(mt_ps_t *ps, mt_ps_counters_t *out) {
    memset(out, 0, sizeof(*out));
    for (int i = 0; i < MT_PS_NMETHODS; i++) {
        out->calls[i] = atomic_load(&ps->calls[i]);
        out->errors[i] = atomic_load(&ps->errors[i]);
    }
    out->lookup_fids = atomic_load(&ps->lookup_fids);
    out->apply_fids = atomic_load(&ps->apply_fids);
    out->sync_entries = atomic_load(&ps->sync_entries);
    out->examples_applied = atomic_load(&ps->examples_applied);
}

/* ============================== helpers ============================== */

#define FAIL(ps, m, c, code, ...)              \
    do {                                       \
        atomic_fetch_add(&(ps)->errors[m], 1); \
        mt_rpc_fail(c, code, __VA_ARGS__);     \
    } while (0)

/* Checks ids: configured slot and owned by this shard. @param[out] nfloats  the sum of their
 * dims; @param[out] widest  the largest (may be NULL). @returns 0 or fails the call. */
static int check_fids(mt_ps_t *ps, int m, mt_rpc_call_t *c, const uint64_t *fids, size_t n,
                      size_t *nfloats, uint32_t *widest) {
    if (n > ps->cfg.max_batch_fids) {
        FAIL(ps, m, c, MT_RPC_RESOURCE_EXHAUSTED, "%zu fids in one request, the limit is %u", n,
             ps->cfg.max_batch_fids);
        return -1;
    }
    size_t sum = 0;
    uint32_t wide = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t dim;
        if (mt_table_dim(ps->table, fids[i], &dim) != MT_OK) {
            FAIL(ps, m, c, MT_RPC_INVALID_ARGUMENT,
                 "fid %zu (0x%016llx): slot %u is not configured", i, (unsigned long long)fids[i],
                 MT_FID_SLOT(fids[i]));
            return -1;
        }
        if (ps->cfg.num_shards > 1) {
            uint32_t owner = mt_ps_shard_of(fids[i], ps->cfg.num_shards);
            if (owner != ps->cfg.shard) {
                FAIL(ps, m, c, MT_RPC_INVALID_ARGUMENT,
                     "fid %zu (0x%016llx) belongs to shard %u, this is shard %u of %u", i,
                     (unsigned long long)fids[i], owner, ps->cfg.shard, ps->cfg.num_shards);
                return -1;
            }
        }
        sum += dim;
        if (dim > wide) wide = dim;
    }
    *nfloats = sum;
    if (widest) *widest = wide;
    return 0;
}

/* Bytes of a protobuf length-delimited field (tag of a field below 16, length, payload). */
static size_t pb_field_bytes(size_t payload) {
    size_t n = 2; /* tag, and the length's first byte */
    for (size_t v = payload; v >= 0x80; v >>= 7)
        n++;
    return n + payload;
}

/* The exact size of a LookupResponse for @p n ids of @p nfloats floats in all: values
 * (packed floats) and found (one byte an id); empty fields are not sent. */
static size_t lookup_bytes(size_t n, size_t nfloats) {
    return (nfloats ? pb_field_bytes(4 * nfloats) : 0) + (n ? pb_field_bytes(n) : 0);
}

/* The most ids of dim @p dim whose Lookup answer fits in @p limit bytes. */
static size_t lookup_fit(uint32_t dim, size_t limit) {
    size_t k = limit / (4 * (size_t)dim + 1);
    while (k > 0 && lookup_bytes(k, k * dim) > limit)
        k--;
    while (lookup_bytes(k + 1, (k + 1) * dim) <= limit)
        k++;
    return k;
}

/* Coordinator fencing (docs/checkpoint.md): a request carrying a coordinator epoch below the
 * highest this shard has seen comes from a trainer another one took over from: refused with
 * ABORTED, changing nothing. Only a Restore claims an epoch (mt_ps_restore_claim, under the
 * snapshot lock, after the admin token); the other writes only compare. 0: not a coordinated
 * trainer's request, always let through. @returns 1 to go on, 0 when the call was failed. */
static int fence_ok(mt_ps_t *ps, int m, mt_rpc_call_t *c, uint64_t epoch) {
    char why[160];
    if (!mt__ps_fenced(ps, epoch, why, sizeof(why))) return 1;
    FAIL(ps, m, c, MT_RPC_ABORTED, "%s", why);
    return 0;
}

static const char *method_names[MT_PS_NMETHODS] = {"Lookup",    "ApplyGradients", "PullDense",
                                                   "PushDense", "Sync",           "Snapshot",
                                                   "Stats",     "Restore",        "Checkpoints"};

/* Packs msg and replies; an answer over the message limit is refused (gRPC would fail it
 * uncounted after the work), with @p hint saying how to ask for less (may be NULL). */
static void reply_msg_hint(mt_ps_t *ps, int m, mt_rpc_call_t *c, const ProtobufCMessage *msg,
                           const char *hint) {
    size_t len = protobuf_c_message_get_packed_size(msg);
    if (len > ps->cfg.max_message_bytes) {
        FAIL(ps, m, c, MT_RPC_RESOURCE_EXHAUSTED,
             "the %s answer would be %zu bytes, over the %u-byte message limit "
             "(ps.max_message_bytes)%s%s",
             method_names[m], len, ps->cfg.max_message_bytes, hint ? ": " : "", hint ? hint : "");
        return;
    }
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        FAIL(ps, m, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory packing the reply");
        return;
    }
    protobuf_c_message_pack(msg, buf);
    mt_rpc_reply(c, buf, len);
    free(buf);
}

static void reply_msg(mt_ps_t *ps, int m, mt_rpc_call_t *c, const ProtobufCMessage *msg) {
    reply_msg_hint(ps, m, c, msg, NULL);
}

/* 1 if @p got equals @p want, in a time that depends on the lengths only, never on where a
 * guess first differs (a remote caller could otherwise find the token byte by byte). */
static int token_eq(const char *got, const char *want) {
    size_t n = strlen(want), glen = strlen(got);
    volatile unsigned char diff = glen != n;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)want[i] ^ (unsigned char)(i < glen ? got[i] : 0);
    return diff == 0;
}

/* The admin check of every admin method (Snapshot, Restore, ...): with ps.admin_token set,
 * the request's token must equal it, else PERMISSION_DENIED. @returns 1 to go on, 0 when
 * the call was failed. */
static int admin_ok(mt_ps_t *ps, int m, mt_rpc_call_t *c, const char *token) {
    if (!ps->admin_token) return 1;
    if (token && token_eq(token, ps->admin_token)) return 1;
    FAIL(ps, m, c, MT_RPC_PERMISSION_DENIED, "admin call: missing or wrong token");
    return 0;
}

/* ============================== sparse methods ============================== */

static void h_lookup(mt_ps_t *ps, mt_rpc_call_t *c, const void *req) {
    const Monolith__V1__LookupRequest *r = req;
    size_t nfloats = 0;
    float *values = NULL;
    uint8_t *found = NULL;
    uint32_t widest = 0;
    if (r->train && !fence_ok(ps, MT_PS_LOOKUP, c, r->epoch)) goto out;
    if (check_fids(ps, MT_PS_LOOKUP, c, r->fids, r->n_fids, &nfloats, &widest) != 0) goto out;
    size_t bytes = lookup_bytes(r->n_fids, nfloats), limit = ps->cfg.max_message_bytes;
    if (bytes > limit) { /* it could not be sent: refuse before reading or admitting a row */
        FAIL(ps, MT_PS_LOOKUP, c, MT_RPC_RESOURCE_EXHAUSTED,
             "the answer to %zu ids (%zu floats) would be %zu bytes, over the %zu-byte message "
             "limit (ps.max_message_bytes): at most %zu ids of dim %u fit in one Lookup; "
             "split the request",
             r->n_fids, nfloats, bytes, limit, lookup_fit(widest, limit), widest);
        goto out;
    }
    values = malloc((nfloats ? nfloats : 1) * sizeof(float));
    found = malloc(r->n_fids ? r->n_fids : 1);
    if (!values || !found) {
        FAIL(ps, MT_PS_LOOKUP, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    mt_err_t err = mt_table_lookup(ps->table, r->fids, r->n_fids, values, nfloats, found,
                                   r->train ? MT_TABLE_TRAIN : 0, now_or(r->now_s), NULL);
    if (err) {
        FAIL(ps, MT_PS_LOOKUP, c, err == MT_NOMEM ? MT_RPC_RESOURCE_EXHAUSTED : MT_RPC_INTERNAL,
             "lookup: %s", mt_strerror(err));
        goto out;
    }
    atomic_fetch_add(&ps->lookup_fids, r->n_fids);
    Monolith__V1__LookupResponse resp = MONOLITH__V1__LOOKUP_RESPONSE__INIT;
    resp.n_values = nfloats;
    resp.values = values;
    resp.found.len = r->n_fids;
    resp.found.data = found;
    reply_msg(ps, MT_PS_LOOKUP, c, &resp.base);
out:
    free(values);
    free(found);
}

static void h_apply(mt_ps_t *ps, mt_rpc_call_t *c, const void *req) {
    const Monolith__V1__ApplyGradientsRequest *r = req;
    size_t nfloats = 0;
    if (!fence_ok(ps, MT_PS_APPLY, c, r->epoch)) return;
    if (check_fids(ps, MT_PS_APPLY, c, r->fids, r->n_fids, &nfloats, NULL) != 0) return;
    if (r->n_grads != nfloats) {
        FAIL(ps, MT_PS_APPLY, c, MT_RPC_INVALID_ARGUMENT,
             "grads has %zu floats, the %zu fids need %zu", r->n_grads, r->n_fids, nfloats);
        return;
    }
    for (size_t i = 0; i < r->n_grads; i++) {
        if (!isfinite(r->grads[i])) {
            FAIL(ps, MT_PS_APPLY, c, MT_RPC_INVALID_ARGUMENT, "grads[%zu] is not finite", i);
            return;
        }
    }
    mt_table_op_stats_t st = {0};
    mt_err_t err =
        mt_table_apply(ps->table, r->fids, r->n_fids, r->grads, r->n_grads, now_or(r->now_s), &st);
    if (err) {
        FAIL(ps, MT_PS_APPLY, c, MT_RPC_INTERNAL, "apply: %s", mt_strerror(err));
        return;
    }
    atomic_fetch_add(&ps->apply_fids, r->n_fids);
    if (r->examples) atomic_fetch_add(&ps->examples_applied, r->examples);
    mt__atomic_max(&ps->step, r->step);
    Monolith__V1__ApplyGradientsResponse resp = MONOLITH__V1__APPLY_GRADIENTS_RESPONSE__INIT;
    resp.applied = st.found;
    resp.missing = st.missing;
    reply_msg(ps, MT_PS_APPLY, c, &resp.base);
}

/* Buffers of one Sync stream. */
typedef struct sync_bufs {
    size_t chunk;
    mt_table_change_t *ents;
    float *vals;
    uint64_t *fids;
    uint8_t *del;
    uint8_t *buf;
    size_t cap;
} sync_bufs_t;

/* Packs and sends one SyncChunk. @returns 0, or -1 (out of memory or the client went away:
 * the call was failed). */
static int sync_send(mt_ps_t *ps, mt_rpc_call_t *c, sync_bufs_t *b, Monolith__V1__SyncChunk *m) {
    size_t plen = monolith__v1__sync_chunk__get_packed_size(m);
    if (plen > b->cap) {
        uint8_t *nb = realloc(b->buf, plen);
        if (!nb) {
            FAIL(ps, MT_PS_SYNC, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
            return -1;
        }
        b->buf = nb;
        b->cap = plen;
    }
    monolith__v1__sync_chunk__pack(m, b->buf);
    if (mt_rpc_send(c, b->buf, plen) != MT_OK) {
        FAIL(ps, MT_PS_SYNC, c, MT_RPC_CANCELLED, "client went away");
        return -1;
    }
    return 0;
}

/*
 * One round: every change after *since, in chunks; the round's last chunk (possibly
 * without entries) has caught_up set, and last set when @p last. On success *since is the
 * round's upto_version. @p full_ok: a full stream is allowed (the stream's first round);
 * otherwise a round that would be full fails the call (the replica must start over).
 * @returns 0, or -1 when the call was failed.
 */
static int sync_round(mt_ps_t *ps, mt_rpc_call_t *c, sync_bufs_t *b, uint64_t *since, int full_ok,
                      int last) {
    mt_table_changes_t *it = NULL;
    uint64_t upto = 0;
    int full = 0, rc = -1, first = 1;
    mt_err_t err = mt_table_changes_begin(ps->table, *since, &it, &upto, &full);
    if (err) {
        FAIL(ps, MT_PS_SYNC, c, MT_RPC_RESOURCE_EXHAUSTED, "sync: %s", mt_strerror(err));
        goto out;
    }
    if (full && !full_ok) {
        FAIL(ps, MT_PS_SYNC, c, MT_RPC_FAILED_PRECONDITION,
             "full sync needed: the change log moved past this stream; retry from 0");
        goto out;
    }
    for (;;) {
        size_t n = 0;
        err = mt_table_changes_next(it, b->ents, b->chunk, b->vals, b->chunk * ps->max_dim, &n);
        if (err == MT_FULL_SYNC) {
            FAIL(ps, MT_PS_SYNC, c, MT_RPC_FAILED_PRECONDITION,
                 "full sync needed: the change log moved past this stream; retry from 0");
            goto out;
        }
        if (err) {
            FAIL(ps, MT_PS_SYNC, c, MT_RPC_INTERNAL, "sync: %s", mt_strerror(err));
            goto out;
        }
        size_t nv = 0;
        for (size_t i = 0; i < n; i++) {
            b->fids[i] = b->ents[i].fid;
            b->del[i] = b->ents[i].deleted;
            nv += b->ents[i].dim;
        }
        Monolith__V1__SyncChunk m = MONOLITH__V1__SYNC_CHUNK__INIT;
        m.full = first && full;
        m.incarnation = ps->incarnation;
        m.upto_version = upto;
        m.n_fids = n;
        m.fids = b->fids;
        m.n_values = nv;
        m.values = b->vals;
        m.deleted.len = n;
        m.deleted.data = b->del;
        m.caught_up = n == 0;
        m.last = n == 0 && last;
        if (sync_send(ps, c, b, &m) != 0) goto out;
        atomic_fetch_add(&ps->sync_entries, n);
        first = 0;
        if (n == 0) break;
    }
    *since = upto;
    rc = 0;
out:
    mt_table_changes_end(it);
    return rc;
}

/* 1 when follow streams should end: the shard stops, or a restore waits for the calls in
 * flight to finish (a follower is one of them: it must not hold the restore up). */
static int follow_over(mt_ps_t *ps) {
    return atomic_load(&ps->stop_streams) || atomic_load(&ps->restoring);
}

/* Sleeps @p ms in steps short enough to notice follow_over(). */
static void follow_sleep(mt_ps_t *ps, uint32_t ms) {
    while (ms && !follow_over(ps)) {
        uint32_t step = ms < 20 ? ms : 20;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)step * 1000000L};
        nanosleep(&ts, NULL);
        ms -= step;
    }
}

/* The most entries a SyncChunk can carry within the message limit: each at most an id (8),
 * its deleted byte and max_dim floats; the fixed fields (full, incarnation, upto_version,
 * last, caught_up, the three length prefixes) take under SYNC_FIXED_BYTES. */
#define SYNC_FIXED_BYTES 64
static size_t sync_chunk_fit(const mt_ps_t *ps) {
    size_t per = 8 + 1 + 4 * (size_t)ps->max_dim, limit = ps->cfg.max_message_bytes;
    return limit > SYNC_FIXED_BYTES ? (limit - SYNC_FIXED_BYTES) / per : 0;
}

/*
 * Sync: a server stream of SyncChunk. Without follow_ms one round (the catch-up) whose
 * last chunk has last = 1. With follow_ms the catch-up, then a round every follow_ms until
 * the stream should end (see ps.proto), the last one with last = 1.
 */
static void h_sync(mt_ps_t *ps, mt_rpc_call_t *c, const void *req) {
    const Monolith__V1__SyncRequest *r = req;
    uint64_t since = r->since_version;
    if (r->incarnation != ps->incarnation) since = 0; /* another life of this shard */
    size_t chunk = r->max_chunk_fids ? r->max_chunk_fids : ps->cfg.sync_chunk_fids;
    if (chunk > 65536) chunk = 65536;
    size_t fit = sync_chunk_fit(ps);
    if (fit == 0) {
        FAIL(ps, MT_PS_SYNC, c, MT_RPC_RESOURCE_EXHAUSTED,
             "a SyncChunk of one row of dim %u does not fit the %u-byte message limit "
             "(ps.max_message_bytes)",
             ps->max_dim, ps->cfg.max_message_bytes);
        return;
    }
    if (chunk > fit) chunk = fit; /* a hint: cut to what one message can carry */
    uint32_t follow_ms = r->follow_ms;
    if (follow_ms > 60000) {
        FAIL(ps, MT_PS_SYNC, c, MT_RPC_INVALID_ARGUMENT, "follow_ms %u is over 60000", follow_ms);
        return;
    }
    if (follow_ms && follow_ms < 5) follow_ms = 5;

    sync_bufs_t b = {.chunk = chunk};
    b.ents = malloc(chunk * sizeof(*b.ents));
    b.vals = malloc(chunk * ps->max_dim * sizeof(float));
    b.fids = malloc(chunk * sizeof(uint64_t));
    b.del = malloc(chunk);
    int following = 0;
    if (!b.ents || !b.vals || !b.fids || !b.del) {
        FAIL(ps, MT_PS_SYNC, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    /* Follow only within the bound on followers: each holds a worker thread. */
    if (follow_ms) {
        uint32_t n = atomic_fetch_add(&ps->followers, 1) + 1;
        following = 1;
        if (n > ps->cfg.sync_max_followers || follow_over(ps)) follow_ms = 0;
    }
    double t0 = mt_mono_s();
    if (sync_round(ps, c, &b, &since, 1, follow_ms == 0) != 0) goto out;
    while (follow_ms) {
        follow_sleep(ps, follow_ms);
        /* End before the deadline (two rounds of margin) or the stream's age limit. */
        int64_t left = mt_rpc_call_remaining_ms(c);
        int end = follow_over(ps) || left < 2 * (int64_t)follow_ms + 1000 ||
                  mt_mono_s() - t0 >= ps->cfg.sync_follow_max_s;
        if (sync_round(ps, c, &b, &since, 0, end) != 0) goto out;
        if (end) break;
    }
    mt_rpc_reply(c, NULL, 0);
out:
    if (following) atomic_fetch_sub(&ps->followers, 1);
    free(b.ents);
    free(b.vals);
    free(b.fids);
    free(b.del);
    free(b.buf);
}

static const char *opt_name(mt_table_opt_t o) {
    switch (o) {
    case MT_OPT_SGD: return "sgd";
    case MT_OPT_ADAGRAD: return "adagrad";
    case MT_OPT_FTRL: return "ftrl";
    case MT_OPT_ADAM: return "adam";
    }
    return "?";
}

static void h_stats(mt_ps_t *ps, mt_rpc_call_t *c, const void *req) {
    (void)req; /* no fields */
    mt_table_stats_t st;
    mt_table_stats(ps->table, &st);
    Monolith__V1__StatsResponse resp = MONOLITH__V1__STATS_RESPONSE__INIT;
    resp.shard = ps->cfg.shard;
    resp.num_shards = ps->cfg.num_shards;
    resp.incarnation = ps->incarnation;
    resp.examples_applied = atomic_load(&ps->examples_applied);
    resp.epoch = atomic_load(&ps->epoch);
    resp.last_checkpoint_id = mt__ps_ckpt_last_id(ps);
    resp.rows = st.rows;
    resp.capacity = st.capacity;
    resp.load_factor = st.load_factor;
    resp.bytes_total = st.bytes_total;
    resp.version = st.version;
    resp.evictions = st.evictions;
    resp.filtered = st.filtered;
    pthread_mutex_lock(&ps->dense_lock);
    resp.dense_version = ps->dense_version;
    pthread_mutex_unlock(&ps->dense_lock);
    /* Slots: walk the 65536 slot ids the table knows. */
    size_t ns = 0;
    Monolith__V1__SlotInfo *infos = calloc(65536, sizeof(*infos));
    Monolith__V1__SlotInfo **ptrs = calloc(65536, sizeof(*ptrs));
    if (!infos || !ptrs) {
        free(infos);
        free(ptrs);
        FAIL(ps, MT_PS_STATS, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    for (uint32_t slot = 0; slot < 65536; slot++) {
        uint64_t fid = MT_FID_MAKE(slot, 0);
        uint32_t dim;
        if (mt_table_dim(ps->table, fid, &dim) != MT_OK) continue;
        const mt_table_slot_config_t *sc = mt_table_slot_config(ps->table, fid);
        Monolith__V1__SlotInfo *si = &infos[ns];
        monolith__v1__slot_info__init(si);
        si->slot = slot;
        si->dim = dim;
        si->optimizer = (char *)opt_name(sc->opt);
        si->min_count = sc->min_count;
        si->ttl_s = sc->ttl_s;
        si->fp16 = sc->precision == MT_PREC_FP16;
        ptrs[ns] = si;
        ns++;
    }
    resp.n_slots = ns;
    resp.slots = ptrs;
    reply_msg(ps, MT_PS_STATS, c, &resp.base);
    free(infos);
    free(ptrs);
}

/* ============================== checkpoints ==============================
 * The store work is ckpt.c's (mt_ps_snapshot, mt_ps_restore, mt__ps_ckpt_list); these
 * handlers translate requests and errors. */

/* The status a checkpoint error is answered with. */
static int ckpt_status(mt_err_t err) {
    switch (err) {
    case MT_INVALID:
    case MT_MISMATCH: return MT_RPC_FAILED_PRECONDITION;
    case MT_NOT_FOUND: return MT_RPC_NOT_FOUND;
    case MT_UNAVAILABLE: return MT_RPC_UNAVAILABLE;
    case MT_NOMEM: return MT_RPC_RESOURCE_EXHAUSTED;
    case MT_FENCED: return MT_RPC_ABORTED;
    default: return MT_RPC_INTERNAL;
    }
}

/* The meta of the checkpoint @p res tells of, as this shard answers it (without offsets). */
static Monolith__V1__CheckpointMeta ckpt_meta(const mt_ps_t *ps, const mt_ps_ckpt_result_t *res) {
    Monolith__V1__CheckpointMeta meta = MONOLITH__V1__CHECKPOINT_META__INIT;
    meta.checkpoint_id = res->checkpoint_id;
    meta.shard = ps->cfg.shard;
    meta.num_shards = ps->cfg.num_shards;
    meta.consistent = res->consistent;
    meta.examples_applied = res->examples_applied;
    return meta;
}

static int store_ok(mt_ps_t *ps, int m, mt_rpc_call_t *c) {
    if (mt__ps_ckpt_has_store(ps)) return 1;
    FAIL(ps, m, c, MT_RPC_FAILED_PRECONDITION,
         "checkpoints are off (no ps.snapshot_dir configured)");
    return 0;
}

static void h_snapshot(mt_ps_t *ps, mt_rpc_call_t *c, const void *req) {
    const Monolith__V1__SnapshotRequest *r = req;
    mt_ps_offset_t *offs = NULL;
    if (!admin_ok(ps, MT_PS_SNAPSHOT, c, r->token) || !store_ok(ps, MT_PS_SNAPSHOT, c) ||
        !fence_ok(ps, MT_PS_SNAPSHOT, c, r->epoch))
        goto out;
    if (r->consistent && r->checkpoint_id == 0) {
        FAIL(ps, MT_PS_SNAPSHOT, c, MT_RPC_INVALID_ARGUMENT,
             "a consistent snapshot needs its checkpoint_id");
        goto out;
    }
    offs = calloc(r->n_offsets ? r->n_offsets : 1, sizeof(*offs));
    if (!offs) {
        FAIL(ps, MT_PS_SNAPSHOT, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < r->n_offsets; i++) {
        offs[i] =
            (mt_ps_offset_t){r->offsets[i]->topic, r->offsets[i]->partition, r->offsets[i]->offset};
    }
    mt_ps_snapshot_req_t sr = {.checkpoint_id = r->checkpoint_id,
                               .consistent = r->consistent,
                               .expect_incarnation = r->expect_incarnation,
                               .offsets = offs,
                               .noffsets = r->n_offsets};
    mt_ps_ckpt_result_t res;
    char why[512] = "";
    mt_err_t err = mt_ps_snapshot(ps, &sr, &res, why, sizeof(why));
    if (err) {
        FAIL(ps, MT_PS_SNAPSHOT, c, ckpt_status(err), "snapshot: %s", why);
        goto out;
    }
    Monolith__V1__CheckpointMeta meta = ckpt_meta(ps, &res);
    meta.n_offsets = r->n_offsets;
    meta.offsets = r->offsets;
    Monolith__V1__SnapshotResponse resp = MONOLITH__V1__SNAPSHOT_RESPONSE__INIT;
    resp.meta = &meta;
    resp.rows = res.rows;
    resp.bytes = res.bytes;
    resp.seconds = res.seconds;
    reply_msg(ps, MT_PS_SNAPSHOT, c, &resp.base);
out:
    free(offs);
}

static void h_restore(mt_ps_t *ps, mt_rpc_call_t *c, const void *req) {
    const Monolith__V1__RestoreRequest *r = req;
    if (!admin_ok(ps, MT_PS_RESTORE, c, r->token) || !store_ok(ps, MT_PS_RESTORE, c)) return;
    if (r->checkpoint_id == MT_PS_NEWEST) {
        FAIL(ps, MT_PS_RESTORE, c, MT_RPC_INVALID_ARGUMENT, "checkpoint_id %llu",
             (unsigned long long)r->checkpoint_id);
        return;
    }
    mt_ps_ckpt_result_t res;
    char why[512] = "";
    mt_err_t err = mt_ps_restore_claim(ps, r->checkpoint_id, r->epoch, &res, why, sizeof(why));
    if (err) {
        FAIL(ps, MT_PS_RESTORE, c, ckpt_status(err), "restore: %s", why);
        return;
    }
    Monolith__V1__CheckpointMeta meta = ckpt_meta(ps, &res);
    Monolith__V1__RestoreResponse resp = MONOLITH__V1__RESTORE_RESPONSE__INIT;
    resp.meta = &meta;
    resp.incarnation = res.incarnation;
    resp.rows = res.rows;
    resp.seconds = res.seconds;
    resp.dropped = res.dropped;
    reply_msg(ps, MT_PS_RESTORE, c, &resp.base);
}

static void h_checkpoints(mt_ps_t *ps, mt_rpc_call_t *c, const void *req) {
    (void)req; /* no fields */
    if (!store_ok(ps, MT_PS_CHECKPOINTS, c)) return;
    Monolith__V1__CheckpointMeta **metas = NULL;
    size_t n = 0;
    uint64_t incarnation = 0, examples = 0;
    char why[512] = "";
    mt_err_t err = mt__ps_ckpt_list(ps, &metas, &n, &incarnation, &examples, why, sizeof(why));
    if (err) {
        FAIL(ps, MT_PS_CHECKPOINTS, c, ckpt_status(err), "checkpoints: %s", why);
        return;
    }
    Monolith__V1__CheckpointsResponse resp = MONOLITH__V1__CHECKPOINTS_RESPONSE__INIT;
    resp.n_checkpoints = n;
    resp.checkpoints = metas;
    resp.incarnation = incarnation;
    resp.examples_applied = examples;
    resp.epoch = atomic_load(&ps->epoch);
    reply_msg(ps, MT_PS_CHECKPOINTS, c, &resp.base);
    mt__ps_ckpt_list_free(metas, n);
}

/* ============================== dense ============================== */

static dense_tensor_t *dense_find(mt_ps_t *ps, const char *name) {
    for (size_t i = 0; i < ps->ndense; i++)
        if (!strcmp(ps->dense[i].name, name)) return &ps->dense[i];
    return NULL;
}

static size_t shape_size(const uint32_t *shape, size_t n, int *ok) {
    size_t sz = 1;
    *ok = n > 0 && n <= 8;
    for (size_t i = 0; i < n && *ok; i++) {
        if (shape[i] == 0 || sz > (SIZE_MAX / 8) / shape[i])
            *ok = 0;
        else
            sz *= shape[i];
    }
    if (sz > (256u << 20)) *ok = 0; /* 1 GiB of floats per tensor at most */
    return sz;
}

/* Adds a tensor from an init message (lock held). */
static int dense_add(mt_ps_t *ps, const Monolith__V1__DenseTensor *t, char *why, size_t wlen) {
    int ok;
    size_t n = shape_size(t->shape, t->n_shape, &ok);
    if (!ok || n != t->n_values) {
        snprintf(why, wlen, "init tensor '%s': shape does not match its %zu values", t->name,
                 t->n_values);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(t->values[i])) {
            snprintf(why, wlen, "init tensor '%s': value %zu is not finite", t->name, i);
            return -1;
        }
    }
    dense_tensor_t *nd = realloc(ps->dense, (ps->ndense + 1) * sizeof(*nd));
    if (!nd) return -2;
    ps->dense = nd;
    dense_tensor_t *d = &nd[ps->ndense];
    memset(d, 0, sizeof(*d));
    d->name = strdup(t->name);
    d->shape = malloc(t->n_shape * sizeof(uint32_t));
    d->w = malloc(n * sizeof(float));
    d->s1 = calloc(n, sizeof(float));
    d->s2 = calloc(n, sizeof(float));
    if (!d->name || !d->shape || !d->w || !d->s1 || !d->s2) {
        free(d->name);
        free(d->shape);
        free(d->w);
        free(d->s1);
        free(d->s2);
        return -2;
    }
    memcpy(d->shape, t->shape, t->n_shape * sizeof(uint32_t));
    d->nshape = t->n_shape;
    d->n = n;
    memcpy(d->w, t->values, n * sizeof(float));
    if (ps->cfg.dense.opt == MT_OPT_ADAGRAD)
        for (size_t i = 0; i < n; i++)
            d->s1[i] = ps->cfg.dense.init_accum;
    ps->ndense++;
    return 0;
}

static void dense_apply(const mt_ps_dense_config_t *o, dense_tensor_t *d, const float *g) {
    switch (o->opt) {
    case MT_OPT_SGD:
        for (size_t i = 0; i < d->n; i++)
            d->w[i] -= o->lr * g[i];
        break;
    case MT_OPT_ADAGRAD:
        for (size_t i = 0; i < d->n; i++) {
            d->s1[i] += g[i] * g[i];
            d->w[i] -= o->lr * g[i] / (sqrtf(d->s1[i]) + o->eps);
        }
        break;
    default: { /* Adam */
        d->steps++;
        double c1 = 1.0 - pow(o->beta1, (double)d->steps);
        double c2 = 1.0 - pow(o->beta2, (double)d->steps);
        float lr_t = (float)(o->lr * sqrt(c2) / c1);
        for (size_t i = 0; i < d->n; i++) {
            d->s1[i] = o->beta1 * d->s1[i] + (1.0f - o->beta1) * g[i];
            d->s2[i] = o->beta2 * d->s2[i] + (1.0f - o->beta2) * g[i] * g[i];
            d->w[i] -= lr_t * d->s1[i] / (sqrtf(d->s2[i]) + o->eps);
        }
        break;
    }
    }
}

static void h_push_dense(mt_ps_t *ps, mt_rpc_call_t *c, const void *req) {
    const Monolith__V1__PushDenseRequest *r = req;
    char why[256] = "";
    int code = MT_RPC_OK;
    if (!fence_ok(ps, MT_PS_PUSH_DENSE, c, r->epoch)) return;
    pthread_mutex_lock(&ps->dense_lock);
    /* Check everything first: a bad request changes nothing. */
    for (size_t i = 0; i < r->n_grads && code == MT_RPC_OK; i++) {
        const Monolith__V1__DenseTensor *g = r->grads[i];
        dense_tensor_t *d = dense_find(ps, g->name);
        /* the first init of that name: the one the tensor is created from below (checking a
         * later one let a gradient of another size through: found by fuzz_ps_push_dense) */
        const Monolith__V1__DenseTensor *init = NULL;
        for (size_t k = 0; k < r->n_init && !d && !init; k++)
            if (!strcmp(r->init[k]->name, g->name)) init = r->init[k];
        size_t n = d ? d->n : init ? init->n_values : 0;
        if (!d && !init) {
            code = MT_RPC_INVALID_ARGUMENT;
            snprintf(why, sizeof(why), "tensor '%s' is unknown and no init was sent", g->name);
        } else if (g->n_values != n) {
            code = MT_RPC_INVALID_ARGUMENT;
            snprintf(why, sizeof(why), "gradient of '%s' has %zu values, the tensor %zu", g->name,
                     g->n_values, n);
        } else {
            for (size_t k = 0; k < g->n_values; k++) {
                if (!isfinite(g->values[k])) {
                    code = MT_RPC_INVALID_ARGUMENT;
                    snprintf(why, sizeof(why), "gradient of '%s': value %zu is not finite", g->name,
                             k);
                    break;
                }
            }
        }
    }
    /* Create the missing tensors, then apply the gradients of the others: a tensor this
     * request creates starts at its init values (its gradient here is not a step). */
    uint8_t *created = calloc(r->n_grads ? r->n_grads : 1, 1);
    if (!created && code == MT_RPC_OK) {
        code = MT_RPC_RESOURCE_EXHAUSTED;
        snprintf(why, sizeof(why), "out of memory");
    }
    for (size_t i = 0; i < r->n_grads && code == MT_RPC_OK; i++) {
        if (dense_find(ps, r->grads[i]->name)) continue;
        created[i] = 1;
        for (size_t k = 0; k < r->n_init; k++) {
            if (strcmp(r->init[k]->name, r->grads[i]->name)) continue;
            int rc = dense_add(ps, r->init[k], why, sizeof(why));
            if (rc == -1) code = MT_RPC_INVALID_ARGUMENT;
            if (rc == -2) {
                code = MT_RPC_RESOURCE_EXHAUSTED;
                snprintf(why, sizeof(why), "out of memory");
            }
            break;
        }
    }
    for (size_t i = 0; i < r->n_grads && code == MT_RPC_OK; i++)
        if (!created[i])
            dense_apply(&ps->cfg.dense, dense_find(ps, r->grads[i]->name), r->grads[i]->values);
    free(created);
    if (code == MT_RPC_OK && r->n_grads) ps->dense_version++;
    uint64_t version = ps->dense_version;
    pthread_mutex_unlock(&ps->dense_lock);
    if (code != MT_RPC_OK) {
        FAIL(ps, MT_PS_PUSH_DENSE, c, code, "%s", why);
    } else {
        Monolith__V1__PushDenseResponse resp = MONOLITH__V1__PUSH_DENSE_RESPONSE__INIT;
        resp.version = version;
        reply_msg(ps, MT_PS_PUSH_DENSE, c, &resp.base);
    }
}

static void h_pull_dense(mt_ps_t *ps, mt_rpc_call_t *c, const void *req) {
    const Monolith__V1__PullDenseRequest *r = req;
    pthread_mutex_lock(&ps->dense_lock);
    Monolith__V1__PullDenseResponse resp = MONOLITH__V1__PULL_DENSE_RESPONSE__INIT;
    resp.version = ps->dense_version;
    size_t cap = ps->ndense;
    Monolith__V1__DenseTensor *ts = calloc(cap ? cap : 1, sizeof(*ts));
    Monolith__V1__DenseTensor **tp = calloc(cap ? cap : 1, sizeof(*tp));
    const char *missing = NULL;
    if (ts && tp && ps->dense_version > r->if_newer_than) {
        size_t n = 0;
        for (size_t i = 0; i < ps->ndense; i++) {
            int want = r->n_names == 0;
            for (size_t k = 0; k < r->n_names && !want; k++)
                want = !strcmp(r->names[k], ps->dense[i].name);
            if (!want) continue;
            monolith__v1__dense_tensor__init(&ts[n]);
            ts[n].name = ps->dense[i].name;
            ts[n].n_shape = ps->dense[i].nshape;
            ts[n].shape = ps->dense[i].shape;
            ts[n].n_values = ps->dense[i].n;
            ts[n].values = ps->dense[i].w;
            tp[n] = &ts[n];
            n++;
        }
        for (size_t k = 0; k < r->n_names && !missing; k++)
            if (!dense_find(ps, r->names[k])) missing = r->names[k];
        resp.n_tensors = n;
        resp.tensors = tp;
    }
    if (!ts || !tp) {
        FAIL(ps, MT_PS_PULL_DENSE, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
    } else if (missing) {
        FAIL(ps, MT_PS_PULL_DENSE, c, MT_RPC_NOT_FOUND, "no dense tensor '%s'", missing);
    } else {
        /* packed under the lock: consistent */
        reply_msg_hint(ps, MT_PS_PULL_DENSE, c, &resp.base,
                       "ask for fewer tensors at a time (PullDenseRequest.names)");
    }
    pthread_mutex_unlock(&ps->dense_lock);
    free(ts);
    free(tp);
}

mt_err_t mt_ps_dense_save(mt_ps_t *ps, uint8_t **buf, size_t *len) {
    pthread_mutex_lock(&ps->dense_lock);
    size_t n = ps->ndense;
    Monolith__V1__DenseTensor *ts = calloc(3 * (n ? n : 1), sizeof(*ts));
    Monolith__V1__DenseTensor **tp = calloc(3 * (n ? n : 1), sizeof(*tp));
    uint64_t *steps = calloc(n ? n : 1, sizeof(uint64_t));
    mt_err_t err = MT_OK;
    if (!ts || !tp || !steps) {
        err = MT_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const dense_tensor_t *d = &ps->dense[i];
        float *arrs[3] = {d->w, d->s1, d->s2};
        for (int k = 0; k < 3; k++) {
            Monolith__V1__DenseTensor *t = &ts[k * n + i];
            monolith__v1__dense_tensor__init(t);
            t->name = d->name;
            t->n_shape = d->nshape;
            t->shape = d->shape;
            t->n_values = d->n;
            t->values = arrs[k];
            tp[k * n + i] = t;
        }
        steps[i] = d->steps;
    }
    Monolith__V1__DenseState st = MONOLITH__V1__DENSE_STATE__INIT;
    st.version = ps->dense_version;
    st.n_weights = st.n_slot1 = st.n_slot2 = n;
    st.weights = tp;
    st.slot1 = tp + n;
    st.slot2 = tp + 2 * n;
    st.n_steps = n;
    st.steps = steps;
    *len = monolith__v1__dense_state__get_packed_size(&st);
    *buf = malloc(*len ? *len : 1);
    if (!*buf) {
        err = MT_NOMEM;
        goto out;
    }
    monolith__v1__dense_state__pack(&st, *buf);
out:
    pthread_mutex_unlock(&ps->dense_lock);
    free(ts);
    free(tp);
    free(steps);
    return err;
}

static void dense_swap_locked(mt_ps_t *ps, mt__ps_dense_t *dd);

mt_err_t mt_ps_dense_load(mt_ps_t *ps, const uint8_t *buf, size_t len) {
    mt__ps_dense_t *dd = NULL;
    mt_err_t err = mt__ps_dense_parse(buf, len, &dd);
    if (err) return err;
    pthread_mutex_lock(&ps->dense_lock);
    dense_swap_locked(ps, dd);
    pthread_mutex_unlock(&ps->dense_lock);
    mt__ps_dense_free(dd);
    return MT_OK;
}

/* Parsed dense parameters, not yet installed (mt__ps_dense_parse). */
struct mt__ps_dense {
    dense_tensor_t *d;
    size_t n;
    uint64_t version;
};

void mt__ps_dense_free(mt__ps_dense_t *dd) {
    if (!dd) return;
    dense_free(dd->d, dd->n);
    free(dd);
}

/* Exchanges the shard's dense parameters with @p dd's (caller holds dense_lock). */
static void dense_swap_locked(mt_ps_t *ps, mt__ps_dense_t *dd) {
    dense_tensor_t *d = ps->dense;
    size_t n = ps->ndense;
    uint64_t v = ps->dense_version;
    ps->dense = dd->d;
    ps->ndense = dd->n;
    ps->dense_version = dd->version;
    dd->d = d;
    dd->n = n;
    dd->version = v;
}

mt_err_t mt__ps_dense_parse(const uint8_t *buf, size_t len, mt__ps_dense_t **out) {
    mt__ps_dense_t *dd = calloc(1, sizeof(*dd));
    if (!dd) return MT_NOMEM;
    if (!buf || !len) { /* no DenseState at all: no tensors, version 0 */
        *out = dd;
        return MT_OK;
    }
    Monolith__V1__DenseState *st = monolith__v1__dense_state__unpack(NULL, len, buf);
    if (!st) {
        free(dd);
        return MT_CORRUPT;
    }
    size_t n = st->n_weights;
    mt_err_t err = MT_OK;
    if (st->n_slot1 != n || st->n_slot2 != n || st->n_steps != n) err = MT_CORRUPT;
    dense_tensor_t *nd = calloc(n ? n : 1, sizeof(*nd));
    if (!nd) err = MT_NOMEM;
    size_t built = 0;
    for (size_t i = 0; i < n && !err; i++, built++) {
        const Monolith__V1__DenseTensor *w = st->weights[i], *a = st->slot1[i], *b = st->slot2[i];
        int ok;
        size_t sz = shape_size(w->shape, w->n_shape, &ok);
        if (!ok || w->n_values != sz || a->n_values != sz || b->n_values != sz) {
            err = MT_CORRUPT;
            break;
        }
        dense_tensor_t *d = &nd[i];
        d->name = strdup(w->name);
        d->shape = malloc(w->n_shape * sizeof(uint32_t));
        d->w = malloc(sz * sizeof(float));
        d->s1 = malloc(sz * sizeof(float));
        d->s2 = malloc(sz * sizeof(float));
        if (!d->name || !d->shape || !d->w || !d->s1 || !d->s2) {
            err = MT_NOMEM;
            built++;
            break;
        }
        memcpy(d->shape, w->shape, w->n_shape * sizeof(uint32_t));
        d->nshape = w->n_shape;
        d->n = sz;
        memcpy(d->w, w->values, sz * sizeof(float));
        memcpy(d->s1, a->values, sz * sizeof(float));
        memcpy(d->s2, b->values, sz * sizeof(float));
        d->steps = st->steps[i];
    }
    if (!err) {
        dd->d = nd;
        dd->n = n;
        dd->version = st->version;
        *out = dd;
    } else {
        dense_free(nd, built);
        free(dd);
    }
    monolith__v1__dense_state__free_unpacked(st, NULL);
    return err;
}

/* ============================== restore ============================== */

int mt__ps_enter(mt_ps_t *ps) {
    /* Dekker with mt__ps_install: count first, then look (both sequentially consistent), so
     * that either the installer sees this call in flight or this call sees the flag. */
    atomic_fetch_add(&ps->inflight, 1);
    if (!atomic_load(&ps->restoring)) return 0;
    atomic_fetch_sub(&ps->inflight, 1);
    return -1;
}

void mt__ps_leave(mt_ps_t *ps) {
    atomic_fetch_sub(&ps->inflight, 1);
}

const mt_ps_config_t *mt__ps_config(const mt_ps_t *ps) {
    return &ps->cfg;
}

pthread_mutex_t *mt__ps_snap_lock(mt_ps_t *ps) {
    return &ps->snap_lock;
}

uint64_t mt__ps_epoch(mt_ps_t *ps) {
    return atomic_load(&ps->epoch);
}

void mt__ps_epoch_raise(mt_ps_t *ps, uint64_t epoch) {
    mt__atomic_max(&ps->epoch, epoch);
}

int mt__ps_fenced(mt_ps_t *ps, uint64_t epoch, char *why, size_t len) {
    uint64_t cur = atomic_load(&ps->epoch);
    if (!epoch || epoch >= cur) return 0;
    mt_msgf(why, len,
            "fenced: coordinator epoch %llu is below %llu (another trainer took over the "
            "cluster's checkpoints)",
            (unsigned long long)epoch, (unsigned long long)cur);
    return 1;
}

mt__ps_ckpt_t *mt__ps_ckpt(mt_ps_t *ps) {
    return ps->ck;
}

uint64_t mt__ps_step(mt_ps_t *ps) {
    return atomic_load(&ps->step);
}

uint64_t mt__ps_dense_version(mt_ps_t *ps) {
    pthread_mutex_lock(&ps->dense_lock);
    uint64_t v = ps->dense_version;
    pthread_mutex_unlock(&ps->dense_lock);
    return v;
}

mt_err_t mt__ps_install(mt_ps_t *ps, mt_table_t *table, mt__ps_dense_t *dense, uint64_t examples,
                        uint64_t step, double wait_s) {
    int was = atomic_exchange(&ps->restoring, 1);
    /* Follow Sync streams end at their next round when stop_streams is not 0; +2 / -2 keeps
     * a daemon's mt_ps_stop_streams() (a store of 1) meanwhile in force (1 + 2 - 2, or
     * 2 -> 1 -> -1: not 0 either way). */
    atomic_fetch_add(&ps->stop_streams, 2);
    double deadline = mt_mono_s() + wait_s;
    while (atomic_load(&ps->inflight) > 0 && mt_mono_s() < deadline) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    mt_err_t err = atomic_load(&ps->inflight) > 0 ? MT_UNAVAILABLE : MT_OK;
    mt_table_t *old = NULL;
    if (!err) {
        old = ps->table;
        ps->table = table;
        pthread_mutex_lock(&ps->dense_lock);
        dense_swap_locked(ps, dense);
        pthread_mutex_unlock(&ps->dense_lock);
        atomic_store(&ps->examples_applied, examples);
        atomic_store(&ps->step, step);
        atomic_store(&ps->incarnation, new_incarnation(atomic_load(&ps->incarnation)));
    }
    atomic_fetch_sub(&ps->stop_streams, 2);
    atomic_store(&ps->restoring, was);
    mt_table_destroy(old); /* nothing uses it: every call that could is over */
    return err;
}

/* ============================== registration ============================== */

/* Counts the call, unpacks its request (malformed: INVALID_ARGUMENT "malformed <Type>"),
 * runs the method's handler on it and frees it. */
static void dispatch(const method_ctx_t *ctx, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    atomic_fetch_add(&ctx->ps->calls[ctx->idx], 1);
    ProtobufCMessage *r = protobuf_c_message_unpack(ctx->req_desc, NULL, len, req);
    if (!r) {
        FAIL(ctx->ps, ctx->idx, c, MT_RPC_INVALID_ARGUMENT, "malformed %s",
             ctx->req_desc->short_name);
        return;
    }
    ctx->fn(ctx->ps, c, r);
    protobuf_c_message_free_unpacked(r, NULL);
}

/* Times every call into the method's latency histogram. The methods that use the table run
 * between mt__ps_enter() and mt__ps_leave(), so that a restore can wait for them; the admin
 * methods are ordered by snap_lock instead (a Snapshot waiting for it while counted would
 * make a restore holding it wait for nothing). */
static void timed(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    method_ctx_t *ctx = ud;
    int admin =
        ctx->idx == MT_PS_SNAPSHOT || ctx->idx == MT_PS_RESTORE || ctx->idx == MT_PS_CHECKPOINTS;
    if (admin ? atomic_load(&ctx->ps->restoring) != 0 : mt__ps_enter(ctx->ps) != 0) {
        atomic_fetch_add(&ctx->ps->calls[ctx->idx], 1);
        FAIL(ctx->ps, ctx->idx, c, MT_RPC_UNAVAILABLE, "shard %u is restoring a snapshot",
             ctx->ps->cfg.shard);
        return;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    dispatch(ctx, c, req, len);
    if (!admin) mt__ps_leave(ctx->ps);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    int b = 0;
    while (b < MT__HIST_BUCKETS - 1 && s > hist_bounds_s[b])
        b++;
    atomic_fetch_add(&ctx->ps->hist[ctx->idx][b], 1);
    atomic_fetch_add(&ctx->ps->hist_sum_us[ctx->idx], (uint64_t)(s * 1e6));
}

mt_err_t mt_ps_render_metrics(mt_ps_t *ps, const char *extra, char **body, size_t *len) {
    mt_strbuf_t b = {0};
    const char *L = "shard";
    uint32_t sh = ps->cfg.shard;
    mt_strbuf_printf(&b, "# HELP monolith_ps_requests_total Calls per method.\n"
                         "# TYPE monolith_ps_requests_total counter\n");
    for (int m = 0; m < MT_PS_NMETHODS; m++)
        mt_strbuf_printf(&b, "monolith_ps_requests_total{%s=\"%u\",method=\"%s\"} %llu\n", L, sh,
                         method_names[m], (unsigned long long)atomic_load(&ps->calls[m]));
    mt_strbuf_printf(&b, "# HELP monolith_ps_errors_total Calls answered with an error status.\n"
                         "# TYPE monolith_ps_errors_total counter\n");
    for (int m = 0; m < MT_PS_NMETHODS; m++)
        mt_strbuf_printf(&b, "monolith_ps_errors_total{%s=\"%u\",method=\"%s\"} %llu\n", L, sh,
                         method_names[m], (unsigned long long)atomic_load(&ps->errors[m]));
    mt_strbuf_printf(&b, "# HELP monolith_ps_request_seconds Call latency.\n"
                         "# TYPE monolith_ps_request_seconds histogram\n");
    for (int m = 0; m < MT_PS_NMETHODS; m++) {
        uint64_t cum = 0;
        for (int k = 0; k < MT__HIST_BUCKETS; k++) {
            cum += atomic_load(&ps->hist[m][k]);
            if (k < MT__HIST_BUCKETS - 1)
                mt_strbuf_printf(
                    &b,
                    "monolith_ps_request_seconds_bucket{%s=\"%u\",method=\"%s\",le=\"%g\"} "
                    "%llu\n",
                    L, sh, method_names[m], hist_bounds_s[k], (unsigned long long)cum);
            else
                mt_strbuf_printf(
                    &b,
                    "monolith_ps_request_seconds_bucket{%s=\"%u\",method=\"%s\",le=\"+Inf\"} "
                    "%llu\n",
                    L, sh, method_names[m], (unsigned long long)cum);
        }
        mt_strbuf_printf(&b, "monolith_ps_request_seconds_sum{%s=\"%u\",method=\"%s\"} %.6f\n", L,
                         sh, method_names[m], (double)atomic_load(&ps->hist_sum_us[m]) * 1e-6);
        mt_strbuf_printf(&b, "monolith_ps_request_seconds_count{%s=\"%u\",method=\"%s\"} %llu\n", L,
                         sh, method_names[m], (unsigned long long)cum);
    }
    mt_table_stats_t st;
    /* a restore swaps the table: wait for it (it is short once the new table is loaded) */
    int entered = -1;
    for (int i = 0; i < 20000 && (entered = mt__ps_enter(ps)) != 0; i++) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    memset(&st, 0, sizeof(st));
    if (entered == 0) {
        mt_table_stats(ps->table, &st);
        mt__ps_leave(ps);
    }
    struct {
        const char *name, *type, *help;
        double v;
    } g[] = {
        {"monolith_ps_rows", "gauge", "Rows in the table.", (double)st.rows},
        {"monolith_ps_capacity", "gauge", "Row slots in the bucket arrays.", (double)st.capacity},
        {"monolith_ps_load_factor", "gauge", "rows / capacity.", st.load_factor},
        {"monolith_ps_table_bytes", "gauge", "Bytes held by the table.", (double)st.bytes_total},
        {"monolith_ps_table_version", "gauge", "Highest change version.", (double)st.version},
        {"monolith_ps_inserts_total", "counter", "Rows created.", (double)st.inserts},
        {"monolith_ps_evictions_total", "counter", "Rows expired.", (double)st.evictions},
        {"monolith_ps_filtered_total", "counter", "Sightings held back by the frequency filter.",
         (double)st.filtered},
        {"monolith_ps_changelog_drops_total", "counter",
         "Change-log entries dropped (older syncs get a full stream).", (double)st.changelog_drops},
        {"monolith_ps_lookup_fids_total", "counter", "Ids looked up.",
         (double)atomic_load(&ps->lookup_fids)},
        {"monolith_ps_apply_fids_total", "counter", "Ids updated by gradients.",
         (double)atomic_load(&ps->apply_fids)},
        {"monolith_ps_sync_entries_total", "counter", "Entries sent by Sync streams.",
         (double)atomic_load(&ps->sync_entries)},
        {"monolith_ps_examples_applied", "gauge",
         "Examples the shard's state reflects (restored with checkpoints).",
         (double)atomic_load(&ps->examples_applied)},
        {"monolith_ps_coordinator_epoch", "gauge",
         "Highest coordinator epoch seen: requests below it are fenced (0: none).",
         (double)atomic_load(&ps->epoch)},
        {"monolith_ps_incarnation", "gauge", "This life of the shard (a restore takes a new one).",
         (double)atomic_load(&ps->incarnation)},
    };
    for (size_t i = 0; i < sizeof(g) / sizeof(g[0]); i++)
        mt_strbuf_printf(&b, "# HELP %s %s\n# TYPE %s %s\n%s{%s=\"%u\"} %.17g\n", g[i].name,
                         g[i].help, g[i].name, g[i].type, g[i].name, L, sh, g[i].v);
    mt__ps_ckpt_render(ps, &b);
    if (extra) mt_strbuf_printf(&b, "%s", extra);
    if (b.oom) {
        free(b.p);
        return MT_NOMEM;
    }
    *body = b.p;
    *len = b.len;
    return MT_OK;
}

mt_err_t mt_ps_register(mt_ps_t *ps, mt_rpc_server_t *srv) {
    /* In MT_PS_* order: the index is the counters' method index. */
    struct {
        const char *path;
        int streaming;
        method_fn fn;
        const ProtobufCMessageDescriptor *req_desc;
    } m[] = {
        {PATH("Lookup"), 0, h_lookup, &monolith__v1__lookup_request__descriptor},
        {PATH("ApplyGradients"), 0, h_apply, &monolith__v1__apply_gradients_request__descriptor},
        {PATH("PullDense"), 0, h_pull_dense, &monolith__v1__pull_dense_request__descriptor},
        {PATH("PushDense"), 0, h_push_dense, &monolith__v1__push_dense_request__descriptor},
        {PATH("Sync"), 1, h_sync, &monolith__v1__sync_request__descriptor},
        {PATH("Snapshot"), 0, h_snapshot, &monolith__v1__snapshot_request__descriptor},
        {PATH("Stats"), 0, h_stats, &monolith__v1__stats_request__descriptor},
        {PATH("Restore"), 0, h_restore, &monolith__v1__restore_request__descriptor},
        {PATH("Checkpoints"), 0, h_checkpoints, &monolith__v1__checkpoints_request__descriptor},
    };
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
        ps->ctx[i] = (method_ctx_t){ps, (int)i, m[i].fn, m[i].req_desc};
        mt_err_t err = mt_rpc_server_add(srv, m[i].path, m[i].streaming, timed, &ps->ctx[i]);
        if (err) return err;
    }
    return MT_OK;
}
