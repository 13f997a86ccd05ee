/*
 * peers.h - sharded serving's peers, internal to mt_serving (docs/serving.md, "Sharded
 * serving"): which serving node to read a shard's rows from, and the reads.
 *
 * A sv_peers_t keeps one channel per peer address, a discovery thread that asks every peer
 * Serving/Shards every refresh_ms, and the route built from the answers: for each shard this
 * node does not hold, the peers that hold it synced. The route is immutable once published
 * (route_lock guards the pointer and the reference counts, a leaf lock), so a fetch never
 * waits for a discovery round.
 *
 * Thread safety: sv_peers_fetch(), sv_peers_render_metrics() and sv_peers_uncovered() may be
 * called from any thread, concurrently with each other and with the discovery thread; a
 * sv_fetch_ws_t belongs to one caller at a time. create / start / stop / destroy: one thread.
 * Lock order: state_lock (the peers' last answers) -> route_lock; neither is held across a
 * call on the network.
 */
#ifndef MT_SERVING_PEERS_H
#define MT_SERVING_PEERS_H

#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"
#include "mt/rpc.h"
#include "mt/strbuf.h"

typedef struct sv_peers sv_peers_t;
typedef struct sv_fetch_ws sv_fetch_ws_t;

typedef struct sv_peers_config {
    const char *const *addrs; /* borrowed during create */
    uint32_t n;
    uint32_t num_shards;
    const uint8_t *held; /* [num_shards]: 1 = this node holds the shard (borrowed: create) */
    uint32_t timeout_ms; /* deadline of a fetch's Lookups */
    uint32_t refresh_ms; /* discovery period */
    mt_rpc_tls_config_t tls;
    /* Called from the discovery thread after each round in which every shard not held here
     * had a peer (may be NULL). */
    void (*on_covered)(void *ud);
    void *ud;
} sv_peers_config_t;

/** @returns MT_OK, MT_CONFIG (a bad address or TLS file: logged), MT_NOMEM. */
mt_err_t sv_peers_create(const sv_peers_config_t *cfg, sv_peers_t **out);
/** Starts the discovery thread (a first round at once). @returns MT_OK or MT_NOMEM. */
mt_err_t sv_peers_start(sv_peers_t *p);
/** Stops and joins the discovery thread (a round in flight ends at its deadline). */
void sv_peers_stop(sv_peers_t *p);
void sv_peers_destroy(sv_peers_t *p);

/** One list of ids to read: n ids of dimension dim each, values into out[i * dim]; or, with
 *  offs ([n + 1]), id i's values of offs[i + 1] - offs[i] floats into out[offs[i]]. */
typedef struct sv_fetch_list {
    const uint64_t *ids;
    size_t n;
    uint32_t dim;
    float *out;
    const size_t *offs; /* NULL: every id of dim floats */
} sv_fetch_list_t;

/**
 * Reads the ids of @p lists whose shard is not held here from the peers (each id once per
 * peer, one Lookup per peer, in parallel, deadline timeout_ms) and writes their values into
 * the lists' out; ids of held shards are left untouched. A peer that fails (or a shard no
 * peer holds) leaves the route until the next discovery round finds it again.
 * @param[in,out] ws    the caller's scratch (created on first use; sv_fetch_ws_free())
 * @param zeros         on a failed peer or an uncovered shard: 1 = write zeros for its ids
 *                      and count them in *zero_fids, 0 = fail
 * @param meanwhile     NULL, or the caller's work, run once on this thread (with @p ud) while
 *                      the Lookups are in flight, always before a value is written to the
 *                      lists' out (with nothing to send, or on an early error: before the
 *                      return): a Predict's lookups of its own shards
 * @returns MT_OK, MT_UNAVAILABLE (!zeros: a peer failed or a shard has no peer; @p why names
 *          them), MT_NOMEM.
 */
mt_err_t sv_peers_fetch(sv_peers_t *p, sv_fetch_ws_t **ws, const sv_fetch_list_t *lists,
                        size_t nlists, int zeros, uint64_t *zero_fids, void (*meanwhile)(void *),
                        void *ud, char *why, size_t whylen);

void sv_fetch_ws_free(sv_fetch_ws_t *ws);

/** Shards not held here that no peer holds synced in the current route. */
uint32_t sv_peers_uncovered(sv_peers_t *p);

/** Appends the peers' metrics (per peer: up, Lookups, failures) to @p b. */
void sv_peers_render_metrics(sv_peers_t *p, mt_strbuf_t *b);

#endif /* MT_SERVING_PEERS_H */
