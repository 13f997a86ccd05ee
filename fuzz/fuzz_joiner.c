/*
 * fuzz_joiner.c - Kafka `features` (Impression) and `actions` (Action) values through
 * mt_joiner_add(): unpack, validation, the join against RocksDB state. One source, two
 * targets: MT_FUZZ_STREAM is MT_JOINER_IMPRESSIONS or MT_JOINER_ACTIONS. The joiner's state
 * lives in a temporary directory made once per process and removed at exit; every input
 * also ticks the watermark and drains the outbox, so the state stays small.
 */
#include <ftw.h>
#include <stdio.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "mt/joiner.h"

#ifndef MT_FUZZ_STREAM
#error "MT_FUZZ_STREAM must be MT_JOINER_IMPRESSIONS or MT_JOINER_ACTIONS"
#endif

static mt_joiner_t *joiner;
static char state_dir[] = "/tmp/mt_fuzz_joiner.XXXXXX";
static int64_t clock_ms;

static int64_t fake_clock(void *opaque) {
    (void)opaque;
    return clock_ms;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void cleanup(void) {
    mt_joiner_close(joiner);
    joiner = NULL;
    nftw(state_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!joiner) {
        mt_joiner_config_t cfg;
        mt_joiner_config_init(&cfg);
        cfg.window_ms = 60000;
        cfg.allowed_lateness_ms = 1000;
        cfg.max_pending_memory = 64;
        cfg.max_early_actions = 64;
        cfg.negative_rate = 0.5;
        cfg.sync = 0;
        char err[256];
        if (!mkdtemp(state_dir) ||
            mt_joiner_open(state_dir, &cfg, fake_clock, NULL, &joiner, err, sizeof(err)) != MT_OK) {
            fprintf(stderr, "fuzz_joiner: cannot open the state in %s\n", state_dir);
            abort();
        }
        atexit(cleanup);
    }
    mt_joiner_outcome_t outcome;
    char why[256];
    clock_ms += 100;
    (void)mt_joiner_add(joiner, MT_FUZZ_STREAM, NULL, 0, 0, data, size, &outcome, why, sizeof(why));
    (void)mt_joiner_outcome_name(outcome);
    uint64_t closed = 0;
    (void)mt_joiner_tick(joiner, &closed);
    size_t n = mt_joiner_outbox_size(joiner);
    for (size_t i = 0; i < n; i++) {
        const mt_joiner_example_t *ex = mt_joiner_outbox_get(joiner, i);
        if (ex && ex->len) {
            volatile uint8_t sink = ex->value[ex->len - 1];
            (void)sink;
        }
    }
    (void)mt_joiner_outbox_done(joiner, n);
    return 0;
}
