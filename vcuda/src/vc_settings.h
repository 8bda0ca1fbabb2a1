/* Process settings from the environment, read once at first CUDA use. */
#ifndef VC_SETTINGS_H
#define VC_SETTINGS_H

#define VC_PATH_MAX 512

struct vc_settings {
    char socket_path[VC_PATH_MAX]; /* VCUDA_SOCKET */
    char limits_path[VC_PATH_MAX]; /* VCUDA_LIMITS */
    char real_cuda[VC_PATH_MAX];   /* VCUDA_REAL_CUDA, "" = search */
    char real_nvml[VC_PATH_MAX];   /* VCUDA_REAL_NVML, "" = search */
    char shared_dir[VC_PATH_MAX];  /* VCUDA_SHARED_DIR */
    char ld_library_path[4096];    /* searched for the real driver when installed as libcuda.so.1 */
    int log_level;                 /* VCUDA_LOG_LEVEL */
};

/* Read the environment (first call only) and return the settings. */
const struct vc_settings *vc_settings(void);

#endif
