/*
 * serialize.c - writing a whole table to a stream and building a table back from one.
 *
 * Format (all integers little-endian; floats as their IEEE bits):
 *
 *   offset  size  field
 *   0       8     magic "MTTABLE\0"
 *   8       4     format version (MT__SER_VERSION)
 *   12      4     0 (reserved; a non-zero value is rejected)
 *   16      ...   blocks, each:
 *                   4  tag ('HEAD', 'ROWS', 'FILT' or 'END.' as a little-endian u32)
 *                   4  payload length n (<= MT__SER_MAX_BLOCK)
 *                   n  payload
 *                   8  XXH64(payload, seed = tag)
 *
 *   HEAD  u32 nslots, then per slot {u16 slot, u16 0, u32 dim, u8 opt, u8 precision, u16 0,
 *         u32 state_floats}; u64 clock; u64 rows (a hint for pre-sizing); u32 nparts;
 *         u32 filter depth; u32 filter width; u32 0; u64 hash_seed
 *   ROWS  u32 n, then n rows {u64 fid, u64 version, u32 touch_s, u32 count,
 *         embedding as stored (fp32, or fp16 padded to 4 bytes), state floats}
 *   FILT  u32 part, u32 0, then depth * width u8 counters of that part
 *   END.  u64 rows written, u64 ROWS blocks written
 *
 * The stream has exactly one HEAD first and one END. last. Loading checks every checksum
 * before using a block, rejects duplicate ids, unknown slots and short rows, and compares
 * the totals of END. with what it read; on any error it destroys what it built, so a table
 * is either loaded whole or not at all. Filter counts are restored only when the filter
 * geometry (parts, depth, width, hash seed) is the same, else the filter starts empty.
 *
 * A loaded table starts its version clock at the saved clock + 2^40 and marks everything
 * below as unservable incrementally: a replica that synced from this table's previous life
 * (even from changes made after the snapshot and lost in a crash) gets a full sync.
 */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "mt/bytes.h"
#include "table_int.h"

#define MT__SER_VERSION    1u
#define MT__SER_MAX_BLOCK  (16u << 20)
#define MT__SER_ROWS_BLOCK (1u << 20)
#define MT__CLOCK_JUMP     (1ull << 40)
#define MT__PRESIZE_MAX    (1ull << 24) /* rows a stream's hint may pre-size for */

#define TAG(a, b, c, d) \
    ((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)
#define TAG_HEAD TAG('H', 'E', 'A', 'D')
#define TAG_ROWS TAG('R', 'O', 'W', 'S')
#define TAG_FILT TAG('F', 'I', 'L', 'T')
#define TAG_END  TAG('E', 'N', 'D', '.')

static const char ser_magic[8] = {'M', 'T', 'T', 'A', 'B', 'L', 'E', 0};

/* ---------------- little-endian buffer ---------------- */

typedef struct buf {
    uint8_t *p;
    size_t len, cap;
} buf_t;

static int buf_reserve(buf_t *b, size_t more) {
    if (b->len + more <= b->cap) return 0;
    size_t c = b->cap ? b->cap : 4096;
    while (c < b->len + more)
        c *= 2;
    uint8_t *n = realloc(b->p, c);
    if (!n) return -1;
    b->p = n;
    b->cap = c;
    return 0;
}

/* Appends n little-endian bytes of v (buffer space reserved by the caller). */
static void buf_put(buf_t *b, uint64_t v, int n) {
    mt_put_le(b->p + b->len, v, n);
    b->len += (size_t)n;
}

/* Appends 32-bit words (floats or packed halves) in little-endian order. */
static void buf_put_words(buf_t *b, const void *src, size_t nwords) {
    const uint8_t *s = src;
    for (size_t i = 0; i < nwords; i++) {
        uint32_t w;
        memcpy(&w, s + 4 * i, 4);
        buf_put(b, w, 4);
    }
}

static mt_err_t write_block(mt_table_write_fn fn, void *ud, uint32_t tag, const uint8_t *payload,
                            size_t len) {
    uint8_t hdr[8], tail[8];
    mt_put_le(hdr, tag, 4);
    mt_put_le(hdr + 4, len, 4);
    mt_put_le(tail, XXH64(payload, len, tag), 8);
    mt_err_t err = fn(ud, hdr, 8);
    if (!err && len) err = fn(ud, payload, len);
    if (!err) err = fn(ud, tail, 8);
    return err;
}

/* ---------------- save ---------------- */

/* Embedding bytes in the stream: fp32 dim * 4, fp16 dim * 2 padded to 4 (the in-memory
 * embedding may be padded further). */
static uint32_t ser_emb_bytes(const mt__slot_t *s) {
    return s->cfg.precision == MT_PREC_FP16 ? (s->cfg.dim * 2 + 3) & ~3u : s->cfg.dim * 4;
}

static size_t ser_row_bytes(const mt__slot_t *s) {
    return 24 + ser_emb_bytes(s) + 4u * s->state_floats;
}

static void put_row(buf_t *b, const mt__slot_t *s, uint64_t fid, const void *row) {
    const mt__row_t *h = mt__row_hdr(s, row);
    buf_put(b, fid, 8);
    buf_put(b, h->version, 8);
    buf_put(b, h->touch_s, 4);
    buf_put(b, h->count, 4);
    buf_put_words(b, mt__row_emb((void *)row), ser_emb_bytes(s) / 4);
    buf_put_words(b, mt__row_state(s, (void *)row), s->state_floats);
}

/* Emits rows buffered in b (rows serialized after a 4-byte count placeholder). */
static mt_err_t flush_rows(mt_table_write_fn fn, void *ud, buf_t *b, uint32_t n, uint64_t *blocks) {
    if (n == 0) return MT_OK;
    mt_put_le(b->p, n, 4);
    (*blocks)++;
    return write_block(fn, ud, TAG_ROWS, b->p, b->len);
}

mt_err_t mt_table_save(mt_table_t *t, mt_table_write_fn fn, void *ud) {
    buf_t b = {0}, part = {0};
    mt_err_t err = MT_OK;
    uint64_t rows_total = 0, blocks = 0, clock = 0, rows_hint = 0;
    for (uint32_t i = 0; i < t->nparts; i++) {
        mt__part_lock(&t->parts[i]);
        if (t->parts[i].clock > clock) clock = t->parts[i].clock;
        rows_hint += t->parts[i].rows;
        mt__part_unlock(&t->parts[i]);
    }
    uint64_t g = atomic_load(&t->clock);
    if (g > clock) clock = g;

    /* Header. */
    uint8_t hdr16[16];
    memcpy(hdr16, ser_magic, 8);
    mt_put_le(hdr16 + 8, MT__SER_VERSION, 4);
    mt_put_le(hdr16 + 12, 0, 4);
    err = fn(ud, hdr16, 16);
    if (err) goto out;
    if (buf_reserve(&b, 4 + 16 * (size_t)t->nslots + 40)) {
        err = MT_NOMEM;
        goto out;
    }
    buf_put(&b, t->nslots, 4);
    for (uint32_t i = 0; i < t->nslots; i++) {
        const mt__slot_t *s = &t->slots[i];
        buf_put(&b, s->cfg.slot, 2);
        buf_put(&b, 0, 2);
        buf_put(&b, s->cfg.dim, 4);
        buf_put(&b, (uint64_t)s->cfg.opt, 1);
        buf_put(&b, (uint64_t)s->cfg.precision, 1);
        buf_put(&b, 0, 2);
        buf_put(&b, s->state_floats, 4);
    }
    buf_put(&b, clock, 8);
    buf_put(&b, rows_hint, 8);
    buf_put(&b, t->nparts, 4);
    buf_put(&b, t->cm_depth, 4);
    buf_put(&b, t->cm_width, 4);
    buf_put(&b, 0, 4);
    buf_put(&b, t->cfg.hash_seed, 8);
    err = write_block(fn, ud, TAG_HEAD, b.p, b.len);
    if (err) goto out;

    /* Rows, one part at a time: copy under the lock, write after it. */
    for (uint32_t pi = 0; pi < t->nparts; pi++) {
        mt__part_t *p = &t->parts[pi];
        part.len = 0;
        uint32_t n = 0;
        mt__part_lock(p);
        const mt__barray_t *a = atomic_load_explicit(&p->arr, memory_order_relaxed);
        for (uint64_t bi = 0; bi <= a->mask && !err; bi++) {
            for (int k = 0; k < MT__BUCKET_SLOTS; k++) {
                const void *row = a->b[bi].row[k];
                if (!row) continue;
                uint64_t fid = a->b[bi].key[k];
                const mt__slot_t *s = mt__slot_of(t, fid);
                if (buf_reserve(&part, ser_row_bytes(s))) {
                    err = MT_NOMEM;
                    break;
                }
                put_row(&part, s, fid, row);
                n++;
            }
        }
        if (!err && t->cm_width) {
            size_t cm = (size_t)t->cm_depth * t->cm_width;
            b.len = 0;
            if (buf_reserve(&b, 8 + cm)) {
                err = MT_NOMEM;
            } else {
                buf_put(&b, pi, 4);
                buf_put(&b, 0, 4);
                memcpy(b.p + b.len, p->cm, cm);
                b.len += cm;
            }
        }
        mt__part_unlock(p);
        if (err) goto out;
        /* Split the part's rows into blocks of about MT__SER_ROWS_BLOCK bytes. */
        size_t off = 0;
        while (off < part.len) {
            buf_t blk = {0};
            size_t start = off;
            uint32_t cnt = 0;
            while (off < part.len && off - start < MT__SER_ROWS_BLOCK) {
                const mt__slot_t *s = mt__slot_of(t, mt_get_le(part.p + off, 8));
                off += ser_row_bytes(s);
                cnt++;
            }
            if (buf_reserve(&blk, 4 + (off - start))) {
                err = MT_NOMEM;
                goto out;
            }
            blk.len = 4;
            memcpy(blk.p + 4, part.p + start, off - start);
            blk.len += off - start;
            err = flush_rows(fn, ud, &blk, cnt, &blocks);
            free(blk.p);
            if (err) goto out;
        }
        rows_total += n;
        if (t->cm_width) {
            err = write_block(fn, ud, TAG_FILT, b.p, b.len);
            if (err) goto out;
        }
    }
    uint8_t end[16];
    mt_put_le(end, rows_total, 8);
    mt_put_le(end + 8, blocks, 8);
    err = write_block(fn, ud, TAG_END, end, 16);
out:
    free(b.p);
    free(part.p);
    return err;
}

/* ---------------- load ---------------- */

static mt_err_t read_exact(mt_table_read_fn fn, void *ud, void *dst, size_t len) {
    size_t got = 0;
    mt_err_t err = fn(ud, dst, len, &got);
    if (err) return err;
    return got == len ? MT_OK : MT_TRUNCATED;
}

/* Reads one block into *payload (reallocated as needed). */
static mt_err_t read_block(mt_table_read_fn fn, void *ud, uint32_t *tag, buf_t *payload) {
    uint8_t hdr[8], tail[8];
    mt_err_t err = read_exact(fn, ud, hdr, 8);
    if (err) return err;
    *tag = (uint32_t)mt_get_le(hdr, 4);
    uint32_t len = (uint32_t)mt_get_le(hdr + 4, 4);
    if (*tag != TAG_HEAD && *tag != TAG_ROWS && *tag != TAG_FILT && *tag != TAG_END)
        return MT_CORRUPT;
    if (len > MT__SER_MAX_BLOCK) return MT_CORRUPT;
    payload->len = 0;
    if (buf_reserve(payload, len ? len : 1)) return MT_NOMEM;
    err = read_exact(fn, ud, payload->p, len);
    if (err) return err;
    payload->len = len;
    err = read_exact(fn, ud, tail, 8);
    if (err) return err;
    if (mt_get_le(tail, 8) != XXH64(payload->p, len, *tag)) return MT_CORRUPT;
    return MT_OK;
}

typedef struct head {
    uint64_t clock, rows;
    uint32_t nparts, depth, width;
    uint64_t hash_seed;
} head_t;

static mt_err_t parse_head(const buf_t *pl, const mt_table_config_t *cfg, head_t *h) {
    if (pl->len < 4) return MT_CORRUPT;
    uint32_t nslots = (uint32_t)mt_get_le(pl->p, 4);
    if (nslots > 65536 || pl->len != 4 + 16 * (size_t)nslots + 40) return MT_CORRUPT;
    const uint8_t *q = pl->p + 4;
    for (uint32_t i = 0; i < nslots; i++, q += 16) {
        uint16_t slot = (uint16_t)mt_get_le(q, 2);
        uint32_t dim = (uint32_t)mt_get_le(q + 4, 4);
        uint8_t opt = q[8], prec = q[9];
        uint32_t state = (uint32_t)mt_get_le(q + 12, 4);
        const mt_table_slot_config_t *c = NULL;
        for (size_t j = 0; j < cfg->nslots; j++)
            if (cfg->slots[j].slot == slot) c = &cfg->slots[j];
        if (!c || c->dim != dim || (uint32_t)c->opt != opt || (uint32_t)c->precision != prec ||
            mt__opt_state_floats(c) != state)
            return MT_MISMATCH;
    }
    h->clock = mt_get_le(q, 8);
    h->rows = mt_get_le(q + 8, 8);
    h->nparts = (uint32_t)mt_get_le(q + 16, 4);
    h->depth = (uint32_t)mt_get_le(q + 20, 4);
    h->width = (uint32_t)mt_get_le(q + 24, 4);
    h->hash_seed = mt_get_le(q + 32, 8);
    if (h->clock > (UINT64_MAX >> 2)) return MT_CORRUPT;
    return MT_OK;
}

static mt_err_t load_rows(mt_table_t *t, const buf_t *pl, uint64_t *nrows) {
    if (pl->len < 4) return MT_CORRUPT;
    uint32_t n = (uint32_t)mt_get_le(pl->p, 4);
    size_t off = 4;
    float emb[MT_TABLE_MAX_DIM], state[2 * MT_TABLE_MAX_DIM + 2];
    for (uint32_t r = 0; r < n; r++) {
        if (pl->len - off < 24) return MT_CORRUPT;
        const uint8_t *q = pl->p + off;
        uint64_t fid = mt_get_le(q, 8), version = mt_get_le(q + 8, 8);
        uint32_t touch = (uint32_t)mt_get_le(q + 16, 4), count = (uint32_t)mt_get_le(q + 20, 4);
        const mt__slot_t *s = mt__slot_of(t, fid);
        if (!s) return MT_CORRUPT; /* HEAD listed the slots: an unknown one is damage */
        if (pl->len - off < ser_row_bytes(s)) return MT_CORRUPT;
        q += 24;
        /* Decode the stored embedding bytes as they are, so fp16 stays bit-exact. */
        uint8_t raw[4 * MT_TABLE_MAX_DIM];
        for (uint32_t w = 0; w < ser_emb_bytes(s) / 4; w++) {
            uint32_t x = (uint32_t)mt_get_le(q + 4 * w, 4);
            memcpy(raw + 4 * w, &x, 4);
        }
        q += ser_emb_bytes(s);
        for (uint32_t w = 0; w < s->state_floats; w++) {
            uint32_t x = (uint32_t)mt_get_le(q + 4 * w, 4);
            memcpy(&state[w], &x, 4);
        }
        mt__row_read_emb(s, raw, emb);
        off += ser_row_bytes(s);
        uint32_t pi = mt__part_of(t, fid);
        mt__part_t *p = &t->parts[pi];
        mt__barray_t *retired = NULL;
        mt_err_t err = MT_OK;
        void *row = NULL;
        mt__part_lock(p);
        if (mt__part_find(t, p, fid)) /* a duplicate id means damage */
            err = MT_CORRUPT;
        else
            err = mt__part_insert(t, p, fid, s, emb, state, touch, count, version, &row, &retired);
        if (!err && s->cfg.precision == MT_PREC_FP16)
            memcpy(mt__row_emb(row), raw, ser_emb_bytes(s));
        mt__part_unlock(p);
        mt__retire(t, retired);
        if (err) return err;
        (*nrows)++;
    }
    return off == pl->len ? MT_OK : MT_CORRUPT;
}

mt_err_t mt_table_load(const mt_table_config_t *cfg, mt_table_read_fn fn, void *ud,
                       mt_table_t **out) {
    mt_table_t *t = NULL;
    buf_t pl = {0};
    head_t h;
    uint64_t nrows = 0, nblocks = 0;
    int got_end = 0;
    uint8_t hdr16[16];
    mt_err_t err = mt_table_config_validate(cfg, NULL, 0);
    if (err) return err;
    err = read_exact(fn, ud, hdr16, 16);
    if (err) goto out;
    if (memcmp(hdr16, ser_magic, 8) != 0) {
        err = MT_CORRUPT;
        goto out;
    }
    if (mt_get_le(hdr16 + 8, 4) != MT__SER_VERSION) {
        err = MT_VERSION;
        goto out;
    }
    if (mt_get_le(hdr16 + 12, 4) != 0) { /* reserved: a later format must bump the version */
        err = MT_CORRUPT;
        goto out;
    }
    uint32_t tag;
    err = read_block(fn, ud, &tag, &pl);
    if (err) goto out;
    if (tag != TAG_HEAD) {
        err = MT_CORRUPT;
        goto out;
    }
    err = parse_head(&pl, cfg, &h);
    if (err) goto out;
    mt_table_config_t c2 = *cfg;
    /* The row count only pre-sizes the table, and it is input: cap what it may allocate
     * before any row has been read (larger tables grow as they load). */
    if (c2.initial_rows < h.rows)
        c2.initial_rows = h.rows < MT__PRESIZE_MAX ? h.rows : MT__PRESIZE_MAX;
    err = mt_table_create(&c2, &t);
    if (err) goto out;
    int same_filter = t->cm_width && h.nparts == t->nparts && h.depth == t->cm_depth &&
                      h.width == t->cm_width && h.hash_seed == t->cfg.hash_seed;
    while (!got_end) {
        err = read_block(fn, ud, &tag, &pl);
        if (err) goto out;
        if (tag == TAG_ROWS) {
            err = load_rows(t, &pl, &nrows);
            nblocks++;
        } else if (tag == TAG_FILT) {
            if (pl.len < 8) {
                err = MT_CORRUPT;
            } else if (same_filter) {
                uint32_t pi = (uint32_t)mt_get_le(pl.p, 4);
                size_t cm = (size_t)t->cm_depth * t->cm_width;
                if (pi >= t->nparts || pl.len != 8 + cm) {
                    err = MT_CORRUPT;
                } else {
                    mt__part_t *p = &t->parts[pi];
                    memcpy(p->cm, pl.p + 8, cm);
                    p->cm_nonzero = 0;
                    for (size_t i = 0; i < cm; i++)
                        p->cm_nonzero += p->cm[i] != 0;
                }
            }
        } else if (tag == TAG_END) {
            if (pl.len != 16 || mt_get_le(pl.p, 8) != nrows || mt_get_le(pl.p + 8, 8) != nblocks)
                err = MT_CORRUPT;
            got_end = 1;
        } else {
            err = MT_CORRUPT; /* a second HEAD */
        }
        if (err) goto out;
    }
    /* Nothing may follow END. */
    {
        uint8_t extra;
        size_t got = 0;
        err = fn(ud, &extra, 1, &got);
        if (err) goto out;
        if (got != 0) {
            err = MT_CORRUPT;
            goto out;
        }
    }
    uint64_t start = h.clock + MT__CLOCK_JUMP;
    atomic_store(&t->clock, start);
    for (uint32_t i = 0; i < t->nparts; i++) {
        t->parts[i].clock = start;
        t->parts[i].log_floor = start;
        t->parts[i].n_inserts = 0;
    }
    *out = t;
    t = NULL;
out:
    mt_table_destroy(t);
    free(pl.p);
    return err;
}
