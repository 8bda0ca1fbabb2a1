/* vcmem: memory-limit scenarios, one per subcommand. Each prints PASS/FAIL
 * lines and exits non-zero if any check failed.
 *   vcmem paths                 every allocation path, exact byte counts, limit and free
 *   vcmem info [ordinal]        cuMemGetInfo, cuDeviceTotalMem and NVML side by side
 *   vcmem race CHUNK_MB START RELEASE   allocate until refused, report what is held
 *   vcmem unknown               frees of handles the shim never saw
 *   vcmem rollback              real driver OOM gives the reservation back
 *   vcmem hold BYTES            hold memory until killed
 *   vcmem hold-thread BYTES     hold memory, then end the main thread (pthread_exit) while another sleeps
 *   vcmem hold-fork BYTES       hold memory, fork a child that only sleeps, say CHILD <pid>, sleep
 *   vcmem hold-closefds BYTES   hold memory, close every descriptor above 2 (as daemons do), wait 2 s, say CLOSED
 *   vcmem fill                  allocate everything the limit allows, report it
 *   vcmem ctx CTX_BYTES         context memory is counted (through NVML)
 *   vcmem devices               per-device limits with several GPUs
 *   vcmem churn                 allocate and free in a loop until killed
 *   vcmem init                  cuInit and one allocation, print the results
 *   vcmem serve                 cuInit, say READY <pid>, then obey stdin lines: "alloc BYTES" (says ALLOC <rc>),
 *                               "exit", "_exit" (end that way); end with exit() at end of input */
#include <pthread.h>

#include "testlib.h"

static unsigned long long remaining(void)
{
    size_t f = 0, t = 0;
    cuMemGetInfo_v2(&f, &t);
    return f;
}

static void paths(void)
{
    unsigned long long base = t_used();
    CUdeviceptr p, q;

    /* cuMemAlloc_v2: counted, refused beyond the limit, given back on free. */
    EXPECT_RC(cuMemAlloc_v2(&p, 64 * MiB), CUDA_SUCCESS);
    EXPECT(t_used() == base + 64 * MiB, "cuMemAlloc_v2 counted %llu, want %llu", t_used() - base, 64 * MiB);
    unsigned long long left = remaining();
    EXPECT_RC(cuMemAlloc_v2(&q, left + 1), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(t_used() == base + 64 * MiB, "a refused allocation changed the count");
    EXPECT_RC(cuMemAlloc_v2(&q, left), CUDA_SUCCESS); /* exactly up to the limit is allowed */
    EXPECT(remaining() == 0, "after filling, %llu bytes are still free", remaining());
    CUdeviceptr extra;
    EXPECT_RC(cuMemAlloc_v2(&extra, 1), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuMemFree_v2(q), CUDA_SUCCESS);
    EXPECT_RC(cuMemFree_v2(p), CUDA_SUCCESS);
    EXPECT(t_used() == base, "frees left %llu", t_used() - base);
    printf("PASS cuMemAlloc_v2\n");

    /* Legacy 32-bit cuMemAlloc. */
    CUdeviceptr_v1 p1;
    unsigned long long before = t_used();
    EXPECT_RC(cuMemAlloc(&p1, 3 * MiB), CUDA_SUCCESS);
    EXPECT(t_used() == before + 3 * MiB, "cuMemAlloc counted %llu", t_used() - before);
    EXPECT_RC(cuMemFree(p1), CUDA_SUCCESS);
    EXPECT(t_used() == before, "cuMemFree gave back %llu", before + 3 * MiB - t_used());
    printf("PASS cuMemAlloc (legacy)\n");

    /* Pitch: the driver's pitch (1000 bytes -> 1024) times the height. */
    size_t pitch = 0;
    before = t_used();
    EXPECT_RC(cuMemAllocPitch_v2(&q, &pitch, 1000, 1000, 4), CUDA_SUCCESS);
    EXPECT(pitch == 1024, "pitch %zu", pitch);
    EXPECT(t_used() == before + 1024ull * 1000, "pitch counted %llu, want %llu", t_used() - before,
           1024ull * 1000);
    EXPECT_RC(cuMemAllocPitch_v2(&p, &pitch, 4096, remaining() / 4096 + 1, 4), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuMemFree_v2(q), CUDA_SUCCESS);
    EXPECT(t_used() == before, "pitch free left %llu", t_used() - before);
    printf("PASS cuMemAllocPitch_v2\n");

    /* Managed memory counts against the device. */
    before = t_used();
    EXPECT_RC(cuMemAllocManaged(&q, 32 * MiB, 1), CUDA_SUCCESS);
    EXPECT(t_used() == before + 32 * MiB, "managed counted %llu", t_used() - before);
    EXPECT_RC(cuMemAllocManaged(&p, remaining() + 1, 1), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuMemFree_v2(q), CUDA_SUCCESS);
    printf("PASS cuMemAllocManaged\n");

    /* Arrays: element sizes in bytes, not bits. FLOAT x 4 channels = 16 bytes. */
    CUarray a;
    CUDA_ARRAY_DESCRIPTOR d2 = {.Width = 256, .Height = 256, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    before = t_used();
    EXPECT_RC(cuArrayCreate_v2(&a, &d2), CUDA_SUCCESS);
    EXPECT(t_used() == before + 1 * MiB, "2D array counted %llu, want %llu", t_used() - before, 1 * MiB);
    EXPECT_RC(cuArrayDestroy(a), CUDA_SUCCESS);
    EXPECT(t_used() == before, "array destroy left %llu", t_used() - before);
    CUDA_ARRAY_DESCRIPTOR d8 = {.Width = 512, .Height = 512, .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
    EXPECT_RC(cuArrayCreate_v2(&a, &d8), CUDA_SUCCESS);
    EXPECT(t_used() == before + 256 * 1024, "8-bit array counted %llu, want 262144", t_used() - before);
    EXPECT_RC(cuArrayDestroy(a), CUDA_SUCCESS);
    CUDA_ARRAY_DESCRIPTOR big = {.Width = 65536, .Height = 65536, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    EXPECT_RC(cuArrayCreate_v2(&a, &big), CUDA_ERROR_OUT_OF_MEMORY);
    printf("PASS cuArrayCreate_v2\n");

    /* 3D arrays: HALF x 2 channels, 64^3 = 1 MiB; layered: layers count in full. */
    CUDA_ARRAY3D_DESCRIPTOR d3 = {64, 64, 64, CU_AD_FORMAT_HALF, 2, 0};
    before = t_used();
    EXPECT_RC(cuArray3DCreate_v2(&a, &d3), CUDA_SUCCESS);
    EXPECT(t_used() == before + 1 * MiB, "3D array counted %llu", t_used() - before);
    EXPECT_RC(cuArrayDestroy(a), CUDA_SUCCESS);
    CUDA_ARRAY3D_DESCRIPTOR lay = {128, 128, 10, CU_AD_FORMAT_UNSIGNED_INT32, 1, CUDA_ARRAY3D_LAYERED};
    EXPECT_RC(cuArray3DCreate_v2(&a, &lay), CUDA_SUCCESS);
    EXPECT(t_used() == before + 128ull * 128 * 10 * 4, "layered array counted %llu", t_used() - before);
    EXPECT_RC(cuArrayDestroy(a), CUDA_SUCCESS);
    CUDA_ARRAY3D_DESCRIPTOR def = {1024, 1024, 0, CU_AD_FORMAT_FLOAT, 4, CUDA_ARRAY3D_DEFERRED_MAPPING};
    EXPECT_RC(cuArray3DCreate_v2(&a, &def), CUDA_SUCCESS);
    EXPECT(t_used() == before, "a deferred-mapping array (no memory of its own) counted %llu", t_used() - before);
    EXPECT_RC(cuArrayDestroy(a), CUDA_SUCCESS);
    printf("PASS cuArray3DCreate_v2\n");

    /* Mipmapped arrays: every level. */
    CUmipmappedArray m;
    CUDA_ARRAY3D_DESCRIPTOR dm = {256, 256, 0, CU_AD_FORMAT_FLOAT, 1, 0};
    before = t_used();
    EXPECT_RC(cuMipmappedArrayCreate(&m, &dm, 3), CUDA_SUCCESS);
    unsigned long long want = 256ull * 256 * 4 + 128ull * 128 * 4 + 64ull * 64 * 4;
    EXPECT(t_used() == before + want, "mipmap counted %llu, want %llu", t_used() - before, want);
    EXPECT_RC(cuMipmappedArrayDestroy(m), CUDA_SUCCESS);
    EXPECT(t_used() == before, "mipmap destroy left %llu", t_used() - before);
    printf("PASS cuMipmappedArrayCreate\n");

    /* VMM: cuMemCreate / cuMemRelease, as NCCL uses. */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h, h2;
    before = t_used();
    EXPECT_RC(cuMemCreate(&h, 4 * MiB, &prop, 0), CUDA_SUCCESS);
    EXPECT(t_used() == before + 4 * MiB, "cuMemCreate counted %llu", t_used() - before);
    EXPECT_RC(cuMemCreate(&h2, (remaining() / (2 * MiB) + 1) * 2 * MiB, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuMemRelease(h), CUDA_SUCCESS);
    EXPECT(t_used() == before, "cuMemRelease left %llu", t_used() - before);
    printf("PASS cuMemCreate\n");

    /* Stream-ordered allocation, default pool and an explicit pool. */
    before = t_used();
    EXPECT_RC(cuMemAllocAsync(&q, 8 * MiB, NULL), CUDA_SUCCESS);
    EXPECT(t_used() == before + 8 * MiB, "cuMemAllocAsync counted %llu", t_used() - before);
    CUmemoryPool pool;
    EXPECT_RC(cuDeviceGetDefaultMemPool(&pool, 0), CUDA_SUCCESS);
    CUdeviceptr r;
    EXPECT_RC(cuMemAllocFromPoolAsync(&r, 8 * MiB, pool, NULL), CUDA_SUCCESS);
    EXPECT(t_used() == before + 16 * MiB, "cuMemAllocFromPoolAsync counted %llu", t_used() - before);
    EXPECT_RC(cuMemAllocAsync(&p, remaining() + 1, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuMemAllocFromPoolAsync(&p, remaining() + 1, pool, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_RC(cuMemFreeAsync(q, NULL), CUDA_SUCCESS);
    EXPECT_RC(cuMemFreeAsync(r, NULL), CUDA_SUCCESS);
    EXPECT(t_used() == before, "async frees left %llu", t_used() - before);
    printf("PASS cuMemAllocAsync / cuMemAllocFromPoolAsync\n");

    EXPECT(t_used() == base, "after every path, %lld bytes are still counted", (long long)(t_used() - base));
}

static void info(int ordinal)
{
    size_t f = 0, t = 0, tm = 0;
    unsigned int f32 = 0, t32 = 0, tm32 = 0;
    cuMemGetInfo_v2(&f, &t);
    cuMemGetInfo(&f32, &t32);
    cuDeviceTotalMem_v2(&tm, ordinal);
    cuDeviceTotalMem(&tm32, ordinal);
    CUuuid u;
    char uuid[96];
    cuDeviceGetUuid(&u, ordinal);
    t_uuid(&u, uuid, sizeof(uuid));
    nvmlDevice_t nd;
    nvmlMemory_t m1 = {0};
    nvmlMemory_v2_t m2;
    memset(&m2, 0, sizeof(m2));
    m2.version = VC_NVML_MEMORY_V2_VERSION;
    nvmlInit_v2();
    nvmlReturn_t r1 = nvmlDeviceGetHandleByUUID(uuid, &nd);
    if (r1 == NVML_SUCCESS) {
        nvmlDeviceGetMemoryInfo(nd, &m1);
        nvmlDeviceGetMemoryInfo_v2(nd, &m2);
    }
    printf("INFO cuda_total=%zu cuda_free=%zu cuda32_total=%u cuda32_free=%u devtotal=%zu devtotal32=%u "
           "nvml_total=%llu nvml_free=%llu nvml_used=%llu nvml2_total=%llu nvml2_free=%llu nvml2_used=%llu\n",
           t, f, t32, f32, tm, tm32, m1.total, m1.free, m1.used, m2.total, m2.free, m2.used);
}

static int alloc_chunk(int kind, unsigned long long bytes)
{
    CUdeviceptr p;
    CUmemGenericAllocationHandle h;
    CUmemAllocationProp prop;
    switch (kind % 4) {
    case 0:
        return cuMemAlloc_v2(&p, bytes);
    case 1:
        return cuMemAllocManaged(&p, bytes, 1);
    case 2:
        memset(&prop, 0, sizeof(prop));
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        return cuMemCreate(&h, bytes, &prop, 0);
    default:
        return cuMemAllocAsync(&p, bytes, NULL);
    }
}

static void race(unsigned long long chunk, const char *start, const char *release)
{
    t_wait_for_file(start, 30);
    unsigned long long held = 0;
    int refused = 0;
    for (int i = 0; i < 100000 && refused < 3; i++) {
        CUresult r = alloc_chunk(i, chunk);
        if (r == CUDA_SUCCESS)
            held += chunk;
        else if (r == CUDA_ERROR_OUT_OF_MEMORY)
            refused++;
        else {
            EXPECT(0, "allocation returned %d", r);
            break;
        }
    }
    printf("HELD %llu\n", held);
    fflush(stdout);
    t_wait_for_file(release, 60);
}

static void unknown(void)
{
    unsigned long long base = t_used();
    unsigned long long pool0 = fakegpu_pool_used(0);
    CUdeviceptr p;
    EXPECT_RC(fakegpu_alloc_untracked(&p, 16 * MiB), CUDA_SUCCESS);
    EXPECT(fakegpu_pool_used(0) == pool0 + 16 * MiB, "untracked allocation not taken from the pool");
    EXPECT_RC(cuMemFree_v2(p), CUDA_SUCCESS); /* reaches the driver */
    EXPECT(fakegpu_pool_used(0) == pool0, "the unknown free did not reach the driver");
    EXPECT(t_used() == base, "an unknown free changed the container's count by %lld",
           (long long)(t_used() - base));
    EXPECT_RC(cuMemFree_v2((CUdeviceptr)0xdead0000ull), CUDA_ERROR_INVALID_VALUE); /* the driver's own answer */
    EXPECT_RC(cuArrayDestroy((CUarray)(uintptr_t)0xbeef000ull), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_RC(cuMemRelease(0x1234567ull), CUDA_ERROR_INVALID_VALUE);
    EXPECT(t_used() == base, "garbage frees changed the count");
    printf("PASS unknown frees pass through\n");
}

static void rollback(void)
{
    unsigned long long base = t_used();
    size_t f, t;
    cuMemGetInfo_v2(&f, &t);
    /* The limit is above the physical pool: the driver itself refuses. */
    CUdeviceptr p;
    unsigned long long phys = fakegpu_pool_used(0);
    (void)phys;
    EXPECT_RC(cuMemAlloc_v2(&p, t + 64 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(t_used() == base, "a failed real allocation left %lld bytes reserved", (long long)(t_used() - base));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h;
    EXPECT_RC(cuMemCreate(&h, 3 * MiB, &prop, 0), CUDA_ERROR_INVALID_VALUE); /* not a granularity multiple */
    EXPECT(t_used() == base, "a rejected cuMemCreate left bytes reserved");
    EXPECT_RC(cuMemAlloc_v2(&p, 8 * MiB), CUDA_SUCCESS);
    EXPECT(t_used() == base + 8 * MiB, "allocation after rollback counted %llu", t_used() - base);
    printf("PASS failed real allocations give their reservation back\n");
}

static void hold(unsigned long long bytes)
{
    CUdeviceptr p;
    CUresult r = cuMemAlloc_v2(&p, bytes);
    printf("HOLD %d\n", r);
    fflush(stdout);
    sleep(60);
}

static void *sleeper(void *arg)
{
    (void)arg;
    sleep(60);
    return NULL;
}

/* The main thread allocates and then ends; the process lives on in another
 * thread (/proc/<pid>/stat then shows the main thread's state, Z). */
static void hold_thread(unsigned long long bytes)
{
    CUdeviceptr p;
    CUresult r = cuMemAlloc_v2(&p, bytes);
    pthread_t th;
    if (pthread_create(&th, NULL, sleeper, NULL) != 0) {
        printf("FAIL pthread_create\n");
        exit(1);
    }
    printf("HOLD %d\n", r);
    fflush(stdout);
    pthread_exit(NULL);
}

static void hold_fork(unsigned long long bytes)
{
    CUdeviceptr p;
    CUresult r = cuMemAlloc_v2(&p, bytes);
    printf("HOLD %d\n", r);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        sleep(60);
        _exit(0);
    }
    printf("CHILD %d\n", (int)child);
    fflush(stdout);
    sleep(60);
}

static void hold_closefds(unsigned long long bytes)
{
    CUdeviceptr p;
    CUresult r = cuMemAlloc_v2(&p, bytes);
    for (int fd = 3; fd < 1024; fd++)
        close(fd);
    printf("HOLD %d\n", r);
    sleep(2);
    printf("CLOSED\n");
    fflush(stdout);
    sleep(60);
}

static void fill(void)
{
    unsigned long long held = 0, chunk = 64 * MiB;
    CUdeviceptr p;
    while (chunk >= 1 * MiB) {
        if (cuMemAlloc_v2(&p, chunk) == CUDA_SUCCESS)
            held += chunk;
        else
            chunk /= 2;
    }
    printf("FILLED %llu\n", held);
}

static void ctx(unsigned long long ctx_bytes)
{
    unsigned long long base = t_used();
    CUcontext c;
    EXPECT_RC(cuCtxCreate_v2(&c, 0, 0), CUDA_SUCCESS);
    /* The watcher reconciles with NVML once a second. */
    double end = t_now() + 8;
    while (t_used() < base + ctx_bytes && t_now() < end)
        usleep(50000);
    EXPECT(t_used() >= base + ctx_bytes, "context memory not counted: used %llu, base %llu, context %llu", t_used(),
           base, ctx_bytes);
    CUdeviceptr p;
    unsigned long long left = remaining();
    EXPECT_RC(cuMemAlloc_v2(&p, left + 1), CUDA_ERROR_OUT_OF_MEMORY);
    printf("PASS context overhead counted (%llu bytes)\n", t_used() - base);
}

static void churn(void)
{
    CUdeviceptr p[8];
    printf("CHURNING\n");
    for (unsigned long long i = 0;; i++) {
        int k = (int)(i % 8);
        if (i >= 8)
            cuMemFree_v2(p[k]);
        if (cuMemAlloc_v2(&p[k], (1 + i % 5) * MiB) != CUDA_SUCCESS)
            p[k] = 0;
    }
}

static void serve(void)
{
    printf("READY %d\n", (int)getpid());
    fflush(stdout);
    char line[128];
    while (fgets(line, sizeof(line), stdin)) {
        unsigned long long n;
        CUdeviceptr p;
        if (sscanf(line, "alloc %llu", &n) == 1) {
            printf("ALLOC %d\n", cuMemAlloc_v2(&p, n));
            fflush(stdout);
        } else if (strncmp(line, "exit", 4) == 0) {
            exit(0);
        } else if (strncmp(line, "_exit", 5) == 0) {
            _exit(0);
        }
    }
    exit(0);
}

static void devices(void)
{
    int n = 0;
    cuDeviceGetCount(&n);
    printf("COUNT %d\n", n);
    for (int i = 0; i < n; i++) {
        CUdevice d;
        CUcontext c;
        cuDeviceGet(&d, i);
        cuDevicePrimaryCtxRetain(&c, d);
        cuCtxSetCurrent(c);
        CUuuid u;
        char uuid[96];
        cuDeviceGetUuid(&u, d);
        t_uuid(&u, uuid, sizeof(uuid));
        size_t f, t;
        cuMemGetInfo_v2(&f, &t);
        CUdeviceptr p;
        CUresult over = cuMemAlloc_v2(&p, t + 1);
        CUresult fits = cuMemAlloc_v2(&p, t / 2);
        printf("DEV %d %s total=%zu over=%d fits=%d\n", i, uuid, t, over, fits);
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2)
        return 2;
    const char *cmd = argv[1];
    int ordinal = (strcmp(cmd, "info") == 0 && argc > 2) ? atoi(argv[2]) : 0;
    if (strcmp(cmd, "devices") == 0) {
        CUresult r = cuInit(0);
        if (r != CUDA_SUCCESS) {
            printf("cuInit=%d\n", r);
            return 1;
        }
        devices();
        return t_failures ? 1 : 0;
    }
    if (strcmp(cmd, "init") == 0) {
        printf("PID %d\n", (int)getpid());
        CUresult r = cuInit(0);
        printf("cuInit=%d\n", r);
        if (r == CUDA_SUCCESS) {
            t_setup(0);
            CUdeviceptr p;
            printf("cuMemAlloc_v2=%d\n", cuMemAlloc_v2(&p, 1 * MiB));
            printf("used=%llu\n", t_used());
        } else {
            CUdeviceptr p;
            printf("cuMemAlloc_v2=%d\n", cuMemAlloc_v2(&p, 1 * MiB));
        }
        return 0;
    }
    if (t_setup(ordinal) != 0)
        return 1;
    if (strcmp(cmd, "paths") == 0)
        paths();
    else if (strcmp(cmd, "info") == 0)
        info(ordinal);
    else if (strcmp(cmd, "race") == 0 && argc >= 5)
        race(strtoull(argv[2], NULL, 10) * MiB, argv[3], argv[4]);
    else if (strcmp(cmd, "unknown") == 0)
        unknown();
    else if (strcmp(cmd, "rollback") == 0)
        rollback();
    else if (strcmp(cmd, "hold") == 0 && argc >= 3)
        hold(strtoull(argv[2], NULL, 10));
    else if (strcmp(cmd, "hold-thread") == 0 && argc >= 3)
        hold_thread(strtoull(argv[2], NULL, 10));
    else if (strcmp(cmd, "hold-fork") == 0 && argc >= 3)
        hold_fork(strtoull(argv[2], NULL, 10));
    else if (strcmp(cmd, "hold-closefds") == 0 && argc >= 3)
        hold_closefds(strtoull(argv[2], NULL, 10));
    else if (strcmp(cmd, "churn") == 0)
        churn();
    else if (strcmp(cmd, "fill") == 0)
        fill();
    else if (strcmp(cmd, "serve") == 0)
        serve();
    else if (strcmp(cmd, "ctx") == 0 && argc >= 3)
        ctx(strtoull(argv[2], NULL, 10));
    else
        return 2;
    return t_failures ? 1 : 0;
}
