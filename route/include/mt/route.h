/*
 * route.h - the routing contract of the sharded parameter server: which shard owns a
 * feature id. The PS shards (ps/, which refuse ids of another shard), the client library
 * (psclient/, which splits requests by shard) and the serving replicas (serving/, which
 * keep each shard's rows apart) all route with this one function, so that they cannot
 * disagree; none of them needs another's headers for it.
 *
 * Contract: fid -> shard = XXH3_64bits of the fid's 8 little-endian bytes, modulo
 * num_shards (0 when num_shards <= 1). Changing it moves every row to another shard:
 * checkpoints written under one rule cannot be served under another.
 *
 * Thread safety: a pure function, callable from any thread.
 */
#ifndef MT_ROUTE_H
#define MT_ROUTE_H

#include <stdint.h>

/**
 * The shard that owns @p fid among @p num_shards.
 * @param[in] fid         the feature id (slot and hash, see mt/table.h)
 * @param[in] num_shards  the shard count; 0 or 1: everything is shard 0
 * @returns the shard, < num_shards (0 when num_shards <= 1)
 */
uint32_t mt_route_shard_of(uint64_t fid, uint32_t num_shards);

#endif /* MT_ROUTE_H */
