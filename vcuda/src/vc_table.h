/* This process's live allocations: handle -> (device slot, bytes), so a
 * free gives back exactly what its allocation reserved. */
#ifndef VC_TABLE_H
#define VC_TABLE_H

#include <stdint.h>

enum vc_kind { VC_KIND_DPTR = 1, VC_KIND_ARRAY = 2, VC_KIND_MIPMAP = 3, VC_KIND_VMM = 4 };

struct vc_alloc {
    uint64_t key;
    uint64_t bytes;
    int32_t kind; /* 0 empty, -1 deleted */
    int32_t dev;
};

int vc_table_add(int kind, uint64_t key, int dev, uint64_t bytes);
/* Remove and return the entry; 0 if there was none (an unknown handle). */
int vc_table_take(int kind, uint64_t key, struct vc_alloc *out);
void vc_table_reset(void); /* after fork, in the child */

#endif
