/* test_readers.c - Criteo, MovieLens and generic CSV readers: inline text and the real samples. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mt/readers.h"
#include "testutil_data.h"

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static FILE *mem(const char *text) {
    FILE *f = fmemopen((void *)text, strlen(text), "r");
    cr_assert_not_null(f);
    return f;
}

/* Writes @p text to a new temporary file; its path goes to @p path (PATH_MAX-ish buffer). */
static void tmpfile_with(char *path, size_t cap, const char *text) {
    snprintf(path, cap, "/tmp/mt_test_readers_XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    size_t len = strlen(text);
    cr_assert_eq(write(fd, text, len), (ssize_t)len);
    close(fd);
}

static size_t nfids(const mt_batch_t *b, size_t i, uint32_t s) {
    size_t n;
    mt_batch_fids(b, i, s, &n);
    return n;
}

static uint64_t fid(const mt_batch_t *b, size_t i, uint32_t s, size_t k) {
    size_t n;
    const uint64_t *f = mt_batch_fids(b, i, s, &n);
    cr_assert_lt(k, n, "example %zu slot %u has %zu fids, wanted #%zu", i, s, n, k);
    return f[k];
}

static uint64_t hs(uint16_t slot, const char *s) {
    return mt_fid_of_bytes(slot, s, strlen(s));
}

/* dir = the shared data's folder `sub`; the case is skipped when it is absent. */
#define NEED_SHARED(sub, dir)                     \
    do {                                          \
        mt_test_data_path(dir, sizeof(dir), sub); \
        mt_test_need_data(dir);                   \
    } while (0)

typedef struct bad_log {
    int n;
    uint64_t lines[16];
} bad_log_t;

static void on_bad(void *opaque, uint64_t line, const char *reason) {
    bad_log_t *l = opaque;
    cr_assert_not_null(reason);
    if (l->n < 16) l->lines[l->n] = line;
    l->n++;
}

/* ---------------------------------------------------------------------------------------- */
/* Criteo                                                                                   */
/* ---------------------------------------------------------------------------------------- */

Test(criteo, bucketization) {
    cr_assert_eq(mt_criteo_bucket(0), 0);
    cr_assert_eq(mt_criteo_bucket(1), 1);
    cr_assert_eq(mt_criteo_bucket(2), 2);
    cr_assert_eq(mt_criteo_bucket(3), 1);     /* ln(3)^2 = 1.21 */
    cr_assert_eq(mt_criteo_bucket(5), 2);     /* 2.59 */
    cr_assert_eq(mt_criteo_bucket(100), 21);  /* 21.21 */
    cr_assert_eq(mt_criteo_bucket(1382), 52); /* 52.29 */
    cr_assert_eq(mt_criteo_bucket(INT64_MAX), 1906);
    cr_assert_eq(mt_criteo_bucket(-1), MT_CRITEO_BUCKET_NEG + 1);
    cr_assert_eq(mt_criteo_bucket(-3), MT_CRITEO_BUCKET_NEG + 3);
    cr_assert_eq(mt_criteo_bucket(INT64_MIN), MT_CRITEO_BUCKET_NEG + 999);
}

/* 13 ints then 26 cats, built by hand */
#define CATS_A                                                                           \
    "68fd1e64\t80e26c9b\t\t7b4723c4\t25c83c98\t7e0ccccf\tde7995b8\t1f89b562\ta73ee510\t" \
    "a8cd5504\tb2cb9c98\t37c9c164\t2824a5f6\t1adce6ef\t8ba8b39a\t891b62e7\te5ba7672\t"   \
    "f54016b9\t21ddcdc9\tb1252a9d\t07b5194c\t\t3a171ecb\tc5c50484\te8b83407\t9727dd16"
#define CATS_EMPTY "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t"

Test(criteo, inline_values_chunks_and_bad_lines) {
    static const char text[] =
        "1\t1\t\t3\t-2\t1382\t0\t2\t5\t100\t7\t8\t9\t10\t" CATS_A "\n" /* 1 good */
        "0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t" CATS_EMPTY "\r\n" /* 2 good, all empty */
        "0\t1\t2\n"                                                    /* 3 bad: columns */
        "x\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t" CATS_EMPTY "\n"   /* 4 bad: label */
        "0\t0\tabc\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t" CATS_EMPTY "\n" /* 5 bad: int */
        "\n"                                                           /* 6 blank */
        "0\t99999999999999999999\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t" CATS_EMPTY "\n" /* 7 */
        "1\t\t\t\t\t\t\t\t\t\t\t\t\t\t" CATS_EMPTY; /* 8 good, no final newline */
    FILE *f = mem(text);
    mt_reader_t *r;
    cr_assert_eq(mt_reader_criteo_open(NULL, NULL, f, &r), MT_OK);
    bad_log_t log = {0};
    mt_reader_set_bad_line_cb(r, on_bad, &log);
    uint32_t ns;
    const uint16_t *slots = mt_reader_slots(r, &ns);
    cr_assert_eq(ns, 39);
    cr_assert_eq(slots[0], 1);
    cr_assert_eq(slots[38], 39);
    mt_batch_t b;
    cr_assert_eq(mt_reader_batch_init(r, &b), MT_OK);

    cr_assert_eq(mt_reader_next(r, &b, 1), MT_OK);
    cr_assert_eq(b.n, 1);
    cr_assert_eq(b.labels[0], 1.0f);
    cr_assert_eq(b.timestamps_ms[0], 0);
    cr_assert_eq(b.sample_rates[0], 1.0f);
    const uint64_t ints[13] = {
        1, MT_CRITEO_BUCKET_EMPTY, 1, MT_CRITEO_BUCKET_NEG + 2, 52, 0, 2, 2, 21, 3, 4, 4, 5};
    for (uint32_t s = 0; s < 13; s++) {
        cr_assert_eq(nfids(&b, 0, s), 1);
        cr_assert_eq(fid(&b, 0, s, 0), mt_fid_of_int((uint16_t)(s + 1), ints[s]), "slot %u", s + 1);
    }
    cr_assert_eq(fid(&b, 0, 13, 0), hs(14, "68fd1e64"));
    cr_assert_eq(fid(&b, 0, 14, 0), hs(15, "80e26c9b"));
    cr_assert_eq(nfids(&b, 0, 15), 0); /* C3 empty */
    cr_assert_eq(nfids(&b, 0, 34), 0); /* C21 empty */
    cr_assert_eq(fid(&b, 0, 38, 0), hs(39, "9727dd16"));
    cr_assert_eq(b.nfids, 13 + 24);

    cr_assert_eq(mt_reader_next(r, &b, 100), MT_OK);
    cr_assert_eq(b.n, 3);
    cr_assert_eq(b.labels[1], 0.0f);
    cr_assert_eq(fid(&b, 1, 0, 0), mt_fid_of_int(1, 0));
    for (uint32_t s = 13; s < 39; s++)
        cr_assert_eq(nfids(&b, 1, s), 0);
    cr_assert_eq(b.labels[2], 1.0f);
    for (uint32_t s = 0; s < 13; s++)
        cr_assert_eq(fid(&b, 2, s, 0), mt_fid_of_int((uint16_t)(s + 1), MT_CRITEO_BUCKET_EMPTY));
    cr_assert_eq(mt_reader_next(r, &b, 100), MT_NOT_FOUND);
    cr_assert_eq(b.n, 3);

    const mt_reader_stats_t *st = mt_reader_stats(r);
    cr_assert_eq(st->lines, 8);
    cr_assert_eq(st->examples, 3);
    cr_assert_eq(st->bad_lines, 4);
    cr_assert_eq(st->last_bad_line, 7);
    cr_assert_eq(st->nbad_kept, 4);
    cr_assert_eq(st->bad[0].line, 3);
    cr_assert_str_eq(st->bad[0].reason, "expected 40 columns, got 3");
    cr_assert_eq(st->bad[1].line, 4);
    cr_assert_str_eq(st->bad[1].reason, "label 'x' is not 0 or 1");
    cr_assert_eq(st->bad[2].line, 5);
    cr_assert_str_eq(st->bad[2].reason, "I2 'abc' is not an integer");
    cr_assert_eq(st->bad[3].line, 7); /* integer overflow */
    cr_assert_eq(log.n, 4);
    cr_assert_eq(log.lines[0], 3);
    cr_assert_eq(log.lines[3], 7);
    mt_batch_free(&b);
    mt_reader_destroy(r);
    fclose(f);
}

Test(criteo, no_label_mode_and_errors) {
    static const char text[] = "1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13\t" CATS_A "\n";
    FILE *f = mem(text);
    mt_criteo_config_t cfg;
    mt_criteo_config_init(&cfg);
    cfg.has_label = false;
    mt_reader_t *r;
    cr_assert_eq(mt_reader_criteo_open(&cfg, NULL, f, &r), MT_OK);
    mt_batch_t b;
    cr_assert_eq(mt_reader_batch_init(r, &b), MT_OK);
    cr_assert_eq(mt_reader_next(r, &b, 0), MT_INVALID);
    cr_assert_eq(mt_reader_next(r, &b, 10), MT_OK);
    cr_assert_eq(b.n, 1);
    cr_assert_eq(b.labels[0], 0.0f);
    cr_assert_eq(fid(&b, 0, 0, 0), mt_fid_of_int(1, 1));
    cr_assert_eq(fid(&b, 0, 12, 0), mt_fid_of_int(13, 6)); /* ln(13)^2 = 6.58 */
    cr_assert_eq(mt_reader_stats(r)->bad_lines, 0);

    /* a batch with other slots is refused */
    mt_batch_t other;
    uint16_t s1 = 1;
    cr_assert_eq(mt_batch_init(&other, &s1, 1), MT_OK);
    cr_assert_eq(mt_reader_next(r, &other, 10), MT_MISMATCH);
    mt_batch_free(&other);
    mt_batch_free(&b);
    mt_reader_destroy(r);
    fclose(f);

    cr_assert_eq(mt_reader_criteo_open(NULL, "/nonexistent/criteo.txt", NULL, &r), MT_IO);
    cr_assert_null(r);
    cr_assert_eq(mt_reader_criteo_open(NULL, NULL, NULL, &r), MT_INVALID);
    mt_reader_destroy(NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* MovieLens                                                                                */
/* ---------------------------------------------------------------------------------------- */

Test(movielens, ml100k_inline_with_side_files) {
    char users[64], items[64];
    tmpfile_with(users, sizeof(users),
                 "1|24|M|technician|85711\n"
                 "2|53|F|other|94043\n"
                 "bogus line\n"
                 "3|17|M|student|00000\n");
    tmpfile_with(items, sizeof(items),
                 "10|Toy Story (1995)|01-Jan-1995||http://x|0|0|0|1|1|1|0|0|0|0|0|0|0|0|0|0|0|0|0\n"
                 "11|A|B (1990)|01-Jan-1990||http://y|1|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0|1\n"
                 "12|short|line\n");
    static const char data[] = "1\t10\t4\t881250949\n"
                               "2\t11\t3\t891717742\n"
                               "7\t99\t5\t1\n"    /* unknown user and item: ids only */
                               "3\t10\t2.5x\t1\n" /* bad rating */
                               "1\t10\t4\n"       /* bad: columns */
                               "3\t12\t5\t0\n";
    FILE *f = mem(data);
    mt_movielens_config_t cfg;
    mt_movielens_config_init(&cfg);
    cfg.users_path = users;
    cfg.items_path = items;
    mt_reader_t *r;
    cr_assert_eq(mt_reader_movielens_open(&cfg, NULL, f, &r), MT_OK);
    uint32_t ns;
    const uint16_t *slots = mt_reader_slots(r, &ns);
    cr_assert_eq(ns, 6);
    for (uint32_t s = 0; s < 6; s++)
        cr_assert_eq(slots[s], s + 1);
    cr_assert_eq(mt_reader_stats(r)->side_bad_lines, 2);
    mt_batch_t b;
    cr_assert_eq(mt_reader_batch_init(r, &b), MT_OK);
    cr_assert_eq(mt_reader_next(r, &b, 100), MT_OK);
    cr_assert_eq(b.n, 4);

    cr_assert_eq(b.labels[0], 1.0f); /* 4 >= 4 */
    cr_assert_eq(b.timestamps_ms[0], 881250949000LL);
    cr_assert_eq(fid(&b, 0, 0, 0), mt_fid_of_int(MT_ML_SLOT_USER, 1));
    cr_assert_eq(fid(&b, 0, 1, 0), mt_fid_of_int(MT_ML_SLOT_ITEM, 10));
    cr_assert_eq(fid(&b, 0, 2, 0), mt_fid_of_int(MT_ML_SLOT_AGE, 18));
    cr_assert_eq(fid(&b, 0, 3, 0), hs(MT_ML_SLOT_GENDER, "M"));
    cr_assert_eq(fid(&b, 0, 4, 0), hs(MT_ML_SLOT_OCCUPATION, "technician"));
    cr_assert_eq(nfids(&b, 0, 5), 3);
    cr_assert_eq(fid(&b, 0, 5, 0), mt_fid_of_int(MT_ML_SLOT_GENRES, 3));
    cr_assert_eq(fid(&b, 0, 5, 1), mt_fid_of_int(MT_ML_SLOT_GENRES, 4));
    cr_assert_eq(fid(&b, 0, 5, 2), mt_fid_of_int(MT_ML_SLOT_GENRES, 5));

    cr_assert_eq(b.labels[1], 0.0f);
    cr_assert_eq(fid(&b, 1, 2, 0), mt_fid_of_int(MT_ML_SLOT_AGE, 50));
    cr_assert_eq(fid(&b, 1, 3, 0), hs(MT_ML_SLOT_GENDER, "F"));
    cr_assert_eq(nfids(&b, 1, 5), 2); /* '|' in the title: last 19 flags still found */
    cr_assert_eq(fid(&b, 1, 5, 0), mt_fid_of_int(MT_ML_SLOT_GENRES, 0));
    cr_assert_eq(fid(&b, 1, 5, 1), mt_fid_of_int(MT_ML_SLOT_GENRES, 18));

    cr_assert_eq(b.labels[2], 1.0f);
    cr_assert_eq(b.timestamps_ms[2], 1000);
    cr_assert_eq(fid(&b, 2, 0, 0), mt_fid_of_int(MT_ML_SLOT_USER, 7));
    for (uint32_t s = 2; s < 6; s++)
        cr_assert_eq(nfids(&b, 2, s), 0);

    cr_assert_eq(fid(&b, 3, 2, 0), mt_fid_of_int(MT_ML_SLOT_AGE, 1)); /* age 17 */
    cr_assert_eq(nfids(&b, 3, 5), 0);                                 /* item 12 was bad */

    const mt_reader_stats_t *st = mt_reader_stats(r);
    cr_assert_eq(st->bad_lines, 2);
    cr_assert_eq(st->bad[0].line, 4);
    cr_assert_str_eq(st->bad[0].reason, "rating '2.5x' is not a number");
    cr_assert_eq(st->bad[1].line, 5);
    cr_assert_eq(st->last_bad_line, 5);
    cr_assert_eq(mt_reader_next(r, &b, 100), MT_NOT_FOUND);
    mt_batch_free(&b);
    mt_reader_destroy(r);
    fclose(f);
    unlink(users);
    unlink(items);
}

Test(movielens, latest_inline_ids_only_and_genres) {
    char movies[64];
    tmpfile_with(movies, sizeof(movies),
                 "movieId,title,genres\n"
                 "1,Toy Story (1995),Adventure|Animation\n"
                 "3,\"Foo, The \"\"Bar\"\" (1995)\",Comedy\n"
                 "4,Nothing (2000),(no genres listed)\n");
    static const char data[] = "userId,movieId,rating,timestamp\n"
                               "1,1,4.0,964982703\n"
                               "1,3,3.5,964981247\n"
                               "2,4,5.0,1\n"
                               "2,x,5.0,1\n";
    /* ids only */
    FILE *f = mem(data);
    mt_movielens_config_t cfg;
    mt_movielens_config_init(&cfg);
    cfg.format = MT_MOVIELENS_LATEST;
    mt_reader_t *r;
    cr_assert_eq(mt_reader_movielens_open(&cfg, NULL, f, &r), MT_OK);
    uint32_t ns;
    mt_reader_slots(r, &ns);
    cr_assert_eq(ns, 2);
    mt_batch_t b;
    cr_assert_eq(mt_reader_batch_init(r, &b), MT_OK);
    cr_assert_eq(mt_reader_next(r, &b, 100), MT_OK);
    cr_assert_eq(b.n, 3);
    cr_assert_eq(b.labels[0], 1.0f);
    cr_assert_eq(b.labels[1], 0.0f);
    cr_assert_eq(b.timestamps_ms[1], 964981247000LL);
    cr_assert_eq(fid(&b, 1, 1, 0), mt_fid_of_int(MT_ML_SLOT_ITEM, 3));
    cr_assert_eq(mt_reader_stats(r)->bad_lines, 1);
    cr_assert_eq(mt_reader_stats(r)->last_bad_line, 5);
    mt_batch_free(&b);
    mt_reader_destroy(r);
    fclose(f);

    /* with movies.csv */
    f = mem(data);
    cfg.items_path = movies;
    cr_assert_eq(mt_reader_movielens_open(&cfg, NULL, f, &r), MT_OK);
    mt_reader_slots(r, &ns);
    cr_assert_eq(ns, 3);
    cr_assert_eq(mt_reader_stats(r)->side_bad_lines, 0);
    cr_assert_eq(mt_reader_batch_init(r, &b), MT_OK);
    cr_assert_eq(mt_reader_next(r, &b, 100), MT_OK);
    cr_assert_eq(nfids(&b, 0, 2), 2);
    cr_assert_eq(fid(&b, 0, 2, 0), hs(MT_ML_SLOT_GENRES, "Adventure"));
    cr_assert_eq(fid(&b, 0, 2, 1), hs(MT_ML_SLOT_GENRES, "Animation"));
    cr_assert_eq(nfids(&b, 1, 2), 1);
    cr_assert_eq(fid(&b, 1, 2, 0), hs(MT_ML_SLOT_GENRES, "Comedy"));
    cr_assert_eq(nfids(&b, 2, 2), 0);
    mt_batch_free(&b);
    mt_reader_destroy(r);
    fclose(f);
    unlink(movies);

    /* config errors */
    cfg.users_path = "/nonexistent/u.user";
    cr_assert_eq(mt_reader_movielens_open(&cfg, "/dev/null", NULL, &r), MT_CONFIG);
    cfg.format = MT_MOVIELENS_100K;
    cr_assert_eq(mt_reader_movielens_open(&cfg, "/dev/null", NULL, &r), MT_IO);
    cr_assert_null(r);
}

/* ---------------------------------------------------------------------------------------- */
/* Generic CSV                                                                              */
/* ---------------------------------------------------------------------------------------- */

Test(csv, by_name_strings_label_seconds_multi_hot) {
    static const char text[] =
        "\xEF\xBB\xBFts,user,action,tags,item,price\n"           /* 1 header with a BOM */
        "1700000000.5,u1,click,a|b||c,42,\"1,5\"\n"              /* 2 */
        "1700000001,u2,view,,-7,2\n"                             /* 3: empty tags, neg int */
        "1700000002,u3,click,x,281474976710656,3\n"              /* 4: 2^48 -> hashed */
        "1700000003,u4,click,x,12\n"                             /* 5 bad: 5 columns */
        "1700000004,u5,click,x,1.5,3\n"                          /* 6 bad: int */
        "soon,u6,click,x,1,3\n"                                  /* 7 bad: timestamp */
        "1700000005,\"u7\",purchase,\"p,q\",1,\"unterminated\n"; /* 8 bad: quote */
    static const mt_csv_slot_t slots[] = {
        {{-1, "user"}, 10, MT_CSV_STRING, false},
        {{-1, "tags"}, 11, MT_CSV_STRING, true},
        {{-1, "item"}, 12, MT_CSV_INT, false},
        {{0, NULL}, 12, MT_CSV_STRING, false}, /* merged into slot 12 */
    };
    static const char *const pos[] = {"click", "purchase"};
    mt_csv_config_t cfg;
    mt_csv_config_init(&cfg);
    cfg.label_kind = MT_CSV_LABEL_STRINGS;
    cfg.label = (mt_csv_column_t){-1, "action"};
    cfg.positive_labels = pos;
    cfg.npositive_labels = 2;
    cfg.time_unit = MT_CSV_TIME_S;
    cfg.timestamp = (mt_csv_column_t){-1, "ts"};
    cfg.slots = slots;
    cfg.nslots_cfg = 4;
    cr_assert_eq(mt_csv_config_validate(&cfg, NULL, 0), MT_OK);
    FILE *f = mem(text);
    mt_reader_t *r;
    char err[128] = "";
    cr_assert_eq(mt_reader_csv_open(&cfg, NULL, f, &r, err, sizeof(err)), MT_OK, "%s", err);
    uint32_t ns;
    const uint16_t *ids = mt_reader_slots(r, &ns);
    cr_assert_eq(ns, 3);
    cr_assert_eq(ids[0], 10);
    cr_assert_eq(ids[1], 11);
    cr_assert_eq(ids[2], 12);
    mt_batch_t b;
    cr_assert_eq(mt_reader_batch_init(r, &b), MT_OK);
    cr_assert_eq(mt_reader_next(r, &b, 2), MT_OK);
    cr_assert_eq(b.n, 2);
    cr_assert_eq(mt_reader_next(r, &b, 100), MT_OK);
    cr_assert_eq(b.n, 3);

    cr_assert_eq(b.labels[0], 1.0f);
    cr_assert_eq(b.timestamps_ms[0], 1700000000500LL);
    cr_assert_eq(fid(&b, 0, 0, 0), hs(10, "u1"));
    cr_assert_eq(nfids(&b, 0, 1), 3);
    cr_assert_eq(fid(&b, 0, 1, 0), hs(11, "a"));
    cr_assert_eq(fid(&b, 0, 1, 1), hs(11, "b"));
    cr_assert_eq(fid(&b, 0, 1, 2), hs(11, "c"));
    cr_assert_eq(nfids(&b, 0, 2), 2);
    cr_assert_eq(fid(&b, 0, 2, 0), mt_fid_of_int(12, 42));
    cr_assert_eq(fid(&b, 0, 2, 1), hs(12, "1700000000.5"));

    cr_assert_eq(b.labels[1], 0.0f);
    cr_assert_eq(b.timestamps_ms[1], 1700000001000LL);
    cr_assert_eq(nfids(&b, 1, 1), 0);
    cr_assert_eq(fid(&b, 1, 2, 0), hs(12, "-7"));
    cr_assert_eq(fid(&b, 2, 2, 0), hs(12, "281474976710656"));

    const mt_reader_stats_t *st = mt_reader_stats(r);
    cr_assert_eq(st->lines, 8);
    cr_assert_eq(st->bad_lines, 4);
    cr_assert_eq(st->bad[0].line, 5);
    cr_assert_str_eq(st->bad[0].reason, "expected 6 columns, got 5");
    cr_assert_eq(st->bad[1].line, 6);
    cr_assert_str_eq(st->bad[1].reason, "column 5: '1.5' is not an integer");
    cr_assert_eq(st->bad[2].line, 7);
    cr_assert_str_eq(st->bad[2].reason, "timestamp 'soon' is not unix seconds");
    cr_assert_eq(st->bad[3].line, 8);
    cr_assert_str_eq(st->bad[3].reason, "field 6: unterminated quote");
    cr_assert_eq(st->last_bad_line, 8);
    cr_assert_eq(mt_reader_next(r, &b, 100), MT_NOT_FOUND);
    mt_batch_free(&b);
    mt_reader_destroy(r);
    fclose(f);
}

Test(csv, tsv_by_index_threshold_ms_lenient) {
    static const char text[] = "0.7\t5\t1700000000123\tred;blue\n"
                               "0.2\t6\t1700000000124\t\textra\n"
                               "nan?\t7\t1\tred\n"
                               "1\t8\n"; /* lenient: short but the label and slot 1 exist? no */
    static const mt_csv_slot_t slots[] = {
        {{1, NULL}, 1, MT_CSV_INT, false},
        {{3, NULL}, 2, MT_CSV_STRING, true},
    };
    mt_csv_config_t cfg;
    mt_csv_config_init(&cfg);
    cfg.delimiter = '\t';
    cfg.quote = 0;
    cfg.header = false;
    cfg.multi_sep = ';';
    cfg.strict_columns = false;
    cfg.label_kind = MT_CSV_LABEL_THRESHOLD;
    cfg.label = (mt_csv_column_t){0, NULL};
    cfg.label_threshold = 0.5;
    cfg.time_unit = MT_CSV_TIME_MS;
    cfg.timestamp = (mt_csv_column_t){2, NULL};
    cfg.slots = slots;
    cfg.nslots_cfg = 2;
    FILE *f = mem(text);
    mt_reader_t *r;
    cr_assert_eq(mt_reader_csv_open(&cfg, NULL, f, &r, NULL, 0), MT_OK);
    mt_batch_t b;
    cr_assert_eq(mt_reader_batch_init(r, &b), MT_OK);
    cr_assert_eq(mt_reader_next(r, &b, 100), MT_OK);
    cr_assert_eq(b.n, 2);
    cr_assert_eq(b.labels[0], 1.0f);
    cr_assert_eq(b.labels[1], 0.0f);
    cr_assert_eq(b.timestamps_ms[0], 1700000000123LL);
    cr_assert_eq(fid(&b, 0, 0, 0), mt_fid_of_int(1, 5));
    cr_assert_eq(nfids(&b, 0, 1), 2);
    cr_assert_eq(fid(&b, 0, 1, 1), hs(2, "blue"));
    cr_assert_eq(nfids(&b, 1, 1), 0);
    const mt_reader_stats_t *st = mt_reader_stats(r);
    cr_assert_eq(st->bad_lines, 2);
    cr_assert_eq(st->bad[0].line, 3);
    cr_assert_str_eq(st->bad[0].reason, "label 'nan?' is not a number");
    cr_assert_eq(st->bad[1].line, 4);
    cr_assert_str_eq(st->bad[1].reason, "no timestamp column 3");
    mt_batch_free(&b);
    mt_reader_destroy(r);
    fclose(f);
}

/* Text columns: the raw text of the last example's line, by name and index; a line without
 * one is bad; an unknown name is a config error naming its role. */
Test(csv, text_columns_of_the_last_example) {
    static const char text[] = "rid,ts,user,item\n"
                               "r-1,10,5,\"it,em\"\n"
                               "r-2,11,6\n" /* no item column: bad */
                               "r-3,12,7,\n";
    static const mt_csv_slot_t slots[] = {{{-1, "user"}, 1, MT_CSV_INT, false}};
    static const mt_csv_column_t texts[] = {{-1, "rid"}, {3, NULL}};
    static const char *const names[] = {"request_id", "item_id"};
    mt_csv_config_t cfg;
    mt_csv_config_init(&cfg);
    cfg.strict_columns = false;
    cfg.slots = slots;
    cfg.nslots_cfg = 1;
    cfg.text_columns = texts;
    cfg.text_names = names;
    cfg.ntext_columns = 2;
    FILE *f = mem(text);
    mt_reader_t *r;
    char err[160];
    cr_assert_eq(mt_reader_csv_open(&cfg, NULL, f, &r, err, sizeof(err)), MT_OK, "%s", err);
    const char *t;
    size_t len;
    cr_assert_eq(mt_reader_csv_text(r, 0, &t, &len), MT_NOT_FOUND);
    cr_assert_eq(mt_reader_csv_text(r, 2, &t, &len), MT_INVALID);
    mt_batch_t b;
    cr_assert_eq(mt_reader_batch_init(r, &b), MT_OK);
    cr_assert_eq(mt_reader_next(r, &b, 1), MT_OK);
    cr_assert_eq(mt_reader_csv_text(r, 0, &t, &len), MT_OK);
    cr_assert_str_eq(t, "r-1");
    cr_assert_eq(len, 3);
    cr_assert_eq(mt_reader_csv_text(r, 1, &t, &len), MT_OK);
    cr_assert_str_eq(t, "it,em");
    cr_assert_eq(mt_reader_next(r, &b, 1), MT_OK); /* skips the bad line 3 */
    cr_assert_eq(mt_reader_csv_text(r, 0, &t, &len), MT_OK);
    cr_assert_str_eq(t, "r-3");
    cr_assert_eq(mt_reader_csv_text(r, 1, &t, &len), MT_OK);
    cr_assert_eq(len, 0);
    cr_assert_str_eq(t, "");
    cr_assert_eq(mt_reader_next(r, &b, 1), MT_NOT_FOUND);
    const mt_reader_stats_t *st = mt_reader_stats(r);
    cr_assert_eq(st->bad_lines, 1);
    cr_assert_eq(st->bad[0].line, 3);
    cr_assert_str_eq(st->bad[0].reason, "no column 4");
    mt_batch_free(&b);
    mt_reader_destroy(r);
    fclose(f);
    /* an unknown name says which role it had and what the header holds */
    static const mt_csv_column_t bad_texts[] = {{-1, "rid"}, {-1, "ad"}};
    cfg.text_columns = bad_texts;
    f = mem(text);
    cr_assert_eq(mt_reader_csv_open(&cfg, NULL, f, &r, err, sizeof(err)), MT_CONFIG);
    cr_assert_str_eq(err, "item_id: column 'ad' is not in the header (rid, ts, user, item)");
    fclose(f);
    cfg.ntext_columns = MT_CSV_MAX_TEXT_COLUMNS + 1;
    cr_assert_eq(mt_csv_config_validate(&cfg, err, sizeof(err)), MT_CONFIG);
}

Test(csv, config_errors) {
    static const mt_csv_slot_t by_name[] = {{{-1, "nope"}, 1, MT_CSV_STRING, false}};
    mt_csv_config_t cfg;
    mt_csv_config_init(&cfg);
    char err[128];
    mt_reader_t *r = NULL;
    cr_assert_eq(mt_csv_config_validate(&cfg, err, sizeof(err)), MT_CONFIG);
    cr_assert_str_eq(err, "no slots configured");
    cfg.slots = by_name;
    cfg.nslots_cfg = 1;
    FILE *f = mem("a,b\n1,2\n");
    cr_assert_eq(mt_reader_csv_open(&cfg, NULL, f, &r, err, sizeof(err)), MT_CONFIG);
    cr_assert_str_eq(err, "slots[0]: column 'nope' is not in the header (a, b)");
    cr_assert_null(r);
    fclose(f);
    cfg.header = false;
    cr_assert_eq(mt_csv_config_validate(&cfg, err, sizeof(err)), MT_CONFIG);
    cr_assert_str_eq(err, "slots[0]: column 'nope' by name needs header = true");
    cfg.header = true;
    cfg.label_kind = MT_CSV_LABEL_STRINGS;
    cfg.label = (mt_csv_column_t){0, NULL};
    cr_assert_eq(mt_csv_config_validate(&cfg, err, sizeof(err)), MT_CONFIG);
    cr_assert_str_eq(err, "label_kind STRINGS needs positive_labels");
    cfg.label_kind = MT_CSV_LABEL_NONE;
    cfg.delimiter = '"';
    cr_assert_eq(mt_csv_config_validate(&cfg, err, sizeof(err)), MT_CONFIG);
    cfg.delimiter = ',';
    cr_assert_eq(mt_reader_csv_open(&cfg, "/nonexistent/x.csv", NULL, &r, err, sizeof(err)), MT_IO);
    cr_assert_null(r);
}

/* ---------------------------------------------------------------------------------------- */
/* The real samples in MT_SHARED_DATA                                                       */
/* ---------------------------------------------------------------------------------------- */

Test(real, criteo_kaggle_sample) {
    char dir[512], path[600];
    NEED_SHARED("criteo-kaggle-sample", dir);
    snprintf(path, sizeof(path), "%s/train_head10k.txt", dir);
    mt_reader_t *r;
    cr_assert_eq(mt_reader_criteo_open(NULL, path, NULL, &r), MT_OK);
    mt_batch_t b;
    cr_assert_eq(mt_reader_batch_init(r, &b), MT_OK);
    cr_assert_eq(b.nslots, 39);
    size_t n = 0, nfid = 0;
    double pos = 0;
    bool first = true;
    mt_err_t err;
    while ((err = mt_reader_next(r, &b, 1000)) == MT_OK) {
        if (first) { /* line 1: 0 1 1 5 0 1382 4 15 2 181 1 2 <empty> 2 68fd1e64 80e26c9b ... */
            cr_assert_eq(b.labels[0], 0.0f);
            cr_assert_eq(fid(&b, 0, 4, 0), mt_fid_of_int(5, 52));
            cr_assert_eq(fid(&b, 0, 11, 0), mt_fid_of_int(12, MT_CRITEO_BUCKET_EMPTY));
            cr_assert_eq(fid(&b, 0, 13, 0), hs(14, "68fd1e64"));
            cr_assert_eq(fid(&b, 0, 14, 0), hs(15, "80e26c9b"));
            first = false;
        }
        for (size_t i = 0; i < b.n; i++) {
            pos += b.labels[i];
            for (uint32_t s = 0; s < 13; s++)
                cr_assert_eq(nfids(&b, i, s), 1);
        }
        n += b.n;
        nfid += b.nfids;
        mt_batch_clear(&b);
    }
    cr_assert_eq(err, MT_NOT_FOUND);
    cr_assert_eq(n, 10000);
    cr_assert_eq(pos, 2182); /* SOURCE.txt: 2,182 positives */
    double mean = pos / (double)n;
    cr_assert(mean > 0.1 && mean < 0.4, "label mean %f", mean);
    cr_assert_eq(nfid, 10000 * 13 + 230360); /* non-empty categorical fields (awk) */
    cr_assert_eq(mt_reader_stats(r)->bad_lines, 0);
    mt_batch_free(&b);
    mt_reader_destroy(r);

    /* the test file has no label column */
    snprintf(path, sizeof(path), "%s/test_head10k.txt", dir);
    mt_criteo_config_t cfg;
    mt_criteo_config_init(&cfg);
    cfg.has_label = false;
    cr_assert_eq(mt_reader_criteo_open(&cfg, path, NULL, &r), MT_OK);
    cr_assert_eq(mt_reader_batch_init(r, &b), MT_OK);
    n = 0;
    while (mt_reader_next(r, &b, 4096) == MT_OK) {
        n += b.n;
        mt_batch_clear(&b);
    }
    cr_assert_eq(n, 10000);
    cr_assert_eq(mt_reader_stats(r)->bad_lines, 0);
    mt_batch_free(&b);
    mt_reader_destroy(r);
}

Test(real, movielens_100k) {
    char dir[512], path[600], users[600], items[600];
    NEED_SHARED("movielens-100k", dir);
    snprintf(path, sizeof(path), "%s/u.data", dir);
    snprintf(users, sizeof(users), "%s/u.user", dir);
    snprintf(items, sizeof(items), "%s/u.item", dir);
    mt_movielens_config_t cfg;
    mt_movielens_config_init(&cfg);
    cfg.users_path = users;
    cfg.items_path = items;
    mt_reader_t *r;
    cr_assert_eq(mt_reader_movielens_open(&cfg, path, NULL, &r), MT_OK);
    cr_assert_eq(mt_reader_stats(r)->side_bad_lines, 0);
    mt_batch_t b;
    cr_assert_eq(mt_reader_batch_init(r, &b), MT_OK);
    size_t n = 0, genres = 0;
    double pos = 0;
    int64_t tmin = INT64_MAX, tmax = 0;
    while (mt_reader_next(r, &b, 8192) == MT_OK) {
        for (size_t i = 0; i < b.n; i++) {
            pos += b.labels[i];
            for (uint32_t s = 0; s < 5; s++)
                cr_assert_eq(nfids(&b, i, s), 1);
            genres += nfids(&b, i, 5);
            if (b.timestamps_ms[i] < tmin) tmin = b.timestamps_ms[i];
            if (b.timestamps_ms[i] > tmax) tmax = b.timestamps_ms[i];
        }
        n += b.n;
        mt_batch_clear(&b);
    }
    cr_assert_eq(n, 100000);
    cr_assert_eq(pos, 55375);     /* ratings >= 4 (awk) */
    cr_assert_eq(genres, 212595); /* sum of the rated items' genre flags */
    cr_assert(tmin >= 874724710000LL && tmax <= 893286638000LL, "%lld %lld", (long long)tmin,
              (long long)tmax);
    cr_assert_eq(mt_reader_stats(r)->bad_lines, 0);
    mt_batch_free(&b);
    mt_reader_destroy(r);
}

Test(real, movielens_latest_small) {
    char dir[512], path[600], movies[600];
    NEED_SHARED("movielens-latest-small", dir);
    snprintf(path, sizeof(path), "%s/ratings.csv", dir);
    snprintf(movies, sizeof(movies), "%s/movies.csv", dir);
    mt_movielens_config_t cfg;
    mt_movielens_config_init(&cfg);
    cfg.format = MT_MOVIELENS_LATEST;
    cfg.items_path = movies;
    mt_reader_t *r;
    cr_assert_eq(mt_reader_movielens_open(&cfg, path, NULL, &r), MT_OK);
    cr_assert_eq(mt_reader_stats(r)->side_bad_lines, 0);
    mt_batch_t b;
    cr_assert_eq(mt_reader_batch_init(r, &b), MT_OK);
    size_t n = 0, genres = 0;
    double pos = 0;
    while (mt_reader_next(r, &b, 8192) == MT_OK) {
        for (size_t i = 0; i < b.n; i++) {
            pos += b.labels[i];
            genres += nfids(&b, i, 2);
        }
        n += b.n;
        mt_batch_clear(&b);
    }
    cr_assert_eq(n, 100836);
    cr_assert_eq(pos, 48580);     /* ratings >= 4 (awk) */
    cr_assert_eq(genres, 274433); /* Python csv module over movies.csv */
    cr_assert_eq(mt_reader_stats(r)->bad_lines, 0);
    cr_assert_eq(mt_reader_stats(r)->lines, 100837);
    mt_batch_free(&b);
    mt_reader_destroy(r);
}

Test(real, generic_csv_on_movielens_latest) {
    char dir[512], path[600];
    NEED_SHARED("movielens-latest-small", dir);
    snprintf(path, sizeof(path), "%s/ratings.csv", dir);
    static const mt_csv_slot_t slots[] = {
        {{-1, "userId"}, 1, MT_CSV_INT, false},
        {{-1, "movieId"}, 2, MT_CSV_INT, false},
    };
    mt_csv_config_t cfg;
    mt_csv_config_init(&cfg);
    cfg.label_kind = MT_CSV_LABEL_THRESHOLD;
    cfg.label = (mt_csv_column_t){-1, "rating"};
    cfg.label_threshold = 4.0;
    cfg.time_unit = MT_CSV_TIME_S;
    cfg.timestamp = (mt_csv_column_t){-1, "timestamp"};
    cfg.slots = slots;
    cfg.nslots_cfg = 2;
    mt_reader_t *r;
    char err[128] = "";
    cr_assert_eq(mt_reader_csv_open(&cfg, path, NULL, &r, err, sizeof(err)), MT_OK, "%s", err);
    mt_batch_t b;
    cr_assert_eq(mt_reader_batch_init(r, &b), MT_OK);
    size_t n = 0;
    double pos = 0;
    while (mt_reader_next(r, &b, 10000) == MT_OK) {
        if (n == 0) { /* 1,1,4.0,964982703 */
            cr_assert_eq(fid(&b, 0, 0, 0), mt_fid_of_int(1, 1));
            cr_assert_eq(b.timestamps_ms[0], 964982703000LL);
        }
        for (size_t i = 0; i < b.n; i++)
            pos += b.labels[i];
        n += b.n;
        mt_batch_clear(&b);
    }
    cr_assert_eq(n, 100836);
    cr_assert_eq(pos, 48580);
    cr_assert_eq(mt_reader_stats(r)->bad_lines, 0);
    mt_batch_free(&b);
    mt_reader_destroy(r);
}

Test(csv, overlong_line_is_bad_not_fatal) {
    static const mt_csv_slot_t slots[] = {{{1, NULL}, 7, MT_CSV_STRING, false}};
    mt_csv_config_t cfg;
    mt_csv_config_init(&cfg);
    cfg.header = false;
    cfg.slots = slots;
    cfg.nslots_cfg = 1;
    size_t big = MT_READER_MAX_LINE_BYTES + 10;
    char *text = malloc(big + 32);
    cr_assert_not_null(text);
    size_t k = (size_t)sprintf(text, "a,b\n");
    memset(text + k, 'x', big);
    text[k + 1] = ',';
    k += big;
    k += (size_t)sprintf(text + k, "\nc,d\n");
    FILE *f = fmemopen(text, k, "r");
    cr_assert_not_null(f);
    mt_reader_t *r;
    cr_assert_eq(mt_reader_csv_open(&cfg, NULL, f, &r, NULL, 0), MT_OK);
    mt_batch_t b;
    cr_assert_eq(mt_reader_batch_init(r, &b), MT_OK);
    cr_assert_eq(mt_reader_next(r, &b, 10), MT_OK);
    cr_assert_eq(b.n, 2);
    cr_assert_eq(fid(&b, 0, 0, 0), hs(7, "b"));
    cr_assert_eq(fid(&b, 1, 0, 0), hs(7, "d"));
    const mt_reader_stats_t *st = mt_reader_stats(r);
    cr_assert_eq(st->bad_lines, 1);
    cr_assert_eq(st->last_bad_line, 2);
    cr_assert_str_eq(st->bad[0].reason, "line longer than 1048576 bytes");
    mt_batch_free(&b);
    mt_reader_destroy(r);
    fclose(f);
    free(text);
}

/* task_labels: a multi-task model's further labels, read like the label (by name or index),
 * into batches of 1 + ntask_labels labels; a one-task batch is refused by the reader; a
 * missing label column makes the line bad; config errors name the key. */
Test(csv, task_labels_per_example) {
    static const char text[] = "click,buy,like,id\n"
                               "1,0,1,5\n"
                               "0,1,0,6\n"
                               "1,1\n";
    static const mt_csv_slot_t slots[] = {{{-1, "id"}, 1, MT_CSV_INT, false}};
    const mt_csv_column_t tl[2] = {{-1, "buy"}, {2, NULL}};
    mt_csv_config_t cfg;
    mt_csv_config_init(&cfg);
    cfg.strict_columns = false;
    cfg.label_kind = MT_CSV_LABEL_THRESHOLD;
    cfg.label = (mt_csv_column_t){-1, "click"};
    cfg.label_threshold = 0.5;
    cfg.task_labels = tl;
    cfg.ntask_labels = 2;
    cfg.slots = slots;
    cfg.nslots_cfg = 1;
    FILE *f = mem(text);
    mt_reader_t *r;
    cr_assert_eq(mt_reader_csv_open(&cfg, NULL, f, &r, NULL, 0), MT_OK);
    mt_batch_t b, one;
    cr_assert_eq(mt_reader_batch_init(r, &b), MT_OK);
    cr_assert_eq(b.ntasks, 3);
    const uint16_t s1[1] = {1};
    cr_assert_eq(mt_batch_init(&one, s1, 1), MT_OK);
    cr_assert_eq(mt_reader_next(r, &one, 100), MT_MISMATCH);
    cr_assert_eq(mt_reader_next(r, &b, 100), MT_OK);
    cr_assert_eq(b.n, 2);
    const float want[6] = {1, 0, 1, 0, 1, 0};
    cr_assert_eq(memcmp(b.labels, want, sizeof(want)), 0);
    const mt_reader_stats_t *st = mt_reader_stats(r);
    cr_assert_eq(st->bad_lines, 1);
    cr_assert_str_eq(st->bad[0].reason, "no label column 3");
    mt_batch_free(&b);
    mt_batch_free(&one);
    mt_reader_destroy(r);
    fclose(f);
    char err[128];
    cfg.ntask_labels = MT_BATCH_MAX_TASKS;
    cr_assert_eq(mt_csv_config_validate(&cfg, err, sizeof(err)), MT_CONFIG);
    cr_expect(strstr(err, "task_labels") != NULL, "%s", err);
    cfg.ntask_labels = 1;
    cfg.label_kind = MT_CSV_LABEL_NONE;
    cr_assert_eq(mt_csv_config_validate(&cfg, err, sizeof(err)), MT_CONFIG);
    cr_expect(strstr(err, "task_labels need a label") != NULL, "%s", err);
}
