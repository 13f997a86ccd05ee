/*
 * shard.c - the state of one shard (shard_int.h): its configuration and limits, the table,
 * the counters, the incarnation and the coordinator epoch, and the quiescing of a restore
 * (mt__ps_enter / mt__ps_leave / mt__ps_install). The bottom layer of the ps module with
 * the dense store (dense.c), which it embeds; it calls nothing above it.
 *
 * Invariants: incarnation is never 0 and changes only in mt__ps_install(), while no call
 * uses the table; epoch never decreases; inflight counts the calls between mt__ps_enter()
 * and mt__ps_leave().
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <xxhash.h>

#include "mt/clock.h"
#include "mt/log.h"
#include "shard_int.h"

/* A random incarnation, never 0 and never @p old. */
static uint64_t new_incarnation(uint64_t old) {
    uint64_t v = 0;
    for (int i = 0; i < 4 && (v == 0 || v == old); i++) {
        if (getrandom(&v, sizeof(v), 0) != sizeof(v)) v = 0;
        if (v == 0 || v == old) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            v = XXH3_64bits_withSeed(&ts, sizeof(ts), old + (uint64_t)i);
        }
    }
    return v ? v : 1;
}

/* ============================== lifecycle ============================== */

mt_err_t mt__ps_shard_init(mt_ps_t *ps, const mt_ps_config_t *cfg, mt_table_t *table) {
    ps->cfg = *cfg;
    ps->cfg.table.slots = NULL; /* borrowed: copied below */
    if (cfg->admin_token && *cfg->admin_token && !(ps->admin_token = strdup(cfg->admin_token)))
        return MT_NOMEM;
    ps->cfg.admin_token = ps->admin_token;
    if (cfg->table.nslots && cfg->table.slots) {
        ps->slots = malloc(cfg->table.nslots * sizeof(*ps->slots));
        if (!ps->slots) return MT_NOMEM;
        memcpy(ps->slots, cfg->table.slots, cfg->table.nslots * sizeof(*ps->slots));
        ps->cfg.table.slots = ps->slots;
    }
    ps->incarnation = new_incarnation(0);
    mt_err_t err = mt__ps_marks_create(&ps->marks);
    if (err) return err;
    if (table) {
        ps->table = table;
    } else {
        err = mt_table_create(&cfg->table, &ps->table);
    }
    if (err) return err;
    for (uint32_t slot = 0; slot < 65536; slot++) {
        uint32_t dim;
        if (mt_table_dim(ps->table, MT_FID_MAKE(slot, 0), &dim) == MT_OK && dim > ps->max_dim)
            ps->max_dim = dim;
    }
    return MT_OK;
}

void mt__ps_shard_fini(mt_ps_t *ps) {
    mt_table_destroy(ps->table);
    ps->table = NULL;
    mt__ps_marks_destroy(ps->marks);
    ps->marks = NULL;
    free(ps->admin_token);
    free(ps->slots);
}

/* ============================== state ============================== */

mt_table_t *mt_ps_table(mt_ps_t *ps) {
    return ps->table;
}

void mt_ps_set_restoring(mt_ps_t *ps, int restoring) {
    atomic_store_explicit(&ps->restoring, restoring ? 1 : 0, memory_order_release);
}

mt_err_t mt_ps_replace_table(mt_ps_t *ps, mt_table_t *table) {
    if (!atomic_load(&ps->restoring) || !table) return MT_INVALID;
    mt_table_destroy(ps->table);
    ps->table = table;
    return MT_OK;
}
void mt_ps_stop_streams(mt_ps_t *ps) {
    atomic_store(&ps->stop_streams, 1);
}

uint64_t mt_ps_incarnation(const mt_ps_t *ps) {
    return ps->incarnation;
}

uint64_t mt_ps_expire_tick(mt_ps_t *ps, uint32_t now_s, size_t max_buckets) {
    uint64_t evicted = 0;
    if (mt__ps_enter(ps) != 0) return 0; /* restoring: the next tick */
    mt_table_expire(ps->table, now_s, max_buckets, &evicted);
    mt__ps_leave(ps);
    return evicted;
}

uint64_t mt_ps_examples_applied(mt_ps_t *ps) {
    return atomic_load(&ps->examples_applied);
}

void mt_ps_counters(mt_ps_t *ps, mt_ps_counters_t *out) {
    memset(out, 0, sizeof(*out));
    for (int i = 0; i < MT_PS_NMETHODS; i++) {
        out->calls[i] = atomic_load(&ps->calls[i]);
        out->errors[i] = atomic_load(&ps->errors[i]);
    }
    out->lookup_fids = atomic_load(&ps->lookup_fids);
    out->apply_fids = atomic_load(&ps->apply_fids);
    out->sync_entries = atomic_load(&ps->sync_entries);
    out->examples_applied = atomic_load(&ps->examples_applied);
}

/* ============================== dense parameters ============================== */

mt_err_t mt_ps_dense_save(mt_ps_t *ps, uint8_t **buf, size_t *len) {
    return mt__ps_dense_save(&ps->dense, buf, len);
}

mt_err_t mt_ps_dense_load(mt_ps_t *ps, const uint8_t *buf, size_t len) {
    mt__ps_dense_t *dd = NULL;
    mt_err_t err = mt__ps_dense_parse(buf, len, &dd);
    if (err) return err;
    mt__ps_dense_swap(&ps->dense, dd);
    mt__ps_dense_free(dd);
    return MT_OK;
}

/* ============================== restore ============================== */

int mt__ps_enter(mt_ps_t *ps) {
    /* Dekker with mt__ps_install: count first, then look (both sequentially consistent), so
     * that either the installer sees this call in flight or this call sees the flag. */
    atomic_fetch_add(&ps->inflight, 1);
    if (!atomic_load(&ps->restoring)) return 0;
    atomic_fetch_sub(&ps->inflight, 1);
    return -1;
}

void mt__ps_leave(mt_ps_t *ps) {
    atomic_fetch_sub(&ps->inflight, 1);
}

const mt_ps_config_t *mt__ps_config(const mt_ps_t *ps) {
    return &ps->cfg;
}

uint64_t mt__ps_epoch(mt_ps_t *ps) {
    return atomic_load(&ps->epoch);
}

void mt__ps_epoch_raise(mt_ps_t *ps, uint64_t epoch) {
    mt__atomic_max(&ps->epoch, epoch);
}

int mt__ps_fenced(mt_ps_t *ps, uint64_t epoch, char *why, size_t len) {
    uint64_t cur = atomic_load(&ps->epoch);
    if (!epoch || epoch >= cur) return 0;
    mt_msgf(why, len,
            "fenced: coordinator epoch %llu is below %llu (another trainer took over the "
            "cluster's checkpoints)",
            (unsigned long long)epoch, (unsigned long long)cur);
    return 1;
}

uint64_t mt__ps_step(mt_ps_t *ps) {
    return atomic_load(&ps->step);
}

mt_err_t mt__ps_install(mt_ps_t *ps, mt_table_t *table, mt__ps_dense_t *dense, uint64_t examples,
                        uint64_t step, mt__ps_mark_list_t marks[2], double wait_s) {
    int was = atomic_exchange(&ps->restoring, 1);
    /* Follow Sync streams end at their next round when stop_streams is not 0; +2 / -2 keeps
     * a daemon's mt_ps_stop_streams() (a store of 1) meanwhile in force (1 + 2 - 2, or
     * 2 -> 1 -> -1: not 0 either way). */
    atomic_fetch_add(&ps->stop_streams, 2);
    double deadline = mt_mono_s() + wait_s;
    while (atomic_load(&ps->inflight) > 0 && mt_mono_s() < deadline) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    mt_err_t err = atomic_load(&ps->inflight) > 0 ? MT_UNAVAILABLE : MT_OK;
    mt_table_t *old = NULL;
    if (!err) {
        old = ps->table;
        ps->table = table;
        mt__ps_dense_swap(&ps->dense, dense);
        atomic_store(&ps->examples_applied, examples);
        atomic_store(&ps->step, step);
        mt__ps_marks_replace(ps->marks, MT__PS_SPARSE, &marks[0]);
        mt__ps_marks_replace(ps->marks, MT__PS_DENSE, &marks[1]);
        atomic_store(&ps->incarnation, new_incarnation(atomic_load(&ps->incarnation)));
    }
    atomic_fetch_sub(&ps->stop_streams, 2);
    atomic_store(&ps->restoring, was);
    mt_table_destroy(old); /* nothing uses it: every call that could is over */
    return err;
}
