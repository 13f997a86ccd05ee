/*
 * config_int.h - what config.c (the property table, slot derivation) and input.c (the
 * [input] section as the generic reader's configuration) share.
 */
#ifndef MT_CONFIG_INT_H
#define MT_CONFIG_INT_H

#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"

/*
 * The slot ids input.columns @p columns maps columns to, without repeats, in the order of
 * their first entry: the order of the generic reader's slots. @p *n = 0 for "".
 * @returns MT_OK, MT_CONFIG (bad syntax, more than @p cap slots: "input.columns: ..." in
 *          @p errbuf), MT_NOMEM.
 */
mt_err_t mt__config_column_slots(const char *columns, uint64_t *v, size_t cap, size_t *n,
                                 char *errbuf, size_t errlen);

#endif /* MT_CONFIG_INT_H */
