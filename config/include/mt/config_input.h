/*
 * config_input.h - the [input] section as the generic CSV/TSV reader's configuration
 * (mt_csv_config_t, data/readers.h).
 *
 * One reading of `[input]` for every program that reads a user's own log: the batch trainer
 * (format tsv / csv) and `monolith replay --dataset csv`, so that a file trains and replays
 * with the same features; mt_config_derive_trainer_slots() takes the model's slots from the
 * same parser when trainer.slots is empty.
 *
 * input.columns: entries `column:slot[:int|string][:multi]` separated by commas, whitespace
 * around an entry and its parts ignored. column = a header name, or a 0-based index when it
 * is all digits; slot 0..32767 (several columns may feed one slot); int (the default): an
 * integer below 2^48 is the id itself, another integer is hashed, a non-integer makes the line
 * bad; string: the text's hash; multi: the value is split on multi_sep (multi-hot). A name
 * cannot hold ':' or ','.
 *
 * input.label: the label column ("" = no label: every label 0); with input.positive_labels
 * (comma-separated exact values) the label is 1 when the value is one of them, else it is a
 * number and 1 when >= label_threshold. input.timestamp ("" = none) in time_unit.
 * input.request_id and input.item_id are not the reader's: they are returned beside it for
 * the replay (which reads them as text columns).
 *
 * Ownership: the mt_config_csv_t owns everything its csv points to (nothing points into the
 * mt_config_t); free it with mt_config_csv_free().
 *
 * Thread safety: reads @p c only; see mt/config.h.
 */
#ifndef MT_CONFIG_INPUT_H
#define MT_CONFIG_INPUT_H

#include <stddef.h>

#include "mt/config.h"
#include "mt/readers.h"

/** Most entries of input.columns. */
#define MT_CONFIG_MAX_COLUMNS 4096

/** [input] for the generic reader. */
typedef struct mt_config_csv {
    mt_csv_config_t csv;        /* for mt_reader_csv_open(); points into this struct */
    mt_csv_column_t request_id; /* input.request_id; index -1 and no name: none */
    mt_csv_column_t item_id;    /* input.item_id; index -1 and no name: none */
    mt_csv_column_t task_labels[MT_BATCH_MAX_TASKS - 1]; /* input.task_labels */
    /* private: the storage csv points to */
    mt_csv_slot_t *slots_;
    char *columns_; /* a copy of input.columns cut into names */
    char *strings_; /* copies of label, timestamp, request_id, item_id, positive_labels,
                       task_labels */
    const char **positive_;
} mt_config_csv_t;

/**
 * Builds the generic reader's configuration from c->input (format tsv: '\t', csv: ',';
 * '"' quoting; strict column counts).
 * @param[out] out     freed with mt_config_csv_free() (also after an error)
 * @param[out] errbuf  on error, what is wrong, naming the key ("input.columns: ...")
 * @returns MT_OK, MT_CONFIG (input.format is not tsv / csv, no or bad columns, a bad
 *          positive_labels list, what mt_csv_config_validate() refuses), MT_NOMEM.
 */
mt_err_t mt_config_input_csv(const mt_config_t *c, mt_config_csv_t *out, char *errbuf,
                             size_t errlen);

/** Frees what @p cc owns and zeroes it. NULL and a zeroed value are no-ops. */
void mt_config_csv_free(mt_config_csv_t *cc);

#endif /* MT_CONFIG_INPUT_H */
