/*
 * test_ps_cluster.c - three PS shards served over gRPC on 127.0.0.1 (in this process, each
 * with its own rpc server on a free port), driven through the client library and through
 * raw calls:
 *   - training lookups and gradient pushes through mt_psc_* match an in-process table fed
 *     the same operations (routing, dedup, fan-out and merge are exact);
 *   - bad input (malformed bytes, unknown slots, ids of another shard, gradient lengths,
 *     NaN, oversized batches, empty requests) gets the right status and changes nothing,
 *     and the shard keeps serving;
 *   - Sync streams rebuild a replica equal to the shard, incrementally and in full;
 *   - dense parameters: PushDense creates and updates, PullDense answers by version;
 *   - Health answers SERVING.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "monolith/v1/ps.pb-c.h"
#include "mt/ps.h"
#include "mt/route.h"
#include "mt/psclient.h"
#include "mt/rpc.h"
#include "mt/table.h"
#include "testutil_ps.h"

#define NSHARDS 3
#define PATH(m) "/monolith.v1.ParameterServer/" m

typedef struct cluster {
    mt_table_slot_config_t slots[2];
    mt_ps_t *ps[NSHARDS];
    mt_rpc_server_t *srv[NSHARDS];
    char addr[NSHARDS][TU_PS_ADDR_LEN];
    mt_psc_t *client;
    mt_table_t *ref; /* reference: one table fed the same operations */
} cluster_t;

static void slots_init(mt_table_slot_config_t *s) {
    mt_table_slot_config_init(&s[0], 1, 8);
    s[0].opt = MT_OPT_ADAGRAD;
    s[0].init = MT_INIT_UNIFORM;
    s[0].init_seed = 17;
    mt_table_slot_config_init(&s[1], 2, 4);
    s[1].opt = MT_OPT_SGD;
    s[1].lr = 0.5f;
    s[1].min_count = 2;
}

static void cluster_start(cluster_t *c, uint32_t max_batch) {
    memset(c, 0, sizeof(*c));
    slots_init(c->slots);
    for (uint32_t i = 0; i < NSHARDS; i++) {
        mt_ps_config_t pc;
        tu_ps_config(&pc, i, NSHARDS, c->slots, 2);
        if (max_batch) pc.max_batch_fids = max_batch;
        cr_assert_eq(mt_ps_create(&pc, NULL, &c->ps[i]), MT_OK);
        c->srv[i] = tu_ps_serve(c->ps[i], 2, 8u << 20, NULL, c->addr[i]);
    }
    c->client = tu_psc_connect(c->addr, NSHARDS);
    mt_table_config_t tc;
    mt_table_config_init(&tc);
    tc.slots = c->slots;
    tc.nslots = 2;
    tc.shards_log2 = 2;
    tc.filter_bytes = 1 << 16;
    cr_assert_eq(mt_table_create(&tc, &c->ref), MT_OK);
}

static void cluster_stop(cluster_t *c) {
    mt_psc_destroy(c->client);
    for (int i = 0; i < NSHARDS; i++) {
        mt_rpc_server_destroy(c->srv[i]);
        mt_ps_destroy(c->ps[i]);
    }
    mt_table_destroy(c->ref);
}

static uint64_t rnd(uint64_t *x) {
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 11;
}

static uint32_t dim_of(uint64_t fid) {
    return MT_FID_SLOT(fid) == 1 ? 8 : 4;
}

Test(ps_cluster, client_matches_in_process_table) {
    cluster_t c;
    cluster_start(&c, 0);
    uint64_t x = 7;
    enum { B = 300 };
    uint64_t fids[B];
    float out[B * 8], ref[B * 8], grads[B * 8];
    uint8_t found[B], rfound[B];
    for (int round = 0; round < 40; round++) {
        /* Unique ids per batch (duplicates are tested below), from a small pool so that
         * ids repeat across rounds and pass the slot-2 filter. */
        size_t n = 0, nf = 0;
        while (n < B) {
            uint64_t f = MT_FID_MAKE(1 + rnd(&x) % 2, rnd(&x) % 2000);
            int dup = 0;
            for (size_t k = 0; k < n && !dup; k++)
                dup = fids[k] == f;
            if (dup) continue;
            fids[n++] = f;
            nf += dim_of(f);
        }
        mt_rpc_status_t st;
        cr_assert_eq(mt_psc_lookup(c.client, fids, n, 1, 1000 + round, out, nf, found, &st), MT_OK,
                     "%s", st.message);
        cr_assert_eq(
            mt_table_lookup(c.ref, fids, n, ref, nf, rfound, MT_TABLE_TRAIN, 1000 + round, NULL),
            MT_OK);
        cr_assert_eq(memcmp(found, rfound, n), 0, "found flags differ in round %d", round);
        cr_assert_eq(memcmp(out, ref, nf * sizeof(float)), 0, "embeddings differ in round %d",
                     round);
        for (size_t k = 0; k < nf; k++)
            grads[k] = (float)((int)(rnd(&x) % 200) - 100) / 64.0f;
        uint64_t applied = 0, missing = 0;
        cr_assert_eq(mt_psc_apply(c.client, fids, n, grads, nf, 1000 + round, round, 0, &applied,
                                  &missing, &st),
                     MT_OK, "%s", st.message);
        mt_table_op_stats_t os = {0};
        cr_assert_eq(mt_table_apply(c.ref, fids, n, grads, nf, 1000 + round, &os), MT_OK);
        cr_assert_eq(applied, os.found);
        cr_assert_eq(missing, os.missing);
    }
    /* Read-only lookups see the trained values. */
    size_t nf = 0;
    for (size_t i = 0; i < B; i++) {
        fids[i] = MT_FID_MAKE(1, i);
        nf += 8;
    }
    mt_rpc_status_t st;
    cr_assert_eq(mt_psc_lookup(c.client, fids, B, 0, 0, out, nf, found, &st), MT_OK);
    cr_assert_eq(mt_table_lookup(c.ref, fids, B, ref, nf, rfound, 0, 0, NULL), MT_OK);
    cr_assert_eq(memcmp(out, ref, nf * sizeof(float)), 0);
    /* Every shard holds only its own ids, and together they hold what the reference does. */
    uint64_t rows = 0;
    for (int i = 0; i < NSHARDS; i++) {
        mt_table_stats_t ts;
        mt_table_stats(mt_ps_table(c.ps[i]), &ts);
        cr_assert_gt(ts.rows, 0, "shard %d got nothing: routing is broken", i);
        rows += ts.rows;
    }
    mt_table_stats_t rs;
    mt_table_stats(c.ref, &rs);
    cr_assert_eq(rows, rs.rows);
    cluster_stop(&c);
}

Test(ps_cluster, duplicates_are_merged) {
    cluster_t c;
    cluster_start(&c, 0);
    /* Slot 2 is SGD lr 0.5, min_count 2: two training sightings admit (zeros init? no:
     * uniform init), then a pushed gradient of 1 + 3 for the same id moves it by -2. */
    uint64_t f = MT_FID_MAKE(2, 99), fids[3] = {f, MT_FID_MAKE(1, 5), f};
    float out[16], before[4], after[4], g[16];
    mt_rpc_status_t st;
    uint8_t found[3];
    cr_assert_eq(mt_psc_lookup(c.client, &f, 1, 1, 10, out, 4, found, &st), MT_OK);
    cr_assert_eq(found[0], 0, "first sighting must be filtered");
    cr_assert_eq(mt_psc_lookup(c.client, fids, 3, 0, 10, out, 16, found, &st), MT_OK);
    cr_assert(found[0] == 0 && found[2] == 0, "read-only lookups do not count");
    cr_assert_eq(mt_psc_lookup(c.client, &f, 1, 1, 11, before, 4, found, &st), MT_OK);
    cr_assert_eq(found[0], 1, "second training sighting admits");
    for (int i = 0; i < 16; i++)
        g[i] = 0.0f;
    for (int d = 0; d < 4; d++) {
        g[d] = 1.0f;
        g[12 + d] = 3.0f;
    }
    uint64_t applied = 0, missing = 0;
    cr_assert_eq(mt_psc_apply(c.client, fids, 3, g, 16, 12, 1, 0, &applied, &missing, &st), MT_OK);
    cr_assert_eq(applied + missing, 2, "duplicates are sent once");
    cr_assert_eq(mt_psc_lookup(c.client, &f, 1, 0, 0, after, 4, found, &st), MT_OK);
    for (int d = 0; d < 4; d++)
        cr_assert_float_eq(after[d], before[d] - 0.5f * 4.0f, 1e-6);
    /* The same id twice in a lookup gets the same values twice. */
    cr_assert_eq(mt_psc_lookup(c.client, fids, 3, 0, 0, out, 16, found, &st), MT_OK);
    cr_assert_eq(memcmp(out, out + 12, 4 * sizeof(float)), 0);
    cluster_stop(&c);
}

/* Raw call helper. */
static int raw(cluster_t *c, int shard, const char *path, const uint8_t *req, size_t len,
               mt_rpc_status_t *st, uint8_t **resp, size_t *rlen) {
    mt_rpc_channel_t *ch = mt_psc_channel(c->client, (uint32_t)shard);
    uint8_t *r = NULL;
    size_t rl = 0;
    mt_rpc_call(ch, path, req, len, 5000, &r, &rl, st);
    if (resp) {
        *resp = r;
        *rlen = rl;
    } else {
        free(r);
    }
    return st->code;
}

static uint64_t fid_of_shard(int shard, uint64_t start) {
    for (uint64_t v = start;; v++)
        if ((int)mt_route_shard_of(MT_FID_MAKE(1, v), NSHARDS) == shard) return MT_FID_MAKE(1, v);
}

Test(ps_cluster, bad_input_gets_the_right_status_and_changes_nothing) {
    cluster_t c;
    cluster_start(&c, 100);
    mt_rpc_status_t st;
    uint8_t garbage[64];
    for (int i = 0; i < 64; i++)
        garbage[i] = (uint8_t)(0xF7 ^ i * 37);
    cr_assert_eq(raw(&c, 0, PATH("Lookup"), garbage, sizeof(garbage), &st, NULL, NULL),
                 MT_RPC_INVALID_ARGUMENT);
    cr_assert(strstr(st.message, "malformed"), "%s", st.message);
    cr_assert_eq(raw(&c, 0, PATH("ApplyGradients"), garbage, 7, &st, NULL, NULL),
                 MT_RPC_INVALID_ARGUMENT);

    uint64_t mine = fid_of_shard(0, 1), other = fid_of_shard(1, 1);
    /* Unknown slot. */
    uint64_t bad_slot = MT_FID_MAKE(9, 1);
    Monolith__V1__LookupRequest lr = MONOLITH__V1__LOOKUP_REQUEST__INIT;
    lr.n_fids = 1;
    lr.fids = &bad_slot;
    lr.train = 1;
    uint8_t buf[4096];
    size_t len = monolith__v1__lookup_request__pack(&lr, buf);
    cr_assert_eq(raw(&c, 0, PATH("Lookup"), buf, len, &st, NULL, NULL), MT_RPC_INVALID_ARGUMENT);
    cr_assert(strstr(st.message, "slot 9"), "%s", st.message);
    /* An id of another shard. */
    lr.fids = &other;
    len = monolith__v1__lookup_request__pack(&lr, buf);
    cr_assert_eq(raw(&c, 0, PATH("Lookup"), buf, len, &st, NULL, NULL), MT_RPC_INVALID_ARGUMENT);
    cr_assert(strstr(st.message, "belongs to shard 1"), "%s", st.message);
    /* Oversized batch (limit 100). */
    uint64_t many[101];
    for (int i = 0; i < 101; i++)
        many[i] = mine;
    lr.n_fids = 101;
    lr.fids = many;
    len = monolith__v1__lookup_request__pack(&lr, buf);
    cr_assert_eq(raw(&c, 0, PATH("Lookup"), buf, len, &st, NULL, NULL), MT_RPC_RESOURCE_EXHAUSTED);
    /* Empty request: a valid, empty answer. */
    uint8_t *resp;
    size_t rlen;
    cr_assert_eq(raw(&c, 0, PATH("Lookup"), NULL, 0, &st, &resp, &rlen), MT_RPC_OK);
    free(resp);
    /* Gradient length mismatch and NaN. */
    float g[9];
    for (int i = 0; i < 9; i++)
        g[i] = 0.25f;
    Monolith__V1__ApplyGradientsRequest ar = MONOLITH__V1__APPLY_GRADIENTS_REQUEST__INIT;
    ar.n_fids = 1;
    ar.fids = &mine;
    ar.n_grads = 9;
    ar.grads = g;
    len = monolith__v1__apply_gradients_request__pack(&ar, buf);
    cr_assert_eq(raw(&c, 0, PATH("ApplyGradients"), buf, len, &st, NULL, NULL),
                 MT_RPC_INVALID_ARGUMENT);
    cr_assert(strstr(st.message, "9 floats"), "%s", st.message);
    ar.n_grads = 8;
    g[3] = NAN;
    len = monolith__v1__apply_gradients_request__pack(&ar, buf);
    cr_assert_eq(raw(&c, 0, PATH("ApplyGradients"), buf, len, &st, NULL, NULL),
                 MT_RPC_INVALID_ARGUMENT);
    cr_assert(strstr(st.message, "not finite"), "%s", st.message);
    /* Nothing changed: shard 0 has no row at all. */
    mt_table_stats_t ts;
    mt_table_stats(mt_ps_table(c.ps[0]), &ts);
    cr_assert_eq(ts.rows, 0);
    cr_assert_eq(ts.version, 0);
    /* Unknown method, then the shard still serves. */
    cr_assert_eq(raw(&c, 0, "/monolith.v1.ParameterServer/Nope", NULL, 0, &st, NULL, NULL),
                 MT_RPC_UNIMPLEMENTED);
    float out[8];
    uint8_t found;
    cr_assert_eq(mt_psc_lookup(c.client, &mine, 1, 1, 5, out, 8, &found, &st), MT_OK);
    cr_assert_eq(found, 1);
    /* While restoring, every method answers UNAVAILABLE and touches nothing. */
    mt_ps_set_restoring(c.ps[0], 1);
    cr_assert_eq(raw(&c, 0, PATH("Stats"), NULL, 0, &st, NULL, NULL), MT_RPC_UNAVAILABLE);
    cr_assert(strstr(st.message, "restoring"), "%s", st.message);
    cr_assert_eq(mt_ps_replace_table(c.ps[1], NULL), MT_INVALID, "only while restoring");
    mt_ps_set_restoring(c.ps[0], 0);
    cr_assert_eq(raw(&c, 0, PATH("Stats"), NULL, 0, &st, NULL, NULL), MT_RPC_OK);
    /* Admin call without a token configured but no snapshot hook: FAILED_PRECONDITION. */
    cr_assert_eq(raw(&c, 0, PATH("Snapshot"), NULL, 0, &st, NULL, NULL),
                 MT_RPC_FAILED_PRECONDITION);
    /* Health. */
    cr_assert_eq(raw(&c, 0, "/grpc.health.v1.Health/Check", NULL, 0, &st, &resp, &rlen), MT_RPC_OK);
    cr_assert_eq(rlen, 2);
    cr_assert(resp[0] == 0x08 && resp[1] == 0x01);
    free(resp);
    cluster_stop(&c);
}

/* Applies one Sync stream from shard i to replica; @returns the final status code. */
static int sync_into(cluster_t *c, int shard, mt_table_t **replica, const mt_table_config_t *tc,
                     uint64_t *since, uint64_t *inc, int *was_full) {
    Monolith__V1__SyncRequest sr = MONOLITH__V1__SYNC_REQUEST__INIT;
    sr.since_version = *since;
    sr.incarnation = *inc;
    sr.max_chunk_fids = 7;
    uint8_t buf[64];
    size_t len = monolith__v1__sync_request__pack(&sr, buf);
    mt_rpc_stream_t *s;
    cr_assert_eq(mt_rpc_stream_open(mt_psc_channel(c->client, (uint32_t)shard), PATH("Sync"), buf,
                                    len, 5000, &s),
                 MT_OK);
    uint8_t *msg;
    size_t ml;
    int first = 1, saw_last = 0;
    *was_full = 0;
    while (mt_rpc_stream_next(s, &msg, &ml) == MT_OK) {
        Monolith__V1__SyncChunk *ch = monolith__v1__sync_chunk__unpack(NULL, ml, msg);
        free(msg);
        cr_assert_not_null(ch);
        if (first && ch->full) {
            *was_full = 1;
            mt_table_destroy(*replica);
            cr_assert_eq(mt_table_create(tc, replica), MT_OK);
        }
        first = 0;
        size_t off = 0;
        for (size_t i = 0; i < ch->n_fids; i++) {
            uint32_t d = dim_of(ch->fids[i]);
            if (ch->deleted.data[i]) {
                mt_table_remove(*replica, &ch->fids[i], 1, NULL);
            } else {
                cr_assert_eq(
                    mt_table_assign(*replica, &ch->fids[i], 1, ch->values + off, d, 1, NULL),
                    MT_OK);
                off += d;
            }
        }
        cr_assert_eq(off, ch->n_values);
        *since = ch->upto_version;
        *inc = ch->incarnation;
        saw_last = ch->last;
        monolith__v1__sync_chunk__free_unpacked(ch, NULL);
    }
    mt_rpc_status_t st;
    mt_rpc_stream_close(s, &st);
    if (st.code == MT_RPC_OK) cr_assert(saw_last, "a complete stream ends with last = 1");
    return st.code;
}

Test(ps_cluster, sync_rebuilds_a_replica) {
    cluster_t c;
    cluster_start(&c, 0);
    mt_table_config_t tc;
    mt_table_config_init(&tc);
    tc.slots = c.slots;
    tc.nslots = 2;
    tc.shards_log2 = 1;
    tc.filter_bytes = 1 << 16;
    mt_table_t *replica = NULL;
    uint64_t since = 0, inc = 0, x = 3;
    int full;
    for (int round = 0; round < 12; round++) {
        enum { B = 200 };
        uint64_t fids[B];
        float out[B * 8], g[B * 8];
        size_t nf = 0;
        for (int i = 0; i < B; i++) {
            fids[i] = MT_FID_MAKE(1, rnd(&x) % 5000);
            nf += 8;
        }
        mt_rpc_status_t st;
        cr_assert_eq(mt_psc_lookup(c.client, fids, B, 1, 100, out, nf, NULL, &st), MT_OK);
        for (size_t k = 0; k < nf; k++)
            g[k] = 0.01f * (float)(k % 5);
        cr_assert_eq(mt_psc_apply(c.client, fids, B, g, nf, 100, 1, 0, NULL, NULL, &st), MT_OK);
        if (round == 6) { /* removals become deletions in the stream */
            uint64_t removed;
            mt_table_remove(mt_ps_table(c.ps[0]), fids, B, &removed);
        }
        cr_assert_eq(sync_into(&c, 0, &replica, &tc, &since, &inc, &full), MT_RPC_OK);
        cr_assert_eq(full, round == 0, "round %d: only the first sync is full", round);
        /* The replica equals shard 0: same rows, same embeddings. */
        mt_table_stats_t a, b;
        mt_table_stats(mt_ps_table(c.ps[0]), &a);
        mt_table_stats(replica, &b);
        cr_assert_eq(a.rows, b.rows, "round %d", round);
        for (uint64_t v = 0; v < 5000; v++) {
            uint64_t f = MT_FID_MAKE(1, v);
            float e1[8], e2[8];
            int r1 = mt_table_get_row(mt_ps_table(c.ps[0]), f, e1, NULL, 0, NULL, NULL, NULL);
            int r2 = mt_table_get_row(replica, f, e2, NULL, 0, NULL, NULL, NULL);
            cr_assert_eq(r1, r2);
            if (r1 == MT_OK) cr_assert_eq(memcmp(e1, e2, sizeof(e1)), 0);
        }
    }
    /* Another incarnation id: a full stream. */
    inc ^= 1;
    cr_assert_eq(sync_into(&c, 0, &replica, &tc, &since, &inc, &full), MT_RPC_OK);
    cr_assert_eq(full, 1);
    mt_table_destroy(replica);
    cluster_stop(&c);
}

/* Reads chunks of a follow stream into replica up to and including the next caught_up
 * chunk. @returns the entries read; *last is set when the chunk also had last = 1. */
static size_t follow_round(mt_rpc_stream_t *s, mt_table_t *replica, uint64_t *since, int *last,
                           int *full) {
    size_t entries = 0;
    *last = 0;
    for (;;) {
        uint8_t *msg;
        size_t ml;
        cr_assert_eq(mt_rpc_stream_next(s, &msg, &ml), MT_OK, "the stream ended early");
        Monolith__V1__SyncChunk *ch = monolith__v1__sync_chunk__unpack(NULL, ml, msg);
        free(msg);
        cr_assert_not_null(ch);
        if (full) *full |= ch->full;
        size_t off = 0;
        for (size_t i = 0; i < ch->n_fids; i++) {
            uint32_t d = dim_of(ch->fids[i]);
            if (ch->deleted.data[i]) {
                mt_table_remove(replica, &ch->fids[i], 1, NULL);
            } else {
                cr_assert_eq(
                    mt_table_assign(replica, &ch->fids[i], 1, ch->values + off, d, 1, NULL), MT_OK);
                off += d;
            }
        }
        entries += ch->n_fids;
        int done = ch->caught_up;
        *last = ch->last;
        cr_assert(!ch->last || ch->caught_up, "the last chunk is caught up");
        cr_assert_geq(ch->upto_version, *since, "versions never go back");
        *since = ch->upto_version;
        monolith__v1__sync_chunk__free_unpacked(ch, NULL);
        if (done) return entries;
    }
}

static void assert_replica_equals(mt_table_t *shard, mt_table_t *replica, const char *when) {
    mt_table_stats_t a, b;
    mt_table_stats(shard, &a);
    mt_table_stats(replica, &b);
    cr_assert_eq(a.rows, b.rows, "%s: %llu rows on the shard, %llu in the replica", when,
                 (unsigned long long)a.rows, (unsigned long long)b.rows);
    for (uint64_t v = 0; v < 5000; v++) {
        uint64_t f = MT_FID_MAKE(1, v);
        float e1[8], e2[8];
        int r1 = mt_table_get_row(shard, f, e1, NULL, 0, NULL, NULL, NULL);
        int r2 = mt_table_get_row(replica, f, e2, NULL, 0, NULL, NULL, NULL);
        cr_assert_eq(r1, r2, "%s: id %llu", when, (unsigned long long)v);
        if (r1 == MT_OK) cr_assert_eq(memcmp(e1, e2, sizeof(e1)), 0, "%s", when);
    }
}

static mt_rpc_stream_t *follow_open(cluster_t *c, int shard, uint64_t since, uint64_t inc,
                                    uint32_t follow_ms) {
    Monolith__V1__SyncRequest sr = MONOLITH__V1__SYNC_REQUEST__INIT;
    sr.since_version = since;
    sr.incarnation = inc;
    sr.max_chunk_fids = 64;
    sr.follow_ms = follow_ms;
    uint8_t buf[64];
    size_t len = monolith__v1__sync_request__pack(&sr, buf);
    mt_rpc_stream_t *s;
    cr_assert_eq(mt_rpc_stream_open(mt_psc_channel(c->client, (uint32_t)shard), PATH("Sync"), buf,
                                    len, 60000, &s),
                 MT_OK);
    return s;
}

/* A follow stream stays open and sends each change in the next round; a shard holds one
 * follower (sync_max_followers = 1 here) and answers another replica one round at a time;
 * mt_ps_stop_streams() ends the stream with last = 1. */
Test(ps_cluster, follow_stream_sends_changes_as_they_happen) {
    cluster_t c;
    cluster_start(&c, 0);
    mt_table_config_t tc;
    mt_table_config_init(&tc);
    tc.slots = c.slots;
    tc.nslots = 2;
    tc.shards_log2 = 1;
    tc.filter_bytes = 1 << 16;
    mt_table_t *replica = NULL;
    cr_assert_eq(mt_table_create(&tc, &replica), MT_OK);
    mt_table_t *shard = mt_ps_table(c.ps[0]);
    uint64_t since = 0, x = 5;
    int last = 0, full = 0;
    mt_rpc_stream_t *s = follow_open(&c, 0, 0, 0, 20);
    follow_round(s, replica, &since, &last, &full);
    cr_assert(full && !last, "the catch-up round of a new replica is full and the stream stays");
    size_t total = 0;
    for (int round = 0; round < 8; round++) {
        enum { B = 200 };
        uint64_t fids[B];
        float out[B * 8], g[B * 8];
        for (int i = 0; i < B; i++)
            fids[i] = MT_FID_MAKE(1, rnd(&x) % 5000);
        mt_rpc_status_t st;
        cr_assert_eq(mt_psc_lookup(c.client, fids, B, 1, 100, out, B * 8, NULL, &st), MT_OK);
        for (size_t k = 0; k < B * 8; k++)
            g[k] = 0.01f * (float)(k % 7);
        cr_assert_eq(mt_psc_apply(c.client, fids, B, g, B * 8, 100, 1, 0, NULL, NULL, &st), MT_OK);
        if (round == 4) { /* removals arrive as deletions */
            uint64_t removed;
            mt_table_remove(shard, fids, B / 2, &removed);
        }
        /* A round that began after the writes carries them, and its upto_version is above
         * every version they took (rounds sent before may still be queued in the stream). */
        mt_table_stats_t ts;
        mt_table_stats(shard, &ts);
        full = 0;
        for (int k = 0; k < 1000 && since <= ts.version; k++) {
            total += follow_round(s, replica, &since, &last, &full);
            cr_assert(!last && !full);
        }
        cr_assert_gt(since, ts.version, "no round after the writes");
        assert_replica_equals(shard, replica, "after a write");
    }
    cr_assert_gt(total, 0);
    /* Quiet: rounds keep coming as heartbeats without entries. */
    cr_assert_eq(follow_round(s, replica, &since, &last, NULL), 0);
    cr_assert_eq(follow_round(s, replica, &since, &last, NULL), 0);
    /* A second follower is over the bound: its catch-up round ends the stream. */
    mt_rpc_stream_t *s2 = follow_open(&c, 0, since, mt_ps_incarnation(c.ps[0]), 20);
    uint64_t since2 = since;
    follow_round(s2, replica, &since2, &last, NULL);
    cr_assert(last, "over sync_max_followers: one round, then the end");
    mt_rpc_status_t st2;
    uint8_t *m2;
    size_t l2;
    cr_assert_eq(mt_rpc_stream_next(s2, &m2, &l2), MT_NOT_FOUND);
    mt_rpc_stream_close(s2, &st2);
    cr_assert_eq(st2.code, MT_RPC_OK, "%s", st2.message);
    /* The shard stops: the follower gets a last chunk and a clean end. */
    mt_ps_stop_streams(c.ps[0]);
    int rounds = 0;
    do {
        follow_round(s, replica, &since, &last, NULL);
        rounds++;
    } while (!last && rounds < 100);
    cr_assert(last, "a stopping shard ends its follow streams");
    cr_assert_eq(mt_rpc_stream_next(s, &m2, &l2), MT_NOT_FOUND);
    mt_rpc_status_t st;
    mt_rpc_stream_close(s, &st);
    cr_assert_eq(st.code, MT_RPC_OK, "%s", st.message);
    assert_replica_equals(shard, replica, "at the end");
    /* A bad follow period is refused. */
    s = follow_open(&c, 1, 0, 0, 60001);
    uint8_t *m;
    size_t ml;
    cr_assert_eq(mt_rpc_stream_next(s, &m, &ml), MT_NOT_FOUND);
    mt_rpc_stream_close(s, &st);
    cr_assert_eq(st.code, MT_RPC_INVALID_ARGUMENT);
    mt_table_destroy(replica);
    cluster_stop(&c);
}

Test(ps_cluster, dense_push_and_pull) {
    cluster_t c;
    cluster_start(&c, 0);
    mt_rpc_channel_t *ch = mt_psc_channel(c.client, 0);
    uint32_t shape[2] = {2, 3};
    float w0[6] = {1, 2, 3, 4, 5, 6}, g[6] = {1, 1, 1, 1, 1, 1};
    Monolith__V1__DenseTensor init = MONOLITH__V1__DENSE_TENSOR__INIT, grad = init;
    init.name = "mlp/w0";
    init.n_shape = 2;
    init.shape = shape;
    init.n_values = 6;
    init.values = w0;
    grad = init;
    grad.values = g;
    Monolith__V1__DenseTensor *gp[1] = {&grad}, *ip[1] = {&init};
    Monolith__V1__PushDenseRequest pr = MONOLITH__V1__PUSH_DENSE_REQUEST__INIT;
    pr.n_grads = 1;
    pr.grads = gp;
    uint8_t buf[1024], *resp;
    size_t len = monolith__v1__push_dense_request__pack(&pr, buf), rlen;
    mt_rpc_status_t st;
    cr_assert_eq(raw(&c, 0, PATH("PushDense"), buf, len, &st, NULL, NULL), MT_RPC_INVALID_ARGUMENT,
                 "an unknown tensor without init is refused");
    pr.n_init = 1;
    pr.init = ip;
    len = monolith__v1__push_dense_request__pack(&pr, buf);
    cr_assert_eq(raw(&c, 0, PATH("PushDense"), buf, len, &st, &resp, &rlen), MT_RPC_OK, "%s",
                 st.message);
    Monolith__V1__PushDenseResponse *pres =
        monolith__v1__push_dense_response__unpack(NULL, rlen, resp);
    cr_assert_eq(pres->version, 1);
    monolith__v1__push_dense_response__free_unpacked(pres, NULL);
    free(resp);
    /* The creating push starts the tensor at its init: its gradient is no step. */
    Monolith__V1__PullDenseRequest q = MONOLITH__V1__PULL_DENSE_REQUEST__INIT;
    len = monolith__v1__pull_dense_request__pack(&q, buf);
    cr_assert_eq(raw(&c, 0, PATH("PullDense"), buf, len, &st, &resp, &rlen), MT_RPC_OK);
    Monolith__V1__PullDenseResponse *pd =
        monolith__v1__pull_dense_response__unpack(NULL, rlen, resp);
    free(resp);
    cr_assert_eq(pd->n_tensors, 1);
    cr_assert_eq(memcmp(pd->tensors[0]->values, w0, sizeof(w0)), 0);
    monolith__v1__pull_dense_response__free_unpacked(pd, NULL);
    /* A push with init for an existing tensor: the init is ignored, the gradient applied.
     * Adam's first step moves every weight by lr (0.001) against the gradient's sign. */
    len = monolith__v1__push_dense_request__pack(&pr, buf);
    cr_assert_eq(raw(&c, 0, PATH("PushDense"), buf, len, &st, &resp, &rlen), MT_RPC_OK, "%s",
                 st.message);
    pres = monolith__v1__push_dense_response__unpack(NULL, rlen, resp);
    cr_assert_eq(pres->version, 2);
    monolith__v1__push_dense_response__free_unpacked(pres, NULL);
    free(resp);
    len = monolith__v1__pull_dense_request__pack(&q, buf);
    cr_assert_eq(raw(&c, 0, PATH("PullDense"), buf, len, &st, &resp, &rlen), MT_RPC_OK);
    pd = monolith__v1__pull_dense_response__unpack(NULL, rlen, resp);
    free(resp);
    cr_assert_eq(pd->version, 2);
    cr_assert_eq(pd->n_tensors, 1);
    cr_assert_str_eq(pd->tensors[0]->name, "mlp/w0");
    for (int i = 0; i < 6; i++)
        cr_assert_float_eq(pd->tensors[0]->values[i], w0[i] - 0.001f, 1e-5);
    monolith__v1__pull_dense_response__free_unpacked(pd, NULL);
    /* Not newer: no tensors. */
    q.if_newer_than = 2;
    len = monolith__v1__pull_dense_request__pack(&q, buf);
    cr_assert_eq(raw(&c, 0, PATH("PullDense"), buf, len, &st, &resp, &rlen), MT_RPC_OK);
    pd = monolith__v1__pull_dense_response__unpack(NULL, rlen, resp);
    free(resp);
    cr_assert_eq(pd->n_tensors, 0);
    monolith__v1__pull_dense_response__free_unpacked(pd, NULL);
    /* Wrong gradient size and NaN: refused, version unchanged. */
    grad.n_values = 5;
    pr.n_init = 0;
    len = monolith__v1__push_dense_request__pack(&pr, buf);
    cr_assert_eq(raw(&c, 0, PATH("PushDense"), buf, len, &st, NULL, NULL), MT_RPC_INVALID_ARGUMENT);
    grad.n_values = 6;
    g[2] = INFINITY;
    len = monolith__v1__push_dense_request__pack(&pr, buf);
    cr_assert_eq(raw(&c, 0, PATH("PushDense"), buf, len, &st, NULL, NULL), MT_RPC_INVALID_ARGUMENT);
    /* Dense state survives a save/load through another service. */
    uint8_t *blob;
    size_t blen;
    cr_assert_eq(mt_ps_dense_save(c.ps[0], &blob, &blen), MT_OK);
    cr_assert_eq(mt_ps_dense_load(c.ps[1], blob, blen), MT_OK);
    cr_assert_eq(mt_ps_dense_load(c.ps[1], blob, blen / 2), MT_CORRUPT);
    free(blob);
    q.if_newer_than = 0;
    len = monolith__v1__pull_dense_request__pack(&q, buf);
    cr_assert_eq(raw(&c, 1, PATH("PullDense"), buf, len, &st, &resp, &rlen), MT_RPC_OK);
    pd = monolith__v1__pull_dense_response__unpack(NULL, rlen, resp);
    free(resp);
    cr_assert_eq(pd->version, 2);
    cr_assert_float_eq(pd->tensors[0]->values[5], 6.0f - 0.001f, 1e-5);
    monolith__v1__pull_dense_response__free_unpacked(pd, NULL);
    (void)ch;
    cluster_stop(&c);
}
