/*
 * fuzz_ps.c - the parameter server's RPC requests, through the real handlers of ps/src/handlers.c
 * (unpack, validation, table / dense work, reply packing) on an in-process mt_ps_t with a small
 * table; gRPC is replaced by fuzz_rpc_stub.c. One source, one target per method: MT_FUZZ_METHOD is
 * the method name ("Lookup", "ApplyGradients", "PullDense", "PushDense", "Sync", "Snapshot",
 * "Stats", "Restore", "Checkpoints"). The PS lives for the whole process
 * (as a shard does); every 4096 inputs it is rebuilt so that the table stays small. The
 * checkpoint methods get a real store (RocksDB in a temporary directory, removed at exit)
 * holding one checkpoint when the PS is built, so that Restore reaches the load and the swap.
 */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "fuzz_rpc_stub.h"
#include "monolith/v1/ps.pb-c.h"
#include "mt/ps.h"
#include "mt/store.h"

#ifndef MT_FUZZ_METHOD
#error "MT_FUZZ_METHOD must name a ParameterServer method"
#endif

static mt_ps_t *ps;
static mt_store_t *store;
static char store_dir[64];
static unsigned inputs;

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void at_exit(void) {
    mt_ps_destroy(ps);
    mt_store_close(store);
    if (store_dir[0]) nftw(store_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* The checkpoint methods' store, once per process. */
static void open_store(void) {
    if (strcmp(MT_FUZZ_METHOD, "Snapshot") && strcmp(MT_FUZZ_METHOD, "Restore") &&
        strcmp(MT_FUZZ_METHOD, "Checkpoints"))
        return;
    snprintf(store_dir, sizeof(store_dir), "/tmp/mt_fuzz_ps_XXXXXX");
    char err[256] = "";
    mt_store_config_t sc;
    mt_store_config_init(&sc);
    sc.chunk_bytes = 64u << 10;
    sc.compact_on_prune = 0;
    if (!mkdtemp(store_dir) || mt_store_open(store_dir, &sc, &store, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "fuzz_ps: cannot open a store in %s: %s\n", store_dir, err);
        abort();
    }
    atexit(at_exit);
}

static void build(void) {
    mt_table_slot_config_t slots[3];
    mt_ps_config_t cfg;
    mt_ps_config_init(&cfg);
    mt_fuzz_table_config(&cfg.table, slots);
    cfg.max_batch_fids = 512;
    cfg.sync_chunk_fids = 16;
    cfg.sync_max_followers = 0; /* a follow Sync answers its catch-up round and ends */
    cfg.admin_token = "secret";
    mt_fuzz_rpc_reset();
    if (mt_ps_create(&cfg, NULL, &ps) != MT_OK || mt_ps_register(ps, NULL) != MT_OK) {
        fprintf(stderr, "fuzz_ps: cannot build the PS\n");
        abort();
    }
    if (!store) open_store();
    if (store) mt_ps_set_store(ps, store);
    /* A few rows and a dense tensor, so that Sync, Stats and PullDense have work. */
    uint64_t fids[3] = {MT_FID_MAKE(1, 1), MT_FID_MAKE(2, 2), MT_FID_MAKE(3, 3)};
    Monolith__V1__LookupRequest lr = MONOLITH__V1__LOOKUP_REQUEST__INIT;
    lr.n_fids = 3;
    lr.fids = fids;
    lr.train = 1;
    uint8_t buf[256];
    size_t n = monolith__v1__lookup_request__pack(&lr, buf);
    mt_fuzz_rpc_call("/monolith.v1.ParameterServer/Lookup", buf, n);
    uint32_t shape[1] = {2};
    float values[2] = {1, 2};
    Monolith__V1__DenseTensor w = MONOLITH__V1__DENSE_TENSOR__INIT;
    w.name = "w";
    w.n_shape = 1;
    w.shape = shape;
    w.n_values = 2;
    w.values = values;
    Monolith__V1__DenseTensor *init[1] = {&w};
    Monolith__V1__PushDenseRequest pr = MONOLITH__V1__PUSH_DENSE_REQUEST__INIT;
    pr.n_init = 1;
    pr.init = init;
    n = monolith__v1__push_dense_request__pack(&pr, buf);
    mt_fuzz_rpc_call("/monolith.v1.ParameterServer/PushDense", buf, n);
    if (store) { /* a checkpoint of that, for Restore to load */
        mt_ps_snapshot_req_t req = {0};
        char why[256];
        mt_err_t e = mt_ps_snapshot(ps, &req, NULL, why, sizeof(why));
        /* the fuzzed Snapshots may have taken the store's ids to their limit: refused, with
         * the store's checkpoints left for Restore; anything else is a bug */
        if (e != MT_OK && !(e == MT_INVALID && strstr(why, "ids must stay below"))) {
            fprintf(stderr, "fuzz_ps: snapshot: %s: %s\n", mt_strerror(e), why);
            abort();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (ps && ++inputs % 4096 == 0) {
        mt_ps_destroy(ps);
        ps = NULL;
    }
    if (!ps) build();
    if (mt_fuzz_rpc_call("/monolith.v1.ParameterServer/" MT_FUZZ_METHOD, data, size) != 0) {
        fprintf(stderr, "fuzz_ps: no handler for %s\n", MT_FUZZ_METHOD);
        abort();
    }
    return 0;
}
