/*
 * testutil_ps.h - PS shards served in the test process, as the in-process cluster tests
 * build them (tests/unit/ps/test_ckpt.c, tests/e2e/test_ps_cluster.c): a shard's
 * configuration over a small table, an rpc server for a shard on 127.0.0.1, and a client of
 * the shards. Each test keeps its own cluster struct and adds what it needs (stores, a
 * reference table, limits).
 *
 * Header-only (static inline), like tests/unit/rpc/tls_certs.h: test_ps_ckpt includes it
 * from its own folder and needs no extra source in its cmake entry; test_e2e_ps_cluster
 * gets this folder on its include path. The helpers assert with Criterion (cr_assert): call
 * them from the test's thread.
 */
#ifndef MT_TESTUTIL_PS_H
#define MT_TESTUTIL_PS_H

#include <criterion/criterion.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mt/ps.h"
#include "mt/psclient.h"
#include "mt/rpc.h"
#include "mt/table.h"

/* The size of an "127.0.0.1:<port>" address buffer. */
#define TU_PS_ADDR_LEN 64

/* @p pc for shard @p shard of @p num_shards over the @p nslots @p slots (borrowed: they must
 * outlive the shard): a small table (4 table shards, a 64 KiB filter, 4096 change-log
 * entries) and one follow Sync stream at a time; the rest as mt_ps_config_init() sets it. */
static inline void tu_ps_config(mt_ps_config_t *pc, uint32_t shard, uint32_t num_shards,
                                mt_table_slot_config_t *slots, size_t nslots) {
    mt_ps_config_init(pc);
    pc->shard = shard;
    pc->num_shards = num_shards;
    pc->table.slots = slots;
    pc->table.nslots = nslots;
    pc->table.shards_log2 = 2;
    pc->table.filter_bytes = 1 << 16;
    pc->table.changelog_entries = 1 << 12;
    pc->sync_max_followers = 1;
}

/*
 * Serves @p ps on a new rpc server with @p threads workers, @p max_message_bytes (0: the
 * default) and listening on @p listen (NULL: the default, 127.0.0.1 on a free port).
 * @p addr (NULL: not wanted; else TU_PS_ADDR_LEN bytes) receives "127.0.0.1:<port>".
 * Asserts that every step succeeds. A test of the answer limit sets the shard's
 * mt_ps_config_t.max_message_bytes to the same value (as monolith-ps does). @returns the
 * server (mt_rpc_server_destroy before mt_ps_destroy).
 */
static inline mt_rpc_server_t *tu_ps_serve(mt_ps_t *ps, uint32_t threads,
                                           uint32_t max_message_bytes, const char *listen,
                                           char *addr) {
    mt_rpc_server_config_t sc;
    mt_rpc_server_config_init(&sc);
    sc.threads = threads;
    if (max_message_bytes) sc.max_message_bytes = max_message_bytes;
    if (listen) sc.listen = listen;
    mt_rpc_server_t *srv = NULL;
    cr_assert_eq(mt_rpc_server_create(&sc, &srv), MT_OK);
    cr_assert_eq(mt_ps_register(ps, srv), MT_OK);
    int port = 0;
    cr_assert_eq(mt_rpc_server_start(srv, &port), MT_OK);
    if (addr) snprintf(addr, TU_PS_ADDR_LEN, "127.0.0.1:%d", port);
    return srv;
}

/* A client (default configuration) of the @p num_shards shards at @p addr[0..num_shards),
 * shard i at addr[i]. Asserts that it is created. @returns it (mt_psc_destroy). */
static inline mt_psc_t *tu_psc_connect(char (*addr)[TU_PS_ADDR_LEN], uint32_t num_shards) {
    const char *addrs[16];
    cr_assert_leq(num_shards, 16);
    for (uint32_t i = 0; i < num_shards; i++)
        addrs[i] = addr[i];
    mt_psc_config_t cc;
    mt_psc_config_init(&cc);
    cc.addrs = addrs;
    cc.num_shards = num_shards;
    mt_psc_t *client = NULL;
    cr_assert_eq(mt_psc_create(&cc, &client), MT_OK);
    return client;
}

#endif /* MT_TESTUTIL_PS_H */
