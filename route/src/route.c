/*
 * route.c - the routing hash (mt/route.h). The fid is hashed as its 8 little-endian bytes
 * so that the result does not depend on the host's byte order.
 */
#include "mt/route.h"

#include <xxhash.h>

uint32_t mt_route_shard_of(uint64_t fid, uint32_t num_shards) {
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(fid >> (8 * i));
    return num_shards <= 1 ? 0 : (uint32_t)(XXH3_64bits(le, 8) % num_shards);
}
