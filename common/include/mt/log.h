/*
 * log.h - one line per event on stderr: "2026-11-29T19:00:00.123Z INFO  ps: message".
 *
 * The level threshold is the process's (set once by a daemon's main before threads start;
 * MT_LOG_INFO by default). Thread safety: mt_log() is thread-safe (one write(2) per line).
 */
#ifndef MT_LOG_H
#define MT_LOG_H

typedef enum mt_log_level {
    MT_LOG_DEBUG = 0,
    MT_LOG_INFO,
    MT_LOG_WARN,
    MT_LOG_ERROR
} mt_log_level_t;

/** Sets the lowest level written (call before starting threads). */
void mt_log_set_level(mt_log_level_t level);

/** Parses "debug", "info", "warn", "error". @returns 0, or -1 if unknown. */
int mt_log_parse_level(const char *s, mt_log_level_t *out);

void mt_log(mt_log_level_t level, const char *who, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* MT_LOG_H */
