/*
 * monolith - the operators' command-line tool.
 *
 *   monolith health   --addr HOST:PORT [--service NAME]
 *   monolith stats    --addr HOST:PORT
 *   monolith lookup   --ps HOST:PORT[,HOST:PORT...] [--train] FID...
 *   monolith snapshot --addr HOST:PORT [--token TOKEN] [--id N]
 *   monolith gen      [--examples N] [--seed S] [--users U] [--items I] [--ctr P]
 *                     [--kafka BOOTSTRAP [--topic examples] [--rate EX_PER_S]]
 *
 * gen writes the synthetic click stream (data/gen: a hidden ground-truth model, Zipf
 * popularity, new ids, drift) to stdout as TSV with a header: label, timestamp_ms, then one
 * column per slot (user, item, segment, category, hour, tags) holding the ids' values
 * (tags: comma-separated). The generic CSV/TSV reader reads it back. With --kafka it
 * produces monolith.v1.Example protobufs to the topic instead (key = request id
 * "gen-<seed>-<n>"): a stream monolith-trainer --online trains on without a joiner;
 * --rate paces it (examples per second; default: as fast as the broker takes them).
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
#include "mt/example_pb.h"
#include "mt/gen.h"
#include "mt/kafka.h"
#include "mt/psclient.h"
#include "mt/rpc.h"
#include "mt/table.h"

#define DEADLINE_MS 10000

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
            "       monolith snapshot --addr HOST:PORT [--token TOKEN] [--id N]\n"
            "       monolith gen      [--examples N] [--seed S] [--users U] [--items I]"
            " [--ctr P]\n"
            "                         [--kafka BOOTSTRAP [--topic examples] [--rate EX_PER_S]]\n"
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
static int call(const char *addr, const char *path, const uint8_t *req, size_t len, uint8_t **resp,
                size_t *rlen, const char *what) {
    mt_rpc_channel_t *ch;
    mt_rpc_client_config_t cc;
    mt_rpc_client_config_init(&cc);
    cc.retries = 1;
    if (mt_rpc_channel_create(addr, &cc, &ch) != MT_OK) {
        fprintf(stderr, "monolith: bad address %s\n", addr);
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

static int cmd_health(const char *addr, const char *service) {
    Grpc__Health__V1__HealthCheckRequest r = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    r.service = (char *)(service ? service : "");
    uint8_t buf[300];
    if (grpc__health__v1__health_check_request__get_packed_size(&r) > sizeof(buf)) return usage();
    size_t len = grpc__health__v1__health_check_request__pack(&r, buf);
    uint8_t *resp = NULL;
    size_t rlen = 0;
    int rc = call(addr, "/grpc.health.v1.Health/Check", buf, len, &resp, &rlen, "health");
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

static int cmd_stats(const char *addr) {
    uint8_t *resp = NULL;
    size_t rlen = 0;
    int rc = call(addr, "/monolith.v1.ParameterServer/Stats", NULL, 0, &resp, &rlen, "stats");
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
           ",\"dense_version\":%" PRIu64 ",\"slots\":[",
           s->shard, s->num_shards, s->incarnation, s->rows, s->capacity, s->load_factor,
           s->bytes_total, s->version, s->evictions, s->filtered, s->dense_version);
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

static int cmd_snapshot(const char *addr, const char *token, uint64_t id) {
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
    if (mt_rpc_channel_create(addr, NULL, &ch) != MT_OK) {
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
           ",\"seconds\":%.3f}\n",
           s->meta ? s->meta->checkpoint_id : 0, s->meta ? s->meta->shard : 0, s->rows, s->bytes,
           s->seconds);
    monolith__v1__snapshot_response__free_unpacked(s, NULL);
    return 0;
}

static int cmd_lookup(char *ps, int train, char **fid_args, int nfids) {
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

/* monolith gen --kafka: the stream as monolith.v1.Example protobufs (key = request id
 * "gen-<seed>-<n>") to a topic, ready for monolith-trainer --online without a joiner. */
static int gen_to_kafka(uint64_t examples, const mt_gen_config_t *gc, const char *bootstrap,
                        const char *topic, double rate) {
    char err[512];
    mt_kafka_producer_t *p;
    if (mt_kafka_producer_create(bootstrap, NULL, &p, err, sizeof(err)) != MT_OK) {
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
    printf("label\ttimestamp_ms\tuser\titem\tsegment\tcategory\thour\ttags\n");
    for (uint64_t done = 0; done < examples && !rc;) {
        size_t n = examples - done < 4096 ? (size_t)(examples - done) : 4096;
        if (mt_gen_next(g, &b, n, NULL) != MT_OK) {
            rc = 1;
            break;
        }
        for (size_t i = 0; i < b.n; i++) {
            printf("%d\t%" PRId64, b.labels[i] > 0.5f, b.timestamps_ms[i]);
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

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    const char *cmd = argv[1], *addr = NULL, *service = NULL, *token = NULL, *kafka = NULL,
               *topic = NULL;
    char *ps = NULL;
    int train = 0;
    uint64_t id = 0, examples = 100000;
    double rate = 0;
    mt_gen_config_t gc;
    mt_gen_config_init(&gc);
    char **rest = calloc((size_t)argc, sizeof(char *));
    int nrest = 0;
    if (!rest) return 1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--addr") && has)
            addr = argv[++i];
        else if (!strcmp(a, "--ps") && has)
            ps = argv[++i];
        else if (!strcmp(a, "--service") && has)
            service = argv[++i];
        else if (!strcmp(a, "--token") && has)
            token = argv[++i];
        else if (!strcmp(a, "--kafka") && has)
            kafka = argv[++i];
        else if (!strcmp(a, "--topic") && has)
            topic = argv[++i];
        else if (!strcmp(a, "--rate") && has) {
            char *end;
            rate = strtod(argv[++i], &end);
            if (*end || !(rate > 0)) {
                free(rest);
                return usage();
            }
        } else if (!strcmp(a, "--id") && has) {
            char *end;
            id = strtoull(argv[++i], &end, 10);
            if (*end) {
                free(rest);
                return usage();
            }
        } else if (has && (!strcmp(a, "--examples") || !strcmp(a, "--seed") ||
                           !strcmp(a, "--users") || !strcmp(a, "--items") || !strcmp(a, "--ctr"))) {
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
                else
                    gc.num_items = x;
            }
            if (*end || !*v) {
                fprintf(stderr, "monolith: %s: '%s' is not a number\n", a, v);
                free(rest);
                return 2;
            }
        } else if (!strcmp(a, "--train"))
            train = 1;
        else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "monolith: unknown option %s\n", a);
            free(rest);
            return usage();
        } else
            rest[nrest++] = argv[i];
    }
    int rc;
    if (!strcmp(cmd, "health") && addr && !nrest)
        rc = cmd_health(addr, service);
    else if (!strcmp(cmd, "stats") && addr && !nrest)
        rc = cmd_stats(addr);
    else if (!strcmp(cmd, "snapshot") && addr && !nrest)
        rc = cmd_snapshot(addr, token, id);
    else if (!strcmp(cmd, "gen") && !nrest)
        rc = cmd_gen(examples, &gc, kafka, topic, rate);
    else if (!strcmp(cmd, "lookup") && (ps || addr)) {
        char *list = strdup(ps ? ps : addr);
        rc = list ? cmd_lookup(list, train, rest, nrest) : 1;
        free(list);
    } else
        rc = usage();
    free(rest);
    return rc;
}
