/*
 * fuzz_replay.c - replay's dataset parsers (replay/src/trivago.c, movielens.c, csv.c) through
 * mt_replay_open() and mt_replay_next(), which read files: each input is written to files in
 * a temporary folder (one per process) first.
 *
 * The first byte picks the dataset (low two bits) and the action delay / positive rating
 * (next bits); the rest is split at the first two 0x00 bytes into up to three files:
 *   0 trivago:           the CSV (plain; gzip is zlib's, not ours)
 *   1 MovieLens 100k:    u.data, u.user, u.item
 *   2 MovieLens latest:  ratings.csv, movies.csv
 *   3 as 0, with a limit of 3 impressions
 * With bit 4 of the first byte the rest is one csv log instead (a user's own, through the
 * generic reader): bit 5 TSV with a header, columns by name, else CSV without one, by
 * index (ts, rid, user, ad, cat, click); bit 6 request and item id columns (rid, ad), else
 * one request per row; bit 3 timestamps in seconds.
 * Every event is encoded as the Kafka message replay would produce.
 */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "mt/replay.h"

static char dir[] = "/tmp/mt_fuzz_replay.XXXXXX";
static int ready;

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void cleanup(void) {
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void on_bad(void *opaque, uint64_t line, const char *reason) {
    (void)opaque;
    (void)line;
    (void)strlen(reason);
}

/* Writes @p n bytes to dir/name, or removes it when @p data is NULL (an absent side file). */
static void put(const char *name, const uint8_t *data, size_t n) {
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (!data) {
        unlink(path);
        return;
    }
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(data, 1, n, f) != n) abort();
    if (fclose(f) != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ready) {
        if (!mkdtemp(dir)) abort();
        atexit(cleanup);
        ready = 1;
    }
    if (size < 1) return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    /* up to three parts separated by 0x00 */
    const uint8_t *part[3] = {NULL, NULL, NULL};
    size_t plen[3] = {0, 0, 0};
    size_t np = 0, start = 0;
    for (size_t i = 0; i <= size && np < 3; i++) {
        if (i == size || (data[i] == 0 && np < 2)) {
            part[np] = data + start;
            plen[np] = i - start;
            np++;
            start = i + 1;
        }
    }
    mt_replay_config_t cfg;
    mt_replay_config_init(&cfg);
    cfg.bad_row_cb = on_bad;
    cfg.action_delay_ms = (mode & 4) ? 0 : 5000;
    cfg.positive_rating = (mode & 8) ? 0.5f : 4.0f;
    char path[256];
    static const mt_csv_slot_t by_name[] = {{{-1, "user"}, 1, MT_CSV_INT, false},
                                            {{-1, "ad"}, 2, MT_CSV_STRING, false},
                                            {{-1, "cat"}, 3, MT_CSV_STRING, true}};
    static const mt_csv_slot_t by_index[] = {{{2, NULL}, 1, MT_CSV_INT, false},
                                             {{3, NULL}, 2, MT_CSV_STRING, false},
                                             {{4, NULL}, 3, MT_CSV_STRING, true}};
    bool named = (mode & 32) != 0;
    mt_csv_config_t csv; /* read by mt_replay_open() only */
    mt_csv_config_init(&csv);
    csv.delimiter = named ? '\t' : ',';
    csv.header = named;
    csv.label_kind = MT_CSV_LABEL_THRESHOLD;
    csv.label = named ? (mt_csv_column_t){-1, "click"} : (mt_csv_column_t){5, NULL};
    csv.label_threshold = 0.5;
    csv.time_unit = (mode & 8) ? MT_CSV_TIME_S : MT_CSV_TIME_MS;
    csv.timestamp = named ? (mt_csv_column_t){-1, "ts"} : (mt_csv_column_t){0, NULL};
    csv.slots = named ? by_name : by_index;
    csv.nslots_cfg = 3;
    switch ((mode & 16) ? 4 : (mode & 3)) {
    case 4:
        put("log.csv", data, size); /* the whole rest, 0x00 bytes included */
        snprintf(path, sizeof(path), "%s/log.csv", dir);
        cfg.dataset = MT_REPLAY_CSV;
        cfg.csv.reader = &csv;
        if (mode & 64) {
            cfg.csv.request_id = named ? (mt_csv_column_t){-1, "rid"} : (mt_csv_column_t){1, NULL};
            cfg.csv.item_id = named ? (mt_csv_column_t){-1, "ad"} : (mt_csv_column_t){3, NULL};
        }
        break;
    case 0:
    case 3:
        put("t.csv", part[0], plen[0]);
        snprintf(path, sizeof(path), "%s/t.csv", dir);
        cfg.dataset = MT_REPLAY_TRIVAGO;
        if ((mode & 3) == 3) cfg.limit = 3;
        break;
    case 1:
        put("u.data", part[0], plen[0]);
        put("u.user", part[1], plen[1]);
        put("u.item", part[2], plen[2]);
        snprintf(path, sizeof(path), "%s", dir);
        cfg.dataset = MT_REPLAY_MOVIELENS_100K;
        break;
    default:
        put("ratings.csv", part[0], plen[0]);
        put("movies.csv", part[1], plen[1]);
        snprintf(path, sizeof(path), "%s", dir);
        cfg.dataset = MT_REPLAY_MOVIELENS_LATEST;
        break;
    }
    cfg.path = path;
    mt_replay_t *r = NULL;
    char err[256];
    if (mt_replay_open(&cfg, &r, err, sizeof(err)) != MT_OK) {
        (void)strlen(err);
        return 0;
    }
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    mt_replay_event_t ev;
    for (int k = 0; k < 100000 && mt_replay_next(r, &ev) == MT_OK; k++) {
        if (mt_replay_encode(&ev, &buf, &cap, &len) == MT_OK && len) {
            volatile uint8_t sink = buf[len - 1];
            (void)sink;
        }
    }
    const mt_replay_stats_t *st = mt_replay_stats(r);
    for (uint32_t i = 0; i < st->nbad_kept; i++)
        (void)strlen(st->bad[i].reason);
    free(buf);
    mt_replay_destroy(r);
    return 0;
}
