/*
 * loadgen.h - the users of the closed loop, as a library (monolith-loadgen is a thin main
 * over it: signals, flags). A run asks serving replicas to rank pages of candidates drawn
 * from the synthetic ground truth (mt/gen.h), draws the users' clicks (and conversions) from
 * the hidden model's true probabilities, produces them to Kafka `actions`, and measures each
 * target's AUC per window against the same clicks, beside the truth's. loadgen/src/loadgen.c
 * has the protocol; the README's closed loop, the measurements.
 *
 * Ownership: the options' strings are borrowed for the run. Thread safety: a run starts
 * its own threads (workers, a click producer) and joins them before it returns; distinct
 * runs share nothing. mt_loadgen_auc() is pure.
 */
#ifndef MT_LOADGEN_H
#define MT_LOADGEN_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "mt/gen.h"
#include "mt/rpc.h"

#define MT_LOADGEN_MAX_TARGETS 8

typedef struct mt_loadgen mt_loadgen_t; /* a run's state (loadgen.c) */

/* A serving target: host:port, or a file where its port (or host:port) will appear. */
typedef struct mt_loadgen_target_spec {
    char name[32];
    char addr[256];      /* empty: port_file */
    char port_file[256]; /* --serving @FILE */
} mt_loadgen_target_spec_t;

/* What the flags set (mt_loadgen_parse_args(); --help lists them with their defaults). */
typedef struct mt_loadgen_opts {
    const char *kafka, *actions_topic, *series_path, *report_path, *latency_path;
    double rate, duration_s, window_s, time_scale, progress_s, latency_interval_s;
    uint32_t k, inflight;
    int64_t deadline_ms, click_delay_ms;
    double conversion_rate;      /* --conversions: 0 = none */
    int64_t conversion_delay_ms; /* after the click */
    mt_rpc_tls_config_t tls;     /* --tls-*: the serving targets' TLS (docs/security.md) */
    mt_gen_config_t gen;
    mt_loadgen_target_spec_t targets[MT_LOADGEN_MAX_TARGETS]; /* [0]: the primary */
    uint32_t ntargets;
} mt_loadgen_opts_t;

/* A score and its label (0 or 1). */
typedef struct mt_loadgen_scored {
    float score;
    float label;
} mt_loadgen_scored_t;

/** Fills @p o from the command line (argv[0] is the program), defaults first, and checks
 *  it (values in range, at least one --serving, TLS files, the generator's configuration).
 *  @returns 0, or -1 after a message (or the usage) on stderr: exit status 2. */
int mt_loadgen_parse_args(mt_loadgen_opts_t *o, int argc, char **argv);

/** Runs the loop for o->duration_s (or until *stop becomes non-zero; @p stop may be NULL):
 *  waits up to 120 s for the primary to answer Health SERVING, sends, closes windows,
 *  prints progress on stderr and the JSON report on stdout (and to o->report_path).
 *  @returns 0, or 1: no request answered by the primary, clicks that could not be
 *  delivered, a file that cannot be written, or the primary never serving. */
int mt_loadgen_run(const mt_loadgen_opts_t *o, volatile sig_atomic_t *stop);

/** Exact AUC of @p n pairs (Mann-Whitney; ties get their average rank), with their log loss
 *  (scores clamped to [1e-7, 1 - 1e-7]), mean score and share of positives. Sorts @p v by
 *  score. @returns NAN without both classes (and the three NAN when n is 0). */
double mt_loadgen_auc(mt_loadgen_scored_t *v, size_t n, double *logloss, double *mean, double *ctr);

#endif /* MT_LOADGEN_H */
