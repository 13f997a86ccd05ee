/* log.c - see mt/log.h. The threshold is the one piece of process-wide state here: it is
 * written once by a daemon's main before any thread starts and only read afterwards. */
#include "mt/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static mt_log_level_t log_threshold = MT_LOG_INFO;

void mt_log_set_level(mt_log_level_t level) {
    log_threshold = level;
}

int mt_log_parse_level(const char *s, mt_log_level_t *out) {
    static const char *names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, names[i])) {
            *out = (mt_log_level_t)i;
            return 0;
        }
    }
    return -1;
}

void mt_log(mt_log_level_t level, const char *who, const char *fmt, ...) {
    if (level < log_threshold) return;
    static const char *tags[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line),
                     "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, tags[level], who);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(line) - 2) len = sizeof(line) - 2;
    line[len++] = '\n';
    ssize_t w = write(2, line, len);
    (void)w;
}
