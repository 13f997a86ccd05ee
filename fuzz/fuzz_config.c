/* fuzz_config.c - the INI parser of every daemon: mt_config_load_string() + validate. */
#include "fuzz_common.h"
#include "mt/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = mt_fuzz_cstr(data, size);
    if (!text) return 0;
    mt_config_t c;
    char err[256];
    if (mt_config_init(&c) == MT_OK &&
        mt_config_load_string(&c, text, "fuzz", err, sizeof(err)) == MT_OK) {
        (void)mt_config_validate(&c, err, sizeof(err));
        mt_table_config_t t;
        mt_config_table(&c, &t);
    }
    mt_config_free(&c);
    free(text);
    return 0;
}
