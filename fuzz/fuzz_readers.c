/*
 * fuzz_readers.c - the text readers on a FILE* (fmemopen): one source, three targets chosen
 * at compile time (MT_FUZZ_READER): Criteo TSV, MovieLens (100k / latest), config-driven CSV.
 * The first input byte picks a variant (has_label, format, CSV layout); the rest is the file.
 */
#include <stdio.h>

#include "fuzz_common.h"
#include "mt/readers.h"

#define READER_CRITEO    1
#define READER_MOVIELENS 2
#define READER_CSV       3

static void on_bad(void *opaque, uint64_t line, const char *reason) {
    (void)opaque;
    (void)line;
    (void)strlen(reason);
}

#if MT_FUZZ_READER == READER_CSV
static mt_err_t open_csv(uint8_t mode, FILE *in, mt_reader_t **r) {
    static const char *const positives[] = {"click", "1"};
    mt_csv_config_t cfg;
    mt_csv_config_init(&cfg);
    mt_csv_slot_t slots[3];
    char err[256];
    if (mode & 1) { /* header, columns by name: label,ts,user,item,tags */
        cfg.header = true;
        cfg.label_kind = (mode & 2) ? MT_CSV_LABEL_STRINGS : MT_CSV_LABEL_THRESHOLD;
        cfg.label = (mt_csv_column_t){-1, "label"};
        cfg.positive_labels = positives;
        cfg.npositive_labels = 2;
        cfg.label_threshold = 0.5;
        cfg.time_unit = (mode & 4) ? MT_CSV_TIME_MS : MT_CSV_TIME_S;
        cfg.timestamp = (mt_csv_column_t){-1, "ts"};
        slots[0] = (mt_csv_slot_t){{-1, "user"}, 1, MT_CSV_INT, false};
        slots[1] = (mt_csv_slot_t){{-1, "item"}, 2, MT_CSV_STRING, false};
        slots[2] = (mt_csv_slot_t){{-1, "tags"}, 2, MT_CSV_STRING, true};
    } else { /* no header, by index; TSV or CSV, quoting on or off */
        cfg.header = false;
        cfg.delimiter = (mode & 2) ? '\t' : ',';
        cfg.quote = (mode & 4) ? '"' : 0;
        cfg.strict_columns = (mode & 8) != 0;
        cfg.label_kind = MT_CSV_LABEL_THRESHOLD;
        cfg.label = (mt_csv_column_t){0, NULL};
        cfg.label_threshold = 1;
        cfg.time_unit = MT_CSV_TIME_S;
        cfg.timestamp = (mt_csv_column_t){1, NULL};
        slots[0] = (mt_csv_slot_t){{2, NULL}, 1, MT_CSV_INT, false};
        slots[1] = (mt_csv_slot_t){{3, NULL}, 2, MT_CSV_STRING, false};
        slots[2] = (mt_csv_slot_t){{4, NULL}, 3, MT_CSV_INT, true};
    }
    cfg.slots = slots;
    cfg.nslots_cfg = 3;
    return mt_reader_csv_open(&cfg, NULL, in, r, err, sizeof(err));
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    /* fmemopen() of 0 bytes fails on older glibc: read an empty file from a 1-byte buffer. */
    static char empty[1];
    FILE *in = size ? fmemopen((void *)data, size, "r") : fmemopen(empty, 1, "r");
    if (!in) return 0;
    if (!size) (void)fgetc(in);
    mt_reader_t *r = NULL;
    mt_err_t err;
#if MT_FUZZ_READER == READER_CRITEO
    mt_criteo_config_t cfg;
    mt_criteo_config_init(&cfg);
    cfg.has_label = (mode & 1) == 0;
    err = mt_reader_criteo_open(&cfg, NULL, in, &r);
#elif MT_FUZZ_READER == READER_MOVIELENS
    mt_movielens_config_t cfg;
    mt_movielens_config_init(&cfg);
    cfg.format = (mode & 1) ? MT_MOVIELENS_LATEST : MT_MOVIELENS_100K;
    cfg.positive_rating = (mode & 2) ? 3.5f : 4.0f;
    err = mt_reader_movielens_open(&cfg, NULL, in, &r);
#elif MT_FUZZ_READER == READER_CSV
    err = open_csv(mode, in, &r);
#else
#error "MT_FUZZ_READER must be READER_CRITEO, READER_MOVIELENS or READER_CSV"
#endif
    if (err == MT_OK) {
        mt_reader_set_bad_line_cb(r, on_bad, NULL);
        mt_batch_t b;
        if (mt_reader_batch_init(r, &b) == MT_OK) {
            while (mt_reader_next(r, &b, 7) == MT_OK)
                mt_batch_clear(&b);
            mt_batch_free(&b);
        }
        (void)mt_reader_stats(r);
    }
    mt_reader_destroy(r);
    fclose(in);
    return 0;
}
