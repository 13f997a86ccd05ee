/*
 * metrics.h - a /metrics page in Prometheus' text format as the daemons write it: each
 * counter or gauge with its HELP and TYPE lines, free lines for a labelled family, and the
 * process metrics (mt/process.h) at the end.
 *
 *   mt_metrics_page_t pg;
 *   if (mt_metrics_page_open(&pg, "monolith_joiner_") != MT_OK) return 500;
 *   mt_metrics_counter(&pg, "messages_total", "Messages consumed.", n);
 *   fprintf(mt_metrics_page_file(&pg), "...");      // a family with labels
 *   return mt_metrics_page_close(&pg, start_unix_s, body, len);   // 200 or 500
 *
 * Counters print as integers, gauges with six decimals.
 * Ownership: the page's buffer is its own until mt_metrics_page_close() hands it over.
 * Thread safety: a page is written by one thread; pages are independent.
 */
#ifndef MT_METRICS_H
#define MT_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mt/err.h"

typedef struct mt_metrics_page {
    FILE *f;
    char *buf;
    size_t len;
    const char *prefix; /* borrowed: prepended to every name */
} mt_metrics_page_t;

/** Opens an empty page whose metric names start with @p prefix (borrowed).
 *  @returns MT_OK or MT_NOMEM. */
mt_err_t mt_metrics_page_open(mt_metrics_page_t *pg, const char *prefix);

/** The stream to write free lines to (a family with labels: its HELP, TYPE and samples). */
FILE *mt_metrics_page_file(mt_metrics_page_t *pg);

/** A counter: "# HELP prefix+name help", "# TYPE prefix+name counter", its sample. */
void mt_metrics_counter(mt_metrics_page_t *pg, const char *name, const char *help, uint64_t v);

/** A gauge, as a counter but "gauge" and the value with six decimals. */
void mt_metrics_gauge(mt_metrics_page_t *pg, const char *name, const char *help, double v);

/** Appends the process metrics (@p start_unix_s: when the process started) and closes the
 *  page. @returns 200 with *body (malloc'd, the caller frees) and *len, or 500 (an output
 *  error; nothing to free). */
int mt_metrics_page_close(mt_metrics_page_t *pg, double start_unix_s, char **body, size_t *len);

#endif /* MT_METRICS_H */
