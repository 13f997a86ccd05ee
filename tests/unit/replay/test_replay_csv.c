/*
 * test_replay_csv.c - a user's own log as impressions and clicks (replay/src/csv.c), from
 * files the test writes, configured through [input] exactly as `monolith replay --dataset
 * csv` does it (mt_config_load_string() then mt_config_input_csv()):
 *   - a TSV out of time order with every kind of bad row: the exact events in event-time
 *     order (ties in file order), request and item ids, user- and item-side slots and their
 *     fids, actions at the impression's time + the delay, the counts and the bad rows with
 *     their lines and reasons (the reader's, ours, a repeated request and item);
 *   - a gzip CSV with text actions (positive_labels), seconds with a fraction, quoting, and
 *     no id columns: "csv-<line>" and item 0;
 *   - columns by index without a header;
 *   - errors: a column not in the header (named, exit-2 material: MT_CONFIG), missing
 *     timestamp / label, a request id without an item id, an empty, missing, truncated file.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "mt/batch.h"
#include "mt/config.h"
#include "mt/config_input.h"
#include "mt/replay.h"
#include "testutil_files.h"

static char tmpdir[64];

static void make_tmpdir(void) {
    tu_tmpdir_make(tmpdir, "mt-replay-csv");
}

static void remove_tmpdir(void) {
    tu_tmpdir_remove(tmpdir);
}

TestSuite(replay_csv, .init = make_tmpdir, .fini = remove_tmpdir);

static char *write_file(const char *name, const char *text, size_t len, bool gz) {
    char *path = malloc(256);
    cr_assert_not_null(path);
    snprintf(path, 256, "%s/%s", tmpdir, name);
    tu_write_file(path, text, len, gz);
    return path;
}

/* A copy of one event (an event's pointers die at the next call). */
typedef struct ev_copy {
    mt_replay_kind_t kind;
    int64_t ts;
    char rid[64];
    uint64_t item;
    bool clicked;
    uint64_t line;
    uint32_t nuser, nitem;
    uint16_t user_slot[8], item_slot[8];
    uint32_t user_n[8], item_n[8];
    uint64_t user_fids[8][4], item_fids[8][4];
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
    cr_assert_leq(e->nuser, 8);
    cr_assert_leq(e->nitem, 8);
    for (uint32_t s = 0; s < e->nuser; s++) {
        c->user_slot[s] = e->user[s].slot;
        c->user_n[s] = e->user[s].nfids;
        cr_assert_leq(e->user[s].nfids, 4);
        memcpy(c->user_fids[s], e->user[s].fids, e->user[s].nfids * sizeof(uint64_t));
    }
    for (uint32_t s = 0; s < e->nitem; s++) {
        c->item_slot[s] = e->item[s].slot;
        c->item_n[s] = e->item[s].nfids;
        cr_assert_leq(e->item[s].nfids, 4);
        memcpy(c->item_fids[s], e->item[s].fids, e->item[s].nfids * sizeof(uint64_t));
    }
}

static size_t read_all(mt_replay_t *r, ev_copy_t *v, size_t cap) {
    size_t n = 0;
    mt_replay_event_t e;
    mt_err_t err;
    while ((err = mt_replay_next(r, &e)) == MT_OK) {
        cr_assert_lt(n, cap, "more events than expected");
        copy_event(&e, &v[n++]);
    }
    cr_assert_eq(err, MT_NOT_FOUND, "%s", mt_strerror(err));
    return n;
}

typedef struct bad_log {
    uint64_t lines[16];
    char reasons[16][96];
    int n;
} bad_log_t;

static void on_bad(void *opaque, uint64_t line, const char *reason) {
    bad_log_t *b = opaque;
    cr_assert(reason && *reason);
    if (b->n < 16) {
        b->lines[b->n] = line;
        snprintf(b->reasons[b->n], sizeof(b->reasons[0]), "%s", reason);
        b->n++;
    }
}

/* The [input] of @p ini as the replay's csv settings, as `monolith replay` builds them. */
typedef struct csv_setup {
    mt_config_t cfg;
    mt_config_csv_t icsv;
    mt_replay_config_t rc;
    bad_log_t bad;
} csv_setup_t;

static mt_err_t setup(csv_setup_t *s, const char *ini, const char *path, char *err, size_t len) {
    memset(s, 0, sizeof(*s));
    cr_assert_eq(mt_config_init(&s->cfg), MT_OK);
    cr_assert_eq(mt_config_load_string(&s->cfg, ini, "t.conf", err, len), MT_OK, "%s", err);
    mt_err_t e = mt_config_input_csv(&s->cfg, &s->icsv, err, len);
    if (e) return e;
    mt_replay_config_init(&s->rc);
    s->rc.dataset = MT_REPLAY_CSV;
    s->rc.path = path;
    s->rc.action_delay_ms = 1000;
    s->rc.csv.reader = &s->icsv.csv;
    s->rc.csv.request_id = s->icsv.request_id;
    s->rc.csv.item_id = s->icsv.item_id;
    s->rc.bad_row_cb = on_bad;
    s->rc.bad_row_opaque = &s->bad;
    return MT_OK;
}

static void teardown(csv_setup_t *s) {
    mt_config_csv_free(&s->icsv);
    mt_config_free(&s->cfg);
}

static uint64_t hs(uint16_t slot, const char *s) {
    return mt_fid_of_bytes(slot, s, strlen(s));
}

/* ---------------------------------------------------------------------------------------- */
/* A TSV ad log, out of time order, with bad rows                                           */
/* ---------------------------------------------------------------------------------------- */

static const char ad_log[] = "ts\trid\tuser\tad\tcat\tclick\n"           /* 1 */
                             "1700000005000\tr2\t7\t100\tshoes\t1\n"     /* 2 */
                             "1700000001000\tr1\t8\t101\tbags\t0\n"      /* 3 */
                             "1700000001000\tr1\t8\t102\tbags\t1\n"      /* 4: tie, after 3 */
                             "oops\tr3\t9\t103\tbags\t0\n"               /* 5: bad time */
                             "1700000002000\tr4\t9\t104\n"               /* 6: 4 columns */
                             "1700000003000\tr5\tnine\t105\tbags\t0\n"   /* 7: not an int */
                             "1700000000500\t\t9\t106\tbags\t1\n"        /* 8: no request */
                             "1700000004000\tr1\t8\t101\tbags\t1\n"      /* 9: r1/101 again */
                             "\n"                                        /* 10: blank */
                             "1700000000000\tr6\t10\t77\tbags|hats\t0\n" /* 11: multi-hot */
                             "1700000003000\tr7\t11\t108\t\t1\n";        /* 12: no cat */

static const char ad_ini[] = "[input]\n"
                             "format = tsv\n"
                             "columns = user:1, ad:2, cat:3:string:multi\n"
                             "label = click\n"
                             "timestamp = ts\n"
                             "time_unit = ms\n"
                             "request_id = rid\n"
                             "item_id = ad\n";

Test(replay_csv, tsv_log_exact_events_order_and_bad_rows) {
    char *path = write_file("ads.tsv", ad_log, strlen(ad_log), false);
    csv_setup_t s;
    char err[256] = "";
    cr_assert_eq(setup(&s, ad_ini, path, err, sizeof(err)), MT_OK, "%s", err);
    mt_replay_t *r = NULL;
    cr_assert_eq(mt_replay_open(&s.rc, &r, err, sizeof(err)), MT_OK, "%s", err);
    /* every bad row was reported during the open, the reader's as read, the repeat after */
    static const uint64_t bad_lines[] = {5, 6, 7, 8, 9};
    static const char *const bad_reasons[] = {
        "timestamp 'oops' is not unix ms", "expected 6 columns, got 4",
        "column 3: 'nine' is not an integer", "empty request id",
        "request 'r1' showed item 101 already on line 3"};
    cr_assert_eq(s.bad.n, 5);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(s.bad.lines[i], bad_lines[i], "bad row %d: line %llu", i,
                     (unsigned long long)s.bad.lines[i]);
        cr_assert_str_eq(s.bad.reasons[i], bad_reasons[i]);
    }
    ev_copy_t ev[16];
    size_t n = read_all(r, ev, 16);
    /* kind, time, request, item, line, clicked */
    static const struct {
        mt_replay_kind_t kind;
        int64_t ts;
        const char *rid;
        uint64_t item, line;
        bool clicked;
    } want[] = {
        {MT_REPLAY_IMPRESSION, 1700000000000, "r6", 77, 11, false},
        {MT_REPLAY_IMPRESSION, 1700000001000, "r1", 101, 3, false},
        {MT_REPLAY_IMPRESSION, 1700000001000, "r1", 102, 4, true},
        {MT_REPLAY_ACTION, 1700000002000, "r1", 102, 4, false},
        {MT_REPLAY_IMPRESSION, 1700000003000, "r7", 108, 12, true},
        {MT_REPLAY_ACTION, 1700000004000, "r7", 108, 12, false},
        {MT_REPLAY_IMPRESSION, 1700000005000, "r2", 100, 2, true},
        {MT_REPLAY_ACTION, 1700000006000, "r2", 100, 2, false},
    };
    cr_assert_eq(n, sizeof(want) / sizeof(want[0]));
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(ev[i].kind, want[i].kind, "event %zu", i);
        cr_assert_eq(ev[i].ts, want[i].ts, "event %zu", i);
        cr_assert_str_eq(ev[i].rid, want[i].rid, "event %zu", i);
        cr_assert_eq(ev[i].item, want[i].item, "event %zu", i);
        cr_assert_eq(ev[i].line, want[i].line, "event %zu", i);
        cr_assert_eq(ev[i].clicked, want[i].clicked, "event %zu", i);
        if (i) cr_assert_geq(ev[i].ts, ev[i - 1].ts, "event time goes back at %zu", i);
    }
    /* line 11: user side user (1) and the multi-hot category (3), item side the ad (2) */
    const ev_copy_t *e = &ev[0];
    cr_assert_eq(e->nuser, 2);
    cr_assert_eq(e->user_slot[0], 1);
    cr_assert_eq(e->user_n[0], 1);
    cr_assert_eq(e->user_fids[0][0], mt_fid_of_int(1, 10));
    cr_assert_eq(e->user_slot[1], 3);
    cr_assert_eq(e->user_n[1], 2);
    cr_assert_eq(e->user_fids[1][0], hs(3, "bags"));
    cr_assert_eq(e->user_fids[1][1], hs(3, "hats"));
    cr_assert_eq(e->nitem, 1);
    cr_assert_eq(e->item_slot[0], 2);
    cr_assert_eq(e->item_n[0], 1);
    cr_assert_eq(e->item_fids[0][0], mt_fid_of_int(2, 77));
    /* line 12: an empty category gives no slot */
    cr_assert_eq(ev[4].nuser, 1);
    cr_assert_eq(ev[4].user_fids[0][0], mt_fid_of_int(1, 11));
    /* actions carry no features */
    cr_assert_eq(ev[3].nuser + ev[3].nitem, 0);
    const mt_replay_stats_t *st = mt_replay_stats(r);
    cr_assert_eq(st->impressions, 5);
    cr_assert_eq(st->actions, 3);
    cr_assert_eq(st->requests, 5);
    cr_assert_eq(st->bad_rows, 5);
    cr_assert_eq(st->last_bad_line, 9);
    cr_assert_eq(st->rows, 10); /* lines 2-9, 11, 12: the blank line is no row */
    cr_assert_eq(st->nbad_kept, 5);
    cr_assert_eq(st->bad[3].line, 8);
    cr_assert_str_eq(st->bad[3].reason, "empty request id");
    mt_replay_destroy(r);
    teardown(&s);
    free(path);
}

/* The paced run's sink sees the same stream, encoded: totals equal the counts. */
static mt_err_t count_sink(void *opaque, const mt_replay_event_t *ev, const uint8_t *value,
                           size_t len) {
    uint64_t *c = opaque;
    cr_assert(len > 0 && value);
    c[ev->kind == MT_REPLAY_IMPRESSION ? 0 : 1]++;
    return MT_OK;
}

Test(replay_csv, limit_and_run_over_the_log) {
    char *path = write_file("ads.tsv", ad_log, strlen(ad_log), false);
    csv_setup_t s;
    char err[256] = "";
    cr_assert_eq(setup(&s, ad_ini, path, err, sizeof(err)), MT_OK, "%s", err);
    mt_replay_t *r = NULL;
    cr_assert_eq(mt_replay_open(&s.rc, &r, err, sizeof(err)), MT_OK, "%s", err);
    uint64_t counts[2] = {0, 0};
    mt_replay_totals_t t;
    cr_assert_eq(mt_replay_run(r, NULL, count_sink, counts, &t), MT_OK);
    cr_assert_eq(counts[0], 5);
    cr_assert_eq(counts[1], 3);
    cr_assert_eq(t.first_event_ms, 1700000000000);
    cr_assert_eq(t.last_event_ms, 1700000006000);
    mt_replay_destroy(r);
    /* --limit 3: the first three impressions in time order, and the one action among them */
    s.rc.limit = 3;
    s.bad.n = 0;
    cr_assert_eq(mt_replay_open(&s.rc, &r, err, sizeof(err)), MT_OK, "%s", err);
    ev_copy_t ev[16];
    size_t n = read_all(r, ev, 16);
    cr_assert_eq(n, 4);
    cr_assert_eq(ev[3].kind, MT_REPLAY_ACTION);
    cr_assert_str_eq(ev[3].rid, "r1");
    cr_assert_eq(ev[3].item, 102);
    mt_replay_destroy(r);
    teardown(&s);
    free(path);
}

/* ---------------------------------------------------------------------------------------- */
/* gzip CSV, text actions, seconds, no id columns                                           */
/* ---------------------------------------------------------------------------------------- */

Test(replay_csv, gzip_csv_text_actions_generated_ids) {
    static const char log[] = "\"when\",user,event,tags\n"      /* 1 */
                              "1700000002.5,\"u,1\",view,a|b\n" /* 2: quoted comma */
                              "1700000001.25,u2,click,a\n"      /* 3 */
                              "1700000003,u3,buy,\n"            /* 4 */
                              "1700000001.25,u4,CLICK,b\n"      /* 5: case matters */
                              "soon,u5,click,b\n";              /* 6: bad time */
    char *path = write_file("log.csv.gz", log, strlen(log), true);
    csv_setup_t s;
    char err[256] = "";
    cr_assert_eq(setup(&s,
                       "[input]\nformat = csv\ncolumns = user:1:string, tags:5:string:multi\n"
                       "label = event\npositive_labels = click, buy\n"
                       "timestamp = when\ntime_unit = s\n",
                       path, err, sizeof(err)),
                 MT_OK, "%s", err);
    mt_replay_t *r = NULL;
    cr_assert_eq(mt_replay_open(&s.rc, &r, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(s.bad.n, 1);
    cr_assert_eq(s.bad.lines[0], 6);
    ev_copy_t ev[16];
    size_t n = read_all(r, ev, 16);
    static const struct {
        mt_replay_kind_t kind;
        int64_t ts;
        const char *rid;
    } want[] = {
        {MT_REPLAY_IMPRESSION, 1700000001250, "csv-3"},
        {MT_REPLAY_IMPRESSION, 1700000001250, "csv-5"},
        {MT_REPLAY_ACTION, 1700000002250, "csv-3"},
        {MT_REPLAY_IMPRESSION, 1700000002500, "csv-2"},
        {MT_REPLAY_IMPRESSION, 1700000003000, "csv-4"},
        {MT_REPLAY_ACTION, 1700000004000, "csv-4"},
    };
    cr_assert_eq(n, sizeof(want) / sizeof(want[0]));
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(ev[i].kind, want[i].kind, "event %zu", i);
        cr_assert_eq(ev[i].ts, want[i].ts, "event %zu", i);
        cr_assert_str_eq(ev[i].rid, want[i].rid, "event %zu", i);
        cr_assert_eq(ev[i].item, 0, "no item column: item 0");
        cr_assert_eq(ev[i].nitem, 0, "no item column: every slot user-side");
    }
    /* line 2: the quoted "u,1" is one value; "a|b" two tags */
    cr_assert_eq(ev[3].nuser, 2);
    cr_assert_eq(ev[3].user_fids[0][0], hs(1, "u,1"));
    cr_assert_eq(ev[3].user_n[1], 2);
    cr_assert_eq(ev[3].user_fids[1][0], hs(5, "a"));
    cr_assert_eq(ev[3].user_fids[1][1], hs(5, "b"));
    const mt_replay_stats_t *st = mt_replay_stats(r);
    cr_assert_eq(st->impressions, 4);
    cr_assert_eq(st->actions, 2);
    cr_assert_eq(st->bad_rows, 1);
    cr_assert_eq(st->rows, 5);
    mt_replay_destroy(r);
    teardown(&s);
    free(path);
}

Test(replay_csv, columns_by_index_without_header) {
    static const char log[] = "5\t1700000000000\t9\t0.9\n"
                              "6\t1699999999000\t8\t0.1\n";
    char *path = write_file("noheader.tsv", log, strlen(log), false);
    csv_setup_t s;
    char err[256] = "";
    cr_assert_eq(setup(&s,
                       "[input]\nformat = tsv\nheader = false\ncolumns = 2:1, 0:2\nlabel = 3\n"
                       "label_threshold = 0.5\ntimestamp = 1\nrequest_id = 0\nitem_id = 2\n",
                       path, err, sizeof(err)),
                 MT_OK, "%s", err);
    mt_replay_t *r = NULL;
    cr_assert_eq(mt_replay_open(&s.rc, &r, err, sizeof(err)), MT_OK, "%s", err);
    ev_copy_t ev[8];
    size_t n = read_all(r, ev, 8);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(ev[0].rid, "6");
    cr_assert_eq(ev[0].item, 8);
    cr_assert_eq(ev[0].line, 2);
    cr_assert_eq(ev[0].nitem, 1, "column 2 is the item's: its slot 1 is item-side");
    cr_assert_eq(ev[0].item_slot[0], 1);
    cr_assert_eq(ev[0].nuser, 1);
    cr_assert_eq(ev[0].user_fids[0][0], mt_fid_of_int(2, 6));
    cr_assert_str_eq(ev[1].rid, "5");
    cr_assert(ev[1].clicked);
    cr_assert_eq(ev[2].kind, MT_REPLAY_ACTION);
    cr_assert_eq(ev[2].item, 9);
    cr_assert_eq(mt_replay_stats(r)->bad_rows, 0);
    mt_replay_destroy(r);
    teardown(&s);
    free(path);
}

/* ---------------------------------------------------------------------------------------- */
/* Errors                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Opens @p ini over @p path; returns the error and the message. */
static mt_err_t open_err(const char *ini, const char *path, char *err, size_t len) {
    csv_setup_t s;
    mt_err_t e = setup(&s, ini, path, err, len);
    mt_replay_t *r = NULL;
    if (!e) e = mt_replay_open(&s.rc, &r, err, len);
    mt_replay_destroy(r);
    teardown(&s);
    return e;
}

Test(replay_csv, configuration_and_file_errors) {
    char *path = write_file("ads.tsv", ad_log, strlen(ad_log), false);
    char err[256] = "";
    char ini[512];
    /* a label column that is not in the file: a configuration error naming it and the header */
    snprintf(ini, sizeof(ini), "%s", ad_ini);
    memcpy(strstr(ini, "label = click"), "label = clik ", 13);
    cr_assert_eq(open_err(ini, path, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "label: column 'clik' is not in the header (ts, rid, user, ad, cat, "
                          "click)"),
              "%s", err);
    /* the item column likewise, by its key's name */
    snprintf(ini, sizeof(ini), "%s", ad_ini);
    memcpy(strstr(ini, "item_id = ad"), "item_id = xx", 12);
    cr_assert_eq(open_err(ini, path, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "item_id: column 'xx' is not in the header"), "%s", err);
    /* a feature column too */
    cr_assert_eq(open_err("[input]\ncolumns = user:1, nope:2\nlabel = click\ntimestamp = ts\n",
                          path, err, sizeof(err)),
                 MT_CONFIG);
    cr_assert(strstr(err, "column 'nope' is not in the header"), "%s", err);
    /* no timestamp, no label, a request id without an item: refused before reading */
    cr_assert_eq(open_err("[input]\ncolumns = user:1\nlabel = click\n", path, err, sizeof(err)),
                 MT_CONFIG);
    cr_assert(strstr(err, "timestamp"), "%s", err);
    cr_assert_eq(
        open_err("[input]\ncolumns = user:1\nlabel =\ntimestamp = ts\n", path, err, sizeof(err)),
        MT_CONFIG);
    cr_assert(strstr(err, "label"), "%s", err);
    cr_assert_eq(open_err("[input]\ncolumns = user:1\nlabel = click\ntimestamp = ts\n"
                          "request_id = rid\n",
                          path, err, sizeof(err)),
                 MT_CONFIG);
    cr_assert(strstr(err, "item id"), "%s", err);
    /* bad [input] syntax is the config module's error, naming the key */
    cr_assert_eq(open_err("[input]\ncolumns = user\nlabel = click\ntimestamp = ts\n", path, err,
                          sizeof(err)),
                 MT_CONFIG);
    cr_assert(strstr(err, "input.columns: 'user': expected column:slot"), "%s", err);
    cr_assert_eq(
        open_err("[input]\ncolumns =\nlabel = click\ntimestamp = ts\n", path, err, sizeof(err)),
        MT_CONFIG);
    cr_assert(strstr(err, "input.columns: no columns"), "%s", err);
    cr_assert_eq(open_err("[input]\nformat = criteo\ncolumns = user:1\n", path, err, sizeof(err)),
                 MT_CONFIG);
    cr_assert(strstr(err, "input.format"), "%s", err);
    /* files: missing, a directory, empty, a truncated gzip stream */
    char missing[300];
    snprintf(missing, sizeof(missing), "%s/none.tsv", tmpdir);
    cr_assert_eq(open_err(ad_ini, missing, err, sizeof(err)), MT_IO);
    cr_assert(strstr(err, "cannot open"), "%s", err);
    cr_assert_eq(open_err(ad_ini, tmpdir, err, sizeof(err)), MT_IO);
    char *empty = write_file("empty.tsv", "", 0, false);
    cr_assert_eq(open_err(ad_ini, empty, err, sizeof(err)), MT_CORRUPT);
    cr_assert(strstr(err, "empty file"), "%s", err);
    char *gz = write_file("ads.tsv.gz", ad_log, strlen(ad_log), true);
    FILE *f = fopen(gz, "rb");
    cr_assert_not_null(f);
    unsigned char buf[4096];
    size_t glen = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    char *cut = write_file("cut.tsv.gz", (const char *)buf, glen - 12, false);
    cr_assert_eq(open_err(ad_ini, cut, err, sizeof(err)), MT_IO);
    free(empty);
    free(gz);
    free(cut);
    free(path);
}
