/*
 * psclient.c - routing, deduplication, parallel fan-out and merging for the sharded PS.
 *
 * A batch of n ids becomes u unique ids (open-addressing map fid -> unique index), grouped
 * by shard; each shard gets one request with its unique ids, all shards at once
 * (mt_rpc_call_many); answers land in a per-unique buffer and are then gathered in request
 * order.
 */
#include "mt/psclient.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "monolith/v1/ps.pb-c.h"
#include "mt/route.h"
#include "mt/table.h"

#define PATH(m) "/monolith.v1.ParameterServer/" m

struct mt_psc {
    uint32_t n;
    mt_rpc_channel_t **ch;
    int64_t deadline_ms;
    pthread_mutex_t lock;   /* guards dims loading */
    uint16_t *dims;         /* [65536] slot -> dim, 0 = not configured; NULL until loaded */
    _Atomic uint64_t epoch; /* coordinator epoch sent with writes (mt_psc_set_epoch) */
};

void mt_psc_config_init(mt_psc_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->deadline_ms = 10000;
    mt_rpc_client_config_init(&cfg->rpc);
}

mt_err_t mt_psc_create(const mt_psc_config_t *cfg, mt_psc_t **out) {
    if (!cfg || cfg->num_shards < 1 || !cfg->addrs) return MT_CONFIG;
    mt_psc_t *c = calloc(1, sizeof(*c));
    if (!c) return MT_NOMEM;
    c->n = cfg->num_shards;
    c->deadline_ms = cfg->deadline_ms;
    pthread_mutex_init(&c->lock, NULL);
    c->ch = calloc(c->n, sizeof(*c->ch));
    if (!c->ch) {
        mt_psc_destroy(c);
        return MT_NOMEM;
    }
    for (uint32_t i = 0; i < c->n; i++) {
        mt_err_t err = mt_rpc_channel_create(cfg->addrs[i], &cfg->rpc, &c->ch[i]);
        if (err) {
            mt_psc_destroy(c);
            return err;
        }
    }
    *out = c;
    return MT_OK;
}

void mt_psc_destroy(mt_psc_t *c) {
    if (!c) return;
    if (c->ch)
        for (uint32_t i = 0; i < c->n; i++)
            mt_rpc_channel_destroy(c->ch[i]);
    free(c->ch);
    free(c->dims);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

mt_rpc_channel_t *mt_psc_channel(mt_psc_t *c, uint32_t i) {
    return i < c->n ? c->ch[i] : NULL;
}

uint32_t mt_psc_num_shards(const mt_psc_t *c) {
    return c->n;
}

void mt_psc_set_epoch(mt_psc_t *c, uint64_t epoch) {
    atomic_store(&c->epoch, epoch);
}

static mt_err_t status_to_err(const mt_rpc_status_t *st) {
    switch (st->code) {
    case MT_RPC_OK: return MT_OK;
    case MT_RPC_INVALID_ARGUMENT: return MT_INVALID;
    case MT_RPC_UNAVAILABLE: return MT_UNAVAILABLE;
    case MT_RPC_DEADLINE_EXCEEDED: return MT_TIMEOUT;
    case MT_RPC_RESOURCE_EXHAUSTED: return MT_LIMIT;
    case MT_RPC_CANCELLED: return MT_CANCELLED;
    case MT_RPC_ABORTED: return MT_FENCED;
    default: return MT_INTERNAL;
    }
}

static void status_msg(mt_rpc_status_t *st, int code, const char *msg) {
    if (!st) return;
    st->code = code;
    snprintf(st->message, sizeof(st->message), "%s", msg);
}

/* Loads slot dims from the first shard that answers Stats. */
static mt_err_t load_dims(mt_psc_t *c, mt_rpc_status_t *st) {
    pthread_mutex_lock(&c->lock);
    mt_err_t err = MT_OK;
    if (c->dims) goto out;
    uint16_t *dims = calloc(65536, sizeof(uint16_t));
    if (!dims) {
        err = MT_NOMEM;
        goto out;
    }
    Monolith__V1__StatsRequest req = MONOLITH__V1__STATS_REQUEST__INIT;
    uint8_t rb[8];
    size_t rl = monolith__v1__stats_request__pack(&req, rb);
    err = MT_UNAVAILABLE;
    for (uint32_t i = 0; i < c->n && err; i++) {
        uint8_t *resp = NULL;
        size_t len = 0;
        mt_rpc_status_t s;
        mt_err_t e = mt_rpc_call(c->ch[i], PATH("Stats"), rb, rl, c->deadline_ms, &resp, &len, &s);
        if (st) *st = s;
        if (e || s.code != MT_RPC_OK) {
            free(resp);
            err = e ? e : status_to_err(&s);
            continue;
        }
        Monolith__V1__StatsResponse *r = monolith__v1__stats_response__unpack(NULL, len, resp);
        free(resp);
        if (!r) {
            err = MT_CORRUPT;
            status_msg(st, MT_RPC_INTERNAL, "malformed StatsResponse");
            continue;
        }
        for (size_t k = 0; k < r->n_slots; k++)
            if (r->slots[k]->slot < 65536 && r->slots[k]->dim <= MT_TABLE_MAX_DIM)
                dims[r->slots[k]->slot] = (uint16_t)r->slots[k]->dim;
        monolith__v1__stats_response__free_unpacked(r, NULL);
        err = MT_OK;
    }
    if (err)
        free(dims);
    else
        c->dims = dims;
out:
    pthread_mutex_unlock(&c->lock);
    return err;
}

mt_err_t mt_psc_dim(mt_psc_t *c, uint64_t fid, uint32_t *dim, mt_rpc_status_t *st) {
    mt_err_t err = load_dims(c, st);
    if (err) return err;
    uint16_t d = c->dims[MT_FID_SLOT(fid)];
    if (!d) return MT_UNKNOWN_SLOT;
    *dim = d;
    return MT_OK;
}

/* ---------------- batch planning ---------------- */

typedef struct plan {
    size_t n, nu;   /* ids, unique ids */
    uint64_t *ufid; /* [nu] */
    uint32_t *uidx; /* [n]: unique index of id i */
    size_t *uoff;   /* [nu]: float offset of unique j in the per-unique buffer */
    uint32_t *udim; /* [nu] */
    size_t ufloats;
    uint32_t *order; /* unique indices grouped by shard */
    size_t *start;   /* [nshards + 1] into order */
} plan_t;

static void plan_free(plan_t *p) {
    free(p->ufid);
    free(p->uidx);
    free(p->uoff);
    free(p->udim);
    free(p->order);
    free(p->start);
}

static mt_err_t plan_build(mt_psc_t *c, const uint64_t *fids, size_t n, plan_t *p,
                           size_t *need_floats, mt_rpc_status_t *st) {
    memset(p, 0, sizeof(*p));
    mt_err_t err = load_dims(c, st);
    if (err) return err;
    size_t sz = 16;
    while (sz < 2 * n)
        sz *= 2;
    uint32_t *map = calloc(sz, sizeof(uint32_t)); /* unique index + 1 */
    p->n = n;
    p->ufid = malloc((n ? n : 1) * sizeof(uint64_t));
    p->uidx = malloc((n ? n : 1) * sizeof(uint32_t));
    p->uoff = malloc((n ? n : 1) * sizeof(size_t));
    p->udim = malloc((n ? n : 1) * sizeof(uint32_t));
    p->order = malloc((n ? n : 1) * sizeof(uint32_t));
    p->start = calloc(c->n + 1, sizeof(size_t));
    if (!map || !p->ufid || !p->uidx || !p->uoff || !p->udim || !p->order || !p->start) {
        free(map);
        plan_free(p);
        return MT_NOMEM;
    }
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t f = fids[i];
        uint16_t d = c->dims[MT_FID_SLOT(f)];
        if (!d) {
            free(map);
            plan_free(p);
            if (st) {
                st->code = MT_RPC_INVALID_ARGUMENT;
                snprintf(st->message, sizeof(st->message), "fid %zu: slot %u is not configured", i,
                         MT_FID_SLOT(f));
            }
            return MT_UNKNOWN_SLOT;
        }
        total += d;
        size_t h = (size_t)((f * 0x9E3779B97F4A7C15ull) >> 20) & (sz - 1);
        while (map[h] && p->ufid[map[h] - 1] != f)
            h = (h + 1) & (sz - 1);
        if (!map[h]) {
            p->ufid[p->nu] = f;
            p->udim[p->nu] = d;
            p->uoff[p->nu] = p->ufloats;
            p->ufloats += d;
            map[h] = (uint32_t)++p->nu;
        }
        p->uidx[i] = map[h] - 1;
    }
    free(map);
    /* Group unique ids by shard (counting sort). */
    uint32_t *shard = malloc((p->nu ? p->nu : 1) * sizeof(uint32_t));
    if (!shard) {
        plan_free(p);
        return MT_NOMEM;
    }
    for (size_t j = 0; j < p->nu; j++) {
        shard[j] = mt_route_shard_of(p->ufid[j], c->n);
        p->start[shard[j] + 1]++;
    }
    for (uint32_t s = 0; s < c->n; s++)
        p->start[s + 1] += p->start[s];
    size_t *fill = calloc(c->n, sizeof(size_t));
    if (!fill) {
        free(shard);
        plan_free(p);
        return MT_NOMEM;
    }
    for (size_t j = 0; j < p->nu; j++)
        p->order[p->start[shard[j]] + fill[shard[j]]++] = (uint32_t)j;
    free(fill);
    free(shard);
    *need_floats = total;
    return MT_OK;
}

/* Runs one packed request per shard that has ids; reqs[s] may be NULL (no ids). On
 * success every calls[s].resp holds the answer (caller frees). */
static mt_err_t fan_out(mt_psc_t *c, const char *path, uint8_t **reqs, size_t *lens,
                        mt_rpc_batch_call_t *calls, mt_rpc_status_t *st) {
    size_t k = 0;
    for (uint32_t s = 0; s < c->n; s++) {
        if (!reqs[s]) continue;
        calls[k] =
            (mt_rpc_batch_call_t){.ch = c->ch[s], .path = path, .req = reqs[s], .len = lens[s]};
        k++;
    }
    mt_err_t err = mt_rpc_call_many(calls, k, c->deadline_ms);
    if (err) return err;
    for (size_t i = 0; i < k; i++) {
        if (calls[i].st.code != MT_RPC_OK) {
            if (st) *st = calls[i].st;
            return status_to_err(&calls[i].st);
        }
    }
    if (st) status_msg(st, MT_RPC_OK, "");
    return MT_OK;
}

static void free_calls(mt_rpc_batch_call_t *calls, size_t n, uint8_t **reqs, uint32_t nshards) {
    for (size_t i = 0; i < n; i++)
        free(calls[i].resp);
    for (uint32_t s = 0; s < nshards; s++)
        free(reqs[s]);
}

mt_err_t mt_psc_lookup(mt_psc_t *c, const uint64_t *fids, size_t n, int train, int64_t now_s,
                       float *out, size_t out_len, uint8_t *found, mt_rpc_status_t *st) {
    plan_t p;
    size_t need;
    mt_err_t err = plan_build(c, fids, n, &p, &need, st);
    if (err) return err;
    if (out_len < need) {
        plan_free(&p);
        status_msg(st, MT_RPC_INVALID_ARGUMENT, "output buffer too small");
        return MT_TOO_SMALL;
    }
    uint8_t **reqs = calloc(c->n, sizeof(uint8_t *));
    size_t *lens = calloc(c->n, sizeof(size_t));
    uint64_t *sf = malloc((p.nu ? p.nu : 1) * sizeof(uint64_t));
    mt_rpc_batch_call_t *calls = calloc(c->n, sizeof(*calls));
    float *uv = malloc((p.ufloats ? p.ufloats : 1) * sizeof(float));
    uint8_t *uf = malloc(p.nu ? p.nu : 1);
    if (!reqs || !lens || !sf || !calls || !uv || !uf) {
        err = MT_NOMEM;
        goto out;
    }
    for (uint32_t s = 0; s < c->n; s++) {
        size_t cnt = p.start[s + 1] - p.start[s];
        if (!cnt) continue;
        for (size_t k = 0; k < cnt; k++)
            sf[p.start[s] + k] = p.ufid[p.order[p.start[s] + k]];
        Monolith__V1__LookupRequest r = MONOLITH__V1__LOOKUP_REQUEST__INIT;
        r.n_fids = cnt;
        r.fids = sf + p.start[s];
        r.train = train;
        r.now_s = now_s;
        r.epoch = train ? atomic_load(&c->epoch) : 0;
        lens[s] = monolith__v1__lookup_request__get_packed_size(&r);
        reqs[s] = malloc(lens[s] ? lens[s] : 1);
        if (!reqs[s]) {
            err = MT_NOMEM;
            goto out;
        }
        monolith__v1__lookup_request__pack(&r, reqs[s]);
    }
    err = fan_out(c, PATH("Lookup"), reqs, lens, calls, st);
    if (err) goto out;
    size_t k = 0;
    for (uint32_t s = 0; s < c->n; s++) {
        size_t cnt = p.start[s + 1] - p.start[s];
        if (!cnt) continue;
        mt_rpc_batch_call_t *bc = &calls[k++];
        Monolith__V1__LookupResponse *r =
            monolith__v1__lookup_response__unpack(NULL, bc->resp_len, bc->resp);
        size_t want = 0;
        for (size_t q = 0; q < cnt; q++)
            want += p.udim[p.order[p.start[s] + q]];
        if (!r || r->n_values != want || r->found.len != cnt) {
            if (r) monolith__v1__lookup_response__free_unpacked(r, NULL);
            status_msg(st, MT_RPC_INTERNAL, "malformed LookupResponse");
            err = MT_CORRUPT;
            goto out;
        }
        size_t off = 0;
        for (size_t q = 0; q < cnt; q++) {
            uint32_t j = p.order[p.start[s] + q];
            memcpy(uv + p.uoff[j], r->values + off, p.udim[j] * sizeof(float));
            off += p.udim[j];
            uf[j] = r->found.data[q];
        }
        monolith__v1__lookup_response__free_unpacked(r, NULL);
    }
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t j = p.uidx[i];
        memcpy(out + off, uv + p.uoff[j], p.udim[j] * sizeof(float));
        off += p.udim[j];
        if (found) found[i] = uf[j];
    }
out:
    if (calls && reqs) free_calls(calls, c->n, reqs, c->n);
    free(reqs);
    free(lens);
    free(sf);
    free(calls);
    free(uv);
    free(uf);
    plan_free(&p);
    return err;
}

/* Range messages of a cover (strings borrowed). @returns 0 or -1 (out of memory). */
static int cover_pb(const mt_psc_range_t *cover, size_t n, Monolith__V1__Range **r,
                    Monolith__V1__Range ***rp) {
    *r = calloc(n ? n : 1, sizeof(**r));
    *rp = calloc(n ? n : 1, sizeof(**rp));
    if (!*r || !*rp) return -1;
    for (size_t i = 0; i < n; i++) {
        monolith__v1__range__init(&(*r)[i]);
        (*r)[i].topic = (char *)cover[i].topic;
        (*r)[i].partition = cover[i].partition;
        (*r)[i].lo = cover[i].lo;
        (*r)[i].hi = cover[i].hi;
        (*r)[i].first = cover[i].first != 0;
        (*rp)[i] = &(*r)[i];
    }
    return 0;
}

/* A covered call's error: a shard's FAILED_PRECONDITION is the rule's "out of order". */
static mt_err_t cover_err(mt_err_t err, size_t ncover, const mt_rpc_status_t *st) {
    if (err && ncover && st && st->code == MT_RPC_FAILED_PRECONDITION) return MT_OUT_OF_ORDER;
    return err;
}

mt_err_t mt_psc_apply(mt_psc_t *c, const uint64_t *fids, size_t n, const float *grads,
                      size_t grads_len, int64_t now_s, uint64_t step, uint64_t examples,
                      uint64_t *applied, uint64_t *missing, mt_rpc_status_t *st) {
    return mt_psc_apply_cover(c, fids, n, grads, grads_len, now_s, step, examples, NULL, 0, NULL,
                              applied, missing, st);
}

mt_err_t mt_psc_apply_cover(mt_psc_t *c, const uint64_t *fids, size_t n, const float *grads,
                            size_t grads_len, int64_t now_s, uint64_t step, uint64_t examples,
                            const mt_psc_range_t *cover, size_t ncover, uint32_t *skipped,
                            uint64_t *applied, uint64_t *missing, mt_rpc_status_t *st) {
    if (skipped) *skipped = 0;
    plan_t p;
    size_t need;
    mt_err_t err = plan_build(c, fids, n, &p, &need, st);
    if (err) return err;
    if (grads_len != need) {
        plan_free(&p);
        status_msg(st, MT_RPC_INVALID_ARGUMENT, "gradient length does not match the ids");
        return MT_TOO_SMALL;
    }
    uint8_t **reqs = calloc(c->n, sizeof(uint8_t *));
    size_t *lens = calloc(c->n, sizeof(size_t));
    uint64_t *sf = malloc((p.nu ? p.nu : 1) * sizeof(uint64_t));
    float *ug = calloc(p.ufloats ? p.ufloats : 1, sizeof(float));
    float *sg = malloc((p.ufloats ? p.ufloats : 1) * sizeof(float));
    mt_rpc_batch_call_t *calls = calloc(c->n, sizeof(*calls));
    Monolith__V1__Range *rr = NULL, **rrp = NULL;
    uint64_t tot_applied = 0, tot_missing = 0;
    uint32_t nskipped = 0;
    if (!reqs || !lens || !sf || !ug || !sg || !calls || cover_pb(cover, ncover, &rr, &rrp)) {
        err = MT_NOMEM;
        goto out;
    }
    size_t off = 0;
    for (size_t i = 0; i < n; i++) { /* sum the gradients of repeated ids */
        uint32_t j = p.uidx[i];
        for (uint32_t d = 0; d < p.udim[j]; d++)
            ug[p.uoff[j] + d] += grads[off + d];
        off += p.udim[j];
    }
    size_t goff = 0;
    for (uint32_t s = 0; s < c->n; s++) {
        size_t cnt = p.start[s + 1] - p.start[s];
        /* with examples or a cover every shard hears of the step */
        if (!cnt && !examples && !ncover) continue;
        size_t g0 = goff;
        for (size_t k = 0; k < cnt; k++) {
            uint32_t j = p.order[p.start[s] + k];
            sf[p.start[s] + k] = p.ufid[j];
            memcpy(sg + goff, ug + p.uoff[j], p.udim[j] * sizeof(float));
            goff += p.udim[j];
        }
        Monolith__V1__ApplyGradientsRequest r = MONOLITH__V1__APPLY_GRADIENTS_REQUEST__INIT;
        r.n_fids = cnt;
        r.fids = sf + p.start[s];
        r.n_grads = goff - g0;
        r.grads = sg + g0;
        r.now_s = now_s;
        r.step = step;
        r.examples = examples;
        r.epoch = atomic_load(&c->epoch);
        r.n_cover = ncover;
        r.cover = rrp;
        lens[s] = monolith__v1__apply_gradients_request__get_packed_size(&r);
        reqs[s] = malloc(lens[s] ? lens[s] : 1);
        if (!reqs[s]) {
            err = MT_NOMEM;
            goto out;
        }
        monolith__v1__apply_gradients_request__pack(&r, reqs[s]);
    }
    err = cover_err(fan_out(c, PATH("ApplyGradients"), reqs, lens, calls, st), ncover, st);
    if (err) goto out;
    for (uint32_t s = 0, k = 0; s < c->n; s++) {
        if (!reqs[s]) continue;
        mt_rpc_batch_call_t *bc = &calls[k++];
        Monolith__V1__ApplyGradientsResponse *r =
            monolith__v1__apply_gradients_response__unpack(NULL, bc->resp_len, bc->resp);
        if (!r) {
            status_msg(st, MT_RPC_INTERNAL, "malformed ApplyGradientsResponse");
            err = MT_CORRUPT;
            goto out;
        }
        tot_applied += r->applied;
        tot_missing += r->missing;
        nskipped += r->skipped;
        monolith__v1__apply_gradients_response__free_unpacked(r, NULL);
    }
    if (applied) *applied = tot_applied;
    if (missing) *missing = tot_missing;
    if (skipped) *skipped = nskipped;
out:
    if (calls && reqs) free_calls(calls, c->n, reqs, c->n);
    free(reqs);
    free(lens);
    free(sf);
    free(rr);
    free(rrp);
    free(ug);
    free(sg);
    free(calls);
    plan_free(&p);
    return err;
}

/* ============================== dense parameters ============================== */

static void tensor_to_pb(const mt_psc_tensor_t *t, Monolith__V1__DenseTensor *pb) {
    monolith__v1__dense_tensor__init(pb);
    pb->name = (char *)t->name;
    pb->n_shape = t->ndim;
    pb->shape = (uint32_t *)t->shape;
    pb->n_values = t->size;
    pb->values = t->values;
}

mt_err_t mt_psc_push_dense(mt_psc_t *c, const mt_psc_tensor_t *grads, const mt_psc_tensor_t *init,
                           size_t n, uint64_t step, uint64_t *version, mt_rpc_status_t *st) {
    return mt_psc_push_dense_cover(c, grads, init, n, step, NULL, 0, NULL, version, st);
}

mt_err_t mt_psc_push_dense_cover(mt_psc_t *c, const mt_psc_tensor_t *grads,
                                 const mt_psc_tensor_t *init, size_t n, uint64_t step,
                                 const mt_psc_range_t *cover, size_t ncover, int *skipped,
                                 uint64_t *version, mt_rpc_status_t *st) {
    Monolith__V1__Range *rr = NULL, **rrp = NULL;
    if (skipped) *skipped = 0;
    Monolith__V1__DenseTensor *g = calloc(n ? n : 1, sizeof(*g)), *in = NULL;
    Monolith__V1__DenseTensor **gp = calloc(n ? n : 1, sizeof(*gp)), **ip = NULL;
    uint8_t *buf = NULL, *resp = NULL;
    mt_err_t err = MT_NOMEM;
    if (!g || !gp || cover_pb(cover, ncover, &rr, &rrp)) goto out;
    if (init && (!(in = calloc(n ? n : 1, sizeof(*in))) || !(ip = calloc(n ? n : 1, sizeof(*ip)))))
        goto out;
    for (size_t i = 0; i < n; i++) {
        tensor_to_pb(&grads[i], &g[i]);
        gp[i] = &g[i];
        if (init) {
            tensor_to_pb(&init[i], &in[i]);
            ip[i] = &in[i];
        }
    }
    Monolith__V1__PushDenseRequest req = MONOLITH__V1__PUSH_DENSE_REQUEST__INIT;
    req.n_grads = n;
    req.grads = gp;
    req.n_init = init ? n : 0;
    req.init = ip;
    req.step = step;
    req.epoch = atomic_load(&c->epoch);
    req.n_cover = ncover;
    req.cover = rrp;
    size_t len = monolith__v1__push_dense_request__get_packed_size(&req);
    if (!(buf = malloc(len ? len : 1))) goto out;
    monolith__v1__push_dense_request__pack(&req, buf);
    size_t rlen = 0;
    mt_rpc_status_t s;
    err = mt_rpc_call(c->ch[0], PATH("PushDense"), buf, len, c->deadline_ms, &resp, &rlen, &s);
    if (st) *st = s;
    if (err) goto out;
    if ((err = cover_err(status_to_err(&s), ncover, &s))) goto out;
    Monolith__V1__PushDenseResponse *r =
        monolith__v1__push_dense_response__unpack(NULL, rlen, resp);
    if (!r) {
        err = MT_CORRUPT;
        status_msg(st, MT_RPC_INTERNAL, "malformed PushDenseResponse");
        goto out;
    }
    if (version) *version = r->version;
    if (skipped) *skipped = r->skipped;
    monolith__v1__push_dense_response__free_unpacked(r, NULL);
out:
    free(g);
    free(gp);
    free(in);
    free(ip);
    free(buf);
    free(resp);
    free(rr);
    free(rrp);
    return err;
}

mt_err_t mt_psc_pull_dense(mt_psc_t *c, mt_psc_tensor_t *ts, size_t n, uint64_t if_newer_than,
                           uint64_t *version, int *updated, mt_rpc_status_t *st) {
    Monolith__V1__PullDenseRequest req = MONOLITH__V1__PULL_DENSE_REQUEST__INIT;
    req.if_newer_than = if_newer_than;
    uint8_t buf[16], *resp = NULL;
    size_t len = monolith__v1__pull_dense_request__pack(&req, buf), rlen = 0;
    mt_rpc_status_t s;
    if (updated) *updated = 0;
    mt_err_t err =
        mt_rpc_call(c->ch[0], PATH("PullDense"), buf, len, c->deadline_ms, &resp, &rlen, &s);
    if (st) *st = s;
    if (err || (err = status_to_err(&s))) {
        free(resp);
        return err;
    }
    Monolith__V1__PullDenseResponse *r =
        monolith__v1__pull_dense_response__unpack(NULL, rlen, resp);
    free(resp);
    if (!r) {
        status_msg(st, MT_RPC_INTERNAL, "malformed PullDenseResponse");
        return MT_CORRUPT;
    }
    if (version) *version = r->version;
    if (r->n_tensors) {
        /* check everything first: values are written all or nothing */
        for (size_t i = 0; i < n && !err; i++) {
            const Monolith__V1__DenseTensor *t = NULL;
            for (size_t k = 0; k < r->n_tensors && !t; k++)
                if (!strcmp(r->tensors[k]->name, ts[i].name)) t = r->tensors[k];
            char why[160];
            if (!t) {
                err = MT_NOT_FOUND;
                snprintf(why, sizeof(why), "the PS holds no dense tensor '%s'", ts[i].name);
                status_msg(st, MT_RPC_NOT_FOUND, why);
            } else if (t->n_values != ts[i].size) {
                err = MT_MISMATCH;
                snprintf(why, sizeof(why), "dense tensor '%s': %zu values on the PS, %zu here",
                         ts[i].name, t->n_values, ts[i].size);
                status_msg(st, MT_RPC_FAILED_PRECONDITION, why);
            }
        }
        for (size_t i = 0; i < n && !err; i++) {
            for (size_t k = 0; k < r->n_tensors; k++) {
                if (strcmp(r->tensors[k]->name, ts[i].name)) continue;
                memcpy(ts[i].values, r->tensors[k]->values, ts[i].size * sizeof(float));
                break;
            }
        }
        if (!err && updated) *updated = 1;
    }
    monolith__v1__pull_dense_response__free_unpacked(r, NULL);
    return err;
}

/* ============================== checkpoints ============================== */

void mt_psc_shard_ckpt_free(mt_psc_shard_ckpt_t *out, uint32_t n) {
    for (uint32_t i = 0; out && i < n; i++) {
        for (int k = 0; k < 4; k++) {
            for (size_t j = 0; j < out[i].nmarks[k]; j++)
                free(out[i].marks[k][j].topic);
            free(out[i].marks[k]);
            out[i].marks[k] = NULL;
            out[i].nmarks[k] = 0;
        }
        for (size_t k = 0; k < out[i].n; k++) {
            for (size_t j = 0; j < out[i].list[k].noffsets; j++)
                free(out[i].list[k].offsets[j].topic);
            free(out[i].list[k].offsets);
        }
        free(out[i].list);
        out[i].list = NULL;
        out[i].n = 0;
    }
}

/* Copies a CheckpointMeta into @p out. @returns MT_OK or MT_NOMEM. */
static mt_err_t ckpt_from_pb(const Monolith__V1__CheckpointMeta *m, mt_psc_checkpoint_t *out) {
    memset(out, 0, sizeof(*out));
    out->checkpoint_id = m->checkpoint_id;
    out->consistent = m->consistent;
    out->examples_applied = m->examples_applied;
    out->created_ms = m->created_ms;
    if (!m->n_offsets) return MT_OK;
    out->offsets = calloc(m->n_offsets, sizeof(*out->offsets));
    if (!out->offsets) return MT_NOMEM;
    for (size_t j = 0; j < m->n_offsets; j++) {
        out->noffsets = j + 1;
        out->offsets[j].topic = strdup(m->offsets[j]->topic ? m->offsets[j]->topic : "");
        out->offsets[j].partition = m->offsets[j]->partition;
        out->offsets[j].offset = m->offsets[j]->offset;
        if (!out->offsets[j].topic) return MT_NOMEM;
    }
    return MT_OK;
}

/* Sends reqs[s] (one per shard) to every shard on @p path, unpacks each answer with @p take,
 * and fills out[s]. @returns MT_OK or the first shard's error. */
static mt_err_t admin_all(mt_psc_t *c, const char *path, uint8_t **reqs, const size_t *lens,
                          int64_t deadline_ms, mt_psc_shard_ckpt_t *out,
                          mt_err_t (*take)(const uint8_t *resp, size_t len,
                                           mt_psc_shard_ckpt_t *o)) {
    mt_rpc_batch_call_t *calls = calloc(c->n, sizeof(*calls));
    if (!calls) return MT_NOMEM;
    for (uint32_t s = 0; s < c->n; s++) {
        memset(&out[s], 0, sizeof(out[s]));
        calls[s] =
            (mt_rpc_batch_call_t){.ch = c->ch[s], .path = path, .req = reqs[s], .len = lens[s]};
    }
    mt_err_t err = mt_rpc_call_many(calls, c->n, deadline_ms);
    for (uint32_t s = 0; s < c->n; s++) {
        mt_psc_shard_ckpt_t *o = &out[s];
        o->st = calls[s].st;
        if (err) {
            o->err = err;
        } else if ((o->err = status_to_err(&calls[s].st)) == MT_OK) {
            o->err = take(calls[s].resp, calls[s].resp_len, o);
            if (o->err) status_msg(&o->st, MT_RPC_INTERNAL, "malformed answer");
        } else if (calls[s].st.code == MT_RPC_FAILED_PRECONDITION) {
            o->err = MT_MISMATCH;
        } else if (calls[s].st.code == MT_RPC_NOT_FOUND) {
            o->err = MT_NOT_FOUND;
        } else if (calls[s].st.code == MT_RPC_PERMISSION_DENIED) {
            o->err = MT_INVALID;
        }
        free(calls[s].resp);
    }
    free(calls);
    if (err) return err;
    for (uint32_t s = 0; s < c->n; s++)
        if (out[s].err) return out[s].err;
    return MT_OK;
}

static mt_err_t take_list(const uint8_t *resp, size_t len, mt_psc_shard_ckpt_t *o) {
    Monolith__V1__CheckpointsResponse *r =
        monolith__v1__checkpoints_response__unpack(NULL, len, resp);
    if (!r) return MT_CORRUPT;
    mt_err_t err = MT_OK;
    o->incarnation = r->incarnation;
    o->examples_applied = r->examples_applied;
    o->epoch = r->epoch;
    o->list = calloc(r->n_checkpoints ? r->n_checkpoints : 1, sizeof(*o->list));
    if (!o->list) err = MT_NOMEM;
    for (size_t k = 0; k < r->n_checkpoints && !err; k++) {
        o->n = k + 1;
        err = ckpt_from_pb(r->checkpoints[k], &o->list[k]);
    }
    monolith__v1__checkpoints_response__free_unpacked(r, NULL);
    return err;
}

static mt_err_t take_snapshot(const uint8_t *resp, size_t len, mt_psc_shard_ckpt_t *o) {
    Monolith__V1__SnapshotResponse *r = monolith__v1__snapshot_response__unpack(NULL, len, resp);
    if (!r) return MT_CORRUPT;
    if (r->meta) o->examples_applied = r->meta->examples_applied;
    monolith__v1__snapshot_response__free_unpacked(r, NULL);
    return MT_OK;
}

static mt_err_t take_restore(const uint8_t *resp, size_t len, mt_psc_shard_ckpt_t *o) {
    Monolith__V1__RestoreResponse *r = monolith__v1__restore_response__unpack(NULL, len, resp);
    if (!r) return MT_CORRUPT;
    o->incarnation = r->incarnation;
    if (r->meta) o->examples_applied = r->meta->examples_applied;
    monolith__v1__restore_response__free_unpacked(r, NULL);
    return MT_OK;
}

/* admin_all() of a request without fields (0 bytes) to every shard. */
static mt_err_t
empty_all(mt_psc_t *c, const char *path, int64_t deadline_ms, mt_psc_shard_ckpt_t *out,
          mt_err_t (*take)(const uint8_t *resp, size_t len, mt_psc_shard_ckpt_t *o)) {
    uint8_t **reqs = calloc(c->n, sizeof(*reqs));
    size_t *lens = calloc(c->n, sizeof(*lens));
    static uint8_t empty[1];
    mt_err_t err = MT_NOMEM;
    if (reqs && lens) {
        for (uint32_t s = 0; s < c->n; s++)
            reqs[s] = empty;
        err = admin_all(c, path, reqs, lens, deadline_ms, out, take);
    }
    free(reqs);
    free(lens);
    return err;
}

mt_err_t mt_psc_checkpoints(mt_psc_t *c, int64_t deadline_ms, mt_psc_shard_ckpt_t *out) {
    return empty_all(c, PATH("Checkpoints"), deadline_ms, out, take_list);
}

/* Copies KafkaOffset messages into a list. @returns MT_OK or MT_NOMEM. */
static mt_err_t offsets_from_pb(Monolith__V1__KafkaOffset *const *ko, size_t n,
                                mt_psc_offset_t **out, size_t *nout) {
    *nout = 0;
    *out = calloc(n ? n : 1, sizeof(**out));
    if (!*out) return MT_NOMEM;
    for (size_t j = 0; j < n; j++) {
        (*out)[j].topic = strdup(ko[j]->topic ? ko[j]->topic : "");
        if (!(*out)[j].topic) return MT_NOMEM;
        (*out)[j].partition = ko[j]->partition;
        (*out)[j].offset = ko[j]->offset;
        *nout = j + 1;
    }
    return MT_OK;
}

static mt_err_t take_marks(const uint8_t *resp, size_t len, mt_psc_shard_ckpt_t *o) {
    Monolith__V1__StatsResponse *r = monolith__v1__stats_response__unpack(NULL, len, resp);
    if (!r) return MT_CORRUPT;
    o->incarnation = r->incarnation;
    o->examples_applied = r->examples_applied;
    o->epoch = r->epoch;
    Monolith__V1__KafkaOffset **lists[4] = {r->marks, r->dense_marks, r->durable_marks,
                                            r->durable_dense_marks};
    size_t ns[4] = {r->n_marks, r->n_dense_marks, r->n_durable_marks, r->n_durable_dense_marks};
    mt_err_t err = MT_OK;
    for (int k = 0; k < 4 && !err; k++)
        err = offsets_from_pb(lists[k], ns[k], &o->marks[k], &o->nmarks[k]);
    monolith__v1__stats_response__free_unpacked(r, NULL);
    return err;
}

mt_err_t mt_psc_marks(mt_psc_t *c, int64_t deadline_ms, mt_psc_shard_ckpt_t *out) {
    return empty_all(c, PATH("Stats"), deadline_ms, out, take_marks);
}

mt_err_t mt_psc_snapshot_all(mt_psc_t *c, const char *token, uint64_t checkpoint_id,
                             const uint64_t *expect_incarnation, const mt_psc_offset_t *offsets,
                             size_t noffsets, int64_t deadline_ms, mt_psc_shard_ckpt_t *out) {
    uint8_t **reqs = calloc(c->n, sizeof(*reqs));
    size_t *lens = calloc(c->n, sizeof(*lens));
    Monolith__V1__KafkaOffset *ko = calloc(noffsets ? noffsets : 1, sizeof(*ko));
    Monolith__V1__KafkaOffset **kop = calloc(noffsets ? noffsets : 1, sizeof(*kop));
    mt_err_t err = MT_NOMEM;
    if (!reqs || !lens || !ko || !kop) goto out;
    for (size_t i = 0; i < noffsets; i++) {
        monolith__v1__kafka_offset__init(&ko[i]);
        ko[i].topic = offsets[i].topic;
        ko[i].partition = offsets[i].partition;
        ko[i].offset = offsets[i].offset;
        kop[i] = &ko[i];
    }
    for (uint32_t s = 0; s < c->n; s++) {
        Monolith__V1__SnapshotRequest r = MONOLITH__V1__SNAPSHOT_REQUEST__INIT;
        r.token = (char *)(token ? token : "");
        r.checkpoint_id = checkpoint_id;
        r.consistent = 1;
        r.n_offsets = noffsets;
        r.offsets = kop;
        r.expect_incarnation = expect_incarnation ? expect_incarnation[s] : 0;
        r.epoch = atomic_load(&c->epoch);
        lens[s] = monolith__v1__snapshot_request__get_packed_size(&r);
        if (!(reqs[s] = malloc(lens[s] ? lens[s] : 1))) goto out;
        monolith__v1__snapshot_request__pack(&r, reqs[s]);
    }
    err = admin_all(c, PATH("Snapshot"), reqs, lens, deadline_ms, out, take_snapshot);
out:
    for (uint32_t s = 0; reqs && s < c->n; s++)
        free(reqs[s]);
    free(reqs);
    free(lens);
    free(ko);
    free(kop);
    return err;
}

mt_err_t mt_psc_restore_all(mt_psc_t *c, const char *token, uint64_t checkpoint_id,
                            int64_t deadline_ms, mt_psc_shard_ckpt_t *out) {
    Monolith__V1__RestoreRequest r = MONOLITH__V1__RESTORE_REQUEST__INIT;
    r.token = (char *)(token ? token : "");
    r.checkpoint_id = checkpoint_id;
    r.epoch = atomic_load(&c->epoch);
    size_t len = monolith__v1__restore_request__get_packed_size(&r);
    uint8_t *buf = malloc(len ? len : 1);
    uint8_t **reqs = calloc(c->n, sizeof(*reqs));
    size_t *lens = calloc(c->n, sizeof(*lens));
    mt_err_t err = MT_NOMEM;
    if (buf && reqs && lens) {
        monolith__v1__restore_request__pack(&r, buf);
        for (uint32_t s = 0; s < c->n; s++) {
            reqs[s] = buf;
            lens[s] = len;
        }
        err = admin_all(c, PATH("Restore"), reqs, lens, deadline_ms, out, take_restore);
    }
    free(buf);
    free(reqs);
    free(lens);
    return err;
}
