/*
 * trivago.c - the trivago RecSys Challenge 2019 session log as impressions and clicks.
 *
 * Input: CSV with a header (RFC 4180 quotes within a line), plain or gzip (zlib reads
 * both), columns found by name:
 *   user_id,session_id,timestamp,step,action_type,reference,platform,city,device,
 *   current_filters,impressions,prices
 * session_id, timestamp, step, action_type, reference and impressions are required; the
 * others feed their slots when present. Rows are grouped by session in step order, not
 * globally in time order: the whole file is read at open, its click-out rows are kept in a
 * compact form (fids already computed) and sorted by (timestamp, line).
 *
 * A kept click-out (request) in memory:
 *
 *   req.ufid_off ──▶ pool: [user][platform][city][device][filters...][session items...][hour]
 *                          (ucnt[k] fids for each of the 7 user slots, in that order)
 *   req.item_off ──▶ hotels: [hotel 0 .. hotel n-1]    prices: [price 0 .. price n-1]
 *   req.rid_off  ──▶ names:  "tv-<session_id>-<step>\0"
 *
 * The session-items slot is computed while reading, in file order: the hotels that earlier
 * rows of the same (contiguous) session referenced with an item action ("interaction item
 * ..." or "clickout item"), most recent last, at most MT_TRIVAGO_SESSION_ITEMS distinct.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "mt/batch.h"
#include "mt/grow.h"
#include "replay_int.h"

#define TV_MAX_COLS    64
#define TV_MAX_LIST    1024 /* shown hotels per click-out */
#define TV_MAX_FILTERS 64
#define TV_LINE_BYTES  (1u << 20)
#define TV_NUSER_SLOTS 7
#define TV_MAX_SESSION 47 /* bytes of a session id (the request id must fit) */

enum {
    C_USER,
    C_SESSION,
    C_TS,
    C_STEP,
    C_ACTION,
    C_REF,
    C_PLATFORM,
    C_CITY,
    C_DEVICE,
    C_FILTERS,
    C_IMPRESSIONS,
    C_PRICES,
    C_N
};
static const char *const col_names[C_N] = {
    "user_id",     "session_id",      "timestamp",   "step",
    "action_type", "reference",       "platform",    "city",
    "device",      "current_filters", "impressions", "prices"};
static const bool col_required[C_N] = {false, true,  true,  true,  true, true,
                                       false, false, false, false, true, false};
static const uint16_t user_slots[TV_NUSER_SLOTS] = {
    MT_TRIVAGO_SLOT_USER,   MT_TRIVAGO_SLOT_PLATFORM, MT_TRIVAGO_SLOT_CITY,
    MT_TRIVAGO_SLOT_DEVICE, MT_TRIVAGO_SLOT_FILTERS,  MT_TRIVAGO_SLOT_SESSION_ITEMS,
    MT_TRIVAGO_SLOT_HOUR};

typedef struct tv_req {
    int64_t timestamp_ms;
    uint64_t line;
    size_t ufid_off, item_off, rid_off;
    uint32_t nitems;
    int32_t clicked; /* index in the list, -1: the clicked hotel was not shown */
    uint8_t ucnt[TV_NUSER_SLOTS];
} tv_req_t;

typedef struct tv_state {
    tv_req_t *reqs;
    size_t nreqs, cap_reqs;
    uint64_t *pool; /* user-side fids */
    size_t npool, cap_pool;
    uint64_t *hotels;
    double *prices; /* parallel to hotels, when the file has prices */
    size_t nitems, cap_items, cap_prices;
    char *names;
    size_t nnames, cap_names;
    bool has_prices;
    /* the cursor */
    size_t k;   /* request */
    uint32_t j; /* position in its list */
} tv_state_t;

/* ---------------------------------------------------------------------------------------- */
/* Parsing helpers                                                                          */
/* ---------------------------------------------------------------------------------------- */

/* Splits @p line in place into at most @p max fields; quotes per RFC 4180 within the line.
 * @returns the number of fields, or -1 (a stray quote, or more than max fields). */
static int split_csv(char *line, char **f, int max) {
    int n = 0;
    char *p = line;
    for (;;) {
        if (n == max) return -1;
        if (*p == '"') {
            char *w = ++p;
            f[n++] = w;
            for (;;) {
                if (*p == '\0') return -1;
                if (*p == '"') {
                    if (p[1] == '"') {
                        *w++ = '"';
                        p += 2;
                        continue;
                    }
                    p++;
                    break;
                }
                *w++ = *p++;
            }
            char c = *p;
            if (c != ',' && c != '\0') return -1;
            *w = '\0';
            if (c == '\0') return n;
            p++;
        } else {
            f[n++] = p;
            while (*p && *p != ',')
                p++;
            if (!*p) return n;
            *p++ = '\0';
        }
    }
}

/* A non-negative decimal integer below 2^48 (the whole string). */
static bool parse_u48(const char *s, uint64_t *out) {
    if (!isdigit((unsigned char)*s)) return false;
    uint64_t v = 0;
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s)) return false;
        v = v * 10 + (uint64_t)(*s - '0');
        if (v >= (1ull << 48)) return false;
    }
    *out = v;
    return true;
}

static bool parse_price(const char *s, double *out) {
    if (!*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno || !(v >= 0) || v > 1e12) return false;
    *out = v;
    return true;
}

/* Splits @p s on '|' in place into @p out (at most @p max pieces); "" gives 0 pieces.
 * @returns the count, or -1 when there are more than @p max. */
static int split_bar(char *s, char **out, int max) {
    if (!*s) return 0;
    int n = 0;
    for (;;) {
        if (n == max) return -1;
        out[n++] = s;
        char *bar = strchr(s, '|');
        if (!bar) return n;
        *bar = '\0';
        s = bar + 1;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Reading the file                                                                         */
/* ---------------------------------------------------------------------------------------- */

typedef struct tv_session {
    char id[TV_MAX_SESSION + 1];
    uint64_t items[MT_TRIVAGO_SESSION_ITEMS]; /* oldest first */
    uint32_t n;
} tv_session_t;

static void session_push(tv_session_t *s, uint64_t hotel) {
    for (uint32_t i = 0; i < s->n; i++) {
        if (s->items[i] == hotel) { /* seen: move it to the most recent place */
            memmove(&s->items[i], &s->items[i + 1], (s->n - i - 1) * sizeof(uint64_t));
            s->items[s->n - 1] = hotel;
            return;
        }
    }
    if (s->n == MT_TRIVAGO_SESSION_ITEMS) {
        memmove(&s->items[0], &s->items[1], (s->n - 1) * sizeof(uint64_t));
        s->n--;
    }
    s->items[s->n++] = hotel;
}

/* One data row. @returns MT_OK (kept or skipped as bad) or MT_NOMEM. */
static mt_err_t read_row(mt_replay_t *r, tv_state_t *st, tv_session_t *sess, const int *col,
                         int ncols, char *line, uint64_t lineno) {
    char *f[TV_MAX_COLS];
    int n = split_csv(line, f, TV_MAX_COLS);
    if (n != ncols) {
        if (n < 0)
            mt__replay_bad_row(r, lineno, "bad CSV quoting or too many columns");
        else
            mt__replay_bad_row(r, lineno, "%d columns, the header has %d", n, ncols);
        return MT_OK;
    }
#define F(c) (col[c] >= 0 ? f[col[c]] : "")
    const char *session = F(C_SESSION), *action = F(C_ACTION), *ref = F(C_REF);
    if (!*session || strlen(session) > TV_MAX_SESSION) {
        mt__replay_bad_row(r, lineno, "session_id empty or longer than %d bytes", TV_MAX_SESSION);
        return MT_OK;
    }
    if (strcmp(sess->id, session) != 0) { /* a new session */
        snprintf(sess->id, sizeof(sess->id), "%s", session);
        sess->n = 0;
    }
    bool clickout = strcmp(action, "clickout item") == 0;
    uint64_t ref_hotel = 0;
    bool ref_is_item = parse_u48(ref, &ref_hotel);
    if (!clickout) {
        if (ref_is_item && strncmp(action, "interaction item", 16) == 0)
            session_push(sess, ref_hotel);
        return MT_OK;
    }
    /* a click-out: validate everything first, then append */
    uint64_t ts_s, step;
    if (!parse_u48(F(C_TS), &ts_s)) {
        mt__replay_bad_row(r, lineno, "timestamp '%.32s' is not a number", F(C_TS));
        return MT_OK;
    }
    if (!parse_u48(F(C_STEP), &step)) {
        mt__replay_bad_row(r, lineno, "step '%.32s' is not a number", F(C_STEP));
        return MT_OK;
    }
    if (!ref_is_item) {
        mt__replay_bad_row(r, lineno, "clickout reference '%.32s' is not an item id", ref);
        return MT_OK;
    }
    char *shown_l[TV_MAX_LIST], *price_l[TV_MAX_LIST];
    int nshown = split_bar(f[col[C_IMPRESSIONS]], shown_l, TV_MAX_LIST);
    if (nshown <= 0) {
        mt__replay_bad_row(
            r, lineno, nshown == 0 ? "clickout without impressions" : "more than %d impressions",
            TV_MAX_LIST);
        return MT_OK;
    }
    int nprices = 0;
    if (st->has_prices) {
        nprices = split_bar(f[col[C_PRICES]], price_l, TV_MAX_LIST);
        if (nprices != nshown) {
            mt__replay_bad_row(r, lineno, "%d prices for %d impressions", nprices, nshown);
            return MT_OK;
        }
    }
    mt_err_t err = mt_grow((void **)&st->hotels, &st->cap_items, st->nitems + (size_t)nshown,
                           sizeof(uint64_t), 1024);
    if (!err && st->has_prices)
        err = mt_grow((void **)&st->prices, &st->cap_prices, st->nitems + (size_t)nshown,
                      sizeof(double), 1024);
    if (err) return err;
    int32_t clicked = -1;
    for (int i = 0; i < nshown; i++) {
        uint64_t h;
        double price = 0;
        if (!parse_u48(shown_l[i], &h)) {
            mt__replay_bad_row(r, lineno, "impression %d '%.32s' is not an item id", i + 1,
                               shown_l[i]);
            return MT_OK;
        }
        if (st->has_prices && !parse_price(price_l[i], &price)) {
            mt__replay_bad_row(r, lineno, "price %d '%.32s' is not a number", i + 1, price_l[i]);
            return MT_OK;
        }
        st->hotels[st->nitems + (size_t)i] = h;
        if (st->has_prices) st->prices[st->nitems + (size_t)i] = price;
        if (h == ref_hotel && clicked < 0) clicked = i;
    }
    /* user-side fids */
    uint64_t ufids[4 + TV_MAX_FILTERS + MT_TRIVAGO_SESSION_ITEMS + 1];
    tv_req_t q;
    memset(&q, 0, sizeof(q));
    uint32_t nu = 0;
    const int strcols[4] = {C_USER, C_PLATFORM, C_CITY, C_DEVICE};
    for (int k = 0; k < 4; k++) {
        const char *v = F(strcols[k]);
        if (*v) {
            ufids[nu++] = mt_fid_of_bytes(user_slots[k], v, strlen(v));
            q.ucnt[k] = 1;
        }
    }
    char *filters[TV_MAX_FILTERS];
    int nf = col[C_FILTERS] >= 0 ? split_bar(f[col[C_FILTERS]], filters, TV_MAX_FILTERS) : 0;
    if (nf < 0) nf = TV_MAX_FILTERS; /* the first ones only (split_bar filled them) */
    for (int k = 0; k < nf; k++)
        if (*filters[k]) {
            ufids[nu++] = mt_fid_of_bytes(MT_TRIVAGO_SLOT_FILTERS, filters[k], strlen(filters[k]));
            q.ucnt[4]++;
        }
    for (uint32_t k = 0; k < sess->n; k++)
        ufids[nu++] = mt_fid_of_int(MT_TRIVAGO_SLOT_SESSION_ITEMS, sess->items[k]);
    q.ucnt[5] = (uint8_t)sess->n;
    ufids[nu++] = mt_fid_of_int(MT_TRIVAGO_SLOT_HOUR, (ts_s % 86400) / 3600);
    q.ucnt[6] = 1;

    char rid[MT_REPLAY_MAX_REQUEST_ID + 1];
    int rlen = snprintf(rid, sizeof(rid), "tv-%s-%llu", session, (unsigned long long)step);
    if (rlen < 0 || (size_t)rlen >= sizeof(rid)) {
        mt__replay_bad_row(r, lineno, "request id too long");
        return MT_OK;
    }
    if ((err =
             mt_grow((void **)&st->pool, &st->cap_pool, st->npool + nu, sizeof(uint64_t), 1024)) ||
        (err = mt_grow((void **)&st->names, &st->cap_names, st->nnames + (size_t)rlen + 1, 1,
                       1024)) ||
        (err = mt_grow((void **)&st->reqs, &st->cap_reqs, st->nreqs + 1, sizeof(tv_req_t), 1024)))
        return err;
    q.timestamp_ms = (int64_t)ts_s * 1000;
    q.line = lineno;
    q.ufid_off = st->npool;
    q.item_off = st->nitems;
    q.rid_off = st->nnames;
    q.nitems = (uint32_t)nshown;
    q.clicked = clicked;
    memcpy(st->pool + st->npool, ufids, nu * sizeof(uint64_t));
    st->npool += nu;
    memcpy(st->names + st->nnames, rid, (size_t)rlen + 1);
    st->nnames += (size_t)rlen + 1;
    st->nitems += (size_t)nshown;
    st->reqs[st->nreqs++] = q;
    r->stats.requests++;
    if (clicked < 0) r->stats.clicks_not_shown++;
    session_push(sess, ref_hotel); /* the click is history for the next click-outs */
    return MT_OK;
#undef F
}

static int req_cmp(const void *a, const void *b) {
    const tv_req_t *x = a, *y = b;
    if (x->timestamp_ms != y->timestamp_ms) return x->timestamp_ms < y->timestamp_ms ? -1 : 1;
    return x->line < y->line ? -1 : x->line > y->line;
}

static void tv_destroy(void *state) {
    tv_state_t *st = state;
    if (!st) return;
    free(st->reqs);
    free(st->pool);
    free(st->hotels);
    free(st->prices);
    free(st->names);
    free(st);
}

/* ---------------------------------------------------------------------------------------- */
/* Emitting                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static uint64_t price_bucket(double price) {
    return (uint64_t)floor(4.0 * log2(1.0 + price));
}

static mt_err_t tv_next(mt_replay_t *r, void *state, mt__replay_imp_t *imp) {
    tv_state_t *st = state;
    while (st->k < st->nreqs && st->j >= st->reqs[st->k].nitems) {
        st->k++;
        st->j = 0;
    }
    if (st->k >= st->nreqs) return MT_NOT_FOUND;
    const tv_req_t *q = &st->reqs[st->k];
    uint32_t j = st->j++;
    imp->timestamp_ms = q->timestamp_ms;
    snprintf(imp->request_id, sizeof(imp->request_id), "%s", st->names + q->rid_off);
    uint64_t hotel = st->hotels[q->item_off + j];
    imp->item_id = hotel;
    imp->clicked = q->clicked == (int32_t)j;
    imp->line = q->line;
    const uint64_t *u = st->pool + q->ufid_off;
    mt_err_t err = MT_OK;
    for (int k = 0; k < TV_NUSER_SLOTS && !err; k++) {
        err = mt__replay_imp_add(imp, true, user_slots[k], u, q->ucnt[k]);
        u += q->ucnt[k];
    }
    uint64_t f = mt_fid_of_int(MT_TRIVAGO_SLOT_ITEM, hotel);
    if (!err) err = mt__replay_imp_add(imp, false, MT_TRIVAGO_SLOT_ITEM, &f, 1);
    if (st->has_prices && !err) {
        const double *p = st->prices + q->item_off;
        f = mt_fid_of_int(MT_TRIVAGO_SLOT_PRICE, price_bucket(p[j]));
        err = mt__replay_imp_add(imp, false, MT_TRIVAGO_SLOT_PRICE, &f, 1);
        uint64_t rank = 0;
        for (uint32_t i = 0; i < q->nitems; i++)
            rank += p[i] < p[j];
        f = mt_fid_of_int(MT_TRIVAGO_SLOT_PRICE_RANK, rank);
        if (!err) err = mt__replay_imp_add(imp, false, MT_TRIVAGO_SLOT_PRICE_RANK, &f, 1);
    }
    f = mt_fid_of_int(MT_TRIVAGO_SLOT_POSITION, j);
    if (!err) err = mt__replay_imp_add(imp, false, MT_TRIVAGO_SLOT_POSITION, &f, 1);
    (void)r;
    return err;
}

static const mt__replay_source_t tv_source = {tv_next, tv_destroy};

/* ---------------------------------------------------------------------------------------- */
/* Opening                                                                                  */
/* ---------------------------------------------------------------------------------------- */

mt_err_t mt__replay_trivago_open(mt_replay_t *r, void **state, const mt__replay_source_t **src,
                                 char *errbuf, size_t errlen) {
    mt_err_t err = MT_OK;
    tv_state_t *st = calloc(1, sizeof(*st));
    char *line = malloc(TV_LINE_BYTES);
    tv_session_t *sess = calloc(1, sizeof(*sess));
    gzFile gz = NULL;
    if (!st || !line || !sess) {
        err = MT_NOMEM;
        goto out;
    }
    gz = gzopen(r->path, "rb");
    if (!gz) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "cannot open %s: %s", r->path, strerror(errno));
        err = MT_IO;
        goto out;
    }
    gzbuffer(gz, 1u << 17);
    int col[C_N], ncols = 0;
    uint64_t lineno = 0;
    bool header = true;
    while (gzgets(gz, line, TV_LINE_BYTES)) {
        lineno++;
        size_t len = strlen(line);
        bool whole = len > 0 && line[len - 1] == '\n';
        if (!whole && !gzeof(gz)) { /* too long: skip to the end of the line */
            int c;
            while ((c = gzgetc(gz)) != -1 && c != '\n') {
            }
            if (header) {
                if (errbuf && errlen) snprintf(errbuf, errlen, "%s: header too long", r->path);
                err = MT_CORRUPT;
                goto out;
            }
            r->stats.rows++;
            mt__replay_bad_row(r, lineno, "longer than %u bytes", TV_LINE_BYTES - 1);
            continue;
        }
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (header) {
            char *f[TV_MAX_COLS];
            ncols = split_csv(line, f, TV_MAX_COLS);
            for (int c = 0; c < C_N; c++) {
                col[c] = -1;
                for (int i = 0; i < ncols; i++)
                    if (strcmp(f[i], col_names[c]) == 0) col[c] = i;
                if (col[c] < 0 && col_required[c]) {
                    if (errbuf && errlen)
                        snprintf(errbuf, errlen,
                                 "%s: no column '%s' in the header (not a trivago "
                                 "session log?)",
                                 r->path, col_names[c]);
                    err = MT_CORRUPT;
                    goto out;
                }
            }
            st->has_prices = col[C_PRICES] >= 0;
            header = false;
            continue;
        }
        if (len == 0) continue;
        r->stats.rows++;
        if ((err = read_row(r, st, sess, col, ncols, line, lineno))) goto out;
    }
    int zerr;
    const char *zmsg = gzerror(gz, &zerr);
    if (zerr != Z_OK) { /* Z_BUF_ERROR: a truncated gzip stream */
        if (errbuf && errlen) snprintf(errbuf, errlen, "%s: read error: %s", r->path, zmsg);
        err = MT_IO;
        goto out;
    }
    if (header) {
        if (errbuf && errlen) snprintf(errbuf, errlen, "%s: empty file", r->path);
        err = MT_CORRUPT;
        goto out;
    }
    if (st->nreqs) qsort(st->reqs, st->nreqs, sizeof(tv_req_t), req_cmp);
    *state = st;
    *src = &tv_source;
    st = NULL;
out:
    if (gz) gzclose(gz);
    free(line);
    free(sess);
    tv_destroy(st);
    return err;
}
