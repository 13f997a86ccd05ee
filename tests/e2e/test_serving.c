/*
 * test_serving.c - the serving replica end to end on 127.0.0.1, in this process: two PS
 * shards (mt_ps over the rpc layer), a trainer training through them (mt_trainer with the
 * PS backend, dense parameters on shard 0), and a serving instance (mt_serving) syncing
 * from them every few hundred milliseconds, called over gRPC like any client.
 *
 *  - a training burst on a new item changes serving's score for it (polled with a deadline:
 *    nothing here asserts on speed);
 *  - ids expired on the PS disappear from serving's Lookup;
 *  - a restarted serving instance converges to the PS state (every trained id, embedding
 *    and first-order row, equal bit for bit to the PS's; the same row count); a PS shard
 *    that comes back empty (another incarnation) makes serving drop that shard's rows only;
 *  - Predict equals the model computed here from the PS's parameters (within 1e-6), and bad
 *    requests get the statuses of mt/serving.h; before the first dense pull, UNAVAILABLE
 *    and Health NOT_SERVING;
 *  - impressions of a Predict reach the features topic of an embedded Kafka (mock) as
 *    Impression messages keyed by the request id, with the served scores;
 *  - a multi-task model (mmoe) serves every task's score of every candidate as its trainer
 *    scores them (task_scores, candidate-major, and tasks = T), task 0's in scores and in
 *    the impressions; a one-task model's replies carry neither.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "monolith/v1/example.pb-c.h"
#include "monolith/v1/ps.pb-c.h"
#include "monolith/v1/serving.pb-c.h"
#include "mt/batch.h"
#include "mt/kafka.h"
#include "mt/model.h"
#include "mt/ps.h"
#include "mt/psclient.h"
#include "mt/route.h"
#include "mt/rpc.h"
#include "mt/serving.h"
#include "mt/store.h"
#include "testutil_tsan.h"
#include "mt/trainer.h"
#include "testutil_ps.h"

#define NSHARDS 2
#define NSLOTS  3 /* 1 user, 2 item, 3 item category */
#define DIM     8
#define SYNC_MS 250
#define RATE    0.25f

static const uint16_t slot_ids[NSLOTS] = {1, 2, 3};

typedef struct cluster {
    mt_table_slot_config_t slots[NSLOTS];
    size_t ntables; /* the model's table slots (din: no sequence slot) */
    mt_ps_t *ps[NSHARDS];
    mt_ps_publisher_t *pub[NSHARDS]; /* kafka set: each shard publishes its changes */
    const char *kafka;               /* NULL, or the bootstrap of the parameters topic */
    mt_rpc_server_t *srv[NSHARDS];
    char addr[NSHARDS][TU_PS_ADDR_LEN];
    const char *addrs[NSHARDS];
    mt_psc_t *psc;
    mt_trainer_t *tr;
    mt_trainer_dense_sync_t *ds;
    mt_trainer_config_t tc;
} cluster_t;

typedef struct server {
    mt_serving_t *sv;
    mt_rpc_server_t *srv;
    mt_rpc_channel_t *ch;
    char addr[64];
} server_t;

/* Sharded serving (server_start_sharded): the shards held, the peers, a failed peer's rule. */
typedef struct sharding {
    const uint32_t *held;
    uint32_t nheld;
    const char *const *peers;
    uint32_t npeers;
    int zeros;
    const char *listen; /* NULL: any free port */
    const char *kafka;  /* not NULL: follow the shards through "params" on these brokers */
} sharding_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void start_shard(cluster_t *c, uint32_t i, const char *listen) {
    mt_ps_config_t pc;
    mt_ps_config_init(&pc);
    pc.shard = i;
    pc.num_shards = NSHARDS;
    pc.table.slots = c->slots;
    pc.table.nslots = c->ntables;
    pc.table.shards_log2 = 3;
    pc.table.filter_bytes = 0;
    pc.sync_chunk_fids = 64;   /* several chunks per stream */
    pc.sync_max_followers = 1; /* below the 2 threads, as the daemon's config requires */
    cr_assert_eq(mt_ps_create(&pc, NULL, &c->ps[i]), MT_OK);
    c->srv[i] = tu_ps_serve(c->ps[i], 2, 0, listen, c->addr[i]);
    c->addrs[i] = c->addr[i];
    if (c->kafka) {
        mt_ps_publish_config_t pub;
        mt_ps_publish_config_init(&pub);
        pub.bootstrap = c->kafka;
        pub.interval_ms = 50;
        char err[256] = "";
        cr_assert_eq(mt_ps_publisher_start(c->ps[i], &pub, &c->pub[i], err, sizeof(err)), MT_OK,
                     "%s", err);
    }
}

static void stop_shard(cluster_t *c, uint32_t i) {
    mt_ps_publisher_stop(c->pub[i]);
    c->pub[i] = NULL;
    mt_ps_stop_streams(c->ps[i]); /* as monolith-ps does before its rpc shutdown */
    mt_rpc_server_destroy(c->srv[i]);
    mt_ps_destroy(c->ps[i]);
    c->srv[i] = NULL;
    c->ps[i] = NULL;
}

/* A model family and its cross layers (NULL where taken: deepfm). */
typedef struct family {
    mt_model_type_t type;
    uint32_t ncross, rank;
    const uint32_t *dims; /* [NSLOTS] per-slot dims (0: DIM), or NULL */
    uint32_t ntasks;      /* mmoe: its tasks T (0: the model's default) */
    uint32_t seq_len;     /* din: slot 1 (the user's) is the sequence, slot 2 its query */
} family_t;

/* Shards (rows idle longer than ttl_s expire, 0: never) and a trainer; with_dense: the
 * trainer keeps its dense parameters on shard 0 (which gives serving a model). */
/* @p mean: the slots pooled by mean, [NSLOTS] parallel to slot_ids (NULL: all summed);
 * @p fam: the model (NULL: deepfm). Serving started on the cluster pools and scores as its
 * trainer does. */
static void cluster_start_model(cluster_t *c, uint32_t ttl_s, int with_dense, const char *kafka,
                                const uint8_t *mean, const family_t *fam, const uint64_t *buckets) {
    memset(c, 0, sizeof(*c));
    c->kafka = kafka;
    mt_trainer_config_init(&c->tc);
    if (mean) memcpy(c->tc.slot_mean, mean, NSLOTS);
    if (buckets) memcpy(c->tc.slot_hash_buckets, buckets, NSLOTS * sizeof(uint64_t));
    if (fam) {
        c->tc.family.type = fam->type;
        c->tc.family.ncross = fam->ncross;
        c->tc.family.cross_rank = fam->rank;
        if (fam->ntasks) c->tc.family.ntasks = fam->ntasks;
        if (fam->type == MT_MODEL_DIN) {
            c->tc.family.seq_slot = 0;
            c->tc.family.seq_query = 1;
            c->tc.family.seq_len = fam->seq_len;
        }
        if (fam->dims) memcpy(c->tc.slot_dim, fam->dims, NSLOTS * sizeof(uint32_t));
    }
    c->tc.nslots = NSLOTS;
    memcpy(c->tc.slot_ids, slot_ids, sizeof(slot_ids));
    c->tc.dim = DIM;
    c->tc.hidden[0] = 16;
    c->tc.hidden[1] = 8;
    c->tc.sparse_lr = 0.2f;
    c->tc.dense_lr = 0.01f;
    cr_assert_eq(mt_trainer_slot_configs(&c->tc, c->slots, NSLOTS, &c->ntables), MT_OK);
    /* one table slot per model slot, but a din sequence's (it reads its query's rows) */
    cr_assert_eq(c->ntables, (size_t)(NSLOTS - (fam && fam->type == MT_MODEL_DIN)));
    for (size_t i = 0; i < c->ntables; i++)
        c->slots[i].ttl_s = ttl_s;
    for (uint32_t i = 0; i < NSHARDS; i++)
        start_shard(c, i, "127.0.0.1:0");
    c->psc = tu_psc_connect(c->addr, NSHARDS);
    mt_trainer_backend_t be;
    mt_trainer_backend_psc(c->psc, &be);
    c->tc.backend = &be;
    cr_assert_eq(mt_trainer_create(&c->tc, &c->tr), MT_OK);
    c->tc.backend = NULL;
    char err[256] = "";
    if (with_dense)
        cr_assert_eq(mt_trainer_dense_sync_create(c->tr, c->psc, 1, &c->ds, err, sizeof(err)),
                     MT_OK, "%s", err);
}

static void cluster_start_mean(cluster_t *c, uint32_t ttl_s, int with_dense, const char *kafka,
                               const uint8_t *mean) {
    cluster_start_model(c, ttl_s, with_dense, kafka, mean, NULL, NULL);
}

static void cluster_start_kafka(cluster_t *c, uint32_t ttl_s, int with_dense, const char *kafka) {
    cluster_start_mean(c, ttl_s, with_dense, kafka, NULL);
}

static void cluster_start(cluster_t *c, uint32_t ttl_s, int with_dense) {
    cluster_start_kafka(c, ttl_s, with_dense, NULL);
}

static void cluster_stop(cluster_t *c) {
    mt_trainer_dense_sync_destroy(c->ds);
    mt_trainer_destroy(c->tr);
    mt_psc_destroy(c->psc);
    for (uint32_t i = 0; i < NSHARDS; i++)
        if (c->srv[i]) stop_shard(c, i);
}

static uint64_t fid(uint16_t slot, uint64_t v) {
    return mt_fid_of_int(slot, v);
}

/* A batch of n examples of (user u + k, item, category item % 7) with the given label,
 * trained at time now (touch time of the rows). A multi-task model's other tasks learn other
 * functions of the item: task 1 bit 1 of its id, task 2 whether 3 divides it, task 3 bit 2. */
static void train(cluster_t *c, uint64_t user0, uint64_t item, float label, int n, uint32_t now) {
    mt_batch_t b;
    cr_assert_eq(mt_batch_init(&b, slot_ids, NSLOTS), MT_OK);
    const uint32_t T = mt_trainer_ntasks(c->tr);
    cr_assert_eq(mt_batch_set_tasks(&b, T), MT_OK);
    const float labels[4] = {label, (float)((item >> 1) & 1), (float)(item % 3 == 0),
                             (float)((item >> 2) & 1)};
    cr_assert_leq(T, 4);
    for (int k = 0; k < n; k++) {
        uint64_t f[NSLOTS] = {fid(1, user0 + (uint64_t)k), fid(2, item), fid(3, item % 7)};
        const uint64_t *per[NSLOTS] = {&f[0], &f[1], &f[2]};
        uint32_t counts[NSLOTS] = {1, 1, 1};
        cr_assert_eq(mt_batch_add_labels(&b, labels, 0, 1.0f, per, counts), MT_OK);
    }
    cr_assert_eq(mt_trainer_train(c->tr, &b, now, NULL, NULL), MT_OK);
    if (c->ds) {
        char err[256] = "";
        cr_assert_eq(mt_trainer_dense_sync_step(c->ds, NULL, err, sizeof(err)), MT_OK, "%s", err);
    }
    mt_batch_free(&b);
}

/* stream_ms: serving's sync_stream_ms (0: poll every SYNC_MS); max_message_bytes: the rpc
 * server's limit, given to serving too as the daemon does (0: the defaults). */
static void server_start_cfg(server_t *s, cluster_t *c, uint32_t max_candidates,
                             mt_kafka_producer_t *producer, uint32_t stream_ms,
                             uint32_t max_message_bytes, const sharding_t *sh) {
    memset(s, 0, sizeof(*s));
    mt_serving_config_t sc;
    mt_serving_config_init(&sc);
    sc.ps_addrs = c->addrs;
    sc.num_shards = NSHARDS;
    sc.nslots = NSLOTS;
    memcpy(sc.slot_ids, slot_ids, sizeof(slot_ids));
    memcpy(sc.slot_mean, c->tc.slot_mean, NSLOTS);
    memcpy(sc.slot_hash_buckets, c->tc.slot_hash_buckets, NSLOTS * sizeof(uint64_t));
    memcpy(sc.slot_dim, c->tc.slot_dim, NSLOTS * sizeof(uint32_t));
    sc.family = c->tc.family;
    sc.dim = DIM;
    sc.nhidden = 2;
    sc.hidden[0] = 16;
    sc.hidden[1] = 8;
    sc.table.slots = c->slots;
    sc.table.nslots = c->ntables;
    sc.table.shards_log2 = 2;
    sc.negative_rate = RATE;
    sc.sync_interval_ms = SYNC_MS;
    sc.sync_stream_ms = stream_ms;
    sc.dense_sync_interval_ms = SYNC_MS;
    sc.sync_timeout_ms = 10000;
    sc.sync_chunk_fids = 50;
    sc.max_candidates = max_candidates;
    sc.workers = 2;
    sc.producer = producer;
    if (max_message_bytes) sc.max_message_bytes = max_message_bytes;
    if (sh && sh->kafka) {
        sc.sync_kafka = 1;
        sc.kafka_bootstrap = sh->kafka;
    }
    if (sh) {
        sc.held_shards = sh->held;
        sc.nheld = sh->nheld;
        sc.peer_addrs = sh->peers;
        sc.npeers = sh->npeers;
        sc.peer_zeros = sh->zeros;
        sc.peer_timeout_ms = 10000; /* what a peer's failure is, not how fast it answers */
        sc.peer_refresh_ms = 200;
    }
    char err[256] = "";
    cr_assert_eq(mt_serving_create(&sc, &s->sv, err, sizeof(err)), MT_OK, "%s", err);
    mt_rpc_server_config_t rc;
    mt_rpc_server_config_init(&rc);
    rc.threads = 2;
    if (sh && sh->listen) rc.listen = sh->listen;
    if (max_message_bytes) rc.max_message_bytes = max_message_bytes;
    cr_assert_eq(mt_rpc_server_create(&rc, &s->srv), MT_OK);
    cr_assert_eq(mt_serving_register(s->sv, s->srv), MT_OK);
    int port;
    cr_assert_eq(mt_rpc_server_start(s->srv, &port), MT_OK);
    snprintf(s->addr, sizeof(s->addr), "127.0.0.1:%d", port);
    mt_rpc_client_config_t cc;
    mt_rpc_client_config_init(&cc);
    cc.retries = 0;
    cr_assert_eq(mt_rpc_channel_create(s->addr, &cc, &s->ch), MT_OK);
    cr_assert_eq(mt_serving_start(s->sv), MT_OK);
}

static void server_start_ex(server_t *s, cluster_t *c, uint32_t max_candidates,
                            mt_kafka_producer_t *producer, uint32_t stream_ms,
                            uint32_t max_message_bytes) {
    server_start_cfg(s, c, max_candidates, producer, stream_ms, max_message_bytes, NULL);
}

static void server_start(server_t *s, cluster_t *c, uint32_t max_candidates,
                         mt_kafka_producer_t *producer) {
    server_start_ex(s, c, max_candidates, producer, 50, 0);
}

static void server_stop(server_t *s) {
    mt_rpc_channel_destroy(s->ch);
    mt_rpc_server_shutdown(s->srv);
    mt_serving_destroy(s->sv);
    mt_rpc_server_destroy(s->srv);
    memset(s, 0, sizeof(*s));
}

static void wait_ready(server_t *s) {
    double end = now_s() + 30;
    while (!mt_serving_ready(s->sv) && now_s() < end)
        usleep(20000);
    cr_assert(mt_serving_ready(s->sv), "serving did not become ready in 30 s");
}

/* ---------------- calls ---------------- */

/* A request for one user and n candidate items (each with its category). */
typedef struct request {
    Monolith__V1__PredictRequest r;
    Monolith__V1__SlotFids user, *userp[2], extra;
    uint64_t ufid, xfid;
    Monolith__V1__Candidate cand[64], *candp[64];
    Monolith__V1__SlotFids item[64][2], *itemp[64][2];
    uint64_t ifid[64][2];
} request_t;

static void request_init(request_t *q, const char *id, uint64_t user, const uint64_t *items,
                         size_t n) {
    memset(q, 0, sizeof(*q));
    monolith__v1__predict_request__init(&q->r);
    q->r.request_id = (char *)id;
    monolith__v1__slot_fids__init(&q->user);
    q->ufid = fid(1, user);
    q->user.slot = 1;
    q->user.n_fids = 1;
    q->user.fids = &q->ufid;
    q->userp[0] = &q->user;
    q->r.n_user = 1;
    q->r.user = q->userp;
    for (size_t i = 0; i < n; i++) {
        monolith__v1__candidate__init(&q->cand[i]);
        q->cand[i].item_id = items[i];
        q->ifid[i][0] = fid(2, items[i]);
        q->ifid[i][1] = fid(3, items[i] % 7);
        for (int k = 0; k < 2; k++) {
            monolith__v1__slot_fids__init(&q->item[i][k]);
            q->item[i][k].slot = (uint32_t)(2 + k);
            q->item[i][k].n_fids = 1;
            q->item[i][k].fids = &q->ifid[i][k];
            q->itemp[i][k] = &q->item[i][k];
        }
        q->cand[i].n_item = 2;
        q->cand[i].item = q->itemp[i];
        q->candp[i] = &q->cand[i];
    }
    q->r.n_candidates = n;
    q->r.candidates = q->candp;
}

/* Calls method with the packed message; @returns the status code; *resp malloc'd. */
static int call(server_t *s, const char *method, const ProtobufCMessage *m, uint8_t **resp,
                size_t *rlen, char *msg, size_t msglen) {
    size_t len = m ? protobuf_c_message_get_packed_size(m) : 0;
    uint8_t *buf = malloc(len ? len : 1);
    if (m) protobuf_c_message_pack(m, buf);
    mt_rpc_status_t st = {0};
    char path[128]; /* the caller's buffer: mt_rpc_call copies it (test_rpc) */
    snprintf(path, sizeof(path), "/monolith.v1.Serving/%s", method);
    mt_err_t err = mt_rpc_call(s->ch, path, buf, len, 60000, resp, rlen, &st); /* a hang guard */
    free(buf);
    if (err == MT_UNAVAILABLE) /* the server answered UNAVAILABLE (retries exhausted) */
        st.code = MT_RPC_UNAVAILABLE;
    else
        cr_assert_eq(err, MT_OK, "%s: %s", method, mt_strerror(err));
    if (msg) snprintf(msg, msglen, "%s", st.message);
    return st.code;
}

/* Predict; @returns the status; on OK scores (n), dense version (or NULL), and a multi-task
 * model's reply: *tasks (NULL: not wanted) and task_scores (n x *tasks, or NULL). Every reply
 * has n scores, and task_scores of n x tasks when tasks > 1, else none. */
static int predict_tasks(server_t *s, request_t *q, float *scores, uint64_t *dense_version,
                         uint32_t *tasks, float *task_scores) {
    uint8_t *resp = NULL;
    size_t rlen = 0;
    char msg[256];
    int code = call(s, "Predict", &q->r.base, &resp, &rlen, msg, sizeof(msg));
    if (code == MT_RPC_OK) {
        Monolith__V1__PredictResponse *p = monolith__v1__predict_response__unpack(NULL, rlen, resp);
        cr_assert_not_null(p);
        cr_assert_eq(p->n_scores, q->r.n_candidates);
        cr_assert_neq(p->tasks, 1, "one task: tasks is left out (0)");
        cr_assert_eq(p->n_task_scores, p->tasks > 1 ? p->n_scores * p->tasks : 0,
                     "%zu task scores, %zu candidates of %u tasks", p->n_task_scores, p->n_scores,
                     p->tasks);
        for (size_t i = 0; i < p->n_scores; i++)
            scores[i] = p->scores[i];
        if (dense_version) *dense_version = p->dense_version;
        if (tasks) *tasks = p->tasks;
        if (task_scores && p->n_task_scores)
            memcpy(task_scores, p->task_scores, p->n_task_scores * sizeof(float));
        monolith__v1__predict_response__free_unpacked(p, NULL);
    }
    free(resp);
    return code;
}

static int predict(server_t *s, request_t *q, float *scores, uint64_t *dense_version) {
    return predict_tasks(s, q, scores, dense_version, NULL, NULL);
}

/* Serving's Lookup of n fids: values (sum of dims) and found flags. @returns the status. */
static int serving_lookup(server_t *s, const uint64_t *fids, size_t n, int train, float *values,
                          size_t nvalues, uint8_t *found) {
    Monolith__V1__LookupRequest rq = MONOLITH__V1__LOOKUP_REQUEST__INIT;
    rq.fids = (uint64_t *)fids;
    rq.n_fids = n;
    rq.train = train;
    uint8_t *resp = NULL;
    size_t rlen = 0;
    int code = call(s, "Lookup", &rq.base, &resp, &rlen, NULL, 0);
    if (code == MT_RPC_OK) {
        Monolith__V1__LookupResponse *p = monolith__v1__lookup_response__unpack(NULL, rlen, resp);
        cr_assert_not_null(p);
        cr_assert_eq(p->n_values, nvalues);
        cr_assert_eq(p->found.len, n);
        memcpy(values, p->values, nvalues * sizeof(float));
        memcpy(found, p->found.data, n);
        monolith__v1__lookup_response__free_unpacked(p, NULL);
    }
    free(resp);
    return code;
}

/* The fids of every id of the given users and items (each row: the embedding, then the
 * first-order weight). */
static size_t all_fids(uint64_t *out, size_t cap, uint64_t user0, size_t nusers,
                       const uint64_t *items, size_t nitems) {
    size_t n = 0;
    for (size_t i = 0; i < nusers && n + 1 <= cap; i++)
        out[n++] = fid(1, user0 + i);
    for (size_t i = 0; i < nitems && n + 2 <= cap; i++) {
        out[n++] = fid(2, items[i]);
        out[n++] = fid(3, items[i] % 7);
    }
    return n;
}

static size_t nfloats(const uint64_t *fids, size_t n) {
    (void)fids;
    return n * (DIM + 1);
}

/* The floats of fids' rows packed by their slots' dims (slot ids 1..NSLOTS are the model
 * slots 0..NSLOTS-1; a slot_dim of 0 is DIM). */
static size_t packed_floats(const cluster_t *c, const uint64_t *fids, size_t n) {
    size_t nf = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t d = c->tc.slot_dim[(fids[i] >> 48) - 1];
        nf += (d ? d : DIM) + 1;
    }
    return nf;
}

/* Polls until serving's Lookup of fids equals the PS's (values bit for bit, found flags) and
 * the replica has as many rows as the shards. @returns 1 if it converged before the end. */
static int converged(server_t *s, cluster_t *c, const uint64_t *fids, size_t n, double secs) {
    size_t nf = packed_floats(c, fids, n);
    float *a = malloc(nf * sizeof(float)), *b = malloc(nf * sizeof(float));
    uint8_t *fa = malloc(n), *fb = malloc(n);
    double end = now_s() + secs;
    int ok = 0;
    while (!ok && now_s() < end) {
        mt_rpc_status_t st;
        if (mt_psc_lookup(c->psc, fids, n, 0, 0, b, nf, fb, &st) != MT_OK) {
            usleep(50000); /* a shard restarting: its channel reconnects */
            continue;
        }
        cr_assert_eq(serving_lookup(s, fids, n, 0, a, nf, fa), MT_RPC_OK);
        uint64_t rows = 0;
        for (int i = 0; i < NSHARDS; i++) {
            mt_table_stats_t ts;
            mt_table_stats(mt_ps_table(c->ps[i]), &ts);
            rows += ts.rows;
        }
        mt_table_stats_t rs;
        mt_table_stats(mt_serving_table(s->sv), &rs);
        ok = !memcmp(a, b, nf * sizeof(float)) && !memcmp(fa, fb, n) && rows == rs.rows;
        if (!ok) usleep(50000);
    }
    free(a);
    free(b);
    free(fa);
    free(fb);
    return ok;
}

/* ---------------- tests ---------------- */

/* (1) A burst of clicks on a new item moves its score, through the PS and the sync:
 * following the shards' change streams (stream_ms > 0) or polling every SYNC_MS. */
static void burst_changes_score(uint32_t stream_ms) {
    cluster_t c;
    cluster_start(&c, 0, 1);
    uint32_t now = (uint32_t)time(NULL);
    for (uint64_t it = 0; it < 20; it++)
        train(&c, 1000, it, it % 3 == 0 ? 1.0f : 0.0f, 20, now);
    server_t s;
    server_start_ex(&s, &c, 100, NULL, stream_ms, 0);
    wait_ready(&s);
    const uint64_t items[2] = {5, 777777};
    request_t q;
    request_init(&q, "req-1", 1003, items, 2);
    float s0[2], s1[2];
    cr_assert_eq(predict(&s, &q, s0, NULL), MT_RPC_OK);
    /* the new item has no row yet: serving reads zeros */
    uint64_t f = fid(2, 777777);
    float v[DIM + 1]; /* a row: the embedding, then the first-order weight */
    uint8_t found = 1;
    cr_assert_eq(serving_lookup(&s, &f, 1, 0, v, DIM + 1, &found), MT_RPC_OK);
    cr_assert_eq(found, 0);
    for (int k = 0; k < 10; k++)
        train(&c, 1000, 777777, 1.0f, 50, now);
    double t0 = now_s(), end = t0 + 30;
    int changed = 0;
    while (!changed && now_s() < end) {
        cr_assert_eq(predict(&s, &q, s1, NULL), MT_RPC_OK);
        changed = s1[1] != s0[1];
        if (!changed) usleep(20000);
    }
    cr_assert(changed, "the new item's score did not change in 30 s");
    cr_log_info("score of the new item changed %.3f s after the burst (%s %u ms)", now_s() - t0,
                stream_ms ? "following, rounds every" : "polling every",
                stream_ms ? stream_ms : SYNC_MS);
    /* it converges to the PS: the row is there and the item scores higher than before */
    const uint64_t ids[1] = {777777};
    uint64_t fids[64];
    size_t n = all_fids(fids, 64, 1000, 50, ids, 1);
    cr_assert(converged(&s, &c, fids, n, 30));
    cr_assert_eq(serving_lookup(&s, &f, 1, 0, v, DIM + 1, &found), MT_RPC_OK);
    cr_assert_eq(found, 1);
    cr_assert_eq(predict(&s, &q, s1, NULL), MT_RPC_OK);
    cr_assert_gt(s1[1], s0[1], "clicks should raise the score: %g -> %g", s0[1], s1[1]);
    mt_serving_shard_status_t st;
    for (uint32_t i = 0; i < NSHARDS; i++) {
        cr_assert_eq(mt_serving_shard_status(s.sv, i, &st), MT_OK);
        cr_assert_geq(st.syncs, 2);
        cr_assert_eq(st.full_syncs, 1, "one full sync at start, then incremental ones");
    }
    char *body = NULL;
    size_t blen = 0;
    cr_assert_eq(mt_serving_render_metrics(s.sv, NULL, &body, &blen), MT_OK);
    cr_assert(strstr(body, "monolith_serving_sync_lag_seconds{shard=\"1\"}"));
    cr_assert(strstr(body, "monolith_serving_predict_seconds_bucket{le=\"+Inf\"}"));
    free(body);
    server_stop(&s);
    cluster_stop(&c);
}

Test(serving, training_burst_on_a_new_item_changes_its_score, .timeout = 120) {
    burst_changes_score(50);
}

Test(serving, training_burst_changes_the_score_when_polling, .timeout = 120) {
    burst_changes_score(0);
}

/* (2) Rows the PS expires disappear from serving. */
Test(serving, expired_ids_disappear, .timeout = 120) {
    cluster_t c;
    cluster_start(&c, 600, 1);
    uint32_t now = (uint32_t)time(NULL);
    const uint64_t old_items[3] = {100, 101, 102}, new_items[2] = {201, 202};
    /* categories 2, 3, 4 (old) and 5, 6 (new): no row shared by old and new */
    for (int i = 0; i < 3; i++)
        train(&c, 5000, old_items[i], 1.0f, 10, now - 3600); /* idle for an hour */
    for (int i = 0; i < 2; i++)
        train(&c, 6000, new_items[i], 0.0f, 10, now);
    server_t s;
    server_start(&s, &c, 100, NULL);
    wait_ready(&s);
    uint64_t olds[64], news[64];
    size_t no = all_fids(olds, 64, 5000, 10, old_items, 3);
    size_t nn = all_fids(news, 64, 6000, 10, new_items, 2);
    cr_assert(converged(&s, &c, olds, no, 30));
    size_t nf = nfloats(olds, no);
    float *v = malloc(nfloats(news, nn) * sizeof(float) + nf * sizeof(float));
    uint8_t found[64];
    cr_assert_eq(serving_lookup(&s, olds, no, 0, v, nf, found), MT_RPC_OK);
    for (size_t i = 0; i < no; i++)
        cr_assert_eq(found[i], 1, "id %zu not synced", i);
    /* the shards' expiry: everything idle for an hour goes (a whole sweep per shard) */
    uint64_t expired = 0;
    for (int i = 0; i < NSHARDS; i++) {
        mt_table_t *t = mt_ps_table(c.ps[i]);
        expired += mt_ps_expire_tick(c.ps[i], now, (size_t)mt_table_buckets(t));
    }
    cr_assert_eq(expired, no);
    double end = now_s() + 30;
    int gone = 0;
    while (!gone && now_s() < end) {
        cr_assert_eq(serving_lookup(&s, olds, no, 0, v, nf, found), MT_RPC_OK);
        gone = 1;
        for (size_t i = 0; i < no; i++)
            gone &= found[i] == 0;
        if (!gone) usleep(20000);
    }
    cr_assert(gone, "expired ids still served after 30 s");
    cr_assert(converged(&s, &c, news, nn, 30), "the rows that did not expire must stay");
    cr_assert_eq(serving_lookup(&s, news, nn, 0, v, nfloats(news, nn), found), MT_RPC_OK);
    for (size_t i = 0; i < nn; i++)
        cr_assert_eq(found[i], 1);
    uint64_t deleted = 0;
    for (uint32_t i = 0; i < NSHARDS; i++) {
        mt_serving_shard_status_t st;
        mt_serving_shard_status(s.sv, i, &st);
        deleted += st.deleted;
    }
    cr_assert_geq(deleted, no, "a deletion per expired row");
    free(v);
    server_stop(&s);
    cluster_stop(&c);
}

/* (3) A restarted serving instance converges to the PS; a shard that comes back empty
 * (another incarnation) takes its rows, and only its rows, out of the replica. */
Test(serving, restarted_instance_converges, .timeout = 180) {
    cluster_t c;
    cluster_start(&c, 0, 1);
    uint32_t now = (uint32_t)time(NULL);
    uint64_t items[40];
    for (int i = 0; i < 40; i++)
        items[i] = 3000 + (uint64_t)i * 13;
    for (int i = 0; i < 20; i++)
        train(&c, 100, items[i], (float)(i % 2), 25, now);
    server_t s;
    server_start(&s, &c, 100, NULL);
    wait_ready(&s);
    server_stop(&s);
    /* more training while serving is down */
    for (int i = 20; i < 40; i++)
        train(&c, 200, items[i], (float)(i % 2), 25, now);
    for (int i = 0; i < 5; i++)
        train(&c, 100, items[i], 1.0f, 25, now);
    server_start(&s, &c, 100, NULL);
    wait_ready(&s);
    static uint64_t fids[4096];
    size_t n = all_fids(fids, 4096, 100, 200, items, 40);
    cr_assert(converged(&s, &c, fids, n, 30), "the restarted replica differs from the PS");
    /* training goes on: still converges */
    for (int i = 0; i < 40; i += 3)
        train(&c, 150, items[i], 1.0f, 20, now);
    cr_assert(converged(&s, &c, fids, n, 30));

    /* shard 1 restarts empty on the same address: serving drops its rows only */
    char listen[64];
    snprintf(listen, sizeof(listen), "%s", c.addr[1]);
    stop_shard(&c, 1);
    start_shard(&c, 1, listen);
    cr_assert_str_eq(c.addr[1], listen);
    mt_table_stats_t s0;
    mt_table_stats(mt_ps_table(c.ps[0]), &s0);
    cr_assert_gt(s0.rows, 0);
    double end = now_s() + 30;
    uint64_t rows = 0;
    while (now_s() < end) {
        mt_table_stats_t rs;
        mt_table_stats(mt_serving_table(s.sv), &rs);
        rows = rs.rows;
        if (rows == s0.rows) break;
        usleep(20000);
    }
    cr_assert_eq(rows, s0.rows, "replica rows %llu, shard 0 alone has %llu",
                 (unsigned long long)rows, (unsigned long long)s0.rows);
    cr_assert(converged(&s, &c, fids, n, 30));
    mt_serving_shard_status_t st;
    mt_serving_shard_status(s.sv, 1, &st);
    cr_assert_eq(st.full_syncs, 2);
    cr_assert_eq(st.incarnation, mt_ps_incarnation(c.ps[1]));
    server_stop(&s);
    cluster_stop(&c);
}

/* The serving model built here: the PS's dense parameters (their version in *version). */
static mt_model_t *ps_model(cluster_t *c, uint64_t *version) {
    mt_model_config_t mc;
    mt_model_config_init(&mc);
    mc.nslots = NSLOTS;
    mc.dim = DIM;
    mc.nhidden = 2;
    mc.hidden[0] = 16;
    mc.hidden[1] = 8;
    mt_model_family_set(&mc, &c->tc.family);
    mt_model_t *m;
    cr_assert_eq(mt_model_create(&mc, &m), MT_OK);
    mt_psc_tensor_t ts[32];
    size_t np = mt_model_nparams(m);
    cr_assert(np <= 32);
    for (size_t i = 0; i < np; i++) {
        mt_model_param_t p;
        mt_model_param(m, i, &p);
        ts[i] = (mt_psc_tensor_t){p.name, p.ndim, {p.shape[0], p.shape[1]}, p.size, p.values};
    }
    int updated;
    mt_rpc_status_t st;
    cr_assert_eq(mt_psc_pull_dense(c->psc, ts, np, 0, version, &updated, &st), MT_OK);
    return m;
}

/* The score computed here: the PS's embeddings pooled as the trainer pools, the PS's dense
 * parameters, the same log-odds correction. */
static void local_scores(cluster_t *c, request_t *q, float *out) {
    uint64_t version;
    mt_model_t *m = ps_model(c, &version);
    mt_rpc_status_t st;
    size_t n = q->r.n_candidates;
    float *E = calloc(n * NSLOTS * DIM, sizeof(float)), *W1 = calloc(n * NSLOTS, sizeof(float));
    for (size_t i = 0; i < n; i++) {
        /* slot 1 from the user, slots 2 and 3 from the candidate */
        uint64_t f[3] = {q->ufid, q->ifid[i][0], q->ifid[i][1]};
        for (int s = 0; s < NSLOTS; s++) {
            float row[DIM + 1]; /* the embedding, then the first-order weight */
            cr_assert_eq(mt_psc_lookup(c->psc, &f[s], 1, 0, 0, row, DIM + 1, NULL, &st), MT_OK);
            memcpy(E + (i * NSLOTS + s) * DIM, row, DIM * sizeof(float));
            W1[i * NSLOTS + s] = row[DIM];
        }
    }
    cr_assert_eq(mt_model_forward_serving(m, NULL, E, W1, n, RATE, NULL, out), MT_OK);
    free(E);
    free(W1);
    mt_model_destroy(m);
}

/* (4) Predict is the model on the PS's parameters; bad requests get their statuses. */
Test(serving, predict_matches_a_local_model_and_rejects_bad_requests, .timeout = 120) {
    cluster_t c;
    cluster_start(&c, 0, 1);
    uint32_t now = (uint32_t)time(NULL);
    uint64_t items[8];
    for (int i = 0; i < 8; i++) {
        items[i] = 40 + (uint64_t)i;
        train(&c, 7000, items[i], (float)(i & 1), 30, now);
    }
    server_t s;
    server_start(&s, &c, 8, NULL);
    wait_ready(&s);
    uint64_t fids[512];
    size_t nf = all_fids(fids, 512, 7000, 30, items, 8);
    cr_assert(converged(&s, &c, fids, nf, 30));
    /* the PS's dense version reached serving too */
    request_t q;
    const uint64_t cand[8] = {40, 41, 42, 43, 44, 45, 46, 99999}; /* the last one unknown */
    request_init(&q, "req-4", 7005, cand, 8);
    float got[8], want[8];
    uint64_t dv = 0, ps_dv = mt_trainer_dense_sync_version(c.ds);
    double end = now_s() + 30;
    do {
        cr_assert_eq(predict(&s, &q, got, &dv), MT_RPC_OK);
        if (dv != ps_dv) usleep(20000);
    } while (dv != ps_dv && now_s() < end);
    cr_assert_eq(dv, ps_dv);
    local_scores(&c, &q, want);
    for (int i = 0; i < 8; i++) {
        cr_assert(fabsf(got[i] - want[i]) <= 1e-6f, "candidate %d: served %.9g, local %.9g", i,
                  got[i], want[i]);
    }

    /* a slot the model does not have is ignored (and counted) */
    uint64_t xf = fid(42, 1);
    monolith__v1__slot_fids__init(&q.extra);
    q.extra.slot = 42;
    q.extra.n_fids = 1;
    q.extra.fids = &xf;
    q.userp[1] = &q.extra;
    q.r.n_user = 2;
    float again[8];
    cr_assert_eq(predict(&s, &q, again, NULL), MT_RPC_OK);
    cr_assert_eq(memcmp(again, got, sizeof(got)), 0);
    mt_serving_counters_t k;
    mt_serving_counters(s.sv, &k);
    cr_assert_eq(k.ignored_fids, 1);
    /* a fid that is not of its SlotFids' slot */
    xf = fid(43, 1);
    char msg[256];
    uint8_t *resp = NULL;
    size_t rlen = 0;
    cr_assert_eq(call(&s, "Predict", &q.r.base, &resp, &rlen, msg, sizeof(msg)),
                 MT_RPC_INVALID_ARGUMENT);
    cr_assert(strstr(msg, "slot"), "%s", msg);
    free(resp);
    resp = NULL;
    q.r.n_user = 1;
    /* too many candidates */
    const uint64_t many[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    request_t big;
    request_init(&big, "req-big", 7005, many, 9);
    cr_assert_eq(call(&s, "Predict", &big.r.base, &resp, &rlen, msg, sizeof(msg)),
                 MT_RPC_RESOURCE_EXHAUSTED);
    free(resp);
    resp = NULL;
    /* malformed bytes */
    mt_rpc_status_t st = {0};
    const uint8_t junk[5] = {0x0a, 0x7f, 0x01, 0x02, 0x03};
    cr_assert_eq(mt_rpc_call(s.ch, "/monolith.v1.Serving/Predict", junk, sizeof(junk), 10000, &resp,
                             &rlen, &st),
                 MT_OK);
    cr_assert_eq(st.code, MT_RPC_INVALID_ARGUMENT);
    free(resp);
    resp = NULL;
    cr_assert_eq(mt_rpc_call(s.ch, "/monolith.v1.Serving/Lookup", junk, sizeof(junk), 10000, &resp,
                             &rlen, &st),
                 MT_OK);
    cr_assert_eq(st.code, MT_RPC_INVALID_ARGUMENT);
    free(resp);
    /* Lookup: training lookups and unknown slots are refused */
    float v[DIM + 1]; /* a row: the embedding, then the first-order weight */
    uint8_t found;
    uint64_t f = fid(2, 40);
    cr_assert_eq(serving_lookup(&s, &f, 1, 1, v, DIM + 1, &found), MT_RPC_INVALID_ARGUMENT);
    f = fid(42, 1);
    cr_assert_eq(serving_lookup(&s, &f, 1, 0, v, DIM + 1, &found), MT_RPC_INVALID_ARGUMENT);
    /* no candidates: no scores */
    request_t none;
    request_init(&none, "req-none", 7005, NULL, 0);
    cr_assert_eq(predict(&s, &none, got, NULL), MT_RPC_OK);
    mt_serving_counters(s.sv, &k);
    cr_assert_eq(k.errors[MT_RPC_INVALID_ARGUMENT], 5);
    cr_assert_eq(k.errors[MT_RPC_RESOURCE_EXHAUSTED], 1);
    server_stop(&s);
    cluster_stop(&c);
}

/* Mean pooling: with slots 1 (the user's) and 3 (the item's category) pooled by mean in the
 * trainer and in serving, Predict equals the model computed here from the PS's rows averaged
 * by hand, with several ids in each mean slot and a candidate adding one more id to the
 * user's slot (its count is the user's plus the candidate's). */
Test(serving, mean_pooled_slots_score_as_the_trainer_pools, .timeout = 120) {
    const uint8_t mean[NSLOTS] = {1, 0, 1};
    cluster_t c;
    cluster_start_mean(&c, 0, 1, NULL, mean);
    uint32_t now = (uint32_t)time(NULL);
    const uint64_t u = 9000, items[3] = {60, 61, 62};
    /* ids: the user's two, each item, its two categories; candidate 0 adds a third user id */
    uint64_t uf[3] = {fid(1, u), fid(1, u + 1000), fid(1, u + 2000)};
    uint64_t itf[3], cat[3][2];
    for (int i = 0; i < 3; i++) {
        itf[i] = fid(2, items[i]);
        cat[i][0] = fid(3, items[i] % 7);
        cat[i][1] = fid(3, 100 + items[i] % 5);
    }
    for (int round = 0; round < 20; round++) {
        mt_batch_t b;
        cr_assert_eq(mt_batch_init(&b, slot_ids, NSLOTS), MT_OK);
        for (int i = 0; i < 3; i++) {
            const uint64_t *per[NSLOTS] = {uf, &itf[i], cat[i]};
            uint32_t counts[NSLOTS] = {i == 0 ? 3u : 2u, 1, 2};
            cr_assert_eq(mt_batch_add(&b, (float)(i == 1), 0, 1.0f, per, counts), MT_OK);
        }
        cr_assert_eq(mt_trainer_train(c.tr, &b, now, NULL, NULL), MT_OK);
        char err[256] = "";
        cr_assert_eq(mt_trainer_dense_sync_step(c.ds, NULL, err, sizeof(err)), MT_OK, "%s", err);
        mt_batch_free(&b);
    }
    server_t s;
    server_start(&s, &c, 8, NULL);
    wait_ready(&s);
    uint64_t all[12] = {uf[0], uf[1], uf[2]};
    size_t nf = 3;
    for (int i = 0; i < 3; i++) {
        all[nf++] = itf[i];
        all[nf++] = cat[i][0];
        all[nf++] = cat[i][1];
    }
    cr_assert(converged(&s, &c, all, nf, 30));
    /* the request: the user's two ids; candidate i its item, its categories, and candidate 0
     * one more id of the user's slot */
    Monolith__V1__PredictRequest r = MONOLITH__V1__PREDICT_REQUEST__INIT;
    Monolith__V1__SlotFids user = MONOLITH__V1__SLOT_FIDS__INIT, *userp = &user;
    user.slot = 1;
    user.n_fids = 2;
    user.fids = uf;
    r.request_id = "req-mean";
    r.n_user = 1;
    r.user = &userp;
    Monolith__V1__Candidate cand[3], *candp[3];
    Monolith__V1__SlotFids sf[3][3], *sfp[3][3];
    for (int i = 0; i < 3; i++) {
        monolith__v1__candidate__init(&cand[i]);
        cand[i].item_id = items[i];
        size_t k = 0;
        monolith__v1__slot_fids__init(&sf[i][k]);
        sf[i][k].slot = 2, sf[i][k].n_fids = 1, sf[i][k].fids = &itf[i], k++;
        monolith__v1__slot_fids__init(&sf[i][k]);
        sf[i][k].slot = 3, sf[i][k].n_fids = 2, sf[i][k].fids = cat[i], k++;
        if (i == 0) {
            monolith__v1__slot_fids__init(&sf[i][k]);
            sf[i][k].slot = 1, sf[i][k].n_fids = 1, sf[i][k].fids = &uf[2], k++;
        }
        for (size_t j = 0; j < k; j++)
            sfp[i][j] = &sf[i][j];
        cand[i].n_item = k;
        cand[i].item = sfp[i];
        candp[i] = &cand[i];
    }
    r.n_candidates = 3;
    r.candidates = candp;
    /* the model here: the PS's dense parameters, its rows pooled by model.h's helpers */
    uint64_t version;
    mt_model_t *m = ps_model(&c, &version);
    mt_rpc_status_t st;
    float E[3 * NSLOTS * DIM], W1[3 * NSLOTS], want[3], got[3];
    for (int i = 0; i < 3; i++) {
        const uint64_t *ids[NSLOTS] = {uf, &itf[i], cat[i]};
        size_t cnt[NSLOTS] = {i == 0 ? 3u : 2u, 1, 2};
        for (int j = 0; j < NSLOTS; j++) {
            float *e = E + (i * NSLOTS + j) * DIM, *w1 = W1 + i * NSLOTS + j;
            for (size_t k = 0; k < cnt[j]; k++) {
                float row[DIM + 1];
                cr_assert_eq(mt_psc_lookup(c.psc, &ids[j][k], 1, 0, 0, row, DIM + 1, NULL, &st),
                             MT_OK);
                if (k == 0)
                    mt_model_pool_first(e, w1, row, DIM);
                else
                    mt_model_pool_add(e, w1, row, DIM);
            }
            if (mean[j]) mt_model_pool_scale(e, w1, mt_model_mean_scale((uint32_t)cnt[j]), DIM);
        }
    }
    cr_assert_eq(mt_model_forward_serving(m, NULL, E, W1, 3, RATE, NULL, want), MT_OK);
    mt_model_destroy(m);
    /* serving, once it has this dense version */
    double end = now_s() + 30;
    uint8_t *resp = NULL;
    size_t rlen = 0;
    char msg[256];
    Monolith__V1__PredictResponse *pr = NULL;
    do {
        if (pr) monolith__v1__predict_response__free_unpacked(pr, NULL), pr = NULL;
        free(resp);
        resp = NULL;
        cr_assert_eq(call(&s, "Predict", &r.base, &resp, &rlen, msg, sizeof(msg)), MT_RPC_OK, "%s",
                     msg);
        pr = monolith__v1__predict_response__unpack(NULL, rlen, resp);
        cr_assert_not_null(pr);
        if (pr->dense_version != version) usleep(20000);
    } while (pr->dense_version != version && now_s() < end);
    cr_assert_eq(pr->dense_version, version);
    cr_assert_eq(pr->n_scores, 3);
    memcpy(got, pr->scores, sizeof(got));
    monolith__v1__predict_response__free_unpacked(pr, NULL);
    free(resp);
    for (int i = 0; i < 3; i++)
        cr_assert(fabsf(got[i] - want[i]) <= 1e-6f, "candidate %d: served %.9g, local %.9g", i,
                  got[i], want[i]);
    server_stop(&s);
    cluster_stop(&c);
}

/* Before the first dense pull: UNAVAILABLE, Health NOT_SERVING; then SERVING. */
/*
 * Trains six items (user 7000..7029 on each, alternate labels) through the cluster's trainer,
 * starts serving on it and checks that a request's served scores are the trainer's own scores
 * of the same examples (mt_trainer_predict: its rows and dense parameters read back from the
 * PS), with serving's sampling correction, within 1e-6. A multi-task model (T > 1): every
 * task of every candidate in task_scores (candidate i's task t at i * T + t), task 0's in
 * scores, tasks = T; a one-task model's reply has no task_scores and tasks 0. @p what names
 * the case.
 */
static void served_as_trained(cluster_t *c, const char *what) {
    uint32_t now = (uint32_t)time(NULL);
    uint64_t items[6];
    for (int i = 0; i < 6; i++) {
        items[i] = 70 + (uint64_t)i;
        train(c, 7000, items[i], (float)(i & 1), 30, now);
    }
    server_t s;
    server_start(&s, c, 8, NULL);
    wait_ready(&s);
    uint64_t fids[512];
    size_t nf = all_fids(fids, 512, 7000, 30, items, 6);
    for (size_t k = 0; k < nf; k++) { /* the ids as the trainer keeps them */
        fids[k] = mt_model_reduce_fid(fids[k], c->tc.slot_hash_buckets[(fids[k] >> 48) - 1]);
        if (c->tc.family.type == MT_MODEL_DIN && fids[k] >> 48 == 1) /* a behaviour: an item */
            fids[k] = mt_model_seq_fid(fids[k], 2);
    }
    cr_assert(converged(&s, c, fids, nf, 30));
    request_t q;
    request_init(&q, "req-model", 7005, items, 6);
    const uint32_t T = mt_trainer_ntasks(c->tr);
    cr_assert(T >= 1 && T <= 4);
    float got[6], got_tasks[6 * 4], want[6 * 4];
    uint32_t tasks = 99;
    uint64_t dv = 0, ps_dv = mt_trainer_dense_sync_version(c->ds);
    double end = now_s() + 30;
    do {
        cr_assert_eq(predict_tasks(&s, &q, got, &dv, &tasks, got_tasks), MT_RPC_OK);
        if (dv != ps_dv) usleep(20000);
    } while (dv != ps_dv && now_s() < end);
    cr_assert_eq(dv, ps_dv);
    /* one task: the reply of before (no task_scores, tasks left out); T: tasks = T and
     * (predict_tasks) n x T task scores */
    cr_assert_eq(tasks, T > 1 ? T : 0, "%s: tasks %u, the model has %u", what, tasks, T);
    /* the trainer's scores of the same six examples (user 7005 trained on each item) */
    mt_batch_t b;
    cr_assert_eq(mt_batch_init(&b, slot_ids, NSLOTS), MT_OK);
    cr_assert_eq(mt_batch_set_tasks(&b, T), MT_OK);
    const float no_labels[4] = {0};
    for (int i = 0; i < 6; i++) {
        uint64_t f[NSLOTS] = {fid(1, 7005), fid(2, items[i]), fid(3, items[i] % 7)};
        const uint64_t *per[NSLOTS] = {&f[0], &f[1], &f[2]};
        uint32_t counts[NSLOTS] = {1, 1, 1};
        cr_assert_eq(mt_batch_add_labels(&b, no_labels, 0, 1.0f, per, counts), MT_OK);
    }
    cr_assert_eq(mt_trainer_predict(c->tr, &b, want), MT_OK); /* [6 x T] */
    mt_batch_free(&b);
    for (int i = 0; i < 6; i++) {
        float w = mt_model_correct_prob(want[i * T], RATE); /* task 0: the click */
        cr_expect(fabsf(got[i] - w) <= 1e-6f, "%s, candidate %d: served %.9g, trainer %.9g", what,
                  i, got[i], w);
        for (uint32_t t = 0; T > 1 && t < T; t++) {
            w = mt_model_correct_prob(want[i * T + t], RATE);
            cr_expect(fabsf(got_tasks[i * T + t] - w) <= 1e-6f,
                      "%s, candidate %d, task %u: served %.9g, trainer %.9g", what, i, t,
                      got_tasks[i * T + t], w);
        }
    }
    /* the items were trained to different labels: the scores differ */
    cr_expect(fabsf(got[0] - got[1]) > 1e-4f, "%s: %.9g %.9g", what, got[0], got[1]);
    /* and each task to its own (train()): a task in another's place would show */
    for (uint32_t t = 1; t < T; t++) {
        float most = 0;
        for (int i = 0; i < 6; i++)
            most = fmaxf(most, fabsf(got_tasks[i * T + t] - got_tasks[i * T]));
        cr_expect(most > 1e-4f, "%s: task %u scores as task 0 (%.9g apart at most)", what, t,
                  (double)most);
    }
    server_stop(&s);
}

/* dcnv2 end to end: the trainer trains it through the PS, serving follows and scores it as
 * the trainer does. Full-rank and low-rank cross layers. */
Test(serving, dcnv2_serves_the_trainers_scores, .timeout = 180) {
    const family_t fams[2] = {{MT_MODEL_DCNV2, .ncross = 2},
                              {MT_MODEL_DCNV2, .ncross = 3, .rank = 4}};
    for (int k = 0; k < 2; k++) {
        cluster_t c;
        cluster_start_model(&c, 0, 1, NULL, NULL, &fams[k], NULL);
        mt_model_param_t p;
        cr_assert_eq(mt_model_param_find(mt_trainer_model(c.tr), "cross.1.b", &p), MT_OK);
        served_as_trained(&c, k ? "dcnv2 rank 4" : "dcnv2 full rank");
        cluster_stop(&c);
    }
}

/* The trainer's scores of the six candidates (items 70..75) for a user whose slot 1 holds
 * @p nseq behaviours @p seq (din's sequence). */
static void trainer_scores(cluster_t *c, const uint64_t *seq, uint32_t nseq, float *want) {
    mt_batch_t b;
    cr_assert_eq(mt_batch_init(&b, slot_ids, NSLOTS), MT_OK);
    for (int i = 0; i < 6; i++) {
        uint64_t f[2] = {fid(2, 70 + (uint64_t)i), fid(3, (70 + (uint64_t)i) % 7)};
        const uint64_t *per[NSLOTS] = {seq, &f[0], &f[1]};
        uint32_t counts[NSLOTS] = {nseq, 1, 1};
        cr_assert_eq(mt_batch_add(&b, 0.0f, 0, 1.0f, per, counts), MT_OK);
    }
    cr_assert_eq(mt_trainer_predict(c->tr, &b, want), MT_OK);
    mt_batch_free(&b);
}

/* din end to end: slot 1 is the user's behaviour sequence (ids of items, looked up in the item
 * slot's rows), the candidate's item attends it. Serving scores as the trainer: a sequence of
 * one (the user id, as trained), of five behaviours of which seq_len = 3 are read (the same
 * scores as the first three alone), and of two (other scores). A candidate with fids in the
 * sequence slot is refused (INVALID_ARGUMENT, counted): serving would not read them, and the
 * joiner would give them to the trainer as behaviours. */
Test(serving, din_serves_the_trainers_scores, .timeout = 180) {
    const family_t fam = {MT_MODEL_DIN, .seq_len = 3};
    cluster_t c;
    cluster_start_model(&c, 0, 1, NULL, NULL, &fam, NULL);
    mt_model_param_t p;
    cr_assert_eq(mt_model_param_find(mt_trainer_model(c.tr), "att.w", &p), MT_OK);
    cr_assert_eq(p.shape[0], 4 * DIM);
    served_as_trained(&c, "din");
    server_t s;
    server_start(&s, &c, 8, NULL);
    wait_ready(&s);
    const uint64_t cand[6] = {70, 71, 72, 73, 74, 75};
    uint64_t seq[5];
    for (int j = 0; j < 5; j++) /* behaviours: items 74, 72, 70, 71, 73 */
        seq[j] = fid(1, (uint64_t[]){74, 72, 70, 71, 73}[j]);
    float got[6], want[6], first3[6], two[6];
    request_t q;
    request_init(&q, "req-din", 7005, cand, 6);
    q.user.fids = seq;
    q.user.n_fids = 5;
    cr_assert_eq(predict(&s, &q, got, NULL), MT_RPC_OK);
    trainer_scores(&c, seq, 5, want);
    for (int i = 0; i < 6; i++)
        cr_expect(fabsf(got[i] - mt_model_correct_prob(want[i], RATE)) <= 1e-6f,
                  "candidate %d: served %.9g, trainer %.9g", i, got[i],
                  mt_model_correct_prob(want[i], RATE));
    q.user.n_fids = 3;
    cr_assert_eq(predict(&s, &q, first3, NULL), MT_RPC_OK);
    q.user.n_fids = 2;
    cr_assert_eq(predict(&s, &q, two, NULL), MT_RPC_OK);
    float most = 0;
    for (int i = 0; i < 6; i++) {
        cr_expect_eq(first3[i], got[i], "candidate %d: the behaviours past 3 were read", i);
        most = fmaxf(most, fabsf(two[i] - got[i]));
    }
    cr_expect(most > 1e-6f, "a behaviour less, the same scores");
    /* a candidate's fid in the sequence slot: refused, naming the slot */
    mt_serving_counters_t k0, k1;
    mt_serving_counters(s.sv, &k0);
    uint64_t extra = fid(1, 75);
    Monolith__V1__SlotFids xs;
    monolith__v1__slot_fids__init(&xs);
    xs.slot = 1;
    xs.n_fids = 1;
    xs.fids = &extra;
    Monolith__V1__SlotFids *withx[3] = {q.itemp[0][0], q.itemp[0][1], &xs};
    q.cand[0].item = withx;
    q.cand[0].n_item = 3;
    q.user.n_fids = 5;
    uint8_t *resp = NULL;
    size_t rlen = 0;
    char msg[256] = "";
    cr_assert_eq(call(&s, "Predict", &q.r.base, &resp, &rlen, msg, sizeof(msg)),
                 MT_RPC_INVALID_ARGUMENT);
    free(resp);
    cr_expect(strstr(msg, "slot 1 is the model's behaviour sequence") != NULL, "%s", msg);
    mt_serving_counters(s.sv, &k1);
    cr_expect_eq(k1.errors[MT_RPC_INVALID_ARGUMENT], k0.errors[MT_RPC_INVALID_ARGUMENT] + 1);
    server_stop(&s);
    cluster_stop(&c);
}

/* Per-slot dims (dcnv2): the user slot of dim 8, items 3, categories 5; serving pools rows
 * of each slot's width as the trainer does. */
Test(serving, per_slot_dims_serve_as_the_trainer_pools, .timeout = 180, MT_NOT_UNDER_TSAN) {
    static const uint32_t dims[NSLOTS] = {0, 3, 5};
    const family_t fam = {MT_MODEL_DCNV2, .ncross = 2, .dims = dims};
    cluster_t c;
    cluster_start_model(&c, 0, 1, NULL, NULL, &fam, NULL);
    mt_model_param_t p;
    cr_assert_eq(mt_model_param_find(mt_trainer_model(c.tr), "cross.0.w", &p), MT_OK);
    cr_assert_eq(p.shape[0], DIM + 3 + 5);
    served_as_trained(&c, "dims 8, 3, 5");
    /* a node holding shard 0 reads shard 1's rows, each of its slot's width, from a peer
     * holding both, and scores as that peer does */
    server_t F, A;
    server_start_ex(&F, &c, 64, NULL, 50, 0);
    const uint32_t h0[1] = {0};
    const char *pa[1] = {F.addr};
    sharding_t sa = {h0, 1, pa, 1, 0, NULL, NULL};
    server_start_cfg(&A, &c, 64, NULL, 50, 0, &sa);
    wait_ready(&F);
    wait_ready(&A);
    request_t q;
    const uint64_t cand[6] = {70, 71, 72, 73, 74, 75};
    request_init(&q, "req-dims-sharded", 7005, cand, 6);
    float fs[6], as[6];
    uint64_t fv = 0, av = 1;
    double end = now_s() + 30;
    int same = 0;
    while (!same && now_s() < end) {
        int fc = predict(&F, &q, fs, &fv), ac = predict(&A, &q, as, &av);
        same = fc == MT_RPC_OK && ac == MT_RPC_OK && fv == av;
        for (int i = 0; same && i < 6; i++)
            same = fabsf(fs[i] - as[i]) <= 1e-6f;
        if (!same) usleep(20000);
    }
    for (int i = 0; i < 6; i++)
        cr_expect(fabsf(fs[i] - as[i]) <= 1e-6f, "candidate %d: sharded %.9g, full %.9g", i, as[i],
                  fs[i]);
    server_stop(&A);
    server_stop(&F);
    cluster_stop(&c);
}

/* Hash buckets per slot (trainer.slot_hash_buckets): the item slot's ids reduced modulo 4
 * (items 70..75 share rows in pairs), the others collisionless; serving reduces as the
 * trainer does, so it reads the rows the trainer trained. */
Test(serving, per_slot_hash_buckets_serve_as_the_trainer_reduces, .timeout = 120) {
    const uint64_t buckets[NSLOTS] = {0, 4, 0};
    cluster_t c;
    cluster_start_model(&c, 0, 1, NULL, NULL, NULL, buckets);
    served_as_trained(&c, "slot 2 in 4 buckets");
    /* the trainer's table holds the reduced ids only: item 70's row is item 74's */
    float r70[DIM + 1], r74[DIM + 1];
    uint64_t f70 = mt_model_reduce_fid(fid(2, 70), 4), f74 = mt_model_reduce_fid(fid(2, 74), 4);
    cr_assert_eq(f70, f74);
    mt_rpc_status_t st;
    cr_assert_eq(mt_psc_lookup(c.psc, &f70, 1, 0, 0, r70, DIM + 1, NULL, &st), MT_OK);
    cr_assert_eq(mt_psc_lookup(c.psc, &f74, 1, 0, 0, r74, DIM + 1, NULL, &st), MT_OK);
    cr_expect_arr_eq(r70, r74, sizeof(r70));
    cluster_stop(&c);
}

Test(serving, unavailable_until_the_model_arrives, .timeout = 120) {
    cluster_t c;
    cluster_start(&c, 0, 0); /* no dense parameters on the PS */
    server_t s;
    server_start(&s, &c, 10, NULL);
    usleep(3 * SYNC_MS * 1000);
    cr_assert_eq(mt_serving_ready(s.sv), 0);
    const uint64_t items[1] = {1};
    request_t q;
    request_init(&q, "req-u", 1, items, 1);
    float sc[1];
    cr_assert_eq(predict(&s, &q, sc, NULL), MT_RPC_UNAVAILABLE);
    uint8_t *resp = NULL;
    size_t rlen = 0;
    mt_rpc_status_t st = {0};
    cr_assert_eq(
        mt_rpc_call(s.ch, "/grpc.health.v1.Health/Check", NULL, 0, 10000, &resp, &rlen, &st),
        MT_OK);
    cr_assert_eq(st.code, MT_RPC_OK);
    cr_assert(rlen == 2 && resp[1] == 2, "Health should be NOT_SERVING");
    free(resp);
    /* the trainer pushes its dense parameters: serving becomes ready */
    char err[256] = "";
    cr_assert_eq(mt_trainer_dense_sync_create(c.tr, c.psc, 1, &c.ds, err, sizeof(err)), MT_OK, "%s",
                 err);
    wait_ready(&s);
    cr_assert_eq(
        mt_rpc_call(s.ch, "/grpc.health.v1.Health/Check", NULL, 0, 10000, &resp, &rlen, &st),
        MT_OK);
    cr_assert(rlen == 2 && resp[1] == 1, "Health should be SERVING");
    free(resp);
    cr_assert_eq(predict(&s, &q, sc, NULL), MT_RPC_OK);
    server_stop(&s);
    cluster_stop(&c);
}

/* (5) Impressions go to the features topic: one per candidate, keyed by the request id, with
 * its served score (a multi-task model's task 0: the reply's scores). @p fam: the model (NULL:
 * deepfm). */
static void impressions_logged(const family_t *fam) {
    char err[512] = "";
    mt_kafka_topic_spec_t topic = {"features", 1};
    mt_kafka_mock_t *mock;
    cr_assert_eq(mt_kafka_mock_create(1, &topic, 1, &mock, err, sizeof(err)), MT_OK, "%s", err);
    mt_kafka_producer_t *p;
    const char *pconf[] = {"linger.ms=1", NULL};
    cr_assert_eq(
        mt_kafka_producer_create(mt_kafka_mock_bootstrap(mock), pconf, &p, err, sizeof(err)), MT_OK,
        "%s", err);
    cluster_t c;
    cluster_start_model(&c, 0, 1, NULL, NULL, fam, NULL);
    train(&c, 1, 10, 1.0f, 10, (uint32_t)time(NULL));
    server_t s;
    server_start(&s, &c, 10, p);
    wait_ready(&s);
    const uint64_t items[3] = {10, 11, 12};
    request_t q;
    request_init(&q, "req-kafka-42", 5, items, 3);
    q.r.timestamp_ms = 1700000000123;
    float sc[3];
    cr_assert_eq(predict(&s, &q, sc, NULL), MT_RPC_OK);
    request_t e;
    request_init(&e, "", 5, items, 1); /* no request id: nothing to join, not logged */
    cr_assert_eq(predict(&s, &e, sc + 2, NULL), MT_RPC_OK);
    cr_assert_eq(predict(&s, &q, sc, NULL), MT_RPC_OK); /* deterministic: the same scores */
    /* the log is written after the reply: wait for the last request's, then flush */
    mt_serving_counters_t k;
    double end = now_s() + 30;
    do {
        mt_serving_counters(s.sv, &k);
    } while (k.logged < 6 && now_s() < end && usleep(10000) == 0);
    cr_assert_eq(mt_kafka_producer_flush(p, 10000), MT_OK);
    mt_serving_counters(s.sv, &k);
    cr_assert_eq(k.logged, 6);
    cr_assert_eq(k.log_dropped, 0);

    const char *topics[] = {"features"};
    const char *cconf[] = {"session.timeout.ms=6000", NULL};
    mt_kafka_consumer_t *kc;
    cr_assert_eq(mt_kafka_consumer_create(mt_kafka_mock_bootstrap(mock), "t", topics, 1, cconf, &kc,
                                          err, sizeof(err)),
                 MT_OK, "%s", err);
    mt_kafka_msg_t msgs[16];
    int got = 0;
    end = now_s() + 60;
    while (got < 6 && now_s() < end) {
        size_t n = mt_kafka_consumer_poll(kc, msgs, 16, 200);
        for (size_t i = 0; i < n; i++, got++) {
            cr_assert_eq(msgs[i].key_len, strlen("req-kafka-42"));
            cr_assert_eq(memcmp(msgs[i].key, "req-kafka-42", msgs[i].key_len), 0);
            Monolith__V1__Impression *im =
                monolith__v1__impression__unpack(NULL, msgs[i].len, msgs[i].value);
            cr_assert_not_null(im);
            cr_assert_str_eq(im->request_id, "req-kafka-42");
            cr_assert_eq(im->timestamp_ms, 1700000000123);
            cr_assert_eq(im->item_id, items[got % 3]);
            cr_assert_eq(im->score, sc[got % 3]);
            cr_assert_eq(im->n_user, 1);
            cr_assert_eq(im->user[0]->slot, 1);
            cr_assert_eq(im->user[0]->fids[0], fid(1, 5));
            cr_assert_eq(im->n_item, 2);
            cr_assert_eq(im->item[0]->fids[0], fid(2, items[got % 3]));
            cr_assert_eq(im->item[1]->fids[0], fid(3, items[got % 3] % 7));
            monolith__v1__impression__free_unpacked(im, NULL);
        }
    }
    cr_assert_eq(got, 6);
    mt_kafka_consumer_destroy(kc);
    server_stop(&s);
    cluster_stop(&c);
    mt_kafka_producer_destroy(p);
    mt_kafka_mock_destroy(mock);
}

/* Not under ThreadSanitizer: librdkafka starts its threads with C11 thrd_create, which
 * TSan does not intercept here, and its first allocation on such a thread crashes TSan. */
Test(serving, impressions_are_logged_to_kafka, .timeout = 120, MT_NOT_UNDER_TSAN) {
    impressions_logged(NULL);
}

/* mmoe: each impression carries its candidate's task-0 score, as the reply's scores. */
Test(serving, mmoe_impressions_log_task_0, .timeout = 120, MT_NOT_UNDER_TSAN) {
    const family_t fam = {MT_MODEL_MMOE, .ntasks = 2};
    impressions_logged(&fam);
}

/* The encoded size of a LookupResponse of n rows of DIM + 1 floats (protobuf-c's own count). */
static size_t lookup_reply_bytes(size_t n) {
    Monolith__V1__LookupResponse r = MONOLITH__V1__LOOKUP_RESPONSE__INIT;
    r.n_values = n * (DIM + 1);
    r.found.len = n;
    return monolith__v1__lookup_response__get_packed_size(&r);
}

/* The largest encoding of a PredictResponse of n candidates' scores (versions of 10 varint
 * bytes), of a model of T tasks (T > 1: task_scores and tasks too; protobuf-c's own count). */
static size_t predict_reply_bytes(size_t n, uint32_t T) {
    Monolith__V1__PredictResponse r = MONOLITH__V1__PREDICT_RESPONSE__INIT;
    r.n_scores = n;
    if (T > 1) {
        r.n_task_scores = n * T;
        r.tasks = T;
    }
    r.sparse_version = r.dense_version = UINT64_MAX;
    return monolith__v1__predict_response__get_packed_size(&r);
}

/* A Predict of user 7005 and n candidates without item fids (2 bytes each on the wire). */
static int predict_n(server_t *s, size_t n, char *msg, size_t msglen) {
    request_t q;
    request_init(&q, "req-n", 7005, NULL, 0);
    Monolith__V1__Candidate *cand = calloc(n, sizeof(*cand));
    Monolith__V1__Candidate **candp = calloc(n, sizeof(*candp));
    cr_assert(cand && candp);
    for (size_t i = 0; i < n; i++) {
        monolith__v1__candidate__init(&cand[i]); /* item_id 0: not on the wire */
        candp[i] = &cand[i];
    }
    q.r.n_candidates = n;
    q.r.candidates = candp;
    uint8_t *resp = NULL;
    size_t rlen = 0;
    int code = call(s, "Predict", &q.r.base, &resp, &rlen, msg, msglen);
    if (code == MT_RPC_OK) {
        Monolith__V1__PredictResponse *p = monolith__v1__predict_response__unpack(NULL, rlen, resp);
        cr_assert_not_null(p);
        cr_assert_eq(p->n_scores, n);
        monolith__v1__predict_response__free_unpacked(p, NULL);
    }
    free(resp);
    free(candp);
    free(cand);
    return code;
}

/* Regression: a Lookup of ~258k ids (dim 16) under a 16 MiB limit was computed, then its
 * reply could not be sent ("Sent message larger than max"), uncounted. A reply larger than
 * the server's max_message_bytes is now refused before any work, RESOURCE_EXHAUSTED,
 * counted; one that just fits is answered. Here: a 64 KiB limit, dim 8. */
/* Not under ThreadSanitizer (it runs in the release and ASan builds): a size check without
 * threads of its own; its multi-megabyte messages through uninstrumented gRPC outlast any
 * deadline there (as rpc::ten_mib_message_within_limits). */
Test(serving, replies_over_the_message_limit_are_refused_first, .timeout = 120, MT_NOT_UNDER_TSAN) {
    enum { LIMIT = 65536 };
    cluster_t c;
    cluster_start(&c, 0, 1);
    train(&c, 7000, 40, 1.0f, 10, (uint32_t)time(NULL));
    server_t s;
    server_start_ex(&s, &c, 1u << 20, NULL, 50, LIMIT);
    wait_ready(&s);
    size_t n = 1;
    while (lookup_reply_bytes(n + 1) <= LIMIT)
        n++;
    uint64_t *fids = malloc((n + 1) * sizeof(uint64_t));
    float *values = malloc((n + 1) * (DIM + 1) * sizeof(float));
    uint8_t *found = malloc(n + 1);
    cr_assert(fids && values && found);
    for (size_t i = 0; i <= n; i++)
        fids[i] = fid(2, 1000000 + i);
    fids[0] = fid(2, 40); /* one trained id among them */
    /* just fits: answered */
    cr_assert_eq(serving_lookup(&s, fids, n, 0, values, n * (DIM + 1), found), MT_RPC_OK);
    cr_assert_eq(found[0], 1);
    /* one more id: refused, with serving's message (not gRPC's), and counted */
    Monolith__V1__LookupRequest rq = MONOLITH__V1__LOOKUP_REQUEST__INIT;
    rq.fids = fids;
    rq.n_fids = n + 1;
    char msg[256] = "";
    uint8_t *resp = NULL;
    size_t rlen = 0;
    cr_assert_eq(call(&s, "Lookup", &rq.base, &resp, &rlen, msg, sizeof(msg)),
                 MT_RPC_RESOURCE_EXHAUSTED, "%s", msg);
    free(resp);
    cr_assert(strstr(msg, "reply") && strstr(msg, "65536"), "%s", msg);
    mt_serving_counters_t k;
    mt_serving_counters(s.sv, &k);
    cr_assert_eq(k.errors[MT_RPC_RESOURCE_EXHAUSTED], 1);

    /* Predict: 4 bytes of score per candidate */
    size_t m = 1;
    while (predict_reply_bytes(m + 1, 1) <= LIMIT)
        m++;
    cr_assert_eq(predict_n(&s, m, msg, sizeof(msg)), MT_RPC_OK, "%s", msg);
    cr_assert_eq(predict_n(&s, m + 1, msg, sizeof(msg)), MT_RPC_RESOURCE_EXHAUSTED, "%s", msg);
    cr_assert(strstr(msg, "reply") && strstr(msg, "65536"), "%s", msg);
    mt_serving_counters(s.sv, &k);
    cr_assert_eq(k.errors[MT_RPC_RESOURCE_EXHAUSTED], 2);
    cr_assert_eq(k.candidates, m, "the refused Predict was scored");
    char *body = NULL;
    size_t blen = 0;
    cr_assert_eq(mt_serving_render_metrics(s.sv, NULL, &body, &blen), MT_OK);
    cr_assert(strstr(body, "monolith_serving_errors_total{code=\"RESOURCE_EXHAUSTED\"} 2\n"), "%s",
              body);
    free(body);
    free(fids);
    free(values);
    free(found);
    server_stop(&s);
    cluster_stop(&c);
}

/* mmoe end to end, 2 and 3 tasks: the trainer trains every task through the PS, serving
 * follows and answers each candidate's task scores as the trainer scores them (task_scores,
 * candidate-major), task 0's in scores, tasks = T (served_as_trained). (3 tasks also has more
 * dense tensors than serving's pull once had room for.) */
Test(serving, mmoe_serves_every_tasks_scores, .timeout = 240) {
    for (uint32_t T = 2; T <= 3; T++) {
        const family_t fam = {MT_MODEL_MMOE, .ntasks = T};
        cluster_t c;
        cluster_start_model(&c, 0, 1, NULL, NULL, &fam, NULL);
        cr_assert_eq(mt_trainer_ntasks(c.tr), T);
        char name[32];
        snprintf(name, sizeof(name), "tower.%u.out.w", T - 1);
        mt_model_param_t p;
        cr_assert_eq(mt_model_param_find(mt_trainer_model(c.tr), name, &p), MT_OK, "%s", name);
        snprintf(name, sizeof(name), "mmoe, %u tasks", T);
        served_as_trained(&c, name);
        cluster_stop(&c);
    }
}

/* A multi-task reply's size counts the task scores: under a 64 KiB limit the largest Predict
 * whose reply (scores, task_scores, tasks) fits is answered, one candidate more is refused
 * by serving first (RESOURCE_EXHAUSTED, its own message), as for one task. */
/* Not under ThreadSanitizer (as replies_over_the_message_limit_are_refused_first): a size
 * check without threads of its own, whose thousands of candidates outlast the calls'
 * deadline there. */
Test(serving, mmoe_replies_over_the_message_limit_are_refused_first, .timeout = 120,
     MT_NOT_UNDER_TSAN) {
    enum { LIMIT = 65536 };
    for (uint32_t T = 2; T <= 3; T++) {
        const family_t fam = {MT_MODEL_MMOE, .ntasks = T};
        cluster_t c;
        cluster_start_model(&c, 0, 1, NULL, NULL, &fam, NULL);
        train(&c, 7000, 40, 1.0f, 10, (uint32_t)time(NULL));
        server_t s;
        server_start_ex(&s, &c, 1u << 20, NULL, 50, LIMIT);
        wait_ready(&s);
        size_t m = 1;
        while (predict_reply_bytes(m + 1, T) <= LIMIT)
            m++;
        char msg[256] = "";
        cr_assert_eq(predict_n(&s, m, msg, sizeof(msg)), MT_RPC_OK, "%u tasks: %s", T, msg);
        cr_assert_eq(predict_n(&s, m + 1, msg, sizeof(msg)), MT_RPC_RESOURCE_EXHAUSTED,
                     "%u tasks: %s", T, msg);
        cr_assert(strstr(msg, "reply") && strstr(msg, "65536"), "%s", msg);
        mt_serving_counters_t k;
        mt_serving_counters(s.sv, &k);
        cr_assert_eq(k.candidates, m, "the refused Predict was scored");
        server_stop(&s);
        cluster_stop(&c);
    }
}

/* Regression: an 8 MB request_id was accepted, and its impressions were then refused by
 * Kafka. Ids longer than MT_SERVING_MAX_REQUEST_ID_BYTES are INVALID_ARGUMENT, counted. */
/* Not under ThreadSanitizer (it runs in the release and ASan builds): a size check without
 * threads of its own; its multi-megabyte messages through uninstrumented gRPC outlast any
 * deadline there (as rpc::ten_mib_message_within_limits). */
Test(serving, long_request_ids_are_refused, .timeout = 120, MT_NOT_UNDER_TSAN) {
    cluster_t c;
    cluster_start(&c, 0, 1);
    train(&c, 7000, 40, 1.0f, 10, (uint32_t)time(NULL));
    server_t s;
    server_start(&s, &c, 10, NULL);
    wait_ready(&s);
    const uint64_t items[1] = {40};
    char *id = malloc(8u << 20);
    cr_assert_not_null(id);
    memset(id, 'r', (8u << 20) - 1);
    id[(8u << 20) - 1] = 0;
    request_t q;
    request_init(&q, id, 7005, items, 1);
    char msg[256] = "";
    uint8_t *resp = NULL;
    size_t rlen = 0;
    cr_assert_eq(call(&s, "Predict", &q.r.base, &resp, &rlen, msg, sizeof(msg)),
                 MT_RPC_INVALID_ARGUMENT, "%s", msg);
    free(resp);
    resp = NULL;
    cr_assert(strstr(msg, "request_id"), "%s", msg);
    /* just over the limit, then at it */
    id[MT_SERVING_MAX_REQUEST_ID_BYTES + 1] = 0;
    cr_assert_eq(call(&s, "Predict", &q.r.base, &resp, &rlen, msg, sizeof(msg)),
                 MT_RPC_INVALID_ARGUMENT, "%s", msg);
    free(resp);
    id[MT_SERVING_MAX_REQUEST_ID_BYTES] = 0;
    float sc[1];
    cr_assert_eq(predict(&s, &q, sc, NULL), MT_RPC_OK);
    mt_serving_counters_t k;
    mt_serving_counters(s.sv, &k);
    cr_assert_eq(k.errors[MT_RPC_INVALID_ARGUMENT], 2);
    cr_assert_eq(k.candidates, 1, "a refused Predict was scored");
    free(id);
    server_stop(&s);
    cluster_stop(&c);
}

/* ---------------- sharded serving ---------------- */

/* Under ThreadSanitizer a training step through the PS with three or four replicas following
 * it takes about ten seconds, and each of the two cases below minutes: they run in the
 * release and ASan builds; peer_loss_and_return_under_concurrent_predicts (two nodes) is
 * the one for TSan, over the same code (discovery, fetch, a peer marked down, its return). */
#define ROUNDS 4
#define LOAD_N 20

/* The value of the metric line starting with @p name (labels included) followed by a space;
 * NAN when the node does not export it. */
static double metric(server_t *s, const char *name) {
    char *body = NULL;
    size_t len = 0;
    cr_assert_eq(mt_serving_render_metrics(s->sv, NULL, &body, &len), MT_OK);
    double v = NAN;
    size_t nl = strlen(name);
    for (const char *p = body; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, name, nl) && p[nl] == ' ') {
            v = strtod(p + nl + 1, NULL);
            break;
        }
    free(body);
    return v;
}

static uint64_t ps_rows(cluster_t *c, int shard) {
    mt_table_stats_t ts;
    mt_table_stats(mt_ps_table(c->ps[shard]), &ts);
    return ts.rows;
}

static uint64_t replica_rows(server_t *s) {
    mt_table_stats_t ts;
    mt_table_stats(mt_serving_table(s->sv), &ts);
    return ts.rows;
}

/* Polls until every node's Predict of q equals the model on the PS's parameters (within
 * 1e-5) with the PS's dense version. @returns 1 if they all did before the deadline. */
static int nodes_agree(cluster_t *c, server_t *const *nodes, int n, request_t *q, double secs) {
    size_t nc = q->r.n_candidates;
    float want[64], got[64];
    double end = now_s() + secs;
    while (now_s() < end) {
        local_scores(c, q, want);
        uint64_t ps_dv = mt_trainer_dense_sync_version(c->ds);
        int ok = 1;
        for (int k = 0; k < n && ok; k++) {
            uint64_t dv = 0;
            ok = predict(nodes[k], q, got, &dv) == MT_RPC_OK && dv == ps_dv;
            for (size_t i = 0; i < nc && ok; i++)
                ok = fabsf(got[i] - want[i]) <= 1e-5f;
        }
        if (ok) return 1;
        usleep(50000);
    }
    return 0;
}

/* An id of slot 2 whose embedding row lives on @p shard. */
static uint64_t id_of_shard(uint32_t shard) {
    for (uint64_t v = 1;; v++)
        if (mt_route_shard_of(fid(2, v), NSHARDS) == shard) return fid(2, v);
}

/* 2 PS shards, 3 serving nodes: F holds both, A shard 0 (peers B, F), B shard 1 (peer F).
 * While the trainer trains (bursts, each followed by a comparison once the replicas caught
 * up), every node's Predict equals the model on the PS's parameters within 1e-5; each node's
 * replica holds only its shards' rows, and says so in /metrics; Lookup on A of a shard-1 id
 * is FAILED_PRECONDITION. */
Test(serving, sharded_nodes_score_as_one_node, .timeout = 240, MT_NOT_UNDER_TSAN) {
    cluster_t c;
    cluster_start(&c, 0, 1);
    uint32_t now = (uint32_t)time(NULL);
    uint64_t items[8];
    for (int i = 0; i < 8; i++) {
        items[i] = 40 + (uint64_t)i;
        train(&c, 7000, items[i], (float)(i & 1), 30, now);
    }
    server_t F, A, B;
    server_start_ex(&F, &c, 64, NULL, 50, 0);
    const uint32_t h0[1] = {0}, h1[1] = {1};
    const char *pb[1] = {F.addr};
    sharding_t sb = {h1, 1, pb, 1, 0, NULL, NULL};
    server_start_cfg(&B, &c, 64, NULL, 50, 0, &sb);
    const char *pa[2] = {B.addr, F.addr};
    sharding_t sa = {h0, 1, pa, 2, 0, NULL, NULL};
    server_start_cfg(&A, &c, 64, NULL, 50, 0, &sa);
    wait_ready(&F);
    wait_ready(&B);
    wait_ready(&A);
    server_t *nodes[3] = {&F, &A, &B};
    request_t q;
    const uint64_t cand[8] = {40, 41, 42, 43, 44, 45, 46, 99999};
    request_init(&q, "req-sharded", 7005, cand, 8);
    for (int round = 0; round < ROUNDS; round++) {
        if (round)
            for (int i = 0; i < 8; i++)
                train(&c, 7000 + 100 * (uint64_t)round, items[i], (float)((i + round) & 1), 20,
                      now);
        cr_assert(nodes_agree(&c, nodes, 3, &q, 60),
                  "round %d: the nodes' scores did not all reach the PS model's", round);
    }
    /* each replica holds its shards' rows only, and /metrics says which */
    double end = now_s() + 30;
    while (now_s() < end &&
           !(replica_rows(&A) == ps_rows(&c, 0) && replica_rows(&B) == ps_rows(&c, 1) &&
             replica_rows(&F) == ps_rows(&c, 0) + ps_rows(&c, 1)))
        usleep(20000);
    cr_assert_eq(replica_rows(&A), ps_rows(&c, 0));
    cr_assert_eq(replica_rows(&B), ps_rows(&c, 1));
    cr_assert_eq(replica_rows(&F), ps_rows(&c, 0) + ps_rows(&c, 1));
    cr_assert_eq(metric(&A, "monolith_serving_rows"), (double)ps_rows(&c, 0));
    cr_assert_eq(metric(&A, "monolith_serving_shard_held{shard=\"0\"}"), 1.0);
    cr_assert_eq(metric(&A, "monolith_serving_shard_held{shard=\"1\"}"), 0.0);
    cr_assert_eq(metric(&B, "monolith_serving_shard_held{shard=\"0\"}"), 0.0);
    cr_assert_eq(metric(&F, "monolith_serving_shard_held{shard=\"1\"}"), 1.0);
    cr_assert(isnan(metric(&A, "monolith_serving_sync_lag_seconds{shard=\"1\"}")));
    cr_assert(!isnan(metric(&A, "monolith_serving_sync_lag_seconds{shard=\"0\"}")));
    cr_assert(isnan(metric(&F, "monolith_serving_remote_shards_uncovered")), "F has no peers");
    cr_assert_eq(metric(&A, "monolith_serving_remote_shards_uncovered"), 0.0);
    char name[160];
    snprintf(name, sizeof(name), "monolith_serving_peer_up{peer=\"%s\"}", F.addr);
    cr_assert_eq(metric(&B, name), 1.0);
    snprintf(name, sizeof(name), "monolith_serving_peer_lookups_total{peer=\"%s\"}", F.addr);
    cr_assert_gt(metric(&B, name), 0.0);
    /* A and B answer Lookup for their own shard only; F for both */
    uint64_t f0 = id_of_shard(0), f1 = id_of_shard(1);
    float v[DIM + 1]; /* a row: the embedding, then the first-order weight */
    uint8_t found;
    cr_assert_eq(serving_lookup(&A, &f1, 1, 0, v, DIM + 1, &found), MT_RPC_FAILED_PRECONDITION);
    cr_assert_eq(serving_lookup(&B, &f0, 1, 0, v, DIM + 1, &found), MT_RPC_FAILED_PRECONDITION);
    cr_assert_eq(serving_lookup(&A, &f0, 1, 0, v, DIM + 1, &found), MT_RPC_OK);
    cr_assert_eq(serving_lookup(&F, &f1, 1, 0, v, DIM + 1, &found), MT_RPC_OK);
    server_stop(&A);
    server_stop(&B);
    server_stop(&F);
    cluster_stop(&c);
}

/* A node's Predicts in a loop, on a thread of its own (no asserts off the test's thread):
 * the statuses are counted. */
typedef struct loader {
    server_t *s;
    request_t q;
    pthread_t t;
    atomic_int stop;
    atomic_uint ok, unavailable, other;
    char last_msg[256];
} loader_t;

static void *load_main(void *arg) {
    loader_t *l = arg;
    size_t len = protobuf_c_message_get_packed_size(&l->q.r.base);
    uint8_t *buf = malloc(len);
    protobuf_c_message_pack(&l->q.r.base, buf);
    while (!atomic_load(&l->stop)) {
        uint8_t *resp = NULL;
        size_t rlen = 0;
        mt_rpc_status_t st = {0};
        mt_err_t err = mt_rpc_call(l->s->ch, "/monolith.v1.Serving/Predict", buf, len, 60000, &resp,
                                   &rlen, &st);
        free(resp);
        if (err == MT_OK && st.code == MT_RPC_OK) {
            atomic_fetch_add(&l->ok, 1);
        } else if (err == MT_UNAVAILABLE || (err == MT_OK && st.code == MT_RPC_UNAVAILABLE)) {
            snprintf(l->last_msg, sizeof(l->last_msg), "%s", st.message);
            atomic_fetch_add(&l->unavailable, 1);
        } else {
            atomic_fetch_add(&l->other, 1);
        }
    }
    free(buf);
    return NULL;
}

static void load_start(loader_t *l, server_t *s, const uint64_t *cand, size_t n) {
    memset(l, 0, sizeof(*l));
    l->s = s;
    request_init(&l->q, "", 7005, cand, n); /* no id: nothing logged */
    cr_assert_eq(pthread_create(&l->t, NULL, load_main, l), 0);
}

static void load_stop(loader_t *l) {
    atomic_store(&l->stop, 1);
    pthread_join(l->t, NULL);
}

/* Waits until @p cond holds (polled), for up to @p secs. */
#define WAIT_FOR(cond, secs)              \
    do {                                  \
        double end_ = now_s() + (secs);   \
        while (!(cond) && now_s() < end_) \
            usleep(20000);                \
    } while (0)

/* F (both shards) is killed under load. B (shard 1, peer F only, peer_failure = fail)
 * answers UNAVAILABLE naming what is missing; Z (shard 1, peer F only, zeros) answers, its
 * shard-0 ids read as zeros and counted; A (shard 0, peers B and F) goes on through B after
 * at most the requests in flight at the kill. F restarted on its address is found again and
 * B answers again. */
Test(serving, a_killed_peer_fails_or_reads_zeros, .timeout = 240, MT_NOT_UNDER_TSAN) {
    cluster_t c;
    cluster_start(&c, 0, 1);
    uint32_t now = (uint32_t)time(NULL);
    for (int i = 0; i < 8; i++)
        train(&c, 7000, 40 + (uint64_t)i, (float)(i & 1), 30, now);
    server_t F, A, B, Z;
    server_start_ex(&F, &c, 64, NULL, 50, 0);
    const uint32_t h0[1] = {0}, h1[1] = {1};
    const char *pf[1] = {F.addr};
    sharding_t sb = {h1, 1, pf, 1, 0, NULL, NULL}, sz = {h1, 1, pf, 1, 1, NULL, NULL};
    server_start_cfg(&B, &c, 64, NULL, 50, 0, &sb);
    server_start_cfg(&Z, &c, 64, NULL, 50, 0, &sz);
    wait_ready(&F);
    wait_ready(&B);
    wait_ready(&Z);
    /* A after B is ready: A's first discovery round then sees B holding shard 1 synced, so
     * its route has B beside F (started earlier, A could be ready through F alone and learn
     * of B only a refresh later: on a busy machine F's kill fell in that window) */
    const char *pa[2] = {B.addr, F.addr};
    sharding_t sa = {h0, 1, pa, 2, 0, NULL, NULL};
    server_start_cfg(&A, &c, 64, NULL, 50, 0, &sa);
    wait_ready(&A);
    const uint64_t cand[8] = {40, 41, 42, 43, 44, 45, 46, 47};
    request_t q;
    request_init(&q, "req-z", 7005, cand, 8);
    server_t *nodes[4] = {&F, &A, &B, &Z};
    cr_assert(nodes_agree(&c, nodes, 4, &q, 60));
    float before[8], after[8];
    cr_assert_eq(predict(&Z, &q, before, NULL), MT_RPC_OK);
    loader_t la, lb, lz;
    load_start(&la, &A, cand, 8);
    load_start(&lb, &B, cand, 8);
    load_start(&lz, &Z, cand, 8);
    WAIT_FOR(atomic_load(&la.ok) >= LOAD_N && atomic_load(&lb.ok) >= LOAD_N &&
                 atomic_load(&lz.ok) >= LOAD_N,
             120);
    cr_assert(atomic_load(&lb.ok) >= LOAD_N && atomic_load(&lz.ok) >= LOAD_N &&
              atomic_load(&la.ok) >= LOAD_N);
    cr_assert_eq(atomic_load(&la.unavailable) + atomic_load(&lb.unavailable) +
                     atomic_load(&lz.unavailable),
                 0);
    /* the kill: F's server goes away, connections and all */
    char faddr[64];
    snprintf(faddr, sizeof(faddr), "%s", F.addr);
    server_stop(&F);
    unsigned a0 = atomic_load(&la.ok), z0 = atomic_load(&lz.ok);
    WAIT_FOR(atomic_load(&lb.unavailable) >= LOAD_N && atomic_load(&lz.ok) >= z0 + LOAD_N &&
                 atomic_load(&la.ok) >= a0 + LOAD_N,
             120);
    load_stop(&la);
    load_stop(&lb);
    load_stop(&lz);
    cr_assert_geq(atomic_load(&lb.unavailable), LOAD_N, "B (fail): %u UNAVAILABLE",
                  atomic_load(&lb.unavailable));
    cr_assert(strstr(lb.last_msg, "shard 0") || strstr(lb.last_msg, faddr), "B said: %s",
              lb.last_msg);
    cr_assert_eq(atomic_load(&lz.unavailable), 0, "Z (zeros) failed: %s", lz.last_msg);
    cr_assert_geq(atomic_load(&lz.ok), z0 + LOAD_N);
    cr_assert_geq(atomic_load(&la.ok), a0 + LOAD_N, "A did not go on through B");
    cr_assert_leq(atomic_load(&la.unavailable), 3, "A: %u UNAVAILABLE (%s)",
                  atomic_load(&la.unavailable), la.last_msg);
    cr_assert_eq(atomic_load(&la.other) + atomic_load(&lb.other) + atomic_load(&lz.other), 0);
    cr_assert_gt(metric(&Z, "monolith_serving_peer_zero_fids_total"), 0.0);
    cr_assert_eq(metric(&B, "monolith_serving_remote_shards_uncovered"), 1.0);
    char name[160];
    snprintf(name, sizeof(name), "monolith_serving_peer_up{peer=\"%s\"}", faddr);
    cr_assert_eq(metric(&B, name), 0.0);
    /* Z's scores without shard 0's rows differ from the full ones */
    cr_assert_eq(predict(&Z, &q, after, NULL), MT_RPC_OK);
    cr_assert(memcmp(before, after, sizeof(before)) != 0);
    /* F comes back on its address: found again, B answers again */
    sharding_t sf = {NULL, 0, NULL, 0, 0, faddr, NULL};
    server_start_cfg(&F, &c, 64, NULL, 50, 0, &sf);
    wait_ready(&F);
    float got[8];
    WAIT_FOR(predict(&B, &q, got, NULL) == MT_RPC_OK, 60);
    cr_assert_eq(predict(&B, &q, got, NULL), MT_RPC_OK);
    server_t *nodes2[4] = {&F, &A, &B, &Z};
    cr_assert(nodes_agree(&c, nodes2, 4, &q, 60));
    server_stop(&A);
    server_stop(&B);
    server_stop(&Z);
    server_stop(&F);
    cluster_stop(&c);
}

/* Two nodes, for ThreadSanitizer: F (both shards) and B (shard 1, peer F). Two threads
 * Predict on B while F goes away and comes back on its address: every Predict is OK or
 * UNAVAILABLE, B answers with F's scores again at the end. What runs concurrently: the
 * discovery thread rebuilding the route, Predicts reading it and marking F down, the
 * metrics. */
Test(serving, peer_loss_and_return_under_concurrent_predicts, .timeout = 300) {
    cluster_t c;
    cluster_start(&c, 0, 1);
    uint32_t now = (uint32_t)time(NULL);
    for (int i = 0; i < 4; i++)
        train(&c, 7000, 40 + (uint64_t)i, (float)(i & 1), 10, now);
    server_t F, B;
    server_start_ex(&F, &c, 64, NULL, 50, 0);
    const uint32_t h1[1] = {1};
    const char *pf[1] = {F.addr};
    sharding_t sb = {h1, 1, pf, 1, 0, NULL, NULL};
    server_start_cfg(&B, &c, 64, NULL, 50, 0, &sb);
    wait_ready(&F);
    wait_ready(&B);
    const uint64_t cand[4] = {40, 41, 42, 43};
    loader_t l1, l2;
    load_start(&l1, &B, cand, 4);
    load_start(&l2, &B, cand, 4);
    WAIT_FOR(atomic_load(&l1.ok) >= 3 && atomic_load(&l2.ok) >= 3, 120);
    char faddr[64];
    snprintf(faddr, sizeof(faddr), "%s", F.addr);
    server_stop(&F);
    WAIT_FOR(atomic_load(&l1.unavailable) >= 3 && atomic_load(&l2.unavailable) >= 3, 120);
    char *body = NULL;
    size_t len = 0;
    cr_assert_eq(mt_serving_render_metrics(B.sv, NULL, &body, &len), MT_OK);
    free(body);
    sharding_t sf = {NULL, 0, NULL, 0, 0, faddr, NULL};
    server_start_cfg(&F, &c, 64, NULL, 50, 0, &sf);
    wait_ready(&F);
    unsigned ok1 = atomic_load(&l1.ok), ok2 = atomic_load(&l2.ok);
    WAIT_FOR(atomic_load(&l1.ok) >= ok1 + 3 && atomic_load(&l2.ok) >= ok2 + 3, 120);
    load_stop(&l1);
    load_stop(&l2);
    cr_assert_geq(atomic_load(&l1.unavailable) + atomic_load(&l2.unavailable), 6);
    cr_assert_geq(atomic_load(&l1.ok), ok1 + 3, "B did not answer again after F came back");
    cr_assert_geq(atomic_load(&l2.ok), ok2 + 3);
    cr_assert_eq(atomic_load(&l1.other) + atomic_load(&l2.other), 0);
    request_t q;
    request_init(&q, "req-back", 7005, cand, 4);
    server_t *nodes[2] = {&F, &B};
    cr_assert(nodes_agree(&c, nodes, 2, &q, 120));
    server_stop(&B);
    server_stop(&F);
    cluster_stop(&c);
}

/* ---------------- parameter fan-out through Kafka ---------------- */

#define FANOUT 8

typedef struct fanout {
    cluster_t c;
    mt_kafka_mock_t *mock;
    server_t nodes[FANOUT];
    char dir[64];
    mt_store_t *store; /* shard 1's checkpoints */
} fanout_t;

/* A mock cluster with "params" (a partition per shard), the shards publishing every 50 ms, a
 * store for shard 1, and @p n replicas following through the topic (not started yet). */
static void fanout_start(fanout_t *f, uint32_t ttl_s) {
    memset(f, 0, sizeof(*f));
    char err[256] = "";
    mt_kafka_topic_spec_t ts = {"params", NSHARDS};
    cr_assert_eq(mt_kafka_mock_create(1, &ts, 1, &f->mock, err, sizeof(err)), MT_OK, "%s", err);
    cluster_start_kafka(&f->c, ttl_s, 1, mt_kafka_mock_bootstrap(f->mock));
    snprintf(f->dir, sizeof(f->dir), "/tmp/mt-fanout-XXXXXX");
    cr_assert_not_null(mkdtemp(f->dir));
    mt_store_config_t sc;
    mt_store_config_init(&sc);
    cr_assert_eq(mt_store_open(f->dir, &sc, &f->store, err, sizeof(err)), MT_OK, "%s", err);
    mt_ps_set_store(f->c.ps[1], f->store);
}

static void fanout_nodes_start(fanout_t *f, int n) {
    sharding_t opt = {.kafka = mt_kafka_mock_bootstrap(f->mock)};
    for (int k = 0; k < n; k++)
        server_start_cfg(&f->nodes[k], &f->c, 100, NULL, 0, 0, &opt);
    for (int k = 0; k < n; k++)
        wait_ready(&f->nodes[k]);
}

static void fanout_stop(fanout_t *f, int n) {
    for (int k = 0; k < n; k++)
        server_stop(&f->nodes[k]);
    cluster_stop(&f->c);
    mt_store_close(f->store);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
    cr_assert_eq(system(cmd), 0);
    mt_kafka_mock_destroy(f->mock);
}

static int all_converged(fanout_t *f, int n, const uint64_t *fids, size_t nf) {
    for (int k = 0; k < n; k++)
        if (!converged(&f->nodes[k], &f->c, fids, nf, 60)) {
            cr_log_error("replica %d differs from the PS", k);
            return 0;
        }
    return 1;
}

static uint64_t shard_sync_calls(cluster_t *c, uint32_t i) {
    mt_ps_counters_t pc;
    mt_ps_counters(c->ps[i], &pc);
    return pc.calls[MT_PS_SYNC];
}

/* 8 replicas follow the shards through the parameters topic: each asks the shards for one
 * Sync at start and nothing after (the shards' cost does not grow with the replicas), and
 * every change reaches all of them: training, an expiry's deletions, a checkpoint restored
 * on a running shard (rows trained after it disappear, changed ones come back), and a shard
 * that comes back empty (a new incarnation: its rows, and only its rows, go). */
Test(serving, eight_replicas_follow_through_kafka, .timeout = 300, MT_NOT_UNDER_TSAN) {
    fanout_t f;
    fanout_start(&f, 600);
    cluster_t *c = &f.c;
    uint32_t now = (uint32_t)time(NULL);
    /* categories (item % 7) 2, 3, 4 for the old items, 5, 6, 0, 1 for the others */
    const uint64_t old_items[3] = {100, 101, 102}, items[6] = {201, 202, 203, 204, 208, 209};
    for (int i = 0; i < 3; i++)
        train(c, 5000, old_items[i], 1.0f, 10, now - 3600); /* idle for an hour: expires */
    for (int i = 0; i < 3; i++)
        train(c, 6000, items[i], (float)(i % 2), 10, now);
    fanout_nodes_start(&f, FANOUT);
    static uint64_t olds[256], fids[1024];
    size_t no = all_fids(olds, 256, 5000, 10, old_items, 3);
    size_t nf = all_fids(fids, 1024, 6000, 40, items, 6);
    cr_assert(all_converged(&f, FANOUT, fids, nf));
    uint64_t calls0 = shard_sync_calls(c, 0), calls1 = shard_sync_calls(c, 1);
    cr_assert_geq(calls0, FANOUT, "a Sync per replica at start");

    /* training: every replica follows, the shards answer no Sync */
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 6; i++)
            train(c, 6000 + (uint64_t)r * 10, items[i], (float)((i + r) % 2), 10, now);
    cr_assert(all_converged(&f, FANOUT, fids, nf));
    cr_assert_eq(shard_sync_calls(c, 0), calls0, "the replicas asked shard 0 for a Sync");
    cr_assert_eq(shard_sync_calls(c, 1), calls1, "the replicas asked shard 1 for a Sync");
    mt_ps_publish_stats_t ps0;
    mt_ps_publisher_stats(c->pub[0], &ps0);
    cr_assert_gt(ps0.entries, 0);
    cr_assert_eq(ps0.failures, 0);

    /* the expiry's deletions reach every replica */
    uint64_t expired = 0;
    for (int i = 0; i < NSHARDS; i++)
        expired +=
            mt_ps_expire_tick(c->ps[i], now, (size_t)mt_table_buckets(mt_ps_table(c->ps[i])));
    cr_assert_eq(expired, no);
    cr_assert(all_converged(&f, FANOUT, fids, nf), "rows that did not expire must stay");
    float *v = malloc(nfloats(olds, no) * sizeof(float));
    uint8_t found[256];
    for (int k = 0; k < FANOUT; k++) {
        cr_assert_eq(serving_lookup(&f.nodes[k], olds, no, 0, v, nfloats(olds, no), found),
                     MT_RPC_OK);
        for (size_t i = 0; i < no; i++)
            cr_assert_eq(found[i], 0, "replica %d still serves expired id %zu", k, i);
    }
    free(v);
    cr_assert_eq(shard_sync_calls(c, 0), calls0);

    /* a checkpoint of shard 1, more training, then the checkpoint restored while it runs */
    mt_ps_snapshot_req_t req = {0};
    mt_ps_ckpt_result_t res;
    char err[256] = "";
    cr_assert_eq(mt_ps_snapshot(c->ps[1], &req, &res, err, sizeof(err)), MT_OK, "%s", err);
    const uint64_t later[3] = {301, 302, 303};
    static uint64_t lfids[256];
    size_t nl = all_fids(lfids, 256, 7000, 10, later, 3);
    for (int i = 0; i < 3; i++)
        train(c, 7000, later[i], 1.0f, 10, now);
    train(c, 6000, items[0], 1.0f, 10, now);
    cr_assert(all_converged(&f, FANOUT, lfids, nl));
    uint64_t inc = mt_ps_incarnation(c->ps[1]);
    cr_assert_eq(mt_ps_restore(c->ps[1], res.checkpoint_id, NULL, err, sizeof(err)), MT_OK, "%s",
                 err);
    cr_assert_neq(mt_ps_incarnation(c->ps[1]), inc);
    cr_assert(all_converged(&f, FANOUT, fids, nf), "the restored shard's rows");
    cr_assert(all_converged(&f, FANOUT, lfids, nl), "rows trained after the checkpoint");
    for (int k = 0; k < FANOUT; k++) {
        mt_serving_shard_status_t st;
        cr_assert_eq(mt_serving_shard_status(f.nodes[k].sv, 1, &st), MT_OK);
        cr_assert_eq(st.incarnation, mt_ps_incarnation(c->ps[1]));
        cr_assert_geq(st.kafka_resyncs, 1, "replica %d: the restore's resync marker", k);
        cr_assert_geq(st.full_syncs, 2, "replica %d: a full Sync after the restore", k);
        cr_assert_geq(st.kafka_offset, 0);
    }

    /* the twin of restarted_instance_converges: shard 1 comes back empty */
    mt_ps_set_store(c->ps[1], NULL);
    char listen[64];
    snprintf(listen, sizeof(listen), "%s", c->addr[1]);
    stop_shard(c, 1);
    start_shard(c, 1, listen);
    for (int k = 0; k < FANOUT; k++) {
        double end = now_s() + 60;
        while (replica_rows(&f.nodes[k]) != ps_rows(c, 0) && now_s() < end)
            usleep(20000);
        cr_assert_eq(replica_rows(&f.nodes[k]), ps_rows(c, 0),
                     "replica %d: %llu rows, shard 0 alone has %llu", k,
                     (unsigned long long)replica_rows(&f.nodes[k]),
                     (unsigned long long)ps_rows(c, 0));
    }
    cr_assert(all_converged(&f, FANOUT, fids, nf));
    train(c, 8000, items[1], 1.0f, 10, now);
    cr_assert(all_converged(&f, FANOUT, fids, nf), "following again after the restart");
    cr_assert(!isnan(metric(&f.nodes[0], "monolith_serving_sync_resyncs_total{shard=\"1\"}")));
    fanout_stop(&f, FANOUT);
}

/* The first message of partition @p part of "params" with entries and caught_up = 0 (a
 * round's chunk), copied into *val (malloc'd). @returns its length, 0 if none. */
static size_t a_published_chunk(fanout_t *f, int32_t part, uint8_t **val) {
    mt_kafka_reader_t *r;
    char err[256] = "";
    cr_assert_eq(
        mt_kafka_reader_create(mt_kafka_mock_bootstrap(f->mock), NULL, &r, err, sizeof(err)), MT_OK,
        "%s", err);
    cr_assert_eq(mt_kafka_reader_start(r, "params", part, 0, err, sizeof(err)), MT_OK, "%s", err);
    size_t len = 0;
    double end = now_s() + 20;
    while (!len && now_s() < end) {
        mt_kafka_msg_t m[64];
        size_t n = mt_kafka_reader_poll(r, m, 64, 100, NULL);
        for (size_t i = 0; i < n && !len; i++) {
            Monolith__V1__SyncChunk *ch =
                monolith__v1__sync_chunk__unpack(NULL, m[i].len, m[i].value);
            cr_assert_not_null(ch, "the publisher wrote something that is not a SyncChunk");
            if (ch->n_fids && !ch->caught_up && !ch->full) {
                *val = malloc(m[i].len);
                memcpy(*val, m[i].value, m[i].len);
                len = m[i].len;
            }
            monolith__v1__sync_chunk__free_unpacked(ch, NULL);
        }
    }
    mt_kafka_reader_destroy(r);
    return len;
}

static uint64_t status_sum(fanout_t *f, int n, uint32_t shard, int field) {
    uint64_t sum = 0;
    for (int k = 0; k < n; k++) {
        mt_serving_shard_status_t st;
        cr_assert_eq(mt_serving_shard_status(f->nodes[k].sv, shard, &st), MT_OK);
        sum += field == 0 ? st.kafka_skipped : field == 1 ? st.kafka_resyncs : st.failures;
    }
    return sum;
}

/* The failure table's message rows: a duplicate of an old round is skipped by version and
 * changes nothing; a message that is not a SyncChunk is counted as a failure and sends the
 * replicas back to a Sync from the shard, after which they follow again. */
/* Not under ThreadSanitizer, as every case with Kafka: librdkafka's threads crash TSan
 * (impressions_are_logged_to_kafka says why). */
Test(serving, duplicate_and_garbage_messages_on_the_parameters_topic, .timeout = 300,
     MT_NOT_UNDER_TSAN) {
    fanout_t f;
    fanout_start(&f, 0);
    cluster_t *c = &f.c;
    uint32_t now = (uint32_t)time(NULL);
    const uint64_t items[4] = {11, 12, 13, 14};
    fanout_nodes_start(&f, 2);
    for (int i = 0; i < 4; i++)
        train(c, 100, items[i], (float)(i % 2), 10, now);
    static uint64_t fids[512];
    size_t nf = all_fids(fids, 512, 100, 30, items, 4);
    cr_assert(all_converged(&f, 2, fids, nf));
    uint8_t *dup = NULL;
    size_t dlen = a_published_chunk(&f, 0, &dup);
    cr_assert_gt(dlen, 0, "no round with entries in params[0]");
    /* the rows it carries change after it was published */
    for (int i = 0; i < 4; i++)
        train(c, 100, items[i], 1.0f, 10, now);
    cr_assert(all_converged(&f, 2, fids, nf));
    uint64_t skipped0 = status_sum(&f, 2, 0, 0), resyncs0 = status_sum(&f, 2, 0, 1);
    uint64_t fail0 = status_sum(&f, 2, 0, 2);
    mt_kafka_producer_t *p;
    char err[256] = "";
    cr_assert_eq(
        mt_kafka_producer_create(mt_kafka_mock_bootstrap(f.mock), NULL, &p, err, sizeof(err)),
        MT_OK, "%s", err);
    cr_assert_eq(mt_kafka_produce(p, "params", 0, "0", 1, dup, dlen, 5000), MT_OK);
    cr_assert_eq(mt_kafka_producer_flush(p, 10000), MT_OK);
    double end = now_s() + 30;
    while (status_sum(&f, 2, 0, 0) < skipped0 + 2 && now_s() < end)
        usleep(20000);
    cr_assert_geq(status_sum(&f, 2, 0, 0), skipped0 + 2, "each replica skips the duplicate");
    cr_assert(all_converged(&f, 2, fids, nf), "a duplicate of an old round moved rows back");
    cr_assert_eq(status_sum(&f, 2, 0, 1), resyncs0, "a duplicate is not a reason to resync");

    const char garbage[] = "\xff\xff\xff\xff not a SyncChunk";
    cr_assert_eq(mt_kafka_produce(p, "params", 0, "0", 1, garbage, sizeof(garbage) - 1, 5000),
                 MT_OK);
    cr_assert_eq(mt_kafka_producer_flush(p, 10000), MT_OK);
    end = now_s() + 30;
    while (status_sum(&f, 2, 0, 1) < resyncs0 + 2 && now_s() < end)
        usleep(20000);
    cr_assert_geq(status_sum(&f, 2, 0, 1), resyncs0 + 2, "each replica resyncs");
    cr_assert_geq(status_sum(&f, 2, 0, 2), fail0 + 2, "and counts a failure");
    for (int k = 0; k < 2; k++) { /* its Sync done, it reads the topic again */
        mt_serving_shard_status_t st = {.kafka_offset = -1};
        end = now_s() + 30;
        while (now_s() < end &&
               (mt_serving_shard_status(f.nodes[k].sv, 0, &st) != MT_OK || st.kafka_offset < 0))
            usleep(20000);
        cr_assert_geq(st.kafka_offset, 0, "replica %d does not follow again", k);
    }
    uint64_t calls = shard_sync_calls(c, 0);
    for (int i = 0; i < 4; i++)
        train(c, 200, items[i], 0.0f, 10, now);
    static uint64_t more[512];
    size_t nm = all_fids(more, 512, 200, 10, items, 4);
    cr_assert(all_converged(&f, 2, more, nm), "following again after the resync");
    cr_assert(all_converged(&f, 2, fids, nf));
    cr_assert_eq(shard_sync_calls(c, 0), calls, "following through the topic again");
    free(dup);
    mt_kafka_producer_destroy(p);
    fanout_stop(&f, 2);
}

/* The failure table's first row: Kafka goes away while the shards train. The publisher
 * counts failed rounds and keeps its version, the replicas' lag grows (nothing is recorded
 * without a round's end), and once the broker is back every change of the outage reaches
 * them in order. */
Test(serving, kafka_away_then_back, .timeout = 300, MT_NOT_UNDER_TSAN) {
    fanout_t f;
    fanout_start(&f, 0);
    cluster_t *c = &f.c;
    uint32_t now = (uint32_t)time(NULL);
    const uint64_t items[4] = {21, 22, 23, 24};
    fanout_nodes_start(&f, 2);
    for (int i = 0; i < 4; i++)
        train(c, 300, items[i], (float)(i % 2), 10, now);
    static uint64_t fids[512];
    size_t nf = all_fids(fids, 512, 300, 30, items, 4);
    cr_assert(all_converged(&f, 2, fids, nf));
    mt_ps_publish_stats_t before, during, after;
    mt_ps_publisher_stats(c->pub[0], &before);
    cr_assert_eq(mt_kafka_mock_broker_set_up(f.mock, 1, 0), MT_OK);
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 4; i++)
            train(c, 300 + (uint64_t)r * 10, items[i], 1.0f, 10, now);
    double end = now_s() + 60;
    do {
        usleep(50000);
        mt_ps_publisher_stats(c->pub[0], &during);
    } while (during.failures == before.failures && now_s() < end);
    cr_assert_gt(during.failures, before.failures, "no failed round while Kafka was away");
    cr_assert_eq(during.version, before.version, "the published version moved without Kafka");
    cr_assert_gt(metric(&f.nodes[0], "monolith_serving_sync_lag_seconds{shard=\"0\"}"), 1.0);
    cr_assert_eq(mt_kafka_mock_broker_set_up(f.mock, 1, 1), MT_OK);
    cr_assert(all_converged(&f, 2, fids, nf), "the outage's changes did not all arrive");
    mt_ps_publisher_stats(c->pub[0], &after);
    cr_assert_gt(after.version, before.version);
    cr_assert_lt(metric(&f.nodes[0], "monolith_serving_sync_lag_seconds{shard=\"0\"}"), 30.0);
    fanout_stop(&f, 2);
}
