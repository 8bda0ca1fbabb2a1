/* The container's compute-limit status, for the node agent: a small text
 * file next to the shared state ($VCUDA_SHARED_DIR/vcuda-v<N>-<key>.status),
 * rewritten whenever the way a device's use is measured changes:
 *
 *     version=1
 *     container_id=<64 hex, or empty>
 *     device<slot>_uuid=GPU-...
 *     device<slot>_compute=process|device|unthrottled
 */
#ifndef VC_STATUS_H
#define VC_STATUS_H

#include "vc_shm.h"

void vc_status_write(struct vc_shm *shm);
const char *vc_measure_name(unsigned mode);

#endif
