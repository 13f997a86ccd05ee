/* fuzz_table_changes.c - change streams of incremental checkpoints (docs/table.md, "Change
 * streams"): mt_table_load_changes() of the input onto a table with a few rows, then a lookup,
 * a removal and a change stream of the result. */
#include "fuzz_common.h"

typedef struct reader {
    const uint8_t *p;
    size_t left;
} reader_t;

static mt_err_t read_fn(void *ud, void *buf, size_t len, size_t *got) {
    reader_t *r = ud;
    size_t n = len < r->left ? len : r->left;
    if (n) memcpy(buf, r->p, n);
    r->p += n;
    r->left -= n;
    *got = n;
    return MT_OK;
}

static mt_err_t write_fn(void *ud, const void *buf, size_t len) {
    (void)ud;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < len; i += 64)
        sink ^= ((const uint8_t *)buf)[i];
    (void)sink;
    return MT_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mt_table_slot_config_t slots[3];
    mt_table_config_t cfg;
    mt_fuzz_table_config(&cfg, slots);
    mt_table_t *t = NULL;
    if (mt_table_create(&cfg, &t) != MT_OK) return 0;
    uint64_t fids[3] = {MT_FID_MAKE(1, 1), MT_FID_MAKE(2, 5), MT_FID_MAKE(3, 9)};
    float values[4 + 8 + 2];
    uint8_t found[3];
    (void)mt_table_lookup(t, fids, 2, values, 12, found, MT_TABLE_TRAIN, 1700000000, NULL);
    uint64_t since = mt_table_changes_cursor(t);
    reader_t r = {data, size};
    uint64_t rows = 0, dels = 0;
    (void)mt_table_load_changes(t, read_fn, &r, &rows, &dels); /* any error: t is still a table */
    (void)mt_table_lookup(t, fids, 3, values, 14, found, 0, 1700000001, NULL);
    (void)mt_table_remove(t, &fids[0], 1, NULL);
    uint64_t upto = 0;
    (void)mt_table_save_changes(t, since, write_fn, NULL, &upto);
    (void)mt_table_save(t, write_fn, NULL);
    mt_table_destroy(t);
    return 0;
}
