/*
 * join.c - the joiner's core: the join rules of joiner.h over state kept in RocksDB.
 *
 * Every piece of state is in one RocksDB database (default column family); keys start with
 * a one-byte record type, and RocksDB orders them as bytes. "key" below is
 * request_id + '\0' + be64(item_id) (request ids hold no NUL: such a message is bad);
 * be64t(t) is big-endian (t XOR 2^63), so that signed times sort as bytes.
 *
 *   key                     value (integers little-endian)       what
 *   'M'                     meta (below)                          watermark, gauges, seq
 *   'K' topic '\0' be32(p)  i64 next offset, i64 max event time  input partition
 *   'P' key                 i64 ts, Impression bytes              pending impression
 *   'A' key                 u8 labels                             labels seen of a 'P' (T > 1)
 *   'T' be64t(close) key    (empty)                               close-time index of 'P'
 *   'E' key                 early record (below)                  early action(s)
 *   'F' be64t(expire) key   (empty)                               expiry index of 'E'
 *   'D' key                 u8 labels, i64 expire                 tombstone of a closed key
 *   'G' be64t(expire) key   (empty)                               expiry index of 'D'
 *   'O' be64(seq)           u8 labels, u16 n, request id (n), Example bytes   the outbox
 *
 *   meta: u32 version (1: one task, 2: several), u8 task_actions[4] (0-padded; all 0 in a
 *         state written before the field: read as one task, the click), i64 watermark,
 *         i64 max event time, u64 pending, u64 early, u64 tombstones, u64 next outbox seq
 *   labels: bit t = task t's label. With one task (T = 1) every record is as it was before
 *         tasks existed: labels 0 or 1, no 'A' record (an impression closes at its action).
 *   early record, T = 1: i64 ts, u8 type, 3 bytes 0 (one action).
 *         T > 1: i64 ts (the latest action's: its 'F' entry is at ts + window), u32 labels
 *         (the tasks present), i64 ts[T] (each task's action time; INT64_MIN: none).
 *
 * A pending impression's 'A' record exists only while its labels are not 0; it is written
 * in the batch of the action that set the label and deleted with the 'P' record. A state
 * written with other task_actions is refused at open (its labels would change meaning).
 *
 * Invariants: every write is one WriteBatch holding a whole step (one message with its
 * position and meta, or a run of closures with meta), so any prefix of the WAL is a
 * consistent state. 'T', 'F' and 'G' entries are created with a time >= the watermark of
 * that moment and deleted once the watermark passes them, so a scan may start at the
 * previous watermark (not at the first, deleted, keys: RocksDB would step over every
 * deletion marker). The memory cache holds a subset of 'P' (the newest at most
 * max_pending_memory), written through.
 *
 * File layout: helpers; keys; state records; the cache; examples; the join; public API.
 */
#include "mt/bytes.h"
#include "mt/joiner.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <rocksdb/c.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "monolith/v1/example.pb-c.h"

#define META_VERSION    1u /* one task: the layout before tasks existed */
#define META_VERSION_MT 2u /* several tasks ('A' records, masks, the multi-task early record) */
#define KEY_MAX         (1 + 8 + MT_JOINER_MAX_REQUEST_ID + 1 + 8)
#define CLOSE_BATCH     512 /* closures per atomic write */
#define MAX_SLOTS_FIDS  (1u << 20)

/* ============================== types ============================== */

typedef struct centry { /* a pending impression held in memory */
    struct centry *hnext;
    struct centry *older, *newer; /* FIFO of insertion: the oldest is evicted first */
    uint64_t hash, item;
    int64_t ts;
    uint32_t rid_len, len;
    uint32_t labels; /* its 'A' record (0: none) */
    uint8_t data[];  /* request id, then the Impression bytes */
} centry_t;

typedef struct position { /* one input partition */
    char *topic;
    int32_t partition;
    int64_t next;    /* next offset to apply; -1: none stored */
    int64_t max_ts;  /* largest event time seen in it (INT64_MIN: none) */
    int64_t last_ms; /* clock of its last message (or of open / mt_joiner_hold()) */
} position_t;

typedef struct obox {
    mt_joiner_example_t ex; /* request_id and value point into buf */
    uint8_t *buf;
} obox_t;

typedef struct buf {
    uint8_t *p;
    size_t len, cap;
} buf_t;

struct mt_joiner {
    mt_joiner_config_t cfg;
    mt_joiner_clock_fn clock;
    void *opaque;
    rocksdb_t *db;
    rocksdb_options_t *opts;
    rocksdb_cache_t *block_cache; /* NULL: no block cache */
    rocksdb_writeoptions_t *wo, *wo_sync;
    rocksdb_readoptions_t *ro;
    rocksdb_writebatch_t *wb;
    uint32_t all_labels; /* every task's bit: (1 << ntasks) - 1 */
    /* persisted (meta) */
    int64_t watermark, max_event;
    uint64_t pending, early, tombstones, next_seq;
    /* the clock side of the watermark */
    int64_t last_input_ms, last_tick_ms;
    /* cache */
    centry_t **buckets;
    size_t nbuckets, ncached;
    centry_t *oldest, *newest;
    /* positions */
    position_t *pos;
    size_t npos, pos_cap;
    /* outbox (in memory, oldest first, from ohead) */
    obox_t *ob;
    size_t ohead, ocount, ocap;
    size_t expect_parts;     /* mt_joiner_set_partitions() */
    int64_t expect_since_ms; /* clock of that call */
    position_t *cur;         /* the partition of the message being applied (NULL: none) */
    buf_t val;               /* scratch */
    mt_joiner_stats_t st;
};

/* ============================== helpers ============================== */

static void put_be64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (56 - 8 * i));
}
static uint64_t get_be64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}
static uint64_t bias(int64_t t) {
    return (uint64_t)t ^ (1ull << 63);
}
static int64_t unbias(uint64_t v) {
    return (int64_t)(v ^ (1ull << 63));
}
static int64_t sat_add(int64_t a, int64_t b) { /* b >= 0 */
    return a > INT64_MAX - b ? INT64_MAX : a + b;
}
static uint32_t popcount(uint32_t v) {
    uint32_t n = 0;
    for (; v; v &= v - 1)
        n++;
    return n;
}

static int64_t default_clock(void *opaque) {
    (void)opaque;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static mt_err_t buf_set(buf_t *b, const void *p, size_t len) {
    if (len > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < len)
            cap *= 2;
        uint8_t *n = realloc(b->p, cap);
        if (!n) return MT_NOMEM;
        b->p = n;
        b->cap = cap;
    }
    if (len) memcpy(b->p, p, len);
    b->len = len;
    return MT_OK;
}

/* RocksDB error -> mt_err_t (the message is freed). */
static mt_err_t rerr_of(char *rerr) {
    if (!rerr) return MT_OK;
    mt_err_t e = strstr(rerr, "Corruption") ? MT_CORRUPT : MT_IO;
    rocksdb_free(rerr);
    return e;
}

/* An iterator over the keys below @p hi (@p hi must outlive it), with its read options. */
static rocksdb_iterator_t *iter_open(mt_joiner_t *j, const void *hi, size_t hilen,
                                     rocksdb_readoptions_t **ro) {
    *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_iterate_upper_bound(*ro, (const char *)hi, hilen);
    return rocksdb_create_iterator(j->db, *ro);
}

/* The first error of a scan: the caller's @p err, else the iterator's. */
static mt_err_t iter_error(rocksdb_iterator_t *it, mt_err_t err) {
    char *rerr = NULL;
    rocksdb_iter_get_error(it, &rerr);
    if (!err) return rerr_of(rerr);
    rocksdb_free(rerr);
    return err;
}

static void iter_close(rocksdb_iterator_t *it, rocksdb_readoptions_t *ro) {
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
}

/* ============================== keys ============================== */

/* prefix + request id + '\0' + be64(item); @returns the length. */
static size_t key_make(uint8_t *k, char type, const char *rid, size_t rlen, uint64_t item) {
    k[0] = (uint8_t)type;
    memcpy(k + 1, rid, rlen);
    k[1 + rlen] = 0;
    put_be64(k + 2 + rlen, item);
    return 10 + rlen;
}

/* prefix + be64t(t) + request id + '\0' + be64(item). */
static size_t tkey_make(uint8_t *k, char type, int64_t t, const char *rid, size_t rlen,
                        uint64_t item) {
    k[0] = (uint8_t)type;
    put_be64(k + 1, bias(t));
    memcpy(k + 9, rid, rlen);
    k[9 + rlen] = 0;
    put_be64(k + 10 + rlen, item);
    return 18 + rlen;
}

/* Splits a time key. @returns 0, or -1 if malformed. */
static int tkey_parse(const uint8_t *k, size_t len, int64_t *t, const char **rid, size_t *rlen,
                      uint64_t *item) {
    if (len < 18 || len - 18 > MT_JOINER_MAX_REQUEST_ID || k[len - 9] != 0) return -1;
    *t = unbias(get_be64(k + 1));
    *rid = (const char *)k + 9;
    *rlen = len - 18;
    *item = get_be64(k + len - 8);
    return 0;
}

/* ============================== state records ============================== */

static void put_meta(mt_joiner_t *j) {
    uint8_t m[56];
    memset(m, 0, sizeof(m));
    m[0] = j->cfg.ntasks > 1 ? META_VERSION_MT : META_VERSION;
    for (uint32_t t = 0; t < j->cfg.ntasks; t++)
        m[4 + t] = (uint8_t)j->cfg.task_actions[t];
    mt_put_le(m + 8, (uint64_t)j->watermark, 8);
    mt_put_le(m + 16, (uint64_t)j->max_event, 8);
    mt_put_le(m + 24, j->pending, 8);
    mt_put_le(m + 32, j->early, 8);
    mt_put_le(m + 40, j->tombstones, 8);
    mt_put_le(m + 48, j->next_seq, 8);
    rocksdb_writebatch_put(j->wb, "M", 1, (const char *)m, sizeof(m));
}

static mt_err_t write_batch(mt_joiner_t *j, int sync) {
    char *rerr = NULL;
    put_meta(j);
    rocksdb_write(j->db, sync ? j->wo_sync : j->wo, j->wb, &rerr);
    rocksdb_writebatch_clear(j->wb);
    return rerr_of(rerr);
}

/* Reads @p key into j->val. *found = 0 when absent. */
static mt_err_t db_get(mt_joiner_t *j, const uint8_t *key, size_t klen, int *found) {
    char *rerr = NULL;
    size_t vlen = 0;
    char *v = rocksdb_get(j->db, j->ro, (const char *)key, klen, &vlen, &rerr);
    if (rerr) return rerr_of(rerr);
    *found = v != NULL;
    mt_err_t e = v ? buf_set(&j->val, v, vlen) : MT_OK;
    rocksdb_free(v);
    return e;
}

/* 'K' topic '\0' be32(partition); @returns its length, 0 for a topic name over 249 bytes. */
static size_t pos_key(uint8_t *k, const char *topic, int32_t partition) {
    size_t tl = strlen(topic);
    if (tl > 249) return 0;
    k[0] = 'K';
    memcpy(k + 1, topic, tl);
    k[1 + tl] = 0;
    for (int i = 0; i < 4; i++)
        k[2 + tl + i] = (uint8_t)((uint32_t)partition >> (24 - 8 * i));
    return tl + 6;
}

static position_t *position_of(mt_joiner_t *j, const char *topic, int32_t partition,
                               mt_err_t *err) {
    *err = MT_OK;
    for (size_t i = 0; i < j->npos; i++)
        if (j->pos[i].partition == partition && !strcmp(j->pos[i].topic, topic)) return &j->pos[i];
    if (j->npos == j->pos_cap) {
        size_t cap = j->pos_cap ? 2 * j->pos_cap : 16;
        position_t *n = realloc(j->pos, cap * sizeof(*n));
        if (!n) {
            *err = MT_NOMEM;
            return NULL;
        }
        j->pos = n;
        j->pos_cap = cap;
    }
    position_t *p = &j->pos[j->npos];
    if (!(p->topic = strdup(topic))) {
        *err = MT_NOMEM;
        return NULL;
    }
    p->partition = partition;
    p->next = -1;
    p->max_ts = INT64_MIN;
    p->last_ms = j->clock(j->opaque);
    uint8_t k[256 + 6];
    size_t kl = pos_key(k, topic, partition);
    int found = 0;
    if (!kl) {
        free(p->topic);
        *err = MT_INVALID;
        return NULL;
    }
    *err = db_get(j, k, kl, &found);
    if (*err) {
        free(p->topic);
        return NULL;
    }
    if (found && j->val.len == 16) {
        p->next = (int64_t)mt_get_le(j->val.p, 8);
        p->max_ts = (int64_t)mt_get_le(j->val.p + 8, 8);
    }
    j->npos++;
    return p;
}

static void put_position(mt_joiner_t *j, const position_t *p) {
    uint8_t k[256 + 6], v[16];
    size_t kl = pos_key(k, p->topic, p->partition);
    mt_put_le(v, (uint64_t)p->next, 8);
    mt_put_le(v + 8, (uint64_t)p->max_ts, 8);
    rocksdb_writebatch_put(j->wb, (const char *)k, kl, (const char *)v, 16);
}

/* ============================== the cache ============================== */

static uint64_t key_hash(const char *rid, size_t rlen, uint64_t item) {
    return XXH3_64bits_withSeed(rid, rlen, item);
}

static centry_t *cache_find(mt_joiner_t *j, const char *rid, size_t rlen, uint64_t item,
                            uint64_t h) {
    if (!j->nbuckets) return NULL;
    for (centry_t *e = j->buckets[h & (j->nbuckets - 1)]; e; e = e->hnext)
        if (e->hash == h && e->item == item && e->rid_len == rlen && !memcmp(e->data, rid, rlen))
            return e;
    return NULL;
}

static void cache_unlink(mt_joiner_t *j, centry_t *e) {
    centry_t **pp = &j->buckets[e->hash & (j->nbuckets - 1)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    if (e->older)
        e->older->newer = e->newer;
    else
        j->oldest = e->newer;
    if (e->newer)
        e->newer->older = e->older;
    else
        j->newest = e->older;
    j->ncached--;
    free(e);
}

static void cache_remove(mt_joiner_t *j, const char *rid, size_t rlen, uint64_t item) {
    centry_t *e = cache_find(j, rid, rlen, item, key_hash(rid, rlen, item));
    if (e) cache_unlink(j, e);
}

/* Best effort: a failed allocation only means a miss later. */
static void cache_insert(mt_joiner_t *j, const char *rid, size_t rlen, uint64_t item, int64_t ts,
                         const void *raw, size_t len, uint32_t labels) {
    if (j->cfg.max_pending_memory == 0) return;
    while (j->ncached >= j->cfg.max_pending_memory && j->oldest) {
        cache_unlink(j, j->oldest);
        j->st.memory_evictions++;
    }
    if (j->ncached + 1 > j->nbuckets) {
        size_t nb = j->nbuckets ? 2 * j->nbuckets : 1024;
        centry_t **b = calloc(nb, sizeof(*b));
        if (!b) return;
        for (size_t i = 0; i < j->nbuckets; i++) {
            for (centry_t *e = j->buckets[i], *next; e; e = next) {
                next = e->hnext;
                e->hnext = b[e->hash & (nb - 1)];
                b[e->hash & (nb - 1)] = e;
            }
        }
        free(j->buckets);
        j->buckets = b;
        j->nbuckets = nb;
    }
    centry_t *e = malloc(sizeof(*e) + rlen + len);
    if (!e) return;
    e->hash = key_hash(rid, rlen, item);
    e->item = item;
    e->ts = ts;
    e->rid_len = (uint32_t)rlen;
    e->len = (uint32_t)len;
    e->labels = labels;
    memcpy(e->data, rid, rlen);
    memcpy(e->data + rlen, raw, len);
    e->hnext = j->buckets[e->hash & (j->nbuckets - 1)];
    j->buckets[e->hash & (j->nbuckets - 1)] = e;
    e->older = j->newest;
    e->newer = NULL;
    if (j->newest)
        j->newest->newer = e;
    else
        j->oldest = e;
    j->newest = e;
    j->ncached++;
}

static void cache_free(mt_joiner_t *j) {
    for (centry_t *e = j->oldest, *n; e; e = n) {
        n = e->newer;
        free(e);
    }
    free(j->buckets);
    j->buckets = NULL;
    j->oldest = j->newest = NULL;
    j->nbuckets = j->ncached = 0;
}

/* The labels seen of pending impression (rid, item): its cache entry's, else its 'A' record
 * (absent: 0; one task: always 0). Leaves j->val alone (it may hold the impression). */
static mt_err_t labels_get(mt_joiner_t *j, const char *rid, size_t rlen, uint64_t item,
                           uint32_t *labels) {
    *labels = 0;
    if (j->cfg.ntasks == 1) return MT_OK;
    centry_t *e = cache_find(j, rid, rlen, item, key_hash(rid, rlen, item));
    if (e) {
        *labels = e->labels;
        return MT_OK;
    }
    uint8_t k[KEY_MAX];
    size_t kl = key_make(k, 'A', rid, rlen, item), vlen = 0;
    char *rerr = NULL;
    char *v = rocksdb_get(j->db, j->ro, (const char *)k, kl, &vlen, &rerr);
    if (rerr) return rerr_of(rerr);
    mt_err_t err = MT_OK;
    if (v && (vlen != 1 || ((uint8_t)v[0] & ~j->all_labels)))
        err = MT_CORRUPT;
    else if (v)
        *labels = (uint8_t)v[0];
    rocksdb_free(v);
    return err;
}

/* Records the labels seen of pending impression (rid, item) (not 0: several tasks only). */
static void labels_put(mt_joiner_t *j, const char *rid, size_t rlen, uint64_t item,
                       uint32_t labels) {
    uint8_t k[KEY_MAX], v = (uint8_t)labels;
    size_t kl = key_make(k, 'A', rid, rlen, item);
    rocksdb_writebatch_put(j->wb, (const char *)k, kl, (const char *)&v, 1);
    centry_t *e = cache_find(j, rid, rlen, item, key_hash(rid, rlen, item));
    if (e) e->labels = labels;
}

/* A pending impression: *found, and its time, labels seen and bytes (into j->val). */
static mt_err_t pending_get(mt_joiner_t *j, const char *rid, size_t rlen, uint64_t item, int *found,
                            int64_t *ts, uint32_t *labels) {
    centry_t *e = cache_find(j, rid, rlen, item, key_hash(rid, rlen, item));
    if (e) {
        *found = 1;
        *ts = e->ts;
        *labels = e->labels;
        return buf_set(&j->val, e->data + rlen, e->len);
    }
    uint8_t k[KEY_MAX];
    size_t kl = key_make(k, 'P', rid, rlen, item);
    mt_err_t err = db_get(j, k, kl, found);
    if (err || !*found) return err;
    j->st.memory_misses++;
    if (j->val.len < 8) return MT_CORRUPT;
    *ts = (int64_t)mt_get_le(j->val.p, 8);
    memmove(j->val.p, j->val.p + 8, j->val.len - 8);
    j->val.len -= 8;
    return labels_get(j, rid, rlen, item, labels);
}

/* ============================== examples ============================== */

static int cmp_slot(const void *a, const void *b) {
    const Monolith__V1__SlotFids *x = *(Monolith__V1__SlotFids *const *)a;
    const Monolith__V1__SlotFids *y = *(Monolith__V1__SlotFids *const *)b;
    return x->slot < y->slot ? -1 : x->slot > y->slot;
}

/* Checks an Impression's slots: every fid of its slot, not too many. */
static int impression_ok(const Monolith__V1__Impression *im, char *why, size_t whylen) {
    size_t total = 0;
    for (int side = 0; side < 2; side++) {
        size_t n = side ? im->n_item : im->n_user;
        Monolith__V1__SlotFids **s = side ? im->item : im->user;
        for (size_t i = 0; i < n; i++) {
            if (s[i]->slot > 65535) {
                mt_msgf(why, whylen, "slot %u above 65535", s[i]->slot);
                return 0;
            }
            for (size_t f = 0; f < s[i]->n_fids; f++) {
                if (s[i]->fids[f] >> 48 != s[i]->slot) {
                    mt_msgf(why, whylen, "fid 0x%016" PRIx64 " is not of its slot %u",
                            s[i]->fids[f], s[i]->slot);
                    return 0;
                }
            }
            total += s[i]->n_fids;
        }
    }
    if (total > MAX_SLOTS_FIDS) {
        mt_msgf(why, whylen, "%zu fids: more than %u", total, MAX_SLOTS_FIDS);
        return 0;
    }
    return 1;
}

/* The Example of impression @p raw with @p nlabels labels: user and item slots merged (one
 * SlotFids per slot, fids of a slot on both sides concatenated without repeats), sorted by
 * slot. */
static mt_err_t make_example(const void *raw, size_t rawlen, float *labels, size_t nlabels,
                             float rate, uint8_t **out, size_t *outlen) {
    Monolith__V1__Impression *im = monolith__v1__impression__unpack(NULL, rawlen, raw);
    if (!im) return MT_CORRUPT;
    mt_err_t err = MT_NOMEM;
    size_t ns = im->n_user + im->n_item, nout = 0;
    Monolith__V1__SlotFids **all = calloc(ns ? ns : 1, sizeof(*all));
    Monolith__V1__SlotFids *merged = calloc(ns ? ns : 1, sizeof(*merged));
    Monolith__V1__SlotFids **ptrs = calloc(ns ? ns : 1, sizeof(*ptrs));
    uint64_t *fids = NULL;
    size_t nf = 0;
    if (!all || !merged || !ptrs) goto out;
    for (size_t i = 0; i < im->n_user; i++)
        all[i] = im->user[i];
    for (size_t i = 0; i < im->n_item; i++)
        all[im->n_user + i] = im->item[i];
    for (size_t i = 0; i < ns; i++)
        nf += all[i]->n_fids;
    if (!(fids = malloc((nf ? nf : 1) * sizeof(*fids)))) goto out;
    qsort(all, ns, sizeof(*all), cmp_slot);
    size_t used = 0;
    for (size_t i = 0; i < ns;) {
        size_t k = i, start = used;
        while (k < ns && all[k]->slot == all[i]->slot) {
            for (size_t f = 0; f < all[k]->n_fids; f++) {
                uint64_t v = all[k]->fids[f];
                int dup = 0;
                if (k > i) { /* only a second side can repeat a fid of the first */
                    for (size_t q = start; q < used && !dup; q++)
                        dup = fids[q] == v;
                }
                if (!dup) fids[used++] = v;
            }
            k++;
        }
        monolith__v1__slot_fids__init(&merged[nout]);
        merged[nout].slot = all[i]->slot;
        merged[nout].n_fids = used - start;
        merged[nout].fids = fids + start;
        ptrs[nout] = &merged[nout];
        nout++;
        i = k;
    }
    Monolith__V1__Example ex = MONOLITH__V1__EXAMPLE__INIT;
    ex.request_id = im->request_id;
    ex.timestamp_ms = im->timestamp_ms;
    ex.n_labels = nlabels;
    ex.labels = labels;
    ex.n_slots = nout;
    ex.slots = ptrs;
    ex.sample_rate = rate;
    size_t len = monolith__v1__example__get_packed_size(&ex);
    uint8_t *b = malloc(len ? len : 1);
    if (!b) goto out;
    monolith__v1__example__pack(&ex, b);
    *out = b;
    *outlen = len;
    err = MT_OK;
out:
    free(all);
    free(merged);
    free(ptrs);
    free(fids);
    monolith__v1__impression__free_unpacked(im, NULL);
    return err;
}

/* Deterministic negative sampling: keep iff hash(request id, item, seed) < rate. */
static int keep_negative(const mt_joiner_t *j, const char *rid, size_t rlen, uint64_t item) {
    if (j->cfg.negative_rate >= 1.0) return 1;
    uint64_t h = XXH3_64bits_withSeed(rid, rlen, j->cfg.seed ^ (item * 0x9e3779b97f4a7c15ull));
    return (double)(h >> 11) * 0x1.0p-53 < j->cfg.negative_rate;
}

static mt_err_t outbox_push(mt_joiner_t *j, uint64_t seq, const char *rid, size_t rlen,
                            uint32_t labels, const uint8_t *ex, size_t len) {
    if (j->ohead + j->ocount == j->ocap) {
        if (j->ohead) {
            memmove(j->ob, j->ob + j->ohead, j->ocount * sizeof(*j->ob));
            j->ohead = 0;
        }
        if (j->ocount == j->ocap) {
            size_t cap = j->ocap ? 2 * j->ocap : 1024;
            obox_t *n = realloc(j->ob, cap * sizeof(*n));
            if (!n) return MT_NOMEM;
            j->ob = n;
            j->ocap = cap;
        }
    }
    obox_t *o = &j->ob[j->ohead + j->ocount];
    if (!(o->buf = malloc(rlen + 1 + len))) return MT_NOMEM;
    memcpy(o->buf, rid, rlen);
    o->buf[rlen] = 0;
    memcpy(o->buf + rlen + 1, ex, len);
    o->ex.seq = seq;
    o->ex.request_id = (const char *)o->buf;
    o->ex.request_id_len = rlen;
    o->ex.value = o->buf + rlen + 1;
    o->ex.len = len;
    o->ex.label = labels != 0;
    o->ex.labels = labels;
    j->ocount++;
    return MT_OK;
}

/* Closes key (rid, item) of impression @p raw (time @p ts) with @p labels (bit t: task t's):
 * the example (unless sampled out: only an example of labels 0 can be) into the batch's
 * outbox, and a tombstone. */
static mt_err_t emit(mt_joiner_t *j, const char *rid, size_t rlen, uint64_t item, int64_t ts,
                     const void *raw, size_t rawlen, uint32_t labels) {
    mt_err_t err;
    int64_t close = sat_add(ts, j->cfg.window_ms);
    int64_t expire = sat_add(sat_add(close > j->watermark ? close : j->watermark, j->cfg.window_ms),
                             j->cfg.allowed_lateness_ms);
    uint8_t k[KEY_MAX], v[9];
    size_t kl = key_make(k, 'D', rid, rlen, item);
    v[0] = (uint8_t)labels;
    mt_put_le(v + 1, (uint64_t)expire, 8);
    rocksdb_writebatch_put(j->wb, (const char *)k, kl, (const char *)v, 9);
    kl = tkey_make(k, 'G', expire, rid, rlen, item);
    rocksdb_writebatch_put(j->wb, (const char *)k, kl, "", 0);
    j->tombstones++;
    if (!labels && !keep_negative(j, rid, rlen, item)) {
        j->st.sampled_out++;
        return MT_OK;
    }
    float rate = labels ? 1.0f : (float)j->cfg.negative_rate;
    float lv[MT_JOINER_MAX_TASKS];
    for (uint32_t t = 0; t < j->cfg.ntasks; t++)
        lv[t] = labels >> t & 1 ? 1.0f : 0.0f;
    uint8_t *ex = NULL;
    size_t len = 0;
    if ((err = make_example(raw, rawlen, lv, j->cfg.ntasks, rate, &ex, &len))) return err;
    uint8_t *ov = malloc(3 + rlen + len);
    if (!ov) {
        free(ex);
        return MT_NOMEM;
    }
    ov[0] = (uint8_t)labels;
    ov[1] = (uint8_t)rlen;
    ov[2] = (uint8_t)(rlen >> 8);
    memcpy(ov + 3, rid, rlen);
    memcpy(ov + 3 + rlen, ex, len);
    uint8_t ok[9];
    ok[0] = 'O';
    uint64_t seq = j->next_seq++;
    put_be64(ok + 1, seq);
    rocksdb_writebatch_put(j->wb, (const char *)ok, 9, (const char *)ov, 3 + rlen + len);
    free(ov);
    err = outbox_push(j, seq, rid, rlen, labels, ex, len);
    free(ex);
    if (err) return err;
    if (labels)
        j->st.positives++;
    else
        j->st.negatives++;
    for (uint32_t t = 0; t < j->cfg.ntasks; t++)
        j->st.task_positives[t] += labels >> t & 1;
    return MT_OK;
}

/* Removes pending impression (rid, item) of time @p ts and labels seen @p labels (its 'A'
 * record, if not 0) from the state. */
static void pending_delete(mt_joiner_t *j, const char *rid, size_t rlen, uint64_t item, int64_t ts,
                           uint32_t labels) {
    uint8_t k[KEY_MAX];
    size_t kl = key_make(k, 'P', rid, rlen, item);
    rocksdb_writebatch_delete(j->wb, (const char *)k, kl);
    if (labels) {
        kl = key_make(k, 'A', rid, rlen, item);
        rocksdb_writebatch_delete(j->wb, (const char *)k, kl);
    }
    kl = tkey_make(k, 'T', sat_add(ts, j->cfg.window_ms), rid, rlen, item);
    rocksdb_writebatch_delete(j->wb, (const char *)k, kl);
    cache_remove(j, rid, rlen, item);
    j->pending--;
}

/* Removes early action (rid, item) of time @p ts. */
static void early_delete(mt_joiner_t *j, const char *rid, size_t rlen, uint64_t item, int64_t ts) {
    uint8_t k[KEY_MAX];
    size_t kl = key_make(k, 'E', rid, rlen, item);
    rocksdb_writebatch_delete(j->wb, (const char *)k, kl);
    kl = tkey_make(k, 'F', sat_add(ts, j->cfg.window_ms), rid, rlen, item);
    rocksdb_writebatch_delete(j->wb, (const char *)k, kl);
    j->early--;
}

/* An early record ('E'): the actions of one key that came before its impression. */
typedef struct early {
    int64_t ts;                      /* the latest action's time ('F' at ts + window) */
    uint32_t labels;                 /* the tasks whose action is here */
    int64_t at[MT_JOINER_MAX_TASKS]; /* each task's action time (INT64_MIN: none) */
} early_t;

/* Parses early record @p v. @returns 0, or -1 if malformed. */
static int early_parse(const mt_joiner_t *j, const uint8_t *v, size_t len, early_t *e) {
    uint32_t nt = j->cfg.ntasks;
    if (nt == 1) { /* i64 ts, u8 type, 3 bytes */
        if (len < 8) return -1;
        e->ts = e->at[0] = (int64_t)mt_get_le(v, 8);
        e->labels = 1;
        return 0;
    }
    if (len != 12 + 8 * (size_t)nt) return -1;
    e->ts = (int64_t)mt_get_le(v, 8);
    e->labels = (uint32_t)mt_get_le(v + 8, 4);
    if (!e->labels || (e->labels & ~j->all_labels)) return -1;
    for (uint32_t t = 0; t < nt; t++)
        e->at[t] = (int64_t)mt_get_le(v + 12 + 8 * t, 8);
    return 0;
}

/* Writes early record @p e under key @p k (its 'F' entry is the caller's); @p type: the
 * action's type, kept by the one-task layout. */
static void early_put(mt_joiner_t *j, const uint8_t *k, size_t kl, const early_t *e,
                      uint32_t type) {
    uint8_t v[12 + 8 * MT_JOINER_MAX_TASKS];
    size_t n = 12;
    mt_put_le(v, (uint64_t)e->ts, 8);
    if (j->cfg.ntasks == 1) {
        v[8] = (uint8_t)type;
        v[9] = v[10] = v[11] = 0;
    } else {
        mt_put_le(v + 8, e->labels, 4);
        for (uint32_t t = 0; t < j->cfg.ntasks; t++, n += 8)
            mt_put_le(v + n, (uint64_t)e->at[t], 8);
    }
    rocksdb_writebatch_put(j->wb, (const char *)k, kl, (const char *)v, n);
}

/* The actions held by early record (rid, item), for the counters: 1 with one task. */
static mt_err_t early_count(mt_joiner_t *j, const char *rid, size_t rlen, uint64_t item,
                            uint64_t *n) {
    *n = 1;
    if (j->cfg.ntasks == 1) return MT_OK;
    uint8_t k[KEY_MAX];
    size_t kl = key_make(k, 'E', rid, rlen, item);
    int found = 0;
    early_t e;
    mt_err_t err = db_get(j, k, kl, &found);
    if (!err && found && !early_parse(j, j->val.p, j->val.len, &e)) *n = popcount(e.labels);
    return err;
}

/* Scans keys with prefix @p type rid '\0': up to 2 items into @p items (and the first value
 * into j->val). @returns the count seen (capped at 2). */
static mt_err_t prefix_scan(mt_joiner_t *j, char type, const char *rid, size_t rlen,
                            uint64_t *items, size_t *n) {
    uint8_t lo[KEY_MAX], hi[KEY_MAX];
    lo[0] = hi[0] = (uint8_t)type;
    memcpy(lo + 1, rid, rlen);
    memcpy(hi + 1, rid, rlen);
    lo[1 + rlen] = 0;
    hi[1 + rlen] = 1;
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = iter_open(j, hi, rlen + 2, &ro);
    mt_err_t err = MT_OK;
    *n = 0;
    for (rocksdb_iter_seek(it, (const char *)lo, rlen + 2); rocksdb_iter_valid(it) && *n < 2;
         rocksdb_iter_next(it)) {
        size_t kl, vl;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &kl);
        if (kl != rlen + 10) continue;
        items[*n] = get_be64(k + rlen + 2);
        if (*n == 0) {
            const char *v = rocksdb_iter_value(it, &vl);
            if ((err = buf_set(&j->val, v, vl))) break;
        }
        (*n)++;
    }
    err = iter_error(it, err);
    iter_close(it, ro);
    return err;
}

/* ============================== the join ============================== */

static void see_event(mt_joiner_t *j, int64_t ts) {
    if (ts > j->max_event) j->max_event = ts;
    if (j->cur && ts > j->cur->max_ts) j->cur->max_ts = ts;
}

/* Drops the oldest early action (bound reached). */
static mt_err_t early_drop_oldest(mt_joiner_t *j) {
    uint8_t lo[9], hi[1] = {'G'};
    lo[0] = 'F';
    put_be64(lo + 1, bias(j->watermark));
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = iter_open(j, hi, 1, &ro);
    rocksdb_iter_seek(it, (const char *)lo, 9);
    mt_err_t err = MT_OK;
    if (rocksdb_iter_valid(it)) {
        size_t kl;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &kl);
        int64_t t;
        const char *rid;
        size_t rlen;
        uint64_t item;
        uint64_t n = 0;
        if (tkey_parse(k, kl, &t, &rid, &rlen, &item) == 0 &&
            !(err = early_count(j, rid, rlen, item, &n))) {
            early_delete(j, rid, rlen, item, t - j->cfg.window_ms);
            j->st.early_dropped += n;
        }
    }
    err = iter_error(it, err);
    iter_close(it, ro);
    return err;
}

static mt_err_t add_impression(mt_joiner_t *j, const Monolith__V1__Impression *im, const void *raw,
                               size_t len, mt_joiner_outcome_t *oc) {
    const char *rid = im->request_id;
    size_t rlen = strlen(rid);
    uint64_t item = im->item_id;
    int64_t ts = im->timestamp_ms;
    int found = 0;
    int64_t t2;
    uint32_t l2, labels = 0;
    mt_err_t err;
    uint8_t k[KEY_MAX];
    size_t kl;
    j->st.impressions++;
    see_event(j, ts);
    if ((err = pending_get(j, rid, rlen, item, &found, &t2, &l2))) return err;
    if (!found) {
        kl = key_make(k, 'D', rid, rlen, item);
        if ((err = db_get(j, k, kl, &found))) return err;
    }
    if (found) {
        j->st.duplicate_impressions++;
        *oc = MT_JOINER_DUPLICATE;
        return MT_OK;
    }
    int64_t close = sat_add(ts, j->cfg.window_ms);
    /* early actions of this item, then of the request (item 0): each task's action within
     * this impression's window labels it; the others wait on */
    for (int pass = 0; pass < (item ? 2 : 1) && labels != j->all_labels; pass++) {
        uint64_t ai = pass ? 0 : item;
        early_t e;
        kl = key_make(k, 'E', rid, rlen, ai);
        if ((err = db_get(j, k, kl, &found))) return err;
        if (!found || early_parse(j, j->val.p, j->val.len, &e)) continue;
        uint32_t claim = 0;
        for (uint32_t t = 0; t < j->cfg.ntasks; t++)
            if ((e.labels & ~labels) >> t & 1 && e.at[t] <= close) claim |= 1u << t;
        if (!claim) continue; /* outside this impression's window */
        labels |= claim;
        j->st.early_joined += popcount(claim);
        if (claim == e.labels) {
            early_delete(j, rid, rlen, ai, e.ts);
            continue;
        }
        e.labels &= ~claim; /* its 'F' entry stays: the record expires with its latest */
        for (uint32_t t = 0; t < j->cfg.ntasks; t++)
            if (claim >> t & 1) e.at[t] = INT64_MIN;
        early_put(j, k, kl, &e, 0);
    }
    if (labels == j->all_labels) {
        j->st.closed_early++;
        *oc = MT_JOINER_JOINED;
        return emit(j, rid, rlen, item, ts, raw, len, labels);
    }
    if (close < j->watermark) {
        j->st.late_impressions++;
        *oc = MT_JOINER_LATE_IMPRESSION;
        return emit(j, rid, rlen, item, ts, raw, len, labels);
    }
    uint8_t *v = malloc(8 + len);
    if (!v) return MT_NOMEM;
    mt_put_le(v, (uint64_t)ts, 8);
    memcpy(v + 8, raw, len);
    kl = key_make(k, 'P', rid, rlen, item);
    rocksdb_writebatch_put(j->wb, (const char *)k, kl, (const char *)v, 8 + len);
    free(v);
    kl = tkey_make(k, 'T', close, rid, rlen, item);
    rocksdb_writebatch_put(j->wb, (const char *)k, kl, "", 0);
    if (labels) labels_put(j, rid, rlen, item, labels);
    cache_insert(j, rid, rlen, item, ts, raw, len, labels);
    j->pending++;
    *oc = MT_JOINER_PENDING;
    return MT_OK;
}

/* Joins action (time ats, task @p task) with pending impression (rid, item) of time @p its and
 * labels seen @p labels, read by pending_get(): with every task's label it closes. */
static mt_err_t join_pending(mt_joiner_t *j, const char *rid, size_t rlen, uint64_t item,
                             int64_t its, uint32_t labels, int64_t ats, uint32_t task,
                             mt_joiner_outcome_t *oc) {
    if (ats > sat_add(its, j->cfg.window_ms)) {
        j->st.late_actions++;
        *oc = MT_JOINER_LATE_ACTION;
        return MT_OK;
    }
    uint32_t bit = 1u << task;
    if (labels & bit) { /* several tasks: this task's action came before */
        j->st.duplicate_actions++;
        *oc = MT_JOINER_DUPLICATE;
        return MT_OK;
    }
    if ((labels | bit) != j->all_labels) { /* the other tasks' actions may come */
        labels_put(j, rid, rlen, item, labels | bit);
        *oc = MT_JOINER_LABELLED;
        return MT_OK;
    }
    /* j->val holds the impression (emit() does not use it) */
    pending_delete(j, rid, rlen, item, its, labels);
    j->st.closed_early++;
    *oc = MT_JOINER_JOINED;
    return emit(j, rid, rlen, item, its, j->val.p, j->val.len, labels | bit);
}

/* The task of action type @p type, or -1. An unspecified type is the click (the only
 * action before types were told apart). */
static int task_of(const mt_joiner_t *j, uint32_t type) {
    if (type == MONOLITH__V1__ACTION_TYPE__ACTION_UNSPECIFIED)
        type = MONOLITH__V1__ACTION_TYPE__ACTION_CLICK;
    for (uint32_t t = 0; t < j->cfg.ntasks; t++)
        if (j->cfg.task_actions[t] == type) return (int)t;
    return -1;
}

static mt_err_t add_action(mt_joiner_t *j, const Monolith__V1__Action *a, mt_joiner_outcome_t *oc) {
    const char *rid = a->request_id;
    size_t rlen = strlen(rid);
    uint64_t item = a->item_id;
    int64_t ats = a->timestamp_ms;
    int found = 0;
    int64_t its = 0;
    uint32_t labels = 0;
    mt_err_t err;
    uint8_t k[KEY_MAX];
    size_t kl;
    j->st.actions++;
    see_event(j, ats);
    int task = task_of(j, (uint32_t)a->type);
    if (task < 0) {
        j->st.no_task_actions++;
        *oc = MT_JOINER_IGNORED;
        return MT_OK;
    }
    uint32_t bit = 1u << task;
    if (item) {
        if ((err = pending_get(j, rid, rlen, item, &found, &its, &labels))) return err;
        if (found) return join_pending(j, rid, rlen, item, its, labels, ats, (uint32_t)task, oc);
        /* an impression logged without its item id */
        if ((err = pending_get(j, rid, rlen, 0, &found, &its, &labels))) return err;
        if (found) return join_pending(j, rid, rlen, 0, its, labels, ats, (uint32_t)task, oc);
        kl = key_make(k, 'D', rid, rlen, item);
        if ((err = db_get(j, k, kl, &found))) return err;
    } else {
        uint64_t items[2];
        size_t n = 0;
        if ((err = prefix_scan(j, 'P', rid, rlen, items, &n))) return err;
        if (n == 2) {
            j->st.ambiguous_actions++;
            *oc = MT_JOINER_AMBIGUOUS;
            return MT_OK;
        }
        if (n == 1) {
            if (j->val.len < 8) return MT_CORRUPT;
            its = (int64_t)mt_get_le(j->val.p, 8);
            memmove(j->val.p, j->val.p + 8, j->val.len - 8);
            j->val.len -= 8;
            if ((err = labels_get(j, rid, rlen, items[0], &labels))) return err;
            return join_pending(j, rid, rlen, items[0], its, labels, ats, (uint32_t)task, oc);
        }
        if ((err = prefix_scan(j, 'D', rid, rlen, items, &n))) return err;
        found = n > 0;
    }
    if (found) { /* closed already: a repeat of an action that labelled it, or late */
        if (j->val.len >= 1 && (j->val.p[0] & bit)) {
            j->st.duplicate_actions++;
            *oc = MT_JOINER_DUPLICATE;
        } else {
            j->st.late_actions++;
            *oc = MT_JOINER_LATE_ACTION;
        }
        return MT_OK;
    }
    int64_t expire = sat_add(ats, j->cfg.window_ms);
    if (expire < j->watermark) { /* any impression it could join has closed */
        j->st.late_actions++;
        *oc = MT_JOINER_LATE_ACTION;
        return MT_OK;
    }
    early_t e;
    uint8_t fk[KEY_MAX];
    size_t fl;
    kl = key_make(k, 'E', rid, rlen, item);
    if ((err = db_get(j, k, kl, &found))) return err;
    if (found) {
        if (j->cfg.ntasks == 1 || early_parse(j, j->val.p, j->val.len, &e) || (e.labels & bit)) {
            j->st.duplicate_actions++;
            *oc = MT_JOINER_DUPLICATE;
            return MT_OK;
        }
        /* another task's action of the key joins its record; the latest sets the expiry */
        e.labels |= bit;
        e.at[task] = ats;
        if (ats > e.ts) {
            fl = tkey_make(fk, 'F', sat_add(e.ts, j->cfg.window_ms), rid, rlen, item);
            rocksdb_writebatch_delete(j->wb, (const char *)fk, fl);
            fl = tkey_make(fk, 'F', expire, rid, rlen, item);
            rocksdb_writebatch_put(j->wb, (const char *)fk, fl, "", 0);
            e.ts = ats;
        }
        early_put(j, k, kl, &e, 0);
        j->st.early_actions++;
        *oc = MT_JOINER_EARLY;
        return MT_OK;
    }
    if (j->early >= j->cfg.max_early_actions && (err = early_drop_oldest(j))) return err;
    e.ts = ats;
    e.labels = bit;
    for (uint32_t t = 0; t < MT_JOINER_MAX_TASKS; t++)
        e.at[t] = INT64_MIN;
    e.at[task] = ats;
    early_put(j, k, kl, &e, (uint32_t)a->type);
    fl = tkey_make(fk, 'F', expire, rid, rlen, item);
    rocksdb_writebatch_put(j->wb, (const char *)fk, fl, "", 0);
    j->early++;
    j->st.early_actions++;
    *oc = MT_JOINER_EARLY;
    return MT_OK;
}

/* Validates the request id of a message. */
static int rid_ok(const char *rid, char *why, size_t whylen) {
    size_t n = strlen(rid);
    if (n == 0) {
        mt_msgf(why, whylen, "empty request_id");
        return 0;
    }
    if (n > MT_JOINER_MAX_REQUEST_ID) {
        mt_msgf(why, whylen, "request_id of %zu bytes (at most %u)", n, MT_JOINER_MAX_REQUEST_ID);
        return 0;
    }
    return 1;
}

/* Closes every entry of index @p type with a time below the watermark, from @p from on. */
static mt_err_t close_range(mt_joiner_t *j, char type, int64_t from, uint64_t *closed) {
    uint8_t lo[9], hi[9];
    lo[0] = hi[0] = (uint8_t)type;
    put_be64(lo + 1, bias(from));
    put_be64(hi + 1, bias(j->watermark));
    mt_err_t err = MT_OK;
    for (;;) {
        rocksdb_readoptions_t *ro;
        rocksdb_iterator_t *it = iter_open(j, hi, 9, &ro);
        size_t done = 0;
        for (rocksdb_iter_seek(it, (const char *)lo, 9); rocksdb_iter_valid(it) && !err;
             rocksdb_iter_next(it)) {
            size_t kl;
            const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &kl);
            int64_t t;
            const char *rid;
            size_t rlen;
            uint64_t item;
            if (tkey_parse(k, kl, &t, &rid, &rlen, &item)) {
                rocksdb_writebatch_delete(j->wb, (const char *)k, kl);
                continue;
            }
            if (type == 'T') {
                int found = 0;
                int64_t ts = 0;
                uint32_t labels = 0;
                if ((err = pending_get(j, rid, rlen, item, &found, &ts, &labels))) break;
                if (!found) { /* an index entry without its record: drop it */
                    rocksdb_writebatch_delete(j->wb, (const char *)k, kl);
                    continue;
                }
                pending_delete(j, rid, rlen, item, ts, labels);
                err = emit(j, rid, rlen, item, ts, j->val.p, j->val.len, labels);
                if (closed) (*closed)++;
            } else if (type == 'F') {
                uint64_t n = 0;
                if ((err = early_count(j, rid, rlen, item, &n))) break;
                early_delete(j, rid, rlen, item, t - j->cfg.window_ms);
                j->st.early_expired += n;
            } else { /* 'G' */
                uint8_t dk[KEY_MAX];
                size_t dl = key_make(dk, 'D', rid, rlen, item);
                rocksdb_writebatch_delete(j->wb, (const char *)dk, dl);
                rocksdb_writebatch_delete(j->wb, (const char *)k, kl);
                j->tombstones--;
            }
            if (++done == CLOSE_BATCH) break;
        }
        err = iter_error(it, err);
        if (!err && done == CLOSE_BATCH && rocksdb_iter_valid(it)) {
            size_t kl;
            const char *k = rocksdb_iter_key(it, &kl);
            memcpy(lo, k, 9); /* resume at this time (its keys are not yet done) */
        } else {
            done = 0;
        }
        iter_close(it, ro);
        if (err) return err;
        if (rocksdb_writebatch_count(j->wb) && (err = write_batch(j, 0))) return err;
        if (!done) return MT_OK;
    }
}

static mt_err_t advance(mt_joiner_t *j, int64_t wm, uint64_t *closed) {
    if (closed) *closed = 0;
    if (wm <= j->watermark) return MT_OK;
    int64_t from = j->watermark;
    j->watermark = wm;
    mt_err_t err;
    if ((err = close_range(j, 'T', from, closed))) return err;
    if ((err = close_range(j, 'F', from, NULL))) return err;
    return close_range(j, 'G', from, NULL);
}

/* ============================== public API ============================== */

void mt_joiner_config_init(mt_joiner_config_t *cfg) {
    cfg->window_ms = 30 * 60 * 1000;
    cfg->allowed_lateness_ms = 10 * 1000;
    cfg->idle_advance_ms = 5000;
    cfg->negative_rate = 1.0;
    cfg->seed = 1;
    cfg->max_pending_memory = 1000000;
    cfg->max_early_actions = 1000000;
    cfg->sync = 1;
    cfg->write_buffer_mb = 64;
    cfg->block_cache_mb = 8;
    memset(cfg->task_actions, 0, sizeof(cfg->task_actions));
    cfg->task_actions[0] = MONOLITH__V1__ACTION_TYPE__ACTION_CLICK;
    cfg->ntasks = 1;
}

mt_err_t mt_joiner_config_validate(const mt_joiner_config_t *cfg, char *errbuf, size_t errlen) {
    if (!cfg) return MT_INVALID;
    if (cfg->window_ms < 1) {
        mt_msgf(errbuf, errlen, "window_ms: %" PRId64 " (at least 1)", cfg->window_ms);
        return MT_CONFIG;
    }
    if (cfg->allowed_lateness_ms < 0 || cfg->idle_advance_ms < 0) {
        mt_msgf(errbuf, errlen, "allowed_lateness_ms and idle_advance_ms must be >= 0");
        return MT_CONFIG;
    }
    if (!(cfg->negative_rate > 0.0 && cfg->negative_rate <= 1.0)) {
        mt_msgf(errbuf, errlen, "negative_rate: %g (expected (0, 1])", cfg->negative_rate);
        return MT_CONFIG;
    }
    if (cfg->max_early_actions < 1) {
        mt_msgf(errbuf, errlen, "max_early_actions: at least 1");
        return MT_CONFIG;
    }
    if (cfg->write_buffer_mb < 1 || cfg->write_buffer_mb > 4096 || cfg->block_cache_mb > 65536) {
        mt_msgf(errbuf, errlen, "write_buffer_mb: %u (1..4096), block_cache_mb: %u (0..65536)",
                cfg->write_buffer_mb, cfg->block_cache_mb);
        return MT_CONFIG;
    }
    if (cfg->ntasks < 1 || cfg->ntasks > MT_JOINER_MAX_TASKS) {
        mt_msgf(errbuf, errlen, "task_actions: %u tasks (1..%u)", cfg->ntasks, MT_JOINER_MAX_TASKS);
        return MT_CONFIG;
    }
    for (uint32_t t = 0; t < cfg->ntasks; t++) {
        if (!mt_joiner_action_name(cfg->task_actions[t])) {
            mt_msgf(errbuf, errlen, "task_actions: type %u is not a task (1 click, 2 conversion)",
                    cfg->task_actions[t]);
            return MT_CONFIG;
        }
        for (uint32_t u = 0; u < t; u++) {
            if (cfg->task_actions[u] == cfg->task_actions[t]) {
                mt_msgf(errbuf, errlen, "task_actions: %s twice",
                        mt_joiner_action_name(cfg->task_actions[t]));
                return MT_CONFIG;
            }
        }
    }
    return MT_OK;
}

/* "click, conversion" from @p n action types (an unknown one as its number). */
static void tasks_text(const uint32_t *types, uint32_t n, char *out, size_t outlen) {
    size_t off = 0;
    out[0] = '\0';
    for (uint32_t t = 0; t < n && off < outlen; t++) {
        const char *name = mt_joiner_action_name(types[t]);
        int w = name ? snprintf(out + off, outlen - off, "%s%s", t ? ", " : "", name)
                     : snprintf(out + off, outlen - off, "%stype %u", t ? ", " : "", types[t]);
        if (w < 0) break;
        off += (size_t)w;
    }
}

/* Checks that meta @p m was written with the configured tasks. */
static mt_err_t check_tasks(const mt_joiner_t *j, const uint8_t *m, const char *state_dir,
                            char *errbuf, size_t errlen) {
    uint32_t stored[MT_JOINER_MAX_TASKS], n = 0;
    while (n < MT_JOINER_MAX_TASKS && m[4 + n])
        stored[n] = m[4 + n], n++;
    if (n == 0) { /* written before the tasks were recorded: the click alone */
        stored[0] = MONOLITH__V1__ACTION_TYPE__ACTION_CLICK;
        n = 1;
    }
    int same = n == j->cfg.ntasks && (n > 1) == (m[0] == META_VERSION_MT);
    for (uint32_t t = 0; same && t < n; t++)
        same = stored[t] == j->cfg.task_actions[t];
    if (same) return MT_OK;
    char was[96], now[96];
    tasks_text(stored, n, was, sizeof(was));
    tasks_text(j->cfg.task_actions, j->cfg.ntasks, now, sizeof(now));
    mt_msgf(errbuf, errlen,
            "%s: written with task_actions \"%s\", configured \"%s\": its stored labels would "
            "change meaning (keep the list, or start a new state_dir)",
            state_dir, was, now);
    return MT_MISMATCH;
}

static mt_err_t load_positions(mt_joiner_t *j) {
    const char hi[1] = {'L'};
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = iter_open(j, hi, 1, &ro);
    mt_err_t err = MT_OK;
    for (rocksdb_iter_seek(it, "K", 1); rocksdb_iter_valid(it) && !err; rocksdb_iter_next(it)) {
        size_t kl;
        const char *k = rocksdb_iter_key(it, &kl);
        if (kl < 7 || k[kl - 5] != 0) continue;
        const uint8_t *pb = (const uint8_t *)k + kl - 4;
        int32_t part =
            (int32_t)((uint32_t)pb[0] << 24 | (uint32_t)pb[1] << 16 | (uint32_t)pb[2] << 8 | pb[3]);
        position_of(j, k + 1, part, &err); /* reads the record again: a few per partition */
    }
    err = iter_error(it, err);
    iter_close(it, ro);
    return err;
}

static mt_err_t load_outbox(mt_joiner_t *j) {
    const char hi[1] = {'P'};
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = iter_open(j, hi, 1, &ro);
    mt_err_t err = MT_OK;
    for (rocksdb_iter_seek(it, "O", 1); rocksdb_iter_valid(it) && !err; rocksdb_iter_next(it)) {
        size_t kl, vl;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &kl);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vl);
        if (kl != 9 || vl < 3) {
            err = MT_CORRUPT;
            break;
        }
        size_t rlen = v[1] | (size_t)v[2] << 8;
        if (3 + rlen > vl) {
            err = MT_CORRUPT;
            break;
        }
        err = outbox_push(j, get_be64(k + 1), (const char *)v + 3, rlen, v[0] & j->all_labels,
                          v + 3 + rlen, vl - 3 - rlen);
        j->st.outbox_recovered++;
    }
    err = iter_error(it, err);
    iter_close(it, ro);
    return err;
}

mt_err_t mt_joiner_open(const char *state_dir, const mt_joiner_config_t *cfg,
                        mt_joiner_clock_fn clock, void *opaque, mt_joiner_t **out, char *errbuf,
                        size_t errlen) {
    if (!state_dir || !*state_dir || !cfg || !out) {
        mt_msgf(errbuf, errlen, "state_dir, config and out are required");
        return MT_INVALID;
    }
    mt_err_t err = mt_joiner_config_validate(cfg, errbuf, errlen);
    if (err) return err;
    mt_joiner_t *j = calloc(1, sizeof(*j));
    if (!j) return MT_NOMEM;
    j->cfg = *cfg;
    j->all_labels = (1u << cfg->ntasks) - 1;
    j->clock = clock ? clock : default_clock;
    j->opaque = opaque;
    j->watermark = INT64_MIN;
    j->max_event = INT64_MIN;
    j->opts = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(j->opts, 1);
    rocksdb_options_set_max_background_jobs(j->opts, 2);
    rocksdb_options_set_write_buffer_size(j->opts, (size_t)cfg->write_buffer_mb << 20);
    rocksdb_block_based_table_options_t *bbto = rocksdb_block_based_options_create();
    if (cfg->block_cache_mb) {
        j->block_cache = rocksdb_cache_create_lru((size_t)cfg->block_cache_mb << 20);
        rocksdb_block_based_options_set_block_cache(bbto, j->block_cache);
    } else {
        rocksdb_block_based_options_set_no_block_cache(bbto, 1);
    }
    rocksdb_options_set_block_based_table_factory(j->opts, bbto);
    rocksdb_block_based_options_destroy(bbto);
    j->wo = rocksdb_writeoptions_create();
    j->wo_sync = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(j->wo_sync, cfg->sync ? 1 : 0);
    j->ro = rocksdb_readoptions_create();
    j->wb = rocksdb_writebatch_create();
    char *rerr = NULL;
    j->db = rocksdb_open(j->opts, state_dir, &rerr);
    if (rerr) {
        mt_msgf(errbuf, errlen, "%s: %s", state_dir, rerr);
        err = rerr_of(rerr);
        goto fail;
    }
    int found = 0;
    if ((err = db_get(j, (const uint8_t *)"M", 1, &found))) {
        mt_msgf(errbuf, errlen, "%s: cannot read the state: %s", state_dir, mt_strerror(err));
        goto fail;
    }
    if (found) {
        uint8_t v0 = j->val.len ? j->val.p[0] : 0;
        if (j->val.len != 56 || (v0 != META_VERSION && v0 != META_VERSION_MT)) {
            mt_msgf(errbuf, errlen, "%s: not a joiner state of version %u or %u", state_dir,
                    META_VERSION, META_VERSION_MT);
            err = j->val.len >= 1 && v0 != META_VERSION && v0 != META_VERSION_MT ? MT_VERSION
                                                                                 : MT_CORRUPT;
            goto fail;
        }
        if ((err = check_tasks(j, j->val.p, state_dir, errbuf, errlen))) goto fail;
        j->watermark = (int64_t)mt_get_le(j->val.p + 8, 8);
        j->max_event = (int64_t)mt_get_le(j->val.p + 16, 8);
        j->pending = mt_get_le(j->val.p + 24, 8);
        j->early = mt_get_le(j->val.p + 32, 8);
        j->tombstones = mt_get_le(j->val.p + 40, 8);
        j->next_seq = mt_get_le(j->val.p + 48, 8);
    }
    if ((err = load_positions(j))) {
        mt_msgf(errbuf, errlen, "%s: cannot read the input positions: %s", state_dir,
                mt_strerror(err));
        goto fail;
    }
    if ((err = load_outbox(j))) {
        mt_msgf(errbuf, errlen, "%s: cannot read the outbox: %s", state_dir, mt_strerror(err));
        goto fail;
    }
    j->last_input_ms = j->last_tick_ms = j->clock(j->opaque);
    *out = j;
    return MT_OK;
fail:
    mt_joiner_close(j);
    return err;
}

void mt_joiner_close(mt_joiner_t *j) {
    if (!j) return;
    if (j->db) rocksdb_close(j->db);
    if (j->opts) rocksdb_options_destroy(j->opts);
    if (j->block_cache) rocksdb_cache_destroy(j->block_cache);
    if (j->wo) rocksdb_writeoptions_destroy(j->wo);
    if (j->wo_sync) rocksdb_writeoptions_destroy(j->wo_sync);
    if (j->ro) rocksdb_readoptions_destroy(j->ro);
    if (j->wb) rocksdb_writebatch_destroy(j->wb);
    cache_free(j);
    for (size_t i = 0; i < j->npos; i++)
        free(j->pos[i].topic);
    free(j->pos);
    for (size_t i = 0; i < j->ocount; i++)
        free(j->ob[j->ohead + i].buf);
    free(j->ob);
    free(j->val.p);
    free(j);
}

mt_err_t mt_joiner_add(mt_joiner_t *j, mt_joiner_stream_t stream, const char *topic,
                       int32_t partition, int64_t offset, const void *value, size_t len,
                       mt_joiner_outcome_t *outcome, char *why, size_t whylen) {
    mt_joiner_outcome_t oc = MT_JOINER_BAD;
    mt_err_t err = MT_OK;
    position_t *pos = NULL;
    if (why && whylen) why[0] = '\0';
    if (topic && offset >= 0) {
        if (!(pos = position_of(j, topic, partition, &err))) goto out;
        if (offset < pos->next) {
            j->st.replayed++;
            oc = MT_JOINER_REPLAYED;
            goto out;
        }
    }
    j->last_input_ms = j->clock(j->opaque);
    if (pos) pos->last_ms = j->last_input_ms;
    j->cur = pos;
    rocksdb_writebatch_clear(j->wb);
    if (!value || !len) {
        mt_msgf(why, whylen, "empty message");
        j->st.bad_messages++;
    } else if (stream == MT_JOINER_IMPRESSIONS) {
        Monolith__V1__Impression *im = monolith__v1__impression__unpack(NULL, len, value);
        if (!im) {
            mt_msgf(why, whylen, "not a monolith.v1.Impression protobuf (%zu bytes)", len);
            j->st.bad_messages++;
        } else if (!rid_ok(im->request_id, why, whylen) || !impression_ok(im, why, whylen)) {
            j->st.bad_messages++;
        } else {
            err = add_impression(j, im, value, len, &oc);
        }
        if (im) monolith__v1__impression__free_unpacked(im, NULL);
    } else {
        Monolith__V1__Action *a = monolith__v1__action__unpack(NULL, len, value);
        if (!a) {
            mt_msgf(why, whylen, "not a monolith.v1.Action protobuf (%zu bytes)", len);
            j->st.bad_messages++;
        } else if (!rid_ok(a->request_id, why, whylen)) {
            j->st.bad_messages++;
        } else {
            err = add_action(j, a, &oc);
        }
        if (a) monolith__v1__action__free_unpacked(a, NULL);
    }
    j->cur = NULL;
    if (err) goto out;
    if (pos) {
        pos->next = offset + 1;
        put_position(j, pos);
    }
    err = write_batch(j, 0);
out:
    if (outcome) *outcome = oc;
    return err;
}

/* The event time the watermark follows: the smallest of the partitions' largest event
 * times, over the partitions that are not idle (a message within idle_advance_ms); when
 * all are idle, the largest; without partitions (no topics given), the largest seen. */
static int64_t event_time(const mt_joiner_t *j, int64_t now) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    size_t seen = 0;
    for (size_t i = 0; i < j->npos; i++) {
        const position_t *p = &j->pos[i];
        if (p->max_ts == INT64_MIN) continue;
        seen++;
        if (p->max_ts > hi) hi = p->max_ts;
        int idle = j->cfg.idle_advance_ms > 0 && now - p->last_ms >= j->cfg.idle_advance_ms;
        if (!idle && p->max_ts < lo) lo = p->max_ts;
    }
    if (hi == INT64_MIN) return j->max_event;
    /* partitions assigned but silent so far hold event time back for idle_advance_ms */
    if (seen < j->expect_parts &&
        (j->cfg.idle_advance_ms == 0 || now - j->expect_since_ms < j->cfg.idle_advance_ms))
        return INT64_MIN;
    return lo != INT64_MAX ? lo : hi;
}

void mt_joiner_set_partitions(mt_joiner_t *j, size_t n) {
    if (n != j->expect_parts) j->expect_since_ms = j->clock(j->opaque);
    j->expect_parts = n;
}

void mt_joiner_hold(mt_joiner_t *j) {
    int64_t now = j->clock(j->opaque);
    j->last_input_ms = j->last_tick_ms = now;
    for (size_t i = 0; i < j->npos; i++)
        j->pos[i].last_ms = now;
}

mt_err_t mt_joiner_tick(mt_joiner_t *j, uint64_t *closed) {
    int64_t now = j->clock(j->opaque);
    int64_t wm = j->watermark;
    if (j->max_event != INT64_MIN) {
        int64_t ev = event_time(j, now);
        if (ev != INT64_MIN) ev -= j->cfg.allowed_lateness_ms;
        if (ev > wm) wm = ev;
        int64_t idle_from = sat_add(j->last_input_ms, j->cfg.idle_advance_ms);
        if (j->cfg.idle_advance_ms > 0 && now > idle_from && wm != INT64_MIN) {
            int64_t from = idle_from > j->last_tick_ms ? idle_from : j->last_tick_ms;
            if (now > from) wm = sat_add(wm, now - from);
        }
    }
    j->last_tick_ms = now;
    return advance(j, wm, closed);
}

mt_err_t mt_joiner_drain(mt_joiner_t *j, uint64_t *closed) {
    if (closed) *closed = 0;
    int64_t base = j->max_event > j->watermark ? j->max_event : j->watermark;
    if (base == INT64_MIN) return MT_OK;
    return advance(j, sat_add(sat_add(base, j->cfg.window_ms), 1), closed);
}

mt_err_t mt_joiner_sync(mt_joiner_t *j) {
    if (!j->cfg.sync) return MT_OK;
    rocksdb_writebatch_clear(j->wb);
    return write_batch(j, 1);
}

size_t mt_joiner_outbox_size(const mt_joiner_t *j) {
    return j->ocount;
}

const mt_joiner_example_t *mt_joiner_outbox_get(const mt_joiner_t *j, size_t i) {
    return i < j->ocount ? &j->ob[j->ohead + i].ex : NULL;
}

mt_err_t mt_joiner_outbox_done(mt_joiner_t *j, size_t n) {
    if (n > j->ocount) return MT_INVALID;
    if (!n) return MT_OK;
    uint8_t lo[9], hi[9];
    lo[0] = hi[0] = 'O';
    put_be64(lo + 1, j->ob[j->ohead].ex.seq);
    put_be64(hi + 1, j->ob[j->ohead + n - 1].ex.seq + 1);
    rocksdb_writebatch_clear(j->wb);
    rocksdb_writebatch_delete_range(j->wb, (const char *)lo, 9, (const char *)hi, 9);
    mt_err_t err = write_batch(j, 1);
    if (err) return err;
    for (size_t i = 0; i < n; i++)
        free(j->ob[j->ohead + i].buf);
    j->ohead += n;
    j->ocount -= n;
    if (!j->ocount) j->ohead = 0;
    return MT_OK;
}

void mt_joiner_stats(const mt_joiner_t *j, mt_joiner_stats_t *out) {
    *out = j->st;
    out->pending = j->pending;
    out->pending_memory = j->ncached;
    out->early_pending = j->early;
    out->tombstones = j->tombstones;
    out->outbox = j->ocount;
    out->watermark_ms = j->watermark;
    out->max_event_ms = j->max_event;
}

const char *mt_joiner_outcome_name(mt_joiner_outcome_t o) {
    switch (o) {
    case MT_JOINER_BAD: return "bad";
    case MT_JOINER_REPLAYED: return "replayed";
    case MT_JOINER_PENDING: return "pending";
    case MT_JOINER_JOINED: return "joined";
    case MT_JOINER_LATE_IMPRESSION: return "late_impression";
    case MT_JOINER_EARLY: return "early";
    case MT_JOINER_LATE_ACTION: return "late_action";
    case MT_JOINER_DUPLICATE: return "duplicate";
    case MT_JOINER_AMBIGUOUS: return "ambiguous";
    case MT_JOINER_LABELLED: return "labelled";
    case MT_JOINER_IGNORED: return "ignored";
    }
    return "?";
}

const char *mt_joiner_action_name(uint32_t type) {
    switch (type) {
    case MONOLITH__V1__ACTION_TYPE__ACTION_CLICK: return "click";
    case MONOLITH__V1__ACTION_TYPE__ACTION_CONVERSION: return "conversion";
    }
    return NULL;
}
