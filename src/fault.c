/* The counters behind fault.h: a countdown to the allocation that fails, and the number of
 * blocks alive, so a test can prove each failure path frees what it took. Atomic so that the
 * counts stay right if a test allocates from more than one thread. */
#include "fault.h"
/* the build force-includes fault.h here too: this file alone calls the C library itself */
#undef malloc
#undef calloc
#undef realloc
#undef strdup
#undef free
#undef clCreateBuffer

#include <cjson/cJSON.h>
#include <stdatomic.h>

static atomic_long countdown; /* 0: disarmed; k > 0: the k-th allocation from now fails */
static atomic_int sticky_mode;
static atomic_int tripped; /* the countdown reached its allocation (sticky: fail from then on) */
static atomic_long failed;
static atomic_long live;

static int decide(void) {
    if (atomic_load(&tripped)) { return atomic_load(&sticky_mode); }
    long c = atomic_load(&countdown);
    while (c > 0) {
        if (atomic_compare_exchange_weak(&countdown, &c, c - 1)) {
            if (c == 1) {
                atomic_store(&tripped, 1);
                return 1;
            }
            return 0;
        }
    }
    return 0;
}

/* 1 when this allocation is to be refused (and counted as refused) */
static int should_fail(void) {
    if (!decide()) { return 0; }
    atomic_fetch_add(&failed, 1);
    return 1;
}

static void *counted(void *p) {
    if (p) { atomic_fetch_add(&live, 1); }
    return p;
}

void *clffn__fi_malloc(size_t n) {
    if (should_fail()) { return NULL; }
    return counted(malloc(n));
}

void *clffn__fi_calloc(size_t n, size_t size) {
    if (should_fail()) { return NULL; }
    return counted(calloc(n, size));
}

void *clffn__fi_realloc(void *p, size_t n) {
    if (should_fail()) { return NULL; }
    void *q = realloc(p, n);
    if (!p) { counted(q); }
    return q;
}

char *clffn__fi_strdup(const char *s) {
    if (should_fail()) { return NULL; }
    return counted(strdup(s));
}

void clffn__fi_free(void *p) {
    if (p) { atomic_fetch_sub(&live, 1); }
    free(p);
}

void clffn__fi_arm(long n, int sticky) {
    atomic_store(&tripped, 0);
    atomic_store(&sticky_mode, sticky);
    atomic_store(&failed, 0);
    atomic_store(&countdown, n > 0 ? n : 0);
}

long clffn__fi_failed(void) { return atomic_load(&failed); }
long clffn__fi_live(void) { return atomic_load(&live); }

static atomic_long device_countdown, device_failed;
static atomic_int device_sticky, device_tripped;

cl_mem clffn__fi_clCreateBuffer(cl_context context, cl_mem_flags flags, size_t size, void *host,
                                cl_int *err) {
    int fail = atomic_load(&device_tripped) && atomic_load(&device_sticky);
    if (!atomic_load(&device_tripped) && atomic_load(&device_countdown) > 0 &&
        atomic_fetch_sub(&device_countdown, 1) == 1) {
        atomic_store(&device_tripped, 1);
        fail = 1;
    }
    if (fail) {
        atomic_fetch_add(&device_failed, 1);
        if (err) { *err = CL_MEM_OBJECT_ALLOCATION_FAILURE; }
        return NULL;
    }
    return clCreateBuffer(context, flags, size, host, err);
}

void clffn__fi_arm_device(long n, int sticky) {
    atomic_store(&device_tripped, 0);
    atomic_store(&device_sticky, sticky);
    atomic_store(&device_failed, 0);
    atomic_store(&device_countdown, n > 0 ? n : 0);
}

long clffn__fi_device_failed(void) { return atomic_load(&device_failed); }

/* cJSON allocates for our code (the safetensors header, tuning profiles): through the counters
 * too. Set before main, so no cJSON block predates the hooks. */
__attribute__((constructor)) static void hook_cjson(void) {
    cJSON_Hooks hooks = {clffn__fi_malloc, clffn__fi_free};
    cJSON_InitHooks(&hooks);
}
