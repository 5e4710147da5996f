/*
 * A fake libnvidia-ml.so.1 for tests: the NVML calls Corral's node agent makes (through pynvml),
 * answered from a text file that a test may rewrite while the agent runs, to inject faults.
 *
 * Build: gcc -shared -fPIC -O1 -Wl,-soname,libnvidia-ml.so.1 -o DIR/libnvidia-ml.so.1 fakenvml.c
 * Load:  LD_LIBRARY_PATH=DIR (pynvml dlopens "libnvidia-ml.so.1"), FAKE_NVML_CONFIG=FILE.
 *
 * The file (tests/fakenvml/fakenvml.py writes it): one `gpu` line starts a GPU, the lines after it
 * describe it; `#` starts a comment.
 *   gpu                              a new GPU (indices count from 0 in file order)
 *   name NVIDIA H100 80GB HBM3       the rest of the line
 *   memory_mib 81559
 *   uuid GPU-...
 *   bus_id 00000000:18:00.0
 *   nvlink 1 2 3                     active NVLinks, link k to the GPU of index peer k
 *   nvlink_down 2                    links (by link number) that are not active
 *   nvswitch 0                       GPUs of the same NVSwitch group are P2P over NVLink
 *   ecc_dbe 1                        volatile double-bit (uncorrected) ECC errors
 *   ecc_sbe 4                        volatile single-bit (corrected) ECC errors
 *   xid SEQ CODE                     an XID event; each SEQ is delivered once per process
 *   lost 1                           the GPU fell off the bus: NVML_ERROR_GPU_IS_LOST
 * The file is read again whenever it changes (write a new file and rename it over the old one).
 * No FAKE_NVML_CONFIG, or no such file: nvmlInit fails as on a machine without a driver.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10, NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_GPU_IS_LOST = 15, NVML_ERROR_UNKNOWN = 999
};
#define MAX_GPUS 64
#define MAX_LINKS 18
#define MAX_XIDS 64
#define EVENT_SBE 0x1ULL
#define EVENT_DBE 0x2ULL
#define EVENT_XID 0x8ULL

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;

struct gpu {
    int index;
    char name[96], uuid[96], bus_id[32];
    unsigned long long memory_mib, ecc_dbe, ecc_sbe;
    int peers[MAX_LINKS], npeers, down[MAX_LINKS];
    int nvswitch, lost;
    long xid_seq[MAX_XIDS], xid_code[MAX_XIDS];
    int nxids;
};

typedef struct gpu *nvmlDevice_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

struct event_set {
    unsigned long long mask[MAX_GPUS];
    long xid_seen[MAX_GPUS];              /* highest XID sequence delivered */
    unsigned long long dbe_seen[MAX_GPUS], sbe_seen[MAX_GPUS];
};
typedef struct event_set *nvmlEventSet_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct gpu gpus[MAX_GPUS];
static int ngpus = -1;  /* -1: no configuration read */
static int inits = 0;
static struct stat seen;

static void trim(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = 0;
}

static void set_text(char *dst, size_t size, const char *src) {
    size_t n = strlen(src);
    if (n >= size) n = size - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

/* Read the file again if it changed; keeps the last good configuration when it cannot be read. */
static void reload(void) {
    const char *path = getenv("FAKE_NVML_CONFIG");
    struct stat st;
    if (!path || stat(path, &st) != 0) return;
    if (ngpus >= 0 && st.st_ino == seen.st_ino && st.st_size == seen.st_size &&
        st.st_mtim.tv_sec == seen.st_mtim.tv_sec && st.st_mtim.tv_nsec == seen.st_mtim.tv_nsec) return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    static struct gpu next[MAX_GPUS];
    int n = 0;
    struct gpu *g = NULL;
    char line[512];
    memset(next, 0, sizeof next);
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        trim(line);
        char *key = line;
        while (*key == ' ' || *key == '\t') key++;
        if (!*key) continue;
        char *rest = key;
        while (*rest && *rest != ' ' && *rest != '\t') rest++;
        if (*rest) *rest++ = 0;
        while (*rest == ' ' || *rest == '\t') rest++;
        if (strcmp(key, "gpu") == 0) {
            if (n == MAX_GPUS) break;
            g = &next[n];
            g->index = n++;
            g->nvswitch = -1;
            snprintf(g->name, sizeof g->name, "Fake GPU");
            snprintf(g->uuid, sizeof g->uuid, "GPU-fake-%d", g->index);
            snprintf(g->bus_id, sizeof g->bus_id, "00000000:%02X:00.0", 0x10 + g->index);
            g->memory_mib = 81920;
            continue;
        }
        if (!g) continue;
        if (strcmp(key, "name") == 0) set_text(g->name, sizeof g->name, rest);
        else if (strcmp(key, "uuid") == 0) set_text(g->uuid, sizeof g->uuid, rest);
        else if (strcmp(key, "bus_id") == 0) set_text(g->bus_id, sizeof g->bus_id, rest);
        else if (strcmp(key, "memory_mib") == 0) g->memory_mib = strtoull(rest, NULL, 10);
        else if (strcmp(key, "ecc_dbe") == 0) g->ecc_dbe = strtoull(rest, NULL, 10);
        else if (strcmp(key, "ecc_sbe") == 0) g->ecc_sbe = strtoull(rest, NULL, 10);
        else if (strcmp(key, "lost") == 0) g->lost = atoi(rest);
        else if (strcmp(key, "nvswitch") == 0) g->nvswitch = atoi(rest);
        else if (strcmp(key, "nvlink") == 0) {
            char *tok = strtok(rest, " \t");
            while (tok && g->npeers < MAX_LINKS) { g->peers[g->npeers++] = atoi(tok); tok = strtok(NULL, " \t"); }
        } else if (strcmp(key, "nvlink_down") == 0) {
            char *tok = strtok(rest, " \t");
            while (tok) { int l = atoi(tok); if (l >= 0 && l < MAX_LINKS) g->down[l] = 1; tok = strtok(NULL, " \t"); }
        } else if (strcmp(key, "xid") == 0 && g->nxids < MAX_XIDS) {
            long seq, code;
            if (sscanf(rest, "%ld %ld", &seq, &code) == 2) {
                g->xid_seq[g->nxids] = seq;
                g->xid_code[g->nxids++] = code;
            }
        }
    }
    fclose(f);
    memcpy(gpus, next, sizeof gpus);
    ngpus = n;
    seen = st;
}

static nvmlReturn_t device_ok(nvmlDevice_t d) {
    if (inits <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!d || d < gpus || d >= gpus + ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    reload();
    if (d->index >= ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    return d->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

#define LOCKED(expr) do { pthread_mutex_lock(&lock); nvmlReturn_t r_ = (expr); pthread_mutex_unlock(&lock); return r_; } while (0)

static nvmlReturn_t init(void) {
    reload();
    if (ngpus < 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    inits++;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; LOCKED(init()); }
nvmlReturn_t nvmlInit_v2(void) { LOCKED(init()); }
nvmlReturn_t nvmlInit(void) { LOCKED(init()); }

static nvmlReturn_t shutdown_(void) {
    if (inits <= 0) return NVML_ERROR_UNINITIALIZED;
    inits--;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlShutdown(void) { LOCKED(shutdown_()); }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t count(unsigned int *n) {
    if (inits <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    reload();
    *n = (unsigned int)ngpus;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { LOCKED(count(n)); }
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { LOCKED(count(n)); }

static nvmlReturn_t by_index(unsigned int i, nvmlDevice_t *d) {
    if (inits <= 0) return NVML_ERROR_UNINITIALIZED;
    reload();
    if (!d || (int)i >= ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    *d = &gpus[i];
    return gpus[i].lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) { LOCKED(by_index(i, d)); }
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { LOCKED(by_index(i, d)); }

static nvmlReturn_t by_uuid(const char *uuid, nvmlDevice_t *d) {
    if (inits <= 0) return NVML_ERROR_UNINITIALIZED;
    reload();
    for (int i = 0; i < ngpus; i++) {
        if (uuid && d && strcmp(gpus[i].uuid, uuid) == 0) {
            *d = &gpus[i];
            return gpus[i].lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) { LOCKED(by_uuid(uuid, d)); }

static nvmlReturn_t copy_text(nvmlDevice_t d, const char *(*field)(nvmlDevice_t), char *out, unsigned int len) {
    nvmlReturn_t r = device_ok(d);
    if (r != NVML_SUCCESS) return r;
    const char *text = field(d);
    if (!out || strlen(text) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}
static const char *name_of(nvmlDevice_t d) { return d->name; }
static const char *uuid_of(nvmlDevice_t d) { return d->uuid; }
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *out, unsigned int len) { LOCKED(copy_text(d, name_of, out, len)); }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *out, unsigned int len) { LOCKED(copy_text(d, uuid_of, out, len)); }

static nvmlReturn_t index_of(nvmlDevice_t d, unsigned int *i) {
    nvmlReturn_t r = device_ok(d);
    if (r == NVML_SUCCESS && i) *i = (unsigned int)d->index;
    return r;
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) { LOCKED(index_of(d, i)); }

static nvmlReturn_t memory(nvmlDevice_t d, nvmlMemory_t *m) {
    nvmlReturn_t r = device_ok(d);
    if (r != NVML_SUCCESS) return r;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = d->memory_mib << 20;
    m->used = 0;
    m->free = m->total;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) { LOCKED(memory(d, m)); }

static void fill_pci(const char *bus_id, nvmlPciInfo_t *p) {
    memset(p, 0, sizeof *p);
    set_text(p->busId, sizeof p->busId, bus_id);
    set_text(p->busIdLegacy, sizeof p->busIdLegacy, bus_id + (strlen(bus_id) > 12 ? 4 : 0));
    sscanf(bus_id, "%x:%x:%x", &p->domain, &p->bus, &p->device);
    p->pciDeviceId = 0x233010de;
}
static nvmlReturn_t pci(nvmlDevice_t d, nvmlPciInfo_t *p) {
    nvmlReturn_t r = device_ok(d);
    if (r != NVML_SUCCESS) return r;
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(d->bus_id, p);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) { LOCKED(pci(d, p)); }
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) { LOCKED(pci(d, p)); }
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p) { LOCKED(pci(d, p)); }

static nvmlReturn_t link_state(nvmlDevice_t d, unsigned int link, unsigned int *active) {
    nvmlReturn_t r = device_ok(d);
    if (r != NVML_SUCCESS) return r;
    if (!active || (int)link >= d->npeers) return NVML_ERROR_INVALID_ARGUMENT;
    *active = d->down[link] ? 0 : 1;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, unsigned int *active) {
    LOCKED(link_state(d, link, active));
}

static nvmlReturn_t link_remote(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *p) {
    nvmlReturn_t r = device_ok(d);
    if (r != NVML_SUCCESS) return r;
    if (!p || (int)link >= d->npeers) return NVML_ERROR_INVALID_ARGUMENT;
    int peer = d->peers[link];
    if (peer < 0 || peer >= ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(gpus[peer].bus_id, p);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *p) {
    LOCKED(link_remote(d, link, p));
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *p) {
    LOCKED(link_remote(d, link, p));
}

static int linked(nvmlDevice_t a, nvmlDevice_t b) {
    for (int l = 0; l < a->npeers; l++)
        if (!a->down[l] && a->peers[l] == b->index) return 1;
    return 0;
}
static nvmlReturn_t p2p(nvmlDevice_t a, nvmlDevice_t b, int index, int *status) {
    nvmlReturn_t r = device_ok(a);
    if (r == NVML_SUCCESS) r = device_ok(b);
    if (r != NVML_SUCCESS) return r;
    if (!status) return NVML_ERROR_INVALID_ARGUMENT;
    int nvlink = (a->nvswitch >= 0 && a->nvswitch == b->nvswitch) || linked(a, b) || linked(b, a);
    /* index 2: NVML_P2P_CAPS_INDEX_NVLINK; 0 NVML_P2P_STATUS_OK, 5 NOT_SUPPORTED */
    *status = (index != 2 || nvlink) ? 0 : 5;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int index, int *status) {
    LOCKED(p2p(a, b, index, status));
}

static nvmlReturn_t ecc_mode(nvmlDevice_t d, int *current, int *pending) {
    nvmlReturn_t r = device_ok(d);
    if (r == NVML_SUCCESS) { if (current) *current = 1; if (pending) *pending = 1; }
    return r;
}
nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t d, int *current, int *pending) { LOCKED(ecc_mode(d, current, pending)); }

/* errorType 1: uncorrected (double-bit), 0: corrected; counterType 0: volatile, 1: aggregate. */
static nvmlReturn_t ecc(nvmlDevice_t d, int error_type, int counter_type, unsigned long long *n) {
    nvmlReturn_t r = device_ok(d);
    if (r != NVML_SUCCESS) return r;
    if (!n || (error_type != 0 && error_type != 1) || (counter_type != 0 && counter_type != 1))
        return NVML_ERROR_INVALID_ARGUMENT;
    *n = error_type == 1 ? d->ecc_dbe : d->ecc_sbe;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int error_type, int counter_type, unsigned long long *n) {
    LOCKED(ecc(d, error_type, counter_type, n));
}

static nvmlReturn_t supported(nvmlDevice_t d, unsigned long long *types) {
    nvmlReturn_t r = device_ok(d);
    if (r == NVML_SUCCESS && types) *types = EVENT_SBE | EVENT_DBE | EVENT_XID;
    return r;
}
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) { LOCKED(supported(d, types)); }

static nvmlReturn_t set_create(nvmlEventSet_t *set) {
    if (inits <= 0) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof(struct event_set));
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) { LOCKED(set_create(set)); }

static nvmlReturn_t set_free(nvmlEventSet_t set) {
    free(set);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { LOCKED(set_free(set)); }

static nvmlReturn_t register_events(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    nvmlReturn_t r = device_ok(d);
    if (r != NVML_SUCCESS) return r;
    if (!set || (types & ~(EVENT_SBE | EVENT_DBE | EVENT_XID))) return NVML_ERROR_NOT_SUPPORTED;
    set->mask[d->index] |= types;
    /* events from now on: what the file already holds has happened before the registration */
    for (int k = 0; k < d->nxids; k++)
        if (d->xid_seq[k] > set->xid_seen[d->index]) set->xid_seen[d->index] = d->xid_seq[k];
    set->dbe_seen[d->index] = d->ecc_dbe;
    set->sbe_seen[d->index] = d->ecc_sbe;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    LOCKED(register_events(d, types, set));
}

/* One pending event of `set`, if any: NVML_SUCCESS with `data` filled, NVML_ERROR_GPU_IS_LOST when a
 * registered GPU fell off the bus, NVML_ERROR_TIMEOUT when none. */
static nvmlReturn_t next_event(nvmlEventSet_t set, nvmlEventData_t *data) {
    reload();
    for (int i = 0; i < ngpus; i++) {
        struct gpu *g = &gpus[i];
        unsigned long long mask = set->mask[i];
        if (!mask) continue;
        if (g->lost) return NVML_ERROR_GPU_IS_LOST;
        /* a counter set back (a driver reload) counts its next errors as new ones */
        if (g->ecc_dbe < set->dbe_seen[i]) set->dbe_seen[i] = g->ecc_dbe;
        if (g->ecc_sbe < set->sbe_seen[i]) set->sbe_seen[i] = g->ecc_sbe;
        memset(data, 0, sizeof *data);
        data->device = g;
        data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
        if (mask & EVENT_XID) {
            int best = -1;
            for (int k = 0; k < g->nxids; k++)
                if (g->xid_seq[k] > set->xid_seen[i] && (best < 0 || g->xid_seq[k] < g->xid_seq[best])) best = k;
            if (best >= 0) {
                set->xid_seen[i] = g->xid_seq[best];
                data->eventType = EVENT_XID;
                data->eventData = (unsigned long long)g->xid_code[best];
                return NVML_SUCCESS;
            }
        }
        if ((mask & EVENT_DBE) && g->ecc_dbe > set->dbe_seen[i]) {
            set->dbe_seen[i] = g->ecc_dbe;
            data->eventType = EVENT_DBE;
            return NVML_SUCCESS;
        }
        if ((mask & EVENT_SBE) && g->ecc_sbe > set->sbe_seen[i]) {
            set->sbe_seen[i] = g->ecc_sbe;
            data->eventType = EVENT_SBE;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec step = {0, 20 * 1000 * 1000};
    for (unsigned int waited = 0;; waited += 20) {
        pthread_mutex_lock(&lock);
        nvmlReturn_t r = inits > 0 ? next_event(set, data) : NVML_ERROR_UNINITIALIZED;
        pthread_mutex_unlock(&lock);
        if (r != NVML_ERROR_TIMEOUT || waited >= timeoutms) return r;
        nanosleep(&step, NULL);
    }
}
nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
