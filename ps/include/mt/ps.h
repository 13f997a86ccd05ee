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
 * Routing (contract): a shard owns the fids with mt_route_shard_of(fid, num_shards) == shard
 * (mt/route.h, the one definition the clients and the serving replicas use too).
 *
 * Thread safety: every function may be called from any thread; handlers run concurrently
 * on the rpc workers (the table is thread-safe; dense parameters take a lock). A restore
 * replaces the table while the shard runs, after the calls using it finished (docs/locking.md).
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
    uint32_t max_batch_fids;     /* larger requests: RESOURCE_EXHAUSTED (default 1 Mi) */
    uint32_t sync_chunk_fids;    /* entries per SyncChunk unless the client asks (default 4096) */
    uint32_t sync_follow_max_s;  /* a follow Sync stream ends after this long (default 300) */
    uint32_t sync_max_followers; /* more follow streams end after their catch-up (default 2) */
    const char *admin_token;     /* copied; NULL or "" = admin calls need no token */
    /* The rpc server's max_message_bytes (mt_rpc_server_config_t; ps.max_message_bytes):
     * the largest answer gRPC will send. Requests whose answer would be larger get
     * RESOURCE_EXHAUSTED before anything is computed (Lookup), Sync chunks are cut to fit,
     * and any other answer over it is refused the same way. Default: the rpc default. */
    uint32_t max_message_bytes;
    /* Snapshots: one in this many writes the whole table, the others only the rows changed
     * since the previous snapshot (incremental, on top of it: docs/checkpoint.md). 1 (the
     * default): every snapshot is whole. The first after a start or a restore is whole. */
    uint32_t snapshot_full_every;
} mt_ps_config_t;

/** Methods, for counters: Lookup, ApplyGradients, PullDense, PushDense, Sync, Snapshot, Stats,
 *  Restore, Checkpoints. */
enum {
    MT_PS_LOOKUP,
    MT_PS_APPLY,
    MT_PS_PULL_DENSE,
    MT_PS_PUSH_DENSE,
    MT_PS_SYNC,
    MT_PS_SNAPSHOT,
    MT_PS_STATS,
    MT_PS_RESTORE,
    MT_PS_CHECKPOINTS,
    MT_PS_NMETHODS
};

/** Counters of one shard (what /metrics exports). */
typedef struct mt_ps_counters {
    uint64_t calls[MT_PS_NMETHODS]; /* per method, in the order above */
    uint64_t errors[MT_PS_NMETHODS];
    uint64_t lookup_fids, apply_fids, sync_entries;
    uint64_t examples_applied; /* see mt_ps_examples_applied() */
} mt_ps_counters_t;

void mt_ps_dense_config_init(mt_ps_dense_config_t *d);
void mt_ps_config_init(mt_ps_config_t *c);

/**
 * Creates the service with an empty table (or, if @p table is not NULL, takes ownership of
 * that table, e.g. one restored from a snapshot).
 * @param[out] out  caller frees with mt_ps_destroy() (after the rpc server stopped).
 */
mt_err_t mt_ps_create(const mt_ps_config_t *cfg, mt_table_t *table, mt_ps_t **out);
void mt_ps_destroy(mt_ps_t *ps);

/** Registers the ParameterServer methods on @p srv (before mt_rpc_server_start()). */
mt_err_t mt_ps_register(mt_ps_t *ps, mt_rpc_server_t *srv);

/** The table (owned by the service; valid until mt_ps_destroy() or a restore replaces it:
 *  mt_ps_restore() or the Restore method). */
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

/**
 * Asks follow Sync streams to end now (each sends its last chunk within one round): the
 * daemon calls it before mt_rpc_server_shutdown() so that replicas are not cut off by the
 * grace period. Thread-safe.
 */
void mt_ps_stop_streams(mt_ps_t *ps);

/** A random id chosen at creation: replicas that synced from another incarnation resync. */
uint64_t mt_ps_incarnation(const mt_ps_t *ps);

/** One expiry tick: at most @p max_buckets buckets at time @p now_s. */
uint64_t mt_ps_expire_tick(mt_ps_t *ps, uint32_t now_s, size_t max_buckets);

/* ---------------- checkpoints (ps/src/ckpt.c; docs/checkpoint.md) ----------------
 *
 * With a store attached, the shard writes checkpoints (Snapshot, mt_ps_snapshot()), lists
 * them (Checkpoints) and loads one while it runs (Restore, mt_ps_restore()). A checkpoint
 * holds the table ("sparse"), and a metadata blob: u32 n, n bytes of CheckpointMeta
 * (protobuf: id, shard, versions, step, examples_applied, consistent, Kafka offsets), then
 * the DenseState (protobuf). Snapshots, restores and listings are serialized (snap_lock).
 *
 * A restore loads the checkpoint into a new table first, then quiesces the shard: calls
 * arriving get UNAVAILABLE, follow Sync streams are asked to end, and it waits (at most
 * MT_PS_QUIESCE_S) for the calls in flight; then it swaps table, dense parameters and
 * examples_applied, takes a new incarnation (replicas resync in full) and resumes.
 */
#define MT_PS_QUIESCE_S 30         /* longest wait for calls in flight before a restore gives up */
#define MT_PS_NEWEST    UINT64_MAX /* mt_ps_restore(): the newest checkpoint, if any */

/** A Kafka position recorded with a checkpoint (the next offset to consume). */
typedef struct mt_ps_offset {
    const char *topic; /* borrowed */
    int32_t partition;
    int64_t offset;
} mt_ps_offset_t;

/** Checkpoint ids are below this (2^62): an id at or above it is refused (MT_INVALID), and
 *  so is a snapshot whose next id would reach it. */
#define MT_PS_CHECKPOINT_ID_MAX (UINT64_C(1) << 62)

/** What a snapshot asks for (initialize with {0}). */
typedef struct mt_ps_snapshot_req {
    uint64_t checkpoint_id;        /* 0: the next id after the newest (not with consistent) */
    int consistent;                /* 1: a cluster checkpoint (exactly checkpoint_id, which
                                     must be above every checkpoint of the shard) */
    uint64_t expect_incarnation;   /* not 0: MT_MISMATCH unless the shard's incarnation */
    const mt_ps_offset_t *offsets; /* noffsets entries stored in the meta (borrowed) */
    size_t noffsets;
    int local; /* 1: the daemon's own (periodic, last): skipped, MT_OK with checkpoint_id 0
                  and res->skipped, once the shard is coordinated (decided under snap_lock: a
                  restore cannot slip in between) */
} mt_ps_snapshot_req_t;

/** What a snapshot or a restore did. */
typedef struct mt_ps_ckpt_result {
    uint64_t checkpoint_id;    /* written or restored; 0: none (restore of nothing / empty) */
    uint64_t rows, bytes;      /* table rows; stream bytes (snapshot) */
    uint64_t examples_applied; /* the counter saved or restored */
    uint64_t incarnation;      /* the shard's incarnation after the call */
    uint64_t dropped;          /* restore: checkpoints above it deleted from the store */
    int consistent;            /* the checkpoint's mark */
    int skipped; /* snapshot: a local one skipped (the shard is coordinated); errbuf says why */
    int unsaved; /* with skipped: the state changed since the last checkpoint written or
                    restored (what a skipped shutdown snapshot leaves to the coordinator) */
    uint64_t last_id; /* with skipped: that checkpoint (0: none) */
    int incremental;  /* snapshot: only the changes since the previous checkpoint written */
    double seconds;
} mt_ps_ckpt_result_t;

typedef struct mt_store mt_store_t;

/** Attaches the checkpoint store (borrowed: it must outlive the service or be detached
 *  with NULL). Without one, Snapshot, Restore and Checkpoints answer FAILED_PRECONDITION. */
void mt_ps_set_store(mt_ps_t *ps, mt_store_t *store);

/**
 * Writes a checkpoint of the shard's state (table, dense parameters, counters) with
 * @p req's id, offsets and mark. Writers may keep running meanwhile (each part of the table
 * is consistent, see mt_table_save()); a coordinator pauses them for a consistent one.
 * A consistent one makes the shard coordinated (mt_ps_coordinated()).
 * @param[out] res  optional; @p errbuf says why on error, and why a local snapshot was
 *                  skipped (res->skipped)
 * @returns MT_OK; MT_INVALID (no store; consistent without an id; an id at or above
 *          MT_PS_CHECKPOINT_ID_MAX); MT_MISMATCH (another
 *          incarnation than expected, or a consistent id not above the newest); or the
 *          store's error.
 */
mt_err_t mt_ps_snapshot(mt_ps_t *ps, const mt_ps_snapshot_req_t *req, mt_ps_ckpt_result_t *res,
                        char *errbuf, size_t errlen);

/**
 * Loads checkpoint @p checkpoint_id into the running shard (see above). MT_PS_NEWEST: the
 * newest one, or nothing when the store has none (res->checkpoint_id 0; the daemon's
 * start). 0: the empty state. Otherwise (0 included) the checkpoints above it are deleted
 * from the store (mt_store_rollback()) once it is installed.
 * @returns MT_OK; MT_INVALID (no store); MT_NOT_FOUND (no such complete checkpoint);
 *          MT_MISMATCH (the checkpoint is another shard's); MT_UNAVAILABLE (calls in flight
 *          did not finish within MT_PS_QUIESCE_S: nothing changed); MT_CORRUPT, MT_NOMEM or
 *          the store's error. Only the rollback may fail after the state was installed (the
 *          error says so); calling again is safe.
 */
mt_err_t mt_ps_restore(mt_ps_t *ps, uint64_t checkpoint_id, mt_ps_ckpt_result_t *res, char *errbuf,
                       size_t errlen);

/**
 * mt_ps_restore() by a checkpoint coordinator of @p epoch (the Restore method; 0: none).
 * Under the snapshot lock, before anything changes: MT_FENCED if @p epoch is below the
 * highest coordinator epoch the shard has seen (another coordinator took over), else the
 * shard's epoch becomes @p epoch (the claim: docs/checkpoint.md, "Fencing"). A restored
 * checkpoint also raises the shard's epoch to the one it was written under, so a restarted
 * shard keeps fencing the coordinators its last checkpoint's coordinator replaced.
 * With @p epoch not 0 the shard becomes coordinated (mt_ps_coordinated()); an operator's
 * restore (0) leaves the mode as it was.
 */
mt_err_t mt_ps_restore_claim(mt_ps_t *ps, uint64_t checkpoint_id, uint64_t epoch,
                             mt_ps_ckpt_result_t *res, char *errbuf, size_t errlen);

/**
 * 1 once a checkpoint coordinator (an exactly-once trainer, docs/checkpoint.md) owns the
 * shard's checkpoints. Exactly three things turn it on, each logged with its reason (which
 * a skipped local snapshot repeats in its errbuf):
 *  - a consistent Snapshot (a cluster checkpoint: only a coordinator writes those);
 *  - a Restore carrying a coordinator epoch (mt_ps_restore_claim() with epoch > 0);
 *  - a start (MT_PS_NEWEST) from a consistent checkpoint.
 * An operator's Restore (no epoch) never does. Nothing turns it off but a new service.
 * The daemon then writes no local snapshots (they would push cluster checkpoints out of
 * ps.snapshot_keep; the coordinator's recovery redoes what is after its last checkpoint).
 */
int mt_ps_coordinated(mt_ps_t *ps);

/** Examples the shard's state reflects: the sum of ApplyGradientsRequest.examples since the
 *  empty state, saved in checkpoints and restored with them. */
uint64_t mt_ps_examples_applied(mt_ps_t *ps);

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

/* ---------------- the change stream on Kafka (docs/serving.md) ---------------- */

typedef struct mt_ps_publisher mt_ps_publisher_t;

typedef struct mt_ps_publish_config {
    const char *bootstrap;         /* borrowed during start */
    const char *const *kafka_conf; /* NULL or "key=value" entries (TLS, SASL), borrowed */
    const char *topic;             /* copied (default "params"); partition = the shard */
    uint32_t interval_ms;          /* a round every this many ms (default 100) */
    uint32_t max_message_bytes;    /* a message's payload at most (default 900000) */
    uint32_t flush_ms;             /* how long a round waits for its delivery (default 5000) */
} mt_ps_publish_config_t;

typedef struct mt_ps_publish_stats {
    uint64_t rounds, messages, entries; /* closed rounds, messages produced, entries in them */
    uint64_t failures;                  /* rounds or markers not delivered (retried) */
    uint64_t resyncs;                   /* resync markers published */
    uint64_t version;                   /* published up to */
    double last_ok_s;                   /* CLOCK_MONOTONIC s of the last round; 0: none */
} mt_ps_publish_stats_t;

void mt_ps_publish_config_init(mt_ps_publish_config_t *c);

/**
 * Starts a thread that publishes the shard's changes to partition <shard> of cfg->topic
 * (publish.c says how: rounds of SyncChunks closed by a caught_up chunk once delivered, a
 * resync marker after a start, a restore or a change log that no longer covers the last
 * round). A round that fails is retried from the same version; nothing here ever blocks a
 * method or a restore on Kafka.
 * @param[out] out  stop with mt_ps_publisher_stop() before mt_ps_destroy()
 * @returns MT_OK, MT_INVALID, MT_CONFIG (a property, or a row too wide for a message:
 * errbuf says), MT_NOMEM, MT_INTERNAL.
 * Thread safety: thread-safe.
 */
mt_err_t mt_ps_publisher_start(mt_ps_t *ps, const mt_ps_publish_config_t *cfg,
                               mt_ps_publisher_t **out, char *errbuf, size_t errlen);

/** Stops the thread (the round in progress ends first), flushes and frees @p p (NULL: no-op).
 *  Thread safety: no other call on @p p may run or follow. */
void mt_ps_publisher_stop(mt_ps_publisher_t *p);

/** Reads the counters. Thread safety: thread-safe. */
void mt_ps_publisher_stats(const mt_ps_publisher_t *p, mt_ps_publish_stats_t *out);

/** The monolith_ps_publish_* metrics (Prometheus text) into @p buf (NULL @p p: empty).
 *  Thread safety: thread-safe. */
void mt_ps_publisher_render_metrics(const mt_ps_publisher_t *p, char *buf, size_t len);

#endif /* MT_PS_H */
