/*
 * peers.c - sharded serving's peers: discovery, the route, and the reads (peers.h,
 * docs/serving.md "Sharded serving").
 *
 * File layout: types; the route (build, publish, acquire, release); discovery; fetch;
 * metrics; lifecycle.
 *
 * Invariants:
 *  - a published route is never modified: a change builds a new one, swapped in under
 *    route_lock; the holder of the last reference frees the old one;
 *  - peer_t.synced and peer_t.up are the last discovery answer, written under state_lock
 *    (by the discovery thread, and by a fetch that marks a failed peer down);
 *  - in a route, plan[r * num_shards + s] is -1 for a shard held here, -2 for a shard no peer
 *    holds synced, else the index of the peer that answers shard s under rotation r.
 */
#include "peers.h"
#include "sv_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "monolith/v1/ps.pb-c.h"
#include "monolith/v1/serving.pb-c.h"
#include "mt/clock.h"
#include "mt/log.h"
#include "mt/route.h"

#define WHO         "serving"
#define LOOKUP_PATH "/monolith.v1.Serving/Lookup"
#define SHARDS_PATH "/monolith.v1.Serving/Shards"
#define MAX_PLANS   16 /* rotations kept: enough to spread the load over a group's replicas */
#define HELD        (-1)
#define NO_PEER     (-2)

/* ============================== types ============================== */

typedef struct route {
    uint32_t refs; /* route_lock */
    uint32_t nplans;
    uint32_t uncovered; /* shards not held here that no peer holds synced */
    int32_t *plan;      /* [nplans * num_shards] */
} route_t;

typedef struct peer {
    char *addr;
    mt_rpc_channel_t *ch;
    uint8_t *synced; /* [num_shards] the shards it holds synced (state_lock) */
    int up;          /* answered the last round, or since (state_lock) */
    int told;        /* a wrong number of shards was logged */
    _Atomic uint64_t calls, failures;
    atomic_int up_gauge; /* up, for metrics without the lock */
} peer_t;

struct sv_peers {
    uint32_t n, num_shards, timeout_ms, refresh_ms;
    uint8_t *held;
    peer_t *peers;
    void (*on_covered)(void *ud);
    void *ud;

    pthread_mutex_t state_lock;
    pthread_mutex_t route_lock;
    route_t *route;
    _Atomic uint64_t rr; /* the next request's rotation */

    pthread_mutex_t stop_lock;
    pthread_cond_t stop_cond;
    int stopping, started;
    pthread_t thread;
};

struct sv_fetch_ws {
    size_t cap_occ, cap_uniq, cap_map, cap_req;
    uint32_t *occ;         /* [occurrences] uniq index, or UINT32_MAX: held here */
    uint64_t *uniq;        /* [uniq] the distinct remote ids */
    int32_t *uniq_peer;    /* [uniq] peer index, or NO_PEER */
    uint32_t *uniq_dim;    /* [uniq] */
    uint32_t *uniq_pos;    /* [uniq] position in by_peer */
    uint32_t *map;         /* [cap_map] open addressing: uniq index + 1, 0 = empty */
    uint64_t *by_peer;     /* [uniq] ids grouped by peer */
    size_t *val_off;       /* [uniq] offset of the id's values in its peer's reply */
    uint8_t *req;          /* packed requests, one after the other */
    uint32_t *cnt, *start; /* [npeers] */
    size_t *req_off;       /* [npeers] */
    size_t *nvals;         /* [npeers] values its reply must carry */
    size_t npeers;
    mt_rpc_batch_call_t *calls;          /* [npeers] */
    Monolith__V1__LookupResponse **resp; /* [npeers] */
};

/* ============================== the route ============================== */

static void route_free(route_t *r) {
    if (!r) return;
    free(r->plan);
    free(r);
}

static route_t *route_acquire(sv_peers_t *p) {
    pthread_mutex_lock(&p->route_lock);
    route_t *r = p->route;
    if (r) r->refs++;
    pthread_mutex_unlock(&p->route_lock);
    return r;
}

static void route_release(sv_peers_t *p, route_t *r) {
    if (!r) return;
    pthread_mutex_lock(&p->route_lock);
    uint32_t left = --r->refs;
    pthread_mutex_unlock(&p->route_lock);
    if (left == 0) route_free(r);
}

/* Builds the route from the peers' answers (state_lock held). For each rotation r: greedy
 * cover of the shards not held here, the peer covering most of the still uncovered shards
 * first, ties to the first in rotation order. NULL: out of memory. */
static route_t *route_build(sv_peers_t *p) {
    uint32_t S = p->num_shards, up = 0;
    for (uint32_t j = 0; j < p->n; j++)
        up += p->peers[j].up != 0;
    route_t *r = calloc(1, sizeof(*r));
    if (!r) return NULL;
    r->nplans = up == 0 ? 1 : up < MAX_PLANS ? up : MAX_PLANS;
    r->plan = malloc((size_t)r->nplans * S * sizeof(int32_t));
    uint8_t *need = malloc(S);
    if (!r->plan || !need) {
        free(need);
        route_free(r);
        return NULL;
    }
    for (uint32_t k = 0; k < r->nplans; k++) {
        int32_t *plan = r->plan + (size_t)k * S;
        uint32_t left = 0;
        for (uint32_t s = 0; s < S; s++) {
            plan[s] = p->held[s] ? HELD : NO_PEER;
            need[s] = !p->held[s];
            left += need[s];
        }
        while (left) {
            int32_t best = -1;
            uint32_t best_n = 0;
            for (uint32_t i = 0; i < p->n; i++) {
                uint32_t j = (k + i) % p->n;
                if (!p->peers[j].up) continue;
                uint32_t c = 0;
                for (uint32_t s = 0; s < S; s++)
                    c += need[s] && p->peers[j].synced[s];
                if (c > best_n) {
                    best_n = c;
                    best = (int32_t)j;
                }
            }
            if (best < 0) break;
            for (uint32_t s = 0; s < S; s++)
                if (need[s] && p->peers[best].synced[s]) {
                    plan[s] = best;
                    need[s] = 0;
                    left--;
                }
        }
        if (k == 0) r->uncovered = left;
    }
    free(need);
    return r;
}

/* Rebuilds and publishes the route (state_lock held). @returns its uncovered count, or
 * UINT32_MAX when out of memory (the old route stays). */
static uint32_t route_publish(sv_peers_t *p) {
    route_t *r = route_build(p);
    if (!r) return UINT32_MAX;
    r->refs = 1;
    pthread_mutex_lock(&p->route_lock);
    route_t *old = p->route;
    p->route = r;
    pthread_mutex_unlock(&p->route_lock);
    route_release(p, old);
    return r->uncovered;
}

uint32_t sv_peers_uncovered(sv_peers_t *p) {
    route_t *r = route_acquire(p);
    uint32_t u = r ? r->uncovered : 0;
    route_release(p, r);
    return u;
}

/* A fetch saw peer j fail: out of the route until a discovery round finds it again. */
static void mark_down(sv_peers_t *p, uint32_t j) {
    pthread_mutex_lock(&p->state_lock);
    if (p->peers[j].up) {
        p->peers[j].up = 0;
        atomic_store(&p->peers[j].up_gauge, 0);
        route_publish(p);
        mt_log(MT_LOG_WARN, WHO,
               "peer %s failed a Lookup: left out of the route until it answers again",
               p->peers[j].addr);
    }
    pthread_mutex_unlock(&p->state_lock);
}

/* ============================== discovery ============================== */

/* One round: Shards from every peer in parallel, the answers recorded, the route rebuilt. */
static void discover(sv_peers_t *p) {
    Monolith__V1__ShardsRequest rq = MONOLITH__V1__SHARDS_REQUEST__INIT;
    uint8_t req[8];
    size_t rlen = monolith__v1__shards_request__pack(&rq, req);
    mt_rpc_batch_call_t *calls = calloc(p->n, sizeof(*calls));
    if (!calls) return;
    for (uint32_t j = 0; j < p->n; j++)
        calls[j] = (mt_rpc_batch_call_t){
            .ch = p->peers[j].ch, .path = SHARDS_PATH, .req = req, .len = rlen};
    /* generous: a peer slow to say what it holds is not down (a slow Lookup is what the
     * fetch deadline judges) */
    uint32_t deadline = p->timeout_ms > 2000 ? p->timeout_ms : 2000;
    mt_err_t err = mt_rpc_call_many(calls, p->n, deadline);
    pthread_mutex_lock(&p->state_lock);
    for (uint32_t j = 0; j < p->n; j++) {
        peer_t *pe = &p->peers[j];
        int was = pe->up;
        Monolith__V1__ShardsResponse *a = NULL;
        if (!err && calls[j].st.code == MT_RPC_OK)
            a = monolith__v1__shards_response__unpack(NULL, calls[j].resp_len, calls[j].resp);
        memset(pe->synced, 0, p->num_shards);
        pe->up = 0;
        if (a && a->num_shards != p->num_shards) {
            if (!pe->told)
                mt_log(MT_LOG_ERROR, WHO,
                       "peer %s has %u shards, this node %u: left out (the fleet's "
                       "cluster.ps differ)",
                       pe->addr, a->num_shards, p->num_shards);
            pe->told = 1;
        } else if (a) {
            pe->told = 0;
            pe->up = 1;
            for (size_t i = 0; i < a->n_synced; i++)
                if (a->synced[i] < p->num_shards) pe->synced[a->synced[i]] = 1;
        }
        if (was != pe->up)
            mt_log(pe->up ? MT_LOG_INFO : MT_LOG_WARN, WHO, "peer %s %s", pe->addr,
                   pe->up ? "answers" : "does not answer: left out of the route");
        atomic_store(&pe->up_gauge, pe->up);
        if (a) monolith__v1__shards_response__free_unpacked(a, NULL);
        free(calls[j].resp);
    }
    uint32_t uncovered = route_publish(p);
    pthread_mutex_unlock(&p->state_lock);
    free(calls);
    if (uncovered == 0 && p->on_covered) p->on_covered(p->ud);
}

static int sleep_until(sv_peers_t *p, double deadline_s) {
    return sv_sleep_until(&p->stop_lock, &p->stop_cond, &p->stopping, deadline_s);
}

static void *discovery_main(void *arg) {
    sv_peers_t *p = arg;
    double next = mt_mono_s();
    while (!sleep_until(p, next)) {
        discover(p);
        next = mt_mono_s() + p->refresh_ms / 1000.0;
    }
    return NULL;
}

/* ============================== fetch ============================== */

void sv_fetch_ws_free(sv_fetch_ws_t *w) {
    if (!w) return;
    free(w->occ);
    free(w->uniq);
    free(w->uniq_peer);
    free(w->uniq_dim);
    free(w->uniq_pos);
    free(w->map);
    free(w->by_peer);
    free(w->val_off);
    free(w->req);
    free(w->cnt);
    free(w->start);
    free(w->req_off);
    free(w->nvals);
    free(w->calls);
    free(w->resp);
    free(w);
}

static int ws_reserve(sv_fetch_ws_t *w, size_t nocc, size_t npeers) {
    if (nocc > w->cap_occ) {
        if (sv_grow((void **)&w->occ, nocc, sizeof(uint32_t)) ||
            sv_grow((void **)&w->uniq, nocc, sizeof(uint64_t)) ||
            sv_grow((void **)&w->uniq_peer, nocc, sizeof(int32_t)) ||
            sv_grow((void **)&w->uniq_dim, nocc, sizeof(uint32_t)) ||
            sv_grow((void **)&w->uniq_pos, nocc, sizeof(uint32_t)) ||
            sv_grow((void **)&w->by_peer, nocc, sizeof(uint64_t)) ||
            sv_grow((void **)&w->val_off, nocc, sizeof(size_t)))
            return -1;
        w->cap_occ = nocc;
    }
    size_t m = 16;
    while (m < 2 * nocc)
        m *= 2;
    if (m > w->cap_map) {
        if (sv_grow((void **)&w->map, m, sizeof(uint32_t))) return -1;
        w->cap_map = m;
    }
    if (npeers > w->npeers) {
        if (sv_grow((void **)&w->cnt, npeers, sizeof(uint32_t)) ||
            sv_grow((void **)&w->start, npeers, sizeof(uint32_t)) ||
            sv_grow((void **)&w->req_off, npeers, sizeof(size_t)) ||
            sv_grow((void **)&w->nvals, npeers, sizeof(size_t)) ||
            sv_grow((void **)&w->calls, npeers, sizeof(mt_rpc_batch_call_t)) ||
            sv_grow((void **)&w->resp, npeers, sizeof(*w->resp)))
            return -1;
        w->npeers = npeers;
    }
    return 0;
}

/* The distinct remote id @p id: its uniq index (added when new). */
static uint32_t uniq_of(sv_fetch_ws_t *w, size_t *nuniq, uint64_t id, int32_t peer, uint32_t dim) {
    size_t mask = w->cap_map - 1, h = (size_t)((id * 0x9E3779B97F4A7C15ull) >> 20) & mask;
    while (w->map[h]) {
        uint32_t u = w->map[h] - 1;
        if (w->uniq[u] == id) return u;
        h = (h + 1) & mask;
    }
    uint32_t u = (uint32_t)(*nuniq)++;
    w->map[h] = u + 1;
    w->uniq[u] = id;
    w->uniq_peer[u] = peer;
    w->uniq_dim[u] = dim;
    return u;
}

/* The caller's work to run while the Lookups are in flight, once (see sv_peers_fetch). */
typedef struct meanwhile {
    void (*fn)(void *ud);
    void *ud;
    int done;
} meanwhile_t;

static void meanwhile_run(void *arg) {
    meanwhile_t *m = arg;
    if (m->done || !m->fn) return;
    m->done = 1;
    m->fn(m->ud);
}

static mt_err_t fetch(sv_peers_t *p, sv_fetch_ws_t **wsp, const sv_fetch_list_t *lists,
                      size_t nlists, int zeros, uint64_t *zero_fids, meanwhile_t *mw, char *why,
                      size_t whylen);

mt_err_t sv_peers_fetch(sv_peers_t *p, sv_fetch_ws_t **wsp, const sv_fetch_list_t *lists,
                        size_t nlists, int zeros, uint64_t *zero_fids, void (*meanwhile)(void *),
                        void *ud, char *why, size_t whylen) {
    meanwhile_t mw = {meanwhile, ud, 0};
    mt_err_t err = fetch(p, wsp, lists, nlists, zeros, zero_fids, &mw, why, whylen);
    meanwhile_run(&mw); /* a path that sent nothing: now (nothing was written yet) */
    return err;
}

static mt_err_t fetch(sv_peers_t *p, sv_fetch_ws_t **wsp, const sv_fetch_list_t *lists,
                      size_t nlists, int zeros, uint64_t *zero_fids, meanwhile_t *mw, char *why,
                      size_t whylen) {
    if (!*wsp && !(*wsp = calloc(1, sizeof(sv_fetch_ws_t)))) return MT_NOMEM;
    sv_fetch_ws_t *w = *wsp;
    size_t nocc = 0;
    for (size_t l = 0; l < nlists; l++)
        nocc += lists[l].n;
    if (ws_reserve(w, nocc, p->n)) return MT_NOMEM;
    memset(w->map, 0, w->cap_map * sizeof(uint32_t));
    route_t *r = route_acquire(p);
    if (!r) return MT_NOMEM; /* created with a route: never */
    const int32_t *plan =
        r->plan + (size_t)(atomic_fetch_add(&p->rr, 1) % r->nplans) * p->num_shards;

    /* 1. the distinct remote ids, each with its peer */
    size_t nuniq = 0, o = 0;
    int32_t no_peer_shard = -1;
    for (size_t l = 0; l < nlists; l++)
        for (size_t i = 0; i < lists[l].n; i++, o++) {
            uint64_t id = lists[l].ids[i];
            uint32_t s = mt_route_shard_of(id, p->num_shards);
            int32_t peer = plan[s];
            if (peer == HELD) {
                w->occ[o] = UINT32_MAX;
                continue;
            }
            if (peer == NO_PEER) no_peer_shard = (int32_t)s;
            const size_t *offs = lists[l].offs;
            uint32_t dim = offs ? (uint32_t)(offs[i + 1] - offs[i]) : lists[l].dim;
            w->occ[o] = uniq_of(w, &nuniq, id, peer, dim);
        }
    route_release(p, r);
    mt_err_t err = MT_OK;
    if (no_peer_shard >= 0 && !zeros) {
        mt_msgf(why, whylen, "no peer holds shard %d synced", no_peer_shard);
        return MT_UNAVAILABLE;
    }
    if (nuniq == 0) return MT_OK;

    /* 2. grouped by peer: positions, value offsets, one packed Lookup per peer */
    memset(w->cnt, 0, p->n * sizeof(uint32_t));
    for (size_t u = 0; u < nuniq; u++)
        if (w->uniq_peer[u] >= 0) w->cnt[w->uniq_peer[u]]++;
    uint32_t at = 0;
    for (uint32_t j = 0; j < p->n; j++) {
        w->start[j] = at;
        at += w->cnt[j];
        w->cnt[j] = 0;
    }
    for (size_t u = 0; u < nuniq; u++) {
        int32_t j = w->uniq_peer[u];
        if (j < 0) continue;
        uint32_t pos = w->start[j] + w->cnt[j]++;
        w->uniq_pos[u] = pos;
        w->by_peer[pos] = w->uniq[u];
        w->val_off[pos] = w->uniq_dim[u]; /* the dim for now: offsets below */
    }
    size_t req_bytes = 0, ncalls = 0;
    for (uint32_t j = 0; j < p->n; j++) {
        size_t off = 0;
        for (uint32_t k = w->start[j]; k < w->start[j] + w->cnt[j]; k++) {
            size_t d = w->val_off[k];
            w->val_off[k] = off;
            off += d;
        }
        w->nvals[j] = off;
        w->req_off[j] = req_bytes;
        if (w->cnt[j]) req_bytes += 16 + 8 * (size_t)w->cnt[j];
    }
    if (req_bytes > w->cap_req) {
        if (sv_grow((void **)&w->req, req_bytes, 1)) return MT_NOMEM;
        w->cap_req = req_bytes;
    }
    uint32_t call_peer[1024];
    for (uint32_t j = 0; j < p->n; j++) {
        w->resp[j] = NULL;
        if (!w->cnt[j]) continue;
        Monolith__V1__LookupRequest rq = MONOLITH__V1__LOOKUP_REQUEST__INIT;
        rq.n_fids = w->cnt[j];
        rq.fids = w->by_peer + w->start[j];
        size_t len = monolith__v1__lookup_request__pack(&rq, w->req + w->req_off[j]);
        call_peer[ncalls] = j;
        w->calls[ncalls++] = (mt_rpc_batch_call_t){
            .ch = p->peers[j].ch, .path = LOOKUP_PATH, .req = w->req + w->req_off[j], .len = len};
    }

    /* 3. the calls, in parallel */
    err = mt_rpc_call_many_overlap(w->calls, ncalls, p->timeout_ms, meanwhile_run, mw);
    if (err) { /* out of memory before anything was sent */
        for (size_t c = 0; c < ncalls; c++)
            free(w->calls[c].resp);
        return err;
    }
    int failed_peer = -1;
    char first[200] = "";
    for (size_t c = 0; c < ncalls; c++) {
        uint32_t j = call_peer[c];
        peer_t *pe = &p->peers[j];
        atomic_fetch_add(&pe->calls, 1);
        const char *bad = NULL;
        if (w->calls[c].st.code != MT_RPC_OK) {
            bad = w->calls[c].st.message;
        } else {
            Monolith__V1__LookupResponse *a =
                monolith__v1__lookup_response__unpack(NULL, w->calls[c].resp_len, w->calls[c].resp);
            if (!a)
                bad = "malformed LookupResponse";
            else if (a->n_values != w->nvals[j] || a->found.len != w->cnt[j])
                bad = "LookupResponse of another size than asked";
            if (bad && a) {
                monolith__v1__lookup_response__free_unpacked(a, NULL);
                a = NULL;
            }
            w->resp[j] = a;
        }
        free(w->calls[c].resp);
        w->calls[c].resp = NULL;
        if (bad) {
            atomic_fetch_add(&pe->failures, 1);
            if (failed_peer < 0) {
                failed_peer = (int)j;
                mt_msgf(first, sizeof(first), "%s (status %d)", bad, w->calls[c].st.code);
            }
            /* gone, or it says it does not hold the shard synced: out of the route until
             * discovery finds it again; slow or overloaded (DEADLINE_EXCEEDED,
             * RESOURCE_EXHAUSTED): this request's failure only */
            int code = w->calls[c].st.code;
            if (code != MT_RPC_DEADLINE_EXCEEDED && code != MT_RPC_RESOURCE_EXHAUSTED)
                mark_down(p, j);
        }
    }
    if (failed_peer >= 0 && !zeros) {
        mt_msgf(why, whylen, "peer %s failed: %s", p->peers[failed_peer].addr, first);
        err = MT_UNAVAILABLE;
        goto out;
    }

    /* 4. scatter the values back to every occurrence (after the caller's own writes) */
    meanwhile_run(mw);
    o = 0;
    uint64_t zeroed = 0;
    for (size_t l = 0; l < nlists; l++) {
        const size_t *offs = lists[l].offs;
        for (size_t i = 0; i < lists[l].n; i++, o++) {
            uint32_t u = w->occ[o];
            if (u == UINT32_MAX) continue;
            uint32_t d = offs ? (uint32_t)(offs[i + 1] - offs[i]) : lists[l].dim;
            float *dst = lists[l].out + (offs ? offs[i] : i * d);
            int32_t j = w->uniq_peer[u];
            const Monolith__V1__LookupResponse *a = j >= 0 ? w->resp[j] : NULL;
            if (!a) {
                memset(dst, 0, d * sizeof(float));
                zeroed++;
                continue;
            }
            memcpy(dst, a->values + w->val_off[w->uniq_pos[u]], d * sizeof(float));
        }
    }
    if (zero_fids) *zero_fids += zeroed;
out:
    for (size_t c = 0; c < ncalls; c++) {
        uint32_t j = call_peer[c];
        if (w->resp[j]) monolith__v1__lookup_response__free_unpacked(w->resp[j], NULL);
        w->resp[j] = NULL;
    }
    return err;
}

/* ============================== metrics ============================== */

void sv_peers_render_metrics(sv_peers_t *p, mt_strbuf_t *b) {
    mt_strbuf_printf(b, "# HELP monolith_serving_peer_up 1 if the peer answered the last "
                        "discovery round (and no Lookup to it failed since).\n"
                        "# TYPE monolith_serving_peer_up gauge\n");
    for (uint32_t j = 0; j < p->n; j++)
        mt_strbuf_printf(b, "monolith_serving_peer_up{peer=\"%s\"} %d\n", p->peers[j].addr,
                         atomic_load(&p->peers[j].up_gauge));
    mt_strbuf_printf(b, "# HELP monolith_serving_peer_lookups_total Lookups sent to the peer by "
                        "Predicts.\n# TYPE monolith_serving_peer_lookups_total counter\n");
    for (uint32_t j = 0; j < p->n; j++)
        mt_strbuf_printf(b, "monolith_serving_peer_lookups_total{peer=\"%s\"} %llu\n",
                         p->peers[j].addr, (unsigned long long)atomic_load(&p->peers[j].calls));
    mt_strbuf_printf(b, "# HELP monolith_serving_peer_failures_total Peer Lookups that missed the "
                        "deadline, broke or were refused.\n"
                        "# TYPE monolith_serving_peer_failures_total counter\n");
    for (uint32_t j = 0; j < p->n; j++)
        mt_strbuf_printf(b, "monolith_serving_peer_failures_total{peer=\"%s\"} %llu\n",
                         p->peers[j].addr, (unsigned long long)atomic_load(&p->peers[j].failures));
    mt_strbuf_printf(b,
                     "# HELP monolith_serving_remote_shards_uncovered Shards not held here that "
                     "no peer holds synced.\n"
                     "# TYPE monolith_serving_remote_shards_uncovered gauge\n"
                     "monolith_serving_remote_shards_uncovered %u\n",
                     sv_peers_uncovered(p));
}

/* ============================== lifecycle ============================== */

mt_err_t sv_peers_create(const sv_peers_config_t *cfg, sv_peers_t **out) {
    if (cfg->n > 1024) return MT_CONFIG;
    sv_peers_t *p = calloc(1, sizeof(*p));
    if (!p) return MT_NOMEM;
    p->n = cfg->n;
    p->num_shards = cfg->num_shards;
    p->timeout_ms = cfg->timeout_ms;
    p->refresh_ms = cfg->refresh_ms;
    p->on_covered = cfg->on_covered;
    p->ud = cfg->ud;
    pthread_mutex_init(&p->state_lock, NULL);
    pthread_mutex_init(&p->route_lock, NULL);
    pthread_mutex_init(&p->stop_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->stop_cond, &ca);
    pthread_condattr_destroy(&ca);
    mt_err_t err = MT_NOMEM;
    p->held = malloc(cfg->num_shards);
    p->peers = calloc(cfg->n ? cfg->n : 1, sizeof(peer_t));
    if (!p->held || !p->peers) goto fail;
    memcpy(p->held, cfg->held, cfg->num_shards);
    mt_rpc_client_config_t cc;
    mt_rpc_client_config_init(&cc);
    cc.retries = 0; /* a slow or gone peer is what the deadline is for */
    cc.tls = cfg->tls;
    for (uint32_t j = 0; j < cfg->n; j++) {
        peer_t *pe = &p->peers[j];
        pe->addr = strdup(cfg->addrs[j]);
        pe->synced = calloc(cfg->num_shards, 1);
        if (!pe->addr || !pe->synced) goto fail;
        if ((err = mt_rpc_channel_create(cfg->addrs[j], &cc, &pe->ch)) != MT_OK) goto fail;
        err = MT_NOMEM;
    }
    pthread_mutex_lock(&p->state_lock);
    uint32_t u = route_publish(p);
    pthread_mutex_unlock(&p->state_lock);
    if (u == UINT32_MAX) goto fail;
    *out = p;
    return MT_OK;
fail:
    sv_peers_destroy(p);
    return err;
}

mt_err_t sv_peers_start(sv_peers_t *p) {
    pthread_mutex_lock(&p->stop_lock);
    p->stopping = 0;
    int ok = pthread_create(&p->thread, NULL, discovery_main, p) == 0;
    p->started = ok;
    pthread_mutex_unlock(&p->stop_lock);
    return ok ? MT_OK : MT_NOMEM;
}

void sv_peers_stop(sv_peers_t *p) {
    if (!p) return;
    pthread_mutex_lock(&p->stop_lock);
    int was = p->started;
    p->started = 0;
    p->stopping = 1;
    pthread_cond_broadcast(&p->stop_cond);
    pthread_mutex_unlock(&p->stop_lock);
    if (was) pthread_join(p->thread, NULL);
}

void sv_peers_destroy(sv_peers_t *p) {
    if (!p) return;
    sv_peers_stop(p);
    if (p->peers)
        for (uint32_t j = 0; j < p->n; j++) {
            mt_rpc_channel_destroy(p->peers[j].ch);
            free(p->peers[j].addr);
            free(p->peers[j].synced);
        }
    free(p->peers);
    free(p->held);
    route_free(p->route);
    pthread_mutex_destroy(&p->state_lock);
    pthread_mutex_destroy(&p->route_lock);
    pthread_mutex_destroy(&p->stop_lock);
    pthread_cond_destroy(&p->stop_cond);
    free(p);
}
