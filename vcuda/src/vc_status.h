/* The container's compute-limit status, for the node agent: a small text
 * file next to the shared state ($VCUDA_SHARED_DIR/vcuda-v<N>-<key>.status),
 * rewritten whenever the way a device's use is measured changes:
 *
 *     version=1
 *     container_id=<64 hex, or empty>
 *     device<slot>_uuid=GPU-...   (MIG-... for a MIG instance)
 *     device<slot>_compute=process|device|gpm|unthrottled
 *
 * gpm: a MIG instance measured by GPM per-instance samples; unthrottled: the
 * compute limit is not enforced (nothing to measure by, e.g. a MIG instance
 * on a card without GPM); memory is limited in every mode.
 */
#ifndef VC_STATUS_H
#define VC_STATUS_H

#include "vc_shm.h"

void vc_status_write(struct vc_shm *shm);
const char *vc_measure_name(unsigned mode);

#endif
