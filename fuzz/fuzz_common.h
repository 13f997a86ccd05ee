/*
 * fuzz_common.h - helpers shared by the libFuzzer targets of fuzz/ (docs/fuzzing.md).
 *
 * Every target defines LLVMFuzzerTestOneInput(); state that is costly to build (a PS, a
 * joiner's RocksDB, a serving replica) is created once per process on the first input.
 * Targets never abort on bad input: whatever the decoder returns is fine, only crashes,
 * sanitizer reports, leaks and timeouts are findings.
 */
#ifndef MT_FUZZ_COMMON_H
#define MT_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mt/table.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A small table config: slot 1 (dim 4, Adagrad), slot 2 (dim 8, Adam, fp16), slot 3 (dim 2,
 * FTRL, min_count 2, ttl 60 s); 4 parts, a small filter. @p slots must hold 3 entries. */
static inline void mt_fuzz_table_config(mt_table_config_t *cfg, mt_table_slot_config_t *slots) {
    mt_table_slot_config_init(&slots[0], 1, 4);
    slots[0].opt = MT_OPT_ADAGRAD;
    mt_table_slot_config_init(&slots[1], 2, 8);
    slots[1].opt = MT_OPT_ADAM;
    slots[1].precision = MT_PREC_FP16;
    mt_table_slot_config_init(&slots[2], 3, 2);
    slots[2].opt = MT_OPT_FTRL;
    slots[2].min_count = 2;
    slots[2].ttl_s = 60;
    mt_table_config_init(cfg);
    cfg->slots = slots;
    cfg->nslots = 3;
    cfg->shards_log2 = 2;
    cfg->filter_bytes = 1u << 16;
    cfg->changelog_entries = 1024;
}

/* The input as a table stream (mt_table_read_fn over a reader), and a writer that touches
 * every 64th byte of what it is given (mt_table_write_fn), for the table targets. */
typedef struct mt_fuzz_reader {
    const uint8_t *p;
    size_t left;
} mt_fuzz_reader_t;

static inline mt_err_t mt_fuzz_read(void *ud, void *buf, size_t len, size_t *got) {
    mt_fuzz_reader_t *r = ud;
    size_t n = len < r->left ? len : r->left;
    if (n) memcpy(buf, r->p, n);
    r->p += n;
    r->left -= n;
    *got = n;
    return MT_OK;
}

static inline mt_err_t mt_fuzz_write(void *ud, const void *buf, size_t len) {
    (void)ud;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < len; i += 64)
        sink ^= ((const uint8_t *)buf)[i];
    (void)sink;
    return MT_OK;
}

/* A NUL-terminated copy of the input (caller frees), or NULL when out of memory. */
static inline char *mt_fuzz_cstr(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) return NULL;
    if (size) memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

#endif /* MT_FUZZ_COMMON_H */
