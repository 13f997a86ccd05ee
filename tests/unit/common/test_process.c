/*
 * test_process.c - the process metrics of /metrics (mt/process.h): every name present with
 * a plausible value, and a short buffer cut but the needed length returned; a whole page
 * (mt/metrics.h): counters, gauges and free lines exactly as written, the process metrics
 * after them.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mt/metrics.h"
#include "mt/process.h"

static double value_of(const char *text, const char *name) {
    char key[96];
    snprintf(key, sizeof(key), "\n%s ", name);
    const char *p = strstr(text, key);
    return p ? strtod(p + strlen(key), NULL) : -1;
}

Test(process, every_metric_with_a_plausible_value) {
    char buf[2048];
    double start = (double)time(NULL) - 5;
    int n = mt_process_render_metrics(start, buf, sizeof(buf));
    cr_assert(n > 0 && (size_t)n < sizeof(buf), "%d", n);
    cr_assert_eq(strlen(buf), (size_t)n);
    cr_assert(value_of(buf, "process_resident_memory_bytes") > 100000, "%s", buf);
    cr_assert(value_of(buf, "process_virtual_memory_bytes") >=
              value_of(buf, "process_resident_memory_bytes"));
    cr_assert(value_of(buf, "process_cpu_seconds_total") >= 0);
    cr_assert(value_of(buf, "process_open_fds") >= 3, "%s", buf); /* stdin, stdout, stderr */
    cr_assert_float_eq(value_of(buf, "process_start_time_seconds"), start, 1e-3);
    cr_assert(strstr(buf, "# TYPE process_cpu_seconds_total counter\n"));
}

Test(process, a_short_buffer_is_cut_and_the_length_needed_returned) {
    char full[2048], cut[40];
    int n = mt_process_render_metrics(1.0, full, sizeof(full));
    int m = mt_process_render_metrics(1.0, cut, sizeof(cut));
    cr_assert(n > 40);
    cr_assert(m >= n - 16 && m <= n + 16, "%d vs %d", m, n); /* figures move between calls */
    cr_assert_eq(strlen(cut), sizeof(cut) - 1);
    cr_assert_eq(strncmp(cut, full, 20), 0);
    cr_assert_eq(mt_process_render_metrics(1.0, NULL, 0) > 0, 1);
}

Test(metrics, a_page_exactly_then_the_process_metrics) {
    mt_metrics_page_t pg;
    cr_assert_eq(mt_metrics_page_open(&pg, "monolith_x_"), MT_OK);
    mt_metrics_counter(&pg, "things_total", "Things done.", UINT64_C(18446744073709551615));
    mt_metrics_gauge(&pg, "ratio", "A share.", 0.25);
    fprintf(mt_metrics_page_file(&pg), "monolith_x_per_task{task=\"click\"} 3\n");
    mt_metrics_gauge(&pg, "lag", "Behind (-1: unknown).", -1);
    char *body = NULL;
    size_t len = 0;
    double start = (double)time(NULL) - 7;
    cr_assert_eq(mt_metrics_page_close(&pg, start, &body, &len), 200);
    cr_assert_not_null(body);
    cr_assert_eq(strlen(body), len);
    const char *want = "# HELP monolith_x_things_total Things done.\n"
                       "# TYPE monolith_x_things_total counter\n"
                       "monolith_x_things_total 18446744073709551615\n"
                       "# HELP monolith_x_ratio A share.\n"
                       "# TYPE monolith_x_ratio gauge\n"
                       "monolith_x_ratio 0.250000\n"
                       "monolith_x_per_task{task=\"click\"} 3\n"
                       "# HELP monolith_x_lag Behind (-1: unknown).\n"
                       "# TYPE monolith_x_lag gauge\n"
                       "monolith_x_lag -1.000000\n";
    cr_assert_eq(strncmp(body, want, strlen(want)), 0, "%s", body);
    const char *proc = body + strlen(want);
    cr_assert_eq(strncmp(proc, "# HELP process_resident_memory_bytes ", 37), 0, "%s", proc);
    cr_assert_float_eq(value_of(proc, "process_start_time_seconds"), start, 1e-3);
    free(body);
}
