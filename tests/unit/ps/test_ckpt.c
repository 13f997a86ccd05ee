/*
 * test_ckpt.c - a shard's checkpoints (ps/src/ckpt.c) through its real handlers: two PS
 * shards in this process, each with a RocksDB store in its own mkdtemp() directory and an rpc
 * server on 127.0.0.1, driven through the client library (mt_psc_*) and raw calls.
 *   - ApplyGradients' examples reach every shard (with or without ids there) and add up in
 *     examples_applied (Stats, metrics); a consistent Snapshot stores it with the offsets;
 *     Checkpoints lists each checkpoint's meta; Restore brings rows, dense parameters and
 *     the counter back exactly, takes a new incarnation and deletes the newer checkpoints,
 *     whose ids can be written again; a restarted shard (mt_ps_restore(MT_PS_NEWEST) on a
 *     new service over the same store) comes back to the same state;
 *   - Restore(0): the empty state, every checkpoint deleted;
 *   - the refusals: a consistent id not above the newest, another incarnation than expected,
 *     no id, a wrong admin token, no store, an unknown checkpoint;
 *   - a restore while lookups, applies and a follow Sync stream run: each call succeeds or
 *     gets UNAVAILABLE, the stream ends, the state afterwards is the checkpoint's (ASan
 *     catches a table freed under a reader);
 *   - local snapshots vs coordination: mt_ps_coordinated() once a consistent checkpoint or a
 *     coordinator's restore (with its epoch) happened, never after an operator's restore; a
 *     skipped local snapshot says why and whether the state changed since;
 *   - metadata that the store's checks pass but the PS cannot read: the message names the
 *     checkpoint and what is wrong;
 *   - incremental snapshots (ps.snapshot_full_every 3): whole, incremental, incremental,
 *     whole; a restart and a Restore of each give back exactly its state; the first snapshot
 *     after a restore is whole;
 *   - the trainer's coordinator (mt/coord.h) over these shards: recovery from nothing, then
 *     checkpoints; a checkpoint that reached shard 0 only and a restart of shard 1: the next
 *     checkpoint fails (another incarnation), recovery picks the last checkpoint both hold,
 *     with its offsets, drops shard 0's partial one and ids keep growing past it; check()
 *     notices a restart; a recovery with a shard down gives up at its timeout or at stop().
 */
#include <criterion/criterion.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "monolith/v1/ps.pb-c.h"
#include "mt/coord.h"
#include "mt/ps.h"
#include "mt/psclient.h"
#include "mt/route.h"
#include "mt/rpc.h"
#include "mt/store.h"
#include "mt/table.h"
#include "testutil_ps.h"

#define NSHARDS 2
#define PATH(m) "/monolith.v1.ParameterServer/" m
#define TOKEN   "t0k"

typedef struct cluster {
    char dir[64];
    mt_table_slot_config_t slots[2];
    mt_ps_t *ps[NSHARDS];
    mt_store_t *store[NSHARDS];
    mt_rpc_server_t *srv[NSHARDS];
    char addr[NSHARDS][TU_PS_ADDR_LEN];
    mt_psc_t *client;
    uint32_t full_every; /* ps.snapshot_full_every of the shards (cluster_start: 1) */
} cluster_t;

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* The stores' directory of the running cluster, removed by the suite's fini even when an
 * assertion ended the test early. */
static char g_dir[64];

static void remove_dir(void) {
    if (g_dir[0]) nftw(g_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    g_dir[0] = 0;
}

static void ps_new(cluster_t *c, uint32_t i) {
    mt_ps_config_t pc;
    tu_ps_config(&pc, i, NSHARDS, c->slots, 2);
    pc.admin_token = TOKEN;
    pc.snapshot_full_every = c->full_every ? c->full_every : 1;
    cr_assert_eq(mt_ps_create(&pc, NULL, &c->ps[i]), MT_OK);
}

static void cluster_start_every(cluster_t *c, int with_store, uint32_t full_every) {
    memset(c, 0, sizeof(*c));
    c->full_every = full_every;
    snprintf(c->dir, sizeof(c->dir), "/tmp/mt_ps_ckpt_XXXXXX");
    cr_assert_not_null(mkdtemp(c->dir));
    memcpy(g_dir, c->dir, sizeof(g_dir));
    mt_table_slot_config_init(&c->slots[0], 1, 8);
    c->slots[0].opt = MT_OPT_ADAGRAD;
    c->slots[0].init = MT_INIT_UNIFORM;
    c->slots[0].init_seed = 5;
    mt_table_slot_config_init(&c->slots[1], 2, 4);
    c->slots[1].opt = MT_OPT_SGD;
    for (uint32_t i = 0; i < NSHARDS; i++) {
        ps_new(c, i);
        if (with_store) {
            char d[128], eb[256] = "";
            snprintf(d, sizeof(d), "%s/shard%u", c->dir, i);
            mt_store_config_t sc;
            mt_store_config_init(&sc);
            sc.keep = 3;
            sc.chunk_bytes = 64u << 10;
            cr_assert_eq(mt_store_open(d, &sc, &c->store[i], eb, sizeof(eb)), MT_OK, "%s", eb);
            mt_ps_set_store(c->ps[i], c->store[i]);
        }
        c->srv[i] = tu_ps_serve(c->ps[i], 4, 0, NULL, c->addr[i]);
    }
    c->client = tu_psc_connect(c->addr, NSHARDS);
}

static void cluster_start(cluster_t *c, int with_store) {
    cluster_start_every(c, with_store, 1);
}

static void cluster_stop(cluster_t *c) {
    mt_psc_destroy(c->client);
    for (int i = 0; i < NSHARDS; i++) {
        mt_rpc_server_destroy(c->srv[i]);
        mt_ps_destroy(c->ps[i]);
        mt_store_close(c->store[i]);
    }
    remove_dir();
}

/* kill and restart shard i as the daemon does: a new service on the same store and address,
 * restored from its newest checkpoint */
static void restart_shard(cluster_t *c, uint32_t i) {
    mt_rpc_server_destroy(c->srv[i]);
    mt_ps_destroy(c->ps[i]);
    ps_new(c, i);
    mt_ps_set_store(c->ps[i], c->store[i]);
    mt_ps_set_restoring(c->ps[i], 1);
    char eb[256] = "";
    cr_assert_eq(mt_ps_restore(c->ps[i], MT_PS_NEWEST, NULL, eb, sizeof(eb)), MT_OK, "%s", eb);
    mt_ps_set_restoring(c->ps[i], 0);
    c->srv[i] = tu_ps_serve(c->ps[i], 4, 0, c->addr[i], NULL); /* same address */
}

static uint32_t dim_of(uint64_t fid) {
    return MT_FID_SLOT(fid) == 1 ? 8 : 4;
}

/* A batch of n ids of slot 1 starting at value v0 (both shards get some). */
static size_t batch(uint64_t *fids, size_t n, uint64_t v0) {
    for (size_t i = 0; i < n; i++)
        fids[i] = MT_FID_MAKE(1, v0 + i);
    return n * 8;
}

/* One training step through @p psc: a training lookup, then gradients with examples.
 * @returns the first error (MT_OK), with the shard's status in @p st. */
static mt_err_t try_step(mt_psc_t *psc, const uint64_t *fids, size_t n, uint64_t examples, float g,
                         mt_rpc_status_t *st) {
    size_t nf = 0;
    for (size_t i = 0; i < n; i++)
        nf += dim_of(fids[i]);
    float *out = calloc(nf, sizeof(float)), *grads = malloc(nf * sizeof(float));
    for (size_t k = 0; k < nf; k++)
        grads[k] = g * (float)((k % 7) + 1);
    mt_err_t err = mt_psc_lookup(psc, fids, n, 1, 100, out, nf, NULL, st);
    if (!err) err = mt_psc_apply(psc, fids, n, grads, nf, 100, 1, examples, NULL, NULL, st);
    free(out);
    free(grads);
    return err;
}

/* One training step through the cluster's client (it must succeed). */
static void step(cluster_t *c, const uint64_t *fids, size_t n, uint64_t examples, float g) {
    mt_rpc_status_t st;
    cr_assert_eq(try_step(c->client, fids, n, examples, g, &st), MT_OK, "%s", st.message);
}

static void lookup(cluster_t *c, const uint64_t *fids, size_t n, float *out) {
    mt_rpc_status_t st;
    size_t nf = 0;
    for (size_t i = 0; i < n; i++)
        nf += dim_of(fids[i]);
    cr_assert_eq(mt_psc_lookup(c->client, fids, n, 0, 0, out, nf, NULL, &st), MT_OK, "%s",
                 st.message);
}

static Monolith__V1__StatsResponse *stats(cluster_t *c, uint32_t i) {
    uint8_t *resp = NULL;
    size_t len = 0;
    mt_rpc_status_t st;
    cr_assert_eq(
        mt_rpc_call(mt_psc_channel(c->client, i), PATH("Stats"), NULL, 0, 5000, &resp, &len, &st),
        MT_OK);
    cr_assert_eq(st.code, MT_RPC_OK, "%s", st.message);
    Monolith__V1__StatsResponse *s = monolith__v1__stats_response__unpack(NULL, len, resp);
    free(resp);
    cr_assert_not_null(s);
    return s;
}

static uint64_t examples_of(cluster_t *c, uint32_t i) {
    Monolith__V1__StatsResponse *s = stats(c, i);
    uint64_t e = s->examples_applied;
    cr_assert_eq(e, mt_ps_examples_applied(c->ps[i]));
    monolith__v1__stats_response__free_unpacked(s, NULL);
    return e;
}

static uint64_t rows_of(cluster_t *c, uint32_t i) {
    Monolith__V1__StatsResponse *s = stats(c, i);
    uint64_t r = s->rows;
    monolith__v1__stats_response__free_unpacked(s, NULL);
    return r;
}

/* A raw admin call; @returns the status code (the answer, if OK, in *resp). */
static int raw(cluster_t *c, uint32_t i, const char *path, const ProtobufCMessage *req,
               uint8_t **resp, size_t *len) {
    uint8_t buf[1024];
    size_t n = req ? protobuf_c_message_pack(req, buf) : 0;
    mt_rpc_status_t st;
    uint8_t *r = NULL;
    size_t rl = 0;
    cr_assert_eq(mt_rpc_call(mt_psc_channel(c->client, i), path, buf, n, 30000, &r, &rl, &st),
                 MT_OK);
    if (resp) {
        *resp = r;
        *len = rl;
    } else {
        free(r);
    }
    return st.code;
}

static void dense_init(cluster_t *c, float v) {
    float vals[3] = {v, v + 1, v + 2}, zero[3] = {0, 0, 0};
    mt_psc_tensor_t t = {"w", 1, {3, 0}, 3, vals}, g = {"w", 1, {3, 0}, 3, zero};
    mt_rpc_status_t st;
    cr_assert_eq(mt_psc_push_dense(c->client, &g, &t, 1, 0, NULL, &st), MT_OK, "%s", st.message);
}

/* Pulls tensor "w"; @returns 1 if the PS has it (then out3 holds it), 0 if it has no dense
 * tensor at all (version 0). */
static int dense_get(cluster_t *c, float *out3) {
    mt_psc_tensor_t t = {"w", 1, {3, 0}, 3, out3};
    uint64_t v = 0;
    int updated = 0;
    mt_rpc_status_t st;
    cr_assert_eq(mt_psc_pull_dense(c->client, &t, 1, 0, &v, &updated, &st), MT_OK, "%s",
                 st.message);
    cr_assert_eq(updated, v > 0);
    return updated;
}

static void dense_step(cluster_t *c) {
    float gv[3] = {0.5f, -0.5f, 1};
    mt_psc_tensor_t g = {"w", 1, {3, 0}, 3, gv};
    mt_rpc_status_t st;
    cr_assert_eq(mt_psc_push_dense(c->client, &g, NULL, 1, 1, NULL, &st), MT_OK, "%s", st.message);
}

/* ============================== tests ============================== */

TestSuite(ps_ckpt, .fini = remove_dir, .timeout = 120);

Test(ps_ckpt, counter_offsets_list_and_restore) {
    cluster_t c;
    cluster_start(&c, 1);
    enum { B = 64 };
    uint64_t fids[B];
    batch(fids, B, 1000);
    dense_init(&c, 1);
    /* 3 steps of 10 examples; then one whose ids all live on one shard: the other still
     * counts its examples (an empty ApplyGradients) */
    for (int i = 0; i < 3; i++)
        step(&c, fids, B, 10, 0.1f);
    uint64_t one = 0;
    for (uint64_t v = 1; !one; v++)
        if (mt_route_shard_of(MT_FID_MAKE(1, v), NSHARDS) == 1) one = MT_FID_MAKE(1, v);
    step(&c, &one, 1, 7, 0.1f);
    for (uint32_t i = 0; i < NSHARDS; i++)
        cr_assert_eq(examples_of(&c, i), 37, "shard %u", i);
    /* applies without examples (a first apply of a step) count nothing */
    mt_rpc_status_t st;
    float g8[8] = {0};
    cr_assert_eq(mt_psc_apply(c.client, &one, 1, g8, 8, 0, 0, 0, NULL, NULL, &st), MT_OK);
    cr_assert_eq(examples_of(&c, 0), 37);
    dense_step(&c);

    /* checkpoint 5 with offsets */
    mt_psc_offset_t offs[2] = {{"examples", 0, 1234}, {"examples", 3, 77}};
    mt_psc_shard_ckpt_t out[NSHARDS];
    uint64_t inc[NSHARDS];
    for (uint32_t i = 0; i < NSHARDS; i++)
        inc[i] = mt_ps_incarnation(c.ps[i]);
    cr_assert_eq(mt_psc_snapshot_all(c.client, TOKEN, 5, inc, offs, 2, 30000, out), MT_OK);
    for (uint32_t i = 0; i < NSHARDS; i++) {
        cr_assert_eq(out[i].examples_applied, 37);
        cr_assert(mt_ps_coordinated(c.ps[i]));
    }
    mt_psc_shard_ckpt_free(out, NSHARDS);
    float at5[B * 8], d5[3];
    lookup(&c, fids, B, at5);
    cr_assert(dense_get(&c, d5));
    uint64_t rows5[NSHARDS];
    for (uint32_t i = 0; i < NSHARDS; i++)
        rows5[i] = rows_of(&c, i);

    /* more training and checkpoint 6, then more training */
    step(&c, fids, B, 10, -0.3f);
    uint64_t more[B];
    batch(more, B, 5000); /* new rows */
    step(&c, more, B, 10, 0.2f);
    dense_step(&c);
    cr_assert_eq(mt_psc_snapshot_all(c.client, TOKEN, 6, inc, offs, 1, 30000, out), MT_OK);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    step(&c, fids, B, 5, 0.7f);
    cr_assert_eq(examples_of(&c, 1), 62);

    /* the list: 5 and 6, consistent, with their offsets and counters */
    cr_assert_eq(mt_psc_checkpoints(c.client, 30000, out), MT_OK);
    for (uint32_t i = 0; i < NSHARDS; i++) {
        cr_assert_eq(out[i].incarnation, inc[i]);
        cr_assert_eq(out[i].examples_applied, 62);
        cr_assert_eq(out[i].n, 2);
        const mt_psc_checkpoint_t *a = &out[i].list[0], *b = &out[i].list[1];
        cr_assert_eq(a->checkpoint_id, 5);
        cr_assert(a->consistent);
        cr_assert_eq(a->examples_applied, 37);
        cr_assert_eq(a->noffsets, 2);
        cr_assert_str_eq(a->offsets[1].topic, "examples");
        cr_assert_eq(a->offsets[1].partition, 3);
        cr_assert_eq(a->offsets[1].offset, 77);
        cr_assert_eq(a->offsets[0].offset, 1234);
        cr_assert_eq(b->checkpoint_id, 6);
        cr_assert_eq(b->examples_applied, 57);
        cr_assert_eq(b->noffsets, 1);
    }
    mt_psc_shard_ckpt_free(out, NSHARDS);

    /* Restore(5): rows, values, dense and counter of then; a new incarnation; 6 dropped */
    cr_assert_eq(mt_psc_restore_all(c.client, TOKEN, 5, 30000, out), MT_OK);
    for (uint32_t i = 0; i < NSHARDS; i++) {
        cr_assert_neq(out[i].incarnation, inc[i]);
        cr_assert_eq(out[i].incarnation, mt_ps_incarnation(c.ps[i]));
        cr_assert_eq(out[i].examples_applied, 37);
        cr_assert_eq(examples_of(&c, i), 37);
        cr_assert_eq(rows_of(&c, i), rows5[i], "shard %u rows", i);
        inc[i] = out[i].incarnation;
    }
    mt_psc_shard_ckpt_free(out, NSHARDS);
    float now[B * 8], dnow[3];
    lookup(&c, fids, B, now);
    cr_assert_eq(memcmp(now, at5, sizeof(now)), 0, "embeddings are those of checkpoint 5");
    cr_assert(dense_get(&c, dnow));
    cr_assert_eq(memcmp(dnow, d5, sizeof(dnow)), 0, "dense parameters of checkpoint 5");
    cr_assert_eq(mt_psc_checkpoints(c.client, 30000, out), MT_OK);
    for (uint32_t i = 0; i < NSHARDS; i++) {
        cr_assert_eq(out[i].n, 1, "checkpoint 6 was dropped");
        cr_assert_eq(out[i].list[0].checkpoint_id, 5);
    }
    mt_psc_shard_ckpt_free(out, NSHARDS);
    /* the same work again gives the same counter; 6 can be written again */
    step(&c, fids, B, 10, -0.3f);
    step(&c, more, B, 10, 0.2f);
    cr_assert_eq(mt_psc_snapshot_all(c.client, TOKEN, 6, inc, offs, 2, 30000, out), MT_OK);
    cr_assert_eq(out[0].examples_applied, 57);
    mt_psc_shard_ckpt_free(out, NSHARDS);

    /* a restarted shard (a new service on the same store) comes back to checkpoint 6 */
    float at6[B * 8];
    lookup(&c, fids, B, at6);
    uint64_t rows6 = rows_of(&c, 1);
    mt_rpc_server_destroy(c.srv[1]);
    mt_ps_destroy(c.ps[1]);
    ps_new(&c, 1);
    cr_assert_eq(mt_ps_coordinated(c.ps[1]), 0);
    mt_ps_set_store(c.ps[1], c.store[1]);
    mt_ps_set_restoring(c.ps[1], 1);
    mt_ps_ckpt_result_t res;
    char eb[256] = "";
    cr_assert_eq(mt_ps_restore(c.ps[1], MT_PS_NEWEST, &res, eb, sizeof(eb)), MT_OK, "%s", eb);
    mt_ps_set_restoring(c.ps[1], 0);
    cr_assert_eq(res.checkpoint_id, 6);
    cr_assert(res.consistent);
    cr_assert_eq(res.dropped, 0, "a start deletes nothing");
    cr_assert(mt_ps_coordinated(c.ps[1]), "its newest checkpoint is a cluster one");
    cr_assert_eq(mt_ps_examples_applied(c.ps[1]), 57);
    mt_table_stats_t ts;
    mt_table_stats(mt_ps_table(c.ps[1]), &ts);
    cr_assert_eq(ts.rows, rows6);
    c.srv[1] = tu_ps_serve(c.ps[1], 4, 0, c.addr[1], NULL);
    /* the client's channel reconnects with a backoff */
    mt_err_t le = MT_UNAVAILABLE;
    for (int i = 0; i < 100 && le; i++) {
        le = mt_psc_lookup(c.client, fids, B, 0, 0, now, B * 8, NULL, &st);
        if (le) usleep(100000);
    }
    cr_assert_eq(le, MT_OK, "%s", st.message);
    cr_assert_eq(memcmp(now, at6, sizeof(now)), 0);

    /* Restore(0): the empty state everywhere, no checkpoint left */
    cr_assert_eq(mt_psc_restore_all(c.client, TOKEN, 0, 30000, out), MT_OK);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    for (uint32_t i = 0; i < NSHARDS; i++) {
        cr_assert_eq(rows_of(&c, i), 0);
        cr_assert_eq(examples_of(&c, i), 0);
    }
    cr_assert_eq(dense_get(&c, dnow), 0, "no dense tensor in the empty state");
    cr_assert_eq(mt_psc_checkpoints(c.client, 30000, out), MT_OK);
    for (uint32_t i = 0; i < NSHARDS; i++)
        cr_assert_eq(out[i].n, 0);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    /* metrics name the counter and the checkpoint figures */
    char *body = NULL;
    size_t blen = 0;
    cr_assert_eq(mt_ps_render_metrics(c.ps[0], NULL, &body, &blen), MT_OK);
    cr_assert_not_null(strstr(body, "monolith_ps_examples_applied{shard=\"0\"} 0\n"));
    cr_assert_not_null(strstr(body, "monolith_ps_restores_total{shard=\"0\"} 2\n"), "%s", body);
    cr_assert_not_null(strstr(body, "monolith_ps_snapshots_total{shard=\"0\"} 3\n"));
    cr_assert_not_null(strstr(body, "method=\"Restore\""));
    free(body);
    cluster_stop(&c);
}

Test(ps_ckpt, refusals) {
    cluster_t c;
    cluster_start(&c, 1);
    uint64_t fids[8];
    batch(fids, 8, 1);
    step(&c, fids, 8, 8, 0.1f);
    uint64_t inc[NSHARDS] = {mt_ps_incarnation(c.ps[0]), mt_ps_incarnation(c.ps[1])};
    mt_psc_shard_ckpt_t out[NSHARDS];
    cr_assert_eq(mt_psc_snapshot_all(c.client, TOKEN, 3, inc, NULL, 0, 30000, out), MT_OK);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    /* not above the newest */
    cr_assert_eq(mt_psc_snapshot_all(c.client, TOKEN, 3, inc, NULL, 0, 30000, out), MT_MISMATCH);
    cr_assert_eq(out[0].st.code, MT_RPC_FAILED_PRECONDITION, "%s", out[0].st.message);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    /* another incarnation than expected: only that shard refuses */
    uint64_t wrong[NSHARDS] = {inc[0], inc[1] + 1};
    cr_assert_eq(mt_psc_snapshot_all(c.client, TOKEN, 4, wrong, NULL, 0, 30000, out), MT_MISMATCH);
    cr_assert_eq(out[0].err, MT_OK);
    cr_assert_eq(out[1].st.code, MT_RPC_FAILED_PRECONDITION);
    cr_assert_not_null(strstr(out[1].st.message, "incarnation"), "%s", out[1].st.message);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    /* so 4 is on shard 0 only: the listing shows it (a coordinator would restore 3) */
    cr_assert_eq(mt_psc_checkpoints(c.client, 30000, out), MT_OK);
    cr_assert_eq(out[0].n, 2);
    cr_assert_eq(out[1].n, 1);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    /* wrong token, unknown checkpoint, consistent without an id */
    cr_assert_eq(mt_psc_restore_all(c.client, "nope", 3, 30000, out), MT_INVALID);
    cr_assert_eq(out[0].st.code, MT_RPC_PERMISSION_DENIED);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    cr_assert_eq(mt_psc_restore_all(c.client, TOKEN, 99, 30000, out), MT_NOT_FOUND);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    Monolith__V1__SnapshotRequest sr = MONOLITH__V1__SNAPSHOT_REQUEST__INIT;
    sr.token = TOKEN;
    sr.consistent = 1;
    cr_assert_eq(raw(&c, 0, PATH("Snapshot"), &sr.base, NULL, NULL), MT_RPC_INVALID_ARGUMENT);
    /* an id at the top of the range is refused, and a plain snapshot after it still saves
     * (an id of UINT64_MAX once made every later snapshot's next id wrap to 0) */
    sr.consistent = 0;
    sr.checkpoint_id = UINT64_MAX;
    cr_assert_eq(raw(&c, 0, PATH("Snapshot"), &sr.base, NULL, NULL), MT_RPC_INVALID_ARGUMENT);
    sr.consistent = 1;
    sr.checkpoint_id = MT_PS_CHECKPOINT_ID_MAX;
    cr_assert_eq(raw(&c, 0, PATH("Snapshot"), &sr.base, NULL, NULL), MT_RPC_INVALID_ARGUMENT);
    mt_ps_snapshot_req_t plain = {0};
    mt_ps_ckpt_result_t pres;
    char perr[256];
    cr_assert_eq(mt_ps_snapshot(c.ps[1], &plain, &pres, perr, sizeof(perr)), MT_OK, "%s", perr);
    cr_assert_lt(pres.checkpoint_id, 100);
    sr.checkpoint_id = 0;
    cr_assert_eq(raw(&c, 0, PATH("Restore"), NULL, NULL, NULL), MT_RPC_PERMISSION_DENIED);
    uint8_t junk[3] = {0xff, 0xff, 0xff};
    mt_rpc_status_t st;
    uint8_t *r = NULL;
    size_t rl = 0;
    cr_assert_eq(
        mt_rpc_call(mt_psc_channel(c.client, 0), PATH("Restore"), junk, 3, 5000, &r, &rl, &st),
        MT_OK);
    cr_assert_eq(st.code, MT_RPC_INVALID_ARGUMENT);
    free(r);
    /* nothing of that changed the state; Restore(3) takes shard 0 back and drops its 4 */
    cr_assert_eq(examples_of(&c, 0), 8);
    cr_assert_eq(mt_psc_restore_all(c.client, TOKEN, 3, 30000, out), MT_OK);
    cr_assert_eq(out[0].examples_applied, 8);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    cr_assert_eq(mt_psc_checkpoints(c.client, 30000, out), MT_OK);
    cr_assert_eq(out[0].n, 1);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    cluster_stop(&c);

    /* without a store: FAILED_PRECONDITION for all three */
    cluster_start(&c, 0);
    cr_assert_eq(mt_psc_checkpoints(c.client, 5000, out), MT_MISMATCH);
    cr_assert_eq(out[0].st.code, MT_RPC_FAILED_PRECONDITION);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    cr_assert_eq(mt_psc_restore_all(c.client, TOKEN, 0, 5000, out), MT_MISMATCH);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    cr_assert_eq(mt_psc_snapshot_all(c.client, TOKEN, 1, NULL, NULL, 0, 5000, out), MT_MISMATCH);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    mt_ps_snapshot_req_t req = {0};
    cr_assert_eq(mt_ps_snapshot(c.ps[0], &req, NULL, NULL, 0), MT_INVALID);
    cluster_stop(&c);
}

/* ---------------- a restore under load ---------------- */

typedef struct load {
    cluster_t *c;
    _Atomic int stop;
    _Atomic uint64_t ok, unavailable, other;
} load_t;

static void *load_main(void *arg) {
    load_t *l = arg;
    uint64_t fids[32];
    batch(fids, 32, 1000);
    float out[32 * 8], g[32 * 8];
    for (size_t k = 0; k < 32 * 8; k++)
        g[k] = 0.01f;
    while (!atomic_load(&l->stop)) {
        mt_rpc_status_t st;
        mt_err_t e = mt_psc_lookup(l->c->client, fids, 32, 1, 100, out, 32 * 8, NULL, &st);
        if (!e) e = mt_psc_apply(l->c->client, fids, 32, g, 32 * 8, 100, 1, 0, NULL, NULL, &st);
        if (e == MT_OK)
            atomic_fetch_add(&l->ok, 1);
        else if (e == MT_UNAVAILABLE)
            atomic_fetch_add(&l->unavailable, 1);
        else
            atomic_fetch_add(&l->other, 1);
    }
    return NULL;
}

Test(ps_ckpt, restore_under_load_and_a_follow_stream) {
    cluster_t c;
    cluster_start(&c, 1);
    uint64_t fids[32];
    batch(fids, 32, 1000);
    step(&c, fids, 32, 32, 0.1f);
    uint64_t inc[NSHARDS] = {mt_ps_incarnation(c.ps[0]), mt_ps_incarnation(c.ps[1])};
    mt_psc_shard_ckpt_t out[NSHARDS];
    cr_assert_eq(mt_psc_snapshot_all(c.client, TOKEN, 1, inc, NULL, 0, 30000, out), MT_OK);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    float at1[32 * 8];
    lookup(&c, fids, 32, at1);
    uint64_t rows1 = rows_of(&c, 0);

    /* a follow Sync stream on shard 0, caught up */
    Monolith__V1__SyncRequest sr = MONOLITH__V1__SYNC_REQUEST__INIT;
    sr.follow_ms = 20;
    uint8_t buf[64];
    size_t n = monolith__v1__sync_request__pack(&sr, buf);
    mt_rpc_stream_t *s = NULL;
    cr_assert_eq(mt_rpc_stream_open(mt_psc_channel(c.client, 0), PATH("Sync"), buf, n, 60000, &s),
                 MT_OK);
    /* writers and readers meanwhile */
    load_t l = {.c = &c};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, load_main, &l);
    while (atomic_load(&l.ok) < 20)
        usleep(1000);
    for (int round = 0; round < 3; round++) {
        cr_assert_eq(mt_psc_restore_all(c.client, TOKEN, 1, 60000, out), MT_OK, "%d: %s", round,
                     out[0].st.message);
        mt_psc_shard_ckpt_free(out, NSHARDS);
        uint64_t seen = atomic_load(&l.ok);
        while (atomic_load(&l.ok) < seen + 10)
            usleep(1000);
    }
    /* the stream ended (it was asked to, for the first restore) */
    int ended = 0;
    for (int i = 0; i < 100000 && !ended; i++) {
        uint8_t *m = NULL;
        size_t ml = 0;
        mt_err_t e = mt_rpc_stream_next(s, &m, &ml);
        free(m);
        ended = e != MT_OK;
    }
    cr_assert(ended, "the follow stream outlived the restore");
    mt_rpc_status_t sst;
    mt_rpc_stream_close(s, &sst);
    atomic_store(&l.stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    cr_log_info("under load: %" PRIu64 " steps ok, %" PRIu64 " unavailable, %" PRIu64 " other",
                atomic_load(&l.ok), atomic_load(&l.unavailable), atomic_load(&l.other));
    cr_assert_eq(atomic_load(&l.other), 0, "only UNAVAILABLE while restoring");
    /* a last restore with nothing running: exactly checkpoint 1 */
    cr_assert_eq(mt_psc_restore_all(c.client, TOKEN, 1, 60000, out), MT_OK);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    float now[32 * 8];
    lookup(&c, fids, 32, now);
    cr_assert_eq(memcmp(now, at1, sizeof(now)), 0);
    cr_assert_eq(rows_of(&c, 0), rows1);
    cr_assert_eq(examples_of(&c, 0), 32);
    cluster_stop(&c);
}

Test(ps_ckpt, local_snapshots_until_coordinated) {
    cluster_t c;
    cluster_start(&c, 1);
    mt_ps_snapshot_req_t req = {0};
    mt_ps_ckpt_result_t res;
    char eb[256] = "";
    cr_assert_eq(mt_ps_snapshot(c.ps[0], &req, &res, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(res.checkpoint_id, 1);
    cr_assert_eq(res.consistent, 0);
    cr_assert_eq(mt_ps_coordinated(c.ps[0]), 0, "local snapshots do not coordinate");
    req.checkpoint_id = 1; /* an old id: a local snapshot takes the next one */
    cr_assert_eq(mt_ps_snapshot(c.ps[0], &req, &res, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(res.checkpoint_id, 2);
    req.expect_incarnation = mt_ps_incarnation(c.ps[0]) ^ 1;
    cr_assert_eq(mt_ps_snapshot(c.ps[0], &req, &res, eb, sizeof(eb)), MT_MISMATCH);
    /* a local checkpoint is not a cluster one: the listing says so */
    mt_psc_shard_ckpt_t out[NSHARDS];
    cr_assert_eq(mt_psc_checkpoints(c.client, 30000, out), MT_OK);
    cr_assert_eq(out[0].n, 2);
    cr_assert_eq(out[0].list[1].consistent, 0);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    /* an operator's restore (no coordinator epoch) is no coordinator: local snapshots go on
     * (regression: it turned the mode on, and the shutdown snapshot was lost) */
    cr_assert_eq(mt_ps_restore(c.ps[0], 1, &res, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(res.dropped, 1);
    cr_assert_eq(mt_ps_coordinated(c.ps[0]), 0, "an operator's restore coordinates");
    mt_ps_snapshot_req_t local = {.local = 1};
    cr_assert_eq(mt_ps_snapshot(c.ps[0], &local, &res, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(res.checkpoint_id, 2, "the local snapshot after an operator's restore");
    cr_assert_eq(res.skipped, 0);
    /* a coordinator's restore (its epoch: the claim) is */
    cr_assert_eq(mt_ps_restore_claim(c.ps[0], 1, 7, &res, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert(mt_ps_coordinated(c.ps[0]), "a coordinator's restore");
    eb[0] = 0;
    cr_assert_eq(mt_ps_snapshot(c.ps[0], &local, &res, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(res.checkpoint_id, 0, "no local snapshot once coordinated");
    cr_assert(res.skipped);
    cr_assert_eq(res.unsaved, 0, "nothing changed since the restore");
    cr_assert(strstr(eb, "epoch 7"), "the skip does not say why: '%s'", eb);
    uint64_t one[1] = {0};
    for (uint64_t v = 1; !one[0]; v++)
        if (mt_route_shard_of(MT_FID_MAKE(2, v), NSHARDS) == 0) one[0] = MT_FID_MAKE(2, v);
    float v4[4];
    mt_rpc_status_t st;
    cr_assert_eq(mt_psc_lookup(c.client, one, 1, 1, 0, v4, 4, NULL, &st), MT_OK, "%s", st.message);
    cr_assert_eq(mt_ps_snapshot(c.ps[0], &local, &res, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert(res.skipped && res.unsaved, "a new row since the restore is unsaved");
    cr_assert_eq(mt_psc_checkpoints(c.client, 30000, out), MT_OK);
    cr_assert_eq(out[0].n, 1);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    local.local = 0; /* an operator's explicit snapshot still happens */
    cr_assert_eq(mt_ps_snapshot(c.ps[0], &local, &res, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(res.checkpoint_id, 2);
    cluster_stop(&c);
}

/* Regression (an outside probe): a checkpoint whose metadata does not parse was reported as
 * "restore of 0 failed"; the message names the checkpoint and what is wrong. */
Test(ps_ckpt, bad_metadata_names_the_checkpoint_and_what_is_wrong) {
    cluster_t c;
    cluster_start(&c, 1);
    mt_table_t *t = NULL;
    mt_ps_config_t pc;
    tu_ps_config(&pc, 0, NSHARDS, c.slots, 2);
    cr_assert_eq(mt_table_create(&pc.table, &t), MT_OK);
    mt_store_table_t st = {"sparse", t, 0};
    char eb[512] = "";
    const struct {
        const char *meta;
        size_t len;
        const char *what;
    } bad[3] = {
        {"abc", 3, "3 bytes, shorter than"},
        {"\x10\0\0\0ab", 6, "16 bytes"},
        {"\x02\0\0\0\xff\xff", 6, "does not parse"},
    };
    for (int i = 0; i < 3; i++) {
        /* written through the store directly: its own checks pass, the PS's do not */
        cr_assert_eq(mt_store_save(c.store[0], (uint64_t)i + 1, &st, 1, bad[i].meta, bad[i].len,
                                   NULL, eb, sizeof(eb)),
                     MT_OK, "%s", eb);
        mt_rpc_server_destroy(c.srv[0]);
        mt_ps_destroy(c.ps[0]);
        ps_new(&c, 0);
        mt_ps_set_store(c.ps[0], c.store[0]);
        mt_ps_set_restoring(c.ps[0], 1);
        eb[0] = 0;
        cr_assert_eq(mt_ps_restore(c.ps[0], MT_PS_NEWEST, NULL, eb, sizeof(eb)), MT_CORRUPT);
        char want[32];
        snprintf(want, sizeof(want), "checkpoint %d", i + 1);
        cr_assert(strstr(eb, want) && strstr(eb, "metadata") && strstr(eb, bad[i].what),
                  "case %d: '%s'", i, eb);
        cr_log_info("bad metadata %d: %s", i, eb);
        mt_ps_set_restoring(c.ps[0], 0);
        c.srv[0] = tu_ps_serve(c.ps[0], 4, 0, c.addr[0], NULL);
    }
    mt_table_destroy(t);
    cluster_stop(&c);
}

/* ---------------- the coordinator ---------------- */

static int stop_after(void *ud) {
    return --*(int *)ud < 0;
}

Test(ps_ckpt, coordinator_recovers_to_the_last_complete_checkpoint) {
    cluster_t c;
    cluster_start(&c, 1);
    mt_coord_config_t cc;
    mt_coord_config_init(&cc);
    cc.token = TOKEN;
    cc.recovery_timeout_s = 20;
    mt_coord_t *co = NULL;
    cr_assert_eq(mt_coord_create(c.client, &cc, &co), MT_OK);
    char eb[512] = "";
    mt_coord_point_t pt;
    /* nothing yet: the empty state, no offsets */
    cr_assert_eq(mt_coord_recover(co, &pt, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(pt.checkpoint_id, 0);
    cr_assert_eq(pt.noffsets, 0);
    mt_coord_point_free(&pt);
    uint64_t fids[32];
    batch(fids, 32, 1);
    step(&c, fids, 32, 32, 0.1f);
    mt_psc_offset_t o1[1] = {{"examples", 0, 32}};
    uint64_t id = 0, ex = 0;
    cr_assert_eq(mt_coord_checkpoint(co, o1, 1, &id, &ex, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(id, 1);
    cr_assert_eq(ex, 32);
    step(&c, fids, 32, 32, 0.1f);
    mt_psc_offset_t o2[2] = {{"examples", 0, 64}, {"examples", 1, 5}};
    cr_assert_eq(mt_coord_checkpoint(co, o2, 2, &id, &ex, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(id, 2);
    cr_assert_eq(ex, 64);
    cr_assert_eq(mt_coord_check(co, eb, sizeof(eb)), MT_OK, "%s", eb);
    float at2[32 * 8];
    lookup(&c, fids, 32, at2);
    /* more work, and checkpoint 3 reaches shard 0 only (shard 1 refuses: not its
     * incarnation), then shard 1 restarts from its newest (2): it lost the work after 2 */
    step(&c, fids, 32, 32, 0.5f);
    uint64_t inc[NSHARDS] = {mt_ps_incarnation(c.ps[0]), 1};
    mt_psc_shard_ckpt_t out[NSHARDS];
    cr_assert_eq(mt_psc_snapshot_all(c.client, TOKEN, 3, inc, o2, 2, 30000, out), MT_MISMATCH);
    mt_psc_shard_ckpt_free(out, NSHARDS);
    restart_shard(&c, 1);
    cr_assert_eq(mt_ps_examples_applied(c.ps[1]), 64);
    cr_assert_eq(mt_ps_examples_applied(c.ps[0]), 96);
    /* the coordinator sees it: its next checkpoint fails, and so does a check */
    step(&c, fids, 32, 32, 0.5f); /* (retried until the channel reconnects) */
    cr_assert_eq(mt_coord_check(co, eb, sizeof(eb)), MT_MISMATCH, "%s", eb);
    cr_assert_neq(mt_coord_checkpoint(co, o2, 2, &id, &ex, eb, sizeof(eb)), MT_OK);
    cr_log_info("checkpoint after the restart: %s", eb);
    /* recovery: 2 is the last checkpoint both hold */
    cr_assert_eq(mt_coord_recover(co, &pt, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(pt.checkpoint_id, 2);
    cr_assert_eq(pt.examples_applied, 64);
    cr_assert_eq(pt.noffsets, 2);
    cr_assert_str_eq(pt.offsets[1].topic, "examples");
    cr_assert_eq(pt.offsets[1].partition, 1);
    cr_assert_eq(pt.offsets[1].offset, 5);
    mt_coord_point_free(&pt);
    cr_assert_eq(mt_coord_last(co), 2);
    for (uint32_t i = 0; i < NSHARDS; i++)
        cr_assert_eq(mt_ps_examples_applied(c.ps[i]), 64, "shard %u", i);
    float now[32 * 8];
    lookup(&c, fids, 32, now);
    cr_assert_eq(memcmp(now, at2, sizeof(now)), 0, "the state of checkpoint 2");
    cr_assert_eq(mt_psc_checkpoints(c.client, 30000, out), MT_OK);
    cr_assert_eq(out[0].n, 2, "shard 0's partial checkpoint 3 is gone");
    mt_psc_shard_ckpt_free(out, NSHARDS);
    cr_assert_eq(mt_coord_check(co, eb, sizeof(eb)), MT_OK, "%s", eb);
    /* ids only grow: past 3 (shard 0's partial one, and the coordinator's failed attempt) */
    step(&c, fids, 32, 32, 0.1f);
    cr_assert_eq(mt_coord_checkpoint(co, o2, 2, &id, &ex, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(id, 4);
    cr_assert_eq(ex, 96);
    /* a shard down: recovery gives up at its timeout, or when stop() says so */
    mt_rpc_server_destroy(c.srv[1]);
    c.srv[1] = NULL;
    mt_coord_destroy(co);
    cc.recovery_timeout_s = 1.5;
    cr_assert_eq(mt_coord_create(c.client, &cc, &co), MT_OK);
    cr_assert_eq(mt_coord_recover(co, &pt, eb, sizeof(eb)), MT_TIMEOUT);
    cr_log_info("recovery with a shard down: %s", eb);
    mt_coord_destroy(co);
    int polls = 2;
    cc.recovery_timeout_s = 60;
    cc.stop = stop_after;
    cc.stop_ud = &polls;
    cr_assert_eq(mt_coord_create(c.client, &cc, &co), MT_OK);
    cr_assert_eq(mt_coord_recover(co, &pt, eb, sizeof(eb)), MT_CANCELLED);
    mt_coord_destroy(co);
    cluster_stop(&c);
}

/* Fencing (docs/checkpoint.md): a second exactly-once trainer takes the cluster over; the
 * first one's writes, checkpoints, checks and recoveries are refused from then on, and its
 * refused writes change nothing. */
Test(ps_ckpt, a_second_coordinator_fences_the_first) {
    cluster_t c;
    cluster_start(&c, 1);
    mt_psc_t *b_client = tu_psc_connect(c.addr, NSHARDS);
    mt_coord_config_t cc;
    mt_coord_config_init(&cc);
    cc.token = TOKEN;
    cc.recovery_timeout_s = 20;
    mt_coord_t *a = NULL, *b = NULL;
    char eb[512] = "";
    mt_coord_point_t pt;
    cr_assert_eq(mt_coord_create(c.client, &cc, &a), MT_OK);
    cr_assert_eq(mt_coord_epoch(a), 0);
    cr_assert_eq(mt_coord_recover(a, &pt, eb, sizeof(eb)), MT_OK, "%s", eb);
    mt_coord_point_free(&pt);
    uint64_t ea = mt_coord_epoch(a);
    cr_assert_gt(ea, 0);
    uint64_t fids[32];
    batch(fids, 32, 1);
    step(&c, fids, 32, 32, 0.1f);
    dense_init(&c, 1);
    mt_psc_offset_t o1[1] = {{"examples", 0, 32}};
    uint64_t id = 0, ex = 0;
    cr_assert_eq(mt_coord_checkpoint(a, o1, 1, &id, &ex, eb, sizeof(eb)), MT_OK, "%s", eb);
    for (uint32_t i = 0; i < NSHARDS; i++) {
        Monolith__V1__StatsResponse *s = stats(&c, i);
        cr_assert_eq(s->epoch, ea, "shard %u saw the first coordinator's epoch", i);
        monolith__v1__stats_response__free_unpacked(s, NULL);
    }
    /* B starts: its recovery claims a higher epoch and restores checkpoint 1 */
    cr_assert_eq(mt_coord_create(b_client, &cc, &b), MT_OK);
    cr_assert_eq(mt_coord_recover(b, &pt, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(pt.checkpoint_id, 1);
    mt_coord_point_free(&pt);
    uint64_t eb_epoch = mt_coord_epoch(b);
    cr_assert_gt(eb_epoch, ea);
    float before[32 * 8];
    lookup(&c, fids, 32, before); /* a read: never fenced */
    /* A's writes are refused with ABORTED (MT_FENCED) and change nothing */
    mt_rpc_status_t st;
    cr_assert_eq(try_step(c.client, fids, 32, 32, 0.5f, &st), MT_FENCED);
    cr_assert_eq(st.code, MT_RPC_ABORTED);
    cr_assert(strstr(st.message, "fenced"), "%s", st.message);
    float gv[32 * 8];
    for (size_t k = 0; k < 32 * 8; k++)
        gv[k] = 1;
    cr_assert_eq(mt_psc_apply(c.client, fids, 32, gv, 32 * 8, 100, 1, 32, NULL, NULL, &st),
                 MT_FENCED);
    float dv[3] = {1, 1, 1};
    mt_psc_tensor_t g = {"w", 1, {3, 0}, 3, dv};
    cr_assert_eq(mt_psc_push_dense(c.client, &g, NULL, 1, 2, NULL, &st), MT_FENCED);
    float after[32 * 8];
    lookup(&c, fids, 32, after);
    cr_assert_eq(memcmp(before, after, sizeof(after)), 0, "a fenced apply changed rows");
    for (uint32_t i = 0; i < NSHARDS; i++)
        cr_assert_eq(mt_ps_examples_applied(c.ps[i]), 32, "shard %u", i);
    /* a write cannot raise the epoch (only a Restore claims): a huge one from a client
     * without the admin token locks nobody out */
    mt_psc_t *rogue = tu_psc_connect(c.addr, NSHARDS);
    mt_psc_set_epoch(rogue, UINT64_MAX);
    cr_assert_eq(try_step(rogue, fids, 32, 0, 0.0f, &st), MT_OK, "%s", st.message);
    mt_psc_destroy(rogue);
    for (uint32_t i = 0; i < NSHARDS; i++) {
        Monolith__V1__StatsResponse *s = stats(&c, i);
        cr_assert_eq(s->epoch, eb_epoch, "shard %u", i);
        monolith__v1__stats_response__free_unpacked(s, NULL);
    }
    /* A's coordinator stops on everything: checkpoint, check, recovery */
    cr_assert_eq(mt_coord_checkpoint(a, o1, 1, &id, &ex, eb, sizeof(eb)), MT_FENCED);
    cr_log_info("the first coordinator's checkpoint: %s", eb);
    cr_assert_eq(mt_coord_check(a, eb, sizeof(eb)), MT_FENCED);
    cr_assert(strstr(eb, "another trainer took over"), "%s", eb);
    cr_assert_eq(mt_coord_recover(a, &pt, eb, sizeof(eb)), MT_FENCED);
    /* B goes on */
    cr_assert_eq(try_step(b_client, fids, 32, 32, 0.5f, &st), MT_OK, "%s", st.message);
    mt_psc_offset_t o2[1] = {{"examples", 0, 64}};
    cr_assert_eq(mt_coord_checkpoint(b, o2, 1, &id, &ex, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(ex, 64);
    cr_assert_eq(mt_coord_check(b, eb, sizeof(eb)), MT_OK, "%s", eb);
    /* a shard restarted from its newest checkpoint (B's) keeps fencing A */
    restart_shard(&c, 1);
    Monolith__V1__StatsResponse *s1 = stats(&c, 1);
    cr_assert_eq(s1->epoch, eb_epoch, "the restarted shard's epoch comes from its checkpoint");
    monolith__v1__stats_response__free_unpacked(s1, NULL);
    cr_assert_eq(try_step(c.client, fids, 32, 32, 0.5f, &st), MT_FENCED, "%s", st.message);
    /* a client that is no coordinator (epoch 0: at-least-once trainers, tools) is not fenced */
    mt_psc_t *plain = tu_psc_connect(c.addr, NSHARDS);
    cr_assert_eq(try_step(plain, fids, 32, 0, 0.1f, &st), MT_OK, "%s", st.message);
    mt_psc_destroy(plain);
    mt_coord_destroy(a);
    mt_coord_destroy(b);
    mt_psc_destroy(b_client);
    cluster_stop(&c);
}

/* ============================== marks: applies exactly once ============================== */

TestSuite(ps_marks, .fini = remove_dir, .timeout = 120);

/* One covered step: a training lookup, then gradients g with the cover [lo, hi) of
 * "examples"/partition p (examples = hi - lo). @returns the apply's error; *skipped the
 * shards that skipped it. */
static mt_err_t covered(mt_psc_t *psc, const uint64_t *fids, size_t n, float g, int32_t p,
                        int64_t lo, int64_t hi, int first, uint32_t *skipped, mt_rpc_status_t *st) {
    size_t nf = 0;
    for (size_t i = 0; i < n; i++)
        nf += dim_of(fids[i]);
    float *out = calloc(nf, sizeof(float)), *grads = malloc(nf * sizeof(float));
    for (size_t k = 0; k < nf; k++)
        grads[k] = g;
    mt_psc_range_t r = {"examples", p, lo, hi, first};
    mt_err_t err = mt_psc_lookup(psc, fids, n, 1, 100, out, nf, NULL, st);
    if (!err)
        err = mt_psc_apply_cover(psc, fids, n, grads, nf, 100, 1, (uint64_t)(hi - lo), &r, 1,
                                 skipped, NULL, NULL, st);
    free(out);
    free(grads);
    return err;
}

/* The mark of "examples"/p in shard i's list k (-1: none). */
static int64_t mark_of(cluster_t *c, uint32_t i, int k, int32_t p) {
    mt_psc_shard_ckpt_t out[NSHARDS];
    cr_assert_eq(mt_psc_marks(c->client, 5000, out), MT_OK);
    int64_t m = -1;
    for (size_t j = 0; j < out[i].nmarks[k]; j++)
        if (out[i].marks[k][j].partition == p && !strcmp(out[i].marks[k][j].topic, "examples"))
            m = out[i].marks[k][j].offset;
    mt_psc_shard_ckpt_free(out, NSHARDS);
    return m;
}

static double metric(cluster_t *c, uint32_t i, const char *line_prefix) {
    char *body = NULL;
    size_t len = 0;
    cr_assert_eq(mt_ps_render_metrics(c->ps[i], NULL, &body, &len), MT_OK);
    const char *at = strstr(body, line_prefix);
    double v = at ? strtod(at + strlen(line_prefix), NULL) : -1;
    free(body);
    return v;
}

/* ps.snapshot_full_every 3: whole, incremental, incremental, whole; a restart and a Restore
 * of any of them give back exactly the state it captured; the first after a restore is whole. */
Test(ps_ckpt, incremental_snapshots_restore_exactly) {
    cluster_t c;
    cluster_start_every(&c, 1, 3);
    enum { B = 64 };
    uint64_t fids[4 * B];
    batch(fids, 4 * B, 5000);
    float at[5][4 * B * 8];
    int inc[5] = {0};
    char eb[512] = "";
    for (int k = 1; k <= 4; k++) {
        /* new ids each round, and more steps on the older ones */
        step(&c, fids, (size_t)k * B, 10, 0.05f * (float)k);
        mt_ps_snapshot_req_t req = {.local = 1};
        for (uint32_t i = 0; i < NSHARDS; i++) {
            mt_ps_ckpt_result_t res;
            cr_assert_eq(mt_ps_snapshot(c.ps[i], &req, &res, eb, sizeof(eb)), MT_OK, "%s", eb);
            cr_assert_eq(res.checkpoint_id, (uint64_t)k);
            if (i == 0) inc[k] = res.incremental;
            cr_assert_eq(res.incremental, inc[k], "both shards alike");
        }
        lookup(&c, fids, 4 * B, at[k]);
    }
    cr_assert_eq(inc[1], 0, "the first is whole");
    cr_assert_eq(inc[2], 1);
    cr_assert_eq(inc[3], 1);
    cr_assert_eq(inc[4], 0, "one in 3 is whole");
    cr_assert_eq(metric(&c, 0, "monolith_ps_snapshots_incremental_total{shard=\"0\"} "), 2);
    /* a restart loads the newest: whole (4) */
    step(&c, fids, 4 * B, 10, 0.5f);
    restart_shard(&c, 1);
    restart_shard(&c, 0);
    float got[4 * B * 8];
    lookup(&c, fids, 4 * B, got);
    cr_assert_eq(memcmp(got, at[4], sizeof(got)), 0, "restart: the state of checkpoint 4");
    /* Restore of an incremental one: the chain 1 + 2 + 3 */
    for (uint64_t id = 3; id >= 2; id--) {
        for (uint32_t i = 0; i < NSHARDS; i++) {
            mt_ps_ckpt_result_t res;
            cr_assert_eq(mt_ps_restore(c.ps[i], id, &res, eb, sizeof(eb)), MT_OK, "%s", eb);
        }
        lookup(&c, fids, 4 * B, got);
        cr_assert_eq(memcmp(got, at[id], sizeof(got)), 0, "restore of %" PRIu64, id);
        cr_assert_eq(examples_of(&c, 0), 10 * id);
    }
    /* after a restore the next snapshot is whole, then incremental again */
    step(&c, fids, 4 * B, 10, 0.25f);
    for (int k = 0; k < 2; k++) {
        mt_ps_snapshot_req_t req = {.local = 1};
        mt_ps_ckpt_result_t res;
        cr_assert_eq(mt_ps_snapshot(c.ps[0], &req, &res, eb, sizeof(eb)), MT_OK, "%s", eb);
        cr_assert_eq(res.incremental, k, "snapshot %d after the restore", k);
        step(&c, fids, B, 10, 0.125f);
    }
    cluster_stop(&c);
}

Test(ps_marks, the_rule_applied_next_and_out_of_order) {
    cluster_t c;
    cluster_start(&c, 1);
    enum { B = 16 };
    uint64_t fids[B];
    batch(fids, B, 500);
    float before[B * 8], after[B * 8], now[B * 8];
    mt_rpc_status_t st;
    uint32_t sk = 0;
    /* a partition without a mark takes offset 0, or a range marked first, nothing else */
    cr_assert_eq(covered(c.client, fids, B, 0.1f, 0, 100, 110, 0, &sk, &st), MT_OUT_OF_ORDER);
    cr_assert(strstr(st.message, "no mark of partition examples/0"), "%s", st.message);
    cr_assert_eq(covered(c.client, fids, B, 0.1f, 0, 0, 10, 0, &sk, &st), MT_OK, "%s", st.message);
    cr_assert_eq(sk, 0);
    cr_assert_eq(covered(c.client, fids, B, 0.1f, 1, 500, 520, 1, &sk, &st), MT_OK, "%s",
                 st.message);
    for (uint32_t i = 0; i < NSHARDS; i++) {
        cr_assert_eq(mark_of(&c, i, MT_PSC_MARKS, 0), 10, "shard %u", i);
        cr_assert_eq(mark_of(&c, i, MT_PSC_MARKS, 1), 520, "shard %u", i);
        cr_assert_eq(mark_of(&c, i, MT_PSC_DURABLE_MARKS, 0), -1, "no checkpoint yet");
        cr_assert_eq(examples_of(&c, i), 30);
    }
    lookup(&c, fids, B, before);
    /* next: applied; the same again (a lost response retried): skipped on every shard */
    cr_assert_eq(covered(c.client, fids, B, 0.1f, 0, 10, 20, 0, &sk, &st), MT_OK, "%s", st.message);
    cr_assert_eq(sk, 0);
    lookup(&c, fids, B, after);
    cr_assert_neq(memcmp(before, after, sizeof(after)), 0, "the step changed the rows");
    cr_assert_eq(covered(c.client, fids, B, 0.1f, 0, 10, 20, 0, &sk, &st), MT_OK, "%s", st.message);
    cr_assert_eq(sk, NSHARDS, "a replayed step is skipped by every shard");
    /* an older step inside the mark: skipped too */
    cr_assert_eq(covered(c.client, fids, B, 0.1f, 0, 0, 10, 0, &sk, &st), MT_OK, "%s", st.message);
    cr_assert_eq(sk, NSHARDS);
    lookup(&c, fids, B, now);
    cr_assert_eq(memcmp(after, now, sizeof(now)), 0, "skipped steps change nothing");
    for (uint32_t i = 0; i < NSHARDS; i++)
        cr_assert_eq(examples_of(&c, i), 40, "skipped steps count no examples");
    /* a gap, an overlap: refused, nothing changes */
    cr_assert_eq(covered(c.client, fids, B, 0.1f, 0, 25, 30, 0, &sk, &st), MT_OUT_OF_ORDER);
    cr_assert(strstr(st.message, "is at 20, the step holds 25-30 (a gap)"), "%s", st.message);
    cr_assert_eq(covered(c.client, fids, B, 0.1f, 0, 15, 30, 0, &sk, &st), MT_OUT_OF_ORDER);
    cr_assert(strstr(st.message, "(an overlap)"), "%s", st.message);
    lookup(&c, fids, B, now);
    cr_assert_eq(memcmp(after, now, sizeof(now)), 0, "refused steps change nothing");
    /* a step of two partitions: one applied and one next is out of order as a whole */
    float g[B * 8];
    for (size_t k = 0; k < B * 8; k++)
        g[k] = 0.2f;
    mt_psc_range_t two[2] = {{"examples", 0, 10, 20, 0}, {"examples", 1, 520, 530, 0}};
    cr_assert_eq(
        mt_psc_apply_cover(c.client, fids, B, g, B * 8, 100, 1, 20, two, 2, &sk, NULL, NULL, &st),
        MT_OUT_OF_ORDER);
    cr_assert(strstr(st.message, "applied on 1 of its 2 partitions"), "%s", st.message);
    two[0] = (mt_psc_range_t){"examples", 0, 20, 30, 0};
    cr_assert_eq(
        mt_psc_apply_cover(c.client, fids, B, g, B * 8, 100, 1, 20, two, 2, &sk, NULL, NULL, &st),
        MT_OK, "%s", st.message);
    for (uint32_t i = 0; i < NSHARDS; i++) {
        cr_assert_eq(mark_of(&c, i, MT_PSC_MARKS, 0), 30);
        cr_assert_eq(mark_of(&c, i, MT_PSC_MARKS, 1), 530);
        cr_assert_eq(examples_of(&c, i), 60);
    }
    /* bad covers: INVALID_ARGUMENT before anything is judged */
    mt_psc_range_t bad[][2] = {
        {{"examples", 0, 30, 30, 0}, {NULL, 0, 0, 0, 0}},         /* lo == hi */
        {{"exa mples", 0, 30, 40, 0}, {NULL, 0, 0, 0, 0}},        /* not a topic name */
        {{"examples", -1, 30, 40, 0}, {NULL, 0, 0, 0, 0}},        /* negative partition */
        {{"examples", 0, 30, 40, 0}, {"examples", 0, 40, 50, 0}}, /* a partition twice */
    };
    size_t nbad[] = {1, 1, 1, 2};
    for (size_t k = 0; k < sizeof(nbad) / sizeof(nbad[0]); k++) {
        cr_assert_eq(mt_psc_apply_cover(c.client, fids, B, g, B * 8, 100, 1, 1, bad[k], nbad[k],
                                        &sk, NULL, NULL, &st),
                     MT_INVALID, "bad cover %zu", k);
        cr_assert_eq(st.code, MT_RPC_INVALID_ARGUMENT);
    }
    cr_assert_eq(mark_of(&c, 0, MT_PSC_MARKS, 0), 30);
    /* counted */
    cr_assert_eq(metric(&c, 0, "monolith_ps_skipped_total{shard=\"0\",kind=\"sparse\"} "), 2);
    cr_assert_eq(metric(&c, 0, "monolith_ps_out_of_order_total{shard=\"0\",kind=\"sparse\"} "), 4);
    cr_assert_eq(
        metric(&c, 1,
               "monolith_ps_mark{shard=\"1\",kind=\"sparse\",topic=\"examples\",partition=\"1\"} "),
        530);
    cluster_stop(&c);
}

Test(ps_marks, marks_survive_a_snapshot_and_a_restart_and_the_restarted_shard_refuses) {
    cluster_t c;
    cluster_start(&c, 1);
    enum { B = 16 };
    uint64_t fids[B];
    batch(fids, B, 900);
    mt_rpc_status_t st;
    uint32_t sk;
    for (int64_t lo = 0; lo < 50; lo += 10)
        cr_assert_eq(covered(c.client, fids, B, 0.1f, 2, lo, lo + 10, 0, &sk, &st), MT_OK, "%s",
                     st.message);
    /* shard 1 writes a local snapshot at 50, then takes 2 more steps, then crashes */
    mt_ps_snapshot_req_t req = {.local = 1};
    mt_ps_ckpt_result_t res;
    char eb[512] = "";
    cr_assert_eq(mt_ps_snapshot(c.ps[1], &req, &res, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(mark_of(&c, 1, MT_PSC_DURABLE_MARKS, 2), 50);
    for (int64_t lo = 50; lo < 70; lo += 10)
        cr_assert_eq(covered(c.client, fids, B, 0.1f, 2, lo, lo + 10, 0, &sk, &st), MT_OK, "%s",
                     st.message);
    float at70[B * 8];
    lookup(&c, fids, B, at70);
    restart_shard(&c, 1);
    cr_assert_eq(mark_of(&c, 1, MT_PSC_MARKS, 2), 50, "the restarted shard is at its snapshot");
    cr_assert_eq(mark_of(&c, 1, MT_PSC_DURABLE_MARKS, 2), 50);
    cr_assert_eq(mark_of(&c, 0, MT_PSC_MARKS, 2), 70);
    cr_assert_eq(examples_of(&c, 1), 50, "its counter matches its marks");
    /* the trainer goes on at 70: shard 1 refuses, shard 0 applies */
    cr_assert_eq(covered(c.client, fids, B, 0.1f, 2, 70, 80, 0, &sk, &st), MT_OUT_OF_ORDER);
    cr_assert(strstr(st.message, "shard 1: out of order"), "%s", st.message);
    cr_assert_eq(mark_of(&c, 0, MT_PSC_MARKS, 2), 80);
    /* re-fed from the lowest mark (50), cut at the others' marks (80): shard 0 skips what it
     * holds, shard 1 applies it; then both go on together */
    for (int64_t lo = 50; lo < 80; lo += 10) {
        cr_assert_eq(covered(c.client, fids, B, 0.1f, 2, lo, lo + 10, 0, &sk, &st), MT_OK, "%s",
                     st.message);
        cr_assert_eq(sk, 1, "shard 0 skips %" PRId64, lo);
    }
    cr_assert_eq(covered(c.client, fids, B, 0.1f, 2, 80, 90, 0, &sk, &st), MT_OK, "%s", st.message);
    cr_assert_eq(sk, 0);
    for (uint32_t i = 0; i < NSHARDS; i++) {
        cr_assert_eq(mark_of(&c, i, MT_PSC_MARKS, 2), 90);
        cr_assert_eq(examples_of(&c, i), 90, "shard %u: every example exactly once", i);
    }
    cluster_stop(&c);
}

/* Threads sending covered steps while snapshots are taken: each snapshot's marks are those
 * of its rows and counter (the gate), and two threads sending the same steps (a retry racing
 * its original) apply each exactly once. */
typedef struct racer {
    cluster_t *c;
    mt_psc_t *psc;
    int64_t upto;
    _Atomic int64_t *skips;
} racer_t;

static void *race(void *arg) {
    racer_t *r = arg;
    uint64_t fid = MT_FID_MAKE(2, 7);
    float g[4] = {1, 1, 1, 1}; /* sgd: every applied step moves the row by the same amount */
    for (int64_t lo = 0; lo < r->upto;) {
        mt_psc_range_t rg = {"examples", 5, lo, lo + 1, 0};
        mt_rpc_status_t st;
        uint32_t sk = 0;
        mt_err_t e =
            mt_psc_apply_cover(r->psc, &fid, 1, g, 4, 100, 1, 1, &rg, 1, &sk, NULL, NULL, &st);
        if (e == MT_OUT_OF_ORDER) { /* the other thread is ahead: this one catches up */
            lo++;
            continue;
        }
        cr_assert_eq(e, MT_OK, "%s", st.message);
        atomic_fetch_add(r->skips, sk);
        lo++;
    }
    return NULL;
}

Test(ps_marks, racing_retries_and_snapshots_apply_each_step_once) {
    cluster_t c;
    cluster_start(&c, 1);
    uint64_t fid = MT_FID_MAKE(2, 7);
    float v0[4], v1[4];
    mt_rpc_status_t st;
    cr_assert_eq(mt_psc_lookup(c.client, &fid, 1, 1, 100, v0, 4, NULL, &st), MT_OK);
    _Atomic int64_t skips = 0;
    enum { N = 300 };
    racer_t r[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        r[i] = (racer_t){&c, tu_psc_connect(c.addr, NSHARDS), N, &skips};
        cr_assert_eq(pthread_create(&th[i], NULL, race, &r[i]), 0);
    }
    uint32_t owner = mt_route_shard_of(fid, NSHARDS);
    mt_ps_snapshot_req_t req = {.local = 1};
    char eb[512];
    /* at least 5 snapshots, and on until half the steps are in: snapshots amid the race */
    for (int k = 0; k < 5 || mt_ps_examples_applied(c.ps[owner]) < N / 2; k++) {
        mt_ps_ckpt_result_t res;
        cr_assert_eq(mt_ps_snapshot(c.ps[owner], &req, &res, eb, sizeof(eb)), MT_OK, "%s", eb);
        /* the snapshot's counter is its mark: checked below through a restart */
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        mt_psc_destroy(r[i].psc);
    }
    cr_assert_eq(mt_psc_lookup(c.client, &fid, 1, 0, 0, v1, 4, NULL, &st), MT_OK);
    cr_assert_eq(mark_of(&c, owner, MT_PSC_MARKS, 5), N);
    cr_assert_eq(examples_of(&c, owner), N, "every step applied once");
    for (int d = 0; d < 4; d++)
        cr_assert_float_eq(v0[d] - v1[d], (float)N * c.slots[1].lr, 1e-3f,
                           "the row moved by N steps exactly (dim %d)", d);
    cr_log_info("racing retries: %lld steps skipped by the shards", (long long)atomic_load(&skips));
    /* the newest snapshot: its counter equals its mark */
    restart_shard(&c, owner);
    int64_t m = mark_of(&c, owner, MT_PSC_MARKS, 5);
    cr_assert_eq((int64_t)examples_of(&c, owner), m, "a snapshot's counter and marks agree");
    cluster_stop(&c);
}

Test(ps_marks, dense_pushes_have_marks_of_their_own) {
    cluster_t c;
    cluster_start(&c, 1);
    float vals[3] = {1, 2, 3}, gv[3] = {0.5f, 0.5f, 0.5f}, got[3];
    mt_psc_tensor_t t = {"w", 1, {3, 0}, 3, vals}, g = {"w", 1, {3, 0}, 3, gv};
    mt_psc_range_t r = {"examples", 0, 0, 8, 0};
    mt_rpc_status_t st;
    int sk = -1;
    cr_assert_eq(mt_psc_push_dense_cover(c.client, &g, &t, 1, 1, &r, 1, &sk, NULL, &st), MT_OK,
                 "%s", st.message);
    cr_assert_eq(sk, 0);
    cr_assert(dense_get(&c, got));
    float first[3];
    memcpy(first, got, sizeof(first));
    r = (mt_psc_range_t){"examples", 0, 8, 16, 0};
    cr_assert_eq(mt_psc_push_dense_cover(c.client, &g, NULL, 1, 1, &r, 1, &sk, NULL, &st), MT_OK);
    cr_assert_eq(sk, 0);
    cr_assert(dense_get(&c, got));
    cr_assert_neq(memcmp(first, got, sizeof(got)), 0);
    memcpy(first, got, sizeof(first));
    cr_assert_eq(mt_psc_push_dense_cover(c.client, &g, NULL, 1, 1, &r, 1, &sk, NULL, &st), MT_OK);
    cr_assert_eq(sk, 1, "pushed before: skipped");
    cr_assert(dense_get(&c, got));
    cr_assert_eq(memcmp(first, got, sizeof(got)), 0);
    r = (mt_psc_range_t){"examples", 0, 20, 24, 0};
    cr_assert_eq(mt_psc_push_dense_cover(c.client, &g, NULL, 1, 1, &r, 1, &sk, NULL, &st),
                 MT_OUT_OF_ORDER);
    cr_assert_eq(mark_of(&c, 0, MT_PSC_DENSE_MARKS, 0), 16);
    cr_assert_eq(mark_of(&c, 0, MT_PSC_MARKS, 0), -1, "the sparse marks are apart");
    /* and they are in the snapshot */
    mt_ps_snapshot_req_t req = {.local = 1};
    mt_ps_ckpt_result_t res;
    char eb[512];
    cr_assert_eq(mt_ps_snapshot(c.ps[0], &req, &res, eb, sizeof(eb)), MT_OK, "%s", eb);
    restart_shard(&c, 0);
    cr_assert_eq(mark_of(&c, 0, MT_PSC_DENSE_MARKS, 0), 16);
    cr_assert_eq(mark_of(&c, 0, MT_PSC_DURABLE_DENSE_MARKS, 0), 16);
    cluster_stop(&c);
}
