/*
 * bpool.c - where the table's bucket arrays live: 2 MiB blocks on transparent huge pages,
 * shared by the parts.
 *
 * A table has 2^shards_log2 parts (1,024 by default), each with its own bucket array, so
 * the arrays are small: 256 KiB each at 10M rows. Allocated one by one from malloc they sat
 * on 4 KiB pages (a huge page needs a whole aligned 2 MiB), and a lookup took a TLB miss
 * on nearly every bucket it read: measured on a 2-vCPU VM, 10M rows, one thread, lookups
 * of existing ids ran at 2.4-3.5M/s against 5.3-6.9M/s with the same arrays packed into
 * huge pages, and a small table in the same process slowed from 17M/s to 8-15M/s beside
 * the big one's page walks.
 *
 * Bucket storage sizes are powers of two (nbuckets * 64 bytes). Sizes below 2 MiB are
 * slots of a block that holds only that size (a slab per size); sizes of 2 MiB and up are
 * their own 2 MiB-aligned allocation. A block goes back to the allocator when its last
 * slot is freed: parts grow at about the same time, so the blocks of the size they grew
 * out of empty together and the pool does not keep the old arrays' memory.
 *
 * Thread-safety: every function takes pool->lock (allocations happen under a part's lock
 * during a grow, frees after a grace period from any thread); the lock is never held while
 * taking another.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "table_int.h"

/* A block's size class, from 0 (128 bytes) up: slot bytes = MT__BPOOL_MIN << klass. */
static unsigned klass_of(size_t bytes) {
    unsigned k = 0;
    while (((size_t)MT__BPOOL_MIN << k) < bytes)
        k++;
    return k;
}

void mt__bpool_init(mt__bpool_t *bp) {
    memset(bp, 0, sizeof(*bp));
    pthread_mutex_init(&bp->lock, NULL);
}

static void hint(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}

/* The first index whose block base is not below base (blocks sorted by base). */
static size_t lower_bound(const mt__bpool_t *bp, uintptr_t base) {
    size_t lo = 0, hi = bp->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)bp->blocks[mid].base < base)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Index of the block holding address p, or bp->n if none. */
static size_t block_find(const mt__bpool_t *bp, const void *p) {
    uintptr_t base = (uintptr_t)p & ~(uintptr_t)(MT__ARENA_BLOCK - 1);
    size_t i = lower_bound(bp, base);
    return i < bp->n && (uintptr_t)bp->blocks[i].base == base ? i : bp->n;
}

static inline int has_space(const mt__bblock_t *b) {
    return b->free != NULL || b->fresh > 0;
}

/* A new empty block of class k, inserted in order; @returns its index or bp->n on failure. */
static size_t block_add(mt__bpool_t *bp, unsigned k) {
    if (bp->n == bp->cap) {
        size_t cap = bp->cap ? 2 * bp->cap : 16;
        mt__bblock_t *nb = realloc(bp->blocks, cap * sizeof(*nb));
        if (!nb) return bp->n;
        bp->blocks = nb;
        bp->cap = cap;
    }
    char *base = aligned_alloc(MT__ARENA_BLOCK, MT__ARENA_BLOCK);
    if (!base) return bp->n;
    hint(base, MT__ARENA_BLOCK);
    size_t i = lower_bound(bp, (uintptr_t)base);
    memmove(&bp->blocks[i + 1], &bp->blocks[i], (bp->n - i) * sizeof(*bp->blocks));
    bp->blocks[i] = (mt__bblock_t){
        .base = base, .klass = k, .fresh = (uint32_t)(MT__ARENA_BLOCK / (MT__BPOOL_MIN << k))};
    bp->n++;
    bp->avail[k]++;
    bp->bytes += MT__ARENA_BLOCK;
    return i;
}

void *mt__bpool_alloc(mt__bpool_t *bp, size_t bytes) {
    assert(bytes >= MT__BPOOL_MIN && (bytes & (bytes - 1)) == 0);
    if (bytes >= MT__ARENA_BLOCK) {
        void *p = aligned_alloc(MT__ARENA_BLOCK, bytes);
        if (!p) return NULL;
        hint(p, bytes);
        pthread_mutex_lock(&bp->lock);
        bp->bytes += bytes;
        pthread_mutex_unlock(&bp->lock);
        return p;
    }
    unsigned k = klass_of(bytes);
    pthread_mutex_lock(&bp->lock);
    size_t i = bp->hint[k];
    if (i >= bp->n || bp->blocks[i].klass != k || !has_space(&bp->blocks[i])) {
        i = bp->n;
        if (bp->avail[k]) /* a block of this size has a freed slot: find it */
            for (i = 0; i < bp->n; i++)
                if (bp->blocks[i].klass == k && has_space(&bp->blocks[i])) break;
        if (i == bp->n) i = block_add(bp, k);
    }
    void *p = NULL;
    if (i < bp->n) {
        mt__bblock_t *b = &bp->blocks[i];
        if (b->free) {
            p = b->free;
            memcpy(&b->free, p, sizeof(void *));
        } else {
            p = b->base + (size_t)b->used_ever * bytes;
            b->used_ever++;
            b->fresh--;
        }
        b->used++;
        if (!has_space(b)) bp->avail[k]--;
        bp->hint[k] = i;
    }
    pthread_mutex_unlock(&bp->lock);
    return p;
}

void mt__bpool_free(mt__bpool_t *bp, void *p, size_t bytes) {
    if (!p) return;
    if (bytes >= MT__ARENA_BLOCK) {
        pthread_mutex_lock(&bp->lock);
        bp->bytes -= bytes;
        pthread_mutex_unlock(&bp->lock);
        free(p);
        return;
    }
    pthread_mutex_lock(&bp->lock);
    size_t i = block_find(bp, p);
    assert(i < bp->n && bp->blocks[i].klass == klass_of(bytes)); /* ownership: ours */
    mt__bblock_t *b = &bp->blocks[i];
    unsigned k = b->klass;
    assert(b->used > 0);
    if (--b->used == 0) {
        /* Its last array: give the whole block back. */
        if (has_space(b)) bp->avail[k]--;
        free(b->base);
        bp->bytes -= MT__ARENA_BLOCK;
        memmove(&bp->blocks[i], &bp->blocks[i + 1], (bp->n - i - 1) * sizeof(*bp->blocks));
        bp->n--;
    } else {
        if (!has_space(b)) bp->avail[k]++;
        memcpy(p, &b->free, sizeof(void *));
        b->free = p;
    }
    pthread_mutex_unlock(&bp->lock);
}

uint64_t mt__bpool_bytes(mt__bpool_t *bp) {
    pthread_mutex_lock(&bp->lock);
    uint64_t n = bp->bytes;
    pthread_mutex_unlock(&bp->lock);
    return n;
}

void mt__bpool_destroy(mt__bpool_t *bp) {
    for (size_t i = 0; i < bp->n; i++)
        free(bp->blocks[i].base);
    free(bp->blocks);
    pthread_mutex_destroy(&bp->lock);
    memset(bp, 0, sizeof(*bp));
}
