/* cuInit: the first CUDA call. Limits are loaded here; without them CUDA is
 * refused (fail closed) with one clear line on stderr. */
#define _GNU_SOURCE
#include "vc_hooks.h"
#include "vc_log.h"
#include "vc_pfn.h"
#include "vc_state.h"

CUresult cuInit(unsigned int flags)
{
    int p = vc_process_init();
    if (p == VC_PHASE_NODRIVER)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (p == VC_PHASE_CLOSED) {
        vc_report_closed();
        return CUDA_ERROR_NOT_PERMITTED;
    }
    CUresult r = REAL(cuInit)(flags);
    if (r == CUDA_SUCCESS)
        vc_devices_init();
    return r;
}
