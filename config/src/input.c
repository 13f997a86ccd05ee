/*
 * input.c - the [input] section as the generic CSV/TSV reader's configuration (see
 * mt/config_input.h for the syntax), and the slots input.columns names (config_int.h), for
 * mt_config_derive_trainer_slots().
 *
 * Both go through one parser, parse_columns(), which cuts a writable copy of input.columns
 * in place: the names of the resulting mt_csv_slot_t point into that copy.
 */
#include "mt/config_input.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_int.h"

/* ---------------------------------------------------------------------------------------- */
/* Private helpers                                                                          */
/* ---------------------------------------------------------------------------------------- */

#define MAX_COLUMN_INDEX ((1u << 20) - 1) /* the reader's bound */

static bool is_space(char ch) {
    return ch == ' ' || ch == '\t';
}

static char *trim(char *s) {
    while (is_space(*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && is_space(e[-1]))
        *--e = '\0';
    return s;
}

/* Cuts the next entry of a comma-separated list at *p (in place) and moves *p past it.
 * @returns the entry trimmed (empty for an empty entry). Call while **p. */
static char *cut_entry(char **p) {
    char *s = *p, *end = strchr(s, ',');
    if (end) *end = '\0';
    *p = end ? end + 1 : s + strlen(s);
    return trim(s);
}

static bool all_digits(const char *s) {
    if (!*s) return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return false;
    return true;
}

/* Entries of a comma-separated list, an upper bound. */
static size_t list_entries(const char *s) {
    size_t n = 1;
    for (; *s; s++)
        n += *s == ',';
    return n;
}

/* A column reference of key @p key: "" = none, all digits = an index, else a name (pointing
 * at @p s, trimmed). */
static mt_err_t column_ref(const char *key, char *s, bool header, mt_csv_column_t *out,
                           char *errbuf, size_t errlen) {
    s = trim(s);
    *out = (mt_csv_column_t){-1, NULL};
    if (!*s) return MT_OK;
    if (all_digits(s)) {
        unsigned long v = strlen(s) > 7 ? MAX_COLUMN_INDEX + 1ul : strtoul(s, NULL, 10);
        if (v > MAX_COLUMN_INDEX) {
            mt_msgf(errbuf, errlen, "%s: column index %s is above %u", key, s, MAX_COLUMN_INDEX);
            return MT_CONFIG;
        }
        out->index = (int)v;
        return MT_OK;
    }
    if (!header) {
        mt_msgf(errbuf, errlen, "%s: column '%s' by name needs input.header = true", key, s);
        return MT_CONFIG;
    }
    out->name = s;
    return MT_OK;
}

/* Cuts @p spec (a writable copy of input.columns) into at most @p cap entries of @p out;
 * their names point into @p spec. Empty entries are skipped. */
static mt_err_t parse_columns(char *spec, bool header, mt_csv_slot_t *out, size_t cap, size_t *n,
                              char *errbuf, size_t errlen) {
    *n = 0;
    char *p = spec;
    while (*p) {
        char *item = cut_entry(&p);
        if (!*item) continue;
        char shown[80]; /* the entry as written, for messages */
        snprintf(shown, sizeof(shown), "%s", item);
        if (*n == cap) {
            mt_msgf(errbuf, errlen, "input.columns: more than %zu entries", cap);
            return MT_CONFIG;
        }
        char *parts[8];
        size_t np = 0;
        for (char *q = item;;) {
            char *colon = strchr(q, ':');
            if (np == 8) {
                mt_msgf(errbuf, errlen, "input.columns: '%s': too many ':' parts", shown);
                return MT_CONFIG;
            }
            parts[np++] = q;
            if (!colon) break;
            *colon = '\0';
            q = colon + 1;
        }
        if (np < 2) {
            mt_msgf(errbuf, errlen,
                    "input.columns: '%s': expected column:slot[:int|string][:multi]", shown);
            return MT_CONFIG;
        }
        mt_csv_slot_t *s = &out[*n];
        memset(s, 0, sizeof(*s));
        s->kind = MT_CSV_INT;
        char *col = trim(parts[0]), *slot = trim(parts[1]);
        if (!*col) {
            mt_msgf(errbuf, errlen, "input.columns: '%s': no column before ':'", shown);
            return MT_CONFIG;
        }
        if (!all_digits(slot) || strlen(slot) > 5 || strtoul(slot, NULL, 10) > 0x7fff) {
            mt_msgf(errbuf, errlen, "input.columns: '%s': bad slot '%s' (0..32767)", shown, slot);
            return MT_CONFIG;
        }
        s->slot_id = (uint16_t)strtoul(slot, NULL, 10);
        char key[120];
        snprintf(key, sizeof(key), "input.columns: '%s'", shown);
        mt_err_t err = column_ref(key, col, header, &s->column, errbuf, errlen);
        if (err) return err;
        for (size_t k = 2; k < np; k++) {
            const char *opt = trim(parts[k]);
            if (!strcmp(opt, "int")) {
                s->kind = MT_CSV_INT;
            } else if (!strcmp(opt, "string")) {
                s->kind = MT_CSV_STRING;
            } else if (!strcmp(opt, "multi")) {
                s->multi = true;
            } else {
                mt_msgf(errbuf, errlen,
                        "input.columns: '%s': unknown option '%s' (int, string, multi)", shown,
                        opt);
                return MT_CONFIG;
            }
        }
        (*n)++;
    }
    return MT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* API                                                                                      */
/* ---------------------------------------------------------------------------------------- */

mt_err_t mt__config_column_slots(const char *columns, uint64_t *v, size_t cap, size_t *n,
                                 char *errbuf, size_t errlen) {
    *n = 0;
    size_t max = list_entries(columns);
    if (max > MT_CONFIG_MAX_COLUMNS) max = MT_CONFIG_MAX_COLUMNS;
    char *spec = strdup(columns);
    mt_csv_slot_t *slots = calloc(max, sizeof(*slots));
    size_t ns = 0;
    mt_err_t err = MT_NOMEM;
    if (!spec || !slots) goto out;
    /* names by header are fine here: only the slots matter */
    if ((err = parse_columns(spec, true, slots, max, &ns, errbuf, errlen))) goto out;
    for (size_t i = 0; i < ns; i++) {
        size_t k = 0;
        while (k < *n && v[k] != slots[i].slot_id)
            k++;
        if (k < *n) continue;
        if (*n == cap) {
            mt_msgf(errbuf, errlen, "input.columns: more than %zu slots", cap);
            err = MT_CONFIG;
            goto out;
        }
        v[(*n)++] = slots[i].slot_id;
    }
    err = MT_OK;
out:
    free(spec);
    free(slots);
    return err;
}

void mt_config_csv_free(mt_config_csv_t *cc) {
    if (!cc) return;
    free(cc->slots_);
    free(cc->columns_);
    free(cc->strings_);
    free(cc->positive_);
    memset(cc, 0, sizeof(*cc));
}

mt_err_t mt_config_input_csv(const mt_config_t *c, mt_config_csv_t *out, char *errbuf,
                             size_t errlen) {
    memset(out, 0, sizeof(*out));
    const mt_config_input_t *in = &c->input;
    if (in->format != MT_INPUT_TSV && in->format != MT_INPUT_CSV) {
        mt_msgf(errbuf, errlen,
                "input.format: the generic reader reads format tsv or csv (criteo and movielens "
                "have readers of their own)");
        return MT_CONFIG;
    }
    bool header = in->header != 0;
    mt_csv_config_t *cc = &out->csv;
    mt_csv_config_init(cc);
    cc->delimiter = in->format == MT_INPUT_TSV ? '\t' : ',';
    cc->header = header;
    cc->multi_sep = (char)in->multi_sep;

    /* the columns */
    size_t max = list_entries(in->columns), n = 0;
    if (max > MT_CONFIG_MAX_COLUMNS) max = MT_CONFIG_MAX_COLUMNS;
    out->columns_ = strdup(in->columns);
    out->slots_ = calloc(max, sizeof(*out->slots_));
    if (!out->columns_ || !out->slots_) return MT_NOMEM;
    mt_err_t err = parse_columns(out->columns_, header, out->slots_, max, &n, errbuf, errlen);
    if (err) return err;
    if (n == 0) {
        mt_msgf(errbuf, errlen,
                "input.columns: no columns: map at least one column to a slot "
                "(column:slot[:int|string][:multi], ...)");
        return MT_CONFIG;
    }
    cc->slots = out->slots_;
    cc->nslots_cfg = n;

    /* the single columns and the positive values: one buffer of NUL-terminated copies */
    const char *const src[6] = {in->label,   in->timestamp,       in->request_id,
                                in->item_id, in->positive_labels, in->task_labels};
    size_t total = 0;
    for (int i = 0; i < 6; i++)
        total += strlen(src[i]) + 1;
    char *part[6], *buf = out->strings_ = malloc(total);
    if (!buf) return MT_NOMEM;
    for (int i = 0; i < 6; i++) {
        size_t len = strlen(src[i]) + 1;
        memcpy(buf, src[i], len);
        part[i] = buf;
        buf += len;
    }
    if ((err = column_ref("input.label", part[0], header, &cc->label, errbuf, errlen)) ||
        (err = column_ref("input.timestamp", part[1], header, &cc->timestamp, errbuf, errlen)) ||
        (err = column_ref("input.request_id", part[2], header, &out->request_id, errbuf, errlen)) ||
        (err = column_ref("input.item_id", part[3], header, &out->item_id, errbuf, errlen)))
        return err;
    bool has_label = cc->label.index >= 0 || cc->label.name;
    size_t nt = 0; /* input.task_labels: cut in place */
    for (char *p = part[5]; *p;) {
        char *v = cut_entry(&p);
        if (!*v) continue;
        if (nt == MT_BATCH_MAX_TASKS - 1) {
            mt_msgf(errbuf, errlen, "input.task_labels: more than %d columns",
                    MT_BATCH_MAX_TASKS - 1);
            return MT_CONFIG;
        }
        if ((err =
                 column_ref("input.task_labels", v, header, &out->task_labels[nt], errbuf, errlen)))
            return err;
        nt++;
    }
    if (nt && !has_label) {
        mt_msgf(errbuf, errlen, "input.task_labels: needs a label column (input.label)");
        return MT_CONFIG;
    }
    cc->task_labels = out->task_labels;
    cc->ntask_labels = nt;
    cc->label_kind = has_label ? MT_CSV_LABEL_THRESHOLD : MT_CSV_LABEL_NONE;
    cc->label_threshold = in->label_threshold;
    if (*trim(part[4])) {
        out->positive_ = calloc(list_entries(part[4]), sizeof(char *));
        if (!out->positive_) return MT_NOMEM;
        size_t np = 0;
        for (char *p = part[4]; *p;) {
            char *v = cut_entry(&p);
            if (*v) out->positive_[np++] = v;
        }
        if (np == 0) {
            mt_msgf(errbuf, errlen, "input.positive_labels: '%s': no value", in->positive_labels);
            return MT_CONFIG;
        }
        if (!has_label) {
            mt_msgf(errbuf, errlen, "input.positive_labels: needs a label column (input.label)");
            return MT_CONFIG;
        }
        cc->label_kind = MT_CSV_LABEL_STRINGS;
        cc->positive_labels = out->positive_;
        cc->npositive_labels = np;
    }
    bool has_ts = cc->timestamp.index >= 0 || cc->timestamp.name;
    cc->time_unit = !has_ts              ? MT_CSV_TIME_NONE
                    : in->time_unit == 1 ? MT_CSV_TIME_S
                                         : MT_CSV_TIME_MS;
    char msg[256];
    if (mt_csv_config_validate(cc, msg, sizeof(msg)) != MT_OK) {
        mt_msgf(errbuf, errlen, "input: %s", msg);
        return MT_CONFIG;
    }
    return MT_OK;
}
