/* Finding and opening the real CUDA driver and NVML (never this library). */
#ifndef VC_LOADER_H
#define VC_LOADER_H

/* Open the real libcuda and resolve every hooked and internal symbol.
 * Thread-safe, runs once. 0 ok, -1 the real driver cannot be found. */
int vc_loader_cuda(void);
/* Same for NVML. */
int vc_loader_nvml(void);
/* glibc's dlsym, whatever this library exports under that name. */
void *vc_real_dlsym(void *handle, const char *name);
/* A symbol of the real libcuda / libnvidia-ml (after the loader ran), or NULL. */
void *vc_real_cuda_sym(const char *name);
void *vc_real_nvml_sym(const char *name);
/* Non-zero if addr lies inside the real libcuda or libnvidia-ml. */
int vc_addr_in_real(const void *addr);

#endif
