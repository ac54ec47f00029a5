/* Empty: see cuda_runtime.h. */
