/*
 * test_batch.c - the example batch: CSR layout, slot checks, growth, the fid contract.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "mt/batch.h"

Test(batch, add_and_read_back) {
    uint16_t slots[3] = {1, 2, 7};
    mt_batch_t b;
    cr_assert_eq(mt_batch_init(&b, slots, 3), MT_OK);
    for (int i = 0; i < 1000; i++) { /* forces several reallocations */
        uint64_t u = mt_fid_of_int(1, (uint64_t)i),
                 it[2] = {mt_fid_of_int(2, 5), mt_fid_of_int(2, 6)};
        const uint64_t *f[3] = {&u, it, NULL};
        uint32_t c[3] = {1, (uint32_t)(i % 3), 0};
        cr_assert_eq(mt_batch_add(&b, (float)(i & 1), 1000 * i, 0.5f, f, c), MT_OK);
    }
    cr_assert_eq(b.n, 1000);
    size_t n;
    const uint64_t *p = mt_batch_fids(&b, 10, 0, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(p[0], mt_fid_of_int(1, 10));
    p = mt_batch_fids(&b, 11, 1, &n);
    cr_assert_eq(n, 2);
    cr_assert_eq(p[1], mt_fid_of_int(2, 6));
    mt_batch_fids(&b, 12, 1, &n);
    cr_assert_eq(n, 0);
    mt_batch_fids(&b, 999, 2, &n);
    cr_assert_eq(n, 0);
    cr_assert_eq(b.labels[7], 1.0f);
    cr_assert_eq(b.timestamps_ms[7], 7000);
    cr_assert_eq(b.sample_rates[3], 0.5f);
    mt_batch_clear(&b);
    cr_assert_eq(b.n, 0);
    cr_assert_eq(b.nfids, 0);
    mt_batch_free(&b);
    mt_batch_free(&b); /* freed twice: a no-op */
}

Test(batch, fid_of_another_slot_is_refused_and_nothing_added) {
    uint16_t slots[2] = {1, 2};
    mt_batch_t b;
    cr_assert_eq(mt_batch_init(&b, slots, 2), MT_OK);
    uint64_t a = mt_fid_of_int(1, 1), wrong = mt_fid_of_int(3, 1);
    const uint64_t *f[2] = {&a, &wrong};
    uint32_t c[2] = {1, 1};
    cr_assert_eq(mt_batch_add(&b, 1, 0, 1, f, c), MT_INVALID);
    cr_assert_eq(b.n, 0);
    cr_assert_eq(b.nfids, 0);
    mt_batch_free(&b);
    mt_batch_t z;
    cr_assert_eq(mt_batch_init(&z, slots, 0), MT_INVALID);
    mt_batch_free(&z); /* zeroed by the refused init: a no-op */
}

Test(batch, fid_contract) {
    cr_assert_eq(mt_fid_of_int(3, 42), ((uint64_t)3 << 48) | 42);
    cr_assert_eq(mt_fid_of_int(3, 1ull << 50), (uint64_t)3 << 48, "values keep their low 48 bits");
    uint64_t f = mt_fid_of_bytes(14, "68fd1e64", 8);
    cr_assert_eq(f >> 48, 14);
    cr_assert_neq(f, mt_fid_of_bytes(14, "68fd1e65", 8));
    cr_assert_eq(f, mt_fid_of_bytes(14, "68fd1e64", 8));
}

Test(batch, gather_copies_chosen_examples_in_order) {
    uint16_t slots[2] = {1, 2};
    mt_batch_t all, b, other;
    cr_assert_eq(mt_batch_init(&all, slots, 2), MT_OK);
    cr_assert_eq(mt_batch_init(&b, slots, 2), MT_OK);
    for (int i = 0; i < 10; i++) {
        uint64_t u = mt_fid_of_int(1, (uint64_t)i), it[3];
        for (int k = 0; k < 3; k++)
            it[k] = mt_fid_of_int(2, (uint64_t)(10 * i + k));
        const uint64_t *f[2] = {&u, it};
        uint32_t c[2] = {1, (uint32_t)(i % 4 == 3 ? 0 : i % 4)};
        cr_assert_eq(mt_batch_add(&all, (float)(i & 1), 100 * i, 0.1f * (float)(i + 1), f, c),
                     MT_OK);
    }
    size_t idx[4] = {7, 2, 9, 2};
    cr_assert_eq(
        mt_batch_add(&b, 1, 1, 1, (const uint64_t *const[]){NULL, NULL}, (const uint32_t[]){0, 0}),
        MT_OK);
    cr_assert_eq(mt_batch_gather(&all, idx, 4, &b), MT_OK);
    cr_assert_eq(b.n, 4, "what b held before is replaced");
    for (size_t j = 0; j < 4; j++) {
        cr_assert_eq(b.labels[j], all.labels[idx[j]]);
        cr_assert_eq(b.timestamps_ms[j], all.timestamps_ms[idx[j]]);
        cr_assert_eq(b.sample_rates[j], all.sample_rates[idx[j]]);
        for (uint32_t s = 0; s < 2; s++) {
            size_t n1, n2;
            const uint64_t *p1 = mt_batch_fids(&b, j, s, &n1),
                           *p2 = mt_batch_fids(&all, idx[j], s, &n2);
            cr_assert_eq(n1, n2);
            if (n1) cr_assert_eq(memcmp(p1, p2, n1 * sizeof(uint64_t)), 0);
        }
    }
    uint16_t others[2] = {1, 3};
    cr_assert_eq(mt_batch_init(&other, others, 2), MT_OK);
    cr_assert_eq(mt_batch_gather(&all, idx, 4, &other), MT_INVALID, "a batch of other slots");
    mt_batch_free(&other);
    mt_batch_free(&b);
    mt_batch_free(&all);
}

/* A multi-task batch: ntasks labels per example in task order, copied by gather; the
 * one-label add refused on it, the tasks fixed once examples exist. */
Test(batch, tasks_carry_a_label_each) {
    const uint16_t slots[1] = {1};
    mt_batch_t b, g;
    cr_assert_eq(mt_batch_init(&b, slots, 1), MT_OK);
    cr_assert_eq(b.ntasks, 1);
    cr_assert_eq(mt_batch_set_tasks(&b, 0), MT_INVALID);
    cr_assert_eq(mt_batch_set_tasks(&b, MT_BATCH_MAX_TASKS + 1), MT_INVALID);
    cr_assert_eq(mt_batch_set_tasks(&b, 3), MT_OK);
    uint64_t f = mt_fid_of_int(1, 5);
    const uint64_t *fp[1] = {&f};
    const uint32_t c[1] = {1};
    cr_assert_eq(mt_batch_add(&b, 1.0f, 0, 1, fp, c), MT_INVALID);
    for (int i = 0; i < 100; i++) { /* past the first capacity: the labels grow with it */
        const float l[3] = {(float)(i & 1), (float)(i % 3 == 0), 1.0f};
        cr_assert_eq(mt_batch_add_labels(&b, l, i, 1, fp, c), MT_OK);
    }
    cr_assert_eq(mt_batch_set_tasks(&b, 2), MT_INVALID); /* examples present */
    for (int i = 0; i < 100; i++) {
        cr_assert_eq(b.labels[i * 3], (float)(i & 1));
        cr_assert_eq(b.labels[i * 3 + 1], (float)(i % 3 == 0));
        cr_assert_eq(b.labels[i * 3 + 2], 1.0f);
    }
    cr_assert_eq(mt_batch_init(&g, slots, 1), MT_OK);
    const size_t idx[2] = {7, 3};
    cr_assert_eq(mt_batch_gather(&b, idx, 2, &g), MT_INVALID); /* one task: not b's three */
    cr_assert_eq(mt_batch_set_tasks(&g, 3), MT_OK);
    cr_assert_eq(mt_batch_gather(&b, idx, 2, &g), MT_OK);
    const float want[6] = {1, 0, 1, 1, 1, 1}; /* examples 7 and 3 */
    cr_assert_eq(memcmp(g.labels, want, sizeof(want)), 0);
    mt_batch_clear(&b);
    cr_assert_eq(b.ntasks, 3);
    mt_batch_free(&b);
    mt_batch_free(&g);
}
