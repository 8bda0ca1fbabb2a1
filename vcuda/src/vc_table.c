#define _GNU_SOURCE
#include "vc_table.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct vc_alloc *slots;
static size_t cap, live, used; /* used = live + tombstones */

static size_t hash(int kind, uint64_t key)
{
    uint64_t h = key ^ ((uint64_t)kind << 56);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return (size_t)h;
}

static int grow(void)
{
    size_t ncap = cap ? cap * 2 : 1024;
    if (live * 4 < cap)
        ncap = cap; /* mostly tombstones: rebuild at the same size */
    struct vc_alloc *n = calloc(ncap, sizeof(*n));
    if (!n)
        return -1;
    for (size_t i = 0; i < cap; i++) {
        if (slots[i].kind <= 0)
            continue;
        size_t j = hash(slots[i].kind, slots[i].key) & (ncap - 1);
        while (n[j].kind != 0)
            j = (j + 1) & (ncap - 1);
        n[j] = slots[i];
    }
    free(slots);
    slots = n;
    cap = ncap;
    used = live;
    return 0;
}

int vc_table_add(int kind, uint64_t key, int dev, uint64_t bytes)
{
    pthread_mutex_lock(&mu);
    if ((used + 1) * 2 > cap && grow() != 0) {
        pthread_mutex_unlock(&mu);
        return -1;
    }
    size_t j = hash(kind, key) & (cap - 1);
    while (slots[j].kind > 0 && !(slots[j].kind == kind && slots[j].key == key))
        j = (j + 1) & (cap - 1);
    if (slots[j].kind <= 0) {
        if (slots[j].kind == 0)
            used++;
        live++;
    }
    slots[j] = (struct vc_alloc){.key = key, .bytes = bytes, .kind = kind, .dev = dev};
    pthread_mutex_unlock(&mu);
    return 0;
}

int vc_table_take(int kind, uint64_t key, struct vc_alloc *out)
{
    pthread_mutex_lock(&mu);
    if (cap == 0) {
        pthread_mutex_unlock(&mu);
        return 0;
    }
    size_t j = hash(kind, key) & (cap - 1);
    while (slots[j].kind != 0) {
        if (slots[j].kind == kind && slots[j].key == key) {
            *out = slots[j];
            slots[j].kind = -1;
            live--;
            pthread_mutex_unlock(&mu);
            return 1;
        }
        j = (j + 1) & (cap - 1);
    }
    pthread_mutex_unlock(&mu);
    return 0;
}

void vc_table_reset(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    memcpy(&mu, &fresh, sizeof(mu));
    free(slots);
    slots = NULL;
    cap = live = used = 0;
}
