/*
 * fuzz_serving.c - serving's RPC requests through its real handlers, on a replica that is
 * ready: MT_FUZZ_METHOD is "Predict" or "Lookup".
 *
 * Once per process the target builds a one-shard cluster in process, with gRPC replaced by
 * fuzz_rpc_stub.c on both sides (WRAP_RPC_CLIENT):
  *  - an mt_ps_t with the model's table slots (feature slots 1..3, rows of the dim-4
 *    embedding and the first-order weight);
 *  - the trainer's path into it, through the real psclient: dense tensors pushed with their
 *    initial values (PushDense), ROWS ids of each slot created (Lookup train) and moved by
 *    one gradient step (ApplyGradients);
 *  - an mt_serving_t on that shard, started: its sync thread pulls the rows (Sync) and its
 *    dense thread the model (PullDense) through the real sync code, until it is ready; it is
 *    then stopped (a replica keeps what it synced and stays ready).
 * Every input then goes to the serving handler as the rpc server would pass it, so Predict's
 * own checks (slots, fid/slot agreement, candidate and fid limits), the pooling and the
 * model's forward pass are reached with real rows and dense parameters. At exit the target
 * prints how many inputs ended with each gRPC status (set MT_FUZZ_QUIET=1 to silence).
 */
#include <stdio.h>
#include <time.h>

#include "fuzz_common.h"
#include "fuzz_rpc_stub.h"
#include "monolith/v1/serving.pb-c.h"
#include "mt/model.h"
#include "mt/ps.h"
#include "mt/psclient.h"
#include "mt/serving.h"

#ifndef MT_FUZZ_METHOD
#error "MT_FUZZ_METHOD must be Predict or Lookup"
#endif

#define NSLOTS 3
#define DIM    4
#define ROWS   64 /* ids 0..ROWS-1 of each slot have rows (the seed corpus uses them) */

static mt_ps_t *ps;
static mt_serving_t *sv;
static uint64_t codes[18]; /* inputs per final gRPC status (17: no answer) */

static void die(const char *what, const char *why) {
    fprintf(stderr, "fuzz_serving: %s: %s\n", what, why);
    abort();
}

static void at_exit(void) {
    if (!getenv("MT_FUZZ_QUIET")) {
        fprintf(stderr, "fuzz_serving: %s answers by status:", MT_FUZZ_METHOD);
        for (int i = 0; i < 18; i++)
            if (codes[i])
                fprintf(stderr, " %d:%llu", i < 17 ? i : -1, (unsigned long long)codes[i]);
        fprintf(stderr, "\n");
    }
    mt_serving_destroy(sv);
    mt_ps_destroy(ps);
}

/* The model's table slots in @p slots (NSLOTS, rows of the embedding and the first-order
 * weight), and a small table config over them. */
static void table_config(mt_table_config_t *cfg, mt_table_slot_config_t *slots) {
    for (uint16_t i = 0; i < NSLOTS; i++) {
        mt_table_slot_config_init(&slots[i], (uint16_t)(i + 1), mt_model_row_floats(DIM));
        slots[i].zero_tail = MT_MODEL_ROW_TAIL;
    }
    mt_table_config_init(cfg);
    cfg->slots = slots;
    cfg->nslots = NSLOTS;
    cfg->shards_log2 = 2;
}

/* The trainer's side: dense tensors and rows pushed into the shard through psclient. */
static void train_once(const char *const *addrs) {
    mt_psc_config_t pc;
    mt_psc_config_init(&pc);
    pc.addrs = addrs;
    pc.num_shards = 1;
    mt_psc_t *psc;
    mt_model_config_t mc;
    mt_model_config_init(&mc);
    mc.nslots = NSLOTS;
    mc.dim = DIM;
    mc.nhidden = 1;
    mc.hidden[0] = 8;
    mt_model_t *m;
    if (mt_psc_create(&pc, &psc) != MT_OK) die("psclient", "cannot create");
    if (mt_model_create(&mc, &m) != MT_OK) die("model", "cannot create");
    size_t n = mt_model_nparams(m);
    mt_psc_tensor_t init[2 * MT_MODEL_MAX_HIDDEN + 2], grads[2 * MT_MODEL_MAX_HIDDEN + 2];
    float *zeros[2 * MT_MODEL_MAX_HIDDEN + 2];
    for (size_t i = 0; i < n; i++) {
        mt_model_param_t p;
        mt_model_param(m, i, &p);
        zeros[i] = calloc(p.size, sizeof(float));
        if (!zeros[i]) die("dense", "out of memory");
        init[i] = (mt_psc_tensor_t){p.name, p.ndim, {p.shape[0], p.shape[1]}, p.size, p.values};
        grads[i] = init[i];
        grads[i].values = zeros[i];
    }
    mt_rpc_status_t st = {0};
    if (mt_psc_push_dense(psc, grads, init, n, 1, NULL, &st) != MT_OK) die("PushDense", st.message);
    for (size_t i = 0; i < n; i++)
        free(zeros[i]);
    mt_model_destroy(m);

    enum { NFIDS = NSLOTS * ROWS, FLOATS = NSLOTS * ROWS * (DIM + MT_MODEL_ROW_TAIL) };
    static uint64_t fids[NFIDS];
    static float emb[FLOATS], grad[FLOATS];
    size_t k = 0;
    for (uint16_t s = 1; s <= NSLOTS; s++)
        for (uint64_t id = 0; id < ROWS; id++)
            fids[k++] = MT_FID_MAKE(s, id);
    int64_t now = (int64_t)time(NULL);
    if (mt_psc_lookup(psc, fids, NFIDS, 1, now, emb, FLOATS, NULL, &st) != MT_OK)
        die("Lookup", st.message);
    for (size_t i = 0; i < FLOATS; i++)
        grad[i] = (float)((int)(i % 7) - 3) * 0.05f;
    if (mt_psc_apply(psc, fids, NFIDS, grad, FLOATS, now, 1, 1, NULL, NULL, &st) != MT_OK)
        die("ApplyGradients", st.message);
    mt_psc_destroy(psc);
}

static void build(void) {
    static const char *const addrs[] = {"127.0.0.1:1"}; /* never dialled: the stub answers */
    mt_table_slot_config_t slots[NSLOTS];
    mt_fuzz_rpc_reset();

    mt_ps_config_t pcfg;
    mt_ps_config_init(&pcfg);
    table_config(&pcfg.table, slots);
    pcfg.table.filter_bytes = 1u << 16;
    pcfg.sync_max_followers = 0;
    if (mt_ps_create(&pcfg, NULL, &ps) != MT_OK || mt_ps_register(ps, NULL) != MT_OK)
        die("PS", "cannot build");
    atexit(at_exit);
    train_once(addrs);

    mt_serving_config_t cfg;
    mt_serving_config_init(&cfg);
    table_config(&cfg.table, slots);
    cfg.ps_addrs = addrs;
    cfg.num_shards = 1;
    cfg.nslots = NSLOTS;
    for (uint32_t i = 0; i < NSLOTS; i++)
        cfg.slot_ids[i] = (uint16_t)(i + 1);
    cfg.dim = DIM;
    cfg.nhidden = 1;
    cfg.hidden[0] = 8;
    cfg.max_candidates = 64;
    cfg.max_request_fids = 1024;
    cfg.workers = 1;
    cfg.sync_interval_ms = 10;
    cfg.sync_stream_ms = 0; /* poll: each Sync is one round the stub answers whole */
    cfg.dense_sync_interval_ms = 10;
    char err[256] = "";
    mt_err_t e = mt_serving_create(&cfg, &sv, err, sizeof(err));
    if (e == MT_OK) e = mt_serving_register(sv, NULL);
    if (e == MT_OK) e = mt_serving_start(sv);
    if (e != MT_OK) die("serving", err[0] ? err : mt_strerror(e));
    for (int i = 0; i < 1000 && !mt_serving_ready(sv); i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    mt_serving_stop(sv);
    mt_serving_counters_t k;
    mt_serving_counters(sv, &k);
    if (!k.ready || k.rows != NSLOTS * ROWS)
        die("serving", "the replica did not sync the shard's rows and dense parameters in 10 s");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!sv) build();
    if (mt_fuzz_rpc_call("/monolith.v1.Serving/" MT_FUZZ_METHOD, data, size) != 0)
        die(MT_FUZZ_METHOD, "no handler");
    int c = mt_fuzz_rpc_last_code();
    codes[c >= 0 && c < 17 ? c : 17]++;
    return 0;
}
