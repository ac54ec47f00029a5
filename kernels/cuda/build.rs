//! Builds the kernels' element logic (`ferro_reduce.h`) as host C, so the CPU test suite can
//! check it against the Rust reference without a GPU.

fn main() {
    println!("cargo:rerun-if-changed=ferro_reduce.h");
    println!("cargo:rerun-if-changed=host/host.c");
    cc::Build::new()
        .file("host/host.c")
        .std("c99")
        .flag("-ffp-contract=off")
        .flag("-fno-strict-aliasing")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .opt_level(2)
        .compile("ferro_reduce_host");
}
