/* fuzz_dense_load.c - the PS's dense state in a checkpoint (DenseState protobuf):
 * mt_ps_dense_load() on an in-process PS, then a save of what was loaded. */
#include <stdio.h>

#include "fuzz_common.h"
#include "mt/ps.h"

static mt_ps_t *ps;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ps) {
        mt_table_slot_config_t slots[3];
        mt_ps_config_t cfg;
        mt_ps_config_init(&cfg);
        mt_fuzz_table_config(&cfg.table, slots);
        if (mt_ps_create(&cfg, NULL, &ps) != MT_OK) {
            fprintf(stderr, "fuzz_dense_load: cannot build the PS\n");
            abort();
        }
    }
    if (mt_ps_dense_load(ps, data, size) == MT_OK) {
        uint8_t *buf = NULL;
        size_t len = 0;
        if (mt_ps_dense_save(ps, &buf, &len) == MT_OK) free(buf);
    }
    return 0;
}
