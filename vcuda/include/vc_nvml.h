/* Our own declarations of the NVML types and constants used by the shim,
 * the fake NVML and the tests (values and layouts from the public NVML API). */
#ifndef VC_NVML_H
#define VC_NVML_H

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999
};

typedef struct nvmlDevice_st *nvmlDevice_t;

#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

/* NVML_STRUCT_VERSION(Memory, 2) */
#define VC_NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct nvmlProcessUtilizationSample_st {
    unsigned int pid;
    unsigned long long timeStamp; /* CPU timestamp, microseconds */
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct nvmlProcessInfo_v1_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct nvmlProcessInfo_st { /* v2 and v3 layout */
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* nvmlDeviceArchitecture_t values */
#define NVML_DEVICE_ARCH_AMPERE 7
#define NVML_DEVICE_ARCH_HOPPER 9

/* GPM (GPU performance monitoring, Hopper and later): samples of counters,
 * metrics computed from two of them. */
typedef struct nvmlGpmSample_st *nvmlGpmSample_t;

#define NVML_GPM_METRIC_GRAPHICS_UTIL 1
#define NVML_GPM_METRIC_SM_UTIL 2
#define NVML_GPM_METRIC_SM_OCCUPANCY 3
#define NVML_GPM_METRIC_MAX 477 /* the array size of the NVML 13 header; older headers have fewer */
#define NVML_GPM_METRICS_GET_VERSION 1
#define NVML_GPM_SUPPORT_VERSION 1

typedef struct {
    char *shortName;
    char *longName;
    char *unit;
} nvmlGpmMetricInfo_t;

typedef struct {
    unsigned int metricId;     /* IN */
    nvmlReturn_t nvmlReturn;   /* OUT: this metric's status */
    double value;              /* OUT */
    nvmlGpmMetricInfo_t metricInfo; /* OUT */
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version;      /* IN: NVML_GPM_METRICS_GET_VERSION */
    unsigned int numMetrics;   /* IN */
    nvmlGpmSample_t sample1;   /* IN */
    nvmlGpmSample_t sample2;   /* IN */
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

typedef struct {
    unsigned int version;           /* IN: NVML_GPM_SUPPORT_VERSION */
    unsigned int isSupportedDevice; /* OUT */
} nvmlGpmSupport_t;

#endif
