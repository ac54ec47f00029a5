/* Prints the ABI facts of whichever nccl.h it is compiled against, one "name value" per
 * line; tests/capi.rs compares them with the Rust definitions. */
#include <nccl.h>
#include <stddef.h>
#include <stdio.h>

#define P(x) printf("%s %lld\n", #x, (long long)(x))
#define OFF(f) printf("offsetof_%s %zu\n", #f, offsetof(ncclConfig_t, f))

int main(void) {
  P(sizeof(ncclUniqueId));
  P(NCCL_UNIQUE_ID_BYTES);
  P(sizeof(ncclResult_t));
  P(sizeof(ncclDataType_t));
  P(sizeof(ncclRedOp_t));
  P(ncclSuccess); P(ncclUnhandledCudaError); P(ncclSystemError); P(ncclInternalError);
  P(ncclInvalidArgument); P(ncclInvalidUsage); P(ncclRemoteError); P(ncclInProgress);
  P(ncclTimeout);
  P(ncclInt8); P(ncclChar); P(ncclUint8); P(ncclInt32); P(ncclInt); P(ncclUint32);
  P(ncclInt64); P(ncclUint64); P(ncclFloat16); P(ncclHalf); P(ncclFloat32); P(ncclFloat);
  P(ncclFloat64); P(ncclDouble); P(ncclBfloat16); P(ncclFloat8e4m3); P(ncclFloat8e5m2);
  P(ncclNumTypes);
  P(ncclSum); P(ncclProd); P(ncclMax); P(ncclMin); P(ncclAvg); P(ncclNumOps); P(ncclMaxRedOp);
  P(ncclScalarDevice); P(ncclScalarHostImmediate);
  P(NCCL_CONFIG_UNDEF_INT);
  P(NCCL_SPLIT_NOCOLOR);
  OFF(size); OFF(magic); OFF(version); OFF(blocking); OFF(cgaClusterSize); OFF(minCTAs);
  OFF(maxCTAs); OFF(netName); OFF(splitShare); OFF(trafficClass); OFF(commName);
  OFF(collnetEnable); OFF(shrinkShare); OFF(nvlsHostMode);
  P(sizeof(ncclConfig_t));
  P(NCCL_VERSION_CODE);
  P(sizeof(ncclCollConfig_t));
  P(offsetof(ncclCollConfig_t, algSelection));
  P(offsetof(ncclCollConfig_t, userProfilerTag));
  P(offsetof(ncclCollConfig_t, launchCompletionEvent));
  P(sizeof(ncclSimInfo_t));
  P(offsetof(ncclSimInfo_t, estimatedTime));
  P(sizeof(ncclConfigExt_t));
  P(sizeof(ncclWaitSignalDesc_t));
  P(sizeof(ncclEncryptionConfig_t));
  P(ncclStatGpuMemTotal);
  P(NCCL_SHRINK_ABORT);
  P(NCCL_SUSPEND_MEM);
  {
    ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
    ncclSimInfo_t si = NCCL_SIM_INFO_INITIALIZER;
    P(cc.forceAlgSelection);
    P(cc.magic);
    P(si.magic);
  }
  {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    P(c.magic);
    P(c.blocking);
    P(c.netName == NULL);
  }
#ifdef FERROCCL_ABI_FULL
  P(NCCL_VERSION(2, 19, 3));
  {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    P(c.size);
    P(c.version);
    P(c.splitShare);
  }
#endif
  return 0;
}
