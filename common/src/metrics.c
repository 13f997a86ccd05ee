/* metrics.c - a /metrics page in Prometheus' text format (mt/metrics.h). */
#include "mt/metrics.h"

#include <inttypes.h>
#include <stdlib.h>

#include "mt/process.h"

mt_err_t mt_metrics_page_open(mt_metrics_page_t *pg, const char *prefix) {
    pg->buf = NULL;
    pg->len = 0;
    pg->prefix = prefix ? prefix : "";
    pg->f = open_memstream(&pg->buf, &pg->len);
    return pg->f ? MT_OK : MT_NOMEM;
}

FILE *mt_metrics_page_file(mt_metrics_page_t *pg) {
    return pg->f;
}

static void head(mt_metrics_page_t *pg, const char *name, const char *help, const char *type) {
    fprintf(pg->f, "# HELP %s%s %s\n# TYPE %s%s %s\n", pg->prefix, name, help, pg->prefix, name,
            type);
}

void mt_metrics_counter(mt_metrics_page_t *pg, const char *name, const char *help, uint64_t v) {
    head(pg, name, help, "counter");
    fprintf(pg->f, "%s%s %" PRIu64 "\n", pg->prefix, name, v);
}

void mt_metrics_gauge(mt_metrics_page_t *pg, const char *name, const char *help, double v) {
    head(pg, name, help, "gauge");
    fprintf(pg->f, "%s%s %.6f\n", pg->prefix, name, v);
}

int mt_metrics_page_close(mt_metrics_page_t *pg, double start_unix_s, char **body, size_t *len) {
    char proc[1024];
    if (mt_process_render_metrics(start_unix_s, proc, sizeof(proc)) > 0) fputs(proc, pg->f);
    int bad = ferror(pg->f);
    if (fclose(pg->f) != 0 || bad) {
        free(pg->buf);
        pg->buf = NULL;
        return 500;
    }
    *body = pg->buf;
    *len = pg->len;
    pg->buf = NULL;
    return 200;
}
