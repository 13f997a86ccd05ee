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
 *     [cluster]                 sections: cluster, ps, table, dense, slot.N (N = 0..65535)
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
#include "mt/table.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_CONFIG_MAX_SHARDS     4096u       /* cluster.num_shards and cluster.ps entries */
#define MT_CONFIG_MAX_FILE_BYTES (16u << 20) /* mt_config_load_file() refuses larger files */

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
    char *snapshot_dir;               /* "" = no snapshots */
    uint32_t snapshot_interval_s;     /* 0 = no periodic snapshots */
    uint32_t snapshot_keep;           /* snapshots kept; older ones are deleted */
    uint32_t expire_interval_ms;      /* 0 = no expiry ticks */
    uint64_t expire_buckets_per_tick; /* mt_table_expire() budget of one tick */
    char *admin_token;                /* "" = admin calls need no token */
    char *metrics_listen;             /* Prometheus /metrics "host:port"; "" = disabled */
} mt_config_ps_t;

/** [dense]: optimizer of the dense (non-embedding) parameters (as mt_ps_dense_config_t). */
typedef struct mt_config_dense {
    mt_table_opt_t opt; /* MT_OPT_SGD, MT_OPT_ADAGRAD or MT_OPT_ADAM (never FTRL) */
    float lr, beta1, beta2, eps;
    float init_accum; /* Adagrad initial accumulator */
} mt_config_dense_t;

/** Everything one file configures. Initialize with mt_config_init(). */
typedef struct mt_config {
    mt_config_cluster_t cluster;
    mt_config_ps_t ps;
    mt_table_config_t table; /* [table]; its slots/nslots stay NULL/0: see mt_config_table() */
    mt_config_dense_t dense;
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
 * Cross-field checks after loading and overrides: every field within its bounds, every slot
 * has a dim, num_shards equals the number of ps addresses when both are given, ps.shard is
 * below the number of shards (num_shards, else the number of addresses, else 1), at least
 * one slot, then mt_table_config_validate() on the table config with the slots attached.
 * @returns MT_OK, MT_CONFIG (message in @p errbuf) or MT_NOMEM.
 */
mt_err_t mt_config_validate(const mt_config_t *c, char *errbuf, size_t errlen);

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
