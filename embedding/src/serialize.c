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
 *
 * Change streams (deltas: mt_table_save_changes / mt_table_load_changes) use the same
 * framing under another magic, so that neither loader takes the other's stream:
 *
 *   0       8     magic "MTDELTA\0"
 *   8       4     format version (MT__DELTA_VERSION)
 *   12      4     0 (reserved)
 *   16      ...   blocks as above: one HEAD, then ROWS and DELS blocks, one END. last
 *
 *   HEAD  u32 nslots, then per slot the 16 bytes of the table's HEAD; u64 since; u64 upto
 *   ROWS  as in a table stream (the rows as they were when the save read them)
 *   DELS  u32 n, then n u64 fids that had no row when the save looked
 *   END.  u64 rows, u64 deletions, u64 ROWS and DELS blocks written
 *
 * A delta lists each id whose change log entry is newer than since (the change iterator of
 * changes.c), with its state when the save looked at it under its part's lock: a full row or a
 * deletion. Every id's state is its latest, so the stream holds no history and its order
 * does not matter, except for an id changed again while the save ran: such a change has a
 * version above upto and comes again, final, in the next delta. Loading replaces rows in
 * place (or inserts them, past the frequency filter) with their exact bytes and removes the
 * deleted ids; it does not log these changes but raises the version clock and every part's
 * log floor above upto and every row version of the stream, so that no replica syncs
 * incrementally across a delta load (as after mt_table_load).
 */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "mt/bytes.h"
#include "table_int.h"

#define MT__SER_VERSION    1u
#define MT__DELTA_VERSION  1u
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
#define TAG_DELS TAG('D', 'E', 'L', 'S')

#define MT__DELTA_BATCH 256u          /* change entries asked of the iterator at a time */
#define MT__DELTA_VALS  (64u * 1024u) /* floats for their embeddings (>= MT_TABLE_MAX_DIM) */

static const char ser_magic[8] = {'M', 'T', 'T', 'A', 'B', 'L', 'E', 0};
static const char delta_magic[8] = {'M', 'T', 'D', 'E', 'L', 'T', 'A', 0};

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

/* Emits the n entries buffered in b (serialized after a 4-byte count placeholder) as one
 * block of tag (ROWS or DELS). */
static mt_err_t flush_counted(mt_table_write_fn fn, void *ud, uint32_t tag, buf_t *b, uint32_t n,
                              uint64_t *blocks) {
    if (n == 0) return MT_OK;
    mt_put_le(b->p, n, 4);
    (*blocks)++;
    return write_block(fn, ud, tag, b->p, b->len);
}

/* The slot descriptors of a HEAD block (the caller reserved 4 + 16 * nslots bytes). */
static void put_slots(buf_t *b, const mt_table_t *t) {
    buf_put(b, t->nslots, 4);
    for (uint32_t i = 0; i < t->nslots; i++) {
        const mt__slot_t *s = &t->slots[i];
        buf_put(b, s->cfg.slot, 2);
        buf_put(b, 0, 2);
        buf_put(b, s->cfg.dim, 4);
        buf_put(b, (uint64_t)s->cfg.opt, 1);
        buf_put(b, (uint64_t)s->cfg.precision, 1);
        buf_put(b, 0, 2);
        buf_put(b, s->state_floats, 4);
    }
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
    put_slots(&b, t);
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
            err = flush_counted(fn, ud, TAG_ROWS, &blk, cnt, &blocks);
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
    if (*tag != TAG_HEAD && *tag != TAG_ROWS && *tag != TAG_FILT && *tag != TAG_DELS &&
        *tag != TAG_END)
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

/* Checks the slot descriptors that start a HEAD payload against cfg: each must be
 * configured there with the same dim, optimizer, precision and state size (MT_MISMATCH);
 * exactly tail_len bytes must follow them. Marks each slot in listed (a 65536-bit set) if
 * given. @param[out] rest  the bytes after the descriptors */
static mt_err_t parse_slots(const buf_t *pl, const mt_table_config_t *cfg, size_t tail_len,
                            uint64_t *listed, const uint8_t **rest) {
    if (pl->len < 4) return MT_CORRUPT;
    uint32_t nslots = (uint32_t)mt_get_le(pl->p, 4);
    if (nslots > 65536 || pl->len != 4 + 16 * (size_t)nslots + tail_len) return MT_CORRUPT;
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
        if (listed) listed[slot / 64] |= 1ull << (slot % 64);
    }
    *rest = q;
    return MT_OK;
}

static int slot_listed(const uint64_t *listed, uint64_t fid) {
    uint16_t slot = MT_FID_SLOT(fid);
    return (int)(listed[slot / 64] >> (slot % 64)) & 1;
}

static mt_err_t parse_head(const buf_t *pl, const mt_table_config_t *cfg, head_t *h) {
    const uint8_t *q;
    mt_err_t err = parse_slots(pl, cfg, 40, NULL, &q);
    if (err) return err;
    h->clock = mt_get_le(q, 8);
    h->rows = mt_get_le(q + 8, 8);
    h->nparts = (uint32_t)mt_get_le(q + 16, 4);
    h->depth = (uint32_t)mt_get_le(q + 20, 4);
    h->width = (uint32_t)mt_get_le(q + 24, 4);
    h->hash_seed = mt_get_le(q + 32, 8);
    if (h->clock > (UINT64_MAX >> 2)) return MT_CORRUPT;
    return MT_OK;
}

/* One row of a ROWS payload: the embedding keeps its stored bytes (in host order). */
typedef struct row_in {
    uint64_t fid, version;
    uint32_t touch_s, count;
    const mt__slot_t *s;
    _Alignas(8) uint8_t raw[4 * MT_TABLE_MAX_DIM];
    float state[2 * MT_TABLE_MAX_DIM + 2];
} row_in_t;

/* Decodes the row at *off of a ROWS payload and moves *off past it. */
static mt_err_t decode_row(const mt_table_t *t, const buf_t *pl, size_t *off, row_in_t *r) {
    if (pl->len - *off < 24) return MT_CORRUPT;
    const uint8_t *q = pl->p + *off;
    r->fid = mt_get_le(q, 8);
    r->version = mt_get_le(q + 8, 8);
    r->touch_s = (uint32_t)mt_get_le(q + 16, 4);
    r->count = (uint32_t)mt_get_le(q + 20, 4);
    r->s = mt__slot_of(t, r->fid);
    if (!r->s) return MT_CORRUPT; /* HEAD listed the slots: an unknown one is damage */
    if (pl->len - *off < ser_row_bytes(r->s)) return MT_CORRUPT;
    q += 24;
    for (uint32_t w = 0; w < ser_emb_bytes(r->s) / 4; w++) {
        uint32_t x = (uint32_t)mt_get_le(q + 4 * w, 4);
        memcpy(r->raw + 4 * w, &x, 4);
    }
    q += ser_emb_bytes(r->s);
    for (uint32_t w = 0; w < r->s->state_floats; w++) {
        uint32_t x = (uint32_t)mt_get_le(q + 4 * w, 4);
        memcpy(&r->state[w], &x, 4);
    }
    *off += ser_row_bytes(r->s);
    return MT_OK;
}

/* Puts the rows of a ROWS payload into t with their exact bytes. A table stream
 * (replace = 0) holds each id once, so an id that already has a row means damage; a delta
 * (replace = 1) replaces it. listed (deltas): the slots of the stream's HEAD.
 * @param[in,out] nrows   rows put so far
 * @param[in,out] maxver  optional: the highest row version seen */
static mt_err_t put_rows(mt_table_t *t, const buf_t *pl, const uint64_t *listed, int replace,
                         uint64_t *nrows, uint64_t *maxver) {
    if (pl->len < 4) return MT_CORRUPT;
    uint32_t n = (uint32_t)mt_get_le(pl->p, 4);
    size_t off = 4;
    row_in_t r;
    for (uint32_t i = 0; i < n; i++) {
        mt_err_t err = decode_row(t, pl, &off, &r);
        if (err) return err;
        if (listed && !slot_listed(listed, r.fid)) return MT_CORRUPT;
        if (maxver && r.version > (UINT64_MAX >> 2)) return MT_CORRUPT; /* the clock follows it */
        mt__part_t *p = &t->parts[mt__part_of(t, r.fid)];
        mt__barray_t *retired = NULL;
        int replaced = 0;
        mt__part_lock(p);
        err = mt__part_put_raw(t, p, r.fid, r.s, r.raw, ser_emb_bytes(r.s), r.state, r.touch_s,
                               r.count, r.version, &replaced, &retired);
        if (!err && replaced && !replace) err = MT_CORRUPT; /* a duplicate id */
        mt__part_unlock(p);
        mt__retire(t, retired);
        if (err) return err;
        if (maxver && r.version > *maxver) *maxver = r.version;
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
    if (c2.initial_rows < h.rows) {
        c2.initial_rows = h.rows < MT__PRESIZE_MAX ? h.rows : MT__PRESIZE_MAX;
        /* the loaded rows take more memory than the reserve held (it would be filled first),
         * and a reserve the size of the header's count would trust input with memory */
        c2.reserve_rows = 0;
    }
    err = mt_table_create(&c2, &t);
    if (err) goto out;
    int same_filter = t->cm_width && h.nparts == t->nparts && h.depth == t->cm_depth &&
                      h.width == t->cm_width && h.hash_seed == t->cfg.hash_seed;
    while (!got_end) {
        err = read_block(fn, ud, &tag, &pl);
        if (err) goto out;
        if (tag == TAG_ROWS) {
            err = put_rows(t, &pl, NULL, 0, &nrows, NULL);
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
            err = MT_CORRUPT; /* a second HEAD, or the DELS of a change stream */
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

/* ---------------- change streams (deltas) ---------------- */

mt_err_t mt_table_save_changes(mt_table_t *t, uint64_t since, mt_table_write_fn fn, void *ud,
                               uint64_t *upto) {
    mt_table_changes_t *it = NULL;
    mt_table_change_t *ch = NULL;
    float *vals = NULL;
    buf_t b = {0}, rows = {0}, dels = {0};
    uint32_t nrows = 0, ndels = 0; /* in the blocks being filled */
    uint64_t rows_total = 0, dels_total = 0, blocks = 0, up = 0;
    int full = 0;
    /* begin() raises the clock to upto before it copies anything: what changes after it
     * gets a higher version, so appears in this stream (as its state when read) or the
     * next one. */
    mt_err_t err = mt_table_changes_begin(t, since, &it, &up, &full);
    if (err) return err;
    if (upto) *upto = up;
    if (full) { /* nothing written: the caller saves the whole table instead */
        err = MT_FULL_SYNC;
        goto out;
    }
    ch = malloc(MT__DELTA_BATCH * sizeof(*ch));
    vals = malloc(MT__DELTA_VALS * sizeof(*vals));
    if (!ch || !vals || buf_reserve(&b, 4 + 16 * (size_t)t->nslots + 16) || buf_reserve(&rows, 4) ||
        buf_reserve(&dels, 4)) {
        err = MT_NOMEM;
        goto out;
    }
    rows.len = dels.len = 4; /* room for the count of each block */

    uint8_t hdr16[16];
    memcpy(hdr16, delta_magic, 8);
    mt_put_le(hdr16 + 8, MT__DELTA_VERSION, 4);
    mt_put_le(hdr16 + 12, 0, 4);
    err = fn(ud, hdr16, 16);
    if (err) goto out;
    put_slots(&b, t);
    buf_put(&b, since, 8);
    buf_put(&b, up, 8);
    err = write_block(fn, ud, TAG_HEAD, b.p, b.len);
    if (err) goto out;

    for (;;) {
        size_t n = 0;
        err = mt_table_changes_next(it, ch, MT__DELTA_BATCH, vals, MT__DELTA_VALS, &n);
        if (err) goto out; /* MT_FULL_SYNC: the log was compacted past since meanwhile */
        if (n == 0) break;
        for (size_t i = 0; i < n; i++) {
            /* The entry only names the id: what counts is its state now, read whole under
             * its part's lock, so an id listed twice is written the same way twice. A
             * deletion of an id that has a row again is skipped: the row's own entry is
             * newer, so it is in this stream too if the row came before begin(), and in
             * the next one if it came after. */
            uint64_t fid = ch[i].fid;
            const mt__slot_t *s = mt__slot_of(t, fid);
            if (buf_reserve(&rows, ser_row_bytes(s)) || buf_reserve(&dels, 8)) {
                err = MT_NOMEM;
                goto out;
            }
            mt__part_t *p = &t->parts[mt__part_of(t, fid)];
            mt__part_lock(p);
            const void *row = mt__part_find(t, p, fid);
            if (row && !ch[i].deleted) put_row(&rows, s, fid, row);
            mt__part_unlock(p);
            if (row && !ch[i].deleted) {
                nrows++;
            } else if (!row) {
                buf_put(&dels, fid, 8);
                ndels++;
            }
            if (rows.len >= MT__SER_ROWS_BLOCK) {
                err = flush_counted(fn, ud, TAG_ROWS, &rows, nrows, &blocks);
                if (err) goto out;
                rows_total += nrows;
                nrows = 0;
                rows.len = 4;
            }
            if (dels.len >= MT__SER_ROWS_BLOCK) {
                err = flush_counted(fn, ud, TAG_DELS, &dels, ndels, &blocks);
                if (err) goto out;
                dels_total += ndels;
                ndels = 0;
                dels.len = 4;
            }
        }
    }
    err = flush_counted(fn, ud, TAG_ROWS, &rows, nrows, &blocks);
    if (err) goto out;
    rows_total += nrows;
    err = flush_counted(fn, ud, TAG_DELS, &dels, ndels, &blocks);
    if (err) goto out;
    dels_total += ndels;
    uint8_t end[24];
    mt_put_le(end, rows_total, 8);
    mt_put_le(end + 8, dels_total, 8);
    mt_put_le(end + 16, blocks, 8);
    err = write_block(fn, ud, TAG_END, end, 24);
out:
    mt_table_changes_end(it);
    free(ch);
    free(vals);
    free(b.p);
    free(rows.p);
    free(dels.p);
    return err;
}

/* Removes the ids of a DELS payload (their slots must be in listed, the stream's HEAD). */
static mt_err_t del_rows(mt_table_t *t, const buf_t *pl, const uint64_t *listed, uint64_t *ndels) {
    if (pl->len < 4) return MT_CORRUPT;
    uint32_t n = (uint32_t)mt_get_le(pl->p, 4);
    if (pl->len != 4 + 8 * (size_t)n) return MT_CORRUPT;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t fid = mt_get_le(pl->p + 4 + 8 * (size_t)i, 8);
        if (!mt__slot_of(t, fid) || !slot_listed(listed, fid)) return MT_CORRUPT;
        mt__part_t *p = &t->parts[mt__part_of(t, fid)];
        mt__part_lock(p);
        (void)mt__part_remove(t, p, fid); /* an id without a row is already as wanted */
        mt__part_unlock(p);
        (*ndels)++;
    }
    return MT_OK;
}

/* After a delta load: as after mt_table_load(), the clock restarts above every version of
 * the table and 2^40 above base (the stream's upto and row versions), and every part's log
 * floor goes there, so that any `since` handed out before (by this table or by the one the
 * delta came from) gets a full sync: the rows put by the load are not in the change log.
 * The floors are raised before the global clock, so no upto at or above the new floor is
 * handed out before every part refuses older ones. */
static void raise_clock(mt_table_t *t, uint64_t base) {
    uint64_t cur = atomic_load(&t->clock);
    for (uint32_t i = 0; i < t->nparts; i++) {
        mt__part_lock(&t->parts[i]);
        if (t->parts[i].clock > cur) cur = t->parts[i].clock;
        mt__part_unlock(&t->parts[i]);
    }
    uint64_t start = base + MT__CLOCK_JUMP;
    if (start <= cur) start = cur + 1;
    for (uint32_t i = 0; i < t->nparts; i++) {
        mt__part_t *p = &t->parts[i];
        mt__part_lock(p);
        if (p->clock < start) p->clock = start;
        if (p->log_floor < start) p->log_floor = start;
        mt__part_unlock(p);
    }
    uint64_t g = atomic_load(&t->clock);
    while (g < start && !atomic_compare_exchange_weak(&t->clock, &g, start)) {
    }
}

mt_err_t mt_table_load_changes(mt_table_t *t, mt_table_read_fn fn, void *ud, uint64_t *rows,
                               uint64_t *deletions) {
    buf_t pl = {0};
    uint64_t listed[65536 / 64] = {0}; /* slots of the stream's HEAD */
    uint64_t nrows = 0, ndels = 0, nblocks = 0, upto = 0, maxver = 0;
    int got_head = 0, got_end = 0;
    uint8_t hdr16[16];
    uint32_t tag;
    mt_err_t err = read_exact(fn, ud, hdr16, 16);
    if (err) goto out;
    if (memcmp(hdr16, delta_magic, 8) != 0) { /* a table stream, too */
        err = MT_CORRUPT;
        goto out;
    }
    if (mt_get_le(hdr16 + 8, 4) != MT__DELTA_VERSION) {
        err = MT_VERSION;
        goto out;
    }
    if (mt_get_le(hdr16 + 12, 4) != 0) {
        err = MT_CORRUPT;
        goto out;
    }
    err = read_block(fn, ud, &tag, &pl);
    if (err) goto out;
    if (tag != TAG_HEAD) {
        err = MT_CORRUPT;
        goto out;
    }
    const uint8_t *q;
    err = parse_slots(&pl, &t->cfg, 16, listed, &q);
    if (err) goto out;
    /* since (at q) is not checked: that t holds the state as of since is the caller's word. */
    upto = mt_get_le(q + 8, 8);
    if (upto > (UINT64_MAX >> 2)) {
        err = MT_CORRUPT;
        goto out;
    }
    got_head = 1;
    while (!got_end) {
        err = read_block(fn, ud, &tag, &pl);
        if (err) goto out;
        if (tag == TAG_ROWS) {
            err = put_rows(t, &pl, listed, 1, &nrows, &maxver);
            nblocks++;
        } else if (tag == TAG_DELS) {
            err = del_rows(t, &pl, listed, &ndels);
            nblocks++;
        } else if (tag == TAG_END) {
            if (pl.len != 24 || mt_get_le(pl.p, 8) != nrows || mt_get_le(pl.p + 8, 8) != ndels ||
                mt_get_le(pl.p + 16, 8) != nblocks)
                err = MT_CORRUPT;
            got_end = 1;
        } else {
            err = MT_CORRUPT; /* a second HEAD, or the FILT of a table stream */
        }
        if (err) goto out;
    }
    uint8_t extra;
    size_t got = 0;
    err = fn(ud, &extra, 1, &got);
    if (!err && got != 0) err = MT_CORRUPT; /* nothing may follow END. */
out:
    /* Also after a failure that left part of the stream in t. */
    if (got_head && (!err || nrows || ndels)) raise_clock(t, upto > maxver ? upto : maxver);
    if (rows) *rows = nrows;
    if (deletions) *deletions = ndels;
    free(pl.p);
    return err;
}
