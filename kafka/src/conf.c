/*
 * conf.c - librdkafka configurations from "key=value" lists, and librdkafka's log lines in
 * our log format (syslog levels 0-3 are errors, 4 warnings, 5 info, 6-7 debug: librdkafka's
 * level-6 lines are chatty connection notices).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kafka_int.h"
#include "mt/log.h"

void mt__kafka_errf(char *errbuf, size_t errlen, const char *fmt, ...) {
    if (!errbuf || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, errlen, fmt, ap);
    va_end(ap);
}

int64_t mt__kafka_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    mt_log_level_t lv = level <= 3   ? MT_LOG_ERROR
                        : level == 4 ? MT_LOG_WARN
                        : level == 5 ? MT_LOG_INFO
                                     : MT_LOG_DEBUG;
    mt_log(lv, MT__KAFKA_WHO, "%s: %s: %s", rk ? rd_kafka_name(rk) : "-", fac, buf);
}

mt_err_t mt__kafka_conf_set(rd_kafka_conf_t *conf, const char *key, const char *value, char *errbuf,
                            size_t errlen) {
    char errstr[512];
    rd_kafka_conf_res_t r = rd_kafka_conf_set(conf, key, value, errstr, sizeof(errstr));
    if (r == RD_KAFKA_CONF_OK) return MT_OK;
    mt__kafka_errf(errbuf, errlen, "%s=%s: %s", key, value, errstr);
    return MT_CONFIG;
}

static mt_err_t apply(rd_kafka_conf_t *conf, const char *const *kv, char *errbuf, size_t errlen) {
    for (size_t i = 0; kv && kv[i]; i++) {
        const char *eq = strchr(kv[i], '=');
        if (!eq || eq == kv[i]) {
            mt__kafka_errf(errbuf, errlen, "'%s' is not key=value", kv[i]);
            return MT_INVALID;
        }
        size_t klen = (size_t)(eq - kv[i]);
        char *key = malloc(klen + 1);
        if (!key) return MT_NOMEM;
        memcpy(key, kv[i], klen);
        key[klen] = '\0';
        mt_err_t rc = mt__kafka_conf_set(conf, key, eq + 1, errbuf, errlen);
        free(key);
        if (rc) return rc;
    }
    return MT_OK;
}

mt_err_t mt__kafka_conf_new(const char *const *defaults, const char *const *user,
                            rd_kafka_conf_t **out, char *errbuf, size_t errlen) {
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (!conf) return MT_NOMEM;
    rd_kafka_conf_set_log_cb(conf, log_cb);
    mt_err_t rc = apply(conf, defaults, errbuf, errlen);
    if (!rc) rc = apply(conf, user, errbuf, errlen);
    if (rc) {
        rd_kafka_conf_destroy(conf);
        return rc;
    }
    *out = conf;
    return MT_OK;
}
