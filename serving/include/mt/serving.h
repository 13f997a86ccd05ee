/*
 * serving.h - the serving replica: monolith.v1.Serving (proto/monolith/v1/serving.proto)
 * answered from this process's own copy of the parameters, kept in step with the parameter
 * servers by periodic sync (docs/serving.md).
 *
 * What one mt_serving_t holds and does:
  *  - a replica table (mt/table.h) with the table slots of the trainer's model (slot s for
 *    every feature slot s, its row the embedding then the first-order weight). It is
 *    written only by the sync threads (mt_table_assign / mt_table_remove, under the table's
 *    own per-part locks) and read by Predict and Lookup with lock-free seqlocked lookups that
 *    never insert and never count;
 *  - one sync thread per PS shard: every sync_interval_ms it opens Sync(since, incarnation)
 *    on its shard and applies the chunks in order. A full stream (first sync, another
 *    incarnation of the shard, a version the shard's change log no longer covers) replaces
 *    only that shard's rows: it assigns every row it carries, then removes the rows of that
 *    shard (mt_route_shard_of) that the stream did not touch (their replica version is older
 *    than the stream's start). A failed sync is logged, counted and retried at the next tick;
 *    the other shards go on;
 *  - a dense thread: every dense_sync_interval_ms it pulls the dense parameters from shard 0
 *    (only when the PS's version is newer) into a spare model and publishes it; a Predict
 *    holds a reference to the model it started with, so a swap never waits for a Predict and
 *    a Predict never waits for a pull;
 *  - Predict: user-side fids pooled once per slot, each candidate's item fids added, one
 *    mt_model_forward_serving() per request with the log-odds correction for negative_rate;
 *    the reply's scores are one per candidate (a multi-task model's task 0, the click), and
 *    a multi-task model (mmoe, T > 1 tasks) adds every task's in task_scores ([n x T],
 *    candidate-major) and T in tasks; sampled requests' impressions go to Kafka (one
 *    Impression per candidate with its task-0 score, key = request id) without ever
 *    blocking: a full producer queue drops and counts.
 *
 * Readiness: until the first dense pull succeeded and every shard completed one sync,
 * Health answers NOT_SERVING and Predict / Lookup answer UNAVAILABLE.
 *
 * Request rules (the statuses a client sees):
 *  - malformed protobuf, a request_id longer than MT_SERVING_MAX_REQUEST_ID_BYTES, a fid
 *    whose top 16 bits are not its SlotFids' slot, Lookup with train = true, Lookup of a fid
 *    whose slot the replica does not have: INVALID_ARGUMENT;
 *  - more than max_candidates candidates, more than max_request_fids fids in all, a reply
 *    that could be larger than max_message_bytes (Lookup: 4 bytes per value and 1 per fid;
 *    Predict: 4 bytes per candidate, 4 x (T + 1) with T > 1 tasks; plus a few bytes of
 *    framing): RESOURCE_EXHAUSTED, before any work;
 *  - every refusal is counted by status (mt_serving_counters_t.errors);
 *  - SlotFids of slots the model does not have: ignored and counted (a client may send
 *    features the model does not use yet);
 *  - not ready: UNAVAILABLE.
 *
 * Thread safety: mt_serving_* functions may be called from any thread. The rpc workers
 * run Predict and Lookup concurrently with each other and with the sync threads.
 * Lock order (docs/locking.md): model_lock and stat_lock are leaves, never held across a
 * call into the table, the model's math, the network or Kafka.
 */
#ifndef MT_SERVING_H
#define MT_SERVING_H

#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"
#include "mt/model.h"
#include "mt/rpc.h"
#include "mt/table.h"

typedef struct mt_serving mt_serving_t;
typedef struct mt_kafka_producer mt_kafka_producer_t;

#define MT_SERVING_MAX_SLOTS  256 /* feature slots of the model (as the trainer) */
#define MT_SERVING_MAX_HIDDEN 8
#define MT_SERVING_MAX_REQUEST_ID_BYTES \
    256 /* PredictRequest.request_id; longer: INVALID_ARGUMENT */

typedef struct mt_serving_config {
    /* The PS shards: addrs[i] serves shard i (borrowed during create). */
    const char *const *ps_addrs;
    uint32_t num_shards;
    /* The model, as [trainer] configures it (feature slots each < 0x8000). */
    uint32_t nslots;
    uint16_t slot_ids[MT_SERVING_MAX_SLOTS];
    uint32_t dim;
    uint32_t nhidden;
    uint32_t hidden[MT_SERVING_MAX_HIDDEN];
    mt_model_family_t family; /* the model family and its settings (default deepfm) */
    uint64_t hash_buckets;    /* as trainer.hash_buckets: ids reduced modulo this; 0 = none */
    uint64_t slot_hash_buckets[MT_SERVING_MAX_SLOTS]; /* parallel to slot_ids, as the
                                                         trainer's: 0 = hash_buckets */
    uint8_t slot_mean[MT_SERVING_MAX_SLOTS];          /* parallel to slot_ids: 1 = mean pooling */
    uint32_t slot_dim[MT_SERVING_MAX_SLOTS]; /* parallel to slot_ids: the slot's dim, 0 = dim
                                                (as the trainer's slot_dim) */
    /* The replica table: parts, hash seed, pre-size and the slots (borrowed during create;
     * they must hold every table slot of the model; the replica keeps their dims and
     * precision and drops what only a trainer needs: filter, TTL, optimizer state). */
    mt_table_config_t table;
    float negative_rate;             /* negatives kept in training, (0, 1] (default 1) */
    uint32_t sync_interval_ms;       /* sparse sync period (default 10000) */
    uint32_t sync_stream_ms;         /* follow streams' round period; 0 = poll (default 100) */
    uint32_t dense_sync_interval_ms; /* dense pull period (default 60000) */
    uint32_t sync_timeout_ms;        /* deadline of one Sync stream / PullDense (default 120000) */
    uint32_t sync_chunk_fids;        /* entries per SyncChunk asked for; 0: the PS's default */
    uint32_t max_candidates;         /* default 10000 */
    uint32_t max_request_fids;       /* user + item fids of one request (default 1 Mi) */
    uint32_t max_message_bytes;      /* the rpc server's max_message_bytes (what gRPC sends
                                        at most): a Predict or Lookup whose reply could be
                                        larger is refused first (default 64 MiB, as
                                        mt_rpc_server_config_init()) */
    mt_rpc_tls_config_t ps_tls;      /* TLS of the PS and peer channels (paths borrowed
                                        during create; default: plaintext) */
    /* Sharded serving (docs/serving.md): the PS shards this node holds (borrowed during
     * create; nheld = 0: every shard) and the serving nodes to read the others from. */
    const uint32_t *held_shards;
    uint32_t nheld;
    const char *const *peer_addrs; /* borrowed during create */
    uint32_t npeers;
    uint32_t peer_timeout_ms; /* deadline of a Predict's peer Lookups (default 100) */
    uint32_t peer_refresh_ms; /* period of the peers' discovery (default 1000) */
    int peer_zeros;           /* a failed peer: 0 = Predict UNAVAILABLE, 1 = read zeros */
    /* Following through Kafka (docs/serving.md, "Parameter fan-out through Kafka"): 0 =
     * a Sync stream per shard (sync_stream_ms); 1 = one Sync per shard at start (and after
     * a resync), then partition <shard> of params_topic, which the shards publish. */
    int sync_kafka;
    const char *kafka_bootstrap;   /* copied; needed with sync_kafka */
    const char *const *kafka_conf; /* NULL or "key=value" entries, borrowed during create */
    const char *params_topic;      /* copied (default "params") */
    uint32_t workers;              /* workspaces kept for concurrent Predicts (default 4) */
    /* Impression log: producer borrowed (must outlive the service), NULL = no logging. */
    mt_kafka_producer_t *producer;
    const char *features_topic; /* copied (default "features") */
    double log_sample_rate;     /* [0, 1] share of requests logged (default 1) */
} mt_serving_config_t;

/** What one shard's sync did (mt_serving_shard_status()). */
typedef struct mt_serving_shard_status {
    uint64_t syncs, failures, full_syncs;
    uint64_t entries, deleted; /* entries applied, of which deletions */
    uint64_t since_version;    /* the upto_version of the last good sync */
    uint64_t incarnation;      /* of the shard at the last good sync */
    double last_ok_s;          /* CLOCK_MONOTONIC seconds of the last good sync; 0: never */
    double last_duration_s;    /* how long the last good sync took (stream + applies) */
    /* Following through Kafka: rounds skipped (already applied), returns to a direct sync
     * (a resync marker, another incarnation, a gap, an offset out of range, a bad message),
     * and the offset of the next message to read (-1: not following). */
    uint64_t kafka_skipped, kafka_resyncs;
    int64_t kafka_offset;
} mt_serving_shard_status_t;

/** Counters of the service (what /metrics exports besides the histograms). */
typedef struct mt_serving_counters {
    uint64_t predicts, candidates, lookups;
    uint64_t errors[17];   /* per gRPC status code of a failed Predict or Lookup */
    uint64_t ignored_fids; /* fids of slots the model does not have */
    uint64_t logged, log_dropped, log_errors;
    uint64_t dense_pulls, dense_failures, dense_version;
    uint64_t rows;
    int ready;
} mt_serving_counters_t;

void mt_serving_config_init(mt_serving_config_t *cfg);

/**
 * Creates the service: validates @p cfg, creates the empty replica and the PS channels.
 * Nothing runs until mt_serving_start().
 * @param[out] out  caller frees with mt_serving_destroy()
 * @returns MT_OK, MT_CONFIG (message in @p errbuf), MT_NOMEM.
 */
mt_err_t mt_serving_create(const mt_serving_config_t *cfg, mt_serving_t **out, char *errbuf,
                           size_t errlen);

/** Registers Predict and Lookup on @p srv (before mt_rpc_server_start()); the service
 *  keeps @p srv (borrowed: it must outlive the service's threads) to switch its Health. */
mt_err_t mt_serving_register(mt_serving_t *sv, mt_rpc_server_t *srv);

/** Starts the sync threads (a first sync of every shard and a dense pull at once).
 *  @returns MT_OK, MT_INVALID (already started), MT_NOMEM. */
mt_err_t mt_serving_start(mt_serving_t *sv);

/** Stops and joins the sync threads (an in-flight sync ends at its next chunk or its
 *  deadline). Idempotent. Stop the rpc server first if Predicts may still arrive. */
void mt_serving_stop(mt_serving_t *sv);

/** Stops if needed and frees everything. NULL is a no-op. */
void mt_serving_destroy(mt_serving_t *sv);

/** 1 once the first dense pull and a sync of every shard succeeded. */
int mt_serving_ready(mt_serving_t *sv);

/** The replica (valid until mt_serving_destroy(); read it, never write it). */
mt_table_t *mt_serving_table(mt_serving_t *sv);

/** Status of shard @p shard's sync. @returns MT_OK or MT_INVALID (no such shard). */
mt_err_t mt_serving_shard_status(mt_serving_t *sv, uint32_t shard, mt_serving_shard_status_t *out);

void mt_serving_counters(mt_serving_t *sv, mt_serving_counters_t *out);

/**
 * Prometheus text exposition: requests, candidates, errors by status, the Predict latency
 * histogram, per-shard syncs / failures / lag, replica rows and bytes, dense version,
 * impressions logged and dropped; @p extra (daemon lines, may be NULL) appended.
 * @param[out] body  malloc'd, caller frees.
 */
mt_err_t mt_serving_render_metrics(mt_serving_t *sv, const char *extra, char **body, size_t *len);

#endif /* MT_SERVING_H */
