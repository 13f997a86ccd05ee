/*
 * test_replay.c - datasets as time-ordered impressions and actions (replay/):
 *   - trivago on an inline sample (plain and gzip): requests, slots, clicks, bad rows with
 *     their lines, the session-items slot, event-time order, the delay, the limit;
 *   - the protobuf encoding decodes back to the same event;
 *   - the real trivago sample (../shared/data, when present): counts checked against an
 *     independent parse of the file; order over the whole stream;
 *   - MovieLens inline and real: positives = ratings >= 4, order;
 *   - the generator: request ids, positives, a bounded heap;
 *   - the paced run, on an injected clock (mt_replay_clock_t) whose sleeps advance it by what
 *     was asked: each event at its due time exactly, an as-fast-as-possible run never
 *     waits, the stop flag between events and while waiting, a failing sink; on the system
 *     clock only lower bounds (a busy machine makes a run slower, never faster).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "monolith/v1/example.pb-c.h"
#include "mt/batch.h"
#include "mt/replay.h"

#include "testutil_data.h"
#include "testutil_files.h"

#define TRIVAGO_SAMPLE_REL "trivago-recsys2019-sample/trivago_val_100k.csv.gz"

static char tmpdir[64];

static void make_tmpdir(void) {
    tu_tmpdir_make(tmpdir, "mt-replay-test");
}

static void remove_tmpdir(void) {
    tu_tmpdir_remove(tmpdir);
}

static void write_file(const char *path, const char *text, bool gz) {
    tu_write_file(path, text, strlen(text), gz);
}

/* A copy of one event (pointers of an event die at the next call). */
typedef struct ev_copy {
    mt_replay_kind_t kind;
    int64_t ts;
    char rid[64];
    uint64_t item;
    bool clicked;
    uint64_t line;
    uint32_t nuser, nitem;
    mt_replay_slot_t user[16], item_slots[16];
    uint64_t fids[256];
} ev_copy_t;

static void copy_event(const mt_replay_event_t *e, ev_copy_t *c) {
    memset(c, 0, sizeof(*c));
    c->kind = e->kind;
    c->ts = e->timestamp_ms;
    snprintf(c->rid, sizeof(c->rid), "%s", e->request_id);
    c->item = e->item_id;
    c->clicked = e->clicked;
    c->line = e->line;
    c->nuser = e->nuser;
    c->nitem = e->nitem;
    size_t nf = 0;
    for (uint32_t s = 0; s < e->nuser + e->nitem; s++) {
        const mt_replay_slot_t *src = s < e->nuser ? &e->user[s] : &e->item[s - e->nuser];
        mt_replay_slot_t *dst = s < e->nuser ? &c->user[s] : &c->item_slots[s - e->nuser];
        cr_assert_leq(nf + src->nfids, 256);
        memcpy(c->fids + nf, src->fids, src->nfids * sizeof(uint64_t));
        *dst = *src;
        dst->fids = c->fids + nf;
        nf += src->nfids;
    }
}

/* Reads every event of r into a malloc'd array. */
static ev_copy_t *read_all(mt_replay_t *r, size_t *n) {
    size_t cap = 64, k = 0;
    ev_copy_t *v = malloc(cap * sizeof(*v));
    cr_assert_not_null(v);
    mt_replay_event_t e;
    mt_err_t err;
    while ((err = mt_replay_next(r, &e)) == MT_OK) {
        if (k == cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof(*v));
            cr_assert_not_null(v);
        }
        copy_event(&e, &v[k++]);
    }
    cr_assert_eq(err, MT_NOT_FOUND, "%s", mt_strerror(err));
    *n = k;
    return v;
}

static const mt_replay_slot_t *find_slot(const mt_replay_slot_t *s, uint32_t n, uint16_t slot) {
    for (uint32_t i = 0; i < n; i++)
        if (s[i].slot == slot) return &s[i];
    return NULL;
}

static uint64_t v48(uint64_t fid) {
    return fid & 0xFFFFFFFFFFFFull;
}

typedef struct bad_log {
    uint64_t lines[16];
    int n;
} bad_log_t;

static void on_bad(void *opaque, uint64_t line, const char *reason) {
    bad_log_t *b = opaque;
    cr_assert(reason && *reason);
    if (b->n < 16) b->lines[b->n++] = line;
}

/* ---------------------------------------------------------------------------------------- */
/* trivago, inline                                                                          */
/* ---------------------------------------------------------------------------------------- */

/* Lines: 1 header; session A (user U1) at t=1000..1100; session B (user U2) at t=500 (an
 * earlier click-out in a later line); bad rows on lines 8, 9 and 10. */
static const char *TV_SAMPLE =
    "user_id,session_id,timestamp,step,action_type,reference,platform,city,device,"
    "current_filters,impressions,prices\n"
    "U1,sA,1000,1,interaction item image,111,FR,\"Marseille, France\",tablet,,,\n" /* 2 */
    "U1,sA,1010,2,search for destination,\"Paris, France\",FR,\"Paris, France\",tablet,,,\n"
    "U1,sA,1020,3,clickout item,222,FR,\"Paris, France\",tablet,Sort by Price|Wifi,"
    "111|222|333,80|50|120\n"                                                     /* 4 */
    "U1,sA,1100,4,clickout item,999,FR,\"Paris, France\",tablet,,444|555,70|70\n" /* 5 */
    "U2,sB,500,1,clickout item,777,DE,Berlin,mobile,,777,35\n"                    /* 6 */
    "\n"                                                                          /* 7 */
    "U2,sB,600,2,clickout item,777,DE,Berlin,mobile,,777\n"                       /* 8 */
    "U2,sB,700,3,clickout item,777,DE,Berlin,mobile,,77x|777,1|2\n"               /* 9 */
    "U2,sB,800,4,clickout item,777,DE,Berlin,mobile,,777|778,1\n";                /* 10 */

static mt_replay_t *open_tv(const char *path, int64_t delay_ms, uint64_t limit, bad_log_t *bad) {
    mt_replay_config_t cfg;
    mt_replay_config_init(&cfg);
    cfg.dataset = MT_REPLAY_TRIVAGO;
    cfg.path = path;
    cfg.action_delay_ms = delay_ms;
    cfg.limit = limit;
    cfg.bad_row_cb = bad ? on_bad : NULL;
    cfg.bad_row_opaque = bad;
    mt_replay_t *r = NULL;
    char err[256];
    mt_err_t e = mt_replay_open(&cfg, &r, err, sizeof(err));
    cr_assert_eq(e, MT_OK, "%s: %s", mt_strerror(e), err);
    return r;
}

static void check_tv_sample(bool gz) {
    make_tmpdir();
    char path[128];
    snprintf(path, sizeof(path), "%s/tv.csv%s", tmpdir, gz ? ".gz" : "");
    write_file(path, TV_SAMPLE, gz);
    bad_log_t bad = {{0}, 0};
    mt_replay_t *r = open_tv(path, 5000, 0, &bad);
    const mt_replay_stats_t *st = mt_replay_stats(r);
    cr_assert_eq(st->rows, 8, "rows %llu", (unsigned long long)st->rows); /* blank excluded */
    cr_assert_eq(st->bad_rows, 3);
    cr_assert_eq(bad.n, 3);
    cr_assert_eq(bad.lines[0], 8);
    cr_assert_eq(bad.lines[1], 9);
    cr_assert_eq(bad.lines[2], 10);
    cr_assert_eq(st->last_bad_line, 10);
    cr_assert_eq(st->nbad_kept, 3);
    cr_assert_eq(st->requests, 3);
    cr_assert_eq(st->clicks_not_shown, 1);

    size_t n;
    ev_copy_t *v = read_all(r, &n);
    /* sB-1 at 500 (1 imp + action at 505), sA-3 at 1020 (3 imps + action at 1025),
     * sA-4 at 1100 (2 imps, the click is not shown) */
    cr_assert_eq(n, 8);
    const char *want_rid[8] = {"tv-sB-1", "tv-sB-1", "tv-sA-3", "tv-sA-3",
                               "tv-sA-3", "tv-sA-3", "tv-sA-4", "tv-sA-4"};
    const int64_t want_ts[8] = {500000,  505000,  1020000, 1020000,
                                1020000, 1025000, 1100000, 1100000};
    const mt_replay_kind_t I = MT_REPLAY_IMPRESSION, A = MT_REPLAY_ACTION;
    const mt_replay_kind_t want_kind[8] = {I, A, I, I, I, A, I, I};
    const uint64_t want_item[8] = {777, 777, 111, 222, 333, 222, 444, 555};
    for (size_t i = 0; i < n; i++) {
        cr_assert_str_eq(v[i].rid, want_rid[i], "event %zu", i);
        cr_assert_eq(v[i].ts, want_ts[i], "event %zu", i);
        cr_assert_eq(v[i].kind, want_kind[i], "event %zu", i);
        cr_assert_eq(v[i].item, want_item[i], "event %zu", i);
    }
    cr_assert(v[0].clicked && !v[2].clicked && v[3].clicked && !v[4].clicked);
    cr_assert(!v[6].clicked && !v[7].clicked);
    cr_assert_eq(v[0].line, 6);
    cr_assert_eq(v[1].line, 6);
    cr_assert_eq(v[3].line, 4);

    /* the slots of impression 222 (position 1 of sA-3) */
    const ev_copy_t *e = &v[3];
    const mt_replay_slot_t *s = find_slot(e->user, e->nuser, MT_TRIVAGO_SLOT_USER);
    cr_assert(s && s->nfids == 1 && s->fids[0] == mt_fid_of_bytes(MT_TRIVAGO_SLOT_USER, "U1", 2));
    s = find_slot(e->user, e->nuser, MT_TRIVAGO_SLOT_CITY);
    cr_assert(s && s->fids[0] == mt_fid_of_bytes(MT_TRIVAGO_SLOT_CITY, "Paris, France", 13));
    s = find_slot(e->user, e->nuser, MT_TRIVAGO_SLOT_PLATFORM);
    cr_assert(s && s->fids[0] == mt_fid_of_bytes(MT_TRIVAGO_SLOT_PLATFORM, "FR", 2));
    s = find_slot(e->user, e->nuser, MT_TRIVAGO_SLOT_DEVICE);
    cr_assert(s && s->fids[0] == mt_fid_of_bytes(MT_TRIVAGO_SLOT_DEVICE, "tablet", 6));
    s = find_slot(e->user, e->nuser, MT_TRIVAGO_SLOT_FILTERS);
    cr_assert(s && s->nfids == 2);
    cr_assert_eq(s->fids[0], mt_fid_of_bytes(MT_TRIVAGO_SLOT_FILTERS, "Sort by Price", 13));
    cr_assert_eq(s->fids[1], mt_fid_of_bytes(MT_TRIVAGO_SLOT_FILTERS, "Wifi", 4));
    s = find_slot(e->user, e->nuser, MT_TRIVAGO_SLOT_SESSION_ITEMS);
    cr_assert(s && s->nfids == 1 && s->fids[0] == mt_fid_of_int(MT_TRIVAGO_SLOT_SESSION_ITEMS, 111),
              "the image interaction with 111 came before");
    s = find_slot(e->user, e->nuser, MT_TRIVAGO_SLOT_HOUR);
    cr_assert(s && s->fids[0] == mt_fid_of_int(MT_TRIVAGO_SLOT_HOUR, 0));
    s = find_slot(e->item_slots, e->nitem, MT_TRIVAGO_SLOT_ITEM);
    cr_assert(s && s->fids[0] == mt_fid_of_int(MT_TRIVAGO_SLOT_ITEM, 222));
    s = find_slot(e->item_slots, e->nitem, MT_TRIVAGO_SLOT_POSITION);
    cr_assert(s && v48(s->fids[0]) == 1);
    s = find_slot(e->item_slots, e->nitem, MT_TRIVAGO_SLOT_PRICE_RANK);
    cr_assert(s && v48(s->fids[0]) == 0, "50 is the cheapest of 80|50|120");
    s = find_slot(e->item_slots, e->nitem, MT_TRIVAGO_SLOT_PRICE);
    cr_assert(s && v48(s->fids[0]) == 22, "floor(4 log2(51)) = 22, got %llu",
              (unsigned long long)v48(s->fids[0]));
    /* every fid carries its slot */
    for (size_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < v[i].nuser + v[i].nitem; k++) {
            const mt_replay_slot_t *x =
                k < v[i].nuser ? &v[i].user[k] : &v[i].item_slots[k - v[i].nuser];
            for (uint32_t f = 0; f < x->nfids; f++)
                cr_assert_eq(x->fids[f] >> 48, x->slot);
        }
    /* sA-4: the session now also holds 222 (the click of sA-3), most recent last */
    s = find_slot(v[6].user, v[6].nuser, MT_TRIVAGO_SLOT_SESSION_ITEMS);
    cr_assert(s && s->nfids == 2 && v48(s->fids[0]) == 111 && v48(s->fids[1]) == 222);
    /* sB-1 has no filters and no history: those slots are omitted */
    cr_assert_null(find_slot(v[0].user, v[0].nuser, MT_TRIVAGO_SLOT_FILTERS));
    cr_assert_null(find_slot(v[0].user, v[0].nuser, MT_TRIVAGO_SLOT_SESSION_ITEMS));
    cr_assert_eq(st->impressions, 6);
    cr_assert_eq(st->actions, 2);
    free(v);
    mt_replay_destroy(r);
    remove_tmpdir();
}

Test(replay_trivago, inline_sample_plain) {
    check_tv_sample(false);
}

Test(replay_trivago, inline_sample_gzip) {
    check_tv_sample(true);
}

Test(replay_trivago, zero_delay_and_limit) {
    make_tmpdir();
    char path[128];
    snprintf(path, sizeof(path), "%s/tv.csv", tmpdir);
    write_file(path, TV_SAMPLE, false);
    /* delay 0: the action has its impression's time and comes after every impression of
     * that time */
    mt_replay_t *r = open_tv(path, 0, 0, NULL);
    size_t n;
    ev_copy_t *v = read_all(r, &n);
    cr_assert_eq(n, 8);
    cr_assert_eq(v[5].kind, MT_REPLAY_ACTION);
    cr_assert_eq(v[5].ts, 1020000);
    cr_assert_eq(v[4].kind, MT_REPLAY_IMPRESSION);
    cr_assert_eq(v[4].ts, 1020000);
    free(v);
    mt_replay_destroy(r);
    /* limit 2: sB-1's impression and action, then sA-3's first impression (111, no click) */
    r = open_tv(path, 5000, 2, NULL);
    v = read_all(r, &n);
    cr_assert_eq(n, 3);
    cr_assert_eq(v[0].kind, MT_REPLAY_IMPRESSION);
    cr_assert_eq(v[1].kind, MT_REPLAY_ACTION);
    cr_assert_eq(v[2].item, 111);
    free(v);
    /* limit 4: the click on 222 is within the limit; its action comes after it */
    mt_replay_destroy(r);
    r = open_tv(path, 5000, 4, NULL);
    v = read_all(r, &n);
    cr_assert_eq(n, 6);
    cr_assert_eq(v[5].kind, MT_REPLAY_ACTION);
    cr_assert_eq(v[5].item, 222);
    free(v);
    mt_replay_destroy(r);
    remove_tmpdir();
}

Test(replay_trivago, bad_files) {
    make_tmpdir();
    char path[128], err[256] = "";
    mt_replay_config_t cfg;
    mt_replay_config_init(&cfg);
    cfg.dataset = MT_REPLAY_TRIVAGO;
    mt_replay_t *r = NULL;
    cr_assert_eq(mt_replay_open(&cfg, &r, err, sizeof(err)), MT_CONFIG, "no path");
    cr_assert(strlen(err) > 0);
    snprintf(path, sizeof(path), "%s/missing.csv", tmpdir);
    cfg.path = path;
    cr_assert_eq(mt_replay_open(&cfg, &r, err, sizeof(err)), MT_IO);
    snprintf(path, sizeof(path), "%s/other.csv", tmpdir);
    write_file(path, "a,b,c\n1,2,3\n", false);
    cr_assert_eq(mt_replay_open(&cfg, &r, err, sizeof(err)), MT_CORRUPT);
    cr_assert_not_null(strstr(err, "session_id"), "%s", err);
    /* a truncated gzip is an I/O error, not a short dataset */
    snprintf(path, sizeof(path), "%s/tv.csv.gz", tmpdir);
    write_file(path, TV_SAMPLE, true);
    FILE *f = fopen(path, "r+");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    cr_assert_eq(ftruncate(fileno(f), size - 12), 0);
    fclose(f);
    cr_assert_eq(mt_replay_open(&cfg, &r, err, sizeof(err)), MT_IO, "%s", err);
    cr_assert_null(r);
    cfg.action_delay_ms = -1;
    cr_assert_eq(mt_replay_config_validate(&cfg, err, sizeof(err)), MT_CONFIG);
    remove_tmpdir();
}

/* ---------------------------------------------------------------------------------------- */
/* Encoding                                                                                 */
/* ---------------------------------------------------------------------------------------- */

Test(replay_encode, round_trip) {
    make_tmpdir();
    char path[128];
    snprintf(path, sizeof(path), "%s/tv.csv", tmpdir);
    write_file(path, TV_SAMPLE, false);
    mt_replay_t *r = open_tv(path, 5000, 0, NULL);
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    mt_replay_event_t e;
    int nimp = 0, nact = 0;
    while (mt_replay_next(r, &e) == MT_OK) {
        cr_assert_eq(mt_replay_encode(&e, &buf, &cap, &len), MT_OK);
        if (e.kind == MT_REPLAY_ACTION) {
            Monolith__V1__Action *a = monolith__v1__action__unpack(NULL, len, buf);
            cr_assert_not_null(a);
            cr_assert_str_eq(a->request_id, e.request_id);
            cr_assert_eq(a->timestamp_ms, e.timestamp_ms);
            cr_assert_eq(a->type, MONOLITH__V1__ACTION_TYPE__ACTION_CLICK);
            cr_assert_eq(a->item_id, e.item_id);
            monolith__v1__action__free_unpacked(a, NULL);
            nact++;
            continue;
        }
        Monolith__V1__Impression *m = monolith__v1__impression__unpack(NULL, len, buf);
        cr_assert_not_null(m);
        cr_assert_str_eq(m->request_id, e.request_id);
        cr_assert_eq(m->timestamp_ms, e.timestamp_ms);
        cr_assert_eq(m->item_id, e.item_id);
        cr_assert_eq(m->n_user, e.nuser);
        cr_assert_eq(m->n_item, e.nitem);
        for (size_t s = 0; s < m->n_user + m->n_item; s++) {
            const Monolith__V1__SlotFids *p = s < m->n_user ? m->user[s] : m->item[s - m->n_user];
            const mt_replay_slot_t *q = s < e.nuser ? &e.user[s] : &e.item[s - e.nuser];
            cr_assert_eq(p->slot, q->slot);
            cr_assert_eq(p->n_fids, q->nfids);
            cr_assert_eq(memcmp(p->fids, q->fids, q->nfids * sizeof(uint64_t)), 0);
        }
        monolith__v1__impression__free_unpacked(m, NULL);
        nimp++;
    }
    cr_assert_eq(nimp, 6);
    cr_assert_eq(nact, 2);
    free(buf);
    mt_replay_destroy(r);
    remove_tmpdir();
}

/* ---------------------------------------------------------------------------------------- */
/* trivago, the real sample                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* An independent count: click-out rows, shown hotels, click-outs whose reference is shown.
 * Splits on commas outside quotes, nothing more. */
static void count_trivago_file(const char *path, uint64_t *clickouts, uint64_t *shown,
                               uint64_t *clicked_shown) {
    gzFile f = gzopen(path, "rb");
    cr_assert_not_null(f);
    static char line[1 << 16];
    *clickouts = *shown = *clicked_shown = 0;
    bool header = true;
    while (gzgets(f, line, sizeof(line))) {
        if (header) {
            header = false;
            continue;
        }
        char *col[12] = {0};
        int nc = 0;
        bool q = false;
        col[nc++] = line;
        for (char *p = line; *p; p++) {
            if (*p == '"') q = !q;
            if (*p == ',' && !q && nc < 12) {
                *p = '\0';
                col[nc++] = p + 1;
            }
            if (*p == '\n') *p = '\0';
        }
        if (nc != 12 || strcmp(col[4], "clickout item") != 0) continue;
        (*clickouts)++;
        bool hit = false;
        for (char *tok = strtok(col[10], "|"); tok; tok = strtok(NULL, "|")) {
            (*shown)++;
            if (!strcmp(tok, col[5])) hit = true;
        }
        *clicked_shown += hit;
    }
    gzclose(f);
}

/* The timeout is a hang guard: 0.5 s under ASan (it was 100 s while the prices array was
 * reallocated for every row: ASan's realloc copies). */
Test(replay_trivago, real_sample_counts_and_order, .timeout = 900) {
    char sample[1024];
    mt_test_data_path(sample, sizeof(sample), TRIVAGO_SAMPLE_REL);
    mt_test_need_data(sample);
    uint64_t clickouts, shown, clicked_shown;
    count_trivago_file(sample, &clickouts, &shown, &clicked_shown);
    cr_assert_eq(clickouts, 13597, "SOURCE.txt says 13,597 click-outs");
    cr_assert_gt(shown, 300000);

    mt_replay_t *r = open_tv(sample, 5000, 0, NULL);
    const mt_replay_stats_t *st = mt_replay_stats(r);
    cr_assert_eq(st->rows, 100003);
    cr_assert_eq(st->bad_rows, 0);
    cr_assert_eq(st->requests, clickouts);
    cr_assert_eq(st->clicks_not_shown, clickouts - clicked_shown);
    mt_replay_event_t e;
    uint64_t nimp = 0, nact = 0, nclicked = 0;
    int64_t last = INT64_MIN;
    mt_replay_kind_t last_kind = MT_REPLAY_IMPRESSION;
    while (mt_replay_next(r, &e) == MT_OK) {
        cr_assert_geq(e.timestamp_ms, last, "out of order at event %llu",
                      (unsigned long long)(nimp + nact));
        if (e.timestamp_ms == last && last_kind == MT_REPLAY_ACTION)
            cr_assert_eq(e.kind, MT_REPLAY_ACTION, "an impression after an action of its time");
        last = e.timestamp_ms;
        last_kind = e.kind;
        if (e.kind == MT_REPLAY_IMPRESSION) {
            nimp++;
            nclicked += e.clicked;
            cr_assert_eq(strncmp(e.request_id, "tv-", 3), 0);
        } else {
            nact++;
        }
    }
    cr_assert_eq(nimp, shown, "%llu impressions, the file shows %llu", (unsigned long long)nimp,
                 (unsigned long long)shown);
    cr_assert_eq(nact, clicked_shown);
    cr_assert_eq(nclicked, clicked_shown);
    cr_assert_eq(st->pending_actions, 0);
    cr_assert_lt(st->max_pending_actions, 1000);
    mt_replay_destroy(r);
}

/* ---------------------------------------------------------------------------------------- */
/* MovieLens                                                                                */
/* ---------------------------------------------------------------------------------------- */

static mt_replay_t *open_ml(mt_replay_dataset_t ds, const char *path, bad_log_t *bad) {
    mt_replay_config_t cfg;
    mt_replay_config_init(&cfg);
    cfg.dataset = ds;
    cfg.path = path;
    cfg.bad_row_cb = bad ? on_bad : NULL;
    cfg.bad_row_opaque = bad;
    mt_replay_t *r = NULL;
    char err[256];
    mt_err_t e = mt_replay_open(&cfg, &r, err, sizeof(err));
    cr_assert_eq(e, MT_OK, "%s: %s", mt_strerror(e), err);
    return r;
}

Test(replay_movielens, inline_100k) {
    make_tmpdir();
    char path[128];
    snprintf(path, sizeof(path), "%s/u.data", tmpdir);
    write_file(path,
               "1\t10\t5\t300\n"
               "2\t20\t3\t100\n"
               "x\t20\t3\t100\n" /* line 3: bad */
               "3\t30\t4\t200\n"
               "1\t20\t4\t100\n",
               false);
    snprintf(path, sizeof(path), "%s/u.user", tmpdir);
    write_file(path, "1|24|M|technician|85711\n2|53|F|other|94043\n3|23|M|writer|32067\n", false);
    bad_log_t bad = {{0}, 0};
    mt_replay_t *r = open_ml(MT_REPLAY_MOVIELENS_100K, tmpdir, &bad);
    cr_assert_eq(bad.n, 1);
    cr_assert_eq(bad.lines[0], 3);
    size_t n;
    ev_copy_t *v = read_all(r, &n);
    /* t=100: ml-2-20 (3, no click), ml-1-20 (4: click at 105); t=200 ml-3-30 (click at 205);
     * t=300: ml-1-10 (click at 305) */
    cr_assert_eq(n, 7);
    cr_assert_str_eq(v[0].rid, "ml-2-20");
    cr_assert(!v[0].clicked);
    cr_assert_eq(v[0].line, 2);
    cr_assert_str_eq(v[1].rid, "ml-1-20");
    cr_assert_eq(v[1].line, 5);
    cr_assert_eq(v[2].kind, MT_REPLAY_ACTION);
    cr_assert_str_eq(v[2].rid, "ml-1-20");
    cr_assert_eq(v[2].ts, 105000);
    cr_assert_str_eq(v[3].rid, "ml-3-30");
    cr_assert_eq(v[4].kind, MT_REPLAY_ACTION);
    cr_assert_str_eq(v[5].rid, "ml-1-10");
    cr_assert_eq(v[5].item, 10);
    cr_assert_eq(v[6].kind, MT_REPLAY_ACTION);
    /* user side: user, age, gender, occupation; item side: movie */
    const mt_replay_slot_t *s = find_slot(v[5].user, v[5].nuser, 1);
    cr_assert(s && v48(s->fids[0]) == 1);
    cr_assert_not_null(find_slot(v[5].user, v[5].nuser, 4));
    s = find_slot(v[5].item_slots, v[5].nitem, 2);
    cr_assert(s && v48(s->fids[0]) == 10);
    free(v);
    mt_replay_destroy(r);
    remove_tmpdir();
}

/* Ratings >= 4 counted straight from the file; the rating column is @p col (0-based). */
static void count_ratings(const char *path, char sep, bool header, uint64_t *rows, uint64_t *pos) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    char line[512];
    *rows = *pos = 0;
    while (fgets(line, sizeof(line), f)) {
        if (header) {
            header = false;
            continue;
        }
        char *p = strchr(line, sep);
        cr_assert_not_null(p);
        p = strchr(p + 1, sep);
        cr_assert_not_null(p);
        (*rows)++;
        *pos += strtod(p + 1, NULL) >= 4.0;
    }
    fclose(f);
}

static void check_ml_real(mt_replay_dataset_t ds, const char *sub, const char *file, char sep,
                          bool header) {
    char dir[1024], path[1100];
    mt_test_data_path(dir, sizeof(dir), sub);
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    mt_test_need_data(path);
    uint64_t rows, pos;
    count_ratings(path, sep, header, &rows, &pos);
    mt_replay_t *r = open_ml(ds, dir, NULL);
    mt_replay_event_t e;
    uint64_t nimp = 0, nact = 0, nclicked = 0;
    int64_t last = INT64_MIN;
    while (mt_replay_next(r, &e) == MT_OK) {
        cr_assert_geq(e.timestamp_ms, last);
        last = e.timestamp_ms;
        if (e.kind == MT_REPLAY_IMPRESSION) {
            nimp++;
            nclicked += e.clicked;
        } else {
            nact++;
        }
    }
    cr_assert_eq(nimp, rows);
    cr_assert_eq(nact, pos, "%llu actions, %llu ratings >= 4", (unsigned long long)nact,
                 (unsigned long long)pos);
    cr_assert_eq(nclicked, pos);
    cr_assert_eq(mt_replay_stats(r)->bad_rows, 0);
    mt_replay_destroy(r);
}

Test(replay_movielens, real_100k_positives) {
    check_ml_real(MT_REPLAY_MOVIELENS_100K, "movielens-100k", "u.data", '\t', false);
}

Test(replay_movielens, real_latest_positives) {
    check_ml_real(MT_REPLAY_MOVIELENS_LATEST, "movielens-latest-small", "ratings.csv", ',', true);
}

/* ---------------------------------------------------------------------------------------- */
/* The generator                                                                            */
/* ---------------------------------------------------------------------------------------- */

Test(replay_gen, stream) {
    mt_replay_config_t cfg;
    mt_replay_config_init(&cfg);
    cfg.dataset = MT_REPLAY_GEN;
    cfg.gen.seed = 7;
    cfg.gen.num_users = 1000;
    cfg.gen.num_items = 500;
    cfg.gen.target_ctr = 0.2;
    cfg.gen.events_per_s = 1000;
    cfg.action_delay_ms = 2000;
    cfg.limit = 20000;
    mt_replay_t *r = NULL;
    cr_assert_eq(mt_replay_open(&cfg, &r, NULL, 0), MT_OK);
    /* the same stream straight from the generator, for the labels */
    mt_gen_t *g;
    cr_assert_eq(mt_gen_create(&cfg.gen, &g), MT_OK);
    mt_batch_t b = {0};
    cr_assert_eq(mt_gen_next(g, &b, 20000, NULL), MT_OK);
    uint64_t positives = 0;
    for (size_t i = 0; i < b.n; i++)
        positives += b.labels[i] > 0.5f;
    mt_replay_event_t e;
    uint64_t nimp = 0, nact = 0;
    int64_t last = INT64_MIN;
    while (mt_replay_next(r, &e) == MT_OK) {
        cr_assert_geq(e.timestamp_ms, last);
        last = e.timestamp_ms;
        if (e.kind == MT_REPLAY_ACTION) {
            nact++;
            continue;
        }
        char want[64];
        snprintf(want, sizeof(want), "gen-7-%llu", (unsigned long long)nimp);
        cr_assert_str_eq(e.request_id, want);
        cr_assert_eq(e.timestamp_ms, b.timestamps_ms[nimp]);
        cr_assert_eq(e.clicked, b.labels[nimp] > 0.5f);
        cr_assert_eq(e.nuser, 3);
        cr_assert_geq(e.nitem, 2);
        nimp++;
    }
    cr_assert_eq(nimp, 20000);
    cr_assert_eq(nact, positives);
    cr_assert_gt(positives, 1000);
    /* the heap holds about 2 s of clicks: 2,000 impressions' worth at most */
    cr_assert_lt(mt_replay_stats(r)->max_pending_actions, 2000);
    mt_batch_free(&b);
    mt_gen_destroy(g);
    mt_replay_destroy(r);
}

/* ---------------------------------------------------------------------------------------- */
/* The paced run                                                                            */
/* ---------------------------------------------------------------------------------------- */

/* A clock the run reads and waits on (mt_replay_clock_t): sleeping advances it by exactly
 * what was asked, so the pacing is checked exactly, however busy the machine is. */
typedef struct fake_clock {
    double now_s;                /* starts at 1000 */
    double slept_s;              /* total of the sleeps asked for */
    unsigned sleeps;             /* how many */
    volatile int *stop_on_sleep; /* set at the first sleep: a stop arriving while waiting */
} fake_clock_t;

static double fake_now(void *opaque) {
    return ((fake_clock_t *)opaque)->now_s;
}

static void fake_sleep(void *opaque, double s) {
    fake_clock_t *fc = opaque;
    fc->now_s += s;
    fc->slept_s += s;
    fc->sleeps++;
    if (fc->stop_on_sleep) *fc->stop_on_sleep = 1;
}

static void use_fake_clock(mt_replay_run_config_t *rc, fake_clock_t *fc) {
    memset(fc, 0, sizeof(*fc));
    fc->now_s = 1000;
    rc->clock = (mt_replay_clock_t){fake_now, fake_sleep, fc};
}

#define SINK_KEPT 16

typedef struct sink_ctx {
    atomic_ulong events;
    uint64_t bytes;
    uint64_t fail_at; /* 0: never */
    volatile int *stop;
    uint64_t stop_at;
    const fake_clock_t *clock; /* if set: the clock's time at each event ... */
    double at_s[SINK_KEPT];    /* ... kept here, with the event's time */
    int64_t event_ms[SINK_KEPT];
} sink_ctx_t;

static mt_err_t test_sink(void *opaque, const mt_replay_event_t *ev, const uint8_t *v, size_t len) {
    sink_ctx_t *c = opaque;
    cr_assert(ev && v && len > 0);
    uint64_t i = atomic_load(&c->events);
    if (c->clock && i < SINK_KEPT) {
        c->at_s[i] = c->clock->now_s;
        c->event_ms[i] = ev->timestamp_ms;
    }
    atomic_store(&c->events, i + 1);
    c->bytes += len;
    if (c->stop && i + 1 == c->stop_at) *c->stop = 1;
    return c->fail_at && i + 1 == c->fail_at ? MT_IO : MT_OK;
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int progress_calls;
static void on_progress(void *opaque, const mt_replay_totals_t *t) {
    (void)opaque;
    (void)t;
    progress_calls++;
}

static void tv_sample(char *path, size_t len) {
    make_tmpdir();
    snprintf(path, len, "%s/tv.csv", tmpdir);
    write_file(path, TV_SAMPLE, false);
}

Test(replay_run, pacing_follows_event_time_at_the_speed) {
    char path[128];
    tv_sample(path, sizeof(path));
    /* event time spans 500 s .. 1100 s: at 2,000x, 0.3 s of the run's clock */
    mt_replay_t *r = open_tv(path, 5000, 0, NULL);
    mt_replay_run_config_t rc;
    mt_replay_run_config_init(&rc);
    rc.speed = 2000;
    rc.progress_interval_ms = 50;
    rc.progress = on_progress;
    fake_clock_t fc;
    use_fake_clock(&rc, &fc);
    sink_ctx_t c = {.clock = &fc};
    mt_replay_totals_t t;
    cr_assert_eq(mt_replay_run(r, &rc, test_sink, &c, &t), MT_OK);
    cr_assert_eq(c.events, 8);
    cr_assert_eq(t.impressions, 6);
    cr_assert_eq(t.actions, 2);
    cr_assert_eq(t.impression_bytes + t.action_bytes, c.bytes);
    cr_assert_eq(t.first_event_ms, 500000);
    cr_assert_eq(t.last_event_ms, 1100000);
    /* each event is handed over at its due time, start + (its time - the first's) / speed:
     * not before (paced), and not later (no wait beyond it) */
    for (int i = 0; i < 8; i++) {
        double due = 1000 + (double)(c.event_ms[i] - c.event_ms[0]) / 1000.0 / rc.speed;
        cr_assert(fabs(c.at_s[i] - due) < 1e-9, "event %d at %.9f, due %.9f", i, c.at_s[i], due);
    }
    cr_assert(fabs(fc.slept_s - 0.3) < 1e-9, "slept %.9f s", fc.slept_s);
    cr_assert(fabs(t.wall_s - 0.3) < 1e-9, "wall_s %.9f", t.wall_s);
    /* progress every 50 ms of the 0.3 s (the waits are cut at each progress time) */
    cr_assert_geq(progress_calls, 5);
    mt_replay_destroy(r);

    /* The system clock: a paced run cannot be faster than event time / speed (only a lower
     * bound: a busy machine makes it slower, never faster). */
    r = open_tv(path, 5000, 0, NULL);
    mt_replay_run_config_init(&rc);
    rc.speed = 2000;
    sink_ctx_t c2 = {0};
    double t0 = mono_s();
    cr_assert_eq(mt_replay_run(r, &rc, test_sink, &c2, &t), MT_OK);
    double took = mono_s() - t0;
    cr_assert_eq(c2.events, 8);
    cr_assert_geq(took, 0.3 - 0.001, "took %.3f s", took);
    cr_assert_geq(t.wall_s, 0.3 - 0.001, "wall_s %.3f", t.wall_s);
    mt_replay_destroy(r);

    /* A clock needs both functions. */
    r = open_tv(path, 5000, 0, NULL);
    rc.clock = (mt_replay_clock_t){fake_now, NULL, &fc};
    cr_assert_eq(mt_replay_run(r, &rc, test_sink, &c2, &t), MT_INVALID);
    mt_replay_destroy(r);
    remove_tmpdir();
}

/* Sets the stop flag once the sink has seen the first event (polling: another thread). */
typedef struct stopper {
    sink_ctx_t *c;
    volatile int *stop;
} stopper_t;

static void *stop_after_first_event(void *arg) {
    stopper_t *s = arg;
    while (atomic_load(&s->c->events) < 1)
        usleep(1000);
    *s->stop = 1;
    return NULL;
}

Test(replay_run, as_fast_as_possible_stop_and_sink_errors, .timeout = 120) {
    char path[128];
    tv_sample(path, sizeof(path));
    mt_replay_run_config_t rc;
    mt_replay_run_config_init(&rc);
    fake_clock_t fc;
    use_fake_clock(&rc, &fc);
    mt_replay_totals_t t;

    /* as fast as possible: the run never asks to wait */
    mt_replay_t *r = open_tv(path, 5000, 0, NULL);
    sink_ctx_t c = {0};
    cr_assert_eq(mt_replay_run(r, &rc, test_sink, &c, &t), MT_OK);
    cr_assert_eq(c.events, 8);
    cr_assert_eq(fc.sleeps, 0, "%u sleeps", fc.sleeps);
    cr_assert_eq(fc.now_s, 1000);
    mt_replay_destroy(r);

    /* a failing sink stops the run with its code */
    r = open_tv(path, 5000, 0, NULL);
    memset(&c, 0, sizeof(c));
    c.fail_at = 3;
    cr_assert_eq(mt_replay_run(r, &rc, test_sink, &c, &t), MT_IO);
    cr_assert_eq(t.impressions + t.actions, 2);
    mt_replay_destroy(r);

    /* the stop flag between events ... */
    r = open_tv(path, 5000, 0, NULL);
    volatile int stop = 0;
    rc.stop = &stop;
    memset(&c, 0, sizeof(c));
    c.stop = &stop;
    c.stop_at = 3;
    cr_assert_eq(mt_replay_run(r, &rc, test_sink, &c, &t), MT_CANCELLED);
    cr_assert_eq(c.events, 3);
    mt_replay_destroy(r);

    /* ... and while waiting for a far event (speed 1: the second is 5 s ahead): a stop
     * arriving during the first wait ends it, which is at most 0.2 s of the clock */
    r = open_tv(path, 5000, 0, NULL);
    stop = 0;
    rc.speed = 1;
    use_fake_clock(&rc, &fc);
    fc.stop_on_sleep = &stop;
    memset(&c, 0, sizeof(c));
    cr_assert_eq(mt_replay_run(r, &rc, test_sink, &c, &t), MT_CANCELLED);
    cr_assert_eq(c.events, 1);
    cr_assert_eq(fc.sleeps, 1);
    cr_assert_leq(fc.slept_s, 0.2);
    mt_replay_destroy(r);

    /* ... also set by another thread, on the system clock: at speed 0.001 the second event
     * is 5,000 s ahead, so only the stop flag, read while waiting, ends this run */
    r = open_tv(path, 5000, 0, NULL);
    stop = 0;
    mt_replay_run_config_init(&rc);
    rc.speed = 0.001;
    rc.stop = &stop;
    memset(&c, 0, sizeof(c));
    stopper_t sp = {&c, &stop};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, stop_after_first_event, &sp), 0);
    cr_assert_eq(mt_replay_run(r, &rc, test_sink, &c, &t), MT_CANCELLED);
    pthread_join(th, NULL);
    cr_assert_eq(c.events, 1);
    mt_replay_destroy(r);
    remove_tmpdir();
}
