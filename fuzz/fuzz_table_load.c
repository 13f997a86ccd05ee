/* fuzz_table_load.c - table snapshots (docs/table.md): mt_table_load() of the input as a
 * stream, then a lookup and a save of the loaded table. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mt_table_slot_config_t slots[3];
    mt_table_config_t cfg;
    mt_fuzz_table_config(&cfg, slots);
    mt_fuzz_reader_t r = {data, size};
    mt_table_t *t = NULL;
    if (mt_table_load(&cfg, mt_fuzz_read, &r, &t) == MT_OK) {
        uint64_t fids[3] = {MT_FID_MAKE(1, 1), MT_FID_MAKE(2, 5), MT_FID_MAKE(3, 9)};
        float values[4 + 8 + 2];
        uint8_t found[3];
        (void)mt_table_lookup(t, fids, 3, values, 14, found, 0, 1, NULL);
        (void)mt_table_save(t, mt_fuzz_write, NULL);
        mt_table_destroy(t);
    }
    return 0;
}
