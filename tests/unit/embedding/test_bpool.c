/*
 * test_bpool.c - the bucket pool (embedding/src/bpool.c): storage of every size is aligned,
 * distinct and inside a 2 MiB block of its own size; blocks go back when their last slot
 * is freed (parts growing in step leave no old arrays behind); the table's bucket arrays
 * all live in the pool and its byte count follows them.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mt/table.h"
#include "table_int.h"

#define BLOCK ((uintptr_t)MT__ARENA_BLOCK)

Test(bpool, sizes_are_aligned_distinct_and_given_back) {
    mt__bpool_t bp;
    mt__bpool_init(&bp);
    enum { PER = 40 };
    void *p[MT__BPOOL_KLASSES + 2][PER];
    for (unsigned k = 0; k < MT__BPOOL_KLASSES + 2; k++) { /* up to 4 MiB: own allocations */
        size_t bytes = (size_t)MT__BPOOL_MIN << k;
        int n = bytes >= (1u << 20) ? 3 : PER;
        for (int i = 0; i < n; i++) {
            p[k][i] = mt__bpool_alloc(&bp, bytes);
            cr_assert_not_null(p[k][i]);
            cr_assert_eq((uintptr_t)p[k][i] % 64, 0, "storage of %zu bytes not 64-aligned", bytes);
            if (bytes < BLOCK) /* a slot never crosses its block */
                cr_assert_eq((uintptr_t)p[k][i] / BLOCK, ((uintptr_t)p[k][i] + bytes - 1) / BLOCK);
            memset(p[k][i], (int)(k + 1), bytes);
        }
    }
    /* Nothing overlapped: every slot still holds its own pattern. */
    for (unsigned k = 0; k < MT__BPOOL_KLASSES + 2; k++) {
        size_t bytes = (size_t)MT__BPOOL_MIN << k;
        int n = bytes >= (1u << 20) ? 3 : PER;
        for (int i = 0; i < n; i++) {
            const unsigned char *c = p[k][i];
            cr_assert(c[0] == k + 1 && c[bytes - 1] == k + 1, "slot %u/%d overwritten", k, i);
        }
    }
    cr_assert_gt(mt__bpool_bytes(&bp), 0);
    for (unsigned k = 0; k < MT__BPOOL_KLASSES + 2; k++) {
        size_t bytes = (size_t)MT__BPOOL_MIN << k;
        int n = bytes >= (1u << 20) ? 3 : PER;
        for (int i = 0; i < n; i++)
            mt__bpool_free(&bp, p[k][i], bytes);
    }
    cr_assert_eq(mt__bpool_bytes(&bp), 0, "%llu bytes kept after every free",
                 (unsigned long long)mt__bpool_bytes(&bp));
    cr_assert_eq(bp.n, 0);
    mt__bpool_destroy(&bp);
}

/* 1,024 parts grow from 4 KiB to 8 KiB arrays one after another: when every 4 KiB array is
 * freed, only the 8 KiB arrays' blocks remain, and freed slots are reused first. */
Test(bpool, parts_growing_in_step_leave_no_old_blocks) {
    mt__bpool_t bp;
    mt__bpool_init(&bp);
    enum { PARTS = 1024 };
    static void *small[PARTS], *big[PARTS];
    for (int i = 0; i < PARTS; i++)
        cr_assert_not_null(small[i] = mt__bpool_alloc(&bp, 4096));
    cr_assert_eq(mt__bpool_bytes(&bp), 2 * BLOCK, "1,024 x 4 KiB is 2 blocks: %llu bytes",
                 (unsigned long long)mt__bpool_bytes(&bp));
    for (int i = 0; i < PARTS; i++) {
        cr_assert_not_null(big[i] = mt__bpool_alloc(&bp, 8192));
        mt__bpool_free(&bp, small[i], 4096);
    }
    cr_assert_eq(mt__bpool_bytes(&bp), 4 * BLOCK, "after the grow: %llu bytes, want 4 blocks",
                 (unsigned long long)mt__bpool_bytes(&bp));
    /* A freed slot in a partly used block is handed out again before a new block. */
    void *again = big[17];
    mt__bpool_free(&bp, big[17], 8192);
    big[17] = mt__bpool_alloc(&bp, 8192);
    cr_assert_eq(big[17], again);
    cr_assert_eq(mt__bpool_bytes(&bp), 4 * BLOCK);
    for (int i = 0; i < PARTS; i++)
        mt__bpool_free(&bp, big[i], 8192);
    cr_assert_eq(mt__bpool_bytes(&bp), 0);
    mt__bpool_destroy(&bp);
}

/* A table grown to 300,000 rows over 1,024 parts: every part's buckets are in the pool's
 * 2 MiB blocks, and the table counts the pool (its arrays, not the ones it grew out of). */
Test(bpool, table_buckets_live_in_the_pool) {
    mt_table_slot_config_t s;
    mt_table_slot_config_init(&s, 1, 8);
    mt_table_config_t c;
    mt_table_config_init(&c);
    c.slots = &s;
    c.nslots = 1;
    mt_table_t *t;
    cr_assert_eq(mt_table_create(&c, &t), MT_OK);
    enum { N = 300000, B = 1000 };
    uint64_t *ids = malloc(N * sizeof(uint64_t));
    float *out = malloc(B * 8 * sizeof(float));
    for (uint64_t i = 0; i < N; i++)
        ids[i] = MT_FID_MAKE(1, i * 0x9E3779B97F4A7C15ull);
    for (size_t i = 0; i < N; i += B)
        cr_assert_eq(mt_table_lookup(t, ids + i, B, out, B * 8, NULL, MT_TABLE_TRAIN, 1, NULL),
                     MT_OK);
    mt_table_stats_t st;
    mt_table_stats(t, &st);
    cr_assert_eq(st.rows, N);
    uint64_t in_use = 0;
    for (uint32_t i = 0; i < t->nparts; i++) {
        const mt__barray_t *a = atomic_load(&t->parts[i].arr);
        uint64_t bytes = (a->mask + 1) * sizeof(mt__bucket_t);
        in_use += bytes;
        cr_assert_eq((uintptr_t)a->b % 64, 0);
        cr_assert_eq(atomic_load(&t->parts[i].bk_hint), a->b, "part %u: stale bucket hint", i);
        if (bytes < BLOCK) {
            pthread_mutex_lock(&t->bpool.lock);
            size_t j;
            for (j = 0; j < t->bpool.n; j++)
                if ((uintptr_t)t->bpool.blocks[j].base == ((uintptr_t)a->b & ~(BLOCK - 1))) break;
            cr_assert_lt(j, t->bpool.n, "part %u's buckets are in no block of the pool", i);
            cr_assert_eq((size_t)MT__BPOOL_MIN << t->bpool.blocks[j].klass, bytes);
            pthread_mutex_unlock(&t->bpool.lock);
        }
    }
    uint64_t pool = mt__bpool_bytes(&t->bpool);
    cr_assert_geq(pool, in_use);
    /* The arrays the parts grew out of were given back: no block is empty, and no block is
     * of a size that no part uses any more. */
    unsigned used_klass = 0;
    for (uint32_t i = 0; i < t->nparts; i++) {
        const mt__barray_t *a = atomic_load(&t->parts[i].arr);
        uint64_t bytes = (a->mask + 1) * sizeof(mt__bucket_t);
        for (unsigned k = 0; k < MT__BPOOL_KLASSES; k++)
            if (((uint64_t)MT__BPOOL_MIN << k) == bytes) used_klass |= 1u << k;
    }
    for (size_t j = 0; j < t->bpool.n; j++) {
        cr_assert_gt(t->bpool.blocks[j].used, 0, "block %zu is empty and kept", j);
        cr_assert(used_klass & (1u << t->bpool.blocks[j].klass),
                  "block %zu holds %u-byte arrays that no part uses", j,
                  MT__BPOOL_MIN << t->bpool.blocks[j].klass);
    }
    cr_assert_geq(st.bytes_buckets, pool);
    free(ids);
    free(out);
    mt_table_destroy(t);
}
