/*
 * monolith-trainer - trains the CTR model from files (batch) or from Kafka (online).
 *
 *   monolith-trainer --config FILE --train FILE [--eval FILE] [--epochs N]
 *                    [--report FILE] [--set section.key=value]... [--log-level LEVEL]
 *   monolith-trainer --config FILE --online [--max-examples N] [--duration-s S]
 *                    [--until-caught-up] [--report FILE] [--set ...]
 *   monolith-trainer --config FILE --check
 *
 * Parameters: with cluster.ps addresses the sparse parameters live on those PS shards
 * (routing and dedup in psclient) and, with trainer.dense_sync_batches > 0, the dense ones
 * on shard 0 (mt_trainer_dense_sync); without addresses the trainer keeps a local table.
 *
 * Batch mode: reads --train ([input] says how) trainer.epochs times (--epochs overrides),
 * scoring each batch before training on it (progressive validation). A progress line every
 * trainer.progress_interval_ms on stderr: epoch, examples, examples/s, window log loss and
 * AUC, bytes read and ETA. After each epoch, --eval is scored (no training). The final
 * report on stdout: examples, examples/s, progressive AUC and log loss, eval AUC and log
 * loss, bad lines; --report FILE also writes it as one JSON object. Bad lines are logged
 * (file:line: reason; the first 100, then a count) and skipped.
 *
 * Online mode: a member of the consumer group kafka.group on kafka.examples_topic (N
 * trainers split the partitions). Messages are decoded as monolith.v1.Example; garbage is
 * counted, logged with topic/partition/offset and skipped. Each batch (trainer.batch_size
 * examples, or fewer when the topic is idle for a moment) is scored, trained and applied;
 * only then are its messages marked, and marked offsets are committed every
 * trainer.commit_interval_ms, at exit and when partitions are revoked: a crash replays at
 * most the uncommitted batches (at-least-once). Runs until SIGTERM/SIGINT, --max-examples,
 * --duration-s, or with --until-caught-up once every assigned partition is consumed up to its
 * high watermark and a poll finds nothing more (a catch-up job over what the topic holds).
 *
 * Exactly-once online mode (trainer.checkpoint_interval_s > 0, docs/checkpoint.md): the
 * trainer coordinates cluster checkpoints (mt/coord.h). At start, and after any failure of a
 * step against the PS (a shard killed, restarting, restored) or a checkpoint, it recovers:
 * every shard goes back to the last complete checkpoint and the consumer to its offsets
 * (caller-owned positions: committed offsets are not read), the dense copy is reset, and the
 * batch in hand is dropped. Every checkpoint_interval_s, between steps, it pushes the pending
 * dense gradients and writes a checkpoint with the positions of everything applied; only
 * then are those positions committed to Kafka. On exit it writes a last one. Progressive AUC over the last trainer.auc_window examples on the
 * progress line and /metrics (trainer.metrics_listen).
 *
 * This file parses the flags, loads and checks the configuration and turns SIGTERM / SIGINT
 * into the run's stop callback; the runs themselves are the trainer library's
 * (mt/trainer_run.h: trainer/src/run.c, online.c, online_marks.c).
 *
 * Exit status: 0 done, 1 runtime failure (input unreadable, PS unreachable after retries,
 * Kafka unusable), 2 bad command line or configuration, 3 fenced: another exactly-once
 * trainer took the cluster's checkpoints over (docs/checkpoint.md; do not restart it).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt/config.h"
#include "mt/config_cli.h"
#include "mt/config_rpc.h"
#include "mt/http.h"
#include "mt/jemalloc_conf.h"
#include "mt/log.h"
#include "mt/trainer_run.h"

#define WHO "trainer"

static void usage(FILE *f) {
    fprintf(f,
            "usage: monolith-trainer --config FILE --train FILE [--eval FILE] [--epochs N]\n"
            "                        [--report FILE] [--set section.key=value]...\n"
            "                        [--log-level debug|info|warn|error]\n"
            "       monolith-trainer --config FILE --online [--max-examples N] [--duration-s S]\n"
            "                        [--until-caught-up] [--report FILE] [--set ...]\n"
            "       monolith-trainer --config FILE --check\n"
            "       monolith-trainer --config-reference\n");
}

/* SIGTERM / SIGINT seen by a thread that does not block them: OpenBLAS starts its worker
 * threads when the library loads, before main() can block the signals, and the default
 * action there would kill the trainer mid-step (no last checkpoint, no report). */
static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig) {
    g_stop_signal = sig;
}

static int stop_requested(void *ud) {
    (void)ud;
    if (g_stop_signal) return 1;
    sigset_t pend;
    sigpending(&pend);
    return sigismember(&pend, SIGTERM) || sigismember(&pend, SIGINT);
}

/* ---------------- main ---------------- */

int main(int argc, char **argv) {
    mt_config_t cfg;
    uint16_t slots[256];
    size_t nslots = 256;
    const char *report_path = NULL;
    mt_trainer_run_t *run = NULL;
    int rc = 2;
    const char *train = NULL, *eval = NULL;
    int online = 0, until_caught_up = 0;
    uint32_t epochs = 0;
    uint64_t max_examples = 0;
    double duration_s = 0;
    char err[512] = "";
    mt_http_t *http = NULL;
    if (mt_config_init(&cfg) != MT_OK) return 1;
    const char *epochs_s = NULL, *max_examples_s = NULL, *duration_s_s = NULL;
    const mt_config_cli_opt_t opts[] = {
        {"--online", &online, NULL, NULL},
        {"--train", NULL, &train, NULL},
        {"--eval", NULL, &eval, NULL},
        {"--report", NULL, &report_path, NULL},
        {"--epochs", NULL, &epochs_s, NULL},
        {"--max-examples", NULL, &max_examples_s, NULL},
        {"--duration-s", NULL, &duration_s_s, NULL},
        {"--until-caught-up", &until_caught_up, NULL, NULL},
    };
    mt_config_cli_t cli = {
        "monolith-trainer", usage, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0};
    if ((rc = mt_config_cli(&cli, &cfg, argc, argv)) != MT_CONFIG_CLI_OK) goto out;
    rc = 2;
    const char *config = cli.config;
    int check_only = cli.check;
    char *end = NULL;
    if (epochs_s) {
        unsigned long x = strtoul(epochs_s, &end, 10);
        if (*end || x < 1 || x > 1000) {
            fprintf(stderr, "monolith-trainer: --epochs %s: expected 1..1000\n", epochs_s);
            goto out;
        }
        epochs = (uint32_t)x;
    }
    if (max_examples_s) {
        unsigned long long x = strtoull(max_examples_s, &end, 10);
        if (*end || x < 1) {
            fprintf(stderr, "monolith-trainer: --max-examples %s: expected >= 1\n", max_examples_s);
            goto out;
        }
        max_examples = x;
    }
    if (duration_s_s) {
        duration_s = strtod(duration_s_s, &end);
        if (*end || !(duration_s > 0)) {
            fprintf(stderr, "monolith-trainer: --duration-s %s: expected > 0\n", duration_s_s);
            goto out;
        }
    }
    if (mt_config_derive_trainer_slots(&cfg, slots, &nslots, err, sizeof(err)) != MT_OK ||
        mt_config_validate(&cfg, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith-trainer: %s: %s\n", config, err);
        goto out;
    }
    if (nslots == 0) {
        fprintf(stderr,
                "monolith-trainer: %s: trainer.slots: no feature slots: list them, or map "
                "columns to slots in input.columns (format tsv / csv; a [slot.N] section of a "
                "slot the columns do not name keeps theirs from being used)\n",
                config);
        goto out;
    }
    /* the TLS files of its PS channels, as they will be read: exit 2, with --check or not */
    if (cfg.cluster.nps && mt_config_rpc_check_tls(&cfg, 0, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith-trainer: %s: %s\n", config, err);
        goto out;
    }
    /* the model these slots make and their hashing, as setup builds them: checked here */
    mt_model_config_t model;
    uint64_t buckets[256];
    uint32_t dims[256];
    if (mt_trainer_run_check(&cfg, online, err, sizeof(err)) != MT_OK ||
        mt_config_model(&cfg, slots, nslots, dims, &model, err, sizeof(err)) != MT_OK ||
        mt_config_slot_hash_buckets(&cfg, slots, nslots, buckets, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith-trainer: %s: %s\n", config, err);
        goto out;
    }
    if (check_only) {
        printf("%s: ok (%zu feature slots, %zu table slots)\n", config, nslots, cfg.nslots);
        rc = 0;
        goto out;
    }
    if (online == (train != NULL)) {
        fprintf(stderr, "monolith-trainer: give either --train FILE or --online\n");
        usage(stderr);
        goto out;
    }
    if (!train && (eval || epochs)) {
        fprintf(stderr, "monolith-trainer: --eval and --epochs are for --train\n");
        goto out;
    }
    if (train && (max_examples || duration_s > 0 || until_caught_up)) {
        fprintf(stderr, "monolith-trainer: --max-examples, --duration-s and --until-caught-up "
                        "are for --online\n");
        goto out;
    }
    if (!epochs) epochs = cfg.trainer.epochs;

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction stop_sa;
    memset(&stop_sa, 0, sizeof(stop_sa));
    stop_sa.sa_handler = on_stop_signal;
    sigemptyset(&stop_sa.sa_mask);
    sigaction(SIGTERM, &stop_sa, NULL);
    sigaction(SIGINT, &stop_sa, NULL);

    mt_trainer_run_config_t rcfg = {.cfg = &cfg,
                                    .slots = slots,
                                    .nslots = nslots,
                                    .online = online,
                                    .report_path = report_path,
                                    .stop = stop_requested,
                                    .stop_ud = NULL};
    rc = mt_trainer_run_create(&rcfg, &run);
    if (rc) goto out;
    if (*cfg.trainer.metrics_listen) {
        int port = 0;
        if (mt_http_start(cfg.trainer.metrics_listen, mt_trainer_run_render, run, &port, &http) !=
            MT_OK) {
            mt_log(MT_LOG_ERROR, WHO, "cannot serve metrics on %s", cfg.trainer.metrics_listen);
            rc = 1;
            goto out;
        }
        mt_log(MT_LOG_INFO, WHO, "metrics on port %d", port);
    }
    mt_log(MT_LOG_INFO, WHO, "model %s: %zu feature slots, dim %u, MLP %s, parameters %s",
           mt_model_type_name(cfg.model.type), nslots, cfg.trainer.dim,
           *cfg.trainer.hidden ? cfg.trainer.hidden : "(none)",
           mt_trainer_run_on_ps(run) ? "on the PS" : "local");
    if (cfg.model.type == MT_MODEL_DCNV2)
        mt_log(MT_LOG_INFO, WHO, "dcnv2: %u cross layers, %s", cfg.model.cross_layers,
               cfg.model.cross_rank ? "low rank" : "full rank");
    rc = online ? mt_trainer_run_online(run, max_examples, duration_s, until_caught_up)
                : mt_trainer_run_batch(run, train, eval, epochs);
out:
    mt_http_stop(http); /* before the run: its handler reads the run's counters */
    mt_trainer_run_destroy(run);
    mt_config_free(&cfg);
    return rc;
}
