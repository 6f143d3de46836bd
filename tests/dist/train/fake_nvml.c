/* A stand-in for NVML (libnvidia-ml.so.1) that plays the part of its C interface the GPU health sampler uses
 * (dist/comm/nvml.h), with values the tests set in $CZ_FAKE_NVML, read at every call:
 *   CZ_FAKE_NVML="util=87,temp=65,power_mw=300000,limit_mw=450000,sm_mhz=2520,reasons=0,
 *                 after_s=1.5,reasons_after=4,power_mw_after=449000,sm_mhz_after=2100,temp_after=83"
 * From after_s seconds past nvmlInit_v2 the *_after values replace theirs: the GPU starts throttling. A value
 * of -1 makes its function answer NVML_ERROR_NOT_SUPPORTED. One device, index 0; no PCI bus id is known. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef void* nvmlDevice_t;
typedef struct {
  unsigned gpu, memory;
} nvmlUtilization_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;

enum { kSuccess = 0, kInvalidArgument = 2, kNotSupported = 3, kNotFound = 6 };
static double start_s = -1;
static int device_token;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

/* The value of `key` in $CZ_FAKE_NVML (its _after form once after_s has passed), else `fallback`. */
static double value(const char* key, double fallback) {
  const char* env = getenv("CZ_FAKE_NVML");
  if (!env) return fallback;
  double after = -1, v = fallback, v_after = 0;
  int have_after = 0;
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", env);
  char key_after[64];
  snprintf(key_after, sizeof key_after, "%s_after", key);
  for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    char* eq = strchr(tok, '=');
    if (!eq) continue;
    *eq = 0;
    const double x = strtod(eq + 1, NULL);
    if (strcmp(tok, key) == 0) v = x;
    if (strcmp(tok, key_after) == 0) v_after = x, have_after = 1;
    if (strcmp(tok, "after_s") == 0) after = x;
  }
  if (have_after && after >= 0 && start_s >= 0 && now_s() - start_s >= after) return v_after;
  return v;
}

nvmlReturn_t nvmlInit_v2(void) {
  start_s = now_s();
  return kSuccess;
}
nvmlReturn_t nvmlShutdown(void) {
  return kSuccess;
}
const char* nvmlErrorString(nvmlReturn_t r) {
  return r == kNotSupported ? "Not Supported" : "fake error";
}
nvmlReturn_t nvmlSystemGetDriverVersion(char* out, unsigned len) {
  snprintf(out, len, "%s", "999.99.fake");
  return kSuccess;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t* d) {
  if (index != 0) return kInvalidArgument;
  *d = &device_token;
  return kSuccess;
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* busid, nvmlDevice_t* d) {
  (void)busid, (void)d;
  return kNotFound;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char* out, unsigned len) {
  (void)d;
  snprintf(out, len, "%s", "Fake GPU");
  return kSuccess;
}

#define ANSWER(key, fallback, store)        \
  do {                                      \
    const double v_ = value(key, fallback); \
    if (v_ < 0) return kNotSupported;       \
    store;                                  \
    return kSuccess;                        \
  } while (0)

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t* u) {
  (void)d;
  u->memory = (unsigned)value("mem_util", 40);
  ANSWER("util", 87, u->gpu = (unsigned)v_);
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* m) {
  (void)d;
  m->total = (unsigned long long)value("mem_total_mib", 24576) << 20;
  ANSWER("mem_used_mib", 10240, (m->used = (unsigned long long)v_ << 20, m->free = m->total - m->used));
}
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned* t) {
  (void)d;
  if (sensor != 0) return kInvalidArgument;
  ANSWER("temp", 65, *t = (unsigned)v_);
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned* mw) {
  (void)d;
  ANSWER("power_mw", 300000, *mw = (unsigned)v_);
}
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned* mw) {
  (void)d;
  ANSWER("limit_mw", 450000, *mw = (unsigned)v_);
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned* mhz) {
  (void)d;
  if (type != 1) return kInvalidArgument; /* NVML_CLOCK_SM */
  ANSWER("sm_mhz", 2520, *mhz = (unsigned)v_);
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long* reasons) {
  (void)d;
  ANSWER("reasons", 0, *reasons = (unsigned long long)v_);
}
