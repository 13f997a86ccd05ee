/*
 * config.c - the configuration of every daemon, driven by one property table.
 *
 * The table props[] below lists every key: its section, name, type, the field it fills
 * (an offset into mt_config_t or into mt_table_slot_config_t), its bounds, its default as
 * text and its doc. From it come mt_config_init() (each default is parsed like a file
 * value), the parser (key lookup, unknown-key and duplicate errors, bounds), overrides,
 * mt_config_validate() (bounds re-checked on the struct), freeing and copying (which fields
 * own strings) and the reference in docs/config.md. Nothing else names a key.
 *
 * Why the line parser is ours and not inih (which was the plan): Debian's libinih 55 is built
 * with a 200-byte line buffer and silently splits a longer line into several "key: value"
 * pairs (a ps list of a dozen host names becomes keys like 'e.svc.cluster.local'); it takes
 * an indented line as the continuation of the previous value ("  y = 2" after "x = 1" sets
 * x to "y = 2"); it knows only ';' as an inline comment (so "3 # c" is the value); it ignores
 * text after "]"; it never reports a section without keys; it accepts "key: value"; and its
 * options are mutable process-wide globals. Working around each of these in a reader left it
 * only the split at '='. The grammar here is in config.h; it is about 80 lines below.
 *
 * Invariants of an initialized mt_config_t: every PT_STRING and PT_ADDR field is a non-NULL
 * owned string; a PT_ADDRS field is NULL with count 0 or an owned array of count owned
 * strings; slots[] is sorted by id without repeats and slot_names[i] is a non-NULL owned
 * string; slots_cap >= nslots is the size of both arrays.
 *
 * File layout: types; the property table; helpers; value parsing and checking; slots; copy
 * and free; the line parser; public API; the reference.
 */
#include "mt/config.h"
#include "mt/model.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "config_int.h"

/* ============================== types ============================== */

typedef enum prop_type {
    PT_UINT,   /* unsigned integer field of 4 or 8 bytes, in umin..umax */
    PT_REAL,   /* float (size 4) or double (size 8), in dmin..dmax (PF_*_OPEN: bound excluded) */
    PT_ENUM,   /* C enum field (int-sized), one of enums[] */
    PT_STRING, /* owned char *, length umin..umax bytes */
    PT_ADDR,   /* owned char * "host:port" (PF_EMPTY_OK: "" allowed) */
    PT_ADDRS   /* owned char ** of "host:port" + size_t count at count_offset, umin..umax */
} prop_type_t;

typedef enum prop_target {
    TGT_CONFIG,   /* offset into mt_config_t */
    TGT_SLOT,     /* offset into mt_table_slot_config_t ([slot.N] sections) */
    TGT_SLOT_NAME /* the slot's entry of slot_names (offset 0 of a char *) */
} prop_target_t;

#define PF_MIN_OPEN 1u /* PT_REAL: value > dmin */
#define PF_MAX_OPEN 2u /* PT_REAL: value < dmax */
#define PF_EMPTY_OK 4u /* PT_ADDR: "" (disabled) allowed */
#define PF_PORT0_OK 8u /* PT_ADDR: port 0 (any free port) allowed */

typedef struct prop_enum {
    const char *name;
    int value;
} prop_enum_t;

typedef struct prop {
    const char *section; /* one of sections[], or "slot" for every [slot.N] */
    const char *key;
    prop_type_t type;
    prop_target_t target;
    size_t offset;       /* of the field in its target */
    size_t size;         /* of the field */
    size_t count_offset; /* PT_ADDRS: offset of the size_t count in mt_config_t */
    uint64_t umin, umax; /* PT_UINT: value; PT_STRING: length; PT_ADDRS: entries */
    double dmin, dmax;   /* PT_REAL */
    unsigned flags;      /* PF_* */
    const char *def;     /* default, parsed like a file value; NULL: required */
    const prop_enum_t *enums;
    const char *doc;
} prop_t;

/* ============================== the property table ============================== */

static const char *const sections[] = {"cluster", "ps",    "table",  "dense",   "trainer", "model",
                                       "input",   "kafka", "joiner", "serving", "tls"};
#define NSECTIONS ((int)(sizeof(sections) / sizeof(sections[0])))
#define SECT_SLOT NSECTIONS /* section index of every [slot.N] */

_Static_assert(sizeof(mt_table_opt_t) == sizeof(int), "PT_ENUM fields are int-sized");
_Static_assert(sizeof(mt_table_init_t) == sizeof(int), "PT_ENUM fields are int-sized");
_Static_assert(sizeof(mt_table_precision_t) == sizeof(int), "PT_ENUM fields are int-sized");
_Static_assert(sizeof(mt_config_input_format_t) == sizeof(int), "PT_ENUM fields are int-sized");
_Static_assert(sizeof(mt_model_type_t) == sizeof(int), "PT_ENUM fields are int-sized");

static const prop_enum_t init_enum[] = {
    {"zeros", MT_INIT_ZEROS}, {"uniform", MT_INIT_UNIFORM}, {"normal", MT_INIT_NORMAL}, {NULL, 0}};
static const prop_enum_t slot_opt_enum[] = {{"sgd", MT_OPT_SGD},
                                            {"adagrad", MT_OPT_ADAGRAD},
                                            {"ftrl", MT_OPT_FTRL},
                                            {"adam", MT_OPT_ADAM},
                                            {NULL, 0}};
static const prop_enum_t dense_opt_enum[] = {
    {"sgd", MT_OPT_SGD}, {"adagrad", MT_OPT_ADAGRAD}, {"adam", MT_OPT_ADAM}, {NULL, 0}};
static const prop_enum_t format_enum[] = {{"tsv", MT_INPUT_TSV},
                                          {"csv", MT_INPUT_CSV},
                                          {"criteo", MT_INPUT_CRITEO},
                                          {"movielens-100k", MT_INPUT_MOVIELENS_100K},
                                          {"movielens-latest", MT_INPUT_MOVIELENS_LATEST},
                                          {NULL, 0}};
static const prop_enum_t bool_enum[] = {{"false", 0}, {"true", 1}, {NULL, 0}};
static const prop_enum_t sep_enum[] = {{"pipe", '|'},  {"comma", ','}, {"semicolon", ';'},
                                       {"colon", ':'}, {"space", ' '}, {"slash", '/'},
                                       {NULL, 0}};
static const prop_enum_t peer_failure_enum[] = {{"fail", 0}, {"zeros", 1}, {NULL, 0}};
static const prop_enum_t sync_source_enum[] = {{"direct", 0}, {"kafka", 1}, {NULL, 0}};
static const prop_enum_t time_unit_enum[] = {{"s", 1}, {"ms", 2}, {NULL, 0}};
/* the names of mt_model_type_name() (test_config checks that they agree) */
static const prop_enum_t model_type_enum[] = {{"deepfm", MT_MODEL_DEEPFM},
                                              {"dcnv2", MT_MODEL_DCNV2},
                                              {"mmoe", MT_MODEL_MMOE},
                                              {"din", MT_MODEL_DIN},
                                              {NULL, 0}};
static const prop_enum_t precision_enum[] = {
    {"fp32", MT_PREC_FP32}, {"fp16", MT_PREC_FP16}, {NULL, 0}};
/* joiner.task_actions: monolith.v1.ActionType's values under mt_joiner_action_name()'s names
 * (test_joiner checks that they agree) */
static const prop_enum_t action_enum[] = {{"click", 1}, {"conversion", 2}, {NULL, 0}};

#define KEY(s, k) .section = (s), .key = (k)
#define CFG(m) \
    .target = TGT_CONFIG, .offset = offsetof(mt_config_t, m), .size = sizeof(((mt_config_t *)0)->m)
#define SLOT(m)                                                        \
    .target = TGT_SLOT, .offset = offsetof(mt_table_slot_config_t, m), \
    .size = sizeof(((mt_table_slot_config_t *)0)->m)
#define UINT(lo, hi)     .type = PT_UINT, .umin = (lo), .umax = (hi)
#define REAL(lo, hi, fl) .type = PT_REAL, .dmin = (lo), .dmax = (hi), .flags = (fl)
#define ENUM(e)          .type = PT_ENUM, .enums = (e)
#define STR(lo, hi)      .type = PT_STRING, .umin = (lo), .umax = (hi)
#define ADDR(fl)         .type = PT_ADDR, .flags = (fl)
#define ADDRS(m, cnt, lo, hi) \
    CFG(m), .type = PT_ADDRS, .count_offset = offsetof(mt_config_t, cnt), .umin = (lo), .umax = (hi)
#define FINITE 1e30 /* the table's bound for "finite" (table.c) */
#define OPEN   (PF_MIN_OPEN | PF_MAX_OPEN)

static const prop_t props[] = {
    /* [cluster] */
    {KEY("cluster", "num_shards"), CFG(cluster.num_shards), UINT(0, MT_CONFIG_MAX_SHARDS),
     .def = "0", .doc = "number of PS shards; 0: as many as `cluster.ps` addresses"},
    {KEY("cluster", "ps"), ADDRS(cluster.ps, cluster.nps, 0, MT_CONFIG_MAX_SHARDS), .def = "",
     .doc = "PS addresses, comma-separated; the i-th serves shard i"},
    /* [ps] */
    {KEY("ps", "shard"), CFG(ps.shard), UINT(0, MT_CONFIG_MAX_SHARDS - 1), .def = "0",
     .doc = "shard this PS serves, below the number of shards (usually an override: "
            "`ps.shard=N`)"},
    {KEY("ps", "listen"), CFG(ps.listen), ADDR(PF_PORT0_OK), .def = "127.0.0.1:7100",
     .doc = "address the PS serves gRPC on (port 0: any free port)"},
    {KEY("ps", "threads"), CFG(ps.threads), UINT(1, 64), .def = "4",
     .doc = "threads serving requests"},
    {KEY("ps", "max_message_bytes"), CFG(ps.max_message_bytes), UINT(4096, INT32_MAX),
     .def = "67108864", .doc = "largest gRPC message received or sent"},
    {KEY("ps", "max_batch_fids"), CFG(ps.max_batch_fids), UINT(1, 1u << 30), .def = "1048576",
     .doc = "ids in one request; a larger request fails with RESOURCE_EXHAUSTED"},
    {KEY("ps", "sync_chunk_fids"), CFG(ps.sync_chunk_fids), UINT(1, 1u << 20), .def = "4096",
     .doc = "entries per Sync chunk unless the client asks for fewer"},
    {KEY("ps", "sync_follow_max_s"), CFG(ps.sync_follow_max_s), UINT(1, 86400), .def = "300",
     .doc = "a follow Sync stream (serving's `sync_stream_ms`) ends after this long and the "
            "replica opens the next one"},
    {KEY("ps", "sync_max_followers"), CFG(ps.sync_max_followers), UINT(0, 63), .def = "2",
     .doc = "follow Sync streams open at once (each holds one of the `max_streams` stream "
            "threads, so it must be below `max_streams`); more replicas are answered one round "
            "at a time and poll"},
    {KEY("ps", "publish_ms"), CFG(ps.publish_ms), UINT(0, 60000), .def = "0",
     .doc = "publish the shard's changes (rows and deletions, versioned) to partition <shard> "
            "of `kafka.params_topic` every this many milliseconds, for replicas with "
            "`serving.sync_source = kafka`; 0: off"},
    {KEY("ps", "snapshot_dir"), CFG(ps.snapshot_dir), STR(0, 4095), .def = "",
     .doc = "directory of table snapshots; empty: no snapshots"},
    {KEY("ps", "snapshot_interval_s"), CFG(ps.snapshot_interval_s), UINT(0, 7 * 86400),
     .def = "300", .doc = "seconds between periodic snapshots; 0: none"},
    {KEY("ps", "snapshot_keep"), CFG(ps.snapshot_keep), UINT(1, 1000), .def = "3",
     .doc = "snapshots kept in `snapshot_dir`; older ones are deleted"},
    {KEY("ps", "snapshot_full_every"), CFG(ps.snapshot_full_every), UINT(1, 10000), .def = "1",
     .doc = "one snapshot in this many writes the whole table, the others only the rows changed "
            "since the previous one (docs/checkpoint.md); 1: every snapshot whole"},
    {KEY("ps", "expire_interval_ms"), CFG(ps.expire_interval_ms), UINT(0, 3600 * 1000),
     .def = "1000", .doc = "milliseconds between expiry ticks; 0: rows never expire"},
    {KEY("ps", "expire_buckets_per_tick"), CFG(ps.expire_buckets_per_tick), UINT(1, UINT32_MAX),
     .def = "65536", .doc = "buckets one expiry tick examines (the `mt_table_expire()` budget)"},
    {KEY("ps", "max_queued_calls"), CFG(ps.max_queued_calls), UINT(0, 4096), .def = "16",
     .doc = "calls waiting for one of `threads` when all are busy; one more is answered "
            "RESOURCE_EXHAUSTED at once (docs/security.md); 0: no waiting"},
    {KEY("ps", "max_streams"), CFG(ps.max_streams), UINT(1, 256), .def = "8",
     .doc = "streaming calls (Sync) open at once, each on a thread of its own besides "
            "`threads`; one more is answered RESOURCE_EXHAUSTED; above `sync_max_followers`"},
    {KEY("ps", "admin_token"), CFG(ps.admin_token), STR(0, 1024), .def = "",
     .doc = "token admin calls must carry; empty: admin calls need no token"},
    {KEY("ps", "metrics_listen"), CFG(ps.metrics_listen), ADDR(PF_EMPTY_OK | PF_PORT0_OK),
     .def = "", .doc = "address of the Prometheus `/metrics` endpoint; empty: disabled"},
    /* [table]: mt_table_config_t, defaults as mt_table_config_init() */
    {KEY("table", "shards_log2"), CFG(table.shards_log2), UINT(0, 16), .def = "10",
     .doc = "the table is split into 2^shards_log2 independent parts"},
    {KEY("table", "max_load"), CFG(table.max_load), REAL(0.5, 0.97, 0), .def = "0.9",
     .doc = "a part grows when its load factor exceeds this"},
    {KEY("table", "filter_bytes"), CFG(table.filter_bytes), UINT(0, 1ull << 40), .def = "8388608",
     .doc = "count-min sketch memory of the frequency filter; 0 only if no slot has "
            "`min_count` > 1"},
    {KEY("table", "filter_depth"), CFG(table.filter_depth), UINT(1, 8), .def = "4",
     .doc = "count-min sketch hash rows"},
    {KEY("table", "changelog_entries"), CFG(table.changelog_entries), UINT(64, 1ull << 40),
     .def = "1048576",
     .doc = "change-log capacity over all parts (24 bytes each; a part's share rounds down to a "
            "power of two); at least 64 per part"},
    {KEY("table", "initial_rows"), CFG(table.initial_rows), UINT(0, 1ull << 40), .def = "0",
     .doc = "pre-size for this many rows; 0: grow from empty"},
    {KEY("table", "reserve_rows"), CFG(table.reserve_rows), ENUM(bool_enum), .def = "false",
     .doc = "with `initial_rows`: also take the memory of that many rows at start and fault its "
            "pages in, so that those inserts take no page faults (PS shards and serving "
            "replicas hold it from their start; a snapshot loaded with more rows than "
            "`initial_rows` is pre-sized for them and reserves nothing: its rows take more "
            "memory than the reserve would)"},
    {KEY("table", "hash_seed"), CFG(table.hash_seed), UINT(0, UINT64_MAX),
     .def = "0x9ae16a3b2f90404f",
     .doc = "seed of the cuckoo and sketch hashes (replicas of a shard: the same)"},
    /* [dense] */
    {KEY("dense", "optimizer"), CFG(dense.opt), ENUM(dense_opt_enum), .def = "adam",
     .doc = "optimizer of the dense parameters"},
    {KEY("dense", "lr"), CFG(dense.lr), REAL(0, FINITE, OPEN), .def = "0.001",
     .doc = "learning rate"},
    {KEY("dense", "beta1"), CFG(dense.beta1), REAL(0, 1, PF_MAX_OPEN), .def = "0.9",
     .doc = "Adam first-moment decay (the PS's, and the trainer's local dense step's)"},
    {KEY("dense", "beta2"), CFG(dense.beta2), REAL(0, 1, PF_MAX_OPEN), .def = "0.999",
     .doc = "Adam second-moment decay (the PS's, and the trainer's local dense step's)"},
    {KEY("dense", "eps"), CFG(dense.eps), REAL(0, 1, PF_MAX_OPEN), .def = "1e-8",
     .doc = "Adagrad / Adam epsilon (Adam: > 0; also the trainer's local dense Adam)"},
    {KEY("dense", "init_accum"), CFG(dense.init_accum), REAL(0, FINITE, PF_MAX_OPEN), .def = "0.1",
     .doc = "Adagrad initial accumulator"},
    /* [trainer] */
    {KEY("trainer", "mean_slots"), CFG(trainer.mean_slots), STR(0, 65536), .def = "",
     .doc = "feature slots pooled by mean, \"3, 7\": an example's ids of such a slot count by "
            "their average row (the others by their sum); each must be one of the model's slots"},
    {KEY("trainer", "slots"), CFG(trainer.slots), STR(0, 65536), .def = "",
     .doc = "feature slots of the model, comma-separated, each below 32768; empty: the input "
            "format's (criteo: 1..39; movielens: 1, 2 and the side-file slots; tsv / csv: the "
            "slots of `input.columns` in their order, unless a `[slot.N]` section configures "
            "a slot they do not name: a PS-only table); "
            "`mt_config_derive_trainer_slots()` adds the table slots they need"},
    {KEY("trainer", "dim"), CFG(trainer.dim), UINT(1, MT_TABLE_MAX_DIM), .def = "8",
     .doc = "embedding dim of every feature slot"},
    {KEY("trainer", "hidden"), CFG(trainer.hidden), STR(0, 256), .def = "256,128",
     .doc = "MLP hidden layer widths, comma-separated (at most 8); empty: no hidden layer"},
    /* [model] */
    {KEY("model", "type"), CFG(model.type), ENUM(model_type_enum), .def = "deepfm",
     .doc = "the model family: deepfm (first order + FM + MLP), dcnv2 (first order + cross "
            "layers stacked with the MLP), mmoe (multi-task: shared experts, a gate and a tower "
            "per task), din (target attention of the candidate item over the user's behaviour "
            "sequence); docs/trainer.md describes each"},
    {KEY("model", "cross_layers"), CFG(model.cross_layers), UINT(1, MT_MODEL_MAX_CROSS), .def = "3",
     .doc = "dcnv2: cross layers x_(c+1) = x_0 * (x_c W_c + b_c) + x_c"},
    {KEY("model", "cross_rank"), CFG(model.cross_rank), UINT(0, MT_MODEL_MAX_INPUT), .def = "0",
     .doc = "dcnv2: 0 = full-rank cross layers (D x D weights, D = slots x dim at most 4096); "
            "else each layer's W is U V of this rank (at most D)"},
    {KEY("model", "tasks"), CFG(model.tasks), UINT(2, MT_MODEL_MAX_TASKS), .def = "2",
     .doc = "mmoe: tasks, one label each (the click first): Example.labels in order (the "
            "joiner's `joiner.task_actions`), or `input.label` then `input.task_labels`"},
    {KEY("model", "experts"), CFG(model.experts), UINT(1, MT_MODEL_MAX_EXPERTS), .def = "4",
     .doc = "mmoe: shared experts (one ReLU layer over the embeddings each)"},
    {KEY("model", "expert_width"), CFG(model.expert_width), UINT(1, MT_MODEL_MAX_WIDTH),
     .def = "64", .doc = "mmoe: each expert's width"},
    {KEY("model", "task_weights"), CFG(model.task_weights), STR(0, 256), .def = "",
     .doc = "mmoe: each task's loss weight (>= 0), comma-separated in task order; empty: 1 "
            "each"},
    {KEY("model", "sequence_slot"), CFG(model.sequence_slot), UINT(0, MT_MODEL_SLOT_LIMIT - 1),
     .def = "0",
     .doc = "din: the feature slot holding the user's behaviour sequence (recent item ids, "
            "most recent first; `monolith gen --sequence` writes one), one of the model's "
            "slots; its ids are looked up in `sequence_query`'s rows (behaviour and candidate "
            "share each item's embedding) and it is not pooled"},
    {KEY("model", "sequence_query"), CFG(model.sequence_query), UINT(0, MT_MODEL_SLOT_LIMIT - 1),
     .def = "0",
     .doc = "din: the candidate item's slot, whose embedding attends every behaviour; another "
            "of the model's slots, of the sequence slot's dim"},
    {KEY("model", "sequence_length"), CFG(model.sequence_length), UINT(1, MT_MODEL_MAX_SEQ),
     .def = "20", .doc = "din: behaviours read per example (the first ones; more are ignored)"},
    {KEY("model", "attention_width"), CFG(model.attention_width), UINT(1, MT_MODEL_MAX_WIDTH),
     .def = "32", .doc = "din: the attention unit's hidden width (sigmoid)"},
    {KEY("trainer", "batch_size"), CFG(trainer.batch_size), UINT(1, 1u << 20), .def = "256",
     .doc = "examples per training step"},
    {KEY("trainer", "sparse_optimizer"), CFG(trainer.sparse_opt), ENUM(slot_opt_enum),
     .def = "ftrl", .doc = "optimizer of the embeddings and first-order weights"},
    {KEY("trainer", "sparse_lr"), CFG(trainer.sparse_lr), REAL(0, FINITE, OPEN), .def = "0.05",
     .doc = "its learning rate"},
    {KEY("trainer", "init_scale"), CFG(trainer.init_scale), REAL(0, FINITE, PF_MAX_OPEN),
     .def = "0.01", .doc = "half-width of the uniform embedding initializer"},
    {KEY("trainer", "min_count"), CFG(trainer.min_count), UINT(0, 255), .def = "0",
     .doc = "frequency filter of the derived slots (see `slot.N.min_count`)"},
    {KEY("trainer", "ttl_s"), CFG(trainer.ttl_s), UINT(0, UINT32_MAX), .def = "0",
     .doc = "expiry of the derived slots in seconds; 0: never"},
    {KEY("trainer", "dense_lr"), CFG(trainer.dense_lr), REAL(0, FINITE, OPEN), .def = "0.001",
     .doc = "learning rate of the trainer's Adam on the dense parameters"},
    {KEY("trainer", "dense_sync_batches"), CFG(trainer.dense_sync_batches), UINT(0, 1u << 20),
     .def = "10",
     .doc = "with parameter servers: push the dense gradients to shard 0 and pull its "
            "parameters every this many batches; 0: dense parameters stay in the trainer"},
    {KEY("trainer", "slot_dims"), CFG(trainer.slot_dims), STR(0, 65536), .def = "",
     .doc = "embedding dim per feature slot, \"slot:dim, ...\" (\"2:4, 5:32\"): that slot's "
            "rows are of this dim (+ its first-order weight) instead of `dim`; the model's "
            "input is the slots' dims summed. Needs a family that takes unequal dims (dcnv2: "
            "deepfm's FM term needs one); each slot must be one of the model's"},
    {KEY("trainer", "slot_hash_buckets"), CFG(trainer.slot_hash_buckets), STR(0, 65536), .def = "",
     .doc = "hash buckets per feature slot, \"slot:buckets, ...\" (\"2:1000, 5:64\"): that "
            "slot's ids are reduced modulo its buckets instead of `hash_buckets`; trainer and "
            "serving reduce alike; each slot must be one of the model's"},
    {KEY("trainer", "cowclip_ratio"), CFG(trainer.cowclip_ratio), REAL(0, FINITE, PF_MAX_OPEN),
     .def = "0",
     .doc = "CowClip (docs/trainer.md): each id's embedding gradient in a step is clipped to "
            "this ratio r times max(the embedding's norm, `cowclip_zeta`) times the id's "
            "occurrences in the batch; 0 = off. For large batches"},
    {KEY("trainer", "cowclip_zeta"), CFG(trainer.cowclip_zeta), REAL(0, FINITE, PF_MAX_OPEN),
     .def = "1e-5", .doc = "CowClip: the lower bound on an embedding's norm in its clip"},
    {KEY("trainer", "hash_buckets"), CFG(trainer.hash_buckets), UINT(0, 1ull << 48), .def = "0",
     .doc = "0: collisionless; else every id is reduced modulo this (a hashed table, for "
            "comparison)"},
    {KEY("trainer", "table_initial_rows"), CFG(trainer.table_initial_rows), UINT(0, 1ull << 40),
     .def = "0",
     .doc = "without PS shards: pre-size the trainer's own table for this many rows (one per "
            "id: the embedding and the first-order weight), their memory taken and mapped at "
            "start; 0: grow from empty"},
    {KEY("trainer", "seed"), CFG(trainer.seed), UINT(0, UINT64_MAX), .def = "1",
     .doc = "seed of the model and embedding initialization"},
    {KEY("trainer", "epochs"), CFG(trainer.epochs), UINT(1, 1000), .def = "1",
     .doc = "batch mode: passes over the training file (`--epochs` overrides)"},
    {KEY("trainer", "progress_interval_ms"), CFG(trainer.progress_interval_ms),
     UINT(0, 3600 * 1000), .def = "1000", .doc = "period of the progress line; 0: none"},
    {KEY("trainer", "auc_window"), CFG(trainer.auc_window), UINT(100, 1u << 26), .def = "100000",
     .doc = "examples in the sliding progressive-validation AUC window"},
    {KEY("trainer", "commit_interval_ms"), CFG(trainer.commit_interval_ms), UINT(0, 600000),
     .def = "1000",
     .doc = "online: period of Kafka offset commits (always after the updates are applied); "
            "0: after every batch"},
    {KEY("trainer", "checkpoint_interval_s"), CFG(trainer.checkpoint_interval_s), UINT(0, 86400),
     .def = "0",
     .doc = "online with PS shards: write a cluster checkpoint (every shard, with the Kafka "
            "offsets) this often and recover from the last one after any failure, so that no "
            "example is lost or applied twice (docs/checkpoint.md; needs `ps.snapshot_dir` on "
            "the shards and `dense_sync_batches` > 0); 0: off, at-least-once commits every "
            "`commit_interval_ms`"},
    {KEY("trainer", "idempotent"), CFG(trainer.idempotent), ENUM(bool_enum), .def = "false",
     .doc = "online with PS shards: many trainers in one group, exactly once: every step "
            "carries its Kafka ranges and every shard applies it exactly once against its "
            "marks, saved in its own snapshots (docs/checkpoint.md, \"Many trainers\"); needs "
            "`dense_sync_batches` = 1 and `checkpoint_interval_s` = 0"},
    {KEY("trainer", "pipelined"), CFG(trainer.pipelined), ENUM(bool_enum), .def = "false",
     .doc = "a step's apply is in flight while the next step looks up and computes (one step "
            "of staleness). Online (PS shards only): its messages are marked once it is "
            "confirmed; with `idempotent` a failure drops both steps and re-reads the shards' "
            "marks. Batch (the PS or the trainer's own table): the next batch's lookup runs "
            "beside this step too; after a failure the pass goes on one step at a time: "
            "docs/trainer.md, \"The pipelined step\""},
    {KEY("trainer", "recovery_timeout_s"), CFG(trainer.recovery_timeout_s), UINT(1, 86400),
     .def = "300",
     .doc = "with checkpoints: how long a recovery waits for every shard to answer and "
            "restore before the trainer exits with status 1"},
    {KEY("trainer", "metrics_listen"), CFG(trainer.metrics_listen), ADDR(PF_EMPTY_OK | PF_PORT0_OK),
     .def = "", .doc = "address of the trainer's Prometheus `/metrics` endpoint; empty: disabled"},
    /* [input] */
    {KEY("input", "format"), CFG(input.format), ENUM(format_enum), .def = "tsv",
     .doc = "training file format; tsv and csv use the generic reader keys below"},
    {KEY("input", "header"), CFG(input.header), ENUM(bool_enum), .def = "true",
     .doc = "tsv / csv: the first line names the columns"},
    {KEY("input", "columns"), CFG(input.columns), STR(0, 65536), .def = "",
     .doc = "tsv / csv: `column:slot[:int|string][:multi]`, comma-separated; column = header "
            "name or 0-based index; int (default): the value is the id; string: its hash; "
            "multi: split on `multi_sep`; several columns may feed one slot; with "
            "`trainer.slots` empty these are the model's slots"},
    {KEY("input", "label"), CFG(input.label), STR(0, 256), .def = "label",
     .doc = "tsv / csv: label column (name or index; for `monolith replay --dataset csv` the "
            "action column: a positive value is a click); empty: no label"},
    {KEY("input", "task_labels"), CFG(input.task_labels), STR(0, 1024), .def = "",
     .doc = "tsv / csv: a multi-task model's further label columns (tasks 1, 2, ... after "
            "`label`'s task 0), comma-separated names or indexes, read like `label`"},
    {KEY("input", "label_threshold"), CFG(input.label_threshold), REAL(-FINITE, FINITE, 0),
     .def = "0.5", .doc = "tsv / csv: label = value >= this"},
    {KEY("input", "positive_labels"), CFG(input.positive_labels), STR(0, 4096), .def = "",
     .doc = "tsv / csv: the values of the label column that mean positive, comma-separated "
            "(`click, buy`: exact text); empty: the label is a number, 1 when >= "
            "`label_threshold`"},
    {KEY("input", "timestamp"), CFG(input.timestamp), STR(0, 256), .def = "",
     .doc = "tsv / csv: timestamp column (name or index; `monolith replay --dataset csv` needs "
            "it: the event time); empty: none"},
    {KEY("input", "time_unit"), CFG(input.time_unit), ENUM(time_unit_enum), .def = "ms",
     .doc = "tsv / csv: unit of the timestamp column"},
    {KEY("input", "multi_sep"), CFG(input.multi_sep), ENUM(sep_enum), .def = "pipe",
     .doc = "tsv / csv: separator of multi-hot values"},
    {KEY("input", "request_id"), CFG(input.request_id), STR(0, 256), .def = "",
     .doc = "`monolith replay --dataset csv`: request id column (name or index), the id the "
            "joiner joins on (rows of one request show different items); empty: each row is a "
            "request of its own, `csv-<line>`"},
    {KEY("input", "item_id"), CFG(input.item_id), STR(0, 256), .def = "",
     .doc = "`monolith replay --dataset csv`: the shown item's column (name or index): an "
            "integer below 2^48 is the item id, other text is hashed; the slots `columns` feeds "
            "from it go on the impression's item side; empty: item 0 (needs one request per "
            "row)"},
    {KEY("input", "users_file"), CFG(input.users_file), STR(0, 4095), .def = "",
     .doc = "movielens-100k: u.user (side slots 3, 4, 5); empty: none"},
    {KEY("input", "items_file"), CFG(input.items_file), STR(0, 4095), .def = "",
     .doc = "movielens: u.item or movies.csv (genre slot 6); empty: none"},
    /* [kafka] */
    {KEY("kafka", "bootstrap"), CFG(kafka.bootstrap), STR(0, 4096), .def = "",
     .doc = "Kafka bootstrap servers `host:port,...`; empty: read `bootstrap_file`"},
    {KEY("kafka", "bootstrap_file"), CFG(kafka.bootstrap_file), STR(0, 4095),
     .def = "/tmp/monolith-kafka.bootstrap",
     .doc = "file holding the bootstrap servers (written by monolith-kafka-dev)"},
    {KEY("kafka", "examples_topic"), CFG(kafka.examples_topic), STR(1, 249), .def = "examples",
     .doc = "topic of labelled examples (Example protobufs)"},
    {KEY("kafka", "features_topic"), CFG(kafka.features_topic), STR(1, 249), .def = "features",
     .doc = "topic of served impressions (Impression protobufs)"},
    {KEY("kafka", "actions_topic"), CFG(kafka.actions_topic), STR(1, 249), .def = "actions",
     .doc = "topic of user actions (Action protobufs)"},
    {KEY("kafka", "params_topic"), CFG(kafka.params_topic), STR(1, 249), .def = "params",
     .doc = "topic of the PS shards' change streams (SyncChunk protobufs, partition i = shard "
            "i: it needs at least as many partitions as shards)"},
    {KEY("kafka", "fetch_wait_ms"), CFG(kafka.fetch_wait_ms), UINT(1, 10000), .def = "100",
     .doc = "how long a broker holds a replica's fetch of `params_topic` while nothing new is "
            "there (a real broker answers as soon as a message arrives, so this bounds idle "
            "fetches; librdkafka's mock cluster, monolith-kafka-dev, answers only then: set "
            "it low, 10-20, there)"},
    {KEY("kafka", "group"), CFG(kafka.group), STR(1, 249), .def = "monolith-trainer",
     .doc = "consumer group of the trainers (they split the partitions)"},
    {KEY("kafka", "session_timeout_ms"), CFG(kafka.session_timeout_ms), UINT(6000, 300000),
     .def = "10000", .doc = "consumer-group session timeout"},
    /* [joiner] */
    {KEY("joiner", "window_s"), CFG(joiner.window_s), UINT(1, 30 * 86400), .def = "1800",
     .doc = "join window: an action joins an impression when its time is at most this many "
            "seconds after the impression's"},
    {KEY("joiner", "allowed_lateness_s"), CFG(joiner.allowed_lateness_s), UINT(0, 86400),
     .def = "10",
     .doc = "the watermark trails the input's event time (the latest event of its slowest "
            "partition) by this much; a window closes once the watermark passes its end"},
    {KEY("joiner", "idle_advance_ms"), CFG(joiner.idle_advance_ms), UINT(0, 86400 * 1000),
     .def = "5000",
     .doc = "after this long without a message on either topic the watermark moves on with "
            "the clock (a stopped stream still gets its negatives); 0: never"},
    {KEY("joiner", "negative_rate"), CFG(joiner.negative_rate), REAL(0, 1, PF_MIN_OPEN), .def = "1",
     .doc = "share of negatives kept (a deterministic hash of request id, item id and `seed`); "
            "a kept negative carries it as `sample_rate`"},
    {KEY("joiner", "seed"), CFG(joiner.seed), UINT(0, UINT64_MAX), .def = "1",
     .doc = "seed of the negative sampling hash"},
    {KEY("joiner", "max_pending_memory"), CFG(joiner.max_pending_memory), UINT(0, 1ull << 32),
     .def = "1000000",
     .doc = "pending impressions also held in memory (the newest); all are in RocksDB"},
    {KEY("joiner", "max_early_actions"), CFG(joiner.max_early_actions), UINT(1, 1ull << 32),
     .def = "1000000",
     .doc = "actions waiting for their impression (in RocksDB); beyond, the oldest is dropped "
            "and counted"},
    {KEY("joiner", "state_dir"), CFG(joiner.state_dir), STR(1, 4095), .def = "/tmp/monolith-joiner",
     .doc = "RocksDB directory of the joiner's state (pending impressions, early actions, "
            "tombstones, input positions, undelivered examples); one joiner per directory"},
    {KEY("joiner", "group"), CFG(joiner.group), STR(1, 249), .def = "monolith-joiner",
     .doc = "consumer group of the joiner on `kafka.features_topic` and `kafka.actions_topic`"},
    {KEY("joiner", "commit_interval_ms"), CFG(joiner.commit_interval_ms), UINT(0, 600000),
     .def = "500",
     .doc = "period of a commit round: sync the state, deliver the examples, commit the "
            "offsets; 0: after every poll"},
    {KEY("joiner", "progress_interval_ms"), CFG(joiner.progress_interval_ms), UINT(0, 3600 * 1000),
     .def = "1000", .doc = "period of the progress line; 0: none"},
    {KEY("joiner", "sync"), CFG(joiner.sync), ENUM(bool_enum), .def = "true",
     .doc = "fsync the state's write-ahead log in each commit round (off: a machine crash "
            "may lose the last rounds' state; a process crash loses nothing either way)"},
    {KEY("joiner", "metrics_listen"), CFG(joiner.metrics_listen), ADDR(PF_EMPTY_OK | PF_PORT0_OK),
     .def = "", .doc = "address of the joiner's Prometheus `/metrics` endpoint; empty: disabled"},
    {KEY("joiner", "rocksdb_write_buffer_mb"), CFG(joiner.rocksdb_write_buffer_mb), UINT(1, 4096),
     .def = "64",
     .doc = "memtable size (MiB) of the state's RocksDB: the state's writes are held this long "
            "in memory before a flush; RSS grows by up to about twice it"},
    {KEY("joiner", "rocksdb_block_cache_mb"), CFG(joiner.rocksdb_block_cache_mb), UINT(0, 65536),
     .def = "8",
     .doc = "block cache (MiB) of the state's RocksDB (reads of flushed state: late actions, "
            "restarts); it fills up over the first minutes; 0: no cache"},
    {KEY("joiner", "task_actions"), CFG(joiner.task_actions), STR(1, 256), .def = "click",
     .doc = "the tasks, one label each: action types, comma-separated (`click`, `conversion`; "
            "case-insensitive; 1 to 4, each once); an example's `labels[t]` is 1 when an "
            "action of the t-th type joined its impression within the window. One task: an "
            "impression closes at its first action; several: it stays open until every task's "
            "action has come or its window ends, and negatives are sampled only among examples "
            "whose labels are all 0. Actions of a type in no task are ignored and counted (an "
            "unspecified type counts as `click`). A `state_dir` keeps the list it was written "
            "with: the joiner refuses it under another list"},
    /* [serving] */
    {KEY("serving", "listen"), CFG(serving.listen), ADDR(PF_PORT0_OK), .def = "127.0.0.1:7200",
     .doc = "address serving answers Predict and Lookup on (port 0: any free port)"},
    {KEY("serving", "threads"), CFG(serving.threads), UINT(1, 64), .def = "4",
     .doc = "threads serving requests (each keeps its own model workspace)"},
    {KEY("serving", "sync_interval_ms"), CFG(serving.sync_interval_ms), UINT(50, 3600 * 1000),
     .def = "10000",
     .doc = "period of the incremental sparse sync from every PS shard (rows changed and ids "
            "deleted since the last sync) when not streaming, and the pause before a failed "
            "stream is opened again"},
    {KEY("serving", "sync_stream_ms"), CFG(serving.sync_stream_ms), UINT(0, 60000), .def = "100",
     .doc = "follow the PS shards: keep each Sync stream open and take what changed every this "
            "many milliseconds (a shard over its `ps.sync_max_followers` answers one round, "
            "then the replica polls every `sync_interval_ms`); 0: poll only"},
    {KEY("serving", "dense_sync_interval_ms"), CFG(serving.dense_sync_interval_ms),
     UINT(50, 86400 * 1000), .def = "60000",
     .doc = "period of the dense pull from shard 0 (only a newer version is transferred)"},
    {KEY("serving", "sync_timeout_ms"), CFG(serving.sync_timeout_ms), UINT(100, 3600 * 1000),
     .def = "120000",
     .doc = "deadline of one Sync stream (a full sync of a large shard included) or PullDense "
            "call; a sync that misses it is retried at the next tick"},
    {KEY("serving", "log_sample_rate"), CFG(serving.log_sample_rate), REAL(0, 1, 0), .def = "1",
     .doc = "share of requests whose impressions are logged to `kafka.features_topic` (a "
            "deterministic hash of the request id); 0: no logging, no Kafka"},
    {KEY("serving", "max_candidates"), CFG(serving.max_candidates), UINT(1, 1u << 20),
     .def = "10000", .doc = "candidates in one Predict; more fail with RESOURCE_EXHAUSTED"},
    {KEY("serving", "max_request_fids"), CFG(serving.max_request_fids), UINT(1, 1u << 30),
     .def = "1048576",
     .doc = "user and item ids in one Predict or Lookup; more fail with RESOURCE_EXHAUSTED"},
    {KEY("serving", "max_message_bytes"), CFG(serving.max_message_bytes), UINT(4096, INT32_MAX),
     .def = "16777216",
     .doc = "largest gRPC request received (or reply sent); a larger request fails with "
            "RESOURCE_EXHAUSTED, and so does, before any work, one whose reply could be larger "
            "(a Lookup's is 4 bytes per value and 1 per id)"},
    {KEY("serving", "max_queued_calls"), CFG(serving.max_queued_calls), UINT(0, 4096), .def = "16",
     .doc = "calls waiting for one of `threads` when all are busy; one more is answered "
            "RESOURCE_EXHAUSTED at once (docs/security.md); 0: no waiting"},
    {KEY("serving", "metrics_listen"), CFG(serving.metrics_listen), ADDR(PF_EMPTY_OK | PF_PORT0_OK),
     .def = "", .doc = "address of serving's Prometheus `/metrics` endpoint; empty: disabled"},
    {KEY("serving", "shards"), CFG(serving.shards), STR(0, 65535), .def = "",
     .doc = "PS shards this node holds, comma-separated (\"0\", \"0,2\"); the other shards' "
            "rows are read from `peers` (docs/serving.md, \"Sharded serving\"); empty: every "
            "shard"},
    {KEY("serving", "peers"), ADDRS(serving.peers, serving.npeers, 0, 1024), .def = "",
     .doc = "serving nodes to read the shards this node does not hold from, comma-separated; "
            "which shards each holds is asked (Serving/Shards), several may hold the same"},
    {KEY("serving", "peer_timeout_ms"), CFG(serving.peer_timeout_ms), UINT(1, 60000), .def = "100",
     .doc = "deadline of the Lookups a Predict sends to its peers (one per peer, in parallel); "
            "a peer that misses it is handled as `peer_failure` says"},
    {KEY("serving", "peer_refresh_ms"), CFG(serving.peer_refresh_ms), UINT(50, 3600 * 1000),
     .def = "1000", .doc = "period of asking every peer which shards it holds synced"},
    {KEY("serving", "peer_failure"), CFG(serving.peer_zeros), ENUM(peer_failure_enum),
     .def = "fail",
     .doc = "what a Predict does when a peer fails or no peer holds a shard: `fail` "
            "(UNAVAILABLE, counted) or `zeros` (those ids read zeros, counted)"},
    {KEY("serving", "sync_source"), CFG(serving.sync_kafka), ENUM(sync_source_enum),
     .def = "direct",
     .doc = "where the replica follows the shards' changes: `direct` (a Sync stream per shard, "
            "`sync_stream_ms`; each costs the shard a stream) or `kafka` (one full Sync per "
            "shard at start, then `kafka.params_topic`, which the shards publish with "
            "`ps.publish_ms`: the shards' cost does not grow with the replicas)"},
    /* [tls] */
    {KEY("tls", "enabled"), CFG(tls.enabled), ENUM(bool_enum), .def = "false",
     .doc = "TLS on every gRPC server and client that reads this file (docs/security.md); "
            "false: plaintext, for loopback only"},
    {KEY("tls", "cert_file"), CFG(tls.cert_file), STR(0, 4095), .def = "",
     .doc = "PEM certificate chain, leaf first: the servers' certificate (its names must match "
            "the addresses clients dial), also presented by clients; required when enabled"},
    {KEY("tls", "key_file"), CFG(tls.key_file), STR(0, 4095), .def = "",
     .doc = "unencrypted PEM private key of `cert_file`; required when enabled"},
    {KEY("tls", "ca_file"), CFG(tls.ca_file), STR(0, 4095), .def = "",
     .doc = "PEM CA certificate(s) that servers' (and, with `client_auth`, clients') "
            "certificates must chain to; required when enabled"},
    {KEY("tls", "client_auth"), CFG(tls.client_auth), ENUM(bool_enum), .def = "false",
     .doc = "servers require a client certificate signed by `ca_file` (mutual TLS)"},
    {KEY("tls", "server_name"), CFG(tls.server_name), STR(0, 253), .def = "",
     .doc = "clients expect this name in servers' certificates instead of the host they dial "
            "(e.g. dialing by IP address); empty: the host"},
    /* [slot.N]: mt_table_slot_config_t, defaults as mt_table_slot_config_init() */
    {KEY("slot", "dim"), SLOT(dim), UINT(1, MT_TABLE_MAX_DIM), .def = NULL,
     .doc = "row width; a slot of the trainer's model may give the embedding's (`trainer.dim`): "
            "its row is one float wider, for the first-order weight"},
    {KEY("slot", "zero_tail"), SLOT(zero_tail), UINT(0, MT_TABLE_MAX_DIM), .def = "0",
     .doc = "the last this many floats of a new row start at 0 whatever `init` (a model "
            "slot's first-order weight: 1, set by the model's layout)"},
    {KEY("slot", "init"), SLOT(init), ENUM(init_enum), .def = "uniform",
     .doc = "initializer of a new row (deterministic per id and `init_seed`)"},
    {KEY("slot", "init_scale"), SLOT(init_scale), REAL(0, FINITE, PF_MAX_OPEN), .def = "0.01",
     .doc = "uniform: half-width; normal: standard deviation"},
    {KEY("slot", "init_mean"), SLOT(init_mean), REAL(-FINITE, FINITE, 0), .def = "0",
     .doc = "normal: mean"},
    {KEY("slot", "init_seed"), SLOT(init_seed), UINT(0, UINT64_MAX), .def = "0x6d6f6e6f6c697468",
     .doc = "seed of the initializer: replicas with the same seed build the same rows"},
    {KEY("slot", "optimizer"), SLOT(opt), ENUM(slot_opt_enum), .def = "adagrad",
     .doc = "optimizer applied in place by the table"},
    {KEY("slot", "lr"), SLOT(lr), REAL(0, FINITE, OPEN), .def = "0.01",
     .doc = "learning rate (FTRL: alpha)"},
    {KEY("slot", "eps"), SLOT(eps), REAL(0, 1, PF_MAX_OPEN), .def = "1e-8",
     .doc = "Adagrad / Adam epsilon (Adam: > 0)"},
    {KEY("slot", "init_accum"), SLOT(init_accum), REAL(0, FINITE, PF_MAX_OPEN), .def = "0.1",
     .doc = "Adagrad initial accumulator"},
    {KEY("slot", "beta1"), SLOT(beta1), REAL(0, 1, PF_MAX_OPEN), .def = "0.9",
     .doc = "Adam first-moment decay"},
    {KEY("slot", "beta2"), SLOT(beta2), REAL(0, 1, PF_MAX_OPEN), .def = "0.999",
     .doc = "Adam second-moment decay"},
    {KEY("slot", "ftrl_beta"), SLOT(ftrl_beta), REAL(0, FINITE, PF_MAX_OPEN), .def = "1",
     .doc = "FTRL beta"},
    {KEY("slot", "l1"), SLOT(l1), REAL(0, FINITE, PF_MAX_OPEN), .def = "0",
     .doc = "FTRL L1 regularization"},
    {KEY("slot", "l2"), SLOT(l2), REAL(0, FINITE, PF_MAX_OPEN), .def = "0",
     .doc = "FTRL L2 regularization"},
    {KEY("slot", "min_count"), SLOT(min_count), UINT(0, 255), .def = "0",
     .doc = "frequency filter: a row is created at the min_count-th training sighting; 0 "
            "and 1 admit at once"},
    {KEY("slot", "ttl_s"), SLOT(ttl_s), UINT(0, UINT32_MAX), .def = "0",
     .doc = "rows idle longer than this many seconds are evicted; 0: never"},
    {KEY("slot", "precision"), SLOT(precision), ENUM(precision_enum), .def = "fp32",
     .doc = "storage precision of the embedding (optimizer state stays fp32)"},
    {KEY("slot", "name"), .target = TGT_SLOT_NAME, .size = sizeof(char *), STR(0, 64), .def = "",
     .doc = "name of the slot, for humans and metrics"},
};
#define NPROPS (sizeof(props) / sizeof(props[0]))

/* ============================== helpers ============================== */

#define SHOW_MAX 64 /* user text in messages is cut to this many bytes */

/* Copies user text for a message: non-printable bytes become '?', long text is cut. */
static const char *show(const char *s, char *out, size_t outlen) {
    size_t i = 0;
    for (; s[i] && i + 4 < outlen && i < SHOW_MAX; i++) {
        unsigned char ch = (unsigned char)s[i];
        out[i] = (ch < 0x20 || ch >= 0x7f) ? '?' : (char)ch;
    }
    if (s[i]) {
        memcpy(out + i, "...", 3);
        i += 3;
    }
    out[i] = '\0';
    return out;
}

static bool is_space(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\v' || ch == '\f';
}
static bool is_digit(char ch) {
    return ch >= '0' && ch <= '9';
}
static bool is_xdigit(char ch) {
    return is_digit(ch) || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}
static bool is_alnum(char ch) {
    return is_digit(ch) || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
}

/* Trims whitespace in place; returns the start. */
static char *trim(char *s) {
    while (is_space(*s))
        s++;
    size_t n = strlen(s);
    while (n && is_space(s[n - 1]))
        s[--n] = '\0';
    return s;
}

static int prop_section(const prop_t *p) {
    for (int i = 0; i < NSECTIONS; i++)
        if (strcmp(p->section, sections[i]) == 0) return i;
    return SECT_SLOT;
}

/* "ps.threads" or "slot.3.dim". */
static const char *dotted(const prop_t *p, uint32_t slot_id, char *out, size_t outlen) {
    if (p->target == TGT_CONFIG)
        snprintf(out, outlen, "%s.%s", p->section, p->key);
    else
        snprintf(out, outlen, "slot.%" PRIu32 ".%s", slot_id, p->key);
    return out;
}

/* The field of @p p in @p base: mt_config_t, mt_table_slot_config_t or char * (slot name). */
static void *field_of(const prop_t *p, const void *base) {
    return (char *)base + p->offset; /* like strchr(): the caller knows whether it may write */
}

static uint64_t get_uint(const void *f, size_t size) {
    if (size == sizeof(uint32_t)) {
        uint32_t v;
        memcpy(&v, f, sizeof(v));
        return v;
    }
    uint64_t v;
    memcpy(&v, f, sizeof(v));
    return v;
}

static void put_uint(void *f, size_t size, uint64_t v) {
    if (size == sizeof(uint32_t)) {
        uint32_t v32 = (uint32_t)v;
        memcpy(f, &v32, sizeof(v32));
    } else {
        memcpy(f, &v, sizeof(v));
    }
}

static double get_real(const void *f, size_t size) {
    if (size == sizeof(float)) {
        float v;
        memcpy(&v, f, sizeof(v));
        return v;
    }
    double v;
    memcpy(&v, f, sizeof(v));
    return v;
}

/* ============================== value parsing and checking ============================== */

/* "1..64", "[0.5, 0.97]", "sgd, adagrad, adam", ...: the bounds column and range messages. */
static void format_bounds(const prop_t *p, bool markdown, char *out, size_t outlen) {
    const char *q = markdown ? "`" : "";
    size_t n = 0;
    out[0] = '\0';
    switch (p->type) {
    case PT_UINT: snprintf(out, outlen, "%" PRIu64 "..%" PRIu64, p->umin, p->umax); break;
    case PT_REAL:
        snprintf(out, outlen, "%c%g, %g%c", (p->flags & PF_MIN_OPEN) ? '(' : '[', p->dmin, p->dmax,
                 (p->flags & PF_MAX_OPEN) ? ')' : ']');
        break;
    case PT_ENUM:
        for (const prop_enum_t *e = p->enums; e->name && n < outlen; e++)
            n += (size_t)snprintf(out + n, outlen - n, "%s%s%s%s", e == p->enums ? "" : ", ", q,
                                  e->name, q);
        break;
    case PT_STRING: snprintf(out, outlen, "length %" PRIu64 "..%" PRIu64, p->umin, p->umax); break;
    case PT_ADDR:
        snprintf(out, outlen, "host:port, port %d..65535%s", (p->flags & PF_PORT0_OK) ? 0 : 1,
                 (p->flags & PF_EMPTY_OK) ? ", or empty" : "");
        break;
    case PT_ADDRS:
        snprintf(out, outlen, "%" PRIu64 "..%" PRIu64 " distinct host:port, port 1..65535", p->umin,
                 p->umax);
        break;
    }
}

static mt_err_t out_of_range(const prop_t *p, const char *text, char *msg, size_t msglen) {
    char b[160], t[SHOW_MAX + 8];
    format_bounds(p, false, b, sizeof(b));
    mt_msgf(msg, msglen, "%s is out of range %s", show(text, t, sizeof(t)), b);
    return MT_CONFIG;
}

static bool empty_ok(const prop_t *p) {
    switch (p->type) {
    case PT_STRING:
    case PT_ADDRS: return p->umin == 0;
    case PT_ADDR: return (p->flags & PF_EMPTY_OK) != 0;
    default: return false;
    }
}

static bool real_in_bounds(const prop_t *p, double x) {
    bool lo = (p->flags & PF_MIN_OPEN) ? x > p->dmin : x >= p->dmin;
    bool hi = (p->flags & PF_MAX_OPEN) ? x < p->dmax : x <= p->dmax;
    return lo && hi; /* false for NaN */
}

/* Decimal or 0x-hex, no sign, nothing else. */
static mt_err_t parse_uint(const prop_t *p, const char *v, uint64_t *out, char *msg,
                           size_t msglen) {
    char t[SHOW_MAX + 8];
    int base = 10;
    const char *digits = v, *q;
    if (v[0] == '0' && (v[1] == 'x' || v[1] == 'X')) {
        base = 16;
        digits = v + 2;
    }
    for (q = digits; base == 10 ? is_digit(*q) : is_xdigit(*q); q++) {
    }
    if (q == digits || *q) {
        mt_msgf(msg, msglen, "'%s' is not an unsigned integer", show(v, t, sizeof(t)));
        return MT_CONFIG;
    }
    errno = 0;
    unsigned long long x = strtoull(digits, NULL, base);
    if (errno == ERANGE || x < p->umin || x > p->umax) return out_of_range(p, v, msg, msglen);
    *out = x;
    return MT_OK;
}

static mt_err_t parse_real(const prop_t *p, const char *v, double *out, char *msg, size_t msglen) {
    char t[SHOW_MAX + 8];
    char *end = NULL;
    double x = 0;
    errno = 0;
    /* strtof for a float field: the same rounding as a C literal (table defaults match). */
    if (is_digit(v[0]) || v[0] == '+' || v[0] == '-' || v[0] == '.')
        x = p->size == sizeof(float) ? (double)strtof(v, &end) : strtod(v, &end);
    if (!end || end == v || *end) {
        mt_msgf(msg, msglen, "'%s' is not a number", show(v, t, sizeof(t)));
        return MT_CONFIG;
    }
    if (errno == ERANGE || !real_in_bounds(p, x)) return out_of_range(p, v, msg, msglen);
    *out = x;
    return MT_OK;
}

static const prop_enum_t *enum_by_name(const prop_t *p, const char *v) {
    for (const prop_enum_t *e = p->enums; e->name; e++)
        if (strcmp(e->name, v) == 0) return e;
    return NULL;
}

/* "host:port" or "[v6]:port" in s[0..len), port 1..65535 (0 too if port0_ok). */
static mt_err_t check_addr(const char *s, size_t len, bool port0_ok, char *msg, size_t msglen) {
    char t[SHOW_MAX + 8], copy[SHOW_MAX + 1];
    const char *colon = NULL, *q;
    size_t n = len < SHOW_MAX ? len : SHOW_MAX;
    memcpy(copy, s, n);
    copy[n] = '\0';
    show(copy, t, sizeof(t));
    if (len && s[0] == '[') {
        const char *rb = memchr(s, ']', len);
        if (!rb || rb == s + 1 || rb + 1 >= s + len || rb[1] != ':') goto bad;
        for (q = s + 1; q < rb; q++)
            if (!is_alnum(*q) && *q != ':' && *q != '.' && *q != '%') goto bad;
        colon = rb + 1;
    } else {
        for (q = s; q < s + len; q++)
            if (*q == ':') colon = q;
        if (!colon || colon == s) goto bad;
        for (q = s; q < colon; q++)
            if (!is_alnum(*q) && *q != '.' && *q != '-' && *q != '_') goto bad;
    }
    size_t ndigits = (size_t)(s + len - colon - 1);
    if (ndigits < 1 || ndigits > 5) goto bad;
    unsigned port = 0;
    for (q = colon + 1; q < s + len; q++) {
        if (!is_digit(*q)) goto bad;
        port = port * 10 + (unsigned)(*q - '0');
    }
    if (port > 65535 || (port == 0 && !port0_ok)) {
        mt_msgf(msg, msglen, "port %u of '%s%s' is out of range %d..65535", port, t,
                len > n ? "..." : "", port0_ok ? 0 : 1);
        return MT_CONFIG;
    }
    return MT_OK;
bad:
    mt_msgf(msg, msglen, "'%s%s' is not host:port", t, len > n ? "..." : "");
    return MT_CONFIG;
}

static void free_list(char **list, size_t n) {
    if (!list) return;
    for (size_t i = 0; i < n; i++)
        free(list[i]);
    free(list);
}

/* Splits "a:1, b:2" into an owned list; checks each entry and that none repeats. */
static mt_err_t parse_addrs(const prop_t *p, const char *v, char ***out, size_t *nout, char *msg,
                            size_t msglen) {
    char **list = NULL;
    size_t n = 0, cap = 1;
    mt_err_t err = MT_OK;
    if (!*v) {
        cap = 0;
    } else {
        for (const char *q = v; *q; q++)
            cap += *q == ',';
    }
    if (cap < p->umin || cap > p->umax) {
        char b[160];
        format_bounds(p, false, b, sizeof(b));
        mt_msgf(msg, msglen, "%zu addresses, expected %s", cap, b);
        return MT_CONFIG;
    }
    if (cap && !(list = calloc(cap, sizeof(*list)))) goto nomem;
    for (const char *q = v; cap && n < cap;) {
        const char *comma = strchr(q, ',');
        const char *end = comma ? comma : q + strlen(q);
        while (q < end && is_space(*q))
            q++;
        const char *e = end;
        while (e > q && is_space(e[-1]))
            e--;
        size_t len = (size_t)(e - q);
        if (len == 0) {
            mt_msgf(msg, msglen, "empty address in the list (entry %zu)", n + 1);
            err = MT_CONFIG;
            goto out;
        }
        if ((err = check_addr(q, len, false, msg, msglen))) goto out;
        for (size_t i = 0; i < n; i++) {
            if (strlen(list[i]) == len && memcmp(list[i], q, len) == 0) {
                char t[SHOW_MAX + 8];
                mt_msgf(msg, msglen, "'%s' appears twice (entries %zu and %zu)",
                        show(list[i], t, sizeof(t)), i + 1, n + 1);
                err = MT_CONFIG;
                goto out;
            }
        }
        if (!(list[n] = strndup(q, len))) goto nomem;
        n++;
        q = end + (comma ? 1 : 0);
    }
    *out = list;
    *nout = n;
    return MT_OK;
nomem:
    mt_msgf(msg, msglen, "out of memory");
    err = MT_NOMEM;
out:
    free_list(list, n);
    return err;
}

/*
 * Parses @p v (trimmed) into @p p's field in @p base. Atomic: on error nothing changed.
 * @param[out] msg  what is wrong, without the key (the caller adds file, line and key)
 */
static mt_err_t set_value(const prop_t *p, void *base, const char *v, char *msg, size_t msglen) {
    void *f = field_of(p, base);
    for (const char *q = v; *q; q++) {
        if ((unsigned char)*q < 0x20 && *q != '\t') {
            mt_msgf(msg, msglen, "value contains a control character");
            return MT_CONFIG;
        }
    }
    if (!*v && !empty_ok(p)) {
        mt_msgf(msg, msglen, "empty value");
        return MT_CONFIG;
    }
    mt_err_t err;
    switch (p->type) {
    case PT_UINT: {
        uint64_t x;
        if ((err = parse_uint(p, v, &x, msg, msglen))) return err;
        put_uint(f, p->size, x);
        return MT_OK;
    }
    case PT_REAL: {
        double x;
        if ((err = parse_real(p, v, &x, msg, msglen))) return err;
        if (p->size == sizeof(float)) {
            float x32 = (float)x;
            memcpy(f, &x32, sizeof(x32));
        } else {
            memcpy(f, &x, sizeof(x));
        }
        return MT_OK;
    }
    case PT_ENUM: {
        const prop_enum_t *e = enum_by_name(p, v);
        if (!e) {
            char b[160], t[SHOW_MAX + 8];
            format_bounds(p, false, b, sizeof(b));
            mt_msgf(msg, msglen, "'%s' is not one of %s", show(v, t, sizeof(t)), b);
            return MT_CONFIG;
        }
        memcpy(f, &e->value, sizeof(int));
        return MT_OK;
    }
    case PT_STRING:
    case PT_ADDR: {
        size_t len = strlen(v);
        if (p->type == PT_STRING && (len < p->umin || len > p->umax)) {
            mt_msgf(msg, msglen, "%zu bytes long, expected %" PRIu64 "..%" PRIu64, len, p->umin,
                    p->umax);
            return MT_CONFIG;
        }
        if (p->type == PT_ADDR && len &&
            (err = check_addr(v, len, (p->flags & PF_PORT0_OK) != 0, msg, msglen)))
            return err;
        char *dup = strdup(v);
        if (!dup) {
            mt_msgf(msg, msglen, "out of memory");
            return MT_NOMEM;
        }
        char *old;
        memcpy(&old, f, sizeof(old));
        free(old);
        memcpy(f, &dup, sizeof(dup));
        return MT_OK;
    }
    case PT_ADDRS: {
        char **list = NULL, **old;
        size_t n = 0, oldn;
        if ((err = parse_addrs(p, v, &list, &n, msg, msglen))) return err;
        memcpy(&old, f, sizeof(old));
        memcpy(&oldn, (char *)base + p->count_offset, sizeof(oldn));
        free_list(old, oldn);
        memcpy(f, &list, sizeof(list));
        memcpy((char *)base + p->count_offset, &n, sizeof(n));
        return MT_OK;
    }
    }
    mt_msgf(msg, msglen, "internal error: bad property type");
    return MT_INTERNAL;
}

/* Checks a field already in the struct (mt_config_validate()): bounds, strings set. */
static mt_err_t check_field(const prop_t *p, const void *base, char *msg, size_t msglen) {
    void *f = field_of(p, base);
    char t[64];
    switch (p->type) {
    case PT_UINT: {
        uint64_t x = get_uint(f, p->size);
        if (!p->def && x == 0) {
            mt_msgf(msg, msglen, "required (no default)");
            return MT_CONFIG;
        }
        snprintf(t, sizeof(t), "%" PRIu64, x);
        if (x < p->umin || x > p->umax) return out_of_range(p, t, msg, msglen);
        return MT_OK;
    }
    case PT_REAL: {
        double x = get_real(f, p->size);
        snprintf(t, sizeof(t), "%g", x);
        if (!real_in_bounds(p, x)) return out_of_range(p, t, msg, msglen);
        return MT_OK;
    }
    case PT_ENUM: {
        int x;
        memcpy(&x, f, sizeof(x));
        for (const prop_enum_t *e = p->enums; e->name; e++)
            if (e->value == x) return MT_OK;
        char b[160];
        format_bounds(p, false, b, sizeof(b));
        mt_msgf(msg, msglen, "%d is not the value of one of %s", x, b);
        return MT_CONFIG;
    }
    case PT_STRING:
    case PT_ADDR: {
        const char *s;
        memcpy(&s, f, sizeof(s));
        if (!s) {
            mt_msgf(msg, msglen, "not set (NULL)");
            return MT_CONFIG;
        }
        size_t len = strlen(s);
        if (!len) {
            if (empty_ok(p)) return MT_OK;
            mt_msgf(msg, msglen, "empty value");
            return MT_CONFIG;
        }
        if (p->type == PT_ADDR)
            return check_addr(s, len, (p->flags & PF_PORT0_OK) != 0, msg, msglen);
        if (len < p->umin || len > p->umax) {
            mt_msgf(msg, msglen, "%zu bytes long, expected %" PRIu64 "..%" PRIu64, len, p->umin,
                    p->umax);
            return MT_CONFIG;
        }
        return MT_OK;
    }
    case PT_ADDRS: {
        char **list;
        size_t n;
        memcpy(&list, f, sizeof(list));
        memcpy(&n, (const char *)base + p->count_offset, sizeof(n));
        if (n < p->umin || n > p->umax || (n && !list)) {
            char b[160];
            format_bounds(p, false, b, sizeof(b));
            mt_msgf(msg, msglen, "%zu addresses, expected %s", n, b);
            return MT_CONFIG;
        }
        for (size_t i = 0; i < n; i++) {
            mt_err_t err;
            if (!list[i]) {
                mt_msgf(msg, msglen, "entry %zu is NULL", i + 1);
                return MT_CONFIG;
            }
            if ((err = check_addr(list[i], strlen(list[i]), false, msg, msglen))) return err;
        }
        return MT_OK;
    }
    }
    return MT_OK;
}

/* ============================== slots ============================== */

/* @returns the index of slot @p id, or -(insertion point + 1). */
static ptrdiff_t slot_find(const mt_config_t *c, uint32_t id) {
    size_t lo = 0, hi = c->nslots;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->slots[mid].slot == id) return (ptrdiff_t)mid;
        if (c->slots[mid].slot < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -(ptrdiff_t)lo - 1;
}

/* The defaults of a new slot, from the table (dim has none: 0 until set). */
static mt_err_t slot_defaults(uint32_t id, mt_table_slot_config_t *s, char **name) {
    char msg[160];
    memset(s, 0, sizeof(*s));
    s->slot = (uint16_t)id;
    *name = NULL;
    for (size_t i = 0; i < NPROPS; i++) {
        const prop_t *p = &props[i];
        if (p->target == TGT_CONFIG || !p->def) continue;
        mt_err_t err = set_value(p, p->target == TGT_SLOT ? (void *)s : (void *)name, p->def, msg,
                                 sizeof(msg));
        if (err) return err == MT_NOMEM ? MT_NOMEM : MT_INTERNAL; /* defaults are checked */
    }
    return MT_OK;
}

/* Adds slot @p id (not present) with the default values; *idx receives its index. */
static mt_err_t slot_add(mt_config_t *c, uint32_t id, size_t *idx) {
    size_t pos = (size_t)(-slot_find(c, id) - 1);
    mt_table_slot_config_t s;
    char *name = NULL;
    mt_err_t err = slot_defaults(id, &s, &name);
    if (err) goto fail;
    if (c->nslots == c->slots_cap) {
        size_t cap = c->slots_cap ? 2 * c->slots_cap : 8;
        mt_table_slot_config_t *slots = malloc(cap * sizeof(*slots));
        char **names = malloc(cap * sizeof(*names));
        if (!slots || !names) {
            free(slots);
            free(names);
            err = MT_NOMEM;
            goto fail;
        }
        if (c->nslots) {
            memcpy(slots, c->slots, c->nslots * sizeof(*slots));
            memcpy(names, c->slot_names, c->nslots * sizeof(*names));
        }
        free(c->slots);
        free(c->slot_names);
        c->slots = slots;
        c->slot_names = names;
        c->slots_cap = cap;
    }
    memmove(&c->slots[pos + 1], &c->slots[pos], (c->nslots - pos) * sizeof(*c->slots));
    memmove(&c->slot_names[pos + 1], &c->slot_names[pos],
            (c->nslots - pos) * sizeof(*c->slot_names));
    c->slots[pos] = s;
    c->slot_names[pos] = name;
    c->nslots++;
    *idx = pos;
    return MT_OK;
fail:
    free(name);
    return err;
}

static void slot_remove(mt_config_t *c, size_t idx) {
    free(c->slot_names[idx]);
    memmove(&c->slots[idx], &c->slots[idx + 1], (c->nslots - idx - 1) * sizeof(*c->slots));
    memmove(&c->slot_names[idx], &c->slot_names[idx + 1],
            (c->nslots - idx - 1) * sizeof(*c->slot_names));
    c->nslots--;
}

/* Where @p p's field lives: the config, slot @p idx, or slot @p idx's name. */
static void *target_of(const prop_t *p, const mt_config_t *c, size_t idx) {
    switch (p->target) {
    case TGT_SLOT: return &c->slots[idx];
    case TGT_SLOT_NAME: return &c->slot_names[idx];
    default: return (void *)c; /* like field_of() */
    }
}

/* ============================== copy and free ============================== */

/* A deep copy, so that a load can fail without touching the config it started from. */
static mt_err_t config_copy(mt_config_t *dst, const mt_config_t *src) {
    *dst = *src;
    dst->slots = NULL;
    dst->slot_names = NULL;
    dst->nslots = dst->slots_cap = 0;
    for (size_t i = 0; i < NPROPS; i++) { /* no pointer of src is left in dst */
        const prop_t *p = &props[i];
        if (p->target != TGT_CONFIG) continue;
        if (p->type == PT_STRING || p->type == PT_ADDR || p->type == PT_ADDRS)
            memset(field_of(p, dst), 0, sizeof(void *));
        if (p->type == PT_ADDRS) memset((char *)dst + p->count_offset, 0, sizeof(size_t));
    }
    for (size_t i = 0; i < NPROPS; i++) {
        const prop_t *p = &props[i];
        if (p->target != TGT_CONFIG) continue;
        if (p->type == PT_STRING || p->type == PT_ADDR) {
            char *s, *dup;
            memcpy(&s, field_of(p, src), sizeof(s));
            if (s && !(dup = strdup(s))) goto nomem;
            if (s) memcpy(field_of(p, dst), &dup, sizeof(dup));
        } else if (p->type == PT_ADDRS) {
            char **list, **dup;
            size_t n;
            memcpy(&list, field_of(p, src), sizeof(list));
            memcpy(&n, (const char *)src + p->count_offset, sizeof(n));
            if (!n) continue;
            if (!(dup = calloc(n, sizeof(*dup)))) goto nomem;
            memcpy(field_of(p, dst), &dup, sizeof(dup));
            memcpy((char *)dst + p->count_offset, &n, sizeof(n));
            for (size_t j = 0; j < n; j++)
                if (!(dup[j] = strdup(list[j]))) goto nomem;
        }
    }
    if (src->nslots) {
        dst->slots = malloc(src->nslots * sizeof(*dst->slots));
        dst->slot_names = calloc(src->nslots, sizeof(*dst->slot_names));
        if (!dst->slots || !dst->slot_names) goto nomem;
        memcpy(dst->slots, src->slots, src->nslots * sizeof(*dst->slots));
        dst->nslots = dst->slots_cap = src->nslots;
        for (size_t i = 0; i < src->nslots; i++)
            if (!(dst->slot_names[i] = strdup(src->slot_names[i]))) goto nomem;
    }
    return MT_OK;
nomem:
    if (!dst->slot_names) dst->nslots = 0;
    mt_config_free(dst);
    return MT_NOMEM;
}

void mt_config_free(mt_config_t *c) {
    if (!c) return;
    for (size_t i = 0; i < NPROPS; i++) {
        const prop_t *p = &props[i];
        if (p->target != TGT_CONFIG) continue;
        if (p->type == PT_STRING || p->type == PT_ADDR) {
            char *s;
            memcpy(&s, field_of(p, c), sizeof(s));
            free(s);
        } else if (p->type == PT_ADDRS) {
            char **list;
            size_t n;
            memcpy(&list, field_of(p, c), sizeof(list));
            memcpy(&n, (char *)c + p->count_offset, sizeof(n));
            free_list(list, n);
        }
    }
    if (c->slot_names)
        for (size_t i = 0; i < c->nslots; i++)
            free(c->slot_names[i]);
    free(c->slot_names);
    free(c->slots);
    memset(c, 0, sizeof(*c));
}

/* ============================== the line parser ============================== */

/*
 * Grammar, one physical line at a time (any length; "\r\n" endings; a UTF-8 BOM skipped):
 *   line    = blank | comment | section | pair
 *   comment = '#' or ';' at the start of the line or after a space or tab, to the end
 *   section = '[' name ']'            name: cluster | ps | table | dense | slot.<0..65535>
 *   pair    = key '=' value           both trimmed; value may be empty; split at the first '='
 * A section may appear once, a key once per section.
 */
typedef struct parser {
    mt_config_t *c;
    const char *name;              /* of the text, for messages */
    unsigned line;                 /* current line, from 1 */
    int sect;                      /* current section index, SECT_SLOT, or -1 before any */
    uint32_t slot_id;              /* current slot when sect == SECT_SLOT */
    unsigned sect_line[NSECTIONS]; /* line of each global section, 0: not seen */
    unsigned *slot_line;           /* 65536 lines of [slot.N] headers, allocated on first use */
    unsigned key_line[NPROPS];     /* line of each key in the current section, 0: not seen */
    char *errbuf;
    size_t errlen;
} parser_t;

static mt_err_t perr(parser_t *ps, mt_err_t err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static mt_err_t perr(parser_t *ps, mt_err_t err, const char *fmt, ...) {
    if (!ps->errbuf || !ps->errlen) return err;
    int n = snprintf(ps->errbuf, ps->errlen, "%s:%u: ", ps->name, ps->line);
    if (n >= 0 && (size_t)n < ps->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ps->errbuf + n, ps->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return err;
}

/* Section index of @p name, SECT_SLOT (with *slot_id), -1 unknown, -2 bad slot id. */
static int find_section(const char *name, uint32_t *slot_id) {
    for (int i = 0; i < NSECTIONS; i++)
        if (strcmp(name, sections[i]) == 0) return i;
    if (strcmp(name, "slot") == 0) return -2;
    if (strncmp(name, "slot.", 5) != 0) return -1;
    const char *d = name + 5;
    size_t n = strlen(d);
    if (n < 1 || n > 5 || (n > 1 && d[0] == '0')) return -2;
    uint32_t id = 0;
    for (size_t i = 0; i < n; i++) {
        if (!is_digit(d[i])) return -2;
        id = id * 10 + (uint32_t)(d[i] - '0');
    }
    if (id > 65535) return -2;
    *slot_id = id;
    return SECT_SLOT;
}

static int find_prop(int sect, const char *key) {
    for (size_t i = 0; i < NPROPS; i++)
        if (prop_section(&props[i]) == sect && strcmp(props[i].key, key) == 0) return (int)i;
    return -1;
}

static mt_err_t on_section(parser_t *ps, char *s) {
    char t[SHOW_MAX + 8];
    size_t len = strlen(s);
    if (len < 2 || s[len - 1] != ']')
        return perr(ps, MT_CONFIG, "malformed section header '%s': expected '[name]'",
                    show(s, t, sizeof(t)));
    s[len - 1] = '\0';
    char *name = trim(s + 1);
    uint32_t id = 0;
    int sect = find_section(name, &id);
    if (sect == -1)
        return perr(ps, MT_CONFIG,
                    "unknown section [%s] (sections: cluster, ps, table, dense, trainer, input, "
                    "kafka, joiner, serving, slot.N)",
                    show(name, t, sizeof(t)));
    if (sect == -2)
        return perr(ps, MT_CONFIG, "bad slot id in [%s]: expected slot.0 .. slot.65535",
                    show(name, t, sizeof(t)));
    unsigned *first;
    if (sect == SECT_SLOT) {
        if (!ps->slot_line && !(ps->slot_line = calloc(65536, sizeof(*ps->slot_line))))
            return perr(ps, MT_NOMEM, "out of memory");
        first = &ps->slot_line[id];
    } else {
        first = &ps->sect_line[sect];
    }
    if (*first)
        return perr(ps, MT_CONFIG, "duplicate section [%s] (first on line %u)", name, *first);
    *first = ps->line;
    if (sect == SECT_SLOT && slot_find(ps->c, id) < 0) {
        size_t idx;
        mt_err_t err = slot_add(ps->c, id, &idx);
        if (err) return perr(ps, err, "[%s]: %s", name, mt_strerror(err));
    }
    ps->sect = sect;
    ps->slot_id = id;
    memset(ps->key_line, 0, sizeof(ps->key_line));
    return MT_OK;
}

static mt_err_t on_pair(parser_t *ps, const char *key, const char *value) {
    char t[SHOW_MAX + 8], d[64], msg[256];
    if (ps->sect < 0)
        return perr(ps, MT_CONFIG, "key '%s' before any section", show(key, t, sizeof(t)));
    int pi = find_prop(ps->sect, key);
    if (pi < 0) {
        if (ps->sect == SECT_SLOT)
            return perr(ps, MT_CONFIG, "unknown key '%s' in [slot.%" PRIu32 "]",
                        show(key, t, sizeof(t)), ps->slot_id);
        return perr(ps, MT_CONFIG, "unknown key '%s' in [%s]", show(key, t, sizeof(t)),
                    sections[ps->sect]);
    }
    const prop_t *p = &props[pi];
    dotted(p, ps->slot_id, d, sizeof(d));
    if (ps->key_line[pi])
        return perr(ps, MT_CONFIG, "%s: duplicate key (first on line %u)", d, ps->key_line[pi]);
    size_t idx = 0;
    if (p->target != TGT_CONFIG) idx = (size_t)slot_find(ps->c, ps->slot_id); /* exists */
    mt_err_t err = set_value(p, target_of(p, ps->c, idx), value, msg, sizeof(msg));
    if (err) return perr(ps, err, "%s: %s", d, msg);
    ps->key_line[pi] = ps->line;
    return MT_OK;
}

static mt_err_t parse_line(parser_t *ps, char *s) {
    char t[SHOW_MAX + 8];
    for (char *q = s; *q; q++) {
        if ((*q == '#' || *q == ';') && (q == s || q[-1] == ' ' || q[-1] == '\t')) {
            *q = '\0';
            break;
        }
    }
    s = trim(s);
    if (!*s) return MT_OK;
    if (*s == '[') return on_section(ps, s);
    char *eq = strchr(s, '=');
    if (!eq)
        return perr(ps, MT_CONFIG, "malformed line '%s': expected 'key = value' or '[section]'",
                    show(s, t, sizeof(t)));
    *eq = '\0';
    char *key = trim(s), *value = trim(eq + 1);
    if (!*key) return perr(ps, MT_CONFIG, "malformed line: no key before '='");
    return on_pair(ps, key, value);
}

static mt_err_t parse_text(mt_config_t *c, const char *text, size_t len, const char *name,
                           char *errbuf, size_t errlen) {
    parser_t ps;
    memset(&ps, 0, sizeof(ps));
    ps.c = c;
    ps.name = name;
    ps.sect = -1;
    ps.errbuf = errbuf;
    ps.errlen = errlen;
    char *buf = NULL;
    size_t cap = 0, pos = 0;
    mt_err_t err = MT_OK;
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) pos = 3;
    while (pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t n = (nl ? (size_t)(nl - text) : len) - pos;
        ps.line++;
        if (memchr(text + pos, '\0', n)) {
            err = perr(&ps, MT_CONFIG, "NUL byte in the line");
            goto out;
        }
        if (n + 1 > cap) {
            size_t ncap = cap ? cap : 256;
            while (ncap < n + 1)
                ncap *= 2;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                err = perr(&ps, MT_NOMEM, "out of memory");
                goto out;
            }
            buf = nb;
            cap = ncap;
        }
        memcpy(buf, text + pos, n);
        buf[n] = '\0';
        if ((err = parse_line(&ps, buf))) goto out;
        pos += n + 1;
    }
out:
    free(buf);
    free(ps.slot_line);
    return err;
}

/* Parses into a copy of @p c and swaps it in on success: @p c is unchanged on error. */
static mt_err_t load_text(mt_config_t *c, const char *text, size_t len, const char *name,
                          char *errbuf, size_t errlen) {
    mt_config_t tmp;
    mt_err_t err = config_copy(&tmp, c);
    if (err) {
        mt_msgf(errbuf, errlen, "%s: out of memory", name);
        return err;
    }
    if ((err = parse_text(&tmp, text, len, name, errbuf, errlen))) {
        mt_config_free(&tmp);
        return err;
    }
    mt_config_free(c);
    *c = tmp;
    return MT_OK;
}

/* ============================== public API ============================== */

mt_err_t mt_config_init(mt_config_t *c) {
    char msg[160];
    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < NPROPS; i++) {
        const prop_t *p = &props[i];
        if (p->target != TGT_CONFIG) continue;
        mt_err_t err = set_value(p, c, p->def, msg, sizeof(msg));
        if (err) return err == MT_NOMEM ? MT_NOMEM : MT_INTERNAL; /* defaults are tested */
    }
    return MT_OK;
}

mt_err_t mt_config_load_string(mt_config_t *c, const char *text, const char *name, char *errbuf,
                               size_t errlen) {
    return load_text(c, text, strlen(text), name ? name : "<string>", errbuf, errlen);
}

mt_err_t mt_config_load_file(mt_config_t *c, const char *path, char *errbuf, size_t errlen) {
    char eb[128];
    char *buf = NULL;
    size_t len = 0, cap = 0;
    mt_err_t err = MT_OK;
    FILE *f = fopen(path, "rb");
    if (!f) {
        mt_msgf(errbuf, errlen, "%s: cannot open: %s", path, strerror_r(errno, eb, sizeof(eb)));
        return MT_IO;
    }
    for (;;) {
        if (len == cap) {
            size_t ncap = cap ? 2 * cap : 4096;
            char *nb;
            if (cap > MT_CONFIG_MAX_FILE_BYTES) {
                mt_msgf(errbuf, errlen, "%s: larger than %u bytes", path, MT_CONFIG_MAX_FILE_BYTES);
                err = MT_CONFIG;
                goto out;
            }
            if (!(nb = realloc(buf, ncap))) {
                mt_msgf(errbuf, errlen, "%s: out of memory", path);
                err = MT_NOMEM;
                goto out;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        mt_msgf(errbuf, errlen, "%s: cannot read: %s", path, strerror_r(errno, eb, sizeof(eb)));
        err = MT_IO;
        goto out;
    }
    if (len > MT_CONFIG_MAX_FILE_BYTES) {
        mt_msgf(errbuf, errlen, "%s: larger than %u bytes", path, MT_CONFIG_MAX_FILE_BYTES);
        err = MT_CONFIG;
        goto out;
    }
    err = load_text(c, buf ? buf : "", len, path, errbuf, errlen);
out:
    free(buf);
    fclose(f);
    return err;
}

mt_err_t mt_config_set(mt_config_t *c, const char *dotted_key, const char *value, char *errbuf,
                       size_t errlen) {
    char t[SHOW_MAX + 8], msg[256], sect_name[32];
    const char *dot = strrchr(dotted_key, '.');
    size_t slen = dot ? (size_t)(dot - dotted_key) : 0;
    uint32_t id = 0;
    int sect = -1, pi = -1;
    if (dot && slen < sizeof(sect_name)) {
        memcpy(sect_name, dotted_key, slen);
        sect_name[slen] = '\0';
        sect = find_section(sect_name, &id);
        if (sect >= 0) pi = find_prop(sect, dot + 1);
    }
    if (sect == -2) {
        mt_msgf(errbuf, errlen, "%s: bad slot id (expected slot.0 .. slot.65535)",
                show(dotted_key, t, sizeof(t)));
        return MT_CONFIG;
    }
    if (pi < 0) {
        mt_msgf(errbuf, errlen, "unknown key '%s' (expected section.key or slot.N.key)",
                show(dotted_key, t, sizeof(t)));
        return MT_CONFIG;
    }
    const prop_t *p = &props[pi];
    char *v = strdup(value);
    if (!v) {
        mt_msgf(errbuf, errlen, "%s: out of memory", dotted_key);
        return MT_NOMEM;
    }
    size_t idx = 0;
    bool added = false;
    mt_err_t err = MT_OK;
    if (p->target != TGT_CONFIG) {
        ptrdiff_t at = slot_find(c, id);
        if (at >= 0) {
            idx = (size_t)at;
        } else if ((err = slot_add(c, id, &idx))) {
            mt_msgf(errbuf, errlen, "%s: %s", dotted_key, mt_strerror(err));
            goto out;
        } else {
            added = true;
        }
    }
    if ((err = set_value(p, target_of(p, c, idx), trim(v), msg, sizeof(msg)))) {
        mt_msgf(errbuf, errlen, "%s: %s", dotted_key, msg);
        if (added) slot_remove(c, idx);
    }
out:
    free(v);
    return err;
}

mt_err_t mt_config_set_arg(mt_config_t *c, const char *key_eq_value, char *errbuf, size_t errlen) {
    char t[SHOW_MAX + 8];
    const char *eq = strchr(key_eq_value, '=');
    if (!eq || eq == key_eq_value) {
        mt_msgf(errbuf, errlen, "'%s': expected key=value", show(key_eq_value, t, sizeof(t)));
        return MT_CONFIG;
    }
    char *key = strndup(key_eq_value, (size_t)(eq - key_eq_value));
    if (!key) {
        mt_msgf(errbuf, errlen, "out of memory");
        return MT_NOMEM;
    }
    mt_err_t err = mt_config_set(c, trim(key), eq + 1, errbuf, errlen);
    free(key);
    return err;
}

mt_err_t mt_config_validate(const mt_config_t *c, char *errbuf, size_t errlen) {
    char msg[256], d[64];
    for (size_t i = 0; i < NPROPS; i++) {
        const prop_t *p = &props[i];
        if (p->target == TGT_CONFIG && check_field(p, c, msg, sizeof(msg))) {
            mt_msgf(errbuf, errlen, "%s: %s", dotted(p, 0, d, sizeof(d)), msg);
            return MT_CONFIG;
        }
    }
    for (size_t s = 0; s < c->nslots; s++) {
        if (s && c->slots[s].slot <= c->slots[s - 1].slot) {
            mt_msgf(errbuf, errlen, "slots: not sorted by id or repeated (slot %u)",
                    c->slots[s].slot);
            return MT_CONFIG;
        }
        for (size_t i = 0; i < NPROPS; i++) {
            const prop_t *p = &props[i];
            if (p->target != TGT_CONFIG && check_field(p, target_of(p, c, s), msg, sizeof(msg))) {
                mt_msgf(errbuf, errlen, "%s: %s", dotted(p, c->slots[s].slot, d, sizeof(d)), msg);
                return MT_CONFIG;
            }
        }
    }
    if (c->dense.opt == MT_OPT_ADAM && c->dense.eps == 0.0f) {
        mt_msgf(errbuf, errlen, "dense.eps: Adam needs eps > 0");
        return MT_CONFIG;
    }
    if (c->ps.sync_max_followers >= c->ps.max_streams) {
        mt_msgf(errbuf, errlen,
                "ps.max_streams: %" PRIu32 " must be above ps.sync_max_followers (%" PRIu32
                "): polling Sync streams would be refused",
                c->ps.max_streams, c->ps.sync_max_followers);
        return MT_CONFIG;
    }
    if (c->tls.enabled) {
        const char *missing = !*c->tls.cert_file  ? "cert_file"
                              : !*c->tls.key_file ? "key_file"
                              : !*c->tls.ca_file  ? "ca_file"
                                                  : NULL;
        if (missing) {
            mt_msgf(errbuf, errlen, "tls.%s: required when tls.enabled is true", missing);
            return MT_CONFIG;
        }
    } else if (c->tls.client_auth) {
        mt_msgf(errbuf, errlen, "tls.client_auth: true needs tls.enabled = true");
        return MT_CONFIG;
    }
    if (c->table.reserve_rows && !c->table.initial_rows) {
        mt_msgf(errbuf, errlen,
                "table.reserve_rows: true needs table.initial_rows > 0 (the rows "
                "to reserve)");
        return MT_CONFIG;
    }
    if (c->cluster.num_shards && c->cluster.nps && c->cluster.num_shards != c->cluster.nps) {
        mt_msgf(errbuf, errlen,
                "cluster.num_shards: %" PRIu32 " does not match the %zu addresses of cluster.ps",
                c->cluster.num_shards, c->cluster.nps);
        return MT_CONFIG;
    }
    uint32_t nshards = c->cluster.num_shards ? c->cluster.num_shards
                       : c->cluster.nps      ? (uint32_t)c->cluster.nps
                                             : 1;
    if (c->ps.shard >= nshards) {
        mt_msgf(errbuf, errlen,
                "ps.shard: %" PRIu32 " is not below the number of shards (%" PRIu32 ")",
                c->ps.shard, nshards);
        return MT_CONFIG;
    }
    if (*c->serving.shards) {
        uint64_t held[64];
        size_t nh = 0;
        if (mt_config_parse_uint_list(c->serving.shards, 0, nshards - 1, held, 64, &nh, msg,
                                      sizeof(msg))) {
            mt_msgf(errbuf, errlen, "serving.shards: %s (there are %" PRIu32 " shards)", msg,
                    nshards);
            return MT_CONFIG;
        }
        for (size_t i = 0; i < nh; i++)
            for (size_t k = 0; k < i; k++)
                if (held[k] == held[i]) {
                    mt_msgf(errbuf, errlen, "serving.shards: shard %" PRIu64 " listed twice",
                            held[i]);
                    return MT_CONFIG;
                }
        if (nh < nshards && c->serving.npeers == 0) {
            mt_msgf(errbuf, errlen,
                    "serving.peers: empty, but serving.shards holds %zu of the %" PRIu32
                    " shards: list the serving nodes holding the others",
                    nh, nshards);
            return MT_CONFIG;
        }
    }
    uint32_t task_types[MT_CONFIG_MAX_TASK_ACTIONS];
    size_t ntasks = 0;
    if (mt_config_joiner_task_actions(c, task_types, &ntasks, errbuf, errlen)) return MT_CONFIG;
    if (c->nslots == 0) {
        mt_msgf(errbuf, errlen,
                "no slots: list the model's feature slots in trainer.slots, map columns to "
                "slots in input.columns (format tsv / csv), or configure [slot.N] sections");
        return MT_CONFIG;
    }
    mt_table_config_t tc;
    mt_config_table(c, &tc);
    mt_err_t err = mt_table_config_validate(&tc, msg, sizeof(msg));
    if (err == MT_CONFIG)
        mt_msgf(errbuf, errlen, "table: %s", msg);
    else if (err)
        mt_msgf(errbuf, errlen, "%s", mt_strerror(err));
    return err;
}

/* @p name (lower case) equals the @p len bytes at @p p, in any case. */
static bool name_is(const char *name, const char *p, size_t len) {
    for (size_t i = 0; i < len; i++) {
        char ch = p[i] >= 'A' && p[i] <= 'Z' ? (char)(p[i] - 'A' + 'a') : p[i];
        if (ch != name[i]) return false; /* also at the end of a shorter name */
    }
    return name[len] == '\0';
}

mt_err_t mt_config_joiner_task_actions(const mt_config_t *c, uint32_t *types, size_t *n,
                                       char *errbuf, size_t errlen) {
    const char *s = c->joiner.task_actions ? c->joiner.task_actions : "", *p = s;
    *n = 0;
    for (;;) {
        while (*p == ' ' || *p == '\t')
            p++;
        const char *q = p;
        while (*q && *q != ',')
            q++;
        size_t len = (size_t)(q - p);
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            len--;
        const prop_enum_t *e = action_enum;
        while (e->name && !name_is(e->name, p, len))
            e++;
        if (!len || !e->name) {
            mt_msgf(errbuf, errlen,
                    "joiner.task_actions: '%s': %s%.*s%s (expected action types, "
                    "comma-separated: click, conversion)",
                    s, len ? "'" : "an empty entry", (int)len, p, len ? "' is not one" : "");
            return MT_CONFIG;
        }
        if (*n == MT_CONFIG_MAX_TASK_ACTIONS) {
            mt_msgf(errbuf, errlen, "joiner.task_actions: '%s': more than %u tasks", s,
                    MT_CONFIG_MAX_TASK_ACTIONS);
            return MT_CONFIG;
        }
        for (size_t i = 0; i < *n; i++) {
            if (types[i] == (uint32_t)e->value) {
                mt_msgf(errbuf, errlen, "joiner.task_actions: '%s': %s appears twice", s, e->name);
                return MT_CONFIG;
            }
        }
        types[(*n)++] = (uint32_t)e->value;
        if (!*q) return MT_OK;
        p = q + 1;
    }
}

mt_err_t mt_config_parse_uint_list(const char *s, uint64_t lo, uint64_t hi, uint64_t *out,
                                   size_t cap, size_t *n, char *errbuf, size_t errlen) {
    *n = 0;
    const char *p = s;
    while (*p == ' ' || *p == '\t')
        p++;
    if (!*p) return MT_OK;
    for (;;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!is_digit(*p)) {
            mt_msgf(errbuf, errlen, "'%s': expected comma-separated integers", s);
            return MT_CONFIG;
        }
        errno = 0;
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (errno || v < lo || v > hi) {
            mt_msgf(errbuf, errlen, "'%s': %.*s is not in %" PRIu64 "..%" PRIu64, s, (int)(end - p),
                    p, lo, hi);
            return MT_CONFIG;
        }
        if (*n == cap) {
            mt_msgf(errbuf, errlen, "'%s': more than %zu entries", s, cap);
            return MT_CONFIG;
        }
        for (size_t i = 0; i < *n; i++) {
            if (out[i] == v) {
                mt_msgf(errbuf, errlen, "'%s': %llu appears twice", s, v);
                return MT_CONFIG;
            }
        }
        out[(*n)++] = v;
        p = end;
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p) return MT_OK;
        if (*p++ != ',') {
            mt_msgf(errbuf, errlen, "'%s': expected comma-separated integers", s);
            return MT_CONFIG;
        }
    }
}

/* The feature slots of [trainer]: the list, or the input format's. For tsv / csv, the
 * slots of input.columns, unless a [slot.N] section configures a slot that they do not name:
 * such a file describes a PS table of its own, not this model. */
mt_err_t mt_config_mean_slots(const mt_config_t *c, const uint16_t *slots, size_t nslots,
                              uint8_t *mean, char *errbuf, size_t errlen) {
    uint64_t v[256];
    size_t n = 0;
    char msg[200];
    if (mt_config_parse_uint_list(c->trainer.mean_slots, 0, MT_MODEL_SLOT_LIMIT - 1, v, 256, &n,
                                  msg, sizeof(msg))) {
        mt_msgf(errbuf, errlen, "trainer.mean_slots: %s", msg);
        return MT_CONFIG;
    }
    memset(mean, 0, nslots);
    for (size_t i = 0; i < n; i++) {
        size_t s = 0;
        while (s < nslots && slots[s] != v[i])
            s++;
        if (s == nslots) {
            mt_msgf(errbuf, errlen, "trainer.mean_slots: %llu is not one of the model's slots",
                    (unsigned long long)v[i]);
            return MT_CONFIG;
        }
        mean[s] = 1;
    }
    return MT_OK;
}

/* After a list's entry at *p: skips blanks and one comma. @returns 1 (past a comma), 0 (the
 * end of the list) or -1 (anything else: not a comma-separated list). */
static int list_sep(const char **p) {
    while (**p == ' ' || **p == '\t')
        (*p)++;
    if (!**p) return 0;
    if (**p != ',') return -1;
    (*p)++;
    return 1;
}

/*
 * A "slot:value, ..." list of key @p key (its text @p s) over the model's @p slots: out[i] =
 * slots[i]'s value, 0 where the list has none. Values in lo..hi (lo >= 1); @p what names one
 * ("buckets"). Unknown or repeated slots and bad syntax are refused by name.
 */
static mt_err_t slot_values(const char *key, const char *s, const uint16_t *slots, size_t nslots,
                            uint64_t lo, uint64_t hi, const char *what, uint64_t *out, char *errbuf,
                            size_t errlen) {
    const char *p = s;
    memset(out, 0, nslots * sizeof(uint64_t));
    for (;;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p) return MT_OK;
        char *end;
        errno = 0;
        unsigned long long slot = strtoull(p, &end, 10), v = 0;
        int ok = is_digit(*p) && !errno && *end == ':';
        if (ok) {
            const char *q = end + 1;
            while (*q == ' ' || *q == '\t')
                q++;
            ok = is_digit(*q);
            v = ok ? strtoull(q, &end, 10) : 0;
            ok = ok && !errno;
        }
        if (!ok) {
            mt_msgf(errbuf, errlen, "%s: '%s': expected \"slot:%s\" pairs separated by commas", key,
                    s, what);
            return MT_CONFIG;
        }
        if (v < lo || v > hi) {
            mt_msgf(errbuf, errlen, "%s: slot %llu: %llu %s, %llu..%llu", key, slot, v, what,
                    (unsigned long long)lo, (unsigned long long)hi);
            return MT_CONFIG;
        }
        size_t i = 0;
        while (i < nslots && slots[i] != slot)
            i++;
        if (i == nslots) {
            mt_msgf(errbuf, errlen, "%s: %llu is not one of the model's slots", key, slot);
            return MT_CONFIG;
        }
        if (out[i]) {
            mt_msgf(errbuf, errlen, "%s: slot %llu appears twice", key, slot);
            return MT_CONFIG;
        }
        out[i] = v;
        p = end;
        if (list_sep(&p) < 0) {
            mt_msgf(errbuf, errlen, "%s: '%s': expected \"slot:%s\" pairs separated by commas", key,
                    s, what);
            return MT_CONFIG;
        }
    }
}

mt_err_t mt_config_slot_hash_buckets(const mt_config_t *c, const uint16_t *slots, size_t nslots,
                                     uint64_t *buckets, char *errbuf, size_t errlen) {
    return slot_values("trainer.slot_hash_buckets", c->trainer.slot_hash_buckets, slots, nslots, 1,
                       1ull << 48, "buckets", buckets, errbuf, errlen);
}

/* trainer.slot_dims over the slots: dims[i] = slots[i]'s dim (trainer.dim where none). */
static mt_err_t slot_dims(const mt_config_t *c, const uint16_t *slots, size_t nslots,
                          uint32_t *dims, char *errbuf, size_t errlen) {
    uint64_t v[256];
    if (nslots > 256) {
        mt_msgf(errbuf, errlen, "trainer.slots: more than 256 slots");
        return MT_CONFIG;
    }
    mt_err_t err = slot_values("trainer.slot_dims", c->trainer.slot_dims, slots, nslots, 1,
                               MT_TABLE_MAX_DIM - MT_MODEL_ROW_TAIL, "dim", v, errbuf, errlen);
    if (err) return err;
    for (size_t i = 0; i < nslots; i++)
        dims[i] = v[i] ? (uint32_t)v[i] : c->trainer.dim;
    return MT_OK;
}

/* model.task_weights into w[0, model.tasks): empty leaves the 1s of mt_model_config_init(). */
static mt_err_t task_weights(const mt_config_t *c, float *w, char *errbuf, size_t errlen) {
    const char *p = c->model.task_weights;
    uint32_t n = 0;
    while (*p) {
        while (*p == ' ' || *p == '\t')
            p++;
        char *end;
        double v = strtod(p, &end);
        if (end == p || !(v >= 0 && v <= 1e6)) {
            mt_msgf(errbuf, errlen, "model.task_weights: '%s': a weight is a number in [0, 1e6]",
                    c->model.task_weights);
            return MT_CONFIG;
        }
        if (n < MT_MODEL_MAX_TASKS) w[n] = (float)v;
        n++;
        p = end;
        if (list_sep(&p) < 0) {
            mt_msgf(errbuf, errlen, "model.task_weights: '%s': comma-separated numbers",
                    c->model.task_weights);
            return MT_CONFIG;
        }
    }
    if (n && n != c->model.tasks) {
        mt_msgf(errbuf, errlen, "model.task_weights: %u weights for %u tasks (model.tasks)", n,
                c->model.tasks);
        return MT_CONFIG;
    }
    return MT_OK;
}

mt_err_t mt_config_model(const mt_config_t *c, const uint16_t *slots, size_t nslots, uint32_t *dims,
                         mt_model_config_t *out, char *errbuf, size_t errlen) {
    uint64_t hidden[MT_MODEL_MAX_HIDDEN];
    size_t nh = 0;
    char msg[200];
    mt_err_t err = slot_dims(c, slots, nslots, dims, errbuf, errlen);
    if (err) return err;
    if (mt_config_parse_uint_list(c->trainer.hidden, 1, MT_MODEL_MAX_WIDTH, hidden,
                                  MT_MODEL_MAX_HIDDEN, &nh, msg, sizeof(msg))) {
        mt_msgf(errbuf, errlen, "trainer.hidden: %s", msg);
        return MT_CONFIG;
    }
    mt_model_config_init(out);
    out->nslots = (uint32_t)nslots;
    out->dim = c->trainer.dim;
    out->nhidden = (uint32_t)nh;
    for (size_t l = 0; l < nh; l++)
        out->hidden[l] = (uint32_t)hidden[l];
    out->init_seed = c->trainer.seed;
    out->type = c->model.type;
    out->ncross = c->model.cross_layers;
    out->cross_rank = c->model.cross_rank;
    out->ntasks = c->model.tasks;
    out->nexperts = c->model.experts;
    out->expert_width = c->model.expert_width;
    if ((err = task_weights(c, out->task_weight, errbuf, errlen))) return err;
    out->seq_len = c->model.sequence_length;
    out->attention_width = c->model.attention_width;
    if (out->type == MT_MODEL_DIN) { /* the slots' ids to their indexes */
        const uint32_t want[2] = {c->model.sequence_slot, c->model.sequence_query};
        uint32_t at[2] = {(uint32_t)nslots, (uint32_t)nslots};
        for (int k = 0; k < 2; k++) {
            for (size_t i = 0; i < nslots && at[k] == nslots; i++)
                if (slots[i] == want[k]) at[k] = (uint32_t)i;
            if (at[k] == nslots) {
                mt_msgf(errbuf, errlen, "model.%s = %u: din needs one of the model's slots",
                        k ? "sequence_query" : "sequence_slot", want[k]);
                return MT_CONFIG;
            }
        }
        if (at[0] == at[1]) {
            mt_msgf(errbuf, errlen,
                    "model.sequence_slot = model.sequence_query = %u: din needs two slots",
                    want[0]);
            return MT_CONFIG;
        }
        if (dims[at[0]] != dims[at[1]]) {
            mt_msgf(errbuf, errlen,
                    "trainer.slot_dims: the sequence slot %u has dim %u, its query slot %u %u: "
                    "the sequence holds the query slot's rows and needs its dim",
                    want[0], dims[at[0]], want[1], dims[at[1]]);
            return MT_CONFIG;
        }
        uint8_t mean[256];
        if (nslots > 256) return MT_CONFIG;
        if ((err = mt_config_mean_slots(c, slots, nslots, mean, errbuf, errlen))) return err;
        if (mean[at[0]]) {
            mt_msgf(errbuf, errlen,
                    "trainer.mean_slots: %u is din's sequence slot, which is not pooled", want[0]);
            return MT_CONFIG;
        }
        out->seq_slot = at[0];
        out->seq_query = at[1];
    }
    for (size_t i = 0; i < nslots; i++)
        if (dims[i] != out->dim) out->slot_dims = dims;
    if (mt_model_config_validate(out, msg, sizeof(msg)) != MT_OK) {
        mt_msgf(errbuf, errlen, "%s", msg);
        return MT_CONFIG;
    }
    return MT_OK;
}

static mt_err_t trainer_slots(const mt_config_t *c, uint64_t *v, size_t cap, size_t *n,
                              char *errbuf, size_t errlen) {
    char msg[256];
    if (mt_config_parse_uint_list(c->trainer.slots, 0, MT_MODEL_SLOT_LIMIT - 1, v, cap, n, msg,
                                  sizeof(msg))) {
        mt_msgf(errbuf, errlen, "trainer.slots: %s", msg);
        return MT_CONFIG;
    }
    if (*n) return MT_OK;
    switch (c->input.format) {
    case MT_INPUT_CRITEO:
        for (uint64_t s = 1; s <= 39 && *n < cap; s++)
            v[(*n)++] = s;
        break;
    case MT_INPUT_MOVIELENS_100K:
    case MT_INPUT_MOVIELENS_LATEST:
        v[(*n)++] = 1;
        v[(*n)++] = 2;
        if (c->input.format == MT_INPUT_MOVIELENS_100K && c->input.users_file[0]) {
            v[(*n)++] = 3;
            v[(*n)++] = 4;
            v[(*n)++] = 5;
        }
        if (c->input.items_file[0]) v[(*n)++] = 6;
        break;
    default: { /* tsv / csv */
        mt_err_t err = mt__config_column_slots(c->input.columns, v, cap, n, errbuf, errlen);
        if (err) return err;
        for (size_t k = 0; k < c->nslots && *n; k++) {
            uint64_t s = c->slots[k].slot;
            size_t i = 0;
            while (i < *n && v[i] != s)
                i++;
            if (i == *n) *n = 0; /* a PS-only config: no trainer slots unless listed */
        }
        break;
    }
    }
    return MT_OK;
}

mt_err_t mt_config_derive_trainer_slots(mt_config_t *c, uint16_t *slots_out, size_t *nslots_out,
                                        char *errbuf, size_t errlen) {
    uint64_t v[256];
    size_t n = 0;
    mt_err_t err = trainer_slots(c, v, 256, &n, errbuf, errlen);
    if (err) return err;
    if (slots_out && nslots_out && *nslots_out < n) {
        mt_msgf(errbuf, errlen, "trainer.slots: more than %zu slots", *nslots_out);
        return MT_CONFIG;
    }
    uint16_t ids[256] = {0}; /* zeroed: GCC -O3 cannot see that only ids[0, n) are read */
    uint32_t dims[256];
    for (size_t i = 0; i < n; i++)
        ids[i] = (uint16_t)v[i];
    /* The table slots are the model's layout's (mt_model_layout_tables(): a din sequence is
     * looked up in its query slot's rows, and has none of its own). */
    uint16_t tids[256];
    uint32_t floats[256];
    size_t nt = 0;
    if (n) {
        mt_model_config_t mc;
        if ((err = mt_config_model(c, ids, n, dims, &mc, errbuf, errlen))) return err;
        err = mt_model_tables(&mc, ids, NULL, NULL, 0, tids, floats, &nt, errbuf, errlen);
        if (err) return err;
    }
    for (size_t i = 0; i < nt; i++) {
        uint16_t id = tids[i];
        const uint32_t row = floats[i], dim = row - MT_MODEL_ROW_TAIL;
        /* the old layout's first-order slot: its weight is in slot id's row now */
        if (slot_find(c, (uint16_t)(id | MT_MODEL_SLOT_LIMIT)) >= 0) {
            mt_msgf(errbuf, errlen,
                    "slot.%u: a model slot's first-order weight is kept in its row (slot.%u, "
                    "dim + 1): remove this section",
                    id | MT_MODEL_SLOT_LIMIT, id);
            return MT_CONFIG;
        }
        ptrdiff_t at = slot_find(c, id);
        if (at >= 0) {
            mt_table_slot_config_t *sc = &c->slots[at];
            if (sc->dim == row && sc->zero_tail == MT_MODEL_ROW_TAIL) continue; /* derived */
            if (sc->dim != dim) {
                mt_msgf(errbuf, errlen,
                        "slot.%u.dim: %u, but the trainer's model needs %u (trainer.dim, "
                        "trainer.slot_dims)",
                        id, sc->dim, dim);
                return MT_CONFIG;
            }
            sc->dim = row; /* the embedding, then the first-order weight */
            sc->zero_tail = MT_MODEL_ROW_TAIL;
            continue;
        }
        size_t idx;
        if ((err = slot_add(c, id, &idx))) {
            mt_msgf(errbuf, errlen, "slot.%u: %s", id, mt_strerror(err));
            return err;
        }
        mt_table_slot_config_t *sc = &c->slots[idx];
        uint32_t keep_ttl = c->trainer.ttl_s;
        mt_table_slot_config_init(sc, id, row);
        sc->zero_tail = MT_MODEL_ROW_TAIL;
        sc->init = MT_INIT_UNIFORM;
        sc->init_scale = c->trainer.init_scale;
        sc->init_seed = c->trainer.seed;
        sc->opt = c->trainer.sparse_opt;
        sc->lr = c->trainer.sparse_lr;
        sc->min_count = c->trainer.min_count;
        sc->ttl_s = keep_ttl;
    }
    if (slots_out && nslots_out) {
        for (size_t i = 0; i < n; i++)
            slots_out[i] = (uint16_t)v[i];
        *nslots_out = n;
    }
    return MT_OK;
}

void mt_config_table(const mt_config_t *c, mt_table_config_t *out) {
    *out = c->table;
    out->slots = c->slots;
    out->nslots = c->nslots;
}

const mt_table_slot_config_t *mt_config_slot(const mt_config_t *c, uint16_t slot,
                                             const char **name) {
    ptrdiff_t at = slot_find(c, slot);
    if (at < 0) return NULL;
    if (name) *name = c->slot_names[at];
    return &c->slots[at];
}

/* ============================== the reference ============================== */

static const char *type_name(const prop_t *p) {
    switch (p->type) {
    case PT_UINT: return "uint";
    case PT_REAL: return p->size == sizeof(float) ? "float" : "double";
    case PT_ENUM: return "enum";
    case PT_STRING: return "string";
    case PT_ADDR: return "address";
    case PT_ADDRS: return "address list";
    }
    return "?";
}

/* Markdown table cell: '|' escaped. */
static void put_cell(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '|') fputc('\\', f);
        fputc(*s, f);
    }
}

mt_err_t mt_config_write_reference(FILE *f) {
    fputs("# Configuration reference\n"
          "\n"
          "<!-- Generated by mt_config_write_reference() (config/src/config.c): do not edit.\n"
          "     Regenerate with: build/config/mt_config_reference docs/config.md -->\n"
          "\n"
          "Every Monolith-C daemon reads one INI file (`mt_config_load_file()`), then applies\n"
          "command-line overrides `section.key=value` (`mt_config_set_arg()`; a slot key is\n"
          "`slot.N.key`, e.g. `slot.3.dim=32`), then checks the whole (`mt_config_validate()`).\n"
          "\n"
          "Syntax: `[section]` headers and `key = value` lines; whitespace around keys and\n"
          "values is trimmed; `#` or `;` at the start of a line or after a space or tab starts a\n"
          "comment. Lines may be of any length. Integers are decimal or `0x` hex. Unknown\n"
          "sections and keys, a section or key given twice, a key before any section, a value\n"
          "out of bounds and an empty value where the bounds do not allow one are errors that\n"
          "name the file, the line and the key. Values are never quoted and cannot hold ` #`\n"
          "or ` ;`.\n"
          "\n"
          "Sections: `[cluster]`, `[ps]`, `[table]`, `[dense]`, `[trainer]`, `[input]`,\n"
          "`[kafka]`, `[joiner]`, `[serving]`, `[tls]` (docs/security.md), and one `[slot.N]` per\n"
          "configured slot id N (0..65535; the top 16 bits of a feature id). At least one slot\n"
          "is required (a `[slot.N]` section, or derived from `trainer.slots` or, for tsv / csv\n"
          "input, `input.columns`) and every slot needs a `dim`; `cluster.num_shards` and the\n"
          "number of `cluster.ps` addresses must agree when both are given. Cross-field rules\n"
          "of the table (e.g. `changelog_entries` >= 64 per part, Adam needs `eps` > 0) are\n"
          "those of `mt_table_config_validate()`.\n"
          "\n"
          "| section | key | type | default | bounds | description |\n"
          "|---|---|---|---|---|---|\n",
          f);
    for (size_t i = 0; i < NPROPS; i++) {
        const prop_t *p = &props[i];
        char b[256];
        format_bounds(p, true, b, sizeof(b));
        fprintf(f, "| `[%s]` | `%s` | %s | ", p->target == TGT_CONFIG ? p->section : "slot.N",
                p->key, type_name(p));
        if (!p->def)
            fputs("required", f);
        else if (!*p->def)
            fputs("(empty)", f);
        else
            fprintf(f, "`%s`", p->def);
        fputs(" | ", f);
        put_cell(f, b);
        fputs(" | ", f);
        put_cell(f, p->doc);
        fputs(" |\n", f);
    }
    return ferror(f) ? MT_IO : MT_OK;
}
