/*
 * ps.h - the parameter-server service: one shard's embedding table and dense parameters,
 * served over the rpc layer as monolith.v1.ParameterServer (proto/monolith/v1/ps.proto).
 *
 * The daemon (ps/main.c) parses the configuration, creates the service, registers it on an
 * mt_rpc_server_t, and drives the periodic work (expiry ticks, snapshots). The service
 * decodes and checks every request (malformed bytes, unknown slots, ids of another shard,
 * gradient lengths, non-finite values, batch limits) and answers with the gRPC status the
 * contract names, never touching the table for a bad request.
 *
 * Routing (contract): fid -> shard mt_ps_shard_of(fid, num_shards) = XXH3_64bits of the
 * fid's 8 little-endian bytes, modulo num_shards.
 *
 * Thread safety: every function may be called from any thread; handlers run concurrently
 * on the rpc workers (the table is thread-safe; dense parameters take a lock).
 */
#ifndef MT_PS_H
#define MT_PS_H

#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"
#include "mt/rpc.h"
#include "mt/table.h"

typedef struct mt_ps mt_ps_t;

/** Optimizer of the dense parameters (held on the PS, updated by PushDense). */
typedef struct mt_ps_dense_config {
    mt_table_opt_t opt; /* MT_OPT_SGD, MT_OPT_ADAGRAD or MT_OPT_ADAM (default Adam) */
    float lr;           /* default 0.001 */
    float beta1, beta2; /* Adam (default 0.9, 0.999) */
    float eps;          /* default 1e-8 */
    float init_accum;   /* Adagrad (default 0.1) */
} mt_ps_dense_config_t;

typedef struct mt_ps_config {
    uint32_t shard;          /* this shard, < num_shards */
    uint32_t num_shards;     /* >= 1 */
    mt_table_config_t table; /* slots borrowed during mt_ps_create() */
    mt_ps_dense_config_t dense;
    uint32_t max_batch_fids;  /* larger requests: RESOURCE_EXHAUSTED (default 1 Mi) */
    uint32_t sync_chunk_fids; /* entries per SyncChunk unless the client asks (default 4096) */
    const char *admin_token;  /* copied; NULL or "" = admin calls need no token */
} mt_ps_config_t;

/** Counters of one shard (what /metrics exports). */
typedef struct mt_ps_counters {
    uint64_t calls[8]; /* per method, in mt_ps_method order */
    uint64_t errors[8];
    uint64_t lookup_fids, apply_fids, sync_entries;
} mt_ps_counters_t;

/** Methods, for counters: Lookup, ApplyGradients, PullDense, PushDense, Sync, Snapshot, Stats. */
enum {
    MT_PS_LOOKUP,
    MT_PS_APPLY,
    MT_PS_PULL_DENSE,
    MT_PS_PUSH_DENSE,
    MT_PS_SYNC,
    MT_PS_SNAPSHOT,
    MT_PS_STATS,
    MT_PS_NMETHODS
};

void mt_ps_dense_config_init(mt_ps_dense_config_t *d);
void mt_ps_config_init(mt_ps_config_t *c);

/** The shard that owns @p fid among @p num_shards (the routing contract). */
uint32_t mt_ps_shard_of(uint64_t fid, uint32_t num_shards);

/**
 * Creates the service with an empty table (or, if @p table is not NULL, takes ownership of
 * that table, e.g. one restored from a snapshot).
 * @param[out] out  caller frees with mt_ps_destroy() (after the rpc server stopped).
 */
mt_err_t mt_ps_create(const mt_ps_config_t *cfg, mt_table_t *table, mt_ps_t **out);
void mt_ps_destroy(mt_ps_t *ps);

/** Registers the ParameterServer methods on @p srv (before mt_rpc_server_start()). */
mt_err_t mt_ps_register(mt_ps_t *ps, mt_rpc_server_t *srv);

/** The table (owned by the service; valid until mt_ps_destroy()). */
mt_table_t *mt_ps_table(mt_ps_t *ps);

/**
 * While restoring is 1, every method answers UNAVAILABLE ("restoring a snapshot") without
 * touching the table. The daemon sets it before it starts serving and clears it after
 * mt_ps_replace_table() installed the restored table.
 */
void mt_ps_set_restoring(mt_ps_t *ps, int restoring);

/** Replaces the (empty) table with @p table, taking ownership; only while restoring.
 *  @returns MT_OK or MT_INVALID (not restoring: the table stays the caller's). */
mt_err_t mt_ps_replace_table(mt_ps_t *ps, mt_table_t *table);

/** A random id chosen at creation: replicas that synced from another incarnation resync. */
uint64_t mt_ps_incarnation(const mt_ps_t *ps);

/** One expiry tick: at most @p max_buckets buckets at time @p now_s. */
uint64_t mt_ps_expire_tick(mt_ps_t *ps, uint32_t now_s, size_t max_buckets);

/** Snapshot hook: the daemon sets the function Snapshot calls (NULL: UNAVAILABLE). */
typedef mt_err_t (*mt_ps_snapshot_fn)(void *ud, uint64_t checkpoint_id, uint64_t *id_out,
                                      uint64_t *rows, uint64_t *bytes, double *seconds);
void mt_ps_set_snapshot_fn(mt_ps_t *ps, mt_ps_snapshot_fn fn, void *ud);

/** Dense parameters as one serialized blob (for snapshots) and back. */
mt_err_t mt_ps_dense_save(mt_ps_t *ps, uint8_t **buf, size_t *len);
mt_err_t mt_ps_dense_load(mt_ps_t *ps, const uint8_t *buf, size_t len);

void mt_ps_counters(mt_ps_t *ps, mt_ps_counters_t *out);

/**
 * Prometheus text exposition of the shard: calls, errors and latency histograms per
 * method, table rows, capacity, bytes, evictions, filter and change-log counters, with
 * @p extra (daemon-level lines, may be NULL) appended.
 * @param[out] body  malloc'd, caller frees.
 */
mt_err_t mt_ps_render_metrics(mt_ps_t *ps, const char *extra, char **body, size_t *len);

#endif /* MT_PS_H */
