/*
 * csv.c - a user's own log (any CSV / TSV, plain or gzip) as impressions and clicks: every
 * row is one impression, and a row whose label (the action column) is positive is also a
 * click, delivered action_delay_ms later by the core.
 *
 * Parsing is the data module's generic reader (data/readers.h), configured by the caller
 * (`monolith replay` builds it from [input], as the batch trainer does: mt/config_input.h);
 * the request id and the item id are the reader's text columns. The file is read whole at
 * open, one row at a time into a scratch batch (so that each row keeps its line number and
 * a bad one can be dropped), the good rows appended to one batch, and replayed in the order
 * of an index sorted by (timestamp, file order): logs are rarely in time order to the
 * millisecond (several writers, late flushes). Memory per row: its fids (8 bytes each), 8
 * bytes per slot of offsets, 64 bytes of label, time, line, item, request id offset and sort
 * key, and the request id's bytes when they come from a column.
 *
 * Bad rows, counted and reported with their line: the reader's (column count, an unparsable
 * label, timestamp or int value, a line over 1 MiB), and ours: an empty or overlong (over
 * MT_REPLAY_MAX_REQUEST_ID bytes) request id, an empty item id, more fids than an impression
 * holds, and a (request id, item) pair already seen on an earlier line (the joiner would drop
 * it as a duplicate: the first row is kept).
 *
 * Sides: the slots that input.columns feeds from the item id's column are item-side, all
 * others user-side (the joiner merges both into one example; only serving tells them apart).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "mt/readers.h"
#include "mt/grow.h"
#include "replay_int.h"

typedef struct csv_key {
    int64_t timestamp_ms;
    size_t i;
} csv_key_t;

typedef struct csv_state {
    mt_batch_t b;    /* the kept rows, in file order */
    uint64_t *lines; /* [b.n] */
    uint64_t *items; /* [b.n] */
    size_t *rid_off; /* [b.n] into rids; NULL without a request id column */
    char *rids;      /* NUL-terminated request ids */
    size_t nrids, cap_rids, cap_rows;
    csv_key_t *order; /* [norder]: the replay order */
    size_t norder, pos;
    bool item_side[2 * MT__REPLAY_MAX_SLOTS]; /* per slot of b */
} csv_state_t;

/* ---------------------------------------------------------------------------------------- */
/* gzip or plain, as a FILE * for the reader (zlib reads both)                              */
/* ---------------------------------------------------------------------------------------- */

static ssize_t gz_cookie_read(void *cookie, char *buf, size_t size) {
    int n = gzread((gzFile)cookie, buf, size > INT_MAX ? INT_MAX : (unsigned)size);
    return n < 0 ? -1 : n;
}

static int gz_cookie_close(void *cookie) {
    (void)cookie; /* gzclose() is mt__replay_csv_open()'s, after gzerror() */
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The source                                                                               */
/* ---------------------------------------------------------------------------------------- */

static void csv_destroy(void *state) {
    csv_state_t *st = state;
    if (!st) return;
    mt_batch_free(&st->b);
    free(st->lines);
    free(st->items);
    free(st->rid_off);
    free(st->rids);
    free(st->order);
    free(st);
}

static mt_err_t csv_next(mt_replay_t *r, void *state, mt__replay_imp_t *imp) {
    csv_state_t *st = state;
    (void)r;
    if (st->pos >= st->norder) return MT_NOT_FOUND;
    size_t i = st->order[st->pos++].i;
    const mt_batch_t *b = &st->b;
    imp->timestamp_ms = b->timestamps_ms[i];
    if (st->rid_off)
        snprintf(imp->request_id, sizeof(imp->request_id), "%s", st->rids + st->rid_off[i]);
    else
        snprintf(imp->request_id, sizeof(imp->request_id), "csv-%llu",
                 (unsigned long long)st->lines[i]);
    imp->item_id = st->items[i];
    imp->clicked = b->labels[i] > 0.5f;
    imp->line = st->lines[i];
    mt_err_t err = MT_OK;
    for (uint32_t s = 0; s < b->nslots && !err; s++) {
        size_t cnt;
        const uint64_t *f = mt_batch_fids(b, i, s, &cnt);
        err = mt__replay_imp_add(imp, !st->item_side[s], b->slot_ids[s], f, (uint32_t)cnt);
    }
    return err; /* MT_LIMIT cannot happen: slots and fids were checked at open */
}

static const mt__replay_source_t csv_source = {csv_next, csv_destroy};

static int key_cmp(const void *a, const void *b) {
    const csv_key_t *x = a, *y = b;
    if (x->timestamp_ms != y->timestamp_ms) return x->timestamp_ms < y->timestamp_ms ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* For the duplicate check (qsort_r): rows by (request id, item, file order). */
static int dup_cmp(const void *a, const void *b, void *arg) {
    const csv_state_t *st = arg;
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    int c = strcmp(st->rids + st->rid_off[x], st->rids + st->rid_off[y]);
    if (c) return c;
    if (st->items[x] != st->items[y]) return st->items[x] < st->items[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

typedef struct dup_pair {
    size_t row, first; /* row repeats the (request id, item) of the earlier row first */
} dup_pair_t;

static int pair_cmp(const void *a, const void *b) {
    size_t x = ((const dup_pair_t *)a)->row, y = ((const dup_pair_t *)b)->row;
    return x < y ? -1 : x > y;
}

static void csv_bad_line(void *opaque, uint64_t line, const char *reason) {
    mt__replay_bad_row(opaque, line, "%s", reason);
}

/* The item id of a text: an integer below 2^48 is itself, other text its 48-bit hash (the
 * value part of mt_fid_of_bytes()), as an int slot's fid would hold it. */
static uint64_t item_of(const char *p, size_t len) {
    uint64_t v = 0;
    bool digits = len > 0 && len <= 15;
    for (size_t k = 0; k < len && digits; k++) {
        if (p[k] < '0' || p[k] > '9')
            digits = false;
        else
            v = v * 10 + (uint64_t)(p[k] - '0');
    }
    if (digits && v < (1ull << 48)) return v;
    return mt_fid_of_bytes(0, p, len) & 0xFFFFFFFFFFFFull;
}

static bool has_column(mt_csv_column_t c) {
    return c.name || c.index >= 0;
}

static bool same_column(mt_csv_column_t a, mt_csv_column_t b) {
    if (a.name || b.name) return a.name && b.name && !strcmp(a.name, b.name);
    return a.index == b.index;
}

/* Room for row b.n in the per-row arrays. */
static mt_err_t grow_rows(csv_state_t *st, bool rids) {
    if (st->b.n < st->cap_rows) return MT_OK;
    size_t c = st->cap_rows ? st->cap_rows * 2 : 1024;
    uint64_t *l = realloc(st->lines, c * sizeof(uint64_t));
    if (l) st->lines = l;
    uint64_t *it = realloc(st->items, c * sizeof(uint64_t));
    if (it) st->items = it;
    size_t *ro = rids ? realloc(st->rid_off, c * sizeof(size_t)) : NULL;
    if (ro) st->rid_off = ro;
    if (!l || !it || (rids && !ro)) return MT_NOMEM;
    st->cap_rows = c;
    return MT_OK;
}

/* Marks the slots the item column feeds as item-side and checks both sides' sizes. */
static mt_err_t assign_sides(csv_state_t *st, const mt_csv_config_t *rc, mt_csv_column_t item,
                             char *errbuf, size_t errlen) {
    uint32_t nuser = 0, nitem = 0;
    if (st->b.nslots > 2 * MT__REPLAY_MAX_SLOTS) goto too_many;
    for (uint32_t s = 0; s < st->b.nslots; s++) {
        bool is_item = false;
        for (size_t k = 0; k < rc->nslots_cfg && has_column(item); k++)
            if (rc->slots[k].slot_id == st->b.slot_ids[s] && same_column(rc->slots[k].column, item))
                is_item = true;
        st->item_side[s] = is_item;
        if (is_item)
            nitem++;
        else
            nuser++;
    }
    if (nuser <= MT__REPLAY_MAX_SLOTS && nitem <= MT__REPLAY_MAX_SLOTS) return MT_OK;
too_many:
    if (errbuf && errlen)
        snprintf(errbuf, errlen, "csv: %u slots (%u user-side, %u item-side): at most %d a side",
                 st->b.nslots, nuser, nitem, MT__REPLAY_MAX_SLOTS);
    return MT_CONFIG;
}

/* Marks in @p dup every row whose (request id, item) an earlier row has, and reports it as
 * a bad row (in line order, naming the earlier line). */
static mt_err_t mark_duplicates(mt_replay_t *r, csv_state_t *st, bool *dup) {
    size_t n = st->b.n, np = 0;
    if (!st->rid_off || n < 2) return MT_OK;
    size_t *idx = malloc(n * sizeof(size_t));
    dup_pair_t *pairs = malloc(n * sizeof(dup_pair_t));
    if (!idx || !pairs) {
        free(idx);
        free(pairs);
        return MT_NOMEM;
    }
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    qsort_r(idx, n, sizeof(size_t), dup_cmp, st);
    size_t run = idx[0]; /* the first row (smallest index) of a run of equal pairs */
    for (size_t k = 1; k < n; k++) {
        size_t b = idx[k];
        if (st->items[run] == st->items[b] &&
            !strcmp(st->rids + st->rid_off[run], st->rids + st->rid_off[b])) {
            dup[b] = true;
            pairs[np++] = (dup_pair_t){b, run};
        } else {
            run = b;
        }
    }
    qsort(pairs, np, sizeof(dup_pair_t), pair_cmp);
    for (size_t k = 0; k < np; k++) {
        size_t b = pairs[k].row;
        mt__replay_bad_row(r, st->lines[b], "request '%.40s' showed item %llu already on line %llu",
                           st->rids + st->rid_off[b], (unsigned long long)st->items[b],
                           (unsigned long long)st->lines[pairs[k].first]);
    }
    free(idx);
    free(pairs);
    return MT_OK;
}

/* Reads one good row of the scratch batch @p sb (line @p line) into st, or reports it bad. */
static mt_err_t keep_row(mt_replay_t *r, csv_state_t *st, const mt_reader_t *rd,
                         const mt_batch_t *sb, uint64_t line, int rid_t, int item_t) {
    const char *rid = NULL, *item = NULL;
    size_t rid_len = 0, item_len = 0;
    if (rid_t >= 0 && mt_reader_csv_text(rd, (size_t)rid_t, &rid, &rid_len) != MT_OK)
        return MT_INTERNAL;
    if (item_t >= 0 && mt_reader_csv_text(rd, (size_t)item_t, &item, &item_len) != MT_OK)
        return MT_INTERNAL;
    if (rid && rid_len == 0) {
        mt__replay_bad_row(r, line, "empty request id");
        return MT_OK;
    }
    if (rid && rid_len > MT_REPLAY_MAX_REQUEST_ID) {
        mt__replay_bad_row(r, line, "request id of %zu bytes (at most %d)", rid_len,
                           MT_REPLAY_MAX_REQUEST_ID);
        return MT_OK;
    }
    if (item && item_len == 0) {
        mt__replay_bad_row(r, line, "empty item id");
        return MT_OK;
    }
    if (sb->nfids > MT__REPLAY_MAX_FIDS) {
        mt__replay_bad_row(r, line, "%zu fids (an impression holds at most %d)", sb->nfids,
                           MT__REPLAY_MAX_FIDS);
        return MT_OK;
    }
    const uint64_t *fids[2 * MT__REPLAY_MAX_SLOTS];
    uint32_t counts[2 * MT__REPLAY_MAX_SLOTS];
    for (uint32_t s = 0; s < sb->nslots; s++) {
        size_t cnt;
        fids[s] = mt_batch_fids(sb, 0, s, &cnt);
        counts[s] = (uint32_t)cnt;
    }
    mt_err_t err = grow_rows(st, rid != NULL);
    if (!err && rid)
        err = mt_grow((void **)&st->rids, &st->cap_rids, st->nrids + rid_len + 1, 1, 1024);
    if (err) return err;
    if ((err = mt_batch_add(&st->b, sb->labels[0], sb->timestamps_ms[0], 1.0f, fids, counts)))
        return err == MT_INVALID ? MT_INTERNAL : err;
    size_t i = st->b.n - 1;
    st->lines[i] = line;
    st->items[i] = item ? item_of(item, item_len) : 0;
    if (rid) {
        st->rid_off[i] = st->nrids;
        memcpy(st->rids + st->nrids, rid, rid_len + 1);
        st->nrids += rid_len + 1;
    }
    return MT_OK;
}

mt_err_t mt__replay_csv_open(mt_replay_t *r, void **state, const mt__replay_source_t **src,
                             char *errbuf, size_t errlen) {
    const mt_replay_csv_config_t *cc = &r->cfg.csv;
    mt_csv_config_t rc = *cc->reader;
    mt_csv_column_t texts[2];
    const char *names[2];
    int rid_t = -1, item_t = -1;
    size_t nt = 0;
    if (has_column(cc->request_id)) {
        rid_t = (int)nt;
        names[nt] = "request_id";
        texts[nt++] = cc->request_id;
    }
    if (has_column(cc->item_id)) {
        item_t = (int)nt;
        names[nt] = "item_id";
        texts[nt++] = cc->item_id;
    }
    rc.text_columns = texts;
    rc.text_names = names;
    rc.ntext_columns = nt;

    mt_err_t err = MT_OK;
    char msg[256] = "";
    csv_state_t *st = calloc(1, sizeof(*st));
    bool *dup = NULL;
    gzFile gz = NULL;
    FILE *f = NULL;
    mt_reader_t *rd = NULL;
    mt_batch_t sb;
    memset(&sb, 0, sizeof(sb));
    if (!st) return MT_NOMEM;
    struct stat sst;
    bool is_dir = stat(r->path, &sst) == 0 && S_ISDIR(sst.st_mode);
    if (is_dir || !(gz = gzopen(r->path, "rb"))) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "cannot open %s: %s", r->path,
                     is_dir ? "a directory" : strerror(errno));
        err = MT_IO;
        goto out;
    }
    gzbuffer(gz, 1u << 17);
    f = fopencookie(gz, "r", (cookie_io_functions_t){gz_cookie_read, NULL, NULL, gz_cookie_close});
    if (!f) {
        err = MT_NOMEM;
        goto out;
    }
    if (rc.header) { /* an empty file is no log (and has no header to resolve names in) */
        int ch = fgetc(f);
        if (ch == EOF) {
            int zerr;
            const char *zmsg = gzerror(gz, &zerr);
            if (errbuf && errlen)
                snprintf(errbuf, errlen, "%s: %s", r->path,
                         zerr != Z_OK ? zmsg : "empty file (no header line)");
            err = zerr != Z_OK ? MT_IO : MT_CORRUPT;
            goto out;
        }
        ungetc(ch, f);
    }
    if ((err = mt_reader_csv_open(&rc, NULL, f, &rd, msg, sizeof(msg)))) {
        if (errbuf && errlen) snprintf(errbuf, errlen, "%s: %s", r->path, msg);
        goto out;
    }
    if ((err = mt_reader_batch_init(rd, &sb)) || (err = mt_reader_batch_init(rd, &st->b))) goto out;
    if ((err = assign_sides(st, &rc, cc->item_id, errbuf, errlen))) goto out;
    mt_reader_set_bad_line_cb(rd, csv_bad_line, r);
    for (;;) {
        mt_batch_clear(&sb);
        err = mt_reader_next(rd, &sb, 1);
        if (err == MT_NOT_FOUND) break;
        if (err) {
            int zerr;
            const char *zmsg = gzerror(gz, &zerr);
            if (errbuf && errlen)
                snprintf(errbuf, errlen, "reading %s: %s", r->path,
                         zerr != Z_OK ? zmsg : mt_strerror(err));
            goto out;
        }
        if ((err = keep_row(r, st, rd, &sb, mt_reader_stats(rd)->lines, rid_t, item_t))) goto out;
    }
    int zerr;
    const char *zmsg = gzerror(gz, &zerr);
    if (zerr != Z_OK) { /* Z_BUF_ERROR: a truncated gzip stream */
        if (errbuf && errlen) snprintf(errbuf, errlen, "%s: read error: %s", r->path, zmsg);
        err = MT_IO;
        goto out;
    }
    r->stats.rows = mt_reader_stats(rd)->examples + mt_reader_stats(rd)->bad_lines;
    dup = calloc(st->b.n ? st->b.n : 1, sizeof(bool));
    st->order = malloc((st->b.n ? st->b.n : 1) * sizeof(csv_key_t));
    if (!dup || !st->order) {
        err = MT_NOMEM;
        goto out;
    }
    if ((err = mark_duplicates(r, st, dup))) goto out;
    for (size_t i = 0; i < st->b.n; i++)
        if (!dup[i]) st->order[st->norder++] = (csv_key_t){st->b.timestamps_ms[i], i};
    if (st->norder) qsort(st->order, st->norder, sizeof(csv_key_t), key_cmp);
    r->stats.requests = st->norder;
    *state = st;
    *src = &csv_source;
    st = NULL;
out:
    mt_batch_free(&sb);
    mt_reader_destroy(rd);
    if (f) fclose(f);
    if (gz) gzclose(gz);
    free(dup);
    csv_destroy(st);
    return err;
}
