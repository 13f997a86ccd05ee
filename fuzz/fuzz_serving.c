/*
 * fuzz_serving.c - serving's RPC requests through its real handlers on an in-process
 * mt_serving_t (never started: no sync threads, no PS needed; gRPC replaced by
 * fuzz_rpc_stub.c). MT_FUZZ_METHOD is "Predict" or "Lookup".
 *
 * Limitation: Predict answers UNAVAILABLE until the replica has synced from every PS shard
 * (sv->ready), which needs live Sync streams; the PredictRequest is therefore also unpacked
 * here directly (protobuf-c), but serving's own checks of a Predict (slots, fid limits,
 * candidates) are not reached. Lookup has no such gate and is fuzzed whole.
 */
#include <stdio.h>

#include "fuzz_common.h"
#include "fuzz_rpc_stub.h"
#include "monolith/v1/serving.pb-c.h"
#include "mt/serving.h"

#ifndef MT_FUZZ_METHOD
#error "MT_FUZZ_METHOD must be Predict or Lookup"
#endif

static mt_serving_t *sv;

static void build(void) {
    static const char *const addrs[] = {"127.0.0.1:1"};
    /* Feature slots 1..3 (dim 4) and their first-order slots s | 0x8000 (dim 1). */
    mt_table_slot_config_t slots[6];
    for (uint16_t i = 0; i < 3; i++) {
        mt_table_slot_config_init(&slots[i], (uint16_t)(i + 1), 4);
        mt_table_slot_config_init(&slots[3 + i], (uint16_t)((i + 1) | 0x8000), 1);
    }
    mt_serving_config_t cfg;
    mt_serving_config_init(&cfg);
    mt_table_config_init(&cfg.table);
    cfg.table.slots = slots;
    cfg.table.nslots = 6;
    cfg.table.shards_log2 = 2;
    cfg.ps_addrs = addrs;
    cfg.num_shards = 1;
    cfg.nslots = 3;
    cfg.slot_ids[0] = 1;
    cfg.slot_ids[1] = 2;
    cfg.slot_ids[2] = 3;
    cfg.dim = 4;
    cfg.max_candidates = 64;
    cfg.max_request_fids = 1024;
    cfg.workers = 1;
    char err[256];
    mt_fuzz_rpc_reset();
    mt_err_t e = mt_serving_create(&cfg, &sv, err, sizeof(err));
    if (e == MT_OK) e = mt_serving_register(sv, NULL);
    if (e != MT_OK) {
        fprintf(stderr, "fuzz_serving: cannot build the service: %s\n", err);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!sv) build();
    if (!strcmp(MT_FUZZ_METHOD, "Predict")) {
        Monolith__V1__PredictRequest *r = monolith__v1__predict_request__unpack(NULL, size, data);
        if (r) {
            size_t n = monolith__v1__predict_request__get_packed_size(r);
            uint8_t *buf = malloc(n ? n : 1);
            if (buf) monolith__v1__predict_request__pack(r, buf);
            free(buf);
            monolith__v1__predict_request__free_unpacked(r, NULL);
        }
    }
    if (mt_fuzz_rpc_call("/monolith.v1.Serving/" MT_FUZZ_METHOD, data, size) != 0) {
        fprintf(stderr, "fuzz_serving: no handler for %s\n", MT_FUZZ_METHOD);
        abort();
    }
    return 0;
}
