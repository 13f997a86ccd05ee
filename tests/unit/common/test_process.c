/*
 * test_process.c - the process metrics of /metrics (mt/process.h): every name present with
 * a plausible value, and a short buffer cut but the needed length returned.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
