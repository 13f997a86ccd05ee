/*
 * bench_serving.h - calls on a monolith-serving replica that the serving benchmarks share
 * (serving_bench, fanout_bench).
 */
#ifndef MT_BENCH_SERVING_H
#define MT_BENCH_SERVING_H

#include <stdint.h>

#include "mt/rpc.h"

/** 1 if the replica behind @p ch has a row for @p fid (Lookup), 0 if not, -1 on error. */
int mt_bench_serving_served(mt_rpc_channel_t *ch, uint64_t fid);

#endif /* MT_BENCH_SERVING_H */
