/* A stand-in for libcupti.so.13 that records what the shim asks of it, for
 * cupti-shim/tests/fake_cupti.rs (no GPU, no CUDA). Built as libcupti.so.13 (soname too), it is
 * what the shim's dlopen finds. It delivers launch callbacks only for the ids the shim enabled,
 * as CUPTI does, and hands out and completes an empty activity buffer at every flush.
 *
 * Test-side entry points: fake_launch(domain, cbid, correlation) -> 1 when delivered;
 * fake_capture(correlation, node, grid_x, block_x) -> a cuLaunchKernel captured into graph 9 as
 * graph node `node`: the launch callback's enter (with the launch's parameters), the node-created
 * resource callback, the exit (1 when delivered);
 * fake_log() -> every call so far ("cb+ 2:211", "enable 10", "flush", ...; repeated flushes
 * are logged once; an activity switched from inside a callback is logged "enable 10 in cb"). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void (*callback_fn)(void *userdata, uint32_t domain, uint32_t cbid, const void *data);
typedef void (*requested_fn)(uint8_t **buf, size_t *size, size_t *max);
typedef void (*completed_fn)(void *ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid);
typedef uint64_t (*timestamp_fn)(void);

/* CUpti_CallbackData (cupti_callbacks.h): the fields the shim reads are callbackSite and
 * correlationId. */
typedef struct {
    uint32_t callbackSite;
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    void *context;
    uint32_t contextUid;
    uint64_t *correlationData;
    uint32_t correlationId;
} callback_data;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[1 << 20];
static size_t log_len;
static callback_fn callback;
static void *userdata;
static requested_fn requested;
static completed_fn completed;
static uint8_t enabled[8][1024];
/* Set on a thread while the fake calls the shim's callback. */
static __thread int in_callback;

static void say(const char *what) {
    pthread_mutex_lock(&mu);
    size_t n = strlen(what);
    int repeat = n <= log_len && (strcmp(what, "flush;") == 0 || strcmp(what, "flush forced;") == 0) &&
                 memcmp(log_buf + log_len - n, what, n) == 0;
    if (!repeat && log_len + n + 1 < sizeof log_buf) {
        memcpy(log_buf + log_len, what, n);
        log_len += n;
        log_buf[log_len] = 0;
    }
    pthread_mutex_unlock(&mu);
}

const char *fake_log(void) { return log_buf; }

int fake_launch(uint32_t domain, uint32_t cbid, uint32_t correlation) {
    if (domain >= 8 || cbid >= 1024 || !enabled[domain][cbid] || callback == NULL) return 0;
    callback_data d;
    memset(&d, 0, sizeof d);
    d.correlationId = correlation;
    in_callback = 1;
    d.callbackSite = 0; /* enter */
    callback(userdata, domain, cbid, &d);
    d.callbackSite = 1; /* exit */
    callback(userdata, domain, cbid, &d);
    in_callback = 0;
    return 1;
}

/* cuLaunchKernel_params_st and CUpti_ResourceData / CUpti_GraphData (cupti_callbacks.h,
 * generated_cuda_meta.h), the fields the shim reads. */
typedef struct {
    void *f;
    uint32_t grid[3], block[3], shared_mem;
    void *stream, **params, **extra;
} launch_params;
typedef struct {
    void *graph, *original_graph, *node, *original_node;
    uint32_t node_type;
    void *dependency, *graph_exec;
} graph_data;
typedef struct {
    void *context;
    void *handle;
    void *descriptor;
} resource_data;

int fake_capture(uint32_t correlation, uint64_t node, uint32_t grid_x, uint32_t block_x) {
    if (!enabled[1][307] || callback == NULL) return 0;
    launch_params p;
    memset(&p, 0, sizeof p);
    p.grid[0] = grid_x, p.grid[1] = 1, p.grid[2] = 1;
    p.block[0] = block_x, p.block[1] = 1, p.block[2] = 1;
    callback_data d;
    memset(&d, 0, sizeof d);
    d.correlationId = correlation;
    d.functionParams = &p;
    callback(userdata, 1, 307, &d);
    if (enabled[3][13]) {
        graph_data g;
        memset(&g, 0, sizeof g);
        g.graph = (void *)(uintptr_t)9;
        g.node = (void *)(uintptr_t)node;
        resource_data r = {NULL, NULL, &g};
        callback(userdata, 3, 13, &r);
    }
    d.callbackSite = 1;
    callback(userdata, 1, 307, &d);
    return 1;
}

uint32_t cuptiGetVersion(uint32_t *v) { *v = 130001; return 0; }
uint32_t cuptiGetResultString(uint32_t r, const char **s) { (void)r; *s = "CUPTI_ERROR_FAKE"; return 0; }
uint32_t cuptiSubscribe(void **sub, callback_fn f, void *ud) {
    *sub = (void *)&enabled;
    callback = f;
    userdata = ud;
    say("subscribe;");
    return 0;
}
uint32_t cuptiUnsubscribe(void *sub) { (void)sub; callback = NULL; say("unsubscribe;"); return 0; }
uint32_t cuptiEnableCallback(uint32_t on, void *sub, uint32_t domain, uint32_t cbid) {
    (void)sub;
    char b[64];
    if (domain < 8 && cbid < 1024) enabled[domain][cbid] = (uint8_t)on;
    snprintf(b, sizeof b, "cb%c %u:%u;", on ? '+' : '-', domain, cbid);
    say(b);
    return 0;
}
uint32_t cuptiEnableDomain(uint32_t on, void *sub, uint32_t domain) {
    (void)sub;
    if (domain < 8) memset(enabled[domain], on ? 1 : 0, sizeof enabled[domain]);
    return 0;
}
uint32_t cuptiActivityEnable(uint32_t kind) {
    char b[32];
    snprintf(b, sizeof b, in_callback ? "enable %u in cb;" : "enable %u;", kind);
    say(b);
    return 0;
}
uint32_t cuptiActivityDisable(uint32_t kind) {
    char b[32];
    snprintf(b, sizeof b, in_callback ? "disable %u in cb;" : "disable %u;", kind);
    say(b);
    return 0;
}
uint32_t cuptiActivityRegisterCallbacks(requested_fn r, completed_fn c) {
    requested = r;
    completed = c;
    return 0;
}
uint32_t cuptiActivityFlushPeriod(uint32_t ms) {
    char b[32];
    snprintf(b, sizeof b, "flush period %u;", ms);
    say(b);
    return 0;
}
uint32_t cuptiActivityRegisterTimestampCallback(timestamp_fn f) { (void)f; return 0; }
uint32_t cuptiActivityFlushAll(uint32_t flags) {
    say((flags & 1) ? "flush forced;" : "flush;");
    if (requested != NULL && completed != NULL) {
        uint8_t *buf = NULL;
        size_t size = 0, max = 0;
        requested(&buf, &size, &max);
        if (buf != NULL) completed(NULL, 0, buf, size, 0);
    }
    return 0;
}
uint32_t cuptiActivityGetNextRecord(uint8_t *buf, size_t valid, void **rec) {
    (void)buf; (void)valid; (void)rec;
    return 12; /* CUPTI_ERROR_MAX_LIMIT_REACHED: no records */
}
uint32_t cuptiActivityGetNumDroppedRecords(void *ctx, uint32_t stream, size_t *n) {
    (void)ctx; (void)stream;
    *n = 0;
    return 0;
}
/* The fake's handles are their ids (fake_capture). */
uint32_t cuptiGetGraphNodeId(void *node, uint64_t *id) { *id = (uint64_t)(uintptr_t)node; return 0; }
uint32_t cuptiGetGraphId(void *graph, uint32_t *id) { *id = (uint32_t)(uintptr_t)graph; return 0; }
