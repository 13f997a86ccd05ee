/*
 * test_run.c - the runs of monolith-trainer as a library (mt/trainer_run.h): the checks of
 * the configuration's combinations, a batch run over a local table on a small TSV (the
 * report, /metrics), a run ended by its stop callback, and a run whose input does not
 * exist. The online modes need Kafka and the PS: tests/e2e (trainer_online, checkpoint,
 * many_trainers, many_trainers_alo, retention, lost_response) run them through the daemon.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mt/config.h"
#include "mt/log.h"
#include "mt/trainer_run.h"
#include "mt/trainer.h"

#define ROWS 3000

static const char *conf_text = "[trainer]\n"
                               "dim = 4\n"
                               "hidden = 8\n"
                               "batch_size = 64\n"
                               "epochs = 2\n"
                               "progress_interval_ms = 0\n"
                               "[input]\n"
                               "format = tsv\n"
                               "header = true\n"
                               "label = label\n"
                               "timestamp = timestamp_ms\n"
                               "time_unit = ms\n"
                               "columns = user:1, item:2\n";

typedef struct fixture {
    char dir[64], data[128], report[128];
    mt_config_t cfg;
    uint16_t slots[256];
    size_t nslots;
} fixture_t;

/* A TSV of ROWS examples (a click when user + item is a multiple of 3: learnable) and a
 * configuration over it. */
static void fixture_init(fixture_t *f) {
    memset(f, 0, sizeof(*f));
    snprintf(f->dir, sizeof(f->dir), "/tmp/mt_test_run_XXXXXX");
    cr_assert_not_null(mkdtemp(f->dir));
    snprintf(f->data, sizeof(f->data), "%s/train.tsv", f->dir);
    snprintf(f->report, sizeof(f->report), "%s/report.json", f->dir);
    FILE *out = fopen(f->data, "w");
    cr_assert_not_null(out);
    fprintf(out, "label\ttimestamp_ms\tuser\titem\n");
    uint64_t x = 12345;
    for (int i = 0; i < ROWS; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        unsigned user = (unsigned)(x >> 33) % 50, item = (unsigned)(x >> 13) % 40;
        fprintf(out, "%d\t%d\t%u\t%u\n", (user + item) % 3 == 0, 1700000000 + i, user, item);
    }
    cr_assert_eq(fclose(out), 0);
    char err[512];
    cr_assert_eq(mt_config_init(&f->cfg), MT_OK);
    cr_assert_eq(mt_config_load_string(&f->cfg, conf_text, "test", err, sizeof(err)), MT_OK, "%s",
                 err);
    f->nslots = 256;
    cr_assert_eq(mt_config_derive_trainer_slots(&f->cfg, f->slots, &f->nslots, err, sizeof(err)),
                 MT_OK, "%s", err);
    cr_assert_eq(mt_config_validate(&f->cfg, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(f->nslots, 2);
}

static void fixture_fini(fixture_t *f) {
    unlink(f->data);
    unlink(f->report);
    rmdir(f->dir);
    mt_config_free(&f->cfg);
}

static mt_trainer_run_config_t run_config(fixture_t *f) {
    return (mt_trainer_run_config_t){.cfg = &f->cfg,
                                     .slots = f->slots,
                                     .nslots = f->nslots,
                                     .online = 0,
                                     .report_path = f->report,
                                     .stop = NULL,
                                     .stop_ud = NULL};
}

/* The value of metric @p name in a /metrics page, or -1. */
static double metric(const char *page, const char *name) {
    char key[128];
    snprintf(key, sizeof(key), "\n%s ", name);
    const char *p = strstr(page, key);
    return p ? strtod(p + strlen(key), NULL) : -1;
}

static char *render(mt_trainer_run_t *r, const char *path, int *code) {
    char *body = NULL;
    size_t len = 0;
    *code = mt_trainer_run_render(r, path, &body, &len);
    if (*code != 200) return NULL;
    char *page = malloc(len + 1);
    memcpy(page, body, len);
    page[len] = 0;
    free(body);
    return page;
}

Test(run, check_refuses_the_combinations_a_run_cannot_do) {
    mt_config_t c;
    char err[512];
    cr_assert_eq(mt_config_init(&c), MT_OK);
    cr_assert_eq(mt_trainer_run_check(&c, 1, err, sizeof(err)), MT_OK);
    /* pipelined: a batch run with its own table or the PS, online only with the PS */
    cr_assert_eq(mt_config_set(&c, "trainer.pipelined", "true", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_trainer_run_check(&c, 0, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(mt_trainer_run_check(&c, 1, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "trainer.pipelined needs the PS shards"), "%s", err);
    cr_assert_eq(mt_config_set(&c, "cluster.ps", "127.0.0.1:1", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_trainer_run_check(&c, 0, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(mt_trainer_run_check(&c, 1, err, sizeof(err)), MT_OK, "%s", err);
    /* covered steps pipeline too */
    cr_assert_eq(mt_config_set(&c, "trainer.idempotent", "true", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "trainer.dense_sync_batches", "1", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_trainer_run_check(&c, 1, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(mt_config_set(&c, "trainer.dense_sync_batches", "4", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_trainer_run_check(&c, 1, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "trainer.idempotent needs"), "%s", err);
    cr_assert_eq(mt_config_set(&c, "trainer.idempotent", "false", err, sizeof(err)), MT_OK);
    /* checkpoints need every parameter on the PS: only an online run is refused */
    cr_assert_eq(mt_config_set(&c, "trainer.checkpoint_interval_s", "5", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "trainer.dense_sync_batches", "0", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_trainer_run_check(&c, 0, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(mt_trainer_run_check(&c, 1, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "trainer.checkpoint_interval_s needs"), "%s", err);
    mt_config_free(&c);
}

Test(run, create_refuses_a_bad_combination_with_the_configuration_status) {
    fixture_t f;
    fixture_init(&f);
    char err[512];
    cr_assert_eq(mt_config_set(&f.cfg, "trainer.idempotent", "true", err, sizeof(err)), MT_OK);
    mt_trainer_run_config_t rc = run_config(&f);
    mt_trainer_run_t *r = NULL;
    cr_assert_eq(mt_trainer_run_create(&rc, &r), MT_TRAINER_EXIT_CONFIG);
    cr_assert_null(r);
    fixture_fini(&f);
}

Test(run, batch_run_trains_every_epoch_reports_and_counts) {
    fixture_t f;
    fixture_init(&f);
    mt_trainer_run_config_t rc = run_config(&f);
    mt_trainer_run_t *r = NULL;
    cr_assert_eq(mt_trainer_run_create(&rc, &r), MT_TRAINER_EXIT_OK);
    cr_assert_eq(mt_trainer_run_on_ps(r), 0);
    cr_assert_eq(mt_trainer_run_batch(r, f.data, f.data, 2), MT_TRAINER_EXIT_OK);
    int code;
    char *page = render(r, "/metrics", &code);
    cr_assert_eq(code, 200);
    cr_assert_eq(metric(page, "monolith_trainer_examples_total"), 2.0 * ROWS, "%s", page);
    cr_assert_eq(metric(page, "monolith_trainer_batches_total"), 2.0 * ((ROWS + 63) / 64));
    cr_assert_eq(metric(page, "monolith_trainer_bad_lines_total"), 0);
    /* where the steps' time went: each phase some (dense: the dense store's rounds with the
     * PS, or Adam), all within the run's time */
    double phases = 0;
    for (int p = 0; p < MT_TRAINER_NPHASES; p++) {
        char name[128];
        snprintf(name, sizeof(name), "monolith_trainer_step_seconds_total{phase=\"%s\"}",
                 mt_trainer_phase_name((mt_trainer_phase_t)p));
        double v = metric(page, name);
        cr_assert(v > 0, "%s: %g in\n%s", name, v, page);
        phases += v;
    }
    cr_assert_leq(phases, metric(page, "monolith_trainer_uptime_seconds"));
    free(page);
    cr_assert_null(render(r, "/other", &code));
    cr_assert_eq(code, 404);
    FILE *in = fopen(f.report, "r");
    cr_assert_not_null(in, "no report at %s", f.report);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof(buf) - 1, in);
    buf[n] = 0;
    fclose(in);
    cr_assert(strstr(buf, "\"mode\": \"batch\""), "%s", buf);
    cr_assert(strstr(buf, "\"examples\": 3000, \"epochs\": 2"), "%s", buf);
    const char *ph = strstr(buf, "\"step_seconds\": {\"ids\": ");
    cr_assert_not_null(ph, "%s", buf);
    const char *model = strstr(ph, "\"model\": ");
    cr_assert(model && strtod(model + strlen("\"model\": "), NULL) > 0, "%s", buf);
    /* the pattern is learnable: the eval pass after two epochs is far from random */
    const char *a = strstr(buf, "\"eval_auc\": ");
    cr_assert_not_null(a, "%s", buf);
    double auc = strtod(a + strlen("\"eval_auc\": "), NULL);
    cr_assert(auc > 0.58 && auc <= 1.0, "eval AUC %f", auc);
    mt_trainer_run_destroy(r);
    fixture_fini(&f);
}

/* Runs a batch pass (2 epochs, eval on the same file) with trainer.pipelined @p pipelined;
 * returns its eval log loss and AUC and its metrics page (the caller frees). */
static char *batch_run(fixture_t *f, int pipelined, double *logloss, double *auc) {
    char err[512];
    cr_assert_eq(
        mt_config_set(&f->cfg, "trainer.pipelined", pipelined ? "true" : "false", err, sizeof(err)),
        MT_OK);
    mt_trainer_run_config_t rc = run_config(f);
    mt_trainer_run_t *r = NULL;
    cr_assert_eq(mt_trainer_run_create(&rc, &r), MT_TRAINER_EXIT_OK);
    cr_assert_eq(mt_trainer_run_batch(r, f->data, f->data, 2), MT_TRAINER_EXIT_OK);
    int code;
    char *page = render(r, "/metrics", &code);
    cr_assert_eq(code, 200);
    mt_trainer_run_destroy(r);
    FILE *in = fopen(f->report, "r");
    cr_assert_not_null(in);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof(buf) - 1, in);
    buf[n] = 0;
    fclose(in);
    const char *a = strstr(buf, "\"eval_auc\": "), *l = strstr(buf, "\"eval_logloss\": ");
    cr_assert(a && l, "%s", buf);
    *auc = strtod(a + strlen("\"eval_auc\": "), NULL);
    *logloss = strtod(l + strlen("\"eval_logloss\": "), NULL);
    return page;
}

/* trainer.pipelined in a batch run over the trainer's own table: every batch of both epochs
 * trained, each but a pass's first while the previous step's apply was in flight, and its
 * lookup prefetched beside the previous step, on the pipeline thread after the apply of the
 * step before that and before the previous step's own: exactly one step stale, so two
 * pipelined runs agree to the last digit (a lookup racing the apply in flight would not) and
 * differ from the unpipelined run; the model learns the pattern all the same. */
Test(run, a_pipelined_batch_run_trains_every_batch_one_step_stale) {
    fixture_t f;
    fixture_init(&f);
    double l0, a0, l1, a1, l2, a2;
    char *p0 = batch_run(&f, 0, &l0, &a0), *p1 = batch_run(&f, 1, &l1, &a1),
         *p2 = batch_run(&f, 1, &l2, &a2);
    const double batches = 2.0 * ((ROWS + 63) / 64);
    cr_assert_eq(metric(p0, "monolith_trainer_batches_total"), batches);
    cr_assert_eq(metric(p0, "monolith_trainer_pipelined_steps_total"), 0, "%s", p0);
    cr_assert_eq(metric(p1, "monolith_trainer_examples_total"), 2.0 * ROWS, "%s", p1);
    cr_assert_eq(metric(p1, "monolith_trainer_batches_total"), batches);
    cr_assert_eq(metric(p1, "monolith_trainer_pipelined_steps_total"), batches - 2, "%s", p1);
    cr_assert_eq(metric(p1, "monolith_trainer_ps_errors_total"), 0);
    cr_assert(a0 > 0.58 && a1 > 0.58, "eval AUC %f unpipelined, %f pipelined", a0, a1);
    cr_assert_neq(l0, l1, "the same eval log loss (%f): nothing was stale", l0);
    cr_assert_eq(l1, l2, "pipelined runs differ: %.9f, %.9f", l1, l2);
    cr_assert_eq(a1, a2);
    cr_assert_eq(metric(p2, "monolith_trainer_pipelined_steps_total"), batches - 2);
    free(p0);
    free(p1);
    free(p2);
    fixture_fini(&f);
}

static int stop_after(void *ud) {
    int *calls = ud;
    return ++*calls > 3;
}

Test(run, the_stop_callback_ends_a_batch_run_between_steps) {
    fixture_t f;
    fixture_init(&f);
    int calls = 0;
    mt_trainer_run_config_t rc = run_config(&f);
    rc.stop = stop_after;
    rc.stop_ud = &calls;
    mt_trainer_run_t *r = NULL;
    cr_assert_eq(mt_trainer_run_create(&rc, &r), MT_TRAINER_EXIT_OK);
    cr_assert_eq(mt_trainer_run_batch(r, f.data, NULL, 1), MT_TRAINER_EXIT_FAILED);
    int code;
    char *page = render(r, "/metrics", &code);
    double ex = metric(page, "monolith_trainer_examples_total");
    cr_assert(ex > 0 && ex < ROWS, "%f examples after a stop", ex);
    free(page);
    mt_trainer_run_destroy(r);
    fixture_fini(&f);
}

Test(run, a_missing_input_fails_the_run) {
    fixture_t f;
    fixture_init(&f);
    mt_trainer_run_config_t rc = run_config(&f);
    mt_trainer_run_t *r = NULL;
    cr_assert_eq(mt_trainer_run_create(&rc, &r), MT_TRAINER_EXIT_OK);
    char missing[160];
    snprintf(missing, sizeof(missing), "%s/missing.tsv", f.dir);
    cr_assert_eq(mt_trainer_run_batch(r, missing, NULL, 1), MT_TRAINER_EXIT_FAILED);
    mt_trainer_run_destroy(r);
    fixture_fini(&f);
}
