/*
 * monolith-joiner - joins impressions (kafka.features_topic) with actions
 * (kafka.actions_topic) into labelled examples (kafka.examples_topic). docs/joiner.md.
 *
 *   monolith-joiner --config FILE [--set section.key=value]... [--log-level LEVEL]
 *                   [--duration-s S] [--until-caught-up] [--drain] [--report FILE]
 *   monolith-joiner --config FILE --check
 *
 * A thin main over mt/joiner_run.h (the consumer-group member, the join core's state in
 * joiner.state_dir, the exactly-once commit round, the report): flags, configuration,
 * signals and the metrics server (joiner.metrics_listen). Progress line on stderr every
 * joiner.progress_interval_ms, a final report on stdout (--report FILE: the same as one JSON
 * object). --until-caught-up: exit once every assigned input partition is read to its end
 * (a backfill). --drain: at exit, close every window (end of a replayed stream).
 *
 * Exit status: 0 done (SIGTERM/SIGINT, --duration-s, caught up), 1 runtime failure (Kafka
 * unusable, state unreadable or unwritable), 2 bad command line or configuration.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mt/config.h"
#include "mt/config_cli.h"
#include "mt/http.h"
#include "mt/joiner_run.h"
#include "mt/log.h"

static void usage(FILE *f) {
    fprintf(f, "usage: monolith-joiner --config FILE [--set section.key=value]...\n"
               "                       [--log-level debug|info|warn|error] [--duration-s S]\n"
               "                       [--until-caught-up] [--drain] [--report FILE]\n"
               "       monolith-joiner --config FILE --check\n"
               "       monolith-joiner --config-reference\n");
}

/* A SIGTERM or SIGINT, taken from the pending set (as ps and serving take theirs) so that
 * none is left to deliver at exit. Every thread blocks them (main does before it starts
 * any), so they wait there; a library thread started before main would not block them and
 * would die of them (no handler here): OpenBLAS starts its threads at load, so the joiner
 * must not link it (the ASan build did once, through config: it exited 143 on SIGTERM). */
static int signalled(void *ud) {
    const sigset_t *sigs = ud;
    const struct timespec zero = {0, 0};
    int s = sigtimedwait(sigs, NULL, &zero);
    return s == SIGTERM || s == SIGINT;
}

int main(int argc, char **argv) {
    mt_config_t cfg;
    int rc = MT_JOINER_EXIT_CONFIG, drain = 0, until_caught_up = 0;
    char err[512] = "";
    const char *report_path = NULL, *duration_s_s = NULL;
    double duration_s = 0;
    mt_http_t *http = NULL;
    mt_joiner_run_t *run = NULL;
    if (mt_config_init(&cfg) != MT_OK) return MT_JOINER_EXIT_FAILED;
    const mt_config_cli_opt_t opts[] = {
        {"--drain", &drain, NULL, NULL},
        {"--until-caught-up", &until_caught_up, NULL, NULL},
        {"--report", NULL, &report_path, NULL},
        {"--duration-s", NULL, &duration_s_s, NULL},
    };
    mt_config_cli_t cli = {"monolith-joiner", usage, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0};
    if ((rc = mt_config_cli(&cli, &cfg, argc, argv)) != MT_CONFIG_CLI_OK) goto out;
    rc = MT_JOINER_EXIT_CONFIG;
    if (duration_s_s) {
        char *end = NULL;
        duration_s = strtod(duration_s_s, &end);
        if (*end || !(duration_s > 0)) {
            fprintf(stderr, "monolith-joiner: --duration-s %s: expected > 0\n", duration_s_s);
            goto out;
        }
    }
    mt_joiner_config_t jc;
    if (mt_joiner_run_check(&cfg, &jc, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith-joiner: %s: %s\n", cli.config, err);
        goto out;
    }
    if (cli.check) {
        char tasks[64];
        mt_joiner_run_tasks(&jc, tasks, sizeof(tasks));
        printf("%s: ok (window %u s, lateness %u s, negative rate %g, tasks %s, state %s)\n",
               cli.config, cfg.joiner.window_s, cfg.joiner.allowed_lateness_s,
               cfg.joiner.negative_rate, tasks, cfg.joiner.state_dir);
        rc = MT_JOINER_EXIT_OK;
        goto out;
    }

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    const mt_joiner_run_config_t rcfg = {.cfg = &cfg,
                                         .report_path = report_path,
                                         .duration_s = duration_s,
                                         .drain = drain,
                                         .until_caught_up = until_caught_up,
                                         .stop = signalled,
                                         .stop_ud = &sigs};
    if ((rc = mt_joiner_run_create(&rcfg, &run)) != MT_JOINER_EXIT_OK) goto out;
    rc = MT_JOINER_EXIT_FAILED;
    if (*cfg.joiner.metrics_listen) {
        int port = 0;
        if (mt_http_start(cfg.joiner.metrics_listen, mt_joiner_run_render, run, &port, &http) !=
            MT_OK) {
            mt_log(MT_LOG_ERROR, "joiner", "cannot serve metrics on %s", cfg.joiner.metrics_listen);
            goto out;
        }
        mt_log(MT_LOG_INFO, "joiner", "metrics on port %d", port);
    }
    rc = mt_joiner_run(run);
out:
    mt_http_stop(http); /* before the run goes: the server's thread renders it */
    mt_joiner_run_destroy(run);
    mt_config_free(&cfg);
    return rc;
}
