/*
 * cli.c - the operators' command-line tool, `monolith` (mt/cli.h; cli/main.c is its thin main).
 *
 *   monolith health   --addr HOST:PORT [--service NAME]
 *   monolith stats    --addr HOST:PORT
 *   monolith lookup   --ps HOST:PORT[,HOST:PORT...] [--train] FID...
 *   monolith predict  --addr HOST:PORT --user FID[,FID...] --candidate ITEM=FID[,FID...]...
 *                     [--request-id ID]
 *   monolith snapshot --addr HOST:PORT [--token TOKEN] [--id N]
 *   (health, stats, lookup, snapshot: [--tls-ca FILE [--tls-cert FILE --tls-key FILE]
 *    [--tls-server-name NAME]] to talk to daemons with [tls] enabled; docs/security.md)
 *   monolith gen      [--examples N] [--seed S] [--users U] [--items I] [--ctr P] [--tasks 2]
 *                     [--sequence L]
 *                     [--kafka BOOTSTRAP [--topic examples] [--rate EX_PER_S]]
 *   monolith offsets  --kafka BOOTSTRAP --group G [--topic examples]
 *   monolith replay   --dataset trivago|movielens-100k|movielens-latest|gen|csv [--path P]
 *                     [--config FILE [--set input.KEY=VALUE]...]  (csv: your own log)
 *                     [--kafka BOOTSTRAP] [--speed N | --as-fast-as-possible] ...
 *
 * gen writes the synthetic click stream (data/gen: a hidden ground-truth model, Zipf
 * popularity, new ids, drift) to stdout as TSV with a header: label, timestamp_ms, then one
 * column per slot (user, item, segment, category, hour, tags) holding the ids' values
 * (tags: comma-separated). The generic CSV/TSV reader reads it back. With --kafka it
 * produces monolith.v1.Example protobufs to the topic instead (key = request id
 * "gen-<seed>-<n>"): a stream monolith-trainer --online trains on without a joiner;
 * --rate paces it (examples per second; default: as fast as the broker takes them).
 *
 * offsets prints a consumer group's committed offset on every partition of a topic beside
 * the partition's log start and end, and the lag (end - committed), asked of the brokers
 * without joining the group: what the trainers committed (at-least-once: how far they
 * trained; exactly-once: the lowest durable mark, docs/checkpoint.md).
 *
 * replay turns a dataset into the loop's streams in event-time order (replay/, docs/replay.md):
 * impressions (monolith.v1.Impression) to `features`, clicks (monolith.v1.Action) to
 * `actions`, keyed by request id; `monolith replay --help` lists its options. --dataset csv
 * reads any CSV / TSV log with the columns the [input] section of --config maps, the keys
 * monolith-trainer reads (mt/config_input.h): a bad or missing column setting is exit 2.
 *
 * predict asks a serving replica (monolith.v1.Serving/Predict) to score the candidates for
 * the user: the user's fids and each candidate's (ITEM: its item id) are grouped by slot
 * into SlotFids; it prints {"scores":[...],"sparse_version":N,"dense_version":N}, and for a
 * multi-task model (T > 1 tasks) each candidate's T scores after the scores (task 0's):
 * {"scores":[...],"task_scores":[[t0,t1,...],...],"tasks":T,"sparse_version":N,...}. A
 * client in Python making the same call is clients/python/monolith_client.py.
 *
 * A FID is "SLOT:VALUE" (decimal, VALUE < 2^48) or a raw 64-bit number (decimal or 0x hex).
 * lookup routes each id to its shard like every client (the --ps list is shard 0, 1, ...).
 * Output is JSON, one object per line. Exit status: 0 success, 1 the call failed (the
 * gRPC status and message are printed on stderr), 2 bad usage.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "grpc/health/v1/health.pb-c.h"
#include "monolith/v1/ps.pb-c.h"
#include "monolith/v1/serving.pb-c.h"
#include "mt/config.h"
#include "mt/cli.h"
#include "mt/config_input.h"
#include "mt/example_pb.h"
#include "mt/gen.h"
#include "mt/kafka.h"
#include "mt/psclient.h"
#include "mt/replay.h"
#include "mt/rpc.h"
#include "mt/table.h"

#define DEADLINE_MS 10000

/* A client configuration with the tool's TLS (--tls-*: plaintext unless --tls-ca is given). */
static void client_config(const mt_rpc_tls_config_t *tls, mt_rpc_client_config_t *cc) {
    mt_rpc_client_config_init(cc);
    cc->tls = *tls;
}

static const char *status_name(int code) {
    static const char *n[] = {"OK",
                              "CANCELLED",
                              "UNKNOWN",
                              "INVALID_ARGUMENT",
                              "DEADLINE_EXCEEDED",
                              "NOT_FOUND",
                              "ALREADY_EXISTS",
                              "PERMISSION_DENIED",
                              "RESOURCE_EXHAUSTED",
                              "FAILED_PRECONDITION",
                              "ABORTED",
                              "OUT_OF_RANGE",
                              "UNIMPLEMENTED",
                              "INTERNAL",
                              "UNAVAILABLE",
                              "DATA_LOSS",
                              "UNAUTHENTICATED"};
    return code >= 0 && code <= 16 ? n[code] : "?";
}

static int usage(void) {
    fprintf(stderr,
            "usage: monolith health   --addr HOST:PORT [--service NAME]\n"
            "       monolith stats    --addr HOST:PORT\n"
            "       monolith lookup   --ps HOST:PORT[,HOST:PORT...] [--train] FID...\n"
            "       monolith predict  --addr HOST:PORT --user FID[,FID...]"
            " --candidate ITEM=FID[,FID...]...\n"
            "                         [--request-id ID]\n"
            "       monolith snapshot --addr HOST:PORT [--token TOKEN] [--id N]\n"
            "       (health, stats, lookup, predict, snapshot: [--tls-ca FILE [--tls-cert FILE"
            " --tls-key FILE]\n"
            "        [--tls-server-name NAME]]: TLS, as the daemons' [tls] section)\n"
            "       monolith gen      [--examples N] [--seed S] [--users U] [--items I]"
            " [--ctr P] [--tasks 2]\n"
            "                         [--sequence L]  (the user's L recent clicks, a column)\n"
            "                         [--kafka BOOTSTRAP [--topic examples] [--rate EX_PER_S]]\n"
            "       monolith offsets  --kafka BOOTSTRAP --group G [--topic examples]\n"
            "       monolith replay   --dataset D [--path P] [--kafka BOOTSTRAP] ..."
            " (monolith replay --help)\n"
            "FID: SLOT:VALUE or a 64-bit number (decimal or 0x hex)\n");
    return 2;
}

static int fail_status(const char *what, const mt_rpc_status_t *st, mt_err_t err) {
    if (st->code != MT_RPC_OK)
        fprintf(stderr, "monolith: %s: %s: %s\n", what, status_name(st->code), st->message);
    else
        fprintf(stderr, "monolith: %s: %s\n", what, mt_strerror(err));
    return 1;
}

/* One unary call on a fresh channel. */
static int call(const mt_rpc_tls_config_t *tls, const char *addr, const char *path,
                const uint8_t *req, size_t len, uint8_t **resp, size_t *rlen, const char *what) {
    mt_rpc_channel_t *ch;
    mt_rpc_client_config_t cc;
    client_config(tls, &cc);
    cc.retries = 1;
    mt_err_t e = mt_rpc_channel_create(addr, &cc, &ch);
    if (e != MT_OK) {
        fprintf(stderr, "monolith: %s: %s\n", addr,
                tls->enabled ? "bad address or TLS files (see above)" : "bad address");
        return 2;
    }
    mt_rpc_status_t st;
    mt_err_t err = mt_rpc_call(ch, path, req, len, DEADLINE_MS, resp, rlen, &st);
    mt_rpc_channel_destroy(ch);
    if (err || st.code != MT_RPC_OK) {
        free(*resp);
        *resp = NULL;
        return fail_status(what, &st, err);
    }
    return 0;
}

static int parse_fid(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    const char *colon = strchr(s, ':');
    if (colon) {
        unsigned long slot = strtoul(s, &end, 10);
        if (end != colon || slot > 65535) return -1;
        unsigned long long v = strtoull(colon + 1, &end, 10);
        if (*end || errno || v >= (1ull << 48) || colon[1] == 0) return -1;
        *out = MT_FID_MAKE(slot, v);
        return 0;
    }
    unsigned long long v = strtoull(s, &end, 0);
    if (*end || errno || !*s) return -1;
    *out = v;
    return 0;
}

static int cmd_health(const mt_rpc_tls_config_t *tls, const char *addr, const char *service) {
    Grpc__Health__V1__HealthCheckRequest r = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    r.service = (char *)(service ? service : "");
    uint8_t buf[300];
    if (grpc__health__v1__health_check_request__get_packed_size(&r) > sizeof(buf)) return usage();
    size_t len = grpc__health__v1__health_check_request__pack(&r, buf);
    uint8_t *resp = NULL;
    size_t rlen = 0;
    int rc = call(tls, addr, "/grpc.health.v1.Health/Check", buf, len, &resp, &rlen, "health");
    if (rc) return rc;
    Grpc__Health__V1__HealthCheckResponse *h =
        grpc__health__v1__health_check_response__unpack(NULL, rlen, resp);
    free(resp);
    if (!h) {
        fprintf(stderr, "monolith: health: malformed answer\n");
        return 1;
    }
    static const char *names[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
    int s = h->status >= 0 && h->status <= 3 ? (int)h->status : 0;
    printf("{\"status\":\"%s\"}\n", names[s]);
    grpc__health__v1__health_check_response__free_unpacked(h, NULL);
    return s == 1 ? 0 : 1;
}

static int cmd_stats(const mt_rpc_tls_config_t *tls, const char *addr) {
    uint8_t *resp = NULL;
    size_t rlen = 0;
    int rc = call(tls, addr, "/monolith.v1.ParameterServer/Stats", NULL, 0, &resp, &rlen, "stats");
    if (rc) return rc;
    Monolith__V1__StatsResponse *s = monolith__v1__stats_response__unpack(NULL, rlen, resp);
    free(resp);
    if (!s) {
        fprintf(stderr, "monolith: stats: malformed answer\n");
        return 1;
    }
    printf("{\"shard\":%u,\"num_shards\":%u,\"incarnation\":%" PRIu64 ",\"rows\":%" PRIu64
           ",\"capacity\":%" PRIu64 ",\"load_factor\":%.4f,\"bytes_total\":%" PRIu64
           ",\"version\":%" PRIu64 ",\"evictions\":%" PRIu64 ",\"filtered\":%" PRIu64
           ",\"dense_version\":%" PRIu64 ",\"examples_applied\":%" PRIu64
           ",\"last_checkpoint_id\":%" PRIu64 ",\"slots\":[",
           s->shard, s->num_shards, s->incarnation, s->rows, s->capacity, s->load_factor,
           s->bytes_total, s->version, s->evictions, s->filtered, s->dense_version,
           s->examples_applied, s->last_checkpoint_id);
    for (size_t i = 0; i < s->n_slots; i++) {
        const Monolith__V1__SlotInfo *si = s->slots[i];
        printf("%s{\"slot\":%u,\"dim\":%u,\"optimizer\":\"%s\",\"min_count\":%u,\"ttl_s\":%u,"
               "\"fp16\":%s}",
               i ? "," : "", si->slot, si->dim, si->optimizer, si->min_count, si->ttl_s,
               si->fp16 ? "true" : "false");
    }
    printf("]}\n");
    monolith__v1__stats_response__free_unpacked(s, NULL);
    return 0;
}

static int cmd_snapshot(const mt_rpc_tls_config_t *tls, const char *addr, const char *token,
                        uint64_t id) {
    Monolith__V1__SnapshotRequest r = MONOLITH__V1__SNAPSHOT_REQUEST__INIT;
    r.token = (char *)(token ? token : "");
    r.checkpoint_id = id;
    size_t len = monolith__v1__snapshot_request__get_packed_size(&r);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return 1;
    monolith__v1__snapshot_request__pack(&r, buf);
    uint8_t *resp = NULL;
    size_t rlen = 0;
    mt_rpc_channel_t *ch;
    mt_rpc_client_config_t cc;
    client_config(tls, &cc);
    if (mt_rpc_channel_create(addr, &cc, &ch) != MT_OK) {
        free(buf);
        return usage();
    }
    mt_rpc_status_t st;
    mt_err_t err = mt_rpc_call(ch, "/monolith.v1.ParameterServer/Snapshot", buf, len, 600000, &resp,
                               &rlen, &st);
    mt_rpc_channel_destroy(ch);
    free(buf);
    if (err || st.code != MT_RPC_OK) {
        free(resp);
        return fail_status("snapshot", &st, err);
    }
    Monolith__V1__SnapshotResponse *s = monolith__v1__snapshot_response__unpack(NULL, rlen, resp);
    free(resp);
    if (!s) {
        fprintf(stderr, "monolith: snapshot: malformed answer\n");
        return 1;
    }
    printf("{\"checkpoint_id\":%" PRIu64 ",\"shard\":%u,\"rows\":%" PRIu64 ",\"bytes\":%" PRIu64
           ",\"examples_applied\":%" PRIu64 ",\"seconds\":%.3f}\n",
           s->meta ? s->meta->checkpoint_id : 0, s->meta ? s->meta->shard : 0, s->rows, s->bytes,
           s->meta ? s->meta->examples_applied : 0, s->seconds);
    monolith__v1__snapshot_response__free_unpacked(s, NULL);
    return 0;
}

static int cmd_lookup(const mt_rpc_tls_config_t *tls, char *ps, int train, char **fid_args,
                      int nfids) {
    const char *addrs[256];
    uint32_t n = 0;
    for (char *tok = strtok(ps, ","); tok && n < 256; tok = strtok(NULL, ","))
        addrs[n++] = tok;
    if (n == 0 || nfids == 0) return usage();
    uint64_t *fids = calloc((size_t)nfids, sizeof(uint64_t));
    if (!fids) return 1;
    for (int i = 0; i < nfids; i++) {
        if (parse_fid(fid_args[i], &fids[i]) != 0) {
            fprintf(stderr, "monolith: '%s' is not a fid (SLOT:VALUE or a 64-bit number)\n",
                    fid_args[i]);
            free(fids);
            return 2;
        }
    }
    mt_psc_config_t pc;
    mt_psc_config_init(&pc);
    pc.addrs = addrs;
    pc.num_shards = n;
    pc.deadline_ms = DEADLINE_MS;
    client_config(tls, &pc.rpc);
    pc.rpc.retries = 1;
    mt_psc_t *c = NULL;
    int rc = 1;
    float *out = NULL;
    uint8_t *found = NULL;
    mt_rpc_status_t st = {0};
    mt_err_t err = mt_psc_create(&pc, &c);
    size_t total = 0;
    for (int i = 0; i < nfids && !err; i++) {
        uint32_t d;
        err = mt_psc_dim(c, fids[i], &d, &st);
        if (err == MT_UNKNOWN_SLOT)
            fprintf(stderr, "monolith: %s: slot %u is not configured\n", fid_args[i],
                    MT_FID_SLOT(fids[i]));
        total += d;
    }
    if (err) {
        if (err != MT_UNKNOWN_SLOT) fail_status("lookup", &st, err);
        goto out;
    }
    out = malloc(total * sizeof(float));
    found = malloc((size_t)nfids);
    if (!out || !found) goto out;
    err = mt_psc_lookup(c, fids, (size_t)nfids, train, 0, out, total, found, &st);
    if (err) {
        fail_status("lookup", &st, err);
        goto out;
    }
    size_t off = 0;
    for (int i = 0; i < nfids; i++) {
        uint32_t d = 0;
        mt_psc_dim(c, fids[i], &d, NULL);
        printf("{\"fid\":\"0x%016" PRIx64 "\",\"slot\":%u,\"value\":%" PRIu64
               ",\"found\":%s,\"embedding\":[",
               fids[i], MT_FID_SLOT(fids[i]), (uint64_t)(fids[i] & 0xFFFFFFFFFFFFull),
               found[i] ? "true" : "false");
        for (uint32_t k = 0; k < d; k++)
            printf("%s%.9g", k ? "," : "", out[off + k]);
        printf("]}\n");
        off += d;
    }
    rc = 0;
out:
    mt_psc_destroy(c);
    free(fids);
    free(out);
    free(found);
    return rc;
}

/* The fids of a comma-separated list, grouped by slot into SlotFids (in the order each slot
 * first appears). @p sf / @p sfp have room for @p cap slots; the fids are written to
 * @p fids (room for @p fcap). @returns the number of SlotFids, or -1 (a bad fid, said). */
static int slot_fids(char *list, Monolith__V1__SlotFids *sf, Monolith__V1__SlotFids **sfp,
                     size_t cap, uint64_t *fids, size_t fcap) {
    size_t n = 0, nf = 0;
    uint64_t tmp[256];
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        if (nf == 256 || nf == fcap || parse_fid(tok, &tmp[nf]) != 0) {
            fprintf(stderr, "monolith: '%s' is not a fid (SLOT:VALUE or a 64-bit number)%s\n", tok,
                    nf == 256 || nf == fcap ? ", or too many" : "");
            return -1;
        }
        nf++;
    }
    size_t used = 0;
    for (size_t i = 0; i < nf; i++) {
        uint16_t slot = MT_FID_SLOT(tmp[i]);
        size_t k = 0;
        while (k < n && sf[k].slot != slot)
            k++;
        if (k < n) continue; /* this slot's fids were gathered already */
        if (n == cap) {
            fprintf(stderr, "monolith: too many slots in '%s'\n", list);
            return -1;
        }
        monolith__v1__slot_fids__init(&sf[n]);
        sf[n].slot = slot;
        sf[n].fids = fids + used;
        for (size_t j = i; j < nf; j++)
            if (MT_FID_SLOT(tmp[j]) == slot) fids[used + sf[n].n_fids++] = tmp[j];
        used += sf[n].n_fids;
        sfp[n] = &sf[n];
        n++;
    }
    return (int)n;
}

#define PREDICT_MAX_CANDIDATES 1024
#define PREDICT_MAX_SLOTS      64

static int cmd_predict(const mt_rpc_tls_config_t *tls, const char *addr, const char *request_id,
                       char *user, char **cands, int ncands) {
    if (!user || ncands < 1 || ncands > PREDICT_MAX_CANDIDATES) return usage();
    int rc = 2;
    Monolith__V1__SlotFids usf[PREDICT_MAX_SLOTS], *usfp[PREDICT_MAX_SLOTS];
    uint64_t ufids[256];
    Monolith__V1__Candidate *c = calloc((size_t)ncands, sizeof(*c));
    Monolith__V1__Candidate **cp = calloc((size_t)ncands, sizeof(*cp));
    Monolith__V1__SlotFids *csf = calloc((size_t)ncands * PREDICT_MAX_SLOTS, sizeof(*csf));
    Monolith__V1__SlotFids **csfp = calloc((size_t)ncands * PREDICT_MAX_SLOTS, sizeof(*csfp));
    uint64_t *cfids = calloc((size_t)ncands * 256, sizeof(uint64_t));
    uint8_t *buf = NULL, *resp = NULL;
    Monolith__V1__PredictResponse *pr = NULL;
    if (!c || !cp || !csf || !csfp || !cfids) {
        rc = 1;
        goto out;
    }
    Monolith__V1__PredictRequest r = MONOLITH__V1__PREDICT_REQUEST__INIT;
    r.request_id = (char *)(request_id ? request_id : "");
    int nu = slot_fids(user, usf, usfp, PREDICT_MAX_SLOTS, ufids, 256);
    if (nu < 0) goto out;
    r.n_user = (size_t)nu;
    r.user = usfp;
    for (int i = 0; i < ncands; i++) {
        char *eq = strchr(cands[i], '='), *end;
        errno = 0;
        unsigned long long item = strtoull(cands[i], &end, 10);
        if (!eq || end != eq || errno || eq == cands[i]) {
            fprintf(stderr, "monolith: --candidate %s: expected ITEM=FID[,FID...]\n", cands[i]);
            goto out;
        }
        monolith__v1__candidate__init(&c[i]);
        c[i].item_id = item;
        int ns = slot_fids(eq + 1, csf + (size_t)i * PREDICT_MAX_SLOTS,
                           csfp + (size_t)i * PREDICT_MAX_SLOTS, PREDICT_MAX_SLOTS,
                           cfids + (size_t)i * 256, 256);
        if (ns < 0) goto out;
        c[i].n_item = (size_t)ns;
        c[i].item = csfp + (size_t)i * PREDICT_MAX_SLOTS;
        cp[i] = &c[i];
    }
    r.n_candidates = (size_t)ncands;
    r.candidates = cp;
    size_t len = monolith__v1__predict_request__get_packed_size(&r);
    if (!(buf = malloc(len ? len : 1))) {
        rc = 1;
        goto out;
    }
    monolith__v1__predict_request__pack(&r, buf);
    size_t rlen = 0;
    if ((rc = call(tls, addr, "/monolith.v1.Serving/Predict", buf, len, &resp, &rlen, "predict")))
        goto out;
    rc = 1;
    if (!(pr = monolith__v1__predict_response__unpack(NULL, rlen, resp)) ||
        (pr->tasks > 1 && pr->n_task_scores != pr->n_scores * pr->tasks)) {
        fprintf(stderr, "monolith: predict: malformed answer\n");
        goto out;
    }
    printf("{\"scores\":[");
    for (size_t i = 0; i < pr->n_scores; i++)
        printf("%s%.9g", i ? "," : "", pr->scores[i]);
    if (pr->tasks > 1) { /* a multi-task model: each candidate's T scores */
        printf("],\"task_scores\":[");
        for (size_t i = 0; i < pr->n_scores; i++) {
            printf("%s[", i ? "," : "");
            for (uint32_t t = 0; t < pr->tasks; t++)
                printf("%s%.9g", t ? "," : "", pr->task_scores[i * pr->tasks + t]);
            printf("]");
        }
        printf("],\"tasks\":%" PRIu32, pr->tasks);
    } else {
        printf("]");
    }
    printf(",\"sparse_version\":%" PRIu64 ",\"dense_version\":%" PRIu64 "}\n", pr->sparse_version,
           pr->dense_version);
    rc = 0;
out:
    if (pr) monolith__v1__predict_response__free_unpacked(pr, NULL);
    free(resp);
    free(buf);
    free(c);
    free(cp);
    free(csf);
    free(csfp);
    free(cfids);
    return rc;
}

/* monolith gen --kafka: the stream as monolith.v1.Example protobufs (key = request id
 * "gen-<seed>-<n>") to a topic, ready for monolith-trainer --online without a joiner. */
static int gen_to_kafka(uint64_t examples, const mt_gen_config_t *gc, const char *bootstrap,
                        const char *topic, double rate) {
    char err[512];
    mt_kafka_producer_t *p;
    const char *pconf[] = {"compression.codec=lz4", NULL}; /* more per mock partition */
    if (mt_kafka_producer_create(bootstrap, pconf, &p, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith: gen: Kafka producer on %s: %s\n", bootstrap, err);
        return 1;
    }
    mt_gen_t *g;
    if (mt_gen_create(gc, &g) != MT_OK) {
        mt_kafka_producer_destroy(p);
        return 1;
    }
    mt_batch_t b = {0};
    int rc = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t chunk = rate > 0 && rate < 40960 ? (size_t)(rate / 10) + 1 : 4096;
    for (uint64_t done = 0; done < examples && !rc;) {
        size_t n = examples - done < chunk ? (size_t)(examples - done) : chunk;
        if (rate > 0) { /* paced: done examples are due at t0 + done / rate */
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            double ahead = (double)done / rate - ((double)(now.tv_sec - t0.tv_sec) +
                                                  (double)(now.tv_nsec - t0.tv_nsec) * 1e-9);
            if (ahead > 0) usleep((useconds_t)(ahead * 1e6));
        }
        if (mt_gen_next(g, &b, n, NULL) != MT_OK) {
            rc = 1;
            break;
        }
        for (size_t i = 0; i < b.n && !rc; i++) {
            char key[64];
            snprintf(key, sizeof(key), "gen-%" PRIu64 "-%" PRIu64, gc->seed, done + i);
            uint8_t *buf;
            size_t len;
            mt_err_t e = mt_example_encode(&b, i, key, &buf, &len);
            if (!e) e = mt_kafka_produce(p, topic, -1, key, strlen(key), buf, len, 30000);
            if (e == MT_OK) free(buf);
            if (e) {
                fprintf(stderr, "monolith: gen: produce to %s: %s\n", topic, mt_strerror(e));
                rc = 1;
            }
        }
        done += n;
    }
    if (!rc && mt_kafka_producer_flush(p, 60000) != MT_OK) {
        fprintf(stderr, "monolith: gen: some messages were not delivered to %s\n", topic);
        rc = 1;
    }
    uint64_t delivered = 0, failed = 0;
    mt_kafka_producer_counts(p, &delivered, &failed);
    fprintf(stderr, "monolith: gen: %" PRIu64 " examples delivered to %s, %" PRIu64 " failed\n",
            delivered, topic, failed);
    mt_batch_free(&b);
    mt_gen_destroy(g);
    mt_kafka_producer_destroy(p);
    return rc;
}

static int cmd_gen(uint64_t examples, const mt_gen_config_t *gc, const char *kafka,
                   const char *topic, double rate) {
    char err[256];
    if (mt_gen_config_validate(gc, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith: gen: %s\n", err);
        return 2;
    }
    if (kafka) return gen_to_kafka(examples, gc, kafka, topic ? topic : "examples", rate);
    mt_gen_t *g;
    if (mt_gen_create(gc, &g) != MT_OK) return 1;
    mt_batch_t b = {0};
    int rc = 0;
    printf("label%s\ttimestamp_ms\tuser\titem\tsegment\tcategory\thour\ttags%s\n",
           gc->tasks == 2 ? "\tconversion" : "", gc->sequence_length ? "\tsequence" : "");
    for (uint64_t done = 0; done < examples && !rc;) {
        size_t n = examples - done < 4096 ? (size_t)(examples - done) : 4096;
        if (mt_gen_next(g, &b, n, NULL) != MT_OK) {
            rc = 1;
            break;
        }
        for (size_t i = 0; i < b.n; i++) {
            for (uint32_t t = 0; t < b.ntasks; t++) /* the click, then a conversion */
                printf("%d\t", b.labels[i * b.ntasks + t] > 0.5f);
            printf("%" PRId64, b.timestamps_ms[i]);
            for (uint32_t s = 0; s < b.nslots; s++) {
                size_t cnt;
                const uint64_t *f = mt_batch_fids(&b, i, s, &cnt);
                putchar('\t');
                for (size_t k = 0; k < cnt; k++)
                    printf("%s%" PRIu64, k ? "," : "", (uint64_t)(f[k] & 0xFFFFFFFFFFFFull));
            }
            putchar('\n');
        }
        done += n;
    }
    if (fflush(stdout) != 0) rc = 1;
    mt_batch_free(&b);
    mt_gen_destroy(g);
    return rc;
}

/* ---------------- monolith replay ---------------- */

static int replay_usage(FILE *to) {
    fprintf(to,
            "usage: monolith replay --dataset trivago|movielens-100k|movielens-latest|gen|csv\n"
            "         [--path P]                the dataset: trivago CSV (.gz or plain); the\n"
            "                                   MovieLens folder (or u.data / ratings.csv);\n"
            "                                   csv: your log, CSV or TSV (.gz or plain)\n"
            "         [--config FILE]           csv: its [input] section maps the columns (the\n"
            "                                   keys monolith-trainer reads, docs/replay.md)\n"
            "         [--set input.KEY=VALUE]...  csv: overrides of that file\n"
            "         [--kafka BOOTSTRAP]       produce to Kafka (without: a dry run)\n"
            "         [--speed N | --as-fast-as-possible]  N x real time (default: as fast\n"
            "                                   as possible)\n"
            "         [--features-topic features] [--actions-topic actions]\n"
            "         [--limit N]               impressions (gen default 100000; 0 = all)\n"
            "         [--action-delay-s D]      click time = impression time + D (default 5)\n"
            "         [--positive-rating R]     MovieLens: rating >= R is a click (default 4)\n"
            "         [--seed S] [--users U] [--items I] [--ctr P] [--events-per-s E]  (gen)\n"
            "         [--kafka-conf KEY=VALUE]...  librdkafka producer properties (default\n"
            "                                   compression.codec=lz4)\n"
            "         [--progress-s S]          progress on stderr every S s (default 2; 0 off)\n"
            "         [--print-events]          each event as a JSON line on stdout\n"
            "Prints one JSON summary line on stdout at the end. Exit status: 0 all events\n"
            "delivered; 1 a failure (dataset unreadable, delivery failed, interrupted); 2 bad\n"
            "usage or configuration (csv: a column setting missing or not in the file).\n");
    return to == stdout ? 0 : 2;
}

typedef struct replay_sink {
    mt_kafka_producer_t *p; /* NULL: dry run */
    const char *features, *actions;
    int print;
    uint64_t bad_logged;
} replay_sink_t;

static mt_err_t replay_sink(void *opaque, const mt_replay_event_t *ev, const uint8_t *value,
                            size_t len) {
    replay_sink_t *s = opaque;
    if (s->print)
        printf("{\"kind\":\"%s\",\"request_id\":\"%s\",\"timestamp_ms\":%" PRId64
               ",\"item_id\":%" PRIu64 ",\"clicked\":%s,\"line\":%" PRIu64 ",\"bytes\":%zu}\n",
               ev->kind == MT_REPLAY_IMPRESSION ? "impression" : "action", ev->request_id,
               ev->timestamp_ms, ev->item_id, ev->clicked ? "true" : "false", ev->line, len);
    if (!s->p) return MT_OK;
    const char *topic = ev->kind == MT_REPLAY_IMPRESSION ? s->features : s->actions;
    mt_err_t e = mt_kafka_produce(s->p, topic, -1, ev->request_id, strlen(ev->request_id), value,
                                  len, 60000);
    if (e) fprintf(stderr, "monolith: replay: produce to %s: %s\n", topic, mt_strerror(e));
    return e;
}

static void replay_bad_row(void *opaque, uint64_t line, const char *reason) {
    replay_sink_t *s = opaque;
    if (s->bad_logged++ < 20)
        fprintf(stderr, "monolith: replay: line %" PRIu64 ": %s (skipped)\n", line, reason);
    else if (s->bad_logged == 21)
        fprintf(stderr, "monolith: replay: more bad rows: only counted from now on\n");
}

static void replay_progress(void *opaque, const mt_replay_totals_t *t) {
    (void)opaque;
    time_t et = (time_t)(t->last_event_ms / 1000);
    struct tm tm;
    char when[32] = "-";
    if (t->last_event_ms > 0 && gmtime_r(&et, &tm))
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    fprintf(stderr,
            "monolith: replay: %" PRIu64 " impressions, %" PRIu64 " actions, event time %s,"
            " %.0f events/s\n",
            t->impressions, t->actions, when,
            t->wall_s > 0 ? (double)(t->impressions + t->actions) / t->wall_s : 0.0);
}

static int replay_number(const char *opt, const char *v, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !(x >= lo && x <= hi)) {
        fprintf(stderr, "monolith: replay: %s: '%s' is not a number in [%g, %g]\n", opt, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

/* --dataset csv: [input] of --config (with the --set overrides) as the replay's csv
 * settings, the key of anything missing or wrong named. @returns 0 or 2 (printed). */
static int replay_csv_config(const char *path, const char *const *sets, int nsets, mt_config_t *cfg,
                             mt_config_csv_t *icsv, mt_replay_csv_config_t *out) {
    char err[512];
    if (!path) {
        fprintf(stderr, "monolith: replay: --dataset csv needs --config FILE: its [input] section "
                        "says which columns are the timestamp, the label (action) and the "
                        "features (docs/replay.md)\n");
        return 2;
    }
    mt_err_t e = mt_config_load_file(cfg, path, err, sizeof(err));
    for (int i = 0; !e && i < nsets; i++)
        e = mt_config_set_arg(cfg, sets[i], err, sizeof(err));
    if (e) {
        fprintf(stderr, "monolith: replay: %s\n", err);
        return 2;
    }
    const mt_config_input_t *in = &cfg->input;
    const char *missing = NULL;
    if (!*in->timestamp)
        missing = "input.timestamp: the csv dataset needs the timestamp column (the event time)";
    else if (!*in->label)
        missing = "input.label: the csv dataset needs the action column (label = 1: a click)";
    else if (*in->request_id && !*in->item_id)
        missing = "input.item_id: needed with input.request_id (the rows of one request differ "
                  "by their item)";
    if (missing) {
        fprintf(stderr, "monolith: replay: %s: %s\n", path, missing);
        return 2;
    }
    if (mt_config_input_csv(cfg, icsv, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith: replay: %s: %s\n", path, err);
        return 2;
    }
    out->reader = &icsv->csv;
    out->request_id = icsv->request_id;
    out->item_id = icsv->item_id;
    return 0;
}

/* One JSON line per partition, then one with the totals; a partition without a commit
 * counts from its log start. */
static int cmd_offsets(const char *kafka, const char *group, const char *topic) {
    enum { MAXP = 4096 };
    mt_kafka_group_offset_t *o = calloc(MAXP, sizeof(*o));
    if (!o) return 1;
    size_t n = 0;
    char err[512];
    mt_err_t e =
        mt_kafka_group_offsets(kafka, NULL, group, topic, 10000, o, MAXP, &n, err, sizeof(err));
    if (e) {
        fprintf(stderr, "monolith: offsets: %s (%s)\n", err, mt_strerror(e));
        free(o);
        return 1;
    }
    int64_t lag = 0, committed = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t from = o[i].committed >= 0 ? o[i].committed : o[i].start;
        int64_t l = o[i].end > from ? o[i].end - from : 0;
        lag += l;
        committed += o[i].committed >= 0;
        printf("{\"topic\":\"%s\",\"partition\":%d,\"committed\":%" PRId64 ",\"start\":%" PRId64
               ",\"end\":%" PRId64 ",\"lag\":%" PRId64 "}\n",
               topic, (int)o[i].partition, o[i].committed, o[i].start, o[i].end, l);
    }
    printf("{\"topic\":\"%s\",\"group\":\"%s\",\"partitions\":%zu,\"committed_partitions\":%" PRId64
           ",\"lag\":%" PRId64 "}\n",
           topic, group, n, committed, lag);
    free(o);
    return 0;
}

static int cmd_replay(int argc, char **argv, const volatile int *stop) {
    mt_replay_config_t rc;
    mt_replay_config_init(&rc);
    mt_replay_run_config_t run;
    mt_replay_run_config_init(&run);
    const char *dataset = NULL, *kafka = NULL, *config = NULL, *sets[64];
    int nsets = 0;
    replay_sink_t sink = {NULL, "features", "actions", 0, 0};
    /* lz4: the 25 impressions of a request share their user-side fids and their key, hence
     * their partition and batch; compressed, all of trivago fits the mock's per-partition
     * retention (docs/replay.md). --kafka-conf entries come after and win. */
    const char *kconf[34] = {"compression.codec=lz4"};
    int nkconf = 1, have_limit = 0, have_speed = 0, fast = 0;
    double progress_s = 2, x;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return replay_usage(stdout);
        if (!strcmp(a, "--as-fast-as-possible")) {
            fast = 1;
            continue;
        }
        if (!strcmp(a, "--print-events")) {
            sink.print = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "monolith: replay: %s needs a value (or is unknown)\n", a);
            return replay_usage(stderr);
        }
        i++;
        if (!strcmp(a, "--dataset"))
            dataset = v;
        else if (!strcmp(a, "--path"))
            rc.path = v;
        else if (!strcmp(a, "--config"))
            config = v;
        else if (!strcmp(a, "--set")) {
            if (nsets == 64 || !strchr(v, '=')) {
                fprintf(stderr,
                        "monolith: replay: --set %s: expected section.key=value (at most "
                        "64)\n",
                        v);
                return 2;
            }
            sets[nsets++] = v;
        } else if (!strcmp(a, "--kafka"))
            kafka = v;
        else if (!strcmp(a, "--features-topic"))
            sink.features = v;
        else if (!strcmp(a, "--actions-topic"))
            sink.actions = v;
        else if (!strcmp(a, "--kafka-conf")) {
            if (nkconf == 33 || !strchr(v, '=')) return replay_usage(stderr);
            kconf[nkconf++] = v;
        } else if (!strcmp(a, "--speed")) {
            if (replay_number(a, v, 1e-6, 1e12, &run.speed)) return 2;
            have_speed = 1;
        } else if (!strcmp(a, "--limit")) {
            if (replay_number(a, v, 0, 1e15, &x)) return 2;
            rc.limit = (uint64_t)x;
            have_limit = 1;
        } else if (!strcmp(a, "--action-delay-s")) {
            if (replay_number(a, v, 0, 86400.0 * 365, &x)) return 2;
            rc.action_delay_ms = (int64_t)(x * 1000 + 0.5);
        } else if (!strcmp(a, "--positive-rating")) {
            if (replay_number(a, v, 0, 10, &x)) return 2;
            rc.positive_rating = (float)x;
        } else if (!strcmp(a, "--progress-s")) {
            if (replay_number(a, v, 0, 86400, &progress_s)) return 2;
        } else if (!strcmp(a, "--seed") || !strcmp(a, "--users") || !strcmp(a, "--items")) {
            if (replay_number(a, v, 0, 1.8e19, &x)) return 2;
            if (!strcmp(a, "--seed"))
                rc.gen.seed = strtoull(v, NULL, 10);
            else if (!strcmp(a, "--users"))
                rc.gen.num_users = (uint64_t)x;
            else
                rc.gen.num_items = (uint64_t)x;
        } else if (!strcmp(a, "--ctr")) {
            if (replay_number(a, v, 0, 1, &rc.gen.target_ctr)) return 2;
        } else if (!strcmp(a, "--events-per-s")) {
            if (replay_number(a, v, 1e-6, 1e9, &rc.gen.events_per_s)) return 2;
        } else {
            fprintf(stderr, "monolith: replay: unknown option %s\n", a);
            return replay_usage(stderr);
        }
    }
    kconf[nkconf] = NULL;
    if (!dataset) {
        fprintf(stderr, "monolith: replay: --dataset is required\n");
        return replay_usage(stderr);
    }
    if (!strcmp(dataset, "trivago"))
        rc.dataset = MT_REPLAY_TRIVAGO;
    else if (!strcmp(dataset, "movielens-100k"))
        rc.dataset = MT_REPLAY_MOVIELENS_100K;
    else if (!strcmp(dataset, "movielens-latest"))
        rc.dataset = MT_REPLAY_MOVIELENS_LATEST;
    else if (!strcmp(dataset, "gen"))
        rc.dataset = MT_REPLAY_GEN;
    else if (!strcmp(dataset, "csv"))
        rc.dataset = MT_REPLAY_CSV;
    else {
        fprintf(stderr, "monolith: replay: unknown dataset '%s'\n", dataset);
        return replay_usage(stderr);
    }
    if (fast && have_speed) {
        fprintf(stderr, "monolith: replay: --speed and --as-fast-as-possible exclude each other\n");
        return 2;
    }
    if (rc.dataset != MT_REPLAY_CSV && (config || nsets)) {
        fprintf(stderr, "monolith: replay: --config and --set are for --dataset csv\n");
        return 2;
    }
    if (rc.dataset == MT_REPLAY_GEN && !have_limit) rc.limit = 100000;
    /* from here on: one exit, which frees the configuration */
    int rc_exit = 0;
    mt_config_t cfg;
    mt_config_csv_t icsv;
    memset(&icsv, 0, sizeof(icsv));
    mt_replay_t *r = NULL;
    char err[512];
    if (mt_config_init(&cfg) != MT_OK) {
        rc_exit = 1;
        goto out;
    }
    if (rc.dataset == MT_REPLAY_CSV &&
        (rc_exit = replay_csv_config(config, sets, nsets, &cfg, &icsv, &rc.csv)))
        goto out;
    if (mt_replay_config_validate(&rc, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith: replay: %s\n", err);
        rc_exit = 2;
        goto out;
    }
    rc.bad_row_cb = replay_bad_row;
    rc.bad_row_opaque = &sink;
    run.progress_interval_ms = (uint32_t)(progress_s * 1000);
    run.progress = replay_progress;
    run.stop = stop;

    mt_err_t e = mt_replay_open(&rc, &r, err, sizeof(err));
    if (e) {
        /* csv: a column that is not in the file is the configuration's fault: exit 2 */
        fprintf(stderr, "monolith: replay: %s (%s)%s%s\n", err[0] ? err : "cannot open",
                mt_strerror(e), e == MT_CONFIG && config ? ": check [input] in " : "",
                e == MT_CONFIG && config ? config : "");
        rc_exit = e == MT_CONFIG ? 2 : 1;
        goto out;
    }
    if (kafka && mt_kafka_producer_create(kafka, kconf, &sink.p, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith: replay: Kafka producer on %s: %s\n", kafka, err);
        rc_exit = 1;
        goto out;
    }

    mt_replay_totals_t t;
    e = mt_replay_run(r, &run, replay_sink, &sink, &t);
    if (e) {
        fprintf(stderr, "monolith: replay: stopped: %s\n", mt_strerror(e));
        rc_exit = 1;
    }
    uint64_t delivered = 0, failed = 0;
    if (sink.p) {
        mt_err_t fe = mt_kafka_producer_flush(sink.p, 120000);
        mt_kafka_producer_counts(sink.p, &delivered, &failed);
        if (fe != MT_OK || delivered != t.impressions + t.actions) {
            fprintf(stderr,
                    "monolith: replay: %" PRIu64 " of %" PRIu64 " messages delivered, %" PRIu64
                    " failed (%s)\n",
                    delivered, t.impressions + t.actions, failed, mt_strerror(fe));
            rc_exit = 1;
        }
    }
    const mt_replay_stats_t *st = mt_replay_stats(r);
    if (fflush(stdout) != 0) rc_exit = 1;
    printf("{\"dataset\":\"%s\",\"impressions\":%" PRIu64 ",\"actions\":%" PRIu64
           ",\"requests\":%" PRIu64 ",\"rows\":%" PRIu64 ",\"bad_rows\":%" PRIu64
           ",\"clicks_not_shown\":%" PRIu64 ",\"impression_bytes\":%" PRIu64
           ",\"action_bytes\":%" PRIu64 ",\"first_event_ms\":%" PRId64 ",\"last_event_ms\":%" PRId64
           ",\"max_pending_actions\":%" PRIu64 ",\"kafka\":%s,\"delivered\":%" PRIu64
           ",\"failed\":%" PRIu64 ",\"wall_s\":%.3f,\"events_per_s\":%.0f}\n",
           dataset, t.impressions, t.actions,
           rc.dataset == MT_REPLAY_GEN ? t.impressions : st->requests, st->rows, st->bad_rows,
           st->clicks_not_shown, t.impression_bytes, t.action_bytes, t.first_event_ms,
           t.last_event_ms, st->max_pending_actions, sink.p ? "true" : "false", delivered, failed,
           t.wall_s, t.wall_s > 0 ? (double)(t.impressions + t.actions) / t.wall_s : 0.0);
    fprintf(stderr,
            "monolith: replay: %s: %" PRIu64 " impressions (%" PRIu64 " bytes) to %s, %" PRIu64
            " actions (%" PRIu64 " bytes) to %s, %" PRIu64 " bad rows, %.1f s\n",
            dataset, t.impressions, t.impression_bytes, sink.p ? sink.features : "(dry run)",
            t.actions, t.action_bytes, sink.p ? sink.actions : "(dry run)", st->bad_rows, t.wall_s);
    if (fflush(stdout) != 0) rc_exit = 1;
out:
    mt_kafka_producer_destroy(sink.p);
    mt_replay_destroy(r);
    mt_config_csv_free(&icsv);
    mt_config_free(&cfg);
    return rc_exit;
}

int mt_cli_run(int argc, char **argv, const volatile int *stop) {
    if (argc < 2) return usage();
    if (!strcmp(argv[1], "replay")) return cmd_replay(argc - 2, argv + 2, stop);
    mt_rpc_tls_config_t tls;
    memset(&tls, 0, sizeof(tls));
    const char *cmd = argv[1], *addr = NULL, *service = NULL, *token = NULL, *kafka = NULL,
               *topic = NULL, *group = NULL;
    char *ps = NULL, *user = NULL;
    const char *request_id = NULL;
    char **cands = calloc((size_t)argc, sizeof(char *));
    int ncands = 0;
    int train = 0;
    uint64_t id = 0, examples = 100000;
    double rate = 0;
    mt_gen_config_t gc;
    mt_gen_config_init(&gc);
    char **rest = calloc((size_t)argc, sizeof(char *));
    int nrest = 0;
    if (!rest || !cands) {
        free(rest);
        free(cands);
        return 1;
    }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--addr") && has)
            addr = argv[++i];
        else if (!strcmp(a, "--ps") && has)
            ps = argv[++i];
        else if (!strcmp(a, "--user") && has)
            user = argv[++i];
        else if (!strcmp(a, "--candidate") && has)
            cands[ncands++] = argv[++i];
        else if (!strcmp(a, "--request-id") && has)
            request_id = argv[++i];
        else if (!strcmp(a, "--service") && has)
            service = argv[++i];
        else if (!strcmp(a, "--token") && has)
            token = argv[++i];
        else if (!strcmp(a, "--tls-ca") && has)
            tls.ca_file = argv[++i];
        else if (!strcmp(a, "--tls-cert") && has)
            tls.cert_file = argv[++i];
        else if (!strcmp(a, "--tls-key") && has)
            tls.key_file = argv[++i];
        else if (!strcmp(a, "--tls-server-name") && has)
            tls.server_name = argv[++i];
        else if (!strcmp(a, "--kafka") && has)
            kafka = argv[++i];
        else if (!strcmp(a, "--topic") && has)
            topic = argv[++i];
        else if (!strcmp(a, "--group") && has)
            group = argv[++i];
        else if (!strcmp(a, "--rate") && has) {
            char *end;
            rate = strtod(argv[++i], &end);
            if (*end || !(rate > 0)) {
                free(rest);
                free(cands);
                return usage();
            }
        } else if (!strcmp(a, "--id") && has) {
            char *end;
            id = strtoull(argv[++i], &end, 10);
            if (*end) {
                free(rest);
                free(cands);
                return usage();
            }
        } else if (has && (!strcmp(a, "--examples") || !strcmp(a, "--seed") ||
                           !strcmp(a, "--users") || !strcmp(a, "--items") || !strcmp(a, "--ctr") ||
                           !strcmp(a, "--tasks") || !strcmp(a, "--sequence"))) {
            char *end;
            const char *v = argv[++i];
            if (!strcmp(a, "--ctr")) {
                gc.target_ctr = strtod(v, &end);
            } else {
                unsigned long long x = strtoull(v, &end, 10);
                if (!strcmp(a, "--examples"))
                    examples = x;
                else if (!strcmp(a, "--seed"))
                    gc.seed = x;
                else if (!strcmp(a, "--users"))
                    gc.num_users = x;
                else if (!strcmp(a, "--tasks")) /* 2: a conversion label after the click */
                    gc.tasks = x <= 2 ? (uint32_t)x : 0;
                else if (!strcmp(a, "--sequence")) /* L: the recent clicks, slot 7 */
                    gc.sequence_length = x <= UINT32_MAX ? (uint32_t)x : UINT32_MAX;
                else
                    gc.num_items = x;
            }
            if (*end || !*v) {
                fprintf(stderr, "monolith: %s: '%s' is not a number\n", a, v);
                free(rest);
                free(cands);
                return 2;
            }
        } else if (!strcmp(a, "--train"))
            train = 1;
        else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "monolith: unknown option %s\n", a);
            free(rest);
            free(cands);
            return usage();
        } else
            rest[nrest++] = argv[i];
    }
    tls.enabled = tls.ca_file || tls.cert_file || tls.key_file || tls.server_name;
    if (tls.enabled && !tls.ca_file) {
        fprintf(stderr, "monolith: --tls-cert, --tls-key and --tls-server-name need --tls-ca\n");
        free(rest);
        free(cands);
        return usage();
    }
    if (tls.enabled) {
        char err[512];
        if (mt_rpc_tls_check(&tls, 0, err, sizeof(err)) != MT_OK) {
            fprintf(stderr, "monolith: %s\n", err);
            free(rest);
            free(cands);
            return 2;
        }
    }
    int rc;
    if (!strcmp(cmd, "health") && addr && !nrest)
        rc = cmd_health(&tls, addr, service);
    else if (!strcmp(cmd, "stats") && addr && !nrest)
        rc = cmd_stats(&tls, addr);
    else if (!strcmp(cmd, "snapshot") && addr && !nrest)
        rc = cmd_snapshot(&tls, addr, token, id);
    else if (!strcmp(cmd, "offsets") && kafka && group && !nrest)
        rc = cmd_offsets(kafka, group, topic ? topic : "examples");
    else if (!strcmp(cmd, "gen") && !nrest)
        rc = cmd_gen(examples, &gc, kafka, topic, rate);
    else if (!strcmp(cmd, "predict") && addr && !nrest)
        rc = cmd_predict(&tls, addr, request_id, user, cands, ncands);
    else if (!strcmp(cmd, "lookup") && (ps || addr)) {
        char *list = strdup(ps ? ps : addr);
        rc = list ? cmd_lookup(&tls, list, train, rest, nrest) : 1;
        free(list);
    } else
        rc = usage();
    free(rest);
    free(cands);
    return rc;
}
