/* fuzz_table_changes.c - change streams of incremental checkpoints (docs/table.md, "Change
 * streams"): mt_table_load_changes() of the input onto a table with a few rows, then a lookup,
 * a removal and a change stream of the result. */
#include "fuzz_common.h"

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
    mt_fuzz_reader_t r = {data, size};
    uint64_t rows = 0, dels = 0;
    (void)mt_table_load_changes(t, mt_fuzz_read, &r, &rows,
                                &dels); /* any error: t is still a table */
    (void)mt_table_lookup(t, fids, 3, values, 14, found, 0, 1700000001, NULL);
    (void)mt_table_remove(t, &fids[0], 1, NULL);
    uint64_t upto = 0;
    (void)mt_table_save_changes(t, since, mt_fuzz_write, NULL, &upto);
    (void)mt_table_save(t, mt_fuzz_write, NULL);
    mt_table_destroy(t);
    return 0;
}
