/*
 * table.c - the cuckoo hash parts, the lock-free read path and the write paths.
 *
 * Cuckoo hashing (Pagh & Rodler 2001), bucketized as in MemC3 / libcuckoo (Fan et al. 2013,
 * Li et al. 2014): every id may live in one of 4 slots of bucket b1 = h1 & mask or of
 * bucket b2 = h2 & mask, h1 and h2 being XXH3 with two seeds. With 4-slot buckets and two
 * choices the table fills to ~95% before an insert fails; we grow a part at max_load (0.9 by
 * default) or when a breadth-first search for a displacement path (at most MT__BFS_NODES
 * buckets, i.e. depth ~4) finds no free slot. The part index comes from the top bits of h1
 * and the buckets from its low bits, so they are independent.
 *
 * Concurrency (see docs/locking.md):
 *  - Writers take the part's mutex. Around any change that readers could observe half-done
 *    (placing or moving a key, changing an embedding, freeing a row), the writer makes the
 *    part's seq odd, then even again (a seqlock). Metadata only writers read (count, touch)
 *    changes without touching seq.
 *  - Readers take no lock: they read seq, the bucket array, the row, then seq again, and
 *    retry if it moved. Rows are never unmapped before mt_table_destroy(), so reading a row
 *    that was freed meanwhile is harmless: the seq check throws the copy away.
 *  - A grow builds the new bucket array beside the old one while holding the part's mutex;
 *    readers keep using the old array (unchanged) until the new pointer is published. The
 *    old array is freed after a grace period of the sleepable-RCU scheme below: readers
 *    count themselves in lanes[cpu].cnt[idx] for the current idx (once per chunk of a
 *    batch); the reclaimer flips idx and waits for the old idx's counters to reach zero.
 */
#include <errno.h>
#include <sys/mman.h>
#include <math.h>
#include <stddef.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "table_int.h"

#define MT__BFS_NODES  512
#define MT__READ_CHUNK 256 /* ids per reader grace-period section */
#ifndef MT__PREFETCH
#define MT__PREFETCH 8 /* pipeline stage distance of the batched lookup */
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* ============================== configuration ============================== */

void mt_table_slot_config_init(mt_table_slot_config_t *s, uint16_t slot, uint32_t dim) {
    memset(s, 0, sizeof(*s));
    s->slot = slot;
    s->dim = dim;
    s->init = MT_INIT_UNIFORM;
    s->init_scale = 0.01f;
    s->init_mean = 0.0f;
    s->init_seed = 0x6d6f6e6f6c697468ull;
    s->opt = MT_OPT_ADAGRAD;
    s->lr = 0.01f;
    s->eps = 1e-8f;
    s->init_accum = 0.1f;
    s->beta1 = 0.9f;
    s->beta2 = 0.999f;
    s->ftrl_beta = 1.0f;
    s->l1 = 0.0f;
    s->l2 = 0.0f;
    s->min_count = 0;
    s->ttl_s = 0;
    s->precision = MT_PREC_FP32;
}

void mt_table_config_init(mt_table_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->shards_log2 = 10;
    cfg->initial_rows = 0;
    cfg->max_load = 0.9;
    cfg->filter_bytes = 8u << 20;
    cfg->filter_depth = 4;
    cfg->changelog_entries = 1u << 20;
    cfg->hash_seed = 0x9ae16a3b2f90404full;
}

#define CFG_FAIL(...)                                                \
    do {                                                             \
        if (errbuf && errlen) snprintf(errbuf, errlen, __VA_ARGS__); \
        return MT_CONFIG;                                            \
    } while (0)

static int finite_pos(float x) {
    return x == x && x > 0.0f && x < 1e30f;
}

mt_err_t mt_table_config_validate(const mt_table_config_t *cfg, char *errbuf, size_t errlen) {
    if (!cfg) CFG_FAIL("config is NULL");
    if (!cfg->slots || cfg->nslots == 0) CFG_FAIL("slots: at least one slot is required");
    if (cfg->nslots > 65536) CFG_FAIL("slots: at most 65536 slots");
    if (cfg->shards_log2 > 16) CFG_FAIL("shards_log2: %u is out of range 0..16", cfg->shards_log2);
    if (!(cfg->max_load >= 0.5 && cfg->max_load <= 0.97))
        CFG_FAIL("max_load: %g is out of range 0.5..0.97", cfg->max_load);
    if (cfg->filter_depth < 1 || cfg->filter_depth > 8)
        CFG_FAIL("filter_depth: %u is out of range 1..8", cfg->filter_depth);
    uint64_t nparts = 1ull << cfg->shards_log2;
    if (cfg->changelog_entries && cfg->changelog_entries < 64 * nparts)
        CFG_FAIL("changelog_entries: %llu is below 64 per part (%llu); 0 turns tracking off",
                 (unsigned long long)cfg->changelog_entries, (unsigned long long)(64 * nparts));
    if (cfg->filter_bytes && cfg->filter_bytes < (uint64_t)cfg->filter_depth * 64 * nparts)
        CFG_FAIL("filter_bytes: %llu is below 64 counters per row per part",
                 (unsigned long long)cfg->filter_bytes);
    if (cfg->filter_bytes / nparts / cfg->filter_depth > UINT32_MAX)
        CFG_FAIL("filter_bytes: too large for this many parts");
    if (cfg->initial_rows > (1ull << 40)) CFG_FAIL("initial_rows: above 2^40");
    uint8_t *seen = calloc(65536, 1);
    if (!seen) return MT_NOMEM;
    for (size_t i = 0; i < cfg->nslots; i++) {
        const mt_table_slot_config_t *s = &cfg->slots[i];
        const char *bad = NULL;
        if (seen[s->slot])
            bad = "slot id appears twice";
        else if (s->dim < 1 || s->dim > MT_TABLE_MAX_DIM)
            bad = "dim out of range 1..1024";
        else if (s->init > MT_INIT_NORMAL)
            bad = "init: unknown initializer";
        else if (s->zero_tail > s->dim)
            bad = "zero_tail: above dim";
        else if (!(s->init_scale >= 0.0f && s->init_scale < 1e30f))
            bad = "init_scale: not finite";
        else if (s->init_mean != s->init_mean)
            bad = "init_mean: NaN";
        else if (s->opt > MT_OPT_ADAM)
            bad = "opt: unknown optimizer";
        else if (!finite_pos(s->lr))
            bad = "lr: must be > 0 and finite";
        else if (!(s->eps >= 0.0f && s->eps < 1.0f))
            bad = "eps: out of range [0, 1)";
        else if (s->opt == MT_OPT_ADAGRAD && !(s->init_accum >= 0.0f && s->init_accum < 1e30f))
            bad = "init_accum: must be >= 0";
        else if (s->opt == MT_OPT_ADAGRAD && s->init_accum == 0.0f && s->eps == 0.0f)
            bad = "init_accum and eps are both 0: division by zero";
        else if (s->opt == MT_OPT_ADAM && !(s->beta1 >= 0.0f && s->beta1 < 1.0f))
            bad = "beta1: out of range [0, 1)";
        else if (s->opt == MT_OPT_ADAM && !(s->beta2 >= 0.0f && s->beta2 < 1.0f))
            bad = "beta2: out of range [0, 1)";
        else if (s->opt == MT_OPT_ADAM && s->eps == 0.0f)
            bad = "eps: Adam needs eps > 0";
        else if (s->opt == MT_OPT_FTRL && !(s->ftrl_beta >= 0.0f && s->ftrl_beta < 1e30f))
            bad = "ftrl_beta: must be >= 0";
        else if (!(s->l1 >= 0.0f && s->l1 < 1e30f) || !(s->l2 >= 0.0f && s->l2 < 1e30f))
            bad = "l1/l2: must be >= 0";
        else if (s->min_count > 255)
            bad = "min_count: at most 255";
        else if (s->min_count > 1 && cfg->filter_bytes == 0)
            bad = "min_count > 1 needs filter_bytes > 0";
        else if (s->precision > MT_PREC_FP16)
            bad = "precision: unknown";
        if (bad) {
            free(seen);
            CFG_FAIL("slot %u: %s", s->slot, bad);
        }
        seen[s->slot] = 1;
    }
    free(seen);
    return MT_OK;
}

/* ============================== fp16 ============================== */

uint16_t mt_fp16_from_float(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exp = (x >> 23) & 0xFFu;
    uint32_t man = x & 0x7FFFFFu;
    if (exp == 0xFF) return (uint16_t)(sign | 0x7C00u | (man ? 0x200u | (man >> 13) : 0));
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7C00u); /* overflow: infinity */
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign; /* underflow: signed zero */
        man |= 0x800000u;                   /* subnormal half */
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t h = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* may carry into exp: correct */
    return (uint16_t)(sign | h);
}

float mt_fp16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, x;
    if (exp == 0) {
        if (man == 0) {
            x = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            x = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FFu) << 13);
        }
    } else if (exp == 31) {
        x = sign | 0x7F800000u | (man << 13);
    } else {
        x = sign | ((exp - 15 + 127) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

void mt__row_read_emb(const mt__slot_t *s, const void *row, float *out) {
    const char *e = row;
    if (s->cfg.precision == MT_PREC_FP32) {
        memcpy(out, e, s->cfg.dim * sizeof(float));
    } else {
        uint16_t h[MT_TABLE_MAX_DIM];
        memcpy(h, e, s->cfg.dim * sizeof(uint16_t));
        for (uint32_t i = 0; i < s->cfg.dim; i++)
            out[i] = mt_fp16_to_float(h[i]);
    }
}

void mt__row_write_emb(const mt__slot_t *s, void *row, const float *in) {
    char *e = row;
    if (s->cfg.precision == MT_PREC_FP32) {
        memcpy(e, in, s->cfg.dim * sizeof(float));
    } else {
        uint16_t *h = (uint16_t *)(void *)e;
        for (uint32_t i = 0; i < s->cfg.dim; i++)
            h[i] = mt_fp16_from_float(in[i]);
    }
}

/* ============================== hashing ============================== */

typedef struct hpair {
    uint64_t h1, h2;
} hpair_t;

static inline hpair_t hash_fid(const mt_table_t *t, uint64_t fid) {
    hpair_t h = {XXH3_64bits_withSeed(&fid, sizeof(fid), t->seed1),
                 XXH3_64bits_withSeed(&fid, sizeof(fid), t->seed2)};
    return h;
}

static inline uint32_t part_index(const mt_table_t *t, uint64_t h1) {
    return t->nparts > 1 ? (uint32_t)(h1 >> t->part_shift) : 0;
}

uint32_t mt__part_of(const mt_table_t *t, uint64_t fid) {
    return part_index(t, XXH3_64bits_withSeed(&fid, sizeof(fid), t->seed1));
}
uint32_t mt_table_parts_of(const mt_table_t *t, const uint64_t *fids, size_t n, uint32_t *parts) {
    for (size_t i = 0; i < n; i++)
        parts[i] = mt__part_of(t, fids[i]);
    return t->nparts;
}

/* Parts whose counts mt_table_part_order() keeps on its stack when the caller gives none. */
#define MT__ORDER_STACK_PARTS 1024

mt_err_t mt_table_part_order(const mt_table_t *t, const uint64_t *fids, size_t n, uint32_t *to,
                             uint32_t *count) {
    if (n > UINT32_MAX) return MT_INVALID;
    uint32_t on_stack[MT__ORDER_STACK_PARTS + 1], *cnt = count;
    if (!cnt && t->nparts > MT__ORDER_STACK_PARTS) {
        if (!(cnt = malloc((t->nparts + 1) * sizeof(uint32_t)))) return MT_NOMEM;
    } else if (!cnt) {
        cnt = on_stack;
    }
    /* counts at cnt[part + 1], then their prefix sums: cnt[part] is where the part's run
     * begins; to[] holds each id's part until it gets its place */
    memset(cnt, 0, (t->nparts + 1) * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) {
        to[i] = mt__part_of(t, fids[i]);
        cnt[to[i] + 1]++;
    }
    for (uint32_t p = 0; p < t->nparts; p++)
        cnt[p + 1] += cnt[p];
    for (size_t i = 0; i < n; i++)
        to[i] = cnt[to[i]]++;
    if (cnt != count && cnt != on_stack) free(cnt);
    return MT_OK;
}

static inline void bucket_pair(uint64_t mask, hpair_t h, uint64_t *b1, uint64_t *b2) {
    *b1 = h.h1 & mask;
    *b2 = h.h2 & mask;
    if (*b2 == *b1) *b2 = *b1 ^ 1;
}

/* ============================== grace periods ============================== */

static inline unsigned lane_of(void) {
    int c = sched_getcpu();
    return c < 0 ? 0 : (unsigned)c & (MT__LANES - 1);
}

static inline unsigned rcu_enter(mt_table_t *t, unsigned *lane) {
    unsigned l = lane_of();
    for (;;) {
        unsigned idx = atomic_load(&t->rcu_idx) & 1u;
        atomic_fetch_add(&t->lanes[l].cnt[idx], 1);
        if ((atomic_load(&t->rcu_idx) & 1u) == idx) {
            *lane = l;
            return idx;
        }
        atomic_fetch_sub(&t->lanes[l].cnt[idx], 1);
    }
}

static inline void rcu_exit(mt_table_t *t, unsigned lane, unsigned idx) {
    atomic_fetch_sub_explicit(&t->lanes[lane].cnt[idx], 1, memory_order_release);
}

static void rcu_synchronize(mt_table_t *t) {
    pthread_mutex_lock(&t->rcu_lock);
    unsigned idx = atomic_load(&t->rcu_idx) & 1u;
    atomic_store(&t->rcu_idx, idx ^ 1u);
    for (unsigned spins = 0;; spins++) {
        uint64_t sum = 0;
        for (unsigned l = 0; l < MT__LANES; l++)
            sum += atomic_load(&t->lanes[l].cnt[idx]);
        if (sum == 0) break;
        if (spins > 64)
            sched_yield();
        else
            cpu_relax();
    }
    pthread_mutex_unlock(&t->rcu_lock);
}

static inline uint64_t arr_bytes(const mt__barray_t *a) {
    return (a->mask + 1) * sizeof(mt__bucket_t);
}

static void arr_free(mt_table_t *t, mt__barray_t *a) {
    if (!a) return;
    mt__bpool_free(&t->bpool, a->b, arr_bytes(a));
    free(a);
}

void mt__retire(mt_table_t *t, mt__barray_t *old) {
    if (!old) return;
    rcu_synchronize(t);
    arr_free(t, old);
}

/* ============================== seqlock ============================== */

static inline void seq_write_begin(mt__part_t *p) {
    assert(MT__PART_LOCKED(p));
    uint64_t s = atomic_load_explicit(&p->seq, memory_order_relaxed);
    assert(!(s & 1)); /* writers do not nest: one holds the lock */
    atomic_store_explicit(&p->seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}

static inline void seq_write_end(mt__part_t *p) {
    uint64_t s = atomic_load_explicit(&p->seq, memory_order_relaxed);
    assert(s & 1);
    atomic_store_explicit(&p->seq, s + 1, memory_order_release);
}

/* ============================== chunk arena ============================== */

/* Slab chunks (16-64 KiB, aligned to their size) are carved from 2 MiB blocks that the
 * table takes from jemalloc and shares among its parts (arena_lock; a part needs a chunk
 * once per ~100 rows). Allocating every chunk from jemalloc directly cost 1.8x the table's
 * bytes in RSS with transparent huge pages (measured: 326 B/row against 176 B/row counted,
 * 10M rows): each aligned chunk left a partly used huge page behind. Blocks are only freed
 * by mt_table_destroy(), like the rows in them. */
/*
 * Asks for transparent huge pages (best effort) on the whole 2 MiB pieces of a big,
 * long-lived, randomly read block: the row arenas (and, in bpool.c, the bucket arrays'
 * blocks). Only these: jemalloc
 * runs with thp:default (mt/jemalloc_conf.h), because with thp:always the kernel refilled
 * freed small allocations as huge pages and the soak's RSS crept (docs/soak.md).
 */
static void huge_hint(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    uintptr_t a = ((uintptr_t)p + MT__ARENA_BLOCK - 1) & ~(uintptr_t)(MT__ARENA_BLOCK - 1);
    uintptr_t e = ((uintptr_t)p + bytes) & ~(uintptr_t)(MT__ARENA_BLOCK - 1);
    if (e > a) (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}

/* Appends block b of bs bytes to the table's blocks (arena_lock held, or at create). */
static int arena_add(mt_table_t *t, char *b, size_t bs) {
    if (t->arena_n == t->arena_cap) {
        size_t cap = t->arena_cap ? 2 * t->arena_cap : 64;
        void **nb = realloc(t->arena_blocks, cap * sizeof(void *));
        if (!nb) return -1;
        t->arena_blocks = nb;
        t->arena_cap = cap;
    }
    t->arena_blocks[t->arena_n++] = b;
    t->arena_bytes += bs;
    return 0;
}

/* At create (cfg.reserve_rows): blocks enough for @p rows rows of the largest slot's size,
 * plus a partly used chunk per part and slab class, each page written once so that the
 * kernel maps (and clears) it now. arena_chunk() uses them first. */
static mt_err_t arena_reserve(mt_table_t *t, uint64_t rows) {
    double per_row = 0;
    size_t max_chunk = 0;
    for (uint32_t i = 0; i < t->nslots; i++) {
        const mt__slot_t *s = &t->slots[i];
        double b = (double)s->chunk_bytes / s->chunk_rows; /* with the chunk's overheads */
        if (b > per_row) per_row = b;
        if (s->chunk_bytes > max_chunk) max_chunk = s->chunk_bytes;
    }
    if (max_chunk > MT__ARENA_BLOCK) return MT_OK; /* chunks of their own: nothing to share */
    double bytes = (double)rows * per_row + (double)t->nparts * t->nclasses * (double)max_chunk;
    /* every page is touched: more than the machine's memory would end in the OOM killer */
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && bytes > (double)pages * (double)page) return MT_NOMEM;
    size_t nblocks = (size_t)(bytes / MT__ARENA_BLOCK) + 1;
    for (size_t k = 0; k < nblocks; k++) {
        char *b = aligned_alloc(MT__ARENA_BLOCK, MT__ARENA_BLOCK);
        if (!b) return MT_NOMEM;
        huge_hint(b, MT__ARENA_BLOCK);
        for (size_t off = 0; off < MT__ARENA_BLOCK; off += 4096)
            ((volatile char *)b)[off] = 0;
        if (arena_add(t, b, MT__ARENA_BLOCK)) {
            free(b);
            return MT_NOMEM;
        }
    }
    t->arena_reserved = t->arena_n;
    return MT_OK;
}

static void *arena_chunk(mt_table_t *t, size_t size) {
    pthread_mutex_lock(&t->arena_lock);
    uintptr_t c = ((uintptr_t)t->arena_cur + size - 1) & ~(uintptr_t)(size - 1);
    if (size <= MT__ARENA_BLOCK && (!t->arena_cur || c + size > (uintptr_t)t->arena_end) &&
        t->arena_used < t->arena_reserved) { /* the next reserved block */
        char *b = t->arena_blocks[t->arena_used++];
        t->arena_end = b + MT__ARENA_BLOCK;
        c = (uintptr_t)b;
    } else if (!t->arena_cur || c + size > (uintptr_t)t->arena_end) {
        size_t bs = size > MT__ARENA_BLOCK ? size : MT__ARENA_BLOCK;
        char *b = aligned_alloc(MT__ARENA_BLOCK, bs);
        if (!b || arena_add(t, b, bs)) {
            free(b);
            pthread_mutex_unlock(&t->arena_lock);
            return NULL;
        }
        huge_hint(b, bs);
        t->arena_end = b + bs;
        c = (uintptr_t)b;
    }
    t->arena_cur = (char *)(c + size);
    pthread_mutex_unlock(&t->arena_lock);
    return (void *)c;
}

/* ============================== slabs ============================== */

/* A slab's free and cur are written under the part's lock and also read without it, with
 * relaxed atomics, by slab_next() (a prefetch address only); so every store is atomic. */
static void *slab_alloc(mt_table_t *t, mt__slab_t *sl, const mt__slot_t *s) {
    if (sl->free) {
        void *r = sl->free;
        void *next;
        memcpy(&next, r, sizeof(next));
        __atomic_store_n(&sl->free, next, __ATOMIC_RELAXED);
        return r;
    }
    if (sl->left == 0) {
        char *chunk = arena_chunk(t, s->chunk_bytes);
        if (!chunk) return NULL;
        sl->bytes += s->chunk_bytes;
        __atomic_store_n(&sl->cur, chunk + MT__CHUNK_HDR, __ATOMIC_RELAXED);
        sl->left = s->chunk_rows;
    }
    /* the handle: the embedding's address (together: after the header; split: the next
     * one of the chunk's embedding array) */
    void *r = s->split ? sl->cur : sl->cur + sizeof(mt__row_t);
    __atomic_store_n(&sl->cur, sl->cur + (s->split ? s->emb_bytes : s->row_bytes),
                     __ATOMIC_RELAXED);
    sl->left--;
    return r;
}

/* The row (handle) the next insert into slab @p sl of slot @p s will most likely take, read
 * without the part's lock: only a prefetch address, possibly stale or past the newest
 * chunk's end (still in the table's arena, or not a row at all: a prefetch never faults),
 * NULL before the slab's first chunk. */
static inline const char *slab_next(const mt__slab_t *sl, const mt__slot_t *s) {
    const char *r = __atomic_load_n(&sl->free, __ATOMIC_RELAXED);
    if (r) return r;
    const char *c = __atomic_load_n(&sl->cur, __ATOMIC_RELAXED);
    return c && !s->split ? c + sizeof(mt__row_t) : c;
}

/* The row keeps its version (the removal's), so stale log entries see it changed. */
static void slab_free(mt__slab_t *sl, void *row) {
#ifndef NDEBUG
    /* Ownership: a row is freed once, by the writer that unlinked it. The newest frees are
     * the likeliest double free: check a bounded prefix of the free list. */
    const void *f = sl->free;
    for (int i = 0; f && i < 64; i++) {
        assert(f != row);
        memcpy(&f, f, sizeof(f));
    }
#endif
    memcpy(row, &sl->free, sizeof(void *));
    __atomic_store_n(&sl->free, row, __ATOMIC_RELAXED);
}

/* ============================== versions and the change log ============================== */

uint64_t mt__part_version(mt_table_t *t, mt__part_t *p) {
    assert(MT__PART_LOCKED(p));
    uint64_t g = atomic_load_explicit(&t->clock, memory_order_relaxed);
    uint64_t prev = p->clock;
    p->clock = (p->clock > g ? p->clock : g) + 1;
    assert(p->clock > prev && p->clock > g); /* versions only go up */
    (void)prev;
    return p->clock;
}

/* The scratch hash set of log_make_room: fids seen, stamped so that it never needs
 * clearing (an entry is in the set iff its stamp is the current one). One per table,
 * under log_scratch_lock (taken with a part's lock held; nothing takes a part lock while
 * holding it). @returns 0, or -1 if out of memory (the set is then unusable). */
static int log_set_reset(mt__logset_t *set, uint64_t n) {
    uint64_t sz = 16;
    while (sz < 2 * n)
        sz *= 2;
    if (sz > set->sz) {
        uint64_t *keys = malloc(sz * sizeof(uint64_t));
        uint32_t *stamps = calloc(sz, sizeof(uint32_t));
        if (!keys || !stamps) {
            free(keys);
            free(stamps);
            return -1;
        }
        free(set->keys);
        free(set->stamps);
        set->keys = keys;
        set->stamps = stamps;
        set->sz = sz;
        set->stamp = 0;
    }
    if (++set->stamp == 0) { /* wrapped: every old stamp could look current */
        memset(set->stamps, 0, set->sz * sizeof(uint32_t));
        set->stamp = 1;
    }
    return 0;
}

/* Adds fid to the set. @returns 1 if it was already there. */
static inline int log_set_add(mt__logset_t *set, uint64_t fid) {
    uint64_t m = set->sz - 1, h = ((fid * 0x9E3779B97F4A7C15ull) >> 17) & m;
    while (set->stamps[h] == set->stamp) {
        if (set->keys[h] == fid) return 1;
        h = (h + 1) & m;
    }
    set->stamps[h] = set->stamp;
    set->keys[h] = fid;
    return 0;
}

/* Drops, in place, every entry of p's log that a newer entry for the same fid supersedes
 * (a newer change, a deletion, or a re-insert after a deletion): scanning from the newest,
 * an entry is live iff its fid was not seen yet; live entries move up against log_end in
 * their order, and log_start follows them. No row is dereferenced. @returns the live count,
 * or UINT64_MAX if out of memory (nothing dropped). */
static uint64_t log_drop_superseded(mt_table_t *t, mt__part_t *p) {
    uint64_t mask = t->log_cap - 1, w = p->log_end;
    pthread_mutex_lock(&t->log_scratch_lock);
    if (log_set_reset(&t->log_scratch, p->log_end - p->log_start)) {
        pthread_mutex_unlock(&t->log_scratch_lock);
        return UINT64_MAX;
    }
    int has_del = 0;
    /* w > k always holds (w only moves down after k does), so a write never lands on an
     * entry the scan has not read yet. */
    for (uint64_t k = p->log_end; k-- > p->log_start;) {
        mt__logent_t e = p->log[k & mask];
        if (log_set_add(&t->log_scratch, e.fid)) continue;
        has_del |= e.row == NULL;
        p->log[--w & mask] = e;
    }
    pthread_mutex_unlock(&t->log_scratch_lock);
    p->log_start = w;
    p->log_has_del = has_del;
    return p->log_end - w;
}

/* Makes room in a full log: drops every superseded entry, and if more than 3/4 of the
 * ring still holds live entries (distinct ids), drops the oldest of them down to 3/4 and
 * raises log_floor past them, so that incremental syncs from before then answer
 * MT_FULL_SYNC: changes are never lost silently. Each call frees at least a quarter of the
 * ring for O(ring) work: amortized O(1) per append. */
static void log_make_room(mt_table_t *t, mt__part_t *p) {
    uint64_t cap = t->log_cap, kept = p->log_end - p->log_start;
    /* With no change since the last scan that could supersede an entry (a stream of new
     * ids), every entry is live: skip the scan. */
    if (p->log_maybe_dead) {
        uint64_t live = log_drop_superseded(t, p);
        if (live != UINT64_MAX) { /* out of memory: the drop below still makes room */
            kept = live;
            p->log_maybe_dead = 0;
        }
    }
    uint64_t keep_max = cap - cap / 4;
    if (kept > keep_max) {
        uint64_t drop = kept - keep_max;
        p->log_floor = p->log[(p->log_start + drop - 1) & (cap - 1)].version;
        p->log_start += drop;
        p->n_log_drops += drop;
    }
}

void mt__log_append(mt_table_t *t, mt__part_t *p, uint64_t fid, uint64_t version, void *row) {
    assert(MT__PART_LOCKED(p));
    if (!t->log_cap) return; /* change tracking is off: every stream is a full one */
    /* The log is in version order (changes.c's log_search depends on it). */
    assert(p->log_end == p->log_start ||
           p->log[(p->log_end - 1) & (t->log_cap - 1)].version < version);
    if (p->log_end - p->log_start == t->log_cap) log_make_room(t, p);
    p->log_has_del |= row == NULL;
    mt__logent_t *e = &p->log[p->log_end++ & (t->log_cap - 1)];
    e->fid = fid;
    e->version = version;
    e->row = row;
}

/* An existing row changes or goes: the log entry of its previous version (if the log still
 * holds it) becomes superseded. */
static inline void log_note_change(mt__part_t *p, uint64_t old_version) {
    if (old_version > p->log_floor) p->log_maybe_dead++;
}

/* A row is created: it supersedes the deletion entry of its id if the log holds one. */
static inline void log_note_insert(mt__part_t *p) {
    if (p->log_has_del) p->log_maybe_dead++;
}

/* ============================== cuckoo core (writers, lock held) ============================== */

static inline int bucket_find(const mt__bucket_t *b, uint64_t fid) {
    for (int i = 0; i < MT__BUCKET_SLOTS; i++)
        if (b->row[i] && b->key[i] == fid) return i;
    return -1;
}

static inline int bucket_free_slot(const mt__bucket_t *b) {
    for (int i = 0; i < MT__BUCKET_SLOTS; i++)
        if (!b->row[i]) return i;
    return -1;
}

/* Finds fid in arr: @returns the row pointer and its position, or NULL. */
static void *arr_find(const mt__barray_t *a, hpair_t h, uint64_t fid, uint64_t *pb, int *ps) {
    uint64_t b1, b2;
    bucket_pair(a->mask, h, &b1, &b2);
    int s = bucket_find(&a->b[b1], fid);
    if (s >= 0) {
        *pb = b1;
        *ps = s;
        return a->b[b1].row[s];
    }
    s = bucket_find(&a->b[b2], fid);
    if (s >= 0) {
        *pb = b2;
        *ps = s;
        return a->b[b2].row[s];
    }
    return NULL;
}

void *mt__part_find(mt_table_t *t, mt__part_t *p, uint64_t fid) {
    assert(MT__PART_LOCKED(p));
    uint64_t b;
    int slot;
    return arr_find(atomic_load_explicit(&p->arr, memory_order_relaxed), hash_fid(t, fid), fid, &b,
                    &slot);
}

static mt__barray_t *arr_new(mt_table_t *t, uint64_t nbuckets) {
    size_t bytes = nbuckets * sizeof(mt__bucket_t);
    mt__barray_t *a = malloc(sizeof(*a));
    if (!a) return NULL;
    a->b = mt__bpool_alloc(&t->bpool, bytes);
    if (!a->b) {
        free(a);
        return NULL;
    }
    memset(a->b, 0, bytes);
    a->mask = nbuckets - 1;
    return a;
}

typedef struct bfs_node {
    uint64_t bucket;
    int32_t parent; /* index of the parent node, -1 for a root */
    int32_t slot;   /* slot in the parent bucket whose entry moves into this bucket */
} bfs_node_t;

/* A bucket entry is read by lock-free readers (bucket_probe, read_one) while a writer holding
 * the part's lock changes it, so writers store keys and row pointers with relaxed atomic
 * stores (plain moves on x86; under C11 a plain store racing with an atomic load is a data
 * race, and ThreadSanitizer says so). What a reader makes of them is decided by the seqlock. */
static inline void bk_set_key(mt__bucket_t *bk, int i, uint64_t fid) {
    __atomic_store_n(&bk->key[i], fid, __ATOMIC_RELAXED);
}
static inline void bk_set_row(mt__bucket_t *bk, int i, void *row) {
    __atomic_store_n(&bk->row[i], row, __ATOMIC_RELAXED);
}

/* Places (fid, row) in a, displacing entries along a BFS path if needed. The caller has
 * made seq odd if a is visible to readers. @returns 0 on success, -1 if no path exists. */
static int arr_place(const mt_table_t *t, mt__barray_t *a, uint64_t fid, hpair_t h, void *row) {
    uint64_t b1, b2;
    bucket_pair(a->mask, h, &b1, &b2);
    int s = bucket_free_slot(&a->b[b1]);
    uint64_t b = b1;
    if (s < 0) {
        s = bucket_free_slot(&a->b[b2]);
        b = b2;
    }
    if (s >= 0) {
        bk_set_key(&a->b[b], s, fid);
        __atomic_store_n(&a->b[b].row[s], row, __ATOMIC_RELEASE);
        return 0;
    }
    bfs_node_t q[MT__BFS_NODES];
    int head = 0, tail = 0, found = -1;
    q[tail++] = (bfs_node_t){b1, -1, -1};
    q[tail++] = (bfs_node_t){b2, -1, -1};
    while (head < tail && found < 0) {
        int cur = head++;
        const mt__bucket_t *cb = &a->b[q[cur].bucket];
        for (int i = 0; i < MT__BUCKET_SLOTS && tail < MT__BFS_NODES; i++) {
            uint64_t k = cb->key[i], x1, x2;
            bucket_pair(a->mask, hash_fid(t, k), &x1, &x2);
            uint64_t alt = x1 == q[cur].bucket ? x2 : x1;
            q[tail] = (bfs_node_t){alt, cur, i};
            if (bucket_free_slot(&a->b[alt]) >= 0) {
                found = tail++;
                break;
            }
            tail++;
        }
    }
    if (found < 0) return -1;
    /* Walk back from the free bucket, moving each entry one step along the path. */
    int n = found;
    int free_slot = bucket_free_slot(&a->b[q[n].bucket]);
    while (q[n].parent >= 0) {
        int par = q[n].parent;
        mt__bucket_t *from = &a->b[q[par].bucket], *to = &a->b[q[n].bucket];
        bk_set_key(to, free_slot, from->key[q[n].slot]);
        bk_set_row(to, free_slot, from->row[q[n].slot]);
        bk_set_row(from, q[n].slot, NULL);
        free_slot = q[n].slot;
        n = par;
    }
    mt__bucket_t *root = &a->b[q[n].bucket];
    bk_set_key(root, free_slot, fid);
    bk_set_row(root, free_slot, row);
    return 0;
}

/* Builds a bigger array holding every entry of p's current one. */
static mt__barray_t *arr_grow(mt_table_t *t, const mt__barray_t *old) {
    for (uint64_t nb = (old->mask + 1) * 2; nb <= (1ull << 40); nb *= 2) {
        mt__barray_t *a = arr_new(t, nb);
        if (!a) return NULL;
        int ok = 1;
        for (uint64_t b = 0; b <= old->mask && ok; b++)
            for (int i = 0; i < MT__BUCKET_SLOTS && ok; i++)
                if (old->b[b].row[i])
                    ok = arr_place(t, a, old->b[b].key[i], hash_fid(t, old->b[b].key[i]),
                                   old->b[b].row[i]) == 0;
        if (ok) return a;
        arr_free(t, a);
    }
    return NULL;
}

static mt_err_t part_grow(mt_table_t *t, mt__part_t *p, mt__barray_t **retired) {
    mt__barray_t *old = atomic_load_explicit(&p->arr, memory_order_relaxed);
    mt__barray_t *a = arr_grow(t, old);
    if (!a) return MT_NOMEM;
    atomic_store_explicit(&p->arr, a, memory_order_release);
    atomic_store_explicit(&p->mask_hint, a->mask, memory_order_relaxed);
    atomic_store_explicit(&p->bk_hint, a->b, memory_order_relaxed);
    p->n_grows++;
    /* A second grow during one insert (rare) frees the first retired array now: readers
     * may hold it, so wait for a grace period (readers never take locks: no deadlock). */
    mt__retire(t, *retired);
    *retired = old;
    return MT_OK;
}

static inline int part_over_load(const mt_table_t *t, const mt__part_t *p, const mt__barray_t *a) {
    uint64_t cap = (a->mask + 1) * MT__BUCKET_SLOTS;
    return (p->rows + 1) * t->max_rows_den > cap * t->max_rows_num;
}

/* Links a filled row that no reader can see yet into p, growing the part as needed, and
 * counts the insert (caller holds p->lock). On error the row goes back to its slab. */
static mt_err_t part_link(mt_table_t *t, mt__part_t *p, uint64_t fid, hpair_t h,
                          const mt__slot_t *s, void *row, mt__barray_t **retired) {
    assert(MT__PART_LOCKED(p));
    mt__barray_t *a = atomic_load_explicit(&p->arr, memory_order_relaxed);
    int rc = -1;
    if (!part_over_load(t, p, a)) {
        seq_write_begin(p);
        rc = arr_place(t, a, fid, h, row);
        seq_write_end(p);
    }
    while (rc != 0) {
        mt_err_t err = part_grow(t, p, retired);
        if (err) {
            slab_free(&p->slabs[s->klass], row);
            return err;
        }
        a = atomic_load_explicit(&p->arr, memory_order_relaxed);
        seq_write_begin(p);
        rc = arr_place(t, a, fid, h, row);
        seq_write_end(p);
    }
    p->rows++;
    log_note_insert(p);
    p->n_inserts++;
    return MT_OK;
}

static mt_err_t part_insert(mt_table_t *t, mt__part_t *p, uint64_t fid, hpair_t h,
                            const mt__slot_t *s, const float *emb, const float *state,
                            uint32_t touch_s, uint32_t count, uint64_t version, void **row_out,
                            mt__barray_t **retired) {
    assert(MT__PART_LOCKED(p));
    void *row = slab_alloc(t, &p->slabs[s->klass], s);
    if (!row) return MT_NOMEM;
    mt__row_t *hdr = mt__row_hdr(s, row);
    hdr->version = version;
    hdr->touch_s = touch_s;
    hdr->count = count;
    if (emb) {
        mt__row_write_emb(s, row, emb);
    } else {
        float w[MT_TABLE_MAX_DIM];
        mt__init_emb(&s->cfg, fid, w);
        mt__row_write_emb(s, row, w);
    }
    if (s->state_floats) {
        if (state)
            memcpy(mt__row_state(s, row), state, s->state_floats * sizeof(float));
        else
            mt__opt_init_state(&s->cfg, mt__row_state(s, row));
    }
    mt_err_t err = part_link(t, p, fid, h, s, row, retired);
    if (err) return err;
    if (row_out) *row_out = row;
    return MT_OK;
}

mt_err_t mt__part_insert(mt_table_t *t, mt__part_t *p, uint64_t fid, const mt__slot_t *s,
                         const float *emb, const float *state, uint32_t touch_s, uint32_t count,
                         uint64_t version, void **row_out, mt__barray_t **retired) {
    return part_insert(t, p, fid, hash_fid(t, fid), s, emb, state, touch_s, count, version, row_out,
                       retired);
}

/* Removes the entry at (b, slot), logs the deletion and frees the row (lock held). */
static void part_remove_at(mt_table_t *t, mt__part_t *p, mt__barray_t *a, uint64_t b, int slot) {
    assert(MT__PART_LOCKED(p) && a->b[b].row[slot]);
    uint64_t fid = a->b[b].key[slot];
    void *row = a->b[b].row[slot];
    const mt__slot_t *s = mt__slot_of(t, fid);
    uint64_t v = mt__part_version(t, p);
    seq_write_begin(p);
    bk_set_row(&a->b[b], slot, NULL);
    log_note_change(p, mt__row_hdr(s, row)->version);
    mt__row_hdr(s, row)->version = v;
    slab_free(&p->slabs[s->klass], row);
    seq_write_end(p);
    mt__log_append(t, p, fid, v, NULL);
    p->rows--;
    p->gen++; /* hints taken before no longer count */
}

mt_err_t mt__part_put_raw(mt_table_t *t, mt__part_t *p, uint64_t fid, const mt__slot_t *s,
                          const void *emb_raw, size_t emb_raw_bytes, const float *state,
                          uint32_t touch_s, uint32_t count, uint64_t version, int *replaced,
                          mt__barray_t **retired) {
    assert(MT__PART_LOCKED(p));
    assert(emb_raw_bytes <= s->emb_bytes);
    hpair_t h = hash_fid(t, fid);
    uint64_t b;
    int slot;
    void *row = arr_find(atomic_load_explicit(&p->arr, memory_order_relaxed), h, fid, &b, &slot);
    *replaced = row != NULL;
    if (row) {
        /* In place: readers copying this embedding meanwhile see seq move and retry. */
        seq_write_begin(p);
        memcpy(mt__row_emb(row), emb_raw, emb_raw_bytes);
        seq_write_end(p);
    } else {
        row = slab_alloc(t, &p->slabs[s->klass], s);
        if (!row) return MT_NOMEM;
        memcpy(mt__row_emb(row), emb_raw, emb_raw_bytes);
    }
    /* The tail is read by writers only (under the lock we hold). */
    mt__row_t *hdr = mt__row_hdr(s, row);
    hdr->version = version;
    hdr->touch_s = touch_s;
    hdr->count = count;
    if (s->state_floats) memcpy(mt__row_state(s, row), state, s->state_floats * sizeof(float));
    return *replaced ? MT_OK : part_link(t, p, fid, h, s, row, retired);
}

int mt__part_remove(mt_table_t *t, mt__part_t *p, uint64_t fid) {
    assert(MT__PART_LOCKED(p));
    mt__barray_t *a = atomic_load_explicit(&p->arr, memory_order_relaxed);
    uint64_t b;
    int slot;
    if (!arr_find(a, hash_fid(t, fid), fid, &b, &slot)) return 0;
    part_remove_at(t, p, a, b, slot);
    p->n_removals++;
    return 1;
}

/* ============================== create / destroy ============================== */

static mt_err_t part_init(mt_table_t *t, mt__part_t *p, uint64_t nbuckets) {
    atomic_init(&p->seq, 0);
    mt__barray_t *a = arr_new(t, nbuckets);
    atomic_init(&p->arr, a);
    atomic_init(&p->mask_hint, nbuckets - 1);
    atomic_init(&p->bk_hint, a ? a->b : NULL);
    p->slabs = calloc(t->nclasses, sizeof(mt__slab_t));
    p->log = t->log_cap ? malloc(t->log_cap * sizeof(mt__logent_t)) : NULL;
    if (t->cm_width) p->cm = calloc((size_t)t->cm_depth * t->cm_width, 1);
    if (pthread_mutex_init(&p->lock, NULL) != 0) return MT_NOMEM;
    if (!a || !p->slabs || (t->log_cap && !p->log) || (t->cm_width && !p->cm)) return MT_NOMEM;
    return MT_OK;
}

static void part_free(mt_table_t *t, mt__part_t *p) {
    arr_free(t, atomic_load_explicit(&p->arr, memory_order_relaxed));
    free(p->slabs); /* their chunks belong to the table's arena */
    free(p->log);
    free(p->cm);
    pthread_mutex_destroy(&p->lock);
}

mt_err_t mt_table_create(const mt_table_config_t *cfg, mt_table_t **out) {
    mt_err_t err = mt_table_config_validate(cfg, NULL, 0);
    if (err) return err;
    mt_table_t *t = calloc(1, sizeof(*t));
    if (!t) return MT_NOMEM;
    t->cfg = *cfg;
    t->nslots = (uint32_t)cfg->nslots;
    t->slots_cfg = malloc(cfg->nslots * sizeof(*cfg->slots));
    t->slots = calloc(cfg->nslots, sizeof(mt__slot_t));
    t->class_slot = calloc(cfg->nslots, sizeof(uint32_t));
    t->slot_index = calloc(65536, sizeof(uint32_t));
    t->nparts = 1u << cfg->shards_log2;
    t->part_shift = 64 - cfg->shards_log2;
    pthread_mutex_init(&t->rcu_lock, NULL);
    pthread_mutex_init(&t->expire_lock, NULL);
    pthread_mutex_init(&t->arena_lock, NULL);
    pthread_mutex_init(&t->log_scratch_lock, NULL);
    mt__bpool_init(&t->bpool);
    if (!t->slots_cfg || !t->slots || !t->class_slot || !t->slot_index) {
        err = MT_NOMEM;
        goto out;
    }
    memcpy(t->slots_cfg, cfg->slots, cfg->nslots * sizeof(*cfg->slots));
    t->cfg.slots = t->slots_cfg;
    for (uint32_t i = 0; i < t->nslots; i++) {
        mt__slot_t *s = &t->slots[i];
        s->cfg = cfg->slots[i];
        s->state_floats = mt__opt_state_floats(&s->cfg);
        s->emb_bytes =
            s->cfg.precision == MT_PREC_FP16 ? ((s->cfg.dim * 2 + 3) & ~3u) : s->cfg.dim * 4;
        if (s->emb_bytes < sizeof(void *)) s->emb_bytes = sizeof(void *); /* free-list link */
        /* the layout (table_int.h): split when the embedding tiles cache lines */
        s->split = s->emb_bytes % MT__CACHELINE == 0 || MT__CACHELINE % s->emb_bytes == 0;
        s->tail_bytes = (uint32_t)((sizeof(mt__row_t) + s->state_floats * 4 + 7) & ~7u);
        s->row_bytes =
            s->split
                ? s->emb_bytes + s->tail_bytes
                : (uint32_t)((sizeof(mt__row_t) + s->emb_bytes + s->state_floats * 4 + 7) & ~7u);
        /* Chunks: at least 16 KiB and 4 rows, a power of two, aligned to their size (split:
         * 8 bytes to align the tail array). */
        s->chunk_bytes = MT__CHUNK_MIN;
        while (s->chunk_bytes < MT__CHUNK_HDR + 8 + 4 * s->row_bytes)
            s->chunk_bytes *= 2;
        s->chunk_rows = (s->chunk_bytes - MT__CHUNK_HDR - 8 * s->split) / s->row_bytes;
        s->tail_off = s->split ? (MT__CHUNK_HDR + s->chunk_rows * s->emb_bytes + 7) & ~7u : 0;
        uint32_t k = 0;
        while (k < t->nclasses && (t->slots[t->class_slot[k]].emb_bytes != s->emb_bytes ||
                                   t->slots[t->class_slot[k]].row_bytes != s->row_bytes ||
                                   t->slots[t->class_slot[k]].split != s->split))
            k++;
        if (k == t->nclasses) t->class_slot[t->nclasses++] = i;
        s->klass = k;
        t->slot_index[s->cfg.slot] = i + 1;
    }
    t->seed1 = cfg->hash_seed;
    t->seed2 = cfg->hash_seed ^ 0x5851F42D4C957F2Dull;
    t->seed_cm = cfg->hash_seed ^ 0x14057B7EF767814Full;
    t->cm_depth = cfg->filter_depth;
    t->cm_width =
        cfg->filter_bytes ? (uint32_t)(cfg->filter_bytes / t->nparts / cfg->filter_depth) : 0;
    /* A power of two per part, so that a ring position is a mask, not a division. */
    t->log_cap = 0;
    if (cfg->changelog_entries)
        for (t->log_cap = 1; t->log_cap * 2 <= cfg->changelog_entries / t->nparts;)
            t->log_cap *= 2;
    t->max_rows_num = (uint64_t)(cfg->max_load * 1000.0);
    t->max_rows_den = 1000;
    atomic_init(&t->rcu_idx, 0);
    atomic_init(&t->clock, 0);
    t->lanes = aligned_alloc(MT__CACHELINE, MT__LANES * sizeof(mt__lane_t));
    t->parts = aligned_alloc(MT__CACHELINE, t->nparts * sizeof(mt__part_t));
    if (!t->lanes || !t->parts) {
        err = MT_NOMEM;
        goto out;
    }
    memset(t->lanes, 0, MT__LANES * sizeof(mt__lane_t));
    memset(t->parts, 0, t->nparts * sizeof(mt__part_t));
    /* Buckets per part so that initial_rows fit under max_load even in parts that get more
     * than their share (~4 standard deviations of slack), a power of two >= 2. */
    uint64_t per_part = cfg->initial_rows / t->nparts + 1;
    if (cfg->initial_rows) per_part += (uint64_t)(4.0 * sqrt((double)per_part)) + 8;
    uint64_t nb = 2;
    while ((double)nb * MT__BUCKET_SLOTS * cfg->max_load < (double)per_part)
        nb *= 2;
    /* hints' generations start apart per table and part (mt__part_t gen) */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t gen_seed = (uint64_t)(uintptr_t)t ^ ((uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec);
    for (uint32_t i = 0; i < t->nparts; i++) {
        err = part_init(t, &t->parts[i], nb);
        if (err) {
            /* parts after i are zeroed; part_free copes with a half-built part */
            goto out;
        }
        t->parts[i].gen = XXH3_64bits_withSeed(&i, sizeof(i), gen_seed);
    }
    if (cfg->reserve_rows && cfg->initial_rows && (err = arena_reserve(t, cfg->initial_rows)))
        goto out;
    *out = t;
    return MT_OK;
out:
    mt_table_destroy(t);
    return err;
}

void mt_table_destroy(mt_table_t *t) {
    if (!t) return;
    if (t->parts)
        for (uint32_t i = 0; i < t->nparts; i++)
            if (t->parts[i].slabs || t->parts[i].log) part_free(t, &t->parts[i]);
    free(t->parts);
    mt__bpool_destroy(&t->bpool);
    for (size_t i = 0; i < t->arena_n; i++)
        free(t->arena_blocks[i]);
    free(t->arena_blocks);
    pthread_mutex_destroy(&t->arena_lock);
    pthread_mutex_destroy(&t->log_scratch_lock);
    free(t->log_scratch.keys);
    free(t->log_scratch.stamps);
    free(t->lanes);
    free(t->slots_cfg);
    free(t->slots);
    free(t->class_slot);
    free(t->slot_index);
    pthread_mutex_destroy(&t->rcu_lock);
    pthread_mutex_destroy(&t->expire_lock);
    free(t);
}

/* ============================== small queries ============================== */

mt_err_t mt_table_dim(const mt_table_t *t, uint64_t fid, uint32_t *dim) {
    const mt__slot_t *s = mt__slot_of(t, fid);
    if (!s) return MT_UNKNOWN_SLOT;
    *dim = s->cfg.dim;
    return MT_OK;
}

const mt_table_slot_config_t *mt_table_slot_config(const mt_table_t *t, uint64_t fid) {
    const mt__slot_t *s = mt__slot_of(t, fid);
    return s ? &s->cfg : NULL;
}

mt_err_t mt_table_state_floats(const mt_table_t *t, uint64_t fid, uint32_t *nfloats) {
    const mt__slot_t *s = mt__slot_of(t, fid);
    if (!s) return MT_UNKNOWN_SLOT;
    *nfloats = s->state_floats;
    return MT_OK;
}

mt_err_t mt_table_row_bytes(const mt_table_t *t, uint64_t fid, uint32_t *bytes) {
    const mt__slot_t *s = mt__slot_of(t, fid);
    if (!s) return MT_UNKNOWN_SLOT;
    *bytes = s->row_bytes;
    return MT_OK;
}

mt_err_t mt_table_batch_floats(const mt_table_t *t, const uint64_t *fids, size_t n,
                               size_t *nfloats) {
    size_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        const mt__slot_t *s = mt__slot_of(t, fids[i]);
        if (!s) return MT_UNKNOWN_SLOT;
        sum += s->cfg.dim;
    }
    *nfloats = sum;
    return MT_OK;
}

uint64_t mt_table_buckets(mt_table_t *t) {
    uint64_t n = 0;
    for (uint32_t i = 0; i < t->nparts; i++) {
        mt__part_t *p = &t->parts[i];
        mt__part_lock(p);
        n += atomic_load_explicit(&p->arr, memory_order_relaxed)->mask + 1;
        mt__part_unlock(p);
    }
    return n;
}

void mt_table_stats(mt_table_t *t, mt_table_stats_t *st) {
    memset(st, 0, sizeof(*st));
    st->bytes_total = sizeof(*t) + t->nparts * sizeof(mt__part_t) + MT__LANES * sizeof(mt__lane_t) +
                      65536 * sizeof(uint32_t);
    for (uint32_t i = 0; i < t->nparts; i++) {
        mt__part_t *p = &t->parts[i];
        mt__part_lock(p);
        const mt__barray_t *a = atomic_load_explicit(&p->arr, memory_order_relaxed);
        st->rows += p->rows;
        st->capacity += (a->mask + 1) * MT__BUCKET_SLOTS;
        st->bytes_filter += (uint64_t)t->cm_depth * t->cm_width;
        st->bytes_changelog += t->log_cap * sizeof(mt__logent_t);
        if (p->clock > st->version) st->version = p->clock;
        if (p->log_floor > st->full_sync_below) st->full_sync_below = p->log_floor;
        st->inserts += p->n_inserts;
        st->removals += p->n_removals;
        st->evictions += p->n_evictions;
        st->grows += p->n_grows;
        st->filtered += p->n_filtered;
        st->changelog_drops += p->n_log_drops;
        mt__part_unlock(p);
    }
    st->bytes_buckets = mt__bpool_bytes(&t->bpool) + t->nparts * sizeof(mt__barray_t);
    pthread_mutex_lock(&t->arena_lock);
    st->bytes_rows = t->arena_bytes; /* chunks in use, free rows and the last block's tail */
    pthread_mutex_unlock(&t->arena_lock);
    st->bytes_total += st->bytes_rows + st->bytes_buckets + st->bytes_filter + st->bytes_changelog;
    st->load_factor = st->capacity ? (double)st->rows / (double)st->capacity : 0.0;
}

/* ============================== lookup ============================== */

/* What the read pipeline knows about one id of a batch (see lookup_readonly). */
typedef struct probe {
    hpair_t h;
    const mt__part_t *p;
    uint64_t mask; /* bucket mask b1, b2 were computed with */
    uint64_t b1, b2;
    const void *row; /* row found by the unvalidated probe, or NULL */
    uint64_t bucket; /* where it was found */
    int slot;
} probe_t;

/* Stage 1: hash, locate, prefetch the first bucket. The array pointer and its mask are read
 * from the part header without dereferencing the array: a stale pair only wastes the
 * prefetch, and later stages recompute against the array they load. */
static inline void probe_start(const mt_table_t *t, uint64_t fid, probe_t *q) {
    q->h = hash_fid(t, fid);
    q->p = &t->parts[part_index(t, q->h.h1)];
    const mt__bucket_t *b = atomic_load_explicit(&q->p->bk_hint, memory_order_relaxed);
    q->mask = atomic_load_explicit(&q->p->mask_hint, memory_order_relaxed);
    bucket_pair(q->mask, q->h, &q->b1, &q->b2);
    q->row = NULL;
    __builtin_prefetch(b + q->b1); /* address arithmetic only: a prefetch never faults */
}

/* Looks for fid in bucket b of a; @returns the slot or -1. Relaxed atomic loads: a writer
 * may be changing the bucket, the seqlock decides later whether what we saw counts. */
static inline int bucket_probe(const mt__barray_t *a, uint64_t b, uint64_t fid) {
    const mt__bucket_t *bk = &a->b[b];
    for (int i = 0; i < MT__BUCKET_SLOTS; i++)
        if (__atomic_load_n(&bk->key[i], __ATOMIC_RELAXED) == fid &&
            __atomic_load_n(&bk->row[i], __ATOMIC_RELAXED))
            return i;
    return -1;
}

/* Stages 2 and 3 (inside a read section): probe bucket 1 or 2; found, remember where and
 * prefetch the embedding; not found in bucket 1, prefetch bucket 2. */
static inline void probe_bucket(const mt_table_t *t, uint64_t fid, probe_t *q, int which) {
    const mt__barray_t *a = atomic_load_explicit(&q->p->arr, memory_order_acquire);
    if (a->mask != q->mask) {
        q->mask = a->mask;
        bucket_pair(q->mask, q->h, &q->b1, &q->b2);
    }
    uint64_t b = which == 1 ? q->b1 : q->b2;
    int i = bucket_probe(a, b, fid);
    if (i >= 0) {
        const char *r = __atomic_load_n(&a->b[b].row[i], __ATOMIC_RELAXED);
        const mt__slot_t *s = mt__slot_of(t, fid);
        q->row = r;
        q->bucket = b;
        q->slot = i;
        __builtin_prefetch(r);
        __builtin_prefetch(r + s->emb_bytes - 1);
    } else if (which == 1) {
        __builtin_prefetch(&a->b[q->b2]);
    }
}

/* The seqlock copy of a row may overlap a writer's change of it, by design (see read_one):
 * under ThreadSanitizer its reads are not recorded (the copy counts only when seq did not
 * move), so that no other access of the row is hidden from it. No code in other builds. */
#ifdef MT_TSAN
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
#define SEQ_COPY_BEGIN() AnnotateIgnoreReadsBegin(__FILE__, __LINE__)
#define SEQ_COPY_END()   AnnotateIgnoreReadsEnd(__FILE__, __LINE__)
#else
#define SEQ_COPY_BEGIN() ((void)0)
#define SEQ_COPY_END()   ((void)0)
#endif

/* Stage 4: the validated read of one id into out (dim floats); @returns 1 if found. Tries
 * the position the probe found first (one compare), else probes both buckets; either way
 * the copy counts only if the part's seq did not move. */
static inline int read_one(const mt__slot_t *s, uint64_t fid, probe_t *q, float *out) {
    const mt__part_t *p = q->p;
    for (;;) {
        uint64_t s1 = atomic_load_explicit(&p->seq, memory_order_acquire);
        if (s1 & 1) {
            cpu_relax();
            continue;
        }
        const mt__barray_t *a = atomic_load_explicit(&p->arr, memory_order_acquire);
        const void *row = NULL;
        if (q->row && a->mask == q->mask &&
            __atomic_load_n(&a->b[q->bucket].key[q->slot], __ATOMIC_RELAXED) == fid &&
            __atomic_load_n(&a->b[q->bucket].row[q->slot], __ATOMIC_RELAXED) == q->row) {
            row = q->row;
        } else {
            if (a->mask != q->mask) {
                q->mask = a->mask;
                bucket_pair(q->mask, q->h, &q->b1, &q->b2);
            }
            int i = bucket_probe(a, q->b1, fid);
            uint64_t b = q->b1;
            if (i < 0) {
                i = bucket_probe(a, q->b2, fid);
                b = q->b2;
            }
            if (i >= 0) row = __atomic_load_n(&a->b[b].row[i], __ATOMIC_RELAXED);
        }
        if (row) {
            SEQ_COPY_BEGIN();
            mt__row_read_emb(s, row, out);
            SEQ_COPY_END();
        }
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&p->seq, memory_order_relaxed) == s1) {
            if (!row) memset(out, 0, s->cfg.dim * sizeof(float));
            return row != NULL;
        }
        q->row = NULL; /* the hint may be stale: probe in full next time */
    }
}

/* Prefetches bucket `which` (1 or 2) of an id for writers, like probe_start. */
static inline __attribute__((always_inline)) void prefetch_bucket(const mt_table_t *t, hpair_t h,
                                                                  int which) {
    const mt__part_t *p = &t->parts[part_index(t, h.h1)];
    const mt__bucket_t *b = atomic_load_explicit(&p->bk_hint, memory_order_relaxed);
    uint64_t mask = atomic_load_explicit(&p->mask_hint, memory_order_relaxed), b1, b2;
    bucket_pair(mask, h, &b1, &b2);
    __builtin_prefetch(b + (which == 1 ? b1 : b2));
}

/* Batched read-only lookup, a 4-stage software pipeline over each chunk of the batch:
 *   id i+3D: hash, prefetch its first bucket
 *   id i+2D: probe the first bucket; found: prefetch the row; else prefetch the second bucket
 *   id i+D:  if it was not in the first bucket, probe the second and prefetch the row
 *   id i:    validated read (read_one), everything it touches now in cache
 * so that the misses of about 3D ids are in flight at once and an id living in its second
 * bucket costs one more overlapped miss, not a serialized one. */
static void lookup_readonly(mt_table_t *t, const uint64_t *fids, size_t n, float *out,
                            uint8_t *found, mt_table_op_stats_t *st) {
    probe_t pq[MT__READ_CHUNK];
    uint64_t nfound = 0;
    size_t off = 0;
    const size_t D = MT__PREFETCH;
    for (size_t base = 0; base < n; base += MT__READ_CHUNK) {
        size_t m = n - base < MT__READ_CHUNK ? n - base : MT__READ_CHUNK;
        const uint64_t *f = fids + base;
        unsigned lane, idx = rcu_enter(t, &lane);
        for (size_t i = 0; i < m && i < 3 * D; i++)
            probe_start(t, f[i], &pq[i]);
        for (size_t i = 0; i < m && i < 2 * D; i++)
            probe_bucket(t, f[i], &pq[i], 1);
        for (size_t i = 0; i < m && i < D; i++)
            if (!pq[i].row) probe_bucket(t, f[i], &pq[i], 2);
        for (size_t i = 0; i < m; i++) {
            size_t j = i + 3 * D;
            if (j < m) probe_start(t, f[j], &pq[j]);
            j = i + 2 * D;
            if (j < m) probe_bucket(t, f[j], &pq[j], 1);
            j = i + D;
            if (j < m && !pq[j].row) probe_bucket(t, f[j], &pq[j], 2);
            const mt__slot_t *s = mt__slot_of(t, f[i]);
            int ok = read_one(s, f[i], &pq[i], out + off);
            off += s->cfg.dim;
            nfound += ok;
            if (found) found[base + i] = (uint8_t)ok;
        }
        rcu_exit(t, lane, idx);
    }
    if (st) {
        st->found += nfound;
        st->missing += n - nfound;
    }
}

/* Writers' pipeline, over groups of MT__WGROUP ids of a batch. While group g is handled id
 * by id under its parts' locks, the rows of group g+1 are prefetched (header and embedding,
 * plus the optimizer state for applies) and the first buckets of group g+2. A row is
 * found for its prefetch by an unlocked probe of its first bucket, as readers do, inside
 * one grace-period section per group (the bucket array may be retired meanwhile); the
 * probe's answer is only a prefetch address, the locked path looks the id up again. An id
 * not in its first bucket gets its second bucket prefetched instead (inserts fill the first
 * while it has room, so most ids are there: prefetching both for every id spent a quarter
 * of the lines a lookup waits for), and in a training lookup also the row the id's part
 * would give a new row (slab_next()): a new id's memory is written at once. The section
 * ends before the group is handled, so a writer never waits for a grace period (a grow's
 * mt__retire) while inside one. Without the row stage, applies on a table much larger
 * than the cache spent most of their time waiting for the optimizer state (measured:
 * 77% of mt__opt_apply's samples on its first load, a warm training step). */
#define MT__WGROUP 8
#define MT__WRING  (3 * MT__WGROUP) /* hashes of groups g, g+1, g+2 */

typedef struct wpipe {
    const uint64_t *fids;
    size_t n;
    int state; /* prefetch the optimizer state too (applies) */
    hpair_t h[MT__WRING];
} wpipe_t;

/* Stage 1 of group g: hash its ids, prefetch the first bucket of each. */
static inline void wpipe_hash(const mt_table_t *t, wpipe_t *w, size_t g) {
    size_t end = (g + 1) * MT__WGROUP < w->n ? (g + 1) * MT__WGROUP : w->n;
    for (size_t i = g * MT__WGROUP; i < end; i++) {
        hpair_t h = hash_fid(t, w->fids[i]);
        w->h[i % MT__WRING] = h;
        prefetch_bucket(t, h, 1);
    }
}

/* Prefetches row @p r of slot @p s for writing: what a training lookup touches, or with
 * @p state what an apply does. Address arithmetic only: the row may be freed meanwhile (it
 * stays in the table's arena), and a prefetch never faults. Always inlined, as is
 * prefetch_bucket: GCC 12 finds a function that only prefetches "pure" and, where it is not
 * inlined early, deletes the calls (seen: a build of this function emitted no prefetch at
 * all, and the applies that relied on it ran 1.5x slower). */
static inline __attribute__((always_inline)) void prefetch_row(const mt__slot_t *s, const char *r,
                                                               int state) {
    const char *head = (const char *)mt__row_hdr(s, r);
    if (s->split) { /* the embedding, then the header (and the state) */
        __builtin_prefetch(r, 1);
        __builtin_prefetch(r + s->emb_bytes - 1, 1);
    }
    /* the header's run: split, it and the state; together, the row to the embedding's end (a
     * lookup) or to the state's (an apply) */
    const char *last = s->split ? head + (state ? s->tail_bytes : sizeof(mt__row_t)) - 1
                       : state  ? head + s->row_bytes - 1
                                : r + s->emb_bytes - 1;
    for (const char *c = head; c < last && c < head + 4 * MT__CACHELINE; c += MT__CACHELINE)
        __builtin_prefetch(c, 1);
    __builtin_prefetch(last, 1);
}

/* Stage 2 of group g: find each id's row without the lock and prefetch it for writing. */
static inline void wpipe_rows(mt_table_t *t, wpipe_t *w, size_t g) {
    size_t end = (g + 1) * MT__WGROUP < w->n ? (g + 1) * MT__WGROUP : w->n;
    if (g * MT__WGROUP >= end) return;
    unsigned lane, idx = rcu_enter(t, &lane);
    for (size_t i = g * MT__WGROUP; i < end; i++) {
        uint64_t fid = w->fids[i], b1, b2;
        hpair_t h = w->h[i % MT__WRING];
        const mt__part_t *p = &t->parts[part_index(t, h.h1)];
        const mt__barray_t *a = atomic_load_explicit(&p->arr, memory_order_acquire);
        bucket_pair(a->mask, h, &b1, &b2);
        int k = bucket_probe(a, b1, fid);
        const mt__slot_t *s = mt__slot_of(t, fid);
        if (k < 0) {
            /* in the second bucket (rarely: an insert takes the first when it has room), or
             * new: that bucket for the locked path, and for a training lookup what it will
             * touch of the row an insert would take */
            __builtin_prefetch(&a->b[b2]);
            const char *nr = w->state ? NULL : slab_next(&p->slabs[s->klass], s);
            if (nr) prefetch_row(s, nr, 0);
            continue;
        }
        const char *r = __atomic_load_n(&a->b[b1].row[k], __ATOMIC_RELAXED);
        if (r) prefetch_row(s, r, w->state);
    }
    rcu_exit(t, lane, idx);
}

static inline void wpipe_start(mt_table_t *t, wpipe_t *w, const uint64_t *fids, size_t n,
                               int state) {
    w->fids = fids;
    w->n = n;
    w->state = state;
    wpipe_hash(t, w, 0);
    wpipe_hash(t, w, 1);
    wpipe_rows(t, w, 0);
}

/* The hash pair of id i, running the stages of later groups at the start of each group.
 * Called for i = 0, 1, ..., n - 1 in order. */
static inline hpair_t wpipe_next(mt_table_t *t, wpipe_t *w, size_t i) {
    if (i % MT__WGROUP == 0) {
        size_t g = i / MT__WGROUP;
        wpipe_hash(t, w, g + 2);
        wpipe_rows(t, w, g + 1);
    }
    return w->h[i % MT__WRING];
}

/* A hint's words (mt_table_hint_t): the row, the part's gen when it was taken, the id. */
static inline void hint_set(mt_table_hint_t *hint, const mt__part_t *p, uint64_t fid,
                            const void *row) {
    assert(MT__PART_LOCKED(p));
    hint->opaque[0] = (uint64_t)(uintptr_t)row;
    hint->opaque[1] = p->gen;
    hint->opaque[2] = fid;
}

/* The row @p hint gives fid in part p, or NULL if it does not count (p->lock held). */
static inline void *hint_row(const mt_table_hint_t *hint, const mt__part_t *p, uint64_t fid) {
    assert(MT__PART_LOCKED(p));
    if (hint->opaque[2] != fid || hint->opaque[1] != p->gen) return NULL;
    return (void *)(uintptr_t)hint->opaque[0];
}

/* Makes @p p the part a batch's writer holds (*held: the one it holds, or NULL): a run of ids
 * of one part takes its lock once. */
static inline void part_hold(mt__part_t **held, mt__part_t *p) {
    if (*held == p) return;
    if (*held) mt__part_unlock(*held);
    mt__part_lock(p);
    *held = p;
}

static inline void part_release(mt__part_t **held) {
    if (*held) mt__part_unlock(*held);
    *held = NULL;
}

/* Training lookup of one id under its part's lock (held through *held, released when a grow
 * retired a bucket array); @p hint (optional) gets its row. */
static mt_err_t lookup_train_one(mt_table_t *t, const mt__slot_t *s, uint64_t fid, hpair_t h,
                                 float *out, uint32_t now_s, int *found, mt_table_hint_t *hint,
                                 mt__part_t **held, mt_table_op_stats_t *st) {
    mt__part_t *p = &t->parts[part_index(t, h.h1)];
    mt__barray_t *retired = NULL;
    mt_err_t err = MT_OK;
    uint64_t b;
    int slot;
    part_hold(held, p);
    mt__barray_t *a = atomic_load_explicit(&p->arr, memory_order_relaxed);
    void *row = arr_find(a, h, fid, &b, &slot);
    *found = 0;
    if (hint) hint_set(hint, p, fid, row); /* (NULL: none, unless a row is made below) */
    if (row) {
        mt__row_t *hdr = mt__row_hdr(s, row);
        if (hdr->count < UINT32_MAX) hdr->count++;
        if (now_s > hdr->touch_s) hdr->touch_s = now_s;
        mt__row_read_emb(s, row, out);
        *found = 1;
        goto out;
    }
    uint32_t seen = 1;
    if (s->cfg.min_count > 1) {
        seen = mt__cm_add(t, p, fid);
        if (seen < s->cfg.min_count) {
            p->n_filtered++;
            if (st) st->filtered++;
            memset(out, 0, s->cfg.dim * sizeof(float));
            goto out;
        }
    }
    uint64_t v = mt__part_version(t, p);
    void *nrow;
    err = part_insert(t, p, fid, h, s, NULL, NULL, now_s, seen, v, &nrow, &retired);
    if (err) {
        memset(out, 0, s->cfg.dim * sizeof(float));
        goto out;
    }
    mt__log_append(t, p, fid, v, nrow);
    mt__row_read_emb(s, nrow, out);
    *found = 1;
    if (hint) hint_set(hint, p, fid, nrow);
    if (st) st->admitted++;
out:
    if (retired) {
        part_release(held);
        mt__retire(t, retired);
    }
    return err;
}

/* The training lookups (mt_table_lookup with MT_TABLE_TRAIN, mt_table_lookup_rows): @p need
 * is the batch's floats; @p found and @p hints are optional. */
static mt_err_t lookup_train(mt_table_t *t, const uint64_t *fids, size_t n, float *out, size_t need,
                             uint8_t *found, uint32_t now_s, mt_table_hint_t *hints,
                             mt_table_op_stats_t *st) {
    size_t off = 0;
    wpipe_t wp;
    mt__part_t *held = NULL;
    wpipe_start(t, &wp, fids, n, 0);
    for (size_t i = 0; i < n; i++) {
        const mt__slot_t *s = mt__slot_of(t, fids[i]);
        int ok = 0;
        hpair_t h = wpipe_next(t, &wp, i);
        mt_err_t err = lookup_train_one(t, s, fids[i], h, out + off, now_s, &ok,
                                        hints ? &hints[i] : NULL, &held, st);
        if (found) found[i] = (uint8_t)ok;
        if (st) {
            st->found += ok;
            st->missing += !ok;
        }
        if (err) {
            part_release(&held);
            /* Zero what is left so the caller never reads garbage; no hints past it. */
            memset(out + off, 0, (need - off) * sizeof(float));
            if (found) memset(found + i, 0, n - i);
            if (hints) memset(hints + i, 0, (n - i) * sizeof(*hints));
            return err;
        }
        off += s->cfg.dim;
    }
    part_release(&held);
    return MT_OK;
}

mt_err_t mt_table_lookup(mt_table_t *t, const uint64_t *fids, size_t n, float *out, size_t out_len,
                         uint8_t *found, unsigned flags, uint32_t now_s, mt_table_op_stats_t *st) {
    size_t need;
    mt_err_t err = mt_table_batch_floats(t, fids, n, &need);
    if (err) return err;
    if (out_len < need) return MT_TOO_SMALL;
    if (!(flags & MT_TABLE_TRAIN)) {
        lookup_readonly(t, fids, n, out, found, st);
        return MT_OK;
    }
    return lookup_train(t, fids, n, out, need, found, now_s, NULL, st);
}

mt_err_t mt_table_lookup_rows(mt_table_t *t, const uint64_t *fids, size_t n, float *out,
                              size_t out_len, uint32_t now_s, mt_table_hint_t *hints,
                              mt_table_op_stats_t *st) {
    size_t need;
    mt_err_t err = mt_table_batch_floats(t, fids, n, &need);
    if (err) return err;
    if (out_len < need) return MT_TOO_SMALL;
    return lookup_train(t, fids, n, out, need, NULL, now_s, hints, st);
}

/* ============================== apply / assign / remove ============================== */

/* Applies gradient @p g to fid's row (p->lock held): the optimizer under the seqlock, a
 * new version, the touch, the change log. */
static inline void apply_row(mt_table_t *t, mt__part_t *p, const mt__slot_t *s, uint64_t fid,
                             void *row, const float *g, uint32_t now_s) {
    mt__row_t *hdr = mt__row_hdr(s, row);
    float *state = mt__row_state(s, row);
    uint64_t v = mt__part_version(t, p);
    seq_write_begin(p);
    if (s->cfg.precision == MT_PREC_FP32) {
        mt__opt_apply(&s->cfg, (float *)row, state, g);
    } else {
        float w[MT_TABLE_MAX_DIM];
        mt__row_read_emb(s, row, w);
        mt__opt_apply(&s->cfg, w, state, g);
        mt__row_write_emb(s, row, w);
    }
    log_note_change(p, hdr->version);
    hdr->version = v;
    seq_write_end(p);
    if (now_s > hdr->touch_s) hdr->touch_s = now_s;
    mt__log_append(t, p, fid, v, row);
}

/* How many ids ahead an apply with hints prefetches rows. */
#define MT__HINT_AHEAD 8

/* Prefetches id i's row by its hint, if it has one: no bucket is read. A stale hint only
 * wastes its prefetch (the arena keeps freed rows' memory mapped). Always inlined, as
 * prefetch_row is (see there). */
static inline __attribute__((always_inline)) void
prefetch_hinted(const mt_table_t *t, const uint64_t *fids, const mt_table_hint_t *hints, size_t i) {
    if (hints[i].opaque[0])
        prefetch_row(mt__slot_of(t, fids[i]), (const char *)(uintptr_t)hints[i].opaque[0], 1);
}

/* mt_table_apply(), or with @p hints mt_table_apply_rows(): each id's row is found through
 * the writers' pipeline, or taken from its hint when the hint counts (found anew if not). */
static mt_err_t apply_batch(mt_table_t *t, const uint64_t *fids, const mt_table_hint_t *hints,
                            size_t n, const float *grads, size_t grads_len, uint32_t now_s,
                            mt_table_op_stats_t *st) {
    size_t need;
    mt_err_t err = mt_table_batch_floats(t, fids, n, &need);
    if (err) return err;
    if (grads_len != need) return MT_TOO_SMALL;
    size_t off = 0;
    uint64_t nfound = 0;
    mt__part_t *held = NULL;
    wpipe_t wp;
    if (hints) {
        for (size_t i = 0; i < n && i < MT__HINT_AHEAD; i++)
            prefetch_hinted(t, fids, hints, i);
    } else {
        wpipe_start(t, &wp, fids, n, 1);
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t fid = fids[i];
        const mt__slot_t *s = mt__slot_of(t, fid);
        const float *g = grads + off;
        off += s->cfg.dim;
        hpair_t h = {0, 0};
        mt__part_t *p;
        if (hints) {
            if (i + MT__HINT_AHEAD < n) prefetch_hinted(t, fids, hints, i + MT__HINT_AHEAD);
            p = &t->parts[mt__part_of(t, fid)];
        } else {
            h = wpipe_next(t, &wp, i);
            p = &t->parts[part_index(t, h.h1)];
        }
        part_hold(&held, p);
        void *row = hints ? hint_row(&hints[i], p, fid) : NULL;
        assert(!row || row == mt__part_find(t, p, fid)); /* a hint that counts is the truth */
        if (!row && hints) {
            row = mt__part_find(t, p, fid);
        } else if (!row) {
            uint64_t b;
            int slot;
            row = arr_find(atomic_load_explicit(&p->arr, memory_order_relaxed), h, fid, &b, &slot);
        }
        if (row) {
            apply_row(t, p, s, fid, row, g, now_s);
            nfound++;
        }
    }
    part_release(&held);
    if (st) {
        st->found += nfound;
        st->missing += n - nfound;
    }
    return MT_OK;
}

mt_err_t mt_table_apply(mt_table_t *t, const uint64_t *fids, size_t n, const float *grads,
                        size_t grads_len, uint32_t now_s, mt_table_op_stats_t *st) {
    return apply_batch(t, fids, NULL, n, grads, grads_len, now_s, st);
}

mt_err_t mt_table_apply_rows(mt_table_t *t, const uint64_t *fids, const mt_table_hint_t *hints,
                             size_t n, const float *grads, size_t grads_len, uint32_t now_s,
                             mt_table_op_stats_t *st) {
    return apply_batch(t, fids, hints, n, grads, grads_len, now_s, st);
}

mt_err_t mt_table_assign(mt_table_t *t, const uint64_t *fids, size_t n, const float *values,
                         size_t values_len, uint32_t now_s, mt_table_op_stats_t *st) {
    size_t need;
    mt_err_t err = mt_table_batch_floats(t, fids, n, &need);
    if (err) return err;
    if (values_len != need) return MT_TOO_SMALL;
    size_t off = 0;
    mt__part_t *held = NULL;
    for (size_t i = 0; i < n; i++) {
        uint64_t fid = fids[i];
        const mt__slot_t *s = mt__slot_of(t, fid);
        const float *val = values + off;
        off += s->cfg.dim;
        hpair_t h = hash_fid(t, fid);
        mt__part_t *p = &t->parts[part_index(t, h.h1)];
        mt__barray_t *retired = NULL;
        uint64_t b;
        int slot;
        part_hold(&held, p);
        mt__barray_t *a = atomic_load_explicit(&p->arr, memory_order_relaxed);
        void *row = arr_find(a, h, fid, &b, &slot);
        uint64_t v = mt__part_version(t, p);
        if (row) {
            mt__row_t *hdr = mt__row_hdr(s, row);
            seq_write_begin(p);
            mt__row_write_emb(s, row, val);
            log_note_change(p, hdr->version);
            hdr->version = v;
            seq_write_end(p);
            if (now_s > hdr->touch_s) hdr->touch_s = now_s;
            mt__log_append(t, p, fid, v, row);
            if (st) st->found++;
        } else {
            void *nrow;
            err = part_insert(t, p, fid, h, s, val, NULL, now_s, 1, v, &nrow, &retired);
            if (!err) {
                mt__log_append(t, p, fid, v, nrow);
                if (st) st->admitted++;
            }
        }
        if (retired || err) part_release(&held);
        mt__retire(t, retired);
        if (err) return err;
    }
    part_release(&held);
    return MT_OK;
}

mt_err_t mt_table_remove(mt_table_t *t, const uint64_t *fids, size_t n, uint64_t *removed) {
    uint64_t cnt = 0;
    for (size_t i = 0; i < n; i++) {
        if (!mt__slot_of(t, fids[i])) return MT_UNKNOWN_SLOT;
    }
    for (size_t i = 0; i < n; i++) {
        hpair_t h = hash_fid(t, fids[i]);
        mt__part_t *p = &t->parts[part_index(t, h.h1)];
        uint64_t b;
        int slot;
        mt__part_lock(p);
        mt__barray_t *a = atomic_load_explicit(&p->arr, memory_order_relaxed);
        if (arr_find(a, h, fids[i], &b, &slot)) {
            part_remove_at(t, p, a, b, slot);
            p->n_removals++;
            cnt++;
        }
        mt__part_unlock(p);
    }
    if (removed) *removed = cnt;
    return MT_OK;
}

mt_err_t mt_table_get_row(mt_table_t *t, uint64_t fid, float *emb, float *state, size_t state_len,
                          uint32_t *touch_s, uint32_t *count, uint64_t *version) {
    const mt__slot_t *s = mt__slot_of(t, fid);
    if (!s) return MT_UNKNOWN_SLOT;
    if (state && state_len < s->state_floats) return MT_TOO_SMALL;
    hpair_t h = hash_fid(t, fid);
    mt__part_t *p = &t->parts[part_index(t, h.h1)];
    uint64_t b;
    int slot;
    mt_err_t err = MT_OK;
    mt__part_lock(p);
    void *row = arr_find(atomic_load_explicit(&p->arr, memory_order_relaxed), h, fid, &b, &slot);
    if (!row) {
        err = MT_NOT_FOUND;
    } else {
        const mt__row_t *hdr = mt__row_hdr(s, row);
        if (emb) mt__row_read_emb(s, row, emb);
        if (state && s->state_floats)
            memcpy(state, mt__row_state(s, row), s->state_floats * sizeof(float));
        if (touch_s) *touch_s = hdr->touch_s;
        if (count) *count = hdr->count;
        if (version) *version = hdr->version;
    }
    mt__part_unlock(p);
    return err;
}

/* ============================== expiry ============================== */

mt_err_t mt_table_expire(mt_table_t *t, uint32_t now_s, size_t max_buckets, uint64_t *evicted) {
    uint64_t cnt = 0;
    size_t budget = max_buckets;
    pthread_mutex_lock(&t->expire_lock);
    /* Visit at most every part once per call so an empty table does not spin. */
    for (uint32_t visited = 0; budget > 0 && visited <= t->nparts; visited++) {
        mt__part_t *p = &t->parts[t->expire_part];
        mt__part_lock(p);
        mt__barray_t *a = atomic_load_explicit(&p->arr, memory_order_relaxed);
        uint64_t nb = a->mask + 1, b = t->expire_bucket;
        for (; b < nb && budget > 0; b++, budget--) {
            for (int i = 0; i < MT__BUCKET_SLOTS; i++) {
                void *row = a->b[b].row[i];
                if (!row) continue;
                const mt__slot_t *s = mt__slot_of(t, a->b[b].key[i]);
                if (s->cfg.ttl_s && (uint64_t)mt__row_hdr(s, row)->touch_s + s->cfg.ttl_s < now_s) {
                    part_remove_at(t, p, a, b, i);
                    p->n_evictions++;
                    cnt++;
                }
            }
        }
        mt__part_unlock(p);
        if (b >= nb) {
            t->expire_bucket = 0;
            t->expire_part = (t->expire_part + 1) & (t->nparts - 1);
        } else {
            t->expire_bucket = b;
        }
    }
    pthread_mutex_unlock(&t->expire_lock);
    if (evicted) *evicted = cnt;
    return MT_OK;
}
