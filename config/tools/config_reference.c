/*
 * config_reference.c - writes docs/config.md, the reference of every configuration key,
 * from the property table of config/src/config.c.
 *
 * Usage: mt_config_reference [OUTPUT]   (standard output without OUTPUT)
 */
#include <stdio.h>

#include "mt/config.h"

int main(int argc, char **argv) {
    FILE *f = argc > 1 ? fopen(argv[1], "w") : stdout;
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    mt_err_t err = mt_config_write_reference(f);
    if ((f != stdout ? fclose(f) : fflush(f)) != 0) err = MT_IO;
    if (err) {
        fprintf(stderr, "mt_config_reference: %s\n", mt_strerror(err));
        return 1;
    }
    return 0;
}
