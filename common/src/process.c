/* process.c - process metrics for /metrics (mt/process.h). */
#include "mt/process.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

/* snprintf at @p *used into buf; keeps counting what is needed past the end. */
static void put(char *buf, size_t len, size_t *used, int *bad, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void put(char *buf, size_t len, size_t *used, int *bad, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(*used < len ? buf + *used : NULL, *used < len ? len - *used : 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        *bad = 1;
    else
        *used += (size_t)n;
}

int mt_process_render_metrics(double start_unix_s, char *buf, size_t len) {
    size_t used = 0;
    int bad = 0;
    if (len) buf[0] = 0;
    unsigned long long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    int have_mem = f && fscanf(f, "%llu %llu", &pages, &resident) == 2;
    if (f) fclose(f);
    if (have_mem) {
        unsigned long long page = (unsigned long long)sysconf(_SC_PAGESIZE);
        put(buf, len, &used, &bad,
            "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
            "# TYPE process_resident_memory_bytes gauge\n"
            "process_resident_memory_bytes %llu\n"
            "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
            "# TYPE process_virtual_memory_bytes gauge\n"
            "process_virtual_memory_bytes %llu\n",
            resident * page, pages * page);
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
                     (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
        put(buf, len, &used, &bad,
            "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
            "# TYPE process_cpu_seconds_total counter\n"
            "process_cpu_seconds_total %.6f\n",
            cpu);
    }
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        long fds = -1; /* the directory's own descriptor is one of them */
        while (readdir(d))
            fds++;
        closedir(d);
        fds -= 2; /* "." and ".." */
        put(buf, len, &used, &bad,
            "# HELP process_open_fds Number of open file descriptors.\n"
            "# TYPE process_open_fds gauge\n"
            "process_open_fds %ld\n",
            fds);
    }
    put(buf, len, &used, &bad,
        "# HELP process_start_time_seconds Start time of the process since unix epoch in "
        "seconds.\n"
        "# TYPE process_start_time_seconds gauge\n"
        "process_start_time_seconds %.3f\n",
        start_unix_s);
    return bad ? -1 : (int)used;
}
