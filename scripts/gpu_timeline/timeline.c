// A CUDA injection library that records the GPU timeline of any process (ours or PyTorch's) through CUPTI's
// activity API: every kernel, memcpy and memset with its start and end on the GPU, and every driver API call with
// its start and end on the host, on one clock. Loaded by the driver when CUDA_INJECTION64_PATH names it; at exit
// it writes TIMELINE_OUT (default timeline.tsv; a "%d" in it becomes the process id, for launchers that start one
// process per GPU), one record a line:
//   K <start ns> <end ns> <correlation> <grid x*y*z> <kernel name>
//   M <start ns> <end ns> <correlation> <bytes> memcpy-<copy kind>
//   S <start ns> <end ns> <correlation> <bytes> memset
//   A <start ns> <end ns> <correlation> <thread> <driver API name>
// scripts/gpu_timeline/report.py reads it (where the GPU is idle, and whether the host or the GPU was late).
// Built by scripts/gpu_timeline/build.sh against CUPTI from the nvidia-cuda-cupti wheel; a development tool only.

#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static FILE *out;
static const size_t BUFFER = 8u << 20;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = (uint8_t *)aligned_alloc(8, BUFFER);
  *size = BUFFER;
  *max_records = 0;
}

static void write_record(CUpti_Activity *r) {
  switch (r->kind) {
  case CUPTI_ACTIVITY_KIND_KERNEL:
  case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
    CUpti_ActivityKernel10 *k = (CUpti_ActivityKernel10 *)r;
    fprintf(out, "K\t%llu\t%llu\t%u\t%lld\t%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
            k->correlationId, (long long)k->gridX * k->gridY * k->gridZ, k->name ? k->name : "?");
    break;
  }
  case CUPTI_ACTIVITY_KIND_MEMCPY: {
    CUpti_ActivityMemcpy6 *m = (CUpti_ActivityMemcpy6 *)r;
    fprintf(out, "M\t%llu\t%llu\t%u\t%llu\tmemcpy-%d\n", (unsigned long long)m->start, (unsigned long long)m->end,
            m->correlationId, (unsigned long long)m->bytes, (int)m->copyKind);
    break;
  }
  case CUPTI_ACTIVITY_KIND_MEMSET: {
    CUpti_ActivityMemset4 *m = (CUpti_ActivityMemset4 *)r;
    fprintf(out, "S\t%llu\t%llu\t%u\t%llu\tmemset\n", (unsigned long long)m->start, (unsigned long long)m->end,
            m->correlationId, (unsigned long long)m->bytes);
    break;
  }
  case CUPTI_ACTIVITY_KIND_DRIVER: {
    CUpti_ActivityAPI *a = (CUpti_ActivityAPI *)r;
    const char *name = "?";
    cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name);
    fprintf(out, "A\t%llu\t%llu\t%u\t%u\t%s\n", (unsigned long long)a->start, (unsigned long long)a->end,
            a->correlationId, a->threadId, name);
    break;
  }
  default:
    break;
  }
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
  (void)ctx;
  (void)stream;
  (void)size;
  CUpti_Activity *record = NULL;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) write_record(record);
  free(buffer);
}

static void finish(void) {
  cuptiActivityFlushAll(1);
  if (out) fclose(out);
}

int InitializeInjection(void) {
  const char *path = getenv("TIMELINE_OUT");
  char named[4096];
  snprintf(named, sizeof named, path ? path : "timeline.tsv", (int)getpid());
  out = fopen(named, "w");
  if (!out) return 0;
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
  atexit(finish);
  return 1;
}
