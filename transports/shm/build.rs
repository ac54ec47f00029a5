//! Declares the `loom` cfg, under which the ring protocol is model-checked.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
