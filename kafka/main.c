/*
 * monolith-kafka-dev - the embedded mock Kafka cluster as a daemon, for local runs and tests.
 *
 *   monolith-kafka-dev [--brokers N] [--topics name:partitions[,name:partitions...]]
 *                      [--bootstrap-file PATH] [--log-level debug|info|warn|error]
 *
 * Starts N mock brokers (librdkafka's, see kafka/include/mt/kafka.h) on 127.0.0.1, creates the
 * topics (default features:8,actions:8,examples:8,params:16), prints the bootstrap string
 * "127.0.0.1:p1,..." as one line on stdout and, with --bootstrap-file, writes the same line to
 * PATH atomically (a temporary file renamed over it). The ports are chosen by the OS
 * (librdkafka 2.0.2 cannot be told a port): the bootstrap file is how other processes find
 * the cluster. Everything is in memory; SIGTERM or SIGINT stops the brokers, removes the
 * bootstrap file (it would name closed ports) and exits 0. Bad flags exit 2, failures 1.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mt/jemalloc_conf.h"
#include "mt/kafka.h"
#include "mt/log.h"

#define WHO        "kafka-dev"
#define MAX_TOPICS 64

static const char DEFAULT_TOPICS[] = "features:8,actions:8,examples:8,params:16";

static void usage(FILE *f) {
    fprintf(f,
            "usage: monolith-kafka-dev [--brokers N] [--topics name:partitions[,...]]\n"
            "                          [--bootstrap-file PATH]\n"
            "                          [--log-level debug|info|warn|error]\n"
            "  --brokers N          mock brokers on 127.0.0.1, 1..64 (default 1)\n"
            "  --topics LIST        topics to create (default %s)\n"
            "  --bootstrap-file F   also write the bootstrap line to F (atomically)\n"
            "The bootstrap string is printed on stdout; ports are chosen by the OS.\n",
            DEFAULT_TOPICS);
}

/* Parses "a:8,b:2" into specs whose names point into @p buf (modified). @returns 0 or -1. */
static int parse_topics(char *buf, mt_kafka_topic_spec_t *specs, size_t *n) {
    *n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(tok, ':');
        if (!colon || colon == tok || *n == MAX_TOPICS) return -1;
        *colon = '\0';
        char *end;
        errno = 0;
        long parts = strtol(colon + 1, &end, 10);
        if (errno || end == colon + 1 || *end || parts < 1 || parts > 100000) return -1;
        specs[*n].name = tok;
        specs[*n].partitions = (int32_t)parts;
        (*n)++;
    }
    return *n ? 0 : -1;
}

/* Writes "bootstrap\n" to path through a temporary file in the same directory. */
static int write_atomic(const char *path, const char *bootstrap) {
    size_t len = strlen(path) + 32;
    char *tmp = malloc(len);
    if (!tmp) return -1;
    snprintf(tmp, len, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    int ok = f && fprintf(f, "%s\n", bootstrap) > 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f && fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, path) != 0) ok = 0;
    int saved = errno;
    if (!ok) unlink(tmp);
    free(tmp);
    errno = saved;
    return ok ? 0 : -1;
}

int main(int argc, char **argv) {
    int nbrokers = 1;
    const char *topics_arg = DEFAULT_TOPICS, *bootstrap_file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--brokers") && strcmp(a, "--topics") && strcmp(a, "--bootstrap-file") &&
            strcmp(a, "--log-level")) {
            fprintf(stderr, "monolith-kafka-dev: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (!v) {
            fprintf(stderr, "monolith-kafka-dev: %s needs a value\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--brokers")) {
            char *end;
            errno = 0;
            long n = strtol(v, &end, 10);
            if (errno || end == v || *end || n < 1 || n > 64) {
                fprintf(stderr, "monolith-kafka-dev: --brokers: '%s' is not 1..64\n", v);
                return 2;
            }
            nbrokers = (int)n;
        } else if (!strcmp(a, "--topics")) {
            topics_arg = v;
        } else if (!strcmp(a, "--bootstrap-file")) {
            if (!*v) {
                fprintf(stderr, "monolith-kafka-dev: --bootstrap-file: empty path\n");
                return 2;
            }
            bootstrap_file = v;
        } else {
            mt_log_level_t lv;
            if (mt_log_parse_level(v, &lv) != 0) {
                fprintf(stderr,
                        "monolith-kafka-dev: --log-level: '%s' is not debug, info, warn, error\n",
                        v);
                return 2;
            }
            mt_log_set_level(lv);
        }
    }
    char *topics_buf = strdup(topics_arg);
    if (!topics_buf) return 1;
    mt_kafka_topic_spec_t specs[MAX_TOPICS];
    size_t nspecs = 0;
    if (parse_topics(topics_buf, specs, &nspecs) != 0) {
        fprintf(stderr,
                "monolith-kafka-dev: --topics: '%s' is not name:partitions[,...] "
                "(1..%d topics, 1..100000 partitions)\n",
                topics_arg, MAX_TOPICS);
        free(topics_buf);
        return 2;
    }

    /* Signals are taken by the main thread only: block them before librdkafka's threads. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    char err[512] = "";
    mt_kafka_mock_t *mock = NULL;
    mt_err_t e = mt_kafka_mock_create(nbrokers, specs, nspecs, &mock, err, sizeof(err));
    if (e == MT_INVALID) { /* a topic name or count the flags let through */
        fprintf(stderr, "monolith-kafka-dev: --topics: %s\n", err);
        rc = 2;
        goto out;
    }
    if (e) {
        mt_log(MT_LOG_ERROR, WHO, "cannot start the mock cluster: %s: %s", mt_strerror(e), err);
        goto out;
    }
    const char *bootstrap = mt_kafka_mock_bootstrap(mock);
    if (bootstrap_file && write_atomic(bootstrap_file, bootstrap) != 0) {
        mt_log(MT_LOG_ERROR, WHO, "cannot write %s: %s", bootstrap_file, strerror(errno));
        goto out;
    }
    if (printf("%s\n", bootstrap) < 0 || fflush(stdout) != 0)
        mt_log(MT_LOG_WARN, WHO, "cannot print the bootstrap on stdout");
    mt_log(MT_LOG_INFO, WHO, "%d mock broker%s at %s, topics %s", nbrokers,
           nbrokers == 1 ? "" : "s", bootstrap, topics_arg);

    int sig;
    while (sigwait(&sigs, &sig) != 0 || (sig != SIGTERM && sig != SIGINT)) {
    }
    mt_log(MT_LOG_INFO, WHO, "%s: stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    if (bootstrap_file) unlink(bootstrap_file);
    rc = 0;
out:
    mt_kafka_mock_destroy(mock);
    free(topics_buf);
    return rc;
}
