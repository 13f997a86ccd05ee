/*
 * readers.h - text readers that fill mt_batch_t in chunks: Criteo TSV, MovieLens (100k and
 * latest-small) and a generic, config-driven CSV/TSV reader for everybody's own log format.
 *
 * All readers share one opaque type and one loop:
 *
 *   mt_reader_t *r;  mt_batch_t b;
 *   mt_reader_criteo_open(NULL, "train.txt", NULL, &r);
 *   mt_reader_batch_init(r, &b);
 *   while (mt_reader_next(r, &b, 4096) == MT_OK) { train(&b); mt_batch_clear(&b); }
 *   // MT_NOT_FOUND = end of input; look at mt_reader_stats(r)->bad_lines
 *   mt_batch_free(&b); mt_reader_destroy(r);
 *
 * Input: one record per line ('\n', a trailing '\r' is dropped). Blank lines are skipped and
 * not counted as bad. A bad line (wrong column count, unparsable label / number / timestamp,
 * over MT_READER_MAX_LINE_BYTES) is skipped and counted, never fatal: mt_reader_stats() has
 * the count, the number of the last bad line and the first MT_READER_BAD_KEPT bad lines with
 * their reasons; an optional callback sees every one. Line numbers start at 1 and include the
 * header line.
 *
 * Every example gets sample rate 1. Labels are 0 or 1.
 *
 * Ownership: a reader owns everything it allocates. When opened on a FILE* the stream is
 * borrowed (the caller closes it after mt_reader_destroy()); when opened on a path the reader
 * opens and closes the file itself. Configs are only read during the open call (strings and
 * arrays in them are copied).
 *
 * Thread safety: a reader is used by one thread at a time; distinct readers are independent.
 */
#ifndef MT_READERS_H
#define MT_READERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mt/batch.h"
#include "mt/err.h"

/** How many bad lines (the first ones) mt_reader_stats() keeps with their reasons. */
#define MT_READER_BAD_KEPT       8
/** Longer lines are bad lines. */
#define MT_READER_MAX_LINE_BYTES (1u << 20)

typedef struct mt_reader mt_reader_t;

/** One bad line: its 1-based line number and why it was skipped. */
typedef struct mt_reader_bad_line {
    uint64_t line;
    char reason[96];
} mt_reader_bad_line_t;

typedef struct mt_reader_stats {
    uint64_t lines;         /* lines read so far, header and blank lines included */
    uint64_t examples;      /* examples appended to batches */
    uint64_t bad_lines;     /* lines skipped as bad */
    uint64_t last_bad_line; /* line number of the last bad line, 0 if none */
    uint32_t nbad_kept;     /* entries used in bad[] */
    mt_reader_bad_line_t bad[MT_READER_BAD_KEPT]; /* the first bad lines */
    uint64_t side_bad_lines; /* MovieLens: lines skipped in the side files (u.user, u.item...) */
} mt_reader_stats_t;

/** Called for every bad line (from inside mt_reader_next()); @p reason is valid for the call. */
typedef void (*mt_reader_bad_line_cb)(void *opaque, uint64_t line, const char *reason);

/* ---------------------------------------------------------------------------------------- */
/* Criteo                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/*
 * Criteo Display Advertising Challenge TSV, no header:
 *   <label> <I1..I13 integers> <C1..C26 hex strings>   (40 fields; 39 without label)
 * Slots 1..13 = I1..I13, one fid each, value = bucket:
 *   v in 0..2 -> v;  v > 2 -> floor(ln(v)^2)  (note: 1 and 3 share bucket 1, as in the
 *   usual trick);  v < 0 -> MT_CRITEO_BUCKET_NEG + min(-v, 999);  empty -> MT_CRITEO_BUCKET_EMPTY.
 * Slots 14..39 = C1..C26, fid = mt_fid_of_bytes(slot, the string's bytes); empty -> no fid.
 * Timestamp 0 (the rows are in time order but carry none).
 */
#define MT_CRITEO_NINT         13
#define MT_CRITEO_NCAT         26
#define MT_CRITEO_NSLOTS       39
#define MT_CRITEO_BUCKET_NEG   10000ull
#define MT_CRITEO_BUCKET_EMPTY 20000ull

typedef struct mt_criteo_config {
    bool has_label; /* true (train.txt); false for test.txt (39 fields, every label 0) */
} mt_criteo_config_t;

/** Defaults: has_label = true. */
void mt_criteo_config_init(mt_criteo_config_t *cfg);

/** The bucket of an integer feature value (see above). */
uint64_t mt_criteo_bucket(int64_t v);

/**
 * Opens a Criteo reader on @p in (borrowed) or, when @p in is NULL, on the file @p path.
 * @param[in] cfg NULL for defaults.
 * @param[out] out the reader, freed with mt_reader_destroy().
 * @returns MT_OK, MT_INVALID (no input), MT_IO (cannot open @p path), MT_NOMEM.
 */
mt_err_t mt_reader_criteo_open(const mt_criteo_config_t *cfg, const char *path, FILE *in,
                               mt_reader_t **out);

/* ---------------------------------------------------------------------------------------- */
/* MovieLens                                                                                */
/* ---------------------------------------------------------------------------------------- */

/*
 * Label = 1 when rating >= positive_rating (default 4: "ratings >= 4 are clicks"), else 0.
 * Timestamp = the rating's unix seconds * 1000.
 * Slots (ids as integer fids):
 *   MT_ML_SLOT_USER (1)       user id
 *   MT_ML_SLOT_ITEM (2)       item (movie) id
 *   with users_path (100k u.user "id|age|gender|occupation|zip"):
 *   MT_ML_SLOT_AGE (3)        age bucket, the lower bound of 1, 18, 25, 35, 45, 50, 56
 *   MT_ML_SLOT_GENDER (4)     mt_fid_of_bytes of "M" / "F"
 *   MT_ML_SLOT_OCCUPATION (5) mt_fid_of_bytes of the occupation name
 *   with items_path:
 *   MT_ML_SLOT_GENRES (6)     multi-hot: 100k u.item -> the genre's flag index 0..18 as an
 *                             integer fid; latest movies.csv -> mt_fid_of_bytes of the name
 * The batch has only the slots configured, in this order. A rating whose user or item is not
 * in the side file gets empty side slots.
 */
enum {
    MT_ML_SLOT_USER = 1,
    MT_ML_SLOT_ITEM = 2,
    MT_ML_SLOT_AGE = 3,
    MT_ML_SLOT_GENDER = 4,
    MT_ML_SLOT_OCCUPATION = 5,
    MT_ML_SLOT_GENRES = 6,
};

typedef enum mt_movielens_format {
    MT_MOVIELENS_100K,   /* u.data: "user\titem\trating\tunix_s", no header */
    MT_MOVIELENS_LATEST, /* ratings.csv: header "userId,movieId,rating,timestamp" */
} mt_movielens_format_t;

typedef struct mt_movielens_config {
    mt_movielens_format_t format;
    const char *users_path; /* u.user (100k only); NULL = no user side slots */
    const char *items_path; /* u.item (100k) or movies.csv (latest); NULL = no genre slot */
    float positive_rating;  /* label = rating >= this; default 4 */
} mt_movielens_config_t;

/** Defaults: 100k, no side files, positive_rating 4. */
void mt_movielens_config_init(mt_movielens_config_t *cfg);

/**
 * Opens a MovieLens ratings reader on @p in (borrowed) or the file @p path; reads the side
 * files named in @p cfg now (their bad lines are counted in side_bad_lines).
 * @returns MT_OK, MT_INVALID (no input), MT_CONFIG (users_path with the latest format, bad
 *          positive_rating), MT_IO (a file cannot be opened or read), MT_NOMEM.
 */
mt_err_t mt_reader_movielens_open(const mt_movielens_config_t *cfg, const char *path, FILE *in,
                                  mt_reader_t **out);

/* ---------------------------------------------------------------------------------------- */
/* Generic CSV / TSV                                                                        */
/* ---------------------------------------------------------------------------------------- */

/** A column: by header @p name when non-NULL (needs header = true), else by 0-based index. */
typedef struct mt_csv_column {
    int index; /* -1 = none (only for the label and timestamp) */
    const char *name;
} mt_csv_column_t;

typedef enum mt_csv_value_kind {
    MT_CSV_INT,    /* integer: fid = the value when 0 <= v < 2^48, else hash of the text;
                      unparsable -> bad line */
    MT_CSV_STRING, /* fid = mt_fid_of_bytes of the text */
} mt_csv_value_kind_t;

typedef struct mt_csv_slot {
    mt_csv_column_t column;
    uint16_t slot_id; /* several columns may feed the same slot (their fids are merged) */
    mt_csv_value_kind_t kind;
    bool multi; /* split the value on the config's multi_sep: multi-hot */
} mt_csv_slot_t;

typedef enum mt_csv_label_kind {
    MT_CSV_LABEL_NONE,      /* every label 0 (inference logs) */
    MT_CSV_LABEL_THRESHOLD, /* numeric: label = value >= label_threshold */
    MT_CSV_LABEL_STRINGS,   /* label = value is one of positive_labels (exact match) */
} mt_csv_label_kind_t;

typedef enum mt_csv_time_unit {
    MT_CSV_TIME_NONE, /* no timestamp column: 0 */
    MT_CSV_TIME_S,    /* unix seconds (a fraction is allowed) */
    MT_CSV_TIME_MS,   /* unix milliseconds */
} mt_csv_time_unit_t;

typedef struct mt_csv_config {
    char delimiter;      /* ',' ('\t' for TSV) */
    char quote;          /* '"': RFC 4180 quoting within one line; 0 = no quoting */
    bool header;         /* the first line names the columns and is no example */
    char multi_sep;      /* separator of multi-hot values, e.g. '|'; used by slots with multi */
    bool strict_columns; /* a line with another column count than the first (or the header)
                            is bad; when false, only missing referenced columns are bad */
    mt_csv_label_kind_t label_kind;
    mt_csv_column_t label;
    /* A multi-task model's further labels (task 1, 2, ...): ntask_labels columns read like
     * label (same kind, threshold and positive strings); the batches then carry
     * 1 + ntask_labels labels per example (mt_reader_batch_init()). At most
     * MT_BATCH_MAX_TASKS - 1; needs a label_kind other than NONE. */
    const mt_csv_column_t *task_labels;
    size_t ntask_labels;
    double label_threshold;             /* MT_CSV_LABEL_THRESHOLD */
    const char *const *positive_labels; /* MT_CSV_LABEL_STRINGS, npositive_labels of them */
    size_t npositive_labels;
    mt_csv_time_unit_t time_unit;
    mt_csv_column_t timestamp;
    const mt_csv_slot_t *slots; /* nslots_cfg column -> slot mappings, at least one */
    size_t nslots_cfg;
    /* Text columns: ntext_columns (at most MT_CSV_MAX_TEXT_COLUMNS) columns whose raw text
     * mt_reader_csv_text() returns for the last example read (a request id, an item id: what
     * is no feature). A line without one of them is bad; an empty value is not. */
    const mt_csv_column_t *text_columns;
    const char *const *text_names; /* NULL, or ntext_columns names for messages (else
                                      "text_columns[i]") */
    size_t ntext_columns;
} mt_csv_config_t;

/** Most text columns of one reader. */
#define MT_CSV_MAX_TEXT_COLUMNS 8

/** Defaults: ',', '"', header, '|', strict, no label, no timestamp, no slots (set them),
 *  no text columns. */
void mt_csv_config_init(mt_csv_config_t *cfg);

/**
 * Checks @p cfg; on error writes a message into @p errbuf (may be NULL).
 * @returns MT_OK or MT_CONFIG.
 */
mt_err_t mt_csv_config_validate(const mt_csv_config_t *cfg, char *errbuf, size_t errlen);

/**
 * Opens a generic reader on @p in (borrowed) or the file @p path. With a header, the header
 * is read now and column names are resolved (an unknown name -> MT_CONFIG with a message).
 * @returns MT_OK, MT_INVALID (no input), MT_CONFIG, MT_IO, MT_NOMEM; on error @p errbuf
 *          (may be NULL) says why.
 */
mt_err_t mt_reader_csv_open(const mt_csv_config_t *cfg, const char *path, FILE *in,
                            mt_reader_t **out, char *errbuf, size_t errlen);

/**
 * The text of text column @p i (see mt_csv_config_t) in the line of the last example
 * mt_reader_next() appended: @p *text is NUL-terminated (quotes removed), @p *len its length.
 * Valid until the next mt_reader_next() or mt_reader_destroy() on @p r.
 * @returns MT_OK, MT_INVALID (not a generic reader, @p i out of range), MT_NOT_FOUND (no
 *          example read yet).
 */
mt_err_t mt_reader_csv_text(const mt_reader_t *r, size_t i, const char **text, size_t *len);

/* ---------------------------------------------------------------------------------------- */
/* Common                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/** Frees @p r (closes the file it opened itself). NULL is fine. */
void mt_reader_destroy(mt_reader_t *r);

/** The reader's slot ids (valid while @p r lives) and their count in @p nslots. */
const uint16_t *mt_reader_slots(const mt_reader_t *r, uint32_t *nslots);

/** mt_batch_init() of @p b with the reader's slots. */
mt_err_t mt_reader_batch_init(const mt_reader_t *r, mt_batch_t *b);

/** Sets a callback called on every bad line (NULL to remove). */
void mt_reader_set_bad_line_cb(mt_reader_t *r, mt_reader_bad_line_cb cb, void *opaque);

/**
 * Appends up to @p max_examples examples to @p b (which must have the reader's slots, see
 * mt_reader_batch_init()); bad lines are skipped and counted. Call it again after MT_OK until
 * MT_NOT_FOUND; @p b is appended to, never cleared.
 * @returns MT_OK when at least one example was appended; MT_NOT_FOUND at the end of input
 *          with nothing appended; MT_MISMATCH (batch slots differ), MT_INVALID (max 0),
 *          MT_IO (read error; the examples read before it stay in @p b), MT_NOMEM.
 */
mt_err_t mt_reader_next(mt_reader_t *r, mt_batch_t *b, size_t max_examples);

/** Counters and the first bad lines; valid while @p r lives. */
const mt_reader_stats_t *mt_reader_stats(const mt_reader_t *r);

#endif /* MT_READERS_H */
