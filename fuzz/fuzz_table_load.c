/* fuzz_table_load.c - table snapshots (docs/table.md): mt_table_load() of the input as a
 * stream, then a lookup and a save of the loaded table. */
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
    reader_t r = {data, size};
    mt_table_t *t = NULL;
    if (mt_table_load(&cfg, read_fn, &r, &t) == MT_OK) {
        uint64_t fids[3] = {MT_FID_MAKE(1, 1), MT_FID_MAKE(2, 5), MT_FID_MAKE(3, 9)};
        float values[4 + 8 + 2];
        uint8_t found[3];
        (void)mt_table_lookup(t, fids, 3, values, 14, found, 0, 1, NULL);
        (void)mt_table_save(t, write_fn, NULL);
        mt_table_destroy(t);
    }
    return 0;
}
