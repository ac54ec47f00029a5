//! Lets the binaries and tests find libtorch at run time without LD_LIBRARY_PATH: torch-sys
//! reports the directory it linked (`links = "tch"`), and every target of this crate gets it as
//! its run path.

fn main() {
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
