/*
 * test_config.c - the configuration module (config/): defaults, parsing, errors, overrides,
 * validation, the generated reference, and robustness against arbitrary input.
 *
 * What each group guards:
 *  - defaults: mt_config_init() equals the defaults documented in the reference (each
 *    documented default, set again, changes nothing), mt_table_config_init() and, for a new
 *    slot, mt_table_slot_config_init();
 *  - parsing: the example file of the design brief parses into exactly its values; the
 *    syntax corners (inline comments, indentation, CRLF, BOM, long lines, '#' inside a value);
 *  - errors: every kind of bad input gives MT_CONFIG with "name:line:" and the key in the
 *    message, and leaves the config unchanged;
 *  - overrides and validation (cross-field rules, the table's own checks, a table created
 *    from the result);
 *  - the reference lists every key exactly once and docs/config.md is current;
 *  - fuzz: random bytes and random mutations of a valid file never crash (ASan) and give
 *    MT_OK or MT_CONFIG.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mt/config.h"
#include "mt/config_cli.h"
#include "mt/config_input.h"

/* The example of the design brief, comments and all. */
static const char *const example =
    "[cluster]\n"
    "num_shards = 3\n"
    "ps = 127.0.0.1:7100, 127.0.0.1:7101, 127.0.0.1:7102   # ps addresses, shard i = i-th\n"
    "[ps]\n"
    "listen = 127.0.0.1:7100\n"
    "threads = 4\n"
    "max_message_bytes = 67108864\n"
    "snapshot_dir = /var/lib/monolith/ps\n"
    "snapshot_interval_s = 300\n"
    "snapshot_keep = 3\n"
    "expire_interval_ms = 1000\n"
    "expire_buckets_per_tick = 65536\n"
    "admin_token =            # empty = admin calls allowed without token\n"
    "metrics_listen = 127.0.0.1:0   # Prometheus /metrics; empty disables\n"
    "[table]\n"
    "shards_log2 = 10\n"
    "max_load = 0.9\n"
    "filter_bytes = 8388608\n"
    "filter_depth = 4\n"
    "changelog_entries = 1048576\n"
    "initial_rows = 0\n"
    "[dense]\n"
    "optimizer = adam        # sgd | adagrad | adam\n"
    "lr = 0.001\n"
    "beta1 = 0.9\n"
    "beta2 = 0.999\n"
    "eps = 1e-8\n"
    "[slot.1]                # one section per slot id (0..65535)\n"
    "dim = 16\n"
    "zero_tail = 0\n"
    "init = uniform          # zeros | uniform | normal\n"
    "init_scale = 0.01\n"
    "init_mean = 0\n"
    "init_seed = 7089074370563974248\n"
    "optimizer = adagrad     # sgd | adagrad | ftrl | adam\n"
    "lr = 0.01\n"
    "eps = 1e-8\n"
    "init_accum = 0.1\n"
    "beta1 = 0.9\n"
    "beta2 = 0.999\n"
    "ftrl_beta = 1\n"
    "l1 = 0\n"
    "l2 = 0\n"
    "min_count = 0\n"
    "ttl_s = 0\n"
    "precision = fp32        # fp32 | fp16\n"
    "name = user_id          # optional, for humans and metrics\n";

/* Every key, as the reference names it: "[section] key". */
static const char *const all_keys[] = {
    "[cluster] num_shards",
    "[cluster] ps",
    "[ps] shard",
    "[ps] listen",
    "[ps] threads",
    "[ps] max_message_bytes",
    "[ps] max_batch_fids",
    "[ps] sync_chunk_fids",
    "[ps] sync_follow_max_s",
    "[ps] sync_max_followers",
    "[ps] publish_ms",
    "[ps] snapshot_dir",
    "[ps] snapshot_interval_s",
    "[ps] snapshot_keep",
    "[ps] snapshot_full_every",
    "[ps] expire_interval_ms",
    "[ps] expire_buckets_per_tick",
    "[ps] max_queued_calls",
    "[ps] max_streams",
    "[ps] admin_token",
    "[ps] metrics_listen",
    "[table] shards_log2",
    "[table] max_load",
    "[table] filter_bytes",
    "[table] filter_depth",
    "[table] changelog_entries",
    "[table] initial_rows",
    "[table] reserve_rows",
    "[table] hash_seed",
    "[dense] optimizer",
    "[dense] lr",
    "[dense] beta1",
    "[dense] beta2",
    "[dense] eps",
    "[dense] init_accum",
    "[trainer] mean_slots",
    "[trainer] slots",
    "[trainer] dim",
    "[trainer] hidden",
    "[trainer] batch_size",
    "[trainer] sparse_optimizer",
    "[trainer] sparse_lr",
    "[trainer] init_scale",
    "[trainer] min_count",
    "[trainer] ttl_s",
    "[trainer] dense_lr",
    "[trainer] dense_sync_batches",
    "[trainer] slot_dims",
    "[trainer] slot_hash_buckets",
    "[trainer] cowclip_ratio",
    "[trainer] cowclip_zeta",
    "[trainer] hash_buckets",
    "[trainer] table_initial_rows",
    "[trainer] seed",
    "[trainer] epochs",
    "[trainer] progress_interval_ms",
    "[trainer] auc_window",
    "[trainer] commit_interval_ms",
    "[trainer] checkpoint_interval_s",
    "[trainer] idempotent",
    "[trainer] pipelined",
    "[trainer] recovery_timeout_s",
    "[trainer] metrics_listen",
    "[model] type",
    "[model] cross_layers",
    "[model] cross_rank",
    "[model] tasks",
    "[model] experts",
    "[model] expert_width",
    "[model] task_weights",
    "[model] sequence_slot",
    "[model] sequence_query",
    "[model] sequence_length",
    "[model] attention_width",
    "[input] format",
    "[input] header",
    "[input] columns",
    "[input] label",
    "[input] task_labels",
    "[input] label_threshold",
    "[input] positive_labels",
    "[input] timestamp",
    "[input] time_unit",
    "[input] multi_sep",
    "[input] request_id",
    "[input] item_id",
    "[input] users_file",
    "[input] items_file",
    "[kafka] bootstrap",
    "[kafka] bootstrap_file",
    "[kafka] examples_topic",
    "[kafka] features_topic",
    "[kafka] actions_topic",
    "[kafka] params_topic",
    "[kafka] fetch_wait_ms",
    "[kafka] group",
    "[kafka] session_timeout_ms",
    "[joiner] window_s",
    "[joiner] allowed_lateness_s",
    "[joiner] idle_advance_ms",
    "[joiner] negative_rate",
    "[joiner] seed",
    "[joiner] max_pending_memory",
    "[joiner] max_early_actions",
    "[joiner] state_dir",
    "[joiner] group",
    "[joiner] commit_interval_ms",
    "[joiner] progress_interval_ms",
    "[joiner] sync",
    "[joiner] metrics_listen",
    "[joiner] rocksdb_write_buffer_mb",
    "[joiner] rocksdb_block_cache_mb",
    "[joiner] task_actions",
    "[serving] listen",
    "[serving] threads",
    "[serving] sync_interval_ms",
    "[serving] sync_stream_ms",
    "[serving] dense_sync_interval_ms",
    "[serving] sync_timeout_ms",
    "[serving] log_sample_rate",
    "[serving] max_candidates",
    "[serving] max_request_fids",
    "[serving] max_message_bytes",
    "[serving] max_queued_calls",
    "[serving] metrics_listen",
    "[serving] shards",
    "[serving] peers",
    "[serving] peer_timeout_ms",
    "[serving] peer_refresh_ms",
    "[serving] peer_failure",
    "[serving] sync_source",
    "[tls] enabled",
    "[tls] cert_file",
    "[tls] key_file",
    "[tls] ca_file",
    "[tls] client_auth",
    "[tls] server_name",
    "[slot.N] dim",
    "[slot.N] zero_tail",
    "[slot.N] init",
    "[slot.N] init_scale",
    "[slot.N] init_mean",
    "[slot.N] init_seed",
    "[slot.N] optimizer",
    "[slot.N] lr",
    "[slot.N] eps",
    "[slot.N] init_accum",
    "[slot.N] beta1",
    "[slot.N] beta2",
    "[slot.N] ftrl_beta",
    "[slot.N] l1",
    "[slot.N] l2",
    "[slot.N] min_count",
    "[slot.N] ttl_s",
    "[slot.N] precision",
    "[slot.N] name",
};
#define NKEYS (sizeof(all_keys) / sizeof(all_keys[0]))

/* ============================== helpers ============================== */

static void init(mt_config_t *c) {
    cr_assert_eq(mt_config_init(c), MT_OK);
}

static bool slot_eq(const mt_table_slot_config_t *a, const mt_table_slot_config_t *b) {
    return a->slot == b->slot && a->dim == b->dim && a->init == b->init &&
           a->init_scale == b->init_scale && a->init_mean == b->init_mean &&
           a->init_seed == b->init_seed && a->opt == b->opt && a->lr == b->lr && a->eps == b->eps &&
           a->init_accum == b->init_accum && a->beta1 == b->beta1 && a->beta2 == b->beta2 &&
           a->ftrl_beta == b->ftrl_beta && a->l1 == b->l1 && a->l2 == b->l2 &&
           a->min_count == b->min_count && a->ttl_s == b->ttl_s && a->precision == b->precision &&
           a->zero_tail == b->zero_tail;
}

static bool table_eq(const mt_table_config_t *a, const mt_table_config_t *b) {
    return a->shards_log2 == b->shards_log2 && a->initial_rows == b->initial_rows &&
           a->reserve_rows == b->reserve_rows && a->max_load == b->max_load &&
           a->filter_bytes == b->filter_bytes && a->filter_depth == b->filter_depth &&
           a->changelog_entries == b->changelog_entries && a->hash_seed == b->hash_seed;
}

/* Every value of two configs, field by field. */
static bool config_eq(const mt_config_t *a, const mt_config_t *b) {
    if (a->cluster.num_shards != b->cluster.num_shards || a->cluster.nps != b->cluster.nps)
        return false;
    for (size_t i = 0; i < a->cluster.nps; i++)
        if (strcmp(a->cluster.ps[i], b->cluster.ps[i])) return false;
    const mt_config_ps_t *p = &a->ps, *q = &b->ps;
    if (p->shard != q->shard || strcmp(p->listen, q->listen) || p->threads != q->threads ||
        p->max_message_bytes != q->max_message_bytes || p->max_batch_fids != q->max_batch_fids ||
        p->sync_chunk_fids != q->sync_chunk_fids || p->sync_follow_max_s != q->sync_follow_max_s ||
        p->sync_max_followers != q->sync_max_followers || p->publish_ms != q->publish_ms ||
        strcmp(p->snapshot_dir, q->snapshot_dir) ||
        p->snapshot_interval_s != q->snapshot_interval_s || p->snapshot_keep != q->snapshot_keep ||
        p->snapshot_full_every != q->snapshot_full_every ||
        p->expire_interval_ms != q->expire_interval_ms ||
        p->expire_buckets_per_tick != q->expire_buckets_per_tick ||
        p->max_queued_calls != q->max_queued_calls || p->max_streams != q->max_streams ||
        strcmp(p->admin_token, q->admin_token) || strcmp(p->metrics_listen, q->metrics_listen))
        return false;
    if (!table_eq(&a->table, &b->table)) return false;
    if (a->dense.opt != b->dense.opt || a->dense.lr != b->dense.lr ||
        a->dense.beta1 != b->dense.beta1 || a->dense.beta2 != b->dense.beta2 ||
        a->dense.eps != b->dense.eps || a->dense.init_accum != b->dense.init_accum)
        return false;
    const mt_config_trainer_t *t = &a->trainer, *u = &b->trainer;
    if (strcmp(t->slots, u->slots) || strcmp(t->mean_slots, u->mean_slots) || t->dim != u->dim ||
        strcmp(t->hidden, u->hidden) || t->batch_size != u->batch_size ||
        t->sparse_opt != u->sparse_opt || t->sparse_lr != u->sparse_lr ||
        t->init_scale != u->init_scale || t->min_count != u->min_count || t->ttl_s != u->ttl_s ||
        t->dense_lr != u->dense_lr || t->dense_sync_batches != u->dense_sync_batches ||
        t->hash_buckets != u->hash_buckets || t->table_initial_rows != u->table_initial_rows ||
        t->cowclip_ratio != u->cowclip_ratio || t->cowclip_zeta != u->cowclip_zeta ||
        strcmp(t->slot_hash_buckets, u->slot_hash_buckets) || strcmp(t->slot_dims, u->slot_dims) ||
        t->seed != u->seed || t->epochs != u->epochs ||
        t->progress_interval_ms != u->progress_interval_ms || t->auc_window != u->auc_window ||
        t->commit_interval_ms != u->commit_interval_ms ||
        t->checkpoint_interval_s != u->checkpoint_interval_s ||
        t->recovery_timeout_s != u->recovery_timeout_s ||
        strcmp(t->metrics_listen, u->metrics_listen))
        return false;
    if (a->model.type != b->model.type || a->model.cross_layers != b->model.cross_layers ||
        a->model.cross_rank != b->model.cross_rank || a->model.tasks != b->model.tasks ||
        a->model.experts != b->model.experts || a->model.expert_width != b->model.expert_width ||
        strcmp(a->model.task_weights, b->model.task_weights) ||
        a->model.sequence_slot != b->model.sequence_slot ||
        a->model.sequence_query != b->model.sequence_query ||
        a->model.sequence_length != b->model.sequence_length ||
        a->model.attention_width != b->model.attention_width)
        return false;
    const mt_config_input_t *i1 = &a->input, *i2 = &b->input;
    if (i1->format != i2->format || i1->header != i2->header || strcmp(i1->columns, i2->columns) ||
        strcmp(i1->label, i2->label) || strcmp(i1->task_labels, i2->task_labels) ||
        i1->label_threshold != i2->label_threshold || strcmp(i1->timestamp, i2->timestamp) ||
        i1->time_unit != i2->time_unit || i1->multi_sep != i2->multi_sep ||
        strcmp(i1->users_file, i2->users_file) || strcmp(i1->items_file, i2->items_file) ||
        strcmp(i1->positive_labels, i2->positive_labels) ||
        strcmp(i1->request_id, i2->request_id) || strcmp(i1->item_id, i2->item_id))
        return false;
    const mt_config_kafka_t *k1 = &a->kafka, *k2 = &b->kafka;
    if (strcmp(k1->bootstrap, k2->bootstrap) || strcmp(k1->bootstrap_file, k2->bootstrap_file) ||
        strcmp(k1->examples_topic, k2->examples_topic) ||
        strcmp(k1->features_topic, k2->features_topic) ||
        strcmp(k1->actions_topic, k2->actions_topic) ||
        strcmp(k1->params_topic, k2->params_topic) || k1->fetch_wait_ms != k2->fetch_wait_ms ||
        strcmp(k1->group, k2->group) || k1->session_timeout_ms != k2->session_timeout_ms)
        return false;
    const mt_config_joiner_t *j1 = &a->joiner, *j2 = &b->joiner;
    if (j1->window_s != j2->window_s || j1->allowed_lateness_s != j2->allowed_lateness_s ||
        j1->idle_advance_ms != j2->idle_advance_ms || j1->negative_rate != j2->negative_rate ||
        j1->seed != j2->seed || j1->max_pending_memory != j2->max_pending_memory ||
        j1->max_early_actions != j2->max_early_actions || strcmp(j1->state_dir, j2->state_dir) ||
        strcmp(j1->task_actions, j2->task_actions) || strcmp(j1->group, j2->group) ||
        j1->commit_interval_ms != j2->commit_interval_ms ||
        j1->progress_interval_ms != j2->progress_interval_ms || j1->sync != j2->sync ||
        strcmp(j1->metrics_listen, j2->metrics_listen) ||
        j1->rocksdb_write_buffer_mb != j2->rocksdb_write_buffer_mb ||
        j1->rocksdb_block_cache_mb != j2->rocksdb_block_cache_mb)
        return false;
    const mt_config_serving_t *v1 = &a->serving, *v2 = &b->serving;
    if (strcmp(v1->listen, v2->listen) || v1->threads != v2->threads ||
        v1->sync_interval_ms != v2->sync_interval_ms || v1->sync_stream_ms != v2->sync_stream_ms ||
        v1->dense_sync_interval_ms != v2->dense_sync_interval_ms ||
        v1->sync_timeout_ms != v2->sync_timeout_ms || v1->log_sample_rate != v2->log_sample_rate ||
        v1->max_candidates != v2->max_candidates || v1->max_request_fids != v2->max_request_fids ||
        v1->max_message_bytes != v2->max_message_bytes ||
        v1->max_queued_calls != v2->max_queued_calls ||
        strcmp(v1->metrics_listen, v2->metrics_listen) || strcmp(v1->shards, v2->shards) ||
        v1->npeers != v2->npeers || v1->peer_timeout_ms != v2->peer_timeout_ms ||
        v1->peer_refresh_ms != v2->peer_refresh_ms || v1->peer_zeros != v2->peer_zeros ||
        v1->sync_kafka != v2->sync_kafka)
        return false;
    for (size_t i = 0; i < v1->npeers; i++)
        if (strcmp(v1->peers[i], v2->peers[i])) return false;
    const mt_config_tls_t *s1 = &a->tls, *s2 = &b->tls;
    if (s1->enabled != s2->enabled || strcmp(s1->cert_file, s2->cert_file) ||
        strcmp(s1->key_file, s2->key_file) || strcmp(s1->ca_file, s2->ca_file) ||
        s1->client_auth != s2->client_auth || strcmp(s1->server_name, s2->server_name))
        return false;
    if (a->nslots != b->nslots) return false;
    for (size_t i = 0; i < a->nslots; i++)
        if (!slot_eq(&a->slots[i], &b->slots[i]) || strcmp(a->slot_names[i], b->slot_names[i]))
            return false;
    return true;
}

static char *reference_text(size_t *len) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    cr_assert_not_null(f);
    cr_assert_eq(mt_config_write_reference(f), MT_OK);
    fclose(f);
    if (len) *len = n;
    return buf;
}

/* Loads @p text as "t.conf" into a fresh config; returns the error, message in @p err. */
static mt_err_t load(mt_config_t *c, const char *text, char *err, size_t errlen) {
    init(c);
    return mt_config_load_string(c, text, "t.conf", err, errlen);
}

static char *write_temp(const void *data, size_t len) {
    char *path = strdup("/tmp/test_config_XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, data, len), (ssize_t)len);
    close(fd);
    return path;
}

/* ============================== defaults ============================== */

Test(config, defaults_match_table_and_slot_init) {
    mt_config_t c;
    init(&c);
    mt_table_config_t t;
    mt_table_config_init(&t);
    cr_assert(table_eq(&c.table, &t), "[table] defaults differ from mt_table_config_init()");
    cr_assert_null(c.table.slots);
    cr_assert_eq(c.nslots, 0);
    cr_assert_eq(c.cluster.num_shards, 0);
    cr_assert_eq(c.cluster.nps, 0);
    cr_assert_null(c.cluster.ps);
    cr_assert_eq(c.ps.shard, 0);
    cr_assert_str_eq(c.ps.listen, "127.0.0.1:7100");
    cr_assert_eq(c.ps.threads, 4);
    cr_assert_eq(c.ps.max_message_bytes, 67108864);
    cr_assert_eq(c.ps.max_batch_fids, 1u << 20);
    cr_assert_eq(c.ps.sync_chunk_fids, 4096);
    cr_assert_eq(c.ps.sync_follow_max_s, 300);
    cr_assert_eq(c.ps.sync_max_followers, 2);
    cr_assert_str_eq(c.ps.snapshot_dir, "");
    cr_assert_eq(c.ps.snapshot_interval_s, 300);
    cr_assert_eq(c.ps.snapshot_keep, 3);
    cr_assert_eq(c.ps.expire_interval_ms, 1000);
    cr_assert_eq(c.ps.expire_buckets_per_tick, 65536);
    cr_assert_eq(c.ps.max_queued_calls, 16);
    cr_assert_eq(c.ps.max_streams, 8);
    cr_assert_str_eq(c.ps.admin_token, "");
    cr_assert_str_eq(c.ps.metrics_listen, "");
    cr_assert_eq(c.serving.max_request_fids, 1u << 20);
    cr_assert_eq(c.serving.max_message_bytes, 16u << 20);
    cr_assert_eq(c.serving.max_queued_calls, 16);
    cr_assert_eq(c.tls.enabled, 0);
    cr_assert_str_eq(c.tls.cert_file, "");
    cr_assert_str_eq(c.tls.key_file, "");
    cr_assert_str_eq(c.tls.ca_file, "");
    cr_assert_eq(c.tls.client_auth, 0);
    cr_assert_str_eq(c.tls.server_name, "");
    cr_assert_eq(c.dense.opt, MT_OPT_ADAM);
    cr_assert_eq(c.dense.lr, 0.001f);
    cr_assert_eq(c.dense.beta1, 0.9f);
    cr_assert_eq(c.dense.beta2, 0.999f);
    cr_assert_eq(c.dense.eps, 1e-8f);
    cr_assert_eq(c.dense.init_accum, 0.1f);

    /* A slot created by one key has every other field from mt_table_slot_config_init(). */
    char err[256] = "";
    cr_assert_eq(mt_config_set(&c, "slot.7.dim", "24", err, sizeof(err)), MT_OK, "%s", err);
    mt_table_slot_config_t s;
    mt_table_slot_config_init(&s, 7, 24);
    const char *name = NULL;
    const mt_table_slot_config_t *got = mt_config_slot(&c, 7, &name);
    cr_assert_not_null(got);
    cr_assert(slot_eq(got, &s), "slot defaults differ from mt_table_slot_config_init()");
    cr_assert_str_eq(name, "");
    cr_assert_null(mt_config_slot(&c, 8, NULL));
    mt_config_free(&c);
}

/* Each default the reference documents, set again, leaves a default config unchanged. */
Test(config, reference_defaults_are_the_init_values) {
    char *ref = reference_text(NULL);
    mt_config_t base, c;
    char err[256] = "";
    init(&base);
    cr_assert_eq(mt_config_set(&base, "slot.5.dim", "8", err, sizeof(err)), MT_OK);
    int checked = 0, required = 0;
    for (char *line = strtok(ref, "\n"); line; line = strtok(NULL, "\n")) {
        char sect[32], key[64], def[128];
        /* | `[ps]` | `threads` | uint | `4` | ... ; an empty default reads "(empty)" */
        if (sscanf(line, "| `[%31[^]]]` | `%63[^`]` | %*[^|]| %127[^|]|", sect, key, def) != 3)
            continue;
        char *end = def + strlen(def);
        while (end > def && end[-1] == ' ')
            *--end = '\0';
        if (strcmp(def, "required") == 0) {
            required++;
            continue;
        }
        char value[128] = "";
        if (strcmp(def, "(empty)") != 0) {
            cr_assert(def[0] == '`' && end[-1] == '`', "default cell %s", def);
            end[-1] = '\0';
            snprintf(value, sizeof(value), "%s", def + 1);
        }
        char dkey[128];
        if (strcmp(sect, "slot.N") == 0)
            snprintf(dkey, sizeof(dkey), "slot.5.%s", key);
        else
            snprintf(dkey, sizeof(dkey), "%s.%s", sect, key);
        init(&c);
        cr_assert_eq(mt_config_set(&c, "slot.5.dim", "8", err, sizeof(err)), MT_OK);
        cr_assert_eq(mt_config_set(&c, dkey, value, err, sizeof(err)), MT_OK, "%s: %s", dkey, err);
        cr_assert(config_eq(&c, &base), "%s = '%s' is not the init value", dkey, value);
        mt_config_free(&c);
        checked++;
    }
    cr_assert_eq(checked + required, (int)NKEYS);
    cr_assert_eq(required, 1); /* slot.N.dim */
    mt_config_free(&base);
    free(ref);
}

/* ============================== parsing ============================== */

Test(config, example_file_parses_to_its_values) {
    mt_config_t c;
    char err[256] = "";
    cr_assert_eq(load(&c, example, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(c.cluster.num_shards, 3);
    cr_assert_eq(c.cluster.nps, 3);
    cr_assert_str_eq(c.cluster.ps[0], "127.0.0.1:7100");
    cr_assert_str_eq(c.cluster.ps[1], "127.0.0.1:7101");
    cr_assert_str_eq(c.cluster.ps[2], "127.0.0.1:7102");
    cr_assert_str_eq(c.ps.listen, "127.0.0.1:7100");
    cr_assert_str_eq(c.ps.snapshot_dir, "/var/lib/monolith/ps");
    cr_assert_str_eq(c.ps.admin_token, "");
    cr_assert_str_eq(c.ps.metrics_listen, "127.0.0.1:0");
    cr_assert_eq(c.ps.threads, 4);
    cr_assert_eq(c.table.shards_log2, 10);
    cr_assert_eq(c.table.max_load, 0.9);
    cr_assert_eq(c.dense.opt, MT_OPT_ADAM);
    cr_assert_eq(c.dense.eps, 1e-8f);
    cr_assert_eq(c.nslots, 1);
    mt_table_slot_config_t s;
    mt_table_slot_config_init(&s, 1, 16);
    s.init_seed = 7089074370563974248ull;
    cr_assert(slot_eq(&c.slots[0], &s));
    cr_assert_str_eq(c.slot_names[0], "user_id");
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_OK, "%s", err);
    mt_config_free(&c);
}

/* The [serving] section of monolith-serving (docs/serving.md). */
Test(config, serving_section_is_read) {
    mt_config_t c;
    char err[256] = "";
    const char *text = "[serving]\n"
                       "listen = 0.0.0.0:7201\n"
                       "threads = 8\n"
                       "sync_interval_ms = 1000\n"
                       "dense_sync_interval_ms = 5000\n"
                       "sync_timeout_ms = 30000\n"
                       "log_sample_rate = 0.25\n"
                       "max_candidates = 500\n"
                       "metrics_listen = 127.0.0.1:0\n";
    cr_assert_eq(load(&c, text, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_str_eq(c.serving.listen, "0.0.0.0:7201");
    cr_assert_eq(c.serving.threads, 8);
    cr_assert_eq(c.serving.sync_interval_ms, 1000);
    cr_assert_eq(c.serving.dense_sync_interval_ms, 5000);
    cr_assert_eq(c.serving.sync_timeout_ms, 30000);
    cr_assert_eq(c.serving.log_sample_rate, 0.25);
    cr_assert_eq(c.serving.max_candidates, 500);
    cr_assert_str_eq(c.serving.metrics_listen, "127.0.0.1:0");
    mt_config_free(&c);
    cr_assert_eq(load(&c, "[serving]\nlog_sample_rate = 1.5\n", err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "log_sample_rate"), "%s", err);
    mt_config_free(&c);
    cr_assert_eq(load(&c, "[serving]\nsync_interval_ms = 10\n", err, sizeof(err)), MT_CONFIG);
    mt_config_free(&c);
    init(&c);
    cr_assert_str_eq(c.serving.listen, "127.0.0.1:7200");
    cr_assert_eq(c.serving.sync_interval_ms, 10000);
    cr_assert_eq(c.serving.dense_sync_interval_ms, 60000);
    cr_assert_eq(c.serving.log_sample_rate, 1.0);
    mt_config_free(&c);
}

Test(config, every_value_is_read_into_its_field) {
    mt_config_t c;
    char err[256] = "";
    const char *text = "[ps]\n"
                       "shard = 2\n"
                       "listen = [::1]:0\n"
                       "threads = 64\n"
                       "max_message_bytes = 4096\n"
                       "max_batch_fids = 77\n"
                       "sync_chunk_fids = 99\n"
                       "snapshot_dir = /tmp/snap\n"
                       "snapshot_interval_s = 0\n"
                       "snapshot_keep = 1000\n"
                       "expire_interval_ms = 0\n"
                       "expire_buckets_per_tick = 4294967295\n"
                       "admin_token = s3cr#t;x\n"
                       "metrics_listen = metrics-host.local:9100\n"
                       "[table]\n"
                       "shards_log2 = 0\n"
                       "max_load = 0.97\n"
                       "filter_bytes = 0\n"
                       "filter_depth = 8\n"
                       "changelog_entries = 0x40\n"
                       "initial_rows = 1000\n"
                       "reserve_rows = true\n"
                       "hash_seed = 0xFFFFFFFFFFFFFFFF\n"
                       "[dense]\n"
                       "optimizer = adagrad\n"
                       "lr = 0.5\n"
                       "beta1 = 0\n"
                       "beta2 = 0.5\n"
                       "eps = 0\n"
                       "init_accum = 2.5\n"
                       "[slot.65535]\n"
                       "dim = 1024\n"
                       "init = normal\n"
                       "init_scale = 0.5\n"
                       "init_mean = -1.25\n"
                       "init_seed = 18446744073709551615\n"
                       "optimizer = ftrl\n"
                       "lr = 3\n"
                       "eps = 0.5\n"
                       "init_accum = 0\n"
                       "beta1 = 0.25\n"
                       "beta2 = 0.75\n"
                       "ftrl_beta = 2\n"
                       "l1 = 0.125\n"
                       "l2 = 4\n"
                       "min_count = 255\n"
                       "ttl_s = 4294967295\n"
                       "precision = fp16\n"
                       "name = item id\n"
                       "[slot.0]\n"
                       "dim = 1\n"
                       "init = zeros\n"
                       "optimizer = sgd\n";
    cr_assert_eq(load(&c, text, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(c.ps.shard, 2);
    cr_assert_str_eq(c.ps.listen, "[::1]:0");
    cr_assert_eq(c.ps.threads, 64);
    cr_assert_eq(c.ps.max_message_bytes, 4096);
    cr_assert_eq(c.ps.max_batch_fids, 77);
    cr_assert_eq(c.ps.sync_chunk_fids, 99);
    cr_assert_str_eq(c.ps.snapshot_dir, "/tmp/snap");
    cr_assert_eq(c.ps.snapshot_interval_s, 0);
    cr_assert_eq(c.ps.snapshot_keep, 1000);
    cr_assert_eq(c.ps.expire_interval_ms, 0);
    cr_assert_eq(c.ps.expire_buckets_per_tick, 4294967295ull);
    cr_assert_str_eq(c.ps.admin_token, "s3cr#t;x"); /* no space before: not a comment */
    cr_assert_str_eq(c.ps.metrics_listen, "metrics-host.local:9100");
    cr_assert_eq(c.table.shards_log2, 0);
    cr_assert_eq(c.table.max_load, 0.97);
    cr_assert_eq(c.table.filter_bytes, 0);
    cr_assert_eq(c.table.filter_depth, 8);
    cr_assert_eq(c.table.changelog_entries, 64);
    cr_assert_eq(c.table.initial_rows, 1000);
    cr_assert_eq(c.table.reserve_rows, 1);
    cr_assert_eq(c.table.hash_seed, UINT64_MAX);
    cr_assert_eq(c.dense.opt, MT_OPT_ADAGRAD);
    cr_assert_eq(c.dense.lr, 0.5f);
    cr_assert_eq(c.dense.beta1, 0.0f);
    cr_assert_eq(c.dense.beta2, 0.5f);
    cr_assert_eq(c.dense.eps, 0.0f);
    cr_assert_eq(c.dense.init_accum, 2.5f);
    cr_assert_eq(c.nslots, 2);
    /* sorted by id whatever the file order */
    cr_assert_eq(c.slots[0].slot, 0);
    cr_assert_eq(c.slots[0].dim, 1);
    cr_assert_eq(c.slots[0].init, MT_INIT_ZEROS);
    cr_assert_eq(c.slots[0].opt, MT_OPT_SGD);
    cr_assert_str_eq(c.slot_names[0], "");
    const mt_table_slot_config_t *s = &c.slots[1];
    cr_assert_eq(s->slot, 65535);
    cr_assert_eq(s->dim, 1024);
    cr_assert_eq(s->init, MT_INIT_NORMAL);
    cr_assert_eq(s->init_scale, 0.5f);
    cr_assert_eq(s->init_mean, -1.25f);
    cr_assert_eq(s->init_seed, UINT64_MAX);
    cr_assert_eq(s->opt, MT_OPT_FTRL);
    cr_assert_eq(s->lr, 3.0f);
    cr_assert_eq(s->eps, 0.5f);
    cr_assert_eq(s->init_accum, 0.0f);
    cr_assert_eq(s->beta1, 0.25f);
    cr_assert_eq(s->beta2, 0.75f);
    cr_assert_eq(s->ftrl_beta, 2.0f);
    cr_assert_eq(s->l1, 0.125f);
    cr_assert_eq(s->l2, 4.0f);
    cr_assert_eq(s->min_count, 255);
    cr_assert_eq(s->ttl_s, 4294967295u);
    cr_assert_eq(s->precision, MT_PREC_FP16);
    cr_assert_str_eq(c.slot_names[1], "item id");
    mt_config_free(&c);
}

Test(config, syntax_corners) {
    mt_config_t c;
    char err[256] = "";
    /* BOM, CRLF, indentation, both comment kinds at line start and inline, blank lines,
     * whitespace inside brackets, a value with '=' in it, no newline at the end. */
    const char *text = "\xEF\xBB\xBF; leading comment\r\n"
                       "   # indented comment\r\n"
                       "\r\n"
                       "  [ ps ]   ; section comment\r\n"
                       "    threads=8;not a comment\r\n";
    cr_assert_eq(load(&c, text, err, sizeof(err)), MT_CONFIG); /* "8;not..." is not a number */
    cr_assert(strstr(err, "t.conf:5: ps.threads: '8;not a comment' is not an unsigned integer"),
              "%s", err);
    mt_config_free(&c);

    text = "\xEF\xBB\xBF; leading comment\r\n"
           "   # indented comment\r\n"
           "\r\n"
           "  [ ps ]   ; section comment\r\n"
           "    threads=8\t# tab before the comment\r\n"
           "\tadmin_token = a=b ; c\r\n"
           "  [slot.3]\n"
           "  dim = 4";
    cr_assert_eq(load(&c, text, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(c.ps.threads, 8);
    cr_assert_str_eq(c.ps.admin_token, "a=b");
    cr_assert_eq(c.nslots, 1);
    cr_assert_eq(c.slots[0].dim, 4);
    mt_config_free(&c);

    /* Empty text, only comments: nothing changes. */
    mt_config_t d;
    init(&d);
    cr_assert_eq(load(&c, "", err, sizeof(err)), MT_OK);
    cr_assert(config_eq(&c, &d));
    mt_config_free(&c);
    cr_assert_eq(load(&c, "# x\n;y\n\n   \n", err, sizeof(err)), MT_OK);
    cr_assert(config_eq(&c, &d));
    mt_config_free(&c);
    mt_config_free(&d);
}

/* A line far beyond 200 bytes (where inih would split it) is one line. */
Test(config, long_lines) {
    char *text = malloc(64 * 1024);
    size_t n = (size_t)sprintf(text, "[cluster]\nps = ");
    for (int i = 0; i < 500; i++)
        n += (size_t)sprintf(text + n, "%sps-shard-%03d.monolith.svc.cluster.local:7100",
                             i ? ", " : "", i);
    sprintf(text + n, "\nnum_shards = 500\n");
    mt_config_t c;
    char err[256] = "";
    cr_assert_eq(load(&c, text, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(c.cluster.nps, 500);
    cr_assert_str_eq(c.cluster.ps[499], "ps-shard-499.monolith.svc.cluster.local:7100");
    cr_assert_eq(c.cluster.num_shards, 500);
    mt_config_free(&c);
    free(text);
}

Test(config, file_loading) {
    mt_config_t c;
    char err[256] = "";
    char *path = write_temp(example, strlen(example));
    init(&c);
    cr_assert_eq(mt_config_load_file(&c, path, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(c.nslots, 1);
    cr_assert_str_eq(c.slot_names[0], "user_id");
    mt_config_free(&c);
    unlink(path);
    free(path);

    /* A NUL byte is an error with its line. */
    static const char nul[] = "[ps]\nthreads = 4\nlisten = a\0b:1\n";
    path = write_temp(nul, sizeof(nul) - 1);
    init(&c);
    cr_assert_eq(mt_config_load_file(&c, path, err, sizeof(err)), MT_CONFIG);
    char want[512];
    snprintf(want, sizeof(want), "%s:3: NUL byte", path);
    cr_assert(strstr(err, want), "%s", err);
    mt_config_free(&c);
    unlink(path);
    free(path);

    /* Missing file: MT_IO naming the path. */
    init(&c);
    cr_assert_eq(mt_config_load_file(&c, "/nonexistent/ps.conf", err, sizeof(err)), MT_IO);
    cr_assert(strstr(err, "/nonexistent/ps.conf: cannot open"), "%s", err);
    /* A directory cannot be read. */
    cr_assert_eq(mt_config_load_file(&c, "/tmp", err, sizeof(err)), MT_IO);
    mt_config_free(&c);

    /* Empty file is fine. */
    path = write_temp("", 0);
    init(&c);
    cr_assert_eq(mt_config_load_file(&c, path, err, sizeof(err)), MT_OK, "%s", err);
    mt_config_free(&c);
    unlink(path);
    free(path);
}

/* ============================== errors ============================== */

typedef struct bad_case {
    const char *text;
    const char *want; /* substring of the message, including "t.conf:LINE: " */
} bad_case_t;

static const bad_case_t bad_cases[] = {
    /* the brief's messages, exactly */
    {"[ps]\nlisten = 1.2.3.4:5\nthread = 4\n", "t.conf:3: unknown key 'thread' in [ps]"},
    {"[ps]\n\nthreads = 0\n", "t.conf:3: ps.threads: 0 is out of range 1..64"},
    {"[slot.1]\ndim = 8\noptimizer = adamw\n",
     "t.conf:3: slot.1.optimizer: 'adamw' is not one of sgd, adagrad, ftrl, adam"},
    /* duplicates */
    {"[ps]\nthreads = 2\nthreads = 3\n", "t.conf:3: ps.threads: duplicate key (first on line 2)"},
    {"[slot.4]\ndim = 2\n[ps]\n[slot.4]\n",
     "t.conf:4: duplicate section [slot.4] (first on line 1)"},
    {"[ps]\nthreads = 2\n[table]\n[ps]\nthreads = 3\n",
     "t.conf:4: duplicate section [ps] (first on line 1)"},
    {"[slot.2]\ndim = 2\ndim = 2\n", "t.conf:3: slot.2.dim: duplicate key (first on line 2)"},
    /* structure */
    {"threads = 4\n[ps]\n", "t.conf:1: key 'threads' before any section"},
    {"# c\n\n = 4\n", "t.conf:3: malformed line: no key before '='"},
    {"[ps]\nthreads 4\n", "t.conf:2: malformed line 'threads 4'"},
    {"[ps]\nthreads: 4\n", "t.conf:2: malformed line 'threads: 4'"},
    {"[ps\nthreads = 4\n", "t.conf:1: malformed section header '[ps'"},
    {"[ps] x\n", "t.conf:1: malformed section header '[ps] x'"},
    {"[]\n", "t.conf:1: unknown section []"},
    {"[foo]\nx = 1\n", "t.conf:1: unknown section [foo]"},
    {"[PS]\n", "t.conf:1: unknown section [PS]"},
    {"[cluster]\n[slot.x]\n", "t.conf:2: bad slot id in [slot.x]"},
    {"[slot.65536]\n", "t.conf:1: bad slot id in [slot.65536]"},
    {"[slot.01]\n", "t.conf:1: bad slot id in [slot.01]"},
    {"[slot.]\n", "t.conf:1: bad slot id in [slot.]"},
    {"[slot]\n", "t.conf:1: bad slot id in [slot]"},
    {"[slot.-1]\n", "t.conf:1: bad slot id in [slot.-1]"},
    {"[slot.1 2]\n", "t.conf:1: bad slot id in [slot.1 2]"},
    {"[slot.1]\ndimension = 3\n", "t.conf:2: unknown key 'dimension' in [slot.1]"},
    {"[ps]\ndim = 3\n", "t.conf:2: unknown key 'dim' in [ps]"},
    {"[slot.1]\nthreads = 3\n", "t.conf:2: unknown key 'threads' in [slot.1]"},
    {"[ps]\nThreads = 3\n", "t.conf:2: unknown key 'Threads' in [ps]"},
    /* numbers */
    {"[ps]\nthreads = 12abc\n", "t.conf:2: ps.threads: '12abc' is not an unsigned integer"},
    {"[ps]\nthreads = -1\n", "t.conf:2: ps.threads: '-1' is not an unsigned integer"},
    {"[ps]\nthreads = +1\n", "t.conf:2: ps.threads: '+1' is not an unsigned integer"},
    {"[ps]\nthreads = 1.5\n", "t.conf:2: ps.threads: '1.5' is not an unsigned integer"},
    {"[ps]\nthreads = 1 2\n", "t.conf:2: ps.threads: '1 2' is not an unsigned integer"},
    {"[ps]\nthreads = 0x\n", "t.conf:2: ps.threads: '0x' is not an unsigned integer"},
    {"[ps]\nthreads = 0x41\n", "t.conf:2: ps.threads: 0x41 is out of range 1..64"},
    {"[ps]\nthreads = 65\n", "t.conf:2: ps.threads: 65 is out of range 1..64"},
    {"[table]\nhash_seed = 18446744073709551616\n",
     "t.conf:2: table.hash_seed: 18446744073709551616 is out of range"},
    {"[slot.9]\nttl_s = 4294967296\n", "t.conf:2: slot.9.ttl_s: 4294967296 is out of range"},
    {"[table]\nmax_load = 0.99\n", "t.conf:2: table.max_load: 0.99 is out of range [0.5, 0.97]"},
    {"[table]\nmax_load = 0.9x\n", "t.conf:2: table.max_load: '0.9x' is not a number"},
    {"[table]\nmax_load = nan\n", "t.conf:2: table.max_load: 'nan' is not a number"},
    {"[table]\nmax_load = -nan\n", "t.conf:2: table.max_load: -nan is out of range"},
    {"[slot.1]\nlr = inf\n", "t.conf:2: slot.1.lr: 'inf' is not a number"},
    {"[slot.1]\nlr = 1e39\n", "t.conf:2: slot.1.lr: 1e39 is out of range (0, 1e+30)"},
    {"[slot.1]\nlr = 0\n", "t.conf:2: slot.1.lr: 0 is out of range (0, 1e+30)"},
    {"[slot.1]\nbeta2 = 1\n", "t.conf:2: slot.1.beta2: 1 is out of range [0, 1)"},
    {"[slot.1]\nbeta2 = 0.99999999\n", "t.conf:2: slot.1.beta2: 0.99999999 is out of range"},
    {"[slot.1]\neps = 1e-50\n", "t.conf:2: slot.1.eps: 1e-50 is out of range"},
    {"[dense]\noptimizer = ftrl\n",
     "t.conf:2: dense.optimizer: 'ftrl' is not one of sgd, adagrad, adam"},
    {"[slot.1]\nprecision = FP16\n", "t.conf:2: slot.1.precision: 'FP16' is not one of fp32, fp16"},
    {"[slot.1]\ndim = 1025\n", "t.conf:2: slot.1.dim: 1025 is out of range 1..1024"},
    {"[slot.1]\nmin_count = 256\n", "t.conf:2: slot.1.min_count: 256 is out of range 0..255"},
    /* empty values */
    {"[ps]\nthreads =\n", "t.conf:2: ps.threads: empty value"},
    {"[ps]\nthreads = # comment\n", "t.conf:2: ps.threads: empty value"},
    {"[ps]\nlisten =\n", "t.conf:2: ps.listen: empty value"},
    {"[dense]\noptimizer =\n", "t.conf:2: dense.optimizer: empty value"},
    {"[slot.1]\ndim = ;\n", "t.conf:2: slot.1.dim: empty value"},
    /* strings and addresses */
    {"[slot.1]\nname = "
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
     "t.conf:2: slot.1.name: 77 bytes long, expected 0..64"},
    {"[ps]\nlisten = localhost\n", "t.conf:2: ps.listen: 'localhost' is not host:port"},
    {"[ps]\nlisten = :7100\n", "t.conf:2: ps.listen: ':7100' is not host:port"},
    {"[ps]\nlisten = host:\n", "t.conf:2: ps.listen: 'host:' is not host:port"},
    {"[ps]\nlisten = host:65536\n", "t.conf:2: ps.listen: port 65536 of 'host:65536'"},
    {"[ps]\nlisten = host:7x\n", "t.conf:2: ps.listen: 'host:7x' is not host:port"},
    {"[ps]\nlisten = ::1:7100\n", "t.conf:2: ps.listen: '::1:7100' is not host:port"},
    {"[ps]\nlisten = [::1]7100\n", "t.conf:2: ps.listen: '[::1]7100' is not host:port"},
    {"[ps]\nlisten = h st:1\n", "t.conf:2: ps.listen: 'h st:1' is not host:port"},
    {"[cluster]\nps = a:1,,b:2\n", "t.conf:2: cluster.ps: empty address in the list (entry 2)"},
    {"[cluster]\nps = a:1, b:2,\n", "t.conf:2: cluster.ps: empty address in the list (entry 3)"},
    {"[cluster]\nps = a:1, b:2, a:1\n",
     "t.conf:2: cluster.ps: 'a:1' appears twice (entries 1 and 3)"},
    {"[cluster]\nps = a:0\n", "t.conf:2: cluster.ps: port 0 of 'a:0' is out of range 1..65535"},
    {"[cluster]\nps = a:1 b:2\n", "t.conf:2: cluster.ps: 'a:1 b:2' is not host:port"},
    {"[cluster]\nnum_shards = 4097\n", "t.conf:2: cluster.num_shards: 4097 is out of range"},
    /* control characters never reach a message raw */
    {"[ps]\nthre\x01"
     "ds = 1\n",
     "t.conf:2: unknown key 'thre?ds' in [ps]"},
    {"[ps]\nadmin_token = a\x01"
     "b\n",
     "t.conf:2: ps.admin_token: value contains a control"},
    /* the error is the first one */
    {"[ps]\nthreads = 0\nfoo = 1\n", "t.conf:2: ps.threads: 0 is out of range"},
};

Test(config, each_error_names_line_and_key) {
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        mt_config_t c;
        char err[512] = "";
        mt_err_t rc = load(&c, bad_cases[i].text, err, sizeof(err));
        cr_expect_eq(rc, MT_CONFIG, "case %zu (%s): %d", i, bad_cases[i].want, rc);
        cr_expect(strstr(err, bad_cases[i].want) == err, "case %zu: want '%s', got '%s'", i,
                  bad_cases[i].want, err);
        mt_config_free(&c);
    }
}

Test(config, a_failed_load_changes_nothing) {
    mt_config_t c, before;
    char err[256] = "";
    cr_assert_eq(load(&c, example, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(load(&before, example, err, sizeof(err)), MT_OK, "%s", err);
    const char *bad = "[ps]\nthreads = 9\nlisten = 0.0.0.0:1\n[cluster]\nps = x:1\n"
                      "[slot.1]\nname = changed\n[slot.2]\ndim = 3\n[slot.3]\ndim = 0\n";
    cr_assert_eq(mt_config_load_string(&c, bad, "b.conf", err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "b.conf:11: slot.3.dim: 0 is out of range 1..1024"), "%s", err);
    cr_assert(config_eq(&c, &before), "a failed load modified the config");
    /* A good second file applies over the first: keys it sets, slots it adds. */
    cr_assert_eq(mt_config_load_string(&c, "[ps]\nthreads = 9\n[slot.2]\ndim = 3\n", "g.conf", err,
                                       sizeof(err)),
                 MT_OK, "%s", err);
    cr_assert_eq(c.ps.threads, 9);
    cr_assert_eq(c.nslots, 2);
    cr_assert_str_eq(c.ps.listen, "127.0.0.1:7100");
    cr_assert_str_eq(c.slot_names[0], "user_id");
    mt_config_free(&c);
    mt_config_free(&before);
}

Test(config, small_or_missing_error_buffers) {
    mt_config_t c;
    char tiny[6];
    memset(tiny, 'x', sizeof(tiny));
    cr_assert_eq(load(&c, "[ps]\nthreads = 0\n", tiny, sizeof(tiny)), MT_CONFIG);
    cr_assert_str_eq(tiny, "t.con");
    mt_config_free(&c);
    cr_assert_eq(load(&c, "[ps]\nthreads = 0\n", NULL, 0), MT_CONFIG);
    cr_assert_eq(mt_config_set(&c, "ps.threads", "0", NULL, 0), MT_CONFIG);
    cr_assert_eq(mt_config_validate(&c, NULL, 0), MT_CONFIG);
    mt_config_free(&c);
    /* NULL and double free are no-ops */
    mt_config_free(NULL);
    mt_config_free(&c);
}

/* ============================== overrides ============================== */

Test(config, overrides) {
    mt_config_t c;
    char err[256] = "";
    cr_assert_eq(load(&c, example, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(mt_config_set(&c, "ps.threads", "8", err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(c.ps.threads, 8);
    cr_assert_eq(mt_config_set(&c, "ps.threads", "  16\t", err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(c.ps.threads, 16);
    cr_assert_eq(mt_config_set(&c, "slot.1.lr", "0.5", err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(c.slots[0].lr, 0.5f);
    cr_assert_eq(mt_config_set(&c, "slot.3.dim", "32", err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(c.nslots, 2);
    cr_assert_eq(c.slots[1].slot, 3);
    cr_assert_eq(c.slots[1].dim, 32);
    cr_assert_eq(mt_config_set(&c, "cluster.ps", "h:1,h:2", err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(c.cluster.nps, 2);
    cr_assert_eq(mt_config_set(&c, "cluster.ps", "", err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(c.cluster.nps, 0);
    cr_assert_null(c.cluster.ps);
    cr_assert_eq(mt_config_set(&c, "slot.1.name", "", err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_str_eq(c.slot_names[0], "");
    cr_assert_eq(mt_config_set_arg(&c, "ps.admin_token=t=1", err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_str_eq(c.ps.admin_token, "t=1");
    cr_assert_eq(mt_config_set_arg(&c, " ps.shard = 2 ", err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(c.ps.shard, 2);

    /* errors: message names the key; nothing changes, no slot is left behind */
    static const struct {
        const char *key, *value, *want;
    } bad[] = {
        {"ps.threads", "0", "ps.threads: 0 is out of range 1..64"},
        {"ps.thread", "4", "unknown key 'ps.thread'"},
        {"threads", "4", "unknown key 'threads'"},
        {"foo.bar", "4", "unknown key 'foo.bar'"},
        {"ps.", "4", "unknown key 'ps.'"},
        {"slot.x.dim", "4", "slot.x.dim: bad slot id"},
        {"slot.65536.dim", "4", "slot.65536.dim: bad slot id"},
        {"slot.dim", "4", "slot.dim: bad slot id"},
        {"slot.9.dim", "0", "slot.9.dim: 0 is out of range 1..1024"},
        {"slot.9.optimizer", "adamw", "slot.9.optimizer: 'adamw' is not one of"},
        {"slot.9.dim", "", "slot.9.dim: empty value"},
        {"ps.listen", "a\nb:1", "ps.listen: value contains a control character"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        size_t nslots = c.nslots;
        uint32_t threads = c.ps.threads;
        cr_expect_eq(mt_config_set(&c, bad[i].key, bad[i].value, err, sizeof(err)), MT_CONFIG, "%s",
                     bad[i].key);
        cr_expect(strstr(err, bad[i].want) == err, "want '%s', got '%s'", bad[i].want, err);
        cr_expect_eq(c.nslots, nslots, "%s left a slot", bad[i].key);
        cr_expect_eq(c.ps.threads, threads);
    }
    cr_assert_null(mt_config_slot(&c, 9, NULL));
    cr_assert_eq(mt_config_set_arg(&c, "ps.threads", err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "expected key=value"), "%s", err);
    cr_assert_eq(mt_config_set_arg(&c, "=4", err, sizeof(err)), MT_CONFIG);
    cr_assert_eq(mt_config_set_arg(&c, "ps.threads=65", err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "ps.threads: 65 is out of range 1..64") == err, "%s", err);
    mt_config_free(&c);
}

/* ============================== validation ============================== */

Test(config, validate_cross_field_rules) {
    mt_config_t c;
    char err[256] = "";
    cr_assert_eq(load(&c, example, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_OK, "%s", err);

    /* The table config built from it creates a table. */
    mt_table_config_t tc;
    mt_config_table(&c, &tc);
    cr_assert_eq(tc.nslots, 1);
    cr_assert_eq(tc.slots, c.slots);
    cr_assert_eq(tc.shards_log2, 10);
    cr_assert_eq(mt_config_set(&c, "table.shards_log2", "2", err, sizeof(err)), MT_OK);
    mt_config_table(&c, &tc);
    mt_table_t *t = NULL;
    cr_assert_eq(mt_table_create(&tc, &t), MT_OK);
    uint32_t dim = 0;
    cr_assert_eq(mt_table_dim(t, MT_FID_MAKE(1, 5), &dim), MT_OK);
    cr_assert_eq(dim, 16);
    mt_table_destroy(t);

    static const struct {
        const char *key, *value, *want;
    } bad[] = {
        {"cluster.num_shards", "2",
         "cluster.num_shards: 2 does not match the 3 addresses of cluster.ps"},
        {"ps.shard", "3", "ps.shard: 3 is not below the number of shards (3)"},
        {"slot.4.lr", "0.5", "slot.4.dim: required"},
        {"table.changelog_entries", "64", "table: changelog_entries: 64 is below 64 per part"},
        {"slot.1.min_count", "2", NULL}, /* with filter_bytes 0 below */
        {"dense.eps", "0", "dense.eps: Adam needs eps > 0"},
        {"slot.1.optimizer", "adam", NULL}, /* with eps 0 below */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (!bad[i].want) continue;
        mt_config_t d;
        cr_assert_eq(load(&d, example, err, sizeof(err)), MT_OK);
        cr_assert_eq(mt_config_set(&d, bad[i].key, bad[i].value, err, sizeof(err)), MT_OK, "%s",
                     err);
        cr_expect_eq(mt_config_validate(&d, err, sizeof(err)), MT_CONFIG, "%s", bad[i].key);
        cr_expect(strstr(err, bad[i].want) == err, "want '%s', got '%s'", bad[i].want, err);
        mt_config_free(&d);
    }
    /* Rules of mt_table_config_validate() that span fields come back prefixed "table: ". */
    cr_assert_eq(mt_config_set(&c, "slot.1.min_count", "2", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "table.filter_bytes", "0", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "table: slot 1: min_count > 1 needs filter_bytes > 0") == err, "%s", err);
    cr_assert_eq(mt_config_set(&c, "table.filter_bytes", "65536", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "slot.1.optimizer", "adam", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "slot.1.eps", "0", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "table: slot 1: eps: Adam needs eps > 0") == err, "%s", err);
    mt_config_free(&c);

    /* No slots; shard without any shard count; neither count given. */
    init(&c);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "no slots: ") == err, "%s", err);
    cr_assert_eq(mt_config_set(&c, "slot.0.dim", "4", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(mt_config_set(&c, "ps.shard", "1", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    cr_assert_str_eq(err, "ps.shard: 1 is not below the number of shards (1)");
    cr_assert_eq(mt_config_set(&c, "cluster.ps", "a:1, b:2", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_OK, "%s", err);
    mt_config_free(&c);
}

/* Fields set directly in the struct are checked against the same bounds. */
Test(config, validate_checks_fields_set_directly) {
    mt_config_t c;
    char err[256] = "";
    cr_assert_eq(load(&c, example, err, sizeof(err)), MT_OK, "%s", err);
    c.ps.threads = 0;
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    cr_assert_str_eq(err, "ps.threads: 0 is out of range 1..64");
    c.ps.threads = 4;
    c.table.max_load = 0.3;
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    cr_assert_str_eq(err, "table.max_load: 0.3 is out of range [0.5, 0.97]");
    c.table.max_load = 0.9;
    c.dense.opt = MT_OPT_FTRL;
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "dense.optimizer: 2 is not the value of one of sgd, adagrad, adam"), "%s",
              err);
    c.dense.opt = MT_OPT_ADAM;
    c.slots[0].lr = NAN;
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "slot.1.lr: ") == err, "%s", err);
    c.slots[0].lr = 0.01f;
    free(c.ps.listen);
    c.ps.listen = strdup("nohostport");
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    cr_assert_str_eq(err, "ps.listen: 'nohostport' is not host:port");
    free(c.ps.listen);
    c.ps.listen = strdup("h:1");
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_OK, "%s", err);
    mt_config_free(&c);
}

/* [tls]: parsed, and enabled only with its three files; the admission keys' rules. */
Test(config, tls_section_and_admission_rules) {
    mt_config_t c;
    char err[256] = "";
    const char *text = "[tls]\n"
                       "enabled = true\n"
                       "cert_file = /etc/monolith/tls/node.pem\n"
                       "key_file = /etc/monolith/tls/node.key\n"
                       "ca_file = /etc/monolith/tls/ca.pem\n"
                       "client_auth = true\n"
                       "server_name = ps.monolith.internal\n"
                       "[slot.1]\n"
                       "dim = 4\n";
    cr_assert_eq(load(&c, text, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(c.tls.enabled, 1);
    cr_assert_str_eq(c.tls.cert_file, "/etc/monolith/tls/node.pem");
    cr_assert_str_eq(c.tls.key_file, "/etc/monolith/tls/node.key");
    cr_assert_str_eq(c.tls.ca_file, "/etc/monolith/tls/ca.pem");
    cr_assert_eq(c.tls.client_auth, 1);
    cr_assert_str_eq(c.tls.server_name, "ps.monolith.internal");
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_OK, "%s", err);
    /* Each file is required when enabled: the message names the key. */
    static const char *const files[] = {"tls.cert_file", "tls.key_file", "tls.ca_file"};
    for (size_t i = 0; i < 3; i++) {
        mt_config_t d;
        cr_assert_eq(load(&d, text, err, sizeof(err)), MT_OK);
        cr_assert_eq(mt_config_set(&d, files[i], "", err, sizeof(err)), MT_OK, "%s", err);
        cr_assert_eq(mt_config_validate(&d, err, sizeof(err)), MT_CONFIG, "%s", files[i]);
        char want[96];
        snprintf(want, sizeof(want), "%s: required when tls.enabled is true", files[i]);
        cr_expect_str_eq(err, want);
        mt_config_free(&d);
    }
    /* client_auth without TLS would silently serve plaintext: refused. */
    cr_assert_eq(mt_config_set(&c, "tls.enabled", "false", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    cr_assert_str_eq(err, "tls.client_auth: true needs tls.enabled = true");
    cr_assert_eq(mt_config_set(&c, "tls.client_auth", "false", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(mt_config_set(&c, "tls.enabled", "yes", err, sizeof(err)), MT_CONFIG);
    /* Admission bounds: streams must leave room beyond the follow Sync streams. */
    cr_assert_eq(mt_config_set(&c, "ps.max_streams", "2", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "ps.max_streams: 2 must be above ps.sync_max_followers (2)") == err, "%s",
              err);
    cr_assert_eq(mt_config_set(&c, "ps.max_streams", "0", err, sizeof(err)), MT_CONFIG);
    cr_assert_eq(mt_config_set(&c, "ps.max_streams", "3", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "ps.max_queued_calls", "0", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "serving.max_queued_calls", "4097", err, sizeof(err)),
                 MT_CONFIG);
    cr_assert_eq(mt_config_set(&c, "serving.max_message_bytes", "1000", err, sizeof(err)),
                 MT_CONFIG);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_OK, "%s", err);
    /* A reserve without a row count would silently reserve nothing: refused. */
    cr_assert_eq(mt_config_set(&c, "table.reserve_rows", "true", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    cr_assert_str_eq(err, "table.reserve_rows: true needs table.initial_rows > 0 (the rows to "
                          "reserve)");
    cr_assert_eq(mt_config_set(&c, "table.initial_rows", "1000", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_OK, "%s", err);
    mt_config_free(&c);
}

/* ============================== the reference ============================== */

Test(config, reference_lists_every_key_once) {
    char *ref = reference_text(NULL);
    int rows = 0;
    int seen[NKEYS] = {0};
    for (char *line = strtok(ref, "\n"); line; line = strtok(NULL, "\n")) {
        char sect[32], key[64], name[128];
        if (sscanf(line, "| `[%31[^]]]` | `%63[^`]` |", sect, key) != 2) continue;
        rows++;
        snprintf(name, sizeof(name), "[%s] %s", sect, key);
        size_t i = 0;
        while (i < NKEYS && strcmp(all_keys[i], name))
            i++;
        cr_assert(i < NKEYS, "reference lists unexpected key %s", name);
        seen[i]++;
        /* six cells: type, default, bounds and doc are not empty */
        int bars = 0;
        for (const char *q = line; *q; q++)
            bars += *q == '|' && (q == line || q[-1] != '\\');
        cr_assert_eq(bars, 7, "row of %s: %s", name, line);
    }
    for (size_t i = 0; i < NKEYS; i++)
        cr_expect_eq(seen[i], 1, "%s listed %d times", all_keys[i], seen[i]);
    cr_assert_eq(rows, (int)NKEYS);
    free(ref);
}

Test(config, docs_config_md_is_current) {
    size_t len;
    char *ref = reference_text(&len);
    FILE *f = fopen(MT_SOURCE_DIR "/docs/config.md", "rb");
    cr_assert_not_null(f, "docs/config.md is missing: build/config/mt_config_reference "
                          "docs/config.md");
    char *doc = malloc(len + 2);
    size_t got = fread(doc, 1, len + 1, f);
    fclose(f);
    cr_assert(got == len && memcmp(doc, ref, len) == 0,
              "docs/config.md is stale: regenerate it with "
              "build/config/mt_config_reference docs/config.md");
    free(doc);
    free(ref);
}

/* ============================== fuzz ============================== */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

#ifdef MT_SANITIZED
#define FUZZ_ROUNDS 20000
#else
#define FUZZ_ROUNDS 100000
#endif

/* Parse, and if that works validate and build the table config: nothing may crash. */
static void try_text(const char *text) {
    mt_config_t c;
    char err[256];
    init(&c);
    mt_err_t rc = mt_config_load_string(&c, text, "f.conf", err, sizeof(err));
    cr_assert(rc == MT_OK || rc == MT_CONFIG, "rc %d for: %s", rc, text);
    if (rc == MT_CONFIG) cr_assert(strncmp(err, "f.conf:", 7) == 0, "%s", err);
    rc = mt_config_validate(&c, err, sizeof(err));
    cr_assert(rc == MT_OK || rc == MT_CONFIG, "validate rc %d", rc);
    mt_table_config_t tc;
    mt_config_table(&c, &tc);
    mt_config_free(&c);
}

Test(config, fuzz_random_bytes, .timeout = 300) {
    static const char alphabet[] = "[]=#;.: \t\n\r,-+0123456789xeslotpsdimabc\x01\xff";
    char buf[256];
    for (int round = 0; round < FUZZ_ROUNDS; round++) {
        size_t n = rnd() % (sizeof(buf) - 1);
        for (size_t i = 0; i < n; i++) {
            char ch = (rnd() & 1) ? alphabet[rnd() % (sizeof(alphabet) - 1)] : (char)rnd();
            buf[i] = ch ? ch : ' ';
        }
        buf[n] = '\0';
        try_text(buf);
    }
}

Test(config, fuzz_mutations_of_a_valid_file, .timeout = 300) {
    size_t base_len = strlen(example);
    char *buf = malloc(base_len + 64);
    static const char *const inserts[] = {
        "[", "]",     "=",     "#",  ";",   "\n", ",",          " ",      "0",         "-",
        "x", "slot.", "65535", "0x", "e99", ".5", "[slot.7]\n", "[ps]\n", "dim = 3\n", "\r"};
    int ok = 0;
    for (int round = 0; round < FUZZ_ROUNDS; round++) {
        memcpy(buf, example, base_len + 1);
        size_t len = base_len;
        int edits = 1 + (int)(rnd() % 4);
        for (int e = 0; e < edits; e++) {
            size_t at = len ? rnd() % len : 0;
            switch (rnd() % 4) {
            case 0: /* flip a byte (never to NUL) */ buf[at] = (char)(rnd() % 255 + 1); break;
            case 1: /* delete a run */
            {
                size_t k = 1 + rnd() % 8;
                if (at + k > len) k = len - at;
                memmove(buf + at, buf + at + k, len - at - k + 1);
                len -= k;
                break;
            }
            default: /* insert a token */
            {
                const char *ins = inserts[rnd() % (sizeof(inserts) / sizeof(inserts[0]))];
                size_t k = strlen(ins);
                if (len + k >= base_len + 63) break;
                memmove(buf + at + k, buf + at, len - at + 1);
                memcpy(buf + at, ins, k);
                len += k;
                break;
            }
            }
        }
        mt_config_t c;
        char err[256];
        init(&c);
        mt_err_t rc = mt_config_load_string(&c, buf, "f.conf", err, sizeof(err));
        cr_assert(rc == MT_OK || rc == MT_CONFIG, "rc %d", rc);
        ok += rc == MT_OK;
        mt_config_free(&c);
        try_text(buf);
    }
    free(buf);
    cr_log_info("mutations: %d of %d parsed", ok, FUZZ_ROUNDS);
    cr_assert(ok > 0 && ok < FUZZ_ROUNDS, "mutations: %d of %d parsed", ok, FUZZ_ROUNDS);
}

/* Random keys and values through mt_config_set(): MT_OK or MT_CONFIG, and validate holds. */
Test(config, fuzz_overrides, .timeout = 300) {
    static const char *const keys[] = {
        "ps.threads",     "slot.1.dim",      "slot.65535.lr", "cluster.ps", "ps.listen",
        "table.max_load", "dense.optimizer", "slot.2.name",   "slot.x.dim", "ps."};
    static const char *const values[] = {"",    "0",       "1",       "64",   "65", "0.5",  "1e-8",
                                         "a:1", "a:1,b:2", "[::1]:0", "adam", "-1", "0x10", "nan"};
    mt_config_t c;
    char err[256];
    init(&c);
    for (int round = 0; round < FUZZ_ROUNDS; round++) {
        const char *k = keys[rnd() % (sizeof(keys) / sizeof(keys[0]))];
        const char *v = values[rnd() % (sizeof(values) / sizeof(values[0]))];
        mt_err_t rc = mt_config_set(&c, k, v, err, sizeof(err));
        cr_assert(rc == MT_OK || rc == MT_CONFIG);
        rc = mt_config_validate(&c, err, sizeof(err));
        cr_assert(rc == MT_OK || rc == MT_CONFIG);
        /* whatever was accepted stays within bounds */
        cr_assert(!strstr(err, "out of range") || strstr(err, "table: "), "%s after %s=%s", err, k,
                  v);
    }
    mt_config_free(&c);
}

/* ============================== trainer slots ============================== */

Test(config, trainer_slots_are_derived_as_the_trainer_makes_them) {
    mt_config_t c;
    char err[256] = "";
    init(&c);
    cr_assert_eq(mt_config_load_string(&c,
                                       "[trainer]\nslots = 3, 1\ndim = 8\nsparse_lr = 0.2\n"
                                       "min_count = 2\nseed = 7\n[slot.1]\ndim = 8\nlr = 0.5\n",
                                       NULL, err, sizeof(err)),
                 MT_OK, "%s", err);
    uint16_t slots[4];
    size_t n = 4;
    cr_assert_eq(mt_config_derive_trainer_slots(&c, slots, &n, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(n, 2);
    cr_assert(slots[0] == 3 && slots[1] == 1);
    cr_assert_eq(c.nslots, 2); /* 1 and 3: each row holds its first-order weight */
    const mt_table_slot_config_t *s1 = mt_config_slot(&c, 1, NULL),
                                 *s3 = mt_config_slot(&c, 3, NULL);
    cr_assert(s1 && s3);
    cr_assert_float_eq(s1->lr, 0.5f, 1e-9, "a configured slot keeps its values");
    cr_assert_eq(s1->dim, 9, "a configured slot of trainer.dim gets the model's row");
    cr_assert_eq(s1->zero_tail, 1);
    cr_assert_eq(s3->dim, 9);
    cr_assert_eq(s3->zero_tail, 1);
    cr_assert_eq(s3->init, MT_INIT_UNIFORM);
    cr_assert_float_eq(s3->lr, 0.2f, 1e-9);
    cr_assert_eq(s3->min_count, 2);
    cr_assert_eq(s3->init_seed, 7);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_OK, "%s", err);
    n = 4; /* twice: nothing changes */
    cr_assert_eq(mt_config_derive_trainer_slots(&c, slots, &n, err, sizeof(err)), MT_OK);
    cr_assert_eq(c.nslots, 2);
    cr_assert_eq(mt_config_slot(&c, 1, NULL)->dim, 9);
    /* the whole row written out is the model's too */
    cr_assert_eq(mt_config_set(&c, "slot.1.dim", "9", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "slot.1.zero_tail", "1", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_derive_trainer_slots(&c, NULL, NULL, err, sizeof(err)), MT_OK, "%s",
                 err);
    cr_assert_eq(mt_config_slot(&c, 1, NULL)->dim, 9);
    /* an older layout's first-order slot is refused, by name */
    cr_assert_eq(mt_config_set(&c, "slot.32771.dim", "1", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_derive_trainer_slots(&c, NULL, NULL, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "slot.32771: a model slot's first-order weight is kept in its row"), "%s",
              err);
    mt_config_free(&c);
    init(&c);
    cr_assert_eq(
        mt_config_load_string(&c, "[trainer]\nslots = 3, 1\ndim = 8\n", NULL, err, sizeof(err)),
        MT_OK, "%s", err);
    cr_assert_eq(mt_config_derive_trainer_slots(&c, NULL, NULL, err, sizeof(err)), MT_OK);
    /* a configured slot of another dim is refused, by name */
    cr_assert_eq(mt_config_set(&c, "slot.3.dim", "4", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_derive_trainer_slots(&c, NULL, NULL, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "slot.3.dim"), "%s", err);
    /* bad lists */
    cr_assert_eq(mt_config_set(&c, "trainer.slots", "1,x", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_derive_trainer_slots(&c, NULL, NULL, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "trainer.slots"), "%s", err);
    cr_assert_eq(mt_config_set(&c, "trainer.slots", "40000", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_derive_trainer_slots(&c, NULL, NULL, err, sizeof(err)), MT_CONFIG);
    cr_assert_eq(mt_config_set(&c, "trainer.slots", "2,2", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_derive_trainer_slots(&c, NULL, NULL, err, sizeof(err)), MT_CONFIG);
    mt_config_free(&c);
    /* criteo's slots when none are listed; a PS-only config derives nothing */
    init(&c);
    cr_assert_eq(mt_config_set(&c, "input.format", "criteo", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_derive_trainer_slots(&c, NULL, NULL, err, sizeof(err)), MT_OK);
    cr_assert_eq(c.nslots, 39);
    mt_config_free(&c);
    init(&c);
    cr_assert_eq(mt_config_derive_trainer_slots(&c, NULL, NULL, err, sizeof(err)), MT_OK);
    cr_assert_eq(c.nslots, 0);
    mt_config_free(&c);
}

/* A user who maps columns to slots in [input] need not list them again: with trainer.slots
 * empty and no [slot.N] of another slot, the model's slots are the columns', in the reader's
 * order (first entry first), with the default slot settings; twice changes nothing. */
Test(config, trainer_slots_derived_from_input_columns) {
    mt_config_t c;
    char err[256] = "";
    init(&c);
    cr_assert_eq(
        mt_config_load_string(&c,
                              "[trainer]\ndim = 8\nsparse_lr = 0.2\n[input]\nformat = tsv\n"
                              "columns = b:5, a:2, c:5:string, d:7:int:multi\n",
                              NULL, err, sizeof(err)),
        MT_OK, "%s", err);
    uint16_t slots[8];
    size_t n = 8;
    cr_assert_eq(mt_config_derive_trainer_slots(&c, slots, &n, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(n, 3);
    cr_assert(slots[0] == 5 && slots[1] == 2 && slots[2] == 7, "%u %u %u", slots[0], slots[1],
              slots[2]);
    cr_assert_eq(c.nslots, 3); /* 2, 5, 7: rows of embedding and first-order weight */
    const mt_table_slot_config_t *s5 = mt_config_slot(&c, 5, NULL);
    cr_assert(s5);
    cr_assert_eq(s5->dim, 9);
    cr_assert_eq(s5->zero_tail, 1);
    cr_assert_eq(s5->init, MT_INIT_UNIFORM);
    cr_assert_float_eq(s5->lr, 0.2f, 1e-9);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_OK, "%s", err);
    n = 8; /* twice: the same slots out, nothing added */
    cr_assert_eq(mt_config_derive_trainer_slots(&c, slots, &n, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(n, 3);
    cr_assert(slots[0] == 5 && slots[1] == 2 && slots[2] == 7);
    cr_assert_eq(c.nslots, 3);
    mt_config_free(&c);
    /* csv too; a [slot.N] of one of the columns' slots overrides its settings */
    init(&c);
    cr_assert_eq(mt_config_load_string(&c,
                                       "[input]\nformat = csv\ncolumns = user:1, item:2\n"
                                       "[trainer]\ndim = 16\n[slot.2]\ndim = 16\nlr = 0.5\n",
                                       NULL, err, sizeof(err)),
                 MT_OK, "%s", err);
    n = 8;
    cr_assert_eq(mt_config_derive_trainer_slots(&c, slots, &n, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(n, 2);
    cr_assert_eq(c.nslots, 2);
    cr_assert_float_eq(mt_config_slot(&c, 2, NULL)->lr, 0.5f, 1e-9);
    mt_config_free(&c);
    /* bad columns are an error of input.columns (not a silent "no slots") */
    init(&c);
    cr_assert_eq(mt_config_set(&c, "input.columns", "user:1, item:40000", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_derive_trainer_slots(&c, NULL, NULL, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "input.columns: 'item:40000': bad slot '40000'"), "%s", err);
    mt_config_free(&c);
}

Test(config, explicit_trainer_slots_and_slot_sections_win_over_columns) {
    mt_config_t c;
    char err[256] = "";
    uint16_t slots[8];
    size_t n = 8;
    /* trainer.slots listed: exactly those, whatever the columns say */
    init(&c);
    cr_assert_eq(mt_config_load_string(&c,
                                       "[trainer]\nslots = 2\n[input]\ncolumns = a:1, b:2, c:3\n",
                                       NULL, err, sizeof(err)),
                 MT_OK, "%s", err);
    cr_assert_eq(mt_config_derive_trainer_slots(&c, slots, &n, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(n, 1);
    cr_assert_eq(slots[0], 2);
    cr_assert_eq(c.nslots, 1);
    cr_assert_null(mt_config_slot(&c, 1, NULL));
    mt_config_free(&c);
    /* a [slot.N] the columns do not name: a PS-only table, no trainer slots derived */
    init(&c);
    cr_assert_eq(mt_config_load_string(&c, "[input]\ncolumns = a:1, b:2\n[slot.9]\ndim = 4\n", NULL,
                                       err, sizeof(err)),
                 MT_OK, "%s", err);
    n = 8;
    cr_assert_eq(mt_config_derive_trainer_slots(&c, slots, &n, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(n, 0);
    cr_assert_eq(c.nslots, 1);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_OK, "%s", err);
    mt_config_free(&c);
    /* criteo and movielens keep their own slots (columns are the generic reader's) */
    init(&c);
    cr_assert_eq(mt_config_load_string(&c, "[input]\nformat = criteo\ncolumns = a:1\n", NULL, err,
                                       sizeof(err)),
                 MT_OK, "%s", err);
    n = 8;
    cr_assert_eq(mt_config_derive_trainer_slots(&c, NULL, NULL, err, sizeof(err)), MT_OK, "%s",
                 err);
    cr_assert_eq(c.nslots, 39);
    mt_config_free(&c);
}

/* No slots anywhere: the error names every key that would give some. */
Test(config, no_slots_error_names_the_keys_that_give_them) {
    mt_config_t c;
    char err[256] = "";
    init(&c);
    cr_assert_eq(
        mt_config_load_string(&c, "[input]\nformat = tsv\nlabel = click\n", NULL, err, sizeof(err)),
        MT_OK, "%s", err);
    size_t n = 8;
    uint16_t slots[8];
    cr_assert_eq(mt_config_derive_trainer_slots(&c, slots, &n, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(n, 0);
    cr_assert_eq(mt_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    cr_assert_str_eq(err, "no slots: list the model's feature slots in trainer.slots, map "
                          "columns to slots in input.columns (format tsv / csv), or configure "
                          "[slot.N] sections");
    cr_assert_null(strstr(err, "no [slot.N] section"));
    mt_config_free(&c);
}

/* [input] as the generic reader's configuration: the syntax, the label kinds, the errors. */
Test(config, input_section_as_the_csv_reader_config) {
    mt_config_t c;
    mt_config_csv_t cc;
    char err[256] = "";
    init(&c);
    cr_assert_eq(mt_config_load_string(&c,
                                       "[input]\nformat = tsv\n"
                                       "columns =  user : 1 , 3:2:string, tags:4:string:multi,,\n"
                                       "label = event\npositive_labels = click , buy\n"
                                       "timestamp = 0\ntime_unit = s\nmulti_sep = semicolon\n"
                                       "request_id = rid\nitem_id = 3\n",
                                       NULL, err, sizeof(err)),
                 MT_OK, "%s", err);
    cr_assert_eq(mt_config_input_csv(&c, &cc, err, sizeof(err)), MT_OK, "%s", err);
    const mt_csv_config_t *r = &cc.csv;
    cr_assert_eq(r->delimiter, '\t');
    cr_assert(r->header);
    cr_assert_eq(r->multi_sep, ';');
    cr_assert_eq(r->nslots_cfg, 3);
    cr_assert_str_eq(r->slots[0].column.name, "user");
    cr_assert_eq(r->slots[0].slot_id, 1);
    cr_assert_eq(r->slots[0].kind, MT_CSV_INT);
    cr_assert_null(r->slots[1].column.name);
    cr_assert_eq(r->slots[1].column.index, 3);
    cr_assert_eq(r->slots[1].kind, MT_CSV_STRING);
    cr_assert(r->slots[2].multi && !r->slots[1].multi);
    cr_assert_eq(r->label_kind, MT_CSV_LABEL_STRINGS);
    cr_assert_str_eq(r->label.name, "event");
    cr_assert_eq(r->npositive_labels, 2);
    cr_assert_str_eq(r->positive_labels[0], "click");
    cr_assert_str_eq(r->positive_labels[1], "buy");
    cr_assert_eq(r->time_unit, MT_CSV_TIME_S);
    cr_assert_eq(r->timestamp.index, 0);
    cr_assert_str_eq(cc.request_id.name, "rid");
    cr_assert_eq(cc.item_id.index, 3);
    mt_config_csv_free(&cc);
    mt_config_csv_free(&cc); /* freed: a no-op */
    mt_config_free(&c);
    /* the default label is numeric; no timestamp, no ids */
    init(&c);
    cr_assert_eq(mt_config_set(&c, "input.columns", "a:1", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "input.format", "csv", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_input_csv(&c, &cc, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(cc.csv.delimiter, ',');
    cr_assert_eq(cc.csv.label_kind, MT_CSV_LABEL_THRESHOLD);
    cr_assert_float_eq(cc.csv.label_threshold, 0.5, 1e-12);
    cr_assert_eq(cc.csv.time_unit, MT_CSV_TIME_NONE);
    cr_assert(cc.request_id.index < 0 && !cc.request_id.name);
    mt_config_csv_free(&cc);
    mt_config_free(&c);
    static const struct {
        const char *key, *value, *msg;
    } bad[] = {
        {"input.columns", "", "input.columns: no columns"},
        {"input.columns", "a", "input.columns: 'a': expected column:slot"},
        {"input.columns", ":1", "input.columns: ':1': no column before ':'"},
        {"input.columns", "a:x", "input.columns: 'a:x': bad slot 'x' (0..32767)"},
        {"input.columns", "a:32768", "input.columns: 'a:32768': bad slot '32768'"},
        {"input.columns", "a:1:float", "input.columns: 'a:1:float': unknown option 'float'"},
        {"input.columns", "9999999:1", "input.columns: '9999999:1': column index 9999999"},
        {"input.positive_labels", " , ", "input.positive_labels: ',': no value"},
        {"input.format", "criteo", "input.format: the generic reader reads format tsv or csv"},
        {"input.header", "false", "input.columns: 'a:1': column 'a' by name needs input.header"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        init(&c);
        cr_assert_eq(mt_config_set(&c, "input.columns", "a:1", err, sizeof(err)), MT_OK);
        cr_assert_eq(mt_config_set(&c, "input.label", "1", err, sizeof(err)), MT_OK);
        cr_assert_eq(mt_config_set(&c, bad[i].key, bad[i].value, err, sizeof(err)), MT_OK, "%s",
                     err);
        cr_assert_eq(mt_config_input_csv(&c, &cc, err, sizeof(err)), MT_CONFIG, "%s=%s", bad[i].key,
                     bad[i].value);
        cr_assert(strstr(err, bad[i].msg), "%s=%s: '%s'", bad[i].key, bad[i].value, err);
        mt_config_csv_free(&cc);
        mt_config_free(&c);
    }
}

/* ============================== the daemons' command line ============================== */

static int cli_usage_calls;
static void cli_usage(FILE *f) {
    (void)f;
    cli_usage_calls++;
}

/* Runs mt_config_cli() on @p args (NULL-terminated, argv[0] added) with a flag --online, a
 * value --train and a shorthand --listen (ps.listen). */
static int run_cli(mt_config_t *c, mt_config_cli_t *cli, int *online, const char **train,
                   const char *const *args) {
    char *argv[32] = {"prog"};
    int argc = 1;
    while (*args && argc < 31)
        argv[argc++] = (char *)*args++;
    static mt_config_cli_opt_t opts[3];
    opts[0] = (mt_config_cli_opt_t){"--online", online, NULL, NULL};
    opts[1] = (mt_config_cli_opt_t){"--train", NULL, train, NULL};
    opts[2] = (mt_config_cli_opt_t){"--listen", NULL, NULL, "ps.listen"};
    *cli = (mt_config_cli_t){"prog", cli_usage, opts, 3, NULL, 0};
    init(c);
    return mt_config_cli(cli, c, argc, argv);
}

Test(config, daemon_command_line_loads_the_file_then_overrides_in_order) {
    const char text[] = "[ps]\nlisten = 127.0.0.1:1\nthreads = 3\n[slot.1]\ndim = 4\n";
    char *path = write_temp(text, sizeof(text) - 1);
    mt_config_t c;
    mt_config_cli_t cli;
    int online = 0;
    const char *train = NULL;
    /* file, then --set and the shorthand in command-line order: the last one wins */
    const char *a1[] = {"--listen",
                        "127.0.0.1:2",
                        "--config",
                        path,
                        "--online",
                        "--set",
                        "ps.listen=127.0.0.1:3",
                        "--train",
                        "f.tsv",
                        "--set",
                        "ps.threads=5",
                        "--check",
                        NULL};
    cr_assert_eq(run_cli(&c, &cli, &online, &train, a1), MT_CONFIG_CLI_OK);
    cr_assert_str_eq(cli.config, path);
    cr_assert_eq(cli.check, 1);
    cr_assert_eq(online, 1);
    cr_assert_str_eq(train, "f.tsv");
    cr_assert_str_eq(c.ps.listen, "127.0.0.1:3");
    cr_assert_eq(c.ps.threads, 5);
    mt_config_free(&c);
    const char *a2[] = {"--config", path, "--set", "ps.threads=7", "--listen", "127.0.0.1:4", NULL};
    online = 0;
    cr_assert_eq(run_cli(&c, &cli, &online, &train, a2), MT_CONFIG_CLI_OK);
    cr_assert_str_eq(c.ps.listen, "127.0.0.1:4");
    cr_assert_eq(c.ps.threads, 7);
    cr_assert_eq(cli.check, 0);
    cr_assert_eq(online, 0);
    mt_config_free(&c);
    /* a value that looks like an option is still the value */
    const char *a3[] = {"--config", path, "--train", "--online", NULL};
    train = NULL;
    cr_assert_eq(run_cli(&c, &cli, &online, &train, a3), MT_CONFIG_CLI_OK);
    cr_assert_str_eq(train, "--online");
    cr_assert_eq(online, 0);
    mt_config_free(&c);
    unlink(path);
    free(path);
}

Test(config, daemon_command_line_errors_exit_2_and_help_exits_0) {
    const char text[] = "[slot.1]\ndim = 4\n";
    char *path = write_temp(text, sizeof(text) - 1);
    mt_config_t c;
    mt_config_cli_t cli;
    int online = 0;
    const char *train = NULL;
    const char *bad[][6] = {
        {"--config", path, "--bogus", "1", NULL}, /* unknown option: usage */
        {"--online", NULL},                       /* no --config: usage */
        {"--config", path, "--train", NULL},      /* a value missing: usage */
        {"--config", path, "--log-level", "loud", NULL},
        {"--config", path, "--set", "ps.nope=1", NULL},
        {"--config", path, "--listen", "not-an-address", NULL},
        {"--config", "/nonexistent/monolith.conf", NULL},
    };
    const int usage_expected[] = {1, 1, 1, 0, 0, 0, 0};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cli_usage_calls = 0;
        cr_assert_eq(run_cli(&c, &cli, &online, &train, bad[i]), MT_CONFIG_CLI_ERROR, "case %zu",
                     i);
        cr_assert_eq(cli_usage_calls, usage_expected[i], "case %zu", i);
        mt_config_free(&c);
    }
    const char *help[] = {"--config", path, "-h", NULL};
    cli_usage_calls = 0;
    cr_assert_eq(run_cli(&c, &cli, &online, &train, help), MT_CONFIG_CLI_EXIT);
    cr_assert_eq(cli_usage_calls, 1);
    mt_config_free(&c);
    unlink(path);
    free(path);
}

Test(config, kafka_bootstrap_from_the_key_or_the_file) {
    mt_config_t c;
    char out[64], err[256];
    init(&c);
    cr_assert_eq(mt_config_set(&c, "kafka.bootstrap", "127.0.0.1:9092", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_kafka_bootstrap(&c, out, sizeof(out), err, sizeof(err)), MT_OK);
    cr_assert_str_eq(out, "127.0.0.1:9092");
    cr_assert_eq(mt_config_kafka_bootstrap(&c, out, 4, err, sizeof(err)), MT_TOO_SMALL);
    cr_assert(strstr(err, "kafka.bootstrap"), "%s", err);
    /* empty key: the file's first line, without its newline */
    const char line[] = "127.0.0.1:40001,127.0.0.1:40002\nignored\n";
    char *path = write_temp(line, sizeof(line) - 1);
    cr_assert_eq(mt_config_set(&c, "kafka.bootstrap", "", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "kafka.bootstrap_file", path, err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_kafka_bootstrap(&c, out, sizeof(out), err, sizeof(err)), MT_OK);
    cr_assert_str_eq(out, "127.0.0.1:40001,127.0.0.1:40002");
    /* a first line longer than the buffer is an error, never cut silently */
    char small[16];
    cr_assert_eq(mt_config_kafka_bootstrap(&c, small, sizeof(small), err, sizeof(err)),
                 MT_TOO_SMALL);
    cr_assert(strstr(err, "longer than 15 bytes"), "%s", err);
    unlink(path);
    free(path);
    /* a missing or empty file: MT_IO, naming it */
    path = write_temp("\n", 1);
    cr_assert_eq(mt_config_set(&c, "kafka.bootstrap_file", path, err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_kafka_bootstrap(&c, out, sizeof(out), err, sizeof(err)), MT_IO);
    cr_assert(strstr(err, path), "%s", err);
    unlink(path);
    cr_assert_eq(mt_config_kafka_bootstrap(&c, out, sizeof(out), err, sizeof(err)), MT_IO);
    cr_assert(strstr(err, "No such file"), "%s", err);
    free(path);
    mt_config_free(&c);
}

/* [model] and [trainer] make the model trainer and serving build (mt_config_model()): the
 * family's names are the model's, and what the family refuses is refused by name. */
Test(config, model_section_makes_the_model) {
    mt_config_t c;
    char err[256];
    mt_model_config_t mc;
    uint16_t slots[256], many[256];
    uint32_t dims[256];
    for (int i = 0; i < 256; i++)
        slots[i] = many[i] = (uint16_t)(i + 1);
    init(&c);
    cr_assert_eq(mt_config_model(&c, slots, 26, dims, &mc, err, sizeof(err)), MT_OK, "%s", err);
    cr_expect_eq(mc.type, MT_MODEL_DEEPFM);
    cr_expect(mc.nslots == 26 && mc.dim == 8 && mc.nhidden == 2 && mc.hidden[0] == 256 &&
              mc.hidden[1] == 128 && mc.init_seed == 1);
    cr_assert_eq(mt_config_set(&c, "model.type", "dcnv2", err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(mt_config_set(&c, "trainer.hidden", "64", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "model.cross_layers", "2", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_model(&c, slots, 26, dims, &mc, err, sizeof(err)), MT_OK, "%s", err);
    cr_expect(mc.type == MT_MODEL_DCNV2 && mc.ncross == 2 && mc.cross_rank == 0 &&
              mc.nhidden == 1 && mc.hidden[0] == 64 && mc.slot_dims == NULL);
    /* per-slot dims: slot 3 of dim 4, the others trainer.dim */
    cr_assert_eq(mt_config_set(&c, "trainer.slot_dims", "3:4", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_model(&c, slots, 26, dims, &mc, err, sizeof(err)), MT_OK, "%s", err);
    cr_expect(mc.slot_dims == dims && dims[2] == 4 && dims[0] == 8 && dims[25] == 8);
    /* and the table slots derived for them are rows of each slot's dim + 1 */
    cr_assert_eq(mt_config_set(&c, "trainer.slots", "1, 2, 3", err, sizeof(err)), MT_OK);
    uint16_t got[8];
    size_t ngot = 8;
    cr_assert_eq(mt_config_derive_trainer_slots(&c, got, &ngot, err, sizeof(err)), MT_OK, "%s",
                 err);
    cr_assert_eq(ngot, 3);
    cr_expect_eq(mt_config_slot(&c, 3, NULL)->dim, 5);
    cr_expect_eq(mt_config_slot(&c, 1, NULL)->dim, 9);
    cr_assert_eq(mt_config_set(&c, "trainer.slot_dims", "3:4, 99:2", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_model(&c, slots, 26, dims, &mc, err, sizeof(err)), MT_CONFIG);
    cr_expect(strstr(err, "trainer.slot_dims: 99 is not one of the model's slots"), "%s", err);
    cr_assert_eq(mt_config_set(&c, "model.type", "deepfm", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "trainer.slot_dims", "3:4", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_model(&c, slots, 26, dims, &mc, err, sizeof(err)), MT_CONFIG);
    cr_expect(strstr(err, "deepfm") != NULL, "%s", err);
    cr_assert_eq(mt_config_set(&c, "trainer.slot_dims", "", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "model.type", "dcnv2", err, sizeof(err)), MT_OK);
    /* full rank over 256 x 8 = 2048 inputs: fine; 256 x 32 = 8192: refused, naming the rank */
    cr_assert_eq(mt_config_model(&c, many, 256, dims, &mc, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(mt_config_set(&c, "trainer.dim", "32", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_model(&c, many, 256, dims, &mc, err, sizeof(err)), MT_CONFIG);
    cr_expect(strstr(err, "cross_rank") != NULL, "%s", err);
    cr_assert_eq(mt_config_set(&c, "model.cross_rank", "32", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_model(&c, many, 256, dims, &mc, err, sizeof(err)), MT_OK, "%s", err);
    cr_expect_eq(mc.cross_rank, 32);
    cr_assert_eq(mt_config_set(&c, "trainer.hidden", "64,x", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_model(&c, slots, 26, dims, &mc, err, sizeof(err)), MT_CONFIG);
    cr_expect(strstr(err, "trainer.hidden") != NULL, "%s", err);
    /* every name the key takes is the model's name of the same family */
    cr_expect_eq(mt_config_set(&c, "model.type", "dcn", err, sizeof(err)), MT_CONFIG);
    const mt_model_type_t offered[] = {MT_MODEL_DEEPFM, MT_MODEL_DCNV2, MT_MODEL_MMOE,
                                       MT_MODEL_DIN};
    for (size_t k = 0; k < sizeof(offered) / sizeof(offered[0]); k++) {
        cr_assert_eq(
            mt_config_set(&c, "model.type", mt_model_type_name(offered[k]), err, sizeof(err)),
            MT_OK, "%s", err);
        cr_expect_eq(c.model.type, offered[k]);
    }
    /* mmoe: its tasks, experts and loss weights reach the model */
    cr_assert_eq(mt_config_set(&c, "trainer.hidden", "16", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "trainer.dim", "8", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "model.type", "mmoe", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "model.tasks", "3", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "model.experts", "2", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "model.expert_width", "12", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "model.task_weights", "1, 0.5 ,2", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_model(&c, slots, 26, dims, &mc, err, sizeof(err)), MT_OK, "%s", err);
    cr_expect(mc.type == MT_MODEL_MMOE && mc.ntasks == 3 && mc.nexperts == 2 &&
              mc.expert_width == 12);
    cr_expect(mc.task_weight[0] == 1.0f && mc.task_weight[1] == 0.5f && mc.task_weight[2] == 2.0f);
    const char *bad_weights[] = {"1, 2", "1, x, 2", "1 2 3", "1, -1, 2", "1,,2"};
    for (size_t k = 0; k < sizeof(bad_weights) / sizeof(bad_weights[0]); k++) {
        cr_assert_eq(mt_config_set(&c, "model.task_weights", bad_weights[k], err, sizeof(err)),
                     MT_OK);
        cr_expect_eq(mt_config_model(&c, slots, 26, dims, &mc, err, sizeof(err)), MT_CONFIG, "%s",
                     bad_weights[k]);
        cr_expect(strstr(err, "model.task_weights") != NULL, "%s", err);
    }
    cr_expect_eq(mt_config_set(&c, "model.tasks", "1", err, sizeof(err)), MT_CONFIG);
    cr_expect_eq(mt_config_set(&c, "model.tasks", "5", err, sizeof(err)), MT_CONFIG);
    cr_expect_eq(mt_config_set(&c, "model.experts", "9", err, sizeof(err)), MT_CONFIG);
    cr_expect_eq(mt_config_set(&c, "model.cross_layers", "0", err, sizeof(err)), MT_CONFIG);
    cr_expect_eq(mt_config_set(&c, "model.cross_layers", "9", err, sizeof(err)), MT_CONFIG);
    /* din: the sequence and query slots' ids become their indexes; missing, equal or of
     * other dims they are refused by name */
    cr_assert_eq(mt_config_set(&c, "model.type", "din", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "model.task_weights", "", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_model(&c, slots, 26, dims, &mc, err, sizeof(err)), MT_CONFIG);
    cr_expect(strstr(err, "model.sequence_slot = 0") != NULL, "%s", err);
    cr_assert_eq(mt_config_set(&c, "model.sequence_slot", "27", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "model.sequence_query", "27", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_model(&c, slots, 27, dims, &mc, err, sizeof(err)), MT_CONFIG);
    cr_expect(strstr(err, "needs two slots") != NULL, "%s", err);
    cr_assert_eq(mt_config_set(&c, "model.sequence_query", "14", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "model.sequence_length", "7", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_set(&c, "model.attention_width", "9", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_model(&c, slots, 27, dims, &mc, err, sizeof(err)), MT_OK, "%s", err);
    cr_expect(mc.type == MT_MODEL_DIN && mc.seq_slot == 26 && mc.seq_query == 13 &&
              mc.seq_len == 7 && mc.attention_width == 9);
    cr_assert_eq(mt_config_set(&c, "trainer.slot_dims", "27:4", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_model(&c, slots, 27, dims, &mc, err, sizeof(err)), MT_CONFIG);
    cr_expect(strstr(err, "the sequence slot 27 has dim 4") != NULL, "%s", err);
    cr_assert_eq(mt_config_set(&c, "trainer.slot_dims", "27:4, 14:4", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_model(&c, slots, 27, dims, &mc, err, sizeof(err)), MT_CONFIG);
    cr_expect(strstr(err, "din's FM term") != NULL, "%s", err);
    cr_assert_eq(mt_config_set(&c, "trainer.slot_dims", "", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_model(&c, slots, 27, dims, &mc, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(mt_config_set(&c, "trainer.mean_slots", "27", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_model(&c, slots, 27, dims, &mc, err, sizeof(err)), MT_CONFIG);
    cr_expect(strstr(err, "27 is din's sequence slot") != NULL, "%s", err);
    cr_expect_eq(mt_config_set(&c, "model.sequence_length", "257", err, sizeof(err)), MT_CONFIG);
    cr_expect_eq(mt_config_set(&c, "model.attention_width", "0", err, sizeof(err)), MT_CONFIG);
    mt_config_free(&c);
}

/* trainer.slot_hash_buckets: per model slot, parallel to the slots; bad lists, unknown or
 * repeated slots and 0 buckets refused by name. */
Test(config, slot_hash_buckets_map_to_the_models_slots) {
    mt_config_t c;
    char err[256];
    init(&c);
    const uint16_t slots[3] = {1, 3, 7};
    uint64_t b[3] = {9, 9, 9};
    cr_assert_eq(mt_config_slot_hash_buckets(&c, slots, 3, b, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert(b[0] == 0 && b[1] == 0 && b[2] == 0); /* default: hash_buckets for all */
    cr_assert_eq(mt_config_set(&c, "trainer.slot_hash_buckets", " 7:1000 ,1: 64", err, sizeof(err)),
                 MT_OK);
    cr_assert_eq(mt_config_slot_hash_buckets(&c, slots, 3, b, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert(b[0] == 64 && b[1] == 0 && b[2] == 1000);
    static const char *bad[][2] = {{"5:10", "5 is not one of the model's slots"},
                                   {"1:10, 1:20", "slot 1 appears twice"},
                                   {"3:0", "slot 3: 0 buckets"},
                                   {"3", "expected \"slot:buckets\""},
                                   {"3:10;7:2", "expected \"slot:buckets\""},
                                   {"x:1", "expected \"slot:buckets\""}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(mt_config_set(&c, "trainer.slot_hash_buckets", bad[i][0], err, sizeof(err)),
                     MT_OK);
        cr_assert_eq(mt_config_slot_hash_buckets(&c, slots, 3, b, err, sizeof(err)), MT_CONFIG,
                     "%s accepted", bad[i][0]);
        cr_assert(strstr(err, bad[i][1]) && strstr(err, "trainer.slot_hash_buckets"), "%s: %s",
                  bad[i][0], err);
    }
    mt_config_free(&c);
}

/* trainer.mean_slots: the pooling of each model slot, refused by name when a slot is not the
 * model's or the list is bad. */
Test(config, mean_slots_map_to_the_models_slots) {
    mt_config_t c;
    char err[256];
    init(&c);
    const uint16_t slots[3] = {1, 3, 7};
    uint8_t mean[3] = {9, 9, 9};
    cr_assert_eq(mt_config_mean_slots(&c, slots, 3, mean, err, sizeof(err)), MT_OK);
    cr_assert(mean[0] == 0 && mean[1] == 0 && mean[2] == 0); /* default: all summed */
    cr_assert_eq(mt_config_set(&c, "trainer.mean_slots", "7, 1", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_mean_slots(&c, slots, 3, mean, err, sizeof(err)), MT_OK);
    cr_assert(mean[0] == 1 && mean[1] == 0 && mean[2] == 1);
    cr_assert_eq(mt_config_set(&c, "trainer.mean_slots", "3, 5", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_mean_slots(&c, slots, 3, mean, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "trainer.mean_slots: 5 is not one of the model's slots"), "%s", err);
    cr_assert_eq(mt_config_set(&c, "trainer.mean_slots", "3,x", err, sizeof(err)), MT_OK);
    cr_assert_eq(mt_config_mean_slots(&c, slots, 3, mean, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "trainer.mean_slots"), "%s", err);
    mt_config_free(&c);
}
