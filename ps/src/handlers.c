/*
 * handlers.c - the ParameterServer methods over one shard (handlers_int.h): the top layer of
 * the ps module's calls. It uses the checkpoints (ckpt_int.h, mt_ps_snapshot and
 * mt_ps_restore_claim), the shard state and the dense store (shard_int.h, dense_int.h);
 * nothing below calls back into it.
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
 * table is read, Sync chunks are cut to fit it (mt__ps_chunk_fit), and reply_msg refuses any
 * other answer over it; each refusal is RESOURCE_EXHAUSTED, counted like every error.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt_int.h"
#include "handlers_int.h"
#include "monolith/v1/ps.pb-c.h"
#include "mt/clock.h"
#include "mt/route.h"
#include "mt/strbuf.h"
#include "shard_int.h"

#define PATH(m) "/monolith.v1.ParameterServer/" m

#define MT__HIST_BUCKETS 13
static const double hist_bounds_s[MT__HIST_BUCKETS - 1] = {
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25};

/* A method's handler: @p req is the method's request, unpacked; borrowed (dispatch() frees it
 * when the handler returns). The handler finishes the call (reply_msg or FAIL). */
typedef void (*method_fn)(struct mt_ps *ps, mt_rpc_call_t *c, const void *req);

/* One registered method (the ud of its rpc handler, timed()). */
typedef struct method_ctx {
    struct mt_ps *ps;
    mt__ps_rpc_t *rpc; /* ps->rpc: the histograms */
    int idx;           /* MT_PS_LOOKUP, ...: the counters' index */
    method_fn fn;
    const ProtobufCMessageDescriptor *req_desc; /* the request message's type */
} method_ctx_t;

/* The rpc layer's part of a service (ps->rpc). */
struct mt__ps_rpc {
    method_ctx_t ctx[MT_PS_NMETHODS];
    _Atomic uint64_t hist[MT_PS_NMETHODS][MT__HIST_BUCKETS]; /* latency, cumulative at render */
    _Atomic uint64_t hist_sum_us[MT_PS_NMETHODS];
};

mt_err_t mt__ps_rpc_create(mt__ps_rpc_t **out) {
    mt__ps_rpc_t *rpc = calloc(1, sizeof(*rpc));
    if (!rpc) return MT_NOMEM;
    *out = rpc;
    return MT_OK;
}

void mt__ps_rpc_destroy(mt__ps_rpc_t *rpc) {
    free(rpc);
}

static uint32_t now_or(int64_t now_s) {
    if (now_s > 0 && now_s < (int64_t)UINT32_MAX) return (uint32_t)now_s;
    return (uint32_t)time(NULL);
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
            uint32_t owner = mt_route_shard_of(fids[i], ps->cfg.num_shards);
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

/* ============================== covers and marks ============================== */

/* A request's cover as ranges (strings borrowed from the request), checked. @returns 0 (with
 * *out NULL when the request has none), or -1 when the call was failed (INVALID_ARGUMENT). */
static int cover_of(mt_ps_t *ps, int m, mt_rpc_call_t *c, Monolith__V1__Range *const *pb, size_t n,
                    mt__ps_range_t **out) {
    *out = NULL;
    if (!n) return 0;
    char why[320];
    if (n > MT__PS_MAX_RANGES) {
        FAIL(ps, m, c, MT_RPC_INVALID_ARGUMENT, "a cover of %zu ranges (at most %d)", n,
             MT__PS_MAX_RANGES);
        return -1;
    }
    mt__ps_range_t *r = malloc(n * sizeof(*r));
    if (!r) {
        FAIL(ps, m, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        r[i] = (mt__ps_range_t){pb[i]->topic, pb[i]->partition, pb[i]->lo, pb[i]->hi, pb[i]->first};
    if (mt__ps_marks_check(r, n, why, sizeof(why)) != MT_OK) {
        free(r);
        FAIL(ps, m, c, MT_RPC_INVALID_ARGUMENT, "%s", why);
        return -1;
    }
    *out = r;
    return 0;
}

/* Starts a covered call: takes the gate shared and judges the cover (marks_int.h).
 * @returns 1 to apply (reserved: finish with cover_end), 0 to skip (gate released), or -1
 * when the call was failed (out of order: FAILED_PRECONDITION; gate released). */
static int cover_begin(mt_ps_t *ps, int m, mt__ps_marks_kind_t kind, mt_rpc_call_t *c,
                       const mt__ps_range_t *r, size_t n) {
    char why[400];
    int skip = 0;
    mt__ps_marks_gate_shared(ps->marks);
    mt_err_t err = mt__ps_marks_begin(ps->marks, kind, r, n, &skip, why, sizeof(why));
    if (err) {
        mt__ps_marks_gate_release(ps->marks);
        if (err == MT_OUT_OF_ORDER) atomic_fetch_add(&ps->out_of_order[kind], 1);
        FAIL(ps, m, c,
             err == MT_OUT_OF_ORDER ? MT_RPC_FAILED_PRECONDITION : MT_RPC_RESOURCE_EXHAUSTED,
             "shard %u: %s", ps->cfg.shard, why);
        return -1;
    }
    if (skip) {
        mt__ps_marks_gate_release(ps->marks);
        atomic_fetch_add(&ps->skipped[kind], 1);
        return 0;
    }
    return 1;
}

/* Ends what cover_begin reserved: the marks move to the ranges' ends if @p done. */
static void cover_end(mt_ps_t *ps, mt__ps_marks_kind_t kind, const mt__ps_range_t *r, size_t n,
                      int done) {
    mt__ps_marks_end(ps->marks, kind, r, n, done);
    mt__ps_marks_gate_release(ps->marks);
}

/* KafkaOffset messages of marks (strings borrowed). */
typedef struct offsets_pb {
    Monolith__V1__KafkaOffset *ko;
    Monolith__V1__KafkaOffset **kop;
    size_t n;
} offsets_pb_t;

static int offsets_alloc(offsets_pb_t *o, size_t n) {
    o->n = 0;
    o->ko = calloc(n ? n : 1, sizeof(*o->ko));
    o->kop = calloc(n ? n : 1, sizeof(*o->kop));
    return o->ko && o->kop ? 0 : -1;
}

static void offsets_add(offsets_pb_t *o, const char *topic, int32_t partition, int64_t next) {
    Monolith__V1__KafkaOffset *k = &o->ko[o->n];
    monolith__v1__kafka_offset__init(k);
    k->topic = (char *)topic;
    k->partition = partition;
    k->offset = next;
    o->kop[o->n++] = k;
}

static void offsets_free(offsets_pb_t *o) {
    free(o->ko);
    free(o->kop);
    memset(o, 0, sizeof(*o));
}

/* The marks of the cover's partitions after a call, for its answer. @returns 0 or -1. */
static int cover_marks(mt_ps_t *ps, mt__ps_marks_kind_t kind, const mt__ps_range_t *r, size_t n,
                       offsets_pb_t *o) {
    int64_t *next = malloc((n ? n : 1) * sizeof(int64_t));
    if (!next || offsets_alloc(o, n)) {
        free(next);
        offsets_free(o);
        return -1;
    }
    mt__ps_marks_of(ps->marks, kind, r, n, next);
    for (size_t i = 0; i < n; i++)
        if (next[i] >= 0) offsets_add(o, r[i].topic, r[i].partition, next[i]);
    free(next);
    return 0;
}

static int list_offsets(const mt__ps_mark_list_t *l, offsets_pb_t *o) {
    if (offsets_alloc(o, l->n)) {
        offsets_free(o);
        return -1;
    }
    for (size_t i = 0; i < l->n; i++)
        offsets_add(o, l->v[i].topic, l->v[i].partition, l->v[i].next);
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
    mt__ps_range_t *cov = NULL;
    size_t ncov = r->n_cover;
    if (cover_of(ps, MT_PS_APPLY, c, r->cover, ncov, &cov) != 0) return;
    /* with a cover: applied exactly once (marks_int.h); every check above came first, so
     * that a reserved step fails only inside the table, which does not happen */
    int go = ncov ? cover_begin(ps, MT_PS_APPLY, MT__PS_SPARSE, c, cov, ncov) : 1;
    mt_table_op_stats_t st = {0};
    mt_err_t err = MT_OK;
    if (go == 1) {
        err = mt_table_apply(ps->table, r->fids, r->n_fids, r->grads, r->n_grads, now_or(r->now_s),
                             &st);
        if (!err) {
            atomic_fetch_add(&ps->apply_fids, r->n_fids);
            if (r->examples) atomic_fetch_add(&ps->examples_applied, r->examples);
            mt__atomic_max(&ps->step, r->step);
        }
        if (ncov) cover_end(ps, MT__PS_SPARSE, cov, ncov, err == MT_OK);
    }
    offsets_pb_t marks = {0};
    if (go < 0) {
        /* failed by cover_begin */
    } else if (err) {
        FAIL(ps, MT_PS_APPLY, c, MT_RPC_INTERNAL, "apply: %s", mt_strerror(err));
    } else if (ncov && cover_marks(ps, MT__PS_SPARSE, cov, ncov, &marks)) {
        FAIL(ps, MT_PS_APPLY, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        Monolith__V1__ApplyGradientsResponse resp = MONOLITH__V1__APPLY_GRADIENTS_RESPONSE__INIT;
        resp.applied = st.found;
        resp.missing = st.missing;
        resp.skipped = go == 0;
        resp.n_marks = marks.n;
        resp.marks = marks.kop;
        reply_msg(ps, MT_PS_APPLY, c, &resp.base);
    }
    offsets_free(&marks);
    free(cov);
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
        size_t nv = mt__ps_chunk_split(b->ents, n, b->fids, b->del);
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
    size_t fit = mt__ps_chunk_fit(ps, ps->cfg.max_message_bytes);
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
    resp.dense_version = mt__ps_dense_version(&ps->dense);
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
    /* the marks, live and of the last checkpoint */
    mt__ps_mark_list_t l[4] = {{0}};
    offsets_pb_t o[4] = {{0}};
    int bad = mt__ps_marks_copy(ps->marks, MT__PS_SPARSE, &l[0]) ||
              mt__ps_marks_copy(ps->marks, MT__PS_DENSE, &l[1]) ||
              mt__ps_ckpt_durable_marks(ps, &l[2], &l[3]);
    for (int i = 0; i < 4 && !bad; i++)
        bad = list_offsets(&l[i], &o[i]);
    if (bad) {
        FAIL(ps, MT_PS_STATS, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        resp.n_marks = o[0].n;
        resp.marks = o[0].kop;
        resp.n_dense_marks = o[1].n;
        resp.dense_marks = o[1].kop;
        resp.n_durable_marks = o[2].n;
        resp.durable_marks = o[2].kop;
        resp.n_durable_dense_marks = o[3].n;
        resp.durable_dense_marks = o[3].kop;
        reply_msg(ps, MT_PS_STATS, c, &resp.base);
    }
    for (int i = 0; i < 4; i++) {
        offsets_free(&o[i]);
        mt__ps_mark_list_free(&l[i]);
    }
    free(infos);
    free(ptrs);
}

/* ============================== checkpoints ==============================
 * The store work is ckpt.c's (mt_ps_snapshot, mt_ps_restore_claim, mt__ps_ckpt_list); these
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
    if (r->checkpoint_id >= MT_PS_CHECKPOINT_ID_MAX) {
        FAIL(ps, MT_PS_SNAPSHOT, c, MT_RPC_INVALID_ARGUMENT,
             "checkpoint_id %llu: ids must stay below %llu", (unsigned long long)r->checkpoint_id,
             (unsigned long long)MT_PS_CHECKPOINT_ID_MAX);
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

/* ============================== dense ==============================
 * The tensors and their optimizer are dense.c's; these handlers translate requests and
 * errors. */

static void h_push_dense(mt_ps_t *ps, mt_rpc_call_t *c, const void *req) {
    const Monolith__V1__PushDenseRequest *r = req;
    char why[256] = "";
    uint64_t version = 0;
    if (!fence_ok(ps, MT_PS_PUSH_DENSE, c, r->epoch)) return;
    mt__ps_range_t *cov = NULL;
    size_t ncov = r->n_cover;
    if (cover_of(ps, MT_PS_PUSH_DENSE, c, r->cover, ncov, &cov) != 0) return;
    /* with a cover: pushed exactly once, against the dense marks. A push the dense store
     * refuses (shapes, values) changes nothing: the marks stay */
    int go = ncov ? cover_begin(ps, MT_PS_PUSH_DENSE, MT__PS_DENSE, c, cov, ncov) : 1;
    mt_err_t err = MT_OK;
    if (go == 1) {
        err = mt__ps_dense_push(&ps->dense, r, &version, why, sizeof(why));
        if (ncov) cover_end(ps, MT__PS_DENSE, cov, ncov, err == MT_OK);
    } else if (go == 0) {
        version = mt__ps_dense_version(&ps->dense);
    }
    offsets_pb_t marks = {0};
    if (go < 0) {
        /* failed by cover_begin */
    } else if (err) {
        FAIL(ps, MT_PS_PUSH_DENSE, c,
             err == MT_NOMEM ? MT_RPC_RESOURCE_EXHAUSTED : MT_RPC_INVALID_ARGUMENT, "%s", why);
    } else if (ncov && cover_marks(ps, MT__PS_DENSE, cov, ncov, &marks)) {
        FAIL(ps, MT_PS_PUSH_DENSE, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        Monolith__V1__PushDenseResponse resp = MONOLITH__V1__PUSH_DENSE_RESPONSE__INIT;
        resp.version = version;
        resp.skipped = go == 0;
        resp.n_marks = marks.n;
        resp.marks = marks.kop;
        reply_msg(ps, MT_PS_PUSH_DENSE, c, &resp.base);
    }
    offsets_free(&marks);
    free(cov);
}

/* The PullDense call being answered (the ud of pull_reply). */
typedef struct pull_call {
    mt_ps_t *ps;
    mt_rpc_call_t *c;
} pull_call_t;

/* Replies to a PullDense with the answer mt__ps_dense_pull() built (under dense_lock). */
static void pull_reply(void *ud, const ProtobufCMessage *resp) {
    pull_call_t *pc = ud;
    reply_msg_hint(pc->ps, MT_PS_PULL_DENSE, pc->c, resp,
                   "ask for fewer tensors at a time (PullDenseRequest.names)");
}

static void h_pull_dense(mt_ps_t *ps, mt_rpc_call_t *c, const void *req) {
    const Monolith__V1__PullDenseRequest *r = req;
    pull_call_t pc = {ps, c};
    const char *missing = NULL;
    mt_err_t err = mt__ps_dense_pull(&ps->dense, r, pull_reply, &pc, &missing);
    if (err == MT_NOT_FOUND)
        FAIL(ps, MT_PS_PULL_DENSE, c, MT_RPC_NOT_FOUND, "no dense tensor '%s'", missing);
    else if (err)
        FAIL(ps, MT_PS_PULL_DENSE, c, MT_RPC_RESOURCE_EXHAUSTED, "out of memory");
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
    atomic_fetch_add(&ctx->rpc->hist[ctx->idx][b], 1);
    atomic_fetch_add(&ctx->rpc->hist_sum_us[ctx->idx], (uint64_t)(s * 1e6));
}

/* One counter family with a label of n values: `name{shard="sh",label="names[i]"} v[i]`. */
static void render_counters(mt_strbuf_t *b, const char *name, const char *help, uint32_t sh,
                            const char *label, const char *const *names, const _Atomic uint64_t *v,
                            int n) {
    mt_strbuf_printf(b, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    for (int i = 0; i < n; i++)
        mt_strbuf_printf(b, "%s{shard=\"%u\",%s=\"%s\"} %llu\n", name, sh, label, names[i],
                         (unsigned long long)atomic_load(&v[i]));
}

mt_err_t mt_ps_render_metrics(mt_ps_t *ps, const char *extra, char **body, size_t *len) {
    mt_strbuf_t b = {0};
    const char *L = "shard";
    uint32_t sh = ps->cfg.shard;
    render_counters(&b, "monolith_ps_requests_total", "Calls per method.", sh, "method",
                    method_names, ps->calls, MT_PS_NMETHODS);
    render_counters(&b, "monolith_ps_errors_total", "Calls answered with an error status.", sh,
                    "method", method_names, ps->errors, MT_PS_NMETHODS);
    mt_strbuf_printf(&b, "# HELP monolith_ps_request_seconds Call latency.\n"
                         "# TYPE monolith_ps_request_seconds histogram\n");
    for (int m = 0; m < MT_PS_NMETHODS; m++) {
        uint64_t cum = 0;
        for (int k = 0; k < MT__HIST_BUCKETS; k++) {
            cum += atomic_load(&ps->rpc->hist[m][k]);
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
                         sh, method_names[m], (double)atomic_load(&ps->rpc->hist_sum_us[m]) * 1e-6);
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
    static const char *kinds[2] = {"sparse", "dense"};
    render_counters(&b, "monolith_ps_skipped_total",
                    "Covered calls skipped: their examples were applied before (a retry or a "
                    "replay).",
                    sh, "kind", kinds, ps->skipped, 2);
    render_counters(&b, "monolith_ps_out_of_order_total",
                    "Covered calls refused: a gap or an overlap with the shard's marks.", sh,
                    "kind", kinds, ps->out_of_order, 2);
    mt_strbuf_printf(&b, "# HELP monolith_ps_mark The next offset the shard expects of a "
                         "partition (covered calls).\n"
                         "# TYPE monolith_ps_mark gauge\n");
    for (int k = 0; k < 2; k++) {
        mt__ps_mark_list_t l;
        if (mt__ps_marks_copy(ps->marks, (mt__ps_marks_kind_t)k, &l) != MT_OK) {
            b.oom = 1;
            break;
        }
        for (size_t i = 0; i < l.n; i++)
            mt_strbuf_printf(&b,
                             "monolith_ps_mark{%s=\"%u\",kind=\"%s\",topic=\"%s\",partition="
                             "\"%d\"} %lld\n",
                             L, sh, kinds[k], l.v[i].topic, (int)l.v[i].partition,
                             (long long)l.v[i].next);
        mt__ps_mark_list_free(&l);
    }
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
        ps->rpc->ctx[i] = (method_ctx_t){ps, ps->rpc, (int)i, m[i].fn, m[i].req_desc};
        mt_err_t err = mt_rpc_server_add(srv, m[i].path, m[i].streaming, timed, &ps->rpc->ctx[i]);
        if (err) return err;
    }
    return MT_OK;
}
