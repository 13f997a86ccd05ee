/*
 * config.h - the configuration of every Monolith-C daemon: one INI file, one struct.
 *
 * One private property table in src/config.c (section, key, type, field offset, bounds,
 * default as text, doc) drives everything here: the defaults set by mt_config_init(), file
 * parsing, command-line overrides, the unknown-key error, bounds checks, mt_config_validate()
 * and the generated reference (docs/config.md, from mt_config_write_reference()). A new key is
 * one line in that table and one field here.
 *
 * File format (every key, its bounds and default: docs/config.md):
 *
 *     # comment                 ; comment
 *     [cluster]                 sections: cluster, ps, table, dense, trainer, input, kafka,
 *                               joiner, serving, tls, slot.N (N = 0..65535)
 *     num_shards = 3            key = value; whitespace around both is trimmed
 *     ps = 10.0.0.1:7100, 10.0.0.2:7100   # inline comment: '#' or ';' after whitespace
 *     [slot.1]                  one section per slot; every slot needs a dim
 *     dim = 16
 *
 * Lines are of any length. Unknown sections and keys, a key or section given twice, a key
 * before any section, a line that is neither "[section]" nor "key = value", a number with
 * trailing characters, a value out of bounds and an empty value where the key does not allow
 * one are errors that name the file, the line and the key. Values cannot contain " #" or " ;"
 * (they start a comment) and are never quoted. Integers are decimal or 0x-prefixed hex;
 * reals are read with strtod() (so in the C locale: daemons never call setlocale()).
 *
 * Ownership: an mt_config_t owns every string and array it points to; mt_config_free()
 * releases them. Read the fields freely; change them only through mt_config_set() (or keep
 * to the documented invariants: strings non-NULL, slots sorted by id, names parallel).
 *
 * Thread safety: no function here uses global state; calls on different mt_config_t values
 * may run concurrently. One mt_config_t is not locked: any number of threads may read it
 * (fields, mt_config_validate(), mt_config_table(), mt_config_slot()) while none modifies it.
 * mt_config_write_reference() only reads constant data.
 */
#ifndef MT_CONFIG_H
#define MT_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mt/err.h"
#include "mt/model.h"
#include "mt/table.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_CONFIG_MAX_SHARDS       4096u       /* cluster.num_shards and cluster.ps entries */
#define MT_CONFIG_MAX_FILE_BYTES   (16u << 20) /* mt_config_load_file() refuses larger files */
#define MT_CONFIG_MAX_TASK_ACTIONS 4u          /* joiner.task_actions entries at most */

/** [cluster]: the shards and where they live. */
typedef struct mt_config_cluster {
    uint32_t num_shards; /* number of PS shards; 0: as many as ps addresses */
    char **ps;           /* owned: nps owned "host:port" strings; ps[i] serves shard i */
    size_t nps;
} mt_config_cluster_t;

/** [ps]: the parameter server daemon. Strings are owned and never NULL ("" = unset). */
typedef struct mt_config_ps {
    uint32_t shard;                   /* this PS's shard, < the number of shards */
    char *listen;                     /* gRPC address "host:port" (port 0: any free port) */
    uint32_t threads;                 /* request-serving threads */
    uint64_t max_message_bytes;       /* largest gRPC message received or sent */
    uint32_t max_batch_fids;          /* ids in one request; more: RESOURCE_EXHAUSTED */
    uint32_t sync_chunk_fids;         /* entries per Sync chunk unless the client asks */
    uint32_t sync_follow_max_s;       /* a follow Sync stream's longest life */
    uint32_t sync_max_followers;      /* follow Sync streams at once (< max_streams) */
    uint32_t publish_ms;              /* changes to kafka.params_topic every this many ms; 0 off */
    char *snapshot_dir;               /* "" = no snapshots */
    uint32_t snapshot_interval_s;     /* 0 = no periodic snapshots */
    uint32_t snapshot_keep;           /* snapshots kept; older ones are deleted */
    uint32_t snapshot_full_every;     /* one whole snapshot in this many; others incremental */
    uint32_t expire_interval_ms;      /* 0 = no expiry ticks */
    uint64_t expire_buckets_per_tick; /* mt_table_expire() budget of one tick */
    uint32_t max_queued_calls;        /* calls waiting for a thread; more: refused */
    uint32_t max_streams;             /* streaming calls at once; more: refused */
    char *admin_token;                /* "" = admin calls need no token */
    char *metrics_listen;             /* Prometheus /metrics "host:port"; "" = disabled */
} mt_config_ps_t;

/** [dense]: optimizer of the dense (non-embedding) parameters (as mt_ps_dense_config_t). */
typedef struct mt_config_dense {
    mt_table_opt_t opt; /* MT_OPT_SGD, MT_OPT_ADAGRAD or MT_OPT_ADAM (never FTRL) */
    float lr, beta1, beta2, eps;
    float init_accum; /* Adagrad initial accumulator */
} mt_config_dense_t;

/** Input formats of the batch trainer ([input] format). */
typedef enum mt_config_input_format {
    MT_INPUT_TSV,              /* generic reader, tab-separated */
    MT_INPUT_CSV,              /* generic reader, comma-separated */
    MT_INPUT_CRITEO,           /* Criteo TSV (39 slots: 1..39) */
    MT_INPUT_MOVIELENS_100K,   /* MovieLens 100k u.data (slots 1..6 with side files) */
    MT_INPUT_MOVIELENS_LATEST, /* MovieLens latest ratings.csv (slots 1, 2, 6) */
} mt_config_input_format_t;

/** [trainer]: the model and how monolith-trainer trains it. Strings owned, never NULL. */
typedef struct mt_config_trainer {
    char *slots;                   /* feature slots, "1,2,3" (each < 32768); "" = the format's */
    char *mean_slots;              /* of those, the ones pooled by mean, "3,7"; "" = none */
    uint32_t dim;                  /* embedding dim of every feature slot */
    char *hidden;                  /* MLP hidden widths, "256,128"; "" = none */
    uint32_t batch_size;           /* examples per training step */
    mt_table_opt_t sparse_opt;     /* optimizer of embeddings and first-order weights */
    float sparse_lr;               /* its learning rate */
    float init_scale;              /* uniform embedding init half-width */
    uint32_t min_count;            /* frequency filter of every derived slot */
    uint32_t ttl_s;                /* expiry of every derived slot; 0 = never */
    float dense_lr;                /* the trainer's local Adam on the dense parameters */
    uint32_t dense_sync_batches;   /* with PS: push/pull dense every this many batches; 0 = local */
    uint64_t hash_buckets;         /* 0: collisionless; else ids reduced modulo this */
    char *slot_hash_buckets;       /* per feature slot, "2:1000, 5:64"; "" = hash_buckets */
    char *slot_dims;               /* per feature slot, "2:4, 5:32"; "" = dim for all */
    float cowclip_ratio;           /* CowClip of embedding gradients: r; 0 = off */
    float cowclip_zeta;            /* CowClip: lower bound on an embedding's norm */
    uint64_t table_initial_rows;   /* local table only: pre-size for this many rows */
    uint64_t seed;                 /* model and embedding initialization */
    uint32_t epochs;               /* batch mode: passes over --train */
    uint32_t progress_interval_ms; /* progress line period; 0 = none */
    uint32_t auc_window;           /* examples in the sliding progressive-AUC window */
    uint32_t commit_interval_ms;   /* online: Kafka offset commit period */
    uint32_t checkpoint_interval_s; /* online: cluster checkpoint period; 0 = off */
    int idempotent;                 /* online: many trainers, covered steps (docs/checkpoint.md) */
    int pipelined;                  /* online with shards: the apply of a step in flight */
    uint32_t recovery_timeout_s;    /* online with checkpoints: longest recovery */
    char *metrics_listen;           /* Prometheus /metrics "host:port"; "" = disabled */
} mt_config_trainer_t;

/** [input]: how the batch trainer and `monolith replay --dataset csv` read files (generic
 *  reader keys apply to tsv / csv; mt/config_input.h turns them into the reader's config). */
typedef struct mt_config_input {
    mt_config_input_format_t format;
    int header;             /* 1: the first line names the columns */
    char *columns;          /* "col:slot[:int|string][:multi], ..." col = header name or index */
    char *label;            /* label column (name or index); "" = no label (all 0) */
    char *task_labels;      /* a multi-task model's further label columns (tasks 1, 2, ...) */
    double label_threshold; /* label = value >= this */
    char *positive_labels;  /* "click, buy": label = value is one of these; "" = threshold */
    char *timestamp;        /* timestamp column; "" = none */
    int time_unit;          /* 1 = seconds, 2 = milliseconds */
    int multi_sep;          /* the character separating multi-hot values */
    char *request_id;       /* replay: request id column; "" = one request per row */
    char *item_id;          /* replay: shown item column; "" = none (item 0) */
    char *users_file;       /* MovieLens 100k u.user; "" = none */
    char *items_file;       /* MovieLens u.item / movies.csv; "" = none */
} mt_config_input_t;

/** [kafka]: the broker and topics of the online daemons. Strings owned, never NULL. */
typedef struct mt_config_kafka {
    char *bootstrap;      /* "host:port,..."; "" = read bootstrap_file */
    char *bootstrap_file; /* written by monolith-kafka-dev */
    char *examples_topic, *features_topic, *actions_topic;
    char *params_topic;     /* the shards' change streams (partition = shard) */
    uint32_t fetch_wait_ms; /* a parameters-topic fetch held by the broker at most */
    char *group;            /* consumer group of the trainers */
    uint32_t session_timeout_ms;
} mt_config_kafka_t;

/** [joiner]: monolith-joiner (docs/joiner.md). Strings owned, never NULL. */
typedef struct mt_config_joiner {
    uint32_t window_s;                /* join window after an impression */
    uint32_t allowed_lateness_s;      /* watermark = the input's event time - this */
    uint32_t idle_advance_ms;         /* both topics idle this long: watermark follows the clock */
    double negative_rate;             /* negatives kept (sampled deterministically), (0, 1] */
    uint64_t seed;                    /* of the negative sampling hash */
    uint64_t max_pending_memory;      /* pending impressions held in memory (all are in RocksDB) */
    uint64_t max_early_actions;       /* actions waiting for their impression */
    char *state_dir;                  /* RocksDB directory of the joiner's state */
    char *group;                      /* consumer group on the features and actions topics */
    uint32_t commit_interval_ms;      /* period of deliver + sync + commit */
    uint32_t progress_interval_ms;    /* progress line period; 0 = none */
    int sync;                         /* 1: fsync the state before each commit */
    char *metrics_listen;             /* Prometheus /metrics "host:port"; "" = disabled */
    uint32_t rocksdb_write_buffer_mb; /* memtable size of the state's RocksDB */
    uint32_t rocksdb_block_cache_mb;  /* block cache of the state's RocksDB; 0 = none */
    char *task_actions;               /* the tasks' action types, "click, conversion": one
                                         label each (mt_config_joiner_task_actions()) */
} mt_config_joiner_t;

/** [serving]: monolith-serving (docs/serving.md). Strings owned, never NULL. The model's
 *  shape comes from [trainer], the PS shards from [cluster], the log-odds correction from
 *  joiner.negative_rate, the impression log's topic from [kafka]. */
typedef struct mt_config_serving {
    char *listen;                    /* gRPC address "host:port" (port 0: any free port) */
    uint32_t threads;                /* request-serving threads */
    uint32_t sync_interval_ms;       /* sparse sync period, per PS shard */
    uint32_t sync_stream_ms;         /* follow streams: round period; 0 = poll every interval */
    uint32_t dense_sync_interval_ms; /* dense pull period (shard 0) */
    uint32_t sync_timeout_ms;        /* deadline of one Sync stream or PullDense call */
    double log_sample_rate;          /* share of requests whose impressions are logged */
    uint32_t max_candidates;         /* candidates in one Predict; more: RESOURCE_EXHAUSTED */
    uint32_t max_request_fids;       /* ids in one Predict / Lookup; more: RESOURCE_EXHAUSTED */
    uint64_t max_message_bytes;      /* largest gRPC message received or sent */
    uint32_t max_queued_calls;       /* calls waiting for a thread; more: RESOURCE_EXHAUSTED */
    char *metrics_listen;            /* Prometheus /metrics "host:port"; "" = disabled */
    char *shards;                    /* PS shards held, "0,2"; "" = every shard */
    char **peers;                    /* serving nodes holding the other shards (owned) */
    size_t npeers;
    uint32_t peer_timeout_ms; /* deadline of a peer Lookup inside a Predict */
    uint32_t peer_refresh_ms; /* period of the peers' discovery (Serving/Shards) */
    int peer_zeros;           /* a failed peer: 0 = Predict UNAVAILABLE, 1 = zeros */
    int sync_kafka;           /* sync_source: 0 = direct (Sync streams), 1 = kafka */
} mt_config_serving_t;

/** [tls]: transport security of every gRPC server and client that reads this file (the
 *  daemons' servers, their PS clients, the tools). Strings owned, never NULL ("" = unset).
 *  docs/security.md; mt/config_rpc.h turns it into the rpc layer's mt_rpc_tls_config_t. */
typedef struct mt_config_tls {
    int enabled;       /* 0: plaintext */
    char *cert_file;   /* PEM chain: a server's certificate, and a client's for mutual TLS */
    char *key_file;    /* its unencrypted PEM private key */
    char *ca_file;     /* PEM CA(s) peers' certificates must chain to */
    int client_auth;   /* servers require client certificates signed by ca_file */
    char *server_name; /* clients: name expected in servers' certificates; "" = the host */
} mt_config_tls_t;

/** Everything one file configures. Initialize with mt_config_init(). */
/** [model]: the model family (mt/model.h, docs/trainer.md); its slots, dim and MLP widths
 *  are [trainer]'s. */
typedef struct mt_config_model {
    mt_model_type_t type;     /* deepfm | dcnv2 | mmoe | din */
    uint32_t cross_layers;    /* dcnv2: cross layers */
    uint32_t cross_rank;      /* dcnv2: 0 = full rank, else the rank of each layer's U V */
    uint32_t tasks;           /* mmoe: tasks (labels per example) */
    uint32_t experts;         /* mmoe: shared experts */
    uint32_t expert_width;    /* mmoe: each expert's width */
    char *task_weights;       /* mmoe: each task's loss weight, "1, 0.5"; "" = 1 each */
    uint32_t sequence_slot;   /* din: the slot of the user's behaviour sequence */
    uint32_t sequence_query;  /* din: the candidate item's slot, attending it */
    uint32_t sequence_length; /* din: behaviours kept (the first, most recent) */
    uint32_t attention_width; /* din: the attention unit's hidden width */
} mt_config_model_t;

typedef struct mt_config {
    mt_config_cluster_t cluster;
    mt_config_ps_t ps;
    mt_table_config_t table; /* [table]; its slots/nslots stay NULL/0: see mt_config_table() */
    mt_config_dense_t dense;
    mt_config_trainer_t trainer;
    mt_config_model_t model;
    mt_config_input_t input;
    mt_config_kafka_t kafka;
    mt_config_joiner_t joiner;
    mt_config_serving_t serving;
    mt_config_tls_t tls;
    mt_table_slot_config_t *slots; /* owned: nslots slots sorted by slot id ([slot.N]) */
    char **slot_names;             /* owned: nslots owned names, parallel to slots ("" = none) */
    size_t nslots;
    size_t slots_cap; /* private: allocated entries of slots and slot_names */
} mt_config_t;

/**
 * Sets every field to its default from the property table; no slots.
 * @param[out] c  any memory; release with mt_config_free() whatever this returns
 * @returns MT_OK or MT_NOMEM.
 */
mt_err_t mt_config_init(mt_config_t *c);

/** Frees everything @p c owns and zeroes it. NULL and a zeroed or freed config are no-ops. */
void mt_config_free(mt_config_t *c);

/**
 * Reads an INI file (at most MT_CONFIG_MAX_FILE_BYTES) over the values already in @p c:
 * keys the file sets replace them, others keep theirs; a [slot.N] section not yet in @p c
 * adds that slot with the default values. Atomic: on error @p c is unchanged.
 * @param[in,out] c     an initialized config
 * @param[in] path      borrowed; also the name in messages
 * @param[out] errbuf   receives "path:line: key: what is wrong" on error (may be NULL)
 * @returns MT_OK, MT_CONFIG (bad content), MT_IO (cannot read the file) or MT_NOMEM.
 * Thread safety: reads the file; see the header.
 */
mt_err_t mt_config_load_file(mt_config_t *c, const char *path, char *errbuf, size_t errlen);

/**
 * As mt_config_load_file(), from a NUL-terminated string.
 * @param[in] name  name of the text in messages (NULL: "<string>")
 * @returns MT_OK, MT_CONFIG or MT_NOMEM. On error @p c is unchanged.
 */
mt_err_t mt_config_load_string(mt_config_t *c, const char *text, const char *name, char *errbuf,
                               size_t errlen);

/**
 * Sets one key, e.g. ("ps.threads", "8") or ("slot.3.dim", "32"), as a command-line override.
 * The value is trimmed and checked as in a file; "slot.N.*" adds slot N when missing.
 * @param[out] errbuf  receives "key: what is wrong" (no file or line) on error (may be NULL)
 * @returns MT_OK, MT_CONFIG or MT_NOMEM. On error @p c is unchanged.
 */
mt_err_t mt_config_set(mt_config_t *c, const char *dotted_key, const char *value, char *errbuf,
                       size_t errlen);

/** mt_config_set() on "dotted.key=value", the form of a command-line argument. */
mt_err_t mt_config_set_arg(mt_config_t *c, const char *key_eq_value, char *errbuf, size_t errlen);

/**
 * The Kafka bootstrap servers: kafka.bootstrap, or when it is empty the first line of
 * kafka.bootstrap_file (the file monolith-kafka-dev writes).
 * @param[out] out     receives them, NUL-terminated
 * @param[out] errbuf  what is wrong, naming the file (may be NULL)
 * @returns MT_OK, MT_IO (the file cannot be read or is empty), MT_TOO_SMALL (@p out).
 */
mt_err_t mt_config_kafka_bootstrap(const mt_config_t *c, char *out, size_t len, char *errbuf,
                                   size_t errlen);

/**
 * Cross-field checks after loading and overrides: every field within its bounds, every slot
 * has a dim, num_shards equals the number of ps addresses when both are given, ps.shard is
 * below the number of shards (num_shards, else the number of addresses, else 1), at least
 * one slot (the message names trainer.slots, input.columns and [slot.N]: call
 * mt_config_derive_trainer_slots() first), then mt_table_config_validate() on the table
 * config with the slots attached.
 * @returns MT_OK, MT_CONFIG (message in @p errbuf) or MT_NOMEM.
 */
mt_err_t mt_config_validate(const mt_config_t *c, char *errbuf, size_t errlen);

/**
 * Adds the table slots the trainer's model needs that no [slot.N] section configures. The
 * model's feature slots are [trainer] slots, or when it is empty the input format's: criteo
 * 1..39; movielens 1, 2 and the side-file slots; tsv / csv the slots input.columns maps
 * columns to, in the order of their first entry (the reader's order), unless a [slot.N]
  * section configures a slot they do not name (a PS-only table: then none). The table slots
 * are the model's layout's (mt_model_layout_tables()): for each feature slot s looked up in
 * its own rows (all but a din sequence slot, which reads its query slot's rows), table slot
 * s holds the model's row (mt_model_row_floats()): the embedding
 * (trainer.dim floats, uniform init of half-width init_scale seeded with trainer.seed) then
 * the first-order weight (starting at 0: zero_tail 1), with the sparse optimizer, lr,
 * min_count and ttl_s. These are the slots mt_trainer_slot_configs() makes, so PS shards and
 * a local trainer agree. A configured [slot.s] must have dim = trainer.dim (the embedding's:
 * the row is one float wider); a configured s | 0x8000 (the first-order slot of an older
 * layout) is refused. Call it after loading and overrides, before mt_config_validate();
 * calling it twice changes nothing.
 * @param[out] slots_out  optional: the feature slots parsed from trainer.slots
 * @param[in,out] nslots_out  in: capacity of slots_out; out: their number
 * @returns MT_OK, MT_CONFIG (bad trainer.slots or input.columns, a dim mismatch, a [model]
 *          the slots cannot make (mt_config_model()); message in
 *          @p errbuf) or MT_NOMEM.
 */
mt_err_t mt_config_derive_trainer_slots(mt_config_t *c, uint16_t *slots_out, size_t *nslots_out,
                                        char *errbuf, size_t errlen);

/**
 * The model's pooling per feature slot: @p mean[i] = 1 when slots[i] is in trainer.mean_slots
 * (its ids' rows averaged), else 0 (summed).
 * @param[in]  slots  the model's feature slots (mt_config_derive_trainer_slots())
 * @param[out] mean   [nslots]
 * @returns MT_OK or MT_CONFIG (a bad list, or a slot that is not one of @p slots: message in
 *          @p errbuf).
 */
mt_err_t mt_config_mean_slots(const mt_config_t *c, const uint16_t *slots, size_t nslots,
                              uint8_t *mean, char *errbuf, size_t errlen);

/**
 * The hash-bucket reduction per feature slot (mt_model_reduce_fid()): @p buckets[i] is
 * slots[i]'s entry of trainer.slot_hash_buckets, or 0 (trainer.hash_buckets applies).
 * @param[in]  slots    the model's feature slots (mt_config_derive_trainer_slots())
 * @param[out] buckets  [nslots]
 * @returns MT_OK or MT_CONFIG (a bad list, a slot twice, 0 buckets, or a slot that is not one
 *          of @p slots: message in @p errbuf).
 */
mt_err_t mt_config_slot_hash_buckets(const mt_config_t *c, const uint16_t *slots, size_t nslots,
                                     uint64_t *buckets, char *errbuf, size_t errlen);

/**
 * The model both the trainer and serving build from @p c: the feature slots @p slots of
 * trainer.dim or their trainer.slot_dims, trainer.hidden's MLP, trainer.seed, and [model]'s
 * family, validated (mt_model_config_validate()).
 * @param[in]  slots  the model's feature slots (mt_config_derive_trainer_slots())
 * @param[out] dims   [nslots]: each slot's dim; out->slot_dims points here when they differ
 *                    from trainer.dim (else NULL)
 * @param[out] out    the model's configuration
 * @returns MT_OK or MT_CONFIG (a bad hidden or slot_dims list, or a model the family refuses,
 *          such as full-rank cross layers over too wide an input, or deepfm with unequal
 *          dims: message in @p errbuf).
 */
mt_err_t mt_config_model(const mt_config_t *c, const uint16_t *slots, size_t nslots, uint32_t *dims,
                         mt_model_config_t *out, char *errbuf, size_t errlen);

/**
 * Parses a comma-separated list of unsigned integers ("256, 128"; "" = none) of at most
 * @p cap entries, each in lo..hi. @returns MT_OK or MT_CONFIG (message in @p errbuf).
 */
mt_err_t mt_config_parse_uint_list(const char *s, uint64_t lo, uint64_t hi, uint64_t *out,
                                   size_t cap, size_t *n, char *errbuf, size_t errlen);

/**
 * joiner.task_actions as action types (monolith.v1.ActionType: 1 click, 2 conversion), in
 * task order: comma-separated names, case-insensitive, 1 to MT_CONFIG_MAX_TASK_ACTIONS of
 * them, each once.
 * @param[out] types  [MT_CONFIG_MAX_TASK_ACTIONS]
 * @param[out] n      how many
 * @returns MT_OK or MT_CONFIG (an unknown name, a repeat, an empty entry, too many: message
 *          in @p errbuf, naming the key).
 */
mt_err_t mt_config_joiner_task_actions(const mt_config_t *c, uint32_t *types, size_t *n,
                                       char *errbuf, size_t errlen);

/**
 * Fills @p out with c->table and slots/nslots pointing into @p c (borrowed: valid until @p c
 * is next changed or freed; mt_table_create() copies them).
 */
void mt_config_table(const mt_config_t *c, mt_table_config_t *out);

/**
 * @returns slot @p slot's settings (borrowed from @p c), or NULL if it is not configured.
 * @param[out] name  optional: its name ("" if none), borrowed from @p c
 */
const mt_table_slot_config_t *mt_config_slot(const mt_config_t *c, uint16_t slot,
                                             const char **name);

/**
 * Writes the Markdown reference of every key (section, key, type, default, bounds, doc):
 * the content of docs/config.md.
 * @returns MT_OK or MT_IO.
 */
mt_err_t mt_config_write_reference(FILE *f);

#ifdef __cplusplus
}
#endif

#endif /* MT_CONFIG_H */
