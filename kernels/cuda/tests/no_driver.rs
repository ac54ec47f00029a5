//! Without an NVIDIA driver every device entry point returns the clear error, and nothing
//! panics. The driver is pointed at a file that does not exist, so this holds on machines that
//! have one too (one test in this binary: the driver is loaded once per process).

use ferroccl_cuda::device::DeviceKernels;
use ferroccl_cuda::driver::{driver, DRIVER_LIB_ENV};
use ferroccl_cuda::{CudaErrorKind, DRIVER_MISSING};

#[test]
fn every_device_entry_point_names_the_missing_driver() {
    std::env::set_var(DRIVER_LIB_ENV, "/nonexistent/ferroccl-test/libcuda.so.1");
    let e = driver().expect_err("a driver loaded from a missing file");
    assert_eq!(e.kind(), CudaErrorKind::DriverMissing);
    assert!(e.to_string().starts_with(DRIVER_MISSING), "{e}");
    assert!(
        e.to_string()
            .contains("/nonexistent/ferroccl-test/libcuda.so.1"),
        "{e}"
    );
    // Asked again: the same answer, not a retry that could panic.
    assert_eq!(driver().unwrap_err(), e);
    for ordinal in [0, 1, 7] {
        let e = DeviceKernels::new(ordinal).expect_err("device kernels without a driver");
        assert_eq!(e.kind(), CudaErrorKind::DriverMissing);
        assert!(e.to_string().starts_with(DRIVER_MISSING), "{e}");
    }
}
